"""Graph launches and compiled graphs' calls are steady-state work, never start-up
(``advice_checks.STEADY_PATTERN``, ``diagnose._startup_time``): a window opened on a running
loop (no steps, no start-up call) has no start-up finding, and the launch finding does not
tell a step captured already to capture it. Hand-drawn timelines; the numbers derived by hand
in each docstring."""

from __future__ import annotations

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame, kernel, launch, row
from traceview.analyses.advice_checks import graph_launch, startup, steady


@pytest.mark.parametrize(("name", "is_steady"), [
    ("hipGraphLaunch", True), ("cudaGraphLaunch", True), ("cudaLaunchKernel", True),
    ("cuLaunchKernelEx", True), ("hipModuleLaunchKernel", True),
    ("## Call CompiledFxGraph fal4xpiah2v6 ##", True), ("CompiledFunction", True),
    ("Torch-Compiled Region: 0/0", True),
    ("MPI_Init", False), ("cuCtxCreate", False), ("aten::mm", False), (None, False),
])
def test_steady_names(name: str | None, is_steady: bool) -> None:
    assert steady(name) is is_steady
    assert not (steady(name) and startup(name))


@pytest.mark.parametrize(("name", "replays"), [
    ("hipGraphLaunch", True), ("cudaGraphLaunch", True), ("torch.cuda.CUDAGraph.replay", True),
    ("cudaLaunchKernel", False), ("## Call CompiledFxGraph x ##", False)])
def test_graph_launch_names(name: str, replays: bool) -> None:
    assert graph_launch(name) is replays


def _window(with_mpi_init: bool, launch_name: str = "hipGraphLaunch"):
    """No steps. Optionally MPI_Init [0,400) first; then (o = 400 or 0) a compiled graph's
    call [o, o+200) whose launch (``launch_name``) [o+50, o+200) launches the kernel
    [o+220, 1000). On the path before the first GPU work: MPI_Init 400 (if any), the compiled
    graph's own time 50, the launch 150, idle 20."""
    o = 400 if with_mpi_init else 0
    ev = [row("cpu_op", "MPI_Init", 0, 400, pid=1, tid=1)] if with_mpi_init else []
    ev += [row("cpu_op", "## Call CompiledFxGraph f3x ##", o, 200, pid=1, tid=1),
           launch(o + 50, 150, 1, name=launch_name),
           kernel("k", o + 220, 1000 - o - 220, corr=1)]
    return traceview.Run.from_events(frame(ev)).diagnose()["findings"]


def _by_id(findings: pl.DataFrame) -> dict[str, dict]:
    return {f["id"]: f for f in findings.iter_rows(named=True)}


def test_a_window_opened_on_a_graph_launch_has_no_start_up() -> None:
    """Without a start-up call the 200 ns of the compiled graph and its graph launch are the
    step's launch overhead (20% of the 1000 ns window), not start-up; and the step is
    captured already (150 of the 200 ns in hipGraphLaunch), so the fix is not "capture the
    step with CUDA graphs"."""
    found = _by_id(_window(with_mpi_init=False))
    assert "startup" not in found
    launch_bound = found["launch_bound"]
    assert launch_bound["path_ns_per_step"] == 200
    assert launch_bound["name"] == "hipGraphLaunch"
    assert "capture the step" not in launch_bound["recommendation"]
    assert "already launches through CUDA/HIP graphs" in launch_bound["recommendation"]


def test_a_compiled_graph_launching_kernel_by_kernel_still_gets_cuda_graphs() -> None:
    """The same window launched by hipModuleLaunchKernel: torch.compile without CUDA graphs.
    Still no start-up; capturing the step (reduce-overhead) is the advice that fits."""
    found = _by_id(_window(with_mpi_init=False, launch_name="hipModuleLaunchKernel"))
    assert "startup" not in found
    assert found["launch_bound"]["path_ns_per_step"] == 200
    assert "capture the step with CUDA graphs" in found["launch_bound"]["recommendation"]


def test_start_up_before_a_graph_launch_names_only_the_start_up_call() -> None:
    """MPI_Init opens the window: its 400 ns are start-up; the compiled graph and its
    hipGraphLaunch that follow (200 ns) stay the launch overhead, not start-up."""
    found = _by_id(_window(with_mpi_init=True))
    start = found["startup"]
    assert start["name"] == "MPI_Init" and start["path_ns_per_step"] == 400
    ev = {e["metric"]: e for e in start["evidence"]}
    assert ev["top_startup_ns_per_step"]["value"] == 400
    assert found["launch_bound"]["path_ns_per_step"] == 200
