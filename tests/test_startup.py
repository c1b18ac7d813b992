"""What a command imports before it answers: start-up is most of a short command's time
(docs/performance.md, log 41). Each check runs the command in a fresh interpreter, as a user's
shell does, and lists the heavy modules it left in ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import FIXTURES
from traceview import cli

#: Modules whose import costs a command ~0.1-0.4 s each, and the format parsers (a cache hit
#: reads Parquet only).
HEAVY = ("polars", "pyarrow", "numpy", "pandas", "traceview.parsers.kineto",
         "traceview.parsers.nsys")

GPU_TRACE = FIXTURES / "data" / "gpu_real" / "sampled_rank-0.json.gz"


def imported_by(argv: list[str], **env: str) -> list[str]:
    """The ``HEAVY`` modules a fresh interpreter has imported once ``traceview ARGV`` ran
    (its output discarded; an exit through ``SystemExit`` counts as having run), with the
    environment variables ``env`` added."""
    code = ("import contextlib, io, sys\n"
            "from traceview.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), "
            "contextlib.redirect_stderr(io.StringIO()):\n"
            "    try:\n"
            f"        rc = main({argv!r})\n"
            "    except SystemExit as exc:\n"
            "        rc = exc.code\n"
            f"print(rc, *[m for m in {HEAVY!r} if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, **env}).stdout.split()
    return out


def test_version_and_help_import_neither_polars_nor_pyarrow():
    assert imported_by(["--version"]) == ["0"]
    assert imported_by(["--help"]) == ["0"]


def test_a_cached_summary_imports_no_pyarrow_numpy_or_parser(tmp_path):
    cache = str(tmp_path / "cache")
    argv = ["summary", str(GPU_TRACE), "--json", "--cache-dir", cache]
    assert cli.main(argv) == 0  # fills the cache (this process)
    # computed from the cached events, not printed from the answer this process kept
    # (traceview/cli/_answers.py; test_answers.py checks that one imports no Polars)
    assert imported_by(argv, TRACEVIEW_ANSWERS="off") == ["0", "polars"]


def test_the_program_exits_with_mains_code_and_its_whole_output(tmp_path):
    # `python -m traceview` and the console script go through console_main, which freezes
    # the objects left before the interpreter exits: the code and every byte still come out
    def program(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                              text=True, cwd=tmp_path)

    assert program("--version").returncode == 0
    bad = program("gapz")
    assert bad.returncode == 2 and "invalid choice: 'gapz'" in bad.stderr
    done = program("summary", str(GPU_TRACE), "--json", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 0
    assert json.loads(done.stdout)["ranks"][0]["rank"] == 0
