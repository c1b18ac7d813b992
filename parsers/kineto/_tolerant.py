"""The tolerant reader of Kineto JSON: damaged or unusual input the C scanner declines.

Truncated writes, NaN/Infinity tokens, invalid UTF-8, values of the wrong type, B/E pairs,
times in exponent notation: the bytes are repaired where they can be, decoded with msgspec
(``args`` left raw, then the few keys that become columns decoded all at once), complete events
salvaged from a truncated array, and every entry that cannot be stored counted by reason.
Well-formed input is read in batches by ``_stream.py`` first. The result has the C scanner's
column layout, so ``_parse`` treats both alike (tests assert that both paths store identical
tables on corpus traces).
"""

from __future__ import annotations

import mmap
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from traceview.errors import UnreadableTraceError
from traceview.parsers.kineto._events import Event, columns_of, valid_utf8
from traceview.parsers.kineto._input import read_bytes, repair_text, salvage_events
from traceview.parsers.kineto._stream import Column, read_streamed


def read_events(path: Path, data: bytes | mmap.mmap, warnings: list[str],
                dropped: dict[str, int], *, release: bool = False
                ) -> tuple[dict[str, Column], int, dict[str, Any], int]:
    """(raw columns as the scanner lays them out, by name, None for a column without a
    value; their length; the header values; entries in the input). The columns come in a
    dict the caller owns, so it can release each one as it converts it.

    ``release``: ``data`` is a memory map of the file whose pages may be handed back as they
    are read (the streamed path then never holds the whole input); the file is read again
    if the stream gives up."""
    streamed = read_streamed(data, release)
    if streamed is None:
        if release or not isinstance(data, bytes):
            data = read_bytes(path, warnings)
        if not valid_utf8(data):
            # msgspec checks the strings it decodes, not the raw ``args`` either path keeps,
            # which would reach the store's text columns as invalid UTF-8
            data = repair_text(data, warnings)
            streamed = read_streamed(data, False)
    if streamed is not None:
        columns, rows, header, skipped = streamed
        dropped.update(skipped)
        return columns, rows, header, rows + sum(skipped.values())
    events, header = _decode(path, data, warnings, dropped)
    input_events = len(events) + sum(dropped.values())
    table = columns_of(_pair_begin_end(events, dropped))
    del events
    return dict(zip(table.column_names, table.columns)), table.num_rows, header, input_events


class _Trace(msgspec.Struct):
    traceEvents: list[Event] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None
    nodes: Any = None  # present in PyTorch Execution Traces, which are not Kineto traces


def _decode(path: Path, data: bytes, warnings: list[str],
            dropped: dict[str, int]) -> tuple[list[Event], dict[str, Any]]:
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


def _decode_fast(path: Path, data: bytes, bare: bool) -> tuple[list[Event], dict[str, Any]]:
    if bare:
        return msgspec.json.decode(data, type=list[Event]), {}
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


def _convert_event(obj: object) -> Event | None:
    """One salvaged event into the typed form, or None when it is not an event object."""
    if not isinstance(obj, dict):
        return None
    try:
        return msgspec.json.decode(msgspec.json.encode(obj), type=Event)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, OverflowError):
        return None


def _pair_begin_end(events: list[Event], dropped: dict[str, int]) -> list[Event]:
    """Turn B/E pairs into complete (X) events, per (pid, tid) stack. Rare in Kineto output."""
    phases = set(map(attrgetter("ph"), events))
    if "B" not in phases and "E" not in phases:
        return events
    stacks: dict[tuple[Any, Any], list[Event]] = {}
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
