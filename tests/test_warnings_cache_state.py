"""A command's warnings are the data's: the same whatever ran before it, cache cold or warm
(issue 48, item 8: after ``summary``, ``overlap --json`` lost the warning about GPU work
queued before the profiler, which it gave on a cold cache and from the API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import traceview
from helpers import write_trace
from traceview.cli import main


def _x(name: str, cat: str, ts: float, dur: float, pid: int = 1, tid: int = 1,
       **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}


@pytest.fixture
def queued(tmp_path: Path) -> str:
    """One kernel (correlation 100) with no launch in the trace, one launched."""
    events = [_x("ProfilerStep#1", "user_annotation", 0, 100),
              _x("k0", "kernel", 5, 10, pid=0, tid=7, device=0, stream=7, correlation=100),
              _x("cudaLaunchKernel", "cuda_runtime", 20, 2, correlation=1),
              _x("k1", "kernel", 30, 10, pid=0, tid=7, device=0, stream=7, correlation=1)]
    return str(write_trace(tmp_path / "rank0.json", events, distributedInfo={"rank": 0}))


def _warnings(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["warnings"]


@pytest.mark.parametrize("before", ["summary", "overlap", "gaps", "breakdown"])
@pytest.mark.parametrize("command", ["overlap", "gaps", "summary"])
def test_warnings_do_not_depend_on_what_ran_before(before: str, command: str, queued: str,
                                                   tmp_path: Path, capsys) -> None:
    cold = _warnings(capsys, [command, queued, "--cache-dir", str(tmp_path / "cold")])
    assert any("have no launch in the trace" in w for w in cold)
    warm = str(tmp_path / "warm")
    _warnings(capsys, [before, queued, "--cache-dir", warm])
    assert _warnings(capsys, [command, queued, "--cache-dir", warm]) == cold


def test_the_api_warns_the_same_on_a_warm_cache(queued: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = traceview.open(queued, cache_dir=cache).overlap().warnings
    assert traceview.open(queued, cache_dir=cache).overlap().warnings == cold
