"""The rank in a file's name, when the trace records none, for every format: per-rank nsys
exports named as the nsys documentation names them (``trace_rank0.sqlite``, ...)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from traceview.cli import main


def _cpu_only_export(path: Path, steps: int) -> None:
    """An nsys export of one process that launched no CUDA work: nothing in it names a rank
    (no MPI table, no NCCL, no rank in its environment)."""
    from fixtures.nsys_synthetic import write_export

    write_export(path, ranks=1, rank_source="none", steps=steps)
    with sqlite3.connect(path) as con:
        tables = [name for (name,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name LIKE 'CUPTI_ACTIVITY_KIND_%'")]
        for table in tables:
            con.execute(f"DELETE FROM {table}")  # noqa: S608 - names from the file itself


def _info(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict, str]:
    code = main(["info", str(path), "--json"])
    out = capsys.readouterr()
    return code, orjson.loads(out.out) if code == 0 else {}, out.err


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in range(2):  # different step counts: files of different content
        _cpu_only_export(folder / f"trace_rank{rank}.sqlite", steps=2 + rank)
    return folder


def test_a_folder_of_per_rank_nsys_exports_is_read_by_their_names(
        exports: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, info, err = _info(capsys, exports)
    assert code == 0, err
    ranks = {Path(r["file"]).name: (r["rank"], r["rank_from"]) for r in info["ranks"]}
    assert ranks == {"trace_rank0.sqlite": (0, "file name"),
                     "trace_rank1.sqlite": (1, "file name")}
    assert "names no rank" not in err and "records rank" not in err


def test_one_per_rank_export_keeps_its_rank(exports: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, info, err = _info(capsys, exports / "trace_rank1.sqlite")
    assert code == 0 and [r["rank"] for r in info["ranks"]] == [1]
    assert "assuming rank 0" not in err


def test_byte_identical_exports_under_two_rank_names(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """One cache entry for both (same bytes): each still takes its own name's rank, without a
    warning that one 'records' the other's."""
    _cpu_only_export(tmp_path / "trace_rank0.sqlite", steps=2)
    (tmp_path / "trace_rank1.sqlite").write_bytes((tmp_path / "trace_rank0.sqlite").read_bytes())
    code, info, err = _info(capsys, tmp_path)
    assert code == 0 and sorted(r["rank"] for r in info["ranks"]) == [0, 1]
    assert "records rank" not in err


def test_an_export_of_processes_none_of_which_has_a_rank_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two CPU-only processes, neither naming its rank: every row would be dropped, and
    summary printed an empty table with exit 0. Now one line naming the file and the way out
    (a rank per process id), which then reads both."""
    import sqlite3

    import traceview
    from fixtures.nsys_synthetic import write_export

    path = tmp_path / "app.sqlite"
    write_export(path, ranks=2, rank_source="none")
    with sqlite3.connect(path) as con:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                    "AND name LIKE 'CUPTI_ACTIVITY_KIND_%'").fetchall():
            con.execute(f"DELETE FROM {table}")  # noqa: S608 - names from the file itself
    assert main(["summary", str(path), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "rank_map" in err[0]
    pids = [int(p) for p in err[0].split("(pids ", 1)[1].split(")", 1)[0].split(", ")]
    run = traceview.open(path, cache=False,
                         options={"rank_map": {f"pid:{pid}": r for r, pid in enumerate(pids)}})
    assert run.summary().to_polars()["rank"].to_list() == [0, 1]
