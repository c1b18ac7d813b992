"""Decoded Kineto events -> the raw columns, in the C scanner's layout.

The pure-Python readers (``_stream.py`` for well-formed input, ``_tolerant.py`` for the rest)
decode events with msgspec into :class:`Event` (``ts``, ``dur`` and ``args`` left as raw JSON),
then turn a list of them into columns here: exact int64 ns from the decimal text of the times,
the ``args`` keys that become columns decoded all at once, values of the wrong type as null.
"""

from __future__ import annotations

import mmap
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from traceview.schema import KINETO_ARGS, KINETO_TEXT_ARGS

_NULL = msgspec.Raw(b"null")


class Event(msgspec.Struct, gc=False):
    """One trace event; ``ts``, ``dur`` and ``args`` stay raw JSON (exact times, args
    decoded all at once later)."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL
    id: Any = None
    args: msgspec.Raw = _NULL


# One field per args key that becomes a column (schema.KINETO_ARGS), the rest of args skipped.
_Args = msgspec.defstruct(
    "_Args",
    [(f"{attr}_{i}", Any, msgspec.field(default=None, name=key))
     for attr, keys in KINETO_ARGS.items() for i, key in enumerate(keys)],
    gc=False,
)


#: Text that repeats from event to event, kept dictionary-encoded from the first batch on.
REPEATING_TEXT = frozenset({"ph", "category", "name", "pid_label", "tid_label",
                            "collective_name", "pg_name", "pg_desc", "pg_ranks", "dtype"})


def valid_utf8(data: bytes | mmap.mmap) -> bool:
    """Whether ``data`` is valid UTF-8: Arrow's check of one string over the bytes as they are
    (vectorised, no copy; ``bytes.decode`` would build the whole text)."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    try:
        pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(data)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def columns_of(events: list[Event]) -> pa.Table:
    """The raw columns of decoded events, in the C scanner's layout."""
    pid, pid_label = _split_ids(list(map(attrgetter("pid"), events)))
    tid, tid_label = _split_ids(list(map(attrgetter("tid"), events)))
    args_raw = list(map(attrgetter("args"), events))
    base = table_of({
        "ph": _any_column(list(map(attrgetter("ph"), events)), pa.string()),
        "name": _any_column(list(map(attrgetter("name"), events)), pa.string()),
        "category": _any_column(list(map(attrgetter("cat"), events)), pa.string()),
        "pid": pid, "tid": tid, "pid_label": pid_label, "tid_label": tid_label,
        "ts_text": _raw_strings(list(map(attrgetter("ts"), events))),
        "dur_text": _raw_strings(list(map(attrgetter("dur"), events))),
        "flow_id": _any_column(list(map(attrgetter("id"), events)), pa.int64()),
        "args_json": _null_if_null_text(_raw_strings(args_raw)),
        **_args_columns(_decode_args(args_raw)),
    })
    times = pl.from_arrow(base.select(["ts_text", "dur_text"])).select(
        decimal_us_to_ns(pl.col("ts_text")).alias("ts_ns"),
        decimal_us_to_ns(pl.col("dur_text")).alias("dur_ns"))
    return (base.drop_columns(["ts_text", "dur_text"])
            .append_column("ts_ns", times["ts_ns"].to_arrow())
            .append_column("dur_ns", times["dur_ns"].to_arrow()))


def table_of(columns: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def _raw_strings(raws: list[msgspec.Raw]) -> pa.LargeStringArray:
    """Raw JSON fragments as one Arrow string array, built from buffers (no per-item objects)."""
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(raws)
    return pa.LargeStringArray.from_buffers(
        len(raws), pa.py_buffer(offsets), pa.py_buffer(data))


def decimal_us_to_ns(text: pl.Expr) -> pl.Expr:
    """Exact int64 ns from the decimal text of a microsecond value (``null`` -> null).

    The text is cast to a Decimal with 3 fractional digits (exact for everything Kineto writes;
    further digits round to the nearest ns, ties to even), so no float is ever involved.
    """
    micros = text.str.strip_chars('"').cast(pl.Decimal(38, 3), strict=False)
    return (micros * 1000).cast(pl.Int64, strict=False)


def _split_ids(values: list[Any]) -> tuple[pa.Array, pa.Array]:
    """pid/tid: integers to an int64 column, anything else to a label column."""
    ints = [v if type(v) is int and -(2**63) <= v < 2**63 else None for v in values]
    others = len(values) - len(ints) + ints.count(None) - values.count(None)
    if not others:
        return _array(ints, pa.int64()), pa.nulls(len(values), pa.string())
    labels = [None if v is None or i is not None else str(v) for v, i in zip(values, ints)]
    return _array(ints, pa.int64()), _array(labels, pa.string())


def _any_column(values: list[Any], typ: pa.DataType) -> pa.Array:
    """A column from loosely typed JSON values; values of another type become null (a number
    with a fraction in an integer column too: the C scanner's rule)."""
    try:
        return _array(values, typ)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        pass
    if pa.types.is_integer(typ):
        clean = [as_int(v) for v in values]
        return _array([v if v is not None and -(2**63) <= v < 2**63 else None for v in clean],
                      typ)
    return _array([None if v is None else v if isinstance(v, str) else
                   msgspec.json.encode(v).decode() for v in values], typ)


def _array(values: list[Any], typ: pa.DataType) -> pa.Array:
    """An int64 or string column of Python values, built by Polars, which raises TypeError
    for a value of another type. (``pa.array`` on a list imports pandas: 0.2 s and ~60 MB
    in the pure path's first batch; and it truncates 1.5 to 1 in an integer column.)"""
    dtype = pl.Int64 if pa.types.is_integer(typ) else pl.String
    array = pl.Series(values=values, dtype=dtype, strict=True).to_arrow(
        compat_level=pl.CompatLevel.oldest())
    return array if array.type == typ else array.cast(typ)


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return None
    return None


def _decode_args(raws: list[msgspec.Raw]) -> list[Any]:
    blob = b"[" + b",".join(raws) + b"]"
    try:
        return msgspec.json.decode(blob, type=list[_Args | None])
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    out: list[Any] = []
    for raw in raws:  # some args are not objects: decode one by one, keep the rest
        try:
            out.append(msgspec.json.decode(raw, type=_Args | None))
        except (msgspec.DecodeError, msgspec.ValidationError):
            out.append(None)
    return out


def _args_columns(args: list[Any]) -> dict[str, pa.Array]:
    empty = _Args()
    args = [empty if a is None else a for a in args]
    columns: dict[str, pa.Array] = {}
    for attr, keys in KINETO_ARGS.items():
        merged = list(map(attrgetter(f"{attr}_0"), args))
        for i in range(1, len(keys)):  # older spellings fill what the current one lacks
            alias = list(map(attrgetter(f"{attr}_{i}"), args))
            if alias.count(None) != len(alias):
                merged = [m if m is not None else v for m, v in zip(merged, alias)]
        typ = pa.string() if attr in KINETO_TEXT_ARGS else pa.int64()
        columns[attr] = _any_column(merged, typ)
    return columns


def _null_if_null_text(raw: pa.Array) -> pa.Array:
    """Raw text ``null`` (no args) becomes a null entry, as the C scanner writes it."""
    column = pl.from_arrow(raw)
    return column.set(column == "null", None).to_arrow().cast(pa.large_string())
