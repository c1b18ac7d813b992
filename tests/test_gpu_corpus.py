"""Robustness on real traces of the shared corpus (tests/conftest.py CORPUS): every GPU analysis gives a result, or a
partial result with a stated reason, never an exception. Skipped when the corpus is absent."""

from __future__ import annotations


import polars as pl
import pytest

import traceview
from traceview.analyses.breakdown import launch_delays
from traceview.analyses.overlap import NOTE_NO_GPU, NOTE_NO_STEPS

from tests.conftest import CORPUS, absent

H = "hta-tests-data/tests/data/"

CASES = {
    "amd_mi250": H + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "two_ranks_nccl": H + "trace_filter",
    "capitalised_2021": H + "trace_file_list/inference_rank_1.json.gz",
    "triton": H + "triton_example/triton_example.json.gz",
    "gpu_user_annotation": H + "with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "rank_non_gpu": H + "rank_non_gpu/rank_non_gpu.json.gz",
    "cpu_only": H + "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "no_kernels_cupti": H + "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "legacy_autograd_no_steps":
        "kineto/tb_plugin/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz",
    "nsys_sqlite": "pipit-nsys-sqlite/pipit/tests/data/cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite",
}
CPU_ONLY = {"rank_non_gpu", "cpu_only", "no_kernels_cupti"}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    path = CORPUS / CASES[request.param]
    if not path.exists():
        pytest.skip(absent(path))
    run = traceview.open([path], cache=True, cache_dir=tmp_path_factory.mktemp("cache"))
    return request.param, run


def test_every_analysis_answers(case) -> None:
    name, run = case
    ranks = set(run.events.select("rank").collect()["rank"].unique().to_list())
    ov = run.overlap(per_step=True).to_polars()
    assert set(ov["rank"].to_list()) == ranks
    for r in ov.filter(pl.col("busy_ns").is_not_null()).iter_rows(named=True):
        assert r["busy_ns"] + r["idle_ns"] == r["window_ns"]
        assert r["overlap_ns"] <= min(r["compute_ns"], r["comm_ns"])
    breakdown = run.breakdown()
    bd = breakdown["steps"]
    parts = ["compute_ns", "exposed_comm_ns", "exposed_memcpy_ns", "exposed_memset_ns", "idle_ns"]
    for r in bd.filter(pl.col("window_ns").is_not_null()).iter_rows(named=True):
        assert sum(r[p] for p in parts) == r["window_ns"] and r["idle_ns"] >= 0
    g = run.gap_rows()
    assert (g["gap_ns"] > 0).all()
    gaps = run.gaps(top=3)
    for table in (gaps["causes"], gaps["largest"], breakdown["top_kernels"],
                  breakdown["top_cpu_ops_by_self"], launch_delays(run.gpu, run.host)):
        assert isinstance(table, pl.DataFrame)
    s = run.summary().to_polars()
    assert set(s["rank"].to_list()) == ranks
    if name in CPU_ONLY:
        assert g.height == 0
        assert all(NOTE_NO_GPU in (n or "") for n in ov["note"].to_list())
        assert s["note"].str.contains("no GPU events").all()
    else:
        assert ov["compute_ns"].drop_nulls().sum() > 0


def test_trace_without_steps_is_one_window(tmp_path) -> None:
    path = CORPUS / CASES["legacy_autograd_no_steps"]
    if not path.exists():
        pytest.skip(absent(path))
    ov = traceview.open([path], cache=True, cache_dir=tmp_path).overlap(per_step=True)["rows"]
    assert ov.height == 1 and NOTE_NO_STEPS in ov["note"][0]
    assert ov["step"][0] is None and ov["compute_ns"][0] > 0
