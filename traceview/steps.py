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

    Works on the few columns it needs (rank, kind, name, ts_ns, dur_ns, correlation), so the
    sorts and joins do not move the wide event rows.
    """
    keys = events.select("rank", "kind", "name", "ts_ns", "dur_ns", "correlation")
    steps = step_ranges(keys).collect()
    if steps.is_empty():
        return pl.repeat(None, events.height, dtype=pl.Int32, eager=True).alias("step")
    ranges = steps.rename({"step": "_range_step"}).sort("step_start_ns")
    by_time = (keys.select("rank", "kind", "ts_ns", "correlation").with_row_index("_row")
               .sort("ts_ns")
               .join_asof(ranges, left_on="ts_ns", right_on="step_start_ns", by="rank",
                          strategy="backward", check_sortedness=False)
               .with_columns(pl.when(pl.col("ts_ns") < pl.col("step_end_ns"))
                             .then(pl.col("_range_step")).alias("_time_step")))
    launches = (by_time.filter(pl.col("kind").is_in(["cuda_runtime", "cuda_driver"])
                               & pl.col("correlation").is_not_null())
                .group_by("rank", "correlation").agg(pl.col("_time_step").first()
                                                     .alias("_launch_step")))
    joined = by_time.join(launches, on=["rank", "correlation"], how="left")
    is_gpu = pl.col("kind").is_in(GPU_KINDS)
    step = pl.when(is_gpu).then(pl.coalesce("_launch_step", "_time_step")).otherwise(
        pl.col("_time_step"))
    return joined.select("_row", step.cast(pl.Int32).alias("step")).sort("_row")["step"]


def assign_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with its ``step`` column filled (null outside every step)."""
    return events.with_columns(step_of_events(events))
