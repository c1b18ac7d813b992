"""The time between two profiling windows of a rank is not data (analyses on a hand-built trace).

Rank 0, device 0, two files (profiling windows; ``file_id`` 0 and 1), times in ns:

  window 0 (file 0): ProfilerStep#1 [0,1000)        k1 [100,300)    k2 [400,600)    step 1
  ... the profiler is off: nothing recorded in [1000, 10000) ...
  window 1 (file 1): ProfilerStep#5 [10000,11000)   k3 [10100,10300) k4 [10500,10600) step 5

Gaps: [300,400) and [10300,10500); [600,10100) lies between the windows and is no gap.
Whole trace: GPU from 100 to 10600, but profiled GPU time is (600-100) + (10600-10100) = 1000
ns, busy 700, idle 300. Step 1's GPU window ends with its own work at 600, not at step 5's start.
"""

from __future__ import annotations

import polars as pl

from gpu_trace_helpers import frame, kernel, launch, step
from traceview.analyses.breakdown import step_breakdown
from traceview.analyses.gaps import gaps
from traceview.analyses.host import host_events
from traceview.analyses.overlap import overlap, prepared_gpu
from traceview.analyses.summary import summary
from traceview.analyses.window import ranks_present, step_spans


def _two_windows():
    w0, w1 = {"file_id": 0}, {"file_id": 1}
    return frame([
        {**step(1, 0, 1000), **w0}, {**step(5, 10000, 1000), **w1},
        {**launch(90, 5, 1, step=1), **w0}, {**launch(390, 5, 2, step=1), **w0},
        {**launch(10090, 5, 3, step=5), **w1}, {**launch(10400, 5, 4, step=5), **w1},
        kernel("k1", 100, 200, corr=1, step=1, **w0), kernel("k2", 400, 200, corr=2, step=1, **w0),
        kernel("k3", 10100, 200, corr=3, step=5, **w1),
        kernel("k4", 10500, 100, corr=4, step=5, **w1),
    ])


def test_no_gap_between_two_windows() -> None:
    ev = _two_windows()
    g = gaps(prepared_gpu(ev), host_events(ev))
    assert g.select("gap_start_ns", "gap_end_ns").rows() == [(300, 400), (10300, 10500)]
    per_stream = gaps(prepared_gpu(ev), host_events(ev), per_stream=True)
    assert per_stream.select("gap_start_ns", "gap_end_ns").rows() == [(300, 400), (10300, 10500)]


def test_whole_trace_idle_sums_the_windows_not_the_hole() -> None:
    ev = _two_windows()
    gpu, ranks = prepared_gpu(ev), ranks_present(ev)
    ov = overlap(gpu, ranks)
    row = ov.row(0, named=True)
    assert (row["window_start_ns"], row["window_end_ns"]) == (100, 10600)
    assert (row["window_ns"], row["busy_ns"], row["idle_ns"]) == (1000, 700, 300)
    s = summary(ov, step_spans(ev), gaps(gpu, host_events(ev)), ranks).row(0, named=True)
    assert (s["steps"], s["span_ns"], s["idle_ns"], s["idle_fraction"]) == (2, 1000, 300, 0.3)


def test_the_last_step_of_a_window_ends_with_its_own_work() -> None:
    ev = _two_windows()
    b = step_breakdown(prepared_gpu(ev), step_spans(ev), ranks_present(ev)).filter(pl.col("step").is_not_null())
    assert b.select("step", "window_start_ns", "window_end_ns", "idle_ns").rows() == [
        (1, 100, 600, 100), (5, 10100, 10600, 200)]
