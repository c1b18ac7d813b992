"""Device memory over time from ``profile_memory`` allocator events ([memory] in Kineto).

Per (rank, device, step): ``peak_allocated_bytes`` / ``peak_reserved_bytes`` = max of the
allocator's "Total Allocated" / "Total Reserved" after each event in the step;
``end_allocated_bytes`` = the value after the step's last event; ``growth_bytes`` =
end_allocated − the previous step's end_allocated (null for the first step). Definitions:
docs/metrics.md, section "GPU memory".
"""

from __future__ import annotations

import polars as pl

from .window import ranks_present

Frame = pl.LazyFrame | pl.DataFrame

NOTE_NO_MEMORY = "no allocator events (profile with profile_memory=True)"


def memory_timeline(events: Frame, *, include_cpu: bool = False) -> pl.DataFrame:
    """Allocator events in time order: rank, device, ts_ns, step, mem_bytes,
    mem_total_allocated, mem_total_reserved. Device −1 (host) is left out unless asked."""
    lf = events.lazy().filter((pl.col("kind").cast(pl.String) == "memory"))
    if not include_cpu:
        lf = lf.filter(pl.col("device").is_not_null() & (pl.col("device") >= 0))
    return lf.select("rank", "device", "ts_ns", "step", "mem_bytes", "mem_total_allocated",
                     "mem_total_reserved").sort("rank", "device", "ts_ns").collect()


def memory_by_step(events: Frame) -> pl.DataFrame:
    """Peak and end-of-step memory per (rank, device, step) and growth across steps.

    Events outside steps are summarised in a row with step null. Ranks without allocator
    events get a row with a note.
    """
    tl = memory_timeline(events)
    ranks = ranks_present(events)
    out = (
        tl.group_by("rank", "device", "step")
        .agg(events=pl.len().cast(pl.Int64),
             peak_allocated_bytes=pl.col("mem_total_allocated").max(),
             peak_reserved_bytes=pl.col("mem_total_reserved").max(),
             end_allocated_bytes=pl.col("mem_total_allocated").sort_by("ts_ns").last(),
             end_reserved_bytes=pl.col("mem_total_reserved").sort_by("ts_ns").last())
        .sort("rank", "device", "step", nulls_last=True)
    )
    in_steps = out.filter(pl.col("step").is_not_null())
    growth = in_steps.with_columns(
        growth_bytes=pl.col("end_allocated_bytes")
        - pl.col("end_allocated_bytes").shift(1).over("rank", "device"),
        peak_growth_bytes=pl.col("peak_allocated_bytes")
        - pl.col("peak_allocated_bytes").shift(1).over("rank", "device"),
    )
    out = pl.concat([growth, out.filter(pl.col("step").is_null())], how="diagonal_relaxed")
    missing = ranks.join(out.select("rank").unique(), on="rank", how="anti")
    out = out.with_columns(note=pl.lit(None, pl.String))
    if missing.height:
        out = pl.concat([out, missing.with_columns(note=pl.lit(NOTE_NO_MEMORY))],
                        how="diagonal_relaxed")
    return out.sort("rank", "device", "step", nulls_last=True)
