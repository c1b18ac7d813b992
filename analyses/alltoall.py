"""All-to-all exchanges: who sends how much to whom, how uneven it is, and what that costs.

Definitions with a worked example: ``docs/metrics.md``, section *All-to-all*. Three steps, each
a pure function over tables:

1. :func:`alltoall_calls`: one row per all-to-all call per rank with the bytes it sends to and
   receives from each peer (in group order), read from the split sizes where the trace has
   them, else from the tensors' shapes (an even split):

   * NCCL (and any backend that writes it): ``record_param_comms`` of an all-to-all, its
     ``In split size`` / ``Out split size`` (rows per peer), ``In msg nelems`` /
     ``Out msg nelems`` and ``dtype``;
   * gloo and other CPU backends: the dispatcher op ``c10d::alltoall_base_``
     (``all_to_all_single``), whose ``Concrete Inputs`` are ``[output, input, group,
     output_split_sizes, input_split_sizes, async_op, timeout]`` and whose ``Input Dims`` /
     ``Input type`` give the two tensors' shapes and dtypes; ``c10d::alltoall_`` (the tensor
     list form): one tensor per peer.

2. :func:`pair_calls`: each call paired with its matched instance
   (:func:`~traceview.analyses.collective_match.match_collectives`: by ``Seq`` where both carry
   it, else the k-th call of a rank with its k-th all-to-all); :func:`alltoall_matrix`: the
   bytes from every rank to every rank of each instance, the sender's split where it was
   recorded, else the receiver's.

3. :func:`alltoall`: per rank the volume sent and received; per step the rank x rank matrix;
   the imbalance (the largest received volume over the mean, at each step's most uneven
   exchange) and the hot rank; and the cost in time, from the dependency graph
   (:func:`~traceview.analyses.dependency_graph.sync_points`): after an uneven exchange,
   every rank's stretch to its next sync point (its share of the work: an expert's compute)
   against the bytes it received, fitted by a line; the cost is what the hot rank's stretch
   would lose at the mean volume (the same total, evenly spread), no more than its lead over
   the others (what they waited for it).

>>> paired = pl.DataFrame({"rank": [0, 1], "instance": ["a2a#0", "a2a#0"],
...     "instance_group": ["a2a", "a2a"], "step": [1, 1],
...     "ts_ns": [0, 5], "peers": [[0, 1], [0, 1]], "send_splits": [[10, 30], [20, 40]],
...     "recv_splits": [[10, 20], [30, 40]], "send_bytes": [40, 60], "recv_bytes": [30, 70],
...     "source": ["split_sizes", "split_sizes"]})
>>> matrix, warnings = alltoall_matrix(paired)
>>> matrix.select("src", "dst", "bytes").rows()
[(0, 0, 10), (0, 1, 30), (1, 0, 20), (1, 1, 40)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from traceview.naming import dtype_bytes

CALL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "tid": pl.Int64, "ts_ns": pl.Int64, "step": pl.Int64,
    "name": pl.String, "group": pl.String, "seq": pl.Int64, "pg_ranks": pl.List(pl.Int32),
    "send_splits": pl.List(pl.Int64), "recv_splits": pl.List(pl.Int64),
    "send_bytes": pl.Int64, "recv_bytes": pl.Int64, "source": pl.String,
    "splits_refused": pl.Boolean,
}
MATRIX_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "group": pl.String, "step": pl.Int64, "src": pl.Int32,
    "dst": pl.Int32,
    "bytes": pl.Int64, "source": pl.String,
}
RANK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "send_bytes": pl.Int64, "recv_bytes": pl.Int64, "calls": pl.Int64,
    "send_bytes_per_step": pl.Int64, "recv_bytes_per_step": pl.Int64,
    "recv_ratio": pl.Float64, "send_ratio": pl.Float64, "hot": pl.Boolean,
}
STEP_MATRIX_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64, "src": pl.Int32, "dst": pl.Int32, "bytes": pl.Int64,
}
EXCHANGE_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "group": pl.String, "step": pl.Int64, "ranks": pl.Int32, "bytes": pl.Int64,
    "recv_imbalance": pl.Float64, "send_imbalance": pl.Float64, "max_recv_rank": pl.Int32,
    "max_send_rank": pl.Int32, "source": pl.String,
}
COST_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64, "instance": pl.String, "next_instance": pl.String,
    "hot_rank": pl.Int32, "recv_imbalance": pl.Float64, "hot_stretch_ns": pl.Int64,
    "lead_ns": pl.Int64, "ns_per_byte": pl.Float64, "balanced_ns": pl.Int64,
    "cost_ns": pl.Int64,
}

#: An exchange whose largest received volume is below this multiple of the mean is even:
#: it names no hot rank and costs nothing (routing noise, not a hot expert).
MIN_IMBALANCE = 1.05

#: The dispatcher ops that carry an all-to-all's tensors and split sizes.
_DISPATCH = ("c10d::alltoall_base_", "c10d::alltoall_")


#: Bounds on the split sizes a trace gives (docs/formats.md, *Bounds*): at most this many
#: peers (the largest jobs' groups are some thousands of ranks) ...
MAX_PEERS = 1 << 17
#: ... and each split, in rows or bytes, within 2^45 (32 Ti), so that their sum over the
#: peers stays within int64 (a tensor's bytes likewise: ``_bytes``). A call beyond either is
#: read as an even split of its tensors, with a warning.
MAX_SPLIT = 1 << 45


def _ints(text: pl.Expr) -> pl.Expr:
    """The integers in a JSON list's text (``"[8, 32]"`` -> [8, 32], ``"[]"`` -> []); one
    beyond int64 is null."""
    return text.str.extract_all(r"-?\d+").list.eval(pl.element().cast(pl.Int64, strict=False))


def _bounded(splits: pl.Expr) -> pl.Expr:
    """Split sizes within the bounds (``MAX_PEERS``, ``MAX_SPLIT``, none negative or beyond
    int64), else null (the call then reads as an even split: ``_refused``)."""
    out_of_bounds = splits.list.eval(pl.element().is_null() | (pl.element() < 0)
                                     | (pl.element() > MAX_SPLIT)).list.any()
    return pl.when(out_of_bounds | (splits.list.len() > MAX_PEERS)).then(None).otherwise(splits)


def _refused(*names: str) -> pl.Expr:
    """Whether any of the columns ``names`` held split sizes beyond the bounds (null)."""
    return pl.any_horizontal(pl.col(n).is_null() & pl.col(f"{n}_given") for n in names)


def _numel(dims: pl.Expr) -> pl.Expr:
    """Elements of a tensor from its ``Input Dims`` entry's text (``"[56, 64]"`` -> 3584);
    null when a dimension is negative or the product is beyond 2^58 (multiplied in floats,
    so that it cannot wrap)."""
    dims = _ints(dims)
    product = dims.list.eval(pl.element().cast(pl.Float64).product()).list.first()
    sane = dims.list.eval(pl.element().is_null() | (pl.element() < 0)).list.any().not_()
    return pl.when(sane & (product <= _MAX_ELEMENTS)).then(product.cast(pl.Int64))


#: A tensor's elements, at most: times 16 bytes an element, within int64.
_MAX_ELEMENTS = float(1 << 58)


def _bytes(elements: pl.Expr, elem: pl.Expr) -> pl.Expr:
    """A tensor's bytes; null when its element count is negative or beyond 2^58."""
    return pl.when((elements >= 0) & (elements <= _MAX_ELEMENTS)).then(elements * elem)


def _per_peer(rows: pl.Expr, total: pl.Expr) -> pl.Expr:
    """Bytes per peer from rows per peer and the tensor's bytes (its rows are the same size);
    empty without split sizes (an even split)."""
    whole = rows.list.sum()
    return pl.when((rows.list.len() > 0) & (whole > 0) & (total >= 0)
                   & (total // whole <= MAX_SPLIT)).then(rows * (total // whole)) \
        .otherwise(pl.lit([], pl.List(pl.Int64)))


def alltoall_calls(events: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """One row per all-to-all call per rank (``CALL_SCHEMA``), on the events' own clocks.

    ``send_splits`` / ``recv_splits``: bytes to / from each peer in group order, empty when
    the call gave no split sizes (an even split of ``send_bytes`` / ``recv_bytes``);
    ``source``: ``split_sizes`` or ``shape``. Needs ``args_json`` (without it: no row)."""
    lf = events.lazy()
    if "args_json" not in lf.collect_schema().names():
        return pl.DataFrame(schema=CALL_SCHEMA)
    name = pl.col("name").cast(pl.String)
    recorded = (name == "record_param_comms") & (
        pl.col("collective").cast(pl.String) == "all_to_all")
    args = pl.col("args_json").cast(pl.String)
    calls = lf.filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", "user_annotation"])
                      & pl.col("dur_ns").is_not_null()
                      & (name.is_in(list(_DISPATCH)) | recorded)).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64).fill_null(0),
        ts_ns="ts_ns", step=pl.col("step").cast(pl.Int64), name=name,
        group=pl.coalesce(pl.col("pg_name").cast(pl.String),
                          pl.col("pg_ranks").cast(pl.String)),
        seq=pl.col("seq").cast(pl.Int64),
        pg_ranks=_ints(pl.col("pg_ranks").cast(pl.String)).cast(pl.List(pl.Int32)),
        # record_param_comms: rows per peer, and the message's elements and dtype
        rpc_send=_ints(args.str.json_path_match("$['In split size']")),
        rpc_recv=_ints(args.str.json_path_match("$['Out split size']")),
        rpc_send_total=_bytes(pl.col("in_nelems"), dtype_bytes(pl.col("dtype"))),
        rpc_recv_total=_bytes(pl.col("out_nelems"), dtype_bytes(pl.col("dtype"))),
        # the dispatcher ops: [output, input, group, output splits, input splits, ...]
        op_recv=_ints(args.str.json_path_match("$['Concrete Inputs'][3]")),
        op_send=_ints(args.str.json_path_match("$['Concrete Inputs'][4]")),
        out_dims=args.str.json_path_match("$['Input Dims'][0]"),
        in_dims=args.str.json_path_match("$['Input Dims'][1]"),
        out_elem=dtype_bytes(args.str.json_path_match("$['Input type'][0]")),
        in_elem=dtype_bytes(args.str.json_path_match("$['Input type'][1]")),
    ).collect()
    if calls.height == 0:
        return pl.DataFrame(schema=CALL_SCHEMA)
    lists = ("rpc_send", "rpc_recv", "op_recv", "op_send")
    calls = calls.with_columns(**{f"{n}_given": pl.col(n).is_not_null() for n in lists}) \
        .with_columns(**{n: _bounded(pl.col(n)) for n in lists}) \
        .with_columns(splits_refused=_refused(*lists))
    # a rank whose all-to-alls have record_param_comms (NCCL's, nested in the dispatcher op)
    # is read from those: they carry the sequence number and the group
    with_rpc = calls.filter(pl.col("name") == "record_param_comms").get_column("rank").unique()
    calls = calls.filter((pl.col("name") == "record_param_comms")
                         | ~pl.col("rank").is_in(with_rpc.implode()))
    rpc, listed = pl.col("name") == "record_param_comms", pl.col("name") == "c10d::alltoall_"

    def tensors(dims: str, elem: str) -> pl.Expr:  # c10d::alltoall_: a tensor per peer
        elements = pl.when(listed).then(pl.col(dims)).str.json_decode(
            pl.List(pl.List(pl.Float64))).list.eval(  # floats: a product cannot wrap
            pl.element().list.eval(pl.element().product()).list.first())
        in_bounds = elements.list.eval(pl.when((pl.element() >= 0)
                                               & (pl.element() <= MAX_SPLIT))
                                       .then(pl.element()).cast(pl.Int64))
        return _bounded(in_bounds) * pl.col(elem)

    out = calls.with_columns(
        send_splits=pl.when(rpc).then(_per_peer(pl.col("rpc_send"), pl.col("rpc_send_total")))
        .when(listed).then(tensors("in_dims", "in_elem"))
        .otherwise(_per_peer(pl.col("op_send"),
                             _bytes(_numel(pl.col("in_dims")), pl.col("in_elem")))),
        recv_splits=pl.when(rpc).then(_per_peer(pl.col("rpc_recv"), pl.col("rpc_recv_total")))
        .when(listed).then(tensors("out_dims", "out_elem"))
        .otherwise(_per_peer(pl.col("op_recv"),
                             _bytes(_numel(pl.col("out_dims")), pl.col("out_elem")))),
        send_bytes=pl.when(rpc).then("rpc_send_total").when(listed).then(None)
        .otherwise(_bytes(_numel(pl.col("in_dims")), pl.col("in_elem"))),
        recv_bytes=pl.when(rpc).then("rpc_recv_total").when(listed).then(None)
        .otherwise(_bytes(_numel(pl.col("out_dims")), pl.col("out_elem"))),
    ).with_columns(
        send_bytes=pl.coalesce("send_bytes", pl.when(pl.col("send_splits").list.len() > 0)
                               .then(pl.col("send_splits").list.sum())),
        recv_bytes=pl.coalesce("recv_bytes", pl.when(pl.col("recv_splits").list.len() > 0)
                               .then(pl.col("recv_splits").list.sum())),
        source=pl.when((pl.col("send_splits").list.len() > 0)
                       | (pl.col("recv_splits").list.len() > 0))
        .then(pl.lit("split_sizes")).otherwise(pl.lit("shape")))
    return out.select(list(CALL_SCHEMA)).cast(CALL_SCHEMA).sort("rank", "ts_ns")


def pair_calls(calls: pl.DataFrame, instances: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Each call of :func:`alltoall_calls` with its matched instance (``instance``) and its
    peers in group order (``peers``), and the warnings of what could not be paired.

    ``instances``: ``MatchResult.instances`` (raw clocks). A call and an instance that both
    carry a sequence number pair by (rank, group, seq); the others by order on each rank (the
    k-th call with the k-th all-to-all), or, where a rank has more of one than of the other
    (a window that cuts a call off), each instance with the latest call that began before
    it. Peers: the group's ranks where the trace names them, else the instance's ranks, else
    (more split sizes than ranks present) the group ranks as global ranks."""
    inst = instances.filter((pl.col("collective") == "all_to_all")
                            & (pl.col("rank").n_unique().over("instance") >= 2)).select(
        "instance", pl.col("rank").cast(pl.Int32), inst_ts="ts_ns",
        inst_group=pl.col("group").cast(pl.String), inst_seq="seq")
    empty = calls.clear().with_columns(instance=pl.lit(None, pl.String),
                                       peers=pl.lit(None, pl.List(pl.Int32)))
    warnings: list[str] = []
    refused = calls.filter(pl.col("splits_refused").fill_null(False)).height
    if refused:
        warnings.append(f"alltoall: {refused} call(s) give split sizes beyond the bounds (more "
                        f"than {MAX_PEERS} peers, or a size negative or over 2^45): read as "
                        "an even split of their tensors")
    if calls.height == 0 or inst.height == 0:
        return empty, warnings
    by_seq = calls.filter(pl.col("seq").is_not_null()).join(
        inst.filter(pl.col("inst_seq").is_not_null()),
        left_on=["rank", "group", "seq"], right_on=["rank", "inst_group", "inst_seq"])
    rest_calls = calls.join(by_seq.select("rank", "ts_ns"), on=["rank", "ts_ns"], how="anti")
    rest_inst = inst.join(by_seq.select("instance", "rank"), on=["instance", "rank"],
                          how="anti")
    parts = [by_seq.select(*calls.columns, "instance", "inst_ts", inst_group="group")]
    # the k-th call of a rank with its k-th instance, where a rank has as many of each
    n_calls = rest_calls.group_by("rank").agg(calls=pl.len())
    n_inst = rest_inst.group_by("rank").agg(inst=pl.len())
    counts = n_calls.join(n_inst, on="rank", how="full", coalesce=True).fill_null(0)
    even = counts.filter(pl.col("calls") == pl.col("inst")).get_column("rank").implode()
    k = pl.int_range(pl.len()).over("rank").alias("_k")
    parts.append(
        rest_calls.filter(pl.col("rank").is_in(even)).sort("rank", "ts_ns").with_columns(k)
        .join(rest_inst.filter(pl.col("rank").is_in(even)).sort("rank", "inst_ts")
              .with_columns(k).select("rank", "_k", "instance", "inst_ts", "inst_group"),
              on=["rank", "_k"])
        .select(*calls.columns, "instance", "inst_ts", "inst_group"))
    for rank in counts.filter(pl.col("calls") != pl.col("inst")).get_column("rank").sort():
        mine = rest_calls.filter(pl.col("rank") == rank).sort("ts_ns")
        theirs = rest_inst.filter(pl.col("rank") == rank).sort("inst_ts")
        paired = theirs.join_asof(mine, left_on="inst_ts", right_on="ts_ns",
                                  strategy="backward", check_sortedness=False) \
            .filter(pl.col("ts_ns").is_not_null()) \
            .unique(["ts_ns"], keep="first", maintain_order=True)
        parts.append(paired.select(*calls.columns, "instance", "inst_ts", "inst_group"))
        warnings.append(f"alltoall: rank {rank}: {mine.height} all-to-all call(s) with sizes "
                        f"and {theirs.height} matched all-to-all(s) (a window that cuts a "
                        f"call off?): {paired.height} paired by time")
    paired = pl.concat(parts, how="vertical_relaxed")
    members = inst.group_by("instance").agg(members=pl.col("rank").unique().sort())
    paired = paired.join(members, on="instance", how="left").with_columns(
        _n=pl.max_horizontal(pl.col("send_splits").list.len(),
                             pl.col("recv_splits").list.len()))
    peers = (pl.when(pl.col("pg_ranks").list.len() > 0).then(pl.col("pg_ranks"))
             .when((pl.col("_n") == 0) | (pl.col("_n") == pl.col("members").list.len()))
             .then(pl.col("members"))
             .otherwise(pl.int_ranges(0, pl.col("_n"), dtype=pl.Int32)))
    paired = paired.with_columns(peers=peers.cast(pl.List(pl.Int32)))
    guessed = paired.filter((pl.col("pg_ranks").list.len().fill_null(0) == 0) & (pl.col("_n") > 0)
                            & (pl.col("_n") != pl.col("members").list.len()))
    if guessed.height:
        warnings.append(f"alltoall: {guessed.height} call(s) have split sizes for more peers "
                        "than the ranks present: their peers are taken as global ranks "
                        "0..n-1 (the default group)")
    return paired.select(*calls.columns, "instance", "peers", instance_group="inst_group") \
        .sort("rank", "ts_ns"), warnings


def alltoall_matrix(paired: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The bytes from every rank to every rank of each instance (``MATRIX_SCHEMA``, ``ts_ns``:
    the instance's first call, raw clock) and the warnings: the sender's split where it
    was recorded, else the receiver's; an even split of the tensor without split sizes.
    A rank's share to itself (the diagonal) is kept: it moves no data between ranks, but its
    expert works on it all the same."""
    if paired.height == 0:
        return pl.DataFrame(schema=MATRIX_SCHEMA), []
    rows = _per_peer_rows(paired)
    key = ["instance", "src", "dst"]
    sent = rows.select("instance", src="rank", dst="peer", sent="sent", _sent_even="no_send",
                       _src_total="send_bytes")
    got = rows.select("instance", src="peer", dst="rank", got="got", _got_even="no_recv",
                      _dst_total="recv_bytes")
    cells = sent.join(got, on=key, how="full", coalesce=True)
    estimated, warnings = _unrecorded_splits(paired, cells)
    cells = cells.join(estimated, on="instance", how="left").with_columns(
        bytes=pl.when(pl.col("_estimate").fill_null(False))
        .then((pl.col("_src_total").cast(pl.Float64) * pl.col("_dst_total")
               / pl.col("_total")).round().cast(pl.Int64))
        .otherwise(pl.coalesce("sent", "got")))
    # only sizes both ranks recorded can disagree: an even split is a guess, not a record
    disagree = cells.filter(pl.col("sent").is_not_null() & pl.col("got").is_not_null()
                            & ~pl.col("_sent_even") & ~pl.col("_got_even")
                            & (pl.col("sent") != pl.col("got"))).sort("instance", "src", "dst")
    if disagree.height:
        shown = "; ".join(f"{r['instance']} {r['src']}->{r['dst']}: rank {r['src']}'s split "
                          f"sends {r['sent']}, rank {r['dst']}'s split receives {r['got']} "
                          f"bytes" for r in disagree.head(3).iter_rows(named=True))
        warnings.append(f"alltoall: {disagree.height} (instance, sender, receiver) cell(s) "
                        f"where both ranks recorded split sizes and they disagree ({shown}"
                        f"{'; ...' if disagree.height > 3 else ''}): the trace's own records "
                        "differ; the sender's kept")
    facts = paired.group_by("instance").agg(
        group=pl.col("instance_group").first(),
        step=pl.col("step").drop_nulls().min(), ts_ns=pl.col("ts_ns").min(),
        source=pl.when((pl.col("source") == "split_sizes").any())
        .then(pl.lit("split_sizes")).otherwise(pl.lit("shape")))
    out = cells.join(facts, on="instance", how="left")
    return (out.select(*MATRIX_SCHEMA, "ts_ns").cast(MATRIX_SCHEMA)
            .sort("ts_ns", "src", "dst"), warnings)


def _unrecorded_splits(paired: pl.DataFrame,
                       cells: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The instances whose calls record no split sizes, on either side, and whose cells are
    estimated from both sides' totals (``instance, _estimate, _total``), with the warnings.

    Without split sizes each side's even split is a guess: a sender's tensor over the group
    and a receiver's tensor over the group disagree as soon as the exchange is uneven
    (param's DLRM: every rank sends 3,392 ints, rank 3 receives 13,312 and rank 0 768). Where
    every cell has both ranks and the senders' totals sum to the receivers' (the trace agrees
    with itself), cell src -> dst = sent(src) x received(dst) / total: the even spread that
    keeps every rank's sent and received totals exact (an even split when all are equal).
    Else (ranks missing, totals that do not add up) the sender's even split stays, with a
    warning naming the totals."""
    unrecorded = paired.group_by("instance").agg(
        _none=((pl.col("send_splits").list.len() == 0)
               & (pl.col("recv_splits").list.len() == 0)).all(),
        _sent=pl.col("send_bytes").sum(), _got=pl.col("recv_bytes").sum(),
        _uneven=(pl.col("send_bytes").n_unique() > 1) | (pl.col("recv_bytes").n_unique() > 1)
        | (pl.col("send_bytes") != pl.col("recv_bytes")).any(),
        _ranks=pl.col("rank").sort(), _send=pl.col("send_bytes").sort_by("rank"),
        _recv=pl.col("recv_bytes").sort_by("rank")).filter(pl.col("_none") & pl.col("_uneven"))
    whole = cells.group_by("instance").agg(
        _whole=(pl.col("sent").is_not_null() & pl.col("got").is_not_null()).all())
    found = unrecorded.join(whole, on="instance", how="left").with_columns(
        _estimate=pl.col("_whole").fill_null(False) & (pl.col("_sent") == pl.col("_got"))
        & (pl.col("_sent") > 0)).sort("instance")
    warnings = []
    fine, off = found.filter("_estimate"), found.filter(~pl.col("_estimate"))
    if fine.height:
        first = fine.row(0, named=True)
        warnings.append(
            f"alltoall: {fine.height} exchange(s) record no split sizes and are uneven (first: "
            f"{first['instance']}, ranks {first['_ranks']} send {first['_send']} and receive "
            f"{first['_recv']} bytes): each rank's totals are the trace's, each cell "
            "src->dst is estimated as sent(src) x received(dst) / total (record the splits: "
            "record_param_comms' In/Out split size, or record_shapes for all_to_all_single)")
    if off.height:
        first = off.row(0, named=True)
        warnings.append(
            f"alltoall: {off.height} exchange(s) record no split sizes and their senders "
            f"({first['_sent']} bytes in all at {first['instance']}) and receivers "
            f"({first['_got']}) do not add up or miss ranks: the senders' even split kept")
    return found.select("instance", "_estimate", _total=pl.col("_sent")), warnings


def _per_peer_rows(paired: pl.DataFrame) -> pl.DataFrame:
    """One row per (call, peer): ``rank``, ``peer``, ``instance``, ``sent`` and ``got`` (the
    split's bytes, or an even share without split sizes). Each list is exploded on its own
    and joined back by (call, position): exploding the peers with the split lists still on
    every row copied each list once per peer, memory quadratic in their length (2,000 splits
    took 3.4 GB)."""
    calls = paired.with_row_index("_call").with_columns(_n=pl.col("peers").list.len())

    def by_position(column: str) -> pl.DataFrame:
        listed = calls.select("_call", column).filter(pl.col(column).list.len() > 0)
        return listed.with_columns(j=pl.int_ranges(0, pl.col(column).list.len())) \
            .explode(column, "j")

    peers = by_position("peers").rename({"peers": "peer"})
    sends, recvs = by_position("send_splits"), by_position("recv_splits")
    n = pl.col("_n")
    return (peers.join(calls.select("_call", "rank", "instance", "send_bytes", "recv_bytes",
                                    "_n", no_send=pl.col("send_splits").list.len() == 0,
                                    no_recv=pl.col("recv_splits").list.len() == 0),
                       on="_call")
            .join(sends, on=["_call", "j"], how="left")
            .join(recvs, on=["_call", "j"], how="left")
            .with_columns(sent=pl.when("no_send").then(pl.col("send_bytes") // n)
                          .otherwise("send_splits"),
                          got=pl.when("no_recv").then(pl.col("recv_bytes") // n)
                          .otherwise("recv_splits"))
            .sort("_call", "j"))


def _volumes(matrix: pl.DataFrame) -> pl.DataFrame:
    """Per (instance, rank): ``send``, ``recv`` bytes (every rank of the instance, zeros
    included), with the instance's ``step`` and ``ts_ns``."""
    sent = matrix.group_by("instance", rank="src").agg(send=pl.col("bytes").sum())
    got = matrix.group_by("instance", rank="dst").agg(recv=pl.col("bytes").sum())
    facts = matrix.group_by("instance").agg(pl.col("group").first(), pl.col("step").first(),
                                            pl.col("ts_ns").min(), pl.col("source").first())
    return (sent.join(got, on=["instance", "rank"], how="full", coalesce=True)
            .with_columns(pl.col("send", "recv").fill_null(0))
            .join(facts, on="instance").sort("ts_ns", "rank"))


def _ratio(value: pl.Expr) -> pl.Expr:
    """``value`` over its mean within the instance (null when the mean is 0)."""
    mean = value.mean().over("instance")
    return pl.when(mean > 0).then(value / mean)


def exchanges(volumes: pl.DataFrame) -> pl.DataFrame:
    """One row per instance (``EXCHANGE_SCHEMA``): its bytes, and how uneven: the largest
    received (sent) volume over the mean of its ranks', and who has it (lowest on ties)."""
    v = volumes.with_columns(recv_ratio=_ratio(pl.col("recv")),
                             send_ratio=_ratio(pl.col("send")))
    return v.sort("ts_ns", "rank").group_by("instance", maintain_order=True).agg(
        pl.col("group").first(), pl.col("step").first(), ranks=pl.len(),
        bytes=pl.col("send").sum(),
        recv_imbalance=pl.col("recv_ratio").max(), send_imbalance=pl.col("send_ratio").max(),
        max_recv_rank=pl.col("rank").sort_by("recv", "rank", descending=[True, False]).first(),
        max_send_rank=pl.col("rank").sort_by("send", "rank", descending=[True, False]).first(),
        source=pl.col("source").first()).select(list(EXCHANGE_SCHEMA)).cast(EXCHANGE_SCHEMA)


def costs(volumes: pl.DataFrame, sync: pl.DataFrame, *,
          min_imbalance: float = MIN_IMBALANCE) -> pl.DataFrame:
    """The time each uneven exchange costs (``COST_SCHEMA``), one row per instance whose
    receive imbalance is at least ``min_imbalance``.

    ``sync``: :func:`~traceview.analyses.dependency_graph.sync_points` (aligned). After
    exchange E, each rank r's *stretch* runs from E's last arrival (when every rank was in)
    to r's arrival at its next sync point (the one E's release gated: in program order, the
    first after E): its share of the exchange and of the work the exchange handed it. A line
    ``stretch = a + b x received bytes`` is fitted over E's ranks (least squares); were the
    same total spread evenly, the hot rank (the most received) would take ``a + b x mean``.
    ``cost_ns = clamp(b x (received_hot - mean), 0, lead)``, where ``lead`` is the hot
    rank's stretch less the longest of the others' (what they waited for it: rebalancing
    cannot save more, it gives the others more work). ``b <= 0``: the stretches do not grow
    with the volume, cost 0."""
    per = volumes.with_columns(recv_ratio=_ratio(pl.col("recv")),
                               mean_recv=pl.col("recv").mean().over("instance"))
    uneven = per.filter(pl.col("recv_ratio").max().over("instance") >= min_imbalance)
    if uneven.height == 0 or sync.height == 0:
        return pl.DataFrame(schema=COST_SCHEMA)
    start = sync.group_by("instance").agg(start_ns=pl.col("last_arrival_ns").max())
    after = sync.filter(pl.col("prev_instance").is_not_null()).select(
        instance="prev_instance", rank=pl.col("rank").cast(pl.Int32),
        next_instance="instance", next_ns="arrival_ns").sort("next_ns").unique(
        ["instance", "rank"], keep="first", maintain_order=True)
    points = (uneven.with_columns(pl.col("rank").cast(pl.Int32))
              .join(start, on="instance").join(after, on=["instance", "rank"])
              .with_columns(stretch=(pl.col("next_ns") - pl.col("start_ns")).cast(pl.Float64),
                            v=pl.col("recv").cast(pl.Float64)))
    if points.height == 0:
        return pl.DataFrame(schema=COST_SCHEMA)
    dv = pl.col("v") - pl.col("v").mean()
    ds = pl.col("stretch") - pl.col("stretch").mean()
    hot_first = points.sort("recv", "rank", descending=[True, False])
    fit = hot_first.group_by("instance", maintain_order=True).agg(
        pl.col("step").first(), n=pl.len(),
        next_instance=pl.col("next_instance").mode().sort().first(),
        recv_imbalance=pl.col("recv_ratio").max(),
        hot_rank=pl.col("rank").first(), hot_v=pl.col("v").first(),
        hot_stretch=pl.col("stretch").first(),
        others=pl.col("stretch").slice(1).max(), mean_v=pl.col("mean_recv").first(),
        var=(dv * dv).sum(), cov=(dv * ds).sum(), v_bar=pl.col("v").mean(),
        s_bar=pl.col("stretch").mean()).filter((pl.col("n") >= 2) & (pl.col("var") > 0))
    b = pl.col("cov") / pl.col("var")
    lead = (pl.col("hot_stretch") - pl.col("others")).clip(0)
    return fit.with_columns(ns_per_byte=b, lead_ns=lead).with_columns(
        balanced_ns=pl.col("s_bar") + pl.col("ns_per_byte") * (pl.col("mean_v") - pl.col("v_bar")),
        cost_ns=pl.when(pl.col("ns_per_byte") > 0).then(pl.min_horizontal(
            pl.col("ns_per_byte") * (pl.col("hot_v") - pl.col("mean_v")), "lead_ns"))
        .otherwise(0.0).clip(0)).select(
        "step", "instance", "next_instance", "hot_rank", "recv_imbalance",
        hot_stretch_ns=pl.col("hot_stretch").round(0), lead_ns=pl.col("lead_ns").round(0),
        ns_per_byte="ns_per_byte", balanced_ns=pl.col("balanced_ns").round(0),
        cost_ns=pl.col("cost_ns").round(0)).cast(COST_SCHEMA)


def alltoall(matrix: pl.DataFrame, *, sync: pl.DataFrame, steps: pl.DataFrame,
             ranks: Sequence[int] = (), min_imbalance: float = MIN_IMBALANCE) -> dict[str, Any]:
    """The all-to-all answer (module docstring; ``docs/metrics.md``, *All-to-all*).

    ``matrix``: :func:`alltoall_matrix`; ``sync``: the dependency graph's sync points
    (aligned); ``steps``: :func:`~traceview.analyses.window.step_spans`; ``ranks``: the
    window's ranks, those reported and compared (none: every rank of the matrix). Returns ``ranks`` (``RANK_SCHEMA``),
    ``hot_rank``, ``imbalance``, ``recv_ratio``, ``cost_ns_per_step``, ``step_ns``,
    ``cost_share``, ``steps`` (the number the means are over), ``matrix`` (per step,
    ``STEP_MATRIX_SCHEMA``), ``exchanges`` (``EXCHANGE_SCHEMA``) and ``costs``
    (``COST_SCHEMA``)."""
    step_ns = steps.get_column("step_time_ns").median() if steps.height else None
    step_ns = int(round(step_ns)) if step_ns is not None else None
    # the ranks reported: the window's (a peer outside it is only known from their side)
    all_ranks = sorted(map(int, ranks)) or sorted({*matrix.get_column("src").to_list(),
                                                    *matrix.get_column("dst").to_list()})
    if matrix.height == 0:
        table = pl.DataFrame({"rank": all_ranks}, schema={"rank": pl.Int32}).with_columns(
            *(pl.lit(None, t).alias(c) for c, t in RANK_SCHEMA.items() if c != "rank"))
        return {"ranks": table.select(list(RANK_SCHEMA)), "hot_rank": None, "imbalance": None,
                "recv_ratio": None, "cost_ns_per_step": None, "step_ns": step_ns,
                "cost_share": None, "steps": 0,
                "matrix": pl.DataFrame(schema=STEP_MATRIX_SCHEMA),
                "exchanges": pl.DataFrame(schema=EXCHANGE_SCHEMA),
                "costs": pl.DataFrame(schema=COST_SCHEMA)}
    vol = _volumes(matrix).filter(pl.col("rank").is_in(all_ranks))
    ex = exchanges(vol)
    n_steps = max(ex.get_column("step").n_unique(), 1)
    # each step's most uneven exchange of each group, by what its ranks received (and by
    # what they sent): a rank's ratio is against the mean of its group's ranks
    def heaviest(column: str, side: str) -> pl.DataFrame:
        pick = ex.sort([column, "instance"], descending=[True, False], nulls_last=True) \
            .unique(["step", "group"], keep="first", maintain_order=True).select("instance")
        per = vol.join(pick, on="instance").group_by("group", "rank").agg(
            v=pl.col(side).sum())
        mean = pl.col("v").mean().over("group")
        return per.with_columns(ratio=pl.when(mean > 0).then(pl.col("v") / mean)) \
            .group_by("rank").agg(pl.col("ratio").max()).with_columns(pl.col("rank")
                                                                     .cast(pl.Int32))

    recv_at = heaviest("recv_imbalance", "recv").rename({"ratio": "recv_ratio"})
    send_at = heaviest("send_imbalance", "send").rename({"ratio": "send_ratio"})
    totals = vol.group_by("rank").agg(send_bytes=pl.col("send").sum(),
                                      recv_bytes=pl.col("recv").sum(), calls=pl.len())
    table = (pl.DataFrame({"rank": all_ranks}, schema={"rank": pl.Int32})
             .join(totals.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
             .join(recv_at, on="rank", how="left").join(send_at, on="rank", how="left")
             .with_columns(pl.col("send_bytes", "recv_bytes", "calls").fill_null(0))
             .with_columns(send_bytes_per_step=pl.col("send_bytes") // n_steps,
                           recv_bytes_per_step=pl.col("recv_bytes") // n_steps))
    ratios = table.filter(pl.col("recv_ratio").is_not_null()).sort(
        ["recv_ratio", "rank"], descending=[True, False])
    imbalance = float(ratios.get_column("recv_ratio")[0]) if ratios.height else None
    hot = int(ratios.get_column("rank")[0]) if imbalance and imbalance >= min_imbalance \
        else None
    table = table.with_columns(hot=pl.col("rank") == hot if hot is not None else pl.lit(False))
    cost_rows = costs(vol, sync, min_imbalance=min_imbalance)
    per_step = int(cost_rows.get_column("cost_ns").sum()) // n_steps if cost_rows.height \
        else 0
    step_matrix = matrix.group_by("step", "src", "dst").agg(pl.col("bytes").sum()).sort(
        "step", "src", "dst", nulls_last=True)
    return {"ranks": table.select(list(RANK_SCHEMA)).cast(RANK_SCHEMA), "hot_rank": hot,
            "imbalance": imbalance, "recv_ratio": imbalance if hot is not None else None,
            "cost_ns_per_step": per_step, "step_ns": step_ns,
            "cost_share": per_step / step_ns if step_ns else None, "steps": n_steps,
            "matrix": step_matrix.select(list(STEP_MATRIX_SCHEMA)).cast(STEP_MATRIX_SCHEMA),
            "exchanges": ex, "costs": cost_rows}


__all__ = ["CALL_SCHEMA", "COST_SCHEMA", "EXCHANGE_SCHEMA", "MATRIX_SCHEMA", "MIN_IMBALANCE",
           "RANK_SCHEMA", "STEP_MATRIX_SCHEMA", "alltoall", "alltoall_calls",
           "alltoall_matrix", "costs", "exchanges", "pair_calls"]
