"""Device memory over time from allocator events: ``profile_memory`` ([memory] in Kineto)
and the CUDA memory-usage table of Nsight Systems.

* :func:`memory_levels`: every allocator event with the bytes allocated (and reserved) after it,
  per rank and device (``cuda:0``, ``cpu``, ``xpu:0``...), and whether those are the
  allocator's own totals (``basis`` ``absolute``: Kineto's ``Total Allocated`` /
  ``Total Reserved``) or a running sum of the events' ``Bytes`` from the trace's start
  (``relative``: older traces, nsys);
* :func:`device_peaks`: per rank and device, the peak, when it happened, the host op active
  then, the allocation rate, and the pressure against the reserved bytes and the device;
* :func:`step_start_levels` and :func:`growth`: the allocated bytes at each step start, and
  steady growth across steps (a leak);
* :func:`memory_by_step`: peak and end-of-step memory per step.

Definitions: docs/metrics.md, sections "GPU memory" and "Memory timelines".
"""

from __future__ import annotations

import polars as pl

from .window import ranks_present

Frame = pl.LazyFrame | pl.DataFrame

#: c10::DeviceType ids as the profiler writes them ("Device Type"), named as torch names
#: devices. A ROCm GPU is ``cuda`` to PyTorch, and so here.
DEVICE_TYPES: dict[int, str] = {
    0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip",
    7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps",
    14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "privateuseone"}
#: The field's rule of thumb for a leak: allocated bytes at the step starts grow by more than
#: this over the run.
LEAK_BYTES = 100_000_000
#: Of the step-to-step changes, at least this share must be rises for growth to be steady.
STEADY_RISE_SHARE = 0.75
#: Near the limit: peak allocated above this share of peak reserved (the cache is full), or
#: peak reserved above ``DEVICE_SHARE`` of the device's memory.
RESERVED_SHARE = 0.95
DEVICE_SHARE = 0.90
#: Host rows that can be "the op active at the peak".
OP_KINDS = ("cpu_op", "user_annotation", "python_function", "nvtx")
LEVEL_KEY = ["rank", "device"]

NOTE_NO_MEMORY = "no allocator events (profile with profile_memory=True)"


def memory_timeline(events: Frame, *, include_cpu: bool = False) -> pl.DataFrame:
    """Allocator events in time order: rank, device, ts_ns, step, mem_bytes,
    mem_total_allocated, mem_total_reserved. Device −1 (host) is left out unless asked."""
    lf = events.lazy().filter((pl.col("kind").cast(pl.String) == "memory"))
    if not include_cpu:
        lf = lf.filter(pl.col("device").is_not_null() & (pl.col("device") >= 0))
    return lf.select("rank", "device", "ts_ns", "step", "mem_bytes", "mem_total_allocated",
                     "mem_total_reserved").sort("rank", "device", "ts_ns").collect()


def memory_by_step(events: Frame) -> pl.DataFrame:
    """Peak and end-of-step memory per (rank, device, step) and growth across steps.

    Events outside steps are summarised in a row with step null. Ranks without allocator
    events get a row with a note.
    """
    tl = memory_timeline(events)
    ranks = ranks_present(events)
    out = (
        tl.group_by("rank", "device", "step")
        .agg(events=pl.len().cast(pl.Int64),
             peak_allocated_bytes=pl.col("mem_total_allocated").max(),
             peak_reserved_bytes=pl.col("mem_total_reserved").max(),
             end_allocated_bytes=pl.col("mem_total_allocated").sort_by("ts_ns").last(),
             end_reserved_bytes=pl.col("mem_total_reserved").sort_by("ts_ns").last())
        .sort("rank", "device", "step", nulls_last=True)
    )
    in_steps = out.filter(pl.col("step").is_not_null())
    growth = in_steps.with_columns(
        growth_bytes=pl.col("end_allocated_bytes")
        - pl.col("end_allocated_bytes").shift(1).over("rank", "device"),
        peak_growth_bytes=pl.col("peak_allocated_bytes")
        - pl.col("peak_allocated_bytes").shift(1).over("rank", "device"),
    )
    out = pl.concat([growth, out.filter(pl.col("step").is_null())], how="diagonal_relaxed")
    missing = ranks.join(out.select("rank").unique(), on="rank", how="anti")
    out = out.with_columns(note=pl.lit(None, pl.String))
    if missing.height:
        out = pl.concat([out, missing.with_columns(note=pl.lit(NOTE_NO_MEMORY))],
                        how="diagonal_relaxed")
    return out.sort("rank", "device", "step", nulls_last=True)


def memory_levels(events: Frame) -> pl.DataFrame:
    """Every allocator event, time-ordered per (rank, device), with the level after it.

    Columns: ``rank``, ``device`` (``cuda:0``, ``cpu``, ...), ``device_index`` (the trace's
    device id, −1 for the host), ``basis``, ``ts_ns``, ``tid``, ``mem_bytes`` (+ allocated,
    − freed), ``allocated_bytes`` and ``reserved_bytes`` after the event. ``basis`` is
    ``absolute`` for a device whose every event carries the allocator's totals, else
    ``relative``: the running sum of ``mem_bytes`` from zero at the trace's start (reserved
    null). A reserved total that stays 0 (the CPU allocator reserves nothing) is null too.
    ``events`` need ``args_json`` for the device type; without it, devices ≥ 0 are ``cuda``.
    """
    lf = events.lazy().filter(pl.col("kind").cast(pl.String) == "memory")
    has_args = "args_json" in lf.collect_schema().names()
    dtype = (pl.col("args_json").str.extract(r'"Device Type":\s*(-?\d+)', 1).cast(pl.Int32)
             if has_args else pl.lit(None, pl.Int32))
    index = pl.col("device").fill_null(-1).cast(pl.Int32)
    dtype = pl.coalesce(dtype, pl.when(index >= 0).then(pl.lit(1)).otherwise(pl.lit(0)))
    name = dtype.replace_strict(DEVICE_TYPES, default="device", return_dtype=pl.String)
    label = (pl.when(dtype == 0).then(pl.lit("cpu"))
             .otherwise(pl.concat_str(name, pl.lit(":"), index.cast(pl.String))))
    mem = (lf.select("rank", "ts_ns", "tid", "mem_bytes", "mem_total_allocated",
                     "mem_total_reserved", device=label, device_index=index)
           .collect().sort("rank", "device", "ts_ns", maintain_order=True))
    absolute = pl.col("mem_total_allocated").is_not_null().all().over(LEVEL_KEY)
    reserved = pl.when(pl.col("mem_total_reserved").max().over(LEVEL_KEY) > 0).then(
        pl.col("mem_total_reserved"))
    return mem.with_columns(
        basis=pl.when(absolute).then(pl.lit("absolute")).otherwise(pl.lit("relative")),
        mem_bytes=pl.col("mem_bytes").fill_null(0),
        allocated_bytes=pl.when(absolute).then(pl.col("mem_total_allocated"))
        .otherwise(pl.col("mem_bytes").fill_null(0).cum_sum().over(LEVEL_KEY)),
        reserved_bytes=pl.when(absolute).then(reserved),
    ).select("rank", "device", "device_index", "basis", "ts_ns", "tid", "mem_bytes",
             "allocated_bytes", "reserved_bytes")


def device_peaks(levels: pl.DataFrame, host: Frame, device_memory: pl.DataFrame | None = None,
                 ) -> pl.DataFrame:
    """Per (rank, device) of :func:`memory_levels`: ``basis``, ``peak_allocated_bytes`` and
    ``peak_time_ns`` (the first event that reached it; ``first_event_ns``: the device's first
    event), ``peak_op`` (the innermost host op of
    ``host`` on the allocating thread around that time), ``peak_reserved_bytes``,
    ``end_allocated_bytes``, ``events``, ``allocated_total_bytes`` (sum of allocations),
    ``allocation_rate_bytes_per_s`` (that sum over the time from the first to the last event),
    ``device_total_bytes`` (from ``device_memory``: ``rank, device_index, total_bytes``, for
    the accelerators) and
    ``near_limit`` with its ``pressure`` reason."""
    at_peak = pl.col("allocated_bytes") == pl.col("allocated_bytes").max()
    span_s = (pl.col("ts_ns").max() - pl.col("ts_ns").min()) / 1e9
    allocated = pl.col("mem_bytes").clip(lower_bound=0).sum()
    rows = levels.group_by(LEVEL_KEY, maintain_order=True).agg(
        pl.col("basis").first(), pl.col("device_index").first(),
        peak_allocated_bytes=pl.col("allocated_bytes").max(),
        peak_reserved_bytes=pl.col("reserved_bytes").max(),
        peak_time_ns=pl.col("ts_ns").filter(at_peak).first(),
        peak_tid=pl.col("tid").filter(at_peak).first(),
        end_allocated_bytes=pl.col("allocated_bytes").last(),
        first_event_ns=pl.col("ts_ns").min(),
        events=pl.len().cast(pl.Int64),
        allocated_total_bytes=allocated,
        allocation_rate_bytes_per_s=pl.when(span_s > 0).then(allocated / span_s))
    rows = _with_peak_op(rows, host)
    totals = (device_memory if device_memory is not None and device_memory.height else
              pl.DataFrame(schema={"rank": pl.Int32, "device_index": pl.Int32,
                                   "total_bytes": pl.Int64}))
    rows = rows.join(totals.select("rank", "device_index", device_total_bytes="total_bytes"),
                     on=["rank", "device_index"], how="left").with_columns(
        device_total_bytes=pl.when(pl.col("device") != "cpu").then("device_total_bytes"))
    return with_pressure(rows).drop("peak_tid").sort(LEVEL_KEY)


def with_pressure(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (``peak_allocated_bytes``, ``peak_reserved_bytes`` and, when known,
    ``device_total_bytes``) with ``near_limit`` and ``pressure``, the reasons: peak allocated
    above ``RESERVED_SHARE`` of peak reserved (the cache is full), or peak reserved above
    ``DEVICE_SHARE`` of the device."""
    if "device_total_bytes" not in rows.columns:
        rows = rows.with_columns(device_total_bytes=pl.lit(None, pl.Int64))
    full_cache = pl.col("peak_allocated_bytes") > RESERVED_SHARE * pl.col("peak_reserved_bytes")
    full_device = pl.col("peak_reserved_bytes") > DEVICE_SHARE * pl.col("device_total_bytes")
    pressure = pl.concat_str(
        pl.when(full_cache).then(pl.format(
            "peak allocated {} B is above {}% of peak reserved {} B", "peak_allocated_bytes",
            pl.lit(round(RESERVED_SHARE * 100)), "peak_reserved_bytes")),
        pl.when(full_device).then(pl.format(
            "peak reserved {} B is above {}% of the device's {} B", "peak_reserved_bytes",
            pl.lit(round(DEVICE_SHARE * 100)), "device_total_bytes")),
        separator="; ", ignore_nulls=True)
    return rows.with_columns(
        near_limit=(full_cache.fill_null(False) | full_device.fill_null(False)),
        pressure=pl.when(pressure != "").then(pressure))


def _with_peak_op(rows: pl.DataFrame, host: Frame) -> pl.DataFrame:
    """``peak_op``: the innermost host op (latest start, then shortest) that spans the peak
    event's time on its rank and thread; ops whose thread the trace does not say (old Kineto
    wrote it as text) count as on any thread, after those on its own. Null when none."""
    ops = (host.lazy().filter(pl.col("kind").cast(pl.String).is_in(OP_KINDS))
           .select("rank", "tid", "ts_ns", "dur_ns", pl.col("name").cast(pl.String))
           .join(rows.lazy().select("rank", "device", "peak_tid", "peak_time_ns"), on="rank")
           .filter((pl.col("tid") == pl.col("peak_tid")).fill_null(True)
                   & (pl.col("ts_ns") <= pl.col("peak_time_ns"))
                   & (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) >= pl.col("peak_time_ns")))
           .sort(pl.col("tid").is_not_null(), "ts_ns", "dur_ns", descending=[True, True, False])
           .group_by(LEVEL_KEY).agg(peak_op=pl.col("name").first()).collect())
    return rows.join(ops, on=LEVEL_KEY, how="left")


def step_start_levels(levels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Allocated bytes at each step start per (rank, device): the level after the last event
    before the step's start (before the first event: the level the first event started
    from, its ``allocated_bytes − mem_bytes``). Columns ``rank, device, step,
    step_start_ns, allocated_bytes``."""
    if levels.height == 0 or steps.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.String, "step": pl.Int64,
                                    "step_start_ns": pl.Int64, "allocated_bytes": pl.Int64})
    first = levels.group_by(LEVEL_KEY).agg(
        before=(pl.col("allocated_bytes") - pl.col("mem_bytes")).first())
    starts = (steps.select("rank", "step", "step_start_ns")
              .join(first.select("rank", "device", "before"), on="rank")
              .sort("step_start_ns"))
    found = starts.join_asof(
        levels.select("rank", "device", "ts_ns", "allocated_bytes").sort("ts_ns"),
        left_on="step_start_ns", right_on="ts_ns", by=LEVEL_KEY, strategy="backward",
        allow_exact_matches=False, check_sortedness=False)
    return (found.select("rank", "device", "step", "step_start_ns",
                         allocated_bytes=pl.coalesce("allocated_bytes", "before"))
            .sort("rank", "device", "step"))


def growth(step_levels: pl.DataFrame, *, leak_bytes: int = LEAK_BYTES) -> pl.DataFrame:
    """Per (rank, device): ``steps`` (step starts seen), ``growth_bytes`` (allocated at the
    last step start − at the first), ``rise_share`` (share of step-to-step changes that
    rise) and ``leak_suspected``: at least 3 step starts, steady growth (``rise_share`` ≥
    ``STEADY_RISE_SHARE``) and ``growth_bytes`` > ``leak_bytes``."""
    change = pl.col("allocated_bytes").diff()
    out = step_levels.sort("rank", "device", "step").group_by(LEVEL_KEY, maintain_order=True).agg(
        steps=pl.len().cast(pl.Int64),
        growth_bytes=pl.col("allocated_bytes").last() - pl.col("allocated_bytes").first(),
        rise_share=(change > 0).sum() / change.drop_nulls().len())
    return out.with_columns(leak_suspected=(
        (pl.col("steps") >= 3) & (pl.col("rise_share") >= STEADY_RISE_SHARE)
        & (pl.col("growth_bytes") > leak_bytes)).fill_null(False))


def timeline_points(levels: pl.DataFrame, *, points: int = 400) -> pl.DataFrame:
    """:func:`memory_levels` thinned for a plot, keeping every peak: per (rank, device), time
    is cut into ``points`` equal buckets and each bucket keeps its highest level, its lowest
    and its last (a step line through them still reaches the device's peak and its troughs).
    Columns ``rank, device, basis, ts_ns, t_ms`` (ms after the rank's first allocator event)
    and ``allocated_bytes``."""
    cols = ["rank", "device", "basis", "ts_ns", "t_ms", "allocated_bytes"]
    if levels.height == 0:
        return levels.with_columns(t_ms=pl.lit(None, pl.Float64)).select(cols)
    start = pl.col("ts_ns").min().over(LEVEL_KEY)
    span = (pl.col("ts_ns").max() - pl.col("ts_ns").min()).over(LEVEL_KEY)
    bucket = (pl.col("ts_ns") - start) * points // pl.when(span > 0).then(span).otherwise(1)
    in_bucket = [*LEVEL_KEY, "bucket"]
    i, level = pl.col("i"), pl.col("allocated_bytes")
    keep = ((i == i.sort_by(level, descending=True).first().over(in_bucket))
            | (i == i.sort_by(level).first().over(in_bucket)) | (i == i.last().over(in_bucket)))
    return (levels.sort(*LEVEL_KEY, "ts_ns", maintain_order=True).with_row_index("i")
            .with_columns(bucket=bucket, t_ms=(pl.col("ts_ns") - pl.col("ts_ns").min()
                                               .over("rank")) / 1e6)
            .filter(keep).select(cols))
