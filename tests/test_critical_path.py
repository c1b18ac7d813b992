"""The critical path across ranks (analyses/critical_path.py) on hand-drawn timelines, and on
the real gloo runs with a rank slowed on purpose.

CPU-only, two ranks, two steps (ns). Main thread tid 1, gloo work items on tid 9:

  rank 0  step 1 [0,1000)     mm [0,100)  all_reduce [100 ............. 700)  add [700,900)
          step 2 [1000,1900)  mm [1000,1500)  all_reduce [1500,1600)  add [1600,1700)
  rank 1  step 1 [0,1000)     mm [0,200) slow [200,600)  all_reduce [600,700)  add [700,900)
          step 2 [1000,2000)  mm [1000,1100)  all_reduce [1100 ........ 1600)  add [1600,1900)

Walking back from 2000 (rank 1 ends last): rank 1 [1600,2000) (add 300, idle 100); the
step-2 all-reduce's transfer [1500,1600) on rank 1; rank 0 arrived last (1500): jump to rank 0;
rank 0 [700,1500) (add 200, idle 100, mm 500); the step-1 all-reduce's transfer [600,700) on
rank 0; rank 1 arrived last (600): jump to rank 1; rank 1 [0,600) (mm 200, slow 400).

  step 1: rank 1 600 + rank 0 400 = 1000 = step;  step 2: rank 0 500 + rank 1 500 = 1000
  ranks: 1 -> 1100 (55%), 0 -> 900 (45%); compute 1600, transfer 200, idle 200
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview

from gpu_trace_helpers import frame, kernel, launch, row, step
from traceview.analyses.critical_path import candidates, walk
from traceview.run.run import Run

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def op(name: str, ts: int, dur: int, rank: int, *, tid: int = 1, kind: str = "cpu_op") -> dict:
    return row(kind, name, ts, dur, rank=rank, pid=rank + 1, tid=tid)


def gloo(ts: int, dur: int, rank: int) -> dict:
    return op("gloo:all_reduce", ts, dur, rank, tid=9, kind="user_annotation")


def issue(ts: int, rank: int) -> dict:
    """The main thread's dispatcher call that hands the all-reduce to gloo's worker (a real
    capture has it; drawn with no duration, it changes no measured time)."""
    return row("cpu_op", "c10d::allreduce_", ts, 0, rank=rank, pid=rank + 1, tid=1,
               collective="all_reduce")


#: The hand-drawn times in µs: the replay's waits are physical (a thread blocked 50 µs or more,
#: ``WaitOptions.min_wait_ns``), a 600 ns "wait" is none.
US = 1_000


def scaled(rows: list[dict], scale: int) -> list[dict]:
    return [{**r, "ts_ns": r["ts_ns"] * scale, "dur_ns": r["dur_ns"] * scale} for r in rows]


def cpu_run(extra: list[dict] | None = None, *, scale: int = 1) -> Run:
    return Run.from_events(frame(scaled([
        step(1, 0, 1000, rank=0), step(2, 1000, 900, rank=0),
        step(1, 0, 1000, rank=1), step(2, 1000, 1000, rank=1),
        op("aten::mm", 0, 100, 0), gloo(100, 600, 0), op("aten::add", 700, 200, 0),
        op("aten::mm", 1000, 500, 0), gloo(1500, 100, 0), op("aten::add", 1600, 100, 0),
        op("aten::mm", 0, 200, 1), op("fixture::slow", 200, 400, 1, kind="user_annotation"),
        gloo(600, 100, 1), op("aten::add", 700, 200, 1),
        op("aten::mm", 1000, 100, 1), gloo(1100, 500, 1), op("aten::add", 1600, 300, 1),
        issue(100, 0), issue(1500, 0), issue(600, 1), issue(1100, 1),
        *(extra or []),
    ], scale)), align="none")


def test_the_path_jumps_to_the_rank_that_arrived_last() -> None:
    seg = cpu_run().path.segments
    assert seg.select("rank", "kind", "start_ns", "end_ns", "to_rank").rows() == [
        (1, "local", 0, 600, None),
        (0, "transfer", 600, 700, 1),
        (0, "local", 700, 1500, None),
        (1, "transfer", 1500, 1600, 0),
        (1, "local", 1600, 2000, None),
    ]


def test_steps_ranks_categories_and_ops_by_hand() -> None:
    """In µs. ``ranks`` is the replay's longest path (issue 46): the gloo work items on tid 9
    are waited on by the main threads' gaps, so it jumps where the measured walk does."""
    res = cpu_run(scale=US).critical_path().to_dict()
    assert [(s["step"], s["path_ns"] // US, s["step_ns"] // US, s["top_rank"], s["jumps"])
            for s in res["steps"]] == [(1, 1000, 1000, 1, 1), (2, 1000, 950, 0, 1)]
    assert [(r["rank"], r["path_ns"] // US, round(r["share"], 9), r["source"])
            for r in res["ranks"]] \
        == [(1, 1100, 0.55, "replay"), (0, 900, 0.45, "replay")]
    cats = {c: v["path_ns"] // US for c, v in res["categories"].items()}
    assert cats == {"compute": 1600, "communication_wait": 0, "communication_transfer": 200,
                    "launch_host": 0, "data_loading": 0, "idle": 200}
    assert [(o["name"], o["category"], o["ranks"], o["path_ns"] // US)
            for o in res["top_ops"]] == [
        ("aten::mm", "compute", [0, 1], 700), ("aten::add", "compute", [0, 1], 500),
        ("fixture::slow", "compute", [1], 400),
        ("gloo:all_reduce", "communication_transfer", [0, 1], 200)]
    assert res["warnings"] == []


def test_pieces_tile_the_path_exactly() -> None:
    path = cpu_run().path
    p = path.pieces.sort("start_ns")
    assert p.get_column("start_ns").to_list()[1:] == p.get_column("end_ns").to_list()[:-1]
    assert (p.get_column("start_ns").min(), p.get_column("end_ns").max()) == (0, 2000)


def test_a_collective_hidden_under_compute_is_not_on_the_path() -> None:
    """Instance ``h`` [30,50) ends while both ranks compute ([20,70) on rank 0, [0,90) on rank
    1): nobody waited for it, so the walk passes it by, to the exposed ``a`` [60,80) only."""
    coll = pl.DataFrame({"instance": ["h", "h", "a", "a"], "rank": [0, 1, 0, 1], "name": "x",
                         "arrival_ns": [30, 35, 10, 60], "end_ns": [50, 50, 80, 80],
                         "last_arrival_ns": [35, 35, 60, 60], "last_rank": [1, 1, 1, 1]})
    busy = pl.DataFrame({"rank": [0, 1], "ts_ns": [20, 0], "end_ns": [70, 60]},
                        schema={"rank": pl.Int32, "ts_ns": pl.Int64, "end_ns": pl.Int64})
    bounds = pl.DataFrame({"rank": [0, 1], "first_ns": [0, 0], "last_ns": [100, 90]},
                          schema={"rank": pl.Int32, "first_ns": pl.Int64, "last_ns": pl.Int64})
    exposed = candidates(coll, busy)
    assert exposed.select("instance", "rank").rows() == [("a", 0), ("a", 1)]
    assert walk(exposed, bounds).select("rank", "kind", "start_ns", "end_ns").rows() == [
        (1, "local", 0, 60), (0, "transfer", 60, 80), (0, "local", 80, 100)]
    # without the compute, ``h`` is on the path: rank 1 reaches it at 60, jumps at 35
    assert walk(candidates(coll, None), bounds).select("rank", "kind", "start_ns",
                                                      "end_ns").rows() == [
        (1, "local", 0, 35), (1, "transfer", 35, 50), (1, "local", 50, 60),
        (0, "transfer", 60, 80), (0, "local", 80, 100)]


def test_walk_on_tables_alone() -> None:
    coll = pl.DataFrame({"instance": ["a", "a"], "rank": [0, 1], "name": "x",
                         "arrival_ns": [10, 60], "end_ns": [80, 80],
                         "last_arrival_ns": [60, 60], "last_rank": [1, 1]})
    bounds = pl.DataFrame({"rank": [0, 1], "first_ns": [0, 0], "last_ns": [100, 90]},
                          schema={"rank": pl.Int32, "first_ns": pl.Int64, "last_ns": pl.Int64})
    seg = walk(candidates(coll, busy=None), bounds)
    assert seg.select("rank", "kind", "start_ns", "end_ns").rows() == [
        (1, "local", 0, 60), (0, "transfer", 60, 80), (0, "local", 80, 100)]
    # no collective: the path is the latest-ending rank's own time
    assert walk(candidates(coll.head(0), busy=None), bounds).rows() == [
        (0, "local", 0, 100, None, None, None)]


def stream_wait(ts: int, stream: int, on: int, corr: int, rank: int) -> list[dict]:
    """``stream`` waits for what ``on`` had queued at ``ts`` (``cudaEventRecord`` then
    ``cudaStreamWaitEvent``, drawn with no duration, and the CUDA sync event a capture with
    ``enable_cuda_sync_events`` writes): how PyTorch's NCCL process group orders its stream
    after the compute stream, and the compute stream after the collective's end."""
    args = {"stream": stream, "wait_on_stream": on, "wait_on_cuda_event_record_corr_id": corr,
            "device": 0, "correlation": corr + 1}
    return [{**launch(ts, 0, corr, rank=rank, name="cudaEventRecord"), "pid": rank + 1},
            {**launch(ts, 0, corr + 1, rank=rank, name="cudaStreamWaitEvent"), "pid": rank + 1},
            row("sync", "Stream Wait Event", ts, 0, rank=rank, pid=rank + 1, tid=stream,
                correlation=corr + 1, args_json=json.dumps(args))]


def gpu_run(*, scale: int = 1) -> Run:
    """GPU, two ranks, one step [0,1000) each; kernels on stream 7, NCCL on stream 20.

    rank 0: launches [50,60) [60,70) [70,80); sgemm [100,300), nccl [300 ... 800) (waits for
            rank 1 until 700), elementwise [800,900)
    rank 1: the same launches; sgemm [100,700), nccl [700,800), elementwise [800,950)

    Path back from 1000 on rank 0 (tie: the lower rank): [800,1000) elementwise 100, idle 100;
    transfer [700,800); jump to rank 1 at 700: sgemm [100,700) compute 600, launches [50,80)
    launch_host 30 (GPU idle, the main thread launching), idle [0,50) and [80,100) 70.

    The replay's longest path (``ranks``), with the stream waits a capture records (NCCL's
    stream after sgemm, the compute stream after NCCL) and no host sync: rank 0's step is done
    when its elementwise is (900; the host idled from 80), so the path goes on into it: step
    tail [900,1000) 100, elementwise 100 after its stream wait, the transfer 100; rank 1 arrived
    last: its NCCL after its sgemm (stream wait, 0), the sgemm 50 + 600 after its launch at 50,
    the host's [0,50). Rank 1 700, rank 0 300: the measured walk's split.
    """
    rows = []
    for rank, (sgemm, nccl_at, elem) in enumerate([(200, 300, 100), (600, 700, 150)]):
        rows += [step(1, 0, 1000, rank=rank)]
        rows += [{**launch(50 + 10 * i, 10, i + 1, rank=rank), "pid": rank + 1}
                 for i in range(3)]
        rows += [kernel("sgemm", 100, sgemm, corr=1, rank=rank),
                 kernel(NCCL, nccl_at, 800 - nccl_at, corr=2, rank=rank, stream=20,
                        bytes=4096, group_size=2),
                 kernel("elementwise", 800, elem, corr=3, rank=rank)]
        rows += stream_wait(60, 20, 7, 10, rank) + stream_wait(70, 7, 20, 12, rank)
    return Run.from_events(frame(scaled(rows, scale)), align="none")


def test_gpu_path_follows_kernels_launches_and_the_last_arriver() -> None:
    run = gpu_run()
    assert run.path.segments.select("rank", "kind", "start_ns", "end_ns").rows() == [
        (1, "local", 0, 700), (0, "transfer", 700, 800), (0, "local", 800, 1000)]
    res = run.critical_path().to_dict()
    assert {c: v["path_ns"] for c, v in res["categories"].items()} == {
        "compute": 700, "communication_wait": 0, "communication_transfer": 100,
        "launch_host": 30, "data_loading": 0, "idle": 170}
    assert [(r["rank"], r["path_ns"], round(r["share"], 9), r["source"])
            for r in res["ranks"]] == [(1, 700, 0.7, "replay"), (0, 300, 0.3, "replay")]
    assert [(o["name"], o["path_ns"]) for o in res["top_ops"]] == [
        ("sgemm", 600), ("elementwise", 100), (NCCL, 100), ("cudaLaunchKernel", 30)]


def test_single_rank_and_no_steps() -> None:
    run = Run.from_events(frame([op("aten::mm", 0, 100, 0), op("aten::add", 150, 50, 0)]))
    res = run.critical_path().to_dict()
    assert [(s["step"], s["path_ns"]) for s in res["steps"]] == [(None, 200)]
    assert res["categories"]["compute"]["path_ns"] == 150
    assert res["categories"]["idle"]["path_ns"] == 50
    assert any("no ProfilerStep" in w for w in res["warnings"])


# --- the real gloo runs: rank R sleeps 30 ms per step (fixtures/gloo_ddp.py, gloo_tp_dp.py) --
SLOWED = [("gloo_ddp_4r_noisy_slow2", 2), ("gloo_ddp_2r_slow1", 1), ("gloo_tp_dp_4r_slow2", 2)]


@pytest.mark.parametrize(("name", "slow"), SLOWED)
def test_real_slowed_runs_the_slow_rank_holds_the_path(name: str, slow: int) -> None:
    res = traceview.open(DATA / name, cache=False).critical_path()
    ranks = res["ranks"]
    assert ranks.get_column("rank")[0] == slow
    assert ranks.get_column("share")[0] > 0.7
    steps = res["steps"]
    # the path covers every step: it tiles the time from the first step to the last
    assert steps.get_column("coverage").min() > 0.9
    total = steps.get_column("path_ns").sum() / steps.get_column("step_ns").sum()
    assert 0.98 < total < 1.1
    assert res["top_ops"].filter(pl.col("category") == "compute").get_column("name")[0] \
        == "fixture::extra_compute"


@pytest.mark.parametrize("name", ["gloo_ddp_4r_noisy", "gloo_ddp_2r"])
def test_real_balanced_runs_cover_the_step(name: str) -> None:
    steps = traceview.open(DATA / name, cache=False).critical_path()["steps"]
    total = steps.get_column("path_ns").sum() / steps.get_column("step_ns").sum()
    assert 0.98 < total < 1.2


def test_complement_with_an_interval_at_the_bound() -> None:
    """The zero-length sentinel at the bound and an interval starting there tie on start: the
    gap must not swallow the interval, whichever order a sort gives them."""
    from traceview.analyses.intervals import complement

    merged = pl.DataFrame({"g": [0, 0], "ts_ns": [10, 50], "end_ns": [30, 60]})
    bounds = pl.DataFrame({"g": [0], "window_start_ns": [10], "window_end_ns": [100]})
    for _ in range(20):  # a non-stable sort chose either order at random
        assert complement(merged, by=["g"], bounds=bounds).rows() == [(0, 30, 50), (0, 60, 100)]


def test_a_rank_missing_from_the_trace_is_named(tmp_path: Path) -> None:
    import shutil

    for rank in (0, 1, 3):
        src = DATA / "gloo_ddp_4r_noisy_slow2" / f"rank-{rank}.gloo_ddp.pt.trace.json.gz"
        shutil.copy(src, tmp_path / src.name)
    res = traceview.open(tmp_path, cache=False).critical_path()
    assert any("1 of 4 ranks are not in the trace" in w for w in res.warnings)


def test_launches_from_the_autograd_thread_are_the_host() -> None:
    """One GPU rank: step markers on tid 1, backward on the autograd thread (tid 2):
    ``evaluate_function`` [40,95) on tid 2 launches at [50,60) the kernel [100,200).
    The path (the step [0,1000)): idle [0,40), launch/host [40,95) (the op 45 ns and, inside
    it, the launch 10 ns), idle [95,100), compute [100,200), idle [200,1000)."""
    bwd = "autograd::engine::evaluate_function: MmBackward0"
    run = Run.from_events(frame([
        step(1, 0, 1000),
        row("cpu_op", bwd, 40, 55, pid=1, tid=2),
        {**launch(50, 10, 1), "tid": 2},
        kernel("sgemm", 100, 100, corr=1),
    ]))
    res = run.critical_path().to_dict()
    cats = {c: v["path_ns"] for c, v in res["categories"].items() if v["path_ns"]}
    assert cats == {"compute": 100, "launch_host": 55, "idle": 845}
    assert [(o["name"], o["path_ns"]) for o in res["top_ops"]] == [
        ("sgemm", 100), (bwd, 45), ("cudaLaunchKernel", 10)]
