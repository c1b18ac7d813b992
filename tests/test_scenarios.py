"""Sanity checks of the scenario matrix (``fixtures/scenarios.py``, ``fixtures/data/scenarios``).

The fixtures only: each scenario folder holds its truth and four rank files traceview opens,
the generator's own timings show the slowed rank slower (and nobody on the balanced twins),
the delays carry no label but in the one control, and the p2p and all-to-all calls are in the
traces with the arguments send/recv and all-to-all matching will need. No verdict is checked
here.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import traceview
from fixtures.scenarios import A2A_TOKENS, BY_NAME, DELAY_MS, MICROBATCHES, SCENARIOS, WORLD, trace_path
from traceview.cli import main

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "scenarios"
NAMES = [s.name for s in SCENARIOS]
TRUTH_KEYS = {"scenario", "layout", "delay_kind", "slow_rank", "delay_ms", "world_size", "steps",
              "threads", "groups", "expected", "weak", "measured"}
MEASURED_KEYS = {"step_ms", "busy_ms", "comm_ms", "extra_ms", "margin_ms", "noise_ms",
                 "max_excess_ms", "per_step"}
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def truth(name: str) -> dict[str, Any]:
    return json.loads((DATA / name / "truth.json").read_text())


@cache
def trace(name: str, rank: int) -> dict[str, Any]:
    return json.loads(gzip.decompress(trace_path(DATA / name, rank, name).read_bytes()))


def events(name: str, rank: int, event: str) -> list[dict[str, Any]]:
    return sorted((e for e in trace(name, rank)["traceEvents"]
                   if e.get("name") == event and e.get("ph") == "X"), key=lambda e: e["ts"])


def test_every_scenario_is_committed() -> None:
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_truth(name: str) -> None:
    t, spec = truth(name), BY_NAME[name]
    assert TRUTH_KEYS <= set(t) and MEASURED_KEYS <= set(t["measured"])
    assert (t["scenario"], t["layout"], t["delay_kind"], t["slow_rank"], t["expected"],
            t["threads"], t["world_size"]) == (name, spec.layout, spec.kind, spec.slow_rank,
                                               spec.slow_rank, spec.threads, WORLD)
    assert isinstance(t["weak"], bool) and (t["weak"] or not spec.weak)
    assert sorted({r for members in t["groups"].values() for r in members}) == list(range(WORLD))
    m = t["measured"]
    busy = {int(r): v for r, v in m["busy_ms"].items()}
    assert sorted(busy) == list(range(WORLD))
    assert all(len(v["busy_ms"]) == t["steps"] for v in m["per_step"].values())
    if t["expected"] is None:
        assert t["delay_ms"] == 0 and m["extra_ms"] is None
        assert m["max_excess_ms"] < DELAY_MS / 2  # nobody stands out
    else:
        slow = t["expected"]
        others = statistics.median(v for r, v in busy.items() if r != slow)
        assert busy[slow] - others >= t["delay_ms"] / 2
        assert m["extra_ms"] >= t["delay_ms"] / 2
        assert m["max_excess_ms"] == m["extra_ms"]  # the slowed rank stands out most


@pytest.mark.parametrize("name", NAMES)
def test_rank_files_open_in_traceview(name: str) -> None:
    folder = DATA / name
    files = sorted(folder.glob("rank-*.pt.trace.json.gz"))
    assert [p.name for p in files] == [trace_path(folder, r, name).name for r in range(WORLD)]
    assert all(p.stat().st_size < 100_000 for p in files)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 400_000
    assert traceview.open(folder, cache=False).ranks_present == list(range(WORLD))


@pytest.mark.parametrize("name", NAMES)
def test_steps_loader_and_no_label_but_the_control(name: str) -> None:
    t = truth(name)
    for rank in range(WORLD):
        doc = trace(name, rank)
        assert doc["distributedInfo"]["rank"] == rank
        names = Counter(e.get("name") for e in doc["traceEvents"] if e.get("ph") == "X")
        steps = [n for n in names if str(n).startswith("ProfilerStep#")]
        assert len(steps) == t["steps"]
        assert names[LOADER] == t["steps"]  # every step draws from a real DataLoader
        labels = {n for n in names if str(n).startswith("fixture::")}
        control = name == "ddp_labelled_r0" and rank == 0
        assert labels == ({"fixture::extra_compute"} if control else set())


def test_tp_dp_groups_in_the_traces() -> None:
    # each rank lists the groups it belongs to; pg_name is the creation order on every rank
    pgs = {pg["pg_name"]: pg["ranks"] for r in range(WORLD)
           for pg in trace("tpdp_stall_r3", r)["distributedInfo"]["pg_config"]}
    assert pgs == {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    assert sorted(map(sorted, truth("tpdp_stall_r3")["groups"].values())) == sorted(pgs.values())
    assert [e["args"]["Input Dims"] for e in events("tpdp_stall_r3", 0, "gloo:all_reduce")][:2] \
        == [[[8, 32]], [[4096]]]  # TP activations, then DP gradients


@pytest.mark.parametrize("name", [n for n in NAMES if BY_NAME[n].layout == "pipeline"])
def test_pipeline_send_recv(name: str) -> None:
    steps = truth(name)["steps"]
    for stage in range(WORLD):
        peers = [p for p in (stage - 1, stage + 1) if 0 <= p < WORLD]
        n = MICROBATCHES * steps * len(peers)
        sends, recvs = events(name, stage, "c10d::send"), events(name, stage, "c10d::recv_")
        assert len(sends) == len(recvs) == n
        assert len(events(name, stage, "gloo:send")) == len(events(name, stage, "gloo:recv")) == n
        # Concrete Inputs: [tensors, group, peer (group rank), tag]
        assert Counter(e["args"]["Concrete Inputs"][2] for e in sends) == \
            Counter({str(p): MICROBATCHES * steps for p in peers})
        assert {e["args"]["Concrete Inputs"][3] for e in sends + recvs} == {"0"}
        assert {str(e["args"]["Input Dims"]) for e in sends + recvs} == {"[[[4, 64]], [], [], []]"}


@pytest.mark.parametrize("name", [n for n in NAMES if BY_NAME[n].layout == "a2a"])
def test_all_to_all_splits(name: str) -> None:
    t = truth(name)
    hot = t["slow_rank"]
    for rank in range(WORLD):
        calls = events(name, rank, "c10d::alltoall_base_")
        assert len(calls) == len(events(name, rank, "gloo:all_to_all")) == 3 * t["steps"]
        counts, dispatch, combine = (c["args"]["Concrete Inputs"] for c in calls[:3])
        assert counts[3:5] == ["[]", "[]"]  # the token counts: even splits
        # dispatch: [out, in, group, output_split_sizes, input_split_sizes, ...]
        out_split, in_split = json.loads(dispatch[3]), json.loads(dispatch[4])
        assert sum(in_split) == A2A_TOKENS and (json.loads(combine[3]), json.loads(combine[4])) == (
            in_split, out_split)
        if hot is None:
            assert in_split == out_split == [11] * WORLD
        else:  # 8x the tokens to the hot expert
            assert in_split == [32 if e == hot else 4 for e in range(WORLD)]
            assert out_split == [32 if rank == hot else 4] * WORLD


@pytest.mark.parametrize("name", ["ddp_stall_r2", "tpdp_balanced", "pipeline_compute_s2",
                                  "a2a_routing_r1"])
def test_traceview_info(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(DATA / name), "--no-cache"]) == 0
    assert capsys.readouterr().out.startswith("4 ranks, 4 files")
