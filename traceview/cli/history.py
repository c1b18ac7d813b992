"""``traceview history``: a results database of CI runs (docs/ci-gate.md, *History*).

* ``history record RUN... --db URL [--label L] [--meta K=V ...]``: the run's gate metrics and
  per-step samples (what ``baseline`` learns from one run), its label, where it came from (the
  CI system's commit, branch and build, the host, the time; ``--meta`` over them) and its
  inputs' content hashes. The same inputs under the same label again: nothing is written.
* ``history show --db URL [--label GLOB] [--last N] [--metric NAME] [--json | --csv]``: the
  runs oldest first with their metrics; ``--metric`` the trend of one.
* ``history upgrade --db URL``: bring an older database to this version's schema.

``--json`` contracts (fields may be added, never renamed): ``record``: ``{"id", "label",
"new", "db", "inputs_hash", "meta", "metrics", "warnings"}``; ``show``: ``{"runs": [{"id",
"label", "recorded_at", "meta", "metrics": {NAME: value}, "inputs_hash", "inputs",
"warnings"}]}``, with ``--metric`` also ``"metric"`` and ``"trend": [{"id", "label",
"recorded_at", "commit", "value", "change_frac"}]``. A plain path for ``--db`` is a SQLite
file. A database that cannot be used (bad URL, unreachable, another program's, newer) is one
line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from traceview.cli._options import add_json_arg
from traceview.cli._render import emit_json, ms, table, warn
from traceview.cli.report import _inputs, _open
from traceview.errors import UsageError
from traceview.outputs import gate, history
from traceview.outputs.ci_meta import ci_metadata, is_utf8, parse_meta
from traceview.outputs.history_schema import MAX_LABEL_CHARS
from traceview.run.result import csv_text
from traceview.store.safe_write import refuse_input_overlap

#: Short column names of the metrics in text tables (the full names are in --json / --csv).
SHORT = {"step_time_p50_ns": "step_p50_ms", "step_time_max_ns": "step_max_ms",
         "compute_per_step_ns": "compute_ms", "exposed_comm_per_step_ns": "exp_comm_ms",
         "idle_per_step_ns": "idle_ms", "gpu_idle_fraction": "gpu_idle",
         "collective_wait_per_step_ns": "wait_ms",
         "straggler_imposed_wait_per_step_ns": "imposed_ms"}


def configure(p: argparse.ArgumentParser, command: str) -> None:
    p.set_defaults(run=_no_action)  # each action sets its own
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    rec = sub.add_parser("record", help="store a run's gate metrics in the database")
    _inputs(rec)
    _db(rec)
    rec.add_argument("--label", default=None,
                     help="what the run is a run of (default: the CI branch, else 'default')")
    rec.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                     help="metadata over what the CI environment gives (repeatable)")
    rec.set_defaults(run=run_record)
    show = sub.add_parser("show", help="the recorded runs, oldest first, with their metrics")
    _db(show)
    select_args(show, last_default=None)
    show.add_argument("--metric", default=None, metavar="NAME",
                      help=f"the trend of one metric ({', '.join(gate.METRICS)})")
    add_json_arg(show, csv=True)
    show.set_defaults(run=run_show)
    up = sub.add_parser("upgrade", help="bring the database to this traceview's schema")
    _db(up)
    up.set_defaults(run=run_upgrade)


def _no_action(args: argparse.Namespace) -> int:
    raise UsageError("history: give an action: record, show or upgrade")


def _db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", required=True, metavar="URL",
                   help="the results database: a SQLite file path, sqlite:///FILE or "
                        "postgresql://USER@HOST/DB")


def select_args(p: argparse.ArgumentParser, *, last_default: int | None,
                prefix: str = "") -> None:
    """--label GLOB and --last N (shared with check --history and report --history)."""
    p.add_argument(f"--{prefix}label", default=None, metavar="GLOB",
                   help="only runs whose label matches this glob (e.g. main, 'release-*')")
    p.add_argument(f"--{prefix}last", type=_positive, default=last_default, metavar="N",
                   help="only the last N matching runs"
                        + (f" (default {last_default})" if last_default else ""))


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 1, got {text!r}")
    return n


def run_meta(env: Any, extra: list[str]) -> dict[str, str]:
    """Where this run came from: the CI environment, the host, ``--meta`` over both. A CI
    variable's bytes that are not UTF-8 are kept as U+FFFD (a database holds text)."""
    found = {k: v if is_utf8(v) else v.encode("utf-8", "surrogateescape").decode(
        "utf-8", "replace") for k, v in ci_metadata(env).items()}
    return {**found, "host": socket.gethostname(), **parse_meta(extra)}


def run_record(args: argparse.Namespace) -> int:
    meta = run_meta(os.environ, args.meta)
    label = args.label or meta.get("branch") or "default"
    if not is_utf8(label):
        raise UsageError(f"--label {label.encode('utf-8', 'surrogateescape')!r}: not valid "
                         "UTF-8")
    if len(label) > MAX_LABEL_CHARS:
        raise UsageError(f"history record: a label is at most {MAX_LABEL_CHARS} characters, "
                         f"this one has {len(label)} (--label, or the CI branch)")
    db = history.open_database(args.db, create=True)
    if db.path is not None:  # a SQLite file: never inside an input folder (the run breaks)
        refuse_input_overlap(db.path, args.paths, option="--db")
    history.refuse_read_only(db)
    history.probe(db)  # a database that is not ours fails before the traces are read
    run = _open(args)
    measured = gate.measure(run)
    inputs, digest = history.inputs_of(run.files)
    run_id, new = history.record(db, measured, label=label, meta=meta, inputs=inputs,
                                 inputs_hash=digest)
    if args.json:
        emit_json({"id": run_id, "label": label, "new": new, "db": db.where,
                   "inputs_hash": digest, "meta": meta, "metrics": measured.values,
                   "warnings": list(measured.warnings)})
        return 0
    if new:
        print(f"recorded run #{run_id} as {label!r} in {db.where} "
              f"({sum(v is not None for v in measured.values.values())} metrics"
              + (f", commit {meta['commit'][:12]}" if meta.get("commit") else "") + ")")
    else:
        print(f"already recorded: run #{run_id} holds these inputs under {label!r}; "
              "nothing written")
    for w in measured.warnings:
        print(f"warning recorded: {w}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    if args.metric is not None and args.metric not in gate.METRICS:
        raise UsageError(f"--metric: unknown metric {args.metric!r}; metrics: "
                         f"{', '.join(gate.METRICS)}")
    db = history.open_database(args.db, create=False)
    runs = history.recorded_runs(db, label=args.label, last=args.last)
    trend = history.trend(runs, args.metric) if args.metric else None
    if args.json:
        out: dict[str, Any] = {"runs": [r.to_dict() for r in runs]}
        if trend is not None:
            out.update(metric=args.metric, trend=trend.to_dicts())
        emit_json(out)
        return 0
    if args.csv:
        sys.stdout.write(csv_text(trend) if trend is not None else _runs_csv(runs))
        return 0
    if not runs:
        warn(f"{db.where}: no recorded run matches")
        return 0
    if trend is not None:
        unit = gate.METRICS[args.metric][0]
        print(f"{args.metric} over {len(runs)} runs, oldest first")
        print(table(["id", "label", "recorded_at", "commit", _unit_header(args.metric),
                     "vs_previous"],
                    [[r["id"], r["label"], r["recorded_at"][:19], (r["commit"] or "")[:12] or None,
                      _value(r["value"], unit),
                      None if r["change_frac"] is None else f"{100 * r['change_frac']:+.1f}%"]
                     for r in trend.iter_rows(named=True)],
                    left={"label", "recorded_at", "commit"}))
        return 0
    shown = [m for m in gate.METRICS if any(r.measured.values.get(m) is not None for r in runs)]
    print(table(["id", "label", "recorded_at", "commit", *(SHORT[m] for m in shown)],
                [[r.id, r.label, r.recorded_at[:19], (r.meta.get("commit") or "")[:12] or None,
                  *(_value(r.measured.values.get(m), gate.METRICS[m][0]) for m in shown)]
                 for r in runs], left={"label", "recorded_at", "commit"}))
    return 0


def _unit_header(metric: str) -> str:
    return SHORT.get(metric, metric)


def _value(v: float | None, unit: str) -> str | None:
    return ms(v) if unit == "ns" else (None if v is None else f"{v:.4f}")


def _runs_csv(runs: list[history.StoredRun]) -> str:
    import polars as pl

    rows = [{"id": r.id, "label": r.label, "recorded_at": r.recorded_at,
             "commit": r.meta.get("commit"), "branch": r.meta.get("branch"),
             "host": r.meta.get("host"), **r.measured.values} for r in runs]
    schema = {"id": pl.Int64, "label": pl.String, "recorded_at": pl.String,
              "commit": pl.String, "branch": pl.String, "host": pl.String,
              **{m: pl.Float64 for m in gate.METRICS}}
    return csv_text(pl.DataFrame(rows, schema=schema))


def run_upgrade(args: argparse.Namespace) -> int:
    db = history.open_database(args.db, create=False)
    version = history.upgrade(db)
    print(f"{db.where}: schema version {version}")
    return 0
