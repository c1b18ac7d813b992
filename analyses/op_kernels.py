"""GPU time per host operator: which op each kernel belongs to.

A GPU event's launch is the runtime call with its correlation id (``cudaLaunchKernel``,
``cudaMemcpyAsync``, ...); the op that launched it is the innermost ``cpu_op`` open on the
launch's thread that contains the call. The op tree is the one of ``analyses/op_tree.py``
(through ``breakdown.with_self_time``), with the runtime calls placed in it as leaves: ties at
equal microseconds follow the trace's nesting, and a 0-duration op contains nothing.

Per op instance:

* ``direct_ns``: GPU time of the work the op launched itself;
* ``subtree_ns``: that of the work it and its children launched;
* ``kernel_ns``: the GPU time the op *owns*. Each GPU event is owned by exactly one op: the
  innermost op enclosing its launch that ``modelled`` accepts (an op a performance model
  explains: ``aten::addmm`` under ``aten::linear``, ``_scaled_dot_product_flash_attention``
  over ``_flash_attention_forward``), else the launching op. So the owned times add up to the
  GPU time launched from ops, with nothing counted twice.

Definitions and a worked example: ``docs/metrics.md``, "Operators against the roofline".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.schema import RUNTIME_KINDS

from .breakdown import with_self_time

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

#: Runtime calls that replay a captured graph (``cudaGraphLaunch``, ``hipGraphLaunch``).
GRAPH_LAUNCH = r"(?i)GraphLaunch"

#: Columns of a GPU event kept on the rows of kernels replayed from a graph: what
#: ``analyses.graph_capture`` pairs them with the captured launches by (``gpu_class``: kernel,
#: memcpy or memset; ``ts_ns``: their order within one replay).
REPLAY_COLUMNS: tuple[str, ...] = ("ts_ns", "stream", "gpu_class")

#: The per-instance columns of :func:`op_kernel_times`.
INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    "op_idx": pl.UInt32, "rank": pl.Int32, "pid": pl.Int64, "tid": pl.Int64,
    "name": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "direct_ns": pl.Int64,
    "subtree_ns": pl.Int64, "kernel_ns": pl.Int64,
}


def op_kernel_times(gpu: pl.DataFrame, host: pl.DataFrame, *,
                    modelled: Callable[[str], bool] = lambda name: False,
                    ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(instances, kernels)``. ``instances``: one row per op instance that owns GPU time
    (``INSTANCE_SCHEMA``; ``op_idx`` names it within this call); ``kernels``: one row per
    launched GPU event: ``op_idx`` (its owner), ``launch_op_idx``, ``name``, ``dur_ns``, and
    ``launch_ts_ns``/``launch_end_ns`` (the runtime call), ``op_ts_ns``/``op_end_ns`` (the
    launching op, which contains the call); ``graph_replayed``: a kernel replayed from a
    CUDA/HIP graph (launched by ``cudaGraphLaunch``), attributed to no op (null ``op_idx``):
    the ops captured into the graph launched it, and their capture is not in the trace.
    ``gpu``: ``prepared_gpu`` rows; ``host``: ``host_events`` rows (ops and launches);
    ``modelled``: whether an op name has a performance model (decides ownership)."""
    tree = host_tree(host, modelled=modelled)
    rows, parent, depth, up = tree.rows, tree.parent, tree.depth, tree.up
    n = rows.height
    work = (gpu.select("rank", "correlation", pl.col("name").cast(pl.String), "dur_ns",
                       *[c for c in REPLAY_COLUMNS if c in gpu.columns])
            .filter(pl.col("correlation").is_not_null() & pl.col("dur_ns").is_not_null())
            .join(launch_rows(rows), on=["rank", "correlation"], how="inner"))
    # a graph replay's kernels share the graph launch's correlation: the op around the launch
    # did not launch them, the ops captured into the graph did (analyses/graph_capture.py
    # charges them to those ops when the capture trace is given)
    replayed = work.filter(pl.col("_graph"))
    work = work.filter(~pl.col("_graph"))
    launch_op = up[work.get_column("_row").to_numpy()] if work.height else np.zeros(0, int)
    keep = launch_op >= 0
    work, launch_op = work.filter(pl.Series(keep)), launch_op[keep]

    owner = owners(launch_op, tree.op_parent, tree.accepts)

    dur = work.get_column("dur_ns").to_numpy().astype(np.int64)
    direct = np.bincount(launch_op, weights=dur, minlength=n).astype(np.int64)
    owned = np.bincount(owner, weights=dur, minlength=n).astype(np.int64)
    subtree = _subtree(direct, parent, depth)

    idx = np.flatnonzero(owned > 0)
    instances = (rows.select("rank", "pid", "tid", pl.col("name").cast(pl.String), "ts_ns",
                             "dur_ns")[idx]
                 .with_columns(op_idx=pl.Series(idx, dtype=pl.UInt32),
                               direct_ns=pl.Series(direct[idx]),
                               subtree_ns=pl.Series(subtree[idx]),
                               kernel_ns=pl.Series(owned[idx]))
                 .select(list(INSTANCE_SCHEMA)).cast(INSTANCE_SCHEMA))  # type: ignore[arg-type]
    ts = rows.get_column("ts_ns").to_numpy()
    end = ts + rows.get_column("dur_ns").to_numpy()
    launch_row = work.get_column("_row").to_numpy()
    kernels = pl.DataFrame({"op_idx": pl.Series(owner, dtype=pl.UInt32),
                            "launch_op_idx": pl.Series(launch_op, dtype=pl.UInt32),
                            "name": work.get_column("name"), "dur_ns": work.get_column("dur_ns"),
                            # where the launch and its op lie: the op contains the launch
                            "launch_ts_ns": ts[launch_row], "launch_end_ns": end[launch_row],
                            "op_ts_ns": ts[launch_op], "op_end_ns": end[launch_op],
                            "graph_replayed": pl.Series([False] * owner.size, dtype=pl.Boolean)})
    if replayed.height:  # unattributed: no op, marked
        kernels = pl.concat([kernels, replayed.drop("_row", "_graph").with_columns(
            graph_replayed=pl.lit(True))], how="diagonal_relaxed")
    return instances, kernels


@dataclasses.dataclass(frozen=True)
class HostTree:
    """The host op tree of the ops and runtime calls (``op_tree`` through
    ``breakdown.with_self_time``), as arrays over ``rows``: ``parent`` (row, -1 for a root),
    ``depth``, ``up`` (each row's nearest enclosing op, itself for an op; -1: none),
    ``op_parent`` (the nearest op above a row, -1: none) and ``accepts`` (an op that
    ``modelled`` accepts: it owns the GPU work launched beneath it)."""

    rows: pl.DataFrame
    parent: Any
    depth: Any
    up: Any
    op_parent: Any
    accepts: Any


def host_tree(host: pl.DataFrame, *,
              modelled: Callable[[str], bool] = lambda name: False) -> HostTree:
    """The tree of ``host``'s ops (``cpu_op``) and runtime calls with a duration."""
    rows = (host.lazy()
            .filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", *RUNTIME_KINDS])
                    & pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") >= 0))
            .select("rank", "pid", "tid", "kind", "name", "ts_ns", "dur_ns", "correlation")
            .collect())
    tree = with_self_time(rows, kinds=("cpu_op", *RUNTIME_KINDS))  # same rows, same order
    parent = tree.get_column("parent_idx").fill_null(-1).cast(pl.Int64).to_numpy().copy()
    is_op = (rows.get_column("kind").cast(pl.String) == "cpu_op").to_numpy()
    up = _nearest_op(parent, is_op)
    names = rows.get_column("name").cast(pl.String)
    wanted = {v: bool(modelled(v)) for v in names.filter(pl.Series(is_op)).unique()
              .drop_nulls().to_list()}  # once per distinct name
    accepts = (names.is_in([v for v, yes in wanted.items() if yes]).fill_null(False)
               .to_numpy() & is_op)
    op_parent = np.where(parent >= 0, up[np.maximum(parent, 0)], -1)
    return HostTree(rows, parent, tree.get_column("depth").to_numpy(), up, op_parent, accepts)


def launch_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """The runtime calls of ``HostTree.rows`` that launch GPU work: ``rank``,
    ``correlation``, ``_row`` (the call's row) and ``_graph`` (a graph launch); the first
    call of a correlation where several share it."""
    return (rows.with_row_index("_row")
            .filter(~pl.col("kind").cast(pl.String).eq("cpu_op")
                    & pl.col("correlation").is_not_null())
            .sort("ts_ns").unique(["rank", "correlation"], keep="first")
            .select("rank", "correlation", "_row",
                    _graph=pl.col("name").cast(pl.String).str.contains(GRAPH_LAUNCH)))


def _nearest_op(parent: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """For each row, itself when it is an op, else its nearest enclosing op (-1: none).
    Runtime calls rarely nest (a driver call inside a runtime call), so a few vectorised
    steps up reach an op."""
    cur = np.where(is_op, np.arange(parent.size), parent)
    todo = (cur >= 0) & ~is_op[np.maximum(cur, 0)]
    while todo.any():
        cur[todo] = parent[cur[todo]]
        todo = (cur >= 0) & ~is_op[np.maximum(cur, 0)]
    return cur


def owners(launch_op: np.ndarray, op_parent: np.ndarray, accepts: np.ndarray) -> np.ndarray:
    """The innermost op from each launching op upwards that ``accepts``, else the launching
    op; ``op_parent``: each row's nearest enclosing op above it (-1: none)."""
    found = np.full(launch_op.size, -1, dtype=np.int64)
    cur = launch_op.astype(np.int64).copy()
    live = cur >= 0
    while live.any():
        hit = live & accepts[np.maximum(cur, 0)] & (found < 0)
        found[hit] = cur[hit]
        live &= found < 0
        cur[live] = op_parent[cur[live]]
        live &= cur >= 0
    return np.where(found >= 0, found, launch_op)


def _subtree(direct: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each row's direct time plus its descendants': added into parents from the deepest
    level up, one vectorised step per level."""
    total = direct.copy()
    if total.size == 0:
        return total
    for level in range(int(depth.max()), 1, -1):
        at = np.flatnonzero((depth == level) & (parent >= 0))
        np.add.at(total, parent[at], total[at])
    return total
