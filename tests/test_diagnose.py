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
from tests.conftest import CORPUS, absent
from traceview.analyses.diagnose import ModelSize, diagnose

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _rows(res) -> list[tuple]:
    return res["findings"].select("id", "rank", "severity", "gain_ns_per_step").rows()


def test_gains_by_hand_and_their_order() -> None:
    run = cpu_run()
    res = run.diagnose()
    assert res["step_ns"] == 975
    assert _rows(res) == [("exposed_communication", None, "high", 100),
                          ("bound", None, "info", None)]
    # a CPU-only run: host-bound, no GPU share (as summary and overlap); its ops are the
    # host's time on the path
    assert res["bound"] == {"bound": "host-bound", "bound_share": None, "shares": {},
                            "gpu_ranks": 0, "window_ns": None, "cpu_only": True, "path": "host", "path_shares": {
        "compute": 0.0, "communication": 0.1, "input": 0.0, "host": 0.8, "idle": 0.1}}


def test_a_flagged_straggler_is_high_severity() -> None:
    run = cpu_run()
    flagged = pl.DataFrame({"rank": [1, 0], "flagged": [True, False],
                            "caused_wait_per_step_ns": [250, 0]})
    out = diagnose(run.path, collective_rows=run.collective_ranks, stragglers=flagged)
    top = out["findings"].row(0, named=True)
    assert (top["id"], top["rank"], top["severity"]) == ("straggler", 1, "high")
    # no replay given: the wait its own time caused (the straggler analysis's) is the gain
    assert top["gain_ns_per_step"] == 250
    # a replay's gain is the gain (issue 46), trusted or not; one that finds none is not
    for replayed, gain in (((180.0, False), 180), ((-40.0, True), 250)):
        again = diagnose(run.path, collective_rows=run.collective_ranks, stragglers=flagged,
                         replayed={1: replayed})["findings"].row(0, named=True)
        assert (again["id"], again["gain_ns_per_step"]) == ("straggler", gain)
    assert top["title"].startswith("Rank 1 holds the others back")
    evidence = {e["metric"]: (e["value"], e["text"]) for e in top["evidence"]}
    assert evidence["lateness_on_path_ns_per_step"] == (250.0, None)
    assert evidence["top_op_on_path_ns_per_step"] == (200.0, "fixture::slow")
    assert "rank 1" in top["recommendation"]
    assert out["findings"].filter(pl.col("id") == "straggler").height == 1  # rank 0: none


def test_gpu_launch_gain_and_mfu() -> None:
    """GPU timeline of test_critical_path: the path spends 30 ns launching
    while the GPU idles (3% of the 1000 ns step: medium); sgemm holds 600 ns of the path (a
    matrix-multiply family, no gain) and elementwise 100 (10%). MFU: 6 x 1e6 params x 1e3
    tokens = 6e9 FLOP per 1 us step on 2 devices of 989.5 TFLOP/s (H100 SXM, bf16) = 3e15
    FLOP/s per device, 3.03x the peak: refused; a step can do at most 1e-6 s x 2 x 989.5e12 =
    1.979e9 FLOP, i.e. 330 tokens of 6e6 FLOP each."""
    run = gpu_run()
    res = run.diagnose(params=1e6, tokens_per_step=1e3, device="NVIDIA H100 80GB HBM3")
    assert _rows(res) == [("exposed_communication", None, "high", 100),
                          ("launch_bound", None, "medium", 30),
                          ("kernels", None, "medium", None), ("kernels", None, "medium", None),
                          ("bound", None, "info", None)]
    families = res["findings"].filter(pl.col("id") == "kernels")
    assert families.select("name", "path_ns_per_step").rows() == [("gemm", 600),
                                                                   ("elementwise", 100)]
    mfu = res["mfu"]
    assert mfu["flops_per_step"] == 6e9 and mfu["devices"] == 2
    assert mfu["peak_tflops"] == 989.5
    assert mfu["mfu"] is None and mfu["refused"]
    assert mfu["computed_mfu"] == pytest.approx(3000.0 / 989.5)  # 3e15 / 989.5e12
    assert "--tokens-per-step 1000 (at most 330 here" in mfu["warning"]
    assert mfu["warning"] in res.warnings
    assert res["findings"].filter(pl.col("id") == "mfu").height == 0
    # the peak is overridable, and the dtype and form factor matter
    ok = run.diagnose(flops_per_step=6e9, peak_tflops=1e4)
    assert ok["mfu"]["mfu"] == pytest.approx(0.3) and not ok["mfu"]["refused"]
    assert ok["findings"].filter(pl.col("id") == "mfu").height == 1
    pcie = run.diagnose(flops_per_step=6e9, device="NVIDIA H100 PCIe", dtype="fp32")["mfu"]
    assert pcie["peak_tflops"] == 51.0


def test_an_mfu_above_100_percent_names_the_likely_wrong_input() -> None:
    """1.5e9 FLOP per 1 us step on 2 devices: 750 TFLOP/s per device. Against a user peak of
    500 (the H100 SXM's bf16 peak is 989.5): the peak is wrong. In fp32 (67 TFLOP/s): 11x,
    while the bf16 peak makes it 0.76: the dtype is wrong. A job of 16 ranks traced on 1
    counts 16 devices (the FLOPs per step are all ranks' together)."""
    run = gpu_run()
    h100 = "NVIDIA H100 80GB HBM3"
    peak = run.diagnose(flops_per_step=1.5e9, peak_tflops=500.0, device=h100)["mfu"]
    assert peak["refused"] and peak["computed_mfu"] == pytest.approx(1.5)
    assert "likely wrong input is --peak-tflops 500" in peak["warning"]
    dtype = run.diagnose(flops_per_step=1.5e9, dtype="fp32", device=h100)["mfu"]
    assert dtype["refused"] and "likely wrong input is --dtype fp32" in dtype["warning"]
    flops = run.diagnose(flops_per_step=1.5e10, device=h100)["mfu"]
    assert "likely wrong input is --flops-per-step" in flops["warning"]
    one_of_16 = pl.DataFrame({"rank": [0], "devices": ['["NVIDIA A100-SXM4-80GB"]'],
                              "world_size": [16]})
    res = diagnose(run.path, collective_rows=run.collective_ranks, devices=one_of_16,
                   model=ModelSize(flops_per_step=1.5e9))
    # 1.5e9 / 1e-6 s / 16 = 93.75 TFLOP/s per device, of 312 (A100 bf16)
    assert (res["mfu"]["devices"], res["mfu"]["devices_source"]) == (16, "world_size")
    assert res["mfu"]["mfu"] == pytest.approx(93.75 / 312)
    assert res["notes"] == []


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
    only ~0.7 ms. The gain is the replay's (rank 5 typical): 2.74 ms, within the issue's
    prediction bar (10%) of the 3 ms injected, though the replay is not trusted on this GPU
    run (16% replay error: the waits inside NCCL kernels are not in its graph yet)."""
    from fixtures.synthetic import SyntheticSpec, generate

    generate(SyntheticSpec(world_size=8, steps=4, seed=9, slow_rank=5,
                           slow_extra_ns=3_000_000), tmp_path / "slow")
    generate(SyntheticSpec(world_size=8, steps=4, seed=9, slow_rank=None), tmp_path / "even")
    slow = traceview.open(tmp_path / "slow", cache=False)
    first = slow.diagnose()["findings"].row(0, named=True)
    assert (first["id"], first["rank"], first["severity"]) == ("straggler", 5, "high")
    assert abs(first["gain_ns_per_step"] - 3_000_000) < 0.10 * 3_000_000
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
    [700,810): 110 ns, plus the path's [25,30) in cudaDeviceSynchronize outside any gap: host
    sync 115 (75 of it in the calls: medium confidence); the launch [10,20) outside any gap:
    10 ns (1%: low). The kernels, 440 ns of the path (an "other" family, no gain), come after
    the gains of 3% of the step or more and before the smaller ones.
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
    assert _rows(res) == [("data_loading", None, "high", 320), ("host_sync", None, "high", 115),
                          ("kernels", None, "medium", None), ("launch_bound", None, "low", 10),
                          ("bound", None, "info", None)]
    assert res["findings"].get_column("confidence").to_list() == [
        "high", "medium", "high", "high", "high"]
    assert res["bound"]["path"] == "compute"
    assert "num_workers" in res["findings"].row(0, named=True)["recommendation"]


# --- real GPU traces of the corpus: the TensorBoard plugin's ResNet-50 samples ---------------
def _tb_sample(workers: int) -> Path | None:
    folder = CORPUS / "kineto" / "tb_plugin" / "samples" / f"resnet50_num_workers_{workers}"
    files = sorted(folder.glob("worker0.*.pt.trace.json.gz")) if folder.is_dir() else []
    return files[0] if files else None


def test_resnet50_with_no_dataloader_workers_is_told_to_add_them() -> None:
    """The classic: ResNet-50 with DataLoader(num_workers=0) stalls on input; with 4 workers
    it does not. Measured: 59.5 ms of a 175 ms step (34%) against 1.8 ms (1.3%)."""
    without, with_four = _tb_sample(0), _tb_sample(4)
    if without is None or with_four is None:
        pytest.skip(absent(CORPUS / "kineto" / "tb_plugin" / "samples"))
    first = traceview.open(without, cache=False).diagnose()["findings"].row(0, named=True)
    assert first["id"] == "data_loading" and first["severity"] == "high"
    assert "num_workers" in first["recommendation"]
    four = traceview.open(with_four, cache=False).diagnose()["findings"]
    loading = four.filter(pl.col("id") == "data_loading")
    assert loading.height == 0 or loading.get_column("gain_share")[0] < 0.05


def test_named_runtime_calls_python_and_launches_on_the_path() -> None:
    """One GPU rank, one step [0,1000), no collective: the path is the whole step.

    host: cudaMalloc [0,300), launch [300,310) of k1, cudaMemcpyAsync [400,600) whose copy
          "Memcpy DtoH (Device -> Pageable)" runs [580,600), a Python function that launches
          nothing (prep.py(10): normalize) [600,800), launch [800,810) of k2
    GPU:  k1 [320,400), the copy [580,600), k2 [820,1000)
    gaps: [400,580) blocking_copy (the copy call holds the host), [600,820) host (k2 launched
          at 800).
    On the path: cudaMalloc 300 (30%: first), normalize 200 (host_work), cudaMemcpyAsync 180
    (all in the blocking-copy gap), launches 10 + 10 and the idle [810,820) in the host gap:
    launch_bound 30 (20 of it named: medium confidence), kernels k1 + k2 = 260 (an "other"
    family, no gain), the pageable copy 20 (half of it gained: 10, 1%). Bound: host 70%
    (300 + 10 + 180 + 200 + 10), compute 28%, idle 2%.
    """
    from gpu_trace_helpers import frame, kernel, launch, row, step

    ev = frame([
        step(1, 0, 1000), launch(0, 300, 90, name="cudaMalloc"), launch(300, 10, 1),
        kernel("k1", 320, 80, corr=1),
        launch(400, 200, 2, name="cudaMemcpyAsync"),
        row("memcpy", "Memcpy DtoH (Device -> Pageable)", 580, 20, correlation=2),
        row("python_function", "prep.py(10): normalize", 600, 200, pid=1, tid=1),
        launch(800, 10, 3), kernel("k2", 820, 180, corr=3)])
    res = traceview.Run.from_events(ev).diagnose()
    f = res["findings"]
    assert f.select("id", "name", "gain_ns_per_step", "path_ns_per_step", "severity",
                    "confidence").rows() == [
        ("runtime_call", "cudaMalloc", 300, 300, "high", "high"),
        ("host_work", "prep.py(10): normalize", 200, 200, "high", "high"),
        ("runtime_call", "cudaMemcpyAsync", 180, 180, "high", "high"),
        ("launch_bound", "cudaLaunchKernel", 30, 30, "medium", "medium"),
        ("kernels", "other", None, 260, "medium", "high"),
        ("pageable_copy", None, 10, 20, "low", "medium"),
        ("bound", None, None, None, "info", "high")]
    malloc, _, memcpy = f.head(3).iter_rows(named=True)
    assert malloc["title"].startswith("cudaMalloc holds 30.0% of the critical path")
    assert "empty_cache" in malloc["recommendation"]
    assert "pageable memory" in memcpy["title"]
    assert "pin_memory" in memcpy["recommendation"] and "non_blocking" in memcpy["recommendation"]
    evidence = {e["metric"]: e["value"] for e in memcpy["evidence"]}
    assert evidence["in_blocking_copy_gaps_ns_per_step"] == 180
    assert res["bound"]["path"] == "host"
    assert res["bound"]["path_shares"]["host"] == pytest.approx(0.7)


def test_python_functions_that_launch_are_launch_overhead() -> None:
    """forward [0,100) on thread 1 holds a launch [40,50); normalize [200,300) holds none; a
    launch on thread 2 [250,260) is another thread's; one starting at normalize's end (300)
    is not inside it."""
    from gpu_trace_helpers import frame, launch, row

    from traceview.analyses.diagnose import launching_functions
    from traceview.analyses.host import host_events

    ev = frame([row("python_function", "model.py(5): forward", 0, 100, pid=1, tid=1),
                launch(40, 10, 1),
                row("python_function", "prep.py(10): normalize", 200, 100, pid=1, tid=1),
                {**launch(250, 10, 2), "tid": 2}, launch(300, 10, 3)])
    names = ["model.py(5): forward", "prep.py(10): normalize"]
    assert launching_functions(host_events(ev), names) == {"model.py(5): forward"}
    assert launching_functions(None, names) == frozenset()


def test_a_balanced_path_says_between_what() -> None:
    """Shares 0.49 compute, 0.43 host (the corpus CloverLeaf path): within 1.2x, balanced."""
    from traceview.analyses.diagnose import _bound, _bound_finding

    cats = {"compute": 0.49, "communication_wait": 0.0, "communication_transfer": 0.0,
            "launch_host": 0.43, "data_loading": 0.0, "idle": 0.08}
    gpu = {"bound": "balanced", "bound_share": 0.45,
           "shares": {"compute": 0.45, "communication": 0.0, "copy": 0.15, "idle": 0.4}}
    bound = _bound({k: {"share": v} for k, v in cats.items()}, run=gpu)
    assert (bound["bound"], bound["path"]) == ("balanced", "balanced")
    assert _bound_finding(bound)["title"] == (
        "Run bound: balanced between compute (45.0%) and idle (40.0%) of the GPU time; "
        "path: 49% compute, 0% communication, 0% input, 43% host, 8% idle")


@pytest.mark.parametrize(("name", "family"), [
    ("void cudnn::bn_bw_1C11_kernel_new<float>", "reduction"),
    ("void at::native::batch_norm_collect_statistics_kernel<float>", "reduction"),
    ("cunn_SoftMaxForward<8, c10::BFloat16>", "reduction"),
    ("void cudnn::detail::implicit_convolve_sgemm<float>", "convolution"),
    ("dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>", "convolution"),
    ("volta_sgemm_64x64_tn", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "gemm"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("void fbgemm_gpu::split_embedding_codegen_forward_kernel", "embedding"),
    ("void at::native::vectorized_elementwise_kernel<4, AddFunctor>", "elementwise"),
    ("void nchwToNhwcKernel<float>", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("clover::par_ranged2d_kernel<PdV_kernel>", "other"),
])
def test_kernel_families_by_name(name: str, family: str) -> None:
    from traceview.analyses.diagnose import KERNEL_FAMILIES, _family

    assert _family(name, tuple((k, p) for k, _, p, _ in KERNEL_FAMILIES)) == family


@pytest.mark.parametrize(("name", "family"), [
    ("cudaMalloc", "allocation"), ("cudaFree", "allocation"), ("cudaHostAlloc", "allocation"),
    ("cuMemAlloc_v2", "allocation"), ("hipMalloc", "allocation"),
    ("cudaMemcpyAsync", "copy"), ("cudaMemcpy", "copy"), ("hipMemcpyWithStream", "copy"),
    ("cudaStreamSynchronize", "sync"), ("cudaDeviceSynchronize", "sync"),
    ("hipEventSynchronize", "sync"), ("cuStreamSynchronize", "sync"),
    ("cudaLaunchKernel", "launch"), ("cudaGraphLaunch", "launch"),
    ("hipExtModuleLaunchKernel", "launch"), ("cuLaunchKernel", "launch"),
    ("cudaDeviceGetStreamPriorityRange", "runtime"), ("cudaEventQuery", "runtime"),
    ("aten::empty", None), ("prep.py(10): normalize", None),
])
def test_runtime_call_families(name: str, family: str | None) -> None:
    from traceview.analyses.diagnose import _family

    assert _family(name) == family
