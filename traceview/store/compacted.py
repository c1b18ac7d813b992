"""The events of many small files as a few files, kept in the cache folder beside them.

A run folder of thousands of small rank files is thousands of Parquet files in the cache, and
every query over them opens every file's footer: ~0.4 ms of CPU per file and query, and a
command runs a dozen queries (``stragglers`` 14; on 5,000 files ~27 s of it). From
:data:`MANY_FILES` plain parts up, the first query of a trace set writes their events, in the
order and with the rank and file id :func:`~traceview.store.parts.scan_parts` gives them, into
a few, ``CACHE_DIR/derived/events-KEY-NNNNN.parquet`` (one per ``FILES_PER_COMPACTED``
files), streaming (memory does not grow with the files); every later query of that set, in
this command or the next, reads those (docs/performance.md, log 44).

The key names each events file as the kept GPU rows' key does (its path, size and
modification time: content-addressed cache entries; its file id and rank), so another set of
files, or a file ingested anew, gets its own. The file is checked by its record (size and
hash, written last) before it is read; a damaged one is written again, with a note.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl
import xxhash

from traceview import schema
from traceview.store import derived
from traceview.store import parquet as store
from traceview.store.parts import Part, is_plain, scan_parts

#: From this many plain parts up, a trace set's events are read from compacted files.
#: Writing them costs about what ~6 queries over the separate files cost (2.3 CPU s for 1,000
#: files of ~1,000 events, where one query opened their footers in 0.39 s); reading them, a
#: tenth of a query. Below this, the ~2 ms a file of a command's queries is no wait.
MANY_FILES = 128

#: Files compacted into one: each compacted file is written by one streaming query over
#: this many files. Over all 5,000 files of a run at once, the query that gives each row its
#: rank and file id (looked up by the row's path) held 2.1 GB; 256 at a time, 266 MB, at the
#: same CPU (docs/performance.md, log 44).
FILES_PER_COMPACTED = 256

#: The version of the compacted files' layout; with the schema's, part of the key.
COMPACTED_VERSION = 2


def compacted_events(parts: list[Part], cache_dir: str | Path | None, *,
                     many: int = MANY_FILES, per_file: int = FILES_PER_COMPACTED,
                     ) -> tuple[pl.LazyFrame | None, list[str]]:
    """(The events of ``parts`` read from their compacted files, each written now when it is
    not kept yet; a note for each kept one that was damaged and written again), or (None,
    notes) when the parts are few, not plain, not in ``cache_dir``, or the folder will not
    take a file: then they are read as they are."""
    if len(parts) < many or cache_dir is None or not is_plain(parts):
        return None, []
    files = derived.parts_identity(parts, cache_dir)
    if files is None:
        return None, []
    key = xxhash.xxh3_128_hexdigest(orjson.dumps(
        [COMPACTED_VERSION, schema.SCHEMA_VERSION, pl.__version__, per_file, files]))
    paths: list[Path] = []
    notes: list[str] = []
    for start in range(0, len(parts), per_file):
        path = Path(cache_dir) / "derived" / f"events-{key}-{start // per_file:05d}.parquet"
        found, problem = derived.check_kept(path)
        if problem:
            notes.append(f"cache entry {path} could not be used ({problem}); discarded, "
                         "written again")
        group = parts[start:start + per_file]
        if not found and not derived.keep(path, lambda tmp, group=group:
                                          scan_parts(group).sink_parquet(tmp)):
            return None, notes
        paths.append(path)
    return pl.scan_parquet(paths, schema=store.events_schema()), notes


__all__ = ["COMPACTED_VERSION", "FILES_PER_COMPACTED", "MANY_FILES", "compacted_events"]
