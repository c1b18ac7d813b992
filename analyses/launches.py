"""The host runtime calls that launch GPU work, found by (rank, correlation).

A GPU event and the runtime call that launched it (kind ``cuda_runtime`` / ``cuda_driver``, or
another accelerator's runtime category, see ``is_runtime_call``) share a correlation id within
a rank. Gaps and launch delays look up hundreds of thousands of
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

from traceview.schema import ACCELERATOR_RUNTIME_CATEGORIES, RUNTIME_KINDS

Frame = pl.LazyFrame | pl.DataFrame

_CORRELATION_BITS = 40
_KEY = "_launch_key"


def launch_table(events: Frame, **aggs: pl.Expr) -> pl.DataFrame:
    """One row per (rank, correlation) of the runtime calls in ``events``: ``rank``,
    ``correlation`` and one column per ``aggs`` entry (an aggregation over that pair's calls,
    in their order, e.g. ``launch_ts_ns=pl.col("ts_ns").min()``). With packed keys the rows
    come in key order."""
    used = {c for agg in aggs.values() for c in agg.meta.root_names()}
    calls = (events.lazy()
             .filter(is_runtime_call(events) & pl.col("correlation").is_not_null())
             .select("rank", "correlation", *sorted(used - {"rank", "correlation"}))
             .collect())
    if _packable(calls, "correlation"):
        # Grouping on a key flagged sorted walks runs of equal keys instead of hashing them
        # (~4x faster). Calls come in time order per rank, so the key is usually sorted
        # already; the stable sort keeps each pair's calls in their order for the aggregations.
        keyed = calls.with_columns(_key("correlation"))
        if not keyed.get_column(_KEY).is_sorted():
            keyed = keyed.sort(_KEY, maintain_order=True)
        return (keyed.with_columns(pl.col(_KEY).set_sorted())
                .group_by(_KEY, maintain_order=True)
                .agg(pl.col("rank").first(), pl.col("correlation").first(), **aggs)
                .drop(_KEY))
    return calls.group_by("rank", "correlation").agg(**aggs)


def is_runtime_call(events: Frame) -> pl.Expr:
    """Boolean expression over ``events``: is the row a runtime call that launches device
    work? Kinds ``RUNTIME_KINDS``; where the frame has a ``category`` column, also rows of kind
    ``other`` in ``ACCELERATOR_RUNTIME_CATEGORIES`` (MTIA, XPU, PrivateUse1 runtimes, which
    the parsers store as they are). The host table (``host.host_events``) already gives those
    calls kind ``cuda_runtime``."""
    kind = pl.col("kind").cast(pl.String)
    runtime = kind.is_in(RUNTIME_KINDS)
    if "category" not in events.lazy().collect_schema().names():
        return runtime
    category = pl.col("category").cast(pl.String).str.to_lowercase()
    return runtime | ((kind == "other") & category.is_in(ACCELERATOR_RUNTIME_CATEGORIES))


def unlaunched_gpu(gpu: pl.DataFrame, events: Frame) -> pl.DataFrame:
    """The rows of ``gpu`` whose launch is not in the trace: they carry a correlation id, but
    no runtime call of ``events`` (``is_runtime_call``) of their rank has it. This is work
    queued before the profiler started (its launch happened before the trace begins). Rows
    without a correlation id are not counted: their source recorded no launch links at all,
    so nothing says their launch is missing."""
    launched = launch_table(events).with_columns(_launched=pl.lit(True))
    linked = gpu.filter(pl.col("correlation").is_not_null())
    return with_launches(linked, launched).filter(pl.col("_launched").is_null()).drop("_launched")


def unlaunched_counts(unlaunched: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """``rank, unlaunched_gpu_events``: how many rows of ``unlaunched`` (``unlaunched_gpu``)
    each rank of ``ranks`` has (0 when none)."""
    counts = unlaunched.group_by("rank").agg(unlaunched_gpu_events=pl.len())
    return (ranks.select("rank").join(counts, on="rank", how="left")
            .with_columns(pl.col("unlaunched_gpu_events").fill_null(0).cast(pl.Int64))
            .sort("rank"))


def with_launches(frame: pl.DataFrame, table: pl.DataFrame, *,
                  correlation: str = "correlation", how: str = "left") -> pl.DataFrame:
    """``frame`` joined (``how``: left or inner) with a ``launch_table`` on ``rank`` and its
    column ``correlation``; rows keep their order."""
    right = table.rename({"correlation": correlation})
    if not (_packable(frame, correlation) and _packable(right, correlation)):
        return frame.join(right, on=["rank", correlation], how=how, maintain_order="left")
    found = _lookup(frame, right, correlation)
    if found is None:  # repeated pairs or clashing names: the join says what they mean
        return (frame.with_columns(_key(correlation))
                .join(right.with_columns(_key(correlation)).drop("rank", correlation), on=_KEY,
                      how=how, maintain_order="left")
                .drop(_KEY))
    at, payload = found
    if how == "inner":
        keep = at.is_not_null()
        return pl.concat([frame.filter(keep), payload.select(pl.all().gather(at.filter(keep)))],
                         how="horizontal")
    return pl.concat([frame, payload.select(pl.all().gather(at))], how="horizontal")


def _lookup(frame: pl.DataFrame, right: pl.DataFrame,
            correlation: str) -> tuple[pl.Series, pl.DataFrame] | None:
    """For each row of ``frame``, the row of ``right`` with its packed key (null: none), and
    ``right``'s other columns; None when keys repeat or a column name is on both sides.

    A binary search per row over the sorted unique keys: no hash table of the 700 k launches
    of a large trace (~5x faster than the join). A null correlation never matches."""
    payload = right.drop("rank", correlation)
    if payload.width == 0 or set(payload.columns) & set(frame.columns):
        return None
    keys = right.select(_key(correlation)).to_series()
    if keys.null_count():
        return None
    if not keys.is_sorted():
        order = keys.to_frame().with_row_index("_i").sort(_KEY, maintain_order=True) \
            .get_column("_i")
        keys, payload = keys.gather(order), payload.select(pl.all().gather(order))
    if keys.len() > 1 and keys.diff().min() <= 0:
        return None
    wanted = frame.select(_key(correlation)).to_series()
    if keys.len() == 0:
        return pl.Series("at", [None] * frame.height, dtype=pl.UInt32), payload
    pos = keys.search_sorted(wanted, side="left").clip(0, keys.len() - 1)
    hit = pl.DataFrame({"pos": pos, "hit": (keys.gather(pos) == wanted).fill_null(False)})
    return hit.select(pl.when(pl.col("hit")).then(pl.col("pos"))).to_series(), payload


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
