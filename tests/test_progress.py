"""The progress line of a long ingest (issue 25): files done of total, MB/s and time left on
stderr, only when stderr is a terminal, never beside ``--json`` nor into a pipe. The real
command runs with its stderr on a pseudo-terminal (``pty.openpty``) and on a pipe."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import orjson

from fixtures.corpus import REPO
from traceview.store.progress import ProgressLine


def test_the_line_says_files_rate_and_time_left():
    now = [0.0]
    out = io.StringIO()
    line = ProgressLine([100_000_000, 100_000_000, 200_000_000, 100_000_000], stream=out,
                        clock=lambda: now[0])
    now[0] = 1.0
    line.done(0)  # 100 MB in 1 s: 100 MB/s, 400 MB left: 4 s
    assert out.getvalue() == ("\rtraceview: ingested 1/4 files, 100 of 500 MB, 100 MB/s, "
                              "~4 s left")
    now[0] = 1.1
    line.done(2)  # within the redraw interval: not drawn
    assert out.getvalue().count("\r") == 1
    now[0] = 5.0
    line.done(1)
    line.done(3)  # the last file is always drawn, without a time left (padded over the last)
    assert out.getvalue().rstrip(" ").endswith(
        "\rtraceview: ingested 4/4 files, 500 of 500 MB, 100 MB/s")
    line.close()
    assert out.getvalue().endswith("\n")


def test_a_shorter_line_wipes_the_longer_one():
    out = io.StringIO()
    now = [1.0]
    line = ProgressLine([10**9, 1], stream=out, clock=lambda: now[0])
    now[0] = 1.5
    line.done(1)
    first = out.getvalue()
    now[0] = 100.0
    line.done(0)
    last = out.getvalue()[len(first):]
    assert len(last) >= len(first)  # padded over what was there


def _rank_files(folder, n: int) -> None:
    """``n`` small rank files: more than an ingest parses in its own process, so a pool of
    workers parses them and the line counts them as they come back."""
    for rank in range(n):
        events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                   "ts": 1000 + i, "dur": 1} for i in range(50)]
        doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": n},
               "traceEvents": events}
        (folder / f"rank-{rank}.pt.trace.json").write_bytes(orjson.dumps(doc))


def _run(args: list[str], *, terminal: bool) -> tuple[str, str]:
    """(stdout, stderr) of ``python -m traceview ARGS``, stderr on a pseudo-terminal or a
    pipe."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "traceview", *args]
    if not terminal:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                              cwd=REPO)
        return done.stdout, done.stderr
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=secondary, env=env, cwd=REPO)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    stdout = proc.communicate(timeout=300)[0]
    os.close(primary)
    return stdout.decode(), seen.decode(errors="replace")


def test_a_terminal_sees_the_line_and_a_pipe_or_json_does_not(tmp_path):
    _rank_files(tmp_path, 40)
    args = ["ingest", str(tmp_path), "--no-cache"]
    _, on_terminal = _run(args, terminal=True)
    assert "ingested 40/40 files" in on_terminal and "MB/s" in on_terminal
    stdout, piped = _run(args, terminal=False)
    assert "ingested" not in piped and "40 ranks" in stdout
    stdout, json_on_terminal = _run([*args, "--json"], terminal=True)
    assert "ingested" not in json_on_terminal and "\r" not in json_on_terminal
    assert orjson.loads(stdout)["files"] == 40
