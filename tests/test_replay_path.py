"""The replay's critical path where a step's GPU work outlives its host (issue 46, item 4):
``analyses/replay/verdicts.py`` ``critical_path`` and ``step_finish``, on hand-drawn one-rank
GPU runs whose host never synchronises with the device (µs; kernels on stream 7).

Host runs ahead (``ahead``): step 1 [0,100) launches k1 at [10,15), k1 runs [20,150); step 2
[100,200) launches k2 at [110,115), k2 runs [150,260) queued behind k1. The replay: k1 starts
its launch delay (10) after its launch and ends 10 + 10 + 130 = 150; k2 waits for k1 on the
stream (its launch gives only 110 + 10 + 110 = 230) and ends 260. The step markers end at 100
and 200 on their own (no sync), so a step is done when its GPU work is: the path starts at
k2's end, 260, and goes back k2 (work 110, step 2) <- k1 (launch 10 + work 130 = 140, its end
at 150 falls in step 2) <- the launch at 10 (host work 10, step 1). 10 + 140 + 110 = 260.

Host idle after the GPU (``tail``): step [0,100) launches k at [10,15), k runs [20,50); the
host runs ``opt`` [30,40) and nothing after it. At the marker's end the last thing that ran
was k: the path is the host's 10, k's 40 (launch delay 10 + work 30), and the host's tail
[50,100) after k ended: ``step_tail`` 50. With ``opt`` at [60,100) instead (``busy``) the host
ran until its marker's end: the path stays on the host, 10 + 90.
"""

from __future__ import annotations

import polars as pl

from gpu_trace_helpers import frame, kernel, launch, row, step
from traceview.analyses.replay.verdicts import critical_path, path_ranks, step_finish
from traceview.run.run import Run

US = 1_000


def _run(rows: list[dict]) -> Run:
    return Run.from_events(frame([{**r, "ts_ns": r["ts_ns"] * US, "dur_ns": r["dur_ns"] * US}
                                  for r in rows]), align="none")


def _path(run: Run) -> list[tuple]:
    return [(r, k, ns // US, s) for r, k, ns, s in critical_path(run.replay).rows()]


def ahead() -> Run:
    return _run([step(1, 0, 100), launch(10, 5, 1), kernel("k1", 20, 130, corr=1),
                 step(2, 100, 100), launch(110, 5, 2), kernel("k2", 150, 110, corr=2)])


def one_step(opt_at: int, opt_dur: int) -> Run:
    return _run([step(1, 0, 100), launch(10, 5, 1), kernel("k", 20, 30, corr=1),
                 row("cpu_op", "opt", opt_at, opt_dur, pid=1, tid=1)])


def test_a_host_that_runs_ahead_the_path_ends_with_the_gpu_work() -> None:
    run = ahead()
    assert _path(run) == [(0, "work", 10, 1), (0, "launch", 140, 2), (0, "work", 110, 2)]
    assert path_ranks(critical_path(run.replay)).select("rank", "path_ns", "share").rows() \
        == [(0, 260 * US, 1.0)]
    # step times stay the markers' (back to back: each marker's end is its own step's)
    assert run.replay.check.steps.select("step", "measured_ns", "replayed_ns").rows() == [
        (1, 100 * US, 100 * US), (2, 100 * US, 100 * US)]


def test_a_gpu_op_belongs_to_the_step_that_launched_it() -> None:
    replay = ahead().replay
    kernels = replay.graph.points.filter(pl.col("kind") == "kernel").select(
        "correlation", "point")
    k1, k2 = (kernels.filter(pl.col("correlation") == c).get_column("point")[0] for c in (1, 2))
    # k1 ends at 150, in step 2's time, but step 1 launched it; the host idled 85 at each end
    assert step_finish(replay).select("step", "gpu", "idle_ns").rows() == [
        (1, k1, 85 * US), (2, k2, 85 * US)]


def test_the_host_idle_after_its_gpu_work_is_the_step_tail() -> None:
    assert _path(one_step(30, 10)) == [
        (0, "work", 10, 1), (0, "launch", 40, 1), (0, "step_tail", 50, 1)]


def test_a_host_busy_to_its_marker_end_keeps_the_path() -> None:
    assert _path(one_step(60, 40)) == [(0, "work", 10, 1), (0, "work", 90, 1)]


def test_a_cpu_run_has_no_gpu_side() -> None:
    run = _run([step(1, 0, 100), row("cpu_op", "mm", 0, 80, pid=1, tid=1)])
    assert step_finish(run.replay).select("gpu", "idle_ns").rows() == [(None, 20 * US)]
    assert _path(run) == [(0, "work", 100, 1)]
