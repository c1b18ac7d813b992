"""The critical path across ranks: the chain of dependent work that sets the step time.

Definitions with a worked example: ``docs/metrics.md``, section *Critical path*. In short, on
the aligned timeline (:mod:`traceview.analyses.align`), walking back from the end of the last
step of the rank that finishes last:

1. on the current rank, the path runs back through the rank's own work to the end of its
   latest *exposed* collective (one whose end the rank's compute was not running across: a
   collective hidden under compute is not what the rank waited for);
2. a collective completes when its last rank arrives, so from the collective's end the path
   runs back through its transfer (last arrival to the end on this rank) and then **jumps to
   the rank that arrived last**, at its arrival;
3. it stops at the start of the first step. Each step's path leads into the next one, so the
   path tiles the time from the first step's start to the last step's end.

Within a rank's own stretch the path follows CPU ops to launches to kernels: where the GPU is
busy, the path is on the GPU (its kernels on their streams), where it is idle, on the host:
the threads that drive the rank's work (the one with the step markers, and those that call
the GPU runtime, such as the autograd engine's). Each elementary piece of the path
gets one category, the first that applies:

=========================  ========================================================
``compute``                a GPU compute/memcpy/memset kernel runs (CPU-only rank: a
                           host op runs)
``communication_transfer`` the path is inside a matched collective, after its last arrival
``communication_wait``     a communication kernel or host call runs that the path cannot
                           follow to another rank (unmatched, or overlapped)
``data_loading``           the host is in a DataLoader op
``launch_host``            GPU rank, GPU idle, the host runs an op (launching)
``idle``                   nothing of the above
=========================  ========================================================

The walk is a Python loop over the collectives on the path (one hop each), never over events.

>>> import polars as pl
>>> coll = pl.DataFrame({"instance": ["a", "a"], "rank": [0, 1], "collective": "all_reduce",
...     "name": "gloo:all_reduce", "arrival_ns": [10, 60], "end_ns": [80, 80],
...     "last_arrival_ns": [60, 60], "last_rank": [1, 1]})
>>> steps = pl.DataFrame({"rank": [0, 1], "step": [0, 0], "step_start_ns": [0, 0],
...     "step_end_ns": [100, 90], "step_time_ns": [100, 90]})
>>> walk(candidates(coll, busy=None), span_bounds(steps)).select(
...     "rank", "kind", "start_ns", "end_ns").rows()
[(1, 'local', 0, 60), (0, 'transfer', 60, 80), (0, 'local', 80, 100)]
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceview._dependencies import lazy_module
from traceview.analyses.align import apply_offsets

from .intervals import clip, complement, flag_overlapping, sweep, union, windowed_sweep
from .names import per_name
from .op_tree import innermost_open, op_tree
from .window import STEP_PATTERN

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

Frame = pl.LazyFrame | pl.DataFrame

#: Path categories, in the order of the rules above (and of every output).
CATEGORIES: tuple[str, ...] = ("compute", "communication_wait", "communication_transfer",
                               "launch_host", "data_loading", "idle")

SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "kind": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "instance": pl.String, "name": pl.String, "to_rank": pl.Int32,
}
PIECE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String,
    "name": pl.String, "instance": pl.String,
}
#: Far beyond any trace's time: the open ends of the first and last step windows.
_FAR_NS = 1 << 62


@dataclass(frozen=True)
class PathOptions:
    """Name rules: which host ops are data loading, which are communication calls."""

    dataloader_pattern: str = (
        r"(?i)dataloader|_MultiProcessingDataLoaderIter|_SingleProcessDataLoaderIter")
    host_comm_pattern: str = (
        r"(?i)^(c10d::|gloo:|nccl:|record_param_comms)|^(aten|c10d)::wait|nccl(Dev)?Kernel")
    sync_pattern: str = (
        r"(?i)^(cuda|hip)(Device|Stream|Event|Ctx)Synchroni[sz]e$|^(cuda|hip)Memcpy$")
    step_pattern: str = STEP_PATTERN


DEFAULT_OPTIONS = PathOptions()


# --- the walk ----------------------------------------------------------------------------

def candidates(collective_rows: pl.DataFrame, busy: pl.DataFrame | None) -> pl.DataFrame:
    """The collective ends the path may pass through: one row per (instance, rank) of
    ``collective_rows`` (``analyses.collectives.collective_ranks``, aligned) whose end is
    exposed, i.e. not inside the rank's compute (``busy``: merged ``rank, ts_ns, end_ns``;
    None: every end is exposed). ``jump_ns``: where the path leaves the collective, the last
    arrival (never after the rank's own end, should the clocks disagree)."""
    rows = collective_rows.select(
        pl.col("rank").cast(pl.Int32), pl.col("instance").cast(pl.String),
        pl.col("name").cast(pl.String), "arrival_ns", "end_ns",
        jump_ns=pl.min_horizontal("last_arrival_ns", "end_ns"),
        to_rank=pl.col("last_rank").cast(pl.Int32))
    if busy is None or busy.height == 0 or rows.height == 0:
        return rows
    # the last nanosecond before the end: compute running across it hides the collective
    probe = rows.with_columns(_s=pl.col("end_ns") - 1)
    flagged = flag_overlapping(probe, busy.with_columns(pl.col("rank").cast(pl.Int32)),
                               "_hidden", by=["rank"], start="_s", end="end_ns")
    return rows.filter(~flagged.get_column("_hidden"))


def span_bounds(steps: pl.DataFrame) -> pl.DataFrame:
    """``rank, first_ns, last_ns``: where each rank's steps begin and end (aligned)."""
    return steps.group_by("rank").agg(first_ns=pl.col("step_start_ns").min(),
                                      last_ns=pl.col("step_end_ns").max()).with_columns(
        pl.col("rank").cast(pl.Int32)).sort("rank")


def walk(cands: pl.DataFrame, bounds: pl.DataFrame) -> pl.DataFrame:
    """The path as ``SEGMENT_SCHEMA`` rows in time order: ``local`` stretches on one rank,
    ``transfer`` stretches inside a collective (``to_rank``: the last arriver it jumps to).

    ``cands``: :func:`candidates`; ``bounds``: :func:`span_bounds`. Starts at the latest
    ``last_ns`` and walks back hop by hop (one Python iteration per collective on the path)."""
    if bounds.height == 0:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    first = dict(zip(bounds.get_column("rank").to_list(), bounds.get_column("first_ns").to_list()))
    ends = bounds.sort("last_ns", "rank", descending=[True, False]).row(0, named=True)
    rank, t = ends["rank"], ends["last_ns"]
    per_rank = {r: _sorted_by_end(g) for (r,), g in
                cands.partition_by("rank", as_dict=True).items()} if cands.height else {}
    used: set[str] = set()
    out: list[tuple] = []
    for _ in range(cands.height + 1):  # each hop uses one collective: a bound, not a loop on time
        floor = first.get(rank, t)
        hop = _latest_before(per_rank.get(rank), t, floor, used)
        if hop is None:
            if t > floor:
                out.append((rank, "local", floor, t, None, None, None))
            break
        instance, name, end, jump, to_rank = hop
        used.add(instance)
        if t > end:
            out.append((rank, "local", end, t, None, None, None))
        if end > jump:
            out.append((rank, "transfer", jump, end, instance, name, to_rank))
        rank, t = to_rank, jump
    return pl.DataFrame(out[::-1], schema=SEGMENT_SCHEMA, orient="row")


def _sorted_by_end(rows: pl.DataFrame) -> dict[str, np.ndarray]:
    rows = rows.sort("end_ns", "arrival_ns")
    return {c: rows.get_column(c).to_numpy() for c in
            ("instance", "name", "arrival_ns", "end_ns", "jump_ns", "to_rank")}


def _latest_before(rows: dict[str, np.ndarray] | None, t: int, floor: int,
                   used: set[str]) -> tuple | None:
    """The rank's collective with the latest end at or before ``t`` (and after ``floor``) that
    it joined before ``t``: the one its work at ``t`` waited for last."""
    if rows is None:
        return None
    i = int(np.searchsorted(rows["end_ns"], t, side="right")) - 1
    while i >= 0 and rows["end_ns"][i] > floor:
        if rows["arrival_ns"][i] < t and rows["instance"][i] not in used:
            return (rows["instance"][i], rows["name"][i], int(rows["end_ns"][i]),
                    int(rows["jump_ns"][i]), int(rows["to_rank"][i]))
        i -= 1
    return None


# --- what the path is doing ----------------------------------------------------------------

def main_threads(host: pl.DataFrame, *, step_pattern: str = STEP_PATTERN) -> pl.DataFrame:
    """``rank, tid``: the thread holding each rank's step markers (else its busiest op
    thread): the thread that runs the training loop and launches the GPU work."""
    ops = host.filter(pl.col("dur_ns").is_not_null()).with_columns(_thread(host))
    weight = pl.when(pl.col("name").cast(pl.String).str.contains(step_pattern)).then(1 << 40) \
        .otherwise(0) + pl.col("dur_ns")
    return (ops.group_by("rank", "tid").agg(w=weight.sum())
            .sort("rank", "w", "tid", descending=[False, True, False])
            .group_by("rank", maintain_order=True).agg(pl.col("tid").first())
            .with_columns(pl.col("rank").cast(pl.Int32)))


def _thread(rows: pl.DataFrame) -> pl.Expr:
    """``tid`` as Int64, -1 where the trace records none (old traces): then one thread."""
    tid = pl.col("tid").cast(pl.Int64) if "tid" in rows.columns else pl.lit(None, pl.Int64)
    return tid.fill_null(-1).alias("tid")


def host_threads(host: pl.DataFrame, *, step_pattern: str = STEP_PATTERN) -> pl.DataFrame:
    """``rank, tid``: the threads that drive each rank's work: its main thread (the one with
    the step markers) and every thread that calls the GPU runtime (on a GPU job, backward runs
    and launches on the autograd engine's own thread)."""
    launching = host.filter(pl.col("kind").cast(pl.String).is_in(
        ["cuda_runtime", "cuda_driver", "sync"])).select(
        pl.col("rank").cast(pl.Int32), _thread(host)).unique()
    return pl.concat([main_threads(host, step_pattern=step_pattern), launching]).unique() \
        .sort("rank", "tid")


def activity(gpu: pl.DataFrame, host: pl.DataFrame, *,
             options: PathOptions = DEFAULT_OPTIONS) -> pl.DataFrame:
    """Everything the path can be doing on a rank, one interval per row (``rank, tid, ts_ns,
    end_ns, name`` and the flags ``gpu_compute, gpu_comm, host_comm, loader, host, sync,
    annotation``), on the timeline of the inputs. NVTX ranges are annotations, never
    ``host`` work; ``annotation``: an NVTX or ``record_function`` range (not a DataLoader's). Host rows: communication calls on any thread; other ops on
    the threads that drive the rank's work (:func:`host_threads`; step markers excluded).
    GPU rows have a null ``tid``."""
    kernels = gpu.filter(pl.col("dur_ns") > 0).select(
        pl.col("rank").cast(pl.Int32), tid=pl.lit(None, pl.Int64), ts_ns="ts_ns",
        end_ns=pl.col("ts_ns") + pl.col("dur_ns"), name=pl.col("name").cast(pl.String),
        gpu_compute=pl.col("gpu_class").cast(pl.String) != "comm",
        gpu_comm=pl.col("gpu_class").cast(pl.String) == "comm",
        host_comm=pl.lit(False), loader=pl.lit(False), host=pl.lit(False), sync=pl.lit(False),
        annotation=pl.lit(False))
    timed = host.filter(pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") > 0)
                        & pl.col("kind").cast(pl.String).is_in(
                            ["cpu_op", "user_annotation", "python_function", "cuda_runtime",
                             "cuda_driver", "sync", "nvtx"]))
    flagged = per_name(timed, _comm=pl.col("name").cast(pl.String).str.contains(
        options.host_comm_pattern), _step=pl.col("name").cast(pl.String).str.contains(
        options.step_pattern), _loader=pl.col("name").cast(pl.String).str.contains(
        options.dataloader_pattern), _sync=pl.col("name").cast(pl.String).str.contains(
        options.sync_pattern)).collect()
    drivers = host_threads(host, step_pattern=options.step_pattern)
    tagged = flagged.with_columns(pl.col("rank").cast(pl.Int32), _thread(flagged)).join(
        drivers.with_columns(_drives=pl.lit(True)), on=["rank", "tid"], how="left")
    host_rows = tagged.filter(pl.col("_comm") | (pl.col("_drives").fill_null(False)
                                                  & ~pl.col("_step"))).select(
        "rank", pl.col("tid").cast(pl.Int64), "ts_ns",
        end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
        name=pl.col("name").cast(pl.String), gpu_compute=pl.lit(False), gpu_comm=pl.lit(False),
        host_comm="_comm", loader=pl.col("_loader") & ~pl.col("_comm"),
        # NVTX ranges are annotations, never work; record_function ranges are the host's
        # on a GPU rank (Python between launches) but not where a CPU rank blocks in gloo
        host=~pl.col("_comm") & (pl.col("kind").cast(pl.String) != "nvtx"),
        sync=pl.col("_sync") | (pl.col("kind").cast(pl.String) == "sync"),
        annotation=pl.col("kind").cast(pl.String).is_in(["user_annotation", "nvtx"])
        & ~pl.col("_loader") & ~pl.col("_comm"))
    return pl.concat([kernels, host_rows]).sort("rank", "ts_ns")


def compute_busy(act: pl.DataFrame, gpu_ranks: set[int]) -> pl.DataFrame:
    """Merged ``rank, ts_ns, end_ns`` of each rank's compute: GPU compute kernels on a rank
    with GPU work, host ops otherwise (what hides a collective's end)."""
    on_gpu = pl.col("rank").is_in(sorted(gpu_ranks))
    rows = act.filter(pl.when(on_gpu).then(pl.col("gpu_compute")).otherwise(pl.col("host")))
    return union(rows.select("rank", "ts_ns", "end_ns"), by=["rank"])


def wait_intervals(act: pl.DataFrame) -> pl.DataFrame:
    """Merged ``rank, ts_ns, end_ns`` where each rank waits: a communication call or kernel is
    in flight and the rank does no work of its own (GPU compute kernels; host ops, not
    syncs, where the GPU runs nothing: the host runs ahead of the GPU). Everything else,
    idle included, is the rank's own time."""
    def merged(cond: pl.Expr) -> pl.DataFrame:
        return union(act.filter(cond).select("rank", "ts_ns", "end_ns"), by=["rank"])

    seg = sweep({"compute": merged(pl.col("gpu_compute")),
                 "gpu": merged(pl.col("gpu_compute") | pl.col("gpu_comm")),
                 "host": merged(pl.col("host") & ~pl.col("sync") & ~pl.col("annotation")),
                 "comm": merged(pl.col("gpu_comm") | pl.col("host_comm"))}, by=["rank"])
    bit = {name: (pl.col("mask") & (1 << i)) != 0
           for i, name in enumerate(("compute", "gpu", "host", "comm"))}
    own_work = bit["compute"] | (bit["host"] & ~bit["gpu"])
    return union(seg.filter(bit["comm"] & ~own_work).select(
        "rank", ts_ns="seg_start_ns", end_ns="seg_end_ns"), by=["rank"])


_BITS = ("gpu_compute", "gpu_comm", "host_comm", "loader", "host", "host_op")


def pieces(segments: pl.DataFrame, act: pl.DataFrame, gpu_ranks: set[int]) -> pl.DataFrame:
    """The path cut into elementary pieces (``PIECE_SCHEMA``), each with its category and the
    op, kernel or collective behind it. Together they tile the path exactly."""
    local = segments.filter(pl.col("kind") == "local").with_row_index("segment").select(
        "rank", "segment", window_start_ns="start_ns", window_end_ns="end_ns")
    flags = {b: pl.col(b) for b in _BITS if b != "host_op"}
    flags["host_op"] = pl.col("host") & ~pl.col("annotation")
    swept = windowed_sweep(act, local, flags, by=["rank"],
                           window_keys=["segment"]) if local.height else pl.DataFrame(
        schema={"rank": pl.Int32, "segment": pl.UInt32, "seg_start_ns": pl.Int64,
                "seg_end_ns": pl.Int64, "mask": pl.Int64})
    busy = swept.select("rank", start_ns="seg_start_ns", end_ns="seg_end_ns",
                        category=_category(gpu_ranks))
    gaps = _uncovered(local, busy)
    named = _named(busy, act, gpu_ranks)
    transfer = segments.filter(pl.col("kind") == "transfer").select(
        "rank", "start_ns", "end_ns", category=pl.lit("communication_transfer"), name="name",
        instance="instance")
    parts = [named, gaps.with_columns(category=pl.lit("idle"), name=pl.lit("(idle)"),
                                      instance=pl.lit(None, pl.String)), transfer]
    return pl.concat([p.select(list(PIECE_SCHEMA)).cast(PIECE_SCHEMA) for p in parts]) \
        .sort("start_ns", "rank")


def _category(gpu_ranks: set[int]) -> pl.Expr:
    bit = {b: (pl.col("mask") & (1 << i)) != 0 for i, b in enumerate(_BITS)}
    comm = bit["gpu_comm"] | bit["host_comm"]
    on_gpu = pl.col("rank").is_in(sorted(gpu_ranks))
    gpu_rank = (pl.when(bit["gpu_compute"]).then(pl.lit("compute"))
                .when(comm).then(pl.lit("communication_wait"))
                .when(bit["loader"]).then(pl.lit("data_loading"))
                .when(bit["host"]).then(pl.lit("launch_host")).otherwise(pl.lit("idle")))
    # a CPU rank inside a record_function range alone while a collective (gloo) is in flight
    # is blocked in it: waiting, not compute
    cpu_rank = (pl.when(bit["loader"]).then(pl.lit("data_loading"))
                .when(bit["host_op"]).then(pl.lit("compute"))
                .when(comm).then(pl.lit("communication_wait"))
                .when(bit["host"]).then(pl.lit("compute")).otherwise(pl.lit("idle")))
    return pl.when(on_gpu).then(gpu_rank).otherwise(cpu_rank)


def _uncovered(windows: pl.DataFrame, busy: pl.DataFrame) -> pl.DataFrame:
    """``rank, start_ns, end_ns``: the parts of the local stretches where nothing runs."""
    if windows.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64})
    merged = union(busy.select("rank", ts_ns="start_ns", end_ns="end_ns"), by=["rank"])
    bounds = windows.select("rank", "segment", "window_start_ns", "window_end_ns")
    # complement wants each group's intervals in time order; clip returns them in its own
    inside = clip(merged, bounds, by=["rank"], window_keys=["segment"]).sort(
        "rank", "segment", "ts_ns")
    gaps = complement(inside, by=["rank", "segment"], bounds=bounds)
    return gaps.select(pl.col("rank").cast(pl.Int32), start_ns="gap_start_ns",
                       end_ns="gap_end_ns")


def _named(busy: pl.DataFrame, act: pl.DataFrame, gpu_ranks: set[int]) -> pl.DataFrame:
    """``busy`` pieces with the name of what runs in each: the kernel on a GPU rank's compute,
    the communication call in a wait, else the innermost host op (as-of joins, no loop
    over events)."""
    on_gpu = pl.col("rank").is_in(sorted(gpu_ranks))
    kernel = on_gpu & (pl.col("category") == "compute")
    wait = pl.col("category") == "communication_wait"
    parts = [
        _latest_started(busy.filter(kernel), act.filter(pl.col("gpu_compute"))),
        _latest_started(busy.filter(wait), act.filter(pl.col("gpu_comm") | pl.col("host_comm"))),
        _innermost(busy.filter(~kernel & ~wait), act.filter(pl.col("host"))),
    ]
    return pl.concat(parts).with_columns(pl.col("name").fill_null("(unnamed)"),
                                         instance=pl.lit(None, pl.String))


def _latest_started(p: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """The row of ``rows`` (same rank) that started last at or before each piece's start,
    if still running: with the streams' work nested or one at a time, what runs in it."""
    right = rows.select("rank", _ts="ts_ns", _end="end_ns", name="name").sort("_ts")
    hit = p.sort("start_ns").join_asof(right, left_on="start_ns", right_on="_ts", by="rank",
                                       strategy="backward", check_sortedness=False)
    return hit.with_columns(name=pl.when(pl.col("_end") > pl.col("start_ns"))
                            .then(pl.col("name"))).drop("_ts", "_end")


def _innermost(p: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """The innermost op running at each piece's start, from the one op tree
    (``analyses/op_tree.py``) of each thread; of the rank's threads, the op that started
    last is what the path waits for."""
    if p.height == 0 or ops.height == 0:
        return p.with_columns(name=pl.lit(None, pl.String))
    thread = ("rank", "tid")
    rows = ops.select(*thread, "ts_ns", "name", dur_ns=pl.col("end_ns") - pl.col("ts_ns"))
    tree = op_tree(rows, thread=thread)
    each = p.with_row_index("_piece").join(rows.select(*thread).unique(), on="rank")
    open_at = innermost_open(each, rows, tree, at="start_ns", thread=thread)
    found = rows.select("ts_ns", _name="name", _tid="tid").with_row_index("op_idx")
    hit = (each.select("_piece", open_at).drop_nulls("op_idx")
           .join(found, on="op_idx"))
    best = hit.sort("ts_ns", "_tid").group_by("_piece").agg(name=pl.col("_name").last())
    return p.with_row_index("_piece").join(best, on="_piece", how="left").drop("_piece")


# --- the whole analysis ------------------------------------------------------------------

@dataclass(frozen=True)
class CriticalPath:
    """``segments``: the walk (:func:`walk`); ``pieces``: the path's pieces with their
    ``step`` (:func:`pieces`, cut at the step boundaries, :func:`with_steps`); ``steps``: the
    step ranges, ``busy``: each rank's merged compute (:func:`compute_busy`) and ``waits``:
    where it waits on communication (:func:`wait_intervals`), all on the aligned timeline."""

    segments: pl.DataFrame
    pieces: pl.DataFrame
    steps: pl.DataFrame
    busy: pl.DataFrame
    waits: pl.DataFrame


def critical_path(collective_rows: pl.DataFrame, steps: pl.DataFrame, gpu: pl.DataFrame,
                  host: pl.DataFrame, *, offsets: pl.DataFrame | None = None,
                  options: PathOptions = DEFAULT_OPTIONS) -> CriticalPath:
    """The critical path of a run (module docstring). ``collective_rows`` are on the aligned
    timeline already; ``steps`` (``window.step_spans``), ``gpu`` (``prepared_gpu``) and
    ``host`` (``host_events``) on each rank's clock, moved onto it with ``offsets``."""
    gpu, host = _aligned(gpu, offsets), _aligned(host, offsets)
    steps = _aligned(steps.rename({"step_start_ns": "ts_ns"}), offsets).with_columns(
        step_end_ns=pl.col("ts_ns") + pl.col("step_time_ns")).rename(
        {"ts_ns": "step_start_ns"}).with_columns(pl.col("rank").cast(pl.Int32))
    act = activity(gpu, host, options=options)
    gpu_ranks = set(gpu.get_column("rank").unique().to_list()) if gpu.height else set()
    bounds = span_bounds(steps) if steps.height else act.group_by("rank").agg(
        first_ns=pl.col("ts_ns").min(), last_ns=pl.col("end_ns").max()).sort("rank")
    busy = compute_busy(act, gpu_ranks)
    segments = walk(candidates(collective_rows, busy), bounds)
    return CriticalPath(segments, with_steps(pieces(segments, act, gpu_ranks), steps), steps,
                        busy, wait_intervals(act))


def _aligned(frame: pl.DataFrame, offsets: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` with ``ts_ns`` on the aligned timeline (durations kept)."""
    if offsets is None or offsets.height == 0 or frame.height == 0:
        return frame

    return apply_offsets(frame, offsets).with_columns(ts_ns="ts_aligned_ns").drop(
        "ts_aligned_ns").collect()


def with_steps(p: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``p`` cut at step boundaries, with ``step``. Step *s* of the path runs from the median
    start of step *s* across ranks to that of step *s + 1* (the host's time between two steps
    belongs to the earlier one); time before the first or after the last belongs to them.
    Time between two profiling windows (a step number missing) belongs to none: it is left
    out.
    Without steps: ``step`` is null (the whole window is one stretch)."""
    if steps.height == 0:
        return p.with_columns(step=pl.lit(None, pl.Int64))
    median = pl.col("step_start_ns").median().round(0).cast(pl.Int64)
    w = (steps.group_by("step").agg(window_start_ns=median, _end=pl.col("step_end_ns").median()
                                     .round(0).cast(pl.Int64)).sort("step")
         # a step runs into the next one; before a missing step number (the profiler was off
         # between two windows of a schedule with repeat) it ends where it ends
         .with_columns(window_end_ns=pl.when(pl.col("step").shift(-1) == pl.col("step") + 1)
                       .then(pl.col("window_start_ns").shift(-1)).otherwise(pl.col("_end")))
         .with_columns(window_end_ns=pl.when(pl.int_range(pl.len()) == pl.len() - 1)
                       .then(pl.lit(_FAR_NS)).otherwise(pl.col("window_end_ns")))
         .with_columns(window_start_ns=pl.when(pl.int_range(pl.len()) == 0)
                       .then(pl.lit(-_FAR_NS)).otherwise(pl.col("window_start_ns"))))
    return clip(p, w.drop("_end"), start="start_ns", end="end_ns", window_keys=["step"]).with_columns(
        pl.col("step").cast(pl.Int64)).sort("start_ns", "rank")
