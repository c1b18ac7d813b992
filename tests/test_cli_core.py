"""CLI ingest/info/sql: the --json contract, exit codes, bad input, the cache and stores."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import FIXTURES
from tests.helpers import write_trace
from traceview.cli import main

GLOO = FIXTURES / "data" / "gloo_ddp_2r"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _trace(tmp_path, name, rank=None, n=3, kernels=0, world=2):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i,
               "dur": 0.5} for i in range(n)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10 + i,
                "dur": 0.5, "args": {"device": 0, "stream": 7}} for i in range(kernels)]
    top = {"distributedInfo": {"rank": rank, "world_size": world}} if rank is not None else {}
    return write_trace(tmp_path / name, events, **top)


def test_info_json_contract(capsys, tmp_path):
    _trace(tmp_path, "a.json", rank=0, n=3, kernels=2)
    _trace(tmp_path, "b.json", rank=1, n=4)
    code, out, _ = _run(capsys, "info", str(tmp_path), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["input_events"] == 9 and report["stored_events"] == 9
    assert report["dropped"] == {} and report["kinds"] == {"cpu_op": 7, "kernel": 2}
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    first = report["ranks"][0]
    assert first["file"].endswith("a.json")
    assert first["kinds"] == {"cpu_op": 3, "kernel": 2}
    for r in report["ranks"]:
        assert r["input_events"] == r["stored_events"] + sum(r["dropped"].values())


def test_info_counts_dropped_events(capsys, tmp_path):
    write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 1}])
    code, out, _ = _run(capsys, "info", str(tmp_path / "t.json"), "--json")
    report = json.loads(out)
    assert code == 0
    assert (report["input_events"], report["stored_events"], report["dropped"]) == (
        2, 1, {"missing_ts": 1})


@pytest.mark.parametrize("content,problem", [
    (b"", "empty file"), (b"\x1f\x8bxx", "corrupt gzip"), (b'{"a": 1}', "no traceEvents"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1', None)])
def test_bad_input_exit_codes(capsys, tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    code, out, err = _run(capsys, "info", str(path), "--json")
    if problem is None:  # truncated: recovered with a warning, not an error
        assert code == 0 and json.loads(out)["dropped"] == {"truncated": 1}
        return
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(path) in err and problem in err
    assert "Traceback" not in err


def test_missing_path_and_empty_directory(capsys, tmp_path):
    code, _, err = _run(capsys, "info", str(tmp_path / "nope.json"))
    assert code == 2 and "no such file" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "info", str(tmp_path / "empty"))
    assert code == 2 and "no trace files" in err


def test_dangling_link_is_unreadable(capsys, tmp_path):
    (tmp_path / "rank-0.json").symlink_to(tmp_path / "gone.json")
    code, _, err = _run(capsys, "info", str(tmp_path / "rank-0.json"))
    assert code == 2 and "rank-0.json" in err and err.count("\n") == 1


def test_parallel_ingest_in_worker_processes(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    from traceview.store.ingest import ingest

    for r in range(3):
        _trace(tmp_path, f"rank-{r}.json", rank=r, n=r + 1)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = ingest([tmp_path], cache_dir=tmp_path / "c", executor=pool)
    assert [f.stored_events for f in result.files] == [1, 2, 3]
    assert sorted(result.rank_of.values()) == [0, 1, 2]


def test_skip_bad_keeps_the_other_ranks(capsys, tmp_path):
    _trace(tmp_path, "rank-0.json", rank=0)
    (tmp_path / "rank-1.json").write_bytes(b"\x1f\x8bbroken")
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and "rank-1.json" in err
    code, out, _ = _run(capsys, "info", str(tmp_path), "--skip-bad", "--json")
    report = json.loads(out)
    assert code == 0 and [r["rank"] for r in report["ranks"]] == [0]
    assert report["skipped"][0]["file"].endswith("rank-1.json")


def test_two_files_claiming_one_rank_is_an_error(capsys, tmp_path):
    _trace(tmp_path, "a.json", rank=1)
    _trace(tmp_path, "b.json", rank=1)
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and "a.json" in err and "b.json" in err and "rank 1" in err


def test_unknown_ranks_need_a_mapping(capsys, tmp_path):
    _trace(tmp_path, "x.json")
    _trace(tmp_path, "y.json")
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and "--rank-map" in err  # never silently call both rank 0
    code, out, _ = _run(capsys, "info", str(tmp_path), "--rank-map", "x.json=4",
                        "--rank-map", "y.json=5", "--json")
    assert code == 0
    assert [(r["rank"], r["rank_from"]) for r in json.loads(out)["ranks"]] == [
        (4, "mapping"), (5, "mapping")]


def test_single_file_without_rank_is_rank_zero_without_a_warning(capsys, tmp_path):
    """One file is one rank: rank 0, said by ``rank_from``, not by a multi-file warning
    (issue 48, item 10)."""
    _trace(tmp_path, "x.json")
    code, out, err = _run(capsys, "info", str(tmp_path / "x.json"), "--json")
    report = json.loads(out)
    assert (report["ranks"][0]["rank"], report["ranks"][0]["rank_from"]) == (0, "default")
    assert not any("assuming rank 0" in w for w in report["warnings"])
    assert "assuming rank 0" not in err


def test_sql(capsys, tmp_path):
    _trace(tmp_path, "a.json", rank=0, n=3, kernels=2)
    code, out, _ = _run(capsys, "sql", str(tmp_path),
                        "select kind, count(*) as n from events group by kind order by kind",
                        "--json")
    assert code == 0
    assert json.loads(out) == [{"kind": "cpu_op", "n": 3}, {"kind": "kernel", "n": 2}]
    code, _, err = _run(capsys, "sql", str(tmp_path), "select nonsense from nowhere")
    assert code == 2 and "SQL error" in err


def test_ingest_store_is_an_input(capsys, tmp_path):
    store = tmp_path / "store"
    code, _, _ = _run(capsys, "ingest", str(GLOO), "-o", str(store))
    assert code == 0
    assert sorted(p.name for p in store.glob("rank-*.parquet")) == [
        "rank-00000.parquet", "rank-00001.parquet"]
    _, direct, _ = _run(capsys, "info", str(GLOO), "--json")
    _, from_store, _ = _run(capsys, "info", str(store), "--json")
    a, b = json.loads(direct), json.loads(from_store)
    assert a["kinds"] == b["kinds"] and a["stored_events"] == b["stored_events"]


def test_cache_is_reused_and_never_stale(tmp_path):
    import traceview

    cache = tmp_path / "cache"
    path = _trace(tmp_path, "rank-0.json", rank=0, n=3)
    first = traceview.open(path, cache_dir=cache)
    assert first.files["stored_events"].item() == 3
    entries = list(cache.iterdir())
    assert len(entries) == 1
    again = traceview.open(path, cache_dir=cache)
    assert again.events.collect().height == 3 and list(cache.iterdir()) == entries
    _trace(tmp_path, "rank-0.json", rank=0, n=5)  # same name, new content
    changed = traceview.open(path, cache_dir=cache)
    assert changed.events.collect().height == 5
    assert len(list(cache.iterdir())) == 2
    assert not list(cache.rglob("*.tmp"))  # atomic writes leave nothing behind


def test_no_cache_writes_nothing(tmp_path, monkeypatch):
    import traceview

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEVIEW_CACHE_DIR", str(cache))
    path = _trace(tmp_path, "rank-0.json", rank=0)
    assert traceview.open(path, cache=False).events.collect().height == 3
    assert not cache.exists()


def test_version_and_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and "traceview" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["info"])
    assert info.value.code == 2


def test_input_files_are_not_modified(tmp_path):
    import hashlib

    import traceview

    copy = tmp_path / "in"
    shutil.copytree(GLOO, copy)
    before = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
              for p in copy.iterdir()}
    traceview.open(copy).events.collect()
    after = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
             for p in copy.iterdir()}
    assert before == after


def test_lazy_events_outlive_an_uncached_traceset(tmp_path):
    import traceview

    path = _trace(tmp_path, "rank-0.json", rank=0, n=4)
    assert traceview.open(path, cache=False).events.collect().height == 4


def test_other_json_in_a_trace_folder_is_passed_over(capsys, tmp_path):
    _trace(tmp_path, "a.json", rank=0, n=2)
    (tmp_path / "manifest.json").write_text('{"files": ["a.json"], "seed": 0}')
    code, out, _ = _run(capsys, "info", str(tmp_path), "--json")
    report = json.loads(out)
    assert code == 0 and report["stored_events"] == 2
    assert report["skipped"][0]["file"].endswith("manifest.json")
    # named explicitly, it is read and rejected
    code, _, err = _run(capsys, "info", str(tmp_path / "manifest.json"))
    assert code == 2 and "no traceEvents" in err


def test_content_id_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """Reopening does not hash a settled input again; rewriting it, even with the same size
    and its old mtime put back, changes its ctime and so is hashed anew (never stale)."""
    import time

    import traceview
    from traceview.store import cache_folder
    from traceview.store import parquet as store

    cache = tmp_path / "cache"
    path = _trace(tmp_path, "rank-0.json", rank=0, n=3)
    old = time.time() - 3600
    os.utime(path, (old, old))
    time.sleep(0.01)
    monkeypatch.setattr(cache_folder, "SETTLED_NS", 0)  # just written; remember it anyway
    hashed = []
    real = store.content_id
    # the input's hashes (the cache's own events files are hashed to check them, too)
    monkeypatch.setattr(store, "content_id",
                        lambda p: (hashed.append(p) if p == path else None) or real(p))
    assert traceview.open(path, cache_dir=cache).events.collect().height == 3
    assert traceview.open(path, cache_dir=cache).events.collect().height == 3
    assert len(hashed) == 1 and (cache / "ids").is_dir()
    text = path.read_text().replace('"name": "op0"', '"name": "opX"')  # same size
    path.write_text(text)
    os.utime(path, (old, old))  # mtime put back; the ctime cannot be
    names = traceview.open(path, cache_dir=cache).events.collect()["name"].cast(str).to_list()
    assert "opX" in names and len(hashed) == 2


def test_ranks_with_events_from_the_footers_equal_the_events(tmp_path):
    from traceview import open as open_traces
    from traceview.analyses.window import ranks_present

    _trace(tmp_path, "a.json", rank=0, n=3, kernels=2, world=3)
    _trace(tmp_path, "b.json", rank=1, n=0, world=3)  # a rank whose trace holds no event
    _trace(tmp_path, "c.json", rank=2, n=1, world=3)
    ts = open_traces(tmp_path, cache_dir=tmp_path / "cache")
    assert ts.ranks["rank"].to_list() == [0, 1, 2]
    assert ts.ranks_with_events() == ranks_present(ts.events)["rank"].to_list() == [0, 2]
