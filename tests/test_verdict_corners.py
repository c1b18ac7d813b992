"""Corners real traces have (issue 10, item 7), each on a hand-made Kineto trace.

1. GPU work whose launch is not in the trace (queued before the profiler started): counted in
   ``info --json``, kept by default with a warning, dropped with ``--exclude-unlaunched``.
2. Other accelerators (MTIA): ``mtia_ccp_events`` are device work, ``mtia_runtime`` calls are
   their launches; the stored table is unchanged (kind ``other``).
3. Custom all-reduce kernels (a project's own; vLLM's ``cross_device_reduce_*`` are known) become communication with
   ``--comm-pattern`` or ``--comm-config``; the kept classified rows key on the patterns.

Times below are microseconds in the trace, nanoseconds in the answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from helpers import write_trace
from traceview.cli import main


def _x(name: str, cat: str, ts: float, dur: float, pid: int = 1, tid: int = 1,
       **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return _x(name, "kernel", ts, dur, pid=0, tid=stream, device=0, stream=stream,
              correlation=corr)


def _launch(ts: float, corr: int) -> dict:
    return _x("cudaLaunchKernel", "cuda_runtime", ts, 2, correlation=corr)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# --- 1. GPU work whose launch is not in the trace ------------------------------------------

@pytest.fixture
def queued_trace(tmp_path: Path) -> str:
    """Rank 0: k0 [5,15) has correlation 100 and no launch (queued before the profiler);
    k1 [30,40) launched at 20; k2 [50,60) launched at 40. Rank 1 has no GPU work."""
    events = [_x("ProfilerStep#1", "user_annotation", 0, 100),
              _kernel("k0", 5, 10, corr=100),
              _launch(20, 1), _kernel("k1", 30, 10, corr=1),
              _launch(40, 2), _kernel("k2", 50, 10, corr=2)]
    path = write_trace(tmp_path / "rank0.json", events, distributedInfo={"rank": 0})
    write_trace(tmp_path / "rank1.json", [_x("aten::mm", "cpu_op", 0, 5)],
                distributedInfo={"rank": 1})
    return str(path.parent)


def test_info_counts_unlaunched_gpu_events(queued_trace, capsys) -> None:
    report = _json(capsys, ["info", queued_trace, "--no-cache", "--json"])
    assert report["unlaunched_gpu_events"] == 1
    assert [(r["rank"], r["unlaunched_gpu_events"]) for r in report["ranks"]] == [(0, 1), (1, 0)]


def test_unlaunched_work_is_kept_with_a_warning(queued_trace) -> None:
    res = traceview.open(queued_trace, cache=False).overlap().to_dict()
    row = res["rows"][0]
    # window [5,60) = 55 us; compute = k0 + k1 + k2 = 30 us
    assert (row["window_ns"], row["compute_ns"]) == (55_000, 30_000)
    assert any("1 GPU events on rank(s) 0 have no launch" in w and "counted" in w
               for w in res["warnings"])


def test_exclude_unlaunched_drops_it(queued_trace, capsys) -> None:
    run = traceview.open(queued_trace, cache=False, exclude_unlaunched=True)
    res = run.overlap().to_dict()
    row = res["rows"][0]
    # k0 gone: window [30,60) = 30 us, compute = 20 us, idle = the 10 us between k1 and k2
    assert (row["window_ns"], row["compute_ns"], row["idle_ns"]) == (30_000, 20_000, 10_000)
    assert any("dropped (--exclude-unlaunched)" in w for w in res["warnings"])
    cli = _json(capsys, ["overlap", queued_trace, "--no-cache", "--json",
                         "--exclude-unlaunched"])
    assert cli == json.loads(json.dumps(res))


def test_no_warning_when_every_launch_is_in_the_trace(tmp_path) -> None:
    path = write_trace(tmp_path / "t.json", [_launch(20, 1), _kernel("k1", 30, 10, corr=1)])
    res = traceview.open(str(path), cache=False).overlap()
    assert not [w for w in res.warnings if "no launch" in w]


# --- 2. Other accelerators: MTIA ------------------------------------------------------------

@pytest.fixture
def mtia_trace(tmp_path: Path) -> str:
    """MTIA device 17 (pid 17, stream 100): a kernel [20,50) launched by runFunction at 10, a
    DMA [60,70) launched at 55, and an event_wait [0,100) (a wait, no work)."""
    events = [_x("ProfilerStep#1", "user_annotation", 0, 100),
              _x("runFunction - job_prep_and_submit_for_execution", "mtia_runtime", 10, 5,
                 correlation=1, device=17),
              _x("add-dtype_Float", "mtia_ccp_events", 20, 30, pid=17, tid=100, stream=100,
                 correlation=1),
              _x("enqueueCommand memcpyHtoDAsync", "mtia_runtime", 55, 2, correlation=2),
              _x("dma_request", "mtia_ccp_events", 60, 10, pid=17, tid=100, stream=100,
                 correlation=2, direction="HOST_TO_DEVICE"),
              _x("event_wait", "mtia_ccp_events", 0, 100, pid=17, tid=101, stream=101)]
    return str(write_trace(tmp_path / "mtia.json", events))


def test_mtia_device_events_are_device_work(mtia_trace) -> None:
    run = traceview.open(mtia_trace, cache=False)
    row = run.overlap().to_dict()["rows"][0]
    # window [20,70) = 50 us: compute 30 (the kernel), memcpy 10 (the DMA), idle 10
    assert (row["device"], row["window_ns"], row["compute_ns"], row["memcpy_ns"],
            row["idle_ns"]) == (17, 50_000, 30_000, 10_000, 10_000)
    assert row["note"].startswith("no communication kernels")  # not "no GPU events"
    # their launches are the mtia_runtime calls: nothing unlaunched, steps from the launches
    assert run.unlaunched.height == 0
    assert run.gpu.get_column("step").to_list() == [1, 1]


def test_mtia_store_is_unchanged(mtia_trace) -> None:
    kinds = (traceview.open(mtia_trace, cache=False).events
             .filter(pl.col("category").cast(pl.String).str.starts_with("mtia"))
             .select(pl.col("kind").cast(pl.String)).collect().to_series().unique().to_list())
    assert kinds == ["other"]


# --- 3. Custom all-reduce kernels -----------------------------------------------------------

@pytest.fixture
def custom_allreduce_trace(tmp_path: Path) -> str:
    """sgemm [0,100) on stream 7 and a project's own all-reduce kernel, ring_reduce_1stage
    [50,150), on stream 9 (vLLM's cross_device_reduce_* are in the default table now:
    tests/test_comm_kernels.py)."""
    events = [_launch(0, 1), _kernel("sgemm", 0, 100, corr=1),
              _launch(1, 2), _kernel("void myproj::ring_reduce_1stage<float, 8>", 50, 100,
                                     corr=2, stream=9)]
    return str(write_trace(tmp_path / "vllm.json", events))


def _overlap_row(capsys, path: str, *options: str) -> dict:
    return _json(capsys, ["overlap", path, "--json", *options])["rows"][0]


def test_custom_allreduce_is_compute_without_a_pattern(custom_allreduce_trace, capsys,
                                                        tmp_path) -> None:
    row = _overlap_row(capsys, custom_allreduce_trace, "--cache-dir", str(tmp_path / "c"))
    assert (row["compute_ns"], row["comm_ns"], row["overlap_ns"]) == (150_000, 0, 0)


def test_comm_pattern_makes_it_communication(custom_allreduce_trace, capsys, tmp_path) -> None:
    cache = ["--cache-dir", str(tmp_path / "c")]
    _overlap_row(capsys, custom_allreduce_trace, *cache)  # keeps the default rows in the cache
    row = _overlap_row(capsys, custom_allreduce_trace, *cache,
                       "--comm-pattern", "ring_reduce_")
    # compute [0,100), comm [50,150): overlap 50, exposed comm 50; the cache did not serve
    # the rows classified without the pattern
    assert (row["compute_ns"], row["comm_ns"], row["overlap_ns"],
            row["exposed_comm_ns"]) == (100_000, 100_000, 50_000, 50_000)
    again = _overlap_row(capsys, custom_allreduce_trace, *cache)
    assert again["comm_ns"] == 0  # and the patterned rows are not served without it


def test_comm_config_file(custom_allreduce_trace, capsys, tmp_path) -> None:
    config = tmp_path / "comm.toml"
    config.write_text('comm_patterns = ["^void myproj::ring_reduce_", "^custom_ar_"]\n')
    row = _overlap_row(capsys, custom_allreduce_trace, "--no-cache", "--comm-config", str(config))
    assert (row["comm_ns"], row["overlap_ns"]) == (100_000, 50_000)
    api = traceview.open(custom_allreduce_trace, cache=False, comm_config=config)
    assert api.overlap().to_dict()["rows"][0] == row


def test_bad_comm_pattern_is_a_usage_error(custom_allreduce_trace, capsys, tmp_path) -> None:
    assert main(["overlap", custom_allreduce_trace, "--no-cache", "--comm-pattern", "(x"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("comm_patterns = 3\n")
    assert main(["overlap", custom_allreduce_trace, "--no-cache", "--comm-config", str(bad)]) == 2


def test_unlaunched_needs_a_correlation_without_a_launch() -> None:
    """Rows: corr 1 launched (rank 0), corr 2 not launched, corr 1 on rank 1 (the launch is
    rank 0's, so not launched), no correlation (no launch links: not counted); the MTIA
    runtime call launches corr 3."""
    from traceview.analyses.launches import unlaunched_counts, unlaunched_gpu

    events = pl.DataFrame({"rank": [0, 0], "kind": ["cuda_runtime", "other"],
                           "category": ["cuda_runtime", "mtia_runtime"],
                           "correlation": [1, 3], "ts_ns": [0, 0]})
    gpu = pl.DataFrame({"rank": [0, 0, 1, 0, 0], "correlation": [1, 2, 1, None, 3]})
    found = unlaunched_gpu(gpu, events)
    assert found.rows() == [(0, 2), (1, 1)]
    ranks = pl.DataFrame({"rank": [0, 1, 2]})
    assert unlaunched_counts(found, ranks).rows() == [(0, 1), (1, 1), (2, 0)]
