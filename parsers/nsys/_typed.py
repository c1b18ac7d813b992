"""Cells that do not hold their column's type. SQLite types values, not columns: a TEXT
``'abc'``, a REAL, a BLOB or a NULL can sit in an INTEGER column such as ``start``. Such a row
is skipped, not read as a null or a truncated number (a blended answer), and counted by column.

A read names each output column (its SQL expression and Polars type); the cells of an integer
output must be integers, of a float output numbers, of a text output anything but a BLOB (a
number is read as its text, as SQLite's own TEXT affinity stores it); a *required* output may
not be NULL either. The check costs nothing on the good path: ADBC types each column from all
the values of a rowid range, so an Arrow column of the expected type (and no nulls where
required) proves every cell (:func:`arrow_holds`). Only a table that fails it is read again
with :func:`keep_sql` as its ``WHERE`` clause (a per-row ``typeof`` filter costs ~50% of the
read) and its skipped rows counted by column (:func:`count_sql`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

_PLAIN = re.compile(r'^(?:"((?:[^"]|"")+)"|([A-Za-z_]\w*))$')


@dataclass(frozen=True)
class Check:
    """One output's cells: its label (the column, for messages), SQL expression and the
    ``typeof`` values allowed."""

    label: str
    expr: str
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class Skipped:
    """Rows of one table skipped for a cell of the wrong type: in all, and per column."""

    rows: int
    columns: dict[str, int]

    def describe(self) -> str:
        """``start 2, deviceId 1``"""
        return ", ".join(f"{c} {n}" for c, n in self.columns.items() if n)


def _allowed(dtype: pl.DataType, required: bool) -> tuple[str, ...]:
    if dtype == pl.String:
        allowed: tuple[str, ...] = ("text", "integer", "real")
    elif dtype == pl.Float64:
        allowed = ("integer", "real")
    else:
        allowed = ("integer",)
    return allowed if required else (*allowed, "null")


def _label(expr: str, output: str) -> str:
    """The column an expression reads (``"end"`` -> ``end``), else the output's name."""
    plain = _PLAIN.match(expr.strip())
    if not plain:
        return output
    return plain.group(1).replace('""', '"') if plain.group(1) else plain.group(2)


def checks(select: Sequence[str], schema: dict[str, pl.DataType],
           required: Sequence[str] = ()) -> list[Check]:
    """The checks of a read: one per output that is not a constant (``NULL``, ``0``)."""
    return [Check(_label(expr, output), expr, _allowed(dtype, output in required))
            for expr, (output, dtype) in zip(select, schema.items(), strict=True)
            if expr.strip().upper() != "NULL" and not expr.strip().isdigit()]


def _holds(check: Check) -> str:
    return f"typeof({check.expr}) IN ({', '.join(repr(t) for t in check.allowed)})"


def keep_sql(found: Sequence[Check]) -> str:
    """The condition that keeps only rows whose cells hold their types (``1`` for none)."""
    return " AND ".join(_holds(c) for c in found) or "1"


def count_sql(table_sql: str, found: Sequence[Check]) -> str:
    """A query giving the rows skipped, then per check the rows whose cell fails it."""
    per = ", ".join(f"sum(NOT {_holds(c)})" for c in found)
    return f"SELECT count(*), {per} FROM {table_sql} WHERE NOT ({keep_sql(found)})"


def skipped(row: Sequence[int | None], found: Sequence[Check]) -> Skipped:
    """:class:`Skipped` from the row of :func:`count_sql`."""
    per: dict[str, int] = {}
    for check, n in zip(found, row[1:], strict=True):
        per[check.label] = per.get(check.label, 0) + int(n or 0)
    return Skipped(int(row[0] or 0), per)


def arrow_holds(table: pa.Table, schema: dict[str, pl.DataType],
                required: Sequence[str] = ()) -> bool:
    """Whether every column of ``table`` (ADBC's, typed from all its values) is of its
    output's type, with no null in a required one."""
    for column, (output, dtype) in zip(table.columns, schema.items(), strict=True):
        kind = column.type
        if output in required and column.null_count:
            return False
        if pa.types.is_null(kind) or column.null_count == len(column):
            continue  # ADBC types a column of NULLs only as int64
        if dtype == pl.String:
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        elif dtype == pl.Float64:
            ok = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        else:
            ok = pa.types.is_integer(kind)
        if not ok:
            return False
    return True
