"""Staged nsys frames -> the events table in the store's Arrow schema, without copying rows.

Two hand-overs used to copy every row of a large export a second time:

* sliding the few metadata rows (process and thread names) in between slices of the events
  gave Polars columns with different chunk layouts, and ``DataFrame.to_arrow`` then rechunks
  every column to align them (~210 MB for 2 M kernels). The slices are cut from the Arrow
  table instead, where a column may hold several chunks as they are, and the frame is
  exported column by column, so the chunks of the rowid ranges need no aligning either.
* ``schema.conform`` makes each column the table lacks with ``pa.nulls``, which allocates and
  zeroes its own buffers: ~270 MB for the 22 columns an nsys kernel table leaves empty, 0.04 s
  of system time on a quiet machine and up to 0.6 s when the kernel must compact memory for
  it. Here they share one zero-filled buffer that is never written (so never touched: its
  pages are only mapped when something reads them, and the cache writer leaves these columns
  out).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview import schema


def events_table(frame: pl.DataFrame) -> pa.Table:
    """``frame`` (event-store columns only, any subset) as a table in the events schema.

    Column by column: ``DataFrame.to_arrow`` first rechunks every column when their chunk
    layouts differ (the columns read from the export hold one chunk per rowid range, those
    derived by a gather one), and a table's columns need not share a layout."""
    table = pa.table({name: frame.select(name).to_arrow().column(0) for name in frame.columns})
    missing = [f for f in schema.EVENTS_ARROW if f.name not in table.column_names]
    if missing and table.num_rows:
        zeros = pa.py_buffer(bytes(8 * (table.num_rows + 1)))  # calloc: no page is touched
        for field in missing:
            table = table.append_column(field, null_array(field.type, table.num_rows, zeros))
    return schema.conform(table)


def null_array(type_: pa.DataType, length: int, zeros: pa.Buffer) -> pa.Array:
    """An all-null array of ``type_`` whose buffers are slices of ``zeros`` (at least
    ``8 * (length + 1)`` zero bytes); ``pa.nulls`` for types without a layout here."""
    validity = zeros.slice(0, (length + 7) // 8)
    if pa.types.is_dictionary(type_):
        indices = null_array(type_.index_type, length, zeros)
        return pa.DictionaryArray.from_arrays(indices, pa.nulls(0, type_.value_type))
    if pa.types.is_integer(type_) and type_.bit_width <= 64:
        data = zeros.slice(0, length * type_.bit_width // 8)
        return pa.Array.from_buffers(type_, length, [validity, data], null_count=length)
    if pa.types.is_large_string(type_):
        offsets = zeros.slice(0, 8 * (length + 1))
        return pa.Array.from_buffers(type_, length, [validity, offsets, zeros.slice(0, 0)],
                                     null_count=length)
    return pa.nulls(length, type=type_)


def in_time_order(events: pl.DataFrame, extra: pl.DataFrame) -> pa.Table:
    """``events`` then ``extra`` rows (each with event-store columns), stably sorted by
    ``ts_ns``, as one table in the events schema. When ``events`` are in time order already (an
    export of one event table), the few ``extra`` rows are slid into place between slices of
    them: a sort would copy every column of every row to move a handful. Ties: events first."""
    if extra.is_empty():
        return events_table(events)
    if not events["ts_ns"].is_sorted():
        return events_table(pl.concat([events, extra], how="diagonal_relaxed")
                            .sort("ts_ns", maintain_order=True))
    extra = extra.sort("ts_ns", maintain_order=True)
    after = events["ts_ns"].search_sorted(extra["ts_ns"], side="right")
    table, rows = events_table(events), events_table(extra)
    parts, start = [], 0
    for (at,), group in (pl.DataFrame({"at": after}).with_row_index()
                         .group_by("at", maintain_order=True)):
        first, count = group["index"][0], group.height  # extra is sorted: groups are runs
        parts += [table.slice(start, at - start), rows.slice(first, count)]
        start = at
    parts.append(table.slice(start))
    # one dictionary per column: the Parquet writer meeting a chunk with another dictionary
    # encodes the rest of the row group value by value (0.29 -> 0.25 CPU s for 2 M kernels);
    # the events' dictionaries come first, so their indices stay as they are (no copy)
    return pa.concat_tables(parts).unify_dictionaries()
