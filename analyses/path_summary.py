"""What the critical path says: per step, per rank, per category and op, what each jump's
stretch held, and what limits the answer. Pure functions of a
:class:`~traceview.analyses.critical_path.CriticalPath`; definitions in ``docs/metrics.md``,
section *Critical path*.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from .critical_path import CATEGORIES, CriticalPath
from .intervals import clip


def _length() -> pl.Expr:
    return (pl.col("end_ns") - pl.col("start_ns")).sum()


def path_steps(path: CriticalPath) -> pl.DataFrame:
    """Per step: ``path_ns`` (time of the path in it, see :func:`with_steps`) against
    ``step_ns`` (the median ``ProfilerStep`` time across ranks), ``coverage`` = path/step, the rank holding most of
    the step's path (``top_rank``, ``top_rank_share``) and the ranks the path ``jumps`` to."""
    p = path.pieces
    per = p.group_by("step").agg(path_ns=_length(),
                                 jumps=(pl.col("category") == "communication_transfer").sum()
                                 .cast(pl.Int64))
    by_rank = p.group_by("step", "rank").agg(ns=_length()).sort(
        "step", "ns", "rank", descending=[False, True, False]).group_by(
        "step", maintain_order=True).agg(top_rank=pl.col("rank").first(),
                                         _top_ns=pl.col("ns").first())
    step_ns = path.steps.group_by("step").agg(
        step_ns=pl.col("step_time_ns").median().round(0).cast(pl.Int64))
    return (per.join(by_rank, on="step", how="left", nulls_equal=True)
            .join(step_ns, on="step", how="left")
            .with_columns(coverage=pl.col("path_ns") / pl.col("step_ns"),
                          top_rank_share=pl.col("_top_ns") / pl.col("path_ns"))
            .select("step", "path_ns", "step_ns", "coverage", "top_rank", "top_rank_share",
                    "jumps").sort("step", nulls_last=True))


def path_ranks(path: CriticalPath, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per rank of ``ranks``: ``path_ns`` and ``share`` of the path time, its busiest
    category on the path; largest share first."""
    p = path.pieces
    total = int(p.select(_length()).item() or 0)
    per = p.group_by("rank").agg(path_ns=_length())
    cat = p.group_by("rank", "category").agg(ns=_length()).sort(
        "rank", "ns", descending=[False, True]).group_by("rank", maintain_order=True).agg(
        top_category=pl.col("category").first())
    return (ranks.select(pl.col("rank").cast(pl.Int32)).join(per, on="rank", how="left")
            .join(cat, on="rank", how="left")
            .with_columns(pl.col("path_ns").fill_null(0))
            .with_columns(share=pl.col("path_ns") / total if total else pl.lit(None, pl.Float64))
            .sort("path_ns", "rank", descending=[True, False]))


def path_categories(path: CriticalPath) -> dict[str, dict[str, float | int | None]]:
    """Per category (all of ``CATEGORIES``): ``path_ns``, ``per_step_ns`` and ``share``."""
    p = path.pieces
    total = int(p.select(_length()).item() or 0)
    n = max(p.get_column("step").n_unique(), 1) if p.height else 1
    got = dict(p.group_by("category").agg(ns=_length()).iter_rows())
    return {c: {"path_ns": int(got.get(c, 0)), "per_step_ns": int(got.get(c, 0)) // n,
                "share": (got.get(c, 0) / total) if total else None} for c in CATEGORIES}


def path_top_ops(path: CriticalPath, *, n: int = 10) -> pl.DataFrame:
    """The ops, kernels and collectives holding most path time: ``name, category, ranks,
    path_ns, per_step_ns, share``."""
    p = path.pieces
    total = int(p.select(_length()).item() or 0)
    steps = max(p.get_column("step").n_unique(), 1) if p.height else 1
    return (p.filter(pl.col("category") != "idle")
            .group_by("name", "category").agg(path_ns=_length(),
                                               ranks=pl.col("rank").unique().sort())
            .with_columns(per_step_ns=pl.col("path_ns") // steps,
                          share=pl.col("path_ns") / total if total else None)
            .sort("path_ns", "name", descending=[True, False]).head(n)
            .select("name", "category", "ranks", "path_ns", "per_step_ns", "share"))


#: The path's categories where a GPU rank's GPU is idle: the host's time, or nothing recorded.
HOST_CATEGORIES: tuple[str, ...] = ("launch_host", "data_loading", "idle")


def host_time(path: CriticalPath, gaps: pl.DataFrame | None,
              gpu_ranks: Sequence[int]) -> pl.DataFrame:
    """The path's time on GPU ranks while their GPU is idle (``HOST_CATEGORIES``), by what
    runs there and why the GPU waits: ``category, name, cause, path_ns``. ``name``: the
    piece's op (the innermost host op, ``(idle)``); ``cause``: that of the GPU gap the time
    lies in (``gaps.gaps`` rows per device; null outside every gap: before a step's first
    kernel, after its last). Largest first."""
    p = path.pieces.filter(pl.col("category").is_in(HOST_CATEGORIES)
                           & pl.col("rank").is_in(list(gpu_ranks)))
    length = (pl.col("end_ns") - pl.col("start_ns")).sum()
    keys = ["category", "name"]
    if gaps is None:
        gaps = pl.DataFrame(schema={"rank": pl.Int32, "cause": pl.String,
                                    "gap_start_ns": pl.Int64, "gap_end_ns": pl.Int64})
    windows = gaps.select(pl.col("rank").cast(pl.Int32), pl.col("cause").cast(pl.String),
                          window_start_ns="gap_start_ns", window_end_ns="gap_end_ns")
    # one device per rank: its gaps are disjoint (several: the union would be needed)
    windows = windows.unique(["rank", "window_start_ns"]).sort("rank", "window_start_ns")
    inside = clip(p, windows, by=["rank"], start="start_ns", end="end_ns",
                  window_keys=["cause"]).group_by(*keys, "cause").agg(path_ns=length)
    outside = (p.group_by(keys).agg(_all=length)
               .join(inside.group_by(keys).agg(_in=pl.col("path_ns").sum()), on=keys,
                     how="left", nulls_equal=True)
               .select(*keys, cause=pl.lit(None, pl.String),
                       path_ns=pl.col("_all") - pl.col("_in").fill_null(0))
               .filter(pl.col("path_ns") > 0))
    return pl.concat([inside.select(*keys, "cause", pl.col("path_ns").cast(pl.Int64)),
                      outside.select(*keys, "cause", pl.col("path_ns").cast(pl.Int64))]) \
        .sort("path_ns", "category", "name", descending=[True, False, False], nulls_last=True)


def path_warnings(path: CriticalPath, collective_rows: pl.DataFrame, *,
                  world_size: int | None = None, ranks: int | None = None) -> list[str]:
    """What limits the path's answer: ranks of the job not in the trace (``world_size``
    against the ``ranks`` present), jumps decided within the clock alignment's uncertainty,
    collectives on the path missing ranks of their group, no steps."""
    out: list[str] = []
    if world_size and ranks and ranks < world_size:
        out.append(f"critical path: {world_size - ranks} of {world_size} ranks are not in the "
                   "trace: the path cannot jump to them, and waiting for them shows as "
                   "communication")
    jumps = path.segments.filter(pl.col("kind") == "transfer").select("instance").unique()
    if jumps.height:
        inst = collective_rows.group_by("instance").agg(
            skew=pl.col("skew_ns").first(), unc=pl.col("uncertainty_ns").first(),
            n=pl.col("n_ranks").first(), size=pl.col("group_size_used").first()
        ).join(jumps, on="instance")
        unresolved = inst.filter(pl.col("skew") <= 2 * pl.col("unc")).height
        if unresolved:
            out.append(f"critical path: {unresolved} of {inst.height} jumps between ranks rest "
                       "on arrival orders within twice the clock alignment's uncertainty")
        partial = inst.filter(pl.col("n") < pl.col("size")).height
        if partial:
            out.append(f"critical path: {partial} collectives on the path miss ranks of their "
                       "group: the rank that arrived last may not be in the trace")
    if path.steps.height == 0:
        out.append("critical path: no ProfilerStep ranges: the whole window is one stretch")
    return out
