"""The Kineto ``args`` map is written once, in ``schema.KINETO_ARGS``; the C scanner keeps a copy
(``ARG_KEYS`` in parsers/kineto/_scan.c) and the column docs name the keys. These tests read the
C source's tables and fail when any of the three drifts from the others."""

from __future__ import annotations

import re

from tests.conftest import REPO
from traceview import schema

SCANNER = REPO / "parsers" / "kineto" / "_scan.c"


def _c_block(source: str, start: str) -> str:
    """The text between ``start`` and the ``}`` that closes the brace it opens."""
    at = source.index(start)
    return source[source.index("{", at) + 1:source.index("}", source.index("{", at))]


def _c_tables() -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """(column -> args keys by priority, text columns) as the C scanner declares them."""
    source = re.sub(r"/\*.*?\*/", "", SCANNER.read_text(), flags=re.DOTALL)
    enum = [name.strip() for name in _c_block(source, "enum {").split(",") if name.strip()]
    names = re.findall(r'"([^"]*)"', _c_block(source, "COL_NAMES[N_COLS]"))
    is_str = [int(v) for v in re.findall(r"\d", _c_block(source, "COL_IS_STR[N_COLS]"))]
    assert enum[-1] == "N_COLS" and len(names) == len(is_str) == len(enum) - 1
    keys = re.findall(r'\{"([^"]+)", (A_\w+), (\d)\}',
                      source[source.index("ARG_KEYS[] = {"):source.index("N_ARG_KEYS")])
    by_column: dict[str, list[tuple[int, str]]] = {}
    for key, column, priority in keys:
        by_column.setdefault(names[enum.index(column)], []).append((int(priority), key))
    args = {column: tuple(key for _, key in sorted(found, key=lambda p: p[0]))
            for column, found in by_column.items()}
    text = {names[enum.index(c)] for c in enum if c.startswith("A_") and is_str[enum.index(c)]}
    return args, text


def test_c_scanner_reads_the_schema_args_map():
    args, text = _c_tables()
    assert args == dict(schema.KINETO_ARGS)
    assert text == schema.KINETO_TEXT_ARGS


def test_column_docs_name_their_kineto_args_key():
    for column in schema.EVENT_COLUMNS:
        if column.name in schema.KINETO_ARGS:
            assert schema.KINETO_ARGS[column.name][0] in column.kineto, column.name


def test_kind_groups_are_kinds():
    for group in (schema.GPU_KINDS, schema.GPU_STREAM_KINDS, schema.RUNTIME_KINDS,
                  schema.STEP_MARKER_KINDS):
        assert set(group) <= set(schema.KINDS)
