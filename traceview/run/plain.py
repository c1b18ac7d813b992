"""What the shared tables' warnings mean for an answer, in plain words: one line per
collective group with problems, one per clock-alignment quality, instead of one technical line
per (group, rank, problem). The technical lines stay the Result's ``warnings`` (``--json``, and
the text output with ``--verbose``); these are ``warnings_plain``.

>>> import polars as pl
>>> problems = pl.DataFrame({"group": ["stream 84", "stream 84"], "rank": [None, 1],
...     "problem": ["order_timing_mismatch", "time_matched"],
...     "detail": ["... scatter by 56826575 ns (robust sd), ...", "..."]})
>>> groups = pl.DataFrame({"group": ["stream 84"], "ranks": [[0, 1]], "match": ["time"],
...     "calls_per_rank": [8], "paired": [6], "unpaired": [10]})
>>> print(collective_lines(problems, groups)[0])
collectives on stream 84 could not be paired across ranks by call order (their completions scatter by 56.8 ms); 10 of 16 calls stay unpaired: cross-rank waits, skew and stragglers there leave them out
"""

from __future__ import annotations

import re

import polars as pl

from traceview import selection

#: Each problem kind, as what it means (the reason a group's calls could not all be paired).
REASONS: dict[str, str] = {
    "order_timing_mismatch": "could not be paired across ranks by call order",
    "time_matched": "could not be paired across ranks by call order",
    "count_mismatch": "were made a different number of times on different ranks",
    "missing_rank": "are missing on some ranks",
    "name_mismatch": "differ between ranks at the same position",
    "unmatched": "share no call with the other ranks on some ranks",
    "group_unknown": "could not be assigned to a process group",
}


def collective_lines(problems: pl.DataFrame, groups: pl.DataFrame) -> list[str]:
    """One line per group with problems: what went wrong and what the answer leaves out."""
    lines = []
    calls = {row["group"]: row for row in groups.iter_rows(named=True)}
    for (group,), rows in problems.group_by("group", maintain_order=True):
        kinds = list(dict.fromkeys(rows.get_column("problem").to_list()))
        reasons = list(dict.fromkeys(REASONS.get(k, k.replace("_", " ")) for k in kinds))
        where = f"on {group}" if str(group).startswith("stream") else f"in group {group}"
        line = f"collectives {where} " + " and ".join(reasons)
        scatter = _scatter_ns(rows.get_column("detail").to_list())
        if scatter is not None:
            line += f" (their completions scatter by {_readable_ns(scatter)})"
        row = calls.get(group)
        if row is not None and row.get("unpaired"):
            total = row["calls_per_rank"] * len(row["ranks"] or [])
            line += (f"; {row['unpaired']} of {max(total, row['unpaired'])} calls stay unpaired:"
                     " cross-rank waits, skew and stragglers there leave them out")
        elif row is not None and row.get("match") == "time":
            line += "; all were paired by completion time instead"
        lines.append(line)
    return lines


def alignment_lines(offsets: pl.DataFrame) -> list[str]:
    """One line for the ranks whose clocks could not be aligned, one for those aligned only
    roughly (quality ``poor``), with the worst error it can put on cross-rank times."""
    lines = []
    if "method" in offsets.columns:
        none = offsets.filter(pl.col("method") == "none").get_column("rank").to_list()
        if none:
            lines.append(f"the clock of rank(s) {selection.describe_ranks(none)} could not be "
                         "aligned with the others: their times are compared as recorded")
    if "quality" in offsets.columns:
        poor = offsets.filter(pl.col("quality") == "poor")
        if poor.height:
            worst = 3 * int(poor.get_column("uncertainty_ns").fill_null(0).max())
            lines.append(f"the clock of rank(s) "
                         f"{selection.describe_ranks(poor.get_column('rank').to_list())} is "
                         f"aligned only roughly: cross-rank times with it can be off by up to "
                         f"{_readable_ns(worst)}")
    return lines


def _scatter_ns(details: list[str]) -> int | None:
    """The completion scatter an order/timing mismatch names, if any."""
    for text in details:
        found = re.search(r"scatter by (\d+) ns", text or "")
        if found:
            return int(found.group(1))
    return None


def _readable_ns(ns: int) -> str:
    """``56826575`` as ``57 ms``; small values in µs."""
    if ns >= 1_000_000:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} µs"
