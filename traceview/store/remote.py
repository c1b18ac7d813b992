"""Store folders on any filesystem: local paths, ``file://``, object stores, fsspec URLs.

A store (see :mod:`traceview.store.parquet`) is one zstd Parquet file per rank plus ``ranks.parquet``,
``files.parquet`` and the manifest ``traceview-store.json``. Here it may live wherever pyarrow
or fsspec can write: a shared filesystem (``/lustre/run7`` or ``file:///lustre/run7``), an
object store (``s3://bucket/run7``, ``gs://...``: pyarrow's own filesystems, or fsspec's when
installed), or fsspec's ``memory://`` (one process only: tests).

Writing is done by the workers: :func:`write_store` maps one task per rank on an executor;
each task reads that rank's events from the parsed Parquet (the cache, which must be readable
by the workers: a shared filesystem on a multi-node cluster) and writes ``rank-NNNNN.parquet``
straight to the store. The driver writes only the small ranks/files tables and, last, the
manifest: a store without a manifest is incomplete and is not opened.
"""

from __future__ import annotations

import atexit
import io
import os
import sys
import posixpath
import threading
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import xxhash

from traceview import schema
from traceview._dependencies import lazy_module
from traceview.errors import TraceviewError, UnreadableTraceError
from traceview.store import parquet as store
from traceview.store import store_tables
from traceview.store.executors import ExecutorSpec, TaskFailure, open_executor, run_tasks
from traceview.store.parts import Part, confined_name, part_of

#: Imported on first use (~0.1-0.2 s with numpy): a run read from the cache reads Parquet
#: through Polars and needs none of it (log 41 of docs/performance.md).
pa = lazy_module("pyarrow")
pafs = lazy_module("pyarrow.fs")
pq = lazy_module("pyarrow.parquet")
# Loaded when a store lies at a URL pyarrow cannot open itself, or is read from one.
fsspec = lazy_module("fsspec", missing="this URL needs fsspec: pip install fsspec")
ds = lazy_module("pyarrow.dataset", missing="reading a remote store needs pyarrow.dataset")


def is_url(path: str | Path) -> bool:
    """``scheme://...`` (a Path never holds one: ``Path("s3://b")`` collapses the slashes)."""
    return isinstance(path, str) and "://" in path


def filesystem(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow filesystem, path inside it)`` for a local path or a URL.

    pyarrow's filesystems first (local, s3, gs, hdfs); any other scheme through fsspec
    (``memory://``, ``abfs://``, ...), wrapped for pyarrow.
    """
    if not is_url(location):
        return pafs.LocalFileSystem(), str(Path(location).resolve())
    url = str(location)
    try:
        return pafs.FileSystem.from_uri(url)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise UnreadableTraceError(url, f"no filesystem for this URL ({exc})") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _atomic(fs: pafs.FileSystem, path: str, write: Any) -> None:
    """Write through a temporary name, then move into place (a put is atomic on object stores;
    on filesystems the move is a rename)."""
    parent = posixpath.dirname(path)
    fs.create_dir(parent, recursive=True)
    tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with fs.open_output_stream(tmp) as out:
            write(out)
        fs.move(tmp, path)
    except BaseException:
        if _exists(fs, tmp):
            fs.delete_file(tmp)
        raise


def write_table(table: pa.Table, fs: pafs.FileSystem, path: str) -> None:
    """An events table as zstd Parquet with the schema version in its metadata."""
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}),
         b"traceview.schema_version": str(schema.SCHEMA_VERSION).encode()})
    _atomic(fs, path, lambda out: pq.write_table(table, out, compression="zstd",
                                                 compression_level=3, row_group_size=1 << 20))


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    _atomic(fs, path, lambda out: out.write(data))


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as fh:
        return fh.read()


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.parquet"


#: Seconds a remote input may take to answer whether it is a store, and to list it, before it
#: is given up (``TRACEVIEW_REMOTE_TIMEOUT``): without a network, object stores' clients retry
#: for many minutes (pyarrow's GCS client: 15).
REMOTE_TIMEOUT_S = 30.0


def within_deadline(url: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or one line naming ``url`` when it gives no answer in time. The call runs
    on a daemon thread, so a client stuck in its retries cannot keep the process alive."""
    try:
        limit = float(os.environ.get("TRACEVIEW_REMOTE_TIMEOUT") or REMOTE_TIMEOUT_S)
    except ValueError:
        limit = REMOTE_TIMEOUT_S
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))

    worker = threading.Thread(target=call, name=f"traceview-remote {url}", daemon=True)
    worker.start()
    worker.join(limit)
    if not outcome:
        # The client keeps retrying on its thread, and pyarrow's S3 finalizer at exit waits
        # for it (minutes): this process leaves without waiting (exit 2, the code of the error
        # below) once it is done. Registered last, so it runs before that finalizer.
        atexit.register(_leave_now)
        raise UnreadableTraceError(url, f"no answer in {limit:g} s (no network, or the store "
                                   "is unreachable; TRACEVIEW_REMOTE_TIMEOUT=SECONDS waits longer)")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _leave_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(2)


def store_problem(url: str) -> str | None:
    """Why the URL ``url`` cannot be read as an input (None: it holds a store): no
    filesystem for its scheme, unreadable (no such host, no access), or something other
    than a store (a trace file: URL inputs are stores only)."""
    try:
        fs, base = filesystem(url)
    except UnreadableTraceError as exc:
        return exc.problem
    except (OSError, ValueError) as exc:  # a client that connects as it is made (ftp, s3)
        return f"cannot be reached ({type(exc).__name__}: {exc})"
    try:
        if _exists(fs, posixpath.join(base, store.STORE_MANIFEST)):
            return None
    except (OSError, ValueError) as exc:
        return f"cannot be read ({type(exc).__name__}: {exc})"
    return (f"not a traceview store (no {store.STORE_MANIFEST} there): a URL input is read "
            "as a store only (`traceview ingest ... -o URL` writes one); copy trace files "
            "to a local folder to read them")


def is_store(location: str | Path) -> bool:
    """True when ``location`` (path or URL) holds a complete store (its manifest)."""
    if not is_url(location):
        return store.is_store(Path(location))
    try:
        fs, base = filesystem(location)
        return _exists(fs, posixpath.join(base, store.STORE_MANIFEST))
    except (UnreadableTraceError, OSError):
        return False


# --- writing: one task per rank on the executor ----------------------------------------------

def write_rank_task(parts: list[tuple[str, int, int | None, dict[int, int]]], rank: int,
                    location: str) -> int:
    """Worker task: the events of ``rank`` from its parsed Parquet file(s) -> the store.

    ``parts``: ``(parquet path, file_id, single rank or None, parsed -> final rank map)``, as
    in ``TraceSet``. Returns the number of events written.
    """
    frames = [Part(*p).scan() for p in parts]
    events = pl.concat(frames, how="vertical").filter(pl.col("rank") == rank).collect()
    fs, base = filesystem(location)
    path = posixpath.join(base, rank_file(rank))
    write_table(schema.conform(events.to_arrow()), fs, path)
    return {"rows": events.height, "record": _record(fs, path)}


def _record(fs: pafs.FileSystem, path: str) -> dict[str, Any]:
    """A written file's size and content hash, as the store's manifest records them."""
    digest = xxhash.xxh3_128()
    with fs.open_input_stream(path) as fh:
        while block := fh.read(8 << 20):
            digest.update(block)
    return {"bytes": fs.get_file_info(path).size, "xxh3": digest.hexdigest()}


def write_store(ts: Any, location: str | Path, *, executor: Any = None) -> str:
    """Write ``ts`` (a TraceSet) as a store at ``location`` (path or URL), one task per rank on
    ``executor`` (``ExecutorSpec``, ``Executor``, ``"local"``/``"dask"``; None: this process).

    Returns the location. A rank whose task keeps failing raises ``TraceviewError`` naming it
    (a store missing a rank would silently change every cross-rank answer).
    """
    target = str(location)
    fs, base = filesystem(target)
    fs.create_dir(base, recursive=True)
    # a rank's events may lie in several files (one per profiling window): each task reads
    # every file of its rank
    tasks = [([p.fields() for p in ts.parts_of(rank)], rank, target)
             for rank, _ in sorted(ts.ranks.select("rank", "file_id").iter_rows(),
                                   key=lambda rf: (rf[1], rf[0]))]
    if executor is None:
        results: list[Any] = [write_rank_task(*t) for t in tasks]
    else:
        spec = ExecutorSpec(executor) if isinstance(executor, str) else executor
        ctx = open_executor(spec) if isinstance(spec, ExecutorSpec) else nullcontext(spec)
        retries = spec.retries if isinstance(spec, ExecutorSpec) else 2
        with ctx as pool:
            results = run_tasks(pool, write_rank_task, tasks, retries=retries)
    failed = [(t[1], r) for t, r in zip(tasks, results) if isinstance(r, TaskFailure)]
    if failed:
        raise TraceviewError("; ".join(f"rank {rank}: cannot write to {target} ({f.error}; "
                                       f"failed {f.attempts} attempts)" for rank, f in failed))
    write_bytes(fs, posixpath.join(base, "ranks.parquet"), _parquet_bytes(ts.ranks))
    write_bytes(fs, posixpath.join(base, "files.parquet"), _parquet_bytes(ts.files))
    write_bytes(fs, posixpath.join(base, "windows.parquet"), _parquet_bytes(ts.windows))
    # each rank file's size and hash: a reader refuses a manifest without them
    records = {rank_file(t[1]): r["record"] for t, r in zip(tasks, results)}
    write_bytes(fs, posixpath.join(base, store.STORE_MANIFEST), orjson.dumps(
        {"traceview_store": store.CACHE_VERSION, "schema_version": schema.SCHEMA_VERSION,
         "ranks": ts.ranks["rank"].to_list(), "files": records}, option=orjson.OPT_INDENT_2))
    return target


def _parquet_bytes(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


# --- reading ----------------------------------------------------------------------------------

class _RemotePart:
    """One events file in a store on any filesystem (scanned lazily through pyarrow), read
    as its ``Part`` (its manifest entry) says."""

    def __init__(self, location: str, name: str, part: Any) -> None:
        self.location = location
        self.name = name
        self.path = f"{location.rstrip('/')}/{name}"
        self.part = part
        self.file_id, self.rank, self.rank_map = part.file_id, part.rank, part.rank_map

    def scan(self) -> pl.LazyFrame:
        fs, base = filesystem(self.location)
        path = posixpath.join(base, self.name)
        if isinstance(fs, pafs.LocalFileSystem):
            frame = store.scan_events(path)
        else:  # columns a file left out come back as nulls, as in store.scan_events
            frame = pl.scan_pyarrow_dataset(ds.dataset(
                path, filesystem=fs, format="parquet", schema=schema.EVENTS_ARROW))
        return self.part.assign(frame)


def read_store(location: str) -> tuple[list[_RemotePart], pl.DataFrame, pl.DataFrame,
                                        pl.DataFrame | None]:
    """A store at a URL (``file://``, ``memory://``, ``s3://`` ...) as what a TraceSet is made
    of: its parts, ranks and files tables, and its windows table (None in older stores)."""
    fs, base = filesystem(location)
    manifest_path = posixpath.join(base, store.STORE_MANIFEST)
    if not _exists(fs, manifest_path):
        raise UnreadableTraceError(location, "no traceview store here (no "
                                   f"{store.STORE_MANIFEST}: missing or still being written)")
    try:
        manifest = orjson.loads(read_bytes(fs, manifest_path))
    except orjson.JSONDecodeError as exc:
        raise UnreadableTraceError(manifest_path, f"damaged store manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise UnreadableTraceError(manifest_path, "damaged store manifest: ingest the traces "
                                   "again")
    if manifest.get("schema_version") != schema.SCHEMA_VERSION:
        raise UnreadableTraceError(location, f"store has schema version "
                                   f"{manifest.get('schema_version')}, this traceview reads "
                                   f"{schema.SCHEMA_VERSION}: ingest the traces again")
    ranks = _store_table(fs, base, location, "ranks.parquet", store_tables.STORE_RANK_SCHEMA)
    files = _store_table(fs, base, location, "files.parquet", store_tables.STORE_FILE_SCHEMA)
    if "parts" in manifest:
        names = [confined_name(e, manifest_path) for e in manifest["parts"]]
        parts = [_RemotePart(location, n, part_of(n, e))
                 for n, e in zip(names, manifest["parts"])]
    else:  # one file per rank, holding all its windows (rows keep their own file_id)
        parts = [_RemotePart(location, rank_file(r), Part(rank_file(r), None, r))
                 for r in ranks["rank"].to_list()]
    _check_records(fs, base, manifest, manifest_path, [p.name for p in parts])
    windows_path = posixpath.join(base, "windows.parquet")  # absent in older stores
    windows = (_store_table(fs, base, location, "windows.parquet",
                            store_tables.WINDOW_SCHEMA)
               if _exists(fs, windows_path) else None)
    return parts, ranks, files, windows


def _store_table(fs: pafs.FileSystem, base: str, location: str, name: str,
                 required: dict[str, pl.DataType]) -> pl.DataFrame:
    """A store's small table, checked as a folder's is (:mod:`traceview.store.store_tables`)."""
    where = f"{location.rstrip('/')}/{name}"
    try:
        data = read_bytes(fs, posixpath.join(base, name))
    except OSError as exc:
        raise UnreadableTraceError(where, f"damaged store file ({exc}): ingest the traces "
                                   "again") from None
    return store_tables.read_store_table(data, where, required)


def _check_records(fs: pafs.FileSystem, base: str, manifest: dict[str, Any], where: str,
                   names: list[str]) -> None:
    """Each events file has its record in the manifest, the size it records (the hash
    is checked where a store folder is opened locally: reading a remote store whole to hash
    it would cost what the analysis does) and a traceview events footer."""
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not all(isinstance(recorded.get(n), dict)
                                                 for n in names):
        raise UnreadableTraceError(where, "store manifest has no integrity record (files: "
                                   "size and hash of each events file): ingest the traces "
                                   "again")
    for name in names:
        size = fs.get_file_info(posixpath.join(base, name)).size
        if size != recorded[name].get("bytes"):
            raise UnreadableTraceError(f"{where.rsplit('/', 1)[0]}/{name}",
                                       f"damaged store file ({size} bytes, "
                                       f"{recorded[name].get('bytes')} were written): ingest "
                                       "the traces again")
        # its footer: another program's Parquet of the recorded size is no events file
        if problem := store_tables.events_footer_problem(posixpath.join(base, name), fs):
            raise UnreadableTraceError(f"{where.rsplit('/', 1)[0]}/{name}",
                                       f"{problem}: ingest the traces again")


__all__ = ["filesystem", "is_store", "is_url", "read_store", "write_rank_task", "write_store"]
