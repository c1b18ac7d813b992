"""Every GPU trace of the shared corpus, swept (issue 49, items 1 and 7): ``summary``, ``ops``
and ``diagnose`` on each, asserting what the trace itself says: the op tree charges each
launch to an op that contains it; no advice contradicts the trace's own kernels (precision,
fused attention, start-up, "per step" without steps); a multi-rank GPU job shows
communication; a trace without GPU work is host-bound everywhere. Each trace is opened and
analysed once for the module (module fixtures), ~20 s in all. Skipped when the corpus is
absent (tests/conftest.py CORPUS).

Measured before item 1 (the sweep sorted ends before starts at equal times): 1,814 of 6,799
launches of ``negative_queue_length_values_check/rank0`` (53 ms of GPU time), 78 of 10,354 of
param's ``linear_kineto`` and 145 of 10,113 of ``resnet_kineto`` were charged to an op that
does not contain them; after: 0 on every trace.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.analyses.advice_checks import (
    FUSED_ATTENTION, LOWER, kernel_precision, startup,
)
from traceview.analyses.diagnose import KERNEL_FAMILIES
from traceview.analyses.op_kernels import op_kernel_times

from tests.conftest import CORPUS, absent

#: Not traces at all, or MTIA (no CUDA kernels; 87 MB: too slow for this sweep).
_NOT_TRACES = ("mtia_", "execution_trace/benchmark_simple_add_et", "memory_timeline")
#: Traces without GPU work (stripped, CPU-only, counters only).
_NO_GPU = ("cpu_only/", "rank_non_gpu", "cupti_profiler", "distributed_info_unavailable",
           "rank_unavailable", "mixed_files/")
_SKIP = _NOT_TRACES + _NO_GPU


def _gpu_traces() -> list[str]:
    if not CORPUS.is_dir():
        return []
    found = [*CORPUS.rglob("*.json.gz"), *CORPUS.rglob("*.sqlite")]
    return sorted(str(p.relative_to(CORPUS)) for p in found
                  if not any(s in str(p) for s in _SKIP))


TRACES = _gpu_traces()
CPU_TRACES = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.json.gz")
                    if any(s in str(p) for s in _NO_GPU)) if CORPUS.is_dir() else []


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, traceview.Run]:
    """Each corpus GPU trace opened once for the module, through one cache folder."""
    if not TRACES:
        pytest.skip(absent())
    cache = tmp_path_factory.mktemp("sweep-cache")
    return {rel: traceview.open(CORPUS / rel, cache_dir=cache) for rel in TRACES}


def _run(runs: dict[str, traceview.Run], rel: str) -> traceview.Run:
    if not (CORPUS / rel).exists():
        pytest.skip(absent(CORPUS / rel))
    return runs[rel]


@pytest.fixture(scope="module")
def answers(runs: dict[str, traceview.Run]) -> dict[str, dict]:
    """summary, ops and diagnose of every trace, computed on first use, once."""
    cache: dict[str, dict] = {}

    class Lazy(dict):
        def __missing__(self, rel: str) -> dict:
            run = _run(runs, rel)
            cache[rel] = {"summary": run.summary(), "ops": run.ops(), "diagnose": run.diagnose()}
            return cache[rel]

    return Lazy()


@pytest.mark.parametrize("rel", TRACES or ["(corpus absent)"])
def test_every_launch_is_charged_to_an_op_that_contains_it(runs, rel: str) -> None:
    run = _run(runs, rel)
    _, kernels = op_kernel_times(run.gpu, run.host)
    outside = kernels.filter((pl.col("op_ts_ns") > pl.col("launch_ts_ns"))
                             | (pl.col("op_end_ns") < pl.col("launch_end_ns")))
    assert outside.height == 0, outside.head(5)


def _family_kernels(run: traceview.Run, family: str) -> dict[str, int]:
    """GPU time per kernel name of one ``KERNEL_FAMILIES`` family (the first pattern that
    matches, as diagnose assigns them), over the whole trace."""
    per = run.gpu.filter(pl.col("gpu_class") == "compute").group_by(
        pl.col("name").cast(pl.String)).agg(pl.col("dur_ns").sum())
    out = {}
    for name, ns in per.iter_rows():
        first = next(key for key, _, pattern, _ in KERNEL_FAMILIES
                     if pl.Series([name]).str.contains(pattern)[0])
        if first == family:
            out[name] = ns
    return out


def _share(kernels: dict[str, int], keep) -> float:
    total = sum(kernels.values())
    return sum(ns for name, ns in kernels.items() if keep(name)) / total if total else 0.0


@pytest.mark.parametrize("rel", TRACES or ["(corpus absent)"])
def test_no_advice_contradicts_the_trace(runs, answers, rel: str) -> None:
    run = _run(runs, rel)
    found = answers[rel]["diagnose"]["findings"]
    for f in found.iter_rows(named=True):
        fix, family = f["recommendation"] or "", f["name"]
        if f["id"] == "kernels" and family in ("gemm", "convolution"):
            named = {n: ns for n, ns in _family_kernels(run, family).items()
                     if kernel_precision(n)}
            if _share(named, lambda n: kernel_precision(n) in LOWER) >= 0.9:
                assert "autocast" not in fix and "TF32" not in fix, (family, fix)
        if f["id"] == "kernels" and family == "attention":
            kernels = _family_kernels(run, "attention")
            if _share(kernels, lambda n: pl.Series([n]).str.contains(FUSED_ATTENTION)[0]) >= 0.9:
                assert "Use fused attention" not in fix
        if f["id"] == "launch_bound":  # CUDA-graph advice never for start-up
            assert not startup(f["name"]), f["title"]
        if run.path.steps.height == 0:  # no steps: never "per step"
            assert "per step" not in f["title"] and f["per"] == "window", f["title"]
    ops = answers[rel]["ops"]["ops"]
    assert ops.filter(pl.col("kernel_time_ns") < 0).height == 0


def _world_size(run: traceview.Run) -> int:
    return run._world.get("world_size") or 1


@pytest.mark.parametrize("rel", TRACES or ["(corpus absent)"])
def test_multi_rank_gpu_jobs_show_communication(runs, answers, rel: str) -> None:
    run = _run(runs, rel)
    if _world_size(run) < 2:
        pytest.skip("a single-rank job")
    ranks = answers[rel]["summary"]["ranks"]
    assert ranks.get_column("comm_ns").sum() > 0
    assert not any("shows no communication kernels" in w
                   for w in answers[rel]["summary"].warnings)


@pytest.mark.parametrize("rel", CPU_TRACES or ["(corpus absent)"])
def test_traces_without_gpu_work_are_host_bound_everywhere(tmp_path, rel: str) -> None:
    if not (CORPUS / rel).exists():
        pytest.skip(absent(CORPUS / rel))
    run = traceview.open(CORPUS / rel, cache_dir=tmp_path)
    assert set(run.summary()["ranks"].get_column("bound").to_list()) == {"host-bound"}
    assert set(run.overlap()["rows"].get_column("bound").to_list()) == {"host-bound"}
    bound = run.diagnose()["bound"]
    assert bound["bound"] == "host-bound" and bound["bound_share"] is None
    assert bound["path"] in ("host", None)  # None: nothing on the path at all
    assert bound["path_shares"]["compute"] == 0.0


def test_the_sweep_sees_the_corpus() -> None:
    if not CORPUS.is_dir():
        pytest.skip(absent())
    assert len(TRACES) >= 20 and all(Path(CORPUS / t).exists() for t in TRACES)
