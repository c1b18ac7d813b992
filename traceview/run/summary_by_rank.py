"""``summary`` of a large run of several ranks, rank by rank: no process holds every rank's rows.

The whole-frame ``Run.summary`` collects the classified GPU rows, the host rows and the gaps of
every rank in one process: ~0.37 MB per MB of JSON, 5 GB for 64 ranks of 211 MB
(docs/scaling.md). But everything it reads is rank-local except the cross-rank straggler
verdict, and that reads small tables. So for a run of whole ranks (no step or time window)
whose stored events pass :data:`EVENTS_BY_RANK`, or whose trace set names an executor
(``--executor dask``):

* each task (a group of whole ranks of about :data:`EVENTS_PER_TASK` events, on the run's
  executor or local worker processes) opens a Run over its ranks' events files only and sends
  back :class:`RankTables`: the ranks' ``summary`` rows, whole-trace overlap rows, host step
  ranges, GPU rows without a launch, collective and send/recv calls, and the GPU time per
  (class, kernel name) that the unseen-communication warning reads;
* the driver concatenates them into a fresh Run of the whole window whose shared tables are
  those concatenations, and takes the straggler verdict, the bound and the warnings from it,
  the code the whole-frame path runs.

Every table is a pure function of one rank's events, so the answer is the whole-frame one, on
any executor and any grouping (``tests/test_summary_by_rank.py`` compares them). The driver
holds ``collective calls + steps + devices + kernel names`` rows per rank; a worker, one task's
ranks. What still reads every rank's events in the driver: the replay, built only where the
straggler analysis flags nobody and yet a rank causes waiting worth explaining
(``run.replay.worth_replaying``); it reads the op rows' nine columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceview.analyses.summary import summary
from traceview.store import executors
from traceview.store.executors import ExecutorSpec, TaskFailure
from traceview.store.traceset import TraceSet

#: Stored events from which a run of several ranks is summarised rank by rank: the whole-frame
#: path would hold ~180 MB of rows beside the interpreter (~90 B an event, log 53 of
#: docs/performance.md) and below it the workers' start costs more than it saves.
EVENTS_BY_RANK = 2_000_000

#: Events a task summarises at most, unless one rank alone has more: a worker holds ~90 B an
#: event; small ranks are grouped so that a task's start (~10-50 ms) stays small beside it.
EVENTS_PER_TASK = 1_000_000


@dataclass(frozen=True)
class RankTables:
    """What one task sends back for its ranks (small tables: never the events)."""

    summary: pl.DataFrame
    overlap: pl.DataFrame
    steps: pl.DataFrame
    unlaunched: pl.DataFrame
    comm: pl.DataFrame
    p2p: pl.DataFrame
    gpu_names: pl.DataFrame


def wanted(run: Any) -> bool:
    """Whether ``run``'s summary goes rank by rank: whole ranks, at least two of them, and
    either an executor named for the run or more than :data:`EVENTS_BY_RANK` stored events."""
    ts = run.traceset
    if not run.whole_ranks or ts._frame is not None or len(run.ranks_present) < 2:
        return False
    return ts.executor is not None or _stored_events(ts, run.ranks_present) > EVENTS_BY_RANK


def summary_by_rank(run: Any) -> tuple[Any, pl.DataFrame] | None:
    """(a Run of ``run``'s window whose shared tables are the ranks' tables, the summary's
    ``ranks`` table), or None where the whole-frame path answers (:func:`wanted`). A rank whose
    task keeps failing makes the whole-frame path answer: a summary leaves out no rank."""
    if not wanted(run):
        return None
    ts = run.traceset
    tasks = [(type(run), _ranks_set(ts, group), dataclasses.replace(run.options, ranks=group))
             for group in task_groups(ts, run.ranks_present)]
    results = _map(ts.executor, tasks)
    if any(isinstance(r, TaskFailure) for r in results):
        return None
    tables: list[RankTables] = results
    driver = type(run)(ts, run.options)
    seeded = {
        "overlap_rows": _concat([t.overlap for t in tables]).sort(
            "rank", "device", nulls_last=True),
        "steps": _concat([t.steps for t in tables]).sort("rank", "step"),
        "unlaunched": _concat([t.unlaunched for t in tables]),
        "_comm_calls": _concat([t.comm for t in tables]),
        "_p2p_calls": _concat([t.p2p for t in tables]),
        # what the unseen-communication warning reads of the GPU rows: their classes and
        # the GPU time per kernel name (sums of sums: the same totals)
        "gpu": _concat([t.gpu_names for t in tables]),
    }
    driver.__dict__.update(seeded)
    return driver, _concat([t.summary for t in tables]).sort("rank")


def rank_tables(run: Any) -> RankTables:
    """Worker task: the tables of :class:`RankTables` for the ranks of ``run`` (a Run over
    their events files only)."""
    gpu = run.gpu
    return RankTables(
        summary=summary(run.overlap_rows, run.steps, run.gap_rows(), run.ranks_table),
        overlap=run.overlap_rows, steps=run.steps, unlaunched=run.unlaunched,
        comm=run._comm_calls, p2p=run._p2p_calls,
        gpu_names=gpu.group_by("rank", "gpu_class", "name").agg(pl.col("dur_ns").sum())
        .sort("rank", "gpu_class", "name"))


def task_groups(ts: TraceSet, ranks: Sequence[int]) -> list[list[int]]:
    """``ranks`` in order, cut into groups of at most :data:`EVENTS_PER_TASK` stored events
    (a rank with more is a group of its own)."""
    counts = _events_per_rank(ts)
    groups: list[list[int]] = []
    total = 0
    for rank in ranks:
        n = counts.get(rank, 0)
        if groups and total + n <= EVENTS_PER_TASK:
            groups[-1].append(rank)
            total += n
        else:
            groups.append([rank])
            total = n
    return groups


def _map(executor: Any, tasks: list[tuple[Any, ...]]) -> list[Any]:
    """``_task`` over ``tasks`` on ``executor`` (an ``ExecutorSpec`` or an ``Executor``), or on
    local worker processes, whose fork server is stopped afterwards (it holds ~100 MB that the
    cross-rank steps after the map do not need)."""
    spec = executor if executor is not None else ExecutorSpec("local")
    ctx = executors.open_executor(spec) if isinstance(spec, ExecutorSpec) else nullcontext(spec)
    with ctx as pool:
        results = executors.run_tasks(pool, _task, tasks, retries=getattr(
            spec, "retries", executors.DEFAULT_RETRIES))
    if isinstance(spec, ExecutorSpec) and spec.kind == "local":
        executors.release_fork_server()
    return results


def _task(run_type: type, ts: TraceSet, options: Any) -> RankTables:
    """A task's Run: the run's own class (sent by reference: this module is below it), over
    the group's trace set, its window the group's ranks."""
    return rank_tables(run_type(ts, options))


def _ranks_set(ts: TraceSet, ranks: list[int]) -> TraceSet:
    """A trace set of ``ranks`` only: their events files, ranks, files and windows rows. No
    cache folder: tables kept for a group of ranks would serve no later command."""
    # a file of several ranks (rank None) is a part of each: once here, the task's window
    # (its ranks) keeps the group's rows
    parts = list({id(p): p for r in ranks for p in ts.parts_of(r)}.values())
    file_ids = ts.windows.filter(pl.col("rank").is_in(ranks)).get_column("file_id").unique()
    sub = TraceSet(parts, ts.ranks.filter(pl.col("rank").is_in(ranks)),
                   ts.files.filter(pl.col("file_id").is_in(file_ids.implode())),
                   windows=ts.windows.filter(pl.col("rank").is_in(ranks)),
                   rows={p.path: ts._rows[p.path] for p in parts
                         if getattr(p, "path", None) in ts._rows})
    return sub


def _events_per_rank(ts: TraceSet) -> dict[int, int]:
    per_file = dict(ts.files.select("file_id", "stored_events").iter_rows())
    out: dict[int, int] = {}
    for rank, file_id in ts.windows.select("rank", "file_id").iter_rows():
        out[rank] = out.get(rank, 0) + int(per_file.get(file_id) or 0)
    return out


def _stored_events(ts: TraceSet, ranks: Sequence[int]) -> int:
    counts = _events_per_rank(ts)
    return sum(counts.get(r, 0) for r in ranks)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(frames, how="diagonal_relaxed")


__all__ = ["EVENTS_BY_RANK", "EVENTS_PER_TASK", "RankTables", "rank_tables", "summary_by_rank",
           "task_groups", "wanted"]
