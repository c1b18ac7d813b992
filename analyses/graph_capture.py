"""Kernels replayed from a CUDA/HIP graph, charged to the ops captured into the graph.

A graph replay (``cudaGraphLaunch``/``hipGraphLaunch``) runs every node of the graph under the
launch's one correlation id: the op around the launch call did not launch them, the ops that
ran while the graph was *captured* did (``torch.cuda.graph``, vLLM's and SGLang's graph
runners, ``torch.compile(mode="reduce-overhead")``). The capture is usually profiled apart
from the replay (a trace of the capture, one of the serving). Given the capture trace:

* a **capture** is the launches on one thread between a ``*StreamBeginCapture*`` call and the
  next ``*StreamEndCapture*`` call (kernel launches, copies and sets; a launch call nested in
  another launch call is the same launch), in the order they were called: each becomes one
  node of the graph. A launch's op is the innermost op around it in the capture's host op tree
  (``analyses/op_kernels.py``: the owner is the innermost modelled op, as for a plain launch);
* a **replay** is the GPU events of one graph launch, in the order of their graph node ids
  (Kineto's ``graph node id``, CUDA 12+: the nodes' creation order, which is the capture's)
  where every event has one, else of their start;
* a replay matches a capture when they hold the same nodes: per key, as many events as
  launches, the key being the kernel's name (``args.kernel`` on the capture's launch calls,
  which ROCm's profiler writes) or, where the capture names no kernels (CUPTI writes only
  the call), kernel, memcpy or memset. The k-th event of a key is the k-th launch of that key:
  positional on one stream, and the same kernel's occurrences in order on several. Where the
  capture names its kernels, a replay that is the capture less a few launches (at most 1%, at
  least 1: a node the replay did not run or the profiler dropped) matches too, in order;
* several captures can hold the same nodes (vLLM's piecewise graphs: one per layer). Those
  whose launches have the same ops with the same recorded arguments are one answer: the k-th
  such replay takes the (k mod m)-th such capture, in capture order (a whole forward pass
  replays its pieces in the order they were captured). Captures that hold the same nodes but
  whose ops differ (two batch sizes with the same kernels) cannot be told apart: their
  replays stay unattributed, and a warning says so. Nothing is ever split between captures.

A replay that matches no capture stays unattributed (``graph_replayed``, no owner), with a
warning naming how many; a capture trace of another program attributes nothing. Per replay,
each captured op that owns time is one op instance (``INSTANCE_SCHEMA``): its direct, subtree
and owned GPU time are that replay's; its name, thread, times and recorded arguments are the
capture's (``op_args``). Definitions: docs/metrics.md, "Graph replays and their capture".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import polars as pl

from traceview._dependencies import lazy_module

from .op_kernels import GRAPH_LAUNCH, INSTANCE_SCHEMA, HostTree, host_tree, launch_rows, owners
from .ops import ARG_KEYS, op_args

np = lazy_module("numpy")

Frame = pl.LazyFrame | pl.DataFrame

#: The runtime calls that open and close a stream capture (CUDA and HIP).
BEGIN_CAPTURE = r"StreamBeginCapture"
END_CAPTURE = r"StreamEndCapture"
#: Runtime and driver calls that put a node with GPU work into a captured graph: kernel
#: launches (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``hipModuleLaunchKernel``, ...),
#: copies and sets; not a host-function node (``cudaLaunchHostFunc``: no GPU event).
NODE_CALL = r"(?i)launch|memcpy|memset"
HOST_NODE_CALL = r"(?i)LaunchHostFunc"
#: How a replay may fall short of its capture when the capture names its kernels: at most
#: this fraction of the capture's launches missing (and at least one).
MISSING_NODES = 0.01


@dataclasses.dataclass(frozen=True)
class Captures:
    """The graphs a capture trace recorded. ``launches``: one row per captured launch:
    ``capture`` (the capture's number), ``seq`` (its position in the capture), ``rank``,
    ``correlation`` (the launch call's), ``key`` (kernel name, or kernel/memcpy/memset when
    the capture names no kernels), ``named`` (whether the capture names its kernels),
    ``owner`` and ``launch_op`` (rows of ``tree.rows``; -1: launched outside every op).
    ``meaning``: per capture, a hash of its launches' owners and their recorded arguments
    (equal for captures that charge the same ops). ``args``: the owners' recorded arguments
    (``op_args`` columns) by row."""

    tree: HostTree
    launches: pl.DataFrame
    meaning: pl.DataFrame
    args: pl.DataFrame


def read_captures(events: Frame, *, modelled: Callable[[str], bool] = lambda name: False,
                  ) -> Captures:
    """The captures in a capture trace's ``events`` (every column of ``traceview.schema``,
    ``args_json`` included: the launch calls' ``kernel`` and the ops' recorded arguments)."""
    host = (events.lazy()
            .filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", "cuda_runtime",
                                                          "cuda_driver"]))
            .select("rank", "kind", pl.col("name").cast(pl.String), "pid", "tid", "ts_ns",
                    "dur_ns", "correlation", "args_json")
            .collect())
    tree = host_tree(host.drop("args_json"), modelled=modelled)
    rows = tree.rows.with_row_index("_row")
    calls = rows.filter(pl.col("kind").cast(pl.String) != "cpu_op")
    windows = _capture_windows(calls)
    named_calls = (launch_rows(tree.rows).filter(~pl.col("_graph"))
                   .join(rows.select("_row", "pid", "tid", "ts_ns", "name"), on="_row")
                   .filter(pl.col("name").str.contains(NODE_CALL)
                           & ~pl.col("name").str.contains(GRAPH_LAUNCH)
                           & ~pl.col("name").str.contains(HOST_NODE_CALL)))
    # a launch call inside another launch call (a runtime call over its driver call) is one node
    parent = tree.parent[named_calls.get_column("_row").to_numpy()]
    is_call = np.isin(parent, calls.get_column("_row").to_numpy())
    node_rows = named_calls.filter(pl.Series(~is_call))
    inside = _inside(node_rows, windows)
    kernel_arg = host.select("rank", "correlation",
                             kernel=pl.col("args_json").str.json_path_match("$.kernel"))
    kernel_arg = kernel_arg.filter(pl.col("correlation").is_not_null()
                                   & pl.col("kernel").is_not_null()).unique(
        ["rank", "correlation"], keep="first")
    launches = (inside.join(kernel_arg, on=["rank", "correlation"], how="left")
                .with_columns(_kind=_node_kind(pl.col("name"))))
    named = (launches.group_by("capture").agg(
        named=(pl.col("kernel").is_not_null() | (pl.col("_kind") != "kernel")).all()))
    launches = (launches.join(named, on="capture")
                .with_columns(key=pl.when(pl.col("named") & (pl.col("_kind") == "kernel"))
                              .then(pl.col("kernel")).otherwise(pl.col("_kind")))
                .sort("capture", "ts_ns", "correlation")
                .with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("capture")))
    row = launches.get_column("_row").to_numpy()
    launch_op = tree.up[row] if row.size else np.zeros(0, np.int64)
    owner = owners(launch_op, tree.op_parent, tree.accepts)
    launches = launches.with_columns(launch_op=pl.Series(launch_op, dtype=pl.Int64),
                                     owner=pl.Series(np.where(launch_op >= 0, owner, -1),
                                                     dtype=pl.Int64))
    args = _owner_args(events, tree.rows, launches.get_column("owner"))
    meaning = (launches.join(args, left_on="owner", right_on="_row", how="left")
               .sort("capture", "seq")
               .group_by("capture", maintain_order=True)
               .agg(meaning=pl.concat_str([pl.col("_op").fill_null(""),
                                           *[pl.col(c).fill_null("") for c in ARG_KEYS]],
                                          separator="\x1f"))
               .with_columns(pl.col("meaning").hash()))
    return Captures(tree, launches.select("capture", "seq", "rank", "correlation", "key",
                                          "named", "owner", "launch_op"), meaning, args)


def _node_kind(name: pl.Expr) -> pl.Expr:
    return (pl.when(name.str.contains("(?i)memcpy")).then(pl.lit("memcpy"))
            .when(name.str.contains("(?i)memset")).then(pl.lit("memset"))
            .otherwise(pl.lit("kernel")))


def _capture_windows(calls: pl.DataFrame) -> pl.DataFrame:
    """Per thread, each ``BEGIN_CAPTURE`` call's end and the next ``END_CAPTURE`` call's start:
    ``rank, pid, tid, capture, start_ns, end_ns``. A begin without an end (a capture that
    failed or was cut by the profiler) holds nothing."""
    marks = (calls.filter(pl.col("name").str.contains(BEGIN_CAPTURE)
                          | pl.col("name").str.contains(END_CAPTURE))
             .select("rank", "pid", "tid", "ts_ns", "dur_ns",
                     _begin=pl.col("name").str.contains(BEGIN_CAPTURE))
             .sort("rank", "pid", "tid", "ts_ns"))
    nxt = [pl.col(c).shift(-1).over("rank", "pid", "tid") for c in ("_begin", "ts_ns")]
    return (marks.with_columns(_next_begin=nxt[0], end_ns=nxt[1])
            .filter(pl.col("_begin") & pl.col("_next_begin").not_(), )
            .select("rank", "pid", "tid", start_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                    end_ns="end_ns")
            .with_row_index("capture").with_columns(pl.col("capture").cast(pl.Int64)))


def _inside(calls: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``calls`` that start inside a capture window of their thread, with its ``capture``."""
    if windows.height == 0 or calls.height == 0:
        return calls.with_columns(capture=pl.lit(None, pl.Int64)).clear()
    found = (calls.sort("ts_ns")
             .join_asof(windows.sort("start_ns"), left_on="ts_ns", right_on="start_ns",
                        by=["rank", "pid", "tid"], strategy="backward",
                        check_sortedness=False))  # sorted by time: sorted in each thread
    return found.filter(pl.col("end_ns").is_not_null() & (pl.col("ts_ns") < pl.col("end_ns")))


def _owner_args(events: Frame, rows: pl.DataFrame, owner: pl.Series) -> pl.DataFrame:
    """The recorded arguments of the capture's owner ops: ``_row``, ``_op`` (name) and the
    ``ARG_KEYS`` columns."""
    wanted = owner.filter(owner >= 0).unique().sort()
    if wanted.len() == 0:
        return pl.DataFrame(schema={"_row": pl.Int64, "_op": pl.String,
                                    **dict.fromkeys(ARG_KEYS, pl.String)})
    ops = (rows.with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
           .filter(pl.col("_row").is_in(wanted.implode()))
           .select("_row", "rank", "pid", "tid", "ts_ns", pl.col("name").cast(pl.String)))
    found = op_args(events, ops)
    return found.select("_row", _op="name", **{c: pl.col(c) for c in ARG_KEYS})


def replay_order(replayed: pl.DataFrame) -> pl.DataFrame:
    """``replayed`` (``op_kernels`` rows marked ``graph_replayed``: ``rank``, ``correlation``
    of their graph launch, ``ts_ns``, ``stream``, ``gpu_class``, ``name``, and ``node``: the
    graph node id, null where not recorded) with ``seq``, each event's place in its replay:
    by node id where every event of the replay has one, else by start."""
    launch = ["rank", "correlation"]
    with_nodes = (pl.col("node").is_not_null() & (pl.col("node") > 0)).all().over(launch)
    order = pl.when(with_nodes).then(pl.col("node")).otherwise(pl.col("ts_ns"))
    return (replayed.with_row_index("_event")
            .with_columns(_order=order)
            .sort([*launch, "_order", "ts_ns", "stream", "_event"], nulls_last=True)
            .with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over(launch),
                          _kind=pl.col("gpu_class").cast(pl.String)
                          .replace_strict({"memcpy": "memcpy", "memset": "memset"},
                                          default="kernel"))
            .drop("_order"))


def match_replays(replayed: pl.DataFrame, captures: Captures,
                  ) -> tuple[pl.DataFrame, dict[str, int]]:
    """Which captured launch each replayed GPU event is. ``replayed``: ``replay_order`` rows.
    Returns ``(pairs, counts)``: ``pairs`` one row per attributed event: ``_event`` (its row
    in ``replayed``), ``capture``, ``capture_seq``; ``counts``: replays ``matched``,
    ``unmatched`` (no capture holds their nodes) and ``ambiguous`` (captures with the same
    nodes but other ops)."""
    launch = ["rank", "correlation"]
    counts = {"matched": 0, "unmatched": 0, "ambiguous": 0}
    empty = pl.DataFrame(schema={"_event": pl.UInt32, "capture": pl.Int64,
                                 "capture_seq": pl.Int64})
    if replayed.height == 0:
        return empty, counts
    cap = captures.launches
    vocab = (pl.concat([replayed.select(k="name"), replayed.select(k="_kind"),
                        cap.select(k="key")]).unique().drop_nulls()
             .with_row_index("_code").with_columns(pl.col("_code").cast(pl.Int64)))
    rep = (replayed.join(_replay_ids(replayed), on=launch)
           .join(vocab.rename({"k": "name", "_code": "_by_name"}), on="name", how="left")
           .join(vocab.rename({"k": "_kind", "_code": "_by_kind"}), on="_kind", how="left")
           .with_columns(_by_name=pl.when(pl.col("_kind") == "kernel").then("_by_name")
                         .otherwise("_by_kind")))
    cap = cap.join(vocab.rename({"k": "key"}), on="key", how="left")
    # one signature per replay and per capture: the sorted node keys, by name and by kind
    rep_sig = (rep.sort("seq").group_by("_replay", *launch).agg(
        n=pl.len(), _ts=pl.col("ts_ns").min(),
        sig_name=pl.col("_by_name").sort(), sig_kind=pl.col("_by_kind").sort(),
        order=pl.col("_by_name"))
        .with_columns(pl.col("sig_name", "sig_kind", "order").hash()))
    cap_sig = (cap.sort("seq").group_by("capture", maintain_order=True).agg(
        cap_rank=pl.col("rank").first(), named=pl.col("named").first(), cap_n=pl.len(),
        sig=pl.col("_code").sort(), cap_order=pl.col("_code"))
        .with_columns(pl.col("sig").hash())
        .join(captures.meaning, on="capture", how="left"))
    # captures of the replay's rank where the capture trace has that rank, else of any rank
    cap_ranks = set(cap_sig.get_column("cap_rank").to_list())
    rep_sig = rep_sig.with_columns(_cap_rank=pl.when(pl.col("rank").is_in(list(cap_ranks)))
                                   .then(pl.col("rank")).otherwise(pl.lit(None, pl.Int32)))
    cands = pl.concat([
        rep_sig.join(cap_sig.filter(f).drop("cap_order"), left_on=[sig, "n"],
                     right_on=["sig", "cap_n"])
        for f, sig in ((pl.col("named"), "sig_name"), (~pl.col("named"), "sig_kind"))],
        how="diagonal_relaxed").filter(pl.col("_cap_rank").is_null()
                                       | (pl.col("_cap_rank") == pl.col("cap_rank")))
    chosen, ambiguous = _chosen(cands)
    chosen = chosen.with_columns(_how=pl.lit("keys"))
    # replays that are their capture less a few nodes, where the capture names its kernels
    missing = rep_sig.join(chosen.select("_replay"), on="_replay", how="anti").join(
        ambiguous.select("_replay"), on="_replay", how="anti")
    fewer = _fewer_nodes(missing, rep, cap, cap_sig)
    pairs = pl.concat([_pairs_by_key(chosen, rep, cap), fewer], how="vertical_relaxed")
    # a replay is attributed whole or not at all
    whole = (pairs.group_by("_replay").agg(_got=pl.len())
             .join(rep_sig.select("_replay", "n"), on="_replay")
             .filter(pl.col("_got") == pl.col("n")).select("_replay"))
    pairs = pairs.join(whole, on="_replay", how="semi")
    counts["matched"] = whole.height
    counts["ambiguous"] = ambiguous.height
    counts["unmatched"] = rep_sig.height - whole.height - ambiguous.height
    return pairs.select("_event", "capture", "capture_seq").sort("_event"), counts


def _chosen(cands: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each replay's capture among its candidates: the only one, or the (k mod m)-th of m
    equivalent ones (same ``meaning``) for the k-th replay with those candidates; replays
    whose candidates differ in meaning are ``ambiguous``."""
    if cands.height == 0:
        none = cands.select("_replay", "capture")
        return none, none.select("_replay")
    per = cands.group_by("_replay").agg(
        _m=pl.len(), _meanings=pl.col("meaning").n_unique(),
        _caps=pl.col("capture").sort())
    ambiguous = per.filter(pl.col("_meanings") > 1).select("_replay")
    ok = (per.filter(pl.col("_meanings") == 1)
          .join(cands.select("_replay", "_ts").unique("_replay"), on="_replay")
          .sort("_ts")
          .with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64).over("_caps"))
          .with_columns(capture=pl.col("_caps").list.get(pl.col("_k") % pl.col("_m")))
          .select("_replay", "capture"))
    return ok, ambiguous


def _pairs_by_key(chosen: pl.DataFrame, rep: pl.DataFrame, cap: pl.DataFrame,
                  ) -> pl.DataFrame:
    """The k-th event of each key in a replay paired with the k-th launch of that key in its
    capture."""
    named = cap.select("capture", "named").unique("capture")
    sides = chosen.select("_replay", "capture").join(named, on="capture")
    r = (rep.join(sides, on="_replay")
         .with_columns(_key=pl.when(pl.col("named")).then("_by_name").otherwise("_by_kind"))
         .sort("seq")
         .with_columns(_occ=pl.int_range(pl.len()).over("_replay", "_key")))
    c = (cap.sort("seq").with_columns(_occ=pl.int_range(pl.len()).over("capture", "_code"))
         .select("capture", _key="_code", _occ="_occ", capture_seq="seq"))
    return r.join(c, on=["capture", "_key", "_occ"]).select("_replay", "_event", "capture",
                                                           "capture_seq")


def _replay_ids(rep: pl.DataFrame) -> pl.DataFrame:
    """Each replay's number, as ``match_replays`` numbers them (in order of first event)."""
    launch = ["rank", "correlation"]
    return (rep.select(*launch).unique().sort(launch)
            .with_row_index("_replay"))


def _fewer_nodes(missing: pl.DataFrame, rep: pl.DataFrame, cap: pl.DataFrame,
                 cap_sig: pl.DataFrame) -> pl.DataFrame:
    """Replays that are a named capture less a few launches (``MISSING_NODES``), matched in
    order: each distinct (node sequence, capture) is aligned once (a greedy walk along the
    capture), and every replay of that sequence takes the alignment. A replay two captures
    fit is left out (no blend, no guess)."""
    schema = {"_replay": pl.UInt32, "_event": pl.UInt32, "capture": pl.Int64,
              "capture_seq": pl.Int64}
    named = cap_sig.filter(pl.col("named")).select("capture", "cap_rank", "cap_n", "cap_order")
    if missing.height == 0 or named.height == 0:
        return pl.DataFrame(schema=schema)
    cands = (missing.select("_replay", "order", "n", "_cap_rank")
             .join(named.drop("cap_order"), how="cross")
             .filter((pl.col("_cap_rank").is_null() | (pl.col("_cap_rank") == pl.col("cap_rank")))
                     & (pl.col("cap_n") > pl.col("n"))
                     & (pl.col("cap_n") - pl.col("n")
                        <= pl.max_horizontal(pl.lit(1), (pl.col("cap_n") * MISSING_NODES)
                                             .floor().cast(pl.Int64)))))
    if cands.height == 0:
        return pl.DataFrame(schema=schema)
    # one replay's codes per distinct sequence, and each distinct (sequence, capture) walked
    # once in Python: a few graphs, however many replays
    first = cands.group_by("order").agg(pl.col("_replay").min())
    codes = dict(rep.join(first, on="_replay").sort("seq").group_by("order")
                 .agg(pl.col("_by_name")).iter_rows())
    walks = (cands.select("order", "capture").unique()
             .join(named.select("capture", "cap_order"), on="capture"))
    aligned = []
    for order, capture, capture_codes in walks.iter_rows():
        positions = _subsequence(codes[order], capture_codes)
        if positions is not None:
            aligned.append(pl.DataFrame({"order": order, "capture": capture,
                                         "seq": range(len(positions)),
                                         "capture_seq": positions},
                                        schema={"order": pl.UInt64, "capture": pl.Int64,
                                                "seq": pl.Int64, "capture_seq": pl.Int64}))
    if not aligned:
        return pl.DataFrame(schema=schema)
    steps = pl.concat(aligned)
    fits = (cands.join(steps.select("order", "capture").unique(), on=["order", "capture"])
            .filter(pl.len().over("_replay") == 1).select("_replay", "order", "capture"))
    return (rep.select("_replay", "_event", "seq").join(fits, on="_replay")
            .join(steps, on=["order", "capture", "seq"])
            .select(list(schema)).cast(schema))  # type: ignore[arg-type]


def _subsequence(codes: list[int], capture: list[int]) -> list[int] | None:
    """The position in ``capture`` of each of ``codes``, walking both in order and skipping
    capture launches the replay lacks; None when ``codes`` is not a subsequence."""
    at, found = 0, []
    for code in codes:
        while at < len(capture) and capture[at] != code:
            at += 1
        if at == len(capture):
            return None
        found.append(at)
        at += 1
    return found


def captured_op_times(replayed: pl.DataFrame, pairs: pl.DataFrame, captures: Captures, *,
                      first_idx: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(instances, kernels)`` of the attributed replayed events, as ``op_kernel_times``
    gives them: one instance per (replay, captured owner op), ``op_idx`` from
    ``first_idx`` on; ``kernels`` one row per attributed event, ``graph_replayed`` true, with
    the captured launch's and op's times (``launch_ts_ns`` .. ``op_end_ns``, the capture's
    clock) and ``_event`` (its row in ``replayed``). An event whose captured launch lies in
    no op is left out (it stays unattributed)."""
    tree = captures.tree
    rows = tree.rows
    launch = ["rank", "correlation"]
    ev = (replayed.select("_event", *launch, "name", "dur_ns", "ts_ns")
          .join(_replay_ids(replayed), on=launch)
          .join(pairs, on="_event")
          .join(captures.launches.select("capture", capture_seq="seq", _launch_rank="rank",
                                         _launch_corr="correlation", owner="owner",
                                         launch_op="launch_op"),
                on=["capture", "capture_seq"])
          .filter(pl.col("owner") >= 0))
    inst_key = ["_replay", "owner"]
    owned = ev.group_by(inst_key).agg(kernel_ns=pl.col("dur_ns").sum(),
                                      rank=pl.col("rank").first())
    direct = (ev.group_by("_replay", "launch_op").agg(direct_ns=pl.col("dur_ns").sum())
              .rename({"launch_op": "owner"}))
    # subtree: each launching op's ancestors (itself included) that own time somewhere
    owner_rows = owned.get_column("owner").unique().to_numpy()
    up_pairs = _ancestors(ev.get_column("launch_op").unique().to_numpy(), tree.op_parent,
                          owner_rows)
    subtree = (ev.join(up_pairs, on="launch_op")
               .group_by("_replay", "ancestor").agg(subtree_ns=pl.col("dur_ns").sum())
               .rename({"ancestor": "owner"}))
    inst = (owned.join(direct, on=inst_key, how="left").join(subtree, on=inst_key, how="left")
            .sort(inst_key)
            .with_row_index("op_idx", offset=first_idx)
            .with_columns(pl.col("direct_ns", "subtree_ns").fill_null(0)))
    op_rows = rows.select("pid", "tid", pl.col("name").cast(pl.String), "ts_ns", "dur_ns",
                          _cap_rank="rank").with_row_index("owner").with_columns(
        pl.col("owner").cast(pl.Int64))
    inst = inst.join(op_rows, on="owner", how="left")
    instances = inst.select(list(INSTANCE_SCHEMA)).cast(INSTANCE_SCHEMA)  # type: ignore[arg-type]
    args = captures.args.select("_row", *ARG_KEYS)
    instances = (instances.with_columns(_row=inst.get_column("owner"))
                 .join(args, on="_row", how="left").drop("_row"))
    ts = rows.get_column("ts_ns").to_numpy()
    end = ts + rows.get_column("dur_ns").to_numpy()
    ev = ev.join(inst.select(*inst_key, "op_idx"), on=inst_key)
    launch_row = _launch_row(ev, rows)
    launch_op = ev.get_column("launch_op").to_numpy()
    kernels = ev.select(
        "op_idx", launch_op_idx=pl.lit(None, pl.UInt32), name="name", dur_ns="dur_ns",
        launch_ts_ns=pl.Series(ts[launch_row]), launch_end_ns=pl.Series(end[launch_row]),
        op_ts_ns=pl.Series(ts[launch_op]), op_end_ns=pl.Series(end[launch_op]),
        graph_replayed=pl.lit(True), rank="rank", correlation="correlation", ts_ns="ts_ns",
        _event="_event")
    return instances, kernels


def _launch_row(ev: pl.DataFrame, rows: pl.DataFrame):  # -> np.ndarray
    found = launch_rows(rows).select(_launch_rank="rank", _launch_corr="correlation",
                                     _row="_row")
    return (ev.select("_launch_rank", "_launch_corr")
            .join(found, on=["_launch_rank", "_launch_corr"], how="left",
                  maintain_order="left").get_column("_row").to_numpy())


def _ancestors(start, op_parent, keep) -> pl.DataFrame:  # (np.ndarray, ...) -> frame
    """``(launch_op, ancestor)`` for each row of ``start`` and each op from it upwards
    (itself included) that is in ``keep``: a few vectorised steps, one per level."""
    start = np.asarray(start, dtype=np.int64)
    keep_mask = np.zeros(op_parent.size, dtype=bool)
    keep_mask[np.asarray(keep, dtype=np.int64)] = True
    pieces_from, pieces_to = [], []
    cur = start.copy()
    live = cur >= 0
    while live.any():
        hit = live & keep_mask[np.maximum(cur, 0)]
        pieces_from.append(start[hit])
        pieces_to.append(cur[hit])
        cur[live] = op_parent[cur[live]]
        live &= cur >= 0
    return pl.DataFrame({"launch_op": np.concatenate(pieces_from) if pieces_from else [],
                         "ancestor": np.concatenate(pieces_to) if pieces_to else []},
                        schema={"launch_op": pl.Int64, "ancestor": pl.Int64})
