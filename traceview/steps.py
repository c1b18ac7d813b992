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
    frame = keys.select("rank", "kind", "ts_ns", "correlation").with_columns(_time_step=step)
    launches = (frame.filter(pl.col("kind").is_in(["cuda_runtime", "cuda_driver"])
                             & pl.col("correlation").is_not_null())
                .sort("ts_ns")
                .group_by("rank", "correlation").agg(pl.col("_time_step").first()
                                                     .alias("_launch_step")))
    gpu = (frame.with_row_index("_row")
           .filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("correlation").is_not_null())
           .join(launches, on=["rank", "correlation"], how="inner")
           .filter(pl.col("_launch_step").is_not_null()))
    return step.scatter(gpu.get_column("_row"), gpu.get_column("_launch_step"))


def _containing_step(keys: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    """The step whose range contains each row's start, on the row's rank (else null)."""
    ts = keys.get_column("ts_ns").fill_null(0).to_numpy()
    rank = keys.get_column("rank").fill_null(-1).to_numpy()
    found = np.zeros(len(ts), dtype=bool)
    out = np.zeros(len(ts), dtype=np.int32)
    ranks = steps.get_column("rank").unique().to_list()
    for r in ranks:
        ranges = steps.filter(pl.col("rank") == r).sort("step_start_ns", maintain_order=True)
        starts = ranges.get_column("step_start_ns").to_numpy()
        on_rank = rank == r
        rows = None if on_rank.all() else np.flatnonzero(on_rank)
        at = ts if rows is None else ts[rows]
        i = np.searchsorted(starts, at, side="right") - 1
        inside = (i >= 0) & (at < ranges.get_column("step_end_ns").to_numpy()[np.maximum(i, 0)])
        where = np.flatnonzero(inside) if rows is None else rows[inside]
        found[where] = True
        out[where] = ranges.get_column("step").to_numpy()[i[inside]]
    inside_any = found & keys.get_column("ts_ns").is_not_null().to_numpy()
    return (pl.DataFrame({"s": out, "ok": inside_any})
            .select(pl.when(pl.col("ok")).then(pl.col("s")).cast(pl.Int32).alias("step"))
            .to_series())


def assign_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with its ``step`` column filled (null outside every step)."""
    return events.with_columns(step_of_events(events))
