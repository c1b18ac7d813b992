"""Advice that checks the trace first (analyses/advice_checks.py, diagnose): no precision advice
to kernels already below fp32, no "use fused attention" to FlashAttention, no CUDA-graph advice
for start-up, "in the window" (with its length) for a trace without steps. Hand-drawn
timelines; the numbers derived by hand in each docstring."""

from __future__ import annotations

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame, kernel, launch, row, step
from traceview.analyses.advice_checks import (
    checked_fix, fused_attention, kernel_precision, lower_precision, precision_shares, startup,
)
from traceview.analyses.diagnose import in_the_window
from traceview.outputs.words import finding_headline


@pytest.mark.parametrize(("name", "precision"), [
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1", "fp8"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4>", "bf16"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "fp16"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x64x32", "tf32"),
    ("volta_sgemm_128x64_nn", "fp32"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>",
     "fp16"),
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopA_TNT", "bf16"),
    # Tensile (hipBLASLt/rocBLAS on AMD): the type token after the transposes
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN", "bf16"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8", "fp16"),
    ("nvjet_qqtst_128x256_64x4_2x1_v_bz_TNT", "fp8"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x64", "fp16"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>(Flash_fwd_params)",
     None),  # says nothing: the op's dtype decides
])
def test_kernel_precision_from_names(name: str, precision: str | None) -> None:
    assert kernel_precision(name) == precision


def test_precision_shares_fall_back_on_the_ops_dtype() -> None:
    # 60 ns fp8 by name, 30 ns nvjet owned by a bf16 op, 10 ns sgemm: 90 of 100 known below fp32
    shares = precision_shares({"gemm_e4m3": 60, "nvjet_tst_x": 30, "volta_sgemm_x": 10},
                              {"nvjet_tst_x": "bf16"})
    assert shares == {"fp8": 60, "bf16": 30, "fp32": 10}
    low, which = lower_precision(shares)
    assert low == pytest.approx(0.9) and which == ["fp8", "bf16"]
    assert lower_precision({"unknown": 5}) == (0.0, [])


def test_fused_attention_and_startup_names() -> None:
    assert fused_attention("void flash::FlashAttnFwdSm90<Flash_fwd_kernel_traits>(...)")
    assert fused_attention("fmha_cutlassF_f16_aligned_64x64_rf_sm80")
    assert fused_attention("cudnn_generated_fort_native_sdpa_sm90_flash_fprop")
    assert not fused_attention("void at::native::softmax_warp_forward<float, float, 10>")
    # ROCm: PyTorch's flash backend runs AOTriton's attn_fwd; vLLM's and SGLang's attention
    assert fused_attention("attn_fwd") and fused_attention("_attn_fwd")
    assert fused_attention("kernel_unified_attention_2d")
    assert fused_attention("void paged_attention_ll4mi_QKV_mfma16_kernel<__hip_bfloat16>(...)")
    assert not fused_attention("scaled_dot_product_attention")  # the math path's dispatcher
    assert not fused_attention("transformer_attn_forward_math")
    assert startup("MPI_Init") and startup("MPI_Init_thread") and startup("cuInit")
    assert startup("numba/cuda/api.py(120): to_device") and not startup("cudaLaunchKernel")


def test_a_kernel_of_a_flash_attention_op_is_fused_whatever_its_name() -> None:
    """A kernel whose name says nothing ("my_kernel", 80 ns) owned by
    ``aten::_scaled_dot_product_flash_attention``, beside a 20 ns softmax: 80% fused by its
    op, so no "use fused attention"; without the owners only 0% is known fused."""
    names = {"my_kernel": 80, "softmax_warp_forward": 20}
    owners = {"my_kernel": "aten::_scaled_dot_product_flash_attention",
              "softmax_warp_forward": "aten::_softmax"}
    fix, evidence = checked_fix("attention", "x", names, {}, owners)
    assert fix.startswith("Attention already runs fused kernels (FlashAttention)")
    assert [e["value"] for e in evidence if e["metric"] == "fused_attention_share"] == [0.8]
    fix, _ = checked_fix("attention", "x", names, {})
    assert fix.startswith("Use fused attention")


def _one_step(kernels: list[tuple[str, int, int]], *, with_step: bool = True,
              extra: list[dict] | None = None):
    """One GPU rank: kernels launched 10 ns before they start (launch [ts-10, ts-5))."""
    rows = [step(1, 0, 1000)] if with_step else []
    for i, (name, ts, dur) in enumerate(kernels, 1):
        rows += [launch(ts - 10, 5, i), kernel(name, ts, dur, corr=i)]
    return traceview.Run.from_events(frame(rows + (extra or [])))


def _finding(res, id_: str, name: str | None = None) -> dict:
    f = res["findings"].filter(pl.col("id") == id_)
    if name is not None:
        f = f.filter(pl.col("name") == name)
    return f.row(0, named=True)


def test_an_fp8_run_is_not_told_to_use_bf16() -> None:
    """An FP8 GEMM [20,600) and a FlashAttention-3 kernel [620,1000): both families hold
    over 10% of the path; neither fix may advise what the kernels already do."""
    res = _one_step([("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n", 20, 580),
                     ("void flash::FlashAttnFwdSm90<Flash_fwd_kernel_traits<128>>(x)", 620,
                      380)]).diagnose()
    gemm = _finding(res, "kernels", "gemm")
    assert "autocast" not in gemm["recommendation"] and "TF32" not in gemm["recommendation"]
    assert "already run in fp8" in gemm["recommendation"]
    ev = {e["metric"]: e["value"] for e in gemm["evidence"]}
    assert ev["lower_precision_share"] == 1.0
    attention = _finding(res, "kernels", "attention")
    assert "Use fused attention" not in attention["recommendation"]
    assert "FlashAttention-3" in attention["recommendation"]
    # the attention kernel's name gives no precision: fp8 attention is still an option
    assert "fp8 attention" in attention["recommendation"]


def test_an_fp32_run_still_gets_the_precision_advice() -> None:
    """sgemm [20,1000) in fp32, and unfused attention (softmax of a naive attention): the
    original advice stands."""
    res = _one_step([("volta_sgemm_128x64_nn", 20, 700),
                     ("void at::native::attention_softmax_warp_forward<float>(x)", 730,
                      270)]).diagnose()
    assert "autocast" in _finding(res, "kernels", "gemm")["recommendation"]
    assert "Use fused attention" in _finding(res, "kernels", "attention")["recommendation"]


def test_mpi_init_is_start_up_not_a_cuda_graph_case() -> None:
    """Without steps: MPI_Init [0,400) on the launching thread, then a launch [405,410) and
    the kernel [420,1000). The host time before the first GPU work (MPI_Init 400 + the launch
    area) is start-up: no launch_bound finding (no CUDA-graph advice); a start-up finding
    names MPI_Init; every title says "in the window (1000 ns)"."""
    ev = [row("cpu_op", "MPI_Init", 0, 400, pid=1, tid=1)]
    res = _one_step([("k", 420, 580)], with_step=False, extra=ev).diagnose()
    ids = res["findings"].get_column("id").to_list()
    assert "launch_bound" not in ids
    start = _finding(res, "startup")
    assert start["name"] == "MPI_Init" and "CUDA graphs" in start["recommendation"]
    assert "do not shorten it" in start["recommendation"]
    for f in res["findings"].iter_rows(named=True):
        assert "per step" not in f["title"] and f["per"] == "window"
    assert "in the window (" in start["title"]
    assert "ms in the window" in finding_headline(start)


def test_in_the_window_wording() -> None:
    assert in_the_window("Communication: 2.00 ms per step not hidden", 30_000_000) == \
        "Communication: 2.00 ms in the window (30.00 ms) not hidden"


def test_an_unnamed_fp8_gemm_is_read_from_its_ops_input_types() -> None:
    """A cuBLASLt kernel whose name gives no precision (``nvjet_qqtst_...``), launched by an
    ``aten::_scaled_mm`` (no model) of ``c10::Float8_e4m3fn`` inputs: the op's recorded
    types say fp8, so the matrix-multiply fix gives no precision advice (the kernel here is
    named ``cublasLt_gemm_kernel``: no type letters)."""
    import json

    fp8 = "c10::Float8_e4m3fn"
    args = {"Input Dims": [[64, 128], [128, 256], [], []],
            "Input type": [fp8, fp8, "float", "float"],
            "Input Strides": [[], [], [], []], "Concrete Inputs": ["", "", "", ""]}
    run = traceview.Run.from_events(frame([
        step(1, 0, 1000),
        row("cpu_op", "aten::_scaled_mm", 5, 10, pid=1, tid=1, args_json=json.dumps(args)),
        launch(8, 2, 1), kernel("cublasLt_gemm_kernel", 20, 900, corr=1)]))
    gemm = _finding(run.diagnose(), "kernels", "gemm")
    assert "already run in fp8" in gemm["recommendation"]
    assert "autocast" not in gemm["recommendation"]


def test_other_kernels_are_sent_to_either_vendors_kernel_profiler() -> None:
    """One unknown kernel [20,1000) holds the path: the fix names Nsight Compute and AMD's
    rocprof-compute (an MI300X trace was told to use ncu)."""
    res = _one_step([("mystery_kernel", 20, 980)]).diagnose()
    fix = _finding(res, "kernels", "other")["recommendation"]
    assert "ncu" in fix and "rocprof-compute" in fix
