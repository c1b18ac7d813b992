"""Which profiler step each event belongs to.

Steps are the ``ProfilerStep#N`` ranges (Kineto user annotations, or NVTX ranges of that name in
nsys). A host event belongs to the step whose range contains its start, on any thread of the
rank (the backward thread's ops belong to the step too). A GPU event belongs to the step of the
runtime call that launched it (same ``correlation``): GPU work runs late, so containment in time
would credit it to the wrong step. GPU events with no launching call found fall back to time
containment, which is the best the trace allows.

>>> from traceview.schema import events_frame
>>> ev = events_frame([
...   dict(rank=0, file_id=0, source="kineto", kind="user_annotation", name="ProfilerStep#3",
...        ts_ns=0, dur_ns=100),
...   dict(rank=0, file_id=0, source="kineto", kind="cuda_runtime", name="cudaLaunchKernel",
...        ts_ns=90, dur_ns=5, correlation=7),
...   dict(rank=0, file_id=0, source="kineto", kind="kernel", name="k", ts_ns=150, dur_ns=5,
...        correlation=7)])
>>> assign_steps(ev)["step"].to_list()
[3, 3, 3]
"""

from __future__ import annotations

import numpy as np
import polars as pl

GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation")
_STEP_NAME = r"^ProfilerStep#(\d+)$"


def step_ranges(events: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """One row per step and rank: rank, step, step_start_ns, step_end_ns."""
    return (
        events.lazy()
        .filter(pl.col("kind").is_in(["user_annotation", "nvtx"])
                & pl.col("name").cast(pl.String).str.contains(_STEP_NAME))
        .select(
            "rank",
            pl.col("name").cast(pl.String).str.extract(_STEP_NAME).cast(pl.Int32).alias("step"),
            pl.col("ts_ns").alias("step_start_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("step_end_ns"),
        )
        .sort("rank", "step_start_ns")
    )


def step_of_events(events: pl.DataFrame) -> pl.Series:
    """The step of every row of ``events`` (Int32, null outside every step), in row order.

    Works on the few columns it needs (rank, kind, name, ts_ns, dur_ns, correlation). The step
    ranges are few, so each row finds its range by binary search over the sorted range starts
    (the last range starting at or before the row, if the row starts before it ends): no sort
    or join of the millions of event rows.
    """
    keys = events.select("rank", "kind", "name", "ts_ns", "dur_ns", "correlation")
    steps = step_ranges(keys).collect()
    if steps.is_empty():
        return pl.repeat(None, events.height, dtype=pl.Int32, eager=True).alias("step")
    step = _containing_step(keys, steps)
    return _through_launches(keys, step)


def _through_launches(keys: pl.DataFrame, step: pl.Series) -> pl.Series:
    """GPU rows take the step of the runtime call that launched them (same rank and
    correlation; the earliest such call), where that call has a step.

    Plain arrays: the runtime and GPU rows are a fraction of the events, so only they are
    gathered, sorted and searched; no frame of all events is built.
    """
    corr = keys.get_column("correlation")
    has_corr = corr.is_not_null().to_numpy()
    is_launch = (keys.get_column("kind").is_in(["cuda_runtime", "cuda_driver"]).to_numpy()
                 & has_corr)
    is_gpu = keys.get_column("kind").is_in(GPU_KINDS).to_numpy() & has_corr
    launches, gpus = np.flatnonzero(is_launch), np.flatnonzero(is_gpu)
    if not len(launches) or not len(gpus):
        return step
    corr_of = corr.fill_null(0).to_numpy()
    rank_of = keys.get_column("rank").fill_null(-1).to_numpy()
    ts_of = keys.get_column("ts_ns").fill_null(0).to_numpy()
    step_of = step.fill_null(-1).to_numpy()  # -1: no step (step numbers are >= 0)
    # the earliest launch of each (rank, correlation)
    order = launches[np.lexsort((ts_of[launches], corr_of[launches], rank_of[launches]))]
    key_r, key_c = rank_of[order], corr_of[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (key_r[1:] != key_r[:-1]) | (key_c[1:] != key_c[:-1])
    order, key_r, key_c = order[first], key_r[first], key_c[first]
    # each GPU row's launch, by binary search over (rank, correlation)
    at = np.minimum(_search_pairs(key_r, key_c, rank_of[gpus], corr_of[gpus]), len(order) - 1)
    match = (key_r[at] == rank_of[gpus]) & (key_c[at] == corr_of[gpus])
    launch_step = step_of[order[at]]
    take = match & (launch_step >= 0)
    out = step_of.copy()
    out[gpus[take]] = launch_step[take]
    return (pl.DataFrame({"s": out.astype(np.int32)})
            .select(pl.when(pl.col("s") >= 0).then(pl.col("s")).alias("step")).to_series())


def _search_pairs(sorted_rank: np.ndarray, sorted_corr: np.ndarray, rank: np.ndarray,
                  corr: np.ndarray) -> np.ndarray:
    """searchsorted over (rank, correlation) pairs sorted by rank, then correlation."""
    at = np.zeros(len(rank), dtype=np.int64)
    for r in np.unique(rank):
        lo, hi = np.searchsorted(sorted_rank, [r, r + 1])
        rows = np.flatnonzero(rank == r)
        at[rows] = lo + np.searchsorted(sorted_corr[lo:hi], corr[rows])
    return at


def _containing_step(keys: pl.DataFrame, steps: pl.DataFrame,
                     chunk: int = 1 << 18) -> pl.Series:
    """The step whose range contains each row's start, on the row's rank (else null).
    Rows go through in chunks, so the temporaries stay small next to the events."""
    ts = keys.get_column("ts_ns")
    rank = keys.get_column("rank")
    out = np.zeros(keys.height, dtype=np.int32)
    found = np.zeros(keys.height, dtype=bool)
    ranges = {r: group.sort("step_start_ns", maintain_order=True)
              for (r,), group in steps.group_by("rank")}
    for start in range(0, keys.height, chunk):
        at = ts.slice(start, chunk).fill_null(-1 << 62).to_numpy()
        on = rank.slice(start, chunk).fill_null(-1).to_numpy()
        for r, group in ranges.items():
            starts = group.get_column("step_start_ns").to_numpy()
            ends = group.get_column("step_end_ns").to_numpy()
            i = np.searchsorted(starts, at, side="right") - 1
            inside = (i >= 0) & (on == r) & (at < ends[np.maximum(i, 0)])
            rows = np.flatnonzero(inside)
            out[start + rows] = group.get_column("step").to_numpy()[i[rows]]
            found[start + rows] = True
    return (pl.DataFrame({"s": out, "ok": found})
            .select(pl.when(pl.col("ok")).then(pl.col("s")).cast(pl.Int32).alias("step"))
            .to_series())


def assign_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with its ``step`` column filled (null outside every step)."""
    return events.with_columns(step_of_events(events))
