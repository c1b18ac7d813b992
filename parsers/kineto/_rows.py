"""Scanned Kineto columns -> rows of the events schema.

:func:`key_frame` works out, for every row at once, what the steps need (kind, name and exact
times) and counts what cannot be stored; :func:`batch` builds the rest of one row range (the
derived device, stream, flow, collective, copy and byte columns, :mod:`._derived`, and the
columns stored as scanned), so the finished table is never whole in memory.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from traceview import schema
from traceview.parsers.kineto._arrow_types import as_type, strings
from traceview.parsers.kineto._columns import RawColumns
from traceview.parsers.kineto._derived import (
    DERIVED,
    MOST_REMEMBERED,
    TextFacts,
    derived_columns,
    dictionary_codes,
)
from traceview.parsers.kineto._events import table_of

_CAT_TO_KIND: dict[str, str] = {
    "cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
    "python_function": "python_function", "kernel": "kernel", "gpu_memcpy": "memcpy",
    "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime", "cuda_driver": "cuda_driver", "cuda_sync": "sync",
    "trace": "trace_span",
}


def key_frame(raw: RawColumns, base_ns: int, dropped: dict[str, int],
               warnings: list[str]) -> tuple[pl.DataFrame, RawColumns]:
    """Kind, name, category and exact times of every row, and what cannot be stored counted.
    Returns them with the raw columns of the rows kept."""
    frame = pl.from_arrow(table_of({
        "kind": _kinds(raw.full("ph"), raw.full("category"), raw.full("name")),
        **{n: raw.full(n) for n in ("ph", "category", "name", "ts_ns", "dur_ns")}}))
    if base_ns:
        frame = frame.with_columns((pl.col("ts_ns") + base_ns).alias("ts_ns"))
    # Count with sums, never with filter(...).height: a filter copies every column.
    missing_ts, no_dur, negative = frame.select(
        (pl.col("ts_ns").is_null() & (pl.col("kind") != "metadata")).sum().alias("a"),
        (pl.col("dur_ns").is_null() & (pl.col("ph") == "X")).sum().alias("b"),
        (pl.col("dur_ns") < 0).sum().alias("c"),
    ).row(0)
    if missing_ts:
        dropped["missing_ts"] = dropped.get("missing_ts", 0) + missing_ts
    frame = _timeless_metadata(frame)
    if missing_ts:
        raw = raw.filter(frame.get_column("ts_ns").is_not_null().to_arrow())
        frame = frame.filter(pl.col("ts_ns").is_not_null())
    if no_dur:
        warnings.append(f"{no_dur} complete events without a duration (dur_ns left null)")
    if negative:
        warnings.append(f"{negative} events with a negative duration (dur_ns set to null)")
        frame = frame.with_columns(
            pl.when(pl.col("dur_ns") < 0).then(None).otherwise(pl.col("dur_ns")).alias("dur_ns"))
    return frame.drop("ph", "category"), raw  # the batches take these two from raw


def _kind_of(ph: pl.Expr, category: pl.Expr) -> pl.Expr:
    """The event kind from the phase and the category (instants named ``[memory]`` aside)."""
    return (
        pl.when(ph.is_in(["s", "t", "f"])).then(pl.lit("flow"))
        .when(ph == "M").then(pl.lit("metadata"))
        .when(ph == "C").then(pl.lit("counter"))
        .when(ph.is_in(["i", "I"])).then(pl.lit("instant"))
        .when(ph == "X").then(category.str.to_lowercase()
                              .replace_strict(_CAT_TO_KIND, default="other"))
        .otherwise(pl.lit("other"))
    )


def _kinds(ph: pa.DictionaryArray, category: pa.DictionaryArray,
           name: pa.DictionaryArray) -> pa.DictionaryArray:
    """The kind of every row, worked out once per (ph, category) pair of dictionary entries
    (a few dozen pairs for millions of rows) and spread over the rows by their indices."""
    ph_values = ph.dictionary.to_pylist() + [None]
    cat_values = category.dictionary.to_pylist() + [None]
    kinds = _kinds_of_pairs([(p, c) for p in ph_values for c in cat_values])
    names = sorted(set(kinds) | {"memory"})
    pair_code = np.array([names.index(k) for k in kinds], dtype=np.int32)
    code = pair_code[dictionary_codes(ph) * len(cat_values) + dictionary_codes(category)]
    name_values = name.dictionary.to_pylist()
    if "[memory]" in name_values:  # instants named [memory] are memory events
        is_memory = dictionary_codes(name) == name_values.index("[memory]")
        code[is_memory & (code == names.index("instant"))] = names.index("memory")
    indices = pa.Array.from_buffers(pa.int32(), len(code), [None, pa.py_buffer(code)])
    return pa.DictionaryArray.from_arrays(indices, strings(names))


#: The kind of each (ph, category) pair met by this process (a few dozen): a small file paid
#: ~1.5 ms of Polars calls to work its pairs out again (docs/performance.md, log 45).
_KIND_OF_PAIR: dict[tuple[str | None, str | None], str] = {}


def _kinds_of_pairs(pairs: list[tuple[str | None, str | None]]) -> list[str]:
    """:func:`_kind_of` of each (ph, category) pair, each pair worked out once per process."""
    new = [pair for pair in dict.fromkeys(pairs) if pair not in _KIND_OF_PAIR]
    if new:
        if len(_KIND_OF_PAIR) + len(new) > MOST_REMEMBERED:
            _KIND_OF_PAIR.clear()
        frame = pl.DataFrame({"ph": [p for p, _ in new], "category": [c for _, c in new]},
                             schema={"ph": pl.String, "category": pl.String})
        kinds = frame.select(_kind_of(pl.col("ph"), pl.col("category")))[:, 0].to_list()
        _KIND_OF_PAIR.update(zip(new, kinds, strict=True))
    return [_KIND_OF_PAIR[pair] for pair in pairs]


def batch(keys: pl.DataFrame, raw: RawColumns, facts: TextFacts, start: int,
          stop: int) -> pa.Table:
    """Rows ``[start, stop)`` in the events schema (step left null): the scanner's arrays
    cast to the schema's types, and the derived columns (:mod:`._derived`)."""
    rows = stop - start
    key_rows = keys.slice(start, rows)
    key_columns = {n: key_rows.get_column(n).to_arrow() for n in ("kind", "ts_ns", "dur_ns")}
    columns = {
        "rank": _constant_int32(rows, 0), "file_id": _constant_int32(rows, 0),
        "source": _constant_text(rows, "kineto"), "step": None,
        **{n: raw.slice(n, start, stop) for n in raw.columns if n in schema.EVENT_COLUMN_NAMES},
        **key_columns,
        **derived_columns(key_columns["kind"], raw, facts, start, stop),
    }
    return pa.Table.from_arrays(
        [pa.nulls(rows, f.type) if columns[f.name] is None else as_type(columns[f.name], f.type)
         for f in schema.EVENTS_ARROW], schema=schema.EVENTS_ARROW)


def empty_columns(raw: RawColumns) -> frozenset[str]:
    """The stored columns that the batches take from the scanner as they are (not derived)
    and that hold no value in any row: labels, memory or FLOP counters a trace never has."""
    as_scanned = (set(raw.columns) & set(schema.EVENT_COLUMN_NAMES)) - set(DERIVED) - {
        "kind", "ts_ns", "dur_ns"}
    return frozenset(name for name in as_scanned if not raw.has_values(name))


def _constant_int32(rows: int, value: int) -> pa.Array:
    values = np.full(rows, value, dtype=np.int32)  # pa.array(numpy) would import pandas
    return pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(values)])


def _constant_text(rows: int, text: str) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(_constant_int32(rows, 0), strings([text]))


def _timeless_metadata(frame: pl.DataFrame) -> pl.DataFrame:
    """Metadata events may lack ``ts``; they are timeless, so pin them to the file's first time."""
    timeless = (pl.col("kind") == "metadata") & pl.col("ts_ns").is_null()
    if not frame.select(timeless.any()).item():
        return frame  # the usual case: no new column
    first = frame.select(pl.col("ts_ns").min()).item()
    return frame.with_columns(
        pl.when((pl.col("kind") == "metadata") & pl.col("ts_ns").is_null())
        .then(pl.lit(first if first is not None else 0, dtype=pl.Int64))
        .otherwise(pl.col("ts_ns")).alias("ts_ns"))
