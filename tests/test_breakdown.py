"""Step breakdown, idle fraction, top kernels, top CPU ops, launch delays
(analyses/breakdown.py) on hand-built traces; numbers derived by hand in each test."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_trace_helpers import frame, row, two_step_trace
from traceview.analyses.breakdown import (
    idle_fraction, launch_delay_summary, launch_delays, step_breakdown, top_cpu_ops,
    top_kernels, with_self_time,
)
from traceview.analyses.host import host_events
from traceview.analyses.overlap import NOTE_NO_GPU, prepared_gpu
from traceview.analyses.window import ranks_present, step_spans

_PARTS = ("compute_ns", "exposed_comm_ns", "exposed_memcpy_ns", "exposed_memset_ns", "idle_ns")


def _step_breakdown(ev) -> pl.DataFrame:
    """``step_breakdown`` on the GPU table, host steps and ranks of the events ``ev``."""
    return step_breakdown(prepared_gpu(ev), step_spans(ev), ranks_present(ev))


def test_step_breakdown_by_hand() -> None:
    df = _step_breakdown(two_step_trace())
    r0 = df.filter(pl.col("rank") == 0)
    # step 1 window [10,110): C=50, M\C=[40,60)... = 10, copy [75,80) exposed 5, idle 35
    # step 2 window [110,160): C=40, M\C=[150,160)=10, idle 0; whole trace [10,160)
    assert r0.select("step", "step_time_ns", "window_ns", *_PARTS).rows() == [
        (1, 100, 100, 50, 10, 5, 0, 35),
        (2, 100, 50, 40, 10, 0, 0, 0),
        (None, None, 150, 90, 20, 5, 0, 35),
    ]
    assert r0["idle_fraction"].to_list() == pytest.approx([0.35, 0.0, 35 / 150])
    r1 = df.filter(pl.col("rank") == 1).row(0, named=True)
    assert r1["note"] == NOTE_NO_GPU


def test_idle_fraction_by_hand() -> None:
    ev = two_step_trace()
    idle = idle_fraction(prepared_gpu(ev), ranks_present(ev))
    r = idle.filter(pl.col("rank") == 0).row(0, named=True)
    # busy = [10,70)+[75,80)+[110,160) = 115 of the span [10,160) = 150
    assert (r["busy_ns"], r["span_ns"], r["idle_ns"]) == (115, 150, 35)
    assert r["idle_fraction"] == pytest.approx(1 - 115 / 150)


def test_top_kernels_by_hand() -> None:
    t = top_kernels(prepared_gpu(two_step_trace()), n=2)
    assert t.select("name", "count", "total_ns", "mean_ns", "p50_ns").rows() == [
        ("sgemm", 2, 70, 35.0, 35.0),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2, 50, 25.0, 25.0),
    ]
    # p99 of {30, 40} with linear interpolation: 30 + 0.99 * 10
    assert t["p99_ns"][0] == pytest.approx(39.9)
    # all GPU durations of rank 0: 30+30+20+5+40+20 = 145
    assert t["share_of_gpu_time"][0] == pytest.approx(70 / 145)


def test_top_cpu_ops_self_time_by_hand() -> None:
    op = lambda name, ts, dur, tid=1: row("cpu_op", name, ts, dur, pid=1, tid=tid)  # noqa: E731
    ev = frame([
        op("A", 0, 100),        # children B, D: self = 100 - 30 - 10 = 60
        op("B", 10, 30),        # child C: self = 20
        op("aten::add", 15, 10),  # C
        op("aten::add", 50, 10),  # D
        op("E", 100, 20),       # touches A's end: a sibling, not a child
        op("F", 5, 500, tid=2),  # another thread: never a parent of tid 1 ops
    ])
    t = top_cpu_ops(with_self_time(ev), n=10)
    got = {r["name"]: (r["count"], r["total_ns"], r["self_ns"]) for r in t.iter_rows(named=True)}
    assert got == {"A": (1, 100, 60), "B": (1, 30, 20), "aten::add": (2, 20, 20),
                   "E": (1, 20, 20), "F": (1, 500, 500)}
    assert t["name"][0] == "F" and t["name"][1] == "A"


def test_identical_ops_nest_in_trace_order() -> None:
    # aten::to calls aten::_to_copy; with µs timestamps both start at 0 and last 18: the one
    # written first is the parent, whatever order the other ops come in
    op = lambda name, ts, dur: row("cpu_op", name, ts, dur, pid=1, tid=1)  # noqa: E731
    for filler in ([], [op("z", 500, 5), op("y", 400, 5)]):
        ev = frame([*filler, op("aten::to", 0, 18), op("aten::_to_copy", 0, 18),
                    op("aten::copy_", 9, 9)])
        got = {r["name"]: r["self_ns"]
               for r in top_cpu_ops(with_self_time(ev), n=10).iter_rows(named=True)}
        assert (got["aten::to"], got["aten::_to_copy"], got["aten::copy_"]) == (0, 9, 9)
    # the same on a trace large enough for a sort to reorder exact ties (an unstable one did)
    ev = frame([op(name, 100 * i, 18 if name != "aten::copy_" else 9)
                for i in range(3000) for name in ("aten::to", "aten::_to_copy", "aten::copy_")])
    got = {r["name"]: r["self_ns"]
           for r in top_cpu_ops(with_self_time(ev), n=10).iter_rows(named=True)}
    assert (got["aten::to"], got["aten::_to_copy"], got["aten::copy_"]) == (0, 27000, 27000)


def test_launch_delays_by_hand() -> None:
    ev = two_step_trace()
    d = launch_delays(prepared_gpu(ev), host_events(ev))
    # launches at 5,6,8,9,105,106 (3 ns long); GPU starts 10,30,50,75,110,140
    assert d["launch_delay_ns"].to_list() == [5, 24, 42, 66, 5, 34]
    assert d["queue_delay_ns"].to_list() == [2, 21, 39, 63, 2, 31]
    s = launch_delay_summary(d).row(0, named=True)
    assert (s["count"], s["launch_delay_p50_ns"], s["launch_delay_max_ns"]) == (6, 29.0, 66)
    assert s["graph_launched"] == 0


_k = st.tuples(st.sampled_from(["gemm", "ncclKernel", "Memcpy HtoD", "Memset"]),
               st.integers(0, 3), st.integers(0, 400), st.integers(0, 60))


@settings(max_examples=25, deadline=None)
@given(st.lists(_k, min_size=1, max_size=25))
def test_parts_always_sum_to_the_window(ks) -> None:
    kinds = {"Memcpy HtoD": "memcpy", "Memset": "memset"}
    rows = [row(kinds.get(n, "kernel"), n, ts, dur, stream=s, step=ts // 150)
            for n, s, ts, dur in ks]
    for r in _step_breakdown(frame(rows)).iter_rows(named=True):
        assert sum(r[p] for p in _PARTS) == r["window_ns"]
        assert all(r[p] >= 0 for p in _PARTS)


def test_kernels_across_ranks_by_hand() -> None:
    """gemm: rank 0 runs 30 + 40 ns, rank 1 runs 50, rank 2 runs 90 -> 3 ranks, count 4,
    total 210, per-rank totals 70, 50, 90 (median 70, max 90 on rank 2); nccl: 40 ns on rank
    0 only. All GPU time 250 -> shares 210/250 and 40/250."""
    from traceview.analyses.breakdown import kernels_across_ranks

    gpu = pl.DataFrame({"rank": [0, 0, 1, 2, 0], "name": ["gemm", "gemm", "gemm", "gemm", "nccl"],
                        "gpu_class": ["compute"] * 4 + ["comm"],
                        "dur_ns": [30, 40, 50, 90, 40]})
    out = kernels_across_ranks(gpu, n=5)
    assert out.select("name", "ranks", "count", "total_ns", "rank_median_ns", "rank_max_ns",
                      "max_rank").rows() == [("gemm", 3, 4, 210, 70.0, 90, 2),
                                             ("nccl", 1, 1, 40, 40.0, 40, 0)]
    assert out["share_of_gpu_time"].to_list() == pytest.approx([210 / 250, 40 / 250])
    assert kernels_across_ranks(gpu, n=1).height == 1
