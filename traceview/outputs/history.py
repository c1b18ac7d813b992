"""CI history: runs' gate metrics kept in a results database (:mod:`history_db`), read back as
a baseline for ``check --history`` and as the trend of one metric.

A recorded run is what ``traceview baseline`` learns from one run (:func:`gate.measure`: the
metric values, the per-step samples, the inputs' warnings) with a label, where it came from
(commit, branch, host, CI build: :mod:`ci_meta`) and the inputs' content hashes. The last N
recorded runs become the same baseline document a multi-run ``traceview baseline`` writes
(:func:`gate.baseline`), so ``check --history`` and ``check --baseline`` apply one rule.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
import xxhash

from traceview.outputs import gate
from traceview.outputs import history_db as db_
from traceview.outputs.history_db import (
    Database,
    HistoryError,
    NoHistoryYet,
    open_database,
    probe,
    refuse_read_only,
    upgrade,
)

__all__ = ["Database", "HistoryError", "NoHistoryYet", "StoredRun", "baseline_doc", "inputs_of",
           "open_database", "probe", "record", "recorded_runs", "refuse_read_only", "trend",
           "upgrade"]


@dataclass(frozen=True)
class StoredRun:
    """One recorded run: its row and its gate metrics."""

    id: int
    label: str
    recorded_at: str
    inputs_hash: str
    meta: dict[str, Any]
    inputs: list[dict[str, Any]]
    measured: gate.RunMetrics

    def to_dict(self) -> dict[str, Any]:
        """``history show --json``'s run: id, label, recorded_at, meta, metrics, inputs."""
        return {"id": self.id, "label": self.label, "recorded_at": self.recorded_at,
                "meta": self.meta, "metrics": dict(self.measured.values),
                "inputs_hash": self.inputs_hash, "inputs": self.inputs,
                "warnings": list(self.measured.warnings)}


def inputs_of(files: pl.DataFrame) -> tuple[list[dict[str, Any]], str]:
    """The inputs of a run (a TraceSet's ``files``: path, size_bytes, content_id) as
    ``[{"file", "bytes", "xxh3"}]`` by file name, and one hash of them all: the xxh3-128 of
    their sorted content hashes (where the files lie and what they are called does not
    count, what they hold does)."""
    rows = sorted(({"file": Path(p).name, "bytes": int(b or 0), "xxh3": c or ""}
                   for p, b, c in files.select("path", "size_bytes", "content_id").iter_rows()),
                  key=lambda r: (r["xxh3"], r["file"]))
    digest = xxhash.xxh3_128_hexdigest("\n".join(r["xxh3"] for r in rows).encode())
    return rows, digest


def now_utc() -> str:
    """UTC now as ISO 8601 with microseconds and Z: sorts as text, on every backend."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record(db: Database, measured: gate.RunMetrics, *, label: str, meta: dict[str, Any],
           inputs: list[dict[str, Any]], inputs_hash: str,
           recorded_at: str | None = None) -> tuple[int, bool]:
    """Store one run in one transaction; (its id, True) or, when this label already holds
    these inputs, (that run's id, False) with nothing written."""
    row = {"label": label, "inputs_hash": inputs_hash, "recorded_at": recorded_at or now_utc(),
           "commit_sha": meta.get("commit"), "branch": meta.get("branch"),
           "host": meta.get("host"), "meta": meta, "inputs": inputs,
           "warnings": list(measured.warnings)}
    metric_rows = [{"name": name, "value": measured.values.get(name), "unit": unit,
                    "note": measured.notes.get(name)}
                   for name, (unit, _) in gate.METRICS.items()]
    sample_rows = [{"kind": kind, "n": len(steps), "steps": [int(x) for x in steps]}
                   for kind, steps in sorted(measured.samples.items())]
    return db_.write(db, lambda conn: db_.insert_run(conn, row, metric_rows, sample_rows))


def recorded_runs(db: Database, *, label: str | None = None, last: int | None = None,
                  exclude_inputs: str | None = None) -> list[StoredRun]:
    """The recorded runs, oldest first: those whose label matches the glob ``label``, without
    the one holding ``exclude_inputs`` (the run being checked, if it was recorded), the
    ``last`` of them."""
    def work(conn: Any) -> list[StoredRun]:
        heads = [h for h in db_.run_headers(conn)
                 if (label is None or fnmatch.fnmatchcase(h["label"], label))
                 and h["inputs_hash"] != exclude_inputs]
        if last is not None:
            heads = heads[-last:] if last > 0 else []
        metric_rows, sample_rows = db_.run_details(conn, [h["id"] for h in heads])
        return [_stored(h, metric_rows[h["id"]], sample_rows[h["id"]]) for h in heads]

    return db_.read(db, work)


def _odd(head: dict[str, Any], metric_rows: list[dict[str, Any]],
         samples: dict[str, list[int]]) -> str | None:
    """What in a run's rows is not as ``record`` writes it (another program's rows, a hand
    edit), or None: such a run is refused by name, never half read."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for key in ("label", "recorded_at", "inputs_hash"):
        if not isinstance(head.get(key), str):
            return f"its {key} is not text"
    if not isinstance(head.get("meta") or {}, dict):
        return "its meta is not an object"
    inputs = head.get("inputs") or []
    if not isinstance(inputs, list) or not all(
            isinstance(i, dict) and isinstance(i.get("file"), str) for i in inputs):
        return "its inputs are not a list of files"
    found = head.get("warnings") or []
    if not isinstance(found, list) or not all(isinstance(w, str) for w in found):
        return "its warnings are not a list of text"
    for r in metric_rows:
        if not isinstance(r.get("name"), str) or not (r.get("value") is None
                                                      or number(r.get("value"))):
            return f"metric {r.get('name')!r} holds {r.get('value')!r}, not a number"
        if r.get("note") is not None and not isinstance(r.get("note"), str):
            return f"metric {r.get('name')!r} has a note that is not text"
    for kind, steps in samples.items():
        if not isinstance(steps, list) or not all(number(v) for v in steps):
            return f"its {kind} samples are not a list of numbers"
    return None


def _stored(head: dict[str, Any], metric_rows: list[dict[str, Any]],
            samples: dict[str, list[int]]) -> StoredRun:
    problem = _odd(head, metric_rows, samples)
    if problem is not None:
        raise ValueError(f"run #{head.get('id')}: {problem}")
    values = {name: None for name in gate.METRICS}
    values.update({r["name"]: r["value"] for r in metric_rows})
    notes = {r["name"]: r["note"] for r in metric_rows if r["note"] is not None}
    measured = gate.RunMetrics(values, notes, samples, tuple(head["warnings"] or ()))
    return StoredRun(head["id"], head["label"], head["recorded_at"], head["inputs_hash"],
                     dict(head["meta"] or {}), list(head["inputs"] or []), measured)


def baseline_doc(stored: list[StoredRun], *, source: str,
                 tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """The baseline document of these runs: what ``traceview baseline --run ...`` writes for
    the same runs, each run described by its id, label, commit and files."""
    if not stored:
        raise HistoryError(f"{source}: no recorded run matches (record some with `traceview "
                           "history record`, or widen --label / --last)")
    inputs = [{"history_id": s.id, "label": s.label, "recorded_at": s.recorded_at,
               "commit": s.meta.get("commit"), "files": [i["file"] for i in s.inputs]}
              for s in stored]
    return gate.baseline([s.measured for s in stored], inputs=inputs, tolerances=tolerances)


def trend(stored: list[StoredRun], metric: str) -> pl.DataFrame:
    """One metric over the runs, oldest first: id, label, recorded_at, commit, value, and
    ``change_frac`` against the previous run holding a value (a fraction)."""
    rows, previous = [], None
    for s in stored:
        value = s.measured.values.get(metric)
        change = (None if value is None or previous in (None, 0)
                  else (value - previous) / previous)
        rows.append({"id": s.id, "label": s.label, "recorded_at": s.recorded_at,
                     "commit": s.meta.get("commit"), "value": value, "change_frac": change})
        previous = value if value is not None else previous
    return pl.DataFrame(rows, schema={"id": pl.Int64, "label": pl.String,
                                      "recorded_at": pl.String, "commit": pl.String,
                                      "value": pl.Float64, "change_frac": pl.Float64})
