"""A store's files checked against what traceview writes there, wherever the store lies.

A store (:mod:`traceview.store.parquet`) holds small tables (``ranks.parquet``,
``files.parquet``, ``windows.parquet``) and one events file per rank or window. Another
program's Parquet in the place of any of them (copied over, a store assembled by hand, a
bucket shared with another job) read as it is fails part-way through an analysis, as an
internal error ("rank" not found, "extra column in file outside of expected schema"). Each is
checked here when the store is opened, by the same rules for a folder (``traceset``) and a URL
(``remote``): a small table must have the columns the trace set reads, of their types, and no
null or negative rank; an events file must carry traceview's schema version and only columns
of the events schema, of their types. Otherwise an :class:`UnreadableTraceError` names the
file (one line, exit 2).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from traceview import schema
from traceview.errors import UnreadableTraceError
from traceview.store import parquet as store

#: The columns of a store's small tables that the trace set reads, and their types.
STORE_RANK_SCHEMA = {"rank": pl.Int32, "file_id": pl.Int32, "world_size": pl.Int32,
                     "host": pl.String, "devices": pl.String, "backend": pl.String,
                     "clock_base_ns": pl.Int64, "source": pl.String, "rank_from": pl.String}
STORE_FILE_SCHEMA = {"file_id": pl.Int32, "path": pl.String, "format": pl.String,
                     "size_bytes": pl.Int64, "content_id": pl.String,
                     "input_events": pl.Int64, "stored_events": pl.Int64}
#: The ``windows`` table: which file holds which profiling window of which rank.
WINDOW_SCHEMA = {"rank": pl.Int32, "window": pl.Int32, "file_id": pl.Int32}

_AGAIN = "ingest the traces again"


def read_store_table(source: Path | bytes, name: str | Path,
                     required: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """A store's small table from ``source`` (its file, or its bytes read from a URL), its
    ``required`` columns there and of their types (ranks neither null nor negative); else an
    :class:`UnreadableTraceError` naming ``name``."""
    try:
        table = pl.read_parquet(io.BytesIO(source) if isinstance(source, bytes) else source)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise UnreadableTraceError(name, f"damaged store file ({str(exc).splitlines()[0]}): "
                                   f"{_AGAIN}") from None
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise UnreadableTraceError(name, f"not a traceview store table (no column "
                                   f"{', '.join(missing)}): {_AGAIN}")
    try:
        table = table.with_columns(pl.col(c).cast(t, strict=True) for c, t in required.items())
    except pl.exceptions.PolarsError:
        wrong = [c for c, t in required.items() if table.schema[c] != t]
        raise UnreadableTraceError(name, f"not a traceview store table (column "
                                   f"{', '.join(wrong)} of another type): {_AGAIN}") from None
    if "rank" in required and table["rank"].null_count() + (table["rank"] < 0).sum():
        raise UnreadableTraceError(name, "not a traceview store table (a rank that is null "
                                   f"or negative): {_AGAIN}")
    return table


def events_file_problem(columns: Mapping[str, pl.DataType],
                        metadata: Mapping[str, str]) -> str | None:
    """Why an events file with these ``columns`` and key-value ``metadata`` (its Parquet
    footer's) is not one traceview wrote for this schema version; None when it is.

    >>> events_file_problem({"ts_ns": pl.Int64}, {"traceview.schema_version": "3"})
    >>> events_file_problem({"a": pl.Int64}, {})
    'not a traceview events file (no traceview.schema_version in its metadata)'
    >>> events_file_problem({"a": pl.Int64}, {"traceview.schema_version": "3"})
    'not a traceview events file (column a is none of the events schema)'
    >>> events_file_problem({"ts_ns": pl.String}, {"traceview.schema_version": "3"})
    'not a traceview events file (column ts_ns is String, not Int64)'
    """
    version = metadata.get("traceview.schema_version")
    if version is None:
        return "not a traceview events file (no traceview.schema_version in its metadata)"
    if version != str(schema.SCHEMA_VERSION):
        return (f"events file of schema version {version}, this traceview reads "
                f"{schema.SCHEMA_VERSION}")
    expected = store.events_schema()
    for column, dtype in columns.items():
        if column not in expected:
            return f"not a traceview events file (column {column} is none of the events schema)"
        if dtype != expected[column]:
            return (f"not a traceview events file (column {column} is {dtype}, not "
                    f"{expected[column]})")
    return None


def events_footer_problem(path: str | Path, filesystem: Any = None) -> str | None:
    """:func:`events_file_problem` of the events file at ``path`` (on ``filesystem``, a
    pyarrow one, for a URL store), from one read of its footer; a footer that does not read
    is a damaged store file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        footer = pq.read_schema(path, filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        return f"damaged store file ({str(exc).splitlines()[0] if str(exc) else exc!r})"
    metadata = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in (footer.metadata or {}).items()}
    try:
        columns = pl.from_arrow(footer.empty_table()).schema
    except (pl.exceptions.PolarsError, pa.ArrowException) as exc:
        return f"not a traceview events file ({str(exc).splitlines()[0]})"
    return events_file_problem(columns, metadata)


__all__ = ["STORE_FILE_SCHEMA", "STORE_RANK_SCHEMA", "WINDOW_SCHEMA", "events_file_problem",
           "events_footer_problem", "read_store_table"]
