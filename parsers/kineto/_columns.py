"""The Kineto scanner's raw columns, held compactly and cut into row batches on demand.

Most ``args`` columns (sequence numbers, element counts, memory fields ...) hold a value on few
rows, so the C scanner hands them over as (row, value) pairs instead of dense int64 arrays,
which were most of its memory. :class:`RawColumns` keeps dense columns as Arrow arrays and
sparse ones as pairs, and builds the dense Arrow array of any row range when a batch needs it.

>>> import numpy as np, pyarrow as pa
>>> raw = RawColumns(5, {"ts": pa.array([1, 2, 3, 4, 5]),
...                      "seq": Sparse(np.array([1, 4], np.uint32), np.array([10, 40]))})
>>> raw.slice("seq", 1, 5).to_pylist(), raw.slice("ts", 3, 5).to_pylist()
([10, None, None, 40], [4, 5])
>>> raw.filter(pa.array([True, False, True, True, True])).slice("seq", 0, 4).to_pylist()
[None, None, None, 40]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.parsers._buffers import values_and_validity
from traceview.parsers.kineto._arrow_types import series_of


@dataclass(frozen=True)
class Sparse:
    """An int64 column as ascending row numbers and their values; other rows are null."""

    rows: np.ndarray  # uint32, ascending
    values: np.ndarray  # int64

    @classmethod
    def of(cls, column: pa.Array, first_row: int = 0) -> Sparse:
        """The values of an integer array, its first row numbered ``first_row``."""
        values, valid = _values(column)
        rows = np.flatnonzero(valid) + first_row
        return cls(rows.astype(np.uint32), values[valid].astype(np.int64))

    @classmethod
    def concat(cls, parts: list[Sparse]) -> Sparse:
        """Pieces of one column, in row order."""
        return cls(np.concatenate([p.rows for p in parts]),
                   np.concatenate([p.values for p in parts]))

    def dense(self, start: int, stop: int) -> pa.Array:
        return _spread(self.rows, self.values, start, stop, pa.int64())


@dataclass(frozen=True)
class SparseText:
    """A dictionary-encoded text column as ascending row numbers, their dictionary indices,
    and the dictionary; other rows are null."""

    rows: np.ndarray  # uint32, ascending
    codes: np.ndarray  # int32
    dictionary: pa.Array

    @classmethod
    def of(cls, column: pa.DictionaryArray, first_row: int = 0) -> SparseText:
        """The values of a dictionary array, its first row numbered ``first_row``."""
        indices, valid = _values(column.indices)
        rows = np.flatnonzero(valid) + first_row
        return cls(rows.astype(np.uint32), indices[valid].astype(np.int32), column.dictionary)

    @classmethod
    def concat(cls, parts: list[SparseText]) -> SparseText:
        """Pieces of one column, in row order, each with its own dictionary: one dictionary
        for all of them (few values: the texts are gathered and encoded again)."""
        texts = pa.concat_arrays([p.dictionary.take(_int32s(p.codes)) for p in parts])
        encoded = texts.dictionary_encode()
        return cls(np.concatenate([p.rows for p in parts]),
                   series_of(encoded.indices).to_numpy().astype(np.int32), encoded.dictionary)

    def dense(self, start: int, stop: int) -> pa.DictionaryArray:
        indices = _spread(self.rows, self.codes, start, stop, pa.int32())
        return pa.DictionaryArray.from_arrays(indices, self.dictionary)


def _values(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of an integer array from its buffers: through Polars, a rare column of
    a small file cost ~0.5 ms in conversions (seven of them a file; docs/performance.md,
    log 45)."""
    if array.type in (pa.int64(), pa.int32(), pa.uint32()):
        return values_and_validity(array)
    values = series_of(array)  # another integer type: not what the readers make
    return values.fill_null(0).to_numpy(), values.is_not_null().to_numpy()


def _int32s(values: np.ndarray) -> pa.Array:
    """An int32 array over a numpy array's buffer (``pa.array`` would import pandas)."""
    values = values.astype(np.int32, copy=False)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def _spread(rows: np.ndarray, values: np.ndarray, start: int, stop: int,
            typ: pa.DataType) -> pa.Array:
    """Rows ``[start, stop)`` of a column given as (ascending row, value) pairs; other rows
    null. Built from buffers: ``pa.array`` on numpy would import pandas."""
    lo, hi = np.searchsorted(rows, [start, stop])
    at = rows[lo:hi].astype(np.int64) - start
    dense = np.zeros(stop - start, dtype=values.dtype)
    dense[at] = values[lo:hi]
    valid = np.zeros(stop - start, dtype=bool)
    valid[at] = True
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(typ, stop - start, [pa.py_buffer(bitmap), pa.py_buffer(dense)])


@dataclass(frozen=True)
class RawColumns:
    """Columns of ``num_rows`` rows: Arrow arrays (full length), :class:`Sparse` pairs, or
    None for a column without a single value (type given by ``types``)."""

    num_rows: int
    columns: dict[str, pa.Array | Sparse | SparseText | None]
    types: dict[str, pa.DataType] | None = None

    def slice(self, name: str, start: int, stop: int) -> pa.Array:
        column = self.columns[name]
        if column is None:
            return pa.nulls(stop - start, (self.types or {}).get(name, pa.null()))
        if isinstance(column, (Sparse, SparseText)):
            return column.dense(start, stop)
        return column.slice(start, stop - start)

    def full(self, name: str) -> pa.Array:
        return self.slice(name, 0, self.num_rows)

    def has_values(self, name: str) -> bool:
        """Whether any row of the column holds a value."""
        column = self.columns[name]
        if column is None:
            return False
        if isinstance(column, (Sparse, SparseText)):
            return len(column.rows) > 0
        return column.null_count < len(column)

    def filter(self, keep: pa.Array) -> RawColumns:
        """Only the rows where ``keep`` is true (rare: rows without a time are dropped)."""
        mask = series_of(keep).fill_null(False).to_numpy()  # pyarrow's would import pandas
        new_row = np.cumsum(mask) - 1
        out: dict[str, pa.Array | Sparse | SparseText | None] = {}
        for name, column in self.columns.items():
            if isinstance(column, Sparse):
                kept = mask[column.rows]
                out[name] = Sparse(new_row[column.rows[kept]].astype(np.uint32),
                                   column.values[kept])
            elif isinstance(column, SparseText):
                kept = mask[column.rows]
                out[name] = SparseText(new_row[column.rows[kept]].astype(np.uint32),
                                       column.codes[kept], column.dictionary)
            else:
                out[name] = None if column is None else column.filter(keep)
        return RawColumns(int(mask.sum()), out, self.types)

    def drop(self, name: str) -> RawColumns:
        return RawColumns(self.num_rows, {k: v for k, v in self.columns.items() if k != name},
                          self.types)
