"""The replay scenarios (``fixtures/replay_scenarios.py``, ``fixtures/data/replay``): real gloo
runs of kinds the analyses were not written around, each slow run with a balanced twin.

Here, what needs no replay engine: every scenario folder opens, has the ranks and steps its
truth says, the measured twin difference in truth.json is reproduced from the traces through
the Run's step table (so the truth is the traces', not the generator's clock), the slowness
carries no label, and the straggler verdict of today names the slowed rank on the scenarios
with one steady slow rank.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceview
from fixtures.replay_scenarios import BY_NAME, LAYOUTS, SCENARIOS, STEPS, trace_path

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "replay"
NAMES = [s.name for s in SCENARIOS]
SLOW = [s.name for s in SCENARIOS if s.kind != "none"]
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
TRUTH_KEYS = {"scenario", "layout", "kind", "pattern", "world_size", "steps", "threads", "groups",
              "twin", "slow_ranks", "expected", "weak", "delays_ms", "steps_affected",
              "nominal_delay_ms_per_step", "profiler_steps", "measured"}
MEASURED_KEYS = {"step_ns", "step_ms_mean", "step_ms_by_rank", "injected_ms",
                 "twin_step_ms_mean", "twin_difference_ms"}


@cache
def truth(name: str) -> dict[str, Any]:
    return json.loads((DATA / name / "truth.json").read_text())


@cache
def run(name: str) -> traceview.Run:
    return traceview.open(DATA / name, cache=False)


def mean_step_ms(name: str) -> float:
    """The run's mean step from the Run's step table: per step, the slowest rank's step."""
    per_step = run(name).steps.group_by("step").agg(pl.col("step_time_ns").max())
    return per_step["step_time_ns"].mean() / 1e6


def test_every_scenario_is_committed_and_small() -> None:
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(NAMES)
    assert sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file()) < 3_200_000  # ~3 MB, with room for a re-recording
    # every layout has its balanced twin, and every slow run names it
    assert {s.layout for s in SCENARIOS if s.kind == "none"} == set(LAYOUTS)


@pytest.mark.parametrize("name", NAMES)
def test_truth(name: str) -> None:
    t, spec = truth(name), BY_NAME[name]
    assert TRUTH_KEYS <= set(t) and MEASURED_KEYS <= set(t["measured"])
    assert (t["scenario"], t["layout"], t["kind"], t["pattern"], t["world_size"], t["steps"],
            t["twin"]) == (name, spec.layout, spec.kind, spec.pattern, spec.world, STEPS,
                           f"{spec.layout}_balanced")
    m = t["measured"]
    assert len(m["step_ns"]) == len(t["profiler_steps"]) == STEPS
    assert sorted(map(int, m["injected_ms"])) == list(range(spec.world))
    if spec.kind == "none":
        assert t["slow_ranks"] == [] and t["nominal_delay_ms_per_step"] == 0
        assert m["twin_difference_ms"] == 0 and m["twin_step_ms_mean"] == m["step_ms_mean"]
        assert all(ms == 0 for per in m["injected_ms"].values() for ms in per)
        return
    assert m["twin_step_ms_mean"] == truth(t["twin"])["measured"]["step_ms_mean"]
    # the slowness was really spent where and when the truth says (sleeps to the ms; compute
    # and the GIL thread are timed, and vary with the load)
    for rank, steps in t["steps_affected"].items():
        spent = m["injected_ms"][rank]
        assert all(spent[k] > 0 for k in steps)
        assert all(spent[k] == 0 for k in range(STEPS) if k not in steps)
        if spec.kind in ("stall", "backward_stall", "slow_comm"):
            assert all(spent[k] >= t["delays_ms"][rank] for k in steps)


@pytest.mark.parametrize("name", NAMES)
def test_folder_opens_with_the_ranks_and_steps_of_its_truth(name: str) -> None:
    t = truth(name)
    r = run(name)
    assert r.ranks_present == list(range(t["world_size"]))
    steps = r.steps
    assert steps.group_by("rank").len().sort("rank")["len"].to_list() == \
        [t["steps"]] * t["world_size"]
    assert sorted(steps["step"].unique().to_list()) == t["profiler_steps"]


@pytest.mark.parametrize("name", NAMES)
def test_measured_mean_step_is_the_traces(name: str) -> None:
    """truth.json's mean step (from the ProfilerStep spans, read by the generator) is what the
    Run's step table gives; hence the twin difference too."""
    t = truth(name)
    assert mean_step_ms(name) == pytest.approx(t["measured"]["step_ms_mean"], abs=0.002)
    if t["kind"] != "none":
        difference = mean_step_ms(name) - mean_step_ms(t["twin"])
        assert difference == pytest.approx(t["measured"]["twin_difference_ms"], abs=0.004)


@pytest.mark.parametrize("name", NAMES)
def test_no_label_on_the_slowness_and_a_real_dataloader(name: str) -> None:
    t = truth(name)
    for rank in range(t["world_size"]):
        doc = json.loads(gzip.decompress(trace_path(DATA / name, rank, name).read_bytes()))
        names = Counter(e.get("name") for e in doc["traceEvents"] if e.get("ph") == "X")
        assert names[LOADER] == t["steps"]
        annotations = {e["name"] for e in doc["traceEvents"]
                       if e.get("cat") == "user_annotation" and e.get("ph") == "X"}
        assert not {a for a in annotations if a.startswith("fixture")}


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS
                                  if s.kind == "none" or (s.pattern == "steady"
                                  and len(s.delays) == 1)])
def test_stragglers_names_the_one_steady_slow_rank_or_nobody(name: str) -> None:
    """Today's verdict where it holds: one rank slow on every step is flagged (a weak one, or
    nobody), a twin flags nobody. (Two slow ranks, a stall on 2 of 8 steps and a stall that
    moves between ranks get no straggler today, which is no answer: the replay's verdicts are
    to name them.)"""
    t = truth(name)
    assert t["expected"] == (t["slow_ranks"][0] if t["slow_ranks"] else None)
    flagged = run(name).stragglers()["ranks"].filter(pl.col("flagged"))["rank"].to_list()
    expected = [] if t["expected"] is None else [t["expected"]]
    assert flagged in ([expected, []] if t.get("weak") else [expected])


# --------------------------------------------------------------------------------------------
# The replay's predictions against the twins (issue 46, items 3 and 6): what removing the
# slowness gives, measured by the twin, within the bar.

#: The issue's bar for a prediction against its twin's measured mean step.
WITHIN = 0.05


def without_the_slowness(name: str) -> str:
    """The what-if SPEC that removes a scenario's slowness: every slowed rank typical (a
    stall that moves between ranks: all of them)."""
    t = truth(name)
    if t["pattern"] == "rotating" or not t["slow_ranks"]:
        return "ranks=all:typical"
    return ",".join(f"rank={r}:typical" for r in t["slow_ranks"])


def predicted_mean_ms(name: str, spec: str) -> float:
    if not hasattr(traceview.Run, "whatif"):
        pytest.skip("the replay engine (Run.whatif) is not in this checkout")
    found = run(name).whatif(spec).to_dict()["scenarios"]
    assert [s["spec"] for s in found] == [spec]
    return found[0]["step_ns_mean"] / 1e6


#: Where the replay misses the issue's bar today (issue 46 stays open on them), as measured by
#: ``benchmarks/replay_predictions.py`` on these fixtures (re-recorded 2026-12-08: ddp1b, ddpb
#: and ddphook at load 1-4, the others at 5-13 while other work ran). Strict: a prediction
#: that comes within the bar fails here until it is taken off the list, so the list can only
#: shrink. The causes, as measured (docs/metrics.md, *Replay*, "Where the predictions miss"):
#: CPU contention on the 2-core recording box, which the replay does not model: a slow run's
#: own durations are not its twin's (ddp1b: the all-reduce's transfer after the last arrival
#: 3.7 ms in the slow run against 5.8 in the twin, the compute before it 3.3 against 2.0 ms;
#: ddp8: 15.0 against 22.8 ms); two slow ranks of four, whose median over all ranks is half
#: slow (ddp1b_stall_r1_r3, ``ranks=all``); tpsp, since its DP all-reduces are matched
#: (async, two at once on two gloo threads): their replayed completions are up to 1.5 ms off
#: the measured ones (the balanced twin's replay error 3.9% / 8.3%, ``ranks=all`` -5.1%), and
#: in tpsp_stall_r3 delays of ranks 0 and 1 that rank 3's stall hid (a gloo all-gather that
#: starts 27 ms after its call in step 9, both ranks) surface in rank 3's typical; a GIL
#: thread, whose busy core slows the other ranks too (contention again: their compute 2.8
#: against 2.0 ms in the twin); the pipeline's replay error (pp1f1b: p90 38%).
TYPICAL_MISSES = {
    "ddp1b_gil_r3": "15.0 ms predicted vs the twin's 11.5 ms (+30.8%)",
    "ddp1b_stall_r2": "9.8 ms predicted vs the twin's 11.5 ms (-15.0%)",
    "ddp8_stall_r5": "35.2 ms predicted vs the twin's 47.6 ms (-26.1%)",
    "ddpb_intermittent_r1": "12.5 ms predicted vs the twin's 11.6 ms (+7.8%)",
    "ddpb_stall_r2": "15.6 ms predicted vs the twin's 11.6 ms (+34.4%)",
    "ddphook_slow_comm_r0": "12.2 ms predicted vs the twin's 9.9 ms (+22.9%)",
    "fsdp2_compute_r1": "71.6 ms predicted vs the twin's 65.5 ms (+9.3%)",
    "tpsp_stall_r3": "30.1 ms predicted vs the twin's 18.4 ms (+63.7%)",
}
ALL_TYPICAL_MISSES = {
    "ddp1b_backward_stall_r1": "12.2 ms predicted vs the twin's 11.5 ms (+6.8%)",
    "ddp1b_gil_r3": "14.9 ms predicted vs the twin's 11.5 ms (+29.5%)",
    "ddp1b_stall_r1_r3": "23.3 ms predicted vs the twin's 11.5 ms (+103.1%)",
    "ddp1b_stall_r2": "9.8 ms predicted vs the twin's 11.5 ms (-14.8%)",
    "ddp8_stall_r5": "34.0 ms predicted vs the twin's 47.6 ms (-28.4%)",
    "ddpb_stall_r2": "15.7 ms predicted vs the twin's 11.6 ms (+35.7%)",
    "ddphook_slow_comm_r0": "12.4 ms predicted vs the twin's 9.9 ms (+24.9%)",
    "fsdp2_balanced": "59.8 ms predicted vs the twin's 65.5 ms (-8.7%)",
    "pp1f1b_balanced": "35.8 ms predicted vs the twin's 45.5 ms (-21.3%)",
    "pp1f1b_compute_s1": "52.9 ms predicted vs the twin's 45.5 ms (+16.3%)",
    "tpsp_balanced": "17.4 ms predicted vs the twin's 18.4 ms (-5.1%)",
    "tpsp_stall_r3": "28.8 ms predicted vs the twin's 18.4 ms (+56.8%)",
}


def known(names: list[str], misses: dict[str, str]) -> list[Any]:
    """``names`` as parameters, those in ``misses`` marked as strict expected failures."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=misses[n]))
            if n in misses else n for n in names]


@pytest.mark.parametrize("name", known(SLOW, TYPICAL_MISSES))
def test_typical_replay_predicts_the_twin(name: str) -> None:
    twin = truth(name)["measured"]["twin_step_ms_mean"]
    assert predicted_mean_ms(name, without_the_slowness(name)) == pytest.approx(twin, rel=WITHIN)


@pytest.mark.parametrize("name", known(NAMES, ALL_TYPICAL_MISSES))
def test_every_rank_typical_predicts_the_twin(name: str) -> None:
    """``ranks=all:typical`` removes any one rank's slowness, and leaves a twin as it is."""
    twin = truth(name)["measured"]["twin_step_ms_mean"]
    assert predicted_mean_ms(name, "ranks=all:typical") == pytest.approx(twin, rel=WITHIN)


# diagnose's gains against the twins (issue 46, item 4): the replayed gain of its finding
# about the slowness (a straggler, several, an intermittent or a moving stall), within the
# issue's bar of the twins' measured difference in mean step
GAIN_WITHIN = 0.25
SLOWNESS_FINDINGS = ["straggler", "several_stragglers", "intermittent_stall", "moving_stall"]
#: Where diagnose's gain misses today (measured as TYPICAL_MISSES; strict, as they are): the
#: contention the replay does not model (ddp8: 8 ranks on 2 cores, a 30 ms sleep costs the
#: run 10.8 ms; fsdp2: rank 1's extra matmuls slow the others' work too, so theirs is no
#: typical; the GIL thread's busy core slows the others too).
DIAGNOSE_MISSES = {
    "ddp1b_gil_r3": "8.9 ms per step vs the twins' 12.4 ms (-28%)",
    "ddp8_stall_r5": "23.2 ms per step vs the twins' 10.8 ms (+115%)",
    "fsdp2_compute_r1": "12.8 ms per step vs the twins' 18.9 ms (-32%)",
    # the replay's gain, as rank=3:typical (TYPICAL_MISSES); its +4% before was the
    # straggler analysis's caused wait, while the replay had no DP dependency to remove
    "tpsp_stall_r3": "28.5 ms per step vs the twins' 40.2 ms (-29%)",
}


@pytest.mark.parametrize("name", known(SLOW, DIAGNOSE_MISSES))
def test_diagnose_gain_is_the_twins_difference(name: str) -> None:
    found = run(name).diagnose()["findings"].filter(pl.col("id").is_in(SLOWNESS_FINDINGS))
    assert found.height >= 1, f"{name}: no finding about the slowness"
    gain_ms = found.get_column("gain_ns_per_step")[0] / 1e6
    twins = truth(name)["measured"]["twin_difference_ms"]
    assert gain_ms == pytest.approx(twins, rel=GAIN_WITHIN)
