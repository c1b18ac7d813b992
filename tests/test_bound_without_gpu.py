"""The right bound (issue 49, item 4): a trace without GPU work is the host's run (``host``
in summary, overlap and diagnose alike); NVTX ranges are annotations, never work; a CPU rank
blocked in a gloo collective inside a bare ``record_function`` range waits. Hand-drawn
timelines, answers derived by hand in each docstring."""

from __future__ import annotations

import polars as pl

import traceview
from gpu_trace_helpers import frame, kernel, launch, row, step


def _categories(run: traceview.Run) -> dict[str, int]:
    p = run.path.pieces
    return dict(p.group_by("category").agg((pl.col("end_ns") - pl.col("start_ns")).sum())
                .iter_rows())


def _cpu_rank(extra: list[dict]) -> traceview.Run:
    """One CPU rank, one step [0,1000) on thread 1: an op [0,100), then ``## backward ##``
    [100,1000) with nothing inside but ``extra``."""
    return traceview.Run.from_events(frame([
        step(1, 0, 1000), row("cpu_op", "aten::mm", 0, 100, pid=1, tid=1),
        row("user_annotation", "## backward ##", 100, 900, pid=1, tid=1), *extra]))


def test_a_cpu_only_trace_is_host_bound_everywhere() -> None:
    run = _cpu_rank([])
    assert run.summary()["ranks"]["bound"].to_list() == ["host-bound"]
    assert run.overlap()["rows"]["bound"].to_list() == ["host-bound"]
    bound = run.diagnose()["bound"]
    assert bound["bound"] == "host-bound" and bound["cpu_only"] and bound["bound_share"] is None
    # the path: the op 100 + the annotation 900, all the host's: 100% host
    assert bound["path"] == "host"
    assert bound["path_shares"]["host"] == 1.0 and bound["path_shares"]["compute"] == 0.0


def test_time_blocked_in_gloo_is_waiting() -> None:
    """gloo:all_reduce in flight [200,900) on the gloo thread: [200,900) of the bare
    annotation is communication_wait (700); [100,200) and [900,1000) are the annotation's
    own (compute 200, with the op's 100: 300)."""
    run = _cpu_rank([row("user_annotation", "gloo:all_reduce", 200, 700, pid=1, tid=7)])
    assert _categories(run) == {"compute": 300, "communication_wait": 700}
    res = run.diagnose()
    assert (res["bound"]["bound"], res["bound"]["path"]) == ("host-bound", "host")
    assert res["bound"]["path_shares"]["communication"] == 0.7
    # an op that runs while the collective is in flight is the rank's work, not a wait
    busy = _cpu_rank([row("user_annotation", "gloo:all_reduce", 200, 700, pid=1, tid=7),
                      row("cpu_op", "aten::add", 300, 100, pid=1, tid=1)])
    assert _categories(busy) == {"compute": 400, "communication_wait": 600}


def test_nvtx_ranges_are_annotations_not_work() -> None:
    """GPU rank: step [0,1000), an NVTX range "loop" [0,1000) on the launching thread, a
    launch [10,20) and its kernel [30,100). Only the launch call is the host's (10); where
    the host runs nothing but the NVTX range, [0,10), [20,30) and [100,1000), the path is idle
    (920), never launch_host or compute."""
    run = traceview.Run.from_events(frame([
        step(1, 0, 1000), row("nvtx", "loop", 0, 1000, pid=1, tid=1), launch(10, 10, 1),
        kernel("k", 30, 70, corr=1)]))
    cats = _categories(run)
    assert cats == {"compute": 70, "launch_host": 10, "idle": 920}
    assert "loop" not in run.path.pieces.get_column("name").to_list()


def test_an_nvtx_only_trace_is_not_compute_bound() -> None:
    run = traceview.Run.from_events(frame([row("nvtx", "loop", 0, 1000, pid=1, tid=1)]))
    bound = run.diagnose()["bound"]
    assert bound["bound"] == "host-bound" and bound["path_shares"]["compute"] == 0.0
    assert run.summary()["ranks"]["bound"].to_list() == ["host-bound"]
