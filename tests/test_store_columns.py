"""Cache files may leave all-null columns out; ``store.scan_events`` gives every column back."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from traceview import schema
from traceview.store import parquet as store


def _events() -> pl.DataFrame:
    return schema.events_frame([
        {"rank": 0, "file_id": 0, "source": "nsys", "kind": "kernel", "name": "k",
         "ts_ns": 10, "dur_ns": 5, "stream": 7},
        {"rank": 0, "file_id": 0, "source": "nsys", "kind": "kernel", "name": "k2",
         "ts_ns": 20, "dur_ns": 1, "args_json": "{}"},
    ])


def test_null_columns_left_out_and_given_back(tmp_path: Path) -> None:
    events = _events()
    full, reduced = tmp_path / "full.parquet", tmp_path / "reduced.parquet"
    store.write_events(events.to_arrow(), full)
    store.write_events(events.to_arrow(), reduced, omit_null_columns=True)
    kept = pq.read_schema(reduced).names
    assert "stream" in kept and "args_json" in kept and "tid" not in kept
    assert store.parquet_schema_version(reduced) == schema.SCHEMA_VERSION
    back = store.scan_events(reduced).collect()
    assert back.schema == store.scan_events(full).collect().schema == schema.polars_schema()
    assert back.equals(store.scan_events(full).collect())
    assert back.equals(events)
    lazy = store.scan_events(reduced).filter(pl.col("tid").is_null()).select("name", "tid")
    assert lazy.collect().height == 2


def test_empty_table_keeps_every_column(tmp_path: Path) -> None:
    target = tmp_path / "empty.parquet"
    store.write_events(schema.empty_events().to_arrow(), target, omit_null_columns=True)
    assert pq.read_schema(target).names == list(schema.EVENT_COLUMN_NAMES)


def test_kineto_cache_files_leave_out_the_columns_a_trace_never_has(tmp_path: Path) -> None:
    """A batched Kineto ingest knows before writing which scanned columns hold no value (no
    labels, memory or FLOP counters here) and leaves them out; derived columns stay."""
    import json

    from traceview.store.ingest import ingest_file

    trace = tmp_path / "rank-0.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1, "dur": 3,
         "args": {"External id": 4}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 9}}]}))
    result = ingest_file(str(trace), str(tmp_path / "cache"), {})
    kept = set(pq.read_schema(result.events_path).names)
    assert {"pid_label", "tid_label", "flops", "mem_bytes", "seq"}.isdisjoint(kept)
    assert {"external_id", "correlation", "device", "stream", "bytes", "step"} <= kept
    back = store.scan_events(result.events_path).collect()
    assert back.schema == schema.polars_schema() and back.height == 2
    assert back.get_column("flops").null_count() == 2
    assert back.get_column("external_id").to_list() == [4, None]
