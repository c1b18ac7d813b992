"""The replay's graph: each rank's threads as queues of points in program order, and the
dependencies between queues and ranks.

Definitions with a worked example: ``docs/metrics.md``, section *Replay*. A **point** is an
instant on one queue (a rank's thread) where something else can hold the queue up:

=============== ===========================================================================
``step_start``   a ``ProfilerStep#N`` marker starts (``step_end``: it ends)
``issue``        a host call enqueues a communication op that runs on another thread (the
                 c10d dispatcher op of gloo's worker-thread collectives)
``arrive``       a communication op starts on its own queue: the rank is ready
``complete``     it ends: a collective at its instance's last arrival plus the transfer,
                 a recv at the later of its send and itself plus the transfer
``wait``         a thread resumes after being blocked on a communication op of its rank
                 (found by :mod:`.waits`: DDP's reducer inside ``backward``, ``Work.wait()``)
=============== ===========================================================================

Between two consecutive points of a queue lies the queue's **work** (``work_ns``): measured
time, ops and uncovered gaps alike, less any time the queue was blocked; it is replayed as
it is. Everything a point waits for is an **edge** (``EDGE_SCHEMA``) from another node: an
issue to its op's arrival (with the measured enqueue lag), every member's arrival to the
instance's node (lag 0), the instance's node to each waiting member's completion (lag: the
instance's **transfer**, the median over its members of end minus last arrival, so the
replay of the measured run is not exact by construction), and an op's completion to the
wait that ends at it (with the measured resume lag).

A point's **stretch** is the run of work since the last point that is not a ``wait`` (an
*anchor*: present on every rank running the same program), keyed across ranks by the
queue's role, the step, the anchor's ordinal in the step and its label; ``typical``
scenarios (:mod:`.scenarios`) compare ranks stretch by stretch.

>>> import polars as pl
>>> ops = pl.DataFrame({"rank": [0, 0, 1, 1], "tid": [1, 1, 1, 1],
...     "name": ["ProfilerStep#1", "gloo:all_reduce"] * 2, "ts_ns": [0, 40, 0, 10],
...     "end_ns": [100, 60, 100, 60], "collective": [None, "all_reduce"] * 2})
>>> comm = pl.DataFrame({"instance": ["a", "a"], "rank": [0, 1], "collective": "all_reduce",
...     "name": "gloo:all_reduce", "arrival_ns": [40, 10], "end_ns": [60, 60]})
>>> g = build_graph(ops, comm)
>>> g.points.select("rank", "kind", "t_ns", "work_ns").rows()[:4]
[(0, 'step_start', 0, 0), (0, 'arrive', 40, 40), (0, 'complete', 60, 0), (0, 'step_end', 100, 40)]
>>> g.edges.filter(pl.col("kind") == "transfer").get_column("lag_ns").to_list()
[20, 20]
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceview.schema import GPU_KINDS, RUNTIME_KINDS, STEP_PATTERN

from .waits import NAME_CODE, WaitOptions, find_waits, name_codes, named

POINT_SCHEMA: dict[str, pl.DataType] = {
    "point": pl.Int64, "rank": pl.Int32, "tid": pl.Int64, "t_ns": pl.Int64,
    "kind": pl.String, "instance": pl.String, "collective": pl.String, "prev": pl.Int64,
    "work_from_ns": pl.Int64, "work_to_ns": pl.Int64, "work_ns": pl.Int64,
    "blocked_ns": pl.Int64, "step": pl.Int64, "role": pl.String, "stretch": pl.String,
    "correlation": pl.Int64,
}
EDGE_SCHEMA: dict[str, pl.DataType] = {
    "src": pl.Int64, "dst": pl.Int64, "lag_ns": pl.Int64, "kind": pl.String,
    "instance": pl.String,
}
INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "node": pl.Int64, "collective": pl.String,
    "last_arrival_ns": pl.Int64, "transfer_ns": pl.Int64, "n_ranks": pl.UInt32,
}

#: Order of points at one instant on one queue: what ends before what begins.
_KIND_ORDER = {"complete": 0, "kernel": 0, "wait": 1, "step_end": 2, "step_start": 3,
               "issue": 4, "launch": 4, "arrive": 5}
#: The points every rank running the same program has: they delimit the stretches.
_ANCHORS = ("step_start", "step_end", "issue", "arrive", "complete")
#: Collectives a backend may run as another (gloo's reduce_scatter is an all_reduce).
_FAMILY = {"reduce_scatter": "all_reduce"}
#: Host calls that enqueue a collective for another thread (gloo's worker, a GPU stream).
_DISPATCH = r"^(c10d::|record_param_comms$)"


@dataclass(frozen=True)
class ReplayGraph:
    """Points (``POINT_SCHEMA``, ``point`` = row), edges between nodes (``EDGE_SCHEMA``;
    nodes are the points, then one per instance), instances (``INSTANCE_SCHEMA``), and the
    ops the graph was built from (``rank, tid, kind, name, ts_ns, end_ns``: scenarios read them)."""

    points: pl.DataFrame
    edges: pl.DataFrame
    instances: pl.DataFrame
    ops: pl.DataFrame

    @property
    def n_nodes(self) -> int:
        return self.points.height + self.instances.height


def build_graph(ops: pl.DataFrame, collective_rows: pl.DataFrame,
                p2p_pairs: pl.DataFrame | None = None, *,
                stream_waits: pl.DataFrame | None = None,
                options: WaitOptions = WaitOptions(),
                transfers: str = "typical") -> ReplayGraph:
    """The graph of one window, on the aligned timeline.

    ``ops``: host ops, ``rank, tid, name, ts_ns, end_ns, collective`` (aligned; the step
    markers among them). ``collective_rows``: one row per (instance, rank) of a matched
    collective, ``instance, rank, collective, name, arrival_ns, end_ns``
    (:func:`~traceview.analyses.collectives.collective_ranks`). ``p2p_pairs``:
    :func:`~traceview.analyses.p2p.pair_p2p` pairs. ``stream_waits``:
    :func:`~traceview.analyses.stream_waits.stream_waits` rows (aligned): a stream's first op
    queued after a ``cudaStreamWaitEvent`` starts after the last op queued on the other
    stream before the event's record.

    ``transfers``: ``typical`` (each member completes the instance's typical transfer after
    its last arrival, ``_with_transfers``: what every answer uses) or ``own`` (each member's
    own measured completion: the replay of the measured run is then exact wherever the graph
    is consistent, so the error left is a wrong edge, never the transfer model;
    ``benchmarks/replay_error.py`` reports both)."""
    if transfers not in ("typical", "own"):
        raise ValueError(f"transfers must be 'typical' or 'own', not {transfers!r}")
    ops = _queued(ops)
    comm, detached = _detach_async(_comm_rows(collective_rows, p2p_pairs, ops), ops)
    comm = _with_transfers(comm, own=transfers == "own") if comm.height else comm.with_columns(
        last=pl.lit(None, pl.Int64), transfer_ns=pl.lit(None, pl.Int64))
    instances = _instances(comm)
    issues = pl.concat([_issues(ops, comm.join(detached.select("instance", "rank"),
                                               on=["instance", "rank"], how="anti")),
                        detached])
    launches = _launches(ops)
    completes = comm.select("instance", "rank", "tid", end_ns="end_ns", ready_ns="last",
                            issued_ns=pl.coalesce(
                                comm.join(issues, on=["instance", "rank"], how="left")
                                .get_column("issue_ns"), pl.col("arrival_ns")))
    host = ops.filter(pl.col("tid") >= 0)
    # a host thread waits on a GPU op only inside a sync call (below): NCCL kernels run
    # while the host goes on launching
    waits = find_waits(host, completes.filter(pl.col("tid") >= 0), options=options)
    if launches.height:  # a host sync waits for the GPU work launched before it
        gpu_done = launches.select(instance=pl.format("gpu#{}", "correlation"), rank="rank",
                                   tid="tid", end_ns="end_ns", issued_ns="launch_ns")
        syncs = host.filter(named(host, options.sync_pattern))
        waits = pl.concat([waits, find_waits(syncs, gpu_done, options=options)])
    waits = pl.concat([waits, _unseen_waits(host, waits, completes, issues)])
    points = _points(ops, comm, issues, waits, launches)
    points = _with_work(points)
    points = _with_stretches(points, ops)
    waited = _stream_wait_edges(stream_waits, launches, points) \
        if stream_waits is not None and stream_waits.height and launches.height \
        else pl.DataFrame(schema=EDGE_SCHEMA)
    points = _without_waited_gaps(points, waited)
    edges = pl.concat([_edges(points, comm, instances, launches), waited])
    return ReplayGraph(points, edges, instances,
                       ops.select("rank", "tid", "kind", "name", "ts_ns", "end_ns"))


def _queued(ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with one queue id per thread and GPU stream: a host op's ``tid``, a GPU op's
    ``-1 - stream`` (negative: never a thread's), and each name's code (``NAME_CODE``: the
    name tests below hash integers)."""
    has = set(ops.columns)
    kind = pl.col("kind").cast(pl.String) if "kind" in has else pl.lit("cpu_op")
    gpu = kind.is_in(list(GPU_KINDS))
    stream = pl.col("stream").cast(pl.Int64) if "stream" in has else pl.lit(None, pl.Int64)
    corr = pl.col("correlation").cast(pl.Int64) if "correlation" in has else \
        pl.lit(None, pl.Int64)
    tid = pl.col("tid").cast(pl.Int64).fill_null(0)
    return ops.select(
        pl.col("rank").cast(pl.Int32),
        tid=pl.when(gpu).then(-1 - pl.coalesce(stream, tid)).otherwise(tid),
        kind=kind, name=pl.col("name").cast(pl.String), ts_ns=pl.col("ts_ns").cast(pl.Int64),
        end_ns=pl.col("end_ns").cast(pl.Int64),
        collective=(pl.col("collective").cast(pl.String) if "collective" in has
                    else pl.lit(None, pl.String)),
        correlation=corr, **{NAME_CODE: name_codes(pl.col("name"))}).sort("rank", "tid", "ts_ns")


def _by_thread_in_time(frame: pl.DataFrame, time: str) -> pl.DataFrame:
    """``frame`` ready for an asof join ``by=["rank", "tid"]`` on ``time``: each thread's rows
    in time order, which is all such a join reads (Polars scans each ``by`` group's rows in
    their order). The graph's ops are in that order already (``_queued``), so the global sort
    by time that the join would otherwise need (the largest sort of a big run's graph) is
    skipped where a pass over the rows shows it; other input is sorted by time."""
    step = pl.col("rank").diff().fill_null(0)
    tid_step = pl.col("tid").diff().fill_null(0)
    ordered = frame.select(
        ((step > 0) | ((step == 0) & (tid_step > 0))
         | ((step == 0) & (tid_step == 0) & (pl.col(time).diff().fill_null(0) >= 0))).all()
        & (pl.col(time).null_count() == 0)).item()
    return frame if ordered else frame.sort(time)


def _unseen_waits(host: pl.DataFrame, waits: pl.DataFrame, completes: pl.DataFrame,
                  issues: pl.DataFrame) -> pl.DataFrame:
    """Waits the measured run did not show: where other ranks waited on an instance, a rank
    that did not (its op had completed before it got there: the slow rank's own all-reduce)
    still depends on it (a collective: a sender never waits for its receiver's recv). Its
    issuing thread gets a wait of nothing blocked at its first op
    boundary at or after the op's completion, so a replay where the op completes later holds
    the thread there. (The measured run's position: a later completion may in truth be
    waited on later in the program; this is the conservative place.)"""
    waited = waits.filter(~pl.col("instance").str.starts_with("gpu#")
                          & ~pl.col("instance").str.starts_with("p2p ")).select(
        "instance").unique()
    if waited.height == 0 or issues.height == 0:
        return pl.DataFrame(schema=waits.schema)
    missing = completes.drop("tid").join(waited, on="instance").join(
        waits.select("instance", "rank"), on=["instance", "rank"], how="anti").join(
        issues.select("instance", "rank", tid="issue_tid"), on=["instance", "rank"])
    if missing.height == 0:
        return pl.DataFrame(schema=waits.schema)
    bounds = pl.concat([host.select("rank", "tid", b="ts_ns"),
                        host.select("rank", "tid", b="end_ns")]).sort("b")
    found = missing.select("instance", "rank", "tid", e="end_ns").sort("e").join_asof(
        bounds, left_on="e", right_on="b", by=["rank", "tid"], strategy="forward",
        check_sortedness=False)
    return found.filter(pl.col("b").is_not_null()).select(
        "rank", "tid", t_ns="b", instance="instance", blocked_ns=pl.lit(0, pl.Int64)) \
        .cast(waits.schema)


def _launches(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per GPU op with its launch: ``rank, tid`` (its stream's queue),
    ``correlation, ts_ns, end_ns``, the launching thread ``launch_tid`` and time
    ``launch_ns``, and ``lag_ns``: how long after its launch it could start, the measured
    delay capped at the rank's typical delay when the stream was idle (a kernel queued behind
    others waited for them, which the stream's order replays); ``gap_ns``: for a kernel
    queued behind the stream's previous op, the device's gap between that op's end and its
    start (1-3 µs a kernel: lost, a step of 20 kernels replays 40 µs short), capped at the
    rank's typical queued gap (a longer one waited for something the trace does not show: a
    missing stream wait stays replay error, not kept as work)."""
    gpu = ops.filter(pl.col("tid") < 0)
    if gpu.height == 0 or gpu.get_column("correlation").null_count() == gpu.height:
        return pl.DataFrame(schema={"rank": pl.Int32, "tid": pl.Int64, "correlation": pl.Int64,
                                    "ts_ns": pl.Int64, "end_ns": pl.Int64, "name": pl.String,
                                    "launch_tid": pl.Int64, "launch_ns": pl.Int64,
                                    "lag_ns": pl.Int64, "gap_ns": pl.Int64})
    calls = ops.filter(pl.col("kind").is_in(list(RUNTIME_KINDS))
                       & pl.col("correlation").is_not_null()).select(
        "rank", "correlation", launch_tid="tid", launch_ns="ts_ns")
    found = gpu.join(calls.unique(["rank", "correlation"]), on=["rank", "correlation"])
    prev_end = pl.col("end_ns").shift(1).over("rank", "tid")
    found = found.sort("rank", "tid", "ts_ns").with_columns(
        delay=(pl.col("ts_ns") - pl.col("launch_ns")).clip(0),
        idle=prev_end.fill_null(0) <= pl.col("launch_ns"),
        gap=(pl.col("ts_ns") - prev_end).clip(0))
    typical = found.group_by("rank").agg(
        cap=pl.col("delay").filter("idle").median(),
        gap_cap=pl.col("gap").filter(~pl.col("idle")).median())
    return found.join(typical, on="rank", how="left").select(
        "rank", "tid", "correlation", "ts_ns", "end_ns", "name", "launch_tid", "launch_ns",
        lag_ns=pl.min_horizontal("delay", pl.col("cap").fill_null(0)).round(0).cast(pl.Int64),
        gap_ns=pl.when(pl.col("idle")).then(0).otherwise(
            pl.min_horizontal(pl.col("gap").fill_null(0), pl.col("gap_cap").fill_null(0)))
        .round(0).cast(pl.Int64))


def _comm_rows(collective_rows: pl.DataFrame, p2p_pairs: pl.DataFrame | None,
               ops: pl.DataFrame) -> pl.DataFrame:
    """One row per (instance, rank): ``tid`` (the thread the op ran on, found by its start
    and name among ``ops``), ``arrival_ns, end_ns``, ``waits`` (true: gloo's and NCCL's
    sends are rendezvous, the sender completes once its receiver has posted) and ``dir`` (a p2p instance's ``src->dst``, for its transfer)."""
    cols = ["instance", "rank", "collective", "name", "arrival_ns", "end_ns", "waits", "dir",
            "own_ns", "peer_end_ns"]
    parts = []
    if collective_rows.height:
        parts.append(collective_rows.select(
            pl.col("instance").cast(pl.String), pl.col("rank").cast(pl.Int32),
            pl.col("collective").cast(pl.String), pl.col("name").cast(pl.String),
            pl.col("arrival_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
            waits=pl.lit(True), dir=pl.lit(None, pl.String), own_ns=pl.lit(0, pl.Int64),
            peer_end_ns=pl.lit(None, pl.Int64)))
    if p2p_pairs is not None and p2p_pairs.height:
        direction = pl.format("{}->{}", "src", "dst")
        # a send's own time: its call less the time before its receiver arrived (the
        # rendezvous wait, replayed); what is left (the sender descheduled) stays its own
        send_dur = pl.col("send_end_ns") - pl.col("send_ns")
        send_own = send_dur - (pl.col("recv_ns") - pl.col("send_ns")).clip(0).clip(None, send_dur)
        for side, rank, start, end in (("send", "src", "send_ns", "send_end_ns"),
                                       ("recv", "dst", "recv_ns", "recv_end_ns")):
            parts.append(p2p_pairs.select(
                pl.col("instance").cast(pl.String), pl.col(rank).cast(pl.Int32).alias("rank"),
                collective=pl.lit(side), name=pl.lit(None, pl.String),
                arrival_ns=pl.col(start).cast(pl.Int64), end_ns=pl.col(end).cast(pl.Int64),
                waits=pl.lit(True), dir=direction,
                own_ns=(send_own if side == "send" else pl.lit(0)).cast(pl.Int64),
                peer_end_ns=pl.col("recv_end_ns" if side == "send" else "send_end_ns")
                .cast(pl.Int64)))
    if not parts:
        return pl.DataFrame(schema={"instance": pl.String, "rank": pl.Int32,
                                    "collective": pl.String, "name": pl.String,
                                    "arrival_ns": pl.Int64, "end_ns": pl.Int64,
                                    "waits": pl.Boolean, "dir": pl.String, "own_ns": pl.Int64,
                                    "peer_end_ns": pl.Int64, "tid": pl.Int64})
    comm = pl.concat(parts).select(cols)
    # the op's thread: the op (of that name, for a collective) starting at its arrival; a
    # merged call or a p2p dispatcher op may not start exactly there: the nearest start
    named = comm.sort("arrival_ns").join_asof(
        ops.select("rank", "tid", "ts_ns").sort("ts_ns"),
        left_on="arrival_ns", right_on="ts_ns", by="rank", strategy="nearest",
        check_sortedness=False)
    return named.select(*cols, "tid").sort("rank", "arrival_ns")


#: A rank's systematic lead on its instances' median transfer needs this many instances.
MIN_LEAD_INSTANCES = 4
#: Queue ids of async ops on their own queue start here (above any thread id).
_OWN_QUEUE = 1 << 48
#: Names of communication calls and their backend work items (never another op's work).
_COMM_NAME = r"^(gloo|mpi|ucc|nccl):|^c10d::|^record_param_comms$|(?i)nccl"


def _detach_async(comm: pl.DataFrame, ops: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Ops that ran asynchronously on the thread that issued them (an ``isend``/``irecv``
    whose work item spans until ``wait()``, while the thread computes): their own thread
    did other work between their start and end, so their arrival and completion go on a
    queue of their own, issued by the thread at their start (lag 0); the thread's
    ``wait()`` is then found as any hidden wait. Returns the comm rows (those moved with
    their own queue id) and the issues of the moved ones."""
    schema = {"instance": pl.String, "rank": pl.Int32, "issue_tid": pl.Int64,
              "issue_ns": pl.Int64}
    # only on threads that issue communication (a backend's worker thread runs its work
    # items' own ops inside them: children, not other work)
    issuing = ops.filter(named(ops, _DISPATCH)).select("rank", "tid").unique()
    work = ops.select("rank", "tid", next_ns="ts_ns", _comm=named(ops, _COMM_NAME)) \
        .filter(~pl.col("_comm") & (pl.col("tid") >= 0)).drop("_comm") \
        .join(issuing, on=["rank", "tid"], how="semi")
    work = _by_thread_in_time(work, "next_ns")
    if comm.height == 0 or work.height == 0:
        return comm, pl.DataFrame(schema=schema)
    found = comm.with_row_index("_row").sort("arrival_ns").join_asof(
        work, left_on="arrival_ns", right_on="next_ns", by=["rank", "tid"],
        strategy="forward", allow_exact_matches=False, check_sortedness=False).sort("_row")
    moved = (pl.col("next_ns") < pl.col("end_ns")).fill_null(False) & (pl.col("tid") >= 0)
    found = found.with_columns(_moved=moved)
    detached = found.filter(pl.col("_moved")).select(
        "instance", "rank", issue_tid="tid", issue_ns="arrival_ns").cast(schema)
    # an async send's recorded end is its wait()'s return: it was complete once its
    # receiver had the data, if that was earlier
    sent = pl.col("_moved") & (pl.col("collective") == "send") & pl.col("peer_end_ns").is_not_null()
    end = pl.when(sent).then(pl.min_horizontal("end_ns", "peer_end_ns")).otherwise(pl.col("end_ns"))
    out = found.with_columns(
        tid=pl.when(pl.col("_moved")).then(_OWN_QUEUE + pl.col("_row").cast(pl.Int64))
        .otherwise(pl.col("tid")),
        own_ns=pl.when(sent).then(pl.lit(0, pl.Int64)).otherwise(pl.col("own_ns")),
        end_ns=end).drop("_row", "next_ns", "_moved")
    return out, detached


def _with_transfers(comm: pl.DataFrame, *, own: bool = False) -> pl.DataFrame:
    """``comm`` with each member's ``transfer_ns``, its completion after the last arrival:
    at a collective the median over the instance's members of end minus last arrival, plus
    the rank's systematic lead on it (the median over the rank's instances of the same
    collective: a ring's last rank ends last every time); at a send or recv the median over
    the window's exchanges of the same direction and side. Neither is one member's own
    (which would replay exactly by construction; ``own`` asks for that, to tell the transfer
    model's error from the graph's)."""
    per = comm.with_columns(last=pl.col("arrival_ns").max().over("instance"))
    if own:
        return per.with_columns(transfer_ns=(pl.col("end_ns") - pl.col("last")).clip(0))
    own_ns = (pl.col("end_ns") - pl.col("last")).clip(0)
    key = pl.when(pl.col("dir").is_null()).then(pl.col("instance")) \
        .otherwise(pl.col("dir") + ":" + pl.col("collective"))
    per = per.with_columns(_key=key, _own=own_ns).with_columns(
        _typ=pl.col("_own").median().over("_key"))
    # a rank's systematic place in the completion order (a ring's last rank ends last every
    # time): the median over its instances of the same collective of its lead on the median
    # (from 4 instances on: fewer would copy each member's own end)
    lead = pl.col("_own") - pl.col("_typ")
    offset = pl.when(pl.len().over("rank", "collective") >= MIN_LEAD_INSTANCES) \
        .then(lead.median().over("rank", "collective")).otherwise(0)
    return per.with_columns(
        transfer_ns=pl.when(pl.col("dir").is_null()).then(pl.col("_typ") + offset)
        .otherwise(pl.col("_typ")).clip(0).round(0).cast(pl.Int64)).drop("_key", "_own", "_typ")


def _instances(comm: pl.DataFrame) -> pl.DataFrame:
    """One node per instance: its last arrival, members and median transfer."""
    if comm.height == 0:
        return pl.DataFrame(schema=INSTANCE_SCHEMA)
    inst = comm.group_by("instance").agg(
        pl.col("collective").first(), last_arrival_ns=pl.col("last").first(),
        transfer_ns=pl.col("transfer_ns").median().round(0).cast(pl.Int64),
        n_ranks=pl.col("rank").n_unique().cast(pl.UInt32))
    return inst.sort("last_arrival_ns", "instance").with_columns(
        node=pl.int_range(pl.len(), dtype=pl.Int64)).select(list(INSTANCE_SCHEMA))


def _issues(ops: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """``instance, rank, issue_tid, issue_ns``: the host call that enqueued each op that runs
    on another thread. A backend's queue is first in, first out: where a rank has as many
    dispatcher calls as ops on other threads, the k-th call issued the k-th op (by start;
    FSDP2's reduce-scatter is run by gloo as an all-reduce: kinds may differ); else the
    latest dispatcher call of the op's family started at or before the op's arrival (by kind
    alone, tpsp's reduce-scatter run as an all-reduce was paired with a data-parallel
    all-reduce call a step earlier: a 60 ms issue lag on its path)."""
    schema = {"instance": pl.String, "rank": pl.Int32, "issue_tid": pl.Int64,
              "issue_ns": pl.Int64}
    calls = ops.filter(named(ops, _DISPATCH) & pl.col("collective").is_not_null()
                       & ~pl.col("collective").is_in(["send", "recv"]))
    if calls.height == 0 or comm.height == 0:
        return pl.DataFrame(schema=schema)
    # outermost calls only (a dispatcher op nests record_param_comms)
    calls = calls.sort("rank", "tid", "ts_ns").with_columns(
        inner=pl.col("end_ns").cum_max().shift(1).over("rank", "tid") >= pl.col("end_ns"))
    calls = calls.filter(~pl.col("inner").fill_null(False)).select(
        "rank", "collective", issue_tid="tid", issue_ns="ts_ns")
    threads = calls.select("rank", tid="issue_tid").unique()
    away = comm.filter((pl.col("tid") >= 0) & (pl.col("tid") < _OWN_QUEUE)).join(
        threads, on=["rank", "tid"], how="anti")
    order = pl.int_range(pl.len()).over("rank")
    fifo_calls = calls.sort("issue_ns").with_columns(k=order)
    fifo_ops = away.sort("arrival_ns").with_columns(k=order)
    same = fifo_calls.group_by("rank").len().join(fifo_ops.group_by("rank").len(), on="rank") \
        .filter(pl.col("len") == pl.col("len_right")).select("rank")
    paired = fifo_ops.join(same, on="rank").join(
        fifo_calls.drop("collective"), on=["rank", "k"])
    # else the latest call of the op's kind, or of its family where that is later (gloo runs
    # reduce_scatter as an all_reduce: on tpsp, the kind alone paired the tensor-parallel
    # reduce-scatter's all_reduce with the previous data-parallel all_reduce call, 84 ms
    # earlier, an enqueue lag that held the thread whatever its peers did)
    family = pl.col("collective").replace(_FAMILY)
    rest = away.join(same, on="rank", how="anti").sort("arrival_ns")
    by_kind = rest.join_asof(
        calls.sort("issue_ns"), left_on="arrival_ns", right_on="issue_ns",
        by=["rank", "collective"], strategy="backward", check_sortedness=False)
    by_family = rest.with_columns(_family=family).join_asof(
        calls.with_columns(_family=family).drop("collective").sort("issue_ns"),
        left_on="arrival_ns", right_on="issue_ns", by=["rank", "_family"],
        strategy="backward", check_sortedness=False).drop("_family")
    rest = pl.concat([by_kind.select(list(schema)), by_family.select(list(schema))]) \
        .drop_nulls("issue_ns").sort("issue_ns").group_by("instance", "rank").last()
    return pl.concat([paired.select(list(schema)).cast(schema),
                      rest.select(list(schema)).cast(schema)])


def _points(ops: pl.DataFrame, comm: pl.DataFrame, issues: pl.DataFrame,
            waits: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    steps = ops.filter(named(ops, STEP_PATTERN) & (pl.col("tid") >= 0)).select(
        "rank", "tid", step=pl.col("name").str.extract(STEP_PATTERN, 1).cast(pl.Int64),
        start="ts_ns", end="end_ns")
    cols = ["rank", "tid", "t_ns", "kind", "instance", "collective", "blocked_ns", "span_ns",
            "step_mark", "correlation"]

    def part(frame: pl.DataFrame, kind: str, t: str, **extra: pl.Expr) -> pl.DataFrame:
        base = {"instance": pl.lit(None, pl.String), "collective": pl.lit(None, pl.String),
                "blocked_ns": pl.lit(0, pl.Int64), "span_ns": pl.lit(None, pl.Int64),
                "step_mark": pl.lit(None, pl.Int64), "correlation": pl.lit(None, pl.Int64)}
        base.update(extra)
        return frame.select(pl.col("rank").cast(pl.Int32), pl.col("tid").cast(pl.Int64),
                            t_ns=pl.col(t).cast(pl.Int64), kind=pl.lit(kind),
                            **base).select(cols).cast({"span_ns": pl.Int64,
                                                       "correlation": pl.Int64})

    # the GPU ops that are not a matched collective's kernel: one point at their end, their
    # duration their work; a collective's kernel is its arrive and complete points
    comm_keys = comm.select("rank", "tid", ts_ns="arrival_ns")
    kernels = launches.join(comm_keys, on=["rank", "tid", "ts_ns"], how="anti")
    comm_launch = launches.join(comm_keys, on=["rank", "tid", "ts_ns"]).select(
        "rank", "tid", "ts_ns", "correlation")
    comm = comm.join(comm_launch, left_on=["rank", "tid", "arrival_ns"],
                     right_on=["rank", "tid", "ts_ns"], how="left")
    parts = [
        part(steps, "step_start", "start", step_mark=pl.col("step")),
        part(steps, "step_end", "end", step_mark=pl.col("step")),
        part(comm, "arrive", "arrival_ns", instance=pl.col("instance"),
             collective=pl.col("collective"), correlation=pl.col("correlation")),
        part(comm, "complete", "end_ns", instance=pl.col("instance"),
             collective=pl.col("collective"), correlation=pl.col("correlation"),
             blocked_ns=pl.col("end_ns") - pl.col("arrival_ns") - pl.col("own_ns")),
        part(issues.rename({"issue_tid": "tid"}), "issue", "issue_ns",
             instance=pl.col("instance")),
        part(waits, "wait", "t_ns", instance=pl.col("instance"),
             blocked_ns=pl.col("blocked_ns")),
        part(kernels, "kernel", "end_ns", instance=pl.format("gpu#{}", "correlation"),
             span_ns=pl.col("end_ns") - pl.col("ts_ns") + pl.col("gap_ns"),
             correlation=pl.col("correlation")),
        part(launches.select("rank", "correlation", "launch_ns", tid="launch_tid"), "launch",
             "launch_ns", correlation=pl.col("correlation")),
    ]
    order = pl.col("kind").replace_strict(_KIND_ORDER, return_dtype=pl.Int8)
    # at one instant, the wait that was blocked first: a wait of nothing there adds only
    # its dependency; then by instance and correlation, so that two points of one kind at one
    # instant (two issues on a queue) keep one order from build to build
    pts = pl.concat(parts).with_columns(_o=order).sort(
        "rank", "tid", "t_ns", "_o", "blocked_ns", "instance", "correlation",
        descending=[False, False, False, False, True, False, False],
        nulls_last=True, maintain_order=True).drop("_o")
    return pts.with_columns(point=pl.int_range(pl.len(), dtype=pl.Int64))


def _with_work(points: pl.DataFrame) -> pl.DataFrame:
    """``prev`` (the queue's previous point), ``work_from_ns``/``work_to_ns``: the stretch of
    measured time replayed as work before the point. Empty where the queue only waited: an
    arrival fed by its issue or launch (a worker thread or a stream waits for work), a
    waiting member's completion (its blocked time is the whole call); a GPU op's work is its
    own duration (the stream's idle time before it waited for its launch)."""
    q = ["rank", "tid"]
    prev_t = pl.col("t_ns").shift(1).over(q)
    issued = points.filter(pl.col("kind") == "issue").select(
        "instance", "rank", _issued=pl.lit(True))
    pts = points.join(issued, on=["instance", "rank"], how="left", maintain_order="left")
    fed = (pl.col("kind") == "arrive") & (pl.col("_issued").fill_null(False)
                                          | pl.col("correlation").is_not_null())
    return pts.with_columns(prev=pl.col("point").shift(1).over(q)).with_columns(
        work_from_ns=pl.when(pl.col("span_ns").is_not_null())
        .then(pl.col("t_ns") - pl.col("span_ns")).otherwise(prev_t),
        work_to_ns=pl.when(pl.col("span_ns").is_not_null()).then(pl.col("t_ns"))
        .when(prev_t.is_null()).then(None)
        .when(fed).then(prev_t)
        .otherwise(pl.max_horizontal(prev_t, pl.col("t_ns") - pl.col("blocked_ns"))),
    ).with_columns(
        work_ns=(pl.col("work_to_ns") - pl.col("work_from_ns")).fill_null(0),
        work_from_ns=pl.col("work_from_ns").fill_null(pl.col("t_ns")),
        work_to_ns=pl.col("work_to_ns").fill_null(pl.col("t_ns")),
    ).drop("_issued").sort("point")


def _with_stretches(points: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """``step`` (the rank's step the point falls in, by the step markers' starts), ``role``
    (``main``: the step markers' thread; else ``thread``) and ``stretch``: the key that
    names the same stretch on every rank (role, step, the opening anchor's ordinal in the
    step and label)."""
    q = ["rank", "tid"]
    starts = points.filter(pl.col("kind") == "step_start").select(
        "rank", _st="t_ns", step="step_mark").sort("_st")
    # the join runs on the three columns it needs, put back in point order (``points`` is in
    # it: ``point`` is the row): sorting every column twice was most of this function's cost
    step = points.select("point", "rank", "t_ns").sort("t_ns").join_asof(
        starts, left_on="t_ns", right_on="_st", by="rank", strategy="backward",
        check_sortedness=False).sort("point").get_column("step")
    # a step's end is its own marker's, where the next step starts at the same instant too
    pts = points.with_columns(
        step=pl.when(pl.col("kind") == "step_end").then("step_mark").otherwise(step),
        _main=(pl.col("kind") == "step_start").any().over(q))
    anchor = pl.col("kind").is_in(list(_ANCHORS))
    label = pl.when(anchor).then(pl.col("kind") + ":" + pl.col("collective").fill_null(""))
    pts = pts.with_columns(
        role=pl.when(pl.col("_main").fill_null(False)).then(pl.lit("main"))
        .when(pl.col("tid") < 0).then(pl.lit("stream"))
        .when(pl.col("tid") >= _OWN_QUEUE).then(pl.lit("async")).otherwise(pl.lit("thread")),
        _n=anchor.cast(pl.Int64).cum_sum().shift(1, fill_value=0).over(q),
        _label=label.forward_fill().shift(1).over(q))
    pts = pts.with_columns(_ord=pl.col("_n") - pl.col("_n").min().over([*q, "step"]))
    stretch = pl.format("{}|{}|{}|{}", "role", "step", "_ord", pl.col("_label").fill_null(""))
    return pts.with_columns(stretch=pl.when(pl.col("step").is_null()).then(None)
                            .otherwise(stretch)).select(list(POINT_SCHEMA)).cast(POINT_SCHEMA)


def _edges(points: pl.DataFrame, comm: pl.DataFrame, instances: pl.DataFrame,
           launches: pl.DataFrame) -> pl.DataFrame:
    n = points.height
    node = instances.select("instance", inode=pl.col("node") + n)
    chain = points.filter(pl.col("prev").is_not_null()).select(
        src="prev", dst="point", lag_ns="work_ns", kind=pl.lit("queue"), instance="instance")
    arrive = points.filter(pl.col("kind") == "arrive")
    complete = points.filter(pl.col("kind") == "complete")
    issue = points.filter(pl.col("kind") == "issue")
    waits = comm.select("instance", "rank", "waits", transfer="transfer_ns")
    into = arrive.join(node, on="instance").select(
        src="point", dst="inode", lag_ns=pl.lit(0, pl.Int64), kind=pl.lit("arrive"),
        instance="instance")
    out = complete.join(waits, on=["instance", "rank"]).filter(pl.col("waits")) \
        .join(node, on="instance").select(src="inode", dst="point", lag_ns="transfer",
                                          kind=pl.lit("transfer"), instance="instance")
    issued = issue.join(arrive, on=["instance", "rank"], suffix="_a").select(
        src="point", dst="point_a", lag_ns=(pl.col("t_ns_a") - pl.col("t_ns")).clip(0),
        kind=pl.lit("issue"), instance="instance")
    done = points.filter(pl.col("kind").is_in(["complete", "kernel"]))
    resumed = points.filter(pl.col("kind") == "wait").join(
        done.select("instance", "rank", c_point="point", c_t="t_ns"),
        on=["instance", "rank"]).select(
        src="c_point", dst="point", lag_ns=pl.col("t_ns") - pl.col("c_t"), kind=pl.lit("wait"),
        instance="instance")
    # a launch to its GPU op (lag: the launch delay; the replay adds a kernel's own work)
    on = ["rank", "correlation"]
    started = points.filter(pl.col("kind") == "launch").select(*on, src="point").join(
        points.filter(pl.col("kind").is_in(["kernel", "arrive"])
                      & pl.col("correlation").is_not_null()).select(*on, "instance",
                                                                    dst="point"), on=on) \
        .join(launches.select(*on, lag_ns="lag_ns"), on=on).select(
        "src", "dst", "lag_ns", kind=pl.lit("launch"), instance="instance")
    return pl.concat([chain, into, out, issued, resumed, started]).cast(EDGE_SCHEMA)


def _without_waited_gaps(points: pl.DataFrame, waited: pl.DataFrame) -> pl.DataFrame:
    """``points`` where a GPU op that waits on another stream's event (a ``stream_wait``
    edge's destination) starts its work no earlier than the measured end of the op it waited
    for: the queued gap before it (``_launches``' ``gap_ns``) up to then was the wait, which
    the edge replays (kept as work, a compute stream waiting for an all-reduce would replay the
    wait twice); a device gap after it stays."""
    if waited.height == 0:
        return points
    ends = points.select(src="point", _end="t_ns")
    own = waited.join(ends, on="src").group_by(point="dst").agg(pl.col("_end").max())
    kernel = (pl.col("kind") == "kernel") & pl.col("_end").is_not_null()
    start = pl.max_horizontal("work_from_ns", pl.min_horizontal("_end", "t_ns"))
    return points.join(own, on="point", how="left", maintain_order="left").with_columns(
        work_from_ns=pl.when(kernel).then(start).otherwise("work_from_ns"),
        work_ns=pl.when(kernel).then(pl.col("t_ns") - start).otherwise("work_ns"),
    ).drop("_end")


def _stream_wait_edges(waits: pl.DataFrame, launches: pl.DataFrame,
                       points: pl.DataFrame) -> pl.DataFrame:
    """``cudaStreamWaitEvent`` edges: from the end of the last op launched on the waited-on
    stream at or before the event's record to the first op launched on the waiting stream at
    or after the wait call (kind ``stream_wait``; the replay adds the op's own work, as for a
    launch). A wait without its record or call in the trace gives no edge."""
    on = waits.filter((pl.col("waiter") == "stream") & pl.col("record_ts_ns").is_not_null()
                      & pl.col("call_ts_ns").is_not_null() & pl.col("stream").is_not_null()
                      & pl.col("wait_on_stream").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), src_tid=-1 - pl.col("wait_on_stream"),
        dst_tid=-1 - pl.col("stream"), record_ns="record_ts_ns", call_ns="call_ts_ns")
    if on.height == 0:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    queued = launches.select("rank", "tid", "correlation", "launch_ns").sort("launch_ns")
    src = on.sort("record_ns").join_asof(
        queued.rename({"tid": "src_tid", "correlation": "src_corr"}), left_on="record_ns",
        right_on="launch_ns", by=["rank", "src_tid"], strategy="backward",
        check_sortedness=False).drop("launch_ns")
    both = src.sort("call_ns").join_asof(
        queued.rename({"tid": "dst_tid", "correlation": "dst_corr"}), left_on="call_ns",
        right_on="launch_ns", by=["rank", "dst_tid"], strategy="forward",
        check_sortedness=False).drop_nulls(["src_corr", "dst_corr"])
    ends = points.filter(pl.col("kind").is_in(["kernel", "complete"])
                         & pl.col("correlation").is_not_null()).select(
        "rank", src_corr="correlation", src="point")
    starts = points.filter(pl.col("kind").is_in(["kernel", "arrive"])
                           & pl.col("correlation").is_not_null()).select(
        "rank", dst_corr="correlation", dst="point")
    return both.join(ends, on=["rank", "src_corr"]).join(starts, on=["rank", "dst_corr"]) \
        .select("src", "dst", lag_ns=pl.lit(0, pl.Int64), kind=pl.lit("stream_wait"),
                instance=pl.lit(None, pl.String)).unique(["src", "dst"]).cast(EDGE_SCHEMA)


__all__ = ["EDGE_SCHEMA", "INSTANCE_SCHEMA", "POINT_SCHEMA", "ReplayGraph", "build_graph"]
