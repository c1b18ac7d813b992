"""The kernel table of an export, read while the export is being opened.

Exports are opened through SQLAlchemy (the project's database layer), and importing it takes
0.12-0.25 s of the interpreter, holding the GIL, in every fresh process. ADBC steps SQLite
without the GIL, so meanwhile the kernel table (the bulk of a large export) is read on its own
threads and read-only connection: its columns and rowid range asked through ADBC, its query
built by :func:`_tables.kernel_query`, its rowid ranges split by
:func:`_db.split_rowids`, as the parser itself would.

Nothing read ahead is used before the export has been opened and recognised through
SQLAlchemy, and then only for the very queries the parser asks for (the same SQL text: same
columns, same rowid ranges). Anything else (not an export, no kernel table, a read error) is
dropped, and the parser reads the table as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from traceview._dependencies import available
from traceview.parsers.nsys import _db
from traceview.parsers.nsys._sql import ident, text

#: Smaller exports are not read ahead: their kernel read is too short to hide much of the
#: import behind, and the extra connection and queries cost ~8 ms (a 200 kB export: 31 -> 39 ms).
MIN_BYTES = 16 << 20

#: columns -> (select list, schema, required outputs), as :func:`_tables.kernel_query` gives
Query = Callable[[Collection[str]], tuple[list[str], dict[str, pl.DataType], tuple[str, ...]]]
_Read = tuple[list[str], list[pl.DataFrame]]


class ReadAhead:
    """``table`` read in a background thread; :meth:`take` hands it over once, for the same
    queries; :meth:`close` waits for the read (it holds file handles) and drops what is left."""

    def __init__(self, path: Path, table: str, query: Query) -> None:
        self.table = table
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nsys-read-ahead")
        self._read = self._pool.submit(_read, path, table, query)

    def take(self, table: str, queries: list[str]) -> list[pl.DataFrame] | None:
        """The frames of ``queries`` (in order) on ``table`` if those are what was read."""
        if table != self.table:
            return None
        read = self._read.result()
        self._read = self._pool.submit(lambda: None)  # handed over at most once
        return read[1] if read is not None and read[0] == queries else None

    def close(self) -> None:
        self._read.result()
        self._pool.shutdown(wait=True)


def start(path: Path, table: str, query: Query) -> ReadAhead | None:
    """Start reading ``table`` of ``path`` ahead, when ADBC is installed and the export is of
    :data:`MIN_BYTES` or more."""
    if not available("adbc_driver_sqlite"):
        return None
    if path.stat().st_size < MIN_BYTES:
        return None
    return ReadAhead(path, table, query)


def _read(path: Path, table: str, query: Query) -> _Read | None:
    try:
        database = _db.adbc_driver_sqlite.connect(_db.ro_uri(path))
    except Exception:  # noqa: BLE001 - not readable as SQLite: the parser says why
        return None
    try:
        columns = _values(database, f"SELECT name FROM pragma_table_info({text(table)})")
        if not columns:
            return None
        select, schema, required = query(columns)
        lo = _values(database, f"SELECT min(rowid) FROM {ident(table)}")[0]
        hi = _values(database, f"SELECT max(rowid) FROM {ident(table)}")[0]
        queries = _db.range_queries(_db.select_sql(table, select),
                                    _db.split_rowids(lo, hi, _db.cores()))
        if not queries:
            return None
        return [q for q, _ in queries], _db.adbc_parts(database, queries, schema, required)
    except Exception:  # noqa: BLE001 - a read error or a cell of the wrong type: the parser
        # reads the table itself (and says which rows it skipped)
        return None
    finally:
        database.close()


def _values(database: Any, sql: str) -> list[Any]:
    """The first column of a small query's result."""
    conn = _db.adbc_driver_manager.AdbcConnection(database)
    try:
        statement = _db.adbc_driver_manager.AdbcStatement(conn)
        try:
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            return pa.RecordBatchReader.from_stream(stream).read_all().column(0).to_pylist()
        finally:
            statement.close()
    finally:
        conn.close()
