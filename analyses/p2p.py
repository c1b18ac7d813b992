"""Point-to-point pairs: every send matched to its recv across ranks.

Definitions: ``docs/metrics.md``, section *Point-to-point pairs*.

1. :func:`p2p_calls` picks one row per send or recv call per rank, with its peer and tag:

   * gloo and other CPU backends: the dispatcher ops ``c10d::send`` and ``c10d::recv_``, whose
     ``Concrete Inputs`` are ``[tensors, group, peer, tag]`` (the peer is the group rank, the
     global rank on the default group); the message size comes from the backend's work item
     nested in the call (``gloo:send``/``gloo:recv``: its shape and dtype), and its end too
     when later: a blocking recv's dispatcher op returns once the work is queued, and the
     work item, in the same thread, is the exchange itself;
   * NCCL: ``record_param_comms`` rows named ``send``/``recv`` with ``Dst Rank``/``Src Rank``
     in their args, when the trace carries them (the dispatcher op around one, ``c10d::send``,
     is the same call: it gives the tag and is not counted again). On the CPU such a call
     only enqueues; its GPU kernel (``ncclDevKernel_SendRecv``, found through the runtime
     launch inside the call and its correlation id) is the exchange, and its times are the
     call's (``timing`` ``gpu``). Without its kernel the CPU times stand (``timing``
     ``enqueue``: the waits and transfers of such a pair are not the exchange's).

2. :func:`pair_p2p` pairs the k-th send from ``src`` to ``dst`` with tag ``t`` with the k-th
   recv on ``dst`` from ``src`` with tag ``t`` (messages between two ranks on one tag are
   delivered in order; "k-th" by the call's ``Seq`` when all the calls of that side carry
   one, the rank's own program order, else by start). What cannot be paired is counted per
   rank and op, never guessed.

Per pair, on the aligned timeline: the receiver's *wait* (the send arrived after the recv
was posted: ``send_ns - recv_ns``, bounded by the recv's own end), the *transfer* (from the
later of the two arrivals to the recv's end) and the bytes.

>>> import polars as pl
>>> calls = pl.DataFrame({"rank": [0, 1, 1, 0], "op": ["send", "recv", "send", "recv"],
...     "peer": [1, 0, 0, 1], "tag": [0, 0, 0, 0], "ts_ns": [50, 10, 70, 60],
...     "end_ns": [55, 58, 72, 80], "bytes": [256, None, 256, None]})
>>> pairs, unmatched = pair_p2p(calls)
>>> pairs.select("instance", "src", "dst", "recv_wait_ns", "transfer_ns", "bytes").rows()
[('p2p 0->1#0', 0, 1, 40, 8, 256), ('p2p 1->0#0', 1, 0, 10, 10, 256)]
"""

from __future__ import annotations

import polars as pl

from traceview.analyses.collective_match import shape_bytes
from traceview.analyses.launches import is_runtime_call

CALL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "tid": pl.Int64, "op": pl.String, "peer": pl.Int32, "tag": pl.Int64,
    "ts_ns": pl.Int64, "end_ns": pl.Int64, "bytes": pl.Int64, "seq": pl.Int64,
    "timing": pl.String,
}
#: How a call is timed: ``host`` (a blocking CPU call: gloo, MPI, UCC), ``gpu`` (an NCCL
#: call's kernel), ``enqueue`` (an NCCL call whose kernel is not in the trace: CPU times).
TIMINGS = ("host", "gpu", "enqueue")
PAIR_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "src": pl.Int32, "dst": pl.Int32, "tag": pl.Int64,
    "order": pl.Int64, "send_ns": pl.Int64, "send_end_ns": pl.Int64, "recv_ns": pl.Int64,
    "recv_end_ns": pl.Int64, "recv_wait_ns": pl.Int64, "transfer_ns": pl.Int64,
    "bytes": pl.Int64, "send_timing": pl.String, "recv_timing": pl.String,
}
UNMATCHED_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "op": pl.String, "peer": pl.Int32, "tag": pl.Int64, "calls": pl.UInt32,
}

#: CPU dispatcher ops of point-to-point calls, and their op.
_DISPATCH = {"c10d::send": "send", "c10d::recv_": "recv"}
#: The backend's work item nested in a call: it carries the tensor's shape and dtype.
_WORK = r"^(gloo|mpi|ucc):(send|recv)$"


def p2p_calls(events: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """One row per send/recv call per rank (``CALL_SCHEMA``), on the events' own clocks."""
    lf = events.lazy()
    if "args_json" not in lf.collect_schema().names():
        return pl.DataFrame(schema=CALL_SCHEMA)
    name = pl.col("name").cast(pl.String)
    # the names first (one column): most runs have no send/recv, and args_json, most of a
    # trace's bytes, is then never read
    present = lf.select(name.unique()).filter(
        name.is_in([*_DISPATCH, "record_param_comms"])).collect()
    if present.height == 0:
        return pl.DataFrame(schema=CALL_SCHEMA)
    host = lf.filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", "user_annotation"])
                     & pl.col("dur_ns").is_not_null())
    args = pl.col("args_json").cast(pl.String)
    calls = host.filter(name.is_in(list(_DISPATCH))).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64).fill_null(0),
        op=name.replace_strict(_DISPATCH, return_dtype=pl.String),
        peer=args.str.json_path_match("$['Concrete Inputs'][2]").cast(pl.Int32, strict=False),
        tag=args.str.json_path_match("$['Concrete Inputs'][3]").cast(pl.Int64, strict=False)
        .fill_null(0),
        ts_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")).collect()
    nccl = host.filter(pl.col("name").cast(pl.String) == "record_param_comms").select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64).fill_null(0),
        op=pl.col("collective").cast(pl.String),
        peer=pl.coalesce(args.str.json_path_match("$['Dst Rank']"),
                         args.str.json_path_match("$['Src Rank']")).cast(pl.Int32, strict=False),
        ts_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
        bytes=pl.col("bytes"), seq=pl.col("seq").cast(pl.Int64)).filter(
        pl.col("op").is_in(["send", "recv"]) & pl.col("peer").is_not_null()).collect()
    if nccl.height:
        calls, nccl = _inside_dispatch(calls, nccl)
        nccl = _on_gpu(lf, nccl)
    calls = calls.with_columns(timing=pl.lit("host"))
    work = host.filter(name.str.contains(_WORK)).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64).fill_null(0),
        _work_ts="ts_ns", _work_end=pl.col("ts_ns") + pl.col("dur_ns"),
        bytes=shape_bytes(args)).collect()
    # each call's size, and its true end, from the work item that starts inside it (same
    # rank and thread)
    sized = calls.sort("ts_ns").join_asof(
        work.sort("_work_ts"), left_on="ts_ns", right_on="_work_ts", by=["rank", "tid"],
        strategy="forward", check_sortedness=False).with_columns(
        inside=pl.col("_work_ts") < pl.col("end_ns")).with_columns(
        bytes=pl.when("inside").then(pl.col("bytes")),
        end_ns=pl.when("inside").then(pl.max_horizontal("end_ns", "_work_end"))
        .otherwise(pl.col("end_ns")))
    out = pl.concat([sized.drop("_work_ts", "_work_end", "inside"), nccl],
                    how="diagonal_relaxed")
    return out.select(list(CALL_SCHEMA)).cast(CALL_SCHEMA).filter(
        pl.col("peer").is_not_null() & (pl.col("peer") >= 0)).sort("rank", "ts_ns")


def _inside_dispatch(calls: pl.DataFrame,
                     nccl: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """An NCCL call and the dispatcher op around it (``c10d::send`` > ``record_param_comms``,
    same rank and thread) are one call: the NCCL row keeps it, with the dispatcher's tag;
    the dispatcher row goes."""
    outer = calls.select("rank", "tid", _d_ts="ts_ns", _d_end="end_ns", _d_tag="tag").sort("_d_ts")
    joined = nccl.sort("ts_ns").join_asof(
        outer, left_on="ts_ns", right_on="_d_ts", by=["rank", "tid"], strategy="backward",
        check_sortedness=False).with_columns(
        _in=pl.col("_d_end").is_not_null() & (pl.col("_d_end") >= pl.col("end_ns")))
    enclosing = joined.filter("_in").select("rank", "tid", ts_ns="_d_ts").unique()
    kept = calls.join(enclosing, on=["rank", "tid", "ts_ns"], how="anti")
    tagged = joined.with_columns(tag=pl.when("_in").then(pl.col("_d_tag")).otherwise(0)
                                 .cast(pl.Int64).fill_null(0)).drop("_d_ts", "_d_end", "_d_tag", "_in")
    return kept, tagged


def _on_gpu(lf: pl.LazyFrame, nccl: pl.DataFrame) -> pl.DataFrame:
    """The NCCL calls timed by their kernels: the first runtime launch inside the call (same
    rank and thread), then the kernel with its correlation id. ``timing``: ``gpu``, or
    ``enqueue`` where no kernel is found (the CPU times stay)."""
    ranks = nccl.get_column("rank").unique().implode()
    launches = lf.filter(is_runtime_call(lf) & pl.col("correlation").is_not_null()
                         & pl.col("rank").cast(pl.Int32).is_in(ranks)).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64).fill_null(0),
        _l_ts="ts_ns", correlation=pl.col("correlation").cast(pl.Int64)).collect().sort("_l_ts")
    launched = nccl.sort("ts_ns").join_asof(
        launches, left_on="ts_ns", right_on="_l_ts", by=["rank", "tid"], strategy="forward",
        check_sortedness=False).with_columns(
        correlation=pl.when(pl.col("_l_ts") < pl.col("end_ns")).then(pl.col("correlation")))
    wanted = launched.get_column("correlation").drop_nulls().unique().implode()
    kernels = lf.filter((pl.col("kind").cast(pl.String) == "kernel")
                        & pl.col("dur_ns").is_not_null()
                        & pl.col("correlation").cast(pl.Int64).is_in(wanted)).select(
        pl.col("rank").cast(pl.Int32), correlation=pl.col("correlation").cast(pl.Int64),
        _k_ts="ts_ns", _k_end=pl.col("ts_ns") + pl.col("dur_ns")).collect().unique(
        ["rank", "correlation"], keep="first")
    timed = launched.join(kernels, on=["rank", "correlation"], how="left")
    on_gpu = pl.col("_k_ts").is_not_null()
    return timed.with_columns(
        ts_ns=pl.coalesce("_k_ts", "ts_ns"), end_ns=pl.coalesce("_k_end", "end_ns"),
        timing=pl.when(on_gpu).then(pl.lit("gpu")).otherwise(pl.lit("enqueue")),
    ).drop("_l_ts", "correlation", "_k_ts", "_k_end")


def pair_p2p(calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(pairs, unmatched)``: ``PAIR_SCHEMA`` (one row per matched send/recv, in order of the
    send), and ``UNMATCHED_SCHEMA`` (calls left over, per rank, op, peer and tag)."""
    if calls.height == 0:
        return pl.DataFrame(schema=PAIR_SCHEMA), pl.DataFrame(schema=UNMATCHED_SCHEMA)
    keyed = calls.with_columns(
        src=pl.when(pl.col("op") == "send").then(pl.col("rank")).otherwise(pl.col("peer")),
        dst=pl.when(pl.col("op") == "send").then(pl.col("peer")).otherwise(pl.col("rank")),
    )
    side = ["op", "src", "dst", "tag"]
    if "seq" in keyed.columns:  # a side's calls are one rank's: its Seq is its program order
        keyed = keyed.with_columns(_by=pl.when(pl.col("seq").is_not_null().all().over(side))
                                   .then(pl.col("seq")).otherwise(pl.col("ts_ns")))
    else:
        keyed = keyed.with_columns(_by=pl.col("ts_ns"))
    keyed = keyed.sort("_by", "ts_ns", "rank").with_columns(
        order=pl.int_range(pl.len()).over(side).cast(pl.Int64))
    if "timing" not in keyed.columns:
        keyed = keyed.with_columns(timing=pl.lit("host"))
    key = ["src", "dst", "tag", "order"]
    sends = keyed.filter(pl.col("op") == "send").select(
        *key, send_ns="ts_ns", send_end_ns="end_ns", send_bytes="bytes", send_timing="timing")
    recvs = keyed.filter(pl.col("op") == "recv").select(
        *key, recv_ns="ts_ns", recv_end_ns="end_ns", recv_bytes="bytes", recv_timing="timing")
    pairs = sends.join(recvs, on=key, how="inner").with_columns(
        instance=pl.format("p2p {}->{}#{}", "src", "dst", "order")
        + pl.when(pl.col("tag") != 0).then(pl.format(" tag {}", "tag")).otherwise(pl.lit("")),
        recv_wait_ns=(pl.min_horizontal("send_ns", "recv_end_ns") - pl.col("recv_ns")).clip(0),
        transfer_ns=(pl.col("recv_end_ns") - pl.max_horizontal("send_ns", "recv_ns")).clip(0),
        bytes=pl.coalesce("send_bytes", "recv_bytes"))
    left = pl.concat([
        keyed.filter(pl.col("op") == "send").join(recvs, on=key, how="anti"),
        keyed.filter(pl.col("op") == "recv").join(sends, on=key, how="anti")])
    unmatched = left.group_by("rank", "op", "peer", "tag").agg(calls=pl.len()).sort(
        "rank", "op", "peer", "tag")
    return (pairs.select(list(PAIR_SCHEMA)).cast(PAIR_SCHEMA).sort("send_ns", "src", "dst"),
            unmatched.select(list(UNMATCHED_SCHEMA)).cast(UNMATCHED_SCHEMA))


def p2p_sync_rows(pairs: pl.DataFrame) -> pl.DataFrame:
    """The pairs as sync points for the dependency graph, one row per (pair, side):
    ``instance, group, collective, name, rank, arrival_ns, end_ns, last_arrival_ns,
    last_rank`` (the receiver's release depends on the send's arrival; a sender never waits
    for its receiver, so its own row's last arrival is its own)."""
    send = pairs.select(
        "instance", group=pl.format("p2p {}->{}", "src", "dst"), collective=pl.lit("send"),
        name=pl.lit("send"), rank="src", arrival_ns="send_ns", end_ns="send_end_ns",
        last_arrival_ns="send_ns", last_rank="src")
    recv = pairs.select(
        "instance", group=pl.format("p2p {}->{}", "src", "dst"), collective=pl.lit("recv"),
        name=pl.lit("recv"), rank="dst", arrival_ns="recv_ns", end_ns="recv_end_ns",
        last_arrival_ns=pl.max_horizontal("send_ns", "recv_ns"),
        last_rank=pl.when(pl.col("send_ns") > pl.col("recv_ns")).then(pl.col("src"))
        .otherwise(pl.col("dst")))
    return pl.concat([send, recv]).sort("arrival_ns", "rank")


__all__ = ["CALL_SCHEMA", "PAIR_SCHEMA", "TIMINGS", "UNMATCHED_SCHEMA", "p2p_calls", "p2p_sync_rows",
           "pair_p2p"]
