"""Achieved FLOP/s and model FLOPs utilisation (MFU) per step.

    achieved_tflops = flops_in_step / step_time_s / 1e12
    mfu             = achieved_tflops / peak_tflops(device, dtype)

``flops_in_step`` is the sum of the ``flops`` column of host ops in the step (PyTorch records it
with ``with_flops=True`` on the leaf aten ops: mm, addmm, bmm, conv, ...), or the caller's model
FLOPs per step. ``step_time_ns`` is the host ``ProfilerStep#N`` duration. Peaks are dense
(no structured sparsity) vendor datasheet figures in ``PEAK_TABLE``; pass your own table or a
``peak_tflops`` number to override. Definitions: docs/metrics.md, section "GPU FLOPs and MFU".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from .window import STEP_PATTERN, ranks_present, step_spans

Frame = pl.LazyFrame | pl.DataFrame


@dataclass(frozen=True)
class Peak:
    """One row of the peak table: devices whose name matches ``pattern`` (case-insensitive
    regex, first match wins), element type, dense peak TFLOP/s, and where the number is from.
    The rows of dtype ``hbm`` hold the device memory's peak bandwidth in TB/s instead
    (``peak_bandwidth``): the roofline's memory roof."""

    pattern: str
    dtype: str
    tflops: float
    source: str


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021); sparsity figures halved"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023); sparsity figures halved"
_B200 = "NVIDIA DGX B200 / HGX B200 datasheet (2024), per GPU; sparsity figures halved"
_V100 = "NVIDIA Tesla V100 GPU datasheet (2020)"
_MI300 = "AMD Instinct MI300X accelerator data sheet (2023), dense matrix"
_MI250 = "AMD Instinct MI250/MI250X data sheets (2021), dense matrix"
_TURING = "NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti reference board"
_GP100 = "NVIDIA Quadro GP100 datasheet (2017)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM; sparsity figures halved"

#: Dense peak TFLOP/s by device name pattern and dtype (fp64, fp32, tf32, bf16, fp16, fp8).
PEAK_TABLE: tuple[Peak, ...] = (
    Peak(r"H100.*PCIe", "fp32", 51.0, _H100), Peak(r"H100.*PCIe", "tf32", 378.0, _H100),
    Peak(r"H100.*PCIe", "bf16", 756.0, _H100), Peak(r"H100.*PCIe", "fp16", 756.0, _H100),
    Peak(r"H100.*PCIe", "fp8", 1513.0, _H100), Peak(r"H100.*PCIe", "fp64", 26.0, _H100),
    Peak(r"H100|H800", "fp32", 67.0, _H100), Peak(r"H100|H800", "tf32", 494.5, _H100),
    Peak(r"H100|H800", "bf16", 989.5, _H100), Peak(r"H100|H800", "fp16", 989.5, _H100),
    Peak(r"H100|H800", "fp8", 1979.0, _H100), Peak(r"H100|H800", "fp64", 34.0, _H100),
    Peak(r"A100|A800", "fp64", 9.7, _A100), Peak(r"A100|A800", "fp32", 19.5, _A100),
    Peak(r"A100|A800", "tf32", 156.0, _A100), Peak(r"A100|A800", "bf16", 312.0, _A100),
    Peak(r"A100|A800", "fp16", 312.0, _A100),
    Peak(r"B200", "tf32", 1100.0, _B200), Peak(r"B200", "bf16", 2250.0, _B200),
    Peak(r"B200", "fp16", 2250.0, _B200), Peak(r"B200", "fp8", 4500.0, _B200),
    Peak(r"V100.*PCIe", "fp32", 14.0, _V100), Peak(r"V100.*PCIe", "fp16", 112.0, _V100),
    Peak(r"V100.*PCIe", "fp64", 7.0, _V100),
    Peak(r"V100", "fp32", 15.7, _V100), Peak(r"V100", "fp16", 125.0, _V100),
    Peak(r"V100", "fp64", 7.8, _V100),
    Peak(r"MI300X", "fp32", 163.4, _MI300), Peak(r"MI300X", "bf16", 1307.4, _MI300),
    Peak(r"MI300X", "fp16", 1307.4, _MI300), Peak(r"MI300X", "fp8", 2614.9, _MI300),
    Peak(r"MI300X", "fp64", 163.4, _MI300),
    Peak(r"MI250X", "fp32", 95.7, _MI250), Peak(r"MI250X", "bf16", 383.0, _MI250),
    Peak(r"MI250X", "fp16", 383.0, _MI250),
    Peak(r"MI250", "fp32", 90.5, _MI250), Peak(r"MI250", "bf16", 362.1, _MI250),
    Peak(r"MI250", "fp16", 362.1, _MI250),
    Peak(r"RTX 2080 Ti", "fp32", 13.4, _TURING), Peak(r"RTX 2080 Ti", "fp16", 107.6, _TURING),
    Peak(r"GP100", "fp32", 10.3, _GP100), Peak(r"GP100", "fp16", 20.7, _GP100),
    Peak(r"GP100", "fp64", 5.2, _GP100),
    Peak(r"H200", "fp32", 67.0, _H200), Peak(r"H200", "tf32", 494.5, _H200),
    Peak(r"H200", "bf16", 989.5, _H200), Peak(r"H200", "fp16", 989.5, _H200),
    Peak(r"H200", "fp8", 1979.0, _H200), Peak(r"H200", "fp64", 34.0, _H200),
    # memory bandwidth (TB/s), the roofline's memory roof
    Peak(r"H100.*PCIe", "hbm", 2.0, _H100), Peak(r"H100|H800", "hbm", 3.35, _H100),
    Peak(r"H200", "hbm", 4.8, _H200),
    Peak(r"A100.*PCIe.*80GB", "hbm", 1.935, _A100), Peak(r"A100.*80GB", "hbm", 2.039, _A100),
    Peak(r"A100|A800", "hbm", 1.555, _A100),
    Peak(r"B200", "hbm", 8.0, _B200), Peak(r"V100", "hbm", 0.9, _V100),
    Peak(r"MI300X", "hbm", 5.3, _MI300), Peak(r"MI250", "hbm", 3.2768, _MI250),
    Peak(r"RTX 2080 Ti", "hbm", 0.616, _TURING), Peak(r"GP100", "hbm", 0.717, _GP100),
)

_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                  "half": "fp16", "float64": "fp64", "double": "fp64", "tensorfloat32": "tf32"}


def peak_tflops(device_name: str | None, dtype: str, *,
                table: Sequence[Peak] = PEAK_TABLE) -> Peak | None:
    """The first table row matching the device name and dtype, or None.

    >>> peak_tflops("NVIDIA H100 80GB HBM3", "bf16").tflops
    989.5
    >>> peak_tflops("AMD Radeon Graphics", "bf16") is None
    True
    """
    if not device_name:
        return None
    dt = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    for p in table:
        if p.dtype == dt and re.search(p.pattern, device_name, flags=re.IGNORECASE):
            return p
    return None


def peak_bandwidth(device_name: str | None, *,
                   table: Sequence[Peak] = PEAK_TABLE) -> Peak | None:
    """The device memory's peak bandwidth (its ``hbm`` row: ``tflops`` holds TB/s), or None.

    >>> peak_bandwidth("NVIDIA H100 80GB HBM3").tflops
    3.35
    """
    return peak_tflops(device_name, "hbm", table=table)


def achieved_flops(
    events: Frame,
    *,
    device_name: str | None = None,
    dtype: str = "bf16",
    peak: float | None = None,
    model_flops_per_step: float | None = None,
    table: Sequence[Peak] = PEAK_TABLE,
    step_pattern: str = STEP_PATTERN,
) -> pl.DataFrame:
    """Per (rank, step): step_time_ns, flops, flops_source, achieved_tflops, peak_tflops,
    mfu, note. Partial results (nulls with a note) when FLOPs or the peak are unknown."""
    spans = step_spans(events, pattern=step_pattern)
    if spans.height == 0:
        return ranks_present(events).with_columns(
            note=pl.lit("no ProfilerStep ranges: no step time"))
    traced = (
        events.lazy()
        .filter((pl.col("kind").cast(pl.String) == "cpu_op") & pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(_tflops=pl.col("flops").cast(pl.Float64).sum(),  # a float: no int64 wrap
             _n=pl.col("flops").is_not_null().sum())
        .collect()
    )
    out = spans.join(traced, on=["rank", "step"], how="left")
    if model_flops_per_step is not None:
        out = out.with_columns(flops=pl.lit(float(model_flops_per_step)),
                               flops_source=pl.lit("model"))
    else:
        has = pl.col("_n").fill_null(0) > 0
        out = out.with_columns(
            flops=pl.when(has).then(pl.col("_tflops").cast(pl.Float64)).otherwise(None),
            flops_source=pl.when(has).then(pl.lit("trace")).otherwise(None))
    found = peak_tflops(device_name, dtype, table=table) if peak is None else None
    peak_value = peak if peak is not None else (found.tflops if found else None)
    out = out.with_columns(
        achieved_tflops=pl.col("flops") / (pl.col("step_time_ns") / 1e9) / 1e12,
        peak_tflops=pl.lit(peak_value, pl.Float64),
        peak_source=pl.lit(found.source if found else ("user" if peak is not None else None),
                           pl.String),
    ).with_columns(mfu=pl.col("achieved_tflops") / pl.col("peak_tflops"))
    no_flops = "no FLOP counts in the trace (profile with with_flops=True) or model FLOPs given"
    no_peak = f"no peak for device {device_name!r} and dtype {dtype!r}: pass a peak"
    note = pl.concat_str([
        pl.when(pl.col("flops").is_null()).then(pl.lit(no_flops)),
        pl.when(pl.col("peak_tflops").is_null()).then(pl.lit(no_peak)),
    ], separator="; ", ignore_nulls=True).replace("", None)
    return out.with_columns(note=note).select(
        "rank", "step", "step_time_ns", "flops", "flops_source", "achieved_tflops",
        "peak_tflops", "peak_source", "mfu", "note").sort("rank", "step")
