"""The events of many small files as one file, kept in the cache folder beside them.

A run folder of thousands of small rank files is thousands of Parquet files in the cache, and
every query over them opens every file's footer: ~0.4 ms of CPU per file and query, and a
command runs a dozen queries (``stragglers`` 14; on 5,000 files ~27 s of it). From
:data:`MANY_FILES` plain parts up, the first query of a trace set writes their events, in the
order and with the rank and file id :func:`~traceview.store.parts.scan_parts` gives them, into
one file, ``CACHE_DIR/derived/events-KEY.parquet``, streaming (memory does not grow with the
files); every later query of that set, in this command or the next, reads that one file
(docs/performance.md, log 44).

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

#: From this many plain parts up, a trace set's events are read from one compacted file.
#: Writing it costs about what ~6 queries over the separate files cost (2.3 CPU s for 1,000
#: files of ~1,000 events, where one query opened their footers in 0.39 s); reading it, a
#: tenth of a query. Below this, the ~2 ms a file of a command's queries is no wait.
MANY_FILES = 128

#: The version of the compacted file's layout; with the schema's, part of the key.
COMPACTED_VERSION = 1


def compacted_events(parts: list[Part], cache_dir: str | Path | None, *,
                     many: int = MANY_FILES) -> tuple[pl.LazyFrame | None, str | None]:
    """(The events of ``parts`` read from their compacted file, written now when it is not
    kept yet; a note when a kept one was damaged and written again), or (None, None) when
    the parts are few, not plain, not in ``cache_dir``, or the folder will not take the file:
    then they are read as they are."""
    if len(parts) < many or cache_dir is None or not is_plain(parts):
        return None, None
    files = derived.parts_identity(parts, cache_dir)
    if files is None:
        return None, None
    key = xxhash.xxh3_128_hexdigest(orjson.dumps(
        [COMPACTED_VERSION, schema.SCHEMA_VERSION, pl.__version__, files]))
    path = Path(cache_dir) / "derived" / f"events-{key}.parquet"
    found, problem = derived.check_kept(path)
    note = (f"cache entry {path} could not be used ({problem}); discarded, written again"
            if problem else None)
    if not found and not derived.keep(path, lambda tmp: scan_parts(parts).sink_parquet(tmp)):
        return None, note
    return pl.scan_parquet(path, schema=store.events_schema()), note


__all__ = ["COMPACTED_VERSION", "MANY_FILES", "compacted_events"]
