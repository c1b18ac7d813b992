"""Waits that frameworks hide inside other ops, found by one framework-agnostic rule.

DDP's reducer waits for its gradient all-reduce inside ``backward`` (gloo runs it on a worker
thread); FSDP waits inside its hooks; ``Work.wait()`` of an ``isend`` or an async collective
is often no op at all. None of them is a sync point the trace names, yet the thread is
blocked on a specific communication op, and a replay that keeps that time as work keeps the
wait when the op it waited for moves.

**The rule.** A *stretch* of a thread is the time between two consecutive op boundaries (an
op's start or end): a gap no op covers, or a piece of an op's self time. A stretch at least
``min_wait_ns`` long that ends within its tolerance (``tolerance_ns``, or 5% of the stretch
up to 5 ms when larger) of the completion of a communication
op of the same rank on another thread, which was issued before the stretch ended and not
complete when it began, is a **wait** on that op: the thread resumes at the op's completion.
Its blocked part runs from the later of the stretch's start and the op's issue to the
stretch's end. A gap (no op of the thread running but its step marker) that a completion falls inside is a wait
on the latest such op too, however late the thread resumed (a descheduled thread on an
oversubscribed host): the replay keeps the resume delay as the wait's lag. So is a gap that
holds the op's last arrival (``ready_ns``: it could complete from then on) with the op not
complete before the gap: a backend's worker on a busy host records its end after the
waiting thread already resumed. Where several ops complete near one stretch end, the latest is the one waited
for; where one op ends several stretches of a thread, the longest is the wait. A gap may
also end shortly *before* the op's recorded end (``WaitOptions.early_resume_share``, at most
``max_early_resume_ns``): the backend woke the waiter before its work item's range closed;
the wait's lag is then negative.

A leaf op's whole body (an op with nothing inside it) is its own work, not a wait, unless its
name says it waits (``WaitOptions.wait_op_pattern``: ``aten::wait``, ``c10d::``, a
synchronize, a barrier): the slow rank's last backward op may well end just as its own
all-reduce completes, and that is no wait. Host time that is no such wait (a stall, data
loading, GC) stays work: a measured gap.

>>> import polars as pl
>>> ops = pl.DataFrame({"rank": [0, 0], "tid": [1, 1], "name": ["aten::mm", "opt.step"],
...     "ts_ns": [0, 900_000], "end_ns": [100_000, 950_000]})
>>> done = pl.DataFrame({"instance": ["ar"], "rank": [0], "tid": [2], "end_ns": [880_000],
...     "issued_ns": [50_000]})
>>> find_waits(ops, done).rows()
[(0, 1, 900000, 'ar', 800000)]
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceview._dependencies import lazy_module
from traceview.schema import STEP_PATTERN

np = lazy_module("numpy")

WAIT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "tid": pl.Int64, "t_ns": pl.Int64, "instance": pl.String,
    "blocked_ns": pl.Int64,
}
#: Threads that run a backend's work items (gloo's workers) but call no dispatcher op wait for
#: work, never on it.
_BACKEND_WORK = r"^(gloo|mpi|ucc):"
_DISPATCH = r"^c10d::|^record_param_comms$"


@dataclass(frozen=True)
class WaitOptions:
    """``tolerance_ns``: how far a resume may be from the completion it follows (a thread's
    wake-up on a busy host, the profiler's own records around it); ``min_wait_ns``: shorter
    stretches are work (an op's own short self time ends near some completion by chance)."""

    tolerance_ns: int = 200_000
    #: A long stretch's tolerance grows with it (up to ``max_tolerance_ns``): a thread blocked
    #: 100 ms on an oversubscribed host may take 1-2 ms to run again, and a chance
    #: completion within 5% of a long stretch's end is rare.
    relative_tolerance: float = 0.05
    max_tolerance_ns: int = 5_000_000
    min_wait_ns: int = 50_000
    #: How far before a communication op's recorded end a gap may end and still be a wait on
    #: it, as a share of the gap, up to ``max_early_resume_ns``: the backend marks the op
    #: complete and wakes the waiter before its work item's profiled range closes, and on a
    #: busy host the waiter runs first (gloo: 0.7 ms of an 8.6 ms wait on ddp1b_balanced).
    #: Short: a stall that ends on its own a few ms before an async collective's end
    #: (tpsp_stall_r3's rank 3: 2.5-3.6 ms) is the stall's own time, not a wait.
    early_resume_share: float = 0.15
    max_early_resume_ns: int = 1_000_000
    #: Whether a gap a completion falls inside is a wait however late the thread resumed.
    late_resumes: bool = True
    wait_op_pattern: str = r"(?i)wait|synchroni[sz]e|barrier|^c10d::|^record_param_comms$"
    #: The host calls that wait for the GPU (GPU work's completion is waited on only inside
    #: them: kernels complete every few microseconds, any gap ends near one).
    sync_pattern: str = (r"(?i)^(cuda|hip)(Device|Stream|Event|Ctx)Synchroni[sz]e$"
                         r"|^(cuda|hip)Memcpy(Async)?$|^cuMemcpy")


def find_waits(ops: pl.DataFrame, completes: pl.DataFrame, *,
               options: WaitOptions = WaitOptions()) -> pl.DataFrame:
    """One row per wait (``WAIT_SCHEMA``): the thread, the resume time ``t_ns``, the
    instance waited on and the blocked time. ``ops``: ``rank, tid, name, ts_ns, end_ns``;
    ``completes``: ``instance, rank, tid, end_ns, issued_ns`` (and optionally ``ready_ns``,
    the instance's last arrival) of the communication ops."""
    if ops.height == 0 or completes.height == 0:
        return pl.DataFrame(schema=WAIT_SCHEMA)
    q = ["rank", "tid"]
    # each name's verdicts once (the regexes run on the distinct names), then the ops as
    # integers and flags: every sort and join below moves these, never the names
    backend, dispatch, markers, waiting = (
        named(ops, pattern)
        for pattern in (_BACKEND_WORK, _DISPATCH, STEP_PATTERN, options.wait_op_pattern))
    ops = ops.select(
        *q, "ts_ns", "end_ns", _backend=backend, _dispatch=dispatch,
        _inner=pl.when(markers).then(0).otherwise(1).cast(pl.Int64),
        _wait=waiting.fill_null(False))
    # a backend's worker thread (its work items, their own ops inside them, no dispatcher
    # call) waits for work, never on it
    waiter = ops.group_by(q).agg(_any=~pl.col("_backend").any() | pl.col("_dispatch").any())
    ops = ops.join(waiter.filter(pl.col("_any")).select(q), on=q, how="semi")
    # every op boundary, in time order per thread, with the thread's depth after it (ops
    # running then, the step markers, which cover everything, aside): every thread's ops
    # all close, so one running sum over all threads is each one's depth
    inner = pl.col("_inner")
    bounds = _boundaries(ops, inner)
    same = (pl.col("rank") == pl.col("rank").shift(-1)) & (pl.col("tid") == pl.col("tid").shift(-1))
    stretches = bounds.with_columns(depth=pl.col("d").cum_sum(),
                                    b=pl.when(same).then(pl.col("a").shift(-1))).filter(
        pl.col("b").is_not_null() & (pl.col("b") - pl.col("a") >= options.min_wait_ns)) \
        .drop("d")
    # a leaf op's whole body is work (unless the op is a wait by name)
    ordered = ops.select(*q, "ts_ns", "end_ns", "_wait") \
        .sort(*q, "ts_ns", pl.col("end_ns"), descending=[False, False, False, True])
    later = (pl.col("rank") == pl.col("rank").shift(-1)) & (pl.col("tid") == pl.col("tid").shift(-1))
    leaf = ~later | (pl.col("ts_ns").shift(-1) >= pl.col("end_ns"))
    bodies = ordered.filter(leaf & (pl.col("end_ns") - pl.col("ts_ns") >= options.min_wait_ns)
                            & ~pl.col("_wait")).select(*q, a="ts_ns", b="end_ns")
    stretches = stretches.join(bodies, on=[*q, "a", "b"], how="anti")
    if stretches.height == 0:
        return pl.DataFrame(schema=WAIT_SCHEMA)
    tol = max(options.tolerance_ns, options.max_tolerance_ns)
    # ``ready_ns`` (optional): the earliest the op could complete, its instance's last arrival
    ready = pl.col("ready_ns") if "ready_ns" in completes.columns else pl.col("end_ns")
    done = completes.select(pl.col("rank").cast(pl.Int32), "instance", c_tid="tid", e="end_ns",
                            issued="issued_ns", r=pl.min_horizontal(ready, pl.col("end_ns")))
    # the completions within the tolerance of each stretch's end: by buckets of twice the
    # tolerance (an end probes the two buckets its window spans), linear in the rows
    width = max(2 * tol, 1)
    own_tol = pl.max_horizontal(pl.lit(options.tolerance_ns), pl.min_horizontal(
        pl.lit(options.max_tolerance_ns),
        ((pl.col("b") - pl.col("a")) * options.relative_tolerance).cast(pl.Int64)))
    # a gap (no op running) may end before the op's recorded end (``early_resume_share``)
    early_tol = pl.when(pl.col("depth") == 0).then(pl.max_horizontal(own_tol, pl.min_horizontal(
        pl.lit(options.max_early_resume_ns),
        ((pl.col("b") - pl.col("a")) * options.early_resume_share).cast(pl.Int64)))) \
        .otherwise(own_tol)
    stretches = stretches.with_columns(pl.col("rank").cast(pl.Int32), tol=own_tol,
                                       early=early_tol)
    low, high = (pl.col("b") - tol) // width, (pl.col("b") + tol) // width
    if options.min_wait_ns > 0:  # then no two stretches of a thread start together: the
        # rows are distinct, and only an end whose window is one bucket would probe it twice
        probes = pl.concat([stretches.with_columns(k=low),
                            stretches.filter(high != low).with_columns(k=high)])
    else:
        probes = pl.concat([stretches.with_columns(k=low),
                            stretches.with_columns(k=high)]).unique()
    pairs = probes.join(done.with_columns(k=pl.col("e") // width), on=["rank", "k"])
    pairs = pairs.filter((pl.col("b") - pl.col("e") <= pl.col("tol"))
                         & (pl.col("e") - pl.col("b") <= pl.col("early"))
                         & (pl.col("e") > pl.col("a")) & (pl.col("issued") < pl.col("b"))
                         & (pl.col("c_tid") != pl.col("tid")))
    best = _longest(pairs, q)
    # a gap (no op running) that an op's completion falls inside, but that ends later than the
    # tolerance: the thread was idle when the op completed and resumed late (descheduled)
    idle = stretches.filter(pl.col("depth") == 0).join(
        best.select(*q, "b"), on=[*q, "b"], how="anti") \
        if options.late_resumes else stretches.head(0)
    # (the op could complete from its last arrival on: a backend's worker on a busy host may
    # record its end after the waiting thread already resumed, so the gap need only hold
    # the last arrival, the op not complete before the gap)
    inside = idle.sort("b").join_asof(
        done.sort("r"), left_on="b", right_on="r", by="rank", strategy="backward",
        check_sortedness=False).filter(
        (pl.col("e") > pl.col("a")) & (pl.col("issued") < pl.col("r"))
        & (pl.col("c_tid") != pl.col("tid")))
    # one wait per op and thread, the longest stretch of either kind (a late-recorded end
    # also lands near some short stretch of the next step's work)
    found = pl.concat([best, inside.select(*q, "a", "b", "instance", "issued")]) \
        .sort(pl.col("b") - pl.col("a"), "b").group_by([*q, "instance"]).last()
    if found.height == 0:
        return pl.DataFrame(schema=WAIT_SCHEMA)
    return found.select(
        *q, t_ns="b", instance="instance",
        blocked_ns=pl.col("b") - pl.max_horizontal("a", "issued")).cast(WAIT_SCHEMA) \
        .sort(*q, "t_ns")


#: An optional column of ops: an integer code per distinct name (:func:`name_codes`), so that
#: name tests hash integers, not millions of strings.
NAME_CODE = "_name_code"


def name_codes(name: pl.Expr) -> pl.Expr:
    """One integer per distinct name (null for a null name): the name's categorical code."""
    return name.cast(pl.String).cast(pl.Categorical).to_physical()


def named(ops: pl.DataFrame, pattern: str) -> pl.Expr:
    """``pl.col("name").str.contains(pattern)``, the regex run once per distinct name (a run
    has thousands of names and millions of ops; nulls stay null), through the names' codes
    (``NAME_CODE``) where ``ops`` has them."""
    key = NAME_CODE if NAME_CODE in ops.columns else "name"
    names = (ops.select(key, pl.col("name").cast(pl.String)).unique(key) if key == NAME_CODE
             else ops.select(pl.col("name").cast(pl.String).unique())) \
        .filter(pl.col("name").str.contains(pattern))
    return pl.col(key).is_in(names.get_column(key).implode())


def _longest(pairs: pl.DataFrame, q: list[str]) -> pl.DataFrame:
    """The latest completion near each stretch's end; then the longest stretch per op and
    thread."""
    latest = pairs.sort("e", "instance").group_by([*q, "b"]).last()
    return latest.with_columns(len=pl.col("b") - pl.col("a")).sort("len", "b") \
        .group_by([*q, "instance"]).last().select(*q, "a", "b", "instance", "issued")


#: A thread's boundaries sort as one int64 key where the window fits: the thread's index,
#: then the time since the window's first boundary, then the depth change (-1, 0, 1: 2 bits).
_QUEUE_BITS, _TIME_BITS = 19, 42


def _boundaries(ops: pl.DataFrame, inner: pl.Expr) -> pl.DataFrame:
    """``rank, tid, a, d``: every op's start (``d`` = ``inner``) and end (``-inner``), sorted
    by thread, time and ``d``: ``concat([starts, ends]).sort("rank", "tid", "a", "d")``.

    Why not that sort: it is most of the waits' cost on a large run (a four-key sort of two
    rows per op). Where ``ops`` is in thread order (the graph's queues are), its rows number
    the threads, and each boundary is one int64 key (thread, time, ``d``) that numpy sorts in
    one pass (its stable sort runs along the two sorted runs, starts and ends) and that holds
    every column back. Nulls, a window of 2^42 ns (73 minutes) or more, or 2^19 threads take
    the four-key sort; equal keys are equal rows, so the two give the same frame."""
    q = ["rank", "tid"]
    new_queue = ((pl.col("rank") != pl.col("rank").shift(1))
                 | (pl.col("tid") != pl.col("tid").shift(1))).fill_null(True)
    step = pl.col("rank").diff().fill_null(0)
    facts = ops.select(
        in_order=((step > 0) | ((step == 0) & (pl.col("tid").diff().fill_null(0) >= 0))).all(),
        nulls=pl.sum_horizontal(pl.col(*q, "ts_ns", "end_ns").null_count()),
        queues=new_queue.sum(), lo=pl.min_horizontal("ts_ns", "end_ns").min(),
        hi=pl.max_horizontal("ts_ns", "end_ns").max()).row(0, named=True)
    if ops.height == 0 or not facts["in_order"] or facts["nulls"] \
            or facts["queues"] >= 1 << _QUEUE_BITS or facts["hi"] - facts["lo"] >= 1 << _TIME_BITS:
        return pl.concat([ops.select(*q, a="ts_ns", d=inner),
                          ops.select(*q, a="end_ns", d=-inner)]).sort(*q, "a", "d")
    cols = ops.select(_q=new_queue.cast(pl.Int64).cum_sum() - 1, _d=inner,
                      _s=pl.col("ts_ns") - facts["lo"], _e=pl.col("end_ns") - facts["lo"])
    thread, depth, start, end = (cols.get_column(c).to_numpy() for c in ("_q", "_d", "_s", "_e"))
    high = thread << (_TIME_BITS + 2)
    key = np.concatenate([high + (start << 2) + depth + 1, high + (end << 2) - depth + 1])
    key.sort(kind="stable")
    firsts = ops.filter(new_queue).select(*q)
    at = key >> (_TIME_BITS + 2)
    return pl.DataFrame({
        "rank": firsts.get_column("rank").gather(at), "tid": firsts.get_column("tid").gather(at),
        "a": ((key >> 2) & ((1 << _TIME_BITS) - 1)) + facts["lo"],
        "d": (key & 3) - 1}).cast({"a": ops.schema["ts_ns"], "d": pl.Int64})


__all__ = ["NAME_CODE", "WAIT_SCHEMA", "WaitOptions", "find_waits", "name_codes", "named"]
