"""Graph replays charged to the ops of their capture (``RunOptions.graph_capture``,
``--graph-capture FILE``): the capture traces read as a trace set of their own, the run's
replayed GPU events matched to the captured launches (``analyses.graph_capture``), and the
ops table's instances and kernels with the attributed ones in. Docs: docs/metrics.md, "Graph
replays and their capture"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl

from traceview.analyses.graph_capture import (captured_op_times, match_replays,
                                              read_captures, replay_order)
from traceview.schema import GPU_KINDS
from traceview.store import traceset

#: The graph node id Kineto writes on a replayed GPU event (CUDA 12+, 2026 Kineto).
NODE_ARG = "$['graph node id']"


def attribute_replays(events: pl.LazyFrame, instances: pl.DataFrame, kernels: pl.DataFrame,
                      paths: Sequence[str | Path], *, modelled: Callable[[str], bool],
                      ) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """``(instances, kernels, warnings)``: ``op_kernels``' tables (with ``op_args``) where
    the replayed GPU events that match a capture of ``paths`` are charged to the captured
    ops; the others stay ``graph_replayed`` without an owner. ``events``: the run's window."""
    replayed = kernels.filter(pl.col("graph_replayed") & pl.col("op_idx").is_null())
    if replayed.height == 0:
        return instances, kernels, []
    named = ", ".join(str(p) for p in paths)
    # each file alone: two captures of one process need no rank map to be read together
    captured = pl.concat([traceset.open(path).events for path in paths],
                         how="vertical_relaxed")
    captures = read_captures(captured, modelled=modelled)
    if captures.launches.height == 0:
        return instances, kernels, [
            f"ops: {named} holds no stream capture (no *StreamBeginCapture* .. "
            "*StreamEndCapture* with launches between): the graph replays stay unattributed"]
    ordered = replay_order(_with_nodes(events, replayed))
    pairs, counts = match_replays(ordered, captures)
    first = int(instances.get_column("op_idx").max() or 0) + 1 if instances.height else 0
    first = max(first, int(kernels.get_column("launch_op_idx").max() or 0) + 1)
    new_instances, new_kernels = captured_op_times(ordered, pairs, captures, first_idx=first)
    # matched events whose captured launch lies in no op stay unattributed too
    left = ordered.join(new_kernels.select("_event"), on="_event", how="anti")
    new_kernels = new_kernels.drop("_event")
    kept = kernels.filter(~(pl.col("graph_replayed") & pl.col("op_idx").is_null()))
    out_kernels = pl.concat([kept, new_kernels,
                             left.select(*[c for c in kernels.columns if c in left.columns])],
                            how="diagonal_relaxed")
    out_instances = pl.concat([instances, new_instances], how="diagonal_relaxed")
    warnings = []
    if counts["unmatched"]:
        warnings.append(f"ops: {counts['unmatched']} of {sum(counts.values())} graph replays "
                        f"match no capture in {named} (other graphs, or a capture that "
                        "lost launches): their GPU events stay unattributed")
    if counts["ambiguous"]:
        warnings.append(f"ops: {counts['ambiguous']} graph replays match several captures in "
                        f"{named} whose ops differ (the same kernels, other shapes): "
                        "unattributed rather than guessed; give only the capture they replay")
    return out_instances, out_kernels, warnings


def _with_nodes(events: pl.LazyFrame, replayed: pl.DataFrame) -> pl.DataFrame:
    """``replayed`` with ``node``: each event's ``graph node id`` where the trace has one."""
    launches = replayed.select("rank", "correlation").unique()
    nodes = (events.filter(pl.col("kind").cast(pl.String).is_in(list(GPU_KINDS)))
             .join(launches.lazy(), on=["rank", "correlation"], how="semi")
             .select("rank", "correlation", "ts_ns", "stream",
                     node=pl.col("args_json").str.json_path_match(NODE_ARG)
                     .cast(pl.Int64, strict=False))
             .collect()
             .unique(["rank", "correlation", "ts_ns", "stream"], keep="first"))
    return replayed.join(nodes, on=["rank", "correlation", "ts_ns", "stream"], how="left",
                         nulls_equal=True, maintain_order="left")
