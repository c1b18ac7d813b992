"""``ops`` on a trace recorded without ``record_shapes`` says why its shape, FLOP and rate
columns are empty (issue 48, item 10: a table of dashes and no reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import write_trace
from traceview.cli import main


def _trace(path: Path, *, shapes: bool) -> str:
    args = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]} if shapes else {}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 20, "pid": 1, "tid": 1,
         "args": args},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 2,
         "pid": 1, "tid": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 10, "dur": 8, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7, "correlation": 1}}]
    return str(write_trace(path, events, distributedInfo={"rank": 0}))


@pytest.mark.parametrize("shapes", [False, True])
def test_ops_says_when_no_shapes_were_recorded(shapes: bool, tmp_path: Path, capsys) -> None:
    trace = _trace(tmp_path / "rank0.json", shapes=shapes)
    assert main(["ops", trace, "--no-cache", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    said = [w for w in res["warnings"] if "records no input shapes" in w]
    assert len(said) == (0 if shapes else 1)
    assert [r["name"] for r in res["ops"]] == ["aten::mm"]
    if not shapes:
        assert "record_shapes=True" in said[0]
        assert main(["ops", trace, "--no-cache"]) == 0
        assert "records no input shapes" in capsys.readouterr().err  # the text output too
