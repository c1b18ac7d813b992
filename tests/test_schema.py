"""The schema is declared once; its renderings must agree with it."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from tests.conftest import REPO
from traceview import schema


def test_docs_schema_is_generated_from_schema_py():
    assert (REPO / "docs" / "schema.md").read_text() == schema.markdown() + "\n", (
        "regenerate with: python -m traceview.schema > docs/schema.md")


def test_every_kind_and_column_is_documented():
    text = schema.markdown()
    for column in schema.EVENT_COLUMNS:
        assert f"`{column.name}`" in text
    for kind in schema.KINDS:
        assert f"`{kind}`" in text


def test_times_are_int64_and_strings_dictionary_encoded():
    arrow = schema.EVENTS_ARROW
    assert arrow.field("ts_ns").type == pa.int64() and arrow.field("dur_ns").type == pa.int64()
    assert pa.types.is_dictionary(arrow.field("name").type)
    assert arrow.metadata[b"traceview.schema_version"] == str(schema.SCHEMA_VERSION).encode()
    assert schema.polars_schema()["name"] == pl.Categorical


def test_conform_fills_missing_and_rejects_unknown_columns():
    table = pa.table({"rank": [0], "file_id": [0], "source": ["kineto"], "kind": ["kernel"],
                      "ts_ns": [5]})
    out = schema.conform(table)
    assert out.schema == schema.EVENTS_ARROW and out.column("dur_ns").null_count == 1
    try:
        schema.conform(table.append_column("bogus", pa.array([1])))
    except ValueError as exc:
        assert "bogus" in str(exc)
    else:
        raise AssertionError("unknown column accepted")


def test_polars_schema_is_what_polars_makes_of_the_arrow_schema():
    # polars_schema() is built without pyarrow (a run read from the cache never imports it):
    # it must stay what converting the Arrow declaration gives, column for column
    for columns in (schema.EVENT_COLUMNS, schema.RANK_COLUMNS, schema.FILE_COLUMNS):
        empty = pa.Table.from_batches([], schema=schema.arrow_schema(columns))
        assert schema.polars_schema(columns) == pl.from_arrow(empty).schema
        assert [str(c.type) for c in columns] == [c.arrow for c in columns]
    assert schema.empty_events().schema == schema.polars_schema()
