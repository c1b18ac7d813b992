"""The replay's verdicts in every command (issue 46, item 4), on the real gloo runs of
``fixtures/data/replay`` (``fixtures/replay_scenarios.py``): two slow ranks are both named,
a stall on a few steps is named with its rank and steps, a stall that moves between ranks
is a moving stall with no single straggler, and a balanced twin names nobody confidently.

The truth is each folder's ``truth.json`` (what the generator slowed: ``slow_ranks``,
``pattern``, ``steps_affected`` as indices into ``profiler_steps``), never the analyses'.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceview
from traceview.analyses.replay.findings import (
    culprit_evidence,
    replay_findings,
    replay_named,
    verdict_words,
)
from traceview.outputs.report import gather

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "replay"
NAMES = sorted(p.parent.name for p in DATA.glob("*/truth.json"))
REPLAY_IDS = ("straggler", "several_stragglers", "intermittent_stall", "moving_stall")


def truth(name: str) -> dict[str, Any]:
    return json.loads((DATA / name / "truth.json").read_text())


@functools.cache
def answers(name: str) -> dict[str, Any]:
    """Every command's answer on one Run (computed once per fixture)."""
    run = traceview.open(DATA / name, cache=False)
    return {"stragglers": run.stragglers(), "summary": run.summary()["worst_straggler"],
            "diagnose": run.diagnose()["findings"], "report": gather(run).worst_straggler}


def _finding_ranks(f: dict[str, Any]) -> set[int]:
    if f["rank"] is not None:
        return {f["rank"]}
    return {int(m) for e in f["evidence"] if e["metric"] == "replay_gain_ns_per_step"
            for m in re.findall(r"rank (\d+)", e["text"] or "")}


def named(name: str) -> dict[str, tuple[frozenset[int], bool]]:
    """Per output: the ranks it names and whether it reports a moving stall."""
    got = answers(name)
    strag = got["stragglers"]
    flagged = strag["ranks"].filter(pl.col("flagged"))["rank"].to_list()
    patterns = strag["patterns"] or {}
    replay_only = patterns.get("named")
    by_stragglers = flagged or (patterns["ranks"] if replay_only in ("several", "few_steps")
                                else [])
    found = got["diagnose"].filter(pl.col("id").is_in(REPLAY_IDS)
                                   & ~((pl.col("id") == "straggler")
                                       & (pl.col("severity") != "high")))
    by_diagnose: set[int] = set()
    for f in found.iter_rows(named=True):
        by_diagnose |= _finding_ranks(f)
    out = {"stragglers": (frozenset(by_stragglers), replay_only == "moving"),
           "diagnose": (frozenset(by_diagnose), "moving_stall" in found["id"].to_list())}
    for key in ("summary", "report"):
        worst = got[key]
        out[key] = (frozenset(worst.get("ranks") or []),
                    (worst.get("patterns") or {}).get("named") == "moving")
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_commands_name_the_same_culprits(name: str) -> None:
    found = named(name)
    assert len(set(found.values())) == 1, f"{name}: the outputs disagree: {found}"


@pytest.mark.parametrize("name", [n for n in NAMES if truth(n)["pattern"] == "steady"
                                  and len(truth(n)["steady_slow_ranks"]) >= 2])
def test_two_slow_ranks_are_both_named(name: str) -> None:
    t = truth(name)
    ranks, moving = named(name)["diagnose"]
    assert ranks == frozenset(t["steady_slow_ranks"]) and not moving
    several = answers(name)["diagnose"].filter(pl.col("id") == "several_stragglers").row(
        0, named=True)
    gains = [e["value"] for e in several["evidence"] if e["metric"] == "replay_gain_ns_per_step"]
    # each rank with its own gain; the combined gain is replayed, so at least the largest one
    assert len(gains) == len(t["steady_slow_ranks"]) and min(gains) > 0
    assert several["gain_ns_per_step"] >= max(gains)
    assert "several stragglers" in answers(name)["summary"]["reason"]


@pytest.mark.parametrize("name", [n for n in NAMES if truth(n)["pattern"] == "intermittent"])
def test_a_stall_on_a_few_steps_names_its_rank_and_steps(name: str) -> None:
    t = truth(name)
    (rank,) = t["slow_ranks"]
    steps = [t["profiler_steps"][i] for i in t["steps_affected"][str(rank)]]
    f = answers(name)["diagnose"].filter(pl.col("id") == "intermittent_stall").row(0, named=True)
    assert f["rank"] == rank
    ev = {e["metric"]: e for e in f["evidence"]}
    assert [int(s) for s in ev["stall_steps"]["text"].split(", ")] == steps
    # the cost per occurrence is the stall; averaged over the window it is its share of it
    assert ev["cost_ns_per_occurrence"]["value"] == pytest.approx(
        t["delays_ms"][str(rank)] * 1e6, rel=0.25)
    assert f["gain_ns_per_step"] == pytest.approx(
        ev["cost_ns_per_occurrence"]["value"] * len(steps) / len(t["profiler_steps"]), rel=0.25)
    words = answers(name)["summary"]["reason"]
    assert words.startswith("intermittent stall on steps " + ", ".join(map(str, steps)))


@pytest.mark.parametrize("name", [n for n in NAMES if truth(n)["pattern"] == "rotating"])
def test_a_moving_stall_names_no_single_straggler(name: str) -> None:
    t = truth(name)
    got = answers(name)
    assert got["stragglers"]["ranks"].filter(pl.col("flagged")).height == 0
    assert got["summary"]["rank"] is None and got["summary"]["ranks"] == []
    assert got["summary"]["reason"].startswith("moving stall")
    f = got["diagnose"].filter(pl.col("id") == "moving_stall").row(0, named=True)
    assert f["rank"] is None
    assert got["diagnose"].filter(pl.col("id") == "straggler").height == 0
    # its cost is the stall's: one delay on one rank per step
    assert f["gain_ns_per_step"] == pytest.approx(t["nominal_delay_ms_per_step"] * 1e6, rel=0.25)


@pytest.mark.parametrize("name", [n for n in NAMES if truth(n)["kind"] == "none"])
def test_a_balanced_twin_names_nobody_confidently(name: str) -> None:
    got = answers(name)
    sure = got["diagnose"].filter(pl.col("id").is_in(REPLAY_IDS)
                                  & (pl.col("confidence") != "low"))
    assert sure.height == 0, sure["title"].to_list()
    assert got["summary"]["rank"] is None and got["summary"]["ranks"] == []
    assert all(c["confidence"] == "low" for c in got["stragglers"]["replay_culprits"])


# --- hand-drawn verdicts: the findings and words from a culprit verdict -------------------

def _verdict(pattern: str, culprits: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"pattern": pattern, "culprits": culprits, "combined_gain_ns_per_step": 0.0,
            "moving_cost_ns_per_step": None, "trusted": True, **more}


def test_several_culprits_by_hand() -> None:
    """Ranks 1 (40 ms alone) and 3 (25 ms more once rank 1 is typical): one finding, no
    rank, each rank's own gain in the evidence, the combined (replayed) 65 ms its gain."""
    v = _verdict("steady", [{"rank": 1, "gain_ns_per_step": 40e6, "steps": []},
                            {"rank": 3, "gain_ns_per_step": 25e6, "steps": []}],
                 combined_gain_ns_per_step=65e6)
    (f,) = replay_findings(v, flagged=[])
    assert (f["id"], f["rank"], f["gain_ns_per_step"], f["confidence"]) == \
        ("several_stragglers", None, 65_000_000, "medium")
    assert [e["value"] for e in f["evidence"]] == [40e6, 25e6, 65e6]
    assert replay_findings(v, flagged=[1]) == []  # the lateness analysis's straggler stands
    assert verdict_words(v) == ("several stragglers: rank 1 40.00 ms, rank 3 25.00 ms per "
                                "step; together 65.00 ms (replayed)")


def test_intermittent_and_moving_by_hand() -> None:
    """150 ms on steps 4 and 7 of 8: 37.5 ms per step over the window; untrusted, it is low
    and names what did not reproduce. A moving stall has no rank."""
    v = _verdict("few_steps", [{"rank": 1, "gain_ns_per_step": 37.5e6, "steps": [4, 7],
                                "cost_ns_per_occurrence": 150e6, "confidence": "high"}],
                 trusted=False)
    (f,) = replay_findings(v, flagged=[], causes=["step 4: rank 2 waited on a barrier"])
    assert (f["id"], f["rank"], f["gain_ns_per_step"], f["confidence"]) == \
        ("intermittent_stall", 1, 37_500_000, "low")
    ev = {e["metric"]: e for e in f["evidence"]}
    assert ev["stall_steps"]["text"] == "4, 7" and ev["cost_ns_per_occurrence"]["value"] == 150e6
    assert ev["replay_not_reproduced"]["text"] == "step 4: rank 2 waited on a barrier"
    moving = _verdict("moving", [], moving_cost_ns_per_step=30e6, moving_ranks=[0, 1, 2, 3])
    (f,) = replay_findings(moving, flagged=[])
    assert (f["id"], f["rank"], f["gain_ns_per_step"]) == ("moving_stall", None, 30_000_000)
    assert replay_named(_verdict("steady", [{"rank": 2, "gain_ns_per_step": 9e6,
                                             "steps": []}]), flagged=[]) is None


def test_a_flagged_straggler_carries_the_other_culprits() -> None:
    """Rank 1 flagged; the replay also names rank 3 (25 ms on top): evidence of rank 3 and of
    the combined 65 ms, nothing for rank 1 itself, nothing when it is the only culprit."""
    v = _verdict("steady", [{"rank": 1, "gain_ns_per_step": 40e6, "confidence": "high"},
                            {"rank": 3, "gain_ns_per_step": 25e6, "confidence": "medium"}],
                 combined_gain_ns_per_step=65e6)
    assert [(e["metric"], e["value"], e["text"]) for e in culprit_evidence(v, 1)] == [
        ("replay_other_culprit_gain_ns_per_step", 25e6, "rank 3 (medium)"),
        ("replay_combined_gain_ns_per_step", 65e6, "replayed with every culprit typical")]
    assert culprit_evidence(_verdict("steady", v["culprits"][:1]), 1) == []
    assert culprit_evidence(None, 1) == []
