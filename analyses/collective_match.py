"""Find the collective operations in a trace and match each instance across ranks.

Two steps, both pure functions over tables:

1. :func:`comm_events` picks one row per collective call per rank:

   * GPU side: communication kernels (``ncclKernel_*``, ``ncclDevKernel_*``, ``rccl*``; the
     selection is :func:`traceview.analyses.classify.is_comm_name`). Their start is the rank's
     arrival on the device, their end the completion.
   * CPU side (used for a rank only when it has no communication kernels): the backend's own
     work items (``gloo:all_reduce``, ``gloo:barrier``, ... on the gloo run-loop threads), whose
     span covers the blocking exchange. When a rank has none of those, the dispatcher ops
     (``c10d::allreduce_``, ``record_param_comms``, ``nccl:*`` annotations, ``*barrier*``) are
     used, flagged ``enqueue_only`` because for asynchronous backends they only enqueue work.
     Nested CPU events (``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce``)
     are merged into one call: the outer span, with the metadata of whichever member has it.
   * Point-to-point calls (send/recv, CPU side, and GPU kernels whose args name a send or
     recv) are left out: they have no all-ranks completion to match (``analyses/p2p.py``
     pairs them). SendRecv kernels that an all-to-all launched are that all-to-all
     (``_all_to_all_kernels``).

2. :func:`match_collectives` gives every call an ``instance`` key shared by the same collective
   on every participating rank:

   * ``comms_id``: the call's ``Comms Id`` when the trace carries one (recent PyTorch writes
     it in ``record_param_comms`` and NCCL kernel args: a hash of the process group, its
     sequence number and its ranks, so one value names one collective on every rank,
     whatever each rank calls the group);
   * ``seq``: (process group, sequence number) when the trace carries ``Seq`` (Kineto
     ``record_param_comms`` / NCCL kernel args, nsys NCCL payloads);
   * ``order``: otherwise (group, position within the group on that rank), accepted only when
     every rank of the group has the same number of calls and the same collective name at every
     position;
   * ``time``: when order matching is contradicted (sampled traces, ranks profiled over
     different windows), calls are paired by completion time: the clock offset between the two
     ranks is the mode of the pairwise end-time differences of same-named calls, and each call
     pairs with the nearest same-named call within ``tolerance_ns`` of that offset, one to one.

   Everything that could not be paired is reported in the ``problems`` table, never silently
   paired with the wrong call.

>>> from traceview.schema import events_frame
>>> rows = [dict(rank=r, file_id=r, source="kineto", kind="kernel", device=r, stream=7,
...              name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts_ns=t + 100 * r, dur_ns=50)
...         for r in (0, 1) for t in (1000, 5000)]
>>> m = match_collectives(comm_events(events_frame(rows)))
>>> m.instances.select("rank", "instance", "match").sort("instance", "rank").rows()
[(0, 'stream 7#0', 'order'), (1, 'stream 7#0', 'order'), (0, 'stream 7#1', 'order'), (1, 'stream 7#1', 'order')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from traceview.analyses.comm_kernels import NCCL_KERNELS
from traceview.analyses.names import matching, per_name
from traceview.analyses.process_groups import recover_groups
from traceview.analyses.window import ranks_present
from traceview.naming import collective_from_text, dtype_bytes

#: Collectives whose completion on any rank needs every rank to have arrived (causality holds,
#: and completions are nearly simultaneous): usable as clock anchors.
BLOCKING: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "barrier")

#: Point-to-point operations: no all-ranks completion.
P2P: tuple[str, ...] = ("send", "recv")

#: CPU-side names of a backend's own work items (their span is the blocking exchange).
_BACKEND_WORK = r"^(gloo|mpi|ucc):"
#: CPU-side dispatcher names (enqueue only for asynchronous backends).
_DISPATCH = r"^(c10d::|nccl:|record_param_comms$)|(?i)barrier"

COMM_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "side": pl.String, "group": pl.String, "seq": pl.Int64,
    "collective": pl.String, "name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64,
    "dur_ns": pl.Int64, "bytes": pl.Int64, "group_size": pl.Int32, "dtype": pl.String,
    "pg_ranks": pl.String, "enqueue_only": pl.Boolean, "comms_id": pl.String,
}

INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    **COMM_SCHEMA, "instance": pl.String, "position": pl.Int64, "match": pl.String,
}

PROBLEM_SCHEMA: dict[str, pl.DataType] = {
    "group": pl.String, "rank": pl.Int32, "problem": pl.String, "detail": pl.String,
}


GROUP_SCHEMA: dict[str, pl.DataType] = {
    "group": pl.String, "ranks": pl.List(pl.Int32), "match": pl.String,
    "calls_per_rank": pl.Int64, "paired": pl.Int64, "unpaired": pl.Int64,
    "tolerance_ns": pl.Int64,
}


@dataclass(frozen=True)
class MatchResult:
    """``instances``: one row per (instance, rank); ``problems``: what could not be matched;
    ``groups``: one row per group (``GROUP_SCHEMA``): how it was matched, with what tolerance."""

    instances: pl.DataFrame
    problems: pl.DataFrame
    groups: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=GROUP_SCHEMA))


def _text(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.String)


def comms_id(args_json: pl.Expr) -> pl.Expr:
    """The ``Comms Id`` in a row's raw args (text: the hash is an unsigned 64-bit number),
    null without one. It is not one of the parsed ``KINETO_ARGS`` columns: it is read from
    the raw args of the communication rows only (a few per step).

    >>> pl.DataFrame({"a": ['{"Seq": 3, "Comms Id": 18446744073709551615}', '{"Seq": 3}']}
    ...              ).select(c=comms_id(pl.col("a"))).get_column("c").to_list()
    ['18446744073709551615', None]
    """
    return args_json.str.extract(r'"Comms Id"\s*:\s*"?(-?\d+)', 1)


def comm_events(events: pl.LazyFrame | pl.DataFrame, *,
                ranks: Sequence[int] | None = None) -> pl.DataFrame:
    """One row per collective call per rank (see the module docstring for the selection).

    Columns: ``COMM_SCHEMA``. ``side`` is ``gpu`` or ``cpu``; ``group`` is the process group
    name when known, else its rank list, else ``stream <id>`` (GPU) or ``default`` (CPU).
    ``ranks``: the ranks with events, when the caller knows them (else they are read: a scan
    of every row's rank).
    """
    lf = events.lazy()
    name = _text("name")
    norm = pl.coalesce(_text("collective"), collective_from_text(name))
    has_args = "args_json" in lf.collect_schema().names()

    kernels = lf.filter((pl.col("kind") == "kernel") & pl.col("dur_ns").is_not_null())
    # The rule runs once per distinct kernel name (reading kind and name only); the matching
    # names then go into the scan's filter, so only the communication kernels' other columns
    # are decoded (a few hundred of ~700 k kernels in a large trace).
    names = lf.filter(pl.col("kind") == "kernel").select(pl.col("name").unique())
    # NCCL/RCCL kernels only: the calls matched across ranks by sequence (a DeepEP or custom
    # all-reduce kernel is communication time, but carries no collective sequence)
    comm_names = matching(names, NCCL_KERNELS).collect().get_column("name")
    gpu = (
        kernels.filter(pl.col("name").is_in(comm_names.implode()))
        .select(
            pl.col("rank").cast(pl.Int32),
            side=pl.lit("gpu"),
            group=pl.coalesce(_text("pg_name"), _text("pg_ranks"),
                              pl.lit("stream ") + pl.coalesce("stream", "tid").cast(pl.String)),
            seq=pl.col("seq"),
            collective=norm.fill_null("other"),
            name=name,
            ts_ns=pl.col("ts_ns"),
            end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
            bytes=pl.col("bytes"),
            group_size=pl.col("group_size").cast(pl.Int32),
            dtype=_text("dtype"),
            pg_ranks=_text("pg_ranks"),
            enqueue_only=pl.lit(False),
            comms_id=comms_id(_text("args_json")) if has_args else pl.lit(None, pl.String),
        )
        # a send or recv kernel (NCCL's SendRecv kernel carrying its call's p2p args) has
        # no all-ranks completion: it is paired by analyses/p2p.py, as on the CPU side
        .filter(~pl.col("collective").is_in(list(P2P)))
        .collect()
    )
    gpu = _all_to_all_kernels(lf, _without_p2p_kernels(lf, gpu))
    cpu_ranks = (pl.Series("rank", list(ranks), dtype=pl.Int32) if ranks is not None else
                 ranks_present(events).get_column("rank").cast(pl.Int32))
    gpu_ranks = gpu.get_column("rank").unique()
    cpu_only = cpu_ranks.filter(~cpu_ranks.is_in(gpu_ranks.implode()))
    if cpu_only.len() == 0:
        return gpu.with_columns(dur_ns=pl.col("end_ns") - pl.col("ts_ns")).select(
            list(COMM_SCHEMA)).cast(COMM_SCHEMA)
    cpu = _cpu_calls(lf.filter(pl.col("rank").cast(pl.Int32).is_in(cpu_only.implode())))
    out = pl.concat([gpu.with_columns(dur_ns=pl.col("end_ns") - pl.col("ts_ns")), cpu],
                    how="diagonal_relaxed")
    return out.select(list(COMM_SCHEMA)).cast(COMM_SCHEMA).sort("rank", "ts_ns")


def _without_p2p_kernels(lf: pl.LazyFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` without the SendRecv kernels that a send or recv launched: a kernel without
    the call's args is told by its launch (correlation id), inside ``record_param_comms`` of
    a send/recv on the same thread. (An all-to-all runs the same kernel.)"""
    unnamed = gpu.filter(pl.col("collective") == "send_recv")
    if unnamed.height == 0:
        return gpu
    keys = lf.filter((pl.col("kind") == "kernel") & pl.col("name").is_in(
        unnamed.get_column("name").unique().implode())).select(
        pl.col("rank").cast(pl.Int32), "ts_ns", correlation=pl.col("correlation").cast(pl.Int64))
    ops = lf.filter((_text("name") == "record_param_comms")
                    & pl.col("collective").cast(pl.String).is_in(list(P2P))).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64), _o_ts="ts_ns",
        _o_end=pl.col("ts_ns") + pl.col("dur_ns")).collect().sort("_o_ts")
    if ops.height == 0:
        return gpu
    launches = lf.filter(pl.col("kind").cast(pl.String).is_in(["cuda_runtime", "cuda_driver"])
                         & pl.col("correlation").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64), _l_ts="ts_ns",
        correlation=pl.col("correlation").cast(pl.Int64)).join(
        keys, on=["rank", "correlation"]).collect().sort("_l_ts")
    p2p = launches.join_asof(ops, left_on="_l_ts", right_on="_o_ts", by=["rank", "tid"],
                             strategy="backward", check_sortedness=False).filter(
        pl.col("_o_end") >= pl.col("_l_ts")).select("rank", "ts_ns")
    return gpu.join(p2p, on=["rank", "ts_ns"], how="anti")


def _all_to_all_kernels(lf: pl.LazyFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` with the SendRecv kernels that an all-to-all launched named ``all_to_all``:
    NCCL runs an all-to-all as grouped sends and receives, so the kernel's name says
    ``send_recv`` (param's 8-rank DLRM: its embedding all-to-all was matched as send_recv,
    and ``alltoall`` found none); its launch (correlation id) lies inside the all-to-all op
    on the same thread (``c10d::alltoall_base_``, ``record_param_comms``, ``nccl:all_to_all``
    whose collective is ``all_to_all``), for every SendRecv kernel of the group on every
    rank."""
    unnamed = gpu.filter(pl.col("collective") == "send_recv")
    if unnamed.height == 0:
        return gpu
    ops = lf.filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", "user_annotation"])
                    & (pl.col("collective").cast(pl.String) == "all_to_all")
                    & pl.col("dur_ns").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64), _o_ts="ts_ns",
        _o_end=pl.col("ts_ns") + pl.col("dur_ns")).collect().sort("_o_ts")
    if ops.height == 0:
        return gpu
    keys = lf.filter((pl.col("kind") == "kernel") & pl.col("name").is_in(
        unnamed.get_column("name").unique().implode())).select(
        pl.col("rank").cast(pl.Int32), "ts_ns", correlation=pl.col("correlation").cast(pl.Int64))
    launches = lf.filter(pl.col("kind").cast(pl.String).is_in(["cuda_runtime", "cuda_driver"])
                         & pl.col("correlation").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), tid=pl.col("tid").cast(pl.Int64), _l_ts="ts_ns",
        correlation=pl.col("correlation").cast(pl.Int64)).join(
        keys, on=["rank", "correlation"]).collect().sort("_l_ts")
    inside = (launches.join_asof(ops, left_on="_l_ts", right_on="_o_ts", by=["rank", "tid"],
                                 strategy="backward", check_sortedness=False)
              .filter(pl.col("_o_end") >= pl.col("_l_ts"))
              .select("rank", "ts_ns", _a2a=pl.lit(True)).unique(["rank", "ts_ns"]))
    # a group's SendRecv kernels are renamed only when every one of them, on every rank,
    # lies in an all-to-all: a trace that lost some ops (HTA's sampled pair) would otherwise
    # name one rank's calls all_to_all and the other's send_recv, and pair nothing by order
    sr = pl.col("collective") == "send_recv"
    return (gpu.join(inside, on=["rank", "ts_ns"], how="left")
            .with_columns(_a2a=pl.col("_a2a").fill_null(False))
            .with_columns(_all=(pl.col("_a2a") | ~sr).all().over("group"))
            .with_columns(collective=pl.when(sr & pl.col("_all"))
                          .then(pl.lit("all_to_all")).otherwise(pl.col("collective")))
            .drop("_a2a", "_all"))


def shape_bytes(args_json: pl.Expr) -> pl.Expr:
    """Message size of a single-tensor op from its recorded shape: product of ``Input Dims``
    x the element size of ``Input type[0]``; null for several tensors or an unknown dtype.

    gloo writes no ``record_param_comms`` (so no ``In msg nelems``), but its work items
    (``gloo:all_reduce``) carry the tensor's shape when the profiler records shapes: it is
    what tells a 1 KiB tensor-parallel all-reduce from an 8 KiB data-parallel one.

    >>> df = pl.DataFrame({"a": ['{"Input Dims": [[256, 4]], "Input type": ["float"]}',
    ...                          '{"Input Dims": [[2], [3]], "Input type": ["float", "float"]}']})
    >>> df.select(b=shape_bytes(pl.col("a"))).get_column("b").to_list()
    [4096, None]
    """
    dims = args_json.str.json_path_match("$['Input Dims']")
    numel = (dims.str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64).product())
             .list.first())
    one_tensor = dims.str.contains(r"^\[\[[0-9, ]*\]\]$")
    size = dtype_bytes(args_json.str.json_path_match("$['Input type'][0]"))
    return pl.when(one_tensor).then(numel * size)


def _cpu_calls(lf: pl.LazyFrame) -> pl.DataFrame:
    """CPU-side calls: nested comm events merged per (rank, thread); backend work preferred.
    With ``args_json`` in ``lf``, backend work items without a message size get it from
    their recorded shape (:func:`shape_bytes`)."""
    name = _text("name")
    rows = lf.filter(pl.col("kind").is_in(["cpu_op", "user_annotation"])
                     & pl.col("dur_ns").is_not_null())
    if "args_json" in lf.collect_schema().names():
        # the shapes of the backend's work items only (a few rows): args_json is most of
        # a trace's bytes, so it never travels with the other rows
        # (their names first, then the names in the scan's filter: a join on names read
        # args_json of every CPU op, ~0.3 MB per rank held at once; 1.9 GB for 5,000 ranks)
        backend = matching(rows.select(pl.col("name").unique()), _BACKEND_WORK).collect()
        shapes = rows.filter(pl.col("bytes").is_null()
                             & pl.col("name").is_in(backend.get_column("name").implode())
                             ).select("rank", "tid", "ts_ns", "name",
                                      shape_bytes=shape_bytes(pl.col("args_json")
                                                              .cast(pl.String)))
        # the dispatcher's record of the call (record_param_comms) may carry its Comms Id
        ids = rows.filter(pl.col("name").cast(pl.String) == "record_param_comms").select(
            "rank", "tid", "ts_ns", "name",
            comms_id=comms_id(pl.col("args_json").cast(pl.String)))
        rows = rows.drop("args_json").join(shapes, on=["rank", "tid", "ts_ns", "name"],
                                           how="left", nulls_equal=True, maintain_order="left")
        rows = rows.join(ids, on=["rank", "tid", "ts_ns", "name"], how="left",
                         nulls_equal=True, maintain_order="left")
        rows = rows.with_columns(bytes=pl.coalesce("bytes", "shape_bytes"))
    else:
        rows = rows.with_columns(comms_id=pl.lit(None, pl.String))
    ops = per_name(  # the name rules run once per distinct name
        rows, _backend=name.str.contains(_BACKEND_WORK), _dispatch=name.str.contains(_DISPATCH))
    cand = ops.filter(
        pl.col("_backend") | pl.col("_dispatch") | pl.col("collective").is_not_null()
    ).select(
        pl.col("rank").cast(pl.Int32),
        tid=pl.coalesce(pl.col("tid"), pl.lit(0)),
        name=name,
        ts_ns="ts_ns",
        end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
        norm=pl.coalesce(_text("collective"), collective_from_text(name)),
        seq="seq", pg_name=_text("pg_name"), pg_ranks=_text("pg_ranks"), bytes="bytes",
        group_size=pl.col("group_size").cast(pl.Int32), dtype=_text("dtype"),
        backend_work=pl.col("_backend"), comms_id="comms_id",
    ).sort("rank", "tid", "ts_ns", pl.col("end_ns"), descending=[False, False, False, True])
    # Merge nested events: a new call starts where ts > running max of previous ends.
    cand = cand.with_columns(
        prev_end=pl.col("end_ns").cum_max().shift(1).over("rank", "tid"),
    ).with_columns(
        new=(pl.col("prev_end").is_null() | (pl.col("ts_ns") >= pl.col("prev_end"))),
    ).with_columns(call=pl.col("new").cast(pl.Int64).cum_sum().over("rank", "tid"))
    calls = cand.group_by("rank", "tid", "call").agg(
        ts_ns=pl.col("ts_ns").min(),
        end_ns=pl.col("end_ns").max(),
        name=pl.col("name").first(),
        collective=pl.col("norm").drop_nulls().first(),
        seq=pl.col("seq").drop_nulls().first(),
        pg_name=pl.col("pg_name").drop_nulls().first(),
        pg_ranks=pl.col("pg_ranks").drop_nulls().first(),
        bytes=pl.col("bytes").drop_nulls().first(),
        group_size=pl.col("group_size").drop_nulls().first(),
        dtype=pl.col("dtype").drop_nulls().first(),
        backend_work=pl.col("backend_work").any(),
        comms_id=pl.col("comms_id").drop_nulls().first(),
    ).collect()
    calls = calls.with_columns(
        has_backend=pl.col("backend_work").any().over("rank"),
        collective=pl.col("collective").fill_null("other"),
    ).filter(
        (pl.col("backend_work") | ~pl.col("has_backend"))
        & ~pl.col("collective").is_in(list(P2P))
    )
    return calls.select(
        "rank",
        side=pl.lit("cpu"),
        group=pl.coalesce("pg_name", "pg_ranks", pl.lit("default")),
        seq="seq", collective="collective", name="name", ts_ns="ts_ns", end_ns="end_ns",
        dur_ns=pl.col("end_ns") - pl.col("ts_ns"), bytes="bytes", group_size="group_size",
        dtype="dtype", pg_ranks="pg_ranks", enqueue_only=~pl.col("backend_work"),
        comms_id="comms_id",
    ).cast({"rank": pl.Int32})


#: Completion residuals below this are clock resolution and thread wake-up: a learnt
#: tolerance never goes below it.
TOLERANCE_FLOOR_NS = 50_000
#: The learnt tolerance is this many robust standard deviations (1.4826 x MAD) of the
#: residuals: about one false rejection in 1.7 million for Gaussian noise.
TOLERANCE_SIGMAS = 5.0
#: Order pairing is contradicted when the residual noise (one robust standard deviation) is
#: above this share of the mean spacing between a rank's calls: time then cannot tell a call
#: from its neighbour, and the residuals are what a wrong pairing produces.
MAX_NOISE_TO_SPACING = 0.25
#: Width of the bins in which pairwise completion differences vote on a clock offset, for
#: time matching (the vote only, not the pairing's tolerance).
VOTE_WINDOW_NS = 500_000

def robust_tolerance(residuals: pl.Series) -> int:
    """``max(TOLERANCE_FLOOR_NS, TOLERANCE_SIGMAS x 1.4826 x MAD)`` of ``residuals`` (ns).

    >>> robust_tolerance(pl.Series([0, 100_000, -100_000, 20_000, 5_000_000]))
    593040
    """
    r = residuals.drop_nulls().cast(pl.Float64)
    if r.len() == 0:
        return TOLERANCE_FLOOR_NS
    mad = float((r - r.median()).abs().median())
    return max(TOLERANCE_FLOOR_NS, round(TOLERANCE_SIGMAS * 1.4826 * mad))


def match_collectives(
    comm: pl.DataFrame,
    *,
    ranks: pl.DataFrame | None = None,
    tolerance_ns: int | None = None,
    max_vote: int = 512,
) -> MatchResult:
    """Give each call of :func:`comm_events` an ``instance`` key shared across ranks.

    ``ranks``: the ranks table; its ``pg_config`` recovers the process group of calls that do
    not name one (:mod:`traceview.analyses.process_groups`). ``tolerance_ns``: how far apart
    (after the clock offset) two completions of one instance may be; None (the default)
    learns it per group from the run's own residuals (:func:`robust_tolerance`).
    ``max_vote`` caps the calls per rank used to vote on a clock offset. Returns
    ``MatchResult(instances, problems, groups)``; instances add ``instance`` (text key),
    ``position`` (sequence number, or position in the group) and ``match``
    (``comms_id``/``seq``/``order``/``time``); ``groups`` says per group how it was matched.
    """
    if comm.height == 0:
        return MatchResult(pl.DataFrame(schema=INSTANCE_SCHEMA),
                           pl.DataFrame(schema=PROBLEM_SCHEMA), pl.DataFrame(schema=GROUP_SCHEMA))
    problems: list[pl.DataFrame] = []
    if ranks is not None:
        comm, found = recover_groups(comm, ranks,
                                     floor_ns=tolerance_ns or TOLERANCE_FLOOR_NS)
        problems.append(pl.DataFrame(found, schema=PROBLEM_SCHEMA))
    comm = comm.sort("rank", "group", "ts_ns")
    if "comms_id" not in comm.columns:
        comm = comm.with_columns(comms_id=pl.lit(None, pl.String))
    # Comms Id first: it names the collective itself (group, sequence number and ranks), so
    # it pairs calls that a per-rank group name or a restarted Seq would not
    with_id = comm.filter(pl.col("comms_id").is_not_null())
    by_id = with_id.with_columns(
        position=pl.coalesce("seq", pl.int_range(pl.len()).over("rank", "group")).cast(pl.Int64),
        instance=pl.lit("comms ") + pl.col("comms_id"),
        match=pl.lit("comms_id"),
    ).with_columns(group=pl.col("group").first().over("instance"))
    every_call, comm = comm, comm.filter(pl.col("comms_id").is_null())
    with_seq = comm.filter(pl.col("seq").is_not_null())
    by_seq = with_seq.with_columns(
        position=pl.col("seq"),
        instance=pl.col("group") + pl.lit("#") + pl.col("seq").cast(pl.String),
        match=pl.lit("seq"),
    )
    rest = comm.filter(pl.col("seq").is_null()).with_columns(
        position=pl.int_range(pl.len()).over("rank", "group").cast(pl.Int64))
    parts = [by_id, by_seq]
    tolerances = {g: 0 for g in pl.concat([by_id.get_column("group"),
                                           by_seq.get_column("group")]).unique()}
    problems.append(_seq_problems(by_id))
    problems.append(_seq_problems(by_seq))
    for (group,), g in rest.group_by("group", maintain_order=True):
        if str(group).startswith("unresolved:"):
            continue  # no group identity: pairing these would be a guess
        ok, probs = _order_consistent(g)
        tol = tolerance_ns
        if ok:
            ok, probs, tol = _order_timing_consistent(g, tolerance_ns)
        problems.append(probs)
        if ok:
            parts.append(g.with_columns(
                instance=pl.col("group") + pl.lit("#") + pl.col("position").cast(pl.String),
                match=pl.lit("order")))
        else:
            matched, unmatched, tol = _match_by_time(g, tolerance_ns=tolerance_ns,
                                                     max_vote=max_vote)
            parts.append(matched)
            problems.append(unmatched)
        tolerances[group] = tol
    inst = pl.concat([p.select(list(INSTANCE_SCHEMA)).cast(INSTANCE_SCHEMA) for p in parts])
    probs = pl.concat([p.select(list(PROBLEM_SCHEMA)).cast(PROBLEM_SCHEMA) for p in problems])
    return MatchResult(inst.sort("instance", "rank"), probs.sort("group", "rank"),
                       _groups(every_call, inst, tolerances))


def _groups(comm: pl.DataFrame, inst: pl.DataFrame, tolerances: dict) -> pl.DataFrame:
    """Per group: its ranks, how it was matched, calls per rank, calls paired and not."""
    paired = inst.filter(pl.col("rank").n_unique().over("instance") >= 2).group_by("group").agg(
        paired=pl.len(), match=pl.col("match").unique().sort().str.join("+"))
    calls = comm.group_by("group").agg(
        ranks=pl.col("rank").unique().sort(), calls=pl.len(),
        calls_per_rank=pl.col("rank").value_counts().struct.field("count").max())
    tol = pl.DataFrame({"group": list(tolerances), "tolerance_ns": list(tolerances.values())},
                       schema={"group": pl.String, "tolerance_ns": pl.Int64})
    return (
        calls.join(paired, on="group", how="left").join(tol, on="group", how="left")
        .with_columns(pl.col("paired").fill_null(0),
                      pl.col("match").fill_null("unresolved"))
        .with_columns(unpaired=pl.col("calls") - pl.col("paired"))
        .select(list(GROUP_SCHEMA)).cast(GROUP_SCHEMA).sort("group")
    )


def _seq_problems(by_seq: pl.DataFrame) -> pl.DataFrame:
    """Seq-matched instances whose ranks disagree on the collective, or miss a member."""
    if by_seq.height == 0:
        return pl.DataFrame(schema=PROBLEM_SCHEMA)
    inst = by_seq.group_by("group", "instance").agg(
        names=pl.col("collective").n_unique(),
        n=pl.col("rank").n_unique(),
        size=pl.col("group_size").max(),
    )
    bad_names = inst.filter(pl.col("names") > 1).select(
        "group", rank=pl.lit(None, pl.Int32), problem=pl.lit("name_mismatch"),
        detail=pl.lit("ranks disagree on the collective at ") + pl.col("instance"))
    missing = inst.filter(pl.col("size").is_not_null() & (pl.col("n") < pl.col("size")))
    present = by_seq.get_column("rank").n_unique()
    short = missing.filter(pl.col("n") < present).select(
        "group", rank=pl.lit(None, pl.Int32), problem=pl.lit("missing_rank"),
        detail=pl.col("instance") + pl.lit(": ") + pl.col("n").cast(pl.String)
        + pl.lit(" of ") + pl.col("size").cast(pl.String) + pl.lit(" ranks present"))
    return pl.concat([bad_names, short])


def _order_consistent(g: pl.DataFrame) -> tuple[bool, pl.DataFrame]:
    """Whether (group, position) matching is safe: equal counts, equal names at every position."""
    group = g.get_column("group")[0]
    counts = g.group_by("rank").agg(n=pl.len()).sort("rank")
    probs = []
    if counts.height < 2:
        return True, pl.DataFrame(schema=PROBLEM_SCHEMA)
    if counts.get_column("n").n_unique() > 1:
        most = counts.get_column("n").max()
        probs.append(counts.filter(pl.col("n") != most).select(
            group=pl.lit(group), rank="rank", problem=pl.lit("count_mismatch"),
            detail=pl.lit("has ") + pl.col("n").cast(pl.String) + pl.lit(" calls, others up to ")
            + pl.lit(str(most)) + pl.lit(" (different profiling windows or sampled trace)")))
    names = g.group_by("position").agg(n=pl.col("collective").n_unique(),
                                       names=pl.col("collective").unique().sort().str.join("/"))
    bad = names.filter(pl.col("n") > 1).sort("position")
    if bad.height:
        first = bad.row(0, named=True)
        probs.append(pl.DataFrame({
            "group": [group], "rank": [None], "problem": ["name_mismatch"],
            "detail": [f"{bad.height} positions where ranks disagree on the collective, first "
                       f"at position {first['position']}: {first['names']}"]}))
    if not probs:
        return True, pl.DataFrame(schema=PROBLEM_SCHEMA)
    out = pl.concat([p.cast({"rank": pl.Int32}) for p in probs], how="diagonal_relaxed")
    return False, out


#: Order matching is rejected when more than this share of a rank's positions have completion
#: times beyond the tolerance from the rank's median clock offset.
MAX_DISAGREEING = 0.5


def _order_timing_consistent(g: pl.DataFrame,
                             tolerance_ns: int | None) -> tuple[bool, pl.DataFrame, int]:
    """Order pairs must also agree in time: end[r, k] - end[ref, k] is one clock offset, up to
    noise that time can resolve. Returns (accepted, problems, tolerance used)."""
    group = g.get_column("group")[0]
    ref_rank = g.get_column("rank").min()
    ref = g.filter(pl.col("rank") == ref_rank).select("position", ref_end="end_ns")
    d = g.filter(pl.col("rank") != ref_rank).join(ref, on="position").with_columns(
        d=pl.col("end_ns") - pl.col("ref_end"))
    if d.height == 0:
        return True, pl.DataFrame(schema=PROBLEM_SCHEMA), tolerance_ns or TOLERANCE_FLOOR_NS
    d = d.with_columns(res=pl.col("d") - pl.col("d").median().over("rank"))
    tol = tolerance_ns if tolerance_ns is not None else robust_tolerance(d.get_column("res"))
    per = d.with_columns(dev=pl.col("res").abs()).group_by("rank").agg(
        bad=(pl.col("dev") > tol).mean(), n=pl.len(), worst=pl.col("dev").max())
    bad = per.filter(pl.col("bad") > MAX_DISAGREEING)
    ends = ref.get_column("ref_end")
    spacing = (ends.max() - ends.min()) / max(ends.len() - 1, 1)
    noise = tol / TOLERANCE_SIGMAS
    if tolerance_ns is None and ends.len() > 2 and noise > MAX_NOISE_TO_SPACING * spacing:
        return False, pl.DataFrame([{
            "group": group, "rank": None, "problem": "order_timing_mismatch",
            "detail": f"order pairing contradicted by timing: completion residuals scatter "
                      f"by {round(noise)} ns (robust sd), more than "
                      f"{MAX_NOISE_TO_SPACING:.0%} of the {round(spacing)} ns between "
                      f"successive calls"}], schema=PROBLEM_SCHEMA), tol
    if bad.height == 0:
        return True, pl.DataFrame(schema=PROBLEM_SCHEMA), tol
    return False, bad.select(
        group=pl.lit(group), rank="rank", problem=pl.lit("order_timing_mismatch"),
        detail=pl.lit("order pairing contradicted by timing: ")
        + (pl.col("bad") * pl.col("n")).round(0).cast(pl.Int64).cast(pl.String)
        + pl.lit(" of ") + pl.col("n").cast(pl.String)
        + pl.lit(f" completions differ from rank {ref_rank}'s by more than the median offset "
                 f"+/- {tol} ns (worst ")
        + pl.col("worst").cast(pl.String) + pl.lit(" ns)")).cast({"rank": pl.Int32}), tol


def _mode_offset(ref: pl.DataFrame, other: pl.DataFrame, tolerance_ns: int,
                 max_vote: int) -> tuple[int | None, int]:
    """Clock offset other - ref with the most same-named end pairs within ``tolerance_ns``."""
    a = ref.head(max_vote).select("collective", e0="end_ns")
    b = other.head(max_vote).select("collective", e1="end_ns")
    diffs = a.join(b, on="collective").select(d=pl.col("e1") - pl.col("e0")).sort("d")
    if diffs.height == 0:
        return None, 0
    d = diffs.get_column("d")
    lo = d.search_sorted(d - tolerance_ns, side="left")
    hi = d.search_sorted(d + tolerance_ns, side="right")
    votes = (hi - lo).alias("votes")
    best = int(votes.arg_max())
    near = d.filter((d - d[best]).abs() <= tolerance_ns)
    return int(near.median()), int(votes[best])


def _match_by_time(g: pl.DataFrame, *, tolerance_ns: int | None,
                   max_vote: int) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Pair calls of one group by completion time against a reference rank (see module doc).
    Without ``tolerance_ns`` the tolerance is learnt from the nearest-neighbour residuals
    under the voted offsets. Returns (matched, problems, tolerance used)."""
    group = g.get_column("group")[0]
    counts = g.group_by("rank").agg(n=pl.len()).sort(["n", "rank"], descending=[True, False])
    ref_rank = counts.get_column("rank")[0]
    ref = g.filter(pl.col("rank") == ref_rank).sort("ts_ns")
    pieces = [ref.with_columns(
        instance=pl.lit(f"{group}@t") + pl.col("position").cast(pl.String),
        match=pl.lit("time"))]
    probs: list[dict] = []
    paired_ref: set[int] = set()
    window = tolerance_ns or VOTE_WINDOW_NS
    nearest = {}
    for rank in counts.get_column("rank").to_list()[1:]:
        other = g.filter(pl.col("rank") == rank).sort("ts_ns")
        off, votes = _mode_offset(ref, other, window, max_vote)
        if off is not None:
            nearest[rank] = (off, votes, _nearest(other, ref, off))
    if tolerance_ns is None:
        # the noise of the pairs the vote found: residuals within the vote window
        close = [n.filter(pl.col("err") <= window).get_column("err")
                 for _, _, n in nearest.values()]
        tolerance_ns = robust_tolerance(pl.concat(close)) if close else TOLERANCE_FLOOR_NS
    for rank in counts.get_column("rank").to_list()[1:]:
        other = g.filter(pl.col("rank") == rank).sort("ts_ns")
        if rank not in nearest:
            probs.append({"group": group, "rank": rank, "problem": "unmatched",
                          "detail": f"no call shares a collective name with rank {ref_rank}"})
            continue
        off, votes, near = nearest[rank]
        cand = (
            near.filter(pl.col("err") <= tolerance_ns)
            # one to one: the closest call wins each reference call
            .sort("err").unique("position_ref", keep="first", maintain_order=True)
        )
        paired_ref.update(cand.get_column("position_ref").to_list())
        pieces.append(cand.with_columns(
            instance=pl.lit(f"{group}@t") + pl.col("position_ref").cast(pl.String),
            match=pl.lit("time")).drop("key", "rkey", "err", "position_ref"))
        lost = other.height - cand.height
        probs.append({"group": group, "rank": rank, "problem": "time_matched",
                      "detail": f"order matching contradicted; paired {cand.height} of "
                                f"{other.height} calls with rank {ref_rank} by completion time "
                                f"(clock offset {off} ns, {votes} votes, tolerance "
                                f"{tolerance_ns} ns); {lost} unmatched"})
    matched = pl.concat([p.select(list(INSTANCE_SCHEMA)).cast(INSTANCE_SCHEMA) for p in pieces])
    n_ref_unpaired = ref.height - len(paired_ref)
    if counts.height > 1:
        probs.append({"group": group, "rank": ref_rank, "problem": "time_matched",
                      "detail": f"reference rank for time matching; {n_ref_unpaired} of "
                                f"{ref.height} calls have no partner"})
    # Keep only instances seen on at least two ranks.
    matched = matched.filter(pl.col("rank").n_unique().over("instance") >= 2)
    prob = pl.DataFrame(probs, schema=PROBLEM_SCHEMA) if probs else pl.DataFrame(
        schema=PROBLEM_SCHEMA)
    return matched, prob, tolerance_ns


def _nearest(other: pl.DataFrame, ref: pl.DataFrame, off: int) -> pl.DataFrame:
    """Each call of ``other`` with the reference call whose completion is nearest after the
    clock offset, and the distance ``err``."""
    return (
        other.with_columns(key=pl.col("end_ns") - off).sort("key")
        .join_asof(ref.select("collective", "position", rkey="end_ns").sort("rkey"),
                   left_on="key", right_on="rkey", by="collective", strategy="nearest",
                   check_sortedness=False, suffix="_ref")
        .with_columns(err=(pl.col("key") - pl.col("rkey")).abs())
    )
