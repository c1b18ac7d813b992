"""Verdicts that survive noise (issue 10, items 1 and 3), each rule on a hand-drawn run."""

from __future__ import annotations

import json

import polars as pl

from traceview.analyses.collective_match import comm_events, match_collectives, robust_tolerance
from traceview.analyses.collectives import collective_ranks
from traceview.analyses.stragglers import stragglers
from traceview.analyses.window import ranks_present, step_spans
from traceview.schema import events_frame

from tests.test_stragglers import MS, ker, step
from tests.test_stragglers import stragglers_of as _stragglers
from tests.test_stragglers import trace as straggler_rows


def trace(late: dict[tuple[int, int], int]) -> pl.DataFrame:
    """The stragglers tests' timeline (3 ranks, 8 steps of 100 ms, an all-reduce ending at
    t + 60 ms; rank r arrives at t + 20 ms + late[(r, step)] us), as a frame."""
    return events_frame(straggler_rows(late))

def gloo(rank: int, ts: int, end: int, nbytes: int) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="user_annotation",
                name="gloo:all_reduce", tid=100, ts_ns=ts, dur_ns=end - ts, bytes=nbytes)


# --- matching: tolerance learnt from the run's residuals ------------------------------------

def test_tolerance_learnt_from_residuals_accepts_noisy_order() -> None:
    # 2 ranks, 6 all-reduces 100 ms apart. Rank 1's completions differ from rank 0's by
    # +2, -2, +2, -2, +2, -2 ms (a busy node): beyond the old fixed 500 us, far below the
    # 100 ms between calls. Residuals about the median offset (0): |2 ms| each, MAD = 2 ms,
    # tolerance = 5 x 1.4826 x 2 ms = 14.826 ms; noise 2.965 ms < 25% of 100 ms: order holds.
    rows = []
    for i in range(6):
        t = i * 100 * MS
        rows += [ker(0, t, 10 * MS), ker(1, t, 10 * MS + (2 if i % 2 == 0 else -2) * MS)]
    m = match_collectives(comm_events(events_frame(rows)))
    assert set(m.instances.get_column("match")) == {"order"}
    g = m.groups.row(0, named=True)
    assert g["tolerance_ns"] == 14_826_000
    assert (g["match"], g["calls_per_rank"], g["paired"], g["unpaired"]) == ("order", 6, 12, 0)
    assert g["ranks"] == [0, 1]
    # an explicit tolerance still overrides: 500 us rejects the order pairing as before
    strict = match_collectives(comm_events(events_frame(rows)), tolerance_ns=500_000)
    assert "order_timing_mismatch" in strict.problems.get_column("problem").to_list()


def test_robust_tolerance_ignores_one_outlier_and_has_a_floor() -> None:
    # median 20 us; absolute deviations 20, 80, 120, 0, 4980 us -> MAD 80 us (the 5 ms
    # outlier does not move it); 5 x 1.4826 x 80 us = 593.04 us
    assert robust_tolerance(pl.Series([0, 100_000, -100_000, 20_000, 5_000_000])) == 593_040
    assert robust_tolerance(pl.Series([0, 0, 0])) == 50_000


# --- matching: several process groups -------------------------------------------------------

def _tp_dp(tp_bytes: int, dp_bytes: int, slow: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """4 ranks, TP {0,1},{2,3} and DP {0,2},{1,3}; 4 steps of 100 ms. Each step every rank
    starts a TP and a DP all-reduce at 10 ms (the slow rank at 50 ms); a call ends 1 ms after
    the last member of its group arrives. pg_config as Kineto writes it."""
    tp, dp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}, {0: (0, 2), 2: (0, 2), 1: (1, 3),
                                                               3: (1, 3)}
    rows = []
    for s in range(4):
        t = s * 100 * MS
        arrive = {r: t + (50 if r == slow else 10) * MS for r in range(4)}
        for r in range(4):
            rows.append(step(r, s, t, 100 * MS))
            rows.append(gloo(r, arrive[r], max(arrive[q] for q in tp[r]) + MS, tp_bytes))
            rows.append(gloo(r, arrive[r] + 1000, max(arrive[q] for q in dp[r]) + MS + 1000,
                             dp_bytes) | {"tid": 200})
    cfg = json.dumps([{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "1", "ranks": [0, 1]},
                      {"pg_name": "2", "ranks": [2, 3]}, {"pg_name": "3", "ranks": [0, 2]},
                      {"pg_name": "4", "ranks": [1, 3]}])
    ranks = pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["h"] * 4, "pg_config": [cfg] * 4},
                         schema={"rank": pl.Int32, "host": pl.String, "pg_config": pl.String})
    return events_frame(rows), ranks


def test_group_recovered_from_pg_config_and_signature() -> None:
    # TP calls carry 1 KiB, DP calls 8 KiB. Both signatures fit three layouts (world, TP, DP).
    # With rank 2 slow, TP calls under the TP layout end together (spread 0 per instance),
    # under DP or world 40 ms apart: TP wins; likewise DP for the 8 KiB calls.
    ev, ranks = _tp_dp(1024, 8192, slow=2)
    m = match_collectives(comm_events(ev), ranks=ranks)
    assert m.problems.filter(pl.col("problem") == "group_unknown").height == 0
    groups = {g["group"]: g["ranks"] for g in m.groups.iter_rows(named=True)}
    assert groups == {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    assert set(m.groups.get_column("paired")) == {8}  # 4 steps x 2 ranks each
    # Stragglers: rank 2 is last in its TP group and its DP group every step; its TP partner
    # (3) and DP partner (0) only wait.
    per = collective_ranks(m)
    res = stragglers(per, step_spans(ev), ranks_present(ev))
    assert res.filter(pl.col("flagged")).get_column("rank").to_list() == [2]


def test_group_recovered_by_causality_when_completions_agree_everywhere() -> None:
    # Rank 1 loads data slowly: the TP all-reduce (1 KiB) holds every rank in step, so the DP
    # all-reduces (16 KiB) of all four ranks complete within ~1 ms of each other under every
    # layout. Per step, DP arrivals (ms after the step start): rank 0 at 57, rank 1 at 56,
    # ranks 2 and 3 at 16 (they wait for their DP partner). A call ends 0.2 ms after the last
    # member of its true group arrives, plus r x 0.3 ms of recording jitter:
    #   rank 0: 57.2   rank 1: 56.5   rank 2: 57.8   rank 3: 57.1
    # Completion spread per instance: DP {0,2} 0.6, {1,3} 0.6 (median 0.6 ms); world 1.3 ms:
    # only 2.2x apart, below SEPARATION (4x), so completions cannot decide. Arrivals can:
    #   world  first end 56.5 - last arrival 57 = -0.5 ms: rank 1 done before rank 0 came;
    #   TP {0,1} likewise -0.5 ms; DP {0,2} +0.2, {1,3} +0.5: only DP is possible.
    us = 1_000
    arrive_dp = {0: 57_000, 1: 56_000, 2: 16_000, 3: 16_000}
    end_dp = {0: 57_200, 1: 56_500, 2: 57_800, 3: 57_100}
    arrive_tp = {0: 10_000, 1: 50_000, 2: 10_000, 3: 10_000}
    end_tp = {0: 51_000, 1: 51_300, 2: 11_600, 3: 11_900}
    rows = []
    for s in range(4):
        t = s * 100 * MS
        for r in range(4):
            rows.append(step(r, s, t, 100 * MS))
            rows.append(gloo(r, t + arrive_tp[r] * us, t + end_tp[r] * us, 1024))
            rows.append(gloo(r, t + arrive_dp[r] * us, t + end_dp[r] * us, 16384))
    _, ranks = _tp_dp(1024, 16384, slow=None)
    m = match_collectives(comm_events(events_frame(rows)), ranks=ranks)
    assert m.problems.filter(pl.col("problem") == "group_unknown").height == 0
    groups = {g["group"]: g["ranks"] for g in m.groups.iter_rows(named=True)}
    assert groups == {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}


def test_no_confident_verdict_without_group_identity() -> None:
    # Same signature for TP and DP calls and nobody slow: every layout explains the
    # completions equally well, so the group is not recovered: a problem says so, and no
    # instance (hence no straggler verdict) rests on a guessed pairing.
    ev, ranks = _tp_dp(1024, 1024, slow=None)
    m = match_collectives(comm_events(ev), ranks=ranks)
    unknown = m.problems.filter(pl.col("problem") == "group_unknown")
    assert unknown.height == 1 and "fits 3 group layouts" in unknown.get_column("detail")[0]
    assert m.instances.height == 0
    assert m.groups.get_column("match").to_list() == ["unresolved"]
    res = stragglers(collective_ranks(m), step_spans(ev), ranks_present(ev))
    assert not res.get_column("flagged").any()
    assert set(res.get_column("confidence")) == {"low"}


# --- stragglers: consistency across steps, noise floor, confidence --------------------------

def test_consistent_lead_beats_one_huge_outlier() -> None:
    # Rank 2 is 4 ms late at every step but step 5; rank 0 is 35 ms late once (step 5: a
    # scheduling hiccup). Sums: rank 0 35 ms > rank 2 28 ms, the sum would blame rank 0.
    late = {(2, s): 4_000 for s in range(8) if s != 5}
    late[(0, 5)] = 35_000
    res = _stragglers(trace(late))
    top = res.row(0, named=True)
    # ranked by the typical step: rank 2's per-step waits are 4 ms x 7 and 0 -> median 4 ms;
    # rank 0's are 0 x 7 and 35 ms -> median 0.
    assert top["rank"] == 2 and top["median_imposed_wait_per_step_ns"] == 4 * MS
    assert (top["steps_last"], top["steps_compared"]) == (7, 8)
    r0 = res.filter(pl.col("rank") == 0).row(0, named=True)
    assert r0["imposed_wait_ns"] == 35 * MS and not r0["flagged"]
    assert "did not cause a clear wait in most steps (1 of 8" in r0["explanation"]


def test_noise_floor_from_the_run_flags_nobody_on_a_noisy_balanced_run() -> None:
    # Every step all three ranks arrive spread by 6 ms, who is last rotating; the non-last
    # spread (second-to-last minus first) is 3 ms at every instance -> noise floor 1.5 x 3 =
    # 4.5 ms. Each rank is last at 2 or 3 of 8 steps with a lead of 3 ms < 4.5 ms: nobody.
    late = {}
    for s in range(8):
        for i, r in enumerate(((s + k) % 3 for k in range(3))):
            late[(r, s)] = 3_000 * i
    res = _stragglers(trace(late))
    assert set(res.get_column("noise_floor_ns")) == {4_500_000}
    assert not res.get_column("flagged").any()
    assert set(res.get_column("steps_last")) == {0}


def test_confidence_is_the_binomial_tail_of_being_last() -> None:
    # Rank 2 last (by 10 ms) at 7 of 8 steps among 3 ranks. Chance of >= 7 of 8 at p = 1/3:
    # 8 (1/3)^7 (2/3) + (1/3)^8 = 17 / 6561 = 0.002591 -> score 0.9974, "high".
    late = {(2, s): 10_000 for s in range(8) if s != 3}
    res = _stragglers(trace(late))
    top = res.row(0, named=True)
    assert top["flagged"] and top["confidence"] == "high"
    assert top["confidence_score"] == round(1 - 17 / 6561, 4)
    # the others: last at 0 of 8 steps, nothing suspicious: a confident "no"
    others = res.filter(pl.col("rank") != 2)
    assert set(others.get_column("confidence")) == {"high"}
