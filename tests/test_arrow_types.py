"""The buffer-level type changes of the Kineto batches agree with Arrow's own cast."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.parsers.kineto._arrow_types import as_type, narrow_strings, series_of, strings

STRING_DICT = pa.dictionary(pa.int32(), pa.string())

words = st.lists(st.text(max_size=6), min_size=1, max_size=8, unique=True)


@st.composite
def dictionary_arrays(draw):
    values = draw(words)
    codes = draw(st.lists(st.one_of(st.none(), st.integers(0, len(values) - 1)), max_size=40))
    index_type = draw(st.sampled_from([pa.int32(), pa.uint32()]))
    array = pa.DictionaryArray.from_arrays(pa.array(codes, index_type),
                                           pa.array(values, pa.large_string()))
    start = draw(st.integers(0, len(codes)))
    return array.slice(start, draw(st.integers(0, len(codes) - start)))


@settings(max_examples=200, deadline=None)
@given(dictionary_arrays())
def test_dictionaries_of_large_strings_narrow_like_cast(array):
    out = as_type(array, STRING_DICT)
    assert out.type == STRING_DICT
    assert out.to_pylist() == array.cast(STRING_DICT).to_pylist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), max_size=40),
       st.integers(0, 40), st.integers(0, 40))
def test_int64_that_fits_narrows_like_cast(values, start, length):
    array = pa.array(values, pa.int64()).slice(start, length)
    out = as_type(array, pa.int32())
    assert out.type == pa.int32()
    assert out.to_pylist() == array.to_pylist()


def test_values_out_of_int32_range_still_raise_like_cast():
    try:
        as_type(pa.array([2**40], pa.int64()), pa.int32())
    except pa.ArrowInvalid:
        pass
    else:  # pragma: no cover
        raise AssertionError("an int64 beyond int32 must not be narrowed silently")


def test_sliced_strings_with_nulls_are_left_to_cast():
    values = pa.array(["a", None, "bc"], pa.large_string()).slice(1)
    assert narrow_strings(values) is None
    assert narrow_strings(pa.array(["a", "bc"], pa.large_string()).slice(1)).to_pylist() == ["bc"]


def test_helpers_build_the_same_values():
    assert strings(["é", "", "x y"]).to_pylist() == ["é", "", "x y"]
    assert strings([]).type == pa.string() and len(strings([])) == 0
    assert series_of(pa.array([3, None]), "n").to_list() == [3, None]


def test_kineto_ingest_imports_neither_pyarrow_compute_nor_pandas(tmp_path):
    """The reason this module exists: each costs every ingesting process 0.2-0.4 s."""
    trace = tmp_path / "rank-0.json"
    trace.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7,'
        ' "ts": 1.5, "dur": 2.25, "args": {"stream": 7, "device": 0, "correlation": 3}},'
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,'
        ' "ts": 1.0, "dur": 0.5, "args": {"correlation": 3}},'
        '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1,'
        ' "ts": 0.5, "dur": 9, "args": {}},'
        '{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 1, "tid": 1, "ts": 1.0},'
        '{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]}')
    code = (
        "import sys\n"
        "import polars, pyarrow.parquet, xxhash\n"
        "import traceview, traceview.store.ingest, traceview.store.steps, traceview.store.traceset\n"
        "from traceview.parsers import kineto\n"
        "before = {m for m in ('pyarrow.compute', 'pandas') if m in sys.modules}\n"
        f"ts = traceview.open([{str(trace)!r}], cache_dir={str(tmp_path / 'cache')!r})\n"
        "assert ts.events.collect().height == 5\n"
        "print(sorted({m for m in ('pyarrow.compute', 'pandas') if m in sys.modules} - before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
