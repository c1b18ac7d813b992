"""The complete events before the damage in a Kineto file that does not decode, a window of
bytes at a time.

Salvage reads element by element with Python's ``json`` (it must stop exactly at the damage,
which msgspec does not say), so each element becomes Python objects: decoding the whole file
at once took ~12x the file (a 300 MB trace with one bad event near its end was killed at a
4 GB cap). Here the text is decoded from a window of :data:`WINDOW` bytes at a time and the
caller turns each window's objects into columns before the next, so memory is the input and
its columns, plus one window's objects. An element larger than the window grows it (up to the
bound on one event); the bounds on one event (``_bounds.py``) hold as on the other paths.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from traceview.parsers.kineto._bounds import (
    MAX_EVENT_BYTES,
    MAX_EVENT_DEPTH,
    TOO_DEEP,
    TOO_LARGE,
    over_bound,
)
from traceview.parsers.kineto._structure import Unbalanced, elements, max_depth

#: Bytes of the events array decoded into Python objects at a time (~10x that in objects).
WINDOW = 4 << 20

_NON_SPACE = re.compile(r"[^ \t\r\n]")
_NON_SPACE_BYTES = re.compile(rb"[^ \t\r\n]")
#: Top-level keys read from a damaged file (they usually precede the events).
HEADER_KEYS = ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "host_name")


class Salvage:
    """The events array of ``data`` (JSON bytes, possibly damaged) read element by element:
    :meth:`batches` yields the decoded elements (any JSON value) a window at a time, then
    ``truncated`` says whether damage ended it, and ``skipped`` counts the elements over a
    bound on one event, by reason. ``header``: the top-level values in :data:`HEADER_KEYS`
    that decode (an empty dict for a bare array). Raises ValueError when there is no events
    array."""

    def __init__(self, data: bytes, resume_at: int | None = None) -> None:
        self.data = data
        self.truncated = False
        self.skipped: dict[str, int] = {}
        self.bare = False
        self.header: dict[str, Any] = {}
        if resume_at is not None:
            # read on from byte ``resume_at`` (an element, or the comma after one), as the
            # salvage of the whole array goes on past the elements before it; no header
            self._start = resume_at
            return
        first = _NON_SPACE_BYTES.search(data)
        self.bare = first is not None and data[first.start():first.start() + 1] == b"["
        if self.bare:
            self._start = first.start() + 1
            return
        key = data.find(b'"traceEvents"')
        opening = data.find(b"[", key) if key >= 0 else -1
        if opening < 0:
            raise ValueError("no traceEvents array")
        self.header = _header(data)
        self._start = opening + 1

    def batches(self) -> Iterator[list[Any]]:
        """The elements, in order, one window's worth at a time."""
        data, size, pos, span = self.data, len(self.data), self._start, WINDOW
        decoder = json.JSONDecoder()
        while True:
            end = _char_start(data, min(size, pos + span))
            window = data[pos:end]
            text = window.decode("utf-8", errors="replace")
            plain = len(text) == len(window)  # one byte a character: offsets agree
            deep = max_depth(window) > MAX_EVENT_DEPTH
            batch: list[Any] = []
            i, n = 0, len(text)
            seen, seen_bytes = 0, 0  # a character index and its byte offset in the window
            while True:
                found = _NON_SPACE.search(text, i)
                i = n if found is None else found.start()
                if i >= n:
                    if end >= size:
                        self.truncated = True
                        yield batch
                        return
                    pos, span = end, WINDOW  # the next window starts here
                    break
                if text[i] == "]":
                    yield batch
                    return
                if text[i] == ",":
                    i += 1
                    continue
                if not plain:  # each character encoded once: the offsets move forward
                    seen_bytes += len(text[seen:i].encode())
                    seen = i
                at = pos + (i if plain else seen_bytes)
                try:
                    value, j = decoder.raw_decode(text, i)
                    complete = j < n or end >= size  # a number may go on past the window
                except (json.JSONDecodeError, RecursionError) as exc:
                    complete = False
                    if data.find(b"\x00", at, end) >= 0:
                        # a NUL byte is in no JSON text, not even a string: damage (a file
                        # preallocated and never written, 40 GiB of NUL were read to the end)
                        self.truncated = True
                        yield batch
                        return
                    if isinstance(exc, RecursionError) or end >= size \
                            or end - at > MAX_EVENT_BYTES:
                        # no larger window helps: an element over a bound, or the damage
                        resume = self._past_element(at)
                        if resume is None:
                            self.truncated = True
                            yield batch
                            return
                        pos, span = resume, WINDOW
                        break
                if not complete:
                    # the next window starts at this element; twice as large when it
                    # started this one, so a long element costs a few windows, not many
                    span = span * 2 if at == pos else WINDOW
                    pos = at
                    break
                length = j - i if plain else len(text[i:j].encode())
                reason = over_bound(length, max_depth(data[at:at + length]) if deep else 0)
                if reason:
                    self.skipped[reason] = self.skipped.get(reason, 0) + 1
                else:
                    batch.append(value)
                i = j
            yield batch

    def _past_element(self, at: int) -> int | None:
        """After an element at ``at`` that does not decode: where reading goes on when it is
        over a bound on one event (counted), else None (the damage: reading stops)."""
        try:
            walk = elements(self.data, at, at + 1)
            element = next(walk)
            after = next(walk)  # the next boundary, or the array's end
        except (Unbalanced, StopIteration):
            return None
        reason = over_bound(element.end - element.start, element.depth)
        if reason is None:
            return None
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        return after.start


def ends_in_damage(data: bytes, start: int) -> bool:
    """Whether the events array of ``data`` from byte ``start`` (where an element, or the comma
    after one, begins) holds no complete element, only damage: then the salvage of the whole
    array ends with exactly the elements before ``start``. The C scanner's rows before a
    failure are kept when this holds (``_parse._fast_columns``)."""
    salvage = Salvage(data, resume_at=start)
    return not any(salvage.batches()) and salvage.truncated and not salvage.skipped


def truncation_warning(kept: int) -> str:
    """The warning of a trace read up to its damage (either path says it the same way)."""
    return f"input is truncated; kept the {kept} complete events before the damage"


def _char_start(data: bytes, end: int) -> int:
    """``end`` moved back to the start of a UTF-8 character (a window never splits one)."""
    back = end
    while back > end - 4 and back > 0 and back < len(data) and 0x80 <= data[back] < 0xC0:
        back -= 1
    return back if back > end - 4 else end


def _header(data: bytes) -> dict[str, Any]:
    """Top-level keys other than traceEvents, where their first mention is followed by a value
    that decodes within the bound on one event."""
    decoder = json.JSONDecoder()
    header: dict[str, Any] = {}
    for key in HEADER_KEYS:
        at = data.find(f'"{key}"'.encode())
        if at < 0:
            continue
        colon = data.find(b":", at)
        first = _NON_SPACE_BYTES.search(data, colon + 1) if colon >= 0 else None
        if first is None:
            continue
        text = data[first.start():first.start() + MAX_EVENT_BYTES].decode("utf-8", "replace")
        try:
            header[key], _ = decoder.raw_decode(text)
        except (json.JSONDecodeError, RecursionError):
            continue
    return header


__all__ = ["HEADER_KEYS", "TOO_DEEP", "TOO_LARGE", "WINDOW", "Salvage", "ends_in_damage",
           "truncation_warning"]
