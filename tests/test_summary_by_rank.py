"""``summary`` rank by rank (``traceview.run.summary_by_rank``) gives the whole-frame answer.

The per-rank path is forced (its thresholds set to 0) and its ``--json`` compared byte for byte
with the whole-frame path's on runs whose answers reach every part of it: GPU ranks with a
flagged straggler, ranks nobody is flagged on where the replay names a pattern, send/recv
pipelines, gloo CPU-only ranks, one nsys file holding several ranks; grouped one rank a task
and all ranks in one task; on threads, on local worker processes (pickled tasks) and on Dask.
"""

from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.run import summary_by_rank as by_rank
from traceview.store.executors import ExecutorSpec

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "fixtures" / "data"


def _answer(path: Path, monkeypatch, *, executor=None, per_task: int | None = None,
            whole: bool = False) -> str:
    run = traceview.open(path, cache=False)
    if whole:
        monkeypatch.setattr(by_rank, "EVENTS_BY_RANK", 1 << 62)
    else:
        monkeypatch.setattr(by_rank, "EVENTS_BY_RANK", -1)
        monkeypatch.setattr(by_rank, "EVENTS_PER_TASK", per_task if per_task is not None else 0)
        run.traceset.executor = executor
    return json.dumps(run.summary().to_dict(), sort_keys=True, default=str)


@pytest.fixture
def calls(monkeypatch) -> list[list[int]]:
    """The ranks of each task run in this process (threads)."""
    seen: list[list[int]] = []
    real = by_rank.rank_tables

    def counted(run):
        seen.append(run.ranks_present)
        return real(run)

    monkeypatch.setattr(by_rank, "rank_tables", counted)
    return seen


@pytest.fixture(scope="module")
def gpu_sets(tmp_path_factory) -> dict[str, Path]:
    """Synthetic NCCL GPU jobs (``fixtures.synthetic``): each rank its own clock."""
    from fixtures.synthetic import SyntheticSpec, generate

    offsets = (0, 2_500_000, -700_000, 41_000_000)
    specs = {
        "gpu_slow_rank": SyntheticSpec(world_size=4, steps=3, kernels_per_step=6,
                                       clock_offsets_ns=offsets),
        "gpu_balanced": SyntheticSpec(world_size=4, steps=3, kernels_per_step=6,
                                      slow_rank=None, clock_offsets_ns=offsets),
        "gpu_pipeline": SyntheticSpec(world_size=4, steps=2, kernels_per_step=6,
                                      pipeline_micro_batches=2),
        "gpu_alltoall": SyntheticSpec(world_size=4, steps=2, kernels_per_step=6,
                                      alltoall_tokens=56, alltoall_hot_rank=2),
    }
    out = {}
    for name, spec in specs.items():
        out[name] = tmp_path_factory.mktemp(name)
        generate(spec, out[name])
    # communication under names the classification does not know: the unseen-communication
    # warning, which reads the GPU time per kernel name
    hidden = tmp_path_factory.mktemp("gpu_hidden_comm")
    for trace in out["gpu_slow_rank"].glob("*.json.gz"):
        text = gzip.decompress(trace.read_bytes())
        for nccl, other in ((b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", b"peer_sum_kernel"),
                            (b"ncclDevKernel_AllGather_RING_LL", b"my_gather_kernel"),
                            (b"ncclDevComm", b"devComm"), (b"ncclWork", b"devWork")):
            text = text.replace(nccl, other)
        (hidden / trace.name).write_bytes(gzip.compress(text))
    out["gpu_hidden_comm"] = hidden
    return out


@pytest.mark.parametrize("name", [
    "gpu_slow_rank",                     # GPU ranks, clocks apart, a slow rank
    "gpu_balanced",                      # GPU ranks, nobody slow
    "gpu_pipeline",                      # NCCL send/recv pairs
    "gpu_alltoall",                      # all-to-all
    "gpu_hidden_comm",                   # the unseen-communication warning
    "scenarios/ddp_stall_r2",            # gloo ranks, a flagged straggler
    "replay/ddpb_intermittent_r1",       # nobody flagged: the replay names the pattern
    "replay/ddp1b_rotating",             # a moving stall
    "scenarios/pipeline_stall_s3",       # send/recv pairs
    "gloo_ddp_4r_noisy_slow2",           # CPU-only gloo ranks
])
def test_rank_by_rank_equals_whole_frame(name, gpu_sets, monkeypatch, calls):
    path = gpu_sets.get(name, DATA / name)
    whole = _answer(path, monkeypatch, whole=True)
    if name == "gpu_hidden_comm":
        assert "shows no communication kernels" in whole and "peer_sum_kernel" in whole
    assert calls == []
    with ThreadPoolExecutor(2) as ex:
        one_each = _answer(path, monkeypatch, executor=ex)
        n_ranks = len(calls)
        assert n_ranks >= 2 and all(len(group) == 1 for group in calls)
        calls.clear()
        together = _answer(path, monkeypatch, executor=ex, per_task=1 << 62)
        assert len(calls) == 1 and len(calls[0]) == n_ranks
    assert one_each == whole
    assert together == whole


def test_nsys_file_of_several_ranks(tmp_path, monkeypatch, calls):
    """One events file holding every rank: each task's window keeps its own ranks' rows."""
    from fixtures.nsys_synthetic import write_export

    path = tmp_path / "job.sqlite"
    write_export(path, ranks=3, steps=3)
    whole = _answer(path, monkeypatch, whole=True)
    with ThreadPoolExecutor(2) as ex:
        assert _answer(path, monkeypatch, executor=ex) == whole
    assert sorted(calls) == [[0], [1], [2]]


def test_local_worker_processes(monkeypatch):
    """The tasks as the CLI sends them: pickled to forked worker processes."""
    path = DATA / "scenarios" / "ddp_compute_r1"
    whole = _answer(path, monkeypatch, whole=True)
    assert _answer(path, monkeypatch, executor=ExecutorSpec("local", max_workers=2)) == whole


def test_dask_local_cluster(monkeypatch):
    pytest.importorskip("distributed")
    path = DATA / "scenarios" / "tpdp_stall_r3"
    whole = _answer(path, monkeypatch, whole=True)
    spec = ExecutorSpec("dask", max_workers=2, processes=False)
    assert _answer(path, monkeypatch, executor=spec) == whole


def test_task_groups_cut_by_events(monkeypatch):
    run = traceview.open(DATA / "gloo_ddp_4r_noisy_slow2", cache=False)
    counts = dict(run.traceset.files.select("file_id", "stored_events").iter_rows())
    per_rank = [counts[f] for f in run.traceset.ranks.sort("rank")["file_id"]]
    ranks = run.ranks_present
    monkeypatch.setattr(by_rank, "EVENTS_PER_TASK", per_rank[0] + per_rank[1])
    groups = by_rank.task_groups(run.traceset, ranks)
    assert groups[0] == [0, 1] and [r for g in groups for r in g] == ranks
    monkeypatch.setattr(by_rank, "EVENTS_PER_TASK", 0)  # a rank above the cut: a task alone
    assert by_rank.task_groups(run.traceset, ranks) == [[r] for r in ranks]


def test_when_rank_by_rank(monkeypatch):
    """Whole ranks, two or more, many events or a named executor; never a window of steps,
    one rank or events held in memory."""
    path = DATA / "gloo_ddp_2r"
    run = traceview.open(path, cache=False)
    assert not by_rank.wanted(run)  # small, no executor: whole frame
    monkeypatch.setattr(by_rank, "EVENTS_BY_RANK", 0)
    assert by_rank.wanted(run)
    assert not by_rank.wanted(run.select(steps="1:2"))
    assert not by_rank.wanted(run.select(ranks="0"))
    monkeypatch.setattr(by_rank, "EVENTS_BY_RANK", 1 << 62)
    run.traceset.executor = ExecutorSpec("local")
    assert by_rank.wanted(run)
    frame = traceview.run.run.Run.from_events(run.events.collect())
    frame.traceset.executor = ExecutorSpec("local")
    assert not by_rank.wanted(frame)


def test_the_callers_run_keeps_its_tables(gpu_sets, monkeypatch):
    """The driver's tables (the ranks' small ones) live in a Run of their own: the caller's
    Run still gives its full GPU rows afterwards."""
    run = traceview.open(gpu_sets["gpu_slow_rank"], cache=False)
    monkeypatch.setattr(by_rank, "EVENTS_BY_RANK", -1)
    with ThreadPoolExecutor(2) as ex:
        run.traceset.executor = ex
        run.summary()
    assert "gpu" not in run.__dict__
    assert "ts_ns" in run.gpu.columns and run.gpu.height > 0
    assert isinstance(run.gpu, pl.DataFrame)


def test_a_task_that_keeps_failing_leaves_no_rank_out(gpu_sets, monkeypatch):
    """A group whose task raises on every attempt: the whole-frame path answers, every rank
    in it (a summary never drops a rank silently)."""
    path = gpu_sets["gpu_slow_rank"]
    whole = _answer(path, monkeypatch, whole=True)
    real = by_rank.rank_tables

    def rank_2_fails(run):
        if 2 in run.ranks_present:
            raise OSError("worker lost")
        return real(run)

    monkeypatch.setattr(by_rank, "rank_tables", rank_2_fails)
    with ThreadPoolExecutor(2) as ex:
        assert _answer(path, monkeypatch, executor=ex) == whole
