"""The report's HTML pieces: escaped tables capped to their top rows, notes, sentences.

Every name from a trace is HTML-escaped. A table shows its first ``visible`` rows; the rest
sit in a collapsed ``<details>`` (at most ``most`` of them: past that, the page says which
command lists every row), so a 256-rank or 2,000-step run keeps a page a reader can scroll.
A kernel name shows short (``analyses.names.short_name``) with the full name on hover.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from traceview.analyses.names import short_name, unique_short_names
from traceview.outputs.safe_text import printable

#: Rows a table shows before its collapsed section.
VISIBLE_ROWS = 10
#: Rows a collapsed section holds at most (the CLI's --csv / --json list every row).
MOST_ROWS = 500


def e(v: Any) -> str:
    """HTML text of ``v``: escaped, its control characters and bidi overrides made visible
    (``safe_text.printable``), so no name can reorder or hide the page's text."""
    return html.escape(printable("" if v is None else str(v), keep="\n\t"))


def ms(v: Any) -> str:
    return "-" if v is None else f"{v / 1e6:.3f}"


def pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def name_cell(v: Any, labels: dict[str, str] | None = None) -> str:
    """A name cell: the short name (its label in ``labels``, the column's unique labels,
    when there), the full one on hover (``title``) when they differ."""
    text = ", ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else str(v))
    shown = (labels or {}).get(text) or short_name(text)
    title = f' title="{e(text)}"' if shown != text else ""
    return f'<td class="name"{title}>{e(shown)}</td>'


def _cell(v: Any, fmt: str, labels: dict[str, str] | None = None) -> str:
    if fmt == "ms":
        return f"<td>{ms(v)}</td>"
    if fmt == "pct":
        return f"<td>{pct(v)}</td>"
    if fmt == "f3":
        return f"<td>{'-' if v is None else f'{v:.3f}'}</td>"
    if fmt == "name":
        return name_cell(v, labels)
    if fmt == "prose":
        return f'<td class="prose">{e(v)}</td>'
    if fmt == "ranks":
        return f"<td>{e(ranks_text(v))}</td>"
    return f"<td>{e('-' if v is None else v)}</td>"


def ranks_text(ranks: list[int] | None, most: int = 8) -> str:
    """``[3, 7, 9]`` as ``3, 7, 9``; a long list ends with how many more."""
    if not ranks:
        return "-"
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


def table(df: pl.DataFrame, columns: list[tuple[str, str, str]], *,
          row_class: str | None = None, visible: int = VISIBLE_ROWS, most: int = MOST_ROWS,
          every_row: str = "") -> str:
    """An escaped HTML table. ``columns``: (column, header, format) with format ``ms``,
    ``pct``, ``f3``, ``name`` (short name, full on hover), ``prose``, ``ranks`` (a list) or
    ``text``. The first ``visible`` rows show; up to ``most`` more are in a collapsed section;
    ``every_row`` names the command that lists them all when there are more still."""
    if df.height == 0:
        return "<p>(no rows)</p>"
    head = "<thead><tr>" + "".join(f"<th>{e(h)}</th>" for _, h, _ in columns) + "</tr></thead>"
    # one label per distinct name in each name column: two kernels never read the same
    labels = {c: unique_short_names(v for v in df.head(visible + most).get_column(c).to_list()
                                    if isinstance(v, str))
              for c, _, f in columns if f == "name" and c in df.columns}

    def rows(frame: pl.DataFrame) -> str:
        out = []
        for row in frame.iter_rows(named=True):
            cls = f' class="{row_class}"' if row_class and row.get("flagged") else ""
            out.append(f"<tr{cls}>" + "".join(_cell(row.get(c), f, labels.get(c)) for c, _, f in columns)
                       + "</tr>")
        return "".join(out)

    shown = f'<div class="scroll"><table>{head}<tbody>{rows(df.head(visible))}</tbody></table></div>'
    rest = df.slice(visible, most)
    if rest.height == 0:
        return shown
    left = df.height - visible - rest.height
    tail = (f"<p>{left} more rows are not in the page"
            + (f": <code>{e(every_row)}</code> lists every row" if every_row else "")
            + ".</p>") if left > 0 else ""
    return (f"{shown}<details><summary>{rest.height} more rows</summary>"
            f'<div class="scroll"><table>{head}<tbody>{rows(rest)}</tbody></table></div>'
            f"{tail}</details>")


def notes(items: list[str]) -> str:
    return "".join(f'<p class="note">{e(n)}</p>' for n in items)


def sentence(text: str) -> str:
    """What stands where a figure would be empty: one sentence saying why."""
    return f'<p class="nofig">{e(text)}</p>'


def warnings(items: list[str], visible: int = 10) -> str:
    """The warnings, first thing on the page: every number below is read in their light."""
    if not items:
        return ""
    first = "".join(f"<li>{e(w)}</li>" for w in items[:visible])
    rest = items[visible:]
    more = (f"<details><summary>{len(rest)} more warnings</summary><ul>"
            + "".join(f"<li>{e(w)}</li>" for w in rest) + "</ul></details>") if rest else ""
    return (f'<section id="warnings" class="warn"><h2>Warnings ({len(items)})</h2>'
            f"<ul>{first}</ul>{more}</section>")


def collapsed_notes(items: list[str]) -> str:
    """Benign notes (an assumption, input passed over by design): collapsed, below the
    verdict and the warnings."""
    if not items:
        return ""
    return (f'<details id="notes"><summary>Notes ({len(items)})</summary><ul>'
            + "".join(f"<li>{e(n)}</li>" for n in items) + "</ul></details>")
