"""``summary``, ``ops`` and ``diagnose`` on real GPU traces the analyses were not written
around (fixtures/data/gpu_beyond, README there): AMD MI300X and MI210 runs whose kernel names
(Tensile ``Cijk_*`` GEMMs, AOTriton ``attn_fwd``, MIOpen ``igemm_*`` convolutions and
``SubTensorOp*`` casts) the families and the advice did not know; and, where present in the
corpus folder, an xDiT diffusion step, an SGLang serving trace and DeepSeek-V3's MoE training
rank. The truth (what each trace's kernels are) is written here, from the kernel names."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import traceview
from fixtures.corpus import absent, corpus_dir

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gpu_beyond"
INFERENCE = "tracelens/tests/traces/inference"


def _corpus(relative: str) -> Path:
    path = corpus_dir() / relative
    if not path.is_file():
        pytest.skip(absent(path))
    return path


def _kernel_findings(res) -> dict[str, dict]:
    found = res["findings"].filter(pl.col("id") == "kernels")
    return {r["name"]: r for r in found.iter_rows(named=True)}


def _evidence(finding: dict, metric: str) -> dict:
    return next(e for e in finding["evidence"] if e["metric"] == metric)


def _no_contradiction(res) -> None:
    """No finding tells the run to do what its kernels already do."""
    for text in res["findings"].get_column("recommendation").drop_nulls().to_list():
        assert not text.startswith("Use fused attention"), text
        assert "autocast" not in text and "TF32" not in text, text


def test_torch_compile_block_on_mi300x() -> None:
    run = traceview.open(HERE / "torch_compile_triton_mi300x.json.gz")
    ops = {r["name"]: r for r in run.ops(by="name")["ops"].iter_rows(named=True)}
    # the kernels each op launched: 7 Tensile bf16 GEMMs, AOTriton's flash attention
    assert ops["aten::mm"]["count"] == 7
    assert all(k.startswith("Cijk_Alik_Bljk_BBS_") for k in ops["aten::mm"]["kernels"])
    assert ops["aten::_scaled_dot_product_flash_attention"]["kernels"] == ["attn_fwd"]
    res = run.diagnose()
    families = _kernel_findings(res)
    # Cijk_* are matrix multiplies in bf16 (they were "other" kernels, to profile with ncu)
    assert _evidence(families["gemm"], "top_kernel_ns_per_step")["text"].startswith("Cijk_")
    assert families["gemm"]["recommendation"].startswith("Matrix multiplies already run in bf16")
    assert "other" not in families
    # attn_fwd is PyTorch's flash backend on ROCm: fused, no "use fused attention"
    assert families["attention"]["recommendation"].startswith(
        "Attention already runs fused kernels (FlashAttention)")
    assert _evidence(families["attention"], "fused_attention_share")["value"] == 1.0
    _no_contradiction(res)
    assert run.summary()["ranks"].row(0, named=True)["comm_ns"] == 0


def test_mi210_training_step_without_host_ops() -> None:
    run = traceview.open(HERE / "mi210_gpu_only.json.gz")
    names = run.gpu.get_column("name").cast(pl.String)
    assert run.gpu.height == 562
    assert names.str.contains("^igemm_(fwd|bwd|wrw)_gtcx2").sum() == 59
    assert names.str.contains("^SubTensorOp").sum() == 109
    assert names.str.contains("^Cijk_").sum() == 3
    families = _kernel_findings(run.diagnose())
    # MIOpen's implicit-GEMM kernels are convolutions (they read as matrix multiplies), its
    # SubTensorOp casts elementwise (they read as matrix multiplies through "tensorop")
    conv = families["convolution"]
    assert _evidence(conv, "top_kernel_ns_per_step")["text"].startswith("igemm_")
    assert conv["recommendation"].startswith("Convolutions, already in bf16")
    gemm = families.get("gemm")
    assert gemm is None or _evidence(gemm, "top_kernel_ns_per_step")["text"].startswith("Cijk_")
    top_elementwise = _evidence(families["elementwise"], "top_kernel_ns_per_step")["text"]
    assert "SubTensorOp" in top_elementwise or "elementwise" in top_elementwise


def test_xdit_stable_diffusion_step() -> None:
    run = traceview.open(_corpus(f"{INFERENCE}/xdit_sd_3.5/profile_trace_rank_0.json.gz"))
    res = run.diagnose()
    families = _kernel_findings(res)
    assert _evidence(families["gemm"], "top_kernel_ns_per_step")["text"].startswith("Cijk_")
    assert families["attention"]["recommendation"].startswith("Attention already runs fused")
    _no_contradiction(res)


def test_sglang_prefill_decode() -> None:
    run = traceview.open(_corpus(
        f"{INFERENCE}/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"))
    ops = {r["name"]: r for r in run.ops(by="name")["ops"].iter_rows(named=True)}
    # the dense GEMMs (Tensile, bf16) are aten::mm's; attention is SGLang's paged kernel
    assert all(k.startswith("Cijk_") for k in ops["aten::mm"]["kernels"])
    res = run.diagnose()
    _no_contradiction(res)
    assert not any("per step" in t for t in res["findings"].get_column("title").to_list())


def test_deepseek_moe_training_rank() -> None:
    # rank 0 of 64, DeepEP's dispatch/combine (dpsk::ep::), FP8 GEMMs, FlashAttention-3
    run = traceview.open(_corpus("deepseek-profile-data/train.json"))
    rank = run.summary()["ranks"].row(0, named=True)
    assert rank["comm_ns"] > 0.8 * rank["compute_ns"]  # 113 ms a step against 124
    res = run.diagnose()
    _no_contradiction(res)
    comm = res["findings"].filter(pl.col("id") == "exposed_communication").row(0, named=True)
    assert comm["recommendation"].startswith("Overlap the expert-parallel all-to-all")
    assert _evidence(comm, "exposed_comm_kind_share")["text"] == "all_to_all"
    families = _kernel_findings(res)
    assert "FlashAttention-3" in families["attention"]["recommendation"]


def _dlrm(tmp_path: Path) -> Path:
    """facebookresearch/param's 8-rank DLRM profile (``et_replay/tests/inputs/
    dlrm_kineto.tar.gz``, MIT, the corpus' ``param`` source), unpacked."""
    import tarfile

    packed = _corpus("param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    with tarfile.open(packed) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "dlrm_kineto"


def test_dlrm_eight_ranks(tmp_path) -> None:
    # 8 V100 ranks, NCCL 2.x: embedding all-to-all (c10d::alltoall_base_, whose kernels are
    # ncclKernel_SendRecv), gradient all-reduce (ncclKernel_AllReduce)
    run = traceview.open(_dlrm(tmp_path))
    ranks = run.summary()["ranks"]
    assert ranks.height == 8
    assert (ranks.get_column("comm_ns") > 0).all()  # every rank communicates
    names = run.gpu.get_column("name").cast(pl.String)
    assert names.str.contains("^ncclKernel_SendRecv").sum() > 0
    assert names.str.contains("^ncclKernel_AllReduce").sum() > 0
    res = run.diagnose()
    _no_contradiction(res)


def test_dlrm_all_to_all_is_matched(tmp_path) -> None:
    # its embedding all-to-all runs as NCCL SendRecv kernels under c10d::alltoall_base_: an
    # all-to-all (it was matched as send_recv, and alltoall found none), 8 ranks each
    run = traceview.open(_dlrm(tmp_path))
    matched = run.collectives()["instances"]
    a2a = matched.filter(pl.col("name") == "all_to_all")
    assert a2a.height > 0 and set(a2a.get_column("n_ranks")) == {8}
    assert "send_recv" not in matched.get_column("name").to_list()
    assert run.alltoall()["exchanges"].height == a2a.height == 5
