"""docs/ci-gate.md's command block runs as written, with the exit codes it states."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import orjson
import pytest

from traceview.cli import main

REPO = Path(__file__).resolve().parents[1]


def _commands() -> list[tuple[list[str], int]]:
    text = (REPO / "docs" / "ci-gate.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "docs/ci-gate.md lost its sh block"
    out = []
    for line in block.group(1).splitlines():
        cmd, _, comment = line.partition("#")
        code = re.search(r"exit (\d)", comment)
        assert code, f"no expected exit code on: {line}"
        out.append((shlex.split(cmd), int(code.group(1))))
    return out


def test_ci_gate_doc_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly", reason="the doc's report command needs plotly (.[plots])")
    (tmp_path / "fixtures").symlink_to(REPO / "fixtures")
    monkeypatch.chdir(tmp_path)
    commands = _commands()
    assert len(commands) == 8
    assert sum("--run" in argv for argv, _ in commands) == 1  # the multi-run baseline
    for argv, expected in commands:
        assert argv[0] == "traceview"
        assert main(argv[1:]) == expected, " ".join(argv)
    assert (tmp_path / "perf-junit.xml").is_file() and (tmp_path / "perf-report.html").is_file()
    runs = orjson.loads((tmp_path / "runs-baseline.json").read_bytes())
    assert len(runs["runs"]) == 2 and runs["metrics"]["step_time_p50_ns"]["spread"] > 0
    assert "FAIL step_time_p50_ns" in capsys.readouterr().out
