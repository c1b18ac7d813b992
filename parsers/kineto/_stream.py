"""Well-formed Kineto JSON read by the pure-Python path a batch at a time.

Where the C scanner is missing, the events array is cut into batches of about
:data:`STREAM_BYTES` straight from the bytes (a regular expression finds where an event may
end; no Python object per event), each batch decoded with msgspec and turned into compact
columns (a column no event fills is not allocated, rare ones are (row, value) pairs, repeating
text is dictionary-encoded), and, from a memory map, each batch's pages handed back once read.
So neither the decoded events nor the input are ever whole in memory. Anything unusual gives
``None`` and the whole-file reader (``_tolerant.py``) decides.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from traceview.parsers.kineto._bounds import MAX_EVENT_BYTES, MAX_EVENT_DEPTH, over_bound
from traceview.parsers.kineto._columns import Sparse, SparseText
from traceview.parsers.kineto._events import REPEATING_TEXT, Event, columns_of, valid_utf8
from traceview.parsers.kineto._structure import Unbalanced, elements, max_depth

#: Bytes of the events array turned into Python objects at a time on the streamed path. The
#: objects of a whole trace took ~8x the file in memory (a 63 MB trace peaked at 581 MB); a
#: batch of 4 MB (~16 k events) is a few MB of them.
STREAM_BYTES = 4 << 20


#: Where the events array opens in an object trace, and where one event may end and the next
#: begin (group 1: the comma between them).
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_END = re.compile(rb"\}\s*(,)\s*\{")
#: msgspec's word for a complete value with more after it (and the byte after the first extra)
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


#: Whether this platform's memory maps can hand pages back (``madvise``: not on Windows).
_CAN_HAND_BACK = hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")

#: Cuts tried in a row before the stream gives up on a batch: a cut that lands inside a string
#: or a nested value fails to decode and the batch grows to the next candidate.
_CUT_TRIES = 8


class _Header(msgspec.Struct):
    """A Kineto trace's top-level values, decoded with its events array left empty."""

    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None
    nodes: Any = None


class _GiveUp(Exception):
    """Anything the streamed path does not read: the whole-file path decides."""


#: A column of the stream: chunks (one per batch), (row, value) pairs, or None (no value).
Column = pa.ChunkedArray | Sparse | SparseText | None


def read_streamed(data: bytes | mmap.mmap, release: bool
                  ) -> tuple[dict[str, Column], int, dict[str, Any], dict[str, int]] | None:
    """Well-formed input, decoded a batch of events at a time straight from the bytes: the raw
    columns (compact, as the C scanner holds them: see :func:`_joined`), their length, the
    header and the events skipped for a bound on one event, by reason (``_bounds.py``: such
    an event is found by its structure and never decoded); None (the caller's whole-file
    path decides) for anything else: invalid UTF-8,
    damage, begin/end pairs (a pair may span two batches), no events, not a Kineto trace.

    The events array is cut at a comma between a closing and an opening brace, found by a
    regular expression, never by a Python object per event. A cut is only trusted because
    both batches beside it decode: a batch that starts at an event boundary and ends inside a
    string or a nested value cannot decode once a ``]`` is appended, so every accepted cut
    lies between two events. Where the array ends is found the same way: the batch holding
    its closing bracket decodes to a complete list with more after it (the header's tail may
    hold arrays and objects too: ``deviceProperties``, logs). With ``release``, each batch's
    pages are handed back once it is read, so the input is never resident whole beside the
    columns.
    """
    try:
        start, head = _events_start(data)
        built = BatchedColumns()
        stop, skipped = None, {}
        for events, stop in _event_batches(data, start, release, skipped):
            if has_begin_end(events):
                return None
            built.add(events)
        header = _header(data, head, stop)
    except (_GiveUp, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    if not built.rows:
        return None
    return built.columns(), built.rows, header, skipped


def has_begin_end(events: list[Event]) -> bool:
    """Whether B/E events are among ``events`` (a pair may span two batches: their reader
    pairs them over the whole file)."""
    return any(e.ph in ("B", "E") for e in events)


class BatchedColumns:
    """Raw columns built a batch of events at a time, in the scanner's compact form."""

    def __init__(self) -> None:
        self.rows = 0
        self._pieces: dict[str, list[tuple[int, Piece]]] = {}

    def add(self, events: list[Event]) -> None:
        table = columns_of(events)
        for name, column in zip(table.column_names, table.columns):
            self._pieces.setdefault(name, []).append((len(events),
                                                      _compact(name, column, self.rows)))
        self.rows += len(events)

    def columns(self) -> dict[str, Column]:
        """The batches joined, by column name (see :func:`_joined`)."""
        return {name: _joined(name, parts, self.rows) for name, parts in self._pieces.items()}


def _events_start(data: bytes | mmap.mmap) -> tuple[int, bytes | None]:
    """(the first byte inside the events array, the bytes before it up to its ``[`` for an
    object trace; None for a bare array of events)."""
    first = re.compile(rb"\S").search(data)
    if first is None:
        raise _GiveUp
    if data[first.start():first.start() + 1] == b"[":
        return first.start() + 1, None
    opening = _EVENTS_KEY.search(data)
    if opening is None:
        raise _GiveUp
    return opening.end(), data[:opening.end()]  # a copy: the map's pages may be handed back


def _header(data: bytes | mmap.mmap, head: bytes | None, stop: int | None) -> dict[str, Any]:
    """The top-level values around the events array (its closing bracket at ``stop``),
    decoded with the array left empty; checks that nothing but them is there."""
    if stop is None:
        raise _GiveUp  # the array never closed
    if head is None:
        if data[stop + 1:].strip():
            raise _GiveUp
        return {}
    trace = msgspec.json.decode(head + data[stop:], type=_Header)
    if trace.nodes is not None:
        raise _GiveUp  # an Execution Trace
    return {"distributedInfo": trace.distributedInfo, "deviceProperties": trace.deviceProperties,
            "baseTimeNanoseconds": trace.baseTimeNanoseconds, "host_name": trace.host_name}


def _event_batches(data: bytes | mmap.mmap, start: int, release: bool,
                   skipped: dict[str, int]) -> Iterator[tuple[list[Event], int | None]]:
    """The events from ``data[start]`` (just inside the array's ``[``) on, about
    ``STREAM_BYTES`` of them at a time, each batch with the array's closing bracket when it
    holds the last event (else None). A batch that may hold an event over a bound (it spans
    more than an event may, or nests deeper) is walked by its structure instead
    (:func:`_walked`), which counts such events in ``skipped`` and leaves them undecoded."""
    handed_back = start - start % mmap.PAGESIZE
    release = release and _CAN_HAND_BACK
    size = len(data)
    while True:
        aim, tries = start + STREAM_BYTES, 0
        walk: int | None = None  # where the structural walk stops, when one is needed
        while True:
            found = _EVENT_END.search(data, aim) if aim < size else None
            cut = size if found is None else found.start(1)
            if cut - start > MAX_EVENT_BYTES:
                walk = start + STREAM_BYTES  # the batch would hold an event over the bound
                break
            batch = b"[" + data[start:cut] + b"]"
            if not valid_utf8(batch):
                raise _GiveUp  # the caller repairs the whole input first
            if max_depth(batch) > MAX_EVENT_DEPTH + 1:  # + 1: the batch's own brackets
                walk = cut
                break
            try:
                events = msgspec.json.decode(batch, type=list[Event])
                break
            except msgspec.DecodeError as exc:
                last = _last_batch(batch, exc)
                if last is not None:
                    events, closed = last
                    stop = start + closed - 1  # batch[i] is data[start + i - 1]
                    if data[stop:stop + 1] != b"]":
                        raise _GiveUp from None
                    yield events, stop
                    return
                tries += 1
                if cut == size or tries == _CUT_TRIES:
                    raise
                aim = cut + 1
        if walk is not None:
            events, cut, stop = _walked(data, start, walk, skipped)
            yield events, stop
            if stop is not None:
                return
            cut -= 1  # the next batch starts after the comma at cut
        elif cut == size:
            raise _GiveUp  # the whole rest decoded as events: no closing bracket
        else:
            yield events, None
        start = cut + 1
        if release:  # the pages before the next batch are read: give them back
            upto = start - start % mmap.PAGESIZE
            if upto > handed_back:
                data.madvise(mmap.MADV_DONTNEED, handed_back, upto - handed_back)
                handed_back = upto


def _walked(data: bytes | mmap.mmap, start: int, until: int, skipped: dict[str, int]
            ) -> tuple[list[Event], int, int | None]:
    """The events from ``start`` to the first element boundary at or past ``until``, found
    by their structure (``_structure.elements``), those over a bound counted in ``skipped``
    and never copied or decoded: (the events, the boundary, the array's closing bracket when
    it came first, else None)."""
    kept: list[bytes] = []
    try:
        for element in elements(data, start, until):
            if element.start == element.end:  # the array's end, or the boundary
                closed = data[element.start:element.start + 1] == b"]"
                events = msgspec.json.decode(b"[" + b",".join(kept) + b"]", type=list[Event])
                return events, element.start, element.start if closed else None
            reason = over_bound(element.end - element.start, element.depth)
            if reason:
                skipped[reason] = skipped.get(reason, 0) + 1
            else:
                kept.append(data[element.start:element.end])
    except Unbalanced:
        raise _GiveUp from None
    raise _GiveUp  # elements() always ends with an empty element or raises


def _last_batch(batch: bytes, exc: msgspec.DecodeError) -> tuple[list[Event], int] | None:
    """When ``batch`` (``[`` + events...) holds the array's end, its events and the index of
    the closing bracket in it: msgspec read a complete list and met more after it (its
    message gives the byte after the first trailing one). None for any other failure."""
    found = _TRAILING.search(str(exc))
    if found is None:
        return None
    complete = batch[:int(found.group(1)) - 1].rstrip()
    return msgspec.json.decode(complete, type=list[Event]), len(complete) - 1


#: One batch's column: an array, (row, value) pairs for few values, or None for none.
Piece = pa.Array | Sparse | SparseText | None


def _is_rare(values: int, rows: int) -> bool:
    """Few enough values (at most 1 row in 8) to hold as (row, value) pairs, as the scanner
    does: a dense int64 column costs 8 bytes a row, the pairs 12 bytes a value."""
    return values * 8 <= rows


def _compact(name: str, column: pa.ChunkedArray, first_row: int) -> Piece:
    """One batch's column as the scanner would hold it: None without a value (most
    per-collective and memory columns), (row, value) pairs for few values, repeating text
    dictionary-encoded. ``first_row``: the batch's first row in the whole column."""
    array = column.combine_chunks()
    values = len(array) - array.null_count
    if not values:
        return None
    if name in REPEATING_TEXT:
        array = array.dictionary_encode()
        return SparseText.of(array, first_row) if _is_rare(values, len(array)) else array
    if pa.types.is_integer(array.type) and _is_rare(values, len(array)):
        return Sparse.of(array, first_row)
    return array


def _joined(name: str, parts: list[tuple[int, Piece]], rows: int) -> Column:
    """A column's batches joined: None when no batch had a value; (row, value) pairs when few
    rows have one (integers, repeating text); else one chunk per batch (nulls where a batch
    had no value; the caller unifies the dictionaries of text)."""
    given = [piece for _, piece in parts if piece is not None]
    if not given:
        return None
    values = sum(len(p.rows) if isinstance(p, (Sparse, SparseText)) else len(p) - p.null_count
                 for p in given)
    text = name in REPEATING_TEXT
    if _is_rare(values, rows) and (text or isinstance(given[0], Sparse)
                                   or pa.types.is_integer(given[0].type)):
        offsets = np.cumsum([0] + [n for n, _ in parts])
        as_pairs = [p if isinstance(p, (Sparse, SparseText)) else
                    (SparseText if text else Sparse).of(p, int(offsets[i]))
                    for i, (_, p) in enumerate(parts) if p is not None]
        return (SparseText if text else Sparse).concat(as_pairs)
    typ = pa.dictionary(pa.int32(), pa.string()) if text else next(
        p.type for p in given if isinstance(p, pa.Array))
    chunks, first = [], 0
    for n, piece in parts:
        chunks.append(pa.nulls(n, typ) if piece is None else
                      piece.dense(first, first + n) if isinstance(piece, (Sparse, SparseText))
                      else piece)
        first += n
    return pa.chunked_array(chunks, typ)
