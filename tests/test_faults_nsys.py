"""Faults inside nsys SQLite exports: odd table and column names, cells not of their column's
type (SQLite types values, not columns), string ids that point nowhere, expected tables that
lack a column. Each is answered by a warning naming the table and column and a partial
answer (exit 0), or, when nothing usable is left, by one line naming the file (exit 2); never
by an internal error, and never by a null or truncated value read as if it were data.

Every hostile export is a copy of the synthetic fixture (``fixtures.nsys_synthetic``) altered
with sqlite3 in ``tmp_path``.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from fixtures.nsys_synthetic import write_export
from traceview.cli import main
from traceview.errors import UnreadableTraceError
from traceview.parsers import nsys
from traceview.parsers.nsys import _db as nsys_db

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
EVENT_TABLES = (KERNEL, RUNTIME, MEMCPY, MEMSET, SYNC, NVTX, "OSRT_API")
#: the first closed NVTX range: a row that is an event (stored when its cells are good)
NVTX_RANGE = f'(SELECT min(rowid) FROM {NVTX} WHERE eventType = 59 AND "end" IS NOT NULL)'
#: the first runtime call (not a driver call)
RUNTIME_CALL = f"(SELECT min(rowid) FROM {RUNTIME} WHERE eventClass = 0)"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nsys.ParsedFile]:
    path = tmp_path_factory.mktemp("nsys") / "good.sqlite"
    write_export(path, ranks=2, steps=2, kernels_per_step=3)
    return path, nsys.parse(path)


def _altered(good_path: Path, tmp_path: Path, *statements: str, loosen: tuple[str, ...] = (),
             name: str = "run.sqlite") -> Path:
    """A copy of the good export with ``statements`` run on it; the tables in ``loosen`` lose
    their NOT NULL / PRIMARY KEY constraints first (same columns and affinities), so that they
    can hold what a damaged export holds."""
    path = tmp_path / name
    shutil.copyfile(good_path, path)
    con = sqlite3.connect(path)
    try:
        for table in loosen:
            con.execute(f'CREATE TABLE "loose" AS SELECT * FROM "{table}"')
            con.execute(f'DROP TABLE "{table}"')
            con.execute(f'ALTER TABLE "loose" RENAME TO "{table}"')
        for statement in statements:
            con.execute(statement)
        con.commit()
    finally:
        con.close()
    return path


def _kinds(parsed) -> dict[str, int]:
    df = pl.from_arrow(parsed.events)
    return dict(df.group_by(pl.col("kind").cast(pl.String)).len().iter_rows())


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


# ------------------------------------------------------------------ names that need quoting
def test_tables_and_columns_with_odd_names_are_read_past(good, tmp_path):
    good_path, base = good
    path = _altered(good_path, tmp_path,
                    'CREATE TABLE "we""ird" (a INTEGER)',
                    """CREATE TABLE "x'y" ("c""d" INTEGER)""",
                    'CREATE TABLE "sp ace;--" (b TEXT)',
                    'CREATE TABLE "CUPTI_ACTIVITY_KIND_""odd" (start INTEGER)',
                    f'ALTER TABLE {KERNEL} ADD COLUMN "we""ird" INTEGER',
                    f"ALTER TABLE {NVTX} ADD COLUMN \"it's\" INTEGER")
    parsed = nsys.parse(path)
    assert _kinds(parsed) == _kinds(base)
    assert parsed.warnings == base.warnings and parsed.dropped == base.dropped
    assert pl.from_arrow(parsed.events).equals(pl.from_arrow(base.events))


def test_a_table_sqlite_cannot_describe_is_read_past(good, tmp_path):
    """A virtual table of a module this SQLite lacks: PRAGMA table_info on it fails."""
    good_path, base = good
    path = _altered(good_path, tmp_path, f"DROP TABLE {MEMSET}", "PRAGMA writable_schema = ON",
                    "INSERT INTO sqlite_master VALUES ('table', 'vt', 'vt', 0, "
                    "'CREATE VIRTUAL TABLE vt USING nosuch(a)')",
                    "INSERT INTO sqlite_master VALUES ('table', 'v\"t', 'v\"t', 0, "
                    "'CREATE VIRTUAL TABLE \"v\"\"t\" USING nosuch(a)')")
    parsed = nsys.parse(path)
    assert _kinds(parsed) == {k: n for k, n in _kinds(base).items() if k != "memset"}


# ------------------------------------------------------------------ cells of the wrong type
#: (table, column, value as SQL, the row (a SQL rowid expression), the kind that loses a row,
#: whether the table must lose its constraints first)
WRONG = [
    (KERNEL, "start", "'abc'", "1", "kernel", False),
    (KERNEL, "start", "NULL", "1", "kernel", True),
    (KERNEL, "end", "2.5", "2", "kernel", False),
    (KERNEL, "deviceId", "x'01'", "1", "kernel", False),
    (KERNEL, "streamId", "'seven'", "1", "kernel", False),
    (KERNEL, "correlationId", "1.5", "1", "kernel", False),
    (KERNEL, "shortName", "'k'", "1", "kernel", False),
    (KERNEL, "demangledName", "x'00ff'", "1", "kernel", False),
    (RUNTIME, "start", "x'0102'", RUNTIME_CALL, "cuda_runtime", False),
    (RUNTIME, "globalTid", "'main'", RUNTIME_CALL, "cuda_runtime", False),
    (RUNTIME, "nameId", "3.25", RUNTIME_CALL, "cuda_runtime", False),
    (RUNTIME, "correlationId", "'c'", RUNTIME_CALL, "cuda_runtime", False),
    (NVTX, "start", "'abc'", NVTX_RANGE, "nvtx", False),
    (NVTX, "text", "x'ff00'", NVTX_RANGE, "nvtx", False),
    (MEMCPY, "start", "1000.5", "1", "memcpy", False),
    (MEMCPY, "bytes", "'4k'", "1", "memcpy", False),
    (MEMSET, "start", "'abc'", "1", "memset", False),
    (SYNC, "end", "NULL", "1", "sync", True),
]


@pytest.mark.parametrize("table, column, value, row, kind, loosen", WRONG,
                         ids=[f"{t.rsplit('_', 1)[-1]}.{c}={v}" for t, c, v, *_ in WRONG])
def test_a_cell_of_the_wrong_type_skips_its_row_with_one_warning(good, tmp_path, table, column,
                                                                 value, row, kind, loosen):
    good_path, base = good
    path = _altered(good_path, tmp_path,
                    f'UPDATE {table} SET "{column}" = {value} WHERE rowid = {row}',
                    loosen=(table,) if loosen else ())
    for use_adbc in (None, False):  # the Arrow reader and the lenient sqlite3 one
        parsed = nsys.parse(path, use_adbc=use_adbc)
        expected = dict(_kinds(base))
        expected[kind] -= 1
        assert _kinds(parsed) == expected
        assert parsed.dropped == {**base.dropped, "wrong_type": 1}
        assert parsed.input_events == base.input_events
        assert parsed.input_events == parsed.events.num_rows + sum(parsed.dropped.values())
        about = [w for w in parsed.warnings if w.startswith(f"{table}:")]
        assert about == [f"{table}: 1 rows skipped, a cell not of its column's type "
                         f"({column} 1)"]


def test_many_wrong_cells_give_one_warning_per_table_counting_by_column(good, tmp_path,
                                                                        capsys):
    good_path, base = good
    path = _altered(good_path, tmp_path,
                    f"UPDATE {KERNEL} SET start = 'abc' WHERE rowid IN (1, 2, 3)",
                    f"UPDATE {KERNEL} SET deviceId = 0.5 WHERE rowid IN (3, 4)",
                    f"UPDATE {RUNTIME} SET \"end\" = x'00' WHERE rowid = 5")
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    kernel = [w for w in warnings if f"{KERNEL}:" in w]
    runtime = [w for w in warnings if f"{RUNTIME}:" in w]
    assert len(kernel) == 1 and kernel[0].endswith(
        f"{KERNEL}: 4 rows skipped, a cell not of its column's type (start 3, deviceId 2)")
    assert len(runtime) == 1 and "1 rows skipped" in runtime[0] and "(end 1)" in runtime[0]
    assert json.loads(out)["stored_events"] == base.events.num_rows - 5


def _only_kernels(good_path: Path, tmp_path: Path, *statements: str) -> Path:
    drops = [f'DROP TABLE "{t}"' for t in EVENT_TABLES if t != KERNEL]
    return _altered(good_path, tmp_path, *drops, *statements)


def test_nothing_usable_left_is_one_line_naming_the_table_and_column(good, tmp_path, capsys):
    good_path, _ = good
    path = _only_kernels(good_path, tmp_path, f"UPDATE {KERNEL} SET start = 'abc'")
    with pytest.raises(UnreadableTraceError, match=f"{KERNEL}: 16 rows skipped.*start 16"):
        nsys.parse(path)
    code, _, err = _run(capsys, "info", str(path), "--no-cache")
    line = _one_line(err)
    assert code == 2 and str(path) in line and KERNEL in line and "start" in line


def test_a_table_without_a_column_its_reader_needs_is_left_out_with_a_warning(good, tmp_path):
    good_path, base = good
    path = _altered(good_path, tmp_path, f"ALTER TABLE {KERNEL} DROP COLUMN deviceId",
                    f'ALTER TABLE {NVTX} DROP COLUMN "end"')
    parsed = nsys.parse(path)
    expected = {k: n for k, n in _kinds(base).items() if k not in ("kernel", "nvtx")}
    assert _kinds(parsed) == expected
    assert f"{KERNEL} has no column deviceId: its 16 rows are not read" in parsed.warnings
    assert any(w.startswith(f"{NVTX} has no column end:") for w in parsed.warnings)


def test_only_tables_without_needed_columns_is_one_line(good, tmp_path, capsys):
    good_path, _ = good
    path = _only_kernels(good_path, tmp_path, f"ALTER TABLE {KERNEL} DROP COLUMN streamId")
    code, _, err = _run(capsys, "info", str(path), "--no-cache")
    line = _one_line(err)
    assert code == 2 and str(path) in line and f"{KERNEL} has no column streamId" in line


# ------------------------------------------------------------------ StringIds
def _names(parsed, kind: str) -> list[str | None]:
    df = pl.from_arrow(parsed.events).filter(pl.col("kind").cast(pl.String) == kind)
    return df.sort("ts_ns")["name"].cast(pl.String).to_list()


def _kernel_name_id(path: Path) -> int:
    with sqlite3.connect(path) as con:
        return con.execute(f"SELECT demangledName FROM {KERNEL} WHERE rowid = 1").fetchone()[0]


@pytest.mark.parametrize("damage, column", [("value = x'00ff'", "value"),
                                            ("id = 'abc'", "id"), ("id = 2.5", "id"),
                                            ("value = NULL", "value")])
def test_a_string_of_the_wrong_type_is_skipped_and_its_users_named_empty(good, tmp_path,
                                                                         damage, column):
    good_path, base = good
    name_id = _kernel_name_id(good_path)
    path = _altered(good_path, tmp_path, f"UPDATE StringIds SET {damage} WHERE id = {name_id}",
                    loosen=("StringIds",))
    parsed = nsys.parse(path)
    assert _kinds(parsed) == _kinds(base)  # every event kept
    assert f"StringIds: 1 rows skipped, a cell not of its column's type ({column} 1)" \
        in parsed.warnings
    users = [w for w in parsed.warnings if w.startswith(f"{KERNEL}:")]
    assert len(users) == 1 and "name a string id that StringIds lacks (demangledName)" in users[0]
    lost = sum(n is None for n in _names(parsed, "kernel"))
    assert lost == int(users[0].split(": ", 1)[1].split()[0]) > 0


def test_string_ids_pointing_nowhere_keep_their_rows_with_a_warning(good, tmp_path):
    good_path, base = good
    path = _altered(good_path, tmp_path,
                    f"UPDATE {KERNEL} SET demangledName = 999999 WHERE rowid = 1",
                    f"UPDATE {KERNEL} SET shortName = -5 WHERE rowid IN (2, 3)",
                    f"UPDATE {RUNTIME} SET nameId = 123456 WHERE rowid = 1",
                    f"UPDATE {NVTX} SET text = NULL, textId = 777777 WHERE rowid = {NVTX_RANGE}")
    parsed = nsys.parse(path)
    assert _kinds(parsed) == _kinds(base) and parsed.dropped == base.dropped
    unresolved = [w for w in parsed.warnings if "string id that StringIds lacks" in w]
    assert unresolved == [
        f"{KERNEL}: 1 rows name a string id that StringIds lacks (demangledName); that name "
        "is left empty",
        f"{KERNEL}: 2 rows name a string id that StringIds lacks (shortName); that name is "
        "left empty",
        f"{RUNTIME}: 1 rows name a string id that StringIds lacks (nameId); that name is left "
        "empty",
        f"{NVTX}: 1 rows name a string id that StringIds lacks (textId); that name is left "
        "empty"]
    assert sum(n is None for n in _names(parsed, "kernel")) == 1


def test_string_ids_without_a_value_column_is_a_warning(good, tmp_path, capsys):
    good_path, base = good
    path = _altered(good_path, tmp_path, "ALTER TABLE StringIds RENAME COLUMN value TO v2")
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0, err
    assert any("StringIds has no id or value column" in w for w in json.loads(out)["warnings"])


# ------------------------------------------------------------------ metadata tables
@pytest.mark.parametrize("table, statement, column", [
    ("ThreadNames", "UPDATE ThreadNames SET globalTid = 'main' WHERE rowid = 1", "globalTid"),
    ("PROCESSES", "UPDATE PROCESSES SET globalPid = 'p' WHERE rowid = 1", "globalPid"),
    ("MPI_RANKS", "UPDATE MPI_RANKS SET rank = 'zero' WHERE rowid = 1", "rank"),
    ("TARGET_INFO_GPU", "UPDATE TARGET_INFO_GPU SET id = 'gpu' WHERE rowid = 1", "id"),
    ("TARGET_INFO_SESSION_START_TIME",
     "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'now'", "utcEpochNs")])
def test_a_metadata_cell_of_the_wrong_type_is_a_warning(good, tmp_path, capsys, table,
                                                        statement, column):
    good_path, _ = good
    path = _altered(good_path, tmp_path, statement)
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0, err
    about = [w for w in json.loads(out)["warnings"] if f"{table}: " in w]
    assert len(about) == 1 and f"rows skipped, a cell not of its column's type ({column} 1)" \
        in about[0]


# ------------------------------------------------------------------ times past int64
def test_times_that_leave_int64_with_the_session_start_are_dropped_not_wrapped(good, tmp_path,
                                                                             capsys):
    good_path, base = good
    path = _altered(good_path, tmp_path, f'UPDATE {KERNEL} SET start = {2**63 - 10}, '
                    f'"end" = {2**63 - 5} WHERE rowid = 1')
    parsed = nsys.parse(path)
    expected = dict(_kinds(base))
    expected["kernel"] -= 1
    assert _kinds(parsed) == expected
    assert parsed.dropped == {**base.dropped, "time_out_of_range": 1}
    assert any("leave the int64 nanosecond range" in w for w in parsed.warnings)
    df = pl.from_arrow(parsed.events)
    assert df["ts_ns"].min() == pl.from_arrow(base.events)["ts_ns"].min()  # none wrapped


def test_a_session_start_that_pushes_every_time_past_int64_is_one_line(good, tmp_path,
                                                                      capsys):
    good_path, _ = good
    path = _altered(good_path, tmp_path,
                    f"UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = {2**63 - 1000}")
    code, _, err = _run(capsys, "info", str(path), "--no-cache")
    line = _one_line(err)
    assert code == 2 and str(path) in line and "int64" in line


def test_wrong_cells_in_rowid_ranges_and_in_the_kernels_read_ahead(good, tmp_path,
                                                                   monkeypatch):
    """The kernel table read ahead (while the export is opened) and in parallel rowid ranges
    skips the same rows with the same warning as one plain read."""
    pytest.importorskip("adbc_driver_sqlite")
    from traceview.parsers.nsys import _db as nsys_db
    from traceview.parsers.nsys import _read_ahead as nsys_read_ahead

    good_path, _ = good
    path = _altered(good_path, tmp_path, f"UPDATE {KERNEL} SET start = 'x' WHERE rowid = 2",
                    f"UPDATE {KERNEL} SET streamId = 7.5 WHERE rowid = 11")
    plain = nsys.parse(path)
    monkeypatch.setattr(nsys_read_ahead, "MIN_BYTES", 0)
    monkeypatch.setattr(nsys_db, "MIN_RANGE_ROWS", 4)
    monkeypatch.setattr(nsys_db, "cores", lambda: 3)
    ranged = nsys.parse(path)
    assert pl.from_arrow(ranged.events).equals(pl.from_arrow(plain.events))
    assert ranged.warnings == plain.warnings and ranged.dropped == plain.dropped
    assert f"{KERNEL}: 2 rows skipped, a cell not of its column's type (start 1, streamId 1)" \
        in ranged.warnings


def test_a_string_over_the_bound_is_a_placeholder_with_a_warning(good, tmp_path):
    """A kernel's name of 8 MB (a hostile export had one of 300 MB, out of memory): SQLite
    hands over a short placeholder giving its size, never the string; one warning."""
    good_path, base = good
    name_id = _kernel_name_id(good_path)
    size = 8 << 20
    path = _altered(good_path, tmp_path,
                    f"UPDATE StringIds SET value = replace(hex(zeroblob({size // 2})), '0', 'k') "
                    f"WHERE id = {name_id}")
    parsed = nsys.parse(path)
    assert _kinds(parsed) == _kinds(base)
    names = set(_names(parsed, "kernel"))
    assert f"(a string of {size} bytes, over the bound of {nsys_db.MAX_STRING_BYTES} left out)" \
        in names and max(len(n or "") for n in names) < 1000
    assert sum("over 1048576 bytes (the bound on one name)" in w for w in parsed.warnings) == 1
