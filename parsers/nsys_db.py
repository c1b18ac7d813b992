"""Read-only access to an Nsight Systems SQLite export: open, introspect, read tables in chunks.

The user's file is opened through SQLAlchemy with the URI ``file:<path>?mode=ro`` (``uri=True``),
so SQLite itself refuses every write and never creates a ``-journal`` or ``-wal`` file.
``immutable=1`` is *not* used: it also skips locking and change detection, which is only safe if
nobody writes the file while we read it, and an export still being written (or copied) would then
be read inconsistently instead of failing. Text is decoded leniently (bytes that are not UTF-8
become U+FFFD; real exports contain them in ``TARGET_INFO_SYSTEM_ENV``).

Large numeric tables are read in chunks of :data:`CHUNK_ROWS` rows, each turned into a compact
Polars frame at once, so peak memory is the columns plus one chunk of Python rows. When the
optional ``adbc-driver-sqlite`` package is installed, numeric queries go through its Arrow-native
reader instead (same read-only URI; about 3x faster, as no Python object is made per value);
text queries always use the lenient SQLAlchemy path.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceview.errors import UnreadableTraceError

#: Rows per chunk when reading through the Python SQLite driver.
CHUNK_ROWS = 131_072
#: Rows per Arrow batch when reading through ADBC.
ADBC_BATCH_ROWS = 131_072

_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
_NSYS_MARKERS = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "TARGET_INFO_", "OSRT_API",
                 "ThreadNames", "PROCESSES")


def ro_uri(path: Path) -> str:
    """``file:/abs/path?mode=ro`` with the path percent-encoded (``?``/``#`` in names are safe).

    >>> ro_uri(Path("/tmp/a b.sqlite"))
    'file:/tmp/a%20b.sqlite?mode=ro'
    """
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


@dataclass
class Export:
    """An open export: its tables with their columns, the export generation and meta data."""

    path: Path
    conn: sqlite3.Connection
    engine: Any
    tables: dict[str, list[str]]
    meta: dict[str, str] = field(default_factory=dict)
    adbc: Any = None
    proxy: Any = None

    @property
    def generation(self) -> str:
        """``"3.x"`` (META_DATA_EXPORT), ``"2.x"`` (EXPORT_META_DATA) or ``"1"`` (neither)."""
        version = self.meta.get("EXPORT_SCHEMA_VERSION")
        if version:
            return version
        return "1"

    def has(self, table: str, *columns: str) -> bool:
        cols = self.tables.get(table)
        return cols is not None and all(c in cols for c in columns)

    def col(self, table: str, column: str, default: str = "NULL") -> str:
        """``column`` when the table has it, else the SQL ``default`` (columns drift)."""
        return f'"{column}"' if self.has(table, column) else default

    def close(self) -> None:
        try:
            (self.proxy or self.conn).close()
        finally:
            self.engine.dispose()
            if self.adbc is not None:
                self.adbc.close()


def open_export(path: Path, *, use_adbc: bool | None = None) -> Export:
    """Open ``path`` read-only and check that it is an nsys export.

    Raises :class:`UnreadableTraceError` naming the file when it is not SQLite or not an nsys
    export. ``use_adbc``: None = when installed, False = never, True = required.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    uri = ro_uri(path)

    def connect() -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.text_factory = _lenient_text
        return con

    engine = create_engine("sqlite+pysqlite://", creator=connect, poolclass=NullPool)
    try:
        proxy = engine.raw_connection()  # keep it: with NullPool, dropping it closes the file
        conn = proxy.driver_connection
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except Exception as exc:  # sqlite3.DatabaseError: not a database, encrypted, truncated
        engine.dispose()
        raise UnreadableTraceError(path, f"cannot be read as SQLite ({exc})") from None
    names = [r[0] for r in rows]
    is_nsys = any(t in names for t in _META_TABLES) or (
        "StringIds" in names and any(n.startswith(_NSYS_MARKERS) for n in names))
    if not is_nsys:
        proxy.close()
        engine.dispose()
        raise UnreadableTraceError(
            path, "is a SQLite database but not an Nsight Systems export (no StringIds, "
            "META_DATA_EXPORT or CUPTI_ACTIVITY_KIND_* tables)")
    tables = {n: [r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')] for n in names}
    meta: dict[str, str] = {}
    for table in _META_TABLES:
        if table in tables:
            meta.update({str(k): str(v) for k, v in conn.execute(
                f"SELECT name, value FROM {table}") if v is not None})
    export = Export(path=path, conn=conn, engine=engine, tables=tables, meta=meta, proxy=proxy)
    if use_adbc is not False:
        export.adbc = _adbc_connect(uri, required=bool(use_adbc))
    return export


def _adbc_connect(uri: str, *, required: bool) -> Any:
    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:
        if required:
            raise
        return None
    return adbc.connect(uri)


def query_rows(export: Export, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    """All rows of a small query (metadata tables), text decoded leniently."""
    return export.conn.execute(sql, tuple(params)).fetchall()


def read_frame(export: Export, sql: str, schema: dict[str, pl.DataType],
               params: Sequence[Any] = (), *, numeric: bool = False) -> pl.DataFrame:
    """A query's result as one typed Polars frame, read in chunks.

    ``numeric`` queries (no text columns) may use the ADBC reader when it is available.
    """
    frames = list(iter_frames(export, sql, schema, params, numeric=numeric))
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames, how="vertical", rechunk=True)


def iter_frames(export: Export, sql: str, schema: dict[str, pl.DataType],
                params: Sequence[Any] = (), *, numeric: bool = False) -> Iterator[pl.DataFrame]:
    if numeric and export.adbc is not None:
        yield from _adbc_frames(export, sql, schema, params)
        return
    cursor = export.conn.execute(sql, tuple(params))
    try:
        while True:
            rows = cursor.fetchmany(CHUNK_ROWS)
            if not rows:
                break
            yield pl.DataFrame(rows, schema=schema, orient="row", strict=False)
    finally:
        cursor.close()


def _adbc_frames(export: Export, sql: str, schema: dict[str, pl.DataType],
                 params: Sequence[Any]) -> Iterator[pl.DataFrame]:
    cursor = export.adbc.cursor()
    try:
        cursor.adbc_statement.set_options(
            **{"adbc.sqlite.query.batch_rows": str(ADBC_BATCH_ROWS)})
        cursor.execute(sql, tuple(params) if params else None)
        reader = cursor.fetch_record_batch()
        names = list(schema)
        for batch in reader:
            frame = pl.from_arrow(batch)
            assert isinstance(frame, pl.DataFrame)
            frame.columns = names
            yield frame.cast(schema, strict=False)  # type: ignore[arg-type]
    finally:
        cursor.close()


def count_rows(export: Export, table: str) -> int:
    return int(export.conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])


def string_table(export: Export) -> pl.DataFrame:
    """``StringIds`` as a frame ``(id, value)``; empty when the table is missing."""
    if not export.has("StringIds", "id", "value"):
        return pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
    return read_frame(export, "SELECT id, value FROM StringIds",
                      {"id": pl.Int64, "value": pl.String})


def table_text(export: Export, table: str, key_col: str, value_col: str) -> dict[str, str]:
    """A small key/value table as a dict (first value per key wins)."""
    if not export.has(table, key_col, value_col):
        return {}
    out: dict[str, str] = {}
    for key, value in query_rows(export, f'SELECT "{key_col}", "{value_col}" FROM "{table}"'):
        if key is not None and value is not None:
            out.setdefault(str(key), str(value))
    return out
