"""A large uncompressed Kineto trace the cache has never seen is read once: its parse hashes the
bytes as they are read (the cache key), instead of the file being hashed whole before it is
parsed (``traceview.store.ingest._parse_first``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import xxhash

import traceview
from traceview.store import parquet

#: Past ``kineto._parse.FOLLOW_FROM_BYTES``: read in a thread the scanner follows.
PADDING = 1 << 20


def _write_trace(path: Path, *, damaged: bool = False) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1,
               "ts": 100 + 10 * i, "dur": 5, "args": {"External id": i}} for i in range(300)]
    text = json.dumps({"traceEvents": events, "padding": "x" * PADDING})
    if damaged:  # a NaN: the C scanner gives up, the tolerant path reads it
        text = text.replace('"dur": 5', '"dur": NaN', 1)
    path.write_text(text)
    return path


def _settle() -> None:
    time.sleep(2.1)  # past cache_folder.SETTLED_NS: the file's identity on disk can be trusted


def _hashes_of(monkeypatch, trace: Path) -> list[str]:
    """The calls that hash ``trace`` whole (the real function, counted)."""
    calls, real = [], parquet.content_id

    def counted(path):
        if Path(path) == trace:
            calls.append(str(path))
        return real(path)

    monkeypatch.setattr(parquet, "content_id", counted)
    return calls


def _entries(cache: Path) -> list[dict]:
    return [parquet.read_cache_meta(e, cache) for e in cache.iterdir()
            if (e / "meta.json").exists()]


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "just-written"])
def test_a_large_trace_never_seen_is_read_once(tmp_path, monkeypatch, settled):
    """Settled, the file is never hashed apart from its parse, and the content id is then
    remembered. Written in the last two seconds, its identity cannot be remembered: it is
    hashed before the parse (so that a reopen finds the entry by hashing, not parsing) and
    after it (to see that it did not change meanwhile)."""
    trace = _write_trace(tmp_path / "trace.json")
    if settled:
        _settle()
    cache = tmp_path / "cache"
    hashes = _hashes_of(monkeypatch, trace)
    ts = traceview.open(trace, cache_dir=cache)
    assert len(hashes) == (0 if settled else 2)
    [entry] = _entries(cache)
    assert entry["content_id"] == ts.files["content_id"][0] == \
        xxhash.xxh3_128_hexdigest(trace.read_bytes())
    assert entry["stored_events"] == 300
    again = traceview.open(trace, cache_dir=cache)  # the cache's answer
    assert again.events.collect().equals(ts.events.collect())
    assert len(hashes) == (0 if settled else 3)  # settled: the content id was remembered


def test_a_copy_of_an_ingested_trace_is_answered_from_its_entry(tmp_path):
    """A copy under another name is parsed (the cache does not know the name), found by its
    content, and answered from the entry the first ingest completed: one entry."""
    trace = _write_trace(tmp_path / "trace.json")
    cache = tmp_path / "cache"
    first = traceview.open(trace, cache_dir=cache)
    copy = tmp_path / "copy" / "trace.json"
    copy.parent.mkdir()
    shutil.copyfile(trace, copy)
    second = traceview.open(copy, cache_dir=cache)
    assert len(_entries(cache)) == 1
    assert second.files["content_id"][0] == first.files["content_id"][0]
    assert second.events.collect().equals(first.events.collect())


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "just-written"])
def test_a_large_trace_the_scanner_gives_up_on_is_keyed_by_its_bytes(tmp_path, settled):
    """The tolerant path does not hash what it reads: a settled file unchanged by its identity
    is hashed after the parse; a just-written one is hashed first and parsed again. Either
    way the entry's key is the file's bytes, with the NaN read as null."""
    trace = _write_trace(tmp_path / "trace.json", damaged=True)
    if settled:
        _settle()
    cache = tmp_path / "cache"
    ts = traceview.open(trace, cache_dir=cache)
    [entry] = _entries(cache)
    assert entry["content_id"] == xxhash.xxh3_128_hexdigest(trace.read_bytes())
    assert entry["stored_events"] == 300
    assert any("NaN" in w for w in json.loads(ts.files["warnings"][0]))


def test_asking_about_an_nsys_export_does_not_load_the_kineto_parser(tmp_path):
    """Whether a file is parsed first is asked of every file the cache does not know; for an
    nsys export (or a small file) the answer costs a stat and a sniff, never the Kineto
    parser's imports (~0.2 s)."""
    import os
    import subprocess
    import sys

    export = tmp_path / "rank0.sqlite"
    export.write_bytes(b"SQLite format 3\x00" + b"\x00" * PADDING)
    small = tmp_path / "small.json"
    small.write_text('{"traceEvents": []}')
    probe = ("import sys; from pathlib import Path; from traceview.parsers import "
             "hashes_as_it_reads as ask; "
             f"print(ask(Path({str(export)!r})), ask(Path({str(small)!r})), "
             "'traceview.parsers.kineto' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ), cwd=tmp_path)
    assert done.stdout.split() == ["False", "False", "False"], done.stderr
