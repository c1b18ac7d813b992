"""Is this run analysable? Pure checks over a run's tables -> problems, each with the fix.

Input: ``files``, one row per trace file (``file_id``, ``path``, ``rank``, ``rank_from``,
``world_size``, ``warnings`` (JSON list), ``dropped`` (JSON object), ``error`` (null when the
file was read)), and the ``events`` of the readable files (schema of :mod:`traceview.schema`,
``file_id`` pointing into ``files``). Optionally the ``run.json`` that
:func:`traceview.capture.profile` writes. :func:`validate_traceset` builds the tables from an
opened :class:`~traceview.store.traceset.TraceSet`; ``traceview validate`` opens each file on its own
so that duplicated ranks and unreadable files are reported instead of stopping the run.

Checks (``Problem.code``):

* ``unreadable_file``, ``truncated_file`` (per file), ``no_rank`` (a file of a multi-file run
  names no rank);
* ``duplicate_rank`` (two files claim one rank and their times overlap; disjoint ones are
  the rank's profiling windows: ``traceview.store.windows``), ``mixed_runs`` (disjoint files
  of one rank that are two runs, not one process's windows: ``traceview.store.runs``, the rule
  every command applies), ``missing_rank`` (a rank of
  ``0 .. world_size - 1`` wrote nothing; several such ranks are one problem listing them in
  ``ranks``, with ``rank`` null; the world size comes from run.json, else the largest the
  traces claim), ``unexpected_rank``, ``world_size_mismatch``;
* ``no_steps`` (no ``ProfilerStep#N`` range on a rank);
* ``no_anchors`` (a rank of a multi-rank run has no blocking collective matched with another
  rank: no ``traceview::sync`` probe and no collectives, so clocks cannot be aligned);
* ``windows_disjoint`` (a rank's recorded time span does not overlap the reference rank's, on
  the raw clocks), ``steps_disjoint`` (no profiler step number in common with the reference).

The reference rank is the lowest rank present. Cross-rank checks use the first file of each
rank.

>>> from traceview.schema import events_frame
>>> ev = events_frame([dict(rank=0, file_id=0, source="kineto", kind="user_annotation",
...                         name="ProfilerStep#2", ts_ns=0, dur_ns=10)])
>>> files = files_frame([dict(file_id=0, path="rank-0.json", rank=0, world_size=1)])
>>> [p.code for p in validate(ev, files)]
[]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import polars as pl

from traceview import selection
from traceview.analyses.align import anchors_from
from traceview.analyses.collective_match import comm_events, match_collectives
from traceview.capture.sync_probe import SYNC_NAME
from traceview.store.runs import RunIdentity, clock_difference, run_difference
from traceview.store.steps import step_ranges
from traceview.store.windows import HOST_KINDS as _HOST_KINDS

FILES_SCHEMA: dict[str, pl.DataType] = {
    "file_id": pl.Int32, "path": pl.String, "rank": pl.Int32, "rank_from": pl.String,
    "world_size": pl.Int32, "warnings": pl.String, "dropped": pl.String, "error": pl.String,
    # what tells two runs from one process's windows (``traceview.store.runs``); may be null
    "source": pl.String, "host": pl.String, "backend": pl.String, "pg_config": pl.String,
}

#: Kinds whose timestamps are not recorded activity (excluded from a rank's time window).
_NOT_ACTIVITY = ("metadata",)

FIX = {
    "unreadable_file": "the file is not a trace traceview can read: re-export it "
                       "(prof.export_chrome_trace / nsys export --type sqlite), and make sure the "
                       "job was not killed while writing it",
    "truncated_file": "the trace was cut off while being written: let every rank leave the "
                      "profiler block (traceview.capture.profile or prof.stop()) before the "
                      "process exits, do not kill ranks at a timeout, and check free disk space",
    "no_rank": "the trace names no rank: initialise torch.distributed before starting the "
               "profiler (Kineto then writes distributedInfo.rank) or name files rank-<R>.*; "
               "traceview.capture.profile does both",
    "duplicate_rank": "each rank must write one file per run (or per profiling window, the "
                      "windows apart in time): remove traces left from "
                      "an earlier run (write each run to a fresh directory) or use "
                      "traceview.capture.profile, whose file names carry rank, host and pid",
    "mixed_runs": "the directory mixes runs: write each run to its own directory (or pick "
                  "one with --run-of FILE); traceview.capture.profile names each run's files "
                  "by rank, host and pid",
    "missing_rank": "every rank must run the profiler, not only rank 0: call "
                    "traceview.capture.profile (or torch.profiler) on all ranks, and check this "
                    "rank's log for a crash before it wrote its trace",
    "unexpected_rank": "the directory mixes runs of different sizes: write each run to its "
                       "own directory",
    "world_size_mismatch": "the files come from runs with different world sizes: write each "
                           "run to its own directory",
    "no_steps": "call prof.step() once per training iteration inside the profiler block "
                "(traceview.capture.profile handle.step()), with a schedule whose active >= 1",
    "no_anchors": "give the alignment blocking collectives inside the active window: keep the "
                  "traceview::sync probe of traceview.capture.profile on (sync=True) or call "
                  "dist.barrier() inside the profiled steps",
    "windows_disjoint_clock": "the ranks profiled the same steps but their clocks differ: "
                              "synchronise the hosts' clocks (chrony/NTP) and keep the "
                              "traceview::sync probe on so traceview align can correct the rest",
    "windows_disjoint": "profile the same iterations on every rank: use one schedule "
                        "(wait/warmup/active) on all ranks and call prof.step() on every rank "
                        "every iteration",
    "steps_disjoint": "profile the same iterations on every rank: use one schedule "
                      "(wait/warmup/active) on all ranks and call prof.step() on every rank "
                      "every iteration",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run, and what to change in the capture."""

    code: str
    message: str
    fix: str
    rank: int | None = None
    file: str | None = None
    files: list[str] = field(default_factory=list)
    #: every rank the problem is about: ``[rank]``, or several with ``rank`` null (ranks 2–127
    #: of a 128-rank job missing are one problem, not 126)
    ranks: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def files_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A typed ``files`` table from a few dicts (missing columns are null)."""
    full = [{k: r.get(k) for k in FILES_SCHEMA} for r in rows]
    return pl.DataFrame(full, schema=FILES_SCHEMA, orient="row")


def _problem(code: str, message: str, *, rank: int | None = None, file: str | None = None,
             files: list[str] | None = None, fix: str | None = None,
             ranks: list[int] | None = None) -> Problem:
    return Problem(code=code, message=message, fix=fix or FIX[code], rank=rank, file=file,
                   files=files or [], ranks=ranks or ([] if rank is None else [rank]))


def check_files(files: pl.DataFrame, *, run_info: dict[str, Any] | None = None) -> list[Problem]:
    """File-level checks: unreadable, truncated, no rank, duplicates, missing ranks."""
    out: list[Problem] = []
    rows = files.sort("file_id").to_dicts()
    readable = [r for r in rows if r["error"] is None]
    seen: set[int] = set()
    for r in rows:
        if r["file_id"] in seen:  # a file holding several ranks (nsys): file checks once
            continue
        seen.add(r["file_id"])
        if r["error"] is not None:
            out.append(_problem("unreadable_file", f"{r['path']}: {r['error']}", file=r["path"]))
            continue
        warnings = orjson.loads(r["warnings"] or "[]")
        dropped = orjson.loads(r["dropped"] or "{}")
        cut = [w for w in warnings if "truncated" in w]
        if cut or dropped.get("truncated"):
            out.append(_problem("truncated_file", f"{r['path']}: "
                                + ("; ".join(cut) or "input is truncated"),
                                rank=r["rank"], file=r["path"]))
        if r["rank_from"] == "default" and len(rows) > 1:
            out.append(_problem("no_rank", f"{r['path']}: names no rank (read as rank "
                                f"{r['rank']})", file=r["path"]))
    by_rank: dict[int, list[str]] = {}
    for r in readable:
        if r["rank"] is not None:
            by_rank.setdefault(int(r["rank"]), []).append(r["path"])
    for rank, paths in sorted(by_rank.items()):
        if len(paths) > 1:
            out.append(_problem("duplicate_rank", f"rank {rank} is claimed by {len(paths)} "
                                f"files: {', '.join(paths)}", rank=rank, file=paths[1],
                                files=paths))
    claimed = sorted({int(r["world_size"]) for r in readable if r["world_size"] is not None})
    expected = (run_info or {}).get("world_size")
    if len(claimed) > 1:
        out.append(_problem("world_size_mismatch", f"the traces claim world sizes "
                            f"{', '.join(map(str, claimed))}"))
    if expected is None and claimed:
        expected = claimed[-1]
    if expected is None or not readable:
        return out
    expected = int(expected)
    expected_files = {int(p["rank"]): p.get("file") for p in (run_info or {}).get("ranks", [])
                      if isinstance(p, dict) and p.get("rank") is not None}
    source = "run.json" if (run_info or {}).get("world_size") is not None else "the traces"
    missing = [rank for rank in range(expected) if rank not in by_rank]
    if len(missing) == 1:
        out.append(_problem("missing_rank", f"rank {missing[0]} of world size {expected} (from "
                            f"{source}) has no trace", rank=missing[0],
                            file=expected_files.get(missing[0])))
    elif missing:  # one problem for them all: its fix is the same
        out.append(_problem("missing_rank", f"ranks {selection.say_ranks(missing)} of world size "
                            f"{expected} (from {source}) have no trace ({len(missing)} ranks)",
                            ranks=missing, files=[f for r in missing
                                                  if (f := expected_files.get(r))]))
    for rank in sorted(r for r in by_rank if r >= expected):
        out.append(_problem("unexpected_rank", f"rank {rank} is outside world size {expected} "
                            f"(from {source})", rank=rank, file=by_rank[rank][0]))
    return out


def _first_file_per_rank(events: pl.LazyFrame, files: pl.DataFrame) -> pl.LazyFrame:
    first = (files.filter(pl.col("error").is_null() & pl.col("rank").is_not_null())
             .sort("file_id").unique("rank", keep="first").select("file_id"))
    return events.join(first.lazy(), on="file_id", how="semi")


def rank_windows(events: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per rank: first start and last end of recorded activity (raw clock), sync-span count.

    Columns: rank, start_ns, end_ns, events, sync_spans.
    """
    return (
        events.lazy()
        .filter(~pl.col("kind").cast(pl.String).is_in(list(_NOT_ACTIVITY)))
        .group_by("rank")
        .agg(start_ns=pl.col("ts_ns").min(),
             end_ns=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max(),
             events=pl.len(),
             sync_spans=(pl.col("name").cast(pl.String) == SYNC_NAME).sum())
        .sort("rank")
        .collect()
    )


def check_events(events: pl.LazyFrame | pl.DataFrame,
                 files: pl.DataFrame | None = None) -> list[Problem]:
    """Event-level checks over one file per rank: steps, anchors, overlapping windows. With
    ``files`` (their paths and hosts), ranks of one host that profiled the same steps at
    different times are ``mixed_runs``, as ingest refuses them (``runs.clock_difference``)."""
    ev = events.lazy()
    windows = rank_windows(ev)
    ranks = windows.get_column("rank").to_list()
    if not ranks:
        return []
    out: list[Problem] = []
    steps = step_ranges(ev).drop_nulls("step").collect()  # a number past int64: no step
    step_sets = {int(r): set(g.get_column("step").to_list())
                 for (r,), g in steps.group_by("rank")}
    for rank in ranks:
        if not step_sets.get(rank):
            out.append(_problem("no_steps", f"rank {rank} has no ProfilerStep#N range, so "
                                "per-step analyses and step windows have nothing to use",
                                rank=rank))
    if len(ranks) >= 2:
        frame = ev.collect()
        anchors = anchors_from(match_collectives(comm_events(frame)))
        per = dict(anchors.group_by("rank").agg(n=pl.len()).rows())
        sync = dict(windows.select("rank", "sync_spans").rows())
        for rank in ranks:
            if not per.get(rank):
                out.append(_problem(
                    "no_anchors", f"rank {rank} has no blocking collective matched with another "
                    f"rank ({sync.get(rank, 0)} {SYNC_NAME} spans): its clock cannot be aligned",
                    rank=rank))
    ref = windows.row(0, named=True)
    ref_steps = step_sets.get(ref["rank"], set())
    for w in windows.iter_rows(named=True):
        if w["rank"] == ref["rank"]:
            continue
        own_steps = step_sets.get(w["rank"], set())
        common = own_steps & ref_steps
        overlap = min(w["end_ns"], ref["end_ns"]) - max(w["start_ns"], ref["start_ns"])
        mixed = _two_runs(ref, w, ref_steps, own_steps, files) if overlap <= 0 else None
        if mixed is not None:
            out.append(mixed)
        elif overlap <= 0:
            gap_s = -overlap / 1e9
            when = "after" if w["start_ns"] >= ref["end_ns"] else "before"
            same_steps = bool(common)
            out.append(_problem(
                "windows_disjoint",
                (f"rank {w['rank']}'s recorded span starts {gap_s:.3f} s after rank "
                 f"{ref['rank']}'s ends (raw clocks); " if when == "after" else
                 f"rank {w['rank']}'s recorded span ends {gap_s:.3f} s before rank "
                 f"{ref['rank']}'s starts (raw clocks); ")
                + ("they share profiler steps " + _steps_text(common)
                   + ", so the hosts' clocks differ" if same_steps else
                   "their profiler steps are " + _steps_text(own_steps) + " and "
                   + _steps_text(ref_steps)),
                rank=w["rank"],
                fix=FIX["windows_disjoint_clock" if same_steps else "windows_disjoint"]))
        if own_steps and ref_steps and not common:
            out.append(_problem(
                "steps_disjoint", f"rank {w['rank']} profiled steps {_steps_text(own_steps)}, "
                f"rank {ref['rank']} steps {_steps_text(ref_steps)}: none in common",
                rank=w["rank"]))
    return out


def _two_runs(ref: dict[str, Any], other: dict[str, Any], ref_steps: set[int],
              own_steps: set[int], files: pl.DataFrame | None) -> Problem | None:
    """``mixed_runs`` when the reference rank and ``other`` (their rows of
    :func:`rank_windows`) are two runs by their times on one host's clock, else None."""
    if files is None or not ref_steps or not own_steps:
        return None
    first = (files.filter(pl.col("error").is_null() & pl.col("rank").is_not_null())
             .sort("file_id").unique("rank", keep="first"))
    row = {r["rank"]: r for r in first.iter_rows(named=True)}
    if ref["rank"] not in row or other["rank"] not in row:
        return None
    ids = sorted((RunIdentity(path=row[w["rank"]]["path"], host=row[w["rank"]]["host"],
                              start_ns=w["start_ns"], end_ns=w["end_ns"],
                              first_step=min(steps), last_step=max(steps))
                  for w, steps in ((ref, ref_steps), (other, own_steps))),
                 key=lambda f: f.start_ns)
    why = clock_difference(*ids)
    if why is None:
        return None
    return _problem("mixed_runs", f"{ids[0].path} and {ids[1].path} are "
                    f"two runs ({why})", rank=other["rank"], file=row[other["rank"]]["path"],
                    files=[f.path for f in ids])


def _steps_text(steps: set[int]) -> str:
    if not steps:
        return "none"
    s = sorted(steps)
    return f"{s[0]}..{s[-1]}" if len(s) > 1 else str(s[0])


def validate(events: pl.LazyFrame | pl.DataFrame, files: pl.DataFrame, *,
             run_info: dict[str, Any] | None = None) -> list[Problem]:
    """All checks: :func:`check_files`, then :func:`check_events` on one file per rank. A
    ``duplicate_rank`` whose files are disjoint in time is the rank's profiling windows (no
    problem), or ``mixed_runs`` when they are not one process's."""
    problems = []
    for p in check_files(files, run_info=run_info):
        if p.code == "duplicate_rank":
            p = _windows_or_runs(events, files, p)
        if p is not None:
            problems.append(p)
    ev = _first_file_per_rank(events.lazy(), files)
    return problems + check_events(ev, files)


def _windows_or_runs(events: pl.LazyFrame | pl.DataFrame, files: pl.DataFrame,
                     problem: Problem) -> Problem | None:
    """A ``duplicate_rank`` problem as it stands (times overlap, or a file without events),
    None (one process's profiling windows), or ``mixed_runs`` naming what differs."""
    rows = {r["file_id"]: r for r in files.filter(pl.col("path").is_in(problem.files)
                                                  & (pl.col("rank") == problem.rank)).to_dicts()}
    host = pl.col("kind").cast(pl.String).is_in(_HOST_KINDS)
    spans = (events.lazy().filter(pl.col("file_id").is_in(list(rows))).group_by("file_id")
             .agg(start=pl.col("ts_ns").min(),
                  end=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max(),
                  first_step=pl.col("step").min(), last_step=pl.col("step").max(),
                  pid=pl.col("pid").filter(host).drop_nulls().mode().first())
             .sort("start").collect())
    if spans.height != len(rows):
        return problem  # a file without events has no place in time
    if not (spans["start"].shift(-1) >= spans["end"]).fill_null(True).all():
        return problem
    ids = [RunIdentity(
        path=rows[s["file_id"]]["path"], source=rows[s["file_id"]]["source"],
        host=rows[s["file_id"]]["host"], pid=s["pid"],
        world_size=rows[s["file_id"]]["world_size"], backend=rows[s["file_id"]]["backend"],
        pg_config=rows[s["file_id"]]["pg_config"], start_ns=s["start"], end_ns=s["end"],
        first_step=s["first_step"], last_step=s["last_step"]) for s in spans.to_dicts()]
    for before, after in zip(ids, ids[1:]):
        why = run_difference(before, after)
        if why:
            return _problem("mixed_runs", f"{before.path} and "
                            f"{after.path} are two runs ({why})", rank=problem.rank,
                            file=after.path, files=[before.path, after.path])
    return None


def validate_traceset(ts: Any, *, run_info: dict[str, Any] | None = None) -> list[Problem]:
    """:func:`validate` for an opened TraceSet (whose ranks are already unique)."""
    files = ts.files.select("file_id", "path", "warnings", "dropped").join(
        ts.ranks.select("file_id", "rank", "rank_from", "world_size", "source", "host",
                        "backend", "pg_config"), on="file_id", how="left")
    files = files.with_columns(error=pl.lit(None, pl.String)).select(list(FILES_SCHEMA)).cast(
        FILES_SCHEMA)
    return validate(ts.events, files, run_info=run_info)
