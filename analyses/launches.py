"""The host runtime calls that launch GPU work, found by (rank, correlation).

A GPU event and the runtime call that launched it (kind ``cuda_runtime`` / ``cuda_driver``)
share a correlation id within a rank. Gaps and launch delays look up hundreds of thousands of
them. Both columns together make a slow key (a group-by and a join on two columns cost ~2x one
on an integer), so the pair is packed into one Int64, the rank in the high bits, whenever the
ids allow it (0 <= correlation < 2**40, 0 <= rank < 2**23); otherwise the two columns are used
as they are. The result is the same either way.

>>> import polars as pl
>>> calls = pl.DataFrame({"rank": [0, 0, 1], "kind": ["cuda_runtime"] * 3,
...                       "correlation": [7, 7, 7], "ts_ns": [5, 3, 9]})
>>> t = launch_table(calls, launch_ts_ns=pl.col("ts_ns").min())
>>> work = pl.DataFrame({"rank": [1, 0], "correlation": [7, 7]})
>>> with_launches(work, t).rows()
[(1, 7, 9), (0, 7, 3)]
"""

from __future__ import annotations

import polars as pl

Frame = pl.LazyFrame | pl.DataFrame

#: Host-side kinds of the calls that launch GPU work.
RUNTIME_KINDS: list[str] = ["cuda_runtime", "cuda_driver"]

_CORRELATION_BITS = 40
_KEY = "_launch_key"


def launch_table(events: Frame, **aggs: pl.Expr) -> pl.DataFrame:
    """One row per (rank, correlation) of the runtime calls in ``events``: ``rank``,
    ``correlation`` and one column per ``aggs`` entry (an aggregation over that pair's calls,
    in their order, e.g. ``launch_ts_ns=pl.col("ts_ns").min()``)."""
    used = {c for agg in aggs.values() for c in agg.meta.root_names()}
    calls = (events.lazy()
             .filter(pl.col("kind").is_in(RUNTIME_KINDS) & pl.col("correlation").is_not_null())
             .select("rank", "correlation", *sorted(used - {"rank", "correlation"}))
             .collect())
    if _packable(calls, "correlation"):
        return (calls.group_by(_key("correlation"))
                .agg(pl.col("rank").first(), pl.col("correlation").first(), **aggs)
                .drop(_KEY))
    return calls.group_by("rank", "correlation").agg(**aggs)


def with_launches(frame: pl.DataFrame, table: pl.DataFrame, *,
                  correlation: str = "correlation", how: str = "left") -> pl.DataFrame:
    """``frame`` joined (``how``: left or inner) with a ``launch_table`` on ``rank`` and its
    column ``correlation``; rows keep their order."""
    right = table.rename({"correlation": correlation})
    if _packable(frame, correlation) and _packable(right, correlation):
        return (frame.with_columns(_key(correlation))
                .join(right.with_columns(_key(correlation)).drop("rank", correlation), on=_KEY,
                      how=how, maintain_order="left")
                .drop(_KEY))
    return frame.join(right, on=["rank", correlation], how=how, maintain_order="left")


def _key(correlation: str) -> pl.Expr:
    return (pl.col("rank").cast(pl.Int64) * (1 << _CORRELATION_BITS)
            + pl.col(correlation).cast(pl.Int64)).alias(_KEY)


def _packable(frame: pl.DataFrame, correlation: str) -> bool:
    """Whether (rank, correlation) of every row packs into one Int64 without collisions
    (rows with a null correlation never match, packed or not)."""
    if frame.height == 0:
        return True
    lo_c, hi_c, lo_r, hi_r = frame.select(
        pl.col(correlation).min(), pl.col(correlation).max().alias("_hc"),
        pl.col("rank").min().alias("_lr"), pl.col("rank").max().alias("_hr")).row(0)
    if lo_c is None:  # every correlation null
        return True
    return lo_c >= 0 and hi_c < (1 << _CORRELATION_BITS) and lo_r >= 0 and hi_r < (1 << 23)
