"""The nsys SQLite parser on synthetic exports with known ground truth (fixtures.nsys_synthetic).

Every expected number comes from the generator's ground truth, which is written independently
of the parser (it counts what it inserts), or is derived by hand in the test.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fixtures.nsys_synthetic import (  # noqa: E402
    BAD_THREAD_NAME,
    NCCL_COMM,
    STEP_NS,
    gtid,
    write_export,
)
from traceview.errors import UnreadableTraceError  # noqa: E402
from traceview.parsers import nsys, parse  # noqa: E402
from traceview.parsers.nsys import _tables as tables  # noqa: E402


def frame(parsed) -> pl.DataFrame:
    return pl.from_arrow(parsed.events)


def kind_counts(df: pl.DataFrame) -> dict[str, int]:
    return {k: n for k, n in df.group_by(pl.col("kind").cast(pl.String)).len().iter_rows()}


@pytest.fixture(scope="module")
def gen3(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("nsys") / "two_ranks.sqlite"
    truth = write_export(path, ranks=2, steps=2, kernels_per_step=3)
    return truth, nsys.parse(path)


def test_kinds_counts_and_accounting(gen3) -> None:
    truth, parsed = gen3
    df = frame(parsed)
    assert kind_counts(df) == truth.kinds
    assert parsed.dropped == truth.dropped  # unclosed ranges + domain-creation rows
    assert parsed.input_events == parsed.events.num_rows + sum(parsed.dropped.values())
    assert parsed.events.schema.equals(__import__("traceview").schema.EVENTS_ARROW,
                                       check_metadata=False)
    assert set(df["source"].cast(pl.String).unique()) == {"nsys"}
    assert parsed.format == "nsys-sqlite"


def test_processes_become_ranks(gen3) -> None:
    truth, parsed = gen3
    df = frame(parsed)
    by_rank = {i.rank: i for i in parsed.ranks}
    assert set(by_rank) == {0, 1}
    for rank, expected in truth.ranks.items():
        info = by_rank[rank]
        assert info.pid == expected["pid"]
        assert info.rank_from == "MPI_RANKS"
        assert info.devices == [expected["device_name"]]
        assert info.backend == "nccl"
        assert info.clock_base_ns == truth.session_start_ns
        kernels = df.filter((pl.col("rank") == rank) & (pl.col("kind") == "kernel"))
        assert kernels.height == expected["kernels"]
        assert kernels["device"].unique().to_list() == [expected["device"]]
        assert set(df.filter(pl.col("rank") == rank)["pid"].drop_nulls()) == {expected["pid"]}


def test_epoch_times_and_durations(gen3) -> None:
    truth, parsed = gen3
    df = frame(parsed)
    kernels = df.filter((pl.col("rank") == 0) & (pl.col("kind") == "kernel")).sort("ts_ns")
    first, nccl = kernels.row(1, named=True), kernels.row(0, named=True)
    # rank 0: t0 = 300_000_000 + 1_000 * 0; the step-0 NCCL kernel starts at t0 + 80_000 and
    # lasts 200_000 + 10_000 * 0; the first compute kernel at t0 + 100_000, 50_000 ns long
    assert (nccl["ts_ns"], nccl["dur_ns"]) == (truth.session_start_ns + 300_080_000, 200_000)
    assert first["ts_ns"] == truth.session_start_ns + 300_000_000 + 100_000
    assert first["dur_ns"] == 50_000
    steps = df.filter((pl.col("kind") == "nvtx") & (pl.col("rank") == 1)
                      & pl.col("name").cast(pl.String).str.starts_with("ProfilerStep#")).sort(
        "ts_ns")
    # rank 1: t0 = 300_001_000, steps every STEP_NS, each 1 ms long
    assert steps["ts_ns"].to_list() == [truth.session_start_ns + 300_001_000 + s * STEP_NS
                                        for s in range(2)]
    assert steps["dur_ns"].to_list() == [1_000_000, 1_000_000]
    assert steps["category"].cast(pl.String).to_list() == ["default", "default"]


def test_names_match_kineto_vocabulary(gen3) -> None:
    _, parsed = gen3
    df = frame(parsed).with_columns(pl.col("name").cast(pl.String))
    runtime = set(df.filter(pl.col("kind") == "cuda_runtime")["name"])
    assert runtime == {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
                       "cudaStreamSynchronize"}
    assert set(df.filter(pl.col("kind") == "cuda_driver")["name"]) == {"cuModuleGetLoadingMode"}
    assert set(df.filter(pl.col("kind") == "memcpy")["name"]) == {
        "Memcpy HtoD (Pageable -> Device)"}
    assert set(df.filter(pl.col("kind") == "memcpy")["copy_kind"].cast(pl.String)) == {"HtoD"}
    # bytes of the memcpy of step s are 4096 * (s + 1): steps 0 and 1 on two ranks
    assert sorted(df.filter(pl.col("kind") == "memcpy")["bytes"]) == [4096, 4096, 8192, 8192]
    assert set(df.filter(pl.col("kind") == "memset")["name"]) == {"Memset (Device)"}
    assert set(df.filter(pl.col("kind") == "sync")["name"]) == {"Stream Sync"}
    kernel = df.filter(pl.col("name").str.starts_with("void gemm_kernel_0")).row(0, named=True)
    assert __import__("json").loads(kernel["args_json"]) == {"shortName": "gemm_kernel_0"}
    detailed = frame(nsys.parse(Path(parsed.path), launch_args=True)).with_columns(
        pl.col("name").cast(pl.String))
    kernel = detailed.filter(pl.col("name").str.starts_with("void gemm_kernel_0")).row(
        0, named=True)
    # generator: grid (128,1,1), block (256,1,1), 32 registers, 0 + 1024 B shared memory
    assert __import__("json").loads(kernel["args_json"]) == {
        "grid": [128, 1, 1], "block": [256, 1, 1], "registers per thread": 32,
        "shared memory": 1024, "shortName": "gemm_kernel_0"}
    launch = df.filter(pl.col("kind") == "cuda_runtime").row(0, named=True)
    assert __import__("json").loads(launch["args_json"])["nsys_name"].endswith("_v7000") or \
        __import__("json").loads(launch["args_json"])["nsys_name"].endswith("_v3020")


def test_correlation_links_launch_and_kernel_per_process(gen3) -> None:
    _, parsed = gen3
    df = frame(parsed)
    kernels = df.filter(pl.col("kind") == "kernel").select("rank", "correlation", "ts_ns")
    launches = df.filter(pl.col("kind") == "cuda_runtime").select(
        "rank", "correlation", pl.col("ts_ns").alias("launch_ns"))
    joined = kernels.join(launches, on=["rank", "correlation"], how="left")
    assert joined["launch_ns"].null_count() == 0
    assert (joined["launch_ns"] < joined["ts_ns"]).all()
    # correlation ids restart in every process, so they repeat across ranks
    assert set(kernels.filter(pl.col("rank") == 0)["correlation"]) == set(
        kernels.filter(pl.col("rank") == 1)["correlation"])


def test_nccl_nvtx_and_kernels_carry_collective_columns(gen3) -> None:
    truth, parsed = gen3
    df = frame(parsed).with_columns(pl.col(c).cast(pl.String) for c in (
        "kind", "name", "collective", "pg_name", "category"))
    ranges = (df.filter((pl.col("kind") == "nvtx") & pl.col("collective").is_not_null())
              .sort("rank", "ts_ns"))
    expected = sorted(truth.collectives, key=lambda c: (c["rank"], c["ts_rel_ns"]))
    assert ranges.select("rank", "collective", "bytes", "pg_name", "seq").rows() == [
        (c["rank"], c["collective"], c["bytes"], c["pg_name"], c["seq"]) for c in expected]
    assert set(ranges["category"]) == {"NCCL"}
    # all-reduce of 16384 bytes of 4-byte floats = 4096 elements; group of 2
    allreduce = ranges.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    assert allreduce["in_nelems"] == 4096 and allreduce["group_size"] == 2
    nccl_kernels = df.filter((pl.col("kind") == "kernel") & pl.col("name").str.contains("nccl"))
    assert nccl_kernels.height == sum(r["nccl_kernels"] for r in truth.ranks.values())
    got = nccl_kernels.sort("rank", "ts_ns").select("rank", "collective", "pg_name", "seq",
                                                     "bytes").rows()
    assert got == [(c["rank"], c["collective"], NCCL_COMM, c["seq"], c["bytes"])
                   for c in expected]
    # the look-alike range in another domain is not a collective
    lookalike = df.filter(pl.col("name") == "ncclAllReduce_lookalike")
    assert lookalike.height == 1 and lookalike["collective"].null_count() == 1
    assert lookalike["category"].to_list() == ["other_lib"]


@pytest.mark.parametrize("generation", [1, 2, 3])
def test_every_export_generation(tmp_path: Path, generation: int) -> None:
    truth = write_export(tmp_path / f"g{generation}.sqlite", generation=generation)
    parsed = nsys.parse(truth.path)
    df = frame(parsed)
    assert kind_counts(df) == truth.kinds
    assert parsed.dropped == truth.dropped
    assert df.filter(pl.col("collective").is_not_null() & (pl.col("kind") == "nvtx")).height \
        == len(truth.collectives)
    first_kernel = df.filter((pl.col("kind") == "kernel") & (pl.col("rank") == 0)
                             & pl.col("name").cast(pl.String).str.starts_with("void gemm")
                             )["ts_ns"].min()
    if generation == 1:  # no TARGET_INFO_SESSION_START_TIME: session-relative, with a warning
        assert first_kernel == truth.first_kernel_rel_ns
        assert any("TARGET_INFO_SESSION_START_TIME" in w for w in parsed.warnings)
    else:
        assert first_kernel == truth.epoch(truth.first_kernel_rel_ns)


@pytest.mark.parametrize("source,rank_from", [
    ("mpi", "MPI_RANKS"), ("nccl", "NCCL NVTX"), ("device", "device"), ("none", "device")])
def test_rank_sources(tmp_path: Path, source: str, rank_from: str) -> None:
    truth = write_export(tmp_path / "r.sqlite", ranks=3, steps=1, rank_source=source)
    parsed = nsys.parse(truth.path)
    got = {i.rank: (i.pid, i.rank_from) for i in parsed.ranks}
    # pids are handed out in reverse rank order, so ranking by pid would fail here
    assert got == {r: (info["pid"], rank_from) for r, info in truth.ranks.items()}
    if source == "nccl":
        assert {i.world_size for i in parsed.ranks} == {3}


def test_one_file_per_rank_from_recorded_environment(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "report.sqlite", ranks=1, rank_offset=3, world_size=4,
                         rank_source="env")
    (info,) = nsys.parse(truth.path).ranks
    assert (info.rank, info.world_size, info.pid) == (3, 4, truth.ranks[3]["pid"])
    assert info.rank_from == "RANK in environment of PROCESS_0"


def test_one_process_without_evidence_leaves_rank_to_ingest(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "report.sqlite", ranks=1, rank_source="none")
    parsed = nsys.parse(truth.path)
    assert [i.rank for i in parsed.ranks] == [None]
    assert frame(parsed)["rank"].unique().to_list() == [0]
    named = write_export(tmp_path / "job_rank_5.sqlite", ranks=1, rank_source="none")
    (info,) = nsys.parse(named.path).ranks
    assert (info.rank, info.rank_from) == (5, "file name")


def test_explicit_rank_map_wins(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "r.sqlite", ranks=2, rank_source="mpi")
    pid0, pid1 = truth.ranks[0]["pid"], truth.ranks[1]["pid"]
    parsed = nsys.parse(truth.path, rank_map={pid0: 7, str(pid1): 9})
    assert {i.pid: (i.rank, i.rank_from) for i in parsed.ranks} == {
        pid0: (7, "mapping"), pid1: (9, "mapping")}
    assert set(frame(parsed)["rank"].unique()) == {7, 9}


def test_osrt_off_by_default_and_launcher_rows_dropped(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "r.sqlite", ranks=2, osrt_per_rank=4)
    default = nsys.parse(truth.path)
    assert "os_runtime" not in kind_counts(frame(default))
    assert any(w.startswith(f"OSRT_API: {truth.osrt_rows} ") for w in default.warnings)
    full = nsys.parse(truth.path, include_osrt=True)
    counts = kind_counts(frame(full))
    assert counts["os_runtime"] == 4 * 2  # the ranks' rows; the launcher's 4 have no rank
    assert full.dropped["no_rank_for_process"] == 4
    assert full.input_events == default.input_events + truth.osrt_rows
    assert full.input_events == full.events.num_rows + sum(full.dropped.values())


def test_text_that_is_not_utf8(tmp_path: Path) -> None:
    truth = write_export(tmp_path / "bad.sqlite", ranks=1, bad_utf8=True, rank_source="mpi")
    df = frame(nsys.parse(truth.path))
    threads = df.filter(pl.col("name").cast(pl.String) == "thread_name")["args_json"].to_list()
    assert threads == ['{"name":"' + BAD_THREAD_NAME + '"}']


def test_not_an_nsys_export(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(UnreadableTraceError, match="not an Nsight Systems export") as err:
        parse(path)
    assert str(path) in str(err.value)
    garbage = tmp_path / "broken.sqlite"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\x00" * 80)
    with pytest.raises(UnreadableTraceError, match="broken.sqlite"):
        parse(garbage)


def test_report_file_names_the_export_command(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00NSYS report, not SQLite")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UnreadableTraceError) as err:
        parse(report)
    assert f"nsys export --type sqlite --output {report}.sqlite {report}" in str(err.value)
    assert "\n" not in str(err.value)
    qdrep = tmp_path / "old.qdrep"
    qdrep.write_bytes(b"qdrep")
    with pytest.raises(UnreadableTraceError, match="nsys export --type sqlite"):
        parse(qdrep)


def test_report_is_converted_when_nsys_is_installed(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``nsys`` on PATH (a shell script copying a prepared export) exercises the
    real conversion path: arguments, temporary output, parsing, clean-up."""
    truth = write_export(tmp_path / "prepared.sqlite", ranks=2)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.txt"
    script = bindir / "nsys"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                      f'# nsys export --type sqlite --output OUT IN\ncp {truth.path} "$5"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"report bytes")
    parsed = parse(report)
    assert parsed.path == str(report) and parsed.format == "nsys-rep"
    assert kind_counts(frame(parsed)) == truth.kinds
    args = log.read_text().split()
    assert args[:4] == ["export", "--type", "sqlite", "--output"] and args[5] == str(report)
    assert not Path(args[4]).exists()  # the temporary export is gone
    assert report.read_bytes() == b"report bytes"


def test_adbc_and_python_driver_agree(tmp_path: Path) -> None:
    pytest.importorskip("adbc_driver_sqlite")
    truth = write_export(tmp_path / "r.sqlite", ranks=2)
    fast = nsys.parse(truth.path, use_adbc=True)
    slow = nsys.parse(truth.path, use_adbc=False)
    key = ["rank", "kind", "ts_ns", "name", "correlation"]
    assert frame(fast).sort(key).equals(frame(slow).sort(key))
    assert (fast.input_events, fast.dropped) == (slow.input_events, slow.dropped)


def test_arrow_reader_gives_the_lenient_readers_frame(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_table`` (ADBC, in parallel rowid ranges) gives the frame the sqlite3 path gives,
    for text whose first rows are NULL and for REALs after NULLs (ADBC types a column from its
    first batch; a rowid range is read in one batch), and falls back to the sqlite3 path for
    text that is not UTF-8 and for a column that ADBC types from a batch of NULLs (int64)
    before it meets a REAL (a view has no rowid ranges, so it is read in batches)."""
    pytest.importorskip("adbc_driver_sqlite")
    from traceview.parsers.nsys import _db as nsys_db

    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, text TEXT, payload REAL)")
        con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?)", [
            (i, None if i < 700 else f"range {i}", None if i < 900 else i / 4)
            for i in range(1000)])
        con.execute("CREATE TABLE mixed (start INTEGER, value)")  # text from the first batch
        con.executemany("INSERT INTO mixed VALUES (?, ?)", [(i, "x" if i % 3 == 1 else i)
                                                           for i in range(1000)])
        con.execute("CREATE TABLE reals (start INTEGER, payload REAL)")
        con.executemany("INSERT INTO reals VALUES (?, ?)", [(i, i / 4 if i >= 700 else None)
                                                           for i in range(1000)])
        con.execute("CREATE VIEW reals_view AS SELECT start, payload FROM reals")
        con.execute("CREATE TABLE bad (start INTEGER, text TEXT)")
        con.executemany("INSERT INTO bad VALUES (?, ?)", [(i, f"ok {i}") for i in range(999)])
        con.execute("INSERT INTO bad VALUES (999, CAST(X'6261645FFF' AS TEXT))")
    con.close()
    monkeypatch.setattr(nsys_db, "MIN_RANGE_ROWS", 100)
    monkeypatch.setattr(nsys_db, "ADBC_BATCH_ROWS", 100)
    monkeypatch.setattr(nsys_db, "cores", lambda: 4)
    lenient: list[str] = []
    read_frame = nsys_db.read_frame
    monkeypatch.setattr(nsys_db, "read_frame", lambda export, sql, schema, params=(): (
        lenient.append(sql), read_frame(export, sql, schema, params))[1])
    export = nsys_db.open_export(path, use_adbc=True)
    try:
        cases = [("NVTX_EVENTS", "start, text, payload",
                  {"start": pl.Int64, "text": pl.String, "payload": pl.Float64}, False),
                 ("mixed", "start, value", {"start": pl.Int64, "value": pl.String}, False),
                 ("reals", "start, payload", {"start": pl.Int64, "payload": pl.Float64}, False),
                 ("reals_view", "start, payload", {"start": pl.Int64, "payload": pl.Float64},
                  True),
                 ("bad", "start, text", {"start": pl.Int64, "text": pl.String}, True)]
        for table, select, schema, falls_back in cases:
            lenient.clear()
            fast = nsys_db.read_table(export, table, select.split(", "), schema)
            assert len(lenient) == falls_back, table
            assert fast.equals(read_frame(export, f'SELECT {select} FROM "{table}"', schema))
        assert fast["text"][-1] == "bad_\ufffd"
    finally:
        export.close()


def test_string_ids_far_apart_resolve_like_dense_ones(tmp_path: Path) -> None:
    """Names are looked up by gathering at the StringIds id when ids are 0..n-1 (as exports
    number them) and by a hash lookup otherwise: both must store the same events. A kernel
    whose name id is missing from StringIds gets no name either way."""
    dense = write_export(tmp_path / "dense.sqlite", ranks=2).path
    sparse = tmp_path / "sparse.sqlite"
    sparse.write_bytes(dense.read_bytes())
    references = {"CUPTI_ACTIVITY_KIND_KERNEL": ["demangledName", "shortName"],
                  "CUPTI_ACTIVITY_KIND_RUNTIME": ["nameId"], "OSRT_API": ["nameId"],
                  "ThreadNames": ["nameId"], "NVTX_EVENTS": ["textId"]}
    with sqlite3.connect(sparse) as con:  # id -> id * 1_000_003 + 7: far apart, none small
        con.execute("UPDATE StringIds SET id = -1 - id")  # through negatives: ids stay unique
        con.execute("UPDATE StringIds SET id = (-1 - id) * 1000003 + 7")
        for table, columns in references.items():
            for column in columns:
                con.execute(f"UPDATE {table} SET {column} = {column} * 1000003 + 7 "
                            f"WHERE {column} IS NOT NULL")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 5 "
                    "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    con.close()
    with sqlite3.connect(dense) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 1000000 "
                    "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    con.close()
    for launch_args in (False, True):
        a = frame(nsys.parse(dense, include_osrt=True, launch_args=launch_args))
        b = frame(nsys.parse(sparse, include_osrt=True, launch_args=launch_args))
        assert a.equals(b)
        assert a.filter(pl.col("kind") == "kernel")["name"].null_count() == 1


@given(pid=st.integers(0, 2**24 - 1), tid=st.integers(0, 2**24 - 1), vm=st.integers(0, 2**15))
def test_global_id_decoding(pid: int, tid: int, vm: int) -> None:
    """globalTid = vm << 48 | pid << 24 | tid decodes back to (pid, tid, globalPid)."""
    g = (vm << 48) | (pid << 24) | tid
    out = pl.DataFrame({"g": [g]}).select(
        tables.pid_of("g").alias("pid"), tables.tid_of("g").alias("tid"),
        tables.gpid_of("g").alias("gpid")).row(0)
    assert out == (pid, tid, (vm << 48) | (pid << 24))
    assert gtid(pid, tid) == (1 << 48) | (pid << 24) | tid


def test_shared_zero_buffer_nulls_equal_pa_nulls() -> None:
    import pyarrow as pa

    from traceview import schema
    from traceview.parsers.nsys import _arrow as nsys_arrow

    zeros = pa.py_buffer(bytes(8 * 11))
    for field in schema.EVENTS_ARROW:
        made = nsys_arrow.null_array(field.type, 10, zeros)
        made.validate(full=True)
        assert made.type == field.type and made.null_count == 10
        assert made.equals(pa.nulls(10, type=field.type)), field.name


@pytest.mark.parametrize("sorted_events", [True, False])
def test_rows_slid_in_where_a_stable_sort_puts_them(sorted_events: bool) -> None:
    from traceview.parsers.nsys import _arrow as nsys_arrow

    ts = [10, 20, 20, 30, 40] if sorted_events else [20, 10, 40, 20, 30]
    events = pl.DataFrame({"ts_ns": ts, "name": [f"e{i}" for i in range(5)],
                           "dur_ns": [1] * 5})
    extra = pl.DataFrame({"ts_ns": [50, 20, 5, 20], "name": ["m0", "m1", "m2", "m3"]})
    table = nsys_arrow.in_time_order(events, extra)
    expected = (pl.concat([events, extra], how="diagonal_relaxed")
                .sort("ts_ns", maintain_order=True))
    got = pl.from_arrow(table).select("ts_ns", pl.col("name").cast(pl.String), "dur_ns")
    assert got.equals(expected)
    assert table.schema.names == list(__import__("traceview").schema.EVENT_COLUMN_NAMES)


def test_kernels_read_ahead_are_used_only_for_the_same_queries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel table read while the export is opened gives the frame the parser reads
    itself; it is handed over only for the same table and queries, and a SQLite file that is
    not an export but has a kernel table still fails as before."""
    pytest.importorskip("adbc_driver_sqlite")
    import threading

    from traceview.parsers.nsys import _db as nsys_db
    from traceview.parsers.nsys import _read_ahead as nsys_read_ahead

    truth = write_export(tmp_path / "r.sqlite", ranks=2, steps=3)
    monkeypatch.setattr(nsys_read_ahead, "MIN_BYTES", 0)
    taken: list[str] = []
    take = nsys_read_ahead.ReadAhead.take

    def counted_take(self, table: str, queries: list[str]):  # noqa: ANN202
        got = take(self, table, queries)
        if got is not None:
            taken.append(table)
        return got

    monkeypatch.setattr(nsys_read_ahead.ReadAhead, "take", counted_take)
    ahead = nsys.parse(truth.path, launch_args=True)
    assert taken == [tables.KERNEL]
    monkeypatch.setattr(nsys_read_ahead, "start", lambda *args: None)
    itself = nsys.parse(truth.path, launch_args=True)
    assert frame(ahead).equals(frame(itself))

    reader = nsys_read_ahead.ReadAhead(
        truth.path, tables.KERNEL, lambda cols: tables.kernel_query(cols, launch_args=False))
    assert reader.take("StringIds", []) is None
    assert reader.take(tables.KERNEL, ["SELECT 1"]) is None
    reader.close()

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute(f'CREATE TABLE {tables.KERNEL} (start INTEGER, "end" INTEGER)')
    con.close()
    monkeypatch.undo()
    monkeypatch.setattr(nsys_read_ahead, "MIN_BYTES", 0)
    with pytest.raises(UnreadableTraceError, match="not an Nsight Systems export"):
        nsys.parse(other)
    assert not [t for t in threading.enumerate() if t.name.startswith("nsys-read-ahead")]
    assert nsys_db.split_rowids(None, None, 2) == []
