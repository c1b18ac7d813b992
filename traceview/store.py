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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from traceview import schema

STORE_MANIFEST = "traceview-store.json"
CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$TRACEVIEW_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceview``, else ``~/.cache/traceview``."""
    explicit = os.environ.get("TRACEVIEW_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "traceview"


def content_id(path: Path) -> str:
    """xxh3-128 of the file's bytes, read in 16 MiB blocks."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def cache_key(content: str, parser_version: int, options: dict[str, Any]) -> str:
    import xxhash

    ident = orjson.dumps([content, parser_version, schema.SCHEMA_VERSION, CACHE_VERSION,
                          options], option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_128_hexdigest(ident)


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path beside ``target``, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_events(table: pa.Table, target: Path) -> None:
    """Write an events table as zstd Parquet with the schema version in its metadata."""
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}),
         b"traceview.schema_version": str(schema.SCHEMA_VERSION).encode()})
    # args_json is near-unique text: dictionary-encoding it and keeping min/max statistics
    # costs a third of the write time and makes reads slower, for no gain.
    others = [name for name in table.column_names if name != "args_json"]
    atomic_write(target, lambda tmp: pq.write_table(
        table, tmp, compression="zstd", compression_level=1, row_group_size=1 << 20,
        use_dictionary=others, write_statistics=others))


def write_json(obj: Any, target: Path) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2)))


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def parquet_schema_version(path: Path) -> int | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"traceview.schema_version")
    return int(value) if value else None


def is_store(path: Path) -> bool:
    return path.is_dir() and (path / STORE_MANIFEST).is_file()
