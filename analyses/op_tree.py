"""The host op tree: which op each host row nests in, on its thread. Every consumer of the
nesting (self times, ``ops``' kernel ownership, ``breakdown``'s top ops, the critical path's
innermost op) reads this one tree.

Rows of one thread nest, so a sweep finds the tree without a loop over events: +1 at each
start, -1 at each end, in the trace's nesting order; a row's depth is the running sum after
its start, and its parent the latest start one level up (an as-of join). At equal timestamps
(whole-microsecond traces have many) the order is the trace's nesting, never the sort's:

* of rows starting together, the parent first: the longer first, then the one written first
  in the file (``aten::to`` over ``aten::_to_copy``, both 18 µs from the same start);
* a row ending when another starts closes first (touching rows are siblings); of rows ending
  together, the inner (later started) closes first;
* a row of 0 duration closes right after it opens: a leaf that contains nothing.

Rounded timestamps can leave a child 1 µs past its parent's end; the sweep's parent then
may not contain the row, and the row moves up to the nearest ancestor that does. So a row's
parent always contains it: ``parent.ts <= ts`` and ``end <= parent.end``. Definitions:
docs/metrics.md, "The host op tree".
"""

from __future__ import annotations

import polars as pl

from traceview._dependencies import lazy_module

np = lazy_module("numpy")

THREAD: tuple[str, ...] = ("rank", "pid", "tid")


def op_tree(rows: pl.DataFrame, *, thread: tuple[str, ...] = THREAD,
            level: pl.Expr | None = None) -> pl.DataFrame:
    """``depth`` (1: a root) and ``parent_idx`` (the row number in ``rows`` of the innermost
    row containing it, null for a root) of each row of ``rows``, in ``rows``' order.
    ``rows``: ``thread`` columns, ``ts_ns``, ``dur_ns`` (non-null, >= 0). ``level``: an
    integer expression over ``rows`` breaking ties of equal start and duration before the
    written order, lower outside (ops 0 around their runtime calls 1 around driver calls 2)."""
    n = rows.height
    if n == 0:
        return pl.DataFrame(schema={"depth": pl.Int64, "parent_idx": pl.UInt32})
    ops = rows.select(*thread, "ts_ns", "dur_ns",
                      _level=pl.lit(0) if level is None else level).with_row_index("_idx")
    # pre-order: parents before children, written order (the row number) for exact ties
    pre = ops.sort([*thread, "ts_ns", "dur_ns", "_level", "_idx"],
                   descending=[*[False] * len(thread), False, True, False, False]
                   ).with_columns(_pre=pl.int_range(pl.len(), dtype=pl.Int64))
    # one thread number and one tie key, so the sweep sorts three integer columns: at one
    # time, ends (0 .. 1 - 2n) before starts (2n + 2 + 2·pre), the inner end (later pre-order)
    # first; a 0-duration row's end (+1) right after its own start
    span = 2 * n + 2
    zero = pl.col("dur_ns") == 0
    pre = pre.with_columns(_thr=pl.struct(thread).rle_id())
    starts = pre.select("_thr", "_idx", _t=pl.col("ts_ns"), _key=span + 2 * pl.col("_pre"),
                        _d=pl.lit(1, pl.Int64))
    ends = pre.select("_thr", "_idx", _t=pl.col("ts_ns") + pl.col("dur_ns"),
                      _key=pl.when(zero).then(span + 2 * pl.col("_pre") + 1)
                      .otherwise(1 - 2 * pl.col("_pre")), _d=pl.lit(-1, pl.Int64))
    pts = (
        pl.concat([starts, ends]).sort("_thr", "_t", "_key")
        # each thread's +1/-1 sum to zero and its points are contiguous: a running sum over
        # all rows is the running sum per thread
        .with_columns(_depth=pl.col("_d").cum_sum(), _order=pl.int_range(pl.len()))
        .filter(pl.col("_d") == 1)
        .select("_thr", "_idx", "_depth", "_order")
    )
    cand = pts.select("_thr", pl.col("_depth").alias("_pdepth"), "_order",
                      pl.col("_idx").alias("_parent"))
    linked = (pts.with_columns(_pdepth=pl.col("_depth") - 1)
              .join_asof(cand, on="_order", by=["_thr", "_pdepth"], strategy="backward",
                         allow_exact_matches=False, check_sortedness=False))
    parent = np.empty(n, dtype=np.int64)  # back in the rows' order, without a sort
    parent[linked.get_column("_idx").to_numpy()] = (
        linked.get_column("_parent").fill_null(-1).cast(pl.Int64).to_numpy())
    ts = rows.get_column("ts_ns").to_numpy()
    end = ts + rows.get_column("dur_ns").to_numpy()
    parent = _containing(parent, ts, end)
    return pl.DataFrame({"depth": pl.Series(_depths(parent), dtype=pl.Int64),
                         "parent_idx": _row_numbers(parent)})


def _containing(parent: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each row's parent moved up until it contains the row (rounded timestamps can cross by
    a microsecond); a few vectorised steps, one per level climbed."""
    parent = parent.copy()
    rows = np.arange(parent.size)
    while True:
        p = np.maximum(parent, 0)
        bad = (parent >= 0) & ((ts[p] > ts[rows]) | (end[p] < end[rows]) | (end[p] == ts[p]))
        if not bad.any():
            return parent
        parent[bad] = parent[p[bad]]


def _depths(parent: np.ndarray) -> np.ndarray:
    """1 + the number of ancestors of each row: one vectorised step per level."""
    depth = np.ones(parent.size, dtype=np.int64)
    up = parent.copy()
    while (up >= 0).any():
        has = up >= 0
        depth[has] += 1
        up[has] = parent[up[has]]
    return depth


def innermost_open(points: pl.DataFrame, rows: pl.DataFrame, tree: pl.DataFrame, *,
                   at: str = "ts_ns", thread: tuple[str, ...] = THREAD) -> pl.Series:
    """For each row of ``points`` (``thread`` columns and ``at``), the row number in ``rows``
    of the innermost row open at that time on its thread (``ts <= t < end``; null: none).
    ``tree``: ``op_tree(rows)``. The latest row started at or before ``t`` is open, or one of
    its ancestors is: the first ancestor still open is the innermost."""
    n = points.height
    if n == 0 or rows.height == 0:
        return pl.Series("op_idx", [None] * n, dtype=pl.UInt32)
    # in pre-order: of rows starting together, the innermost is matched (the last)
    right = (rows.select(*thread, _ts="ts_ns", _dur="dur_ns").with_row_index("_row")
             .sort([*thread, "_ts", "_dur", "_row"],
                   descending=[*[False] * len(thread), False, True, False]).drop("_dur"))
    types = rows.select(thread).schema
    hit = (points.select(*[pl.col(c).cast(types[c]) for c in thread], _t=pl.col(at))
           .with_row_index("_p").sort("_t")
           .join_asof(right, left_on="_t", right_on="_ts", by=list(thread),
                      strategy="backward", check_sortedness=False).sort("_p"))
    cur = hit.get_column("_row").fill_null(-1).cast(pl.Int64).to_numpy().copy()
    t = hit.get_column("_t").to_numpy()
    ts = rows.get_column("ts_ns").to_numpy()
    end = ts + rows.get_column("dur_ns").to_numpy()
    parent = tree.get_column("parent_idx").fill_null(-1).cast(pl.Int64).to_numpy()
    while True:
        c = np.maximum(cur, 0)
        closed = (cur >= 0) & (end[c] <= t)
        if not closed.any():
            break
        cur[closed] = parent[c[closed]]
    return _row_numbers(cur).alias("op_idx")


def _row_numbers(rows: np.ndarray) -> pl.Series:
    """Row numbers as UInt32, -1 as null."""
    s = pl.Series("parent_idx", rows, dtype=pl.Int64)
    return s.set(s < 0, None).cast(pl.UInt32)
