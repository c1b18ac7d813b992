"""GPU idle gaps and their causes.

Per device: the busy union across all streams, and the gaps between busy intervals. Per
stream: the same on one stream. Each gap gets one cause. First, what held the host: of

* ``sync``: a host synchronisation (kind ``sync``, or a runtime call matching
  ``GapOptions.sync_pattern``: cudaDeviceSynchronize, cudaStreamSynchronize,
  cudaEventSynchronize, blocking cudaMemcpy, their HIP twins),
* ``blocking_copy``: a runtime copy call (``GapOptions.copy_pattern``: cudaMemcpyAsync and
  the other cudaMemcpy*/hipMemcpy*/cuMemcpy* calls) whose GPU copy moves data to or from
  pageable host memory (its name matches ``GapOptions.pageable_pattern``, as in ``Memcpy DtoH
  (Device -> Pageable)``): such a copy holds the host, whatever its name says, until the GPU
  has reached it (device to pageable) or staged it (pageable to device),
* ``data_loading``: a host op matching ``GapOptions.dataloader_pattern``,

the one covering most of the gap (ties in that order). Else the first that applies:

1. ``between_steps``: the GPU work before and after the gap was launched in different steps;
2. ``host``: the runtime call that launched the work after the gap began at or after the gap
   began (the GPU had nothing queued: waiting on the host);
3. ``launch_overhead``: the gap is shorter than ``GapOptions.launch_overhead_ns``;
4. ``graph``: the work after the gap is a node of a CUDA/HIP graph launched before the gap
   (its launch matches ``GapOptions.graph_pattern``): the GPU had the graph and ran its nodes
   as the graph's own dependencies allowed (event waits, nodes on other streams, host nodes);
5. ``other``: anything else (cross-stream waits, work without a matching launch, ...).

Definitions with a worked example: docs/metrics.md, section "GPU time: gaps".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from .intervals import flag_overlapping, overlapping, union
from .launches import RUNTIME_KINDS, launch_table, with_launches
from .names import matching
from .overlap import NOTE_NO_GPU
from .window import file_of

Frame = pl.LazyFrame | pl.DataFrame

CAUSES: tuple[str, ...] = (
    "sync", "blocking_copy", "data_loading", "between_steps", "host", "launch_overhead",
    "graph", "other",
)

#: Histogram bucket edges (ns): <1 µs, 1-10 µs, 10-100 µs, 0.1-1 ms, 1-10 ms, 10-100 ms, >=100 ms.
DEFAULT_EDGES_NS: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)


@dataclass(frozen=True)
class GapOptions:
    """Thresholds and patterns for gap attribution (all overridable)."""

    launch_overhead_ns: int = 10_000
    sync_pattern: str = (
        r"(?i)^(cuda|hip)(Device|Stream|Event|Ctx)Synchroni[sz]e$|^(cuda|hip)Memcpy$"
    )
    dataloader_pattern: str = (
        r"(?i)dataloader|_MultiProcessingDataLoaderIter|_SingleProcessDataLoaderIter"
    )
    copy_pattern: str = r"(?i)^(cuda|hip)Memcpy|^cuMemcpy"
    pageable_pattern: str = r"(?i)pageable"
    graph_pattern: str = r"(?i)^(cuda|hip)GraphLaunch|^cuGraphLaunch"


DEFAULT_OPTIONS = GapOptions()


def gaps(
    gpu: pl.DataFrame,
    host: pl.DataFrame,
    *,
    per_stream: bool = False,
    options: GapOptions = DEFAULT_OPTIONS,
) -> pl.DataFrame:
    """Every idle gap per (rank, device) -- or per (rank, device, stream) -- with its cause.

    Columns: rank, device, [stream,] gap_start_ns, gap_end_ns, gap_ns, cause, prev_name,
    next_name, prev_step, next_step, next_correlation, launch_ts_ns, launch_name (the runtime
    call that launched the work after the gap). The names are Categorical,
    as the store's ``name`` (a large trace has as many gaps as kernels: turning every name into
    text cost more than finding the gaps). Gaps are strictly positive; touching or overlapping
    GPU work leaves no gap. ``gpu``: ``prepared_gpu`` rows; ``host``: ``host_events`` rows
    (launches, syncs, data loading ops).
    """
    by = ["rank", "device", "stream"] if per_stream else ["rank", "device"]
    g = _between(gpu, by)
    g = with_launches(g, launch_table(host, launch_ts_ns=pl.col("ts_ns").min(),
                                      launch_name=pl.col("name").first()),
                      correlation="next_correlation")
    kind = pl.col("kind")
    timed = host.lazy().filter(pl.col("dur_ns").is_not_null())
    runtime = timed.filter(kind.is_in(RUNTIME_KINDS))
    syncs = pl.concat([
        timed.filter(kind == "sync").select("rank", "ts_ns", "dur_ns"),
        matching(runtime, options.sync_pattern).select("rank", "ts_ns", "dur_ns")]).collect()
    loaders = matching(timed.filter(kind.is_in(["cpu_op", "user_annotation", "python_function"])),
                       options.dataloader_pattern).select("rank", "ts_ns", "dur_ns").collect()
    held = {"sync": syncs, "blocking_copy": blocking_copies(gpu, host, options=options),
            "data_loading": loaders}
    for name, intervals in held.items():
        g = _covered(g, intervals, f"_{name}")
    covered = [pl.col(f"_{name}") for name in held]
    most = pl.max_horizontal(covered)
    holder = pl.lit(None, pl.String)
    for name in reversed(held):  # the first of the largest wins
        holder = pl.when(pl.col(f"_{name}") == most).then(pl.lit(name)).otherwise(holder)
    graph = pl.col("launch_name").cast(pl.String).str.contains(options.graph_pattern)
    cause = (
        pl.when(most > 0).then(holder)
        .when(pl.col("prev_step").is_not_null() & pl.col("next_step").is_not_null()
              & (pl.col("prev_step") != pl.col("next_step"))).then(pl.lit("between_steps"))
        .when(pl.col("launch_ts_ns") >= pl.col("gap_start_ns")).then(pl.lit("host"))
        .when(pl.col("gap_ns") < options.launch_overhead_ns).then(pl.lit("launch_overhead"))
        .when(graph.fill_null(False)).then(pl.lit("graph"))
        .otherwise(pl.lit("other"))
    )
    cols = [*by, "gap_start_ns", "gap_end_ns", "gap_ns", "cause", "prev_name", "next_name",
            "prev_step", "next_step", "next_correlation", "launch_ts_ns", "launch_name"]
    return g.with_columns(cause=cause).select(cols).sort([*by, "gap_start_ns"],
                                                         maintain_order=True)


def blocking_copies(gpu: pl.DataFrame, host: pl.DataFrame, *,
                    options: GapOptions = DEFAULT_OPTIONS) -> pl.DataFrame:
    """``rank, ts_ns, dur_ns, correlation``: the runtime copy calls of ``host`` that hold the
    host until the GPU copies (cause ``blocking_copy``): a call matching
    ``options.copy_pattern`` whose GPU copy in ``gpu`` (same rank and correlation) moves data
    to or from pageable host memory (its name matches ``options.pageable_pattern``).

    CUDA's rule (the runtime API's "API synchronization behavior"): a copy between device and
    pageable host memory is synchronous with the host, ``Async`` or not; a copy from device to
    pageable memory returns only once it has completed, after the work queued before it."""
    pageable = matching(gpu.lazy().filter(pl.col("correlation").is_not_null()),
                        options.pageable_pattern).select("rank", "correlation").unique()
    calls = matching(host.lazy().filter(pl.col("kind").is_in(RUNTIME_KINDS)
                                        & pl.col("dur_ns").is_not_null()
                                        & pl.col("correlation").is_not_null()),
                     options.copy_pattern)
    return (calls.join(pageable, on=["rank", "correlation"], how="semi", maintain_order="left")
            .select("rank", "ts_ns", "dur_ns", "correlation").collect())


def _between(gpu: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The gaps of ``gpu`` per ``by`` group, with the GPU work on either side of each.

    One pass over each group's events sorted by start: ``_reach`` is the latest end so far
    (the end of the busy time); a gap opens where an event starts after it. The work after the
    gap is that event (the first to start; ties: the shorter, then input order), the work
    before it the event that set ``_reach`` (the last to end; ties: the later to start).
    A Python loop over the groups (devices or streams, never events): running maxima per group
    cost ~4x more as window expressions.
    """
    rows = (gpu.select(*by, "ts_ns", "end_ns", "name", "step", "correlation",
                       file_of(gpu).alias("_file"))
            .sort([*by, "ts_ns", "end_ns"], maintain_order=True))
    parts = [_gaps_of_group(g, by) for g in rows.partition_by(by, maintain_order=True)]
    return pl.concat(parts) if parts else _gaps_of_group(rows, by)


def _gaps_of_group(rows: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``_between`` for the rows of one group, sorted by start. The time between the work of
    two files (profiling windows of one rank) is no gap: the profiler was off."""
    reacher = pl.when(pl.col("end_ns") == pl.col("_reach")).then(pl.int_range(pl.len()))
    prev = pl.col("_reacher").shift(1)
    return (
        rows.with_columns(_reach=pl.col("end_ns").cum_max())
        .with_columns(_reacher=reacher.forward_fill())
        .with_columns(gap_start_ns=pl.col("_reach").shift(1),
                      prev_name=pl.col("name").gather(prev), prev_step=pl.col("step").gather(prev),
                      _prev_file=pl.col("_file").gather(prev))
        .filter((pl.col("ts_ns") > pl.col("gap_start_ns"))
                & pl.col("_file").eq_missing(pl.col("_prev_file")))
        .select(*by, "gap_start_ns", gap_end_ns="ts_ns", prev_name="prev_name",
                prev_step="prev_step", next_name="name", next_step="step",
                next_correlation="correlation")
        .with_columns(gap_ns=pl.col("gap_end_ns") - pl.col("gap_start_ns"))
    )


def _covered(g: pl.DataFrame, intervals: pl.DataFrame, column: str) -> pl.DataFrame:
    """Add ``column``: how much of each gap ``intervals`` (same rank) cover.

    The intervals are merged per rank, each with the covered time before it; the covered time
    up to t is then that of the last merged interval starting at or before t plus its part
    before t, found with an as-of join: covered = up_to(gap end) - up_to(gap start). Only the
    gaps some interval overlaps (one as-of join finds them) are measured: most gaps of a
    large trace touch no synchronisation, copy or DataLoader op.
    """
    merged = union(
        intervals.select("rank", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")),
        by=["rank"],
    )
    zeros = pl.repeat(0, g.height, dtype=pl.Int64, eager=True)
    if merged.height == 0:  # nothing to cover (often: no data loader, few syncs)
        return g.with_columns(zeros.alias(column))
    hits = flag_overlapping(g.select("rank", "gap_start_ns", "gap_end_ns"), merged, "_hit",
                            by=["rank"], start="gap_start_ns",
                            end="gap_end_ns").get_column("_hit").arg_true()
    if hits.len() == 0:
        return g.with_columns(zeros.alias(column))
    touched = g.select("rank", "gap_start_ns", "gap_end_ns").gather(hits)
    right = (merged.sort("rank", "ts_ns")
             .with_columns(_len=pl.col("end_ns") - pl.col("ts_ns"))
             .with_columns(_before=pl.col("_len").cum_sum().over("rank") - pl.col("_len"))
             .select(pl.col("rank").cast(g.schema["rank"]), "ts_ns", "end_ns", "_before")
             .sort("ts_ns"))

    def up_to(at: str) -> pl.Series:
        left = touched.select("rank", at).with_row_index("_row").sort(at)
        hit = left.join_asof(right, left_on=at, right_on="ts_ns", by="rank",
                             strategy="backward", check_sortedness=False)
        value = (pl.col("_before") + pl.min_horizontal(pl.col(at), "end_ns")
                 - pl.col("ts_ns")).fill_null(0)
        return hit.sort("_row").select(value).to_series()

    return g.with_columns(zeros.scatter(hits, up_to("gap_end_ns") - up_to("gap_start_ns"))
                          .alias(column))


def gap_causes(gap_frame: pl.DataFrame, *, by: Sequence[str] = ("rank", "device")) -> pl.DataFrame:
    """Per group and cause: count, total_gap_ns, share_of_idle (of the group's total gap time)."""
    by = list(by)
    out = gap_frame.group_by([*by, "cause"]).agg(
        count=pl.len().cast(pl.Int64), total_gap_ns=pl.col("gap_ns").sum(),
        max_gap_ns=pl.col("gap_ns").max())
    return (
        out.with_columns(share_of_idle=pl.col("total_gap_ns") / pl.col("total_gap_ns").sum().over(by))
        .sort([*by, "total_gap_ns"], descending=[False] * len(by) + [True])
    )


def gap_histogram(
    gap_frame: pl.DataFrame,
    *,
    by: Sequence[str] = ("rank", "device"),
    edges_ns: Sequence[int] = DEFAULT_EDGES_NS,
) -> pl.DataFrame:
    """Gap counts per duration bucket: by..., bucket_lo_ns, bucket_hi_ns (null: open), count,
    total_gap_ns. Buckets are half-open [lo, hi)."""
    by = list(by)
    edges = sorted(edges_ns)
    lo: pl.Expr = pl.lit(0, pl.Int64)
    hi: pl.Expr = pl.lit(edges[0], pl.Int64) if edges else pl.lit(None, pl.Int64)
    for i, e in enumerate(edges):
        nxt = pl.lit(edges[i + 1], pl.Int64) if i + 1 < len(edges) else pl.lit(None, pl.Int64)
        cond = pl.col("gap_ns") >= e
        lo = pl.when(cond).then(pl.lit(e, pl.Int64)).otherwise(lo)
        hi = pl.when(cond).then(nxt).otherwise(hi)
    return (
        gap_frame.with_columns(bucket_lo_ns=lo, bucket_hi_ns=hi)
        .group_by([*by, "bucket_lo_ns", "bucket_hi_ns"])
        .agg(count=pl.len().cast(pl.Int64), total_gap_ns=pl.col("gap_ns").sum())
        .sort([*by, "bucket_lo_ns"])
    )


def largest_gaps(
    gap_frame: pl.DataFrame,
    host: Frame,
    *,
    n: int = 10,
    ops_per_gap: int = 5,
) -> pl.DataFrame:
    """The ``n`` longest gaps with the host ops around them.

    Adds ``launch_op`` (the CPU op that launched the work after the gap, through the runtime
    call's external id) and ``ops_during`` (names of up to ``ops_per_gap`` host ops overlapping
    the gap, longest overlap first; ProfilerStep ranges excluded). ``host``: ``host_events``
    rows (with ``external_id``).
    """
    # Ties in the gaps' own order (rank, device[, stream], start): the same answer whether
    # the rows were just found or read back from the cache folder.
    top = gap_frame.sort("gap_ns", descending=True, maintain_order=True).head(n).with_row_index(
        "_gap")
    host = host.lazy()
    kind = pl.col("kind")
    # Only the few launches, ops and overlaps of these gaps are looked up (semi joins first),
    # not every runtime call and op of the trace.
    wanted = top.lazy().select("rank", pl.col("next_correlation").alias("correlation"))
    runtime_ext = (
        host.filter(kind.is_in(RUNTIME_KINDS) & pl.col("correlation").is_not_null())
        .join(wanted, on=["rank", "correlation"], how="semi", maintain_order="left")
        .group_by("rank", "correlation").agg(_ext=pl.col("external_id").drop_nulls().first())
        .rename({"correlation": "next_correlation"})
    ).collect()
    ops = host.filter(kind.is_in(["cpu_op", "user_annotation"]) & pl.col("dur_ns").is_not_null())
    op_by_ext = (
        ops.filter(pl.col("external_id").is_not_null())
        .join(runtime_ext.lazy().select("rank", external_id="_ext"), on=["rank", "external_id"],
              how="semi", maintain_order="left")
        .group_by("rank", "external_id")
        .agg(launch_op=pl.col("name").cast(pl.String).sort_by("dur_ns").first())
        .rename({"external_id": "_ext"})
    )
    spans = union(top.select("rank", ts_ns="gap_start_ns", end_ns="gap_end_ns"), by=["rank"])
    near = overlapping(ops.select("rank", "name", "ts_ns",
                                  end_ns=pl.col("ts_ns") + pl.col("dur_ns")), spans, by=["rank"])
    during = (
        top.lazy().select("_gap", "rank", "gap_start_ns", "gap_end_ns")
        .join(near.lazy().select("rank", "name", "ts_ns",
                                 dur_ns=pl.col("end_ns") - pl.col("ts_ns")),
              on="rank", how="inner")
        .with_columns(_ov=pl.min_horizontal(pl.col("ts_ns") + pl.col("dur_ns"), "gap_end_ns")
                      - pl.max_horizontal("ts_ns", "gap_start_ns"))
        .filter((pl.col("_ov") > 0)
                & ~pl.col("name").cast(pl.String).str.starts_with("ProfilerStep#"))
        .group_by("_gap")
        .agg(ops_during=pl.col("name").cast(pl.String).sort_by("_ov", descending=True)
             .unique(maintain_order=True).head(ops_per_gap))
    )
    return (
        top.lazy()
        .join(runtime_ext.lazy(), on=["rank", "next_correlation"], how="left")
        .join(op_by_ext, on=["rank", "_ext"], how="left")
        .join(during, on="_gap", how="left")
        .sort("_gap")
        .drop("_gap", "_ext")
        .collect()
    )


def no_gpu_ranks(ranks: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Ranks of ``ranks`` with no GPU work at all in ``gpu`` (``prepared_gpu`` rows), each with
    the reason (for partial results)."""
    gpu_ranks = gpu.select(pl.col("rank").unique())
    return ranks.select("rank").join(gpu_ranks, on="rank", how="anti").with_columns(note=pl.lit(NOTE_NO_GPU)).sort("rank")
