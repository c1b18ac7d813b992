"""GPU stream waits: where a stream or the host waited for work queued on another stream.

A replay of a GPU run needs these edges: NCCL's stream waits for the compute stream before a
collective and the compute stream waits for NCCL's after it, through ``cudaEventRecord`` on
one stream and ``cudaStreamWaitEvent`` on the other; a host thread waits on an event with
``cudaEventSynchronize``. Without them the streams replay as independent queues.

Kineto writes them when the profiler runs with CUDA sync events
(``_ExperimentalConfig(enable_cuda_sync_events=True)``, which ``traceview.capture`` sets), as
``cuda_sync`` activities (kind ``sync``), one per synchronisation, named as CUPTI's sync types:

==================== ========== ===================================================================
name                 waiter     what is waited for (args)
==================== ========== ===================================================================
``Stream Wait Event`` the stream ``stream`` waits for the event recorded on ``wait_on_stream`` by the
                     ``stream`` ``cudaEventRecord`` whose correlation is
                                ``wait_on_cuda_event_record_corr_id`` (cudaStreamWaitEvent)
``Event Sync``       the host   the same, for ``cudaEventSynchronize`` (``stream`` is -1)
``Stream Sync``      the host   all the work queued on ``stream`` (cudaStreamSynchronize)
``Context Sync``     the host   all the work of the device (cudaDeviceSynchronize)
==================== ========== ===================================================================

``correlation`` is the synchronising runtime call's (it finds the call, hence the host thread);
-1 in ``wait_on_stream`` or the record's correlation means unknown (the event was recorded
before the profiler started). The parser keeps these args in ``args_json`` (no columns: sync
rows are few, and no other reader needs them); nsys's SYNCHRONIZATION table has no such
fields, so an nsys trace gives the waits' streams but never the record.

:func:`stream_waits` is the table of waits; :func:`stream_wait_coverage` counts, per rank with
GPU work, the runtime calls that make a cross-stream wait against the edges the trace carries,
and :func:`stream_wait_notes` turns a shortfall into the note a replay gives as a cause of its
error. Definitions: docs/metrics.md, section "GPU stream waits".

>>> import polars as pl
>>> events = pl.DataFrame({"rank": [0, 0], "kind": ["sync", "cuda_runtime"],
...     "name": ["Stream Wait Event", "cudaStreamWaitEvent"], "tid": [24, 7], "stream": [None, None],
...     "device": [0, None], "ts_ns": [1000, 990], "dur_ns": [2, 5], "correlation": [9, 9],
...     "args_json": ['{"stream": 24, "wait_on_stream": 20, '
...                   '"wait_on_cuda_event_record_corr_id": 5, "correlation": 9}', "{}"]})
>>> stream_waits(events).select("rank", "sync", "waiter", "stream", "wait_on_stream",
...                             "record_correlation", "call_tid").rows()
[(0, 'stream_wait_event', 'stream', 24, 20, 5, 7)]
"""

from __future__ import annotations

import polars as pl

from traceview.schema import GPU_KINDS

Frame = pl.LazyFrame | pl.DataFrame

WAIT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "sync": pl.String, "waiter": pl.String, "device": pl.Int32,
    "stream": pl.Int64, "wait_on_stream": pl.Int64, "record_correlation": pl.Int64,
    "correlation": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "call_tid": pl.Int64,
    "call_ts_ns": pl.Int64, "record_ts_ns": pl.Int64,
}
COVERAGE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "gpu_rows": pl.UInt32, "streams": pl.UInt32, "wait_calls": pl.UInt32,
    "sync_rows": pl.UInt32, "edges": pl.UInt32,
}
NOTE_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int32, "cause": pl.String, "note": pl.String}

#: Kineto's (and nsys's, ``parsers/nsys/_tables.SYNC_NAME``) sync names -> ``sync``.
SYNC_KINDS = {"Stream Wait Event": "stream_wait_event", "Event Sync": "event_sync",
              "Stream Sync": "stream_sync", "Context Sync": "context_sync"}
#: The syncs that wait for one event, hence carry the stream and record they wait on.
EVENT_WAITS = ("stream_wait_event", "event_sync")
#: Runtime calls that make such a wait (CUDA runtime and driver, HIP).
WAIT_CALLS = ("cudaStreamWaitEvent", "cudaEventSynchronize", "cuStreamWaitEvent",
              "cuEventSynchronize", "hipStreamWaitEvent", "hipEventSynchronize")
RECORD_CALLS = ("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                "cuEventRecordWithFlags", "hipEventRecord", "hipEventRecordWithFlags")

NO_SYNC_EVENTS = "no_cuda_sync_events"
UNRESOLVED = "unresolved_waits"


def _arg(name: str) -> pl.Expr:
    """An integer arg of the row's ``args_json``; -1 (Kineto's unknown) and absent are null."""
    value = pl.col("args_json").cast(pl.String).str.json_path_match(f"$.{name}").cast(
        pl.Int64, strict=False)
    return pl.when(value >= 0).then(value)


def stream_waits(events: Frame) -> pl.DataFrame:
    """One row per synchronisation in ``events`` (``WAIT_SCHEMA``), in time order per rank.

    ``waiter`` is ``stream`` (a ``Stream Wait Event``: ``stream`` may start nothing queued after
    the wait before the event is reached) or ``host`` (the calling thread ``call_tid`` is
    held). ``wait_on_stream``: the stream waited on (a Stream Sync's own stream; null on a
    Context Sync: every stream of ``device``, and where unknown). ``record_correlation`` and
    ``record_ts_ns``: the ``cudaEventRecord`` call whose event is waited for (the work queued
    on ``wait_on_stream`` before that call is what is waited for). ``call_tid``/``call_ts_ns``:
    the synchronising runtime call, found by (rank, correlation); null when not in the trace."""
    lf = events.lazy()
    names = lf.collect_schema().names()
    name = pl.col("name").cast(pl.String)
    syncs = lf.filter((pl.col("kind").cast(pl.String) == "sync") & name.is_in(list(SYNC_KINDS)))
    has_args = "args_json" in names
    stream_col = pl.col("stream").cast(pl.Int64) if "stream" in names else pl.lit(None, pl.Int64)
    own_stream = pl.coalesce(_arg("stream"), stream_col) if has_args else stream_col
    own_stream = pl.when(own_stream >= 0).then(own_stream)
    sync = name.replace_strict(SYNC_KINDS, return_dtype=pl.String)
    device = pl.col("device").cast(pl.Int64) if "device" in names else pl.lit(None, pl.Int64)
    waits = syncs.select(
        pl.col("rank").cast(pl.Int32), sync=sync,
        device=pl.coalesce(device, _arg("device")) if has_args else device,
        _own=own_stream,
        _on=_arg("wait_on_stream") if has_args else pl.lit(None, pl.Int64),
        record_correlation=_arg("wait_on_cuda_event_record_corr_id") if has_args
        else pl.lit(None, pl.Int64),
        correlation=pl.col("correlation").cast(pl.Int64), ts_ns="ts_ns", dur_ns="dur_ns",
    ).with_columns(
        waiter=pl.when(pl.col("sync") == "stream_wait_event").then(pl.lit("stream"))
        .otherwise(pl.lit("host")),
        stream=pl.when(pl.col("sync") == "stream_wait_event").then("_own"),
        wait_on_stream=pl.when(pl.col("sync") == "stream_sync").then("_own")
        .when(pl.col("sync").is_in(EVENT_WAITS)).then("_on"),
    ).collect()
    if waits.height == 0:
        return pl.DataFrame(schema=WAIT_SCHEMA)
    runtime = lf.filter(pl.col("kind").cast(pl.String).is_in(["cuda_runtime", "cuda_driver"])
                        & pl.col("correlation").is_not_null())
    calls = runtime.filter(name.is_in(list(WAIT_CALLS) + ["cudaStreamSynchronize",
                                                          "cudaDeviceSynchronize",
                                                          "hipStreamSynchronize",
                                                          "hipDeviceSynchronize"])).select(
        pl.col("rank").cast(pl.Int32), correlation=pl.col("correlation").cast(pl.Int64),
        call_tid=pl.col("tid").cast(pl.Int64), call_ts_ns="ts_ns").collect()
    records = runtime.filter(name.is_in(list(RECORD_CALLS))).select(
        pl.col("rank").cast(pl.Int32), record_correlation=pl.col("correlation").cast(pl.Int64),
        record_ts_ns="ts_ns").collect()
    return (waits.join(calls.unique(["rank", "correlation"], keep="first"),
                       on=["rank", "correlation"], how="left")
            .join(records.unique(["rank", "record_correlation"], keep="first"),
                  on=["rank", "record_correlation"], how="left")
            .select(list(WAIT_SCHEMA)).cast(WAIT_SCHEMA).sort("rank", "ts_ns"))


def stream_wait_coverage(events: Frame) -> pl.DataFrame:
    """Per rank with GPU work (``COVERAGE_SCHEMA``): its GPU rows and streams, the runtime calls
    that make a cross-stream wait (``WAIT_CALLS``), its sync rows, and the ``edges``: event waits
    whose stream waited on is known."""
    lf = events.lazy()
    kind, name = pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String)
    gpu = lf.filter(kind.is_in(list(GPU_KINDS))).group_by("rank").agg(
        gpu_rows=pl.len(), streams=pl.col("stream").n_unique())
    counts = lf.group_by("rank").agg(
        wait_calls=(kind.is_in(["cuda_runtime", "cuda_driver"]) & name.is_in(list(WAIT_CALLS)))
        .sum(),
        sync_rows=(kind == "sync").sum())
    waits = stream_waits(lf)
    edges = waits.lazy().filter(pl.col("sync").is_in(EVENT_WAITS)
                                & pl.col("wait_on_stream").is_not_null()).group_by("rank").agg(
        edges=pl.len())
    out = (gpu.with_columns(pl.col("rank").cast(pl.Int32))
           .join(counts.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
           .join(edges, on="rank", how="left").collect())
    return out.select(list(COVERAGE_SCHEMA)).cast(COVERAGE_SCHEMA).fill_null(0).sort("rank")


def stream_wait_notes(coverage: pl.DataFrame) -> pl.DataFrame:
    """Per rank whose GPU waits a replay cannot see (``NOTE_SCHEMA``): ``cause``
    ``no_cuda_sync_events`` (GPU work and not one sync row: the profiler ran without CUDA sync
    events) or ``unresolved_waits`` (fewer edges than wait calls: events recorded before the
    profiler started, or a Kineto that does not write the stream waited on)."""
    ranks = coverage.lazy().filter(pl.col("gpu_rows") > 0)
    missing = ranks.filter(pl.col("sync_rows") == 0).select(
        "rank", cause=pl.lit(NO_SYNC_EVENTS),
        note=pl.format("GPU trace without CUDA sync events ({} stream/event wait calls in the "
                       "trace): a replay cannot see where a stream or the host waited for "
                       "another stream, and runs the {} streams as independent queues, a cause "
                       "of replay error; record with traceview.capture, or torch.profiler's "
                       "experimental_config=torch._C._profiler._ExperimentalConfig("
                       "enable_cuda_sync_events=True)", "wait_calls", "streams"))
    short = ranks.filter((pl.col("sync_rows") > 0) & (pl.col("edges") < pl.col("wait_calls")))
    short = short.select(
        "rank", cause=pl.lit(UNRESOLVED),
        note=pl.format("{} of {} stream/event wait calls have no sync event saying which stream "
                       "they waited on (the event was recorded before the profiler started, or "
                       "the profiler did not write it): a replay does not see those waits, a "
                       "cause of replay error",
                       pl.col("wait_calls") - pl.col("edges"), "wait_calls"))
    return pl.concat([missing, short]).collect().cast(NOTE_SCHEMA).sort("rank")
