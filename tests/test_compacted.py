"""Many small events files read as one compacted file (traceview.store.compacted): the same
rows in the same order as the files themselves, kept and checked like other derived files."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from traceview import schema
from traceview.store import parquet as store
from traceview.store.compacted import compacted_events
from traceview.store.parts import Part, scan_parts


def _parts(cache: Path, files: int) -> list[Part]:
    """``files`` cache entries of three events each; the file of rank r stores rank 0 and
    file_id 0 (as the ingest leaves them) and is read as rank ``files - 1 - r``."""
    parts = []
    for f in range(files):
        events = schema.events_frame([
            {"kind": "kernel", "name": f"k{f}-{i}", "ts_ns": 1000 * f + 10 * i, "dur_ns": 5,
             "stream": 7, "args_json": '{"x": %d}' % i} for i in range(3)])
        path = cache / f"entry{f}" / "events.parquet"
        store.write_events(events.to_arrow(), path, omit_null_columns=True)
        parts.append(Part(str(path), file_id=f, rank=files - 1 - f))
    return parts


def test_the_compacted_file_holds_the_files_rows_in_their_order(tmp_path):
    parts = _parts(tmp_path, 5)
    frame, notes = compacted_events(parts, tmp_path, many=4)
    assert frame is not None and notes == []
    assert_frame_equal(frame.collect(), scan_parts(parts).collect())
    got = frame.select("rank", "file_id", "name").collect()
    assert got["rank"].to_list()[:4] == [4, 4, 4, 3] and got["file_id"].to_list()[-1] == 4
    assert got["name"].to_list()[:2] == ["k0-0", "k0-1"]
    kept = list((tmp_path / "derived").glob("events-*.parquet"))
    assert len(kept) == 1


def test_compacted_in_groups_of_files_the_rows_stay_in_order(tmp_path):
    parts = _parts(tmp_path, 7)
    frame, _ = compacted_events(parts, tmp_path, many=4, per_file=3)
    assert len(list((tmp_path / "derived").glob("events-*.parquet"))) == 3  # 3 + 3 + 1
    assert_frame_equal(frame.collect(), scan_parts(parts).collect())


def test_it_is_written_once_and_read_again(tmp_path):
    parts = _parts(tmp_path, 4)
    compacted_events(parts, tmp_path, many=4)
    [kept] = (tmp_path / "derived").glob("events-*.parquet")
    written = kept.stat().st_mtime_ns
    frame, notes = compacted_events(parts, tmp_path, many=4)
    assert notes == [] and kept.stat().st_mtime_ns == written
    assert frame.select(pl.len()).collect().item() == 12


def test_another_set_of_files_gets_its_own(tmp_path):
    parts = _parts(tmp_path, 5)
    compacted_events(parts, tmp_path, many=4)
    frame, _ = compacted_events(parts[:4], tmp_path, many=4)
    assert frame.select(pl.len()).collect().item() == 12
    assert len(list((tmp_path / "derived").glob("events-*.parquet"))) == 2


def test_a_damaged_compacted_file_is_written_again_with_a_note(tmp_path):
    parts = _parts(tmp_path, 4)
    compacted_events(parts, tmp_path, many=4)
    [kept] = (tmp_path / "derived").glob("events-*.parquet")
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    frame, notes = compacted_events(parts, tmp_path, many=4)
    assert len(notes) == 1 and str(kept) in notes[0] and "content changed" in notes[0]
    assert_frame_equal(frame.collect(), scan_parts(parts).collect())


def test_few_files_or_files_outside_the_cache_are_read_as_they_are(tmp_path):
    parts = _parts(tmp_path / "elsewhere", 4)
    assert compacted_events(parts, tmp_path / "cache", many=4) == (None, [])
    assert compacted_events(parts, tmp_path / "elsewhere", many=5) == (None, [])
    assert compacted_events(parts, None, many=4) == (None, [])
    assert compacted_events([*parts[:3], parts[0]], tmp_path / "elsewhere", many=4) == (
        None, [])  # one file twice: not plain
