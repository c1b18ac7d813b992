"""Interval algebra (analyses/intervals.py): hand-derived cases and Hypothesis invariants.

The oracle for the property tests is the obvious one: on small integer timelines, the set of
covered unit cells [t, t+1) computed with Python sets.
"""

from __future__ import annotations

from unittest import mock

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.analyses import intervals
from traceview.analyses.intervals import (
    clip, complement, has_bit, mask_lengths, overlapping, segment_lengths, sweep, total_length,
    union, windowed_mask_lengths, windowed_sweep, windows_disjoint,
)


def _frame(ivs: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({"g": [g for g, _, _ in ivs], "ts_ns": [s for _, s, _ in ivs],
                         "end_ns": [e for _, _, e in ivs]},
                        schema={"g": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})


def _cells(ivs, g=None) -> set[int]:
    return {t for gg, s, e in ivs if g is None or gg == g for t in range(s, e)}


def test_union_by_hand() -> None:
    # [0,10) and [5,12) merge; [12,15) touches and merges; [20,30) is separate; group 1 alone
    f = _frame([(0, 0, 10), (0, 5, 12), (0, 12, 15), (0, 20, 30), (1, 3, 4)])
    assert union(f, by=["g"]).rows() == [(0, 0, 15), (0, 20, 30), (1, 3, 4)]
    assert total_length(union(f, by=["g"]), by=["g"]).rows() == [(0, 25), (1, 1)]


def test_nested_and_unsorted_input() -> None:
    f = _frame([(0, 20, 25), (0, 0, 100), (0, 50, 60)])  # everything inside [0,100)
    assert union(f, by=["g"]).rows() == [(0, 0, 100)]


def test_complement_with_bounds_by_hand() -> None:
    merged = union(_frame([(0, 10, 20), (0, 30, 40)]), by=["g"])
    assert complement(merged, by=["g"]).rows() == [(0, 20, 30)]
    bounds = pl.DataFrame({"g": [0, 1], "window_start_ns": [0, 0], "window_end_ns": [35, 7]})
    # leading [0,10), inner [20,30), interval clipped at 35 so no trailing gap; empty group 1
    assert complement(merged, by=["g"], bounds=bounds).rows() == [
        (0, 0, 10), (0, 20, 30), (1, 0, 7)]


def test_sweep_overlap_by_hand() -> None:
    # compute [0,10) [20,30); comm [5,25): overlap = [5,10)+[20,25) = 10; busy = 30
    comp = _frame([(0, 0, 10), (0, 20, 30)])
    comm = _frame([(0, 5, 25)])
    seg = sweep({"compute": comp, "comm": comm}, by=["g"])
    out = segment_lengths(seg, {
        "compute": has_bit(0), "comm": has_bit(1), "both": has_bit(0) & has_bit(1),
        "busy": pl.col("mask") > 0}, by=["g"])
    assert out.rows() == [(0, 20, 20, 10, 30)]


def test_clip_to_windows_by_hand() -> None:
    f = _frame([(0, 0, 10), (0, 5, 12), (0, 20, 30), (1, 3, 8)])
    w = pl.DataFrame({"g": [0, 0, 1], "step": [1, 2, 1], "window_start_ns": [0, 11, 0],
                      "window_end_ns": [11, 25, 5]})
    got = clip(f, w, by=["g"], window_keys=["step"]).sort("g", "ts_ns")
    assert got.select("g", "ts_ns", "end_ns", "step").rows() == [
        (0, 0, 10, 1), (0, 5, 11, 1), (0, 11, 12, 2), (0, 20, 25, 2), (1, 3, 5, 1)]


_iv = st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 15)).map(
    lambda t: (t[0], t[1], t[1] + t[2]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_iv, max_size=25))
def test_union_matches_cell_oracle(ivs) -> None:
    merged = union(_frame(ivs), by=["g"])
    for g in range(3):
        rows = merged.filter(pl.col("g") == g)
        got = {t for s, e in zip(rows["ts_ns"], rows["end_ns"]) for t in range(s, e)}
        assert got == _cells(ivs, g)
        # merged intervals are disjoint and not touching, and union <= sum of durations
        starts, ends = rows["ts_ns"].to_list(), rows["end_ns"].to_list()
        assert all(starts[i + 1] > ends[i] for i in range(len(starts) - 1))
        assert sum(e - s for e, s in zip(ends, starts)) <= sum(
            e - s for gg, s, e in ivs if gg == g)


@settings(max_examples=60, deadline=None)
@given(st.lists(_iv, max_size=25))
def test_busy_plus_gaps_is_span(ivs) -> None:
    merged = union(_frame(ivs), by=["g"])
    gaps = complement(merged, by=["g"])
    assert (gaps["gap_end_ns"] - gaps["gap_start_ns"] > 0).all()  # gaps >= 0 (strictly)
    for g in range(3):
        m = merged.filter(pl.col("g") == g)
        if m.height == 0:
            continue
        busy = int((m["end_ns"] - m["ts_ns"]).sum())
        gp = gaps.filter(pl.col("g") == g)
        idle = int((gp["gap_end_ns"] - gp["gap_start_ns"]).sum())
        assert busy + idle == int(m["end_ns"].max()) - int(m["ts_ns"].min())


@settings(max_examples=60, deadline=None)
@given(st.lists(_iv, max_size=15), st.lists(_iv, max_size=15))
def test_sweep_overlap_invariants(a, b) -> None:
    ua, ub = union(_frame(a), by=["g"]), union(_frame(b), by=["g"])
    seg = sweep({"a": ua, "b": ub}, by=["g"])
    out = segment_lengths(seg, {"a": has_bit(0), "b": has_bit(1),
                                "ab": has_bit(0) & has_bit(1), "busy": pl.col("mask") > 0},
                          by=["g"])
    for g, la, lb, lab, busy in out.rows():
        ca, cb = _cells(a, g), _cells(b, g)
        assert (la, lb, lab, busy) == (len(ca), len(cb), len(ca & cb), len(ca | cb))
        assert lab <= min(la, lb)
        assert busy == la + lb - lab


@settings(max_examples=40, deadline=None)
@given(st.lists(_iv, max_size=20), st.lists(st.integers(1, 30), min_size=1, max_size=5))
def test_clip_to_tiling_windows_preserves_time(ivs, widths) -> None:
    # windows tile [0, W) for every group; clipping then summing equals the cells inside [0, W)
    edges = [0]
    for w in widths:
        edges.append(edges[-1] + w)
    win = pl.DataFrame({
        "g": [g for g in range(3) for _ in widths],
        "step": [i for _ in range(3) for i in range(len(widths))],
        "window_start_ns": [edges[i] for _ in range(3) for i in range(len(widths))],
        "window_end_ns": [edges[i + 1] for _ in range(3) for i in range(len(widths))],
    })
    got = clip(_frame(ivs), win, by=["g"], window_keys=["step"])
    for g in range(3):
        rows = got.filter(pl.col("g") == g)
        cells: list[int] = []
        for s, e, k in zip(rows["ts_ns"], rows["end_ns"], rows["step"]):
            assert edges[k] <= s < e <= edges[k + 1]
            cells += range(s, e)
        want = sorted(t for gg, s, e in ivs if gg == g for t in range(s, e) if t < edges[-1])
        assert sorted(cells) == want


def test_windowed_sweep_by_hand() -> None:
    # set a: [0,10) [20,30); set b: [5,25); windows [0,8) and [8,22) on group 0, [0,4) on 1
    f = pl.DataFrame({"g": [0, 0, 0, 1], "ts_ns": [0, 20, 5, 1], "end_ns": [10, 30, 25, 9],
                      "s": ["a", "a", "b", "b"]})
    w = pl.DataFrame({"g": [0, 0, 1], "step": [1, 2, 1], "window_start_ns": [0, 8, 0],
                      "window_end_ns": [8, 22, 4]})
    seg = windowed_sweep(f, w, {"a": pl.col("s") == "a", "b": pl.col("s") == "b"},
                         by=["g"], window_keys=["step"])
    assert seg.rows() == [
        (0, 1, 0, 5, 1), (0, 1, 5, 8, 3),                    # a alone, then a and b
        (0, 2, 8, 10, 3), (0, 2, 10, 20, 2), (0, 2, 20, 22, 3),
        (1, 1, 1, 4, 2)]                                     # clipped at the window's end
    assert windows_disjoint(w, by=["g"])
    assert not windows_disjoint(w.with_columns(pl.lit(0).alias("g")), by=["g"])


_labelled = st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 15),
                      st.integers(0, 2)).map(lambda t: (t[0], t[1], t[1] + t[2], t[3]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_labelled, max_size=30),
       st.lists(st.tuples(st.integers(0, 20), st.integers(0, 25)), min_size=1, max_size=5))
def test_windowed_sweep_equals_clip_union_sweep(ivs, gaps_and_widths) -> None:
    # disjoint windows with gaps between them (some empty), the same on every group
    edges, t = [], 0
    for gap, width in gaps_and_widths:
        edges.append((t + gap, t + gap + width))
        t += gap + width
    win = pl.DataFrame({
        "g": [g for g in range(3) for _ in edges], "step": [i for _ in range(3)
                                                             for i in range(len(edges))],
        "window_start_ns": [lo for _ in range(3) for lo, _ in edges],
        "window_end_ns": [hi for _ in range(3) for _, hi in edges]})
    f = pl.DataFrame({"g": [i[0] for i in ivs], "ts_ns": [i[1] for i in ivs],
                      "end_ns": [i[2] for i in ivs], "s": [i[3] for i in ivs]},
                     schema={"g": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "s": pl.Int64})
    sets = {k: pl.col("s") == k for k in range(3)}
    keys = ["g", "step"]
    labels = {"s0": has_bit(0), "s1": has_bit(1), "s01": has_bit(0) & has_bit(1),
              "busy": pl.col("mask") > 0, "s2_alone": has_bit(2) & ~has_bit(0) & ~has_bit(1)}
    got = segment_lengths(windowed_sweep(f, win, sets, by=["g"], window_keys=["step"]),
                          labels, by=keys)
    cut = clip(f, win, by=["g"], window_keys=["step"])
    want = segment_lengths(sweep({k: union(cut.filter(c), by=keys) for k, c in sets.items()},
                                 by=keys), labels, by=keys)
    assert got.equals(want)
    # several window sets in one sweep: the steps, and one window over everything
    whole = pl.DataFrame({"g": [0, 1, 2], "window_start_ns": [-5] * 3,
                          "window_end_ns": [200] * 3})
    per_step, per_group = windowed_mask_lengths(f, [(win, ["step"]), (whole, [])], sets,
                                                by=["g"])
    assert mask_lengths(per_step, labels, by=keys).equals(want)
    alone = windowed_mask_lengths(f, [(whole, [])], sets, by=["g"])[0]
    assert mask_lengths(per_group, labels, by=["g"]).equals(mask_lengths(alone, labels, by=["g"]))
    assert mask_lengths(per_group, labels, by=["g"]).equals(segment_lengths(
        sweep({k: union(f.filter(c), by=["g"]) for k, c in sets.items()}, by=["g"]), labels,
        by=["g"]))
    for g, step, s0, *_ in got.rows():  # and against the cell oracle
        lo, hi = edges[step]
        assert s0 == len({c for gg, s, e, k in ivs if gg == g and k == 0
                          for c in range(s, e) if lo <= c < hi})


@pytest.mark.parametrize("few", [32, 0])  # intervals compared one by one, or as-of joined
@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_iv, max_size=25), others=st.lists(_iv, max_size=8))
def test_overlapping_matches_pairwise_check(few, rows, others) -> None:
    f = _frame(rows).with_row_index("i")
    with mock.patch.object(intervals, "_FEW_INTERVALS", few):
        spans = union(_frame(others), by=["g"])
        got = overlapping(f, spans, by=["g"])
    # The oracle checks each row against the merged spans it is given: merging touching
    # intervals ([43,58) and [58,59) -> [43,59)) makes an empty row at 58 overlap the span,
    # though it overlaps neither original interval (a case Hypothesis found).
    merged = spans.select("g", "ts_ns", "end_ns").rows()
    want = [i for i, (g, s, e) in enumerate(rows)
            if any(gg == g and s < oe and e > os for gg, os, oe in merged)]
    assert got.get_column("i").to_list() == want  # and in the input order
