"""The columns a Kineto batch derives (flow, device, stream, collective, copy kind, bytes), in
numpy over dictionary codes and value buffers.

What a text says (the collective an NCCL kernel's name implies, a dtype's size) is worked out
once per file and distinct value (:func:`text_facts`, with Polars' string functions) into
lookup tables indexed by dictionary code; a batch then picks from them by its rows' codes.
Built with Polars expressions per batch, the same columns cost ~20 Polars calls and a dozen
conversions per 65,536 rows, more than the work itself (docs/performance.md, log 42).

>>> _first_valid(np.array([-1, 0, -1]), np.array([2, 1, -1])).tolist()
[2, 0, -1]
>>> _coded(np.array([1, -1, 0]), strings(["a", "b"])).to_pylist()
['b', None, 'a']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from traceview import schema
from traceview.naming import collective_from_text, copy_kind_from_name, dtype_bytes
from traceview.parsers._buffers import dictionary_codes, integers, remembered
from traceview.parsers.kineto._arrow_types import strings
from traceview.parsers.kineto._columns import RawColumns, Sparse, SparseText


#: The columns :func:`derived_columns` builds (the batch stores the others as scanned).
DERIVED = ("flow_phase", "flow_id", "device", "stream", "collective", "copy_kind", "bytes")


@dataclass(frozen=True)
class TextFacts:
    """Lookup tables by dictionary code of the raw text columns; the last entry of each is
    the null row's. Collectives and copy kinds are codes into ``collectives`` and
    ``copy_kinds`` (-1: none); ``dtype_bytes`` is -1 where the size is unknown."""

    kernel_collective: np.ndarray  # by name code
    op_collective: np.ndarray  # by name code
    name_copy_kind: np.ndarray  # by name code
    arg_collective: np.ndarray  # by collective_name code
    dtype_bytes: np.ndarray  # by dtype code
    device_category: np.ndarray  # by category code, bool
    collectives: list[str]
    copy_kinds: list[str]


def text_facts(raw: RawColumns) -> TextFacts:
    """What the text columns say, worked out once per distinct value (dictionary entry): from
    the name, the collective of an NCCL/RCCL kernel or of a c10d/gloo/nccl/mpi op and the
    memcpy direction; from ``Collective name`` the collective; from ``dtype`` the element size;
    from the category whether it is another accelerator's device work.

    Each distinct text is read by Polars' string functions once per process
    (:func:`~traceview.parsers._buffers.remembered`): the ranks of one job share their names,
    and a file of a few KB paid ~8 ms of Polars calls for them (docs/performance.md, log 45)."""
    def entries(column: str) -> list[str]:
        return raw.columns[column].dictionary.to_pylist()

    names = remembered(_NAME_FACTS, entries("name"), _name_facts)
    kernel = [k for k, _, _ in names]
    op = [o for _, o, _ in names]
    copy = [c for _, _, c in names]
    args = remembered(_ARG_COLLECTIVE, entries("collective_name"), _collectives)
    collectives = _vocabulary([*kernel, *op, *args, "other"])
    copy_kinds = _vocabulary(copy)
    sizes = remembered(_DTYPE_BYTES, entries("dtype"), _dtype_sizes)
    device = [c in schema.ACCELERATOR_DEVICE_CATEGORIES for c in entries("category")]
    return TextFacts(
        kernel_collective=_codes_in(kernel, collectives),
        op_collective=_codes_in(op, collectives),
        name_copy_kind=_codes_in(copy, copy_kinds),
        arg_collective=_codes_in(args, collectives),
        dtype_bytes=np.array([-1 if s is None else s for s in sizes] + [-1], dtype=np.int64),
        device_category=np.array(device + [False]),
        collectives=collectives, copy_kinds=copy_kinds)


#: What each distinct text said (see text_facts): name -> (kernel collective, op collective,
#: copy kind); ``Collective name`` -> collective; dtype -> element size
_NAME_FACTS: dict[str, tuple[str | None, str | None, str | None]] = {}
_ARG_COLLECTIVE: dict[str, str | None] = {}
_DTYPE_BYTES: dict[str, int | None] = {}


def _frame(values: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"v": values}, schema={"v": pl.String})


def _name_facts(values: list[str]) -> list[tuple[str | None, str | None, str | None]]:
    v = pl.col("v")
    names = _frame(values).select(
        pl.when(v.str.contains(r"(?i)nccl|rccl")).then(collective_from_text(v)).alias("kernel"),
        pl.when(v.str.contains(r"(?i)^(nccl|gloo|c10d|mpi)[:_]"))
        .then(collective_from_text(v)).alias("op"),
        copy_kind_from_name(v).alias("copy"))
    return list(names.iter_rows())


def _collectives(values: list[str]) -> list[str | None]:
    return _frame(values).select(collective_from_text(pl.col("v"))).to_series().to_list()


def _dtype_sizes(values: list[str]) -> list[int | None]:
    return _frame(values).select(dtype_bytes(pl.col("v"))).to_series().to_list()


def _vocabulary(values: list[str | None]) -> list[str]:
    return sorted({v for v in values if v is not None})


def _codes_in(values: list[str | None], vocabulary: list[str]) -> np.ndarray:
    """Each value's position in ``vocabulary`` (-1 for None), with a -1 for the null row."""
    at = {v: i for i, v in enumerate(vocabulary)}
    return np.array([-1 if v is None else at[v] for v in values] + [-1], dtype=np.int64)


def derived_columns(kind: pa.DictionaryArray, raw: RawColumns, facts: TextFacts, start: int,
                    stop: int) -> dict[str, pa.Array]:
    """The derived columns of rows ``[start, stop)``, whose kinds are ``kind``. Another
    accelerator's device work (kind ``other``, an ``ACCELERATOR_DEVICE_CATEGORIES`` category)
    keeps its ``args.stream`` as a GPU kernel does: without it, the analyses would take its
    thread id for its stream (MTIA: 4 and 408 where the trace says streams 1 and 102)."""
    kinds = kind.dictionary.to_pylist() + [None]
    code = dictionary_codes(kind)

    def of_kind(*names: str) -> np.ndarray:
        return np.array([k in names for k in kinds])[code]

    is_gpu = of_kind(*schema.GPU_STREAM_KINDS)
    is_flow, is_memory, is_memcpy = of_kind("flow"), of_kind("memory"), of_kind("memcpy")
    name = _codes(raw, "name", start, stop)
    collective_name = _codes(raw, "collective_name", start, stop)
    on_stream = is_gpu | (of_kind("other")
                          & facts.device_category[_codes(raw, "category", start, stop)])
    collective = _first_valid(
        facts.arg_collective[collective_name],
        np.where(of_kind("kernel"), facts.kernel_collective[name], -1),
        np.where(of_kind("cpu_op", "user_annotation"), facts.op_collective[name], -1),
        np.where(collective_name < len(facts.arg_collective) - 1,
                 facts.collectives.index("other"), -1))
    ph = raw.slice("ph", start, stop)
    device, device_ok = int_values(raw, "device", start, stop)
    mem_device, mem_device_ok = int_values(raw, "mem_device", start, stop)
    flow_id, flow_id_ok = int_values(raw, "flow_id", start, stop)
    stream, stream_ok = int_values(raw, "stream", start, stop)
    return {
        "flow_phase": _masked_dictionary(ph, is_flow),
        "flow_id": int64s(flow_id, flow_id_ok & is_flow),
        "device": int64s(np.where(is_gpu, device, mem_device),
                          np.where(is_gpu, device_ok, is_memory & mem_device_ok)),
        "stream": int64s(stream, stream_ok & on_stream),
        "collective": _coded(collective, strings(facts.collectives)),
        "copy_kind": _coded(np.where(is_memcpy, facts.name_copy_kind[name], -1),
                            strings(facts.copy_kinds)),
        "bytes": _bytes(raw, start, stop, of_kind("memcpy", "memset"), collective >= 0,
                        facts.dtype_bytes[_codes(raw, "dtype", start, stop)]),
    }


def _bytes(raw: RawColumns, start: int, stop: int, is_copy: np.ndarray,
           is_collective: np.ndarray, element_bytes: np.ndarray) -> pa.Array:
    """A copy's or memset's own ``bytes``; else a collective's larger element count times
    its dtype's size (null where either is unknown)."""
    given, given_ok = int_values(raw, "bytes", start, stop)
    given_ok &= is_copy
    into, into_ok = int_values(raw, "in_nelems", start, stop)
    out, out_ok = int_values(raw, "out_nelems", start, stop)
    elements = np.where(into_ok & out_ok, np.maximum(into, out), np.where(into_ok, into, out))
    counted_ok = is_collective & (into_ok | out_ok) & (element_bytes >= 0)
    counted = elements * element_bytes  # wraps on overflow, as Polars' product did
    return int64s(np.where(given_ok, given, counted), given_ok | counted_ok)


def _first_valid(*codes: np.ndarray) -> np.ndarray:
    """Per row, the first code that is not -1 (a coalesce)."""
    out = codes[0].copy()
    for more in codes[1:]:
        out = np.where(out < 0, more, out)
    return out


def _codes(raw: RawColumns, name: str, start: int, stop: int) -> np.ndarray:
    """Codes of a raw text column's rows into its dictionary (null: ``len(dictionary)``)."""
    column = raw.columns[name]
    if isinstance(column, SparseText):
        codes = np.full(stop - start, len(column.dictionary), dtype=np.int64)
        lo, hi = np.searchsorted(column.rows, [start, stop])
        codes[column.rows[lo:hi].astype(np.int64) - start] = column.codes[lo:hi]
        return codes
    return dictionary_codes(raw.slice(name, start, stop))


def int_values(raw: RawColumns, name: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """A raw integer column's rows as (values, valid); null rows hold 0."""
    column = raw.columns[name]
    rows = stop - start
    if column is None:
        return np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=bool)
    if isinstance(column, Sparse):
        values, valid = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=bool)
        lo, hi = np.searchsorted(column.rows, [start, stop])
        at = column.rows[lo:hi].astype(np.int64) - start
        values[at], valid[at] = column.values[lo:hi], True
        return values, valid
    values, valid = integers(raw.slice(name, start, stop))
    return values.astype(np.int64, copy=False), valid


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def int64s(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """``values`` as an int64 array, null where ``valid`` is false (those rows zeroed: a
    copy, made only when there are any; a whole file's times have none)."""
    bitmap = _validity(valid)
    if bitmap is not None:
        values = np.where(valid, values, 0)
    values = values.astype(np.int64, copy=False)
    return pa.Array.from_buffers(pa.int64(), len(values), [bitmap, pa.py_buffer(values)])


def _coded(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    """Codes into ``dictionary`` (-1: null) as a dictionary array."""
    valid = codes >= 0
    indices = pa.Array.from_buffers(pa.int32(), len(codes), [
        _validity(valid), pa.py_buffer(np.where(valid, codes, 0).astype(np.int32))])
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _masked_dictionary(column: pa.DictionaryArray, keep: np.ndarray) -> pa.DictionaryArray:
    """``column`` with the rows where ``keep`` is false set to null."""
    codes = dictionary_codes(column)
    return _coded(np.where(keep & (codes < len(column.dictionary)), codes, -1),
                  column.dictionary)
