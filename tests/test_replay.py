"""The what-if replay (analyses/replay) on a hand-drawn DDP step whose answers are derived by
hand, then through the CLI, then on the real gloo fixtures.

Three ranks, one step, times in ms. Every rank's main thread (tid 1) runs forward, issues the
gradient all-reduce (``c10d::allreduce_``, 1 ms), runs backward, waits (DDP's reducer: a
gap no op covers) until gloo's worker thread (tid 2) has finished the all-reduce, then the
optimizer (10 ms) and a tail op (5 ms). The worker starts the all-reduce 1 ms after the
issue. Rank 1 stalls 40 ms before issuing (an unannotated sleep)::

    rank 0, 2   fwd [0,10)  issue [10,11)  bwd [11,20)  (wait 20..60)  opt [60,70) tail [70,75)
    rank 1      fwd [0,10)  (stall 10..50) issue [50,51) bwd [51,60)   opt [60,70) tail [70,75)
    worker      all_reduce from issue + 1 ms to 59.9 (last arrival 51, transfer 8.9)

By hand:
* ranks 0 and 2 wait on the all-reduce from the end of bwd (20) to 60: blocked 40 ms, so their
  work between the issue and the wait is 10 - 0 = bwd's 9 ms plus the issue's 1 ms;
* the replay of the measured run reproduces it: all steps 75 ms, error 0;
* ``rank=1:typical``: rank 1's stretch from the step's start to its issue (50 ms) becomes the
  median of (10, 50, 10) = 10; it issues at 10, arrives at 11, the all-reduce completes at
  11 + 8.9 = 19.9; ranks 0 and 2 resume at max(20, 19.9 + 0.1) = 20 and end at 35, rank 1 at
  10 + 25 = 35: every step 35 ms, a gain of 40 ms;
* rank 1 did not wait (its all-reduce completed 0.1 ms before its bwd ended), but as the
  others waited on it, it depends on it too: a wait of nothing at bwd's end (60);
* ``comm=x2``: the transfer is 17.8, completion 68.8, every rank resumes at 68.9 and ends at
  83.9: gain -8.9 ms;
* ``stalls=off``: rank 1's stretch before the issue has 40 ms outside every leaf op against
  the median 0: cut to 0, the same 35 ms as ``rank=1:typical``;
* a replay that kept the wait as work (no wait found) would gain nothing: checked below.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from helpers import write_trace
from traceview.analyses.replay import build_graph, find_waits, replay_graph, self_check
from traceview.analyses.replay.scenarios import SpecError, parse_scenario
from traceview.analyses.replay.waits import WaitOptions
from traceview.analyses.replay.verdicts import (
    critical_path,
    culprits,
    path_ranks,
    rank_gains,
    type_slowdowns,
)
from traceview.analyses.replay.whatif import replay_run, whatif

MS = 1_000_000
ROOT = Path(__file__).resolve().parent.parent


def _rank_ops(rank: int) -> list[tuple]:
    issue = 50 if rank == 1 else 10
    rows = [("ProfilerStep#1", 0, 75, None), ("fwd", 0, 10, None),
            ("c10d::allreduce_", issue, issue + 1, "all_reduce"),
            ("bwd", issue + 1, issue + 1 + 9 if rank != 1 else 60, None),
            ("opt", 60, 70, None), ("tail", 70, 75, None)]
    out = [(rank, 1, name, s * MS, e * MS, c) for name, s, e, c in rows]
    out.append((rank, 2, "gloo:all_reduce", (issue + 1) * MS, int(59.9 * MS), "all_reduce"))
    return out


def _ops() -> pl.DataFrame:
    rows = [r for rank in range(3) for r in _rank_ops(rank)]
    return pl.DataFrame(rows, schema=["rank", "tid", "name", "ts_ns", "end_ns", "collective"],
                        orient="row")


def _collectives(ops: pl.DataFrame) -> pl.DataFrame:
    return ops.filter(pl.col("name") == "gloo:all_reduce").select(
        instance=pl.lit("default#0"), rank="rank", collective=pl.lit("all_reduce"),
        name="name", arrival_ns="ts_ns", end_ns="end_ns")


@pytest.fixture(scope="module")
def graph():
    ops = _ops()
    return build_graph(ops, _collectives(ops))


def test_the_reducers_hidden_wait_is_found_with_its_blocked_time(graph):
    waits = graph.points.filter(pl.col("kind") == "wait").sort("rank")
    assert waits.select("rank", "t_ns", "blocked_ns", "instance").rows() == [
        (0, 60 * MS, 40 * MS, "default#0"), (1, 60 * MS, 0, "default#0"),
        (2, 60 * MS, 40 * MS, "default#0")]


def test_the_slow_ranks_own_backward_ending_at_the_completion_is_no_wait(graph):
    # rank 1's bwd [51, 60) ends 0.1 ms after its all-reduce completes: a leaf op's body,
    # not a wait; but as the others waited there, rank 1 depends on the all-reduce too:
    # a wait of nothing at its first boundary after the completion (bwd's end)
    (wait,) = graph.points.filter((pl.col("rank") == 1) & (pl.col("kind") == "wait")).rows(
        named=True)
    assert (wait["t_ns"], wait["blocked_ns"], wait["work_ns"]) == (60 * MS, 0, 10 * MS)


def test_a_leaf_op_named_as_a_wait_is_a_wait():
    ops = pl.DataFrame({"rank": [0, 0], "tid": [1, 1], "name": ["c10d::wait", "x"],
                        "ts_ns": [0, 0], "end_ns": [900_000, 950_000]})
    done = pl.DataFrame({"instance": ["a"], "rank": [0], "tid": [2], "end_ns": [880_000],
                         "issued_ns": [10_000]})
    assert find_waits(ops.head(1), done).get_column("blocked_ns").to_list() == [890_000]


def test_a_gap_holding_the_last_arrival_waits_though_the_worker_records_its_end_late():
    """A busy host's worker thread records the all-reduce's end (12 ms) after the waiting
    thread already resumed (11 ms): the gap [2, 11) holds the instance's last arrival (4 ms),
    so it is the wait, not the short stretch of the next step's work that ends near the
    recorded end ([11.9, 12))."""
    ops = pl.DataFrame({"rank": [0] * 4, "tid": [1] * 4,
                        "name": ["ProfilerStep#1", "c10d::allreduce_", "opt", "fwd"],
                        "ts_ns": [0, 1 * MS, 11 * MS, 11_900_000],
                        "end_ns": [11_500_000, 2 * MS, 11_400_000, 14 * MS]})
    done = pl.DataFrame({"instance": ["ar"], "rank": [0], "tid": [2], "end_ns": [12 * MS],
                         "issued_ns": [1 * MS], "ready_ns": [4 * MS]})
    assert find_waits(ops, done).select("t_ns", "instance", "blocked_ns").rows() == [
        (11 * MS, "ar", 9 * MS)]
    # without the last arrival the early-resume rule still holds it: the gap ends 1 ms (at
    # most 15% of its 9 ms, capped at 1 ms) before the recorded end
    assert find_waits(ops, done.drop("ready_ns")).get_column("t_ns").to_list() == [11 * MS]
    # recorded 1.5 ms late, beyond the cap: only the last arrival finds the wait
    late = done.with_columns(end_ns=pl.lit(12_500_000))
    assert find_waits(ops, late).get_column("t_ns").to_list() == [11 * MS]
    assert find_waits(ops, late.drop("ready_ns")).get_column("t_ns").to_list() != [11 * MS]


def test_an_issue_is_the_latest_dispatcher_call_of_any_kind_before_the_arrival():
    """Rank 0 issued an all-reduce at 0 whose op (2-50) no instance holds (a group the matcher
    could not tell), then a reduce-scatter at 60 that gloo runs as an all-reduce (62): with
    one call more than ops, the FIFO pairing cannot hold; the op's issue is the latest
    dispatcher call before it, of whatever kind (not the all-reduce 62 ms earlier)."""
    ops = pl.DataFrame({
        "rank": [0, 0, 0, 0, 1, 1], "tid": [1, 2, 1, 3, 1, 3],
        "name": ["c10d::allreduce_", "gloo:all_reduce", "c10d::_reduce_scatter_base_",
                 "gloo:all_reduce", "c10d::_reduce_scatter_base_", "gloo:all_reduce"],
        "ts_ns": [0, 2 * MS, 60 * MS, 62 * MS, 60 * MS, 61 * MS],
        "end_ns": [1 * MS, 50 * MS, 61 * MS, 70 * MS, 61 * MS, 70 * MS],
        "collective": ["all_reduce", "all_reduce", "reduce_scatter", "all_reduce",
                       "reduce_scatter", "all_reduce"]})
    comm = pl.DataFrame({"instance": ["x", "x"], "rank": [0, 1], "collective": "all_reduce",
                         "name": "gloo:all_reduce", "arrival_ns": [62 * MS, 61 * MS],
                         "end_ns": [70 * MS, 70 * MS]})
    g = build_graph(ops, comm)
    assert g.points.filter(pl.col("kind") == "issue").select("rank", "t_ns").rows() == [
        (0, 60 * MS), (1, 60 * MS)]
    assert g.edges.filter(pl.col("kind") == "issue").get_column("lag_ns").to_list() == [
        2 * MS, 1 * MS]


def test_a_gap_ending_just_before_the_ops_recorded_end_is_a_wait_on_it():
    """gloo marks the all-reduce complete and wakes the waiter before its work item's range
    closes; on a busy host the waiter runs first (ddp1b_balanced: resumed 0.7 ms before the
    recorded end of an 8.6 ms wait). By hand (ms): `fwd` [0, 1), a gap [1, 9.6), `opt`
    [9.6, 10); the all-reduce, issued at 0.5, is recorded ending at 10.3. The gap's own
    tolerance is 5% of 8.6 = 0.43 < 0.7, but a gap may end up to 15% of its length (1.29)
    before the recorded end: a wait at 9.6 blocked 9.6 - 1 = 8.6, whose resume lag is
    -0.7 (the replay of the measured run keeps it). Recorded 2 ms after the resume (beyond
    1.29): no wait; the same 0.7 ms inside a leaf op's body (no gap): no wait."""
    ops = pl.DataFrame({"rank": [0, 0], "tid": [1, 1], "name": ["fwd", "opt"],
                        "ts_ns": [0, round(9.6 * MS)], "end_ns": [1 * MS, 10 * MS]})
    done = pl.DataFrame({"instance": ["ar"], "rank": [0], "tid": [2],
                         "end_ns": [round(10.3 * MS)], "issued_ns": [MS // 2]})
    assert find_waits(ops, done).rows() == [(0, 1, round(9.6 * MS), "ar", round(8.6 * MS))]
    later = done.with_columns(end_ns=pl.lit(round(11.6 * MS)))
    assert find_waits(ops, later).height == 0
    body = pl.DataFrame({"rank": [0], "tid": [1], "name": ["bwd"], "ts_ns": [1 * MS],
                         "end_ns": [round(9.6 * MS)]})
    assert find_waits(body, done).height == 0
    # in the graph: the wait's edge from the completion has lag -0.7 ms
    step = pl.DataFrame({"rank": [0, 0, 0, 0, 0], "tid": [1, 1, 1, 1, 2],
                         "name": ["ProfilerStep#1", "fwd", "c10d::allreduce_", "opt",
                                  "gloo:all_reduce"],
                         "ts_ns": [0, 0, MS // 2, round(9.6 * MS), MS],
                         "end_ns": [10 * MS, MS // 2, 1 * MS, 10 * MS, round(10.3 * MS)],
                         "collective": [None, None, "all_reduce", None, "all_reduce"]})
    coll = pl.DataFrame({"instance": ["ar"], "rank": [0], "collective": ["all_reduce"],
                         "name": ["gloo:all_reduce"], "arrival_ns": [1 * MS],
                         "end_ns": [round(10.3 * MS)]})
    g = build_graph(step, coll)
    assert g.edges.filter(pl.col("kind") == "wait").get_column("lag_ns").to_list() == [
        round(-0.7 * MS)]
    assert self_check(g, replay_graph(g)).steps.select("measured_ns", "replayed_ns").row(0) \
        == (10 * MS, 10 * MS)


def test_the_replay_of_the_measured_run_reproduces_it(graph):
    check = self_check(graph, replay_graph(graph))
    assert check.steps.select("step", "measured_ns", "replayed_ns").rows() == [
        (1, 75 * MS, 75 * MS)]
    assert (check.median, check.p90, check.trusted) == (0.0, 0.0, True)


def test_typical_slow_rank_gains_its_stall(graph):
    _, (typical,) = whatif(graph, ["rank=1:typical"])
    assert typical["steps"] == [{"step": 1, "predicted_ns": 35 * MS, "replayed_ns": 35 * MS}]
    assert typical["gain_ns_per_step"] == 40 * MS
    assert typical["step_ns_mean"] == typical["step_ns_p50"] == 35 * MS
    assert typical["slowdown"] == pytest.approx(75 / 35)


def test_a_fast_ranks_typical_changes_nothing(graph):
    _, (fast,) = whatif(graph, ["rank=0:typical"])
    assert fast["gain_ns_per_step"] == 0


def test_comm_scaled_holds_every_rank_that_depends_on_it(graph):
    _, (slower,) = whatif(graph, ["comm=x2"])
    assert slower["step_ns_mean"] == pytest.approx(83.9 * MS, abs=1)
    assert slower["gain_ns_per_step"] == pytest.approx(-8.9 * MS, abs=1)


def test_stalls_off_cuts_the_unannotated_stall(graph):
    _, (off,) = whatif(graph, ["stalls=off"])
    assert off["step_ns_mean"] == 35 * MS


def test_specs_combine(graph):
    _, (both,) = whatif(graph, ["rank=1:typical,comm=x2"])
    # issue at 10, arrive 11, completion 11 + 17.8 = 28.8: every rank resumes at 28.9 -> 43.9
    assert both["step_ns_mean"] == pytest.approx(43.9 * MS, abs=1)


def test_op_scaling_scales_the_matched_ops_time(graph):
    _, (opt,) = whatif(graph, ["op=^opt$:x0.5"])
    assert opt["gain_ns_per_step"] == 5 * MS  # opt's 10 ms halved on every rank


def test_a_wait_kept_as_work_would_gain_nothing():
    ops = _ops()
    blind = build_graph(ops, _collectives(ops), options=WaitOptions(
        tolerance_ns=0, relative_tolerance=0.0, late_resumes=False))
    assert blind.points.filter(pl.col("kind") == "wait").height == 0
    _, (typical,) = whatif(blind, ["rank=1:typical"])
    assert typical["gain_ns_per_step"] == 0


def test_a_dependency_that_does_not_reproduce_is_named():
    # rank 2's all-reduce ends 20 ms after the others' (and it resumes then): one transfer
    # per instance (the median, 8.9) replays it 20 ms early
    ops = _ops().with_columns(
        end_ns=pl.when((pl.col("rank") == 2) & (pl.col("name") == "gloo:all_reduce"))
        .then(int(79.9 * MS)).otherwise(pl.col("end_ns")),
        ts_ns=pl.when((pl.col("rank") == 2) & pl.col("name").is_in(["opt", "tail"]))
        .then(pl.col("ts_ns") + 20 * MS).otherwise(pl.col("ts_ns")))
    ops = ops.with_columns(end_ns=pl.when((pl.col("rank") == 2) & pl.col("name").is_in(
        ["opt", "tail", "ProfilerStep#1"])).then(pl.col("end_ns") + 20 * MS)
        .otherwise(pl.col("end_ns")))
    g = build_graph(ops, _collectives(ops))
    check = self_check(g, replay_graph(g))
    # measured: the longest rank's step, 95; replayed 75 everywhere
    assert check.steps.select("measured_ns", "replayed_ns").row(0) == (95 * MS, 75 * MS)
    assert check.p90 == pytest.approx(20 / 95)
    assert not check.trusted
    cause = check.causes.row(0, named=True)
    assert (cause["rank"], cause["kind"], cause["instance"]) == (2, "complete", "default#0")
    assert "earlier in the replay" in cause["what"]


@pytest.mark.parametrize("text", ["", "rank=x:typical", "rank=1", "comm=2", "comm=x",
                                  "op=(:x2", "op=a", "stalls=on", "ranks=some:typical",
                                  "kernel=:x2"])
def test_bad_specs_are_refused(text):
    with pytest.raises(SpecError):
        parse_scenario(text)


def test_a_regex_with_commas_stays_one_spec():
    (spec,) = parse_scenario("op=a{1,2}:x3")
    assert (spec.kind, spec.pattern, spec.factor) == ("op", "a{1,2}", 3.0)


# ----------------------------------------------------------------------------- the CLI
def _kineto(rank: int) -> list[dict]:
    events = []
    for _, tid, name, s, e, coll in _rank_ops(rank):
        cat = "user_annotation" if name.startswith(("ProfilerStep", "gloo:")) else "cpu_op"
        ev = {"ph": "X", "cat": cat, "name": name, "pid": 100 + rank, "tid": tid,
              "ts": s / 1000, "dur": (e - s) / 1000, "args": {}}
        if coll:
            ev["args"] = {"Collective name": coll, "Process Group Name": "default"}
        events.append(ev)
    return events


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replay")
    for rank in range(3):
        write_trace(root / f"rank-{rank}.pt.trace.json", _kineto(rank),
                    distributedInfo={"rank": rank, "world_size": 3, "backend": "gloo"})
    return root


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                          text=True, cwd=ROOT)


def test_cli_json_contract_on_the_hand_drawn_run(hand_run, tmp_path):
    out = _cli("whatif", str(hand_run), "--align", "none", "--json", "--cache-dir",
               str(tmp_path), "--scenario", "rank=1:typical", "--scenario", "ranks=all:typical")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["steps"] == [{"step": 1, "measured_ns": 75 * MS, "replayed_ns": 75 * MS,
                             "error": 0.0}]
    assert doc["replay_error"] == {"median": 0.0, "p90": 0.0} and doc["trusted"] is True
    typical, every = doc["scenarios"]
    assert typical["spec"] == "rank=1:typical"
    assert (typical["step_ns_mean"], typical["step_ns_p50"], typical["gain_ns_per_step"]) \
        == (35 * MS, 35 * MS, 40 * MS)
    assert typical["steps"][0]["step"] == 1 and typical["steps"][0]["predicted_ns"] == 35 * MS
    assert every["gain_ns_per_step"] == 40 * MS  # the fast ranks are the median already


def test_cli_bad_spec_is_a_one_line_usage_error(hand_run):
    out = _cli("whatif", str(hand_run), "--scenario", "rank=one:typical")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "rank=one:typical" in out.stderr


def test_api_answers_as_the_cli(hand_run, tmp_path):
    import traceview
    run = traceview.open(str(hand_run), align="none", cache_dir=str(tmp_path))
    result = run.whatif("rank=1:typical")
    out = _cli("whatif", str(hand_run), "--align", "none", "--json", "--cache-dir",
               str(tmp_path), "--scenario", "rank=1:typical")
    assert result.to_dict() == json.loads(out.stdout)


# ----------------------------------------------------------------------------- real runs
REPLAY = ROOT / "fixtures" / "data" / "replay"

def _runs(folders: list[Path]) -> list[Path]:
    """The run folders among ``folders``: those holding trace files themselves."""
    return sorted(p for p in folders if p.is_dir() and any(p.glob("*trace.json*")))


FIXTURES = _runs(list((ROOT / "fixtures" / "data" / "scenarios").iterdir())
                 + list((ROOT / "fixtures" / "data").glob("gloo_*"))
                 + list(REPLAY.iterdir()))


@functools.lru_cache(maxsize=None)
def _whatif(path: Path):
    """The fixture's ``whatif`` answer, once per session (two tests read it)."""
    import traceview
    return traceview.open(str(path)).whatif()


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_every_multi_rank_fixture_gets_a_replay_error_and_its_reasons(path):
    result = _whatif(path)
    err = result["replay_error"]
    assert result["steps"].height >= 3 and err["median"] is not None
    assert result["graph"]["forced"] == 0
    if result["trusted"]:
        assert err["p90"] <= 0.05
    else:  # every step beyond 5% names the point that does not reproduce
        bad = result["steps"].filter(pl.col("error") > 0.05).get_column("step").to_list()
        assert result["not_reproduced"].get_column("step").to_list() == bad
        assert any("not trusted" in n for n in result["notes"])


#: The fixtures whose replay error misses issue 46's bar (median <= 1%, p90 <= 3%), as
#: measured when the bar's test was written (benchmarks/replay_error.py prints them). Strict:
#: a fixture that comes within the bar fails here until it is taken off the list, so the list
#: can only shrink, and one that meets it today must keep meeting it. Why they miss: a
#: member's completion after its instance's last arrival scatters by milliseconds on the
#: 2-core recording host, noise one typical transfer per instance cannot follow (with each
#: member's own transfer every one replays within 0.1%: the test below); pipelines' p2p
#: transfers scatter most.
REPLAY_ERROR_MISSES = {
    "gloo_ddp_2r": "median 3.6%, p90 5.9%",
    "gloo_ddp_4r_noisy": "median 10.0%, p90 18.4%",
    "gloo_ddp_4r_noisy_slow2": "median 1.2%, p90 2.7%",
    "gloo_windows_2r": "median 11.5%, p90 24.4%",
    "ddp1b_backward_stall_r1": "median 1.3%, p90 7.3%",
    "ddp1b_balanced": "median 4.8%, p90 16.4%",
    "ddp1b_gil_r3": "median 5.4%, p90 11.0%",
    "ddp1b_rotating": "median 2.4%, p90 3.6%",
    "ddp1b_stall_r1_r3": "median 2.2%, p90 4.3%",
    "ddp1b_stall_r2": "median 1.7%, p90 3.2%",
    "ddp8_balanced": "median 20.4%, p90 24.5%",
    "ddp8_stall_r5": "median 7.7%, p90 11.5%",
    "ddpb_balanced": "median 9.3%, p90 18.2%",
    "ddpb_intermittent_r1": "median 9.3%, p90 19.2%",
    "ddpb_stall_r2": "median 3.0%, p90 7.0%",
    "ddphook_balanced": "median 9.4%, p90 25.8%",
    "ddphook_slow_comm_r0": "median 2.3%, p90 4.4%",
    "fsdp2_balanced": "median 2.8%, p90 5.3%",
    "fsdp2_compute_r1": "median 3.2%, p90 5.1%",
    "pp1f1b_balanced": "median 21.8%, p90 38.2%",
    "pp1f1b_compute_s1": "median 8.4%, p90 14.8%",
    # the DP all-reduces matched since 2026-12-08 (their group was unknown): the concurrent
    # pairs on gloo's two worker threads replay up to 1.5 ms off with one transfer
    "tpsp_balanced": "median 3.9%, p90 8.3%",
    "tpsp_stall_r3": "median 1.0%, p90 3.3%",
    "a2a_balanced": "median 3.4%, p90 4.1%",
    "a2a_routing_r1": "median 2.2%, p90 4.8%",
    "a2a_routing_r2_noisy": "median 1.6%, p90 3.7%",
    "ddp_balanced": "median 5.3%, p90 18.5%",
    "ddp_balanced_noisy": "median 1.2%, p90 5.5%",
    "ddp_compute_r1": "median 3.0%, p90 6.0%",
    "ddp_compute_r3_noisy": "median 1.3%, p90 4.2%",
    "ddp_dataloader_r3": "median 6.8%, p90 9.1%",
    "ddp_labelled_r0": "median 1.5%, p90 4.1%",
    "ddp_stall_r0": "median 4.3%, p90 17.0%",
    "ddp_stall_r1_weak": "median 4.5%, p90 14.7%",
    "ddp_stall_r2": "median 3.7%, p90 10.1%",
    "ddp_stall_r2_noisy": "median 0.9%, p90 4.7%",
    "pipeline_balanced": "median 15.6%, p90 22.4%",
    "pipeline_compute_s0": "median 6.3%, p90 11.8%",
    "pipeline_compute_s2": "median 8.7%, p90 21.8%",
    "pipeline_stall_s3": "median 10.9%, p90 18.6%",
    "tpdp_balanced": "median 3.0%, p90 8.5%",
    "tpdp_compute_r0": "median 2.2%, p90 4.6%",
    "tpdp_dataloader_r1": "median 1.1%, p90 4.2%",
    "tpdp_stall_r3": "median 1.1%, p90 2.2%",
}


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=REPLAY_ERROR_MISSES[p.name]))
    if p.name in REPLAY_ERROR_MISSES else p for p in FIXTURES], ids=[p.name for p in FIXTURES])
def test_every_multi_rank_fixture_meets_the_replay_error_bar(path):
    """Issue 46's bar: median <= 1% and p90 <= 3% (the OSDI'25 study: 1.3% / 5.5%)."""
    err = _whatif(path)["replay_error"]
    assert err["median"] <= 0.01 and err["p90"] <= 0.03


def test_a_real_ddp_straggler_typical_gain_is_the_twins_difference():
    """ddp_stall_r2: rank 2 sleeps in forward each step; ddp_balanced is its twin (truth.json:
    mean step per rank, measured by the generator). DDP's reducer waits inside backward on
    the other ranks: found, so rank 2's typical gains at least what the twins differ by and
    at most the sleep. (4 ranks on 2 cores: the sleep frees a core for the others, so the
    twins differ by less than the sleep; the replay knows no CPU contention.)"""
    import traceview
    scenarios = ROOT / "fixtures" / "data" / "scenarios"

    def mean_step_ns(name: str) -> float:
        steps = json.loads((scenarios / name / "truth.json").read_text())["measured"]["step_ms"]
        return sum(steps.values()) / len(steps) * MS

    twins = mean_step_ns("ddp_stall_r2") - mean_step_ns("ddp_balanced")
    result = traceview.open(str(scenarios / "ddp_stall_r2")).whatif("rank=2:typical",
                                                                     "rank=0:typical")
    assert result["replay_error"]["median"] <= 0.05
    slow, fast = result["scenarios"]
    delay = json.loads((scenarios / "ddp_stall_r2" / "truth.json").read_text())["delay_ms"]
    assert 0.9 * twins <= slow["gain_ns_per_step"] <= 1.1 * delay * MS
    assert abs(fast["gain_ns_per_step"]) < 0.25 * slow["gain_ns_per_step"]


# ----------------------------------------------------------------------------- verdicts
def _many(ranks: int, steps: int, stalls: dict[tuple[int, int], int]) -> tuple:
    """The hand-drawn step above, ``steps`` times 200 ms apart, on ``ranks`` ranks, rank r
    stalling ``stalls[(r, s)]`` ms before its issue in step s. By hand, a step lasts
    35 ms + its largest stall: the all-reduce completes 1 + 8.9 ms after the last issue at
    10 + stall, every rank resumes 0.1 ms later and runs 15 ms more."""
    rows, coll = [], []
    for s in range(steps):
        base = s * 200
        stall = [stalls.get((r, s), 0) for r in range(ranks)]
        done = 10 + max(stall) + 1 + 8.9
        for r in range(ranks):
            issue = 10 + stall[r]
            resume = done + 0.1
            ops = [(f"ProfilerStep#{s}", 0, resume + 15, None), ("fwd", 0, 10, None),
                   ("c10d::allreduce_", issue, issue + 1, "all_reduce"),
                   ("bwd", issue + 1, issue + 10, None), ("opt", resume, resume + 10, None),
                   ("tail", resume + 10, resume + 15, None)]
            rows += [(r, 1, n, round((base + a) * MS), round((base + b) * MS), c)
                     for n, a, b, c in ops]
            rows.append((r, 2, "gloo:all_reduce", round((base + issue + 1) * MS),
                         round((base + done) * MS), "all_reduce"))
            coll.append((f"default#{s}", r, "all_reduce", "gloo:all_reduce",
                         round((base + issue + 1) * MS), round((base + done) * MS)))
    ops = pl.DataFrame(rows, schema=["rank", "tid", "name", "ts_ns", "end_ns", "collective"],
                       orient="row")
    coll = pl.DataFrame(coll, schema=["instance", "rank", "collective", "name", "arrival_ns",
                                      "end_ns"], orient="row")
    return replay_run(build_graph(ops, coll))


def test_a_stall_on_two_of_eight_steps_is_named_with_its_steps_and_cost():
    replay = _many(4, 8, {(1, 2): 40, (1, 5): 40})
    assert replay.check.steps.get_column("replayed_ns").to_list() == \
        [35 * MS] * 2 + [75 * MS] + [35 * MS] * 2 + [75 * MS] + [35 * MS] * 2
    verdict = culprits(replay)
    assert verdict["pattern"] == "few_steps"
    (only,) = verdict["culprits"]
    assert (only["rank"], only["steps"]) == (1, [2, 5])
    assert only["cost_ns_per_occurrence"] == pytest.approx(40 * MS)
    assert only["gain_ns_per_step"] == pytest.approx(10 * MS)  # 80 ms over 8 steps
    assert only["confidence"] == "high"


def test_a_stall_moving_between_ranks_has_a_total_cost_and_no_single_straggler():
    replay = _many(4, 8, {(s % 4, s): 40 for s in range(8)})
    verdict = culprits(replay)
    assert verdict["pattern"] == "moving" and verdict["culprits"] == []
    assert verdict["moving_ranks"] == [0, 1, 2, 3]
    assert verdict["moving_cost_ns_per_step"] == pytest.approx(40 * MS)


def test_two_culprits_each_with_its_own_gain_and_the_combined_gain_replayed():
    replay = _many(6, 8, {**{(1, s): 40 for s in range(8)}, **{(3, s): 25 for s in range(8)}})
    # alone, rank 3's typical gains nothing: rank 1 still sets the pace
    gains = dict(rank_gains(replay).select("rank", "gain_ns_per_step").rows())
    assert gains[1] == pytest.approx(15 * MS) and gains[3] == pytest.approx(0)
    verdict = culprits(replay)
    assert verdict["pattern"] == "steady"
    assert [(c["rank"], round(c["gain_ns_per_step"] / MS, 6)) for c in verdict["culprits"]] \
        == [(1, 15.0), (3, 25.0)]
    assert verdict["combined_gain_ns_per_step"] == pytest.approx(40 * MS)  # 75 -> 35


def test_the_replays_critical_path_runs_through_the_slow_rank():
    replay = _many(6, 8, {**{(1, s): 40 for s in range(8)}, **{(3, s): 25 for s in range(8)}})
    ranks = path_ranks(critical_path(replay))
    assert ranks.row(0, named=True)["rank"] == 1
    # the path tiles the time from the first step's start to the last step's end
    assert ranks.get_column("path_ns").sum() == 7 * 200 * MS + 75 * MS


def test_type_slowdowns_name_the_stalls():
    replay = _many(4, 8, {(1, s): 40 for s in range(8)})
    types = {t: s for t, s in type_slowdowns(replay).select("type", "slowdown").rows()}
    assert types["stalls"] == pytest.approx(75 / 35) and types["work"] == pytest.approx(75 / 35)
    assert types["transfer"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- GPU
def _gpu_step() -> pl.DataFrame:
    """One rank, one step (ms): the host launches a kernel at 10 (cudaLaunchKernel [10, 12),
    correlation 1), the kernel runs on stream 7 [15, 60), the host waits in
    cudaDeviceSynchronize [12, 61), then `opt` [61, 70) and a tail [70, 75)."""
    rows = [("ProfilerStep#1", "user_annotation", 0, 75, None, None),
            ("cudaLaunchKernel", "cuda_runtime", 10, 12, None, 1),
            ("cudaDeviceSynchronize", "cuda_runtime", 12, 61, None, None),
            ("opt", "cpu_op", 61, 70, None, None), ("tail", "cpu_op", 70, 75, None, None),
            ("gemm", "kernel", 15, 60, 7, 1)]
    return pl.DataFrame(
        [(0, 1 if k != "kernel" else 7, n, k, a * MS, b * MS, st, c)
         for n, k, a, b, st, c in rows],
        schema=["rank", "tid", "name", "kind", "ts_ns", "end_ns", "stream", "correlation"],
        orient="row")


def test_a_host_sync_waits_on_the_kernel_it_ends_at():
    g = build_graph(_gpu_step(), pl.DataFrame())
    (wait,) = g.points.filter(pl.col("kind") == "wait").rows(named=True)
    # blocked from the sync's start (12, after the launch at 10) to its end (61)
    assert (wait["t_ns"], wait["blocked_ns"], wait["instance"]) == (61 * MS, 49 * MS, "gpu#1")
    launch = g.edges.filter(pl.col("kind") == "launch").row(0, named=True)
    assert launch["lag_ns"] == 5 * MS  # the kernel started 5 ms after its launch, stream idle
    check = self_check(g, replay_graph(g))
    assert check.steps.select("measured_ns", "replayed_ns").row(0) == (75 * MS, 75 * MS)


def test_kernel_scaling_moves_the_host_through_its_sync():
    g = build_graph(_gpu_step(), pl.DataFrame())
    _, (slower, host) = whatif(g, ["kernel=gemm:x2", "op=^opt$:x0.5"])
    # the kernel ends at 10 + 5 + 90 = 105, the sync at 106, the step at 120
    assert slower["step_ns_mean"] == 120 * MS and slower["gain_ns_per_step"] == -45 * MS
    assert host["gain_ns_per_step"] == 4.5 * MS  # opt [61, 70) halved


def _truth(name: str) -> dict:
    return json.loads((REPLAY / name / "truth.json").read_text())


@pytest.mark.parametrize("name", sorted(p.name for p in REPLAY.iterdir()
                                        if p.is_dir() and p.name.endswith("_balanced")))
def test_a_balanced_twin_names_no_culprit_with_confidence(name):
    import traceview
    verdict = traceview.open(str(REPLAY / name)).whatif()["verdict"]
    assert verdict["pattern"] in ("none", "steady")
    assert all(c["confidence"] == "low" for c in verdict["culprits"])


def test_a_stall_moving_between_ranks_in_a_real_run():
    import traceview
    verdict = traceview.open(str(REPLAY / "ddp1b_rotating")).whatif()["verdict"]
    assert verdict["pattern"] == "moving" and verdict["culprits"] == []
    assert verdict["moving_ranks"] == _truth("ddp1b_rotating")["slow_ranks"]
    twins = _truth("ddp1b_rotating")["measured"]["twin_difference_ms"] * MS
    assert verdict["moving_cost_ns_per_step"] == pytest.approx(twins, rel=0.25)


def test_a_stall_on_two_of_eight_steps_in_a_real_run():
    import traceview
    truth = _truth("ddpb_intermittent_r1")
    steps = [truth["profiler_steps"][i] for i in truth["steps_affected"]["1"]]
    result = traceview.open(str(REPLAY / "ddpb_intermittent_r1")).whatif("rank=1:typical")
    (culprit,) = result["verdict"]["culprits"]
    assert (result["verdict"]["pattern"], culprit["rank"], culprit["steps"]) == \
        ("few_steps", 1, steps)
    gain = result["scenarios"][0]["gain_ns_per_step"]
    assert gain == pytest.approx(truth["measured"]["twin_difference_ms"] * MS, rel=0.25)


def test_the_corpus_nccl_pair_replays_within_the_trusted_bound():
    """The sampled NCCL pair of the corpus (GPU; launches, host syncs, SendRecv kernels)."""
    from fixtures.corpus import absent, corpus_dir
    import traceview
    folder = corpus_dir() / "hta-tests-data" / "tests" / "data" / "trace_filter"
    files = [folder / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    if not all(f.exists() for f in files):
        pytest.skip(absent(folder))
    result = traceview.open([str(f) for f in files]).whatif()
    assert result["trusted"] and result["replay_error"]["p90"] <= 0.05
    assert result["graph"]["forced"] == 0 and result["graph"]["points"] > 4000


def _two_streams() -> tuple[pl.DataFrame, pl.DataFrame]:
    """One rank (ms): `a` on stream 7 [15, 40) launched at 10; cudaEventRecord on stream 7 at
    12; cudaStreamWaitEvent for stream 9 at 13; `b` on stream 9 launched at 14 runs [40, 50):
    it waited for `a` through the event; the host waits in cudaDeviceSynchronize [16, 51),
    then a tail [51, 60)."""
    rows = [("ProfilerStep#1", "user_annotation", 0, 60, None, None),
            ("cudaLaunchKernel", "cuda_runtime", 10, 11, None, 1),
            ("cudaEventRecord", "cuda_runtime", 12, 12.5, None, 2),
            ("cudaStreamWaitEvent", "cuda_runtime", 13, 13.5, None, 3),
            ("cudaLaunchKernel", "cuda_runtime", 14, 15, None, 4),
            ("cudaDeviceSynchronize", "cuda_runtime", 16, 51, None, None),
            ("tail", "cpu_op", 51, 60, None, None),
            ("a", "kernel", 15, 40, 7, 1), ("b", "kernel", 40, 50, 9, 4)]
    ops = pl.DataFrame([(0, st or 1, n, k, round(a * MS), round(b * MS), st, c)
                        for n, k, a, b, st, c in rows],
                       schema=["rank", "tid", "name", "kind", "ts_ns", "end_ns", "stream",
                               "correlation"], orient="row")
    waits = pl.DataFrame({"rank": [0], "waiter": ["stream"], "stream": [9],
                          "wait_on_stream": [7], "record_ts_ns": [12 * MS],
                          "call_ts_ns": [13 * MS]})
    return ops, waits


def test_a_stream_wait_event_holds_the_waiting_streams_kernel():
    ops, waits = _two_streams()
    blind = build_graph(ops, pl.DataFrame())
    g = build_graph(ops, pl.DataFrame(), stream_waits=waits)
    assert g.edges.filter(pl.col("kind") == "stream_wait").height == 1
    # without the edge `b` replays 15.5 ms after its launch (the median delay on an idle
    # stream): the step comes out short, a missing dependency as replay error
    assert self_check(blind, replay_graph(blind)).steps.get_column("replayed_ns")[0] < 60 * MS
    assert self_check(g, replay_graph(g)).steps.select("measured_ns", "replayed_ns").row(0) \
        == (60 * MS, 60 * MS)
    # `a` twice as long: 15 + 5 + 50 = 65 (wait: 10 + 5 + 50), `b` ends 75, the sync 76, step 85
    _, (slower,) = whatif(g, ["kernel=^a$:x2"])
    assert slower["step_ns_mean"] == 85 * MS


def test_a_run_without_step_markers_is_one_step_its_window():
    ops, waits = _two_streams()
    g = build_graph(ops.filter(pl.col("name") != "ProfilerStep#1"), pl.DataFrame(),
                    stream_waits=waits)
    check = self_check(g, replay_graph(g))
    # from the first point (the launch at 10) to the last (the sync's end at 51)
    assert check.steps.select("step", "measured_ns", "replayed_ns").rows() == [
        (-1, 41 * MS, 41 * MS)]


# ------------------------------------------------------ GPU stream waits from Kineto JSON
def _kineto_two_streams(path: Path, *, sync_events: bool) -> Path:
    """``_two_streams`` as the profiler writes it (µs): the host thread's runtime calls, the
    two kernels with their correlations and, with CUDA sync events, the ``cuda_sync`` row of
    the cudaStreamWaitEvent (correlation 3: stream 9 waits on stream 7 for the record of
    correlation 2)."""
    def x(cat, name, ts, end, pid=7, tid=7, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": end - ts, "args": args}
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 60_000),
        x("cuda_runtime", "cudaLaunchKernel", 10_000, 11_000, correlation=1),
        x("cuda_runtime", "cudaEventRecord", 12_000, 12_500, correlation=2),
        x("cuda_runtime", "cudaStreamWaitEvent", 13_000, 13_500, correlation=3),
        x("cuda_runtime", "cudaLaunchKernel", 14_000, 15_000, correlation=4),
        x("cuda_runtime", "cudaDeviceSynchronize", 16_000, 51_000, correlation=5),
        x("cpu_op", "tail", 51_000, 60_000),
        x("kernel", "a", 15_000, 40_000, pid=0, tid=7, device=0, stream=7, correlation=1),
        x("kernel", "b", 40_000, 50_000, pid=0, tid=9, device=0, stream=9, correlation=4),
    ]
    if sync_events:
        events.append(x("cuda_sync", "Stream Wait Event", 13_200, 13_200, pid=0, tid=9,
                        cuda_sync_kind="stream_wait_event", wait_on_stream=7,
                        wait_on_cuda_event_record_corr_id=2, stream=9, correlation=3,
                        device=0, context=1))
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                                "distributedInfo": {"rank": 0, "world_size": 1}}))
    return path


def test_kineto_stream_wait_edges_reach_the_replay(tmp_path):
    """Through the Kineto parser: with the ``cuda_sync`` row the step replays exactly (60 ms,
    by hand as in ``_two_streams``); without it `b` replays soon after its launch at 14 ms,
    not after `a` at 40, so the step comes out short, and the answer says why: the trace has
    no CUDA sync events."""
    import traceview
    good = traceview.open(str(_kineto_two_streams(tmp_path / "with.json", sync_events=True)),
                          cache=False).whatif()
    assert good["steps"].select("measured_ns", "replayed_ns").row(0) == (60 * MS, 60 * MS)
    assert not any("CUDA sync events" in n for n in good["notes"])
    blind = traceview.open(str(_kineto_two_streams(tmp_path / "without.json",
                                                   sync_events=False)), cache=False).whatif()
    assert blind["steps"].get_column("replayed_ns")[0] < 60 * MS
    assert any("without CUDA sync events" in n and "enable_cuda_sync_events=True" in n
               for n in blind["notes"])


SYNTHETIC = {"ddp_slow1": {"slow_rank": 1}, "ddp_balanced": {"slow_rank": None},
             "alltoall_hot2": {"alltoall_tokens": 1400, "alltoall_hot_rank": 2},
             "gpipe": {"pipeline_micro_batches": 4}}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_nccl_runs_replay_within_the_bar_with_cuda_sync_events(name, tmp_path):
    """The synthetic NCCL runs (fixtures/synthetic.py: each NCCL kernel waits on the stream
    for its gradient's kernel, the optimiser for NCCL). Written as a profiler with CUDA sync
    events writes them, the replay meets issue 46's bar (median <= 1%, p90 <= 3%); without
    them the NCCL kernels replay at their launch, milliseconds early, and the answer names
    the missing events as the cause."""
    import traceview
    from fixtures.synthetic import SyntheticSpec, generate
    spec = SyntheticSpec(world_size=4, steps=6, **SYNTHETIC[name])
    generate(dataclasses.replace(spec, cuda_sync_events=True), tmp_path / "sync")
    result = traceview.open(str(tmp_path / "sync"), cache=False).whatif()
    err = result["replay_error"]
    assert err["median"] <= 0.01 and err["p90"] <= 0.03 and result["trusted"]
    generate(spec, tmp_path / "plain")
    blind = traceview.open(str(tmp_path / "plain"), cache=False).whatif()
    assert blind["replay_error"]["median"] > 0.03
    assert any("without CUDA sync events" in n for n in blind["notes"])


#: Where the graph itself is not yet exact (strict: fixed ones fail until taken off). tpsp: 1-2
#: of 32 data-parallel all-reduces a run, two of them in flight at once on gloo's two worker
#: threads, are paired across ranks in the wrong order (their completions cross), so an own
#: completion lands before the arrival it is paired with.
OWN_TRANSFER_MISSES = {
    "tpsp_balanced": "p90 1.3%: concurrent DP all-reduces paired out of order",
    "tpsp_stall_r3": "p90 0.14%: concurrent DP all-reduces paired out of order",
}


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=OWN_TRANSFER_MISSES[p.name]))
    if p.name in OWN_TRANSFER_MISSES else p for p in FIXTURES], ids=[p.name for p in FIXTURES])
def test_every_multi_rank_fixture_replays_exactly_with_its_own_transfers(path):
    """The graph is consistent on every fixture: with each member's own measured completion
    (``transfers="own"``) instead of its instance's typical transfer, the replay of the
    measured run reproduces every step within 0.1%, and no node is forced. So no edge holds a
    point later than it ran, and no blocked time is removed without the dependency that
    explains it; what replay error is left (the test above) is the transfer model's: one
    typical transfer against completions that scatter by milliseconds on an oversubscribed
    host (benchmarks/replay_error.py prints both)."""
    import traceview
    from traceview.analyses.replay.check import self_check as check_of
    from traceview.run.replay import replay_of
    own = replay_of(traceview.open(str(path)), transfers="own")
    check = check_of(own.graph, own.base)
    assert check.forced == 0 and check.p90 is not None and check.p90 <= 0.001


def test_own_transfers_are_each_members_completion():
    """Hand-drawn: the all-reduce of the module's step with rank 0's completion 2 ms later
    than the others' (59.9 and 61.9): typical transfers give every member the median 8.9 ms
    after the last arrival (51), own ones 8.9 and 10.9."""
    ops = _ops()
    late = (pl.col("rank") == 0) & (pl.col("name") == "gloo:all_reduce")
    ops = ops.with_columns(end_ns=pl.when(late).then(pl.col("end_ns") + 2 * MS)
                           .otherwise(pl.col("end_ns")))
    edges = {t: build_graph(ops, _collectives(ops), transfers=t).edges.filter(
        pl.col("kind") == "transfer").get_column("lag_ns").sort().to_list()
        for t in ("typical", "own")}
    assert edges["typical"] == [round(8.9 * MS)] * 3
    assert edges["own"] == [round(8.9 * MS), round(8.9 * MS), round(10.9 * MS)]
    with pytest.raises(ValueError, match="transfers"):
        build_graph(ops, _collectives(ops), transfers="median")


def test_a_kernel_queued_behind_another_keeps_the_streams_typical_gap():
    """One rank, one stream (ms). `a` launched at 10 runs [12, 20) on an idle stream (launch
    delay 2, the rank's typical); `b`, `c`, `d` are launched at 11, 12, 13, queued behind it,
    and start 2, 2 and 10 after the previous kernel's end: `b` [22, 30), `c` [32, 40), `d`
    [50, 60). The host waits in cudaDeviceSynchronize [14, 61), then a tail [61, 65).
    By hand: the typical queued gap is the median of (2, 2, 10) = 2, kept before each queued
    kernel (the device's own gap: without it the step replays 6 ms short); `d`'s 10 is capped
    at 2 (something the trace does not show held it: a missing stream wait stays replay
    error), so `d` replays [42, 52), the sync resumes 1 later at 53 and the step ends at 57,
    not 65."""
    rows = [("ProfilerStep#1", "user_annotation", 0, 65, None, None),
            ("cudaLaunchKernel", "cuda_runtime", 10, 10.5, None, 1),
            ("cudaLaunchKernel", "cuda_runtime", 11, 11.5, None, 2),
            ("cudaLaunchKernel", "cuda_runtime", 12, 12.5, None, 3),
            ("cudaLaunchKernel", "cuda_runtime", 13, 13.5, None, 4),
            ("cudaDeviceSynchronize", "cuda_runtime", 14, 61, None, None),
            ("tail", "cpu_op", 61, 65, None, None),
            ("a", "kernel", 12, 20, 7, 1), ("b", "kernel", 22, 30, 7, 2),
            ("c", "kernel", 32, 40, 7, 3), ("d", "kernel", 50, 60, 7, 4)]
    ops = pl.DataFrame([(0, st or 1, n, k, round(a * MS), round(b * MS), st, c)
                        for n, k, a, b, st, c in rows],
                       schema=["rank", "tid", "name", "kind", "ts_ns", "end_ns", "stream",
                               "correlation"], orient="row")
    g = build_graph(ops, pl.DataFrame())
    kernels = g.points.filter(pl.col("kind") == "kernel").sort("t_ns")
    assert kernels.get_column("work_ns").to_list() == [8 * MS, 10 * MS, 10 * MS, 12 * MS]
    replayed = replay_graph(g).time[:g.points.height]
    assert (replayed[kernels.get_column("point").to_numpy()] // MS).tolist() == [20, 30, 40, 52]
    assert self_check(g, replay_graph(g)).steps.select("measured_ns", "replayed_ns").row(0) \
        == (65 * MS, 57 * MS)


def test_gloos_reduce_scatter_run_as_an_all_reduce_is_issued_by_its_own_call():
    """Two ranks (ms). Each main thread calls c10d::allreduce_ at 10 (an async all-reduce of
    another group, not matched: no op of it in the graph) and c10d::_reduce_scatter_base_ at
    50; gloo runs the reduce-scatter as an all_reduce on its worker from 51 to 55. Two calls
    and one op: no first-in-first-out pairing. By kind, the all_reduce would be issued by the
    all_reduce call at 10 (an enqueue lag of 41 ms); by its family, by the reduce-scatter call
    at 50, the later: lag 1 ms."""
    rows = []
    for r in (0, 1):
        rows += [(r, 1, "ProfilerStep#1", 0, 60, None), (r, 1, "c10d::allreduce_", 10, 11,
                                                          "all_reduce"),
                 (r, 1, "c10d::_reduce_scatter_base_", 50, 50.5, "reduce_scatter"),
                 (r, 2, "gloo:all_reduce", 51, 55, "all_reduce")]
    ops = pl.DataFrame([(r, t, n, round(a * MS), round(b * MS), c) for r, t, n, a, b, c in rows],
                       schema=["rank", "tid", "name", "ts_ns", "end_ns", "collective"],
                       orient="row")
    coll = pl.DataFrame({"instance": ["tp#0"] * 2, "rank": [0, 1], "collective": "all_reduce",
                         "name": "gloo:all_reduce", "arrival_ns": [51 * MS] * 2,
                         "end_ns": [55 * MS] * 2})
    g = build_graph(ops, coll)
    issues = g.points.filter(pl.col("kind") == "issue")
    assert issues.select("rank", "t_ns").sort("rank").rows() == [(0, 50 * MS), (1, 50 * MS)]
    assert g.edges.filter(pl.col("kind") == "issue").get_column("lag_ns").to_list() == [MS, MS]


def test_a_step_that_does_not_reproduce_says_whether_the_transfer_model_or_an_edge_is_why():
    """Two ranks (ms): each issues an all-reduce at 10 ([10, 11)), gloo's worker runs it from
    12; rank 0's ends at 20 (8 after the last arrival), rank 1's at 30 (18); each main thread
    waits in a gap until 0.1 after its end, then `opt` for 10: steps 30.1 and 40.1. By hand:
    both members replay the median transfer, 13: complete at 25, steps 35.1 on both ranks;
    the step (the longest rank's) 40.1 -> 35.1, 12.5% off. The point that drifts most is a
    completion set by its instance (5 ms either way): cause ``transfer``, and its words give
    the member's own 8 or 18 against the typical 13. With each member's own transfer it
    reproduces. A kernel that waited on another stream the graph does not know (below) is a
    ``dependency``."""
    rows = []
    for r, end in ((0, 20), (1, 30)):
        rows += [(r, 1, "ProfilerStep#1", 0, end + 10.1, None),
                 (r, 1, "c10d::allreduce_", 10, 11, "all_reduce"),
                 (r, 2, "gloo:all_reduce", 12, end, "all_reduce"),
                 (r, 1, "opt", end + 0.1, end + 10.1, None)]
    ops = pl.DataFrame([(r, t, n, round(a * MS), round(b * MS), c) for r, t, n, a, b, c in rows],
                       schema=["rank", "tid", "name", "ts_ns", "end_ns", "collective"],
                       orient="row")
    coll = _collectives(ops)
    g = build_graph(ops, coll)
    check = self_check(g, replay_graph(g))
    assert check.steps.select("measured_ns", "replayed_ns").row(0) == (
        round(40.1 * MS), round(35.1 * MS))
    cause = check.causes.row(0, named=True)
    assert (cause["kind"], cause["cause"], abs(cause["drift_ns"])) == ("complete", "transfer",
                                                                         5 * MS)
    assert "its typical transfer is 13.0 ms" in cause["what"]
    own = build_graph(ops, coll, transfers="own")
    assert self_check(own, replay_graph(own)).causes.height == 0
    blind_ops, _ = _two_streams()
    blind = build_graph(blind_ops, pl.DataFrame())
    assert set(self_check(blind, replay_graph(blind)).causes.get_column("cause")) == {
        "dependency"}


def test_the_graph_is_the_same_from_build_to_build():
    """gloo_tp_dp_4r_slow2 has two issue points at one instant on one queue: every sort key
    tied, so they came out in either order, and with them the points' ids, links and stretch
    labels (6 builds gave 6 graphs). Now instance and correlation break the tie."""
    import traceview
    from traceview.run.replay import replay_of
    graphs = {tuple(frame.hash_rows().to_list())
              for _ in range(4)
              for g in [replay_of(traceview.open(str(ROOT / "fixtures" / "data"
                                                     / "gloo_tp_dp_4r_slow2"),
                                                 cache=False)).graph]
              for frame in (g.points, g.edges)}
    assert len(graphs) == 2  # one points frame and one edges frame across the builds
