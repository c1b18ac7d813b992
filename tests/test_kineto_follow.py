"""The scanner following a gzip file as it inflates reads exactly what a scan of the whole
inflated bytes reads, wherever the producer's progress cuts the input."""

from __future__ import annotations

import gzip
import json
import mmap
import threading
import time
from pathlib import Path

import pytest

from traceview.parsers.kineto import _parse as kineto
from traceview.parsers.kineto._input import _InflatingMap, open_input

# The C scanner is optional at install (no compiler: the pure-Python path reads everything).
_kineto_scan = pytest.importorskip("traceview.parsers.kineto._scan",
                                   reason="the C scanner is not built here")

ROOT = Path(__file__).resolve().parents[1]


WAITS: list[int] = []  # how often the last followed scans waited for bytes


def _columns(data, *, progress=None, step=1 << 18, min_parallel=1 << 40) -> tuple:
    """Rows, every column as Python values, the header and the B/E count of one scan."""
    rows, columns = _kineto_scan.scan(data, min_parallel, progress is not None, progress, step)
    WAITS.append(columns["follow_waits"])
    out = {}
    for name, typ in kineto._RAW_COLUMNS.items():
        column = kineto._scanned_column(columns[name], typ, rows)
        if column is None:
            out[name] = None
        elif isinstance(column, kineto.Sparse):
            out[name] = (column.rows.tolist(), column.values.tolist())
        else:
            out[name] = column.to_pylist()
    return rows, out, columns["header"], columns["begin_end_events"]


def _followed(path: Path, *, chunk: int, step: int, min_parallel: int = 1 << 40) -> tuple:
    inflating = _InflatingMap.start(path, chunk=chunk)
    assert inflating is not None
    try:
        return _columns(inflating.map, progress=inflating.progress, step=step,
                        min_parallel=min_parallel)
    finally:
        inflating.stop()
        inflating.map.close()


def _events_json(n: int) -> bytes:
    rows = [json.dumps({"ph": "X", "cat": "kernel" if i % 3 else "cpu_op",
                        "name": f"op\\u00e9{i % 7}", "pid": i % 2, "tid": 7,
                        "ts": 1000.125 + i, "dur": 0.5,
                        "args": {"External id": i, "stream": 7, "device": 0,
                                 "note": "x" * (i % 50)}}) for i in range(n)]
    return ('{"distributedInfo": {"rank": 5}, "deviceProperties": [{"id": 0}],\n'
            '"traceEvents": [\n' + ",\n".join(rows) + '\n], "baseTimeNanoseconds": 1000}\n'
            ).encode()


@pytest.mark.parametrize("chunk,step", [(1, 1), (7, 1), (4099, 1), (65536, 5000),
                                        (1 << 20, 1 << 18)])
def test_following_reads_what_the_whole_bytes_read(tmp_path, chunk, step):
    text = _events_json(3000 if chunk > 1 else 300)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text))
    assert _followed(path, chunk=chunk, step=step) == _columns(text)


@pytest.mark.parametrize("chunk", [1, 7, 97, 4099])
def test_a_scan_cut_every_few_bytes_waits_resumes_and_reads_the_same(chunk):
    """A producer that publishes ``chunk`` bytes and pauses: the scanner runs into the known
    end again and again, and still reads exactly what the whole bytes read. Chunks shorter
    than an event (~190 bytes) cut most events; a wait then lasts at least as long as the
    cut part, so the waits are about one or two per event, not one per chunk. (How many
    waits there are at the least depends on how often the scanner thread gets a core while
    the producer runs: on a loaded machine it may catch up only a few times, so only "it
    waited" is asserted from below; the bound above is the point.)"""
    events = 40 if chunk < 10 else 120
    text = _events_json(events)
    assert _trickled(text, chunk=chunk, pause=0.0002, step=1, first_pause=0.05) \
        == _columns(text)
    assert 1 <= WAITS[-2] <= 3 * events + 20


def test_following_then_splitting_the_rest_over_two_threads(tmp_path):
    """Once every byte is in, the rest is scanned on two threads and merged."""
    text = _events_json(40_000)  # ~6 MB
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text, compresslevel=1))
    for chunk, step in [(1 << 16, 1 << 16), (1 << 20, 1 << 20)]:
        assert _followed(path, chunk=chunk, step=step, min_parallel=1 << 20) == _columns(text)


def test_following_a_bare_array_and_a_header_after_the_events(tmp_path):
    events = [{"ph": "i", "name": f"m{i}", "pid": 1, "tid": 1, "ts": i, "s": "t"}
              for i in range(500)]
    for name, doc in [("bare", events), ("late", {"traceEvents": events, "pad": "y" * 9000,
                                                  "distributedInfo": {"rank": 2}})]:
        text = json.dumps(doc).encode()
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(text))
        assert _followed(path, chunk=113, step=1) == _columns(text), name


@pytest.mark.parametrize("relative", [
    "fixtures/data/gloo_ddp_2r/rank-0.gloo_ddp.pt.trace.json.gz",
])
def test_following_a_real_trace(relative):
    path = ROOT / relative
    text = gzip.decompress(path.read_bytes())
    assert _followed(path, chunk=97, step=1) == _columns(text)
    assert _trickled(text, chunk=4099, pause=0.0002, step=1) == _columns(text)
    # It followed the producer (waited for bytes). How often depends on how the two threads
    # are scheduled, so only "at least once" holds on a loaded machine too.
    assert WAITS[-2] > 0


def test_following_corpus_traces(corpus):
    for relative in ["kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
                     "hta-tests-data/tests/data/amd_trace/"
                     "mi250_minitoy_train_ROCm6_2_kineto.json.gz"]:
        path = corpus / relative
        text = gzip.decompress(path.read_bytes())
        assert _followed(path, chunk=50_000, step=1, min_parallel=1 << 22) == _columns(text)


def test_a_stream_that_stops_short_or_goes_on_fails_the_scan(tmp_path):
    """The producer's verdict decides: a truncated stream, or one with bytes past the size
    the trailer records (two members), never yields a scan; parsing then takes the tolerant
    path, which words what happened."""
    text = _events_json(2000)
    whole = gzip.compress(text)
    short = tmp_path / "short.json.gz"
    short.write_bytes(whole[: len(whole) * 2 // 3] + whole[-8:])  # a trailer that lies
    two = tmp_path / "two.json.gz"
    two.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    for path in (short, two):
        with pytest.raises(ValueError):
            _followed(path, chunk=4096, step=1)
    assert kineto.parse(two).input_events == 2000
    salvaged = kineto.parse(short)
    assert 0 < salvaged.input_events < 2000 and any("gzip" in w for w in salvaged.warnings)


def test_parse_follows_gzip_and_stores_what_plain_json_stores(tmp_path):
    text = _events_json(5000)
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    with open_input(packed, [], follow=True) as given:
        assert given.progress is not None and given.releasable
    with open_input(plain, [], follow=True) as given:  # mapped: scanned in place, no copy
        assert given.progress is None and given.releasable and given.mapped_file
    assert kineto.parse(packed).events.equals(kineto.parse(plain).events)


def _trickled(text: bytes, *, chunk: int, pause: float, step: int,
              first_pause: float = 0.0) -> tuple:
    """A scan following a producer that publishes ``chunk`` bytes every ``pause`` seconds
    (``first_pause`` after the first chunk: time for the scanner to start and catch up)."""
    data, progress = mmap.mmap(-1, len(text)), mmap.mmap(-1, 16)

    def produce() -> None:
        for at in range(0, len(text), chunk):
            data[at:at + chunk] = text[at:at + chunk]
            _kineto_scan.publish(progress, min(len(text), at + chunk), _kineto_scan.PRODUCING)
            time.sleep(first_pause if at == 0 else pause)
        _kineto_scan.publish(progress, len(text), _kineto_scan.DONE)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        return _columns(data, progress=progress, step=step)
    finally:
        producer.join()


def test_a_long_element_or_header_cut_many_times_is_scanned_again_a_few_times():
    """Each wait lasts at least as long as what will be scanned again, so a 3 MB header or
    event arriving 64 KiB at a time is rescanned ~log2(3 MB / 64 KiB) times, not ~45."""
    big = "z" * 3_000_000
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {"huge": big} if i == 5 else {}} for i in range(10)]
    for name, doc in [("event", {"traceEvents": events}),
                      ("header", {"deviceProperties": [{"blob": big}], "traceEvents": events[:5]})]:
        text = json.dumps(doc).encode()
        assert _trickled(text, chunk=1 << 16, pause=0.002, step=4096) == _columns(text), name
        assert 0 < WAITS[-2] < 20, (name, WAITS[-2])
