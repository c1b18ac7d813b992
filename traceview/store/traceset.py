"""TraceSet: one run's ranks, opened once, queried many times (frames, SQL, pandas).

>>> import traceview                                   # doctest: +SKIP
>>> ts = traceview.open("fixtures/data/gloo_ddp_2r")   # doctest: +SKIP
>>> ts.sql("select rank, count(*) as n from events group by rank")  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceview import schema
from traceview.errors import UnreadableTraceError, UsageError
from traceview.store import cache_folder
from traceview.store import parquet as store
from traceview.store import remote as remote_store
from traceview.store import store_tables
from traceview.store.compacted import compacted_events
from traceview.store.executors import ExecutorSpec
from traceview.store.ingest import ingest
from traceview.store.ingested import IngestResult
from traceview.store.parts import Part, confined_name, part_entry, part_of, scan_parts
from traceview.store.placement import rank_info_rows, select_window
from traceview.store.rank_facts import by_final_rank
from traceview.store.safe_write import (
    check_folder_target,
    made_folder,
    private_folder,
    refuse_input_overlap,
    remove_stale_temporaries,
    write_folder,
)
from traceview.store.windows import WindowChoice, chosen_windows

WINDOW_SCHEMA = store_tables.WINDOW_SCHEMA


#: Drop reasons that are not damage (an E merged into its B event, NVTX naming rows, a launcher
#: process without a rank), or that have a warning of their own (truncation, the bounds on one
#: event).
_DROPS_WITHOUT_WARNING = frozenset({"end_merged_into_begin", "nvtx_not_an_event",
                                    "event_over_size_bound", "event_over_depth_bound",
                                    "no_rank_for_process", "truncated"})


_SPAN_KEYS = ("first_step", "last_step", "start_ns", "end_ns")


class TraceSet:
    """The events of one run (all ranks, long form) with its ranks and files tables."""

    #: (rank, file_id) -> that rank's events per kind, span and GPU events without a launch,
    #: as its ingest learnt them (``rank_facts.by_final_rank``); None where they are not known
    #: (a store, a cache entry written before them, a rank of several files)
    rank_facts: dict[tuple[int, int], dict[str, Any]] | None = None

    def __init__(self, parts: list[Part], ranks: pl.DataFrame, files: pl.DataFrame,
                 skipped: Sequence[tuple[str, str]] = (),
                 windows: pl.DataFrame | None = None,
                 rows: dict[str, int] | None = None) -> None:
        self._parts = parts
        #: rows of the events files where their ingest counted them (path -> rows): no footer
        #: read per file to know which ranks have events
        self._rows = dict(rows or {})
        self.ranks = ranks
        self.files = files
        #: ``rank, window, file_id``: the profiling windows of each rank and their files
        #: (``traceview.store.windows``); one window (0) per rank unless a rank has several files
        self.windows = (windows if windows is not None else
                        ranks.select("rank", pl.lit(0).alias("window"), "file_id")
                        ).cast(WINDOW_SCHEMA).sort("rank", "window")
        self.skipped = list(skipped)
        #: warnings about how the files were read rather than what they hold (an unusable
        #: cache folder, a damaged cache entry parsed again): ``warnings`` lists them first,
        #: ``data_warnings`` leaves them out (they are no damage of the input)
        self.notes: list[str] = []
        #: where per-rank work runs (``traceview.store.executors.ExecutorSpec``/``Executor``), or None
        self.executor: Any = None
        #: the cache folder the events files live in (results derived from them may be kept
        #: there too: ``traceview.store.derived``); None for a store, a URL or ``cache=False``
        self.cache_dir: str | Path | None = None
        self._frame: pl.LazyFrame | None = None  # events held in memory (``from_frame``)
        #: where many small events files are compacted into one (``traceview.store.compacted``):
        #: the cache folder, or this process's private one under ``cache=False``
        self.compact_dir: str | Path | None = None
        self._compacted: tuple[list[Part], pl.LazyFrame | None] | None = None

    @classmethod
    def from_frame(cls, events: pl.LazyFrame | pl.DataFrame,
                   ranks: pl.DataFrame | None = None) -> TraceSet:
        """A trace set over events already in memory (a notebook's frame, a test's hand-made
        timeline); ``ranks``: its ranks table (hosts, world size), else one row per rank."""
        frame = events.lazy()
        if ranks is None:
            present = frame.select(pl.col("rank").unique().sort()).collect()
            ranks = present.select(pl.col("rank").cast(pl.Int32), file_id=pl.lit(0, pl.Int32),
                                   source=pl.lit("memory"))
            empty = pl.DataFrame(schema=schema.polars_schema(schema.RANK_COLUMNS))
            ranks = pl.concat([empty, ranks], how="diagonal_relaxed")
        ts = cls([], ranks, pl.DataFrame(schema=schema.polars_schema(schema.FILE_COLUMNS)))
        ts._frame = frame
        return ts

    @property
    def events(self) -> pl.LazyFrame:
        """All events as a Polars LazyFrame in the schema of ``traceview.schema``."""
        if self._frame is not None:
            return self._frame
        if not self._parts:
            return schema.empty_events().lazy()
        if self._compacted is None or self._compacted[0] is not self._parts:
            # once per set of parts (a window chosen later makes another set)
            frame, notes = compacted_events(self._parts, self.compact_dir)
            self.notes += notes
            self._compacted = (self._parts, frame)
        frame = self._compacted[1]
        return frame if frame is not None else scan_parts(self._parts)

    def analysis_events(self) -> pl.LazyFrame:
        """The events without ``args_json``: every column an analysis reads, and a fraction of
        the bytes (the raw args text is most of a trace), so collecting a window is cheap."""
        return self.events.drop("args_json", strict=False)

    def ranks_with_events(self) -> list[int] | None:
        """The ranks with at least one event, from the row counts in the files' footers (no
        event is read); None when a file holds several ranks or is not a local file (then
        only its events can tell)."""
        if self._frame is not None or not all(type(p) is Part and p.rank is not None
                                              and p.on_disk for p in self._parts):
            return None
        return sorted({p.rank for p in self._parts
                       if (self._rows[p.path] if p.path in self._rows
                           else store.row_count(p.path)) > 0})

    def parts_of(self, rank: int) -> list[Any]:
        """The parts (events files) that hold the events of ``rank``: one per window."""
        files = set(self.windows.filter(pl.col("rank") == rank)["file_id"].to_list())
        return [p for p in self._parts if p.rank in (None, rank)
                and (p.file_id is None or p.file_id in files)]

    def window_spans(self) -> pl.DataFrame:
        """The ``windows`` table with each window's file path, ``first_step``, ``last_step``,
        ``start_ns`` and ``end_ns`` (first start, last end of its events; reads four columns
        of every event; none when the ingest noted them, ``rank_facts``)."""
        if self.rank_facts is not None:
            spans = pl.DataFrame(
                [{"rank": rank, "file_id": file_id,
                  **{k: facts["span"].get(k) for k in _SPAN_KEYS}}
                 for (rank, file_id), facts in self.rank_facts.items()],
                schema={"rank": WINDOW_SCHEMA["rank"], "file_id": WINDOW_SCHEMA["file_id"],
                        **dict.fromkeys(_SPAN_KEYS, pl.Int64)})
        else:
            spans = (self.events.group_by("rank", "file_id").agg(
                first_step=pl.col("step").min(), last_step=pl.col("step").max(),
                start_ns=pl.col("ts_ns").min(),
                end_ns=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max()).collect())
        return (self.windows.join(self.files.select("file_id", "path"), on="file_id", how="left")
                .join(spans, on=["rank", "file_id"], how="left").sort("rank", "window"))

    def kernels(self) -> pl.LazyFrame:
        """GPU kernels only."""
        return self.events.filter(pl.col("kind") == "kernel")

    @property
    def warnings(self) -> list[str]:
        """What reading the files said: the ``notes`` on how they were read, then
        ``data_warnings``."""
        return [*self.notes, *self.data_warnings]

    @property
    def data_warnings(self) -> list[str]:
        """What the files said about their data: damage, assumptions, and events dropped (one
        line with the counts for a file whose parser dropped damaged events)."""
        out: list[str] = []
        for path, warns, dropped in self.files.select("path", "warnings", "dropped").iter_rows():
            out += [f"{path}: {w}" for w in orjson.loads(warns or "[]")]
            unexplained = {k: n for k, n in orjson.loads(dropped or "{}").items()
                           if k not in _DROPS_WITHOUT_WARNING and n}
            if unexplained:
                counts = ", ".join(f"{n} {why}" for why, n in sorted(unexplained.items()))
                out.append(f"{path}: {sum(unexplained.values())} input events dropped "
                           f"({counts}; info --json lists them)")
        return out

    def sql(self, query: str, *, events: pl.LazyFrame | None = None,
            tables: Mapping[str, Callable[[], pl.LazyFrame]] | None = None) -> pl.DataFrame:
        """Run SQL over the tables ``events``, ``kernels``, ``ranks``, ``files`` and
        ``windows``. ``events``: a selection of the events to query instead of all of them;
        ``tables``: more tables by name, each made only when the query names it (the Run's
        classified ``gpu`` rows cost a pass over the GPU events)."""
        # Names are Categorical in the store (compact, fast to group); SQL's LIKE and string
        # functions want text, so the query sees them as plain strings (cast lazily: only
        # the columns a query reads are cast).
        events = (self.events if events is None else events).with_columns(
            pl.col(pl.Categorical).cast(pl.String))
        kernels = events.filter(pl.col("kind") == "kernel")
        named = {name: make().with_columns(pl.col(pl.Categorical).cast(pl.String))
                 for name, make in (tables or {}).items()
                 if re.search(rf"\b{re.escape(name)}\b", query, re.IGNORECASE)}
        context = pl.SQLContext(events=events, kernels=kernels,
                                ranks=self.ranks.lazy(), files=self.files.lazy(),
                                windows=self.windows.lazy(), **named)
        try:
            return context.execute(query, eager=True)
        except (pl.exceptions.SQLInterfaceError, pl.exceptions.SQLSyntaxError,
                pl.exceptions.ColumnNotFoundError, pl.exceptions.InvalidOperationError) as exc:
            first = str(exc).splitlines()[0]
            # the classification is not an events column: say which table has it
            hint = ("; gpu_class and gpu_subclass are columns of the table gpu "
                    "(the classified GPU rows: select ... from gpu)"
                    if "gpu_class" in first or "gpu_subclass" in first else "")
            raise UsageError(f"SQL error: {first}{hint}") from None

    def to_pandas(self) -> Any:
        """All events as a pandas DataFrame (categoricals stay categorical)."""
        return self.events.collect().to_pandas()

    def write_store(self, out_dir: str | Path) -> Path | str:
        """Write a self-contained store folder: the events files and the small tables, with a
        manifest that says which rank and file each events file holds.

        Each events file of this set goes into the store as it is: hard-linked from the cache
        when the store is on the cache's filesystem, else copied (a file of compressed
        Parquet, a tenth of its trace); nothing is decoded or encoded again, so writing a
        store costs about what reading the cache does. ``out_dir`` may be a URL (``file://``,
        ``s3://``, ``memory://`` ...); then, or when this TraceSet was opened with an
        executor, the workers write one file per rank
        (:func:`traceview.store.remote.write_store`).
        """
        if remote_store.is_url(out_dir):
            return remote_store.write_store(self, out_dir, executor=self.executor)
        if self.executor is not None or not all(type(p) is Part for p in self._parts):
            out = check_folder_target(out_dir)
            with made_folder(out):  # removed again, empty, when the write fails
                remove_stale_temporaries(out)
                write_folder(out, lambda stage: _store_files_in(remote_store.write_store(
                    self, str(stage), executor=self.executor)))
            return str(out_dir)
        out = check_folder_target(out_dir)
        # Never over what is read: the input files, nor a store's own rank files.
        refuse_input_overlap(out, [*self.files["path"].to_list(),
                                   *{str(Path(p.path).parent) for p in self._parts
                                     if p.on_disk}])
        with made_folder(out):  # removed again, empty, when the write fails
            remove_stale_temporaries(out)  # a killed ``ingest -o``'s leftovers
            # Beside, then over: an old store stays whole until every file of the new one is.
            write_folder(out, self._write_store_files)
        return out

    def _write_store_files(self, folder: Path) -> list[str]:
        """This set's store files into ``folder``; their names, the manifest last."""
        names = _store_file_names(self._parts)
        for part, name in zip(self._parts, names):
            if part.on_disk:
                _link_or_copy(Path(part.path), folder / name)
            else:  # the cache's disk would not take it: the store gets the bytes
                (folder / name).write_bytes(part.data)
        self.ranks.write_parquet(folder / "ranks.parquet")
        self.files.write_parquet(folder / "files.parquet")
        self.windows.write_parquet(folder / "windows.parquet")
        # each events file's size and hash: opening the store checks them (_check_store_file)
        store.write_json({"traceview_store": store.CACHE_VERSION,
                          "schema_version": schema.SCHEMA_VERSION,
                          "ranks": self.ranks["rank"].to_list(),
                          "parts": [part_entry(p, n) for p, n in zip(self._parts, names)],
                          "files": {n: store.events_record(folder / n) for n in names}},
                         folder / store.STORE_MANIFEST)
        return [*names, "ranks.parquet", "files.parquet", "windows.parquet",
                store.STORE_MANIFEST]

    def __repr__(self) -> str:
        n = self.files["stored_events"].sum() if self.files.height else 0
        return f"<TraceSet {self.ranks.height} ranks, {self.files.height} files, {n} events>"

    def _repr_html_(self) -> str:
        summary = self.ranks.select("rank", "world_size", "source", "backend", "file_id").join(
            self.files.select("file_id", "path", "stored_events"), on="file_id", how="left")
        return f"<p>{self!r}</p>" + summary._repr_html_()


def open(paths: str | Path | Iterable[str | Path], *, skip_bad: bool = False,  # noqa: A001
         rank_map: dict[str, int] | None = None, cache: bool = True,
         cache_dir: str | Path | None = None, progress: bool = False,
         options: dict[str, Any] | None = None, executor: Any = None,
         scheduler: str | None = None, window: WindowChoice = None,
         run_of: str | Path | None = None) -> TraceSet:
    """Open trace files, folders of traces, or a store (folder or URL) written by ``ingest -o``.

    ``run_of``: when the inputs hold several runs (files of one rank that are not one
    process's profiling windows, or files of two jobs: ``traceview.store.runs``), keep the run
    this input file belongs to; without it such inputs raise ``TwoRunsError``.

    ``window``: one profiling window of each rank (``traceview.store.windows``): its number, from
    0, or ``"last"``; None (default) keeps every window. Out of range: ``UsageError``.

    ``executor``: where files are parsed: ``"local"`` (local processes), ``"dask"`` (with
    ``scheduler`` ADDRESS, or a local cluster started and closed here), an
    ``ExecutorSpec`` or any ``concurrent.futures.Executor``; None: in this process for small
    inputs, local processes for large ones.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise UsageError("no input paths")
    if isinstance(executor, str) or scheduler:
        executor = ExecutorSpec(executor or "dask", scheduler=scheduler)

    urls = [p for p in items if remote_store.is_url(p)]
    if run_of is not None and (urls or any(store.is_store(Path(p)) for p in items)):
        raise UsageError("--run-of picks among trace files; a store already holds one run")
    if urls:
        url = str(urls[0])  # clients without a network retry for minutes: bounded
        if len(items) > 1:
            raise UsageError(f"{url}: a URL input must be the only input (a traceview store)")
        problem = remote_store.within_deadline(url, remote_store.store_problem, url)
        if problem is not None:
            raise UnreadableTraceError(url, problem)
        parts, ranks, files, windows = remote_store.within_deadline(
            url, remote_store.read_store, url)
        return _only_window(TraceSet(parts, ranks, files, windows=windows), window)
    stores = [Path(p) for p in items if store.is_store(Path(p))]
    if stores:
        if len(items) > 1:
            raise UsageError("a store folder must be the only input")
        return _only_window(_open_store(stores[0]), window)
    notes: list[str] = []
    if cache:
        cache_dir, note = _usable_cache_dir(cache_dir, items)
        if note:
            notes.append(note)
            cache = False
    if not cache:
        cache_dir = _temporary_cache_dir()
    result = ingest(items, cache_dir=cache_dir, skip_bad=skip_bad, rank_map=rank_map,
                    options=options, progress=progress, executor=executor,
                    run_of=str(run_of) if run_of is not None else None)
    ts = _from_ingest(select_window(result, window))
    ts.notes = [*notes, *result.notes]
    ts.executor = executor
    ts.cache_dir = cache_dir if cache else None  # a temporary folder is not worth keeping in
    ts.compact_dir = cache_dir  # ... but many files are worth reading as one within a command
    return ts


def _usable_cache_dir(cache_dir: str | Path | None, inputs: list[Any]
                      ) -> tuple[Path | None, str | None]:
    """(the cache folder to use, None; or None and a warning saying why there is none): the
    default or given folder when it can be written, never one inside an input folder."""
    try:
        folder = Path(cache_dir) if cache_dir not in (None, "") else cache_folder.default_cache_dir()
    except RuntimeError as exc:  # no home folder to put the default under
        return None, (f"no cache folder ({exc}); working without a cache (set "
                      "TRACEVIEW_CACHE_DIR or --cache-dir to a writable folder)")
    fix = ("working without a cache (set TRACEVIEW_CACHE_DIR or --cache-dir to a writable "
           "folder, or pass --no-cache to silence this)")
    resolved = folder.expanduser().resolve()
    for item in inputs:
        if not Path(item).is_dir():  # files (or link loops: ingest names them) hold no cache
            continue
        source = Path(item).resolve()
        if resolved == source or resolved.is_relative_to(source):
            return None, f"cache folder {folder} is inside the input folder {item}; {fix}"
    problem = store.unusable_cache_dir(folder)
    if problem:
        return None, f"cache folder {folder} cannot be written ({problem}); {fix}"
    for shared in ("ids", "derived", "answers"):  # entries' own are swept when looked up
        remove_stale_temporaries(folder / shared)
    return folder, None


def _temporary_cache_dir() -> str:
    """A private cache folder for this process, removed at exit. Lazy frames read its Parquet
    files after ``open`` returns, possibly after the TraceSet is gone
    (``open(p, cache=False).events.collect()``). Those of earlier processes that were killed
    are removed first (only folders named as this function names them)."""
    tmp = Path(tempfile.gettempdir())
    remove_stale_temporaries(tmp, _TEMPORARY_CACHE)
    folder = str(private_folder(tmp, _TEMPORARY_CACHE))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


#: The name private cache folders are temporaries of (``.traceview-cache.traceview-...tmp``).
_TEMPORARY_CACHE = "traceview-cache"


def _from_ingest(result: IngestResult) -> TraceSet:
    parts = []
    # each file's ranks gathered in one pass (a pass over every file's ranks per file grew as
    # files^2: 5,000 rank files made 25 M look-ups)
    mappings: dict[int, dict[int, int]] = {}
    for (fi, parsed), final in result.rank_of.items():
        mappings.setdefault(fi, {})[parsed if parsed is not None else 0] = final
    for i, file in enumerate(result.files):
        mapping = mappings.get(i, {})
        single = next(iter(mapping.values())) if len(file.ranks) == 1 else None
        parts.append(Part(file.events_path, i, single, mapping, data=file.events_data))
    ranks = pl.DataFrame(rank_info_rows(result), schema=schema.polars_schema(schema.RANK_COLUMNS))
    files = pl.DataFrame([{
        "file_id": i, "path": f.path, "format": f.format, "size_bytes": f.size_bytes,
        "content_id": f.content_id, "input_events": f.input_events,
        "stored_events": f.stored_events, "dropped": orjson.dumps(f.dropped).decode(),
        "warnings": orjson.dumps(f.warnings).decode()} for i, f in enumerate(result.files)],
        schema=schema.polars_schema(schema.FILE_COLUMNS))
    windows = pl.DataFrame(
        [{"rank": rank, "window": result.window_of.get((i, rank), 0), "file_id": i}
         for i, rank in {(i, rank) for (i, _), rank in result.rank_of.items()}],
        schema=WINDOW_SCHEMA)
    out = TraceSet(parts, ranks.sort("rank"), files, result.skipped, windows,
                   rows={f.events_path: f.stored_events for f in result.files})
    out.rank_facts = by_final_rank(result.files, result.rank_of)
    return out


def _store_file_names(parts: Sequence[Part]) -> list[str]:
    """A store's name for each events file: ``rank-NNNNN.parquet`` for a rank's only file,
    else ``file-NNNNN.parquet`` (a file of several ranks, or one of a rank's windows)."""
    per_rank = Counter(p.rank for p in parts)
    return [f"rank-{p.rank:05d}.parquet" if p.rank is not None and per_rank[p.rank] == 1
            else f"file-{i:05d}.parquet" for i, p in enumerate(parts)]


def _store_files_in(folder: str) -> list[str]:
    """The files a store writer put in ``folder``, its manifest last (it makes the store)."""
    names = sorted(n for n in os.listdir(folder) if n != store.STORE_MANIFEST)
    return [*names, store.STORE_MANIFEST]


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` (a new name) holds ``source``'s bytes: a hard link when both lie on one
    filesystem (the cache writes a new file for a new entry and never changes one in place, so
    the link stays valid), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _open_store(folder: Path) -> TraceSet:
    """A store folder as a TraceSet; a damaged store is an :class:`UnreadableTraceError`
    naming the damaged file (its files are checked against the sizes and hashes the manifest
    recorded, where it recorded them)."""
    manifest_path = folder / store.STORE_MANIFEST
    try:
        manifest = store.read_json(manifest_path)
    except (OSError, ValueError) as exc:
        raise UnreadableTraceError(manifest_path, f"damaged store manifest ({exc}): ingest "
                                   "the traces again") from None
    if not isinstance(manifest, dict):
        raise UnreadableTraceError(manifest_path, "damaged store manifest: ingest the traces "
                                   "again")
    if manifest.get("schema_version") != schema.SCHEMA_VERSION:
        raise UnreadableTraceError(folder, f"store has schema version "
                                   f"{manifest.get('schema_version')}, this traceview reads "
                                   f"{schema.SCHEMA_VERSION}: ingest the traces again")
    ranks = _read_store_table(folder / "ranks.parquet", store_tables.STORE_RANK_SCHEMA)
    files = _read_store_table(folder / "files.parquet", store_tables.STORE_FILE_SCHEMA)
    if "parts" in manifest:
        if not isinstance(manifest["parts"], list):
            raise UnreadableTraceError(manifest_path, "damaged store manifest (parts is not "
                                       "a list): ingest the traces again")
        parts = [part_of(str(folder / confined_name(entry, manifest_path)), entry)
                 for entry in manifest["parts"]]
    else:
        # written one file per rank (by the workers): a rank file holds all the rank's
        # windows, each row with its own file_id
        parts = [Part(str(folder / f"rank-{r:05d}.parquet"), None, r)
                 for r in ranks["rank"].to_list()]
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not all(
            isinstance(recorded.get(Path(p.path).name), dict) for p in parts):
        # the sizes and hashes are what ties the events files to the manifest
        raise UnreadableTraceError(manifest_path, "store manifest has no integrity record "
                                   "(files: size and hash of each events file): ingest the "
                                   "traces again")
    for part in parts:
        _check_store_file(Path(part.path), recorded[Path(part.path).name])
    windows = folder / "windows.parquet"  # absent in stores written before windows existed
    return TraceSet(parts, ranks, files,
                    windows=_read_store_table(windows, WINDOW_SCHEMA) if windows.is_file()
                    else None)


def _read_store_table(path: Path, required: dict[str, pl.DataType]) -> pl.DataFrame:
    return store_tables.read_store_table(path, path, required)


def _hash_memo_dir() -> Path | None:
    """Where the hashes of checked store files are remembered (the cache folder, when there
    is one), so a large store is hashed once, not on every open."""
    try:
        folder = cache_folder.default_cache_dir()
    except RuntimeError:
        return None
    return folder if folder.is_dir() else None


def _check_store_file(path: Path, record: Any) -> None:
    """A store's rank file is there, ends in a Parquet footer, and (when the manifest
    recorded them) has the size and hash it was written with; its footer is traceview's."""
    problem = None
    try:
        if isinstance(record, dict):
            if path.stat().st_size != record.get("bytes"):
                problem = f"{path.stat().st_size} bytes, {record.get('bytes')} were written"
            elif store.known_content_id(path, _hash_memo_dir()) != record.get("xxh3"):
                problem = "content changed since it was written"
    except Exception as exc:  # noqa: BLE001 - any failure to read it is damage
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if problem is None:  # the footer reads (one read), and is traceview's
        if found := store_tables.events_footer_problem(path):
            raise UnreadableTraceError(path, f"{found}: ingest the traces again")
    if problem:
        raise UnreadableTraceError(path, f"damaged store file ({problem}): ingest the traces "
                                   "again")


def _only_window(ts: TraceSet, window: WindowChoice) -> TraceSet:
    """A store's TraceSet restricted to one profiling window of each rank (None: all)."""
    if window is None:
        return ts

    if not all(type(p) is Part for p in ts._parts):
        raise UsageError("--window on a store at a URL: copy the store to a folder first, or "
                         "open the trace files")
    window_of = {(fid, rank): n for rank, n, fid in ts.windows.iter_rows()}
    chosen = chosen_windows(window_of, window)
    kept = ts.windows.filter([(f, r) in chosen for r, f in
                              ts.windows.select("rank", "file_id").iter_rows()])
    files = tuple(kept["file_id"].to_list())
    # a file of the set is kept or not; a rank file of an older store keeps the chosen rows
    ts._parts = [p if p.file_id is not None else
                 Part(p.path, p.file_id, p.rank, p.rank_map, files, p.data)
                 for p in ts._parts if p.file_id is None or p.file_id in files]
    ts.windows = kept
    ts.files = ts.files.filter(pl.col("file_id").is_in(files))
    ts.ranks = ts.ranks.drop("file_id").join(kept.select("rank", "file_id"), on="rank",
                                             how="left").select(ts.ranks.columns)
    return ts
