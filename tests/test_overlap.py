"""Compute/communication overlap (analyses/overlap.py) on a hand-built trace.

See tests/gpu_trace_helpers.two_step_trace for the timeline; numbers below are derived by hand.
"""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_trace_helpers import frame, kernel, row, two_step_trace
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


def test_bound_is_the_largest_share_and_idle_is_a_bound() -> None:
    """One rule (``bound_of``) from the shares of the window, which add up to it.

    * sgemm [0,10) and [90,100): window 100, compute 20, idle 80 -> ``idle`` (0.8 >= 1.2 x 0.2);
    * NCCL [0,50), sgemm [50,60) and [99,100): comm 50, compute 11, idle 39 -> ``comm-bound``
      (0.5 >= 1.2 x 0.39);
    * sgemm [0,40) and [99,100), copy [40,60): compute 41, copy 20, idle 39 -> ``balanced``
      (41 < 1.2 x 39); sgemm [0,40), copy [40,100): copy 60 -> ``copy-bound``.
    """
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    idle = _get(_overlap(frame([kernel("sgemm", 0, 10), kernel("sgemm", 90, 10)])), rank=0)
    assert (idle["bound"], idle["bound_share"]) == ("idle", pytest.approx(0.8))
    comm = _get(_overlap(frame([kernel(nccl, 0, 50, stream=20), kernel("sgemm", 50, 10),
                                kernel("sgemm", 99, 1)])), rank=0)
    assert comm["bound"] == "comm-bound"
    copy = "Memcpy HtoD (Pinned -> Device)"
    even = _get(_overlap(frame([kernel("sgemm", 0, 40), row("memcpy", copy, 40, 20),
                                kernel("sgemm", 99, 1)])), rank=0)
    assert even["bound"] == "balanced"
    copied = _get(_overlap(frame([kernel("sgemm", 0, 40), row("memcpy", copy, 40, 60)])),
                  rank=0)
    assert (copied["bound"], copied["bound_share"]) == ("copy-bound", pytest.approx(0.6))


def test_bound_of_ties_and_empty() -> None:
    from traceview.analyses.overlap import bound_of

    assert bound_of({"compute": 0.49, "host": 0.43, "idle": 0.08}) == "balanced"
    assert bound_of({"compute": 0.13, "host": 0.86}) == "host"
    assert bound_of({"compute": 0.0, "idle": 0.0}) is None
    assert bound_of({"communication": 0.5, "compute": 0.5}) == "balanced"
    assert bound_of({"idle": 0.6, "compute": 0.4}, ratio=2.0) == "balanced"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50), st.sampled_from(
    ["sgemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy"])), min_size=1, max_size=12))
def test_bound_agrees_with_the_shares(spec) -> None:
    """On random traces the bound names the largest of compute, exposed comm, exposed copy and
    idle (they add up to the window), or says balanced when the next is within 1.2x."""
    rows = [row("memcpy", "Memcpy DtoD (Device -> Device)", t, d) if n == "Memcpy"
            else kernel(n, t, d, stream=20 if n.startswith("nccl") else 7) for t, d, n in spec]
    r = _get(_overlap(frame(rows)), rank=0)
    parts = {"compute-bound": r["compute_ns"], "comm-bound": r["exposed_comm_ns"],
             "copy-bound": r["exposed_memcpy_ns"] + r["exposed_memset_ns"], "idle": r["idle_ns"]}
    assert sum(parts.values()) == r["window_ns"]
    ranked = sorted(parts.values(), reverse=True)
    if ranked[0] >= 1.2 * ranked[1]:
        assert parts[r["bound"]] == ranked[0]
    else:
        assert r["bound"] == "balanced"
    assert r["bound_share"] == pytest.approx(ranked[0] / r["window_ns"])
