"""The per-rank one-screen summary behind ``traceview summary``.

Per rank (devices of a rank summed; a Kineto rank normally drives one device):
steps, step_time_ns_p50 (median host ``ProfilerStep`` duration), compute_ns, comm_ns,
overlap_ns, exposed_comm_ns, hidden_fraction = overlap / comm, busy_ns, span_ns, idle_ns,
idle_fraction = idle / span (whole trace, as in ``overlap`` and ``breakdown``); compute, comm and
exposed comm are totals over the window, and ``*_per_step`` the same divided by the rank's
steps (comparable with the step time; null without steps); the biggest gap
cause and its time, and ``bound`` / ``bound_share``: the rank's GPU bound by the one rule of
``overlap.bound_of`` over those sums. (``traceview summary``'s worst straggler is the stragglers analysis' answer,
taken by the Run from the same aligned table as ``traceview stragglers``.)
"""

from __future__ import annotations

import polars as pl

from .gaps import gap_causes
from .overlap import BOUND_NO_GPU, NOTE_NO_GPU, bound_columns

SUMMARY_COLUMNS = [
    "rank", "steps", "step_time_ns_p50", "compute_ns", "comm_ns", "overlap_ns",
    "exposed_comm_ns", "hidden_fraction", "idle_fraction", "busy_ns", "span_ns", "idle_ns",
    "devices", "top_gap_cause", "top_gap_cause_ns", "note", "bound", "bound_share",
    "compute_ns_per_step", "comm_ns_per_step", "exposed_comm_ns_per_step",
]

#: The window totals also given per step (total / steps; null without steps).
PER_STEP = ("compute_ns", "comm_ns", "exposed_comm_ns")


def summary(
    overlap_rows: pl.DataFrame,
    host_steps: pl.DataFrame,
    gap_rows: pl.DataFrame,
    ranks: pl.DataFrame,
) -> pl.DataFrame:
    """One row per rank of ``ranks`` (columns ``SUMMARY_COLUMNS``), from the whole-trace
    ``overlap`` rows, the host step ranges (``step_spans``) and the gaps (``gaps``)."""
    ov = overlap_rows.filter(pl.col("step").is_null())
    sums = [pl.col(c).sum() for c in ("compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns",
                                      "exposed_memcpy_ns", "exposed_memset_ns", "busy_ns",
                                      "idle_ns")]
    per_rank = (
        ov.filter(pl.col("device").is_not_null() | pl.col("compute_ns").is_not_null())
        .group_by("rank")
        .agg(*sums, span_ns=pl.col("window_ns").sum(), devices=pl.len().cast(pl.Int64))
        .with_columns(
            hidden_fraction=pl.when(pl.col("comm_ns") > 0)
            .then(pl.col("overlap_ns") / pl.col("comm_ns")).otherwise(None),
            idle_fraction=pl.when(pl.col("span_ns") > 0)
            .then(pl.col("idle_ns") / pl.col("span_ns")).otherwise(None),
        )
        # the shares of the rank's span, as overlap's of a window
        .with_columns(window_ns=pl.col("span_ns")).with_columns(bound_columns())
        .drop("window_ns")
    )
    steps = host_steps.group_by("rank").agg(
        steps=pl.len().cast(pl.Int64),
        step_time_ns_p50=pl.col("step_time_ns").median().round().cast(pl.Int64))
    causes = gap_causes(gap_rows, by=["rank"])
    top = causes.sort("rank", "total_gap_ns", descending=[False, True]).group_by(
        "rank", maintain_order=True).first().select(
        "rank", top_gap_cause="cause", top_gap_cause_ns="total_gap_ns")
    out = (
        ranks.select("rank").join(per_rank, on="rank", how="left")
        .join(steps, on="rank", how="left")
        .join(top, on="rank", how="left")
        .with_columns(steps=pl.col("steps").fill_null(0))
    )
    note = pl.concat_str([
        pl.when(pl.col("busy_ns").is_null()).then(pl.lit(NOTE_NO_GPU)),
        pl.when(pl.col("steps") == 0).then(pl.lit("no ProfilerStep ranges: no step time")),
        pl.when((pl.col("comm_ns") == 0)).then(pl.lit("no communication kernels")),
    ], separator="; ", ignore_nulls=True).replace("", None)
    per_step = [pl.when(pl.col("steps") > 0).then(pl.col(c) / pl.col("steps")).round()
                .cast(pl.Int64).alias(f"{c}_per_step") for c in PER_STEP]
    # a rank without GPU work is the host's run: bound host (as overlap and diagnose say)
    bound = pl.when(pl.col("busy_ns").is_null()).then(pl.lit(BOUND_NO_GPU)) \
        .otherwise(pl.col("bound"))
    return out.with_columns(*per_step, note=note, bound=bound).select(SUMMARY_COLUMNS) \
        .sort("rank")
