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
import re
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from traceview.errors import UnreadableTraceError
from traceview.parsers.kineto._bounds import MAX_EVENT_BYTES, MAX_EVENT_DEPTH, TOO_LARGE
from traceview.parsers.kineto._events import Event, columns_of, valid_utf8
from traceview.parsers.kineto._input import read_bytes, repair_text
from traceview.parsers.kineto._salvage import Salvage, truncation_warning
from traceview.parsers.kineto._stream import (
    BatchedColumns,
    Column,
    has_begin_end,
    read_streamed,
)
from traceview.parsers.kineto._structure import max_depth


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
    return _decode(path, data, warnings, dropped)


class _Trace(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None
    nodes: Any = None  # present in PyTorch Execution Traces, which are not Kineto traces


#: Raw events decoded together on the whole-file path (one join of their bytes at a time).
_DECODE_BATCH = 16384

_DECLINED = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


def _decode(path: Path, data: bytes, warnings: list[str], dropped: dict[str, int]
            ) -> tuple[dict[str, Column], int, dict[str, Any], int]:
    """The whole-file reader (B/E pairs, values of the wrong type), then, for what does not
    decode, the salvage of every complete event before the damage."""
    first = _first_byte(data)
    bare = data[first:first + 1] == b"["
    whole = _decoded_whole(path, data, bare, dropped)
    if whole is None:
        repaired = repair_text(data, warnings)
        if repaired is not data:
            data = repaired
            whole = _decoded_whole(path, data, bare, dropped)
    if whole is not None:
        events, header = whole
        input_events = len(events) + sum(dropped.values())
        table = columns_of(_pair_begin_end(events, dropped))
        del events
        return dict(zip(table.column_names, table.columns)), table.num_rows, header, input_events
    return _salvaged(path, data, bare, warnings, dropped)


def _first_byte(data: bytes) -> int:
    found = _NON_SPACE.search(data)
    return found.start() if found else len(data)


_NON_SPACE = re.compile(rb"[^ \t\r\n]")


def _decoded_whole(path: Path, data: bytes, bare: bool, dropped: dict[str, int]
                   ) -> tuple[list[Event], dict[str, Any]] | None:
    """:func:`_decode_whole`, or None when the input does not decode as it is."""
    try:
        return _decode_whole(path, data, bare, dropped)
    except _DECLINED:
        dropped.pop(TOO_LARGE, None)  # counted again by whichever reader goes on
        return None


def _decode_whole(path: Path, data: bytes, bare: bool, dropped: dict[str, int]
                  ) -> tuple[list[Event], dict[str, Any]] | None:
    """Every event of well-formed JSON at once, those over a bound on one event skipped
    (counted in ``dropped``); None when an event may nest deeper than the bound (the
    salvage finds which)."""
    if max_depth(data) > MAX_EVENT_DEPTH + (1 if bare else 2):  # + the array (and document)
        return None
    if bare:
        raws, header = msgspec.json.decode(data, type=list[msgspec.Raw]), {}
    else:
        trace = msgspec.json.decode(data, type=_Trace)
        if trace.traceEvents is None:
            if trace.nodes is not None:
                raise UnreadableTraceError(path, "a PyTorch Execution Trace, not a Kineto trace")
            raise UnreadableTraceError(path, "not a Kineto trace (no traceEvents)")
        raws, header = trace.traceEvents, {
            "distributedInfo": trace.distributedInfo,
            "deviceProperties": trace.deviceProperties,
            "baseTimeNanoseconds": trace.baseTimeNanoseconds, "host_name": trace.host_name}
    kept = [raw for raw in raws if len(raw) <= MAX_EVENT_BYTES]
    if len(kept) < len(raws):
        dropped[TOO_LARGE] = len(raws) - len(kept)
    del raws
    events: list[Event] = []
    for at in range(0, len(kept), _DECODE_BATCH):
        events += msgspec.json.decode(b"[" + b",".join(kept[at:at + _DECODE_BATCH]) + b"]",
                                      type=list[Event])
    return events, header


def _salvaged(path: Path, data: bytes, bare: bool, warnings: list[str],
              dropped: dict[str, int]) -> tuple[dict[str, Column], int, dict[str, Any], int]:
    """Every complete event before the damage, turned into columns a window at a time
    (``_salvage.py``); B/E pairs, which may span windows, are paired over all of them."""
    try:
        salvage = Salvage(data)
        built: BatchedColumns | None = BatchedColumns()
        decoded, events, not_events = 0, 0, 0
        for objects in salvage.batches():
            batch = _events_of(objects)
            decoded, events, not_events = (decoded + len(objects), events + len(batch),
                                           not_events + len(objects) - len(batch))
            if has_begin_end(batch):
                built = None
                break
            if batch:
                built.add(batch)
        if built is None:  # read again, keeping every event for the pairing
            salvage = Salvage(data)
            every = [e for objects in salvage.batches() for e in _events_of(objects)]
    except ValueError:
        raise UnreadableTraceError(path, _not_json_reason(data)) from None
    if salvage.truncated:
        warnings.append(truncation_warning(decoded))
        dropped["truncated"] = dropped.get("truncated", 0) + 1
    if not bare and not decoded and not salvage.truncated and "traceEvents" not in data[
            :2000].decode("utf-8", "replace") and not salvage.header:
        raise UnreadableTraceError(path, "not a Kineto trace (no traceEvents)")
    if bare and decoded and not events:
        raise UnreadableTraceError(path, "not a Kineto trace (a JSON array without trace events)")
    if not_events:
        dropped["not_an_event"] = dropped.get("not_an_event", 0) + not_events
    for reason, count in salvage.skipped.items():
        dropped[reason] = dropped.get(reason, 0) + count
    if built is None:
        input_events = len(every) + sum(dropped.values())
        table = columns_of(_pair_begin_end(every, dropped))
        del every
    elif not built.rows:
        input_events, table = sum(dropped.values()), columns_of([])
    else:
        return built.columns(), built.rows, salvage.header, built.rows + sum(dropped.values())
    return (dict(zip(table.column_names, table.columns)), table.num_rows, salvage.header,
            input_events)


def _events_of(objects: list[Any]) -> list[Event]:
    """The salvaged values that are events, typed."""
    return [event for event in map(_convert_event, objects) if event is not None]


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
