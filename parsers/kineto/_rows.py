"""Scanned Kineto columns -> rows of the events schema.

:func:`row_keys` works out, for every row at once, what the steps need (kind and exact times,
beside the name) and counts what cannot be stored; :func:`batch` builds the rest of one row range (the
derived device, stream, flow, collective, copy and byte columns, :mod:`._derived`, and the
columns stored as scanned), so the finished table is never whole in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from traceview import schema
from traceview.parsers._buffers import dictionary_codes, remembered
from traceview.parsers.kineto._arrow_types import as_type, strings
from traceview.parsers.kineto._columns import RawColumns
from traceview.parsers.kineto._derived import (
    DERIVED,
    TextFacts,
    derived_columns,
    int64s,
    int_values,
)

_CAT_TO_KIND: dict[str, str] = {
    "cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
    "python_function": "python_function", "kernel": "kernel", "gpu_memcpy": "memcpy",
    "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime", "cuda_driver": "cuda_driver", "cuda_sync": "sync",
    "trace": "trace_span",
}


@dataclass(frozen=True)
class RowKeys:
    """What the steps need of every row besides its name, and what :func:`batch` takes as is:
    the kind (codes into the sorted kind names) and the exact times (the clock base added)."""

    kind: pa.DictionaryArray
    ts_ns: pa.Array
    dur_ns: pa.Array

    @property
    def num_rows(self) -> int:
        return len(self.kind)


def row_keys(raw: RawColumns, base_ns: int, dropped: dict[str, int],
             warnings: list[str]) -> tuple[RowKeys, RawColumns]:
    """Kind and exact times of every row, and what cannot be stored counted. Returns them
    with the raw columns of the rows kept. In numpy over the columns' buffers: as a Polars
    frame, a file of a few KB paid ~2.5 ms in Polars calls (docs/performance.md, log 45)."""
    kind = _kinds(raw.full("ph"), raw.full("category"), raw.full("name"))
    kinds = kind.dictionary.to_pylist()
    is_metadata = dictionary_codes(kind) == kinds.index("metadata") if "metadata" in kinds \
        else np.zeros(len(kind), dtype=bool)
    rows = raw.num_rows
    ts, ts_ok = int_values(raw, "ts_ns", 0, rows)
    dur, dur_ok = int_values(raw, "dur_ns", 0, rows)
    if base_ns:  # clock_base checked that no time overflows; in place where ts is a copy
        ts = np.add(ts, base_ns, out=ts if ts.flags.owndata else None)
    missing_ts = int((~ts_ok & ~is_metadata).sum())
    no_dur = int((~dur_ok & _is_text(raw.full("ph"), "X")).sum())
    negative = dur_ok & (dur < 0)
    negatives = int(negative.sum())  # counted before rows without a time go
    if missing_ts:
        dropped["missing_ts"] = dropped.get("missing_ts", 0) + missing_ts
    timeless = is_metadata & ~ts_ok
    if timeless.any():  # metadata may lack ts: timeless, pinned to the file's first time
        ts = np.where(timeless, ts[ts_ok].min() if ts_ok.any() else 0, ts)
        ts_ok = ts_ok | timeless
    if missing_ts:
        raw = raw.filter(_booleans(ts_ok))
        kind = pa.DictionaryArray.from_arrays(_int32s(dictionary_codes(kind)[ts_ok]),
                                              kind.dictionary)
        ts, dur, dur_ok, negative = ts[ts_ok], dur[ts_ok], dur_ok[ts_ok], negative[ts_ok]
        ts_ok = ts_ok[ts_ok]
    if no_dur:
        warnings.append(f"{no_dur} complete events without a duration (dur_ns left null)")
    if negatives:
        warnings.append(f"{negatives} events with a negative duration (dur_ns set to null)")
    return RowKeys(kind, int64s(ts, ts_ok), int64s(dur, dur_ok & ~negative)), raw


def _is_text(column: pa.DictionaryArray, text: str) -> np.ndarray:
    """Whether each row of a dictionary column is ``text`` (a null row is not)."""
    values = column.dictionary.to_pylist()
    if text not in values:
        return np.zeros(len(column), dtype=bool)
    return dictionary_codes(column) == values.index(text)


def _booleans(values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(values),
                                 [None, pa.py_buffer(np.packbits(values, bitorder="little"))])


def _int32s(values: np.ndarray) -> pa.Array:
    values = values.astype(np.int32)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


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
    # int32 holds every pair's number: pair_code has an entry for each
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
    return remembered(_KIND_OF_PAIR, pairs, _work_out_kinds)


def _work_out_kinds(pairs: list[tuple[str | None, str | None]]) -> list[str]:
    frame = pl.DataFrame({"ph": [p for p, _ in pairs], "category": [c for _, c in pairs]},
                         schema={"ph": pl.String, "category": pl.String})
    return frame.select(_kind_of(pl.col("ph"), pl.col("category")))[:, 0].to_list()


def batch(keys: RowKeys, raw: RawColumns, facts: TextFacts, start: int,
          stop: int) -> pa.Table:
    """Rows ``[start, stop)`` in the events schema (step left null): the scanner's arrays
    cast to the schema's types, and the derived columns (:mod:`._derived`)."""
    rows = stop - start
    key_columns = {"kind": in_order_of_appearance(keys.kind.slice(start, rows)),
                   "ts_ns": keys.ts_ns.slice(start, rows),
                   "dur_ns": keys.dur_ns.slice(start, rows)}
    columns = {
        "rank": constant_int32(rows, 0), "file_id": constant_int32(rows, 0),
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


def constant_int32(rows: int, value: int) -> pa.Array:
    values = np.full(rows, value, dtype=np.int32)  # pa.array(numpy) would import pandas
    return pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(values)])


def _constant_text(rows: int, text: str) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(constant_int32(rows, 0), strings([text]))


def in_order_of_appearance(column: pa.DictionaryArray) -> pa.DictionaryArray:
    """``column`` with only the dictionary entries its rows use, in the order they first
    appear (as a Polars Categorical hands them to Arrow): so the stored files stay the same
    bytes as when the kinds went through Polars. No null rows.

    >>> kind = pa.DictionaryArray.from_arrays(pa.array([2, 0, 2], pa.int32()),
    ...                                       strings(["a", "memory", "z"]))
    >>> out = in_order_of_appearance(kind)
    >>> out.dictionary.to_pylist(), out.indices.to_pylist()
    (['z', 'a'], [0, 1, 0])
    """
    codes = dictionary_codes(column)
    used = np.flatnonzero(np.bincount(codes, minlength=len(column.dictionary)))
    first = np.array([np.argmax(codes == code) for code in used], dtype=np.int64)
    order = used[np.argsort(first)]
    new_code = np.zeros(len(column.dictionary), dtype=np.int32)
    new_code[order] = np.arange(len(order), dtype=np.int32)
    values = column.dictionary.to_pylist()
    return pa.DictionaryArray.from_arrays(_int32s(new_code[codes]),
                                          strings([values[i] for i in order]))
