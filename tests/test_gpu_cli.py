"""The gaps / overlap / breakdown / summary commands end to end on a hand-written Kineto file
(read by the real parser), and the summary --json contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceview.cli import main


def _x(name: str, cat: str, ts_us: float, dur_us: float, pid: int, tid: int, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts_us, "dur": dur_us, "pid": pid,
            "tid": tid, "args": args}


def write_trace(path: Path, rank: int) -> Path:
    """Two steps; per step: compute 30 us, NCCL 20 us of which 10 us overlap compute.

    step 1 host [0,100) us: gemm [10,40), nccl [30,50) -> compute 30, comm 20, overlap 10
    step 2 host [100,200) us: gemm [110,140), nccl [130,150)
    """
    ev = []
    for n, t0 in ((1, 0), (2, 100)):
        ev.append(_x(f"ProfilerStep#{n}", "user_annotation", t0, 100, 1, 1))
        c = 10 * n
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t0 + 2, 1, 1, 1, correlation=c))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t0 + 3, 1, 1, 1, correlation=c + 1))
        ev.append(_x("gemm", "kernel", t0 + 10, 30, 0, 7, device=0, stream=7, correlation=c))
        ev.append(_x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", t0 + 30, 20, 0, 20,
                     device=0, stream=20, correlation=c + 1))
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                   "world_size": 2},
           "traceEvents": ev}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture()
def traces(tmp_path: Path) -> list[str]:
    return [str(write_trace(tmp_path / f"rank{r}.json", r)) for r in (0, 1)]


def test_summary_json_contract(traces, capsys) -> None:
    assert main(["summary", *traces, "--no-cache", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    r = out["ranks"][0]
    for key in ("rank", "steps", "step_time_ns_p50", "compute_ns", "comm_ns", "overlap_ns",
                "exposed_comm_ns", "hidden_fraction", "idle_fraction"):
        assert key in r
    # whole trace: compute 60 us, comm 40 us, overlap 20 us; GPU span [10,150) us = 140 us,
    # busy = [10,50) + [110,150) = 80 us -> idle 60 us
    assert (r["steps"], r["step_time_ns_p50"]) == (2, 100_000)
    assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"], r["exposed_comm_ns"]) == (
        60_000, 40_000, 20_000, 20_000)
    assert r["hidden_fraction"] == pytest.approx(0.5)
    assert r["idle_fraction"] == pytest.approx(60 / 140)
    assert "worst_straggler" in out


def test_windows_ranks_and_steps(traces, capsys) -> None:
    assert main(["overlap", *traces, "--no-cache", "--json", "--ranks", "1", "--steps", "2:3",
                 "--per-step"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["rank"] for r in rows} == {1}
    step_rows = [r for r in rows if r["step"] is not None]
    assert [r["step"] for r in step_rows] == [2]
    assert (step_rows[0]["compute_ns"], step_rows[0]["overlap_ns"]) == (30_000, 10_000)
    # warm-up skipping: only when asked
    assert main(["breakdown", *traces, "--no-cache", "--json", "--skip-warmup", "1"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert {r["step"] for r in steps if r["step"] is not None} == {2}


def test_text_outputs_and_gaps(traces, capsys) -> None:
    for cmd in ("summary", "overlap", "breakdown", "gaps"):
        assert main([cmd, *traces, "--no-cache"]) == 0
        assert capsys.readouterr().out.strip()
    assert main(["gaps", traces[0], "--no-cache", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # one device gap [50,110) us, between step 1 and step 2 work -> between_steps
    assert [(c["cause"], c["total_gap_ns"]) for c in out["causes"]] == [("between_steps", 60_000)]


def test_bad_window_is_a_usage_error(traces, capsys) -> None:
    assert main(["summary", *traces, "--no-cache", "--time", "1parsec:2"]) == 2
    assert "duration" in capsys.readouterr().err
