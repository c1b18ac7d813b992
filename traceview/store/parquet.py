"""The Parquet event store: cache entries for parsed files, and self-contained store folders.

Cache entries are keyed by content identity: an xxh3-128 hash of the file's bytes, the parser
version, the schema version and the parser options. A changed file has another key, so a stale
entry is never served; hashing runs at several GB/s, so checking costs little next to parsing.
Every write goes to a temporary name in the same folder and is renamed into place (atomic).

A store folder (``traceview ingest -o DIR``) holds one Parquet file per rank (zstd), plus
``ranks.parquet``, ``files.parquet`` and ``traceview-store.json``. It is itself a valid input.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl
import xxhash

from traceview import schema
from traceview._dependencies import lazy_module
from traceview.store.cache_folder import identity, is_settled, untrusted, untrusted_files
from traceview.store.safe_write import atomic_write, remove_stale_temporaries

if TYPE_CHECKING:
    import polars as pl

#: Imported on first use (~0.1-0.2 s with numpy): a run read from the cache reads Parquet
#: through Polars and needs none of it (log 41 of docs/performance.md).
pa = lazy_module("pyarrow")
pq = lazy_module("pyarrow.parquet")

STORE_MANIFEST = "traceview-store.json"
#: Part of every cache key. 2: cache files may leave all-null columns out (``scan_events``
#: gives them back), which a reader of version 1 would not expect. 3: ``meta.json`` records
#: the size and hash of its events file (``read_cache_meta`` checks them). 5: cache files
#: also leave out the columns the trace set assigns (``ASSIGNED_COLUMNS``), and a store may
#: list its files in its manifest (``parts``), so a store file can be a cache file linked or
#: copied.
CACHE_VERSION = 5

#: Columns a parser can only guess (file_id is the file's place in the set; a one-rank file's
#: rank comes from its name or ``--rank-map`` as often as from the trace): the trace set
#: assigns them when it reads a file, so a cache file does not store a placeholder that a
#: store file copied from it, read by another tool, would show as if it were true.
ASSIGNED_COLUMNS = ("rank", "file_id")


def content_id(path: Path) -> str:
    """xxh3-128 of the file's bytes, read into one reused 4 MiB buffer: as fast as hashing a
    memory map (0.044 against 0.046 s for 150 MB), and a file cut or unreadable meanwhile is an
    OSError or other bytes, where a mapped page that cannot be read kills the process
    (SIGBUS). Reading new blocks (``fh.read``) was ~3x slower: an allocation and copy each."""
    digest = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as fh:
        # a small file's size, plus one byte to see its end: a 4 MiB buffer zeroed for a
        # file of a few KB cost ~0.3 ms (twice per ingested file; docs/performance.md, log 45)
        buffer = bytearray(min(1 << 22, os.fstat(fh.fileno()).st_size + 1))
        view = memoryview(buffer)
        while n := fh.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def unusable_cache_dir(folder: Path) -> str | None:
    """Why ``folder`` cannot hold the cache (made when missing, then written to), or None when
    it can. Checked once per command: a read-only folder, a missing parent that cannot be made,
    a file in its place all fail here, before any trace is read."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".probe.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


class BrokenCacheEntry(Exception):
    """A cache entry that is there but cannot be used: ``path`` is the damaged file."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UntrustedCacheEntry(BrokenCacheEntry):
    """A cache entry another user could have written (``cache_folder.untrusted``): never
    read, and never written into (the parse's events go to a private folder)."""


def events_record(events_path: Path) -> dict[str, Any]:
    """What a cache entry's ``meta.json`` records of its events file, to check it by: its size
    and content hash (a truncated, emptied or flipped file never passes for the original)."""
    return {"bytes": events_path.stat().st_size, "xxh3": content_id(events_path)}


def read_cache_meta(entry: Path, cache_dir: Path) -> dict[str, Any] | None:
    """The metadata of the complete cache entry in folder ``entry`` (``meta.json``, checked
    against its ``events.parquet``), or None when the entry is not complete (never written, or
    its writer was killed before ``meta.json``, which is written last). Raises
    :class:`BrokenCacheEntry` when an entry is there but damaged.

    The events file is checked by size and content hash (remembered by its identity on disk,
    as input files' are: :func:`known_content_id`), so any change since it was written is
    caught here, before a reader meets it half way through a query."""
    meta_path, events_path = entry / "meta.json", entry / "events.parquet"
    remove_stale_temporaries(entry)  # a killed writer's leftovers
    if not meta_path.exists():
        return None
    distrusted = untrusted_files(entry, meta_path, events_path)
    if distrusted is not None:  # planted by another user in a shared cache folder
        raise UntrustedCacheEntry(distrusted[0], f"{distrusted[1]}: not trusted")
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as exc:
        raise BrokenCacheEntry(meta_path, f"not readable JSON ({exc})") from None
    record = meta.pop("events_file", None) if isinstance(meta, dict) else None
    if not isinstance(record, dict):
        raise BrokenCacheEntry(meta_path, "does not describe its events file")
    try:
        size = events_path.stat().st_size
    except OSError:
        raise BrokenCacheEntry(events_path, "missing") from None
    if size != record.get("bytes"):
        raise BrokenCacheEntry(events_path, f"{size} bytes, {record.get('bytes')} were written")
    if known_content_id(events_path, cache_dir) != record.get("xxh3"):
        raise BrokenCacheEntry(events_path, "content changed since it was written")
    return meta


def discard_cache_entry(entry: Path) -> None:
    """Mark a damaged entry incomplete (its ``meta.json`` removed); parsing the file again
    writes it anew. The folder stays: a concurrent run may be writing into it right now. An
    entry that cannot be changed (another user's, in a shared cache) stays as it is: it fails
    its check again next time, and the parse's answer comes from memory meanwhile."""
    try:
        (entry / "meta.json").unlink(missing_ok=True)
    except OSError:
        pass


def known_content_id(path: Path, cache_dir: Path | None) -> str:
    """:func:`content_id`, remembered in the cache folder by the file's identity on disk
    (device, inode, size, mtime and ctime in ns; as git's index and ccache do), so reopening
    large inputs does not hash them again (~0.1 s per 300 MB). Any write changes the ctime,
    which no tool can set back, so a changed file is always hashed anew; files written in the
    last two seconds are never remembered (see ``cache_folder.SETTLED_NS``)."""
    if cache_dir is None:
        return content_id(path)

    # stat before hashing: a file changed meanwhile is remembered under its old identity,
    # which no longer matches
    st = path.stat()
    known = _remembered(_content_id_memo(path, cache_dir, st))
    if known is not None:
        return known
    found = content_id(path)
    remember_content_id(path, cache_dir, st, found)
    return found


def remember_content_id(path: Path, cache_dir: Path, st: os.stat_result, content: str) -> None:
    """Remember ``content`` as the content id of ``path`` while its identity on disk is
    ``st`` (taken before its bytes were read), unless it was written too recently to tell a
    later change by its identity (see ``cache_folder.SETTLED_NS``)."""
    if not is_settled(st):
        return
    try:
        atomic_write(_content_id_memo(path, cache_dir, st),
                     lambda tmp: tmp.write_text(_memo_text(content)))
    except OSError:
        pass  # a read-only cache folder: hash next time


def remembered_content_id(path: Path, cache_dir: Path) -> str | None:
    """The content id :func:`known_content_id` remembered for the file as it is on disk, or
    None (never hashed, or changed since): one stat and one small read, no hashing."""
    return _remembered(_content_id_memo(path, cache_dir, path.stat()))


def _memo_text(content: str) -> str:
    """A remembered content id, followed by its own xxh3-64: a memo damaged on disk (a flipped
    byte) is then never taken for another file's identity (its cache key, its content_id)."""
    return content + xxhash.xxh3_64_hexdigest(content.encode())


def _remembered(memo: Path) -> str | None:
    """The content id remembered in ``memo``; None when there is none or it is damaged (the
    file is then hashed again, and the memo rewritten)."""
    try:
        with open(memo, "rb") as fh:
            if untrusted(os.fstat(fh.fileno())):
                return None  # another user's: hashed again
            text = fh.read(256).strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    known = text[:32]
    return known if len(text) == 48 and _memo_text(known) == text else None


def _content_id_memo(path: Path, cache_dir: Path, st: os.stat_result) -> Path:
    """Where the content id of the file with identity ``st`` on disk is remembered."""
    ident = f"{path.resolve()}|" + "|".join(map(str, identity(st)))
    return Path(cache_dir) / "ids" / f"{xxhash.xxh3_128_hexdigest(os.fsencode(ident))}.txt"


def cache_key(content: str, parser_version: int, options: dict[str, Any]) -> str:
    ident = orjson.dumps([content, parser_version, schema.SCHEMA_VERSION, CACHE_VERSION,
                          options], option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_128_hexdigest(ident)


#: Columns whose values repeat (ids of kinds, streams, steps ...) gain from Parquet dictionary
#: pages; near-unique ones (times, correlation ids, args text) only pay for the hash table and
#: then fall back to plain pages: dictionary-encoding them took 40 % of the write and made the
#: file larger (docs/performance.md, log 15).
_UNIQUE_COLUMNS = frozenset({"ts_ns", "dur_ns", "correlation", "external_id", "flow_id",
                             "args_json"})


#: Text columns whose min/max statistics can skip row groups: few distinct values, filtered on
#: by the analyses. Statistics of the other text columns (names, categories, labels) never skip
#: a row group of interleaved events and cost ~20 % of the write (docs/performance.md, log 18).
_TEXT_WITH_STATISTICS = frozenset({"kind", "source"})


def parquet_options(table_schema: pa.Schema) -> dict[str, Any]:
    """Write options of the events files: dictionary pages only where values repeat, zstd-1 on
    the near-unique columns and LZ4 on the dictionary-encoded rest, min/max statistics on the
    integer columns, kind and source (they drive predicate pushdown).

    The dictionary-encoded columns are small once encoded, and zstd paid more to set up per
    page (a compression context each) than it saved on them: LZ4 there writes a 300 MB trace's
    store 0.034 CPU s faster (of 0.41 s), at the same size (docs/performance.md, log 22).

    Remembered for the last few schemas (names and types): worked out anew, they cost ~0.16
    ms of a file of a few KB (log 45)."""
    for known, options in _OPTIONS_OF:
        if known.equals(table_schema):
            return dict(options)
    options = _options_of(table_schema)
    _OPTIONS_OF[:] = [(table_schema, options), *_OPTIONS_OF[:7]]
    return dict(options)


#: (schema, its write options) of the last schemas written, newest first
_OPTIONS_OF: list[tuple[pa.Schema, dict[str, Any]]] = []


def _options_of(table_schema: pa.Schema) -> dict[str, Any]:
    names = table_schema.names
    return dict(compression={n: "zstd" if n in _UNIQUE_COLUMNS else "lz4" for n in names},
                compression_level={n: 1 for n in names if n in _UNIQUE_COLUMNS},
                use_dictionary=[n for n in names if n not in _UNIQUE_COLUMNS],
                write_statistics=[n for n in names if n in _TEXT_WITH_STATISTICS
                                  or pa.types.is_integer(table_schema.field(n).type)],
                # near-sorted or near-unique integers: delta pages write ~10 % faster than plain
                column_encoding={n: "DELTA_BINARY_PACKED" for n in names
                                 if n in _UNIQUE_COLUMNS and n != "args_json"})


def _with_version(table_schema: pa.Schema) -> pa.Schema:
    return table_schema.with_metadata(
        {**(table_schema.metadata or {}),
         b"traceview.schema_version": str(schema.SCHEMA_VERSION).encode()})


def write_events(table: pa.Table, target: Path, *, omit_null_columns: bool = False,
                 leave_out: Collection[str] = ()) -> None:
    """Write an events table as zstd Parquet with the schema version in its metadata.

    ``omit_null_columns``: leave out the columns that are null in every row (for cache files,
    read back through :func:`scan_events`). An nsys kernel table fills 13 of the 35 columns;
    encoding the other 22 took 40 % of its write. ``leave_out``: columns not to write.
    """
    atomic_write(target, lambda tmp: _write_table(table, tmp, omit_null_columns, leave_out))


def events_bytes(table: pa.Table, *, omit_null_columns: bool = False,
                 leave_out: Collection[str] = ()) -> bytes:
    """The Parquet file :func:`write_events` writes, in memory: for when no folder takes it (a
    full disk under the cache); :func:`scan_events` reads the bytes as it reads a file."""
    sink = pa.BufferOutputStream()
    _write_table(table, sink, omit_null_columns, leave_out)
    return sink.getvalue().to_pybytes()


def _write_table(table: pa.Table, sink: Path | pa.NativeFile, omit_null_columns: bool,
                 leave_out: Collection[str]) -> None:
    if omit_null_columns and table.num_rows:
        table = table.select([i for i, column in enumerate(table.columns)
                              if column.null_count < table.num_rows])
    table = table.drop_columns([c for c in leave_out if c in table.column_names])
    table = table.replace_schema_metadata(_with_version(table.schema).metadata)
    pq.write_table(table, sink, row_group_size=1 << 20, **parquet_options(table.schema))


def write_event_batches(batches: Iterable[pa.Table], target: Path, *,
                        leave_out: Collection[str] = (), overlap: bool = True) -> None:
    """Write event batches (one events schema) as one Parquet file, a row group per batch.

    A thread writes batch N (pyarrow encodes and compresses without the GIL) while the caller
    builds batch N+1, so the two cores share the work; at most two batches are alive.
    ``overlap=False`` (one batch: nothing to overlap) writes in this thread: starting the
    writer's thread cost a file of a few KB ~2 ms (docs/performance.md, log 45).
    ``leave_out``: columns null in every row of every batch, not written (as ``write_events``
    with ``omit_null_columns``; ``scan_events`` gives them back): each cost the writer ~4 ms
    per 1.4 M rows of a column it had nothing to say about.
    """
    atomic_write(target, lambda tmp: _write_batches(batches, tmp, leave_out, overlap))


def event_batches_bytes(batches: Iterable[pa.Table], *,
                        leave_out: Collection[str] = (), overlap: bool = True) -> bytes:
    """The Parquet file :func:`write_event_batches` writes, in memory (see
    :func:`events_bytes`)."""
    sink = pa.BufferOutputStream()
    _write_batches(batches, sink, leave_out, overlap)
    return sink.getvalue().to_pybytes()


def _write_batches(batches: Iterable[pa.Table], sink: Path | pa.NativeFile,
                   leave_out: Collection[str], overlap: bool = True) -> None:
    tables = (table.drop_columns(list(leave_out)) if leave_out else table for table in batches)
    first = next(tables, None)
    if first is None:
        raise ValueError("no batches to write")
    stored = _with_version(first.schema)
    writer = pq.ParquetWriter(sink, stored, **parquet_options(stored))

    def write(table: pa.Table) -> None:
        writer.write_table(table.replace_schema_metadata(stored.metadata),
                           row_group_size=max(1, table.num_rows))

    if overlap:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(write, first)
            for table in tables:  # built while the batch before it is written
                pending.result()
                pending = pool.submit(write, table)
            pending.result()
    else:
        write(first)
        for table in tables:
            write(table)
    writer.close()


def scan_events(path: str | Path | bytes) -> pl.LazyFrame:
    """An events file (or its bytes: :func:`events_bytes`) as a LazyFrame with every column of
    the events schema, in schema order; columns the file left out (see ``write_events``) are
    null."""
    return pl.scan_parquet(path, schema=events_schema(), missing_columns="insert")


_EVENTS_SCHEMA: list[Any] = []


def events_schema() -> pl.Schema:
    """The events schema in Polars' types (a copy: ``schema.polars_schema()`` builds an Arrow
    table and converts it, ~1 ms, which a scan per file paid for every file)."""
    if not _EVENTS_SCHEMA:
        _EVENTS_SCHEMA.append(schema.polars_schema())
    return pl.Schema(_EVENTS_SCHEMA[0])


def write_json(obj: Any, target: Path) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2)))


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def row_count(path: str | Path) -> int:
    """Rows in a Parquet file, from its footer (through Polars, which reads only the footer
    here: pyarrow's reader would import pyarrow into every command read from the cache)."""
    return pl.scan_parquet(path).select(pl.len()).collect().item()


def parquet_schema_version(path: Path) -> int | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"traceview.schema_version")
    return int(value) if value else None


def is_store(path: Path) -> bool:
    return path.is_dir() and (path / STORE_MANIFEST).is_file()
