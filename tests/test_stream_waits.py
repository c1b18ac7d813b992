"""GPU stream waits (``analyses/stream_waits.py``): a hand-drawn trace whose answer is derived
by hand in the comments, then real Kineto traces of the corpus, with and without CUDA sync
events."""

from __future__ import annotations

import json

import polars as pl
import pytest

import traceview
from traceview.analyses.stream_waits import (
    NO_SYNC_EVENTS,
    UNRESOLVED,
    WAIT_SCHEMA,
    stream_wait_coverage,
    stream_wait_notes,
    stream_waits,
)

HTA = "hta-tests-data/tests/data"


def _row(rank: int, kind: str, name: str, ts: int, corr: int | None, *, tid: int = 100,
         dur: int = 5, stream: int | None = None, args: dict | None = None) -> dict:
    return {"rank": rank, "kind": kind, "name": name, "tid": tid, "stream": stream,
            "device": None, "ts_ns": ts, "dur_ns": dur, "correlation": corr,
            "args_json": json.dumps(args or {})}


def _hand_drawn() -> pl.DataFrame:
    """Rank 0 records an event on stream 7 (correlation 10) and makes stream 20 wait for it;
    a second thread waits on an event recorded before the profiler started (Kineto writes -1);
    then a stream sync of stream 7 and a device sync. Rank 1 has GPU work and two
    cudaStreamWaitEvent calls but was profiled without CUDA sync events. Rank 2 is CPU only."""
    rt, sync = "cuda_runtime", "sync"
    return pl.DataFrame([
        _row(0, "kernel", "gemm", 900, 9, tid=7, stream=7),
        _row(0, "kernel", "allreduce", 1110, 15, tid=20, stream=20),
        _row(0, rt, "cudaEventRecord", 1000, 10),
        _row(0, rt, "cudaStreamWaitEvent", 1100, 11),
        _row(0, sync, "Stream Wait Event", 1105, 11, tid=20, dur=2,
             args={"stream": 20, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 10,
                   "device": 0, "correlation": 11}),
        _row(0, rt, "cudaEventSynchronize", 1200, 12, tid=101, dur=50),
        _row(0, sync, "Event Sync", 1201, 12, tid=-1, dur=48,
             args={"stream": -1, "wait_on_stream": -1, "wait_on_cuda_event_record_corr_id": -1,
                   "device": 0}),
        _row(0, rt, "cudaStreamSynchronize", 1300, 13),
        _row(0, sync, "Stream Sync", 1301, 13, tid=7, args={"stream": 7, "device": 0}),
        _row(0, rt, "cudaDeviceSynchronize", 1400, 14),
        _row(0, sync, "Context Sync", 1401, 14, tid=-1, args={"stream": -1, "device": 0}),
        _row(1, "kernel", "gemm", 900, 3, tid=7, stream=7),
        _row(1, rt, "cudaStreamWaitEvent", 1000, 4),
        _row(1, rt, "cudaStreamWaitEvent", 1050, 5),
        _row(2, "cpu_op", "aten::mm", 900, None),
    ])


def test_hand_drawn_waits() -> None:
    waits = stream_waits(_hand_drawn())
    assert waits.schema == pl.Schema(WAIT_SCHEMA)
    cols = ["rank", "sync", "waiter", "device", "stream", "wait_on_stream", "record_correlation",
            "correlation", "call_tid", "call_ts_ns", "record_ts_ns"]
    assert waits.select(cols).rows() == [
        # stream 20 waits for what stream 7 had queued when cudaEventRecord (corr 10) ran
        (0, "stream_wait_event", "stream", 0, 20, 7, 10, 11, 100, 1100, 1000),
        # the host thread 101 waits on an event recorded before the profiler: unknown (-1)
        (0, "event_sync", "host", 0, None, None, None, 12, 101, 1200, None),
        # the host waits for everything queued on stream 7
        (0, "stream_sync", "host", 0, None, 7, None, 13, 100, 1300, None),
        # the host waits for every stream of device 0
        (0, "context_sync", "host", 0, None, None, None, 14, 100, 1400, None),
    ]


def test_hand_drawn_coverage_and_notes() -> None:
    coverage = stream_wait_coverage(_hand_drawn())
    # rank 0: 2 GPU rows on 2 streams; 2 wait calls (cudaStreamWaitEvent, cudaEventSynchronize),
    # 4 sync rows, 1 edge (the event sync's stream is unknown); rank 1: no sync row at all;
    # rank 2 has no GPU work: no row
    assert coverage.rows() == [(0, 2, 2, 2, 4, 1), (1, 1, 1, 2, 0, 0)]
    notes = stream_wait_notes(coverage)
    assert notes.select("rank", "cause").rows() == [(0, UNRESOLVED), (1, NO_SYNC_EVENTS)]
    assert notes["note"][0].startswith("1 of 2 stream/event wait calls have no sync event")
    assert notes["note"][1].startswith("GPU trace without CUDA sync events (2 stream/event wait")
    assert "enable_cuda_sync_events=True" in notes["note"][1]


def test_nothing_to_say_without_gpu_work_or_sync_rows() -> None:
    cpu = _hand_drawn().filter(pl.col("rank") == 2)
    assert stream_waits(cpu).height == 0 and stream_wait_coverage(cpu).height == 0
    assert stream_wait_notes(stream_wait_coverage(cpu)).height == 0
    no_args = _hand_drawn().drop("args_json")  # a store without args: syncs, no edges
    waits = stream_waits(no_args)
    assert waits["sync"].to_list() == ["stream_wait_event", "event_sync", "stream_sync",
                                       "context_sync"]
    assert waits["wait_on_stream"].null_count() == 4


def test_corpus_multi_stream_event_sync(corpus) -> None:
    path = corpus / HTA / "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"
    if not path.exists():
        pytest.skip(f"absent: {path}")
    events = traceview.open(path, cache=False).events
    waits = stream_waits(events)
    assert waits.select("sync", "waiter", "stream", "wait_on_stream", "record_correlation",
                        "correlation").rows() == [
        ("event_sync", "host", None, None, None, 24),  # recorded before the profiler started
        ("event_sync", "host", None, 20, 32, 54),
        ("stream_wait_event", "stream", 24, 20, 1385, 1389),
        ("event_sync", "host", None, 28, 62, 1410),
        ("context_sync", "host", None, None, None, 1424),
    ]
    wait = waits.row(2, named=True)  # cudaStreamWaitEvent at 367682 us, its record at 367666
    assert (wait["call_tid"], wait["call_ts_ns"], wait["record_ts_ns"], wait["device"]) == (
        3727853, 1712867402367682000, 1712867402367666000, 0)
    assert stream_wait_notes(stream_wait_coverage(events)).height == 0


def test_corpus_gpu_traces_without_the_edges(corpus) -> None:
    nccl = corpus / HTA / "nccl_parser_config/nccl_data.json.gz"
    older = corpus / HTA / "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz"
    if not (nccl.exists() and older.exists()):
        pytest.skip(f"absent: {nccl} or {older}")
    # an NCCL run profiled without CUDA sync events: its cudaStreamWaitEvent calls have no edge
    notes = stream_wait_notes(stream_wait_coverage(traceview.open(nccl, cache=False).events))
    assert notes.select("rank", "cause").rows() == [(0, NO_SYNC_EVENTS)]
    assert "(108 stream/event wait calls in the trace)" in notes["note"][0]
    # a 2023 Kineto: 20 Stream Wait Events (with their stream, without the record) for 34
    # cudaStreamWaitEvent calls
    events = traceview.open(older, cache=False).events
    waits = stream_waits(events).filter(pl.col("sync") == "stream_wait_event")
    assert waits.height == 20 and waits["wait_on_stream"].null_count() == 0
    assert waits["record_correlation"].null_count() == 20
    notes = stream_wait_notes(stream_wait_coverage(events))
    assert notes.select("rank", "cause").rows() == [(0, UNRESOLVED)]
    assert notes["note"][0].startswith("14 of 34 ")
