"""A window (``--time``, ``--steps``) does not make launched work "unlaunched": a kernel
replayed from a graph whose ``cudaGraphLaunch`` lies before the window was launched, earlier
(``Run.unlaunched`` looks the launches up in the ranks' whole traces). Only a correlation id
that no runtime call of the rank's trace has is unlaunched. Hand-drawn timeline."""

from __future__ import annotations

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame, kernel, launch, step


@pytest.fixture()
def graph_replay_run() -> traceview.Run:
    """Rank 0 (ns): cudaGraphLaunch [0,10) (correlation 7) replays k1 [100,200) and k2
    [300,400) (both correlation 7, as Kineto links a graph's kernels to its launch); k3
    [500,600) has correlation 99, which no runtime call has (queued before the profiler
    started); cudaLaunchKernel [650,660) (correlation 8) launches k4 [700,800)."""
    return traceview.Run.from_events(frame([
        launch(0, 10, 7, name="cudaGraphLaunch"),
        kernel("k1", 100, 100, corr=7), kernel("k2", 300, 100, corr=7),
        kernel("k3", 500, 100, corr=99),
        launch(650, 10, 8), kernel("k4", 700, 100, corr=8)]))


def _unlaunched(run: traceview.Run) -> list[str]:
    return sorted(run.unlaunched.get_column("name").cast(pl.String).to_list())


@pytest.mark.parametrize("window", [None, "50ns:1000ns", "250ns:1000ns", "450ns:650ns"])
def test_a_graph_launch_before_the_time_window_still_launched_its_kernels(
        graph_replay_run: traceview.Run, window: str | None) -> None:
    """The window [50,1000) cuts the graph launch off, [250,1000) k1 too, [450,650) keeps
    only k3: in each, k3 (where kept) is the only unlaunched kernel."""
    run = graph_replay_run.select(time=window)
    kept = set(run.gpu.get_column("name").cast(pl.String).to_list())
    assert _unlaunched(run) == (["k3"] if "k3" in kept else [])


def test_exclude_unlaunched_in_a_time_window_keeps_the_graphs_kernels(
        graph_replay_run: traceview.Run) -> None:
    """--time 50ns:1000ns --exclude-unlaunched: k1, k2 (graph launched before the window)
    and k4 stay; only k3 goes."""
    run = graph_replay_run.select(time="50ns:1000ns", exclude_unlaunched=True)
    assert sorted(run.gpu.get_column("name").cast(pl.String).to_list()) == ["k1", "k2", "k4"]


def test_a_step_window_keeps_a_graph_launched_in_an_earlier_step_launched() -> None:
    """Steps 1 [0,200) and 2 [200,400); the graph launch [10,20) (correlation 7) lies in step
    1 and its kernel k1 runs [250,300), tagged step 2 as the trace's own step marks it:
    --steps 2:3 leaves the launch out, yet k1 was launched."""
    run = traceview.Run.from_events(frame([
        step(1, 0, 200), step(2, 200, 200),
        launch(10, 10, 7, name="cudaGraphLaunch", step=1),
        kernel("k1", 250, 50, corr=7, step=2)]))
    window = run.select(steps="2:3")
    assert window.gpu.get_column("name").cast(pl.String).to_list() == ["k1"]
    assert window.unlaunched.height == 0
