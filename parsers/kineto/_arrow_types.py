"""The few Arrow type changes the Kineto batches need, done on buffers.

``Array.cast`` goes through ``pyarrow.compute``, whose import costs ~0.2 s of every ingesting
process (it builds ~300 wrappers from docstrings): 13 % of a 300 MB single-rank ingest
(docs/performance.md, log 18). The batches only ever need to turn the scanner's and Polars'
dictionary columns (``large_string`` values, ``int32`` or ``uint32`` indices) into the schema's
``dictionary<string, int32>``, which is a reinterpretation of the indices and a narrowing of
the small dictionary's offsets. Anything else still goes to ``Array.cast``.

>>> import pyarrow as pa
>>> big = pa.DictionaryArray.from_arrays(pa.array([1, None, 0], pa.uint32()),
...                                      pa.array(["a", "bc"], pa.large_string()))
>>> out = as_type(big, pa.dictionary(pa.int32(), pa.string()))
>>> out.type, out.to_pylist()
(DictionaryType(dictionary<values=string, indices=int32, ordered=0>), ['bc', None, 'a'])
>>> series_of(pa.array([1, None]), "x").to_list(), strings(["é", "", "ab"]).to_pylist()
([1, None], ['é', '', 'ab'])
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import polars as pl
import pyarrow as pa

_INT32_MAX = (1 << 31) - 1


def as_type(array: pa.Array | pa.ChunkedArray, typ: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``array`` as type ``typ``: itself when it has that type already, a buffer-level
    conversion for dictionaries of large strings, else ``Array.cast``; chunk by chunk."""
    if array.type == typ:
        return array
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([as_type(chunk, typ) for chunk in array.chunks], typ)
    if _is_string_dictionary(typ) and _is_string_dictionary(array.type, large=True):
        indices = array.indices
        if indices.type == pa.uint32():  # dictionary sizes are far below 2**31
            indices = indices.view(pa.int32())
        values = narrow_strings(array.dictionary)
        if indices.type == pa.int32() and values is not None:
            return pa.DictionaryArray.from_arrays(indices, values)
    if typ == pa.int32() and array.type == pa.int64():
        narrowed = _narrow_ints(array)
        if narrowed is not None:
            return narrowed
    return array.cast(typ)


def narrow_strings(values: pa.Array) -> pa.Array | None:
    """A ``large_string`` array as ``string`` (int32 offsets); None when it cannot be done
    on the buffers (more than 2 GiB of text, or a sliced array with nulls)."""
    if values.type == pa.string():
        return values
    validity, offsets, data = values.buffers()
    if validity is not None and values.offset:
        return None
    wide = np.frombuffer(offsets, dtype=np.int64)[values.offset:values.offset + len(values) + 1]
    if len(wide) and (wide[-1] > _INT32_MAX or wide[0] < 0):
        return None
    narrow = wide.astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values), [validity, pa.py_buffer(narrow), data],
                                 null_count=values.null_count)


def _narrow_ints(array: pa.Array) -> pa.Array | None:
    """An int64 array as int32 when every slot fits; None for a sliced array with nulls or a
    value out of range (``Array.cast`` then raises as it always did)."""
    validity, data = array.buffers()
    if data is None or (validity is not None and array.offset):
        return None
    wide = np.frombuffer(data, dtype=np.int64)[array.offset:array.offset + len(array)]
    if len(wide) and (wide.min() < -_INT32_MAX - 1 or wide.max() > _INT32_MAX):
        return None
    narrow = pa.py_buffer(wide.astype(np.int32))
    return pa.Array.from_buffers(pa.int32(), len(array), [validity, narrow],
                                 null_count=array.null_count)


def _is_string_dictionary(typ: pa.DataType, *, large: bool = False) -> bool:
    return (pa.types.is_dictionary(typ)
            and typ.value_type == (pa.large_string() if large else pa.string())
            and typ.index_type in (pa.int32(), pa.uint32()))


def strings(values: list[str]) -> pa.Array:
    """A ``string`` array of Python strings, built on buffers: ``pa.array`` imports pandas
    (~0.4 s) to check whether it was given pandas objects. A short list (kinds, collectives,
    a constant) is built once per process: each batch of a small file built ~10 of them."""
    if len(values) <= _SHORT:
        return _short_strings(tuple(values))
    return _strings(values)


#: Lists of at most this many strings are remembered by :func:`strings` (Arrow arrays are
#: immutable: sharing one is safe).
_SHORT = 64


@lru_cache(maxsize=1024)
def _short_strings(values: tuple[str, ...]) -> pa.Array:
    return _strings(values)


def _strings(values: Sequence[str]) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def series_of(array: pa.Array, name: str = "") -> pl.Series:
    """An Arrow array as a Polars Series. ``pl.Series(array)`` imports ``pyarrow.compute``
    (to combine chunks it is never given here); a one-column table does not."""
    return pl.from_arrow(pa.Table.from_arrays([array], names=[name])).to_series()
