"""How every command prints: one table formatter for text, and ``--json`` / ``--csv``.

Text is for people: numbers are pre-formatted by the command with the helpers here (``ms``,
``us``, ``pct``, ``duration``), a missing value shows as ``-`` and a long name is cut with
``…`` so a table stays one screen wide. ``--json`` and ``--csv`` are for programs and come
from the :class:`~traceview.run.result.Result` untouched.

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

from traceview.analyses.spread import MANY_RANKS, distribution, outliers
from traceview.cli import _answers as answers
from traceview.cli._streams import takes_utf8, unguarded, warning_line
from traceview.outputs.safe_text import ascii_json, printable
from traceview.run.result import json_bytes

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
    """A value as table text: a name's control characters, tabs and newlines as escapes
    (``safe_text.printable``), so a row stays one line and a name cannot drive the terminal."""
    return MISSING if value is None else printable(str(value))


def cut(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters, the last one ``…`` when it was longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def short(text: str | None, width: int = 40) -> str:
    """A kernel or op name for a table: ``-`` when there is none, cut to ``width``."""
    return cut(printable(text), width) if text else MISSING


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
    print(warning_line(message), file=sys.stderr)


def emit_result(result: Any, args: argparse.Namespace) -> bool:
    """Print ``result`` (a :class:`~traceview.run.result.Result`) as ``--json`` or ``--csv``
    when asked (True), after its warnings on stderr (in plain words, each once; in full with
    ``--verbose``); False when the command should render its text."""
    lines = [warning_line(w) for w in warnings_for(result, args)]
    for line in lines:
        print(line, file=sys.stderr)
    if getattr(args, "json", False):
        text = _json_text(result.to_json().decode())
    elif getattr(args, "csv", False):
        text = result.to_csv()  # exact names; backslashreplace'd where the output's
    else:                       # encoding lacks one
        return False
    unguarded(sys.stdout).write(text)
    answers.printed(args, result, lines, text)
    return True


def warnings_for(result: Any, args: argparse.Namespace) -> list[str]:
    """The warnings a person reads: plain words, or every technical line with --verbose."""
    return list(result.warnings) if getattr(args, "verbose", False) else result.plain_warnings


def _write_json(text: str) -> None:
    """JSON to stdout past the guard (exact names)."""
    unguarded(sys.stdout).write(_json_text(text))


def _json_text(text: str) -> str:
    """A JSON document as written: all ASCII where stdout cannot encode UTF-8 (a backslash
    escape of the stream's own would not be JSON)."""
    return (text if takes_utf8(sys.stdout) else ascii_json(text)) + "\n"


def dumps(obj: Any) -> str:
    """JSON text for the ``--json`` of commands without a Result (``result.json_bytes``)."""
    return json_bytes(obj).decode()


def emit_json(obj: Any) -> None:
    _write_json(dumps(obj))


# ------------------------------------------------------------------ many ranks, many rows
#: A text table longer than this prints its distribution and its outliers unless --all.
MAX_ROWS = 64


def is_many(df: Any, args: argparse.Namespace) -> bool:
    """True when ``df`` (a table with a ``rank`` column) is too long to print whole: more
    than ``analyses.spread.MANY_RANKS`` ranks or ``MAX_ROWS`` rows, and no ``--all``."""
    if getattr(args, "all", False) or df.height == 0:
        return False
    return df.get_column("rank").n_unique() > MANY_RANKS or df.height > MAX_ROWS


def spread(df: Any, metrics: Sequence[tuple[str, str, Any]], what: str = "ranks") -> str:
    """The distribution of each metric over the rows of ``df`` (``metrics``: column, name,
    formatter): median, p90, max, the rank holding the max, the outlier ranks
    (``analyses.spread.distribution``)."""
    d = distribution(df, [c for c, _, _ in metrics])
    fmt = {c: (name, f) for c, name, f in metrics}
    rows = [[fmt[r["metric"]][0], fmt[r["metric"]][1](r["median"]),
             fmt[r["metric"]][1](r["p90"]), fmt[r["metric"]][1](r["max"]), r["max_rank"],
             ranks_text(r["outlier_ranks"])] for r in d.iter_rows(named=True)]
    return (f"Across {df.height} {what}: median, p90, max and the rank of the max; outliers "
            "by the robust rule of docs/metrics.md\n"
            + table(["metric", "median", "p90", "max", "max_rank", "outlier_ranks"], rows,
                    left={"metric", "outlier_ranks"}, max_width=None))


def outlier_ranks(df: Any, columns: Sequence[str]) -> list[int]:
    """The ranks that are outliers in any of ``columns``, furthest first per column."""
    out: list[int] = []
    for col in columns:
        out += [r for r in outliers(df, col)["rank"].to_list() if r not in out]
    return out


def ranks_text(ranks: Sequence[int] | None, most: int = 8) -> str:
    """``[3, 7, 9]`` as ``3, 7, 9``; a long list ends with how many more."""
    if not ranks:
        return MISSING
    return ", ".join(map(str, ranks[:most])) + (
        f" and {len(ranks) - most} more" if len(ranks) > most else "")


def not_shown(shown: int, total: int, command: str,
              formats: str = "--json and --csv hold") -> str:
    return (f"({total - shown} of {total} rows not shown: `traceview {command} --all` prints "
            f"every row; {formats} every row)")
