"""Small tasks in batches (traceview.store.batched): the plan, per-task retries inside a batch,
a batch whose worker dies, and a folder of many small rank files ingested in batches."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from traceview.store.batched import plan_batches, run_batched
from traceview.store.executors import TaskFailure, local_pool
from traceview.store.ingest import ingest

REPO = Path(__file__).resolve().parents[1]
GLOO = REPO / "fixtures" / "data" / "gloo_ddp_2r"


def flaky(marker_dir: str, key: str, fail_times: int) -> str:
    """Raises on its first ``fail_times`` attempts (counted in files, across processes)."""
    n = len(list(Path(marker_dir).glob(f"{key}.*")))
    (Path(marker_dir) / f"{key}.{n}").touch()
    if n < fail_times:
        raise OSError(f"transient failure {n} of {key}")
    return f"{key} ok after {n + 1}"


def die_once(marker_dir: str, key: str) -> str:
    """Kills its worker process the first time it runs (a segfault or an OOM kill looks so)."""
    marker = Path(marker_dir) / f"died-{key}"
    if not marker.exists():
        marker.touch()
        os._exit(1)
    return key


def test_plan_keeps_order_bounds_and_spreads_over_workers() -> None:
    assert plan_batches([1] * 10, workers=1, budget=100, most=4, per_worker=1) == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # two workers, four batches each at least: 10 tasks -> batches of 2 (ceil(10 / 8))
    assert [len(b) for b in plan_batches([1] * 10, workers=2, budget=100)] == [2, 2, 2, 2, 2]
    # a heavy task goes alone; the budget closes a batch before it is passed
    assert plan_batches([3, 3, 3, 9, 1], workers=1, budget=7, per_worker=1) == [
        [0, 1], [2], [3], [4]]
    assert plan_batches([], workers=2, budget=1) == []
    # a few files: one per batch, as one task per file was
    assert plan_batches([5, 5], workers=2, budget=100) == [[0], [1]]


def test_a_raising_task_is_retried_alone_and_counts_every_attempt(tmp_path: Path) -> None:
    d = str(tmp_path)
    tasks = [(d, "a", 0), (d, "b", 2), (d, "c", 9), (d, "e", 0)]
    pool = local_pool(2)
    try:
        out = run_batched(pool, flaky, tasks, [[0, 1, 2, 3]], retries=2)
        none = run_batched(pool, flaky, [(d, "z", 1)], [[0]], retries=0)
    finally:
        pool.shutdown()
    assert out[0] == "a ok after 1" and out[3] == "e ok after 1"  # ran once: in the batch
    assert out[1] == "b ok after 3"  # failed in the batch, once alone, then passed
    assert isinstance(out[2], TaskFailure) and out[2].attempts == 3 and out[2].args == tasks[2]
    assert out[2].error == "OSError: transient failure 2 of c"
    assert len(list(tmp_path.glob("c.*"))) == 3 and len(list(tmp_path.glob("a.*"))) == 1
    assert isinstance(none[0], TaskFailure) and none[0].attempts == 1


def test_a_batch_whose_worker_dies_is_retried_then_its_tasks_alone(tmp_path: Path) -> None:
    d = str(tmp_path)
    pool, broken = local_pool(1), local_pool(1)
    try:
        # x kills the first attempt, y the second: the third completes the batch
        out = run_batched(pool, die_once, [(d, "x"), (d, "y")], [[0, 1]], retries=2,
                          replace_pool=lambda: local_pool(1))
        # without a new pool the batch fails as a whole, then each task alone
        lost = run_batched(broken, die_once, [(d, "w"), (d, "v")], [[0, 1]], retries=0)
    finally:
        pool.shutdown()
        broken.shutdown()
    assert out == ["x", "y"]
    assert all(isinstance(t, TaskFailure) and "BrokenProcessPool" in t.error for t in lost)


@pytest.mark.parametrize("executor", [None, "local"])
def test_many_small_files_in_batches_match_one_by_one(tmp_path: Path, executor) -> None:
    # 40 copies of a 2-rank run's files: batches of several files per task on 2 workers
    # (plus a file that is no trace: its error names it, and --skip-bad keeps the rest)
    folder = tmp_path / "run"
    folder.mkdir()
    for k in range(20):
        for src in sorted(GLOO.glob("*.json.gz")):
            shutil.copy(src, folder / f"copy{k:02d}-{src.name}")
    (folder / "rank-99.trace.json").write_text("{not json")
    kw = dict(skip_bad=True, rank_map={str(p): i for i, p in enumerate(sorted(folder.iterdir()))})
    batched = ingest([folder], cache_dir=tmp_path / "c1", executor=executor or "local", **kw)
    again = ingest([folder], cache_dir=tmp_path / "c1", **kw)  # every file from the cache
    alone = [ingest([p], cache_dir=tmp_path / "c2", rank_map={str(p): i})
             for i, p in enumerate(sorted(folder.iterdir())) if p.name.startswith("copy")]
    assert len(batched.files) == 40 and [s[0] for s in batched.skipped] == [
        str(folder / "rank-99.trace.json")]
    assert all(f.from_cache for f in again.files)
    for got, want in zip(batched.files, [a.files[0] for a in alone], strict=True):
        assert (got.path, got.content_id, got.stored_events, got.ranks) == (
            want.path, want.content_id, want.stored_events, want.ranks)


class CountingPool:
    """A local process pool that counts its submissions (the executor, not ingest, is
    instrumented)."""

    def __init__(self) -> None:
        self.pool = local_pool(2)
        self.submitted = 0

    def submit(self, fn, *args, **kwargs):
        self.submitted += 1
        return self.pool.submit(fn, *args, **kwargs)


def test_small_files_share_a_submission(tmp_path: Path) -> None:
    # 24 small rank files: one submission per file before; batches of ceil(24 / (cores x 4))
    for k in range(12):
        for src in sorted(GLOO.glob("*.json.gz")):
            shutil.copy(src, tmp_path / f"copy{k:02d}-{src.name}")
    counting = CountingPool()
    try:
        res = ingest([tmp_path], cache_dir=tmp_path / "cache", executor=counting,
                     rank_map={str(p): i for i, p in enumerate(sorted(tmp_path.glob("*.gz")))})
    finally:
        counting.pool.shutdown()
    assert len(res.files) == 24 and not res.skipped
    assert counting.submitted < 24


def test_ranks_with_events_of_an_ingest_read_no_footer(tmp_path: Path, monkeypatch) -> None:
    # the ingest counted every file's rows: 5,000 footers read again cost ~1.5 ms each
    import traceview
    from traceview.store import parquet as store

    ts = traceview.open(GLOO, cache_dir=tmp_path / "cache").traceset
    monkeypatch.setattr(store, "row_count", lambda path: 1 / 0)
    assert ts.ranks_with_events() == [0, 1]
