"""The replay itself: every node's time, as the longest path through the graph.

A node with no incoming edge (each queue's first point) starts at its measured time; every
other node at the latest of its incoming edges' sources plus their lags (a queue's previous
point plus the work between them; an instance's last arrival; a completion plus the resume
lag ...). The nodes are taken in dependency order (Kahn's algorithm): one Python step per
node, that is per sync point, never per event. Should wrong edges close a cycle, the
earliest measured node among those left is taken as it is (``forced``, reported by the
self-check).

>>> import numpy as np
>>> # queues 0 -> 1 (work 5) and 2 -> 3 (work 1); node 4 joins the arrivals 1 and 2, and 3
>>> # waits on it (lag 2)
>>> out = simulate(np.array([0, 0, 0, 0, 0]), np.array([0, 2, 1, 2, 4]),
...                np.array([1, 3, 4, 4, 3]), np.array([5, 1, 0, 0, 2]))
>>> out.time.tolist(), out.pred.tolist()
([0, 5, 0, 7, 5], [-1, 0, -1, 4, 1])
"""

from __future__ import annotations

from dataclasses import dataclass

from traceview._dependencies import lazy_module

from .graph import ReplayGraph

np = lazy_module("numpy")


@dataclass(frozen=True)
class Replayed:
    """``time``: each node's replayed time; ``pred``: the node that set it (-1: none, the
    node kept its measured time); ``forced``: nodes taken out of order to break a cycle."""

    time: np.ndarray
    pred: np.ndarray
    forced: int


def simulate(measured: np.ndarray, src: np.ndarray, dst: np.ndarray, lag: np.ndarray) -> Replayed:
    """Replayed times of ``len(measured)`` nodes (an instance node's measured time only
    orders a forced choice) under the edges
    ``src -> dst`` with ``lag``: ``time[dst] >= time[src] + lag``."""
    n = len(measured)
    order = np.argsort(src, kind="stable")
    src_s, dst_s, lag_s = src[order], dst[order], lag[order]
    start = np.searchsorted(src_s, np.arange(n + 1)).tolist()
    dsts, lags = dst_s.tolist(), lag_s.tolist()
    indeg = np.bincount(dst, minlength=n).tolist()
    meas = measured.tolist()
    neg = -(1 << 62)
    time = [neg] * n
    pred = [-1] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    for i in ready:
        time[i] = meas[i]
    done = [False] * n
    waiting = sorted(range(n), key=meas.__getitem__)  # for a forced pick, earliest first
    cursor = 0
    forced = 0
    left = n
    while left:
        if not ready:  # a cycle: take the earliest measured node not done yet
            while done[waiting[cursor]]:
                cursor += 1
            i = waiting[cursor]
            if time[i] == neg:
                time[i] = meas[i]
            forced += 1
            ready.append(i)
        i = ready.pop()
        if done[i]:
            continue
        done[i] = True
        left -= 1
        t = time[i]
        for e in range(start[i], start[i + 1]):
            d = dsts[e]
            v = t + lags[e]
            if v > time[d]:
                time[d] = v
                pred[d] = i
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    return Replayed(np.asarray(time, dtype=np.int64), np.asarray(pred, dtype=np.int64), forced)


def replay_graph(graph: ReplayGraph, *, work_ns: np.ndarray | None = None,
                 transfer_scale: float = 1.0, edge_lags: np.ndarray | None = None) -> Replayed:
    """Replay ``graph`` with each point's work ``work_ns`` (None: as measured), the edges'
    lags ``edge_lags`` (None: as built; queue edges take the work) and every transfer scaled
    by ``transfer_scale``."""
    pts, edges = graph.points, graph.edges
    measured = np.concatenate([pts.get_column("t_ns").to_numpy(),
                               graph.instances.get_column("last_arrival_ns").to_numpy()])
    src = edges.get_column("src").to_numpy()
    dst = edges.get_column("dst").to_numpy()
    lag = (edges.get_column("lag_ns").to_numpy() if edge_lags is None
           else np.asarray(edge_lags, dtype=np.int64)).copy()
    kind = edges.get_column("kind").to_numpy()
    work = pts.get_column("work_ns").to_numpy() if work_ns is None \
        else np.asarray(work_ns, dtype=np.int64)
    if work_ns is not None:
        queue = kind == "queue"
        lag[queue] = work[dst[queue]]
    # a GPU op starts after its launch (and a stream wait's event), and ends its work later
    launched = (kind == "launch") | (kind == "stream_wait")
    lag[launched] += work[dst[launched]]
    if transfer_scale != 1.0:
        moved = kind == "transfer"
        lag[moved] = np.round(lag[moved] * transfer_scale).astype(np.int64)
    return simulate(measured.astype(np.int64), src, dst, lag)


__all__ = ["Replayed", "replay_graph", "simulate"]
