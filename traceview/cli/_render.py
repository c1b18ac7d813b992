"""How every command prints: one table formatter for text, and ``--json`` / ``--csv``.

Text is for people: numbers are pre-formatted by the command with the helpers here (``ms``,
``us``, ``pct``, ``duration``), a missing value shows as ``-`` and a long name is cut with
``…`` so a table stays one screen wide. ``--json`` and ``--csv`` are for programs and come
from the :class:`~traceview.result.Result` untouched.

>>> print(table(["rank", "name", "total_ms"], [[0, "ncclAllReduce", ms(1_500_000)],
...                                            [1, None, None]], left={"name"}))
rank  name           total_ms
   0  ncclAllReduce     1.500
   1  -                     -
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import Any


#: A text cell longer than this is cut (kernel names can run to thousands of characters).
MAX_WIDTH = 60
MISSING = "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
          left: Collection[str] = (), max_width: int | None = MAX_WIDTH) -> str:
    """Columns two spaces apart, each as wide as its widest cell; right-aligned (numbers)
    unless its header is in ``left``. A cell: ``None`` shows as ``-``, anything else as
    ``str()`` cut to ``max_width`` characters (None: never cut, for tables of notes)."""
    cells = [[cut(cell(v), max_width or len(cell(v))) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    aligns = [str.ljust if h in left else str.rjust for h in headers]

    def line(row: Sequence[str]) -> str:
        return "  ".join(align(c, w) for c, w, align in zip(row, widths, aligns)).rstrip()

    return "\n".join([line(headers), *map(line, cells)])


def cell(value: Any) -> str:
    return MISSING if value is None else str(value)


def cut(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters, the last one ``…`` when it was longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def short(text: str | None, width: int = 40) -> str:
    """A kernel or op name for a table: ``-`` when there is none, cut to ``width``."""
    return cut(text, width) if text else MISSING


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds, three decimals."""
    return MISSING if ns is None else f"{ns / 1e6:.3f}"


def us(ns: float | None) -> str:
    """Nanoseconds as microseconds, one decimal."""
    return MISSING if ns is None else f"{ns / 1e3:.1f}"


def fixed(value: float | None, decimals: int) -> str | None:
    """``value`` with ``decimals`` places; None stays None (a table shows ``-``)."""
    return None if value is None else f"{value:.{decimals}f}"


def pct(fraction: float | None) -> str:
    return MISSING if fraction is None else f"{100 * fraction:.1f}%"


def duration(ns: int | None) -> str:
    """A bucket bound in its largest whole unit (``10us``, ``1.5ms``); None is unbounded."""
    if ns is None:
        return "inf"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:g}{unit}"
    return f"{ns}ns"


# ----------------------------------------------------------------------------- for programs
def warn(message: str) -> None:
    print(f"traceview: warning: {message}", file=sys.stderr)


def emit_result(result: Any, args: argparse.Namespace) -> bool:
    """Print ``result`` (a :class:`~traceview.result.Result`) as ``--json`` or ``--csv``
    when asked (True), after its warnings on stderr; False when the command should render
    its text."""
    for warning in result.warnings:
        warn(warning)
    if getattr(args, "json", False):
        sys.stdout.write(result.to_json().decode() + "\n")
        return True
    if getattr(args, "csv", False):
        sys.stdout.write(result.to_csv())
        return True
    return False


def dumps(obj: Any) -> str:
    """JSON text for the ``--json`` of commands without a Result (``result.json_bytes``)."""
    from traceview.result import json_bytes

    return json_bytes(obj).decode()


def emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
