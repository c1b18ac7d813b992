"""Integer and dictionary Arrow arrays read as numpy arrays straight from their buffers, and
answers worked out once per distinct value.

Both serve the per-file work of the ingest (the Kineto batches, the steps of every row), where
the general tools cost more than the work on a file of a few KB: pyarrow's ``to_numpy``
imports pandas, Polars' ``fill_null`` is ~0.15 ms a call, and the same names (a job's ranks
share them) went through Polars' string functions again in every file (docs/performance.md,
log 45). numpy and pyarrow are imported on first use: a command answered from the cache
needs neither.

>>> import pyarrow as pa
>>> values, valid = integers(pa.chunked_array([[1, None], [3]]), fill=-1)
>>> values.tolist(), valid.tolist()
([1, -1, 3], [True, False, True])
>>> memo = {}
>>> remembered(memo, ["a", "b", "a"], lambda new: [v.upper() for v in new]), sorted(memo)
(['A', 'B', 'A'], ['a', 'b'])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from traceview._dependencies import lazy_module

np = lazy_module("numpy")
pa = lazy_module("pyarrow")

#: Distinct values a memo of :func:`remembered` holds at most; past it, it is emptied at once.
MOST_REMEMBERED = 1 << 15


def values_and_validity(array: Any) -> tuple[Any, Any]:
    """A primitive array's values (a view of its buffer; null rows hold anything) and
    validity. Only this slice's bytes of the validity bitmap are unpacked: a batch's slice
    shares its whole file's."""
    if pa.types.is_null(array.type):
        return np.zeros(len(array), dtype=np.int64), np.zeros(len(array), dtype=bool)
    bitmap, data = array.buffers()
    if data is None:  # no rows
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    values = np.frombuffer(data, dtype=np.dtype(str(array.type)))[
        array.offset:array.offset + len(array)]
    if bitmap is None or array.null_count == 0:
        return values, np.ones(len(array), dtype=bool)
    first, skip = divmod(array.offset, 8)
    own = np.frombuffer(bitmap, dtype=np.uint8)[first:first + (skip + len(array) + 7) // 8]
    return values, np.unpackbits(own, bitorder="little")[skip:skip + len(array)].astype(bool)


def integers(array: Any, fill: int = 0) -> tuple[Any, Any]:
    """An integer array's or chunked array's values, with ``fill`` in its null rows (a view
    of the buffer where it has no nulls and one chunk, else a copy), and its validity."""
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    parts = [values_and_validity(chunk) for chunk in chunks if len(chunk)]
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    if len(parts) == 1:
        values, valid = parts[0]
        return (values if valid.all() else np.where(valid, values, fill)), valid
    # the chunks (a two-thread scan's halves) copied once, nulls filled in place
    values = np.concatenate([v for v, _ in parts])
    valid = np.concatenate([ok for _, ok in parts])
    if not valid.all():
        values[~valid] = fill
    return values, valid


def dictionary_codes(array: Any) -> Any:
    """A dictionary array's indices in their own integer type (int32 from the parsers), with
    its null rows as ``len(dictionary)``. Without nulls, a read-only view of the indices'
    buffer: widened to int64, the copies were a third of the work between a 262 MB trace's
    scan and its first batch (docs/performance.md, log 50)."""
    indices, valid = values_and_validity(array.indices)
    if array.null_count == 0:
        return indices
    return np.where(valid, indices, np.int32(len(array.dictionary)))


def remembered(memo: dict, values: Sequence[Hashable],
               work_out: Callable[[list], Sequence[Any]]) -> list:
    """``work_out(values)`` (elementwise: a value's answer never depends on the others), each
    distinct value worked out once while ``memo`` holds it; the new ones together."""
    new = [v for v in dict.fromkeys(values) if v not in memo]
    if new:
        if len(memo) + len(new) > MOST_REMEMBERED:
            memo.clear()
        memo.update(zip(new, work_out(new), strict=True))
    return [memo[v] for v in values]


__all__ = ["MOST_REMEMBERED", "dictionary_codes", "integers", "remembered",
           "values_and_validity"]
