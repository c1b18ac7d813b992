"""Window selection (analyses/window.py) and the per-rank summary (analyses/summary.py) on the
hand-built two-step trace of gpu_trace_helpers (numbers derived by hand)."""

from __future__ import annotations

import polars as pl
import pytest

from gpu_trace_helpers import two_step_trace
from traceview.analyses.gaps import gaps
from traceview.analyses.host import host_events
from traceview.analyses.overlap import overlap, prepared_gpu
from traceview.analyses.summary import summary
from traceview.analyses.window import (
    Window, gpu_step_windows, ranks_present, select, step_spans,
)
from traceview.run.run import Run


def _rank0(df: pl.DataFrame) -> dict:
    return df.filter(pl.col("rank") == 0).row(0, named=True)


def _overlap(ev) -> pl.DataFrame:
    """Whole-trace ``overlap`` on the GPU table and the ranks of the events ``ev``."""
    return overlap(prepared_gpu(ev), ranks_present(ev))


def test_ranks_and_steps() -> None:
    ev = two_step_trace()
    assert select(ev, Window(ranks=[1])).collect()["rank"].unique().to_list() == [1]
    only2 = select(ev, Window(steps=(2, 3))).collect()
    assert only2["step"].unique().to_list() == [2]
    r = _rank0(_overlap(only2))
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
    r = _rank0(_overlap(select(two_step_trace(), Window(time_ns=(20, 45)))))
    assert (r["window_ns"], r["compute_ns"], r["comm_ns"], r["overlap_ns"]) == (25, 20, 15, 10)


def test_step_windows_by_hand() -> None:
    spans = step_spans(two_step_trace())
    assert spans.select("rank", "step", "step_time_ns").rows() == [(0, 1, 100), (0, 2, 100)]
    w = gpu_step_windows(prepared_gpu(two_step_trace()))
    assert w.select("step", "window_start_ns", "window_end_ns").rows() == [
        (1, 10, 110), (2, 110, 160)]


def test_summary_by_hand() -> None:
    ev = two_step_trace()
    gpu, ranks = prepared_gpu(ev), ranks_present(ev)
    s = summary(overlap(gpu, ranks), step_spans(ev), gaps(gpu, host_events(ev)), ranks)
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


def test_run_computes_ranks_present_once(monkeypatch) -> None:
    from traceview.analyses import collective_match, flops, memory, window
    from traceview.run import run as run_module

    ev = pl.concat([two_step_trace(), two_step_trace().with_columns(rank=pl.lit(3, pl.Int32))],
                   how="vertical_relaxed")
    want = window.ranks_present(ev).get_column("rank").to_list()
    assert want == [0, 1, 3]
    calls, uncounted = [], window.ranks_present

    def counted(events):
        calls.append(events)
        return uncounted(events)

    # every module that calls it by name (imports are at module level) counts
    for module in (window, run_module, collective_match, flops, memory):
        monkeypatch.setattr(module, "ranks_present", counted)
    run = Run.from_events(ev)
    assert run.ranks_present == want
    assert run.ranks_table.get_column("rank").to_list() == want
    run.summary(), run.overlap(per_step=True), run.gaps(), run.breakdown()
    assert run.ranks_present is run.ranks_present
    assert len(calls) == 1  # once for the Run, whatever the analyses asked
