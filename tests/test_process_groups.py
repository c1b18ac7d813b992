"""Which process group a collective call belongs to (``analyses/process_groups.py`` and the
group key of ``analyses/collective_match.py``), each rule on a hand-drawn trace.

The rule (docs/metrics.md, *Matching tolerance and process groups*): a call that names its
group (``Process Group Name`` / ``Process Group Ranks`` of ``record_param_comms``) is in that
group, a fact; only calls that name none (gloo's work items) have their group inferred from
``pg_config``, and the inference's causality test counts arrivals and completions apart, so
that concurrent asynchronous calls finishing out of their start order refute no layout.
"""

from __future__ import annotations

import json

import polars as pl

from traceview.analyses.collective_match import comm_events, match_collectives
from traceview.analyses.process_groups import candidates, parse_groups
from traceview.schema import events_frame

US = 1_000
MS = 1_000_000
TP = {0: ("1", "[0, 1]"), 1: ("1", "[0, 1]"), 2: ("2", "[2, 3]"), 3: ("2", "[2, 3]")}
DP = {0: ("3", "[0, 2]"), 2: ("3", "[0, 2]"), 1: ("4", "[1, 3]"), 3: ("4", "[1, 3]")}
CONFIG = json.dumps([{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "1", "ranks": [0, 1]},
                     {"pg_name": "2", "ranks": [2, 3]}, {"pg_name": "3", "ranks": [0, 2]},
                     {"pg_name": "4", "ranks": [1, 3]}])
RANKS = pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["h"] * 4, "pg_config": [CONFIG] * 4},
                     schema={"rank": pl.Int32, "host": pl.String, "pg_config": pl.String})


def call(rank: int, ts: int, end: int, group: tuple[str, str] | None, *, tid: int = 1,
         seq: int | None = None, name: str = "record_param_comms") -> dict:
    """One all-reduce of 1 KiB on ``rank``; ``group`` = (pg_name, pg_ranks) as Kineto writes
    them in ``record_param_comms``, or None (a trace that does not say)."""
    row = dict(rank=rank, file_id=rank, source="kineto", kind="cpu_op", name=name, tid=tid,
               ts_ns=ts, dur_ns=end - ts, collective="all_reduce", bytes=1024)
    if group is not None:
        row |= {"pg_name": group[0], "pg_ranks": group[1]}
    if seq is not None:
        row["seq"] = seq
    return row


def overlapping_groups(named: bool) -> list[dict]:
    """4 ranks, TP {0,1},{2,3} and DP {0,2},{1,3} (every rank in two groups), 4 steps of
    10 ms. Every rank starts a TP all-reduce at 1 ms and a DP one at 3 ms, each ending 1 ms
    later, on every rank alike: one signature (all_reduce, 1 KiB), one timing, so nothing but
    the group field can tell TP from DP or from the world group."""
    rows = []
    for s in range(4):
        t = s * 10 * MS
        for r in range(4):
            rows.append(call(r, t + 1 * MS, t + 2 * MS, TP[r] if named else None))
            rows.append(call(r, t + 3 * MS, t + 4 * MS, DP[r] if named else None, tid=2))
    return rows


def test_candidates_are_disjoint_covers_of_the_ranks() -> None:
    groups = parse_groups([CONFIG])
    # ranks 0..3 are covered by the world, by TP or by DP: three layouts
    assert sorted(len(c) for c in candidates([0, 1, 2, 3], groups)) == [1, 2, 2]
    assert candidates([0, 3], groups) == []  # no group of pg_config is {0, 3}


def test_the_group_field_decides_where_timing_cannot() -> None:
    # Named: each call is in the group it names, a fact; four groups of 2 ranks, each
    # instance the same position of one group on its two ranks (4 steps: 4 instances a group).
    named = match_collectives(comm_events(events_frame(overlapping_groups(named=True))),
                              ranks=RANKS)
    assert named.problems.filter(pl.col("problem") == "group_unknown").height == 0
    assert {g["group"]: g["ranks"] for g in named.groups.iter_rows(named=True)} == \
        {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    assert set(named.groups.get_column("paired")) == {8}
    pairs = named.instances.group_by("instance").agg(pl.col("rank").sort()).get_column("rank")
    assert sorted({tuple(p) for p in pairs.to_list()}) == [(0, 1), (0, 2), (1, 3), (2, 3)]
    # Unnamed: the same calls fit the world, TP and DP alike (same signature, counts and
    # times): the group is unsure, and no instance is guessed.
    unnamed = match_collectives(comm_events(events_frame(overlapping_groups(named=False))),
                                ranks=RANKS)
    unknown = unnamed.problems.filter(pl.col("problem") == "group_unknown")
    assert unknown.height == 1 and "fits 3 group layouts" in unknown.get_column("detail")[0]
    assert unnamed.instances.height == 0


def test_sequence_numbers_pair_the_calls_of_one_instance() -> None:
    # The named trace with each group's sequence number (0..3 per group) and rank 1's first
    # DP call missing (its profiling window started later): positions would pair rank 1's
    # DP calls 1..3 with rank 3's 0..2; the sequence numbers pair 1..3 with 1..3.
    rows = overlapping_groups(named=True)
    counters: dict[tuple[int, str], int] = {}
    for row in rows:
        key = (row["rank"], row["pg_name"])
        row["seq"] = counters[key] = counters.get(key, -1) + 1
    rows = [r for r in rows if not (r["rank"] == 1 and r["pg_name"] == "4" and r["seq"] == 0)]
    m = match_collectives(comm_events(events_frame(rows)), ranks=RANKS)
    dp1 = m.instances.filter(pl.col("group") == "4")
    assert set(dp1.get_column("match")) == {"seq"}
    assert dp1.filter(pl.col("rank") == 1).get_column("position").sort().to_list() == [1, 2, 3]
    assert dp1.group_by("instance").agg(n=pl.len(), seqs=pl.col("seq").n_unique()) \
        .filter(pl.col("n") == 2).get_column("seqs").to_list() == [1, 1, 1]


def gloo(rank: int, ts_us: int, end_us: int, tid: int) -> dict:
    """A gloo work item (no group field, as torch 2.13's gloo writes it) of 64 KiB."""
    return dict(rank=rank, file_id=rank, source="kineto", kind="user_annotation",
                name="gloo:all_reduce", tid=tid, ts_ns=ts_us * US, dur_ns=(end_us - ts_us) * US,
                bytes=65536)


def test_concurrent_async_calls_are_counted_not_paired_by_start() -> None:
    # Two async DP all-reduces a rank per step (async_op=True, one per parameter), run at once
    # on the rank's two gloo threads. Ranks 0 and 1 arrive early; ranks 2 and 3 late (their
    # TP pair is slow). Per step, in us (start -> end):
    #   rank 0: 0 -> 1150 and 10 -> 1050      rank 2: 1000 -> 1060 and 1150 -> 1200
    #   rank 1: 0 -> 1350 and 10 -> 1250      rank 3: 1200 -> 1260 and 1300 -> 1340
    # Rank 0's second call ends (1050) before rank 2's second one starts (1150): by start
    # order the DP instance k=1 would be {rank 0 (10 -> 1050), rank 2 (1150 -> 1200)}, lag
    # 1050 - 1150 = -100 us, impossible; yet the calls are DP's (rank 0's second call was
    # paired with rank 2's first). Counted apart, the k-th completion of a rank needs every
    # member's k-th arrival:
    #   DP {0,2}: k=0 first end min(1050, 1060) = 1050 >= last arrival max(0, 1000) = 1000;
    #             k=1 first end min(1150, 1200) = 1150 >= max(10, 1150) = 1150;
    #   DP {1,3}: k=0 1250 >= 1200, k=1 1340 >= 1300: possible.
    #   world:    k=0 first end 1050 < 4th arrival max(0, 0, 1000, 1200) = 1200: -150 us;
    #   TP {2,3}: k=0 first end min(1060, 1260) = 1060 < max(1000, 1200) = 1200: -140 us.
    # So DP is the only possible layout (both others beyond the 50 us noise floor).
    calls = {0: [(0, 1150), (10, 1050)], 1: [(0, 1350), (10, 1250)],
             2: [(1000, 1060), (1150, 1200)], 3: [(1200, 1260), (1300, 1340)]}
    rows = []
    for s in range(4):
        t = s * 10_000
        for r, pair in calls.items():
            rows += [gloo(r, t + a, t + e, tid=10 + i) for i, (a, e) in enumerate(pair)]
    m = match_collectives(comm_events(events_frame(rows)), ranks=RANKS)
    assert m.problems.filter(pl.col("problem") == "group_unknown").height == 0
    assert {g["group"]: g["ranks"] for g in m.groups.iter_rows(named=True)} == \
        {"3": [0, 2], "4": [1, 3]}
