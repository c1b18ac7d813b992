"""What to fix first (analyses/diagnose.py): gains derived by hand on the timelines of
tests/test_critical_path.py, and on the real gloo runs with a rank slowed on purpose.

CPU timeline (see test_critical_path). A rank's *own* time in a stretch is the stretch less
its waits on communication. The path jumps to rank 1 at the step-1 all-reduce: its stretch
[0,600) is all its own (600), rank 0's [0,100) too (100): gain 500. It jumps to rank 0 at the
step-2 one: rank 0's stretch from its end of the step-1 all-reduce, [700,1500), 800 own;
rank 1's [700,1100), 400 own: gain 400. Per step (2 steps): rank 1 250 ns, rank 0 200 ns.
Exposed communication: the two transfers, 2 x 100 ns = 100 ns per step. Mean step (1000 +
950) / 2 = 975 ns. Neither rank is flagged by the straggler analysis (one slow step each), so
diagnose names no straggler (one answer everywhere): the jumps' gains are still computed.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import traceview
from test_critical_path import cpu_run, gpu_run
from traceview.analyses.diagnose import ModelSize, diagnose, jump_gains

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _rows(res) -> list[tuple]:
    return res["findings"].select("id", "rank", "severity", "gain_ns_per_step").rows()


def test_gains_by_hand_and_their_order() -> None:
    run = cpu_run()
    res = run.diagnose()
    assert res["step_ns"] == 975
    assert _rows(res) == [("exposed_communication", None, "high", 100),
                          ("bound", None, "info", None)]
    gains = dict(jump_gains(run.path, run.collective_ranks).rows())
    assert sorted(gains.values()) == [400, 500]  # per step (2 steps): rank 0 200, rank 1 250
    assert res["bound"] == {"bound": "compute", "shares": {
        "compute": 0.8, "communication": 0.1, "input": 0.0, "host": 0.0, "idle": 0.1}}


def test_a_flagged_straggler_is_high_severity() -> None:
    run = cpu_run()
    flagged = pl.DataFrame({"rank": [1, 0], "flagged": [True, False]})
    out = diagnose(run.path, collective_rows=run.collective_ranks, stragglers=flagged)
    top = out["findings"].row(0, named=True)
    assert (top["id"], top["rank"], top["severity"]) == ("straggler", 1, "high")
    assert top["title"].startswith("Rank 1 holds the others back")
    evidence = {e["metric"]: (e["value"], e["text"]) for e in top["evidence"]}
    assert evidence["lateness_on_path_ns_per_step"] == (250.0, None)
    assert evidence["top_op_on_path_ns_per_step"] == (200.0, "fixture::slow")
    assert "rank 1" in top["recommendation"]
    assert out["findings"].filter(pl.col("id") == "straggler").height == 1  # rank 0: none


def test_gpu_launch_gain_and_mfu() -> None:
    """GPU timeline of test_critical_path: at the one all-reduce rank 1's stretch [0,700) is
    700 ns of its own time, rank 0's [0,300) 300: gain 400; the path spends 30 ns launching while the GPU idles (3% of the 1000 ns step:
    medium); MFU: 6 x 1e6 params x 1e3 tokens = 6e9 FLOP per 1 us step on 2 devices of 989.5
    TFLOP/s (H100 SXM, bf16) = 3e15 FLOP/s per device, 0.303 of the peak."""
    run = gpu_run()
    res = run.diagnose(params=1e6, tokens_per_step=1e3, device="NVIDIA H100 80GB HBM3")
    assert dict(jump_gains(run.path, run.collective_ranks).rows()).popitem()[1] == 400
    assert _rows(res)[:2] == [("exposed_communication", None, "high", 100),
                              ("launch_bound", None, "medium", 30)]
    mfu = res["mfu"]
    assert mfu["flops_per_step"] == 6e9 and mfu["devices"] == 2
    assert mfu["peak_tflops"] == 989.5
    assert mfu["mfu"] == pytest.approx(3000.0 / 989.5)  # 3e15 / 989.5e12
    assert res["findings"].filter(pl.col("id") == "mfu").height == 1
    # the peak is overridable, and the dtype and form factor matter
    assert run.diagnose(flops_per_step=6e9, peak_tflops=100.0)["mfu"]["mfu"] == \
        pytest.approx(30.0)
    pcie = run.diagnose(flops_per_step=6e9, device="NVIDIA H100 PCIe", dtype="fp32")["mfu"]
    assert pcie["peak_tflops"] == 51.0


def test_model_flops_with_attention() -> None:
    # 6N + 12 L H S per token: 6e6 + 12 x 2 x 64 x 128 = 6,196,608 per token
    assert ModelSize(params=1e6, tokens_per_step=10, layers=2, hidden=64,
                     seq_len=128).flops() == 61_966_080.0
    assert ModelSize(params=1e6).flops() is None
    assert ModelSize(flops_per_step=5.0, params=1.0, tokens_per_step=1.0).flops() == 5.0


def test_cpu_only_run_has_no_mfu_peak() -> None:
    mfu = cpu_run().diagnose(params=1e6, tokens_per_step=10)["mfu"]
    assert mfu["mfu"] is None and "pass --peak-tflops" in mfu["note"]


# --- the real gloo runs: rank R sleeps 30 ms in every step ----------------------------------
DELAY_NS = 30_000_000  # fixtures/gloo_ddp.py and gloo_tp_dp.py: --delay-ms 30
SLOWED = [("gloo_ddp_4r_noisy_slow2", 2), ("gloo_ddp_2r_slow1", 1), ("gloo_tp_dp_4r_slow2", 2)]


@pytest.mark.parametrize(("name", "slow"), SLOWED)
def test_real_slowed_runs_first_finding_names_the_slow_rank(name: str, slow: int) -> None:
    """Measured: 34.2 ms (4 ranks, noisy), 29.7 ms (2 ranks), 24.9 ms (TP x DP: in its last
    step the path reaches the slow rank through a barrier the matcher cannot place in a group,
    with a warning, so that step gains nothing)."""
    first = traceview.open(DATA / name, cache=False).diagnose()["findings"].row(0, named=True)
    assert (first["id"], first["rank"], first["severity"]) == ("straggler", slow, "high")
    # the gain is the injected delay, give or take the run's noise
    assert abs(first["gain_ns_per_step"] - DELAY_NS) < 0.2 * DELAY_NS


@pytest.mark.parametrize("name", ["gloo_ddp_4r_noisy", "gloo_ddp_2r"])
def test_real_balanced_runs_have_no_high_straggler(name: str) -> None:
    found = traceview.open(DATA / name, cache=False).diagnose()["findings"]
    stragglers = found.filter(pl.col("id") == "straggler")
    assert stragglers.filter(pl.col("severity") == "high").height == 0


# --- 8 GPU ranks over NCCL (fixtures/synthetic.py): rank 5's first backward kernel +3 ms ---
def test_synthetic_nccl_slow_rank_gain_is_the_injected_delay(tmp_path: Path) -> None:
    """The fast ranks wait for rank 5 inside their NCCL kernels, and their later buckets wait
    on the earlier ones (one stream): at the exposed last bucket rank 5 leads the others by
    only ~0.7 ms. Its own time in the stretch exceeds theirs by the full 3 ms."""
    from fixtures.synthetic import SyntheticSpec, generate

    generate(SyntheticSpec(world_size=8, steps=4, seed=9, slow_rank=5,
                           slow_extra_ns=3_000_000), tmp_path / "slow")
    generate(SyntheticSpec(world_size=8, steps=4, seed=9, slow_rank=None), tmp_path / "even")
    slow = traceview.open(tmp_path / "slow", cache=False)
    first = slow.diagnose()["findings"].row(0, named=True)
    assert (first["id"], first["rank"], first["severity"]) == ("straggler", 5, "high")
    assert abs(first["gain_ns_per_step"] - 3_000_000) < 0.05 * 3_000_000
    path = slow.critical_path()
    assert path["ranks"].get_column("rank")[0] == 5
    assert path["steps"].get_column("coverage").min() > 0.95
    even = traceview.open(tmp_path / "even", cache=False).diagnose()["findings"]
    assert even.filter((pl.col("id") == "straggler") & (pl.col("severity") == "high")).height \
        == 0


def test_gpu_gap_causes_on_the_path() -> None:
    """One GPU rank, one step [0,1000), no collective: the path is the whole step.

    host: launch [10,20), cudaDeviceSynchronize [25,200), DataLoader [200,500),
          launch [500,510), cudaDeviceSynchronize [710,780), launch [790,800)
    GPU:  k1 [30,200), k2 [520,700), k3 [810,900)
    gaps: [200,520) data_loading (the DataLoader op overlaps it), [700,810) sync.
    On the path, inside [200,520): data loading 300 + launch 10 + idle 10 = 320 ns; inside
    [700,810): 110 ns; launch/host outside any gap: [10,20) and [25,30) = 15 ns (1.5%: low).
    """
    from gpu_trace_helpers import frame, kernel, launch, row, step

    ev = frame([
        step(1, 0, 1000), launch(10, 10, 1), launch(25, 175, 90, name="cudaDeviceSynchronize"),
        row("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 200, 300,
            pid=1, tid=1),
        launch(500, 10, 2), launch(710, 70, 91, name="cudaDeviceSynchronize"),
        launch(790, 10, 3),
        kernel("k1", 30, 170, corr=1), kernel("k2", 520, 180, corr=2),
        kernel("k3", 810, 90, corr=3)])
    res = traceview.Run.from_events(ev).diagnose()
    assert _rows(res) == [("data_loading", None, "high", 320), ("host_sync", None, "high", 110),
                          ("launch_bound", None, "low", 15), ("bound", None, "info", None)]
    assert res["bound"]["bound"] == "compute"
    assert "num_workers" in res["findings"].row(0, named=True)["recommendation"]


def test_a_straggler_slowed_on_the_host_without_an_op() -> None:
    """Rank 1's host sleeps with nothing recorded (a bare time.sleep): it launches sgemm only
    at 490 (sgemm [500,700)), NCCL [700,800). Rank 0: sgemm [100,300), NCCL [300 ... 800).
    Rank 1's stretch [0,700) is all its own time (no communication in flight): 700; rank 0's
    [0,300): 300. Gain 400, though rank 1's GPU computes no more than rank 0's."""
    from gpu_trace_helpers import frame, kernel, launch, step

    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    rows = []
    for rank, (at, sgemm_at, dur) in enumerate([(90, 100, 200), (490, 500, 200)]):
        rows += [step(1, 0, 1000, rank=rank),
                 {**launch(at, 5, 1, rank=rank), "pid": rank + 1},
                 {**launch(at + 5, 5, 2, rank=rank), "pid": rank + 1},
                 kernel("sgemm", sgemm_at, dur, corr=1, rank=rank),
                 kernel(nccl, sgemm_at + dur, 800 - sgemm_at - dur, corr=2, rank=rank,
                        stream=20, bytes=4096, group_size=2)]
    run = traceview.Run.from_events(frame(rows), align="none")
    assert dict(jump_gains(run.path, run.collective_ranks).rows()).popitem()[1] == 400


# --- real GPU traces of the corpus: the TensorBoard plugin's ResNet-50 samples ---------------
def _tb_sample(workers: int) -> Path | None:
    from tests.conftest import CORPUS

    folder = CORPUS / "kineto" / "tb_plugin" / "samples" / f"resnet50_num_workers_{workers}"
    files = sorted(folder.glob("worker0.*.pt.trace.json.gz")) if folder.is_dir() else []
    return files[0] if files else None


def test_resnet50_with_no_dataloader_workers_is_told_to_add_them() -> None:
    """The classic: ResNet-50 with DataLoader(num_workers=0) stalls on input; with 4 workers
    it does not. Measured: 59.5 ms of a 175 ms step (34%) against 1.8 ms (1.3%)."""
    without, with_four = _tb_sample(0), _tb_sample(4)
    if without is None or with_four is None:
        pytest.skip("the corpus' TensorBoard plugin samples are not here")
    first = traceview.open(without, cache=False).diagnose()["findings"].row(0, named=True)
    assert first["id"] == "data_loading" and first["severity"] == "high"
    assert "num_workers" in first["recommendation"]
    four = traceview.open(with_four, cache=False).diagnose()["findings"]
    loading = four.filter(pl.col("id") == "data_loading")
    assert loading.height == 0 or loading.get_column("gain_share")[0] < 0.05
