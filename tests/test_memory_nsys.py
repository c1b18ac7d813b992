"""``traceview memory`` on Nsight Systems exports with CUDA memory usage: a synthetic export
(real SQLite, the table as ``shared/reference/nsys-schema-dumps`` defines it) whose answer is
derived by hand, and an export without the table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl

import traceview
from fixtures import nsys_synthetic

#: CUDA_GPU_MEMORY_USAGE_EVENTS as saxpy-mpi-cuda_nsys_perlmutter0.schema.sql defines it
TABLE = """CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (
    start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL,
    bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL,
    name TEXT, correlationId INTEGER)"""


def _export_with_memory(path: Path) -> nsys_synthetic.GroundTruth:
    """Two ranks. Rank 0 (device 0, 40,000,000 B GPU): cudaMalloc 10 MB at +1 ms, 30 MB at
    +2 ms, cudaFree 10 MB at +3 ms, cudaMalloc 5 MB at +4 ms, and 1 MB pinned host memory at
    +1.5 ms; rank 1 (device 1): 2 MB at +1 ms. By hand, rank 0 cuda:0: running sum 10, 40,
    30, 35 MB: peak 40,000,000 B (relative to the capture's start) at +2 ms, end 35 MB. nsys
    gives no reserved figure, so no pressure check, though the device total is known. Host
    (pinned) 1 MB. Steps start at +0 (nothing allocated yet) and +10 ms (35 MB)."""
    truth = nsys_synthetic.write_export(path, ranks=2, steps=2)
    con = sqlite3.connect(path)
    con.execute(TABLE)
    t0 = 300_000_000
    rows = []
    for rank, info in truth.ranks.items():
        gp = nsys_synthetic.gpid(info["pid"])
        dev = info["device"]
        ops = ([(1, 10, 2, 0), (2, 30, 2, 0), (3, 10, 2, 1), (4, 5, 2, 0), (1.5, 1, 1, 0)]
               if rank == 0 else [(1, 2, 2, 0)])
        for ms, mb, kind, freed in ops:
            rows.append((t0 + int(ms * 1_000_000), gp, dev, 1, 0x7000 + mb, 0,
                         mb * 1_000_000, kind, freed, None, None))
    con.executemany("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    rows)
    con.execute("UPDATE TARGET_INFO_GPU SET totalMemory = 40000000")
    con.commit()
    con.close()
    return truth


def test_nsys_memory_usage_by_hand(tmp_path: Path) -> None:
    truth = _export_with_memory(tmp_path / "run.sqlite")
    run = traceview.open(tmp_path / "run.sqlite", cache=False)
    res = run.memory()
    rows = {(r["rank"], r["device"]): r for r in res.table("devices").iter_rows(named=True)}
    start = truth.epoch(300_000_000)
    gpu = rows[(0, "cuda:0")]
    assert (gpu["basis"], gpu["peak_allocated_bytes"], gpu["peak_reserved_bytes"],
            gpu["peak_time_ns"], gpu["end_allocated_bytes"], gpu["events"]) == (
        "relative", 40_000_000, None, start + 2_000_000, 35_000_000, 4)
    assert gpu["device_total_bytes"] == 40_000_000 and not gpu["near_limit"]
    assert rows[(0, "cpu")]["peak_allocated_bytes"] == 1_000_000
    assert rows[(1, "cuda:1")]["peak_allocated_bytes"] == 2_000_000
    steps = res.table("steps").filter((pl.col("rank") == 0) & (pl.col("device") == "cuda:0"))
    assert steps["allocated_bytes"].to_list() == [0, 35_000_000]


def test_nsys_export_without_memory_usage(tmp_path: Path) -> None:
    nsys_synthetic.write_export(tmp_path / "plain.sqlite", ranks=1, steps=1)
    res = traceview.open(tmp_path / "plain.sqlite", cache=False).memory()
    assert res.table("devices").height == 0
    assert any("no allocator events" in w for w in res.warnings)
