"""Window selection (analyses/window.py) and the per-rank summary (analyses/summary.py) on the
hand-built two-step trace of gpu_trace_helpers (numbers derived by hand)."""

from __future__ import annotations

import polars as pl
import pytest

from gpu_trace_helpers import two_step_trace
from traceview.analyses.overlap import overlap
from traceview.analyses.summary import summary
from traceview.run import Run
from traceview.analyses.window import Window, gpu_step_windows, select, step_spans


def _rank0(df: pl.DataFrame) -> dict:
    return df.filter(pl.col("rank") == 0).row(0, named=True)


def test_ranks_and_steps() -> None:
    ev = two_step_trace()
    assert select(ev, Window(ranks=[1])).collect()["rank"].unique().to_list() == [1]
    only2 = select(ev, Window(steps=(2, 3))).collect()
    assert only2["step"].unique().to_list() == [2]
    r = _rank0(overlap(only2))
    assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"]) == (40, 20, 10)


def test_skip_warmup_only_when_asked() -> None:
    ev = two_step_trace()
    assert select(ev, Window()).collect().height == ev.height
    kept = select(ev, Window(skip_warmup=1)).collect()
    assert kept.filter(pl.col("rank") == 0)["step"].unique().to_list() == [2]
    assert kept.filter(pl.col("rank") == 1).height == 1  # no steps: nothing to skip
    assert select(ev, Window(skip_warmup=2)).collect().filter(pl.col("rank") == 0).height == 0


def test_time_window_clips() -> None:
    # [20,45) ns after the first event (ts 0): sgemm [10,40) -> [20,40), nccl [30,60) -> [30,45)
    r = _rank0(overlap(select(two_step_trace(), Window(time_ns=(20, 45)))))
    assert (r["window_ns"], r["compute_ns"], r["comm_ns"], r["overlap_ns"]) == (25, 20, 15, 10)


def test_step_windows_by_hand() -> None:
    spans = step_spans(two_step_trace())
    assert spans.select("rank", "step", "step_time_ns").rows() == [(0, 1, 100), (0, 2, 100)]
    from traceview.analyses.overlap import prepared_gpu
    w = gpu_step_windows(prepared_gpu(two_step_trace()))
    assert w.select("step", "window_start_ns", "window_end_ns").rows() == [
        (1, 10, 110), (2, 110, 160)]


def test_summary_by_hand() -> None:
    s = summary(two_step_trace())
    r = _rank0(s)
    assert (r["steps"], r["step_time_ns_p50"]) == (2, 100)
    assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"], r["exposed_comm_ns"]) == (
        90, 50, 30, 20)
    assert r["hidden_fraction"] == pytest.approx(0.6)
    assert r["idle_fraction"] == pytest.approx(35 / 150)
    # device gaps: [70,75) queued, 5 ns -> launch_overhead; [80,110) step 1 -> 2: between_steps
    assert (r["top_gap_cause"], r["top_gap_cause_ns"]) == ("between_steps", 30)
    r1 = s.filter(pl.col("rank") == 1).row(0, named=True)
    assert "no GPU events" in r1["note"] and r1["compute_ns"] is None


def test_worst_straggler_states_a_reason() -> None:
    one_rank = Run.from_events(two_step_trace().filter(pl.col("rank") == 0))
    single = one_rank.summary()["worst_straggler"]
    assert single["rank"] is None and "single rank" in single["reason"]
    both = Run.from_events(two_step_trace()).summary()["worst_straggler"]
    assert "rank" in both and (both["rank"] is not None or both["reason"])


def test_ranks_present_is_read_once_for_a_remembered_frame(tmp_path) -> None:
    from traceview.analyses import window

    path = tmp_path / "events.parquet"
    pl.DataFrame({"rank": [3, 1, 3, 0], "ts_ns": [1, 2, 3, 4]}).write_parquet(path)
    lazy = pl.scan_parquet(path)
    assert window.ranks_present(lazy).get_column("rank").to_list() == [0, 1, 3]
    assert window.ranks_present(lazy) is not window.ranks_present(lazy)  # not remembered
    assert window.remember_ranks(lazy) is lazy
    first = window.ranks_present(lazy)
    assert window.ranks_present(lazy) is first and first.get_column("rank").to_list() == [0, 1, 3]
    assert window.ranks_present(lazy.filter(pl.col("rank") > 0)).height == 2  # another plan
    held = len(window._REMEMBERED_RANKS)
    del lazy
    assert len(window._REMEMBERED_RANKS) == held - 1  # forgotten with its frame
