"""Pipeline parallelism (analyses/pipeline.py, ``traceview pipeline``) on hand-drawn timelines
and on the real 4-stage GPipe runs of ``fixtures/scenarios.py``.

Hand-drawn: three CPU ranks, stage = rank, GPipe with 2 micro-batches, 4 identical steps of
1400 us (µs below; the events are in ns). Forward F = 100 on stages 0 and 2 but 150 on stage 1
(the slow stage), backward B = 200; a send returns at once, a recv ends 10 after the later of
its post and its send (the transfer); then a gloo all-reduce on a worker thread that ends at
1370 for everybody and the optimiser [1370,1400). One step (offset by 1400 per step):

  rank 0  F [0,100) send>1 @100  F [100,200) send>1 @200  recv<1 [200 ........ 950)
          B [950,1150)  recv<1 [1150,1160)  B [1160,1360)  all_reduce [1360,1370)
  rank 1  recv<0 [0,110)  F [110,260) send>2 @260  recv<0 [260,270)  F [270,420) send>2 @420
          recv<2 [420,740)  B [740,940) send>0 @940  recv<2 [940,950)  B [950,1150)
          send>0 @1150  all_reduce [1150 ......... 1370)
  rank 2  recv<1 [0,270)  F [270,370)  recv<1 [370,430)  F [430,530)  B [530,730) send>1 @730
          B [730,930) send>1 @930  all_reduce [930 ............... 1370)

Waits (a recv until its send started, within the call): rank 0: on downstream 740 (its first
backward recv: 940 - 200) and 0; rank 1: on upstream 100 and 0 (the second send came at 200,
before the recv at 260), on downstream 310 (730 - 420) and 0; rank 2: on upstream 260 and 50
(420 - 370). Transfers: 10 per recv: 20, 40, 20. Collectives: 10, 220 and 440, of which the
wait for the last arriver (rank 0, at 1360) 0, 210 and 430.

  compute = step - send/recv calls - collectives:
    rank 0: 1400 - 760 - 10 = 630;  rank 1: 1400 - 450 - 220 = 730;  rank 2: 1400 - 330 - 440 = 630
  bubble = the first recv's wait from each side + the collective waits after the last call:
    rank 0: 740;  rank 1: 100 + 310 + 210 = 620;  rank 2: 260 + 430 = 690
  idle = all waits: rank 0: 740;  rank 1: 620 (the least);  rank 2: 310 + 430 = 740

Bottleneck: rank 1, 730 - 630 = 100 per step (= 2 micro-batches x 50), in every step, no
jitter: clear; a step at the median stage's speed: 1300. Schedule: GPipe (every forward call
before the backward ones), m = 2 forward sends per step, p = 3: ideal (3-1)/(2+3-1) = 50%;
measured (740 + 620 + 690) / (3 x 1400) = 48.8%. With F = 100 on stage 1 too, every stage
computes 630 a step: no bottleneck.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from gpu_trace_helpers import frame, row, step
from traceview.analyses.p2p import PAIR_SCHEMA
from traceview.analyses.pipeline import pipeline, stage_order
from traceview.cli import main
from traceview.run.run import Run

US = 1000
PERIOD = 1400
SCENARIOS = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "scenarios"


def _timeline(slow: bool) -> list[tuple]:
    """One step as drawn in the module docstring: (rank, what, start, end, peer) in µs; a
    send is ``send``, a recv ``recv``, compute ``aten::mm``, the all-reduce ``all_reduce``."""
    if slow:
        return [
            (0, "aten::mm", 0, 100), (0, "send", 100, 100, 1), (0, "aten::mm", 100, 200),
            (0, "send", 200, 200, 1), (0, "recv", 200, 950, 1), (0, "aten::mm", 950, 1150),
            (0, "recv", 1150, 1160, 1), (0, "aten::mm", 1160, 1360),
            (0, "all_reduce", 1360, 1370),
            (1, "recv", 0, 110, 0), (1, "aten::mm", 110, 260), (1, "send", 260, 260, 2),
            (1, "recv", 260, 270, 0), (1, "aten::mm", 270, 420), (1, "send", 420, 420, 2),
            (1, "recv", 420, 740, 2), (1, "aten::mm", 740, 940), (1, "send", 940, 940, 0),
            (1, "recv", 940, 950, 2), (1, "aten::mm", 950, 1150), (1, "send", 1150, 1150, 0),
            (1, "all_reduce", 1150, 1370),
            (2, "recv", 0, 270, 1), (2, "aten::mm", 270, 370), (2, "recv", 370, 430, 1),
            (2, "aten::mm", 430, 530), (2, "aten::mm", 530, 730), (2, "send", 730, 730, 1),
            (2, "aten::mm", 730, 930), (2, "send", 930, 930, 1), (2, "all_reduce", 930, 1370),
        ]
    # balanced: stage 1's forward takes 100 too (1300 a step; derived the same way)
    return [
        (0, "aten::mm", 0, 100), (0, "send", 100, 100, 1), (0, "aten::mm", 100, 200),
        (0, "send", 200, 200, 1), (0, "recv", 200, 850, 1), (0, "aten::mm", 850, 1050),
        (0, "recv", 1050, 1060, 1), (0, "aten::mm", 1060, 1260), (0, "all_reduce", 1260, 1270),
        (1, "recv", 0, 110, 0), (1, "aten::mm", 110, 210), (1, "send", 210, 210, 2),
        (1, "recv", 210, 220, 0), (1, "aten::mm", 220, 320), (1, "send", 320, 320, 2),
        (1, "recv", 320, 640, 2), (1, "aten::mm", 640, 840), (1, "send", 840, 840, 0),
        (1, "recv", 840, 850, 2), (1, "aten::mm", 850, 1050), (1, "send", 1050, 1050, 0),
        (1, "all_reduce", 1050, 1270),
        (2, "recv", 0, 220, 1), (2, "aten::mm", 220, 320), (2, "recv", 320, 330, 1),
        (2, "aten::mm", 330, 430), (2, "aten::mm", 430, 630), (2, "send", 630, 630, 1),
        (2, "aten::mm", 630, 830), (2, "send", 830, 830, 1), (2, "all_reduce", 830, 1270),
    ]


def pipeline_run(*, slow: bool = True, steps: int = 4) -> Run:
    """The hand-drawn run: ``steps`` copies of the docstring's step, each with its
    ProfilerStep and the optimiser's op after the all-reduce."""
    period = PERIOD if slow else PERIOD - 100
    rows = []
    for k in range(steps):
        o = k * period
        for rank in range(3):
            rows.append({**step(k + 1, (o) * US, period * US, rank=rank), "pid": rank + 1})
            rows.append(row("cpu_op", "Optimizer.step#SGD.step", (o + period - 30) * US,
                            30 * US, rank=rank, pid=rank + 1, tid=1))
        for rank, what, start, end, *peer in _timeline(slow):
            ts, dur = (o + start) * US, (end - start) * US
            if what in ("send", "recv"):
                name = "c10d::send" if what == "send" else "c10d::recv_"
                rows.append(row("cpu_op", name, ts, dur, rank=rank, pid=rank + 1, tid=1,
                                args_json=json.dumps({"Concrete Inputs": ["", "", str(peer[0]),
                                                                          "0"]})))
            elif what == "all_reduce":
                rows.append(row("user_annotation", "gloo:all_reduce", ts, dur, rank=rank,
                                pid=rank + 1, tid=9))
            else:
                rows.append(row("cpu_op", what, ts, dur, rank=rank, pid=rank + 1, tid=1))
    return Run.from_events(frame(rows), align="none")


def test_stages_waits_bubble_and_compute_by_hand() -> None:
    res = pipeline_run().pipeline()
    stages = res["stages"]
    assert stages.select("rank", "stage", "upstream_rank", "downstream_rank").rows() == [
        (0, 0, None, 1), (1, 1, 0, 2), (2, 2, 1, None)]
    per_step = stages.select(
        "rank", *((pl.col(c) // pl.col("steps") // US).alias(c) for c in (
            "step_ns", "compute_ns", "wait_upstream_ns", "wait_downstream_ns",
            "p2p_transfer_ns", "collective_ns", "collective_wait_ns", "bubble_ns", "idle_ns")))
    assert per_step.rows() == [
        # rank, step, compute, wait up, wait down, transfer, collective, its wait, bubble, idle
        (0, 1400, 630, 0, 740, 20, 10, 0, 740, 740),
        (1, 1400, 730, 100, 310, 40, 220, 210, 620, 620),
        (2, 1400, 630, 310, 0, 20, 440, 430, 690, 740),
    ]
    assert stages.get_column("steps").to_list() == [4, 4, 4]
    assert stages.get_column("sends").to_list() == [8, 16, 8]
    assert stages.get_column("bubble_fraction").round(4).to_list() == [
        round(740 / 1400, 4), round(620 / 1400, 4), round(690 / 1400, 4)]
    # each step alike
    assert res["steps"].height == 12
    assert set(res["steps"].get_column("compute_ns").to_list()) == {630 * US, 730 * US}


def test_bottleneck_schedule_and_p2p_by_hand() -> None:
    res = pipeline_run().pipeline().to_dict()
    b = res["bottleneck"]
    assert (b["rank"], b["stage"], b["gain_ns_per_step"], b["clear"]) == (1, 1, 100 * US, True)
    assert (b["step_ns"], b["step_ns_at_median_speed"], b["steps_leading"], b["steps"]) == (
        1400 * US, 1300 * US, 4, 4)
    s = res["schedule"]
    assert (s["kind"], s["stages"], s["micro_batches"], s["chunks"]) == ("GPipe", 3, 2, None)
    assert s["ideal_bubble_fraction"] == 0.5
    assert s["bubble_fraction"] == pytest.approx(2050 / 4200)
    assert res["p2p"] == {"pairs": 32, "unmatched": 0, "unmatched_sends": 0,
                          "unmatched_recvs": 0}
    # the slow stage idles least
    idle = {r["rank"]: r["idle_fraction"] for r in res["stages"]}
    assert min(idle, key=idle.get) == 1


def test_a_balanced_pipeline_has_no_bottleneck() -> None:
    res = pipeline_run(slow=False).pipeline()
    assert res["stages"].select(pl.col("compute_ns") // 4 // US).to_series().to_list() == [
        630, 630, 630]
    assert res["stages"].select(pl.col("bubble_ns") // 4 // US).to_series().to_list() == [
        640, 620, 640]
    b = res["bottleneck"]
    assert (b["rank"], b["stage"], b["gain_ns_per_step"], b["clear"]) == (None, None, 0, False)
    assert res["schedule"]["bubble_fraction"] == pytest.approx(1900 / 3900)


def test_the_timeline_marks_the_bubbles() -> None:
    """Step 1's segments of rank 1: the first recv of each side and the all-reduce's wait
    are the bubble, the second recvs only transfer, the all-reduce's last 10 its transfer."""
    timeline = pipeline_run().pipeline(timeline=True)["timeline"]
    mine = timeline.filter((pl.col("rank") == 1) & (pl.col("step") == 1)).select(
        "part", pl.col("start_ns") // US, pl.col("end_ns") // US).rows()
    assert mine == [
        ("bubble", 0, 100), ("p2p_transfer", 100, 110), ("p2p_transfer", 260, 270),
        ("bubble", 420, 730), ("p2p_transfer", 730, 740), ("p2p_transfer", 940, 950),
        ("bubble", 1150, 1360), ("collective", 1360, 1370)]


def test_diagnose_names_the_bottleneck_stage() -> None:
    findings = pipeline_run().diagnose()["findings"]
    found = findings.filter(pl.col("id").str.contains("pipeline_bottleneck"))
    assert found.select("rank", "gain_ns_per_step").rows() == [(1, 100 * US)]
    assert "stage 1 (rank 1)" in found.get_column("title")[0]
    # ranked with the others by gain, but listed right before the straggler finding it
    # explains (the same rank: the cause is what to fix)
    ids = findings.get_column("id").to_list()
    ranks = findings.get_column("rank").to_list()
    at = ids.index("pipeline_bottleneck")
    if "straggler" in ids and ranks[ids.index("straggler")] == 1:
        assert ids[at + 1] == "straggler"
    gains = findings.filter(pl.col("gain_ns_per_step").is_not_null()
                            & (pl.col("id") != "pipeline_bottleneck")) \
        .get_column("gain_ns_per_step").to_list()
    assert gains == sorted(gains, reverse=True)
    assert pipeline_run(slow=False).diagnose()["findings"].filter(
        pl.col("id") == "pipeline_bottleneck").height == 0


def test_the_report_draws_the_stages_and_the_bubble_table() -> None:
    """A run with send/recv pairs gets a Pipeline section: the schedule against the ideal
    bubble, the bottleneck, one step's timeline per stage (the bubbles marked) and the
    bubble table; a run without pairs has no such section."""
    pytest.importorskip("plotly")
    from traceview.outputs import plots
    from traceview.outputs.report import gather, render_body

    data = gather(pipeline_run())
    body, _ = render_body(data)
    section = body[body.index('<section id="pipeline">'):]
    section = section[:section.index("</section>")]
    assert "GPipe, 3 stages, 2 micro-batches" in section
    assert "<b>48.8%</b>" in section and "50.0%" in section
    assert "Bottleneck: stage 1 (rank 1)</b>: 0.100 ms per step" in section
    assert "Pipeline stages over step 2 (the median step)" in section
    assert section.count("<tr>") == 1 + 3  # the header and one row a stage
    assert "<td>1</td><td>1</td><td>1.400</td><td>0.730</td><td>0.620</td>" in section
    assert '<a href="#pipeline">Pipeline</a>' in body
    steps = data.pipeline["steps"].filter(pl.col("step") == 1).select(
        "rank", "stage", start_ms=pl.col("step_start_ns") / 1e6,
        dur_ms=pl.col("step_ns") / 1e6)
    segments = data.pipeline["timeline"].filter(pl.col("step") == 1).select(
        "rank", "stage", "part", start_ms=pl.col("start_ns") / 1e6,
        dur_ms=(pl.col("end_ns") - pl.col("start_ns")) / 1e6)
    fig = plots.pipeline_timeline(steps, segments)
    names = [t.name for t in fig.data]
    assert names[0] == "own time (compute)" and "bubble (fill / drain wait)" in names
    bubble = fig.data[names.index("bubble (fill / drain wait)")]
    first = sorted(zip(bubble.y, bubble.base, bubble.x))[0]
    assert first[0] == "stage 0 (rank 0)" and first[1:] == pytest.approx((0.2, 0.74))
    plain = gather(Run.from_events(frame([step(1, 0, 100)]), align="none"))
    assert plain.pipeline is None
    assert 'id="pipeline"' not in render_body(plain)[0]


# --- the stages and the schedule from pairs alone ------------------------------------------

def pairs(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """Pairs from (src, dst, send_ns, recv_ns): a recv ends 1 after the later of the two."""
    out = []
    seen: dict[tuple[int, int], int] = {}
    for src, dst, send, recv in rows:
        k = seen[(src, dst)] = seen.get((src, dst), -1) + 1
        end = max(send, recv) + 1
        out.append({"instance": f"p2p {src}->{dst}#{k}", "src": src, "dst": dst, "tag": 0,
                    "order": k, "send_ns": send, "send_end_ns": send, "recv_ns": recv,
                    "recv_end_ns": end, "recv_wait_ns": max(min(send, end) - recv, 0),
                    "transfer_ns": end - max(send, recv), "bytes": 4})
    return pl.DataFrame(out, schema=PAIR_SCHEMA)


def test_one_f_one_b_is_told_from_gpipe() -> None:
    """Two stages, three micro-batches, 1F1B: rank 0 sends F0 @10, F1 @20, receives B0
    (posted 25, sent 30), sends F2 @40, receives B1 and B2 (a forward call after a backward
    one); rank 1 receives each forward and sends its backward."""
    p = pairs([(0, 1, 10, 0), (1, 0, 30, 25), (0, 1, 20, 31), (1, 0, 50, 45),
               (0, 1, 40, 51), (1, 0, 70, 65)])
    res = pipeline(p)
    assert res["schedule"]["kind"] == "1F1B"
    assert res["schedule"]["micro_batches"] == 3
    assert res["schedule"]["ideal_bubble_fraction"] == pytest.approx(1 / 4)
    assert res["stages"].select("rank", "stage").rows() == [(0, 0), (1, 1)]
    assert res["notes"] == ["no ProfilerStep ranges: each rank's span of send/recv calls is "
                            "one step"]
    gpipe = pairs([(0, 1, 10, 0), (0, 1, 20, 11), (0, 1, 30, 21), (1, 0, 50, 31),
                   (1, 0, 60, 51), (1, 0, 70, 61)])
    assert pipeline(gpipe)["schedule"]["kind"] == "GPipe"


def test_a_ring_is_an_interleaved_schedule() -> None:
    """Three ranks in a ring 2 > 0 > 1 > 2, two model chunks each (v = 2), two micro-batches:
    the forward sends 2>0 and 0>1 carry both chunks (4 each), the last stage's 1>2 only the
    first chunk's outputs into the second (2); backward the other way. Rank 2 starts (its
    first call is a send, at 10): it is stage 0."""
    edges = [e for chunk in (0, 1) for _ in (0, 1)
             for e in [(2, 0), (0, 1), *([(1, 2)] if chunk == 0 else [])]]
    fwd = [(s, d, 10 * (i + 1), 10 * (i + 1) - 1) for i, (s, d) in enumerate(edges)]
    fwd[0], fwd[1] = (2, 0, 10, 0), (0, 1, 20, 0)  # ranks 0 and 1 post their recv first
    bwd = [(d, s, 1000 + 10 * i, 1000 + 10 * i - 1) for i, (s, d) in enumerate(edges[::-1])]
    res = pipeline(pairs(fwd + bwd))
    assert res["stages"].select("rank", "stage", "upstream_rank", "downstream_rank").rows() \
        == [(2, 0, 1, 0), (0, 1, 2, 1), (1, 2, 0, 2)]
    s = res["schedule"]
    assert (s["kind"], s["micro_batches"], s["chunks"]) == ("interleaved", 2, 2)
    assert s["ideal_bubble_fraction"] == pytest.approx(2 / 6)


def test_two_pipelines_and_a_star() -> None:
    """Two chains {0,1} and {2,3} (pipeline x data parallel) are two pipelines; a rank that
    talks to three others is no pipeline and is left out with a note."""
    chains = stage_order(pairs([(0, 1, 0, 0), (2, 3, 0, 0), (1, 0, 5, 5), (3, 2, 5, 5)]))
    assert chains.select("rank", "pipeline", "stage").rows() == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    notes: list[str] = []
    star = stage_order(pairs([(0, 1, 0, 0), (0, 2, 1, 1), (0, 3, 2, 2)]), notes=notes)
    assert star.height == 0
    assert notes and "not a pipeline" in notes[0]
    assert pipeline(pairs([]))["notes"] == ["no send/recv pair: no pipeline"]


def test_without_send_recv_the_command_says_so(capsys) -> None:
    """A data-parallel run has no pipeline: an empty table and a warning, not an error."""
    ddp = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r"
    res = Run.from_events(frame([step(1, 0, 100)]), align="none").pipeline()
    assert res["stages"].height == 0 and res["bottleneck"]["rank"] is None
    assert "pipeline: no send/recv pair: no pipeline" in res.warnings
    if ddp.is_dir():
        assert main(["pipeline", str(ddp)]) == 0
        assert "no pipeline" in capsys.readouterr().out


# --- the real GPipe runs (fixtures/scenarios.py) ------------------------------------------

PIPELINES = ["pipeline_balanced", "pipeline_compute_s0", "pipeline_compute_s2",
             "pipeline_stall_s3"]


def _scenario(name: str) -> tuple[Path, dict]:
    folder = SCENARIOS / name
    if not (folder / "truth.json").is_file():
        pytest.skip(f"fixture {name} is not in this checkout")
    return folder, json.loads((folder / "truth.json").read_text())


@pytest.fixture(scope="module")
def answers() -> dict:
    return {}


def _answer(name: str, answers: dict):
    if name not in answers:
        import traceview

        folder, truth = _scenario(name)
        run = traceview.open(folder, cache=False)
        answers[name] = (run.pipeline(), run.stragglers()["ranks"], truth)
    return answers[name]


@pytest.mark.parametrize("name", PIPELINES)
def test_real_pipeline_every_send_paired_and_the_stages(name: str, answers: dict) -> None:
    res, _, truth = _answer(name, answers)
    assert res["p2p"]["unmatched"] == 0 and res["p2p"]["pairs"] > 0
    chain = [g for k, g in sorted(truth["groups"].items()) if k.startswith("p2p_")]
    order = res["stages"].sort("stage").get_column("rank").to_list()
    assert [[a, b] for a, b in zip(order, order[1:])] == chain
    s = res["schedule"]
    assert (s["kind"], s["stages"], s["micro_batches"]) == ("GPipe", 4, 4)
    assert s["ideal_bubble_fraction"] == pytest.approx(3 / 7)


@pytest.mark.parametrize("name", [n for n in PIPELINES if n != "pipeline_balanced"])
def test_real_pipeline_names_the_slow_stage(name: str, answers: dict) -> None:
    """The bottleneck is the stage the generator slowed, that stage idles least, and the
    straggler analysis names that rank or nobody."""
    res, strag, truth = _answer(name, answers)
    b = res["bottleneck"]
    assert b["rank"] == truth["slow_rank"], b["reason"]
    idle = dict(res["stages"].select("rank", "idle_fraction").rows())
    assert min(idle, key=idle.get) == truth["slow_rank"]
    assert b["gain_ns_per_step"] > 0.1 * b["step_ns"]
    flagged = strag.filter(pl.col("flagged")).get_column("rank").to_list()
    assert set(flagged) <= {b["rank"]}


def test_real_balanced_pipeline_has_a_small_gain(answers: dict) -> None:
    res, strag, _ = _answer("pipeline_balanced", answers)
    b = res["bottleneck"]
    assert b["rank"] is None
    # the leading stage's lead is the last stage's loss and the machine's noise (the generator
    # measured up to 3.4 ms of excess busy time): well under the slowed runs' ~35 ms
    assert b["gain_ns_per_step"] < 0.2 * b["step_ns"]
    assert strag.filter(pl.col("flagged")).height == 0


def test_cli_json_contract(capsys) -> None:
    folder, _ = _scenario("pipeline_compute_s2")
    assert main(["pipeline", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"stages", "bottleneck", "schedule", "p2p", "warnings"} <= set(doc)
    assert {"rank", "stage", "compute_ns", "bubble_ns", "bubble_fraction", "wait_upstream_ns",
            "wait_downstream_ns"} <= set(doc["stages"][0])
    assert {"rank", "stage", "gain_ns_per_step"} <= set(doc["bottleneck"])
    assert {"kind", "micro_batches", "ideal_bubble_fraction"} <= set(doc["schedule"])
    assert {"pairs", "unmatched"} <= set(doc["p2p"])
