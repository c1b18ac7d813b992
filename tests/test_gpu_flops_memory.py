"""FLOPs/MFU (analyses/flops.py) and memory (analyses/memory.py) on hand-built traces."""

from __future__ import annotations

import polars as pl
import pytest

from gpu_trace_helpers import frame, row, step
from traceview.analyses.flops import Peak, achieved_flops, peak_tflops
from traceview.analyses.memory import NOTE_NO_MEMORY, memory_by_step


def _flops_trace():
    # two 1 ms steps; step 1 has 2e11 + 1e11 FLOP in two matmuls, step 2 has 5e11
    return frame([
        step(1, 0, 1_000_000), step(2, 1_000_000, 1_000_000),
        row("cpu_op", "aten::mm", 10, 100, step=1, flops=200_000_000_000),
        row("cpu_op", "aten::addmm", 200, 100, step=1, flops=100_000_000_000),
        row("cpu_op", "aten::relu", 400, 10, step=1),
        row("cpu_op", "aten::mm", 1_000_010, 100, step=2, flops=500_000_000_000),
    ])


def test_mfu_from_trace_flops_by_hand() -> None:
    df = achieved_flops(_flops_trace(), device_name="NVIDIA A100-SXM4-80GB", dtype="bf16")
    # 3e11 FLOP in 1 ms = 3e14 FLOP/s = 300 TFLOP/s; A100 bf16 dense peak 312
    assert df["achieved_tflops"].to_list() == pytest.approx([300.0, 500.0])
    assert df["mfu"].to_list() == pytest.approx([300 / 312, 500 / 312])
    assert df["flops_source"].to_list() == ["trace", "trace"]
    assert df["note"].to_list() == [None, None]


def test_model_flops_and_user_peak_override() -> None:
    df = achieved_flops(_flops_trace(), model_flops_per_step=1e11, peak=200.0)
    assert df["achieved_tflops"].to_list() == pytest.approx([100.0, 100.0])
    assert df["mfu"].to_list() == pytest.approx([0.5, 0.5])
    table = (Peak(r"Radeon", "bf16", 100.0, "my measurement"),)
    assert peak_tflops("AMD Radeon Graphics", "bfloat16", table=table).tflops == 100.0


def test_partial_results_with_reasons() -> None:
    ev = _flops_trace().with_columns(flops=pl.lit(None, pl.Int64))
    df = achieved_flops(ev, device_name="AMD Radeon Graphics")
    assert df["mfu"].null_count() == 2
    assert "with_flops" in df["note"][0] and "no peak" in df["note"][0]
    no_steps = achieved_flops(frame([row("cpu_op", "aten::mm", 0, 1)]))
    assert "ProfilerStep" in no_steps["note"][0]


def test_memory_by_step_by_hand() -> None:
    mem = lambda ts, step_, alloc, res, device=0: row(  # noqa: E731
        "memory", "[memory]", ts, None, step=step_, device=device, mem_total_allocated=alloc,
        mem_total_reserved=res)
    ev = frame([
        step(1, 0, 100), step(2, 100, 100),
        mem(10, 1, 100, 200), mem(20, 1, 300, 400), mem(30, 1, 150, 400),
        mem(110, 2, 500, 600), mem(120, 2, 250, 600),
        mem(15, 1, 999, 999, device=-1),  # host allocation: not device memory
        row("cpu_op", "aten::mm", 0, 1, rank=1),
    ])
    df = memory_by_step(ev)
    r0 = df.filter(pl.col("rank") == 0)
    assert r0.select("step", "peak_allocated_bytes", "peak_reserved_bytes",
                     "end_allocated_bytes", "growth_bytes").rows() == [
        (1, 300, 400, 150, None), (2, 500, 600, 250, 100)]
    assert df.filter(pl.col("rank") == 1)["note"].item() == NOTE_NO_MEMORY
