"""``ingest -o`` / ``TraceSet.write_store``: the events files go into the store as they are
(linked or copied, never decoded again), the manifest says which rank and file each holds,
and a store answers exactly as the traces it came from."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest

import traceview
from traceview.store import parquet as store
from traceview.store import traceset
from traceview.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"
GLOO = FIX / "gloo_ddp_2r"


def _events(ts: traceset.TraceSet) -> pl.DataFrame:
    ev = ts.events.collect().with_columns(pl.col(pl.Categorical).cast(pl.String))
    return ev.sort(ev.columns, nulls_last=True)


def test_store_files_are_the_cache_files_linked(tmp_path: Path) -> None:
    ts = traceset.open(GLOO, cache_dir=tmp_path / "cache")
    out = ts.write_store(tmp_path / "store")
    manifest = orjson.loads((out / store.STORE_MANIFEST).read_bytes())
    assert [(e["file"], e["rank"], e["file_id"]) for e in manifest["parts"]] == [
        ("rank-00000.parquet", 0, 0), ("rank-00001.parquet", 1, 1)]
    for part, entry in zip(ts._parts, manifest["parts"]):
        # one filesystem: a hard link to the cache entry, no second copy of the bytes
        assert os.path.samefile(part.path, out / entry["file"])
    again = traceset.open(out)
    assert _events(again).equals(_events(ts))
    assert again.ranks.equals(ts.ranks) and again.files.equals(ts.files)


def test_a_store_file_holds_no_placeholder_rank(tmp_path: Path) -> None:
    # A Kineto file's parser writes rank 0 and file_id 0 as placeholders; the trace set
    # assigns the real ones. A store file read by another tool must not show rank 0 for
    # rank 1: the columns are left out, and the manifest (and the file name) say the rank.
    out = traceset.open(GLOO, cache_dir=tmp_path / "cache").write_store(tmp_path / "store")
    names = pq.read_schema(out / "rank-00001.parquet").names
    assert "rank" not in names and "file_id" not in names and "ts_ns" in names
    ev = traceset.open(out).events.filter(pl.col("rank") == 1).collect()
    assert ev.height == 1039 and ev["file_id"].unique().to_list() == [1]


def test_store_copied_across_filesystems_and_read_by_url(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    ts = traceset.open(GLOO, cache_dir=tmp_path / "cache")
    monkeypatch.setattr(os, "link", no_links)  # as when the store is on another disk
    out = ts.write_store(tmp_path / "store")
    monkeypatch.undo()
    part = ts._parts[0]
    assert not os.path.samefile(part.path, out / "rank-00000.parquet")
    assert (out / "rank-00000.parquet").read_bytes() == Path(part.path).read_bytes()
    assert not list(out.glob(".*.tmp"))
    by_url = traceview.open(f"file://{out}")
    assert _events(by_url.traceset).equals(_events(ts))


def test_store_written_without_cache_outlives_its_temporary_files(tmp_path: Path,
                                                                  capsys) -> None:
    out = tmp_path / "store"
    assert main(["ingest", str(GLOO), "--no-cache", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["stragglers", str(out), "--json"]) == 0
    from_store = orjson.loads(capsys.readouterr().out)
    assert main(["stragglers", str(GLOO), "--no-cache", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["ranks"] == from_store["ranks"]


def test_windows_of_one_rank_keep_their_files(tmp_path: Path) -> None:
    # a real 2-rank run with 3 profiling windows per rank: 6 files, each its own store file,
    # named by its place in the set; one window of the store reads only its files
    ts = traceset.open(FIX / "gloo_windows_2r", cache_dir=tmp_path / "cache")
    out = ts.write_store(tmp_path / "store")
    parts = orjson.loads((out / store.STORE_MANIFEST).read_bytes())["parts"]
    assert [e["file"] for e in parts] == [f"file-{i:05d}.parquet" for i in range(6)]
    assert sorted((e["rank"], e["file_id"]) for e in parts) == sorted(
        ts.windows.select("rank", "file_id").rows())
    assert _events(traceset.open(out)).equals(_events(ts))
    one = traceset.open(out, window=1)
    assert one.window_spans()["first_step"].to_list() == [4, 4]
    assert len(one._parts) == 2
