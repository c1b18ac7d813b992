"""Operators against the roofline (analyses/op_kernels.py, op_models.py, ops.py) on a
hand-built trace, every number derived by hand below.

Rank 0, one thread (pid 1, tid 1), device "NVIDIA H100 80GB HBM3" (fp32 67 TFLOP/s, bf16
989.5 TFLOP/s, 3.35 TB/s: analyses.flops.PEAK_TABLE):

  aten::mm [1000,1100)         A [64,128] @ B [128,256] float, args.flops recorded
    cudaLaunchKernel @1010 corr 1 -> "gemm_a" 10 us
  aten::linear [2000,2200)     x [64,128], W [256,128], bias [256] float
    aten::t [2005,2008)        (no GPU work)
    aten::addmm [2010,2150)    bias [256], A [64,128], B [128,256]
      cudaLaunchKernel @2020 corr 2 -> "gemm_b" 20 us
  aten::_scaled_dot_product_flash_attention [3000,3300)  q k v [1,2,128,64] bf16, causal
    aten::_flash_attention_forward [3010,3200)
      cudaLaunchKernel @3020 corr 3 -> "flash_fwd" 5 us
  aten::index_select [4000,4100)                (no model)
    cudaLaunchKernel @4010 corr 4 -> "index_kernel" 1 us
  cudaLaunchKernel @5000 corr 5 (no op around it) -> "orphan" 2 us
  aten::mm [6000,6100) same shapes as the first, launched "gemm_a" 20 us (corr 6)

By hand:
  mm: FLOPs 2*64*128*256 = 4,194,304; bytes (64*128 + 128*256 + 64*256) * 4 = 229,376.
      Instance 1: 10 us -> 4,194,304 / 10,000 ns = 419.43 GFLOP/s = 0.41943 TFLOP/s,
      229,376 / 10,000 = 0.0229376 TB/s; instance 2 (20 us): half of each.
      Roofline: compute 4,194,304 / 67e3 FLOP/ns = 62.60 ns; memory 229,376 / 3.35e3 B/ns =
      68.47 ns -> memory bound, roofline time 68.47 ns per instance; the group's fraction
      2 * 68.47 / 30,000 = 0.004565; time left 30,000 - 136.94 = 29,863 ns.
  addmm (owns gemm_b: the innermost modelled op; linear owns nothing): FLOPs 4,194,304 +
      64*256 (bias) = 4,210,688; bytes 229,376 + 256*4 = 230,400.
  flash (owns flash_fwd, launched by its unmodelled child: direct 0, subtree 5 us): FLOPs
      (2*1*2*128*128*64) * 2 (QK^T and PV) / 2 (causal, square) = 4,194,304; bytes 4 *
      1*2*128*64*2 = 131,072; 4,194,304 / 5,000 = 0.83886 TFLOP/s; intensity 32 < ridge
      989.5 / 3.35 = 295.4 -> memory bound; roofline 131,072 / 3.35e3 = 39.13 ns.
  index_select: 1 us, no model; orphan: no op, not in the table.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from gpu_trace_helpers import frame, kernel, launch, row
from traceview.analyses.host import host_events
from traceview.analyses.names import short_name, unique_short_names
from traceview.analyses.op_kernels import op_kernel_times
from traceview.analyses.op_models import causal_fraction, family, model
from traceview.analyses.ops import op_args, ops
from traceview.analyses.overlap import prepared_gpu
from traceview.run.run import Run

H100 = "NVIDIA H100 80GB HBM3"
F32, BF16 = "float", "c10::BFloat16"


def _op(name: str, ts: int, dur: int, dims=None, types=None, concrete=None, **kw) -> dict:
    args = {}
    if dims is not None:
        args = {"Input Dims": dims, "Input type": types,
                "Input Strides": [[] for _ in dims],
                "Concrete Inputs": concrete or ["" for _ in dims]}
    return row("cpu_op", name, ts, dur, pid=1, tid=1, args_json=json.dumps(args), **kw)


def _trace():
    mm = ([[64, 128], [128, 256]], [F32, F32])
    qkv = [[1, 2, 128, 64]] * 3
    return frame([
        _op("aten::mm", 1000, 100, *mm, flops=4_194_304),
        launch(1010, 5, 1), kernel("gemm_a", 1200, 10_000, corr=1),
        _op("aten::linear", 2000, 200, [[64, 128], [256, 128], [256]], [F32] * 3),
        _op("aten::t", 2005, 3, [[256, 128]], [F32]),
        _op("aten::addmm", 2010, 140, [[256], [64, 128], [128, 256], [], []],
            [F32, F32, F32, "Scalar", "Scalar"], ["", "", "", "1", "1"]),
        launch(2020, 5, 2), kernel("gemm_b", 12_000, 20_000, corr=2),
        _op("aten::_scaled_dot_product_flash_attention", 3000, 300, [*qkv, [], [], []],
            [BF16] * 3 + ["Scalar"] * 3, ["", "", "", "0.", "True", "False"]),
        _op("aten::_flash_attention_forward", 3010, 190, qkv, [BF16] * 3),
        launch(3020, 5, 3), kernel("flash_fwd", 40_000, 5_000, corr=3),
        _op("aten::index_select", 4000, 100, [[100, 8], [], [4]], [F32, "Scalar", "long int"]),
        launch(4010, 5, 4), kernel("index_kernel", 50_000, 1_000, corr=4),
        launch(5000, 5, 5), kernel("orphan", 60_000, 2_000, corr=5),
        _op("aten::mm", 6000, 100, *mm),
        launch(6010, 5, 6), kernel("gemm_a", 70_000, 20_000, corr=6),
    ])


def _ops(ev, **kw):
    instances, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev),
                                         modelled=lambda n: family(n) is not None)
    return ops(op_args(ev, instances), kernels, device=H100, **kw)


def test_models_by_hand() -> None:
    mm = model("aten::mm", [[64, 128], [128, 256]], [F32, F32], ["", ""])
    assert (mm.category, mm.flops, mm.bytes, mm.dtype) == ("gemm", 4_194_304, 229_376, "fp32")
    addmm = model("aten::addmm", [[256], [64, 128], [128, 256], [], []],
                  [F32, F32, F32, "Scalar", "Scalar"], [])
    assert (addmm.flops, addmm.bytes) == (4_194_304 + 64 * 256, 229_376 + 256 * 4)
    # linear: x [4, 16, 128] (M = 64) and W [256, 128]: the same product as mm, no bias
    lin = model("aten::linear", [[4, 16, 128], [256, 128], []], [F32, F32, ""], [])
    assert (lin.flops, lin.bytes) == (4_194_304, 229_376)
    bmm = model("aten::bmm", [[3, 64, 128], [3, 128, 256]], [BF16, BF16], [])
    assert (bmm.flops, bmm.bytes, bmm.dtype) == (3 * 4_194_304, 3 * 57_344 * 2, "bf16")
    mat = model("aten::matmul", [[2, 3, 64, 128], [128, 256]], [F32, F32], [])
    assert mat.flops == 6 * 4_194_304  # batch 2*3 broadcast over B
    # conv2d 3x3, stride 1, padding 1: out [8, 16, 32, 32]; 2 * 131,072 * (3*3*3) + bias
    conv = model("aten::convolution",
                 [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], [], [], []],
                 [F32] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"],
                 ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"])
    assert conv.flops == 2 * 131_072 * 27 + 131_072
    assert conv.bytes == (8 * 3 * 32 * 32 + 16 * 27 + 16 + 131_072) * 4
    # stride 2, no padding: out 15x15
    conv2 = model("aten::convolution", [[1, 3, 32, 32], [16, 3, 3, 3], []],
                  [F32, F32, ""], ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]",
                                   "1"])
    assert conv2.flops == 2 * (16 * 15 * 15) * 27
    add = model("aten::add", [[16, 1024], [1024], []], [BF16, BF16, "Scalar"], [])
    assert (add.category, add.flops, add.bytes) == (
        "elementwise", 16 * 1024, (16 * 1024 + 1024 + 16 * 1024) * 2)
    copy = model("aten::copy_", [[8, 4], [8, 4], []], [BF16, F32, "Scalar"], [])
    assert (copy.flops, copy.bytes) == (0, 32 * 4 + 32 * 2)  # reads src, writes self
    mean = model("aten::mean", [[16, 8, 1024], [], [], []], [F32, "ScalarList", "Scalar", ""],
                 ["", "[-1]", "True", ""])
    assert (mean.category, mean.flops, mean.bytes) == ("reduce", 16 * 8 * 1024,
                                                      (16 * 8 * 1024 + 16 * 8) * 4)
    soft = model("aten::_softmax", [[4, 256], [], []], [BF16, "Scalar", "Scalar"], [])
    assert (soft.flops, soft.bytes) == (3 * 1024, 2 * 1024 * 2)
    assert model("aten::index_select", [[100, 8]], [F32], []) is None
    assert model("aten::mm", [[64, 128]], [F32], []) is None  # does not fit: no model


def test_sdpa_causal_and_backward_by_hand() -> None:
    qkv = [[2, 4, 256, 64]] * 3
    full = model("aten::_scaled_dot_product_efficient_attention", [*qkv, [], [], [], []],
                 [BF16] * 3 + ["", "Scalar", "Scalar", "Scalar"],
                 ["", "", "", "", "False", "0.", "False"])
    assert full.flops == 2 * 2 * 4 * 256 * 256 * 64 * 2
    assert full.bytes == 4 * 2 * 4 * 256 * 64 * 2
    causal = model("aten::_scaled_dot_product_efficient_attention", [*qkv, [], [], [], []],
                   [BF16] * 3 + ["", "Scalar", "Scalar", "Scalar"],
                   ["", "", "", "", "False", "0.", "True"])
    assert causal.flops == full.flops // 2
    # a causal mask on L=2 queries and S=4 keys (top-left) keeps 1 + 2 of 8 scores
    assert causal_fraction(2, 4) == 3 / 8
    grad = model("aten::_scaled_dot_product_flash_attention_backward",
                 [[2, 4, 256, 64], *qkv], [BF16] * 4, [""] * 11 + ["False"])
    assert grad.flops == 2.5 * full.flops
    assert grad.bytes == 7 * 2 * 4 * 256 * 64 * 2  # q k v grad_out read; dq dk dv written


def test_kernel_time_per_op_by_hand() -> None:
    ev = _trace()
    inst, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev),
                                    modelled=lambda n: family(n) is not None)
    got = {(r["name"], r["ts_ns"]): (r["direct_ns"], r["subtree_ns"], r["kernel_ns"])
           for r in inst.iter_rows(named=True)}
    assert got == {
        ("aten::mm", 1000): (10_000, 10_000, 10_000),
        ("aten::addmm", 2010): (20_000, 20_000, 20_000),
        ("aten::_scaled_dot_product_flash_attention", 3000): (0, 5_000, 5_000),
        ("aten::index_select", 4000): (1_000, 1_000, 1_000),
        ("aten::mm", 6000): (20_000, 20_000, 20_000),
    }  # linear owns nothing (addmm inside it is modelled); the orphan kernel has no op
    assert sorted(kernels.get_column("name").to_list()) == [
        "flash_fwd", "gemm_a", "gemm_a", "gemm_b", "index_kernel"]
    # without models every kernel belongs to the op that launched it
    plain, _ = op_kernel_times(prepared_gpu(ev), host_events(ev))
    assert ("aten::_flash_attention_forward", 5_000) in plain.select("name", "kernel_ns").rows()


def test_ops_rates_and_roofline_by_hand() -> None:
    res = _ops(_trace())
    df = res["ops"]
    assert df.get_column("name").to_list()[0] == "aten::mm"  # most time first: 30 us
    mm = df.row(0, named=True)
    assert (mm["count"], mm["kernel_time_ns"], mm["direct_kernel_time_ns"]) == (2, 30_000,
                                                                                30_000)
    assert (mm["flops"], mm["bytes"]) == (4_194_304, 229_376)
    assert mm["input_dims"] == "[[64,128],[128,256]]" and mm["dtypes"] == [F32, F32]
    assert mm["tflops_per_s"] == pytest.approx((0.4194304 + 0.2097152) / 2)
    assert mm["tflops_per_s_max"] == pytest.approx(0.4194304)
    assert mm["tflops_per_s_min"] == pytest.approx(0.2097152)
    assert mm["tb_per_s_max"] == pytest.approx(0.0229376)
    assert mm["intensity"] == pytest.approx(4_194_304 / 229_376)
    assert mm["bound"] == "memory"
    roof = 229_376 / 3.35e3
    assert mm["roofline_time_ns"] == round(2 * roof)
    assert mm["roofline_fraction"] == pytest.approx(2 * roof / 30_000)
    assert mm["time_left_ns"] == round(30_000 - 2 * roof)
    # the recorded args.flops (one instance) agree with the model's; the model's are used
    assert (mm["flops_source"], mm["trace_flops"]) == ("model", 4_194_304)
    assert mm["kernels"] == ["gemm_a"]
    addmm = df.filter(pl.col("name") == "aten::addmm").row(0, named=True)
    assert (addmm["flops"], addmm["bytes"], addmm["kernels"]) == (4_210_688, 230_400,
                                                                  ["gemm_b"])
    fa = df.filter(pl.col("category") == "sdpa").row(0, named=True)
    assert (fa["flops"], fa["bytes"], fa["direct_kernel_time_ns"]) == (4_194_304, 131_072, 0)
    assert fa["tflops_per_s"] == pytest.approx(4_194_304 / 5_000 / 1e3)
    assert (fa["intensity"], fa["bound"]) == (32.0, "memory")
    assert fa["roofline_fraction"] == pytest.approx(131_072 / 3.35e3 / 5_000)
    idx = df.filter(pl.col("name") == "aten::index_select").row(0, named=True)
    assert (idx["category"], idx["flops"], idx["bound"], idx["kernel_time_ns"]) == (
        None, None, None, 1_000)
    assert df.get_column("kernel_time_ns").sum() == 56_000  # every owned kernel once
    assert res["peaks"]["tflops"] == {"bf16": 989.5, "fp32": 67.0}
    assert res["peaks"]["tb_per_s"] == 3.35 and res["warnings"] == []


def test_by_name_and_category() -> None:
    by_name = _ops(_trace(), by="name")["ops"]
    assert by_name.height == 4 and by_name.get_column("input_dims").is_null().all()
    gemm = _ops(_trace(), category="gemm")["ops"]
    assert sorted(gemm.get_column("name").to_list()) == ["aten::addmm", "aten::mm"]


def test_unknown_device_rates_without_bound() -> None:
    ev = _trace()
    inst, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev),
                                    modelled=lambda n: family(n) is not None)
    res = ops(op_args(ev, inst), kernels, device="Some Accelerator 9000")
    mm = res["ops"].row(0, named=True)
    assert mm["tflops_per_s_max"] == pytest.approx(0.4194304)
    assert mm["bound"] is None and mm["roofline_fraction"] is None
    assert "not in the peak table" in res["warnings"][0]


def test_run_ops_json_contract() -> None:
    ranks = pl.DataFrame({"rank": [0], "file_id": [0], "source": ["memory"],
                          "devices": [json.dumps([H100])]},
                         schema_overrides={"rank": pl.Int32, "file_id": pl.Int32})
    res = Run.from_events(_trace(), ranks_table=ranks).ops()
    doc = res.to_dict()
    for key in ("ops", "device", "peaks", "warnings"):
        assert key in doc
    first = doc["ops"][0]
    for key in ("name", "category", "input_dims", "dtypes", "count", "kernel_time_ns",
                "direct_kernel_time_ns", "flops", "bytes", "tflops_per_s", "tb_per_s",
                "intensity", "bound", "roofline_fraction", "kernels"):
        assert key in first
    assert doc["device"] == H100 and first["kernel_time_ns"] == 30_000
    assert "gemm_a" in res.to_csv()


def test_unique_short_names_keep_distinct_kernels_apart() -> None:
    names = [
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
        "at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
        f"at::native::binary_internal::{op}Functor<float> > >(at::TensorIteratorBase&)"
        "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::"
        "BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::"
        f"binary_internal::{op}Functor<float> > >(at::TensorIteratorBase&)::{{lambda(int)#1}})"
        for op in ("Mul", "Div", "Add")]
    assert len({short_name(n, 60) for n in names}) == 1  # the plain rule collapses them
    labels = unique_short_names(names, width=60)
    assert len(set(labels.values())) == 3
    assert [op in labels[n] for op, n in zip(("Mul", "Div", "Add"), names)] == [True] * 3
    assert unique_short_names(["aten::mm", "aten::mm"]) == {"aten::mm": "aten::mm"}


def test_roofline_finding_by_hand() -> None:
    """Four op shapes over 2 steps on 1 GPU rank; time left 6, 4, 2 and 1 ms: the top three
    leave (6 + 4 + 2) / 2 = 6 ms per step; capped at the path's compute (5 ms per step)."""
    from traceview.analyses.roofline_finding import roofline_finding

    df = pl.DataFrame({"name": ["a", "b", "c", "d"], "input_dims": ["[[1]]"] * 4,
                       "bound": ["compute", "memory", "memory", "memory"],
                       "roofline_fraction": [0.4, 0.2, 0.5, 0.9],
                       "time_left_ns": [6_000_000, 4_000_000, 2_000_000, 1_000_000]})
    f = roofline_finding(df, n_steps=2, gpu_ranks=1, path_compute_ns_per_step=None)
    assert (f["id"], f["name"], f["gain_ns_per_step"]) == ("roofline", "a", 6_000_000)
    assert [e["value"] for e in f["evidence"][:3]] == [3e6, 2e6, 1e6]
    capped = roofline_finding(df, n_steps=2, gpu_ranks=1, path_compute_ns_per_step=5_000_000)
    assert capped["gain_ns_per_step"] == 5_000_000
    assert roofline_finding(df.with_columns(time_left_ns=pl.lit(None, pl.Int64)), n_steps=2,
                            gpu_ranks=1, path_compute_ns_per_step=None) is None


def test_causal_fraction_in_closed_form() -> None:
    """Sum over rows i < L of min(i + 1, S) over L x S, as the row-by-row count says, for
    any L != S (a square mask counts 1/2, as TraceLens does); a long sequence
    costs no loop over its rows."""
    import time

    for l, s in [(2, 4), (4, 2), (5, 3), (3, 7), (128, 64), (64, 4096)]:  # noqa: E741
        assert causal_fraction(l, s) == sum(min(i + 1, s) for i in range(l)) / (l * s)
    start = time.perf_counter()
    for _ in range(20):
        causal_fraction(900_000, 1_000_000)  # a loop over its rows took ~0.1 s each
    assert time.perf_counter() - start < 0.05
    assert causal_fraction(10**12, 10**12 + 1) == pytest.approx(0.5)


def test_shapes_out_of_bounds_are_not_modelled_with_a_warning() -> None:
    """A product of 2^40 x 2^40 matrices (FLOPs beyond int64) and a negative dimension: no
    error and no negative FLOPs; those shapes are not modelled, and a warning says so."""
    huge = [[1 << 40, 1 << 40], [1 << 40, 1 << 40]]
    assert model("aten::mm", huge, [F32, F32], ["", ""]) is None
    assert model("aten::mm", [[-64, 128], [128, 256]], [F32, F32], ["", ""]) is None
    ev = frame([
        _op("aten::mm", 1000, 100, huge, [F32, F32]),
        launch(1010, 5, 1), kernel("gemm_a", 1200, 10_000, corr=1),
        _op("aten::bmm", 2000, 100, [[4, -64, 128], [4, 128, 256]], [F32, F32]),
        launch(2010, 5, 2), kernel("gemm_b", 12_000, 10_000, corr=2),
        _op("aten::mm", 3000, 100, [[64, 128], [128, 256]], [F32, F32],
            flops=(1 << 63) - 1),
        launch(3010, 5, 3), kernel("gemm_c", 30_000, 10_000, corr=3),
        _op("aten::mm", 4000, 100, [[64, 128], [128, 256]], [F32, F32],
            flops=(1 << 63) - 1),
        launch(4010, 5, 4), kernel("gemm_c", 40_000, 10_000, corr=4)])
    res = Run.from_events(ev).ops()
    table = res["ops"]
    assert table.filter(pl.col("name") != "aten::mm").get_column("flops").null_count() == 1
    assert (table.get_column("flops").drop_nulls() >= 0).all()
    assert (table.get_column("tflops_per_s_total").drop_nulls() >= 0).all()
    assert any("FLOPs or bytes beyond 2^62 not modelled" in w for w in res.warnings)
    assert any("a negative dimension not modelled" in w for w in res.warnings)


def test_csv_cells_a_spreadsheet_would_run_start_with_a_quote() -> None:
    """A kernel named ``=HYPERLINK(...)`` (or starting with + - @ tab CR) is written to CSV
    with a leading ``'`` (OWASP): a spreadsheet shows it as text; numbers stay numbers."""
    ev = frame([_op("aten::mm", 1000, 100, [[64, 128], [128, 256]], [F32, F32]),
                launch(1010, 5, 1),
                kernel('=HYPERLINK("http://evil","x")', 1200, 10_000, corr=1),
                _op("@SUM(1)", 2000, 100, [[4, 4], [4, 4]], [F32, F32]),
                _op("aten::mm", 3000, 100, [[64, 128], [128, 256]], [F32, F32]),
                launch(3010, 5, 2), kernel("-2+3", 3200, 10_000, corr=2)])
    text = Run.from_events(ev).ops().to_csv()
    import csv
    import io

    cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
    assert [c for c in cells if "HYPERLINK" in c][0].startswith("'")
    assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r")]
    assert not [c for c in cells if c[:1] == "-" and not c.lstrip("-").replace(".", "")
                .replace("e", "").isdigit()]
