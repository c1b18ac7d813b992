"""Placement: which final rank, and which profiling window of it, each parsed file holds.

Ranks are resolved across the files of a set: ``distributedInfo``, then the file name, then an
explicit mapping (``--rank-map``); a single rank-less file, or the rank-less files of one
process, are rank 0 with a warning. Several files of one rank are its profiling windows when
their times do not overlap (``traceview.store.windows``); overlapping ones are an error naming both,
and ``--skip-bad`` leaves the damaged one out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson

from traceview.errors import RankConflictError
from traceview.parsers import family, rank_from_file_name
from traceview.store.ingested import FileResult, IngestResult
from traceview.store.windows import (
    WindowChoice,
    chosen_windows,
    file_span,
    number_windows,
    process_of_file_name,
)


def place(results: list[FileResult], rank_map: dict[str, int],
           skipped: list[tuple[str, str]] | None,
           ) -> tuple[dict[tuple[int, int | None], int], dict[tuple[int, int], int]]:
    """(rank of every (file, parsed rank), window of every (file, rank)). With ``skipped``
    (``--skip-bad``), files that cannot be placed are left out and listed there: those
    without a rank, and the damaged (or empty) one of two that claim one rank at one time.
    ``results`` loses them in place."""
    def windows(rank_of: dict[tuple[int, int | None], int]) -> dict[tuple[int, int], int]:
        return number_windows([r.path for r in results], rank_of,
                              lambda i: file_span(results[i].events_path),
                              lambda i: _damaged(results[i]))

    while True:
        try:
            rank_of = resolve_ranks(results, rank_map)
            try:
                return rank_of, windows(rank_of)
            except RankConflictError:
                by_name = _ranks_from_names(results, rank_of, rank_map)
                if by_name is None:
                    raise
                return by_name, windows(by_name)
        except RankConflictError as exc:
            leave = set(exc.skippable)
            if skipped is None or not leave or len(leave) >= len(results):
                raise
            for result in [r for r in results if r.path in leave]:
                results.remove(result)
                why = str(exc).removeprefix(f"{result.path}: ")
                skipped.append((result.path, f"{result.path}: cannot be placed ({why})"))


def _ranks_from_names(results: list[FileResult], rank_of: dict[tuple[int, int | None], int],
                      rank_map: dict[str, int]) -> dict[tuple[int, int | None], int] | None:
    """When the ranks the files record collide (a report copied per rank, an environment
    that every rank shared) but each file holds one rank and the file names give each a
    different rank (``trace_rank0.sqlite``, ``rank-1.json``, ``worker2``), the names decide,
    with a warning; None when they cannot (a name without a rank, two names alike, a file of
    several ranks, or a rank given by ``--rank-map``)."""
    named = [rank_from_file_name(Path(r.path).name) for r in results]
    if (len(results) < 2 or None in named or len(set(named)) != len(named)
            or any(len(r.ranks) != 1 or r.ranks[0].get("rank_from") == "mapping"
                   for r in results)):
        return None
    recorded = {i: rank for (i, _), rank in rank_of.items()}
    for i, result in enumerate(results):
        if recorded.get(i) != named[i]:
            result.warnings.append(
                f"records rank {recorded.get(i)} ({result.ranks[0].get('rank_from')}), as "
                f"other files of this set do; rank {named[i]} taken from the file name")
        result.ranks[0]["rank_from"] = "file name"
    return {(i, parsed): named[i] for (i, parsed) in rank_of}


def _damaged(result: FileResult) -> bool:
    """A file its parser found cut short or damaged (events dropped for damage)."""
    return bool(result.dropped.get("truncated")) or any(
        "truncat" in w or "damaged" in w for w in result.warnings)


def _lookup(mapping: dict[str, int], path: str) -> int | None:
    p = Path(path)
    for key in (path, str(p.resolve()), p.name, p.stem):
        if key in mapping:
            return mapping[key]
    return None


def resolve_ranks(results: list[FileResult],
                  rank_map: dict[str, int]) -> dict[tuple[int, int | None], int]:
    """Final rank for every (file, parsed rank). Raises on unknown ranks; several files of one
    rank are told apart (or refused) by ``traceview.store.windows.number_windows``."""
    rank_of: dict[tuple[int, int | None], int] = {}
    unknown: list[int] = []
    for i, result in enumerate(results):
        explicit = _lookup(rank_map, result.path)
        for info in result.ranks:
            parsed = info["rank"]
            if explicit is not None and len(result.ranks) == 1:
                rank_of[(i, parsed)] = explicit
                info["rank_from"] = "mapping"
            elif parsed is not None:
                rank_of[(i, parsed)] = parsed
            else:
                unknown.append(i)
    if unknown:
        if len(results) == 1:
            rank_of[(0, None)] = 0
            results[0].warnings.append("the trace names no rank; assuming rank 0")
            results[0].ranks[0]["rank_from"] = "default"
        elif _one_process(results, unknown, rank_of):
            _rank_zero_for_one_process(results, unknown, rank_of)
        else:
            names = ", ".join(results[i].path for i in unknown)
            raise RankConflictError(
                f"{names}: no rank in the trace or its file name; pass --rank-map FILE=RANK",
                skippable=tuple(results[i].path for i in unknown))
    return rank_of


def _one_process(results: list[FileResult], unknown: list[int],
                 rank_of: dict[tuple[int, int | None], int]) -> bool:
    """Are all the files rank-less, one rank each, and named by one process
    (``tensorboard_trace_handler``'s ``<host>_<pid>``)? Then they are that one process's
    profiling windows: a single-process run."""
    if rank_of or any(len(results[i].ranks) != 1 for i in unknown):
        return False
    processes = {process_of_file_name(Path(results[i].path).name) for i in unknown}
    return len(processes) == 1 and None not in processes


def _rank_zero_for_one_process(results: list[FileResult], unknown: list[int],
                               rank_of: dict[tuple[int, int | None], int]) -> None:
    """A single-process run is rank 0 (as a single rank-less file is), with a warning."""
    process = process_of_file_name(Path(results[unknown[0]].path).name)
    for i in unknown:
        rank_of[(i, None)] = 0
        results[i].ranks[0]["rank_from"] = "default"
        results[i].warnings.append(f"the trace names no rank; one process ({process}) wrote "
                                   f"every file, assuming rank 0")


def select_window(result: IngestResult, window: WindowChoice) -> IngestResult:
    """``result`` with only the files of ``window`` of each rank (``traceview.store.windows``); the
    kept files are indexed from 0 again, their windows keep their numbers. None keeps all."""
    if window is None:
        return result
    window_of = {pair: result.window_of.get(pair, 0) for pair in
                 {(i, rank) for (i, _), rank in result.rank_of.items()}}
    chosen = chosen_windows(window_of, window)
    kept = sorted({i for i, _ in chosen})
    new_index = {old: new for new, old in enumerate(kept)}
    return dataclasses.replace(
        result, files=[result.files[i] for i in kept],
        rank_of={(new_index[i], parsed): rank for (i, parsed), rank in result.rank_of.items()
                 if (i, rank) in chosen},
        window_of={(new_index[i], rank): window_of[(i, rank)] for i, rank in chosen})


def rank_info_rows(result: IngestResult) -> list[dict[str, Any]]:
    """Rows of the ranks table."""
    rows = []
    first = _first_windows(result)
    for (i, parsed), rank in sorted(result.rank_of.items(), key=lambda kv: kv[1]):
        if (i, rank) not in first:
            continue  # one row per rank: its other windows are in ``TraceSet.windows``
        file = result.files[i]
        info = next(r for r in file.ranks if r["rank"] == parsed)
        rows.append({
            "rank": rank, "file_id": i, "world_size": info.get("world_size"),
            "host": info.get("host"), "devices": orjson.dumps(info.get("devices") or []).decode(),
            "backend": info.get("backend"), "clock_base_ns": info.get("clock_base_ns"),
            "source": family(file.format), "rank_from": info.get("rank_from"),
            "pg_config": info.get("pg_config"), "device_memory": info.get("device_memory"),
        })
    return rows


def _first_windows(result: IngestResult) -> set[tuple[int, int]]:
    """The (file index, rank) pair of each rank's earliest window."""
    first: dict[int, tuple[int, int]] = {}
    for (i, _), rank in result.rank_of.items():
        n = result.window_of.get((i, rank), 0)
        if rank not in first or n < first[rank][0]:
            first[rank] = (n, i)
    return {(i, rank) for rank, (_, i) in first.items()}
