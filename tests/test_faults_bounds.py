"""Hostile inputs that asked for unbounded memory, or got an internal error or a wrong exit
code: each is now answered within a bound (docs/formats.md, "Bounds") by one line naming the
file (exit 2), or by a warning and a partial answer. The inputs are built here, in tmp_path;
commands that could eat the machine run in a subprocess under an address-space limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from traceview.cli import main

GLOO = FIXTURES / "data" / "gloo_ddp_2r"
ROOT = Path(__file__).resolve().parents[1]
#: The address space a guarded command may use: polars and zstd reserve ~2 GB of it up front,
#: so the bound sits well above that and well below what an unbounded read asks for.
LIMIT = 5 << 30


def _limited(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def _guarded(*argv: str, limit: int = LIMIT, env: dict[str, str] | None = None,
             timeout: int = 120) -> tuple[int, str]:
    """``traceview ARGV`` in a subprocess under an address-space limit: (exit code, stderr +
    stdout)."""
    done = subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limited(limit),
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return done.returncode, done.stderr + done.stdout


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str, *names: str) -> None:
    """One message line (warnings aside) that names each of ``names``; no traceback."""
    lines = [line for line in err.strip().splitlines() if line.startswith("traceview:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for name in names:
        assert name in lines[0], err


# ------------------------------------------------------------------------------- ranks
def test_a_huge_rank_range_is_compared_with_the_ranks_present():
    code, said = _guarded("summary", str(GLOO), "--ranks", "0-1000000000", "--json",
                          "--no-cache")
    assert code == 0, said
    assert '"ranks": "0-1"' in said


@pytest.mark.parametrize("spec", ["5-1000000000", "3-1", "-4", "0-99999999999"])
def test_a_rank_range_outside_the_run_is_one_line(capsys, spec):
    code, _, err = _run(capsys, "summary", str(GLOO), "--ranks", spec, "--no-cache")
    assert code == 2
    _one_line(err, "--ranks")
