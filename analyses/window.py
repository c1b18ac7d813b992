"""Selecting what to analyse: ranks, profiler steps, a time window, warm-up steps.

Steps come from ``ProfilerStep#N`` ranges on the host (or any user marker whose name matches a
pattern with one number group). GPU events belong to the step of their launching runtime call
(the store's ``step`` column; when a reader left it empty it is derived here through the
correlation id). On the GPU, the steps of one (rank, device) *tile* the timeline: step N's
window runs from the first start of a GPU event launched in step N to the first start of step
N+1's GPU work (the last step ends at the last end of its own GPU work). So per-step GPU times
add up, and GPU idle time at a step boundary (data loading, optimizer on the host) is charged
to the step that ends there.

A rank may have several profiling windows, one file each (a schedule with ``repeat``:
``traceview.store.windows``). The time between two of them is not data (the profiler was off): the
last step of a window ends with its own GPU work, and the whole-trace window's length
(``window_ns``) is the sum of the windows' spans.

>>> parse_step_name(pl.Series(["ProfilerStep#12", "aten::mm"]), STEP_PATTERN).to_list()
[12, None]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from traceview.schema import STEP_MARKER_KINDS, STEP_PATTERN

from .launches import is_runtime_call

Frame = pl.LazyFrame | pl.DataFrame


@dataclass(frozen=True)
class Window:
    """What to analyse. All fields optional; the default selects everything.

    ranks:        ranks to keep (None: all).
    steps:        half-open step range ``(start, stop)``; either end may be None.
    time_ns:      half-open ``(start, stop)`` in ns *relative to the first event of the
                  selection*; events are clipped to it.
    skip_warmup:  drop the first N steps of each rank (only when asked; default 0).
    step_pattern: regex with one group capturing the step number (user markers).
    """

    ranks: Sequence[int] | None = None
    steps: tuple[int | None, int | None] | None = None
    time_ns: tuple[int | None, int | None] | None = None
    skip_warmup: int = 0
    step_pattern: str = STEP_PATTERN


def ranks_present(events: Frame) -> pl.DataFrame:
    """The ranks with at least one event: one column ``rank``, sorted. (A Run asks it once,
    or reads it from the files' footers: ``Run.ranks_table``.)"""
    return events.lazy().select(pl.col("rank").unique().sort()).collect()


def parse_step_name(names: pl.Series | pl.Expr, pattern: str = STEP_PATTERN):
    """Step number from a marker name (Int64), null when it does not match or its number is
    beyond int64 (ingest warned of those: they are no steps)."""
    return names.cast(pl.String).str.extract(pattern, 1).cast(pl.Int64, strict=False)


def step_spans(events: Frame, *, pattern: str = STEP_PATTERN) -> pl.DataFrame:
    """Host step ranges: ``rank, step, step_start_ns, step_end_ns, step_time_ns``.

    Taken from host-side events (not ``gpu_user_annotation``) whose name matches ``pattern``.
    If a step number appears twice on a rank, its first start and last end are used.
    The pattern runs once per distinct name; the markers are found by a join on the name.
    """
    host = (
        events.lazy()
        .filter(pl.col("kind").is_in(STEP_MARKER_KINDS) & pl.col("dur_ns").is_not_null())
        .select("rank", "name", "ts_ns", "dur_ns")
    )
    numbers = (
        host.select(pl.col("name").unique())
        .with_columns(step=parse_step_name(pl.col("name"), pattern))
        .filter(pl.col("step").is_not_null())
    )
    return (
        host.join(numbers, on="name", how="inner")
        .group_by("rank", "step")
        .agg(step_start_ns=pl.col("ts_ns").min(), step_end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).max())
        .with_columns(step_time_ns=pl.col("step_end_ns") - pl.col("step_start_ns"))
        .sort("rank", "step")
        .collect()
    )


def with_gpu_steps(gpu: pl.LazyFrame, events: Frame, *,
                   pattern: str = STEP_PATTERN) -> pl.LazyFrame:
    """Fill a null ``step`` on GPU events from their launching runtime call.

    The runtime call (``launches.is_runtime_call``, same rank and correlation) is
    placed in the host step range that contains its start (an as-of join on the step starts).
    Events already carrying a step keep it.
    """
    spans = step_spans(events, pattern=pattern)
    if spans.height == 0:
        return gpu
    launches = (
        events.lazy()
        .filter(is_runtime_call(events) & pl.col("correlation").is_not_null())
        .group_by("rank", "correlation")
        .agg(_launch_ts=pl.col("ts_ns").min())
        .sort("_launch_ts")
        .join_asof(spans.lazy().sort("step_start_ns").select(
            "rank", pl.col("step_start_ns"), "step_end_ns", pl.col("step").alias("_lstep")),
            left_on="_launch_ts", right_on="step_start_ns", by="rank", strategy="backward",
            check_sortedness=False)
        .filter(pl.col("_launch_ts") < pl.col("step_end_ns"))
        .select("rank", "correlation", "_lstep")
    )
    return (
        gpu.join(launches, on=["rank", "correlation"], how="left")
        .with_columns(step=pl.coalesce(pl.col("step"), pl.col("_lstep")))
        .drop("_lstep")
    )


def gpu_step_windows(gpu: Frame, *, by: Sequence[str] = ("rank", "device")) -> pl.DataFrame:
    """Tiling step windows on the GPU: ``by..., step, window_start_ns, window_end_ns``.

    Window of step N = [first start of step N's GPU events, first start of the next step's);
    the last step ends at the last end of its own GPU events, and so does the last step of a
    profiling window (the next step is in another file: the time between is not data). Steps
    whose start is not after the previous one's (out-of-order replays) get an empty window
    and are dropped.
    """
    by = list(by)
    lf = gpu.lazy()
    per = (
        lf.filter(pl.col("step").is_not_null())
        .group_by([*by, "step"])
        .agg(window_start_ns=pl.col("ts_ns").min(), _last_end=pl.col("end_ns").max(),
             _file=file_of(lf).first())
        .sort([*by, "step"])
    )
    nxt = pl.col("window_start_ns").shift(-1).over(by)
    same_window = pl.col("_file").shift(-1).over(by).eq_missing(pl.col("_file"))
    return (
        per.with_columns(window_end_ns=pl.when(same_window).then(pl.coalesce(nxt, "_last_end"))
                         .otherwise(pl.col("_last_end")))
        .filter(pl.col("window_end_ns") > pl.col("window_start_ns"))
        .select([*by, "step", "window_start_ns", "window_end_ns"])
        .collect()
    )


def gpu_trace_windows(gpu: Frame, *, by: Sequence[str] = ("rank", "device")) -> pl.DataFrame:
    """Whole-trace window per group: first GPU start to last GPU end, and ``window_ns``, the
    sum of the spans of the group's profiling windows (files): the time between two windows
    is not data, so it is never idle. With one window, ``window_ns`` = end - start."""
    by = list(by)
    lf = gpu.lazy()
    return (
        lf.group_by([*by, file_of(lf).alias("_file")])
        .agg(_start=pl.col("ts_ns").min(), _end=pl.col("end_ns").max())
        .group_by(by)
        .agg(window_start_ns=pl.col("_start").min(), window_end_ns=pl.col("_end").max(),
             window_ns=(pl.col("_end") - pl.col("_start")).sum())
        .sort(by)
        .collect()
    )


def file_of(frame: Frame) -> pl.Expr:
    """The file (profiling window) of each row: ``file_id``; null for a frame without one,
    which is then a single window."""
    if "file_id" in frame.lazy().collect_schema().names():
        return pl.col("file_id")
    return pl.lit(None, dtype=pl.Int32)


def select(events: Frame, window: Window | None = None) -> pl.LazyFrame:
    """Events restricted to ``window`` (ranks, then warm-up skipping, steps, time).

    With a step range, only events that carry a step in it are kept (GPU events through
    their launch). With a time window, events overlapping it are kept and clipped to it.
    """
    lf = events.lazy()
    if window is None:
        return lf
    if window.ranks is not None:
        lf = lf.filter(pl.col("rank").is_in(list(window.ranks)))
    if window.skip_warmup > 0 or window.steps is not None:
        lf = _fill_steps(lf, window.step_pattern)
    if window.skip_warmup > 0:
        lf = _skip_warmup(lf, window.skip_warmup)
    if window.steps is not None:
        lo, hi = window.steps
        cond = pl.col("step").is_not_null()
        if lo is not None:
            cond &= pl.col("step") >= lo
        if hi is not None:
            cond &= pl.col("step") < hi
        lf = lf.filter(cond)
    if window.time_ns is not None:
        lo, hi = window.time_ns
        origin = pl.col("ts_ns").min()
        lf = lf.with_columns(_origin=origin)
        t0 = pl.col("_origin") + (lo if lo is not None else 0)
        end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)
        cond = end >= t0
        new_ts = pl.max_horizontal("ts_ns", t0)
        new_end = end
        if hi is not None:
            t1 = pl.col("_origin") + hi
            cond &= pl.col("ts_ns") < t1
            new_end = pl.min_horizontal(end, t1)
        lf = (lf.filter(cond)
              .with_columns(dur_ns=pl.when(pl.col("dur_ns").is_null()).then(None)
                            .otherwise(new_end - new_ts), ts_ns=new_ts)
              .drop("_origin"))
    return lf


def _skip_warmup(lf: pl.LazyFrame, n: int) -> pl.LazyFrame:
    """Drop each rank's first ``n`` steps and the step-less events before the first kept one.

    A rank without steps is kept whole (there is nothing to skip); a rank with ``n`` steps or
    fewer keeps nothing.
    """
    steps = (
        lf.filter(pl.col("step").is_not_null())
        .group_by("rank", "step").agg(_s=pl.col("ts_ns").min())
        .with_columns(_order=pl.col("step").rank("dense").over("rank"))
    )
    first_kept = steps.filter(pl.col("_order") == n + 1).select(
        "rank", pl.col("step").alias("_first_kept"), pl.col("_s").alias("_kept_from"))
    has_steps = steps.select("rank").unique().with_columns(_has_steps=pl.lit(True))
    keep = (
        pl.col("_has_steps").is_null()
        | (pl.col("_first_kept").is_not_null()
           & pl.when(pl.col("step").is_not_null())
           .then(pl.col("step") >= pl.col("_first_kept"))
           .otherwise(pl.col("ts_ns") >= pl.col("_kept_from")))
    )
    return (
        lf.join(first_kept, on="rank", how="left").join(has_steps, on="rank", how="left")
        .filter(keep)
        .drop("_first_kept", "_kept_from", "_has_steps")
    )


def _fill_steps(lf: pl.LazyFrame, pattern: str) -> pl.LazyFrame:
    """Give GPU events without a step the step of their launch (see ``with_gpu_steps``)."""
    gpu_kinds = ["kernel", "memcpy", "memset"]
    is_gpu = pl.col("kind").cast(pl.String).is_in(gpu_kinds)
    gpu = with_gpu_steps(lf.filter(is_gpu), lf, pattern=pattern)
    return pl.concat([lf.filter(~is_gpu), gpu.select(lf.collect_schema().names())])
