"""``traceview memory``: device memory per rank and device, from traces and allocator snapshots.

One function, :func:`memory_result`, composes the answer that ``Run.memory`` returns and the
CLI prints: trace rows from the Run's allocator events (``analyses.memory``), snapshot rows from
CUDA caching-allocator pickles (``parsers.torch_snapshot`` read, ``analyses.memory_snapshot``
replayed), and every warning either raises. Either part may be absent: a command line of
snapshots only has no Run.

``--json`` contract: ``{"devices": [{"rank", "device", "peak_allocated_bytes",
"peak_reserved_bytes", "peak_time_ns", "peak_op", "basis", "source", ...}], "steps": [...],
"top_stacks": [...], "ooms": [...], "segments": [...], "snapshots": [...], "warnings":
[...]}``; snapshot rows
add ``allocated_bytes``, ``reserved_bytes`` and ``segments``. Definitions: docs/metrics.md,
sections "Memory timelines" and "Allocator snapshots".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceview.analyses.memory import device_peaks, growth, step_start_levels, with_pressure
from traceview.analyses.memory_snapshot import (
    block_lifetimes,
    oom_events,
    replay,
    segment_table,
    snapshot_peaks,
    snapshot_state,
    top_stacks_at_peak,
)
from traceview.parsers import torch_snapshot
from traceview.run.result import Result

#: The contract's columns, first and in this order; the others follow.
CONTRACT = ("rank", "device", "peak_allocated_bytes", "peak_reserved_bytes", "peak_time_ns",
            "peak_op", "basis")
DEVICE_COLUMNS: dict[str, pl.DataType] = {
    "rank": pl.Int32, "device": pl.String, "peak_allocated_bytes": pl.Int64,
    "peak_reserved_bytes": pl.Int64, "peak_time_ns": pl.Int64, "peak_op": pl.String,
    "basis": pl.String, "source": pl.String, "end_allocated_bytes": pl.Int64,
    "allocated_bytes": pl.Int64, "reserved_bytes": pl.Int64, "segments": pl.Int64,
    "allocated_block_bytes": pl.Int64,
    "fragmentation_bytes": pl.Int64, "largest_free_block_bytes": pl.Int64,
    "start_allocated_bytes": pl.Int64, "first_event_ns": pl.Int64, "events": pl.Int64, "allocated_total_bytes": pl.Int64,
    "allocation_rate_bytes_per_s": pl.Float64, "device_total_bytes": pl.Int64,
    "near_limit": pl.Boolean, "pressure": pl.String, "growth_bytes": pl.Int64,
    "leak_suspected": pl.Boolean, "ooms": pl.Int64, "file": pl.String,
    # the whole stack of the action at the peak (``peak_op`` names its user frame)
    "peak_stack": pl.String}


def memory(run: Any, *, snapshots: Sequence[str | Path] = (), top: int = 10) -> Result:
    """Peak memory per rank and device from the allocator events, growth across steps,
    pressure; with ``snapshots`` (``_dump_snapshot`` pickles) their replayed peaks, top
    stacks and OOMs too. Main table ``devices``: the Run's ``memory`` method
    (``traceview.run.registry``)."""
    return memory_result(run, snapshots, top=top)


def memory_result(run: Any | None, snapshots: Sequence[str | Path] = (), *,
                  top: int = 10) -> Result:
    """The ``memory`` answer for ``run``'s traces (a :class:`~traceview.run.run.Run`, or None)
    and the allocator ``snapshots`` (pickle paths)."""
    warnings: list[str] = []
    parts, steps = [], _empty_steps()
    if run is not None:
        trace_rows, steps, notes = _trace_part(run)
        parts.append(trace_rows)
        warnings += notes
    stacks, ooms, segments, files = _empty_stacks(), _empty_ooms(), _empty_segments(), []
    if snapshots:
        snap_rows, stacks, ooms, segments, files, notes = _snapshot_part(snapshots, top=top)
        parts.append(snap_rows)
        warnings += notes
    devices = pl.concat([_conform(p) for p in parts]) if parts else _conform(pl.DataFrame())
    warnings += _row_warnings(devices)
    base = run.warnings if run is not None else []
    window = {"window": run.window_info} if run is not None else {}
    return Result("memory", {**window, "devices": devices, "steps": steps,
                             "top_stacks": stacks, "ooms": ooms, "segments": segments,
                             "snapshots": files},
                  main="devices", warnings=(*base, *warnings),
                  reading_notes=tuple(run.traceset.notes) if run is not None else ())


# --------------------------------------------------------------------------- traces

def _trace_part(run: Any) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    levels = run.memory_levels
    peaks = device_peaks(levels, run.host, device_memory_table(run.ranks))
    steps = step_start_levels(levels, run.steps)
    grown = growth(steps)
    rows = (peaks.join(grown.select("rank", "device", "growth_bytes", "leak_suspected"),
                       on=["rank", "device"], how="left")
            .with_columns(source=pl.lit("trace"),
                          leak_suspected=pl.col("leak_suspected").fill_null(False)))
    missing = sorted(set(run.ranks_present) - set(rows.get_column("rank").to_list()))
    notes = [f"memory: rank {r}: no allocator events (record with profile_memory=True, or "
             "nsys --cuda-memory-usage=true)" for r in missing]
    return rows, steps, notes


def device_memory_table(ranks: pl.DataFrame) -> pl.DataFrame:
    """``rank, device_index, total_bytes``: each rank's accelerators' memory as its trace
    names it (the ranks table's ``device_memory``, JSON ``{"0": bytes, ...}``)."""
    rows: list[tuple[int, int, int]] = []
    if "device_memory" in ranks.columns:
        for rank, text in ranks.select("rank", "device_memory").rows():
            for index, total in (orjson.loads(text) if text else {}).items():
                if total:
                    rows.append((rank, int(index), int(total)))
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "device_index": pl.Int32,
                                      "total_bytes": pl.Int64}, orient="row")


# --------------------------------------------------------------------------- snapshots

def _snapshot_part(paths: Sequence[str | Path], *, top: int) -> tuple[
        pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, list[dict[str, Any]], list[str]]:
    snaps = [torch_snapshot.read(p) for p in paths]
    notes = [w for s in snaps for w in s.warnings]
    ranks = _snapshot_ranks(snaps, notes)
    rows, stacks, ooms, files, segments = [], [], [], [], []
    for snap, rank in zip(snaps, ranks):
        segs, blocks, trace = (t.with_columns(rank=pl.lit(rank, pl.Int32))
                               for t in (snap.segments, snap.blocks, snap.trace))
        state = snapshot_state(segs, blocks)
        replayed = replay(trace, state)
        peaks = snapshot_peaks(replayed, state)
        rows.append(peaks.with_columns(file=pl.lit(snap.path)))
        stacks.append(top_stacks_at_peak(block_lifetimes(trace, blocks), peaks, top=top))
        ooms.append(oom_events(trace))
        segments.append(segment_table(segs, blocks))
        files.append({"file": snap.path, "rank": rank, "segments": snap.segments.height,
                      "trace_entries": snap.trace.height})
        notes += [f"{snap.path}: rank {r} cuda:{d}: the history does not belong to this "
                  f"snapshot: undoing it from the snapshot gives a start state of {b} B; its "
                  "peak is not to be trusted"
                  for r, d, b in peaks.filter(pl.col("start_allocated_bytes") < 0)
                  .select("rank", "device", "start_allocated_bytes").rows()]
    devices = with_pressure(pl.concat(rows).rename({"trace_entries": "events"}).with_columns(
        device=pl.format("cuda:{}", "device"), basis=pl.lit("absolute"),
        source=pl.lit("snapshot"), end_allocated_bytes=pl.col("allocated_bytes")))
    stack_frame = pl.concat(stacks).with_columns(device=pl.format("cuda:{}", "device"))
    segment_frame = pl.concat(segments).with_columns(device=pl.format("cuda:{}", "device"))
    oom_frame = pl.concat(ooms).with_columns(device=pl.format("cuda:{}", "device"))
    notes += [f"memory: rank {r} {d}: out of memory: {b} bytes requested, {f} bytes free on "
              "the device" for r, d, b, f in oom_frame.select(
                  "rank", "device", "requested_bytes", "device_free_bytes").rows()]
    return devices, stack_frame, oom_frame, segment_frame, files, notes


def _snapshot_ranks(snaps: Sequence[Any], notes: list[str]) -> list[int]:
    """Each snapshot's rank: from its file name; a single snapshot without one is rank 0,
    several are numbered in the order given (with a warning)."""
    named = [s.rank for s in snaps]
    if all(r is not None for r in named):
        return [int(r) for r in named]
    if len(snaps) == 1:
        return [0]
    notes.append("snapshots without a rank in their file name are numbered in the order given")
    return list(range(len(snaps)))


# --------------------------------------------------------------------------- the answer

def _row_warnings(devices: pl.DataFrame) -> list[str]:
    out = [f"memory: rank {r} {d}: near the limit: {p}" for r, d, p in
           devices.filter(pl.col("near_limit")).select("rank", "device", "pressure").rows()]
    out += [f"memory: rank {r} {d}: allocated bytes at the step starts grew by {g} B over the "
            "run, steadily: a leak?" for r, d, g in devices.filter(pl.col("leak_suspected"))
            .select("rank", "device", "growth_bytes").rows()]
    return out


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with every device column, in order (a column it lacks is null)."""
    if df.width == 0:
        return pl.DataFrame(schema=DEVICE_COLUMNS)
    return df.select([(pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c)
                      for c, t in DEVICE_COLUMNS.items()])


def _empty_steps() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.String, "step": pl.Int64,
                                "step_start_ns": pl.Int64, "allocated_bytes": pl.Int64})


def _empty_stacks() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.String, "stack": pl.String,
                                "bytes": pl.Int64, "blocks": pl.Int64, "share": pl.Float64,
                                "frame": pl.String})


def _empty_segments() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "rank": pl.Int32, "device": pl.String, "address": pl.Int64, "total_size": pl.Int64,
        "stream": pl.Int64, "segment_type": pl.String, "blocks": pl.Int32,
        "allocated_bytes": pl.Int64, "free_bytes": pl.Int64,
        "largest_free_block_bytes": pl.Int64})


def _empty_ooms() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.String, "seq": pl.Int64,
                                "requested_bytes": pl.Int64, "device_free_bytes": pl.Int64,
                                "time_ns": pl.Int64, "stack": pl.String, "frame": pl.String})
