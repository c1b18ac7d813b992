"""The README's quick start is what CI runs: its two commands, and the commands `.ci/run`
runs for the second, are the same words in both files. Its GPU commands run, on the real GPU
trace they name, and answer with GPU time (not the CPU fixture's empty columns)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO
from traceview.cli import main

README = (REPO / "README.md").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()


def _quick_start() -> list[str]:
    """The commands of the README's quick start: each bash block's line."""
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def _ci_commands() -> set[str]:
    """`.ci/run`'s command lines, comments and shell plumbing left out."""
    return {line.strip() for line in CI_RUN.splitlines()
            if line.strip() and not line.strip().startswith("#")}


def _gpu_commands() -> list[list[str]]:
    """The quick start's third block, one command a line, comments left out."""
    return [shlex.split(line, comments=True) for line in _quick_start()[2].splitlines()]


def test_the_quick_start_is_two_commands_and_the_second_is_ci():
    first, second, _gpu = _quick_start()
    assert second == "bash .ci/run"
    steps = [shlex.split(step) for step in first.split("&&")]
    assert steps[0] == ["python3", "-m", "venv", ".venv"]
    assert steps[1] == [".venv/bin/pip", "install", "."]
    assert steps[2] == [".venv/bin/traceview", "info", "fixtures/data/gloo_ddp_2r"]


def test_ci_runs_the_readmes_main_job_and_test_command():
    ci = _ci_commands()
    first = _quick_start()[0]
    main_job = first.split("&&")[-1].strip().removeprefix(".venv/bin/")
    assert main_job in ci
    # the commands the quick start says `.ci/run` runs, in backticks, are its lines
    said = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for command in ('pip install -q "torch==2.13.0"', 'pip install -q ".[dev,plots,dask,postgres]"',
                    "python -m pytest -q -p no:cacheprovider", "lint-imports", "ruff check ."):
        assert command in ci
        assert command.replace(" -q", "") in said or command in said, command


def test_ci_installs_into_its_own_venv_from_nothing_but_python3():
    assert 'python3 -m venv "$VENV"' in CI_RUN and "set -euo pipefail" in CI_RUN


def test_the_quick_starts_gpu_commands_cover_the_gpu_questions_on_the_real_gpu_trace():
    traceview = [argv[1:] for argv in _gpu_commands() if argv[0] == ".venv/bin/traceview"]
    assert [argv[0] for argv in traceview] == [
        "summary", "gaps", "breakdown", "overlap", "diagnose", "report"]
    assert all(argv[1] == "fixtures/data/gpu_real" for argv in traceview)
    others = [argv for argv in _gpu_commands() if argv[0] != ".venv/bin/traceview"]
    assert others == [[".venv/bin/pip", "install", ".[plots]"]]  # the report needs plotly
    assert (REPO / "fixtures/data/gpu_real/LICENSE").is_file()


@pytest.mark.parametrize("argv", [a[1:] for a in _gpu_commands() if a[0] == ".venv/bin/traceview"],
                         ids=lambda a: a[0])
def test_the_quick_starts_gpu_command_answers_with_gpu_time(argv, tmp_path: Path, capsys,
                                                            monkeypatch):
    monkeypatch.chdir(REPO)  # the README's paths are relative to the checkout
    argv = [str(tmp_path / a) if a.endswith(".html") else a for a in argv]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # what the CPU fixture says instead of GPU numbers
    assert "no ProfilerStep" not in out and "no GPU" not in out
    assert "no communication kernels" not in out
    if argv[0] == "summary":
        row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["0"])
        assert row[1] == "2" and "-" not in row[2:6]  # steps, step time, compute, comm, exposed
    if argv[0] == "report":
        assert (tmp_path / "gpu-report.html").stat().st_size > 0


def test_the_command_table_names_every_command() -> None:
    """The README's command table lists every command the CLI has (it had left out ops and
    history)."""
    from traceview.cli import COMMANDS

    rows = [line for line in (REPO / "README.md").read_text().splitlines()
            if line.startswith("| `traceview ")]
    listed = {m for line in rows for m in re.findall(r"`traceview ([a-z-]+)", line)}
    assert set(COMMANDS) <= listed, sorted(set(COMMANDS) - listed)
