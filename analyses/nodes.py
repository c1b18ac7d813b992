"""Which node each rank ran on, how many nodes a collective spans, and late ranks that share one.

Definitions: ``docs/metrics.md``, section *Nodes*. A rank's node is, first match wins:

1. ``--gpus-per-node N`` (``gpus_per_node``): ranks ``kN .. kN+N-1`` are ``node k`` (the
   launcher's layout: torchrun and Slurm number the ranks of a node together);
2. the host the trace names: Kineto's ``host_name`` header, the nsys target's ``Hostname``
   (the ranks table's ``host``), as ``host <name>``;
3. unknown (null): ``node_span`` is then null and the locality ``unknown``.

>>> ranks = pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["a", "a", "b", "b"]})
>>> rank_nodes(ranks).get_column("node").to_list()
['host a', 'host a', 'host b', 'host b']
>>> rank_nodes(ranks, gpus_per_node=1).get_column("node").to_list()
['node 0', 'node 1', 'node 2', 'node 3']
"""

from __future__ import annotations

from typing import Any

import polars as pl

NODES_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int32, "node": pl.String,
                                        "node_from": pl.String}


def rank_nodes(ranks: pl.DataFrame, *, gpus_per_node: int | None = None) -> pl.DataFrame:
    """One row per rank of ``ranks`` (a table with ``rank`` and, when known, ``host``):
    ``node`` and where it came from (``node_from``: ``--gpus-per-node``, ``host``, null)."""
    if ranks.height == 0 or "rank" not in ranks.columns:
        return pl.DataFrame(schema=NODES_SCHEMA)
    rows = ranks.filter(pl.col("rank").is_not_null()).unique("rank", keep="first")
    if gpus_per_node:
        out = rows.select(pl.col("rank").cast(pl.Int32),
                          node=pl.lit("node ") + (pl.col("rank") // gpus_per_node).cast(pl.String),
                          node_from=pl.lit("--gpus-per-node"))
    else:
        host = pl.col("host").cast(pl.String) if "host" in rows.columns else pl.lit(None,
                                                                                      pl.String)
        out = rows.select(pl.col("rank").cast(pl.Int32),
                          node=pl.when(host.is_not_null() & (host != ""))
                          .then(pl.lit("host ") + host),
                          node_from=pl.when(host.is_not_null() & (host != ""))
                          .then(pl.lit("host")))
    return out.cast(NODES_SCHEMA).sort("rank")


def with_nodes(rows: pl.DataFrame, nodes: pl.DataFrame | None) -> pl.DataFrame:
    """``rows`` (one per instance and rank) with ``node`` and the instance's ``node_span``
    (distinct nodes among its ranks; null when any rank's node is unknown) and ``locality``
    (``intra-node`` for one node, ``inter-node`` for more, ``unknown``)."""
    if nodes is None or nodes.height == 0:
        rows = rows.with_columns(node=pl.lit(None, pl.String))
    else:
        rows = rows.join(nodes.select("rank", "node"), on="rank", how="left")
    known = pl.col("node").is_not_null().all().over("instance")
    span = pl.when(known).then(pl.col("node").n_unique().over("instance")).cast(pl.Int32)
    return rows.with_columns(node_span=span).with_columns(
        locality=pl.when(pl.col("node_span").is_null()).then(pl.lit("unknown"))
        .when(pl.col("node_span") == 1).then(pl.lit("intra-node"))
        .otherwise(pl.lit("inter-node")))


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0–2, 5``."""
    out, run = [], []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}")
        run = [r]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}")
    return ", ".join(out)


def ranks_text(ranks: list[int]) -> str:
    """``rank 1`` / ``ranks 0–2, 5``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


def shared_nodes(culprit_ranks: list[int], nodes: pl.DataFrame) -> list[dict[str, Any]]:
    """The nodes that hold two or more of ``culprit_ranks`` (the flagged stragglers): a host
    problem rather than a rank problem when every rank of the node is among them. One dict
    per such node: ``node``, ``ranks`` (the late ones), ``node_ranks``, ``all_late`` and a
    ``sentence`` ("node 3: ranks 24–31 all late")."""
    if len(culprit_ranks) < 2 or nodes.height == 0:
        return []
    known = nodes.filter(pl.col("node").is_not_null())
    late = set(culprit_ranks)
    out = []
    for (node,), g in known.group_by("node", maintain_order=True):
        members = sorted(g.get_column("rank").to_list())
        hit = [r for r in members if r in late]
        if len(hit) < 2:
            continue
        every = len(hit) == len(members)
        what = "all late" if every else f"late ({len(hit)} of the node's {len(members)})"
        out.append({"node": node, "ranks": hit, "node_ranks": members, "all_late": every,
                    "sentence": f"{node}: ranks {rank_ranges(hit)} {what}"
                                + (": a host problem, not a rank problem" if every and
                                   len(late - set(hit)) == 0 else "")})
    return sorted(out, key=lambda d: (-len(d["ranks"]), d["node"]))


#: A node is late at an instance when its first rank arrives this long after every rank of
#: the other nodes, at least (and more than 3 x the clocks' uncertainty): below it, which
#: node is last is clock noise and thread wake-up (as the stragglers' floor).
NODE_LATE_FLOOR_NS = 50_000
#: A node is flagged when it is the late node at >= this share of the instances where some
#: node was late, and at least ``NODE_MIN_INSTANCES`` times (the stragglers' persistence).
NODE_MIN_SHARE = 0.75
NODE_MIN_INSTANCES = 3
#: ... and when the others' wait for it is at least this share of the span the multi-node
#: collectives cover (first arrival to last end): an effect, not a rounding of noise.
NODE_MIN_EFFECT = 0.05

LATE_NODE_SCHEMA: dict[str, pl.DataType] = {
    "node": pl.String, "ranks": pl.List(pl.Int32), "late_instances": pl.Int64,
    "significant_instances": pl.Int64, "multi_node_instances": pl.Int64,
    "lead_p50_ns": pl.Int64, "lead_total_ns": pl.Int64, "flagged": pl.Boolean,
    "sentence": pl.String,
}


def late_nodes(rows: pl.DataFrame) -> pl.DataFrame:
    """Nodes whose ranks all arrive late together (``LATE_NODE_SCHEMA``, flagged first).

    ``rows``: :func:`~traceview.analyses.collectives.collective_ranks` with ``node``. At each
    instance spanning two or more nodes, the *late node* is the one whose first rank arrives
    last; its ``lead`` is that first arrival minus the last arrival of every other node's
    ranks (all of the node came after all of the others). An instance counts when the lead is
    above ``max(NODE_LATE_FLOOR_NS, 3 x uncertainty_ns)`` and above the spread of arrivals
    inside any one node there (a node is late as a whole, not one rank of it). A rank-level straggler analysis
    cannot see this: the last rank leads the second-last (its node mate) by nothing.
    ``flagged``: persistent (``NODE_MIN_SHARE``, ``NODE_MIN_INSTANCES``), large
    (``NODE_MIN_EFFECT``) and of two ranks or more."""
    if rows.height == 0 or "node" not in rows.columns:
        return pl.DataFrame(schema=LATE_NODE_SCHEMA)
    known = rows.filter(pl.col("node").is_not_null() & (pl.col("node_span") >= 2))
    if known.height == 0:
        return pl.DataFrame(schema=LATE_NODE_SCHEMA)
    per = known.group_by("instance", "node").agg(
        first=pl.col("arrival_ns").min(), last=pl.col("arrival_ns").max(),
        unc=pl.col("uncertainty_ns").max())
    ordered = per.sort("instance", "first", "node").with_columns(
        # the latest arrival among the other nodes: the max of the previous nodes' lasts
        others_last=pl.col("last").cum_max().shift(1).over("instance"),
        is_late=pl.col("first").rank("ordinal", descending=True).over("instance") == 1,
        inside=(pl.col("last") - pl.col("first")).max().over("instance"))
    late = ordered.filter(pl.col("is_late") & pl.col("others_last").is_not_null()) \
        .with_columns(lead=pl.col("first") - pl.col("others_last"))
    floor = pl.max_horizontal(pl.lit(NODE_LATE_FLOOR_NS), 3 * pl.col("unc").fill_null(0),
                              pl.col("inside"))
    sig = late.filter(pl.col("lead") > floor)
    n_multi = known.get_column("instance").n_unique()
    span = max(int(known.get_column("end_ns").max() - known.get_column("arrival_ns").min()), 1)
    n_sig = sig.height
    members = known.group_by("node").agg(ranks=pl.col("rank").unique().sort())
    out = sig.group_by("node").agg(
        late_instances=pl.len(), lead_p50_ns=pl.col("lead").median().round(0).cast(pl.Int64),
        lead_total_ns=pl.col("lead").sum()).join(members, on="node", how="left")
    out = out.with_columns(
        significant_instances=pl.lit(n_sig, pl.Int64), multi_node_instances=pl.lit(n_multi,
                                                                                   pl.Int64),
        flagged=(pl.col("late_instances") >= NODE_MIN_INSTANCES)
        & (pl.col("late_instances") >= NODE_MIN_SHARE * n_sig)
        & (pl.col("lead_total_ns") >= NODE_MIN_EFFECT * span)
        & (pl.col("ranks").list.len() >= 2))
    sentences = [
        f"{r['node']}: ranks {rank_ranges(r['ranks'])} all late at {r['late_instances']} of "
        f"{n_multi} collectives ({r['lead_p50_ns'] / 1e6:.2f} ms after every other node, "
        f"median): a host problem, not a rank problem" if r["flagged"] else
        f"{r['node']}: ranks {rank_ranges(r['ranks'])} late together at "
        f"{r['late_instances']} of {n_multi} collectives (not flagged)"
        for r in out.iter_rows(named=True)]
    return out.with_columns(sentence=pl.Series(sentences, dtype=pl.String)) \
        .select(list(LATE_NODE_SCHEMA)).cast(LATE_NODE_SCHEMA) \
        .sort(["flagged", "lead_total_ns"], descending=True)


__all__ = ["LATE_NODE_SCHEMA", "NODES_SCHEMA", "late_nodes", "rank_nodes", "rank_ranges",
           "ranks_text", "shared_nodes", "with_nodes"]
