"""The tolerant reader of Kineto JSON: damaged or unusual input the C scanner declines.

Truncated writes, NaN/Infinity tokens, invalid UTF-8, values of the wrong type, B/E pairs,
times in exponent notation: the bytes are repaired where they can be, decoded with msgspec
(``args`` left raw, then the few keys that become columns decoded all at once), complete events
salvaged from a truncated array, and every entry that cannot be stored counted by reason. The
result has the C scanner's column layout, so ``_parse`` treats both alike (tests
assert that both paths store identical tables on corpus traces).
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from traceview.errors import UnreadableTraceError
from traceview.schema import KINETO_ARGS, KINETO_TEXT_ARGS
from traceview.parsers.kineto._input import repair_text, salvage_events


def read_events(path: Path, data: bytes, warnings: list[str], dropped: dict[str, int]
                ) -> tuple[dict[str, pa.ChunkedArray | None], int, dict[str, Any], int]:
    """(raw columns as the scanner lays them out, by name, None for a column without a
    value; their length; the header values; entries in the input). The columns come in a
    dict the caller owns, so it can release each one as it converts it."""
    if not _valid_utf8(data):
        # first: msgspec checks the strings it decodes, not the raw ``args`` either path
        # keeps, which would reach the store's text columns as invalid UTF-8
        data = repair_text(data, warnings)
    streamed = _read_streamed(data)
    if streamed is not None:
        columns, rows, header = streamed
        return columns, rows, header, rows
    events, header = _decode(path, data, warnings, dropped)
    input_events = len(events) + sum(dropped.values())
    table = _columns_from_structs(_pair_begin_end(events, dropped))
    del events
    return dict(zip(table.column_names, table.columns)), table.num_rows, header, input_events


_NULL = msgspec.Raw(b"null")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL
    id: Any = None
    args: msgspec.Raw = _NULL


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None
    nodes: Any = None  # present in PyTorch Execution Traces, which are not Kineto traces


# One field per args key that becomes a column (schema.KINETO_ARGS), the rest of args skipped.
_Args = msgspec.defstruct(
    "_Args",
    [(f"{attr}_{i}", Any, msgspec.field(default=None, name=key))
     for attr, keys in KINETO_ARGS.items() for i, key in enumerate(keys)],
    gc=False,
)


#: Events turned into Python objects at a time on the streamed path. The objects of a whole
#: trace took ~8x the file in memory (a 63 MB trace peaked at 581 MB); a batch of 16 k
#: events is a few MB of them.
STREAM_BATCH = 1 << 14


class _RawTrace(msgspec.Struct):
    """A Kineto trace with each event left as its raw bytes (a view into the input)."""

    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None
    nodes: Any = None


def _read_streamed(data: bytes) -> tuple[dict[str, pa.ChunkedArray | None], int,
                                          dict[str, Any]] | None:
    """Well-formed input, decoded a batch of events at a time: the raw columns (compact: a
    column no event fills is None, repeating text dictionary-encoded), their length and the
    header; None (the caller's whole-file path decides) for anything else: damage,
    begin/end pairs (a pair may span two batches), no events, not a Kineto trace. ``data`` is
    valid UTF-8 (``read_events`` repairs it first)."""
    bare = data.lstrip()[:1] == b"["
    try:
        if bare:
            raws, header = msgspec.json.decode(data, type=list[msgspec.Raw]), {}
        else:
            trace = msgspec.json.decode(data, type=_RawTrace)
            raws = trace.traceEvents
            header = {"distributedInfo": trace.distributedInfo,
                      "deviceProperties": trace.deviceProperties,
                      "baseTimeNanoseconds": trace.baseTimeNanoseconds,
                      "host_name": trace.host_name}
            if not raws or trace.nodes is not None:
                return None
        chunks: dict[str, list[tuple[int, pa.Array | None]]] = {}
        for start in range(0, len(raws), STREAM_BATCH):
            events = msgspec.json.decode(
                b"[" + b",".join(raws[start:start + STREAM_BATCH]) + b"]", type=list[_Event])
            if any(e.ph in ("B", "E") for e in events):
                return None
            table = _columns_from_structs(events)
            for name, column in zip(table.column_names, table.columns):
                chunks.setdefault(name, []).append((len(events), _compact(name, column)))
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    if not chunks:
        return None
    return {name: _joined(parts) for name, parts in chunks.items()}, len(raws), header


#: Text that repeats from event to event, kept dictionary-encoded from the first batch on.
REPEATING_TEXT = frozenset({"ph", "category", "name", "pid_label", "tid_label",
                            "collective_name", "pg_name", "pg_desc", "pg_ranks", "dtype"})


def _compact(name: str, column: pa.ChunkedArray) -> pa.Array | None:
    """One batch's column as the scanner would hold it: None without a value (most
    per-collective and memory columns), repeating text dictionary-encoded."""
    array = column.combine_chunks()
    if array.null_count == len(array):
        return None
    return array.dictionary_encode() if name in REPEATING_TEXT else array


def _joined(parts: list[tuple[int, pa.Array | None]]) -> pa.ChunkedArray | None:
    """A column's batches as one chunked array (nulls where a batch had no value), or None
    when no batch had one."""
    typ = next((array.type for _, array in parts if array is not None), None)
    if typ is None:
        return None
    return pa.chunked_array([array if array is not None else pa.nulls(n, typ)
                             for n, array in parts], typ)


def _decode(path: Path, data: bytes, warnings: list[str],
            dropped: dict[str, int]) -> tuple[list[_Event], dict[str, Any]]:
    bare = data.lstrip()[:1] == b"["
    try:
        return _decode_fast(path, data, bare)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        pass
    data = repair_text(data, warnings)
    try:
        return _decode_fast(path, data, bare)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        pass
    try:
        objects, header, truncated = salvage_events(data)
    except ValueError:
        raise UnreadableTraceError(path, _not_json_reason(data)) from None
    if truncated:
        warnings.append(f"input is truncated; kept the {len(objects)} complete events before "
                        "the damage")
        dropped["truncated"] = dropped.get("truncated", 0) + 1
    if not bare and not objects and not truncated and "traceEvents" not in data[:2000].decode(
            "utf-8", "replace") and not header:
        raise UnreadableTraceError(path, "not a Kineto trace (no traceEvents)")
    events = []
    for obj in objects:
        event = _convert_event(obj)
        if event is None:
            dropped["not_an_event"] = dropped.get("not_an_event", 0) + 1
        else:
            events.append(event)
    if bare and objects and not events:
        raise UnreadableTraceError(path, "not a Kineto trace (a JSON array without trace events)")
    return events, header


def _valid_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8: Arrow's check of one string over the bytes as they are
    (vectorised, no copy; ``bytes.decode`` would build the whole text)."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    try:
        pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(data)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _decode_fast(path: Path, data: bytes, bare: bool) -> tuple[list[_Event], dict[str, Any]]:
    if bare:
        return msgspec.json.decode(data, type=list[_Event]), {}
    trace = msgspec.json.decode(data, type=_Trace)
    if trace.traceEvents is None:
        if trace.nodes is not None:
            raise UnreadableTraceError(path, "a PyTorch Execution Trace, not a Kineto trace")
        raise UnreadableTraceError(path, "not a Kineto trace (no traceEvents)")
    header = {"distributedInfo": trace.distributedInfo,
              "deviceProperties": trace.deviceProperties,
              "baseTimeNanoseconds": trace.baseTimeNanoseconds, "host_name": trace.host_name}
    return trace.traceEvents, header


def _not_json_reason(data: bytes) -> str:
    head = data.lstrip()[:1]
    if head not in (b"{", b"["):
        return "not JSON (does not start with { or [)"
    return "not a Kineto trace (no traceEvents)"


def _convert_event(obj: object) -> _Event | None:
    """One salvaged event into the typed form, or None when it is not an event object."""
    if not isinstance(obj, dict):
        return None
    try:
        return msgspec.json.decode(msgspec.json.encode(obj), type=_Event)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, OverflowError):
        return None


def _pair_begin_end(events: list[_Event], dropped: dict[str, int]) -> list[_Event]:
    """Turn B/E pairs into complete (X) events, per (pid, tid) stack. Rare in Kineto output."""
    phases = set(map(attrgetter("ph"), events))
    if "B" not in phases and "E" not in phases:
        return events
    stacks: dict[tuple[Any, Any], list[_Event]] = {}
    for ev in events:
        if ev.ph == "B":
            stacks.setdefault((ev.pid, ev.tid), []).append(ev)
        elif ev.ph == "E":
            stack = stacks.get((ev.pid, ev.tid))
            if not stack:
                continue  # counted below as an unmatched end
            begin = stack.pop()
            try:
                dur_us = float(bytes(ev.ts)) - float(bytes(begin.ts))
            except ValueError:
                continue
            begin.ph, begin.dur = "X", msgspec.Raw(repr(dur_us).encode())
            ev.ph = "__merged__"
    kept = [ev for ev in events if ev.ph not in ("B", "E", "__merged__")]
    for reason, phase in (("unmatched_begin", "B"), ("unmatched_end", "E"),
                          ("end_merged_into_begin", "__merged__")):
        count = sum(1 for ev in events if ev.ph == phase)
        if count:
            dropped[reason] = dropped.get(reason, 0) + count
    return kept


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
        return pa.array(ints, type=pa.int64()), pa.nulls(len(values), pa.string())
    labels = [None if v is None or i is not None else str(v) for v, i in zip(values, ints)]
    return pa.array(ints, type=pa.int64()), pa.array(labels, type=pa.string())


def _any_column(values: list[Any], typ: pa.DataType) -> pa.Array:
    """A column from loosely typed JSON values; values of another type become null."""
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    if pa.types.is_integer(typ):
        clean = [as_int(v) for v in values]
        return pa.array([v if v is not None and -(2**63) <= v < 2**63 else None for v in clean],
                        type=typ)
    return pa.array([None if v is None else v if isinstance(v, str) else
                     msgspec.json.encode(v).decode() for v in values], type=typ)


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


def table_of(columns: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def _columns_from_structs(events: list[_Event]) -> pa.Table:
    """The raw columns of the tolerant path (same layout as the C scanner's)."""
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
