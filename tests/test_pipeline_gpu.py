"""Pipeline parallelism on GPU traces (NCCL send/recv as SendRecv kernels): a hand-drawn
two-stage run, and the synthetic generator's pipeline mode checked against the truth it writes.

Hand-drawn (µs below; the events are in ns): two GPU ranks on one clock, stage = rank, GPipe
with m = 2 micro-batches, forward F = 100, backward B = 200 (micro-batches in reverse), one
step [0, 1000). The CPU only enqueues: each send/recv is ``c10d::send``/``c10d::recv_`` >
``record_param_comms`` > ``cudaLaunchKernel``, whose correlation id names the
``ncclDevKernel_SendRecv`` kernel on the pair's stream 30; a pair's two kernels end together,
10 after the later of their starts (each waits inside its kernel for the other). Compute runs
on stream 7, then a GPU all-reduce (stream 24) ending at 930 on both, the optimiser [930,960).

  rank 0  F0 [0,100)  F1 [100,200)                 B1 [520,720)  B0 [720,920)   opt [930,960)
     s30  send0 [100,110)  send1 [200,210)  recv_g1 [210 ...... 520)  recv_g0 [520,720)
     s24                                                              all_reduce [920,930)
  rank 1  F0 [110,210)  F1 [210,310)  B1 [310,510)  B0 [510,710)                opt [930,960)
     s30  recv0 [0,110)  recv1 [110,210)  send_g1 [510,520)  send_g0 [710,720)
     s24                                                   all_reduce [720 ......... 930)

A call's wait is [start, min(peer's start, end)), its transfer the rest; on a GPU stage only
what of them lies outside the stage's own kernels counts (exposed):

  rank 0: send0/send1 wait 0 (recv posted at 0 / 110); send0's transfer [100,110) is under F1:
          0, send1's [200,210): 10. recv_g1 waits [210,510) = 300 (nothing runs), transfer 10;
          recv_g0 waits [520,710) and transfers [710,720), both under B1: 0.
          wait_downstream 300, transfer 20; all-reduce [920,930): wait 0, collective 10.
          exposed comm: [100,110) 0 + [200,720) - B1 = 320 + [920,930) 10 = 330
          compute = 1000 - 330 = 670; bubble = first recv from downstream 300 = 30%
  rank 1: recv0 waits [0,100) = 100 (nothing yet: the warm-up), transfer 10; recv1 waits
          [110,200) and transfers [200,210) under F0: 0; send_g1 [510,520) under B0: 0;
          send_g0 [710,720) transfer 10. wait_upstream 100, transfer 20; all-reduce
          [720,930): waits [720,920) = 200 (after its last send/recv: the cool-down), 210 in all.
          exposed comm: [0,210) - F0 = 110 + [510,520) 0 + [710,930) 220 = 330
          compute = 670; bubble = 100 + 200 = 300 = 30%

Schedule GPipe, m = 2, p = 2: ideal 1/3 = 33.3%, measured 600 / 2000 = 30% (transfers and the
optimiser are not bubble). Equal compute: no bottleneck. As a CPU (enqueue-timed) run, the
same calls would say nothing of the exchange: without the kernels the calls fall back to
their CPU times, with a warning.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame, row, step
from traceview.analyses.p2p import p2p_calls, pair_p2p
from traceview.cli import main
from traceview.run.run import Run

US = 1000
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

#: (rank, what, gpu start, gpu end, peer): the docstring's step, in launch order per rank.
GPU_STEP = [
    (0, "mm", 0, 100), (0, "send", 100, 110, 1), (0, "mm", 100, 200), (0, "send", 200, 210, 1),
    (0, "recv", 210, 520, 1), (0, "mm", 520, 720), (0, "recv", 520, 720, 1), (0, "mm", 720, 920),
    (0, "all_reduce", 920, 930), (0, "opt", 930, 960),
    (1, "recv", 0, 110, 0), (1, "mm", 110, 210), (1, "recv", 110, 210, 0), (1, "mm", 210, 310),
    (1, "mm", 310, 510), (1, "send", 510, 520, 0), (1, "mm", 510, 710), (1, "send", 710, 720, 0),
    (1, "all_reduce", 720, 930), (1, "opt", 930, 960),
]


def gpu_pipeline_rows(*, kernels: bool = True) -> list[dict]:
    """The docstring's step: every GPU item launched from a CPU op at 2 µs intervals (the CPU
    runs ahead), linked by correlation; ``kernels=False`` leaves the SendRecv kernels out."""
    rows = []
    for rank in (0, 1):
        rows.append({**step(1, 0, 1000 * US, rank=rank), "pid": rank + 1})
        seq, cpu = 0, 1
        for corr, (r, what, start, end, *peer) in enumerate(GPU_STEP, start=100):
            if r != rank:
                continue
            ts = cpu * US
            cpu += 2
            if what in ("send", "recv"):
                seq += 1
                key = "Dst Rank" if what == "send" else "Src Rank"
                rows.append(row("cpu_op", "c10d::send" if what == "send" else "c10d::recv_",
                                ts, 1800, rank=rank, pid=rank + 1, tid=1,
                                args_json=json.dumps({"Concrete Inputs": ["", "", str(peer[0]),
                                                                          "0"]})))
                rows.append(row("cpu_op", "record_param_comms", ts + 100, 1500, rank=rank,
                                pid=rank + 1, tid=1, collective=what, seq=seq, bytes=4096,
                                args_json=json.dumps({"Collective name": what, key: peer[0],
                                                      "Seq": seq})))
                name, stream = SENDRECV, 30
            elif what == "all_reduce":
                rows.append(row("cpu_op", "record_param_comms", ts + 100, 1500, rank=rank,
                                pid=rank + 1, tid=1, collective="all_reduce"))
                name, stream = ALLREDUCE, 24
            else:
                rows.append(row("cpu_op", f"aten::{what}", ts + 100, 1500, rank=rank,
                                pid=rank + 1, tid=1))
                name, stream = f"sgemm_{what}", 7
            rows.append(row("cuda_runtime", "cudaLaunchKernel", ts + 500, 500, rank=rank,
                            pid=rank + 1, tid=1, correlation=corr, step=1))
            if kernels or what not in ("send", "recv"):
                rows.append(row("kernel", name, start * US, (end - start) * US, rank=rank,
                                device=rank, stream=stream, correlation=corr, step=1))
    return rows


@pytest.fixture(scope="module")
def gpu_run() -> Run:
    return Run.from_events(frame(gpu_pipeline_rows()), align="none")


def test_nccl_calls_take_their_kernels_times() -> None:
    calls = p2p_calls(frame(gpu_pipeline_rows()))
    # one call per record_param_comms (the c10d::send around it is the same call)
    assert calls.height == 8
    assert set(calls.get_column("timing")) == {"gpu"}
    pairs, unmatched = pair_p2p(calls)
    assert unmatched.height == 0
    assert pairs.select("instance", "recv_wait_ns", "transfer_ns").rows() == [
        # 0->1: the recvs were posted at 0 and 110, the sends started at 100 and 200
        ("p2p 0->1#0", 100 * US, 10 * US), ("p2p 0->1#1", 90 * US, 10 * US),
        # 1->0: rank 0's recv_g1 [210,520) waited for the send at 510; recv_g0 from 520 to 710
        ("p2p 1->0#0", 300 * US, 10 * US), ("p2p 1->0#1", 190 * US, 10 * US)]


def test_gpu_stages_by_hand(gpu_run: Run) -> None:
    res = gpu_run.pipeline()
    stages = res["stages"]
    assert stages.select("rank", "stage", "upstream_rank", "downstream_rank").rows() == [
        (0, 0, None, 1), (1, 1, 0, None)]
    assert stages.select(*((pl.col(c) // US).alias(c) for c in (
        "step_ns", "compute_ns", "wait_upstream_ns", "wait_downstream_ns", "p2p_transfer_ns",
        "collective_ns", "collective_wait_ns", "bubble_ns", "idle_ns"))).rows() == [
        (1000, 670, 0, 300, 20, 10, 0, 300, 300),
        (1000, 670, 100, 0, 20, 210, 200, 300, 300)]
    assert stages.get_column("bubble_fraction").to_list() == [0.3, 0.3]
    sched = res["schedule"]
    assert (sched["kind"], sched["micro_batches"], sched["stages"]) == ("GPipe", 2, 2)
    assert sched["ideal_bubble_fraction"] == pytest.approx(1 / 3)
    assert sched["bubble_fraction"] == pytest.approx(0.3)
    assert res["bottleneck"]["rank"] is None and res["bottleneck"]["gain_ns_per_step"] == 0


def test_without_kernels_the_cpu_times_stand_with_a_warning() -> None:
    run = Run.from_events(frame(gpu_pipeline_rows(kernels=False)), align="none")
    assert set(p2p_calls(frame(gpu_pipeline_rows(kernels=False))).get_column("timing")) == {
        "enqueue"}
    res = run.pipeline()
    assert res["p2p"]["pairs"] == 4
    warned = [w for w in res.warnings if "without their GPU kernel" in w]
    assert len(warned) == 2 and "rank 0: 4 NCCL call(s)" in warned[0]


# --- the synthetic generator's pipeline mode --------------------------------------------------

def _generate(tmp_path_factory: pytest.TempPathFactory, **spec) -> tuple[Path, dict]:
    from fixtures import synthetic
    out = tmp_path_factory.mktemp("pipe")
    truth = synthetic.generate(synthetic.SyntheticSpec(world_size=4, steps=3, seed=3, **spec), out)
    return out, truth.pipeline


@pytest.fixture(scope="module")
def balanced4(tmp_path_factory):
    return _generate(tmp_path_factory, pipeline_micro_batches=4)


@pytest.fixture(scope="module", params=[4, 8], ids=["m4", "m8"])
def balanced(request, tmp_path_factory, balanced4):
    if request.param == 4:
        return balanced4
    return _generate(tmp_path_factory, pipeline_micro_batches=request.param)


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return _generate(tmp_path_factory, pipeline_micro_batches=4, pipeline_slow_stage=2)


def _check_against_truth(res, truth: dict) -> None:
    stages = res["stages"]
    assert stages.select("rank", "stage", "upstream_rank", "downstream_rank").rows() == [
        (s["rank"], s["stage"], s["upstream_rank"], s["downstream_rank"])
        for s in truth["per_stage"]]
    sched = res["schedule"]
    assert sched["kind"] == truth["schedule"]
    assert sched["micro_batches"] == truth["micro_batches"]
    assert sched["ideal_bubble_fraction"] == pytest.approx(truth["ideal_bubble_fraction"])
    # every stage's bubble and waits as the generator's own times make them, to within the
    # clock alignment (one all-reduce a step anchors it)
    for got, want in zip(stages.iter_rows(named=True), truth["per_stage"]):
        tol = 0.002 * want["step_ns"]
        for col in ("step_ns", "compute_ns", "bubble_ns", "wait_upstream_ns",
                    "wait_downstream_ns", "collective_wait_ns", "sends", "recvs"):
            assert abs(got[col] - want[col]) <= tol, (got["rank"], col, got[col], want[col])


def test_synthetic_balanced_pipeline_bubble_is_the_ideal(balanced) -> None:
    folder, truth = balanced
    res = traceview.open(folder).pipeline()
    _check_against_truth(res, truth)
    # balanced stages, cheap transfers: the measured bubble is the schedule's ideal
    assert abs(res["schedule"]["bubble_fraction"] - truth["ideal_bubble_fraction"]) < 0.02
    assert res["bottleneck"]["rank"] is None
    assert res["p2p"] == {"pairs": 3 * 2 * 3 * truth["micro_batches"], "unmatched": 0,
                          "unmatched_sends": 0, "unmatched_recvs": 0}
    assert not [w for w in res.warnings if "send/recv" in w or "collectives:" in w]


def test_synthetic_slow_stage_is_the_bottleneck(slow) -> None:
    folder, truth = slow
    res = traceview.open(folder).pipeline()
    _check_against_truth(res, truth)
    b = res["bottleneck"]
    assert b["clear"] and b["rank"] == truth["slow_rank"] and b["stage"] == truth["slow_stage"]
    # m micro-batches, each slower by the extra: the step's gain
    extra = truth["micro_batches"] * truth["slow_extra_ns_per_micro_batch"]
    assert b["gain_ns_per_step"] == pytest.approx(extra, rel=0.05)
    idle = dict(res["stages"].select("rank", "idle_fraction").iter_rows())
    assert min(idle, key=idle.get) == truth["slow_rank"]


def test_synthetic_cli_json_contract(balanced4, capsys) -> None:
    folder, truth = balanced4
    assert main(["pipeline", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"stages", "bottleneck", "schedule", "p2p", "warnings"} <= set(doc)
    assert {"rank", "stage", "compute_ns", "bubble_ns", "bubble_fraction", "wait_upstream_ns",
            "wait_downstream_ns"} <= set(doc["stages"][0])
    assert {"rank", "stage", "gain_ns_per_step"} <= set(doc["bottleneck"])
    assert {"kind", "micro_batches", "ideal_bubble_fraction"} <= set(doc["schedule"])
    assert {"pairs", "unmatched"} <= set(doc["p2p"])
    assert [s["stage"] for s in doc["stages"]] == [0, 1, 2, 3]
    assert doc["schedule"]["kind"] == "GPipe" and doc["schedule"]["micro_batches"] == 4
    assert abs(doc["schedule"]["bubble_fraction"] - truth["ideal_bubble_fraction"]) < 0.02


def test_the_pipeline_truth_round_trips(balanced4) -> None:
    from fixtures import synthetic
    folder, truth = balanced4
    loaded = synthetic.load_ground_truth(folder)
    assert loaded.pipeline == json.loads(json.dumps(truth))
    assert dataclasses.asdict(loaded)["pipeline"]["stages"] == 4
