"""The README's quick start is what CI runs: its two commands, and the commands `.ci/run`
runs for the second, are the same words in both files."""

from __future__ import annotations

import re
import shlex

from tests.conftest import REPO

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


def test_the_quick_start_is_two_commands_and_the_second_is_ci():
    first, second = _quick_start()
    assert second == "bash .ci/run"
    steps = [shlex.split(step) for step in first.split("&&")]
    assert steps[0] == ["python3", "-m", "venv", ".venv"]
    assert steps[1] == [".venv/bin/pip", "install", "."]
    assert steps[2] == [".venv/bin/traceview", "info", "fixtures/data/gloo_ddp_2r"]


def test_ci_runs_the_readmes_main_job_and_test_command():
    ci = _ci_commands()
    first, _ = _quick_start()
    main_job = first.split("&&")[-1].strip().removeprefix(".venv/bin/")
    assert main_job in ci
    # the commands the quick start says `.ci/run` runs, in backticks, are its lines
    said = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for command in ('pip install -q "torch==2.13.0"', 'pip install -q ".[dev,plots,dask]"',
                    "python -m pytest -q -p no:cacheprovider", "lint-imports", "ruff check ."):
        assert command in ci
        assert command.replace(" -q", "") in said or command in said, command


def test_ci_installs_into_its_own_venv_from_nothing_but_python3():
    assert 'python3 -m venv "$VENV"' in CI_RUN and "set -euo pipefail" in CI_RUN
