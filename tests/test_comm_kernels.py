"""Communication kernels wherever they hide (analyses/comm_kernels.py): the table's names are
communication by default, its lookalikes are not, and a multi-rank job without any says so
in summary and diagnose with the likely names for --comm-pattern. Hand-written Kineto files
read by the real parser; times derived by hand."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.analyses.classify import DEFAULT_PATTERNS, with_comm_patterns
from traceview.analyses.comm_kernels import COMM_KERNELS, DEFAULT_COMM_PATTERN
from traceview.cli import main

COMM = [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)",
    "void deep_ep::intranode::cached_notify_dispatch<8>(int const*, int)",
    "void deep_ep::internode::cached_notify<8, 32>(int, int)",
    "void deep_ep::internode_ll::combine<true, 7168>(void*, void const*)",
    "void dpsk::ep::intranode::dispatch<8, 768, 6144>(int4*, float*)",
    "nvshmemi_proxy_quiet_kernel",
    "void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, int)",
    "void tensorrt_llm::kernels::twoShotAllReduceKernel<__nv_bfloat16, 8>(params)",
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<8>(x)",
    "void mscclpp::executionKernel<__nv_bfloat16>(int, int)",
]
COMPUTE = [
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)",  # local
    "void moe_dispatch_kernel<float>(float*)", "combine_attn_seqk_parallel<float>",
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128",
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>(Flash_fwd_params)",
]


def test_the_table_names_communication_and_nothing_else() -> None:
    names = pl.Series(COMM + COMPUTE)
    got = names.str.contains(DEFAULT_PATTERNS.comm).to_list()
    assert got == [True] * len(COMM) + [False] * len(COMPUTE)
    for row in COMM_KERNELS:  # every row's example is its own, with a source
        assert pl.Series([row.example]).str.contains(row.pattern)[0], row.library
        assert row.source
    assert DEFAULT_PATTERNS.comm == DEFAULT_COMM_PATTERN


def test_comm_pattern_still_extends_the_table() -> None:
    extended = with_comm_patterns(["^my_allgather_"]).comm
    names = pl.Series(["my_allgather_kernel", COMM[5], "my_gemm"])
    assert names.str.contains(extended).to_list() == [True, True, False]


def _x(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}


def _moe_rank(path: Path, comm_name: str, *, world: int = 64) -> Path:
    """One step [0,100) µs of rank 0 of a ``world``-rank job: a GEMM [10,40) and a
    communication kernel ``comm_name`` [30,80) on another stream. compute 30, comm 50,
    overlap [30,40) = 10, exposed 40."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 100, 1, 1),
          _x("cudaLaunchKernel", "cuda_runtime", 2, 1, 1, 1, correlation=1),
          _x("cudaLaunchKernel", "cuda_runtime", 4, 1, 1, 1, correlation=2),
          _x("sm90_xmma_gemm_e4m3bf16", "kernel", 10, 30, 0, 7, device=0, stream=7,
             correlation=1),
          _x(comm_name, "kernel", 30, 50, 0, 9, device=0, stream=9, correlation=2)]
    doc = {"schemaVersion": 1, "traceEvents": ev,
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world}}
    path.write_text(json.dumps(doc))
    return path


def test_deepep_kernels_count_as_communication_by_default(tmp_path: Path) -> None:
    path = _moe_rank(tmp_path / "rank0.json", "void dpsk::ep::internode::combine<true>(int*)")
    r = traceview.open(path, cache=False).summary()["ranks"].row(0, named=True)
    assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"], r["exposed_comm_ns"]) == (
        30_000, 50_000, 10_000, 40_000)


@pytest.mark.parametrize("command", ["summary", "diagnose"])
def test_a_multi_rank_job_without_comm_kernels_says_so(tmp_path: Path, command: str,
                                                       capsys) -> None:
    hidden = "void myep::all_to_all_dispatch<8>(int*)"
    path = _moe_rank(tmp_path / "rank0.json", hidden)
    assert main([command, str(path), "--no-cache"]) == 0
    err = capsys.readouterr().err
    assert "world size 64 shows no communication kernels" in err
    assert "--comm-pattern 'myep::all_to_all_dispatch'" in err
    # following the hint: the kernel is communication
    assert main(["summary", str(path), "--no-cache", "--json",
                 "--comm-pattern", "myep::all_to_all_dispatch"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ranks"][0]["comm_ns"] == 50_000
    assert "shows no communication kernels" not in out.err


def test_a_single_rank_job_without_comm_kernels_is_not_warned(tmp_path: Path) -> None:
    path = _moe_rank(tmp_path / "rank0.json", "void myep::all_to_all_dispatch<8>(int*)",
                     world=1)
    res = traceview.open(path, cache=False).summary()
    assert not any("no communication kernels" in w for w in res.warnings)
