"""The run's bound: the one answer ``summary``, ``overlap``, ``diagnose`` and the report give to
"what is this run bound by, and by how much".

It is read from the GPU's time, not from the critical path: the whole-trace ``overlap`` rows
of every GPU rank and device are pooled (their compute, exposed communication, exposed copies
and idle time summed, over the sum of their windows) and the pooled shares go through the one
rule of every bound (``overlap.bound_columns``: the largest share when at least 1.2x the next,
else ``balanced``). Pooling makes a one-rank run's bound its rank's bound in ``summary``
exactly (the same sums through the same expressions), and costs a sum over a few rows: the
critical path is not computed for it (on 200 ranks it doubles ``summary``'s time).
``diagnose`` names this bound and adds, under another name (``path_shares``), what its critical
path is made of. A run without GPU work is ``host-bound`` with no share (no GPU time to take a
share of), as each of its ranks. Definition: docs/metrics.md, "The run's bound".
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .overlap import BOUND_NO_GPU, bound_columns, window_shares

#: The GPU shares the bound is read from, in ``overlap.window_shares``' order.
SHARE_KINDS: tuple[str, ...] = ("compute", "communication", "copy", "idle")

_SUMMED = ("compute_ns", "exposed_comm_ns", "exposed_memcpy_ns", "exposed_memset_ns", "idle_ns",
           "window_ns")


def run_bound(overlap_rows: pl.DataFrame, *, bound_ratio: float = 1.2) -> dict[str, Any]:
    """The run's bound from the whole-trace ``overlap`` rows (step null): ``bound`` (spelled as
    ``overlap``'s: compute-bound, comm-bound, copy-bound, idle, balanced, host-bound; None: no
    time at all), ``bound_share`` (the largest share; None without GPU work), ``shares`` (the
    pooled GPU shares, ``SHARE_KINDS``, adding up to 1; empty without GPU work),
    ``gpu_ranks`` (how many ranks the GPU time comes from) and ``window_ns`` (the pooled
    windows)."""
    rows = overlap_rows.filter(pl.col("step").is_null() & pl.col("window_ns").is_not_null())
    if rows.height == 0:  # no GPU work anywhere: the host's run, as each rank says
        return {"bound": BOUND_NO_GPU if overlap_rows.height else None, "bound_share": None,
                "shares": {}, "gpu_ranks": 0, "window_ns": None}
    pooled = rows.select(*(pl.col(c).sum() for c in _SUMMED),
                         gpu_ranks=pl.col("rank").n_unique().cast(pl.Int64))
    shares = window_shares()
    out = pooled.with_columns(*bound_columns(bound_ratio),
                              *(shares[k].alias(f"share_{k}") for k in SHARE_KINDS)).row(
        0, named=True)
    return {"bound": out["bound"], "bound_share": out["bound_share"],
            "shares": {k: out[f"share_{k}"] for k in SHARE_KINDS},
            "gpu_ranks": out["gpu_ranks"], "window_ns": out["window_ns"]}


def bound_phrase(bound: dict[str, Any]) -> str:
    """The bound with its share, as every text output prints it: ``idle 55.2% of the GPU
    time``, ``balanced between compute (45.0%) and idle (40.0%) of the GPU time``,
    ``host-bound (no GPU work)``."""
    label, share, shares = bound.get("bound"), bound.get("bound_share"), bound.get("shares")
    if label is None:
        return "unknown"  # no recorded time, or none given (a bare critical path)
    if share is None:
        return f"{label} (no GPU work)" if label == BOUND_NO_GPU else str(label)
    if label == "balanced" and shares:
        top = sorted(shares, key=lambda k: (-(shares[k] or 0.0), SHARE_KINDS.index(k)))[:2]
        return ("balanced between " + " and ".join(
            f"{k} ({100 * (shares[k] or 0.0):.1f}%)" for k in top) + " of the GPU time")
    return f"{label} {100 * share:.1f}% of the GPU time"
