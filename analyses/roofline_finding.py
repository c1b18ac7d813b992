"""``diagnose``'s roofline finding: the op shapes furthest from their roofline, weighted by
their GPU time (``analyses.ops``).

    gain per step = min(sum over the top ``TOP`` op shapes of time_left_ns / (steps x GPU
                        ranks), the compute on the critical path per step)

``time_left_ns`` is GPU time x (1 - roofline fraction): what the op would save at the
roofline. The gain is conservative: only the ``TOP`` shapes with the most time left count,
it is a mean per step and rank (the ops table sums over ranks), and it never exceeds the GPU
compute the critical path holds (faster kernels off the path save nothing). The roofline is
an ideal no kernel reaches, and the bytes are the ideal traffic, so the confidence is medium.
Definitions: ``docs/metrics.md``, "Operators against the roofline" and "Diagnose".
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .advice_checks import LOWER
from .names import short_name

#: The op shapes a roofline finding counts (most time left first).
TOP = 3

RECOMMENDATION = (
    "Bring the named ops closer to their roofline: for compute-bound matrix multiplies and "
    "attention, bf16/fp16 (or fp8) with dimensions that are multiples of 64, larger batches "
    "or fused projections (fewer, larger GEMMs), FlashAttention-style fused kernels; for "
    "memory-bound ops, fuse them with their neighbours (torch.compile), avoid extra copies "
    "and casts, keep tensors contiguous. `traceview ops` lists every op with its bound and "
    "the fraction of the roofline it reaches; profile the top kernels with Nsight Compute.")

#: The same for ops already below fp32 (their recorded dtypes): no precision advice.
RECOMMENDATION_LOW_PRECISION = (
    "Bring the named ops closer to their roofline (they already run in {precision}): for "
    "compute-bound matrix multiplies and attention, dimensions that are multiples of 64, "
    "larger batches or fused projections (fewer, larger GEMMs), fused attention kernels; for "
    "memory-bound ops, fuse them with their neighbours (torch.compile), avoid extra copies "
    "and casts, keep tensors contiguous. `traceview ops` lists every op with its bound and "
    "the fraction of the roofline it reaches; profile the top kernels with Nsight Compute.")


def roofline_finding(ops: pl.DataFrame | None, *, n_steps: int, gpu_ranks: int,
                     path_compute_ns_per_step: int | None) -> dict[str, Any] | None:
    """The finding (id ``roofline``, gain per step as above), or None when no op has a
    roofline (no peaks for the device, no modelled op) or nothing is left on the table."""
    if ops is None or ops.height == 0 or "time_left_ns" not in ops.columns:
        return None
    top = (ops.filter(pl.col("time_left_ns") > 0)
           .sort("time_left_ns", "name", descending=[True, False]).head(TOP))
    if top.height == 0:
        return None
    per = max(n_steps, 1) * max(gpu_ranks, 1)
    left = int(top.get_column("time_left_ns").sum()) // per
    gain = left if path_compute_ns_per_step is None else min(left, path_compute_ns_per_step)
    lead = top.row(0, named=True)
    evidence = [{"metric": "time_left_ns_per_step", "value": float(r["time_left_ns"] // per),
                 "unit": "ns", "text": f"{r['name']} {r['input_dims'] or ''} ({r['bound']}-"
                 f"bound, {100 * r['roofline_fraction']:.0f}% of its roofline)".strip()}
                for r in top.iter_rows(named=True)]
    evidence.append({"metric": "left_on_top_ops_ns_per_step", "value": float(left),
                     "unit": "ns", "text": f"the top {top.height} op shapes"})
    if path_compute_ns_per_step is not None:
        evidence.append({"metric": "path_compute_ns_per_step",
                         "value": float(path_compute_ns_per_step), "unit": "ns",
                         "text": "the cap: compute on the critical path"})
    return {"id": "roofline", "rank": None, "name": lead["name"], "gain_ns_per_step": gain,
            "confidence": "medium", "max_severity": "medium",
            "title": (f"Ops far from their roofline: {short_name(lead['name'], 50)} reaches "
                      f"{100 * lead['roofline_fraction']:.0f}% of its {lead['bound']} roof; the "
                      f"top {top.height} op shapes leave {_time(left)} per step on the table"),
            "evidence": evidence, "recommendation": _recommendation(top)}


def _recommendation(top: pl.DataFrame) -> str:
    """The fix, without precision advice when every named op already runs below fp32."""
    dtypes = set(top.get_column("dtype").drop_nulls().to_list()) if "dtype" in top.columns \
        else set()
    if dtypes and dtypes <= LOWER:
        return RECOMMENDATION_LOW_PRECISION.format(precision=" and ".join(sorted(dtypes)))
    return RECOMMENDATION


def _time(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us" if ns >= 1e3 \
        else f"{ns:.0f} ns"
