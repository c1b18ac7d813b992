"""Device memory from CUDA caching-allocator snapshots: state at snapshot time, and the peak
replayed from the allocator's trace.

Inputs are the tables ``traceview.parsers.torch_snapshot`` reads (each with a ``rank`` column
added): ``segments`` (one row per segment at snapshot time), ``blocks`` (their blocks) and
``trace`` (the recorded actions, ``seq`` in order per device).

**The replay runs backwards from the snapshot**, as PyTorch's MemoryViz does: the snapshot is
the end state, and undoing the trace's actions from the last one gives every earlier state,
the one before the first recorded action included (the *inferred start state*: what was
allocated before recording began). Allocated bytes are *requested* bytes (what the trace
records for ``alloc`` and ``free_completed``, and ``requested_size`` of the blocks held at
snapshot time: ``active_allocated`` and those awaiting free); a block is held from its
``alloc`` to its ``free_completed``. Reserved bytes are segment bytes: ``segment_alloc`` and
``segment_map`` add, ``segment_free`` and ``segment_unmap`` remove. Definitions:
docs/metrics.md, section "Allocator snapshots".
"""

from __future__ import annotations

import polars as pl

KEY = ["rank", "device"]
#: Block states that hold memory (a block freed while a stream still uses it waits).
HELD_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")
ALLOCATED_DELTA = {"alloc": 1, "free_completed": -1}
RESERVED_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}

#: Frames of the allocator itself (``file:line:function``): skipped when a stack is named, so
#: the name points at the code that asked for the memory (the stack stays whole in --json).
ALLOCATOR_FRAMES = r"c10::|CUDACachingAllocator|^torch/cuda/memory\.py:"
#: A Python frame (``file.py:line:function``).
PYTHON_FRAME = r"^[^:;]*\.py:"
#: PyTorch's own Python (its files are named from the package: ``torch/nn/modules/...``).
TORCH_FRAME = r"^torch/"


def user_frames(stack: pl.Expr) -> pl.Expr:
    """The frames of a ``;``-joined stack (outermost first) without the allocator's own
    (``ALLOCATOR_FRAMES``), as a list."""
    return stack.str.split(";").list.eval(
        pl.element().filter(~pl.element().str.contains(ALLOCATOR_FRAMES)))


def user_frame(stack: pl.Expr) -> pl.Expr:
    """The frame that names a stack: the user's innermost, i.e. the innermost Python frame
    outside PyTorch (the line of the model or loop that asked: ``model.py:12:forward``, not
    ``torch/nn/modules/linear.py``), else the innermost Python frame outside the allocator,
    else the innermost frame outside it, else the innermost frame (allocator frames alone)."""
    kept = user_frames(stack)
    python = kept.list.eval(pl.element().filter(pl.element().str.contains(PYTHON_FRAME)))
    own = python.list.eval(pl.element().filter(~pl.element().str.contains(TORCH_FRAME)))
    return pl.coalesce(own.list.last(), python.list.last(), kept.list.last(),
                       stack.str.split(";").list.last())


def snapshot_state(segments: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, device) at snapshot time: ``segments``, ``reserved_bytes`` (sum of segment
    sizes), ``allocated_bytes`` (requested bytes of held blocks; ``allocated_block_bytes``:
    their rounded block sizes, what ``torch.cuda.memory_allocated`` counts), ``fragmentation_bytes``
    (reserved − allocated: cached but not handed out, rounding included),
    ``largest_free_block_bytes`` (the largest inactive block: the largest request the cache
    could serve without a new segment)."""
    seg = segments.group_by(KEY).agg(segments=pl.len().cast(pl.Int64),
                                     reserved_bytes=pl.col("total_size").sum())
    held = pl.col("state").is_in(HELD_STATES)
    blk = blocks.group_by(KEY).agg(
        allocated_bytes=pl.col("requested_size").filter(held).sum(),
        allocated_block_bytes=pl.col("size").filter(held).sum(),
        largest_free_block_bytes=pl.col("size").filter(~held).max())
    return (seg.join(blk, on=KEY, how="full", coalesce=True)
            .with_columns(pl.col("segments", "reserved_bytes", "allocated_bytes",
                                 "allocated_block_bytes").fill_null(0))
            .with_columns(fragmentation_bytes=pl.col("reserved_bytes") - pl.col("allocated_bytes"))
            .sort(KEY))


def segment_table(segments: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """One row per segment at snapshot time: ``rank, device, address, total_size, stream,
    segment_type, blocks``, ``allocated_bytes`` (requested bytes of its held blocks),
    ``free_bytes`` (its inactive blocks) and ``largest_free_block_bytes``; largest first."""
    held = pl.col("state").is_in(HELD_STATES)
    per = blocks.group_by(*KEY, address="segment_address").agg(
        allocated_bytes=pl.col("requested_size").filter(held).sum(),
        free_bytes=pl.col("size").filter(~held).sum(),
        largest_free_block_bytes=pl.col("size").filter(~held).max())
    return (segments.join(per, on=[*KEY, "address"], how="left")
            .with_columns(pl.col("allocated_bytes", "free_bytes").fill_null(0))
            .sort([*KEY, "total_size", "address"], descending=[False, False, True, False]))


def replay(trace: pl.DataFrame, state: pl.DataFrame) -> pl.DataFrame:
    """The trace with the allocated and reserved bytes after each action, replayed backwards
    from ``state`` (:func:`snapshot_state`): ``allocated_after``, ``reserved_after``, and per
    device ``start_allocated`` / ``start_reserved`` (the inferred state before the first
    action)."""
    d_alloc = pl.col("action").replace_strict(ALLOCATED_DELTA, default=0, return_dtype=pl.Int64)
    d_res = pl.col("action").replace_strict(RESERVED_DELTA, default=0, return_dtype=pl.Int64)
    size = pl.col("size").fill_null(0)
    steps = trace.sort(*KEY, "seq").with_columns(
        delta_allocated=d_alloc * size, delta_reserved=d_res * size)
    ends = state.select(*KEY, end_allocated="allocated_bytes", end_reserved="reserved_bytes")
    return (steps.join(ends, on=KEY, how="left")
            .with_columns(pl.col("end_allocated", "end_reserved").fill_null(0))
            .with_columns(
                # after action i = end − (what the actions after i added)
                allocated_after=pl.col("end_allocated") - pl.col("delta_allocated")
                .cum_sum(reverse=True).over(KEY) + pl.col("delta_allocated"),
                reserved_after=pl.col("end_reserved") - pl.col("delta_reserved")
                .cum_sum(reverse=True).over(KEY) + pl.col("delta_reserved"),
                start_allocated=pl.col("end_allocated") - pl.col("delta_allocated").sum()
                .over(KEY),
                start_reserved=pl.col("end_reserved") - pl.col("delta_reserved").sum().over(KEY))
            .drop("end_allocated", "end_reserved"))


def snapshot_peaks(replayed: pl.DataFrame, state: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, device): ``peak_allocated_bytes`` / ``peak_reserved_bytes`` over the inferred
    start state and the state after every action; ``peak_seq`` (the action that reached the
    allocated peak first; −1: the start state), ``peak_time_ns`` (its ``time_us`` × 1000 when
    recorded), ``peak_op`` (its innermost user frame: :func:`user_frame`;
    ``peak_stack``: the whole stack), ``start_allocated_bytes``, ``ooms`` and
    ``trace_entries``. A device with no trace peaks at its snapshot state."""
    starts = replayed.group_by(KEY).agg(
        seq=pl.lit(-1, pl.Int64), allocated_after=pl.col("start_allocated").first(),
        reserved_after=pl.col("start_reserved").first())
    levels = pl.concat([starts, replayed.select(*KEY, "seq", "allocated_after",
                                                "reserved_after", "time_us", "stack")],
                       how="diagonal_relaxed")
    top = levels.sort(*KEY, "seq").group_by(KEY, maintain_order=True).agg(
        peak_allocated_bytes=pl.col("allocated_after").max(),
        peak_reserved_bytes=pl.col("reserved_after").max(),
        peak_seq=pl.col("seq").filter(pl.col("allocated_after") == pl.col("allocated_after")
                                      .max()).first(),
        peak_time_us=pl.col("time_us").filter(pl.col("allocated_after") == pl.col(
            "allocated_after").max()).first(),
        peak_stack=pl.col("stack").filter(pl.col("allocated_after") == pl.col(
            "allocated_after").max()).first(),
        start_allocated_bytes=pl.col("allocated_after").filter(pl.col("seq") == -1).first(),
        trace_entries=(pl.col("seq") >= 0).sum().cast(pl.Int64),
        ooms=pl.lit(0, pl.Int64))
    ooms = replayed.filter(pl.col("action") == "oom").group_by(KEY).agg(
        n_oom=pl.len().cast(pl.Int64))
    state_cols = ["segments", "reserved_bytes", "allocated_bytes", "allocated_block_bytes",
                  "fragmentation_bytes"]
    out = (state.join(top, on=KEY, how="full", coalesce=True)  # a device may hold nothing now
           .join(ooms, on=KEY, how="left")
           .with_columns(pl.col(state_cols).fill_null(0))
           .with_columns(
               peak_allocated_bytes=pl.coalesce("peak_allocated_bytes", "allocated_bytes"),
               peak_reserved_bytes=pl.coalesce("peak_reserved_bytes", "reserved_bytes"),
               start_allocated_bytes=pl.coalesce("start_allocated_bytes", "allocated_bytes"),
               trace_entries=pl.col("trace_entries").fill_null(0),
               ooms=pl.col("n_oom").fill_null(0),
               peak_time_ns=pl.col("peak_time_us") * 1000,
               peak_op=user_frame(pl.col("peak_stack")))
           .drop("n_oom", "peak_time_us"))
    return out.sort(KEY)


def block_lifetimes(trace: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Every block the replay knows, with the actions that bound its life: ``born_seq`` (its
    ``alloc``; −1 when it was allocated before recording began) and ``freed_seq`` (its
    ``free_completed``; null when it is still held at snapshot time), ``size`` (requested
    bytes) and ``stack`` (where it was allocated; for a block allocated before recording,
    where it was freed or, if still held, the block's own frames)."""
    acts = (trace.filter(pl.col("action").is_in(["alloc", "free_completed"]))
            .sort(*KEY, "addr", "seq")
            .with_columns(nxt_action=pl.col("action").shift(-1).over(*KEY, "addr"),
                          nxt_seq=pl.col("seq").shift(-1).over(*KEY, "addr"),
                          prev_action=pl.col("action").shift(1).over(*KEY, "addr")))
    in_trace = acts.filter(pl.col("action") == "alloc").select(
        *KEY, "addr", "size", "stack", born_seq="seq",
        freed_seq=pl.when(pl.col("nxt_action") == "free_completed").then(pl.col("nxt_seq")))
    # freed in the trace without its alloc: held since before recording began
    before = acts.filter((pl.col("action") == "free_completed")
                         & (pl.col("prev_action") != "alloc").fill_null(True)).select(
        *KEY, "addr", "size", "stack", born_seq=pl.lit(-1, pl.Int64), freed_seq="seq")
    # held at snapshot time and not allocated (and still held) within the trace
    live_in_trace = in_trace.filter(pl.col("freed_seq").is_null()).select(*KEY, "addr")
    held = (blocks.filter(pl.col("state").is_in(HELD_STATES))
            .select(*KEY, addr="address", size="requested_size", stack="stack")
            .join(live_in_trace, on=[*KEY, "addr"], how="anti")
            .with_columns(born_seq=pl.lit(-1, pl.Int64), freed_seq=pl.lit(None, pl.Int64)))
    return pl.concat([in_trace, before, held], how="diagonal_relaxed").sort(*KEY, "born_seq")


def top_stacks_at_peak(lifetimes: pl.DataFrame, peaks: pl.DataFrame, *,
                       top: int = 10) -> pl.DataFrame:
    """The allocation stacks holding the most bytes at each device's allocated peak:
    ``rank, device, stack, bytes, blocks, share`` (of the peak), largest first; ``frame``:
    the frame that names the stack (:func:`user_frame`: the user's innermost, not the
    allocator's)."""
    at = lifetimes.join(peaks.select(*KEY, "peak_seq", "peak_allocated_bytes"), on=KEY)
    live = at.filter((pl.col("born_seq") <= pl.col("peak_seq"))
                     & (pl.col("freed_seq").is_null() | (pl.col("freed_seq") > pl.col("peak_seq"))))
    return (live.group_by(*KEY, "stack")
            .agg(bytes=pl.col("size").sum(), blocks=pl.len().cast(pl.Int64),
                 peak=pl.col("peak_allocated_bytes").first())
            .with_columns(share=pl.col("bytes") / pl.col("peak"),
                          frame=user_frame(pl.col("stack")))
            .drop("peak")
            .sort([*KEY, "bytes", "stack"], descending=[False, False, True, False],
                  nulls_last=True)
            .group_by(KEY, maintain_order=True).head(top))


def oom_events(trace: pl.DataFrame) -> pl.DataFrame:
    """The allocator's out-of-memory events: ``rank, device, seq, requested_bytes,
    device_free_bytes, time_ns, stack``, ``frame`` (:func:`user_frame`)."""
    return trace.filter(pl.col("action") == "oom").select(
        *KEY, "seq", requested_bytes="size", device_free_bytes="device_free",
        time_ns=pl.col("time_us") * 1000, stack="stack",
        frame=user_frame(pl.col("stack"))).sort(*KEY, "seq")
