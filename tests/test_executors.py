"""Executors without Dask: local process pools, retries, a dead worker, per-file failures, stores on
fsspec/pyarrow filesystems, and per-rank summaries checked by hand and against the whole-frame
analyses."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.store import parquet as store
from traceview.errors import UsageError
from traceview.store.executors import ExecutorSpec, TaskFailure, local_pool, open_executor, run_tasks
from traceview.store.ingest import ingest, parser_version
from traceview.parsers import detect_format
from traceview.run.per_rank import cross_rank, summarise
from traceview.schema import events_frame

REPO = Path(__file__).resolve().parents[1]
GLOO = REPO / "fixtures" / "data" / "gloo_ddp_2r"


# --- task functions (module level: workers import them by name) ------------------------

def flaky(marker_dir: str, key: str, fail_times: int) -> str:
    """Raises on its first ``fail_times`` attempts (counted in files, across processes)."""
    marker = Path(marker_dir) / key
    n = len(list(Path(marker_dir).glob(f"{key}.*")))
    (marker.parent / f"{key}.{n}").touch()
    if n < fail_times:
        raise OSError(f"transient failure {n} of {key}\nsecond line")
    return f"{key} ok after {n + 1}"


def die_once(marker_dir: str, key: str) -> str:
    """Kills its worker process on the first attempt (a segfault or an OOM kill looks so)."""
    marker = Path(marker_dir) / key
    if not marker.exists():
        marker.touch()
        os._exit(1)
    return key


@pytest.fixture(scope="module")
def pool():
    ex = local_pool(2)
    yield ex
    ex.shutdown()


def test_spec_validation() -> None:
    with pytest.raises(UsageError, match="--executor wants"):
        ExecutorSpec("slurm")
    with pytest.raises(UsageError, match="--scheduler needs --executor dask"):
        ExecutorSpec("local", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(UsageError):
        ExecutorSpec("local", retries=-1)


def polars_sum(n: int) -> int:
    return int(pl.DataFrame({"x": list(range(n))}).select(pl.col("x").sum()).item())


def test_local_pool_never_forks_the_caller() -> None:
    """Workers come from the fork server (Linux) or are spawned, never forked from this
    process, whose Polars thread pool has run: a Polars query in a worker completes."""
    assert polars_sum(10) == 45  # this process's Polars threads have started
    ex = local_pool(2)
    try:
        expected = "forkserver" if sys.platform.startswith("linux") else "spawn"
        assert ex._mp_context.get_start_method() == expected
        futures = [ex.submit(polars_sum, 1000) for _ in range(2)]
        assert [f.result(timeout=120) for f in futures] == [499500, 499500]
    finally:
        ex.shutdown()


def test_retries_then_success_and_failure(pool: ProcessPoolExecutor, tmp_path: Path) -> None:
    tasks = [(str(tmp_path), "a", 0), (str(tmp_path), "b", 2), (str(tmp_path), "c", 5)]
    out = run_tasks(pool, flaky, tasks, retries=2)
    assert out[0] == "a ok after 1"
    assert out[1] == "b ok after 3"          # two failed attempts, retried twice
    assert isinstance(out[2], TaskFailure)
    assert out[2].attempts == 3 and out[2].args == tasks[2]
    assert out[2].error == "OSError: transient failure 2 of c"   # one line, last attempt
    assert len(list(tmp_path.glob("c.*"))) == 3


def test_no_retries(pool: ProcessPoolExecutor, tmp_path: Path) -> None:
    out = run_tasks(pool, flaky, [(str(tmp_path), "d", 1)], retries=0)
    assert isinstance(out[0], TaskFailure) and out[0].attempts == 1


def test_dead_worker_pool_is_replaced(tmp_path: Path) -> None:
    # x kills its worker once; y and z are fine but were in flight in the broken pool (each
    # failure of a broken pool costs every task in it one attempt).
    (tmp_path / "y").touch()
    (tmp_path / "z").touch()
    ex = local_pool(2)
    try:
        tasks = [(str(tmp_path), k) for k in ("x", "y", "z")]
        out = run_tasks(ex, die_once, tasks, retries=2, replace_pool=lambda: local_pool(2))
    finally:
        ex.shutdown()
    assert out == ["x", "y", "z"]


def test_dead_worker_without_replacement_is_reported(tmp_path: Path) -> None:
    ex = local_pool(1)
    try:
        out = run_tasks(ex, die_once, [(str(tmp_path), "w")], retries=2)
    finally:
        ex.shutdown()
    assert isinstance(out[0], TaskFailure) and "BrokenProcessPool" in out[0].error


def _block_cache_entry(cache: Path, trace: Path) -> None:
    """Put a plain file where ``trace``'s cache folder goes: writing its Parquet there then
    fails (EEXIST) on every attempt: a real, per-file failure of the cache, not of the trace."""
    key = store.cache_key(store.content_id(trace), parser_version(detect_format(trace)), {})
    cache.mkdir(parents=True, exist_ok=True)
    (cache / key).write_text("not a folder")


def test_a_blocked_cache_entry_comes_back_from_the_worker_in_memory(pool: ProcessPoolExecutor,
                                                                    tmp_path: Path) -> None:
    """The cache's fault is not the trace's (issue 19): the worker process sends the parse's
    Parquet bytes back, the run says once that the cache was not written, and the answer is
    the one a writable cache gives. (A file that fails every attempt is reported by name:
    ``test_dask.py::test_dask_failing_file_reported_by_file``; the retries: above.)"""
    files = sorted(GLOO.glob("*.json.gz"))
    cache = tmp_path / "cache"
    _block_cache_entry(cache, files[1])
    res = ingest(files, cache_dir=cache, skip_bad=True, executor=pool)
    assert [Path(f.path).name for f in res.files] == [f.name for f in files] and not res.skipped
    assert res.files[1].events_data is not None and res.files[0].events_data is None
    assert len([n for n in res.notes if f"cache not written: {cache}: File exists" in n]) == 1
    truth = ingest(files, cache_dir=tmp_path / "writable", executor=pool)
    assert [f.stored_events for f in res.files] == [f.stored_events for f in truth.files]
    assert res.rank_of == truth.rank_of


def test_local_executor_store_matches_default(tmp_path: Path) -> None:
    default = traceview.open(GLOO, cache=False)
    spec = ExecutorSpec("local", max_workers=2)
    with open_executor(spec) as ex:
        viaexec = traceview.open(GLOO, cache=False, executor=ex)
        viaexec.executor = ex
        url = (tmp_path / "store").as_uri()
        assert viaexec.write_store(url) == url
    a = default.events.collect().sort(pl.all())
    b = viaexec.events.collect().sort(pl.all())
    assert a.height == 2078 and a.equals(b)
    reopened = traceview.open(url)
    assert reopened.events.collect().sort(pl.all()).equals(a)
    assert reopened.ranks.equals(default.ranks) and reopened.files.equals(default.files)


def test_memory_url_store_roundtrip() -> None:
    pytest.importorskip("fsspec")
    ts = traceview.open(GLOO, cache=False)
    url = "memory://traceview-test/gloo"
    ts.write_store(url)  # a URL: written rank by rank through pyarrow's fsspec handler
    back = traceview.open(url)
    assert back.ranks.get_column("rank").to_list() == [0, 1]
    assert back.events.collect().sort(pl.all()).equals(ts.events.collect().sort(pl.all()))
    assert back.sql("select count(*) as n from events").item() == 2078


def test_url_that_is_no_store(tmp_path: Path) -> None:
    """Each URL that cannot be read says why, naming it: nothing there or a trace file (not
    a store), a scheme no filesystem knows, a URL beside other inputs (all were "a URL
    input must be a traceview store")."""
    from traceview.errors import UnreadableTraceError

    trace = sorted(GLOO.iterdir())[0].as_uri()
    for url, words in [((tmp_path / "nothing").as_uri(), "not a traceview store"),
                       (trace, r"not a traceview store \(no traceview-store.json there\)"),
                       ("nosuchscheme://host/t.json", "no filesystem for this URL")]:
        with pytest.raises(UnreadableTraceError, match=words) as caught:
            traceview.open(url)
        assert str(caught.value).startswith(url)
    with pytest.raises(UsageError, match="URL input must be the only input"):
        traceview.open([trace, str(GLOO)])


def test_cli_ingest_local_executor_to_url_then_analyses(tmp_path: Path, capsys) -> None:
    import orjson

    from traceview.cli import main

    url = (tmp_path / "st").as_uri()
    assert main(["ingest", str(GLOO), "--executor", "local", "-o", url, "--json",
                 "--no-cache"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["store"] == url and report["stored_events"] == 2078
    assert main(["collectives", url, "--json"]) == 0
    coll = orjson.loads(capsys.readouterr().out)
    assert main(["analyse", url, "--json"]) == 0
    ana = orjson.loads(capsys.readouterr().out)
    assert ana["ranks"] == 2 and ana["events"] == 2078 and ana["failed"] == []
    # The per-rank path matches the whole-frame command, instance by instance.
    key = ("instance", "group", "seq", "n_ranks", "skew_ns", "last_rank", "comm_ns")
    assert coll["instances"] and len(coll["instances"]) == len(ana["collectives"])
    assert [[i[k] for k in key] for i in ana["collectives"]] == \
        [[i[k] for k in key] for i in coll["instances"]]
    assert main(["stragglers", url, "--json"]) == 0
    strag = orjson.loads(capsys.readouterr().out)
    assert strag["ranks"] == ana["stragglers"]


# --- per-rank summaries by hand ---------------------------------------------------------------

K = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _hand_trace() -> pl.DataFrame:
    """Two ranks, two steps each, one all-reduce per step, one compute kernel per step.

    rank 0: ProfilerStep#1 [0, 10_000), kernel gemm [1_000, 4_000), allreduce [4_000, 6_000)
            ProfilerStep#2 [10_000, 20_000), gemm [11_000, 14_000), allreduce [14_000, 16_000)
    rank 1 (clock +1_000_000 ns): gemm ends 1_000 ns later, so it arrives last by 1_000 ns;
            both all-reduces end at the same true time.
    """
    rows = []
    for r, off in ((0, 0), (1, 1_000_000)):
        for s, base in ((1, 0), (2, 10_000)):
            rows.append(dict(rank=r, file_id=r, source="kineto", kind="user_annotation",
                             name=f"ProfilerStep#{s}", pid=1, tid=1, ts_ns=base + off,
                             dur_ns=10_000))
            late = 1_000 * r
            rows.append(dict(rank=r, file_id=r, source="kineto", kind="kernel", name="gemm",
                             device=0, stream=7, ts_ns=base + 1_000 + off,
                             dur_ns=3_000 + late, step=s))
            rows.append(dict(rank=r, file_id=r, source="kineto", kind="kernel", name=K,
                             device=0, stream=13, ts_ns=base + 4_000 + late + off,
                             dur_ns=2_000 - late, step=s, collective="all_reduce",
                             bytes=4_000, group_size=2, pg_name="0", seq=s))
    return events_frame(rows)


def test_summary_by_hand() -> None:
    ev = _hand_trace()
    s1 = summarise(ev.filter(pl.col("rank") == 1))
    assert s1.ranks == [1] and s1.events == 6
    assert s1.comm.select("seq", "ts_ns", "end_ns").rows() == [
        (1, 1_005_000, 1_006_000), (2, 1_015_000, 1_016_000)]
    assert s1.steps.select("step", "step_start_ns", "step_time_ns").rows() == [
        (1, 1_000_000, 10_000), (2, 1_010_000, 10_000)]
    # Overlap on rank 1: gemm [1_001_000, 1_005_000) and allreduce [1_005_000, 1_006_000)
    # touch but do not overlap; comm 2 x 1_000 ns, compute 2 x 4_000 ns.
    ov = s1.overlap.row(0, named=True)
    assert (ov["compute_ns"], ov["comm_ns"], ov["overlap_ns"]) == (8_000, 2_000, 0)
    assert s1.nbytes() > 0

    res = cross_rank([summarise(ev.filter(pl.col("rank") == r)) for r in (0, 1)])
    # Alignment: ends at 6_000 / 1_006_000 and 16_000 / 1_016_000 -> offset 1_000_000.
    assert res.offsets.select("rank", "offset_ns").rows() == [(0, 0), (1, 1_000_000)]
    # Rank 0 arrives at 4_000, rank 1 at 5_000 (aligned): skew 1_000, last rank 1, and the
    # transfer (min duration over ranks) is rank 1's 1_000 ns: 4_000 B / 1_000 ns = 4 GB/s,
    # busbw x 2(n-1)/n = 1 -> 4 GB/s.
    assert res.collectives.select("seq", "skew_ns", "last_rank", "comm_ns").rows() == [
        (1, 1_000, 1, 1_000), (2, 1_000, 1, 1_000)]
    assert res.collectives.get_column("busbw_gbps").to_list() == [4.0, 4.0]
    st = res.stragglers.filter(pl.col("rank") == 1).row(0, named=True)
    assert st["last_arrivals"] == 2 and st["imposed_wait_ns"] == 2_000


def test_cross_rank_with_missing_rank_is_partial() -> None:
    ev = _hand_trace()
    res = cross_rank([summarise(ev.filter(pl.col("rank") == 0))],
                     failed=["rank-1.json: rank 1: analysis failed (OSError: x)"])
    assert res.collectives.height == 0
    assert res.offsets.select("rank", "offset_ns").rows() == [(0, 0)]
    assert "no collective was matched" in res.stragglers.get_column("explanation")[0]
    assert res.failed == ["rank-1.json: rank 1: analysis failed (OSError: x)"]


def test_cross_rank_of_nothing() -> None:
    res = cross_rank([])
    assert res.offsets.height == 0 and res.collectives.height == 0


# --- property: the per-rank path equals the whole-frame analyses -----------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _traces(draw) -> pl.DataFrame:
    n_ranks = draw(st.integers(2, 3))
    n_coll = draw(st.integers(1, 4))
    rows = []
    for r in range(n_ranks):
        off = draw(st.integers(-10**9, 10**9)) if r else 0
        t = 0
        for s in range(n_coll):
            comp = draw(st.integers(0, 50_000))
            rows.append(dict(rank=r, file_id=r, source="kineto", kind="user_annotation",
                             name=f"ProfilerStep#{s}", ts_ns=t + off,
                             dur_ns=comp + 200_000))
            if comp:
                rows.append(dict(rank=r, file_id=r, source="kineto", kind="kernel",
                                 name="gemm", device=r, stream=7, ts_ns=t + off, dur_ns=comp))
            start = t + comp - draw(st.integers(0, comp))  # may overlap the compute kernel
            rows.append(dict(rank=r, file_id=r, source="kineto", kind="kernel", name=K,
                             device=r, stream=13, ts_ns=start + off,
                             dur_ns=100_000 + s * 1_000 - (start - t), collective="all_reduce",
                             bytes=1 << 20, group_size=n_ranks, pg_name="0", seq=s))
            t += 200_000
    return events_frame(rows)


@settings(max_examples=25, deadline=None)
@given(_traces())
def test_per_rank_equals_whole_frame(ev: pl.DataFrame) -> None:
    from traceview.run.run import Run

    whole = Run.from_events(ev)  # every table on the whole frame, wired as the CLI does
    ranks = sorted(ev.get_column("rank").unique().to_list())
    res = cross_rank([summarise(ev.filter(pl.col("rank") == r)) for r in ranks])
    assert res.offsets.equals(whole.offsets)
    assert res.collectives.equals(whole.collectives()["instances"])
    assert res.stragglers.equals(whole.stragglers()["ranks"])
    assert res.overlap.equals(whole.overlap_rows)
    # Overlap never exceeds either side; the union of both fits in the window.
    o = res.overlap
    assert (o["overlap_ns"] <= o["compute_ns"]).all() and (o["overlap_ns"] <= o["comm_ns"]).all()


@pytest.mark.parametrize("flags", [[], ["-E"]], ids=["pinned path", "environment ignored"])
def test_workers_import_the_callers_traceview_from_any_folder(tmp_path: Path,
                                                               flags: list[str]) -> None:
    """Run from a folder holding another ``traceview`` (a checkout's root: its uncompiled
    sources, no ``_scan``), the workers import the traceview the caller runs, not that one:
    before, the fork server's preload took the folder's (``No module named
    'traceview.parsers.kineto._scan'`` on every file of a run of more than 32 files). With
    ``-E`` the server cannot be given the caller's path: traceview is not preloaded."""
    decoy = tmp_path / "checkout" / "traceview"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    root = str(Path(traceview.__file__).resolve().parents[1])
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "import traceview\n"
            "from traceview.store.executors import local_pool\n"
            "pool = local_pool(1)\n"
            "job = pool.submit(eval, \"__import__('traceview').__file__\")\n"
            "print(traceview.__file__, job.result(timeout=120), sep='\\n')\n"
            "pool.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run([sys.executable, *flags, "-c", code], cwd=decoy.parent, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    caller, worker = done.stdout.split()
    assert worker == caller and Path(caller).resolve().parents[1] == Path(root)
