"""The op models' FLOPs against the counts PyTorch's profiler records (``with_flops=True``,
the numbers it writes to Kineto's ``args.flops``) and against a real H100 trace of the
corpus.

PyTorch counts ``2·M·N·K`` for aten::mm, bmm and addmm, ``2·numel(out)·Cin/g·prod(k)`` for a
convolution and one per output element for add and mul. The models agree, except aten::addmm,
which also counts the bias add (one FLOP per output element, as TraceLens does):
docs/metrics.md, "Operators against the roofline".
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from conftest import CORPUS, needs_torch
from fixtures.corpus import absent
from traceview.analyses.op_models import model

QWEN = CORPUS / "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@needs_torch
def test_models_agree_with_pytorch_recorded_flops() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b, bias = torch.randn(64, 128), torch.randn(128, 256), torch.randn(256)
    x, y = torch.randn(3, 32, 16), torch.randn(3, 16, 8)
    img, w = torch.randn(2, 3, 16, 16), torch.randn(4, 3, 3, 3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as p:
        torch.mm(a, b)
        torch.addmm(bias, a, b)
        torch.bmm(x, y)
        torch.nn.functional.conv2d(img, w, stride=2, padding=1)
        torch.add(a, a)
        torch.mul(a, a)
    seen = {}
    for e in p.events():
        if not e.flops:
            continue
        shapes = [list(s) for s in e.input_shapes]
        types = ["float" if s else "" for s in shapes]  # every tensor here is float32
        concrete = [str(c) if c is not None and c != "" else "" for c in
                    (e.concrete_inputs or [""] * len(shapes))]
        name = "aten::convolution" if e.name == "aten::conv2d" else e.name
        if e.name == "aten::conv2d":  # conv2d(input, weight, bias, stride, padding,
            # dilation, groups) in convolution's argument order
            shapes = [*shapes[:6], [], [], []]
            types = [*types[:6], "", "", ""]
            concrete = [*concrete[:6], "False", "[0, 0]", concrete[6]]
        m = model(name, shapes, types, concrete)
        seen[e.name] = (e.flops, m.flops if m else None)
    assert seen["aten::mm"] == (4_194_304, 4_194_304)
    assert seen["aten::bmm"] == (2 * 3 * 32 * 16 * 8,) * 2
    assert seen["aten::addmm"] == (4_194_304, 4_194_304 + 64 * 256)  # + the bias add
    assert seen["aten::add"] == seen["aten::mul"] == (64 * 128, 64 * 128)
    if "aten::conv2d" in seen:  # out [2, 4, 8, 8]: 2 * 512 * 27
        assert seen["aten::conv2d"] == (2 * 512 * 27, 2 * 512 * 27)


def _cpu_ops(path) -> list[dict]:
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]


def test_corpus_gemm_flops_against_recorded_and_nesting() -> None:
    """Qwen1.5-0.5B on an H100 (bf16): every GEMM op has a model; where the trace records
    ``args.flops`` the models must agree (this trace was profiled with ``with_flops=1`` but
    carries none, so the check is the nesting: each aten::linear's FLOPs equal those of the
    aten::addmm / aten::mm it runs, and each matmul's those of its mm / bmm)."""
    if not QWEN.is_file():
        pytest.skip(absent(QWEN))
    ops = _cpu_ops(QWEN)
    gemm = [e for e in ops if e["name"] in ("aten::mm", "aten::addmm", "aten::bmm",
                                            "aten::linear", "aten::matmul")]
    assert len(gemm) == 434
    flops = {}
    for e in gemm:
        a = e["args"]
        m = model(e["name"], a["Input Dims"], a["Input type"], a.get("Concrete Inputs"))
        assert m is not None and m.category == "gemm", e["name"]
        if "flops" in a:
            assert m.flops == a["flops"] or e["name"] == "aten::addmm"
        flops[(e["tid"], e["ts"], e["name"])] = (e["ts"] + e["dur"], m.flops)
    outer = sorted(k for k in flops if k[2] in ("aten::linear", "aten::matmul"))
    inner = sorted(k for k in flops if k[2] in ("aten::mm", "aten::addmm", "aten::bmm"))
    matched = 0
    for tid, ts, name in outer:
        end, f = flops[(tid, ts, name)]
        kids = [k for k in inner if k[0] == tid and ts <= k[1] < end]
        if len(kids) == 1:
            assert f == flops[kids[0]][1], (name, kids[0][2])  # a bias counts on both
            matched += 1
    assert matched == 168 + 97  # every linear and every matmul has exactly one GEMM inside


def test_corpus_ops_table(tmp_path) -> None:
    """``run.ops()`` on the same trace: its large GEMMs (the bf16 projections, over a GFLOP
    each) run at hundreds of TFLOP/s, under the 989.5 TFLOP/s bf16 peak; every owned kernel
    is counted once."""
    if not QWEN.is_file():
        pytest.skip(absent(QWEN))
    import traceview

    run = traceview.open(QWEN, cache_dir=tmp_path)
    df = run.ops().to_polars()
    gemm = df.filter(pl.col("category") == "gemm")
    assert gemm.height and (gemm["tflops_per_s_max"] < 989.5).all()
    large = gemm.filter(pl.col("flops") > 1e9)
    assert large.height == 4 and (large["tflops_per_s_total"] > 500).all()
    assert (large["bound"] == "compute").all() and (large["roofline_fraction"] < 1).all()
    assert df["kernel_time_ns"].sum() <= run.gpu["dur_ns"].sum()
    fa = df.filter(pl.col("category") == "sdpa").row(0, named=True)
    # q [16,16,559,64] bf16, causal: (2*16*16*559*559*64) * 2 / 2
    assert fa["flops"] == 2 * 16 * 16 * 559 * 559 * 64
