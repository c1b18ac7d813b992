"""The structure of JSON bytes without decoding them: how deep brackets nest, and where the
elements of an array begin and end.

The pure-Python readers need both to hold the bounds on one event (``_bounds.py``) before
msgspec or ``json`` decode it: a decoder given one 500 MB string builds it, and one given a
value nested 100,000 deep stops at its own recursion limit, which depends on the call stack.
Both functions work on the bytes with numpy, a chunk at a time, so their memory is bounded
by the chunk, whatever the element.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

#: Bytes looked at together when walking elements (a few arrays of this many entries).
CHUNK = 4 << 20

_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_OPENS, _CLOSES = (ord("{"), ord("[")), (ord("}"), ord("]"))  # [1]: the array's
#: Every byte but quotes and brackets, deleted to leave a fragment's structure.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_NON_SPACE = re.compile(rb"[^ \t\r\n]")


def max_depth(fragment: bytes) -> int:
    """How deep brackets nest in ``fragment`` (valid JSON text, or a prefix of it), strings
    left out: ``[{"a": [1]}]`` is 3. A cheap first look: the bytes outside quotes and
    brackets are deleted, then every pair of adjacent quotes (an empty string, or the end of
    one string and the start of the next: either way no byte changes side), which leaves
    the brackets alone unless a string holds one; :func:`elements` says which element."""
    if b"\\" in fragment:  # escaped quotes and backslashes first: neither opens nor closes
        fragment = fragment.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = np.frombuffer(fragment.translate(None, _NOT_STRUCTURE).replace(b'""', b""),
                         dtype=np.uint8)
    if not len(kept):
        return 0
    # '[' and '{' have bit 1 set, ']' and '}' do not: +1 for an opening, -1 for a closing
    step = ((kept >> 1) & 1).astype(np.int8) * 2 - 1
    if (kept == _QUOTE).any():  # a string holds a bracket: count only those outside strings
        outside = (np.cumsum(kept == _QUOTE, dtype=np.int64) & 1) == 0
        step[~outside | (kept == _QUOTE)] = 0
    return int(np.cumsum(step, dtype=np.int64).max(initial=0))


@dataclass(frozen=True)
class Element:
    """One element of an array: its bytes are ``data[start:end]``; ``depth``: how deep it
    nests (an object holding a list: 2; a number: 0)."""

    start: int
    end: int
    depth: int


class Unbalanced(ValueError):
    """The array does not close: its brackets or strings run past the end of the data."""


@dataclass
class _State:
    in_string: bool = False
    escape_next: bool = False
    depth: int = 0  # 0: between elements of the array; -1: past its closing bracket


def elements(data: bytes | mmap.mmap, pos: int, stop: int | None = None
             ) -> Iterator[Element]:
    """The elements of the array whose first byte inside its ``[`` is at ``pos``, in order;
    when it closes, a last :class:`Element` with ``start == end`` at its ``]``. With ``stop``,
    it ends at the first element boundary (the byte after a comma between elements) at or
    past ``stop`` instead, as an empty element there. Raises :class:`Unbalanced` when the
    data ends first. Values are not checked, only brackets, strings and escapes."""
    state = _State()
    boundary, deepest, at = pos, 0, pos
    size = len(data)
    while at < size:
        chunk = np.frombuffer(data[at:at + CHUNK], dtype=np.uint8)
        depth, cuts = _chunk(chunk, state)
        since = max(boundary - at, 0)  # this chunk's part of the element being read
        for cut in cuts:
            if cut > since:
                deepest = max(deepest, int(depth[since:cut].max()))
            yield from _element(data, boundary, at + cut, deepest)
            if chunk[cut] == _CLOSES[1]:
                yield Element(at + cut, at + cut, 0)
                return
            boundary, deepest, since = at + cut + 1, 0, cut + 1
            if stop is not None and boundary >= stop:
                yield Element(boundary, boundary, 0)
                return
        if since < len(chunk):
            deepest = max(deepest, int(depth[since:].max()))
        at += len(chunk)
    raise Unbalanced("the array does not close")


def _element(data: bytes | mmap.mmap, boundary: int, cut: int,
             deepest: int) -> Iterator[Element]:
    """The element between a boundary and the comma or bracket at ``cut``; none if only
    white space is there (an empty array)."""
    first = _NON_SPACE.search(data, boundary, cut)
    if first is None:
        return
    start, end = first.start(), cut
    while end > start:  # white space before the comma, a page at a time (it may be long)
        tail = data[max(start, end - 4096):end]
        kept = tail.rstrip(b" \t\r\n")
        end -= len(tail) - len(kept)
        if kept:
            break
    yield Element(start, end, deepest)


def _chunk(chunk: np.ndarray, state: _State) -> tuple[np.ndarray, list[int]]:
    """(the depth after each byte of ``chunk``, the offsets of the commas and the bracket at
    depth 0 that end elements), carrying strings, escapes and depth over to the next chunk."""
    escaped = _escaped(chunk, state)
    quotes = (chunk == _QUOTE) & ~escaped
    parity = np.cumsum(quotes, dtype=np.int64) & 1
    inside = parity.astype(bool) if not state.in_string else ~parity.astype(bool)
    opens = _any_of(chunk, _OPENS) & ~inside
    closes = _any_of(chunk, _CLOSES) & ~inside
    depth = state.depth + np.cumsum(opens.astype(np.int32) - closes, dtype=np.int64)
    ends = ((chunk == _COMMA) & ~inside & (depth == 0)) | (closes & (depth == -1))
    state.in_string = bool(inside[-1])
    state.depth = int(depth[-1])
    return depth, np.flatnonzero(ends).tolist()


def _any_of(values: np.ndarray, pair: tuple[int, int]) -> np.ndarray:
    return (values == pair[0]) | (values == pair[1])


def _escaped(chunk: np.ndarray, state: _State) -> np.ndarray:
    """Which bytes a backslash escapes (a run of backslashes escapes the byte after it when
    its length is odd); carries a run cut by the chunk's end over to the next chunk."""
    escaped = np.zeros(len(chunk), dtype=bool)
    slashes = np.flatnonzero(chunk == _BACKSLASH)
    carried, state.escape_next = state.escape_next, False
    if not len(slashes):
        if carried and len(chunk):
            escaped[0] = True
        return escaped
    breaks = np.flatnonzero(np.diff(slashes) != 1)
    starts = slashes[np.r_[0, breaks + 1]]
    stops = slashes[np.r_[breaks, len(slashes) - 1]] + 1
    lengths = stops - starts
    if carried:
        if starts[0] == 0:
            lengths[0] += 1
        else:
            escaped[0] = True
    odd = stops[(lengths & 1) == 1]
    escaped[odd[odd < len(chunk)]] = True
    state.escape_next = bool(len(odd) and odd[-1] == len(chunk))
    return escaped
