"""Dask executor: same stores and same answers as local processes; retries; failures by file;
the CLI with ``--executor dask --scheduler ADDRESS``.

One in-process ``LocalCluster`` (2 workers, 1 thread each, ``processes=False``) serves the
module through its real scheduler address; the local side is one spawn pool.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

distributed = pytest.importorskip("distributed")

import traceview  # noqa: E402
from traceview.store.executors import (  # noqa: E402
    ExecutorSpec,
    TaskFailure,
    is_dask,
    local_pool,
    open_executor,
    run_tasks,
)
from traceview.store.ingest import ingest  # noqa: E402
from traceview.run.per_rank import analyse  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GLOO = REPO / "fixtures" / "data" / "gloo_ddp_2r"


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0", silence_logs=40) as c:
        yield c


@pytest.fixture(scope="module")
def dask_ex(cluster):
    with distributed.Client(cluster.scheduler_address) as client:
        yield client.get_executor(pure=False)


@pytest.fixture(scope="module")
def local_ex():
    ex = local_pool(2)
    yield ex
    ex.shutdown()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    from fixtures.synthetic import SyntheticSpec, generate

    out = tmp_path_factory.mktemp("syn")
    generate(SyntheticSpec(world_size=4, steps=3, kernels_per_step=6,
                           clock_offsets_ns=(0, 2_500_000, -700_000, 41_000_000)), out)
    return out


def _flaky(marker_dir: str, key: str, fail_times: int) -> str:
    n = len(list(Path(marker_dir).glob(f"{key}.*")))
    (Path(marker_dir) / f"{key}.{n}").touch()
    if n < fail_times:
        raise RuntimeError(f"worker lost {key}")
    return key


def _whole_frame(run) -> dict[str, pl.DataFrame]:
    """The same tables from the whole Run on the driver, wired as the CLI wires them."""
    return {"offsets": run.offsets, "collectives": run.collectives()["instances"],
            "stragglers": run.stragglers()["ranks"], "overlap": run.overlap_rows}


def _tables(res) -> dict[str, pl.DataFrame]:
    return {"offsets": res.offsets, "collectives": res.collectives,
            "stragglers": res.stragglers, "overlap": res.overlap}


def _sorted_events(ts) -> pl.DataFrame:
    return ts.events.collect().sort(pl.all())


@pytest.mark.parametrize("which", ["gloo", "synthetic"])
def test_same_stores_and_answers(which, synthetic, dask_ex, local_ex, tmp_path) -> None:
    path = GLOO if which == "gloo" else synthetic
    assert is_dask(dask_ex) and not is_dask(local_ex)
    by_dask = traceview.open(path, cache_dir=tmp_path / "c1", executor=dask_ex)
    by_local = traceview.open(path, cache_dir=tmp_path / "c2", executor=local_ex)
    ev = _sorted_events(by_dask)
    assert ev.height > 0 and ev.equals(_sorted_events(by_local))
    assert by_dask.ranks.equals(by_local.ranks) and by_dask.files.equals(by_local.files)

    # Stores written by the workers: Dask into memory:// (its workers are threads here, so
    # they share the memory filesystem), local processes into file://.
    by_dask.executor, by_local.executor = dask_ex, local_ex
    mem = f"memory://traceview-dask/{which}"
    url = (tmp_path / "store").as_uri()
    by_dask.write_store(mem)
    by_local.write_store(url)
    s_dask, s_local = traceview.open(mem), traceview.open(url)
    assert _sorted_events(s_dask).equals(ev) and _sorted_events(s_local).equals(ev)

    # Per-rank analyses on each executor (reading each store where it lives) equal each other
    # and the whole-frame analyses on the driver.
    want = _whole_frame(by_local)
    got_dask = _tables(analyse(s_dask, executor=dask_ex))
    got_local = _tables(analyse(s_local, executor=local_ex))
    n_ranks = by_local.ranks.height
    assert want["offsets"].height == n_ranks and want["collectives"].height > 0
    for name, frame in want.items():
        assert got_dask[name].equals(frame), name
        assert got_local[name].equals(frame), name
    if which == "synthetic":
        # The injected clock offsets are recovered (within the reported uncertainty).
        off = dict(want["offsets"].select("rank", "offset_ns").rows())
        assert abs(off[3] - 41_000_000) < 100_000 and abs(off[1] - 2_500_000) < 100_000


def test_dask_retries(dask_ex, tmp_path) -> None:
    d = str(tmp_path)
    out = run_tasks(dask_ex, _flaky, [(d, "a", 1), (d, "b", 9)], retries=2)
    assert out[0] == "a"
    assert isinstance(out[1], TaskFailure) and out[1].attempts == 3
    assert out[1].error == "RuntimeError: worker lost b"


def test_dask_failing_file_reported_by_file(dask_ex, tmp_path, monkeypatch) -> None:
    import errno

    from traceview.store import ingest as ingest_module

    files = sorted(GLOO.glob("*.json.gz"))
    real = ingest_module.parse_batched

    def parse(path, **options):  # rank 0's file: an I/O error on every read (a bad disk)
        if Path(path) == files[0]:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path, **options)

    # the workers are threads of this process (processes=False): they see the patch
    monkeypatch.setattr(ingest_module, "parse_batched", parse)
    res = ingest(files, cache_dir=tmp_path, skip_bad=True, executor=dask_ex)
    assert [Path(f.path).name for f in res.files] == [files[1].name]
    assert res.skipped[0][0] == str(files[0])
    assert "failed 3 attempts" in res.skipped[0][1]
    with pytest.raises(traceview.TraceviewError, match="failed 3 attempts"):
        ingest(files, cache_dir=tmp_path, executor=dask_ex)  # without --skip-bad: an error


def test_dask_cache_entry_that_cannot_be_written_is_answered_from_memory(dask_ex,
                                                                         tmp_path) -> None:
    """A plain file where rank 0's cache entry goes: its Parquet cannot be written there, which
    is the cache's fault, not the trace's: the worker sends the events back in memory, and
    the run says once that the cache was not written."""
    from traceview.parsers import detect_format
    from traceview.store import parquet as store
    from traceview.store.ingest import parser_version
    from traceview.store.parts import Part

    files = sorted(GLOO.glob("*.json.gz"))
    key = store.cache_key(store.content_id(files[0]), parser_version(detect_format(files[0])),
                          {})
    (tmp_path / key).write_text("not a folder")
    res = ingest(files, cache_dir=tmp_path, skip_bad=True, executor=dask_ex)
    assert [Path(f.path).name for f in res.files] == [f.name for f in files] and not res.skipped
    assert res.files[0].events_data is not None and res.files[1].events_data is None
    assert [n for n in res.notes if "cache not written" in n] == [
        f"cache not written: {tmp_path}: File exists; answered from the parse in memory (free "
        "space there, or set --cache-dir / TRACEVIEW_CACHE_DIR elsewhere)"]
    rows = Part("", 0, 0, data=res.files[0].events_data).scan().collect()
    assert rows.height == res.files[0].stored_events


def test_spec_starts_and_closes_local_cluster(tmp_path) -> None:
    spec = ExecutorSpec("dask", max_workers=1, processes=False)
    with open_executor(spec) as ex:
        assert ex.submit(abs, -3).result() == 3
        client = ex._client
        assert client.status == "running"
    assert client.status == "closed"


def test_cli_dask_ingest_store_and_analyses(cluster, tmp_path, capsys) -> None:
    import orjson

    from traceview.cli import main

    addr = cluster.scheduler_address
    url = f"memory://traceview-cli/{tmp_path.name}"
    assert main(["ingest", str(GLOO), "--executor", "dask", "--scheduler", addr, "-o", url,
                 "--json", "--no-cache"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["store"] == url and report["stored_events"] == 2078
    assert main(["analyse", url, "--executor", "dask", "--scheduler", addr, "--json"]) == 0
    ana = orjson.loads(capsys.readouterr().out)
    assert main(["align", url, "--json"]) == 0
    aligned = orjson.loads(capsys.readouterr().out)
    assert [r["offset_ns"] for r in ana["offsets"]] == [r["offset_ns"] for r in aligned["ranks"]]
    assert main(["info", url, "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["stored_events"] == 2078
    assert main(["ingest", str(GLOO), "--scheduler", addr, "--executor", "local"]) == 2
    assert "--scheduler needs --executor dask" in capsys.readouterr().err
