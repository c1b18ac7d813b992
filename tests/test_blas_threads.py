"""The program asks OpenBLAS for one thread (its idle spin cost every command 0.15 CPU s), and
leaves alone a user's own choice, the job ``capture`` starts, and a library caller's process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r"
ASKED_BY = "from traceview.cli import _one_blas_thread; _one_blas_thread({!r})"


def _threads_seen(code: str, **env: str) -> str:
    """OPENBLAS_NUM_THREADS as numpy's OpenBLAS found it, after ``code`` ran in a fresh
    interpreter (``?`` when unset)."""
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport os, numpy\n"
         "print(os.environ.get('OPENBLAS_NUM_THREADS', '?'))"],
        env={**clean, **env}, capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def test_the_program_asks_for_one_blas_thread():
    assert _threads_seen(ASKED_BY.format("summary")) == "1"


def test_a_users_choice_is_kept():
    assert _threads_seen(ASKED_BY.format("summary"), OPENBLAS_NUM_THREADS="4") == "4"


def test_numpy_loaded_already_is_left_as_it_is():
    assert _threads_seen("import numpy\n" + ASKED_BY.format("summary")) == "?"


def test_the_job_capture_starts_keeps_its_threads():
    assert _threads_seen(ASKED_BY.format("capture")) == "?"


def test_a_library_caller_is_left_as_it_is():
    assert _threads_seen("import traceview.cli") == "?"


def test_a_command_runs_with_one_blas_thread():
    code = ("import sys, io, contextlib\nfrom traceview.cli import console_main\n"
            f"sys.argv = ['traceview', 'info', {str(FIXTURE)!r}, '--no-cache']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    console_main()")
    assert _threads_seen(code, TRACEVIEW_ANSWERS="off") == "1"
