"""``--graph-capture`` on real traces: vLLM and SGLang decode steps replayed from HIP graphs,
with the traces of their capture (AMD-AGI/TraceLens test data, MIT). The truth is TraceLens's
own answer for the same pairs (its ``perf_csvs``, which merge the capture into the replay):
per op name, its instances and direct GPU time (``ops_summary.csv``), and per GEMM shape,
its instances, FLOPs and mean TFLOP/s (``GEMM.csv``). Deliberate differences: TraceLens
charges a kernel launched outside every op to its launch call (``hipLaunchKernel``), we to
no op; and it drops the line-number suffix SGLang's profiler adds to its ranges
(``sglang_profiler::..._100``).

The vLLM full-graph pair is committed (fixtures/data/graph_capture_real, README there); the
others are read from the corpus folder in the source's layout and skip when absent."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

import traceview
from fixtures.corpus import absent, corpus_dir

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "graph_capture_real"
INFERENCE = "tracelens/tests/traces/inference"

#: per case: TraceLens's op name -> (instances, direct GPU µs); its GEMM rows: (name, input
#: dims, instances, FLOPs per instance, mean TFLOP/s)
GOLDEN = {
    "vllm_decode_full": (
        {"vllm::moe_forward": (24, 7171.532),
         "aten::addmm": (72, 953.878),
         "vllm::unified_attention_with_output": (24, 724.361),
         "SortTokens": (24, 375.118),
         "aiter::rmsnorm2d_fwd_with_add_ck": (48, 326.038),
         "triton_poi_fused__to_copy_1": (23, 292.374),
         "aten::mm": (1, 276.678),
         "_C::rotary_embedding": (24, 149.738),
         "_C_cache_ops::reshape_and_cache_flash": (24, 136.41),
         "triton_poi_fused_constant_pad_nd_moe_forward_0": (24, 122.61),
         "TopK": (24, 119.814),
         "aten::copy_": (10, 45.149),
         "triton_poi_fused_0": (1, 10.598),
         "aiter::rms_norm": (1, 5.999),
         "aten::sub": (1, 4.439),
         "aten::index": (1, 2.959)},
        [("aten::addmm", [[5120], [32, 2880], [2880, 5120], [], []], 24, 943882240, 58.6288),
         ("aten::addmm", [[2880], [32, 4096], [4096, 2880], [], []], 24, 755066880, 49.6273),
         ("aten::mm", [[32, 2880], [2880, 201088]], 1, 37064540160, 133.9629),
         ("aten::addmm", [[32], [32, 2880], [2880, 32], [], []], 24, 5899264, 0.7093)]),
    "vllm_prefilldecode_piecewise": (
        {"vllm::moe_forward": (24, 124885.786),
         "aten::addmm": (72, 17301.817),
         "vllm::unified_attention_with_output": (24, 5146.907),
         "aiter::rmsnorm2d_fwd_with_add_ck": (48, 3367.738),
         "_C::rotary_embedding": (24, 1706.329),
         "triton_poi_fused_constant_pad_nd_moe_forward_0": (24, 1566.326),
         "_C_cache_ops::reshape_and_cache_flash": (24, 586.371),
         "triton_poi_fused__to_copy_1": (23, 435.696),
         "SortTokens": (24, 431.372),
         "aten::mm": (1, 346.637),
         "TopK": (24, 141.577),
         "aten::copy_": (11, 79.196),
         "triton_poi_fused_0": (1, 43.439),
         "aiter::rms_norm": (1, 39.679),
         "aten::index": (1, 3.639),
         "aten::sub": (1, 3.399)},
        [("aten::addmm", [[5120], [8192, 2880], [2880, 5120], [], []], 24, 241633853440, 633.7685),
         ("aten::addmm", [[2880], [8192, 4096], [4096, 2880], [], []], 24, 193297121280, 614.0529),
         ("aten::addmm", [[32], [8192, 2880], [2880, 32], [], []], 24, 1510211584, 61.351),
         ("aten::mm", [[46, 2880], [2880, 201088]], 1, 53280276480, 153.7064)]),
    "sglang_decode": (
        {"aten::mm": (145, 5782.254),
         "sglang_profiler::attention_paged_attention_ragged": (36, 2127.863),
         "aten::copy_": (78, 378.609),
         "aiter::add_rmsnorm": (72, 346.842),
         "aiter::rmsnorm": (73, 337.122),
         "sgl_kernel::silu_and_mul": (36, 324.367),
         "sgl_kernel::rotary_embedding": (36, 195.815),
         "sglang::store_cache": (36, 173.543),
         "aten::argmax": (1, 53.84),
         "aten::gather": (1, 13.499),
         "aten::_foreach_copy_": (2, 12.097),
         "aten::neg": (1, 5.688),
         "aten::cumsum": (1, 5.247),
         "aten::arange": (1, 4.246)},
        [("aten::mm", [[32, 4096], [4096, 24576]], 36, 6442450944, 96.024),
         ("aten::mm", [[32, 12288], [12288, 4096]], 36, 3221225472, 79.7425),
         ("aten::mm", [[32, 4096], [4096, 6144]], 36, 1610612736, 73.0287),
         ("aten::mm", [[32, 4096], [4096, 4096]], 36, 1073741824, 64.435),
         ("aten::mm", [[32, 4096], [4096, 151936]], 1, 39829110784, 100.3677)]),
}

#: the corpus pairs: case -> (replay, capture), paths under ``INFERENCE``
CORPUS = {
    "vllm_prefilldecode_piecewise": (
        "vllm_prefilldecode_piecewise/graph_execution.json.gz",
        "vllm_prefilldecode_piecewise/capture_traces/"
        "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"),
    "sglang_decode": ("sglang_decode/sglang_Qwen3-8B_decode.json.gz",
                      "sglang_decode/capture_traces/bs_32_rank0.json.gz"),
}
XDIT = ("xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz",
        "xdit_flux.1_aiter_sage/capture_traces/capture_trace_rank_0.json.gz")


def _corpus_pair(replay: str, capture: str) -> tuple[Path, Path]:
    paths = (corpus_dir() / INFERENCE / replay, corpus_dir() / INFERENCE / capture)
    for path in paths:
        if not path.is_file():
            pytest.skip(absent(path))
    return paths


def _check_against_tracelens(run, case: str) -> None:
    ops_golden, gemm_golden = GOLDEN[case]
    by_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in run.ops(by="name")["ops"].iter_rows(named=True):
        name = re.sub(r"^(sglang_profiler::.*)_\d+$", r"\1", r["name"])
        by_name[name][0] += r["count"]
        by_name[name][1] += r["direct_kernel_time_ns"]
    for name, (count, direct_us) in ops_golden.items():
        assert by_name[name][0] == count, name
        # TraceLens sums microseconds as floats: within 0.05%
        assert by_name[name][1] / 1e3 == pytest.approx(direct_us, rel=5e-4), name
    shapes = run.ops(by="shape")["ops"].filter(pl.col("category") == "gemm")
    for name, dims, count, flops, tflops in gemm_golden:
        rows = shapes.filter((pl.col("name") == name) & (pl.col("input_dims") == json.dumps(
            dims, separators=(",", ":"))))
        assert rows.get_column("count").sum() == count, (name, dims)
        assert set(rows.get_column("flops").to_list()) == {flops}, (name, dims)
        mean = (rows.get_column("tflops_per_s") * rows.get_column("count")).sum() / count
        assert mean == pytest.approx(tflops, rel=1e-3), (name, dims)


def test_vllm_full_graph_against_tracelens() -> None:
    run = traceview.open(HERE / "vllm_decode_full_replay.json.gz",
                         graph_capture=HERE / "vllm_decode_full_capture_cut.json.gz")
    _check_against_tracelens(run, "vllm_decode_full")
    # the one hipGraphLaunch's 421 events all charged, 10.388 ms: nothing left unattributed
    _, kernels = run.op_instances
    replayed = kernels.filter(pl.col("graph_replayed"))
    assert replayed.height == 421 and replayed["op_idx"].null_count() == 0
    assert replayed["dur_ns"].sum() == pytest.approx(10_388_000, abs=1_000)
    assert not [w for w in run.ops().warnings if "graph" in w]


def test_vllm_full_graph_without_its_capture() -> None:
    run = traceview.open(HERE / "vllm_decode_full_replay.json.gz")
    names = set(run.ops(by="name")["ops"].get_column("name").to_list())
    assert names == {"aten::mm", "aten::copy_", "aten::sub", "aten::index"}
    assert any("421 GPU events (10.388 ms) were replayed" in w for w in run.ops().warnings)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_corpus_pairs_against_tracelens(case: str) -> None:
    replay, capture = _corpus_pair(*CORPUS[case])
    run = traceview.open(replay, graph_capture=capture)
    _check_against_tracelens(run, case)
    assert not [w for w in run.ops().warnings if "graph" in w]


def test_xdit_capture_one_launch_longer_than_its_replays() -> None:
    # Flux (xDiT, aiter SageAttention): four replays of one graph, 1,566 events each; the
    # capture holds 1,567 launches (a GEMM the replays never ran last): matched in order
    replay, capture = _corpus_pair(*XDIT)
    run = traceview.open(replay, graph_capture=capture)
    _, kernels = run.op_instances
    replayed = kernels.filter(pl.col("graph_replayed"))
    assert replayed.height == 4 * 1566 and replayed["op_idx"].null_count() == 0
    assert not [w for w in run.ops().warnings if "graph" in w]
