"""GPU idle gaps and their causes (analyses/gaps.py) on a hand-built trace.

Timeline of rank 0, device 0 (ns). Host: ProfilerStep#1 [0,1000), #2 [1000,2000), #3 [2000,40000).
  k1 [100,200)   stream 7,  launched at 90
  k2 [205,300)   stream 7,  launched at 150     -> gap [200,205) 5 ns, queued: launch_overhead
  k3 [250,400)   stream 20, launched at 160     (overlaps k2: no device gap)
  k4 [500,600)   stream 7,  launched at 450     -> gap [400,500): launch after gap start: host
  cudaDeviceSynchronize on the host [610,700)
  k5 [800,900)   stream 7,  launched at 605     -> gap [600,800): sync overlaps it: sync
  DataLoader __next__ on the host [950,1100)
  k6 [1200,1300) stream 7,  step 2, launched 1150 -> gap [900,1200): data_loading (beats step)
  k7 [31300,31400) step 2, launched at 1250     -> gap [1300,31300) 30 µs, queued: other
  k8 [31500,31600) step 3, launched at 2100     -> gap [31400,31500): between_steps
"""

from __future__ import annotations

import polars as pl

from gpu_trace_helpers import frame, kernel, launch, row, step
from traceview.analyses.gaps import (
    GapOptions, gap_causes, gap_histogram, gaps, largest_gaps, no_gpu_ranks,
)
from traceview.analyses.host import host_events
from traceview.analyses.overlap import prepared_gpu
from traceview.analyses.window import ranks_present


def _gaps(ev, **options):
    """``gaps`` on the GPU and host tables of the events ``ev``."""
    return gaps(prepared_gpu(ev), host_events(ev), **options)


def _trace():
    return frame([
        step(1, 0, 1000), step(2, 1000, 1000), step(3, 2000, 38000),
        launch(90, 5, 1, step=1), launch(150, 5, 2, step=1), launch(160, 5, 3, step=1),
        launch(450, 5, 4, step=1), launch(605, 2, 5, step=1), launch(1150, 5, 6, step=2),
        {**launch(1250, 5, 7, step=2), "external_id": 77}, launch(2100, 5, 8, step=3),
        launch(610, 90, 99, name="cudaDeviceSynchronize"),
        row("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 950, 150,
            pid=1, tid=1),
        row("cpu_op", "aten::add", 1240, 20, pid=1, tid=1, external_id=77),
        row("cpu_op", "aten::item", 5000, 1000, pid=1, tid=1),
        kernel("k1", 100, 100, corr=1, step=1), kernel("k2", 205, 95, corr=2, step=1),
        kernel("k3", 250, 150, corr=3, step=1, stream=20),
        kernel("k4", 500, 100, corr=4, step=1), kernel("k5", 800, 100, corr=5, step=1),
        kernel("k6", 1200, 100, corr=6, step=2), kernel("k7", 31300, 100, corr=7, step=2),
        kernel("k8", 31500, 100, corr=8, step=3),
        row("cpu_op", "aten::mm", 0, 10, rank=1, pid=2, tid=2),
    ])


def test_device_gaps_and_causes_by_hand() -> None:
    g = _gaps(_trace())
    assert g.select("rank", "device", "gap_start_ns", "gap_end_ns", "cause").rows() == [
        (0, 0, 200, 205, "launch_overhead"),
        (0, 0, 400, 500, "host"),
        (0, 0, 600, 800, "sync"),
        (0, 0, 900, 1200, "data_loading"),
        (0, 0, 1300, 31300, "other"),
        (0, 0, 31400, 31500, "between_steps"),
    ]
    assert (g["gap_ns"] > 0).all()
    r = g.row(4, named=True)
    assert (r["prev_name"], r["next_name"], r["next_correlation"], r["launch_ts_ns"]) == (
        "k6", "k7", 7, 1250)


def test_threshold_is_an_option() -> None:
    # with a 40 µs threshold the queued 30 µs gap becomes launch overhead
    g = _gaps(_trace(), options=GapOptions(launch_overhead_ns=40_000))
    assert g.filter(pl.col("gap_start_ns") == 1300)["cause"].item() == "launch_overhead"


def test_per_stream_gaps_by_hand() -> None:
    g = _gaps(_trace(), per_stream=True)
    s7 = g.filter(pl.col("stream") == 7)
    # stream 7 sees [300,500) instead of [400,500): k3 ran on stream 20 meanwhile
    assert s7.select("gap_start_ns", "gap_end_ns", "cause").rows()[:2] == [
        (200, 205, "launch_overhead"), (300, 500, "host")]
    assert g.filter(pl.col("stream") == 20).height == 0


def test_histogram_and_causes_by_hand() -> None:
    g = _gaps(_trace())
    h = gap_histogram(g)
    # 5, 100, 200, 300, 100 ns fall in [0, 1 µs); 30 µs falls in [10 µs, 100 µs)
    assert h.select("bucket_lo_ns", "bucket_hi_ns", "count", "total_gap_ns").rows() == [
        (0, 1_000, 5, 705), (10_000, 100_000, 1, 30_000)]
    c = gap_causes(g)
    assert c.row(0, named=True)["cause"] == "other"
    assert c["share_of_idle"].sum() == 1.0
    assert c.filter(pl.col("cause") == "sync")["total_gap_ns"].item() == 200


def test_largest_gaps_with_host_ops() -> None:
    ev = _trace()
    top = largest_gaps(_gaps(ev), host_events(ev), n=2)
    assert top["gap_ns"].to_list() == [30_000, 300]
    first = top.row(0, named=True)
    assert first["launch_op"] == "aten::add"
    assert first["ops_during"] == ["aten::item"]
    assert top.row(1, named=True)["ops_during"] == [
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]


def test_cpu_only_rank_is_reported_not_raised() -> None:
    ev = _trace()
    assert _gaps(ev).filter(pl.col("rank") == 1).height == 0
    assert no_gpu_ranks(ranks_present(ev), prepared_gpu(ev))["rank"].to_list() == [1]
    empty = ev.filter(pl.col("rank") == 1)
    assert _gaps(empty).height == 0 and largest_gaps(_gaps(empty), host_events(empty)).height == 0


def test_work_on_either_side_of_each_gap_per_group() -> None:
    # Rank 0 (given first, so its rows come first): a long kernel "long" [0,100) holds the busy
    # time past "short" [10,20); the gap [100,150) has "long" before it. Rank 1: "a" [0,50)
    # and "b" [0,50) tie on the end (the later-starting one wins, here the later row), then a
    # null step and a null name after the gap [50,70): nothing is carried over from before.
    g = _gaps(frame([
        kernel("long", 0, 100, step=1), kernel("short", 10, 10, step=1),
        kernel("after0", 150, 10, step=2, corr=5),
        kernel("a", 0, 50, rank=1, step=3), kernel("b", 0, 50, rank=1, step=4),
        kernel(None, 70, 5, rank=1),
    ]))
    assert g.select("rank", "gap_start_ns", "gap_end_ns", "prev_name", "prev_step",
                    "next_name", "next_step", "next_correlation").rows() == [
        (0, 100, 150, "long", 1, "after0", 2, 5),
        (1, 50, 70, "b", 4, None, None, None),
    ]


def test_blocking_copy_graph_and_the_largest_holder_by_hand() -> None:
    """Rank 0, device 0 (ns); every gap is 20 µs or more (none is launch overhead).

      k1 [0,1000)           launched at 0
      k3 [30000,31000)      launched at 500 (queued)
      cudaMemcpyAsync [1200,31050) on the host, its copy "Memcpy DtoH (Device -> Pageable)"
                            [31000,31050) after k3 (correlation 2): the host waits in it
                            -> gap [1000,30000): blocking_copy (the call covers [1200,30000))
      cudaMemcpyAsync [60000,61000), copy "Memcpy HtoD (Pinned -> Device)" [61000,61100):
                            -> gap [31050,61000): a pinned copy holds nothing, the copy was
                            queued at 60000 (before the gap ended, after it began): host
      k5 [90000,91000)      launched at 600 -> gap [61100,90000): queued, launched by
                            cudaLaunchKernel, nothing holds the host: other
      k6 [120000,121000)    a node of a graph launched at 700 (cudaGraphLaunch) -> gap
                            [91000,120000): graph
      cudaStreamSynchronize [125000,135000) and a DataLoader op [130000,170000)
      k7 [180000,181000)    launched at 800 -> gap [121000,180000): the sync covers 10 µs of
                            it, the DataLoader 40 µs: data_loading
      cudaDeviceSynchronize [190000,200000), DataLoader [200000,210000)
      k8 [220000,221000)    launched at 900 -> gap [181000,220000): both cover 10 µs, the tie
                            goes to sync
    """
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ev = frame([
        launch(0, 5, 1), kernel("k1", 0, 1000, corr=1),
        launch(1200, 29850, 2, name="cudaMemcpyAsync"),
        row("memcpy", "Memcpy DtoH (Device -> Pageable)", 31000, 50, correlation=2),
        launch(500, 5, 3), kernel("k3", 30000, 1000, corr=3),
        launch(60000, 1000, 4, name="cudaMemcpyAsync"),
        row("memcpy", "Memcpy HtoD (Pinned -> Device)", 61000, 100, correlation=4),
        launch(600, 5, 5), kernel("k5", 90000, 1000, corr=5),
        launch(700, 5, 6, name="cudaGraphLaunch"), kernel("k6", 120000, 1000, corr=6),
        launch(125000, 10000, 90, name="cudaStreamSynchronize"),
        row("cpu_op", loader, 130000, 40000, pid=1, tid=1),
        launch(800, 5, 7), kernel("k7", 180000, 1000, corr=7),
        launch(190000, 10000, 91, name="cudaDeviceSynchronize"),
        row("cpu_op", loader, 200000, 10000, pid=1, tid=1),
        launch(900, 5, 8), kernel("k8", 220000, 1000, corr=8),
    ])
    g = _gaps(ev)
    assert g.select("gap_start_ns", "gap_end_ns", "cause").rows() == [
        (1000, 30000, "blocking_copy"),
        (31050, 61000, "host"),
        (61100, 90000, "other"),
        (91000, 120000, "graph"),
        (121000, 180000, "data_loading"),
        (181000, 220000, "sync"),
    ]
    assert g.row(3, named=True)["launch_name"] == "cudaGraphLaunch"
    causes = gap_causes(g)
    assert causes.filter(pl.col("cause") == "blocking_copy")["total_gap_ns"].item() == 29_000
