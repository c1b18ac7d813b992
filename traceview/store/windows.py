"""Profiling windows: several trace files of one rank, told apart by their times.

A ``torch.profiler`` schedule with ``repeat`` other than 1 writes one trace file per cycle
per rank (``tensorboard_trace_handler``: ``<host>_<pid>.<time>.pt.trace.json[.gz]``). The rule:

* Files that resolve to the same rank are that rank's **profiling windows** when their event
  time ranges do not overlap. They are numbered 0, 1, 2 ... in time order (by first event).
* Two files of one rank whose time ranges overlap are a conflict (two different runs, say):
  an error naming both files. So are disjoint files that are not one process's windows
  (``traceview.store.runs``: another host, process, world size, or steps that start again).
* Steps keep their ``ProfilerStep`` numbers: the profiler's step counter keeps counting across
  cycles, so they are distinct across windows.

The time between two windows of a rank is not data (the profiler was off): analyses never
count it as GPU idle or as part of a step (see ``analyses/gaps.py`` and ``analyses/window.py``).

>>> parse_window("last"), parse_window("2")
('last', 2)
>>> process_of_file_name("vm_7888.1795601432278272764.pt.trace.json.gz")
'vm_7888'
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from traceview.errors import RankConflictError, TwoRunsError, UsageError
from traceview.store import parquet as store
from traceview.store.runs import RunIdentity, run_difference

#: ``--window`` value: a window number (from 0) or ``"last"``; None selects every window.
WindowChoice = int | str | None

#: ``<worker>.<time>.pt.trace.json[.gz]``, the names ``tensorboard_trace_handler`` writes;
#: ``<worker>`` defaults to ``<host>_<pid>``: one process.
_HANDLER_NAME = r"^(?P<worker>.+)\.\d+\.pt\.trace\.json(?:\.gz)?$"


#: Event kinds a host process records under its own pid (device rows carry a device id).
HOST_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class FileSpan:
    """The times and steps of one file's events (None when it holds no timed event), and
    the process id its host events carry most (None when it has none)."""

    start_ns: int | None
    end_ns: int | None
    first_step: int | None
    last_step: int | None
    pid: int | None = None


def _span_columns() -> list[pl.Expr]:
    """First start, last end, first and last step of an events table."""
    return [pl.col("ts_ns").min().alias("start_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("end_ns"),
            pl.col("step").min().alias("first_step"),
            pl.col("step").max().alias("last_step")]


def file_span(events_path: str | Path | bytes) -> FileSpan:
    """First start, last end, first and last step of an events file (or its bytes), and its
    host events' process (five columns read)."""
    host = pl.col("kind").cast(pl.String).is_in(HOST_KINDS)
    row = store.scan_events(events_path).select(
        *_span_columns(),
        pl.col("pid").filter(host).drop_nulls().mode().first().alias("pid"),
    ).collect().row(0, named=True)
    return FileSpan(**row)


def span_of_rows(ts_ns: Any, dur_ns: Any, step: Any) -> FileSpan:
    """:func:`file_span`'s times and steps (not its process) from the columns in memory (Arrow
    arrays or Polars series): a parse's own key columns, so that its ingest need not read back
    the file it has just written."""
    frame = pl.DataFrame({"ts_ns": ts_ns, "dur_ns": dur_ns, "step": step})
    return FileSpan(**frame.select(_span_columns()).row(0, named=True))


def rough_span(events_path: str | Path | bytes,
               exact: Callable[[], FileSpan] | None = None) -> FileSpan:
    """First and last event start and first and last step of an events file, from the Parquet
    footer's column statistics (a few hundred bytes, where :func:`file_span` reads five
    columns: a 5,000-rank run asks this of every file). The end is the last *start*, which
    is enough to tell spans a whole profiled step apart. Where a statistic is missing (no
    step markers: every step null), falls back to ``exact`` (by default :func:`file_span`,
    which reads five columns back: 0.07 s and 60 MB at the peak of a 300 MB trace's ingest,
    docs/performance.md, log 52)."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - only when files of one host are compared

    try:
        meta = pq.read_metadata(io.BytesIO(events_path) if isinstance(events_path, bytes)
                                else events_path)
        names = meta.schema.names
        found: dict[str, tuple[int, int]] = {}
        for column in ("ts_ns", "step"):
            stats = [meta.row_group(g).column(names.index(column)).statistics
                     for g in range(meta.num_row_groups)]
            held = [st for st in stats if st is not None and st.has_min_max]
            if len(held) != len(stats) or not held:
                raise ValueError(column)
            found[column] = (min(st.min for st in held), max(st.max for st in held))
    except (OSError, ValueError, IndexError):  # no such column or statistic: read it
        return exact() if exact is not None else file_span(events_path)
    return FileSpan(start_ns=found["ts_ns"][0], end_ns=found["ts_ns"][1],
                    first_step=found["step"][0], last_step=found["step"][1])


def process_of_file_name(name: str) -> str | None:
    """The worker (by default ``<host>_<pid>``) in a ``tensorboard_trace_handler`` file name."""

    found = re.match(_HANDLER_NAME, name)
    return found.group("worker") if found else None


def number_windows(paths: list[str], rank_of: Mapping[tuple[int, Any], int],
                   identity_of: Callable[[int, int], RunIdentity],
                   damaged: Callable[[int], bool] = lambda i: False,
                   ) -> dict[tuple[int, int], int]:
    """Window number of every (file index, rank): 0 for a rank's only file; for a rank with
    several files, their order in time. ``identity_of(i, rank)`` (times, steps, process: what
    tells windows from runs) is asked only for the files of such ranks. Raises
    :class:`RankConflictError` naming two files whose times overlap (the ``damaged`` ones of
    them skippable), or that are two runs."""
    files_of: dict[int, list[int]] = {}
    for (i, _), rank in rank_of.items():
        files_of.setdefault(rank, [])
        if i not in files_of[rank]:
            files_of[rank].append(i)
    window_of: dict[tuple[int, int], int] = {}
    for rank, files in files_of.items():
        ordered = files if len(files) == 1 else _in_time_order(
            paths, rank, {i: identity_of(i, rank) for i in files}, damaged)
        window_of.update({(i, rank): n for n, i in enumerate(ordered)})
    return window_of


def _in_time_order(paths: list[str], rank: int, files: dict[int, RunIdentity],
                   damaged: Callable[[int], bool]) -> list[int]:
    """``files`` (of one rank) sorted by start; a conflict when two overlap in time or are
    not one process's windows."""
    empty = [i for i, f in files.items() if f.start_ns is None]
    if empty:  # a file without events has no place in time: it cannot be told apart
        other = next(i for i in files if i != empty[0])
        raise RankConflictError(f"{paths[other]} and {paths[empty[0]]} both claim rank {rank} "
                                f"and {paths[empty[0]]} holds no timed event",
                                skippable=(paths[empty[0]],))
    ordered = sorted(files, key=lambda i: (files[i].start_ns, files[i].end_ns, i))
    for before, after in zip(ordered, ordered[1:]):
        if files[after].start_ns < files[before].end_ns:
            raise RankConflictError(
                f"{paths[before]} and {paths[after]} both claim rank {rank} and their times "
                f"overlap (not two profiling windows of one run)",
                skippable=tuple(paths[i] for i in (before, after) if damaged(i)))
        why = run_difference(files[before], files[after])
        if why:
            raise TwoRunsError(
                f"{paths[before]} and {paths[after]} both claim rank {rank} but are two runs "
                f"({why}); keep one with --run-of FILE, or give each run its own folder")
    return ordered


def parse_window(text: str | None) -> WindowChoice:
    """``--window N|last`` -> ``N`` or ``"last"`` (None stays None)."""
    if text is None:
        return None
    if text.strip().lower() == "last":
        return "last"
    if text.strip().isdigit() and len(text.strip()) <= 9:  # more windows than that: no
        return int(text)
    raise UsageError(f"--window wants a window number (from 0) or 'last', got {text!r}")


def chosen_windows(window_of: Mapping[tuple[int, int], int],
                   window: WindowChoice) -> set[tuple[int, int]]:
    """The (file index, rank) pairs of ``window`` (a number, or ``"last"``: each rank's last).
    An out-of-range number is a :class:`UsageError` naming how many windows there are."""
    counts: dict[int, int] = {}
    for (_, rank), n in window_of.items():
        counts[rank] = max(counts.get(rank, 0), n + 1)
    if window == "last":
        return {(i, rank) for (i, rank), n in window_of.items() if n == counts[rank] - 1}
    if not isinstance(window, int) or window < 0:
        raise UsageError(f"--window wants a window number (from 0) or 'last', got {window!r}")
    short = sorted(rank for rank, count in counts.items() if count <= window)
    if short:
        n = counts[short[0]]
        whose = "there are" if len(set(counts.values())) == 1 else f"rank {short[0]} has"
        raise UsageError(f"--window {window} is out of range: {whose} {n} "
                         f"window{'s' if n != 1 else ''} (0-{n - 1}, or 'last')")
    return {pair for pair, n in window_of.items() if n == window}
