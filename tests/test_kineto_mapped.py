"""The C scanner over a memory-mapped file: it hashes the file beside the scan (the content id),
and a file another process cuts short under it is a failed scan, not a process killed by
SIGBUS (``_scan.c``: guarded_elements, hash_mapped)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash

from traceview.parsers import kineto

_kineto_scan = kineto._parse._kineto_scan
pytestmark = pytest.mark.skipif(_kineto_scan is None, reason="no C scanner")


def _trace(events: int, padding: int = 0) -> bytes:
    """A Kineto document of ``events`` events, each with ``padding`` bytes of args text."""
    one = b'{"ph":"X","cat":"cpu_op","name":"op","pid":1,"tid":1,"ts":1.5,"dur":2,' \
          b'"args":{"note":"' + b"x" * padding + b'"}}'
    return b'{"traceEvents":[' + b",".join([one] * events) + b"]}"


def _scanned(path: Path, **kw) -> tuple[int, dict]:
    with open(path, "rb") as fh:
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _kineto_scan.scan(data, kw.get("min_parallel", 8 << 20), 1, None, 256 << 10,
                                 1 << 40, 1 << 20, True)
    finally:
        data.close()


@pytest.mark.parametrize("events, padding", [(1, 0), (3, 40), (4000, 1000), (9000, 1100)],
                         ids=["one-event", "a-few", "about-4MiB", "past-two-chunks"])
def test_a_mapped_file_is_hashed_as_xxhash_hashes_it(tmp_path, events, padding):
    """Whole or in 4 MiB chunks (their pages handed back as they go), the digest is
    xxhash.xxh3_128's of the bytes, and the columns are those of a scan of the bytes."""
    path = tmp_path / "trace.json"
    path.write_bytes(_trace(events, padding))
    rows, columns = _scanned(path)
    assert columns["content_id"] == xxhash.xxh3_128_hexdigest(path.read_bytes())
    plain_rows, plain = _kineto_scan.scan(path.read_bytes())
    assert rows == plain_rows == events and plain["content_id"] is None  # bytes: not hashed
    assert columns["args_json"] is not None


def test_the_parse_keys_a_large_file_by_the_bytes_it_mapped(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(_trace(2000, 600))  # past kineto._parse.FOLLOW_FROM_BYTES: mapped
    parsed = kineto.parse_batched(path)
    assert parsed.content_id == xxhash.xxh3_128_hexdigest(path.read_bytes())
    small = tmp_path / "small.json"
    small.write_bytes(_trace(3))
    assert kineto.parse_batched(small).content_id is None  # read first: the caller hashes it


_CUT_SHORT = textwrap.dedent("""
    import faulthandler, mmap, os, sys, threading, time
    faulthandler.enable()  # as pytest has it: its handler must come back after each scan
    from traceview.parsers import kineto
    from traceview.errors import UnreadableTraceError
    scan = kineto._parse._kineto_scan.scan
    path, text = sys.argv[1], open(sys.argv[1], "rb").read()

    def cut_after(delay):
        time.sleep(delay)
        os.truncate(path, 1000)

    for delay in (0.0, 0.003, 0.02, 0.08):
        open(path, "wb").write(text)
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        cutter = threading.Thread(target=cut_after, args=(delay,))
        cutter.start()
        try:
            scan(data, 1 << 20, 1, None, 1 << 18, 1 << 40, 1 << 20, True)
            print("scan whole")
        except ValueError as exc:
            print("scan failed:", exc)
        cutter.join()
        data.close()
        open(path, "wb").write(text)  # and through the parser: a partial answer or an error
        cutter = threading.Thread(target=cut_after, args=(delay,))
        cutter.start()
        try:
            parsed = kineto.parse(path)
            print("parse:", parsed.events.num_rows, "events")
        except UnreadableTraceError as exc:
            print("parse refused:", exc)
        cutter.join()
    print("alive")
""")


def test_a_mapped_file_cut_short_under_the_scan_is_a_failed_scan_not_sigbus(tmp_path):
    """Another process truncating the file while both scanner threads and the hasher read it:
    every read past the new end lands back in the scanner, which fails like damaged input;
    the parser then reads the file as it now is (a partial answer or a refusal naming it).
    Run in a child process: a SIGBUS not caught kills it, which the test sees."""
    path = tmp_path / "trace.json"
    path.write_bytes(_trace(60_000, 1500))  # ~100 MB: the scan takes a while
    script = tmp_path / "cut.py"
    script.write_text(_CUT_SHORT)  # the traceview this test imports: installed, or the tree's
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert lines[-1] == "alive" and "Fatal Python error" not in done.stderr
    scans = [line for line in lines if line.startswith("scan")]
    assert len(scans) == 4
    assert all(line == "scan whole" or "cut short while it was read" in line for line in scans)
    assert any("cut short" in line for line in scans)  # at least the first delay lands in it


def test_a_file_that_cannot_be_mapped_is_read_as_before(tmp_path, monkeypatch):
    """Some filesystems (FUSE, some network mounts) refuse mmap: the file is then read in a
    thread the scanner follows, parsed the same, and hashed by the caller (no content id)."""
    from traceview.parsers.kineto import _input

    path = tmp_path / "trace.json"
    path.write_bytes(_trace(2000, 600))
    mapped = kineto.parse_batched(path)
    real = _input.mmap.mmap

    def refuse_files(fileno, *args, **kwargs):
        if fileno != -1:  # a file mapping; anonymous maps (-1) are still allowed
            raise OSError(19, "No such device")
        return real(fileno, *args, **kwargs)

    monkeypatch.setattr(_input.mmap, "mmap", refuse_files)
    with _input.open_input(path, [], follow=True) as given:
        assert not given.mapped_file and given.progress is not None
    read = kineto.parse_batched(path)
    assert read.content_id is None and mapped.content_id is not None
    assert read.events.table().equals(mapped.events.table())
