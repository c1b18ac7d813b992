"""Straggler detection: hand-built traces, a real slowed gloo run, synthetic ground truth."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.analyses.collective_match import comm_events, match_collectives
from traceview.analyses.collectives import collective_ranks
from traceview.analyses.stragglers import stragglers
from traceview.analyses.window import ranks_present, step_spans
from traceview.schema import events_frame

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "fixtures" / "data"
MS = 1_000_000


def stragglers_of(ev: pl.DataFrame) -> pl.DataFrame:
    """Stragglers of ``ev`` on raw clocks (the hand-built traces share one clock)."""
    per = collective_ranks(match_collectives(comm_events(ev)))
    return stragglers(per, step_spans(ev), ranks_present(ev))


def step(rank: int, n: int, ts: int, dur: int) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="user_annotation",
                name=f"ProfilerStep#{n}", ts_ns=ts, dur_ns=dur)


def ker(rank: int, ts: int, dur: int) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="kernel", name=AR, device=rank,
                stream=7, ts_ns=ts, dur_ns=dur)


def trace(late: dict[int, int]) -> list[dict]:
    """3 ranks, 8 steps of 100 ms, one all-reduce per step ending at t + 60 ms.

    Ranks arrive at t + 20 ms + their per-step lateness ``late[(rank, step)]`` (in us)."""
    rows = []
    for s in range(8):
        t = s * 100 * MS
        for r in range(3):
            arr = t + 20 * MS + late.get((r, s), 0) * 1000
            rows += [step(r, s, t, 100 * MS), ker(r, arr, t + 60 * MS - arr)]
    return rows


def test_slow_rank_flagged_with_hand_derived_numbers() -> None:
    # Rank 2 arrives 10 ms late at 7 of 8 steps; at step 3 rank 0 is 1 ms late instead.
    # Rank 1 jitters 0.2 ms at even steps.
    late = {(2, s): 10_000 for s in range(8) if s != 3}
    late[(0, 3)] = 1_000
    late.update({(1, s): 200 for s in range(0, 8, 2)})
    res = stragglers_of(events_frame(trace(late)))
    assert res.get_column("rank").to_list()[0] == 2      # sorted by imposed wait
    r2 = res.row(0, named=True)
    assert r2["flagged"]
    # last at 7 instances; lateness behind the second-to-last arrival: 10 ms - 0.2 ms at even
    # steps (0, 2, 4, 6) and 10 ms at odd steps 1, 5, 7 -> 4 * 9.8 + 3 * 10 = 69.2 ms
    assert r2["last_arrivals"] == 7
    assert r2["imposed_wait_ns"] == 69_200_000
    assert r2["imposed_wait_per_step_ns"] == 69_200_000 // 8
    # floor for a "clear" last arrival = max(50 us, 1% of 100 ms = 1 ms): step 3 (rank 0 by
    # exactly 1 ms) is not clear, so 7 clear instances, all rank 2's.
    assert (r2["significant_last_arrivals"], r2["significant_instances"]) == (7, 7)
    assert "rank 2 arrived last at 7 of 7" in r2["explanation"]
    assert "8.7 ms per step" in r2["explanation"]
    # nobody else is flagged
    assert res.filter(pl.col("flagged")).height == 1
    # compute before collectives: rank 2's first gap is 20 ms + 10 ms, later gaps 40+10 ms...
    assert r2["compute_ratio"] > 1.0


def test_balanced_run_flags_nobody() -> None:
    # Who is last rotates; lateness 0.3 ms, far below 5% of the step time.
    late = {(s % 3, s): 300 for s in range(8)}
    res = stragglers_of(events_frame(trace(late)))
    assert not res.get_column("flagged").any()
    assert all(e.startswith("not flagged") for e in res.get_column("explanation"))


def test_persistent_but_tiny_is_not_flagged() -> None:
    # Rank 1 always last but by 2 ms per 100 ms step (2% < 5% effect size).
    late = {(1, s): 2_000 for s in range(8)}
    res = stragglers_of(events_frame(trace(late)))
    assert not res.get_column("flagged").any()
    assert "effect below 5%" in res.filter(pl.col("rank") == 1).get_column("explanation")[0]


def test_no_collectives_partial_result() -> None:
    ev = events_frame([step(0, 0, 0, 10), step(1, 0, 0, 10)])
    res = stragglers_of(ev)
    assert res.height == 2 and not res.get_column("flagged").any()
    assert "no collective was matched" in res.get_column("explanation")[0]


# --- (a) a real gloo run with a rank slowed on purpose --------------------------------------

def _analyse(path: Path) -> tuple[pl.DataFrame, object]:
    import traceview

    run = traceview.open(path, cache=False)  # clocks aligned, hosts from the ranks table
    return run.stragglers()["ranks"], run


def test_real_gloo_run_slow_rank_flagged(tmp_path: Path) -> None:
    """Runs fixtures/gloo_ddp.py for real: 2 ranks, 4 steps; rank 1 sleeps 30 ms per step
    before backward. (The balanced case uses the committed run below, to keep CI fast.)"""
    pytest.importorskip("torch")
    from fixtures import gloo_ddp

    gloo_ddp.run(tmp_path / "slow", world_size=2, steps=4, slow_rank=1, delay_ms=30, seed=2)
    res, _ = _analyse(tmp_path / "slow")
    top = res.row(0, named=True)
    assert top["rank"] == 1 and top["flagged"]
    # it held rank 0 for about the injected 30 ms per step (sleep + scheduling noise)
    assert 20 * MS <= top["imposed_wait_per_step_ns"] <= 45 * MS
    assert not res.row(1, named=True)["flagged"]


def test_committed_gloo_fixtures() -> None:
    """Committed real runs: rank 1 slowed by 30 ms (flagged) and the same job without delay
    (nobody flagged)."""
    if not (DATA / "gloo_ddp_2r_slow1").is_dir():
        pytest.skip("fixture data missing")
    res, _ = _analyse(DATA / "gloo_ddp_2r_slow1")
    assert res.row(0, named=True)["rank"] == 1 and res.row(0, named=True)["flagged"]
    res, _ = _analyse(DATA / "gloo_ddp_2r")
    assert not res.get_column("flagged").any()


# --- (c) synthetic GPU traces: slow rank with clock offsets of seconds ----------------------

def test_synthetic_slow_rank(tmp_path: Path) -> None:
    import traceview
    from fixtures.synthetic import SyntheticSpec, generate

    gt = generate(SyntheticSpec(world_size=4, steps=4, seed=9, slow_rank=2,
                                slow_extra_ns=3_000_000), tmp_path)
    run = traceview.open(tmp_path, cache=False)
    # unaligned: clocks seconds apart, the answer is meaningless
    raw = run.select(align="none").stragglers()["ranks"]
    res = run.stragglers()["ranks"]
    flagged = res.filter(pl.col("flagged")).get_column("rank").to_list()
    assert flagged == [gt.slow_rank]
    # imposed wait per step ~ the extra 3 ms the slow rank spends per step
    top = res.row(0, named=True)
    assert 2_500_000 <= top["imposed_wait_per_step_ns"] <= 3_500_000
    # without alignment the same data point elsewhere (or nowhere): alignment matters here
    assert raw.row(0, named=True)["rank"] != gt.slow_rank or not raw.row(0, named=True)["flagged"]


def test_cli_stragglers_json_sorted(capsys: pytest.CaptureFixture[str]) -> None:
    import orjson

    from traceview.cli import main

    src = DATA / "gloo_ddp_2r_slow1"
    if not src.is_dir():
        pytest.skip("fixture data missing")
    assert main(["stragglers", str(src), "--json", "--no-cache"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    ranks = out["ranks"]
    for field in ("rank", "flagged", "imposed_wait_ns", "last_arrivals", "explanation"):
        assert all(field in r for r in ranks)
    waits = [r["imposed_wait_ns"] for r in ranks]
    assert waits == sorted(waits, reverse=True)
    assert ranks[0]["rank"] == 1 and ranks[0]["flagged"]
    assert main(["stragglers", str(src), "--no-cache"]) == 0
    assert "STRAGGLER: rank 1" in capsys.readouterr().out


def test_confidence_of_a_long_run_does_not_overflow() -> None:
    """2,000 steps give thousands of instances: comb(n, i) passes a float's range, the
    log-space tail does not (last in 5,000 of 6,000 with 8 ranks is no chance)."""
    from traceview.analyses.stragglers import _binomial_tail, _confidence, _consistency

    assert _binomial_tail(3, 5, 0.5) == pytest.approx(0.5)  # (10 + 5 + 1) / 32
    assert _consistency(5000, 6000, 8) == 1.0
    assert _confidence(True, 1.0, 6000) == "high"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 30), st.integers(-5, 5), max_size=12))
def test_median_of_the_others_matches_the_median_of_a_new_list(values) -> None:
    # one sort for every rank's "median of the other ranks" (ties and one-rank runs included)
    from traceview.analyses.stragglers import _median, _OthersMedian

    others = _OthersMedian(values)
    for key in [*values, 99]:
        assert others(key) == _median([v for q, v in values.items() if q != key])
