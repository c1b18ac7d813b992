"""Ingest: input paths -> parsed, cached Parquet per file, and the ranks/files tables.

Files are parsed in worker processes (bounded by cores and a memory budget); each worker writes
its file's Parquet into the cache and returns only a small summary, so the driver never holds
all events. Which rank and profiling window each file's rows belong to is worked out across
the files by ``traceview.store.placement``.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.errors import TraceviewError, UnreadableTraceError
from traceview.parsers import (
    PARSER_VERSIONS,
    EventBatches,
    RankInfo,
    detect_format,
    family,
    file_problem,
    hashes_as_it_reads,
    is_trace_name,
    kineto,
    parse_batched,
    refuse_non_json,
)
from traceview.parsers._memory import available_memory
from traceview.store import cache_folder
from traceview.store import parquet as store
from traceview.store.batched import plan_batches, run_batched
from traceview.store.executors import (
    ExecutorSpec,
    TaskFailure,
    cores,
    local_pool,
    open_executor,
    warm_local_pool,
)
from traceview.store.ingested import FileResult, IngestResult
from traceview.store.placement import place, resolve_ranks
from traceview.store.progress import ProgressLine
from traceview.store.rank_facts import OtherCategories, rank_facts
from traceview.store.safe_write import is_ours
from traceview.store.steps import StepsOfRows
from traceview.store.windows import rough_span, span_of_rows

#: Imported on first use (~0.1-0.2 s with numpy): a run read from the cache reads Parquet
#: through Polars and needs none of it (log 41 of docs/performance.md).
pa = lazy_module("pyarrow")


def parser_version(fmt: str) -> int:
    """The parser version for a format; part of the cache key."""
    return PARSER_VERSIONS[family(fmt)]


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories (one level) into trace files; keep explicit files as given."""
    return discover_with_ignored(paths)[0]


def discover_with_ignored(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(trace files, JSON files in the given folders that are not traces and were passed over).

    Folders of traces often hold other JSON (manifests, configs). A file found in a folder is
    passed over only when neither its name (trace, rank, worker) nor its first 64 KiB
    (``"traceEvents"`` or ``"ph"``) suggests a trace; a damaged trace is still read, and fails
    or warns as such. Files named explicitly are always read.
    """
    found: list[Path] = []
    ignored: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # entries that are no regular file (a link loop, a FIFO) are kept, unopened: their
            # ingest fails them by name (or --skip-bad skips them), never silently
            inner = sorted(p for p in path.iterdir() if is_trace_name(p) and not p.is_dir())
            # a link whose target is gone (a "latest" link after a clean-up) is passed over,
            # with a warning (ingest's skipped); named on the command line it is an error
            traces = [p for p in inner if not _dangling(p)
                      and (file_problem(p) or _looks_like_trace(p))]
            kept = set(traces)  # a list's `in` made a folder of N files cost N^2 compares
            ignored.extend(p for p in inner if p not in kept)
            if not traces:
                raise UnreadableTraceError(path, "directory holds no trace files "
                                           "(.json, .json.gz, .sqlite)")
            found.extend(traces)
        elif path.exists() or path.is_symlink():  # a link loop: its ingest names it
            found.append(path)
        else:
            raise UnreadableTraceError(path, "no such file or directory")
    return _distinct(found), ignored


def _distinct(files: list[Path]) -> list[Path]:
    """Each file once, first mention kept: the same trace named twice, a folder and one of
    its files, a link and its target are one file (by device and inode), not two files that
    claim the same rank."""
    seen: set[object] = set()
    out = []
    for path in files:
        try:
            st = path.stat()
            key: object = (st.st_dev, st.st_ino)
        except OSError:  # a link loop, a file gone: its ingest names it
            key = str(path)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


_TRACE_NAME = re.compile(r"trace|rank|worker", re.IGNORECASE)


def _dangling(path: Path) -> bool:
    """A symbolic link to nothing (not a link loop: that is a fault of the input, refused)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return path.is_symlink()
    except OSError:
        return False
    return False


def _passed_over(path: Path) -> str:
    """Why a file found in a folder was not read (ingest's ``skipped``)."""
    if _dangling(path):
        return f"{path}: a link to {os.readlink(path)}, which does not exist"
    return f"{path}: passed over, not a trace (no traceEvents)"


def _looks_like_trace(path: Path) -> bool:
    if not path.name.endswith(".json") or _TRACE_NAME.search(path.name):
        return True  # gzip, SQLite and trace-like names are always read
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return True  # unreadable: let the reader report it
    return b'"traceEvents"' in head or b'"ph"' in head or not head.strip()


def _cache_lookup(path: str, cache_dir: str | None, options: dict[str, Any],
                  content: str | None = None) \
        -> tuple[FileResult | None, str, Path | None, Path, Path, str | None]:
    """The cached result of a file, if its content was ingested before (and where it goes),
    and a warning when a damaged entry was found (and discarded: the file is parsed again).
    ``content``: the file's content id when the caller hashed it already."""
    file_path = Path(path)
    fmt = detect_format(file_path)
    refuse_non_json(file_path, fmt)  # before the whole file is hashed
    base = Path(cache_dir) if cache_dir else None
    cid = content or store.known_content_id(file_path, base)
    key = store.cache_key(cid, parser_version(fmt), options)
    meta_path = (base or Path()) / key / "meta.json"
    events_path = (base or Path()) / key / "events.parquet"
    if base is None:
        return None, cid, base, meta_path, events_path, None
    try:
        meta = store.read_cache_meta(meta_path.parent, base)
        if meta is None:
            return None, cid, base, meta_path, events_path, None
        meta.update(path=path, from_cache=True, events_path=str(events_path))
        try:  # fields another version added are left out, not taken for damage
            return (FileResult(**{k: v for k, v in meta.items() if k in _RESULT_FIELDS}),
                    cid, base, meta_path, events_path, None)
        except TypeError:
            raise store.BrokenCacheEntry(meta_path, "not a traceview cache record") from None
    except store.BrokenCacheEntry as broken:
        if isinstance(broken, store.UntrustedCacheEntry):
            base = None  # not ours: the parse's events go to a private folder
        else:
            store.discard_cache_entry(meta_path.parent)
        return None, cid, base, meta_path, events_path, (
            f"cache entry {broken.path} could not be used ({broken.problem}); discarded, "
            "the file was parsed again")


#: What a cache entry's meta.json may say of a file; a version that adds a field (e.g.
#: ``rough_span``) writes entries the versions before it still read. A field whose meaning
#: changes comes with a new parser version, which is part of the cache key.
_RESULT_FIELDS = frozenset(f.name for f in fields(FileResult))


def cached_result(path: str, cache_dir: str | None, options: dict[str, Any],
                  content: str | None = None) -> tuple[FileResult | None, str | None, str | None]:
    """(the cached result of a file or None, its content id (None when it cannot be read),
    a warning when a damaged cache entry was discarded). ``content``: the content id when
    known already."""
    try:
        found = _cache_lookup(path, cache_dir, options, content)
    except (OSError, TraceviewError):
        return None, None, None
    return found[0], found[1], found[5]


#: Reads of a file that changes while it is read, before it is refused (see ingest_file).
READS_OF_A_CHANGING_FILE = 3


def ingest_file(path: str, cache_dir: str | None, options: dict[str, Any],
                content: str | None = None) -> FileResult:
    """Parse one file into the cache (or find it there). Runs in a worker process.

    The cache key is the content hashed before the parse; the file is hashed again once its
    events are written (the last time its bytes are read), and an entry is completed only when
    the two agree: a file that changed meanwhile (a profiler still writing it, a copy in
    progress) is read again, with a warning, and refused after ``READS_OF_A_CHANGING_FILE``
    reads. So no entry ever holds a parse of other bytes than its key's. A large uncompressed
    Kineto file never seen is the exception: its parse hashes what it reads, and is keyed by
    that (``_parse_first``)."""
    changed: list[str] = []
    for attempt in range(READS_OF_A_CHANGING_FILE):
        first = _parse_first(Path(path), cache_dir, options) \
            if attempt == 0 and content is None else None
        result, content = first or _ingest_once(path, cache_dir, options, content)
        if content is None:  # read as hashed
            if changed:
                result.warnings = [*result.warnings, f"changed while it was read "
                                   f"({', '.join(changed)}); read again, as it is now"]
            return result
        changed.append(f"{result.size_bytes:,} bytes when read")
    raise UnreadableTraceError(path, f"kept changing while it was read ({', '.join(changed)}); "
                               "read it once its writer has finished")


def _ingest_once(path: str, cache_dir: str | None, options: dict[str, Any],
                 content: str | None) -> tuple[FileResult, str | None]:
    """(the file's result, None); or (a result not to use, its content id now) when the file
    changed while it was read: its parse is then left incomplete in the cache (no meta.json),
    never served."""
    file_path = Path(path)
    cached, cid, base, meta_path, events_path, _ = _cache_lookup(path, cache_dir, options,
                                                                 content)
    if cached is not None:
        return cached, None
    result = _stored(parse_batched(file_path, **options), path, cid, base, events_path)
    now = store.known_content_id(file_path, base)  # a memo hit when the file is unchanged
    if now != cid:
        return result, now
    return _completed(result, base, meta_path, events_path), None


def _parse_first(path: Path, cache_dir: str | None, options: dict[str, Any]
                 ) -> tuple[FileResult, str | None] | None:
    """A large uncompressed Kineto file the cache does not remember: parsed before it is
    hashed, keyed by the content id of exactly the bytes the parse read (the scanner hashes the
    mapped file beside its scan), then looked up. A cold ingest so reads the file once
    instead of twice (0.25 of a 262 MB file's 2.3 s; docs/performance.md, log 48); only a copy
    of a file ingested before under another name is parsed in vain.

    Whether the file changed while it was read: by its identity on disk (as the content-id
    memo tells), and by hashing it again when its identity changed. Then (the result, the
    content id now), as ``_ingest_once`` answers.

    None when this does not apply (see ``_read_once``), or when the parse did not hash what
    it read (the tolerant path) and the file may have changed since: the caller then hashes
    first and parses again."""
    before = _read_once(path, cache_dir)
    if before is None:
        return None
    base = Path(cache_dir) if cache_dir else None
    parsed = parse_batched(path, **options)
    cid = parsed.content_id or store.known_content_id(path, base)
    after = path.stat()  # after any hashing: a write before it shows, one after it changes
    unchanged = cache_folder.same_identity(before, after)  # neither the parse nor the hash
    if parsed.content_id is None and not unchanged:
        return None
    cached, cid, base, meta_path, events_path, _ = _cache_lookup(str(path), cache_dir, options,
                                                                 cid)
    if cached is not None:
        return cached, None
    result = _stored(parsed, str(path), cid, base, events_path)
    now = cid if unchanged else store.content_id(path)
    if now != cid:
        return result, now
    if base is not None and parsed.content_id is not None:
        store.remember_content_id(path, base, after, cid)
    return _completed(result, base, meta_path, events_path), None


def _read_once(path: Path, cache_dir: str | None) -> os.stat_result | None:
    """The file's identity on disk when ``_parse_first`` applies to it, else None: a large
    uncompressed Kineto file (``hashes_as_it_reads``), not remembered by the cache, and
    settled. A file written in the last two seconds (or dated in the future, copied from a
    machine whose clock is ahead) is never remembered, so hashing it first finds it in the
    cache where a parse first would parse it again at every reopen."""
    try:
        if not hashes_as_it_reads(path) or _remembered_id(path, cache_dir) is not None:
            return None
        st = path.stat()
    except OSError:
        return None  # the usual path words it
    return st if cache_folder.is_settled(st) else None


def _stored(parsed: Any, path: str, cid: str, base: Path | None, events_path: Path
            ) -> FileResult:
    """The parse's events written into the cache entry (or memory), and the file's result."""
    file_path = Path(path)
    keys = _step_keys(parsed.events)
    steps = StepsOfRows(keys)
    others = OtherCategories(steps)
    written, data, note = _write_parsed(parsed, steps, base, events_path, others)
    result = FileResult(
        path=path, format=parsed.format, size_bytes=file_path.stat().st_size, content_id=cid,
        events_path=written, ranks=[asdict(r) for r in parsed.ranks],
        input_events=parsed.input_events, stored_events=parsed.events.num_rows,
        dropped=parsed.dropped, warnings=[*parsed.warnings, *step_warnings(steps)],
        events_data=data, notes=[note] if note else [],
    )
    result.rank_facts = rank_facts(steps, others)
    result.rough_span = asdict(rough_span(result.events_source, exact=lambda: span_of_rows(
        keys["ts_ns"], keys["dur_ns"], steps.column())))
    return result


def _completed(result: FileResult, base: Path | None, meta_path: Path, events_path: Path
               ) -> FileResult:
    """The cache entry made complete by its ``meta.json``, written last (when the events went
    to its folder)."""
    if base is not None and result.events_data is None:
        try:
            store.write_json({**{k: v for k, v in asdict(result).items()
                                 if k not in _NOT_IN_META},
                              "events_file": store.events_record(events_path)}, meta_path)
        except OSError as exc:  # the events file is whole: the answer reads it; no entry
            result.notes = [cache_not_written(base, exc)]
    return result


#: FileResult fields a cache entry's meta.json leaves out: where this run found the file, and
#: what only this run's writing had to say
_NOT_IN_META = ("path", "from_cache", "events_path", "events_data", "notes")


def _write_parsed(parsed: Any, steps: StepsOfRows, base: Path | None, events_path: Path,
                  others: OtherCategories) -> tuple[str, bytes | None, str | None]:
    """Write the parse's events into the cache entry at ``events_path`` (or a private
    temporary folder when there is no cache): (the file's path, None, None). When the folder
    will not take them (a full disk, a file size limit, a read-only or vanished folder):
    ("", the Parquet file's bytes in memory, a note naming the folder and the reason). The
    trace was read: its answer does not depend on the cache's disk."""
    # the trace set assigns file_id always, and rank to a file of one rank (TraceSet.Part)
    assigned = store.ASSIGNED_COLUMNS if len(parsed.ranks) == 1 else ("file_id",)
    batched = isinstance(parsed.events, EventBatches)
    leave_out = {*parsed.events.null_columns, *assigned} if batched else assigned
    # one batch: no batch to build while the writer's thread writes (its start cost ~2 ms)
    overlap = batched and parsed.events.num_rows > parsed.events.batch_rows
    folder = base
    try:
        if base is None:
            folder = Path(tempfile.gettempdir())
            events_path = Path(tempfile.mkdtemp(prefix="traceview-")) / "events.parquet"
        if batched:
            store.write_event_batches(others.seen(batches_with_steps(parsed.events, steps)),
                                      events_path, leave_out=leave_out, overlap=overlap)
        else:
            table = with_steps(parsed.events, steps)
            others.note(table)
            store.write_events(table, events_path, omit_null_columns=True,
                               leave_out=leave_out)
        return str(events_path), None, None
    except OSError as exc:
        note = cache_not_written(folder, exc)
    others.found.clear()  # noted again as the batches pass again
    if batched:  # batches are built again from the parse (nothing is read twice)
        data = store.event_batches_bytes(others.seen(batches_with_steps(parsed.events, steps)),
                                         leave_out=leave_out, overlap=overlap)
    else:
        table = with_steps(parsed.events, steps)
        others.note(table)
        data = store.events_bytes(table, omit_null_columns=True, leave_out=leave_out)
    return "", data, note


def cache_not_written(folder: Path | None, exc: OSError) -> str:
    """The note when a cache folder will not take a write: the folder and the OS's reason
    (one text per folder and reason, so that many files make one warning)."""
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or type(exc).__name__)
    if folder is not None and is_ours(folder):  # --no-cache: this process's private folder
        return (f"temporary files not written: {folder.parent}: {reason}; answered from the "
                "parse in memory")
    return (f"cache not written: {folder}: {reason}; answered from the parse in memory (free "
            "space there, or set --cache-dir / TRACEVIEW_CACHE_DIR elsewhere)")


def _step_keys(events: pa.Table | EventBatches) -> pl.DataFrame | pa.Table:
    """The key columns steps are worked out from (the batches carry them for the whole file);
    only these are read, so no other column is copied."""
    if isinstance(events, EventBatches):
        return events.step_keys
    return events.select(["rank", "kind", "name", "ts_ns", "dur_ns", "correlation"])


def step_warnings(steps: StepsOfRows) -> list[str]:
    """What the step assignment has to say: markers whose number no int64 holds are no steps
    (a wrapped or corrupt counter); their events are kept, outside every step."""
    if not steps.oversized:
        return []
    return [f"{steps.oversized:,} ProfilerStep#N marker(s) number a step beyond 2^63-1; "
            "passed over: their events have no step"]


def with_steps(table: pa.Table, steps: StepsOfRows | None = None) -> pa.Table:
    """Fill the ``step`` column (source-agnostic, so every parser gets it the same way).
    ``steps``: the table's :class:`~traceview.store.steps.StepsOfRows`, when known already.

    The step column is set into the Arrow table, so no other column is copied.
    """
    steps = steps if steps is not None else StepsOfRows(_step_keys(table))
    return _set_step(table, steps.rows(0, table.num_rows).to_arrow())


def batches_with_steps(batches: EventBatches, steps: StepsOfRows | None = None
                       ) -> Iterator[pa.Table]:
    """The batches of a file with their ``step`` column filled. Steps need the whole file's
    key columns (which the batches carry); :class:`~traceview.store.steps.StepsOfRows` works out
    the steps of every row once, and each batch takes its slice (no copy)."""
    column = (steps if steps is not None else StepsOfRows(batches.step_keys)).column().to_arrow()
    for (start, stop), table in zip(batches.ranges(), batches, strict=True):
        yield _set_step(table, column.slice(start, stop - start))


def _set_step(table: pa.Table, step: pa.Array) -> pa.Table:
    """``table`` with ``step`` as its step column (no other column is copied)."""
    return table.set_column(table.schema.get_field_index("step"), table.schema.field("step"),
                            step)


Outcome = FileResult | tuple[str, str, int]


def _safe_ingest(path: str, cache_dir: str | None, options: dict[str, Any],
                 content: str | None = None) -> tuple[Outcome, str | None]:
    """In this process: :func:`_lookup_and_ingest`, with any other failure (a parser bug)
    reported as that file's error, so it cannot take the other ranks down."""
    try:
        return _lookup_and_ingest(path, cache_dir, options, content)
    except Exception as exc:  # noqa: BLE001
        return (path, f"{path}: cannot parse ({type(exc).__name__}: {exc})", 2), None


#: Below this much (estimated uncompressed) input, and at most this many files, ingest in
#: this process.
IN_PROCESS_BYTES = 64 << 20
IN_PROCESS_FILES = 32


def _in_process(misses: list[Path]) -> bool:
    """Whether to parse ``misses`` in this process: starting worker processes costs ~0.5 s,
    and small inputs parse faster than that here. Each file costs ~10-15 ms however small:
    1,000 rank files of 4 KB (57 MB estimated) took 20 CPU s on one core in this process
    (docs/performance.md, log 45), so many files go to the workers."""
    return len(misses) <= 1 or (len(misses) <= IN_PROCESS_FILES
                                and _estimated_bytes(misses) < IN_PROCESS_BYTES)


def _remembered_id(path: Path, cache: str | None) -> str | None:
    """The file's content id if the cache remembers it as it is on disk (no hashing)."""
    if cache is None:
        return None
    try:
        return store.remembered_content_id(path, Path(cache))
    except OSError:
        return None  # unreadable: its parse says so


def _estimated_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size * (15 if p.name.endswith(".gz") else 1) for p in paths)


def worker_count(paths: list[Path], memory_budget: int | None = None) -> int:
    """Workers: at most one per core and as many as fit the memory budget.

    A worker's peak memory grows by about 2x the uncompressed size of the file it parses
    (scanned columns plus two batches in flight: docs/performance.md); 2.5x leaves a margin.
    Gzip files are assumed to inflate 15x.
    """
    if len(paths) <= 1:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    budget = memory_budget or _available_memory() // 2
    largest = max(p.stat().st_size * (15 if p.name.endswith(".gz") else 1) for p in paths)
    by_memory = max(1, int(budget // max(1, 2.5 * largest)))
    return max(1, min(cores or 1, len(paths), by_memory))


def _available_memory() -> int:
    """The memory this process may take (the machine's, or its container's limit)."""
    found = available_memory()
    return 4 << 30 if found is None else found


def ingest(paths: Iterable[str | Path], *, cache_dir: str | Path | None = None,
           skip_bad: bool = False, rank_map: dict[str, int] | None = None,
           options: dict[str, Any] | None = None, progress: bool = False,
           executor: Executor | Any = None, run_of: str | None = None) -> IngestResult:
    """Parse every input (in parallel), then resolve ranks across files.

    ``run_of``: keep only the run this input file belongs to (``--run-of``); the files of
    other runs are listed in ``skipped`` with the reason (``traceview.store.placement``).

    ``executor``: an ``Executor``, a :class:`traceview.store.executors.ExecutorSpec`, ``"local"`` or
    ``"dask"``; None parses small inputs in this process and large ones in a local pool.
    A task that raises is retried; one that keeps failing is reported like a bad file.
    """
    named, ignored = discover_with_ignored(paths)
    # checked before anything opens them: opening a FIFO blocks, /dev/zero never ends
    bad = {f: (str(f), f"{f}: {problem}", 2) for f in named
           if (problem := file_problem(f)) is not None}
    files = [f for f in named if f not in bad]
    options = dict(options or {})
    cache = str(cache_dir) if cache_dir is not None else None
    remembered = {f: _remembered_id(f, cache) for f in files}
    if executor is None and not _in_process([f for f in files if remembered[f] is None]):
        # files never seen: most likely parsed by the pool, whose fork server imports
        # while this process looks up the others

        warm_local_pool()
    # Cache hits of files the cache remembers are answered here (no hashing): starting workers
    # to find them would cost more than reading. A file never seen is hashed and looked up by
    # the task that parses it when it is not in the cache: hashing thousands of new files here
    # first kept the workers waiting (docs/performance.md, log 43).
    looked = {f: cached_result(str(f), cache, options, remembered[f]) for f in files
              if remembered[f] is not None} if cache else {}
    hits = {f: hit for f, (hit, _, _) in looked.items()}
    ids = {f: cid for f, (_, cid, _) in looked.items()}  # hashed once, here
    healed = {f: note for f, (_, _, note) in looked.items() if note}
    misses = [f for f in files if hits.get(f) is None]
    _notice_slow_path(misses)
    if not misses:
        parsed = []
    elif executor is None and _in_process(misses):
        parsed = [_safe_ingest(str(f), cache, options, ids.get(f)) for f in misses]
    else:
        parsed = _ingest_parallel(misses, cache, options, progress, executor, ids)
    healed.update({f: note for f, (_, note) in zip(misses, parsed) if note})
    by_file = {**bad, **{f: outcome for f, (outcome, _) in zip(misses, parsed)}}
    outcomes = [hits[f] if hits.get(f) is not None else by_file[f] for f in named]
    results: list[FileResult] = []
    skipped: list[tuple[str, str]] = []
    for outcome in outcomes:
        if isinstance(outcome, FileResult):
            results.append(outcome)
        elif skip_bad and len(named) > 1:
            skipped.append((outcome[0], outcome[1]))
        else:
            raise _error(outcome)
    if not results:
        raise UnreadableTraceError(", ".join(str(f) for f in named), "no readable trace")
    left_out: list[tuple[str, str]] = []
    rank_of, window_of = place(results, rank_map or {}, skipped if skip_bad else None,
                               run_of=run_of, left_out=left_out)
    skipped += left_out
    skipped += [(str(p), _passed_over(p)) for p in ignored]
    # a cache folder that will not take writes is said once, not once per file
    written = list(dict.fromkeys(note for r in results for note in r.notes))
    return IngestResult(files=results, rank_of=rank_of, skipped=skipped, window_of=window_of,
                        notes=[*(f"{f}: {healed[f]}" for f in files if f in healed),
                               *written])


#: Kineto input (uncompressed, estimated) from which a parse on the pure-Python path is worth a
#: notice: below it the difference is under a second.
SLOW_PATH_NOTICE_BYTES = IN_PROCESS_BYTES


def _notice_slow_path(misses: list[Path]) -> None:
    """One line on stderr when a large Kineto ingest runs on the pure-Python path (3-4.6x
    slower, ~3.6x the memory): why, and the fix. A notice, not a warning: the answer is the
    same (a warning would reach ``check`` as damaged input)."""
    try:
        size = _estimated_bytes([f for f in misses if family(detect_format(f)) == "kineto"])
    except OSError:
        return  # an unreadable file: its parse says so
    if size < SLOW_PATH_NOTICE_BYTES:
        return

    path, why = kineto.parser_path()
    if why:
        print(f"traceview: note: parsing {size / 1e6:,.0f} MB of Kineto JSON on the {path} "
              f"path, 3-4.6x slower than the C scanner: {why}; {kineto.SCANNER_FIX}",
              file=sys.stderr)


def _ingest_task(path: str, cache_dir: str | None, options: dict[str, Any],
                 content: str | None = None) -> FileResult | tuple[str, str, int]:
    """The per-file task on an executor: a bad trace is an answer (no retry); anything else
    (a worker that died, an I/O error) raises so that the attempt is retried."""
    try:
        return ingest_file(path, cache_dir, options, content)
    except TraceviewError as exc:
        return (path, str(exc), exc.exit_code)


def _lookup_and_ingest(path: str, cache_dir: str | None, options: dict[str, Any],
                       content: str | None = None) -> tuple[Outcome, str | None]:
    """(:func:`_ingest_task`'s answer, the note of a damaged cache entry discarded or None),
    looking the file up in the cache first when the caller did not (``content`` None)."""
    note = None
    if cache_dir is not None and content is None and _read_once(Path(path), cache_dir) is None:
        hit, content, note = cached_result(path, cache_dir, options)
        if hit is not None:
            return hit, note
    return _ingest_task(path, cache_dir, options, content), note


#: Small files go to the workers in batches of up to this much estimated input (and
#: ``batched.MOST_PER_BATCH`` files): a file of a few KB parses in ~40 ms, and a task of its
#: own added a pool round trip to each (docs/performance.md, log 43).
BATCH_BYTES = IN_PROCESS_BYTES


def _ingest_parallel(files: list[Path], cache: str | None, options: dict[str, Any],
                     progress: bool, executor: Any, ids: dict[Path, str | None] | None = None,
                     ) -> list[tuple[Outcome, str | None]]:
    """Map :func:`_lookup_and_ingest` over the files on ``executor``: an ``Executor``, an
    ``ExecutorSpec``, ``"local"``/``"dask"``, or None (own local pool sized by memory).
    Small files go in batches (:mod:`traceview.store.batched`)."""
    if isinstance(executor, str):
        executor = ExecutorSpec(executor)
    retries = executor.retries if isinstance(executor, ExecutorSpec) else 2
    if executor is None or (isinstance(executor, ExecutorSpec) and executor.kind == "local"):
        workers = (executor.max_workers if isinstance(executor, ExecutorSpec) else None) \
            or worker_count(files)
        ctx: Any = open_executor(ExecutorSpec("local", max_workers=workers, retries=retries))
        replace = lambda: local_pool(workers)  # noqa: E731 - a dead worker breaks the pool
    elif isinstance(executor, ExecutorSpec):
        ctx, replace = open_executor(executor), None
        workers = executor.max_workers or cores()
    else:
        ctx, replace, workers = nullcontext(executor), None, cores()
    batches = plan_batches([_estimated_bytes([f]) for f in files], workers=workers,
                           budget=BATCH_BYTES)
    line = ProgressLine([_estimated_bytes([f]) for f in files]) if progress else None
    with ctx as pool:
        raw = run_batched(pool, _lookup_and_ingest,
                          [(str(f), cache, options, (ids or {}).get(f)) for f in files],
                          batches, retries=retries,
                          on_result=(lambda i, _: line.done(i)) if line else None,
                          replace_pool=replace)
    if line:
        line.close()
    return [((t.args[0], f"{t.args[0]}: cannot parse ({t.error}; failed {t.attempts} "
              f"attempts)", 2), None) if isinstance(t, TaskFailure) else t for t in raw]


def _error(outcome: tuple[str, str, int]) -> TraceviewError:
    error = TraceviewError(outcome[1])
    error.exit_code = outcome[2]
    return error


__all__ = ["FileResult", "IngestResult", "RankInfo", "discover", "ingest", "resolve_ranks"]
