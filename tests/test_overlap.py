"""Compute/communication overlap (analyses/overlap.py) on a hand-built trace.

See tests/gpu_trace_helpers.two_step_trace for the timeline; numbers below are derived by hand.
"""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_trace_helpers import frame, kernel, two_step_trace
from traceview.analyses.overlap import NOTE_NO_GPU, NOTE_NO_STEPS, overlap, prepared_gpu
from traceview.analyses.window import ranks_present


def _overlap(ev, **options) -> pl.DataFrame:
    """``overlap`` on the GPU table and the ranks of the events ``ev``."""
    return overlap(prepared_gpu(ev), ranks_present(ev), **options)


def _get(df: pl.DataFrame, **keys) -> dict:
    sel = df
    for k, v in keys.items():
        sel = sel.filter(pl.col(k).is_null() if v is None else pl.col(k) == v)
    assert sel.height == 1, sel
    return sel.row(0, named=True)


def test_whole_trace_by_hand() -> None:
    r = _get(_overlap(two_step_trace()), rank=0)
    # window [10,160) = 150; C = [10,40)+[50,70)+[110,150) = 90; M = [30,60)+[140,160) = 50
    # C∩M = [30,40)+[50,60)+[140,150) = 30; busy = [10,70)+[75,80)+[110,160) = 115
    assert (r["window_ns"], r["compute_ns"], r["comm_ns"], r["overlap_ns"]) == (150, 90, 50, 30)
    assert (r["exposed_comm_ns"], r["busy_ns"], r["idle_ns"]) == (20, 115, 35)
    assert (r["memcpy_ns"], r["exposed_memcpy_ns"]) == (5, 5)
    assert r["hidden_fraction"] == pytest.approx(30 / 50)
    # (C + M - |C∪M|) / (C + M - max) = (140 - 110) / (140 - 90)
    assert r["overlap_efficiency"] == pytest.approx(30 / 50)
    assert r["bound"] == "compute-bound"  # 90 > 1.2 * 50


def test_per_step_by_hand() -> None:
    df = _overlap(two_step_trace(), per_step=True)
    s1, s2 = _get(df, rank=0, step=1), _get(df, rank=0, step=2)
    # step 1 window = [10, 110) (up to step 2's first GPU start)
    assert (s1["window_start_ns"], s1["window_end_ns"]) == (10, 110)
    assert (s1["compute_ns"], s1["comm_ns"], s1["overlap_ns"], s1["exposed_comm_ns"]) == (
        50, 30, 20, 10)
    assert (s1["busy_ns"], s1["idle_ns"]) == (65, 35)
    assert s1["overlap_efficiency"] == pytest.approx(20 / 30)
    # step 2 window = [110, 160): compute 40, comm 20, overlap [140,150) = 10
    assert (s2["window_ns"], s2["compute_ns"], s2["comm_ns"], s2["overlap_ns"]) == (50, 40, 20, 10)
    assert s2["hidden_fraction"] == pytest.approx(0.5)
    assert s2["idle_ns"] == 0
    # per-step windows tile the whole-trace window: sums agree
    whole = _get(_overlap(two_step_trace()), rank=0)
    for col in ("compute_ns", "comm_ns", "overlap_ns", "busy_ns", "idle_ns", "window_ns"):
        assert s1[col] + s2[col] == whole[col]


def test_cpu_only_rank_gets_a_row_with_a_reason() -> None:
    r = _get(_overlap(two_step_trace()), rank=1)
    assert r["note"] == NOTE_NO_GPU and r["compute_ns"] is None


def test_steps_from_launch_correlation_when_store_left_step_empty() -> None:
    ev = two_step_trace().with_columns(
        step=pl.when(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy"]))
        .then(None).otherwise(pl.col("step")))
    a = _overlap(ev, per_step=True).filter(pl.col("rank") == 0)
    b = _overlap(two_step_trace(), per_step=True).filter(pl.col("rank") == 0)
    assert a.equals(b)


def test_no_steps_and_no_comm() -> None:
    ev = frame([kernel("a", 0, 10), kernel("b", 20, 10)])
    r = _get(_overlap(ev, per_step=True), rank=0)
    assert NOTE_NO_STEPS in r["note"] and "no communication" in r["note"]
    assert (r["compute_ns"], r["idle_ns"], r["hidden_fraction"], r["overlap_efficiency"]) == (
        20, 10, None, None)


def test_empty_input_gives_empty_result() -> None:
    ev = frame([]).head(0)
    assert _overlap(ev).height == 0


_k = st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 500), st.integers(0, 80))


@settings(max_examples=25, deadline=None)
@given(st.lists(_k, min_size=1, max_size=30))
def test_invariants(ks) -> None:
    rows = [kernel("ncclKernel" if comm else "gemm", ts, dur, stream=s, step=ts // 200)
            for comm, s, ts, dur in ks]
    for per_step in (False, True):
        df = _overlap(frame(rows), per_step=per_step)
        for r in df.iter_rows(named=True):
            assert r["overlap_ns"] <= min(r["compute_ns"], r["comm_ns"])
            assert r["busy_ns"] + r["idle_ns"] == r["window_ns"]
            assert r["idle_ns"] >= 0 and r["exposed_comm_ns"] >= 0
            assert r["exposed_comm_ns"] == r["comm_ns"] - r["overlap_ns"]
            if r["hidden_fraction"] is not None:
                assert 0 <= r["hidden_fraction"] <= 1
            if r["overlap_efficiency"] is not None:
                assert 0 <= r["overlap_efficiency"] <= 1 + 1e-12
