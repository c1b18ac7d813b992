"""The nsys parser on the real export of the shared corpus, through the CLI, and on a directory
mixing Kineto and nsys files. Counts are checked against SQL written here, independently of the
parser; the file must be byte-for-byte unchanged and no journal/WAL file may appear."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fixtures.nsys_synthetic import write_export  # noqa: E402
from traceview.cli import main  # noqa: E402
from traceview.parsers import nsys  # noqa: E402

from tests.conftest import CORPUS, absent  # noqa: E402

CLOVERLEAF = ("pipit-nsys-sqlite/pipit/tests/data/cloverleaf-nsys/"
              "perlmutter-cloverleaf-cuda.sqlite")


@pytest.fixture(scope="module")
def cloverleaf() -> Path:
    path = CORPUS / CLOVERLEAF
    if not path.is_file():
        pytest.skip(absent(path))
    return path


def sql_counts(path: Path) -> dict[str, int]:
    """Independent counts, straight from SQLite."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    one = lambda q: con.execute(q).fetchone()[0]  # noqa: E731
    out = {
        "kernel": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"),
        "memcpy": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY"),
        "sync": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
        "cuda_runtime": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                            "WHERE eventClass <> 1"),
        "cuda_driver": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                           "WHERE eventClass = 1"),
        "launches": one("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                        "ON s.id = r.nameId WHERE s.value LIKE 'cudaLaunchKernel%'"),
        "epoch": one("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"),
        "first_kernel": one("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL"),
    }
    con.close()
    return out


def fingerprint(path: Path) -> tuple[str, int, int, list[str]]:
    stat = path.stat()
    return (hashlib.sha256(path.read_bytes()).hexdigest(), stat.st_mtime_ns, stat.st_size,
            sorted(os.listdir(path.parent)))


def test_real_export_counts_match_sql(cloverleaf: Path) -> None:
    expected = sql_counts(cloverleaf)
    before = fingerprint(cloverleaf)
    parsed = nsys.parse(cloverleaf)
    after = fingerprint(cloverleaf)
    assert after == before  # bytes, mtime, size, and no -journal / -wal / -shm beside it
    df = pl.from_arrow(parsed.events).with_columns(pl.col("kind", "name").cast(pl.String))
    counts = {k: n for k, n in df.group_by("kind").len().iter_rows()}
    for kind in ("kernel", "memcpy", "sync", "cuda_runtime", "cuda_driver"):
        assert counts[kind] == expected[kind], kind
    assert df.filter(pl.col("name") == "cudaLaunchKernel").height == expected["launches"]
    assert df.filter(pl.col("kind") == "kernel")["ts_ns"].min() == \
        expected["epoch"] + expected["first_kernel"]
    assert parsed.input_events == parsed.events.num_rows + sum(parsed.dropped.values())
    (info,) = parsed.ranks
    assert (info.rank, info.host, info.pid) == (0, "nid008553", 1701896)
    assert info.devices == ["NVIDIA A100-SXM4-80GB"]
    # every kernel has its launch (same correlation) before it
    kernels = df.filter(pl.col("kind") == "kernel").select("correlation", "ts_ns")
    launches = df.filter(pl.col("name") == "cudaLaunchKernel").select(
        "correlation", pl.col("ts_ns").alias("launch_ns"))
    joined = kernels.join(launches, on="correlation", how="left")
    assert joined["launch_ns"].null_count() == 0 and (joined["launch_ns"] < joined["ts_ns"]).all()


def test_reading_creates_no_file_in_a_writable_directory(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "run.sqlite", ranks=2)
    before = fingerprint(truth.path)
    nsys.parse(truth.path, include_osrt=True)
    assert fingerprint(truth.path) == before
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        from traceview.parsers.nsys._db import open_export

        export = open_export(truth.path, use_adbc=False)
        try:
            export.conn.execute("CREATE TABLE x (a)")
        finally:
            export.close()
    assert fingerprint(truth.path) == before


def test_cli_info_json_on_real_export(cloverleaf: Path, capsys: pytest.CaptureFixture) -> None:
    expected = sql_counts(cloverleaf)
    assert main(["info", str(cloverleaf), "--json", "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kinds"]["kernel"] == expected["kernel"]
    assert report["kinds"]["memcpy"] == expected["memcpy"]
    assert report["input_events"] == report["stored_events"] + sum(report["dropped"].values())


def test_cli_info_and_sql_on_multi_rank_export(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    truth = write_export(tmp_path / "job.sqlite", ranks=2, steps=2)
    assert main(["info", str(truth.path), "--json", "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kinds"]["kernel"] == truth.kinds["kernel"]
    assert report["kinds"]["memcpy"] == truth.kinds["memcpy"]
    assert report["input_events"] == sum(truth.kinds.values()) + sum(truth.dropped.values())
    assert main(["sql", "--no-cache", "--json", str(truth.path),
                 "select rank, count(*) as n from events where kind = 'kernel' "
                 "group by rank order by rank"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["n"]) for r in rows] == [
        (rank, info["kernels"]) for rank, info in sorted(truth.ranks.items())]


def test_directory_mixing_kineto_and_nsys(tmp_path: Path) -> None:
    """One run: rank 0 profiled with torch.profiler (Kineto), rank 1 with nsys."""
    import traceview

    run = tmp_path / "run"
    run.mkdir()
    write_export(run / "rank1.sqlite", ranks=1, rank_offset=1, world_size=2,
                 rank_source="mpi")
    kineto = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"},
              "baseTimeNanoseconds": 1_700_000_000_000_000_000,
              "traceEvents": [
                  {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "pid": 0, "tid": 7, "ts": 300000.0, "dur": 200.0,
                   "args": {"device": 0, "stream": 20, "correlation": 5}}]}
    (run / "rank0.pt.trace.json").write_text(json.dumps(kineto))
    ts = traceview.open(run, cache=False)
    df = ts.events.collect().with_columns(pl.col("source", "kind", "collective").cast(pl.String))
    assert sorted(ts.ranks["rank"].to_list()) == [0, 1]
    sources = dict(df.group_by("rank").agg(pl.col("source").unique().sort()).iter_rows())
    assert {r: list(s) for r, s in sources.items()} == {0: ["kineto"], 1: ["nsys"]}
    # NCCL kernels are recognised the same way from both sources
    nccl = df.filter((pl.col("kind") == "kernel") & (pl.col("collective") == "all_reduce"))
    assert set(nccl["source"]) == {"kineto", "nsys"}
