"""Kineto parser on hand-built traces whose every number can be checked by eye."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pyarrow as pa
from pathlib import Path

import pytest

from tests.helpers import write_trace
from traceview.errors import UnreadableTraceError
from traceview.parsers.kineto import _parse as kineto


def _frame(parsed) -> pl.DataFrame:
    return pl.from_arrow(parsed.events).with_columns(pl.col(pl.Categorical).cast(pl.String))


def test_times_are_exact_nanoseconds_from_decimal_text(tmp_path):
    # 1712195495406752.8 us cannot be represented by a float64 to the ns (ulp is 0.25 us);
    # the parser must read the decimal text: 1712195495406752800 ns exactly.
    path = write_trace(tmp_path / "rank-0.json", text=(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
        '"ts": 1712195495406752.8, "dur": 0.001},'
        '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, '
        '"ts": 10.0005, "dur": 3}]}'))
    df = _frame(kineto.parse(path))
    assert df["ts_ns"].to_list() == [1712195495406752800, 10000]  # 10.0005 us: ties to even
    assert df["dur_ns"].to_list() == [1, 3000]


def test_base_time_is_added(tmp_path):
    path = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 4458676522690.655,
         "dur": 41.407, "args": {"device": 0, "stream": 7, "correlation": 5}}],
        baseTimeNanoseconds=1711964646000000000)
    row = _frame(kineto.parse(path)).row(0, named=True)
    assert row["ts_ns"] == 1711964646000000000 + 4458676522690655
    assert row["dur_ns"] == 41407
    assert (row["kind"], row["device"], row["stream"], row["correlation"]) == ("kernel", 0, 7, 5)


def test_kinds_flows_and_metadata(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": 2, "ts": 2, "dur": 1},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 1},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
         "tid": 7, "ts": 4, "dur": 1, "args": {"bytes": 4096, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 5,
         "dur": 1, "args": {"bytes": 64}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
         "ts": 6, "dur": 1, "args": {"correlation": 9}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 1, "tid": 2, "ts": 6},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 0, "tid": 7, "ts": 7,
         "bp": "e"},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
         "tid": 2, "ts": 8, "args": {"Bytes": 512, "Total Allocated": 1024,
                                     "Total Reserved": 2048}},
        {"ph": "C", "name": "counter", "pid": 1, "tid": 2, "ts": 9, "args": {"v": 1}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 0, "dur": 10},
    ]
    parsed = kineto.parse(write_trace(tmp_path / "t.json", events))
    df = _frame(parsed)
    assert df["kind"].to_list() == ["cpu_op", "cpu_op", "kernel", "memcpy", "memset",
                                    "cuda_runtime", "flow", "flow", "memory", "counter",
                                    "metadata", "trace_span"]
    assert df.filter(pl.col("kind") == "memcpy")["copy_kind"].item() == "HtoD"
    assert df.filter(pl.col("kind") == "memcpy")["bytes"].item() == 4096
    assert df.filter(pl.col("kind") == "memset")["bytes"].item() == 64
    flows = df.filter(pl.col("kind") == "flow")
    assert flows["flow_id"].to_list() == [9, 9] and flows["flow_phase"].to_list() == ["s", "f"]
    mem = df.filter(pl.col("kind") == "memory").row(0, named=True)
    assert (mem["mem_bytes"], mem["mem_total_allocated"], mem["mem_total_reserved"]) == (
        512, 1024, 2048)
    # Metadata has no ts: pinned to the file's first time (0 here), never dropped.
    assert df.filter(pl.col("kind") == "metadata")["ts_ns"].item() == 0
    span = df.filter(pl.col("kind") == "trace_span").row(0, named=True)
    assert span["pid"] is None and span["pid_label"] == "Spans"
    assert span["tid_label"] == "PyTorch Profiler"
    assert parsed.input_events == 12 and df.height == 12 and parsed.dropped == {}


def test_args_are_kept_losslessly(tmp_path):
    args = {"External id": 5, "weird key": [1, {"x": "y"}], "Input Dims": [[2, 3]]}
    path = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": args}])
    row = _frame(kineto.parse(path)).row(0, named=True)
    assert json.loads(row["args_json"]) == args
    assert row["external_id"] == 5


def test_collective_columns_and_bytes(tmp_path):
    args = {"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
            "Group size": 2, "dtype": "Float", "Process Group Name": "0",
            "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
            "Seq": 17}
    path = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
         "ts": 1, "dur": 1, "args": args},
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 40, "ts": 2, "dur": 1,
         "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
         "args": {**args, "dtype": "BFloat16", "stream": 40, "device": 0}},
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 40, "ts": 3, "dur": 1,
         "name": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 1,
         "ts": 4, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::reduce", "pid": 1, "tid": 1, "ts": 5,
         "dur": 1},
    ])
    df = _frame(kineto.parse(path))
    assert df["collective"].to_list() == ["all_reduce", "all_reduce", "all_gather",
                                          "all_reduce", None]
    # 1000 elements x 4 bytes (Float); the kernel says BFloat16: 1000 x 2.
    assert df["bytes"].to_list()[:2] == [4000, 2000]
    first = df.row(0, named=True)
    assert (first["pg_name"], first["pg_desc"], first["pg_ranks"], first["seq"],
            first["group_size"], first["in_nelems"]) == ("0", "default_pg", "[0, 1]", 17, 2, 1000)


def test_bare_array_layout(tmp_path):
    path = write_trace(tmp_path / "worker0.pt.trace.json", text=json.dumps([
        {"ph": "X", "cat": "Operator", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1}]))
    parsed = kineto.parse(path)
    assert parsed.events.num_rows == 2
    assert parsed.ranks[0].rank == 0 and parsed.ranks[0].rank_from == "file name"


def test_begin_end_pairs_become_spans(tmp_path):
    path = write_trace(tmp_path / "t.json", [
        {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 12},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 15},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 20},
        {"ph": "E", "pid": 1, "tid": 9, "ts": 21},
        {"ph": "B", "name": "never closed", "pid": 1, "tid": 1, "ts": 30},
    ])
    parsed = kineto.parse(path)
    df = _frame(parsed).sort("ts_ns")
    assert df.select("name", "ts_ns", "dur_ns").rows() == [("outer", 10000, 10000),
                                                           ("inner", 12000, 3000)]
    assert parsed.dropped == {"end_merged_into_begin": 2, "unmatched_end": 1,
                              "unmatched_begin": 1}
    assert parsed.input_events == df.height + sum(parsed.dropped.values()) == 6


def test_missing_dur_unsorted_and_missing_ts(tmp_path):
    path = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 1, "ts": 50, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "nodur", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "X", "cat": "cpu_op", "name": "nots", "pid": 1, "tid": 1, "dur": 5},
    ])
    parsed = kineto.parse(path)
    df = _frame(parsed)
    assert df["name"].to_list() == ["late", "nodur"]
    assert df["dur_ns"].to_list() == [1000, None]
    assert parsed.dropped == {"missing_ts": 1}
    assert any("without a duration" in w for w in parsed.warnings)


def test_nan_invalid_utf8_and_huge_integers(tmp_path):
    text = ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\xff\xfe", "pid": 0, '
            '"tid": 7, "ts": 1, "dur": NaN, "args": {"correlation": 99999999999999999999999, '
            '"stream": 7, "note": "NaN stays text"}}, {"ph": "X", "cat": "cpu_op", '
            '"name": "NaN", "pid": 1, "tid": 1, "ts": 2, "dur": Infinity}]}')
    path = tmp_path / "t.json"
    path.write_bytes(text.encode("latin-1"))
    parsed = kineto.parse(path)
    df = _frame(parsed)
    assert df.height == 2 and parsed.dropped == {}
    assert df["dur_ns"].to_list() == [None, None]
    assert df["correlation"].to_list() == [None, None]  # beyond int64: null, kept in args_json
    assert "99999999999999999999999" in df["args_json"][0]
    assert df["name"].to_list()[1] == "NaN"  # a string "NaN" is not a token
    assert "NaN stays text" in df["args_json"][0]
    assert any("UTF-8" in w for w in parsed.warnings)
    assert any("NaN/Infinity" in w for w in parsed.warnings)


def test_truncated_write_keeps_complete_events(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i,
               "dur": 1} for i in range(5)]
    full = json.dumps({"traceEvents": events})
    cut = full[: full.index('"op3"') + 3]  # in the middle of the 4th event
    parsed = kineto.parse(write_trace(tmp_path / "t.json.gz", text=cut))
    assert parsed.events.num_rows == 3
    assert parsed.dropped == {"truncated": 1}
    assert parsed.input_events == 4
    assert any("truncated" in w for w in parsed.warnings)


def test_truncated_gzip_stream_is_recovered(tmp_path):
    import gzip

    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i,
               "dur": 1, "args": {"pad": "x" * 200}} for i in range(200)]
    data = gzip.compress(json.dumps({"traceEvents": events}).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    parsed = kineto.parse(path)
    assert 0 < parsed.events.num_rows < 200
    assert any("gzip" in w for w in parsed.warnings)


@pytest.mark.parametrize("content,problem", [
    (b"", "empty file"),
    (b"\x1f\x8b\x08\x00garbagegarbage", "corrupt gzip"),
    (b'{"hello": "world"}', "no traceEvents"),
    (b"hello world", "not JSON"),
    (b'{"schema": "1.0.1", "nodes": []}', "Execution Trace"),
    (b"[[1, 2], [3, 4]]", "without trace events"),
])
def test_bad_input_is_one_clear_error(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(UnreadableTraceError) as info:
        kineto.parse(path)
    message = str(info.value)
    assert str(path) in message and problem in message and "\n" not in message


def test_rank_sources(tmp_path):
    with_info = write_trace(tmp_path / "rank-5.json", [], distributedInfo={"rank": 3,
                                                                           "world_size": 8})
    assert kineto.parse(with_info).ranks[0].rank == 3
    by_name = write_trace(tmp_path / "job_rank_12_trace.json", [],
                          distributedInfo={"backend": "nccl"})
    info = kineto.parse(by_name)
    assert info.ranks[0].rank == 12 and info.ranks[0].rank_from == "file name"
    assert any("no rank" in w for w in info.warnings)
    nothing = write_trace(tmp_path / "trace.json", [])
    assert kineto.parse(nothing).ranks[0].rank is None


CORPUS_SAMPLES = [
    "hta-tests-data/tests/data/nccl_parser_config/nccl_data.json.gz",
    "hta-tests-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta-tests-data/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
    "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "hta-tests-data/tests/data/trace_file_list/inference_rank_1.json.gz",
]


@pytest.mark.parametrize("relative", CORPUS_SAMPLES)
def test_fast_and_tolerant_paths_store_identical_tables(relative, corpus, monkeypatch):
    """The C scanner is only an optimisation: both paths must give the same table."""
    path = corpus / relative
    fast = kineto.parse(path)
    monkeypatch.setattr(kineto, "_kineto_scan", None)
    slow = kineto.parse(path)
    assert fast.input_events == slow.input_events and fast.dropped == slow.dropped
    assert fast.events.equals(slow.events), relative


@pytest.mark.parametrize("batch_bytes", [1, 700, 4 << 20])
def test_the_pure_path_in_batches_stores_what_the_scanner_stores(batch_bytes, monkeypatch):
    """The pure-Python path decodes a batch of about ``_stream.STREAM_BYTES`` at a time: a
    batch of one event or a few split every array many times (and the rare columns into
    (row, value) pairs batch by batch) and must still give the C scanner's table; so must
    the whole-file path it falls back to."""
    from traceview.parsers.kineto import _stream, _tolerant

    path = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r"
    path = sorted(path.glob("*.json.gz"))[0]
    fast = kineto.parse(path)
    monkeypatch.setattr(kineto, "_kineto_scan", None)
    monkeypatch.setattr(_stream, "STREAM_BYTES", batch_bytes)
    streamed = kineto.parse(path)
    monkeypatch.setattr(_tolerant, "read_streamed", lambda data, release: None)
    whole = kineto.parse(path)
    for slow in (streamed, whole):
        assert slow.input_events == fast.input_events and slow.dropped == fast.dropped
        assert slow.events.equals(fast.events)


def _tricky_events() -> list[dict]:
    """Events whose text looks like an event boundary: a name holding ``}, {``, args with a
    list of objects, a header after the events array with a bracket in a string."""
    return [{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 10 + i, "dur": 1,
             "name": f'op{i} }}, {{"ph": "X"}}, ]',
             "args": {"External id": i, "shapes": [{"a": [1, 2]}, {"b": {"c": "},"}}],
                      **({"Sequence number": i} if i % 9 == 0 else {})}}
            for i in range(40)]


def _scanned_and_streamed(path: Path, monkeypatch, batch_bytes: int):
    """``path`` parsed by the C scanner, then by the pure path's stream in batches of about
    ``batch_bytes`` (failing if it gave up and left the file to the whole-file reader)."""
    from traceview.parsers.kineto import _stream, _tolerant

    fast = kineto.parse(path)
    monkeypatch.setattr(kineto, "_kineto_scan", None)
    monkeypatch.setattr(_stream, "STREAM_BYTES", batch_bytes)
    monkeypatch.setattr(_stream, "_CUT_TRIES", 64)

    def whole_file(*_args):
        raise AssertionError("the stream gave up on well-formed input")

    monkeypatch.setattr(_tolerant, "_decode", whole_file)
    return fast, kineto.parse(path)


@pytest.mark.parametrize("gzipped", [False, True])
@pytest.mark.parametrize("batch_bytes", [1, 300])
def test_the_stream_cuts_only_between_events(tmp_path, monkeypatch, gzipped, batch_bytes):
    """The stream cuts the events array where ``}`` and ``,`` meet; a cut inside a name or
    inside nested args must not decode, so the batch grows to the next candidate and the
    table is the scanner's, from a memory map (pages handed back) or an inflated gzip."""
    path = write_trace(tmp_path / f"trace.json{'.gz' if gzipped else ''}", _tricky_events(),
                       traceName="x]", distributedInfo={"rank": 3})
    fast, slow = _scanned_and_streamed(path, monkeypatch, batch_bytes)
    assert slow.events.equals(fast.events) and slow.ranks == fast.ranks
    assert slow.events.column("name").to_pylist()[3] == 'op3 }, {"ph": "X"}, ]'


@pytest.mark.parametrize("batch_bytes", [1, 300, 4 << 20])
def test_the_stream_finds_the_end_of_the_events_array(tmp_path, monkeypatch, batch_bytes):
    """Newer PyTorch writes ``deviceProperties`` after the events, MTIA traces log arrays:
    the tail holds brackets and ``}, {`` too. The array ends where a batch decodes to a
    complete list with more after it; the header values after it are read."""
    events = json.dumps(_tricky_events())
    text = ('{"schemaVersion": 1, "distributedInfo": {"rank": 2, "world_size": 4}, '
            f'"traceEvents": {events}, "deviceProperties": [{{"id": 0, "name": "H100"}}, '
            '{"id": 1, "name": "H100"}], "WARNING": ["a }, { b ] c"], "traceName": "x]", '
            '"baseTimeNanoseconds": 1000000000}')
    path = write_trace(tmp_path / "trace.json", text=text)
    fast, slow = _scanned_and_streamed(path, monkeypatch, batch_bytes)
    assert slow.events.equals(fast.events) and slow.ranks == fast.ranks
    assert slow.ranks[0].rank == 2 and slow.events.column("ts_ns")[0].as_py() == 1_000_010_000


def test_the_pure_path_never_imports_pandas():
    """``pa.array`` on a Python list imports pandas (0.2 s, ~60 MB); the pure path builds its
    columns without it."""
    import os
    import subprocess
    import sys

    path = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "data" /
                   "gloo_ddp_2r").glob("*.json.gz"))[0]
    code = ("import sys; from traceview.parsers.kineto import parse; "
            f"parse({str(path)!r}); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TRACEVIEW_PURE_PYTHON": "1"},
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_stream_leaves_damage_to_the_whole_file_path(tmp_path, monkeypatch):
    """A file cut short decodes until the damage; the stream then gives up and the whole-file
    path keeps every complete event and says the input is truncated."""
    from traceview.parsers.kineto import _stream

    text = json.dumps({"traceEvents": _tricky_events()})
    path = write_trace(tmp_path / "trace.json", text=text[: len(text) * 2 // 3])
    monkeypatch.setattr(kineto, "_kineto_scan", None)
    monkeypatch.setattr(_stream, "STREAM_BYTES", 300)
    parsed = kineto.parse(path)
    assert 0 < parsed.events.num_rows < 40 and parsed.dropped.get("truncated") == 1
    assert any("truncated" in w for w in parsed.warnings)


def test_fast_path_is_built():
    # CI machines have a compiler: the C fast path must be there, not silently missing.
    assert kineto._kineto_scan is not None


@pytest.mark.parametrize("relative", CORPUS_SAMPLES)
def test_two_thread_scan_equals_one_thread(relative, corpus):
    """The scanner splits large arrays between two threads; the split must change nothing."""
    from traceview.parsers.kineto._input import read_bytes

    data = read_bytes(corpus / relative, [])
    rows_one, one = kineto._kineto_scan.scan(data, 1 << 62)
    rows_two, two = kineto._kineto_scan.scan(data, 1)  # force the split on any size
    assert one["threads"] == 1 and two["threads"] == 2
    assert rows_one == rows_two and one["header"] == two["header"]
    _assert_same_columns(rows_one, one, rows_two, two)
    assert two["args_json"][0] == "chunks"  # the second thread's text is not copied


def _assert_same_columns(rows_one: int, one: dict, rows_two: int, two: dict) -> None:
    """Two scans' columns hold the same values: a column may be dense in one scan and (row,
    value) pairs in the other, and two chunks (one per thread) in a split scan."""
    for name, typ in kineto._RAW_COLUMNS.items():
        a = kineto.RawColumns(rows_one, {name: kineto._scanned_column(one[name], typ, rows_one)},
                              {name: typ}).full(name)
        b = kineto.RawColumns(rows_two, {name: kineto._scanned_column(two[name], typ, rows_two)},
                              {name: typ}).full(name)
        assert _whole(a).equals(_whole(b)), name


def _whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def test_sparse_and_dense_integer_columns(tmp_path):
    """Integer columns with values on few rows come out of the scanner as (row, value) pairs,
    dense ones as arrays; both read back to the same values, split or not."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {"External id": i, **({"Seq": i * 10} if i % 20 == 3 else {})}}
              for i in range(100)]
    data = json.dumps({"traceEvents": events}, indent=1).encode()
    for split in (1 << 62, 1):
        rows, columns = kineto._kineto_scan.scan(data, split)
        seq = kineto._scanned_column(columns["seq"], pa.int64(), rows)
        ext = kineto._scanned_column(columns["external_id"], pa.int64(), rows)
        assert isinstance(seq, kineto.Sparse) and isinstance(ext, pa.Array), split
        assert seq.rows.tolist() == [3, 23, 43, 63, 83]
        assert seq.dense(0, 100).to_pylist() == [i * 10 if i % 20 == 3 else None
                                                 for i in range(100)]
        assert ext.to_pylist() == list(range(100))


def test_two_thread_scan_is_used_on_kineto_layouts(tmp_path):
    pretty = ",\n".join(json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1,
                                    "tid": 1, "ts": i, "dur": 1, "args": {"External id": i}},
                                   indent=2) for i in range(200))
    events = [{"name": f"op{i}", "ph": "X", "ts": i, "dur": 1, "args": {"External id": i}}
              for i in range(200)]
    compact = json.dumps({"traceEvents": events}, separators=(",", ":"))  # as orjson writes
    for text in ('{"traceEvents": [\n' + pretty + "\n]}",
                 "[" + ",\n".join(f'{{"ph":"X","name":"a","ts":{i},"dur":1}}'
                                  for i in range(200)) + "]",
                 compact, compact.replace(",{", ", {")):
        rows, columns = kineto._kineto_scan.scan(text.encode(), 1)
        assert rows == 200 and columns["threads"] == 2


def test_a_split_point_inside_an_args_object_changes_nothing():
    """On one line, a '},{"name":' may open an object inside args (in a string its quotes are
    escaped, so it never looks like an event there): the split point is only a hint, proven by
    the first half landing on it, so a false one leaves the scan on one thread with the same
    columns."""
    events = [{"ph": "X", "name": '},{"name":"x"' if i >= 100 else f"op{i}", "ts": i, "dur": 1,
               "args": {"nested": [{"a": 1}, {"name": 2}] if i >= 100 else [], "Seq": i}}
              for i in range(200)]
    data = json.dumps(events, separators=(",", ":")).encode()
    middle = len(data) // 2
    assert data.find(b'},{"name":2', middle) < data.find(b'},{"ph"', middle)  # a false hint first
    rows_one, one = kineto._kineto_scan.scan(data, 1 << 62)
    rows_two, two = kineto._kineto_scan.scan(data, 1)
    assert rows_one == rows_two == 200 and two["threads"] == 1  # the hint was refused
    _assert_same_columns(rows_one, one, rows_two, two)


def test_columns_that_change_density_and_interned_names_survive_the_split():
    """A column dense in the first half of the file and sparse in the second (it switches to
    dense storage on one scanner thread only), and names interned per thread then merged,
    read back the same with one thread and with two."""
    n = 40_000
    events = [{"ph": "X", "cat": "cpu_op", "name": ["a\"b", "a\\u0022b", "c", f"u{i}"][i % 4],
               "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {"Seq": i} if i < n // 2 or i % 1000 == 0 else {}} for i in range(n)]
    text = "[" + ",\n".join(json.dumps(e).replace("a\\\\u0022b", "a\\u0022b") for e in events)
    data = (text + "]").encode()
    for split in (1 << 62, 1):
        rows, columns = kineto._kineto_scan.scan(data, split)
        raw = {name: kineto._scanned_column(columns[name], typ, rows)
               for name, typ in kineto._RAW_COLUMNS.items()}
        seq = kineto.RawColumns(rows, raw, kineto._RAW_COLUMNS).full("seq").to_pylist()
        assert seq == [i if i < n // 2 or i % 1000 == 0 else None for i in range(n)], split
        names = raw["name"]
        assert names.to_pylist() == [['a"b', 'a"b', "c", f"u{i}"][i % 4] for i in range(n)]
        assert len(names.dictionary) == 2 + n // 4  # 'a"b' once, however it was escaped


def test_columns_held_by_one_scanner_thread_only_read_back_exactly(tmp_path, monkeypatch):
    """Text and dense integers of a split scan come as two chunks, one per thread, including
    when only one thread saw values (the other chunk is nulls) and when one thread held the
    values as (row, value) pairs."""
    n = 40_000
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {**({"External id": i} if i < n // 2 else {"correlation": i}),
                        **({"stream": i} if i >= n // 2 or i % 1000 == 0 else {})}}
              for i in range(n)]
    data = ("[" + ",\n".join(json.dumps(e) for e in events) + "]").encode()
    rows, columns = kineto._kineto_scan.scan(data, 1)
    assert columns["threads"] == 2
    assert {name: columns[name][0] for name in ("external_id", "correlation", "stream")} == \
        {"external_id": "int", "correlation": "chunks", "stream": "chunks"}
    raw = {name: kineto._scanned_column(columns[name], typ, rows)
           for name, typ in kineto._RAW_COLUMNS.items()}
    full = kineto.RawColumns(rows, raw, kineto._RAW_COLUMNS).full
    half = n // 2
    assert full("external_id").to_pylist() == [i if i < half else None for i in range(n)]
    assert full("correlation").to_pylist() == [None if i < half else i for i in range(n)]
    assert full("stream").to_pylist() == [i if i >= half or i % 1000 == 0 else None
                                          for i in range(n)]
    path = tmp_path / "halves.json"
    path.write_bytes(data)
    whole = kineto.parse(path)  # 40k events: scanned by one thread
    scan = kineto._kineto_scan.scan
    monkeypatch.setattr(kineto._kineto_scan, "scan", lambda data, _, *rest: scan(data, 1, *rest))
    assert kineto.parse(path).events.equals(whole.events)  # by two


def _buffers(column: tuple) -> list[tuple]:
    """The (address, length, owner) triples of a scanned column, through its chunks."""
    kind, *rest = column
    if kind != "chunks":
        return rest
    return [block for half in rest[1:] if half is not None for block in _buffers(half)]


def _events_json(n: int, last: str = "1") -> bytes:
    rows = [f'{{"ph":"X","cat":"cpu_op","name":"op{i % 50}","pid":1,"tid":1,"ts":{i},'
            f'"dur":{last if i == n - 1 else 1},"args":{{"External id":{i}}}}}' for i in range(n)]
    return ('{"distributedInfo": {"rank": 5}, "traceEvents": [\n' + ",\n".join(rows)
            + '\n], "baseTimeNanoseconds": 1000}').encode()


def test_large_columns_grow_in_their_own_mappings_and_read_back_exactly(tmp_path, monkeypatch):
    """Column buffers from 64 KiB up are anonymous mappings that grow by mremap, and are
    handed to Arrow as such. 250k events take args_json past 4 MiB and the int64 columns
    past 1 MiB, in both halves of a split scan (the second appended to the first) and whole."""
    n = 250_000
    data = _events_json(n)
    owners = set()
    for split in (1 << 62, 1):
        rows, columns = kineto._kineto_scan.scan(data, split)
        assert rows == n and columns["threads"] == (1 if split > 1 else 2)
        owners |= {repr(block[2]).split('"')[1] for name in ("args_json", "ts_ns", "external_id")
                   for block in _buffers(columns[name])}
        raw = {name: kineto._scanned_column(columns[name], typ, rows)
               for name, typ in kineto._RAW_COLUMNS.items()}
        full = kineto.RawColumns(rows, raw, kineto._RAW_COLUMNS).full
        assert full("external_id").to_pylist() == list(range(n)), split
        assert full("ts_ns").to_pylist() == [i * 1000 for i in range(n)], split
        args = full("args_json")
        assert args[0].as_py() == '{"External id":0}'
        assert args[n - 1].as_py() == f'{{"External id":{n - 1}}}', split
    assert owners == {"traceview.map", "traceview.block"}  # bitmaps stay malloc'd
    path = tmp_path / "large.json"
    path.write_bytes(data)
    fast = kineto.parse(path)
    monkeypatch.setattr(kineto, "_kineto_scan", None)
    assert fast.events.equals(kineto.parse(path).events)


def test_gzip_is_inflated_into_a_releasable_map_and_parses_like_plain_json(tmp_path):
    from traceview.parsers.kineto._input import open_input

    text = _events_json(2000)
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    with open_input(packed, []) as given:
        assert given.releasable and bytes(given.data[:20]) == text[:20]
    a, b = kineto.parse(plain), kineto.parse(packed)
    assert a.events.equals(b.events) and b.ranks[0].rank == 5 and b.ranks[0].clock_base_ns == 1000


def test_gzip_with_two_members_is_read_whole(tmp_path):
    from traceview.parsers.kineto._input import open_input

    text = _events_json(500)
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    with open_input(path, []) as given:
        assert not given.releasable  # the trailer records only the last member's size
    assert kineto.parse(path).input_events == 500


def test_a_scan_that_fails_after_releasing_pages_falls_back_to_fresh_bytes(tmp_path):
    """The scanner hands pages back as it goes (16 MiB at a time); when it then meets
    something only the tolerant path reads (a NaN at the very end), that path must not see
    the released (zeroed) memory of an inflated gzip."""
    n = 300_000  # ~30 MB of JSON
    text = _events_json(n, last="NaN")
    path = tmp_path / "late-nan.json.gz"
    path.write_bytes(gzip.compress(text, compresslevel=1))
    parsed = kineto.parse(path)
    assert parsed.input_events == n and parsed.ranks[0].rank == 5
    ext = parsed.events.column("external_id").to_pylist()
    assert ext == list(range(n)) and any("NaN" in w for w in parsed.warnings)


def test_invalid_utf8_inside_args_is_replaced_not_stored(tmp_path):
    """A flipped byte inside an ``args`` key (found by tests/test_fuzz.py): the scanner
    declines the file, and the tolerant reader, which keeps ``args`` raw, must not store the
    invalid bytes as text (Parquet refuses them when the column is read back)."""
    path = tmp_path / "rank-0.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
                     b'"pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"Record func\x8bion id"'
                     b': 0, "External id": 7}}]}')
    parsed = kineto.parse(path)
    for name in parsed.events.column_names:
        column = parsed.events.column(name)
        if pa.types.is_large_string(column.type) or pa.types.is_string(column.type):
            column.validate(full=True)
    assert "invalid UTF-8 replaced with U+FFFD" in parsed.warnings
    assert "\ufffd" in parsed.events.column("args_json")[0].as_py()
