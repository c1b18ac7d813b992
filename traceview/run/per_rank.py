"""Per-rank analyses on an executor; cross-rank steps on the small tables that travel back.

A 1,024-rank run has far more events than one machine should hold. Everything in traceview's
cross-rank analyses reduces to small per-rank tables:

* ``comm``: one row per collective call (:func:`traceview.analyses.collective_match.comm_events`
  is rank-local: GPU communication kernels, or CPU calls for a rank without them);
* ``steps``: the rank's host ``ProfilerStep`` spans (:func:`traceview.analyses.window.step_spans`);
* ``overlap``: compute/communication overlap per (rank, device) (rank-local by definition);
* ``kinds``: event counts per kind.

:func:`summarise` computes those from one rank's events (a pure function, run on a worker by
:func:`map_ranks`); :func:`cross_rank` runs the cross-rank steps on the driver from the
summaries alone: collective matching, clock alignment, per-instance collective metrics and
stragglers. The answers equal the whole-frame analyses (``tests/test_dask.py`` checks it).

The driver holds ``sum over ranks of (collective calls + steps + devices)`` rows: for
1,024 ranks x 2,000 calls, 2 M rows of ~15 columns (~250 MB). See ``docs/scaling.md``.

>>> from traceview.schema import events_frame
>>> k = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
>>> ev = events_frame([dict(rank=r, file_id=r, source="kineto", kind="kernel", name=k,
...                         device=r, stream=7, ts_ns=100 * r, dur_ns=1000 - 100 * r)
...                    for r in (0, 1)])
>>> res = cross_rank([summarise(ev.filter(rank=r)) for r in (0, 1)], method="none")
>>> res.collectives.select("n_ranks", "skew_ns", "last_rank").row(0)
(2, 100, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceview.analyses.align import estimate_offsets
from traceview.analyses.collective_match import (
    COMM_SCHEMA,
    MatchResult,
    comm_events,
    match_collectives,
)
from traceview.analyses.nodes import rank_nodes
from traceview.analyses.collectives import collective_ranks, instances
from traceview.analyses.overlap import overlap, prepared_gpu
from traceview.analyses.stragglers import stragglers
from traceview.analyses.window import ranks_present, step_spans
from traceview.store.executors import (
    DEFAULT_RETRIES,
    ExecutorSpec,
    TaskFailure,
    open_executor,
    run_tasks,
)
from traceview.store.remote import _RemotePart
from traceview.store.traceset import Part

STEPS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "step": pl.Int64, "step_start_ns": pl.Int64, "step_end_ns": pl.Int64,
    "step_time_ns": pl.Int64,
}


@dataclass(frozen=True)
class RankSummary:
    """What one rank's worker sends back: small tables only (never the events)."""

    ranks: list[int]
    comm: pl.DataFrame
    steps: pl.DataFrame
    overlap: pl.DataFrame
    kinds: pl.DataFrame
    events: int

    def nbytes(self) -> int:
        """Estimated in-memory size of the tables (what the driver holds for this rank)."""
        return sum(int(t.estimated_size()) for t in (self.comm, self.steps, self.overlap,
                                                     self.kinds))


@dataclass(frozen=True)
class CrossRank:
    """Cross-rank results from the summaries. ``failed``: ranks/files whose task kept failing
    (one line each); their ranks are absent from every table."""

    offsets: pl.DataFrame
    match: MatchResult
    collectives: pl.DataFrame
    collective_ranks: pl.DataFrame
    stragglers: pl.DataFrame
    overlap: pl.DataFrame
    steps: pl.DataFrame
    kinds: pl.DataFrame
    failed: list[str] = field(default_factory=list)
    summary_bytes: int = 0


def summarise(events: pl.LazyFrame | pl.DataFrame) -> RankSummary:
    """The per-rank tables of the module docstring (works on any set of whole ranks)."""
    lf = events.lazy()
    present = ranks_present(lf).with_columns(pl.col("rank").cast(pl.Int32))
    ranks = present.get_column("rank").to_list()
    kinds = (lf.group_by("rank", pl.col("kind").cast(pl.String)).agg(n=pl.len())
             .sort("rank", "kind").collect())
    return RankSummary(
        ranks=[int(r) for r in ranks],
        # pg_ranks (the group's rank list as text) is dropped in transit: ``group`` already
        # carries the identity, and on a 16k-rank world group it is ~90 KB per row.
        comm=comm_events(lf).with_columns(pg_ranks=pl.lit(None, pl.String))
        .select(list(COMM_SCHEMA)).cast(COMM_SCHEMA),
        steps=step_spans(lf).cast(STEPS_SCHEMA),
        overlap=overlap(prepared_gpu(lf), present),
        kinds=kinds,
        events=int(kinds.get_column("n").sum()) if kinds.height else 0,
    )


def cross_rank(
    summaries: Sequence[RankSummary],
    *,
    method: str = "auto",
    reference_rank: int | None = None,
    hosts: pl.DataFrame | dict[int, str] | None = None,
    tolerance_ns: int = 500_000,
    failed: Sequence[str] = (),
) -> CrossRank:
    """Collective matching, alignment, collectives and stragglers from the summaries alone."""
    ranks = sorted({r for s in summaries for r in s.ranks})
    comm = (pl.concat([s.comm for s in summaries]) if summaries
            else pl.DataFrame(schema=COMM_SCHEMA)).sort("rank", "ts_ns")
    steps = (pl.concat([s.steps for s in summaries]) if summaries
             else pl.DataFrame(schema=STEPS_SCHEMA)).sort("rank", "step")
    overlap = (pl.concat([s.overlap for s in summaries], how="diagonal_relaxed")
               .sort("rank", "device", nulls_last=True) if summaries else pl.DataFrame())
    kinds = (pl.concat([s.kinds for s in summaries]).sort("rank", "kind") if summaries
             else pl.DataFrame(schema={"rank": pl.Int32, "kind": pl.String, "n": pl.UInt32}))
    match = match_collectives(comm, tolerance_ns=tolerance_ns)
    offsets = estimate_offsets(match, ranks, method=method, reference_rank=reference_rank,
                               hosts=hosts)
    # each rank's node from its host, as the Run's (analyses.nodes)
    host_table = hosts if isinstance(hosts, pl.DataFrame) or hosts is None else pl.DataFrame(
        {"rank": list(hosts), "host": list(hosts.values())},
        schema={"rank": pl.Int32, "host": pl.String})
    per = collective_ranks(match, offsets=offsets,
                           nodes=None if host_table is None else rank_nodes(host_table))
    rank_table = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int32})
    return CrossRank(
        offsets=offsets, match=match, collectives=instances(per), collective_ranks=per,
        stragglers=stragglers(per, steps, rank_table), overlap=overlap,
        steps=steps, kinds=kinds, failed=list(failed),
        summary_bytes=sum(s.nbytes() for s in summaries),
    )


# --- mapping over the ranks of a TraceSet -----------------------------------------------------

def _part_spec(part: Any) -> tuple[str, tuple[Any, ...]]:
    if isinstance(part, _RemotePart):
        return "store", (part.location, part.name, part.part.fields())
    return "file", part.fields()


def summarise_task(specs: list[tuple[str, tuple[Any, ...]]], rank: int) -> RankSummary:
    """Worker task: read one rank's events where they are stored and summarise them."""
    frames = [(_RemotePart(a[0], a[1], Part(*a[2])) if kind == "store" else Part(*a)).scan()
              for kind, a in specs]
    events = pl.concat(frames, how="vertical").filter(pl.col("rank") == rank).collect()
    return summarise(events)


def map_ranks(ts: Any, *, executor: Any = None, ranks: Sequence[int] | None = None,
              retries: int | None = None) -> tuple[list[RankSummary], list[str]]:
    """:func:`summarise` every rank of ``ts`` on ``executor`` (``ExecutorSpec``, ``Executor``,
    ``"local"``/``"dask"``; None: in this process). Returns the summaries and one line per
    rank whose task kept failing (naming its file)."""
    ts = getattr(ts, "traceset", ts)  # a Run maps the ranks of its trace set
    paths = dict(ts.files.select("file_id", "path").iter_rows())
    wanted = set(ranks) if ranks is not None else None
    # every window's file of the rank (``TraceSet.parts_of``); the first names it on failure
    tasks = [([_part_spec(p) for p in ts.parts_of(rank)], rank)
             for rank, fid in ts.ranks.select("rank", "file_id").iter_rows()
             if wanted is None or rank in wanted]
    if executor is None:
        results: list[Any] = [summarise_task(*t) for t in tasks]
    else:
        spec = ExecutorSpec(executor) if isinstance(executor, str) else executor
        if retries is None:
            retries = spec.retries if isinstance(spec, ExecutorSpec) else DEFAULT_RETRIES
        ctx = open_executor(spec) if isinstance(spec, ExecutorSpec) else nullcontext(spec)
        with ctx as pool:
            results = run_tasks(pool, summarise_task, tasks, retries=retries)
    summaries = [r for r in results if isinstance(r, RankSummary)]
    failed = []
    for (spec_list, rank), r in zip(tasks, results):
        if isinstance(r, TaskFailure):
            fid = spec_list[0][1][1] if spec_list[0][0] == "file" else spec_list[0][1][2]
            failed.append(f"{paths.get(fid, '?')}: rank {rank}: analysis failed ({r.error}; "
                          f"failed {r.attempts} attempts)")
    return summaries, failed


def analyse(ts: Any, *, executor: Any = None, method: str = "auto",
            reference_rank: int | None = None, tolerance_ns: int = 500_000,
            ranks: Sequence[int] | None = None) -> CrossRank:
    """Per-rank summaries on ``executor``, then :func:`cross_rank` on the driver."""
    summaries, failed = map_ranks(ts, executor=executor, ranks=ranks)
    return cross_rank(summaries, method=method, reference_rank=reference_rank,
                      hosts=ts.ranks, tolerance_ns=tolerance_ns, failed=failed)


__all__ = ["CrossRank", "RankSummary", "analyse", "cross_rank", "map_ranks", "summarise",
           "summarise_task"]
