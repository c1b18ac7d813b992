"""The fixed cost of one small file (docs/performance.md, log 45), checked by hand: what each
shortcut remembers or skips must give what the long way gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import xxhash

from benchmarks.inputs import tiny_events
from tests.helpers import write_trace
from traceview.parsers.kineto import _derived, _rows
from traceview.parsers.kineto import _parse as kineto
from traceview.parsers._buffers import remembered, values_and_validity
from traceview.parsers.kineto._arrow_types import strings
from traceview.parsers.kineto._columns import RawColumns, Sparse, SparseText
from traceview.store import ingest, parquet
from traceview.store.steps import StepsOfRows


def test_tiny_events_keep_metadata_steps_and_collectives_first_in_their_order():
    events = [{"ph": "X", "name": "aten::mm"}, {"ph": "M", "name": "process_name"},
              {"ph": "X", "name": "aten::add"}, {"ph": "X", "name": "ProfilerStep#1"},
              {"ph": "X", "name": "gloo:all_reduce"}, {"ph": "X", "name": "aten::cat"}]
    names = [e["name"] for e in tiny_events(events, 4)]
    assert names == ["aten::mm", "process_name", "ProfilerStep#1", "gloo:all_reduce"]
    assert [e["name"] for e in tiny_events(events, 2)] == ["process_name", "ProfilerStep#1"]


def test_remembered_works_each_new_value_out_once_and_answers_in_order():
    memo: dict[str, int] = {}
    asked: list[list[str]] = []

    def lengths(values: list[str]) -> list[int]:
        asked.append(values)
        return [len(v) for v in values]

    assert remembered(memo, ["ab", "c", "ab"], lengths) == [2, 1, 2]
    assert remembered(memo, ["c", "def"], lengths) == [1, 3]
    assert asked == [["ab", "c"], ["def"]]


def test_text_facts_the_same_whether_remembered_or_not(tmp_path, monkeypatch):
    events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL",
               "pid": 0, "tid": 7, "ts": 1, "dur": 1},
              {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1,
               "ts": 2, "dur": 1, "args": {"dtype": "Float", "Collective name": "broadcast"}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
               "pid": 0, "tid": 7, "ts": 3, "dur": 1}]
    path = write_trace(tmp_path / "t.json", events)
    for memo in ("_NAME_FACTS", "_ARG_COLLECTIVE", "_DTYPE_BYTES"):
        monkeypatch.setattr(_derived, memo, {})  # nothing remembered yet
    first = kineto.parse(path).events
    second = kineto.parse(path).events  # every text remembered now
    assert first.equals(second)
    assert _derived._NAME_FACTS["ncclDevKernel_AllGather_RING_LL"][0] == "all_gather"
    assert _derived._NAME_FACTS["Memcpy HtoD (Pageable -> Device)"][2] == "HtoD"
    assert _derived._DTYPE_BYTES["Float"] == 4


def test_values_and_validity_of_a_slice_reads_only_its_rows():
    array = pa.array([1, None, 3, 4, None, 6, 7, 8, 9, None], pa.int64()).slice(3, 6)
    values, valid = values_and_validity(array)
    assert valid.tolist() == [True, False, True, True, True, True]
    assert values[valid].tolist() == [4, 6, 7, 8, 9]


def test_sparse_columns_from_buffers():
    sparse = Sparse.of(pa.array([None, 5, None, 7], pa.int64()), first_row=10)
    assert sparse.rows.dtype == np.uint32 and sparse.rows.tolist() == [11, 13]
    assert sparse.values.dtype == np.int64 and sparse.values.tolist() == [5, 7]
    text = SparseText.of(pa.DictionaryArray.from_arrays(pa.array([None, 1, 0, None],
                                                                 pa.int32()),
                                                        strings(["a", "b"])))
    assert text.rows.tolist() == [1, 2] and text.codes.dtype == np.int32
    assert text.codes.tolist() == [1, 0] and text.dictionary.to_pylist() == ["a", "b"]


def _raw(ph: list, category: list, name: list, ts: list, dur: list) -> RawColumns:
    def coded(values: list) -> pa.DictionaryArray:
        distinct = sorted({v for v in values if v is not None})
        codes = pa.array([None if v is None else distinct.index(v) for v in values], pa.int32())
        return pa.DictionaryArray.from_arrays(codes, pa.array(distinct, pa.large_string()))

    return RawColumns(len(ph), {"ph": coded(ph), "category": coded(category),
                                "name": coded(name), "ts_ns": pa.array(ts, pa.int64()),
                                "dur_ns": pa.array(dur, pa.int64())})


def test_row_keys_by_hand():
    """A timeless metadata row takes the first time; a row without a time is dropped and
    counted; a negative duration is nulled; a complete event without one is warned about;
    the clock base is added to every time."""
    raw = _raw(ph=["M", "X", "X", "X", "i"],
               category=[None, "cpu_op", "kernel", "cpu_op", None],
               name=["process_name", "aten::mm", "k", "aten::add", "[memory]"],
               ts=[None, 50, None, 20, 30], dur=[None, -5, 1, None, None])
    dropped: dict[str, int] = {}
    warnings: list[str] = []
    keys, kept = _rows.row_keys(raw, 1000, dropped, warnings)
    assert keys.kind.to_pylist() == ["metadata", "cpu_op", "cpu_op", "memory"]
    assert keys.ts_ns.to_pylist() == [1020, 1050, 1020, 1030]
    assert keys.dur_ns.to_pylist() == [None, None, None, None]
    assert kept.num_rows == 4 and kept.full("name").to_pylist()[2] == "aten::add"
    assert dropped == {"missing_ts": 1}
    assert warnings == ["1 complete events without a duration (dur_ns left null)",
                        "1 events with a negative duration (dur_ns set to null)"]


def test_row_keys_without_damage_keep_every_row_and_warn_nothing():
    raw = _raw(ph=["X", "X"], category=["cpu_op", "kernel"], name=["a", "b"], ts=[2, 1],
               dur=[3, 4])
    warnings: list[str] = []
    keys, kept = _rows.row_keys(raw, 0, {}, warnings)
    assert (keys.kind.to_pylist(), keys.ts_ns.to_pylist(), keys.dur_ns.to_pylist()) == (
        ["cpu_op", "kernel"], [2, 1], [3, 4])
    assert kept is raw and warnings == []


def test_a_batch_lists_its_kinds_in_order_of_appearance():
    kind = pa.DictionaryArray.from_arrays(pa.array([3, 1, 3, 0], pa.int32()),
                                          strings(["a", "b", "c", "d"]))
    out = _rows.in_order_of_appearance(kind.slice(0, 3))
    assert out.dictionary.to_pylist() == ["d", "b"] and out.indices.to_pylist() == [0, 1, 0]
    out = _rows.in_order_of_appearance(kind.slice(1, 3))
    assert out.dictionary.to_pylist() == ["b", "d", "a"]
    assert out.to_pylist() == ["b", "d", "a"]


def _step_keys() -> pl.DataFrame:
    return pl.DataFrame({
        "rank": pl.Series([0, 0, 0, 0, 1, 1], dtype=pl.Int32),
        "kind": ["user_annotation", "cpu_op", "cuda_runtime", "kernel", "user_annotation",
                 "cpu_op"],
        "name": ["ProfilerStep#7", "aten::mm", "cudaLaunchKernel", "gemm", "ProfilerStep#2",
                 "aten::add"],
        "ts_ns": [0, 10, 20, 150, 0, 5], "dur_ns": [100, 5, 5, 10, 50, 1],
        "correlation": [None, None, 4, 4, None, None]},
        schema_overrides={"kind": pl.Categorical, "name": pl.Categorical})


def test_steps_from_an_arrow_table_are_those_from_a_polars_frame():
    frame = _step_keys()
    want = [7, 7, 7, 7, 2, 2]  # the kernel runs after step 7 ends: its launch's step
    assert StepsOfRows(frame).column().to_list() == want
    assert StepsOfRows(frame.to_arrow()).column().to_list() == want
    plain = frame.with_columns(pl.col("kind", "name").cast(pl.String)).to_arrow()
    assert StepsOfRows(plain).column().to_list() == want


def test_steps_of_an_empty_table():
    empty = _step_keys().head(0)
    assert StepsOfRows(empty).column().to_list() == []
    assert StepsOfRows(empty.to_arrow()).column().to_list() == []


def test_one_batch_is_written_alike_with_or_without_the_writer_thread(tmp_path):
    parsed = kineto.parse_batched(write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]))
    written = []
    for overlap in (True, False):
        target = tmp_path / f"{overlap}.parquet"
        parquet.write_event_batches(ingest.batches_with_steps(parsed.events), target,
                                    leave_out=parsed.events.null_columns, overlap=overlap)
        written.append(target.read_bytes())
    assert written[0] == written[1]


def test_several_batches_are_written_alike_with_or_without_the_writer_thread(tmp_path):
    parsed = kineto.parse_batched(write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(5)]))
    events = dataclasses.replace(parsed.events, batch_rows=2)
    written = [parquet.event_batches_bytes(ingest.batches_with_steps(events), overlap=overlap)
               for overlap in (True, False)]
    assert written[0] == written[1]


def test_content_id_of_a_small_and_an_empty_file(tmp_path):
    small, empty = tmp_path / "small", tmp_path / "empty"
    small.write_bytes(b"x" * 1000)
    empty.write_bytes(b"")
    assert parquet.content_id(small) == xxhash.xxh3_128_hexdigest(b"x" * 1000)
    assert parquet.content_id(empty) == xxhash.xxh3_128_hexdigest(b"")


def test_parquet_options_remembered_per_schema_and_handed_out_as_copies():
    one = pa.schema([("ts_ns", pa.int64()), ("kind", pa.dictionary(pa.int32(), pa.string()))])
    other = pa.schema([("ts_ns", pa.int64())])
    first = parquet.parquet_options(one)
    first["compression"] = None  # a caller's change stays its own
    assert parquet.parquet_options(one) == parquet._options_of(one)
    assert parquet.parquet_options(other) == parquet._options_of(other)
    assert parquet.parquet_options(other)["use_dictionary"] == []


def test_strings_short_lists_remembered_long_ones_built():
    assert strings(["a", "bé"]) is strings(["a", "bé"])
    long = [str(i) for i in range(100)]
    assert strings(long).to_pylist() == long


def test_many_small_files_go_to_the_workers(tmp_path):
    files = [write_trace(tmp_path / f"r{i}.json", []) for i in range(ingest.IN_PROCESS_FILES
                                                                     + 1)]
    assert not ingest._in_process(files)
    assert ingest._in_process(files[:ingest.IN_PROCESS_FILES])
    assert ingest._in_process(files[:1])


@pytest.mark.parametrize("size", [0, 100, (1 << 20) + 1])
def test_follow_only_files_of_a_megabyte_or_more(tmp_path, size):
    path = tmp_path / "t.json"
    path.write_bytes(b" " * size)
    expected = size >= kineto.FOLLOW_FROM_BYTES and kineto._kineto_scan is not None
    assert kineto._worth_following(path) == expected
    kineto._worth_following(tmp_path / "missing")  # never raises: open_input words it
