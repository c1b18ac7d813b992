"""The bounds on one Kineto event, the same on every path (docs/formats.md, "Bounds").

Real events are a few hundred bytes; the largest seen are kernel names of some KB and ``args``
of a few MB (shapes, concrete inputs), nested a handful of levels. One event of 500 MB, or one
nested 100,000 levels deep, is an attack or damage: it is skipped, counted, and said in a
warning, and the rest of the file is read. The C scanner takes these numbers as arguments, so
this module is their one definition.
"""

from __future__ import annotations

#: The most bytes one element of the events array may span in the file, from its ``{`` to its
#: ``}`` (its strings, the name and every ``args`` value, lie inside it, so this bounds them too).
MAX_EVENT_BYTES = 32 << 20

#: The deepest one event may nest: its own object is level 1, ``args`` level 2, a list in
#: ``args`` level 3. Kineto writes at most ~6; the bound stays far below the decoders' own
#: recursion limits (msgspec's and Python's ~1000, which depend on the call stack, and
#: Polars' JSON functions over ``args_json``, 128), so every path decides alike.
MAX_EVENT_DEPTH = 64

#: ``dropped`` keys of events skipped for a bound (the warning says which bound).
TOO_LARGE = "event_over_size_bound"
TOO_DEEP = "event_over_depth_bound"


def over_bound(size: int, depth: int) -> str | None:
    """Which bound an element of ``size`` bytes nesting ``depth`` deep is over (size first,
    as the C scanner counts it), or None."""
    if size > MAX_EVENT_BYTES:
        return TOO_LARGE
    if depth > MAX_EVENT_DEPTH:
        return TOO_DEEP
    return None


def skipped_warnings(dropped: dict[str, int]) -> list[str]:
    """One warning per bound that made events be skipped (none when none were)."""
    out = []
    if n := dropped.get(TOO_LARGE):
        out.append(f"{n} events larger than {MAX_EVENT_BYTES >> 20} MiB skipped (the bound on "
                   "one event; docs/formats.md, Bounds)")
    if n := dropped.get(TOO_DEEP):
        out.append(f"{n} events nested deeper than {MAX_EVENT_DEPTH} levels skipped (the bound "
                   "on one event; docs/formats.md, Bounds)")
    return out
