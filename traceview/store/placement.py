"""Placement: which final rank, and which profiling window of it, each parsed file holds.

Ranks are resolved across the files of a set: ``distributedInfo``, then the file name, then an
explicit mapping (``--rank-map``); a single rank-less file, or the rank-less files of one
process, are rank 0 with a warning. Several files of one rank are its profiling windows when
their times do not overlap and they are one process's (``traceview.store.windows``,
``traceview.store.runs``); overlapping ones are an error naming both, and ``--skip-bad`` leaves
the damaged one out. Files of two runs, or of two jobs, are an error naming two of them and what
differs, unless ``--run-of FILE`` keeps FILE's run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from traceview.errors import RankConflictError, TwoRunsError, UsageError
from traceview.parsers import family, rank_from_file_name
from traceview.store.ingested import FileResult, IngestResult
from traceview.store.runs import (
    RunIdentity,
    clock_difference,
    job_difference,
    nearest_run,
    run_difference,
    runs_of,
)
from traceview.store.windows import (
    FileSpan,
    WindowChoice,
    chosen_windows,
    file_span,
    number_windows,
    process_of_file_name,
    rough_span,
)


def place(results: list[FileResult], rank_map: dict[str, int],
           skipped: list[tuple[str, str]] | None, *, run_of: str | None = None,
           left_out: list[tuple[str, str]] | None = None,
           ) -> tuple[dict[tuple[int, int | None], int], dict[tuple[int, int], int]]:
    """(rank of every (file, parsed rank), window of every (file, rank)). With ``skipped``
    (``--skip-bad``), files that cannot be placed are left out and listed there: those
    without a rank, and the damaged (or empty) one of two that claim one rank at one time.
    ``run_of`` (``--run-of FILE``): only the files of FILE's run are kept, the others listed
    in ``left_out`` with the reason (:func:`keep_run`). Files of two runs or two jobs are
    otherwise a :class:`TwoRunsError` (``traceview.store.runs``). ``results`` loses the files
    left out in place."""
    spans: dict[str, FileSpan] = {}  # read once per file: five columns of its events

    def identities(rank_of: dict[tuple[int, int | None], int]
                   ) -> Callable[[int, int], RunIdentity]:
        """What each (file, final rank) says about its run, under ``rank_of``."""
        parsed: dict[tuple[int, int], int | None] = {}
        for (j, p), r in rank_of.items():  # one pass, not one per file: 5,000 files
            parsed.setdefault((j, r), p)

        def identity_of(i: int, rank: int) -> RunIdentity:
            path = results[i].events_path or f"memory:{i}"  # in memory: FileResult.events_data
            if path not in spans:
                spans[path] = file_span(results[i].events_source)
            return run_identity(results[i], parsed.get((i, rank)), spans[path])
        return identity_of

    def windows(rank_of: dict[tuple[int, int | None], int]) -> dict[tuple[int, int], int]:
        return number_windows([r.path for r in results], rank_of, identities(rank_of),
                              lambda i: _damaged(results[i]))

    while True:
        try:
            rank_of = resolve_ranks(results, rank_map)
            if run_of is not None:
                why = keep_run(results, rank_of, run_of, identities(rank_of))
                if left_out is not None:
                    left_out += [(results[i].path, text) for i, text in sorted(why.items())]
                results[:] = [r for i, r in enumerate(results) if i not in why]
                run_of = None  # chosen: what is left is placed as usual
                continue
            try:
                window_of = windows(rank_of)
            except RankConflictError:  # two runs too: per-rank copies can look like them
                by_name = _ranks_from_names(results, rank_of, rank_map)
                if by_name is None:
                    raise
                rank_of, window_of = by_name, windows(by_name)
            check_one_job(results, rank_of)
            check_one_clock(results, rank_of)
            return rank_of, window_of
        except TwoRunsError:
            raise  # no damaged file to skip: the caller must choose a run
        except RankConflictError as exc:
            leave = set(exc.skippable)
            if skipped is None or not leave or len(leave) >= len(results):
                raise
            for result in [r for r in results if r.path in leave]:
                results.remove(result)
                why = str(exc).removeprefix(f"{result.path}: ")
                skipped.append((result.path, f"{result.path}: cannot be placed ({why})"))


def run_identity(result: FileResult, parsed_rank: int | None, span: FileSpan) -> RunIdentity:
    """What ``result`` (the part of it for ``parsed_rank``) says about its run."""
    info = next((r for r in result.ranks if r["rank"] == parsed_rank), result.ranks[0])
    return RunIdentity(
        path=result.path, source=family(result.format), host=info.get("host"),
        pid=info.get("pid") if info.get("pid") is not None else span.pid,
        world_size=info.get("world_size"), backend=info.get("backend"),
        pg_config=info.get("pg_config"), start_ns=span.start_ns, end_ns=span.end_ns,
        first_step=span.first_step, last_step=span.last_step)


def check_one_job(results: list[FileResult], rank_of: dict[tuple[int, int | None], int]
                  ) -> None:
    """Files of different ranks must come from one job: a :class:`TwoRunsError` naming two
    files that disagree on the world size or backend. Only the header is consulted."""
    first: RunIdentity | None = None
    for (i, parsed), rank in sorted(rank_of.items(), key=lambda kv: (kv[1], kv[0][0])):
        info = next((r for r in results[i].ranks if r["rank"] == parsed), results[i].ranks[0])
        here = RunIdentity(path=results[i].path, world_size=info.get("world_size"),
                           backend=info.get("backend"))
        if first is None:
            first = here
            continue
        why = job_difference(first, here)
        if why:
            raise TwoRunsError(f"{first.path} and {here.path} come from two jobs ({why}); "
                               f"keep one with --run-of FILE, or give each job its own folder")


def check_one_clock(results: list[FileResult], rank_of: dict[tuple[int, int | None], int]
                    ) -> None:
    """Ranks of one host that profiled the same steps at different times are two runs
    (``runs.clock_difference``): a :class:`TwoRunsError` naming two of their files. Per host,
    the ranks in order of their first event: each is compared with the rank that ended last
    before it, so a host of many ranks costs one sort."""
    ranks_of_host: dict[str, dict[int, list[int]]] = {}
    for (i, parsed), rank in rank_of.items():
        info = next((r for r in results[i].ranks if r["rank"] == parsed), results[i].ranks[0])
        if isinstance(info.get("host"), str):
            ranks_of_host.setdefault(info["host"], {}).setdefault(rank, []).append(i)
    for host, files_of in ranks_of_host.items():
        if len(files_of) < 2:
            continue
        spans = sorted((_rank_span(results, files, host) for files in files_of.values()),
                       key=lambda f: (f.start_ns is None, f.start_ns or 0))
        latest: RunIdentity | None = None
        for span in spans:
            why = clock_difference(latest, span) if latest is not None else None
            if why:
                raise TwoRunsError(f"{latest.path} and {span.path} come from two runs ({why}); "
                                   "keep one with --run-of FILE, or give each run its own "
                                   "folder")
            if latest is None or (span.end_ns or 0) > (latest.end_ns or 0):
                latest = span


def _rank_span(results: list[FileResult], files: list[int], host: str) -> RunIdentity:
    """One rank's files on ``host`` as one span: the first start to the last end, the first
    step to the last; named by its first file."""
    spans = [FileSpan(**results[i].rough_span) if results[i].rough_span is not None
             else rough_span(results[i].events_source) for i in files]
    starts = [s.start_ns for s in spans if s.start_ns is not None]
    ends = [s.end_ns for s in spans if s.end_ns is not None]
    firsts = [s.first_step for s in spans if s.first_step is not None]
    lasts = [s.last_step for s in spans if s.last_step is not None]
    return RunIdentity(path=results[files[0]].path, host=host,
                       start_ns=min(starts, default=None), end_ns=max(ends, default=None),
                       first_step=min(firsts, default=None), last_step=max(lasts, default=None))


def keep_run(results: list[FileResult], rank_of: dict[tuple[int, int | None], int],
             run_of: str, identity_of: Callable[[int, int], RunIdentity]) -> dict[int, str]:
    """The files to leave out so that only ``run_of``'s run remains, each with the reason:
    of ``run_of``'s rank, the files of its other runs (``runs.runs_of``); of the other ranks,
    every run but the one of the same job with the most time in common with it
    (``runs.nearest_run``). A ``UsageError`` when ``run_of`` is not one of the inputs."""
    ref_index = _index_of(results, run_of)
    files_of: dict[int, list[int]] = {}
    for (i, _), rank in rank_of.items():
        files_of.setdefault(rank, [])
        if i not in files_of[rank]:
            files_of[rank].append(i)
    ref_rank = next(rank for (i, _), rank in rank_of.items() if i == ref_index)
    index = {results[i].path: i for i in range(len(results))}
    ref_run = next(run for run in runs_of([identity_of(i, ref_rank)
                                           for i in files_of[ref_rank]])
                   if any(f.path == results[ref_index].path for f in run))
    kept: set[str] = set()
    why: dict[str, str] = {}
    for rank, files in files_of.items():
        runs = runs_of([identity_of(i, rank) for i in files])
        keep = ref_run if rank == ref_rank else nearest_run(runs, ref_run)
        kept |= {f.path for f in keep or []}
        for f in (f for run in runs for f in run if f not in (keep or [])):
            other = (keep or ref_run)[0]
            pair = sorted((f, other), key=lambda x: x.start_ns or 0)
            diff = (run_difference(*pair) if rank == ref_rank else  # another rank: its own pid
                    job_difference(*pair) or clock_difference(*pair))
            why[f.path] = (f"{f.path}: another run than {run_of} "
                           f"({diff or 'no time in common'}); left out (--run-of)")
    # a file of several ranks stays when any of its ranks keeps it
    return {index[path]: text for path, text in why.items() if path not in kept}


def _index_of(results: list[FileResult], path: str) -> int:
    """The index of the input ``path`` names (as given, resolved, or by file name)."""
    want = Path(path)
    for i, r in enumerate(results):
        if r.path == path or Path(r.path).resolve() == want.resolve():
            return i
    named = [i for i, r in enumerate(results) if Path(r.path).name == want.name]
    if len(named) == 1:
        return named[0]
    raise UsageError(f"--run-of {path}: not one of the traces read "
                     f"({', '.join(r.path for r in results[:3])}"
                     f"{', ...' if len(results) > 3 else ''})")


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
        # a rank read from a file name is no record: the parse of a byte-identical file of
        # another name (one cache entry) carries that file's; this name decides, silently
        if recorded.get(i) != named[i] and result.ranks[0].get("rank_from") != "file name":
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
            elif len(result.ranks) == 1 and (
                    named := rank_from_file_name(Path(result.path).name)) is not None:
                # the parser found no rank inside (an nsys export of a CPU-only process):
                # the file name's, whatever the format (trace_rank1.sqlite, rank-1.json)
                rank_of[(i, parsed)] = named
                info["rank_from"] = "file name"
            else:
                unknown.append(i)
    if unknown:
        if len(results) == 1:
            # one file is one rank: rank 0 is no assumption worth a warning (a Kineto trace
            # without distributedInfo, a single-process nsys export); `rank_from` says so
            rank_of[(0, None)] = 0
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
