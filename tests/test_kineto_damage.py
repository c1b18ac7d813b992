"""A trace cut short (a job killed while the profiler wrote it, a copy that stopped) is read by
the C scanner up to the damage, and gives exactly what the salvage gives: the same rows, the
same dropped count and the same warning. The salvage decodes element by element in Python
(~15x slower, ~2x the memory): a 200 MB trace cut short took 17 s and 740 MB through it.

The truth here is the salvage itself (the pure-Python path), run on the same cut file; cuts
land anywhere: inside strings, numbers, keys, between elements, after a comma."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from traceview.parsers.kineto import _parse

pytestmark = pytest.mark.skipif(_parse._kineto_scan is None,
                                reason="the C scanner is not built here")

_SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gpu_real" / \
    "sampled_rank-0.json.gz"


def _trace(events: int = 1500) -> bytes:
    """The first ``events`` events of a real GPU trace (kernels, runtime calls, flows, steps),
    one event a line as Kineto writes them."""
    doc = json.loads(gzip.decompress(_SOURCE.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"][:events]
    body = ",\n  ".join(json.dumps(e) for e in doc.pop("traceEvents"))
    head = json.dumps(doc)[:-1]
    return (head + ', "traceEvents": [\n  ' + body + "\n]}").encode()


def _cuts(data: bytes, count: int, seed: int) -> list[int]:
    """Where to cut: at random in the events array, and at the shapes that matter (just after
    an element, after the comma behind it, inside a key, inside a number)."""
    start = data.index(b'"traceEvents"')
    picked = random.Random(seed).sample(range(start + 20, len(data) - 3), count)
    element_end = data.index(b"},\n", len(data) // 2) + 1
    key = data.index(b'"name"', len(data) // 3) + 3
    number = data.index(b'"ts": ', len(data) // 4) + 9
    return sorted({*picked, element_end, element_end + 1, key, number, len(data) - 2})


@pytest.fixture
def scanner_threads(monkeypatch, request):
    """The C scanner with its two-thread split forced on small inputs (``threads`` 2), so the
    damage can land in the second half."""
    real = _parse._kineto_scan
    minimum = 1 if request.param == 2 else 1 << 40

    def scan(data, _min_parallel, *rest):
        return real.scan(data, minimum, *rest)

    monkeypatch.setattr(_parse, "_kineto_scan", SimpleNamespace(scan=scan))
    return request.param


@pytest.fixture
def salvage_reads(monkeypatch) -> list[int]:
    """One entry each time a parse left its file to the tolerant reader (the salvage)."""
    tolerant = _parse._read_tolerantly
    reads: list[int] = []
    monkeypatch.setattr(_parse, "_read_tolerantly", lambda *a: reads.append(1) or tolerant(*a))
    return reads


def _same_events(fast, slow) -> bool:
    """Equal tables, ``args_json`` compared as the values it holds: the scanner keeps each
    args object's text as the file wrote it (as it does for an intact file), the salvage
    writes the objects it decoded back out (compact)."""
    def args(table) -> list:
        return [None if text is None else json.loads(text)
                for text in table.column("args_json").to_pylist()]

    return (fast.drop_columns(["args_json"]).equals(slow.drop_columns(["args_json"]))
            and args(fast) == args(slow))


def _parsed(path: Path, monkeypatch, scanner) -> tuple:
    monkeypatch.setattr(_parse, "_kineto_scan", scanner)
    parsed = _parse.parse(path)
    return parsed.events, parsed.dropped, parsed.warnings, parsed.input_events


@pytest.mark.parametrize("scanner_threads", [1, 2], indirect=True)
def test_a_trace_cut_anywhere_reads_as_the_salvage_reads_it(tmp_path, monkeypatch,
                                                            scanner_threads, salvage_reads):
    data = _trace()
    fast_scanner = _parse._kineto_scan
    for cut in _cuts(data, 14, seed=scanner_threads):
        path = tmp_path / f"cut-{cut}.pt.trace.json"
        path.write_bytes(data[:cut])
        fast = _parsed(path, monkeypatch, fast_scanner)
        assert not salvage_reads, f"cut at {cut}: the C scanner left it to the salvage"
        slow = _parsed(path, monkeypatch, None)
        assert fast[1:] == slow[1:], f"cut at {cut}"
        assert _same_events(fast[0], slow[0]), f"cut at {cut}"
        assert fast[1] == {"truncated": 1} and "input is truncated" in fast[2][0]
        salvage_reads.clear()


@pytest.mark.parametrize("scanner_threads", [1, 2], indirect=True)
@pytest.mark.parametrize("damage,salvage_reads_on", [
    (b"{@@@@", False),  # an element that is no JSON: the salvage stops there, and so do we
    (b"7, {", True),    # a number where an event should be: the salvage reads on past it
], ids=["bad-element", "number-element"])
def test_damage_inside_the_events_array(tmp_path, monkeypatch, scanner_threads, damage,
                                        salvage_reads_on, salvage_reads):
    """Damage in the middle, events after it. Where the salvage stops at the damage, the
    scanner's rows before it are its answer; where the salvage reads on (a complete element
    the scanner does not take), the file is left to it."""
    data = bytearray(_trace())
    at = data.index(b"{", data.index(b"},\n", len(data) * 3 // 4) + 1)
    data[at:at + (5 if damage.startswith(b"{@") else 1)] = damage
    path = tmp_path / "damaged.pt.trace.json"
    path.write_bytes(bytes(data))
    fast_scanner = _parse._kineto_scan
    fast = _parsed(path, monkeypatch, fast_scanner)
    assert salvage_reads == ([1] if salvage_reads_on else [])
    slow = _parsed(path, monkeypatch, None)
    assert fast[1:] == slow[1:] and _same_events(fast[0], slow[0])
    assert ("truncated" in fast[1]) is not salvage_reads_on


def test_a_document_cut_after_its_events_array_keeps_every_event(tmp_path, monkeypatch):
    """Cut after the events array's ``]``: every event is there, and nothing is said to be
    missing (the salvage's reading), whichever path reads it."""
    data = _trace()
    cut = data[:data.rindex(b"]") + 1]
    path = tmp_path / "cut-after-array.pt.trace.json"
    path.write_bytes(cut)
    fast = _parsed(path, monkeypatch, _parse._kineto_scan)
    slow = _parsed(path, monkeypatch, None)
    assert fast[1:] == slow[1:] and _same_events(fast[0], slow[0])
    assert fast[0].num_rows == fast[3] and not fast[1]


@pytest.mark.parametrize("follow", [True, False], ids=["inflated-beside-the-scan", "inflated-first"])
@pytest.mark.parametrize("what_was_cut", ["the-gzip-stream", "the-json-then-gzipped"])
def test_a_gzip_trace_cut_short_reads_as_the_salvage_reads_it(tmp_path, monkeypatch, follow,
                                                              what_was_cut, salvage_reads):
    """A .json.gz cut short, or a trace cut short and then gzipped whole: the scan that
    followed the inflating thread fails, and what inflates is read once and scanned again up
    to the damage."""
    monkeypatch.setattr(_parse, "FOLLOW_FROM_BYTES", 0 if follow else 1 << 40)
    data = _trace()
    path = tmp_path / "cut.pt.trace.json.gz"
    if what_was_cut == "the-gzip-stream":
        packed = gzip.compress(data, compresslevel=1)
        path.write_bytes(packed[:len(packed) * 2 // 3])
    else:
        path.write_bytes(gzip.compress(data[:len(data) * 2 // 3], compresslevel=1))
    fast_scanner = _parse._kineto_scan
    fast = _parsed(path, monkeypatch, fast_scanner)
    assert not salvage_reads
    slow = _parsed(path, monkeypatch, None)
    assert fast[1:] == slow[1:] and _same_events(fast[0], slow[0])
    assert fast[2] == [*(["gzip stream is truncated; reading what inflates"]
                         if what_was_cut == "the-gzip-stream" else []),
                       f"input is truncated; kept the {fast[0].num_rows} complete events "
                       "before the damage"]


def _small_trace(bare: bool = False, begin_end: bool = False) -> bytes:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i,
               "dur": 5, "args": {"External id": i}} for i in range(6)]
    if begin_end:
        events[2:4] = [{"ph": "B", "name": "span", "pid": 1, "tid": 1, "ts": 20},
                       {"ph": "E", "name": "span", "pid": 1, "tid": 1, "ts": 30}]
    if bare:
        return json.dumps(events).encode()
    return json.dumps({"distributedInfo": {"rank": 3}, "traceEvents": events,
                       "deviceProperties": [{"id": 0}]}).encode()


@pytest.mark.parametrize("shape,cut", [
    ("object", lambda d: d.index(b'"traceEvents"') + 5),   # inside the key: no events array
    ("object", lambda d: d.index(b"[") + 1),                # just after the array opens
    ("object", lambda d: d.index(b'"op3"') + 2),            # inside an event's name
    ("object", lambda d: d.index(b'"External id": 4') + 15),  # inside a number in args
    ("object", lambda d: d.index(b'"deviceProperties"') + 4),  # in a value after the array
    ("bare", lambda d: d.index(b'"op4"')),                  # the old layout, a bare array
    ("begin_end", lambda d: d.index(b'"op5"')),             # B/E pairs: the tolerant path
], ids=["in-the-key", "after-the-bracket", "in-a-name", "in-a-number", "after-the-array",
        "bare-array", "begin-end-pairs"])
def test_small_traces_cut_at_the_awkward_places(tmp_path, monkeypatch, shape, cut):
    """Whatever the cut, the parse with the C scanner says what the pure-Python path says:
    the same rows, dropped counts and warnings, or the same one-line error."""
    from traceview.errors import UnreadableTraceError

    data = _small_trace(bare=shape == "bare", begin_end=shape == "begin_end")
    path = tmp_path / "cut.pt.trace.json"
    path.write_bytes(data[:cut(data)])

    def outcome(scanner):
        try:
            return _parsed(path, monkeypatch, scanner)
        except UnreadableTraceError as exc:
            return str(exc)

    fast, slow = outcome(_parse._kineto_scan), outcome(None)
    if isinstance(slow, str):
        assert fast == slow
    else:
        assert fast[1:] == slow[1:] and _same_events(fast[0], slow[0])
