"""Compute/communication overlap per rank and device, per step and for the whole trace.

With C = ∪ compute kernels, M = ∪ communication kernels (merged across streams of one device):

* ``compute_ns`` = |C|, ``comm_ns`` = |M|, ``overlap_ns`` = |C ∩ M|,
* ``exposed_comm_ns`` = comm − overlap = |M \\ C|,
* ``hidden_fraction`` = overlap / comm (null when comm = 0),
* ``overlap_efficiency`` = (compute + comm − busy) / (compute + comm − max(compute, comm))
  with busy = |C ∪ M|; equals overlap / min(compute, comm); null when either is 0,
* ``memcpy_ns`` = |∪ memcpy|, ``exposed_memcpy_ns`` = |∪ memcpy \\ (C ∪ M)|,
* ``bound`` (:func:`bound_of`, the one rule of every output that names a bound): of the
  window's shares, compute = |C|, communication = |M \\ C|, copy = |(Y ∪ S) \\ (C ∪ M)| and
  idle = window − busy (they add up to the window), the largest, when it is at least ratio
  (1.2) × the next one, else ``balanced``; spelled ``compute-bound``, ``comm-bound``,
  ``copy-bound``, ``idle``, ``balanced``; ``bound_share`` is the largest share. Null for an
  empty window.

The same sweep gives the time accounting the breakdown uses (``accounting``). Definitions with
worked examples: docs/metrics.md, section "GPU time: overlap".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from traceview.errors import UsageError

from .classify import DEFAULT_PATTERNS, ClassifyPatterns, gpu_events, gpu_rows
from .intervals import (
    clip,
    has_bit,
    mask_lengths,
    sweep,
    union,
    windowed_mask_lengths,
    windows_disjoint,
)
from .window import STEP_PATTERN, gpu_step_windows, gpu_trace_windows, with_gpu_steps

Frame = pl.LazyFrame | pl.DataFrame

#: Bits of the sweep mask, one per coarse class.
BITS: dict[str, int] = {"compute": 0, "comm": 1, "memcpy": 2, "memset": 3}

NOTE_NO_GPU = "no GPU events on this rank (CPU-only trace, or GPU events stripped)"
NOTE_NO_STEPS = "no ProfilerStep ranges: whole trace reported as one window"
NOTE_NO_COMM = "no communication kernels: hidden_fraction and overlap_efficiency are null"

_C, _M, _Y, _S = (has_bit(BITS[k]) for k in ("compute", "comm", "memcpy", "memset"))

#: Lengths summed from the sweep for every window.
_LABELS: dict[str, pl.Expr] = {
    "busy_ns": pl.col("mask") > 0,
    "compute_ns": _C,
    "comm_ns": _M,
    "overlap_ns": _C & _M,
    "exposed_comm_ns": _M & ~_C,
    "memcpy_ns": _Y,
    "exposed_memcpy_ns": _Y & ~_C & ~_M,
    "memset_ns": _S,
    "exposed_memset_ns": _S & ~_C & ~_M & ~_Y,
    "compute_or_comm_ns": _C | _M,
}


def accounting(
    gpu: Frame,
    windows: Frame,
    *,
    by: Sequence[str] = ("rank", "device"),
    window_keys: Sequence[str] = (),
) -> pl.DataFrame:
    """Time of each class inside each window (``gpu`` from ``classify.gpu_events``).

    ``windows``: ``by..., window_keys..., window_start_ns, window_end_ns``, disjoint per group.
    Returns the window columns, ``window_ns``, every ``_LABELS`` column and ``idle_ns`` =
    window − busy. Windows without GPU work have zeros.
    """
    return accountings(gpu, [(windows, window_keys)], by=by)[0]


def accountings(
    gpu: Frame,
    window_sets: Sequence[tuple[Frame, Sequence[str]]],
    *,
    by: Sequence[str] = ("rank", "device"),
) -> list[pl.DataFrame]:
    """``accounting`` for several sets of ``(windows, window_keys)`` (e.g. the steps and the
    whole trace): the sets whose windows are disjoint share one sweep over the events."""
    by = list(by)
    sets = [(w.lazy().collect() if isinstance(w, pl.LazyFrame) else w, list(wk))
            for w, wk in window_sets]
    intervals = gpu.lazy().select([*by, "ts_ns", "end_ns", "gpu_class"])
    classes = {cls: pl.col("gpu_class") == cls for cls in BITS}
    # steps tile the timeline: always disjoint, unless replayed out of order
    disjoint = [i for i, (w, _) in enumerate(sets) if windows_disjoint(w, by=by)]
    swept = dict(zip(disjoint, windowed_mask_lengths(
        intervals, [sets[i] for i in disjoint], classes, by=by))) if disjoint else {}
    out = []
    for i, (w, wk) in enumerate(sets):
        keys = [*by, *wk]
        if i in swept:
            per_mask = swept[i]
        else:  # overlapping windows each get their own clipped copy of the intervals
            cut = clip(intervals, w, by=by, window_keys=wk)
            per_mask = sweep({cls: union(cut.filter(cond), by=keys)
                              for cls, cond in classes.items()}, by=keys).group_by(
                [*keys, "mask"]).agg(length_ns=(pl.col("seg_end_ns") - pl.col("seg_start_ns")).sum())
        lengths = mask_lengths(per_mask, _LABELS, by=keys)
        joined = w.join(lengths, on=keys, how="left") if keys else w.join(lengths, how="cross")
        out.append(
            joined.with_columns([pl.col(c).fill_null(0) for c in _LABELS])
            .with_columns(window_ns=_window_length(w))
            .with_columns(idle_ns=pl.col("window_ns") - pl.col("busy_ns"))
            .sort(keys)
        )
    return out


def _window_length(windows: pl.DataFrame) -> pl.Expr:
    """A window's length: end - start, unless the windows bring their own ``window_ns`` (the
    whole trace of a rank with several profiling windows: ``gpu_trace_windows``)."""
    if "window_ns" in windows.columns:
        return pl.col("window_ns")
    return pl.col("window_end_ns") - pl.col("window_start_ns")


#: What a window (or the critical path) can be bound by, in the order ties are broken.
BOUND_KINDS: tuple[str, ...] = ("compute", "communication", "copy", "input", "host", "idle")

#: ``overlap``'s and ``summary``'s spelling of a bound (``diagnose`` says the kind itself).
BOUND_LABELS: dict[str, str] = {"compute": "compute-bound", "communication": "comm-bound",
                                "copy": "copy-bound", "input": "input-bound",
                                "host": "host-bound", "idle": "idle", "balanced": "balanced"}


#: The bound of a rank without GPU work (a CPU-only trace): its time is the host's.
BOUND_NO_GPU = BOUND_LABELS["host"]


def bound_expr(shares: Mapping[str, pl.Expr], *, ratio: float = 1.2) -> pl.Expr:
    """The bound of a window from the shares of its time (``shares``: a ``BOUND_KINDS`` kind
    -> share expression): the kind with the largest share, when it is at least ``ratio``
    times the next largest; ``balanced`` when the two are closer; null when no share is
    positive. Ties go to the kind first in ``BOUND_KINDS``."""
    kinds = [k for k in BOUND_KINDS if k in shares]
    cols = [shares[k].cast(pl.Float64).fill_null(0.0) for k in kinds]
    top = pl.max_horizontal(cols)
    second = pl.concat_list(cols).list.sort(descending=True).list.get(1, null_on_oob=True) \
        .fill_null(0.0) if len(cols) > 1 else pl.lit(0.0)
    largest = pl.lit(None, pl.String)
    for k, c in reversed(list(zip(kinds, cols))):  # the first of the largest wins
        largest = pl.when(c == top).then(pl.lit(k)).otherwise(largest)
    return (pl.when(top.is_null() | (top <= 0)).then(pl.lit(None, pl.String))
            # shares are ratios of integers: "at least ratio times" up to their rounding
            .when(top >= ratio * second * (1 - 1e-12)).then(largest)
            .otherwise(pl.lit("balanced")))


def bound_of(shares: Mapping[str, float | None], *, ratio: float = 1.2) -> str | None:
    """:func:`bound_expr` on one set of shares (``diagnose``'s critical path)."""
    if not shares:
        return None
    row = pl.DataFrame({k: [None if v is None else float(v)] for k, v in shares.items()},
                       schema={k: pl.Float64 for k in shares})
    return row.select(bound_expr({k: pl.col(k) for k in shares}, ratio=ratio)).item()


def window_shares() -> dict[str, pl.Expr]:
    """The shares of a window's time the GPU bound is read from, over the ``accounting``
    columns: compute, exposed communication, exposed copies (memcpy and memset), idle; they
    add up to 1. Null for an empty window."""
    window = pl.col("window_ns")

    def share(ns: pl.Expr) -> pl.Expr:
        return pl.when(window > 0).then(ns / window).otherwise(None)

    return {"compute": share(pl.col("compute_ns")),
            "communication": share(pl.col("exposed_comm_ns")),
            "copy": share(pl.col("exposed_memcpy_ns") + pl.col("exposed_memset_ns")),
            "idle": share(pl.col("idle_ns"))}


def bound_columns(bound_ratio: float = 1.2) -> list[pl.Expr]:
    """``bound`` (``BOUND_LABELS`` spelling) and ``bound_share`` (the largest share) of
    windows with the ``accounting`` columns."""
    shares = window_shares()
    return [bound_expr(shares, ratio=bound_ratio).replace_strict(
                BOUND_LABELS, default=None, return_dtype=pl.String).alias("bound"),
            pl.max_horizontal(list(shares.values())).alias("bound_share")]


def overlap_columns(bound_ratio: float = 1.2) -> list[pl.Expr]:
    """Derived overlap metrics from the ``accounting`` columns."""
    compute, comm = pl.col("compute_ns"), pl.col("comm_ns")
    denom = compute + comm - pl.max_horizontal(compute, comm)
    return [
        pl.when(comm > 0).then(pl.col("overlap_ns") / comm).otherwise(None)
        .alias("hidden_fraction"),
        pl.when(denom > 0).then((compute + comm - pl.col("compute_or_comm_ns")) / denom)
        .otherwise(None).alias("overlap_efficiency"),
        *bound_columns(bound_ratio),
    ]


#: The columns of ``prepared_gpu``: what the GPU analyses read, nothing more (a window of a
#: large trace has hundreds of thousands of GPU events; the other columns would ride along).
PREPARED_COLUMNS: tuple[str, ...] = (
    "rank", "device", "stream", "name", "ts_ns", "dur_ns", "end_ns", "step", "correlation",
    "gpu_class", "gpu_subclass", "file_id",  # file_id: the profiling window (no gap between)
)


#: What ``gpu_events`` reads to make ``PREPARED_COLUMNS``.
_RAW_COLUMNS: tuple[str, ...] = (
    "rank", "kind", "category", "name", "copy_kind", "device", "pid", "stream", "tid", "ts_ns",
    "dur_ns", "step", "correlation", "file_id",
)


def prepared_gpu(
    events: Frame, *, patterns: ClassifyPatterns = DEFAULT_PATTERNS,
    step_pattern: str = STEP_PATTERN,
) -> pl.DataFrame:
    """Classified GPU events (``PREPARED_COLUMNS``) with steps filled from their launches,
    collected once."""
    # The GPU rows with the columns the classification reads come from the scan first (the
    # streaming engine: same rows, same order, ~10% less CPU than the in-memory one); the
    # join with the per-name classes then runs on the in-memory engine (~2x less CPU than the
    # default engine on 700 k rows; a lazy plan over the scan would also read it twice).
    rows = gpu_rows(events).select(*_RAW_COLUMNS).collect(engine="streaming")
    gpu = gpu_events(rows, patterns=patterns).select(PREPARED_COLUMNS).collect(
        engine="in-memory")
    if gpu.get_column("step").null_count() == 0:
        return gpu  # every step known (the store assigns them at ingest): nothing to fill
    return with_gpu_steps(gpu.lazy(), events, pattern=step_pattern).collect()


def overlap(
    gpu: pl.DataFrame,
    ranks: pl.DataFrame,
    *,
    steps: pl.DataFrame | None = None,
    per_step: bool = False,
    bound_ratio: float = 1.2,
    step_windows: str = "gpu",
) -> pl.DataFrame:
    """Overlap per (rank, device) for the whole trace, or per (rank, device, step).

    ``step_windows``: ``"gpu"`` (default) tiles the GPU timeline by the steps' launched work
    (see ``window.gpu_step_windows``); ``"host"`` uses the host ``ProfilerStep`` ranges as
    windows on the GPU timeline (GPU work outside every host range is then not counted).

    Columns: rank, device, step (null for whole-trace rows), window_start_ns, window_end_ns,
    window_ns, compute_ns, comm_ns, overlap_ns, exposed_comm_ns, busy_ns, idle_ns, memcpy_ns,
    exposed_memcpy_ns, memset_ns, exposed_memset_ns, hidden_fraction, overlap_efficiency,
    bound, note, bound_share. Every rank of ``ranks`` gets at least one row; a rank without GPU events gets
    nulls and a note. With ``per_step`` and no steps, the whole-trace row is returned with a
    note.

    ``gpu``: :func:`prepared_gpu` rows; ``ranks``: the ranks to report (column ``rank``);
    ``steps``: host step ranges (:func:`~.window.step_spans`), read for ``step_windows="host"``.
    """
    window_sets = [(gpu_trace_windows(gpu), [])]
    if per_step:
        window_sets.append((step_windows_for(gpu, steps, step_windows), ["step"]))
    trace, *per = accountings(gpu, window_sets)  # one sweep for the trace and its steps
    trace = trace.with_columns(step=pl.lit(None, pl.Int64), note=pl.lit(None, pl.String))
    if per_step:
        steps = per[0].with_columns(note=pl.lit(None, pl.String))
        have = steps.select("rank", "device").unique()
        fallback = trace.join(have, on=["rank", "device"], how="anti").with_columns(
            note=pl.lit(NOTE_NO_STEPS))
        result = pl.concat([steps, fallback.select(steps.columns)], how="vertical_relaxed")
    else:
        result = trace
    result = result.with_columns(overlap_columns(bound_ratio)).with_columns(
        note=_join_notes(pl.col("note"), pl.when(pl.col("comm_ns") == 0)
                         .then(pl.lit(NOTE_NO_COMM)).otherwise(None)))
    return finish(result, ranks, _OVERLAP_COLUMNS)


def step_windows_for(gpu: pl.DataFrame, steps: pl.DataFrame | None, kind: str) -> pl.DataFrame:
    """Step windows per (rank, device): GPU tiling (``"gpu"``) or the host step ranges
    ``steps`` (``"host"``)."""
    if kind == "gpu":
        return gpu_step_windows(gpu)
    if kind != "host":
        raise UsageError(f"step windows are 'gpu' or 'host', not {kind!r}")
    if steps is None:
        raise UsageError("host step windows need the host step ranges (steps=)")
    spans = steps
    devices = gpu.select("rank", "device").unique()
    return devices.join(spans, on="rank", how="inner").select(
        "rank", "device", "step", pl.col("step_start_ns").alias("window_start_ns"),
        pl.col("step_end_ns").alias("window_end_ns")).sort("rank", "device", "step")


_OVERLAP_COLUMNS = [
    "rank", "device", "step", "window_start_ns", "window_end_ns", "window_ns", "compute_ns",
    "comm_ns", "overlap_ns", "exposed_comm_ns", "busy_ns", "idle_ns", "memcpy_ns",
    "exposed_memcpy_ns", "memset_ns", "exposed_memset_ns", "hidden_fraction",
    "overlap_efficiency", "bound", "note", "bound_share",
]


def _join_notes(*parts: pl.Expr) -> pl.Expr:
    return pl.concat_str(list(parts), separator="; ", ignore_nulls=True).replace("", None)


def finish(result: pl.DataFrame, ranks: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """Select ``columns`` and add a row with a note for each rank of ``ranks`` that has no GPU
    events."""
    missing = ranks.select("rank").join(result.select("rank").unique(), on="rank", how="anti")
    result = result.select([c for c in columns if c in result.columns])
    if missing.height:
        filler = missing.with_columns(note=pl.lit(NOTE_NO_GPU))
        if "bound" in columns:  # no GPU work: the host's run (summary and diagnose say so too)
            filler = filler.with_columns(bound=pl.lit(BOUND_NO_GPU))
        result = pl.concat([result, filler], how="diagonal_relaxed")
    return result.sort("rank", "device", "step", nulls_last=True) if "step" in result.columns \
        else result.sort("rank", "device", nulls_last=True)
