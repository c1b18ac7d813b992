"""Read-only access to an Nsight Systems SQLite export: open, introspect, read tables in chunks.

The export is opened through a SQLAlchemy engine (whose connection is a ``sqlite3`` one) with
the URI ``file:<path>?mode=ro`` (``uri=True``), so SQLite itself refuses every write and never
creates a ``-journal`` file. ``immutable=1`` is added only for a WAL-mode export (header bytes
18-19 are 2) with no changes waiting in a ``-wal`` file beside it: read-only SQLite would
otherwise create ``-wal`` and ``-shm`` beside the input (and fail on read-only media), and
with nothing in a ``-wal`` the file alone is the whole database. Elsewhere ``immutable=1`` is
*not* used: it also skips locking and change detection, which is only safe if nobody writes the
file while we read it, and an export still being written (or copied) would then be read
inconsistently instead of failing. A WAL-mode export whose changes still lie in its ``-wal``,
with no ``-shm`` to read them through, is refused by name (reading it would create the
``-shm``). Text is decoded leniently (bytes that are not UTF-8 become
U+FFFD; real exports contain them in ``TARGET_INFO_SYSTEM_ENV``).

Event tables and StringIds are read with :func:`read_table`: through the Arrow-native reader of
``adbc-driver-sqlite`` (same read-only URI; no Python object is made per value), a large table
in rowid ranges read at the same time on their own connections, one per core (the driver
releases the GIL while it steps SQLite). Text comes that way too when it is all UTF-8. What
ADBC cannot give exactly (text with other bytes, a column it typed from a batch of NULLs that
then holds REALs), what is read without ADBC, and the small metadata queries come through the
``sqlite3`` module, text decoded leniently, in chunks of :data:`CHUNK_ROWS` rows each turned
into a compact Polars frame at once, so peak memory is the columns plus one chunk of Python rows.

Every name put into SQL is quoted by :func:`_sql.ident`, and every cell read is checked for its
column's type (:mod:`_typed`): a row with a cell of the wrong type is skipped and counted in
:attr:`Export.skipped`, never read as a null or a truncated number.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from traceview._dependencies import available, lazy_module
from traceview.errors import UnreadableTraceError
from traceview.parsers.nsys._sql import ident
from traceview.parsers.nsys._typed import (
    Check,
    Skipped,
    arrow_holds,
    checks,
    count_sql,
    keep_sql,
    skipped,
)

# Loaded when an export is opened: a Kineto-only run never pays for them. ADBC is optional
# (without it tables are read through sqlite3); SQLAlchemy is a dependency.
sqlalchemy = lazy_module("sqlalchemy", submodules=("sqlalchemy.pool",),
                         missing="reading nsys exports needs SQLAlchemy: pip install sqlalchemy")
adbc_driver_sqlite = lazy_module("adbc_driver_sqlite", missing="use_adbc=True needs ADBC's "
                                 "SQLite driver: pip install adbc-driver-sqlite")
adbc_driver_manager = lazy_module("adbc_driver_manager", missing="use_adbc=True needs ADBC: "
                                  "pip install adbc-driver-manager")

#: Rows per chunk when reading through the Python SQLite driver.
CHUNK_ROWS = 131_072
#: Rows per Arrow batch when reading through ADBC a table without rowid ranges.
ADBC_BATCH_ROWS = 131_072
#: A table is split into parallel rowid ranges only above this many rows per range: below it,
#: opening one more connection costs more than the range saves.
MIN_RANGE_ROWS = 262_144

_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
_NSYS_MARKERS = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "TARGET_INFO_", "OSRT_API",
                 "ThreadNames", "PROCESSES")


def ro_uri(path: Path) -> str:
    """``file:/abs/path?mode=ro`` with the path percent-encoded (``?``/``#`` in names are safe),
    and ``&immutable=1`` for a WAL-mode export with nothing waiting in a ``-wal`` file.

    >>> ro_uri(Path("/tmp/a b.sqlite"))
    'file:/tmp/a%20b.sqlite?mode=ro'
    """
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    return uri + "&immutable=1" if _wal_mode_alone(path) else uri


def _wal_mode_alone(path: Path) -> bool:
    """Whether ``path`` is a WAL-mode database that is whole without side files (no ``-wal``
    beside it, or an empty one). Raises :class:`UnreadableTraceError` for one whose changes
    are in its ``-wal`` and that has no ``-shm``: SQLite would create it beside the input."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return False  # opening it says why
    if len(head) < 20 or not head.startswith(b"SQLite format 3\x00") or head[18:20] != b"\x02\x02":
        return False
    wal = Path(f"{path}-wal")
    try:
        waiting = wal.stat().st_size > 0
    except OSError:
        return True
    if waiting and not Path(f"{path}-shm").exists():
        raise UnreadableTraceError(path, f"WAL-mode export whose last changes are still in "
                                   f"{wal.name} (being written, or copied while open); "
                                   "checkpoint it first (sqlite3 FILE 'PRAGMA "
                                   "wal_checkpoint(TRUNCATE)') or read it where it was written")
    return not waiting


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


@dataclass
class Export:
    """An open export: its tables with their columns, the export generation and meta data.

    ``conn`` is the ``sqlite3`` connection (text, small queries) that the SQLAlchemy
    ``engine`` opened; ``adbc`` the ADBC database that :func:`read_table` opens its
    connections from (None: not installed or not wanted).
    """

    path: Path
    conn: sqlite3.Connection
    tables: dict[str, list[str]]
    meta: dict[str, str] = field(default_factory=dict)
    adbc: Any = None
    engine: Any = None
    proxy: Any = None  # the engine's checked-out connection (NullPool: closing it closes conn)
    #: ``_read_ahead.ReadAhead``: a table read while this export was being opened
    read_ahead: Any = None
    #: table -> the rows read past for a cell of the wrong type (:mod:`_typed`)
    skipped: dict[str, Skipped] = field(default_factory=dict)
    #: table -> {column: rows} whose string id StringIds does not hold
    unresolved: dict[str, dict[str, int]] = field(default_factory=dict)

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
        return ident(column) if self.has(table, column) else default

    def close(self) -> None:
        try:
            if self.proxy is not None:
                self.proxy.close()
            else:
                self.conn.close()
            if self.engine is not None:
                self.engine.dispose()
        finally:
            try:
                if self.read_ahead is not None:
                    self.read_ahead.close()
            finally:
                if self.adbc is not None:
                    self.adbc.close()


def open_export(path: Path, *, use_adbc: bool | None = None) -> Export:
    """Open ``path`` read-only and check that it is an nsys export.

    Raises :class:`UnreadableTraceError` naming the file when it is not SQLite or not an nsys
    export. ``use_adbc``: None = when installed, False = never, True = required.
    """
    uri = ro_uri(path)

    def connect() -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.text_factory = _lenient_text
        return con

    # SQLAlchemy owns the connection (the project's database layer; its engine is how other
    # tools reach the export too); the bulk tables bypass it through ADBC, below.
    engine = sqlalchemy.create_engine("sqlite+pysqlite://", creator=connect,
                                      poolclass=sqlalchemy.pool.NullPool)
    try:
        proxy = engine.raw_connection()
    except Exception as exc:  # sqlite3.Error: a missing file or folder, no permission
        engine.dispose()
        raise UnreadableTraceError(path, f"cannot be read as SQLite ({exc})") from None
    conn = proxy.driver_connection
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error as exc:  # not a database, encrypted, truncated
        proxy.close()
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
    # a table SQLite cannot describe has no columns here (every table has one): left out
    tables = {n: columns for n in names if (columns := _columns(conn, n))}
    meta: dict[str, str] = {}
    for table in _META_TABLES:
        if table in tables:
            meta.update({str(k): str(v) for k, v in conn.execute(
                f"SELECT name, value FROM {ident(table)}") if v is not None})
    export = Export(path=path, conn=conn, tables=tables, meta=meta, engine=engine, proxy=proxy)
    if use_adbc is not False:
        export.adbc = _adbc_database(uri, required=bool(use_adbc))
    return export


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The columns of ``table``; none for one SQLite cannot describe (a virtual table of a
    module it lacks), which is then read past like any table the parser does not know. Any
    name an export holds (a table 'we"ird' too) is quoted, never spliced in."""
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({ident(table)})")]
    except sqlite3.Error:
        return []


def _adbc_database(uri: str, *, required: bool) -> Any:
    # The low-level API, not adbc_driver_manager.dbapi: the DB-API module imports
    # pyarrow.dataset and pandas (~0.5 s), which nothing here uses.
    if not required and not available("adbc_driver_sqlite"):
        return None
    return adbc_driver_sqlite.connect(uri)


def query_rows(export: Export, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    """All rows of a small query (metadata tables), text decoded leniently."""
    return export.conn.execute(sql, tuple(params)).fetchall()


def read_frame(export: Export, sql: str, schema: dict[str, pl.DataType],
               params: Sequence[Any] = ()) -> pl.DataFrame:
    """A query's result (text decoded leniently) as one typed Polars frame, read in chunks."""
    frames = list(iter_frames(export, sql, schema, params))
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames, how="vertical", rechunk=True)


def iter_frames(export: Export, sql: str, schema: dict[str, pl.DataType],
                params: Sequence[Any] = ()) -> Iterator[pl.DataFrame]:
    cursor = export.conn.execute(sql, tuple(params))
    try:
        while True:
            rows = cursor.fetchmany(CHUNK_ROWS)
            if not rows:
                break
            yield pl.DataFrame(rows, schema=schema, orient="row", strict=False)
    finally:
        cursor.close()


def select_sql(table: str, select: Sequence[str]) -> str:
    """``SELECT expr, ... FROM "table"``."""
    return f"SELECT {', '.join(select)} FROM {ident(table)}"


def read_table(export: Export, table: str, select: Sequence[str],
               schema: dict[str, pl.DataType], required: Sequence[str] = ()) -> pl.DataFrame:
    """``SELECT select FROM table`` as one typed frame, rows in table order (see
    :func:`read_parts`)."""
    return pl.concat(read_parts(export, table, select, schema, required), how="vertical",
                     rechunk=True)


def read_parts(export: Export, table: str, select: Sequence[str],
               schema: dict[str, pl.DataType], required: Sequence[str] = ()) -> list[pl.DataFrame]:
    """``SELECT select FROM table`` (one expression per ``schema`` column) as consecutive
    typed frames of one chunk each (one per rowid range), rows in table order: a caller that
    derives columns part by part and concatenates the results never copies the rows into one
    chunk (126 MB per 2 M kernels).

    Through ADBC when available, a large table in parallel rowid ranges. Text comes through
    ADBC too when all of it is UTF-8; a table with other bytes in its text, or values ADBC
    cannot type, is read by the lenient ``sqlite3`` path instead: slower, same rows.
    Rows with a cell not of its output's type (a NULL in a ``required`` one) are skipped and
    counted in ``export.skipped`` (:mod:`_typed`).
    """
    sql = select_sql(table, select)
    if export.adbc is None:
        return [read_checked(export, table, select, schema, required)]
    ranges = rowid_ranges(export, table, parts=cores())
    queries = range_queries(sql, ranges)
    if not queries and pl.String in schema.values():  # no rowid: the size of a range is unknown
        return [read_checked(export, table, select, schema, required)]
    if queries and export.read_ahead is not None:
        frames = export.read_ahead.take(table, [query for query, _ in queries])
        if frames is not None:
            return frames
    try:
        return adbc_parts(export.adbc, queries or [(sql, 0)], schema, required)
    except WrongTypes:
        pass  # below: the rows whose cells hold their types, the others counted
    except NotForArrow:
        return [read_checked(export, table, select, schema, required)]
    found = checks(select, schema, required)
    export.skipped[table] = skipped(query_rows(export, count_sql(ident(table), found))[0], found)
    keep = keep_sql(found)
    try:
        return adbc_parts(export.adbc, range_queries(sql, ranges, keep)
                          or [(f"{sql} WHERE {keep}", 0)], schema, required)
    except NotForArrow:
        return [read_checked(export, table, select, schema, required)]


def read_checked(export: Export, table: str, select: Sequence[str],
                 schema: dict[str, pl.DataType], required: Sequence[str] = ()) -> pl.DataFrame:
    """:func:`read_table` through the lenient ``sqlite3`` path (small tables, text that is not
    UTF-8, no ADBC): the type check is the query's ``WHERE``, and the rows it left out, if the
    table has more than were read, are counted in ``export.skipped``."""
    found = checks(select, schema, required)
    frame = read_frame(export, f"{select_sql(table, select)} WHERE {keep_sql(found)}", schema)
    _count_skipped(export, table, found, frame.height)
    return frame


def checked_rows(export: Export, table: str, select: Sequence[str],
                 schema: dict[str, pl.DataType]) -> list[tuple]:
    """The rows of a small table whose cells hold ``schema``'s types, as tuples without a
    NULL (what a metadata lookup can use), the others counted in ``export.skipped``. No
    Polars frame: on a table of a few rows making one costs ~1 ms."""
    found = checks(select, schema)
    rows = query_rows(export, f"{select_sql(table, select)} WHERE {keep_sql(found)}")
    _count_skipped(export, table, found, len(rows))
    text = [dtype == pl.String for dtype in schema.values()]  # a number in a text column
    return [tuple(str(v) if t else v for v, t in zip(row, text, strict=True)) for row in rows
            if None not in row]


def _count_skipped(export: Export, table: str, found: Sequence[Check], read: int) -> None:
    """When ``table`` has more rows than the ``read`` that passed ``found``, count the others
    by column in ``export.skipped``."""
    if read < count_rows(export, table):
        export.skipped[table] = skipped(query_rows(export, count_sql(ident(table), found))[0],
                                        found)


def range_queries(sql: str, ranges: list[tuple[int, int]],
                  keep: str | None = None) -> list[tuple[str, int]]:
    """``(query, rows at most)`` of ``sql`` restricted to each rowid range (and to the rows
    that satisfy ``keep``)."""
    where = f"({keep}) AND " if keep else ""
    return [(f"{sql} WHERE {where}rowid BETWEEN {lo} AND {hi}", hi - lo + 1) for lo, hi in ranges]


def adbc_parts(database: Any, queries: list[tuple[str, int]],
               schema: dict[str, pl.DataType], required: Sequence[str] = ()) -> list[pl.DataFrame]:
    """Each ``(query, rows at most)`` on its own connection to the ADBC ``database``, all at
    once (the driver steps SQLite without the GIL). Raises :class:`NotForArrow`, and
    :class:`WrongTypes` where a cell is not of its column's type."""
    with ThreadPoolExecutor(max(1, len(queries))) as pool:
        return list(pool.map(lambda query: _adbc_frame(database, *query, schema, required),
                             queries))


def rowid_ranges(export: Export, table: str, parts: int) -> list[tuple[int, int]]:
    """:func:`split_rowids` of ``table``; ``[]`` when it has no rowid (a view, a
    ``WITHOUT ROWID`` table) or no rows."""
    try:  # two queries: SQLite answers a lone min() or max() from the b-tree, both together
        # only by scanning the table
        lo = export.conn.execute(f"SELECT min(rowid) FROM {ident(table)}").fetchone()[0]
        hi = export.conn.execute(f"SELECT max(rowid) FROM {ident(table)}").fetchone()[0]
    except sqlite3.Error:
        return []
    return split_rowids(lo, hi, parts)


def split_rowids(lo: int | None, hi: int | None, parts: int) -> list[tuple[int, int]]:
    """Up to ``parts`` consecutive ``(first, last)`` ranges covering rowids ``lo..hi``, each of
    at least :data:`MIN_RANGE_ROWS` rowids (``[]`` for no rows). A full scan visits rows in
    rowid order, so reading the ranges in order and concatenating gives the rows in the same
    order.

    >>> split_rowids(1, 1_000_000, 2)
    [(1, 500000), (500001, 1000000)]
    """
    if lo is None or hi is None:
        return []
    span = hi - lo + 1
    n = max(1, min(parts, span // MIN_RANGE_ROWS))
    bounds = [lo + span * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


def cores() -> int:
    """The cores this process may run on (one rowid range each)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


class NotForArrow(Exception):
    """A query whose result ADBC cannot give exactly: read it through ``sqlite3``."""


class WrongTypes(NotForArrow):
    """A query whose result holds a cell not of its column's type (:mod:`_typed`)."""


def _adbc_frame(database: Any, sql: str, rows: int, schema: dict[str, pl.DataType],
                required: Sequence[str]) -> pl.DataFrame:
    """One query (of at most ``rows`` rows) through its own ADBC connection, so several can run
    at once."""
    text = pl.String in schema.values()
    # One batch per range: ADBC types each column from the first batch (text whose first rows
    # are NULL would be typed int64 and fail at its first value), and one batch is one chunk
    # of the frame. Without a rowid range (rows unknown; never text) in batches.
    batch = min(rows, 2**31 - 1) or ADBC_BATCH_ROWS
    conn = adbc_driver_manager.AdbcConnection(database)
    try:
        statement = adbc_driver_manager.AdbcStatement(conn)
        try:
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(batch)})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            table = pa.RecordBatchReader.from_stream(stream).read_all()
            if text:
                table.validate(full=True)  # checks the text is UTF-8
        except (adbc_driver_manager.Error, pa.ArrowException, OSError) as exc:
            # the driver's own errors come out of the Arrow stream as OSError
            raise NotForArrow(str(exc)) from exc
        finally:
            statement.close()
    finally:
        conn.close()
    if not arrow_holds(table, schema, required):
        raise WrongTypes(sql)
    # one chunk per Arrow batch (one batch per range)
    frame = pl.from_arrow(table.rename_columns(list(schema)), rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame.cast(schema, strict=False)  # type: ignore[arg-type]


def count_rows(export: Export, table: str) -> int:
    return int(export.conn.execute(f"SELECT COUNT(*) FROM {ident(table)}").fetchone()[0])


#: The longest string of ``StringIds`` read as it is, in bytes (docs/formats.md, *Bounds*):
#: a real kernel name, even a deeply templated one, is some KB; one of 300 MB ran out of
#: memory. A longer one reads as a short placeholder saying its size.
MAX_STRING_BYTES = 1 << 20

_SIZE = 'length(CAST("value" AS BLOB))'
#: The bounded value: SQLite hands over the placeholder, never the long string.
_BOUNDED_VALUE = (f'CASE WHEN typeof("value") = \'text\' AND {_SIZE} > {MAX_STRING_BYTES} '
                  f"THEN '(a string of ' || {_SIZE} || ' bytes, over the bound of "
                  f"{MAX_STRING_BYTES} left out)' ELSE \"value\" END")


def string_table(export: Export) -> pl.DataFrame:
    """``StringIds`` as a frame ``(id, value)``; empty when the table is missing. Rows whose
    id is not an integer or whose value is not text are skipped (``export.skipped``); a
    value longer than ``MAX_STRING_BYTES`` is a placeholder (:func:`long_strings`)."""
    if not export.has("StringIds", "id", "value"):
        return pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
    return read_table(export, "StringIds", ["id", _BOUNDED_VALUE],
                      {"id": pl.Int64, "value": pl.String}, required=("id", "value"))


def long_strings(export: Export) -> int:
    """How many strings of ``StringIds`` are over ``MAX_STRING_BYTES`` (placeholders)."""
    if not export.has("StringIds", "id", "value"):
        return 0
    return int(export.conn.execute(
        f'SELECT count(*) FROM "StringIds" WHERE typeof("value") = \'text\' '
        f"AND {_SIZE} > {MAX_STRING_BYTES}").fetchone()[0])
