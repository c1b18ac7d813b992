"""A value across many ranks, or along many steps, reduced to what a reader can take in.

* :func:`distribution`: per metric, the median, p90 and max across ranks and the rank that
  holds the max, with the outlier ranks (:func:`outliers`);
* :func:`outliers`: the ranks whose value sits far from the others' (robust z, with a floor
  relative to the median so a run of near-identical ranks flags nobody);
* :func:`binned_steps`: a per-step series cut into at most ``bins`` runs of consecutive steps,
  each keeping its median and its worst step, so a 2,000-step run is a few hundred points and
  its slowest steps are still visible.

Definitions: docs/metrics.md, section "Across ranks and along steps".

>>> import polars as pl
>>> per_rank = pl.DataFrame({"rank": [0, 1, 2, 3, 4], "step_ms": [10.0, 10.2, 10.0, 10.0, 30.0]})
>>> distribution(per_rank, ["step_ms"]).select("median", "max", "max_rank",
...                                            "outlier_ranks").row(0)
(10.0, 30.0, 4, [4])
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

#: Past this many ranks, outputs show the distribution and the outliers rather than a row
#: (or a bar) per rank: a few dozen is what a reader can still tell apart.
MANY_RANKS = 32
#: Robust z beyond which a rank is an outlier (Iglewicz and Hoaglin's 3.5).
OUTLIER_Z = 3.5
#: ... and it must also differ from the median by this share of it (near-identical ranks
#: have a MAD of almost nothing, which would make a 1 % difference an outlier).
OUTLIER_MIN_REL = 0.05
#: 1.4826 x MAD estimates the standard deviation of normally distributed values.
_MAD_TO_SD = 1.4826


def outliers(per_rank: pl.DataFrame, column: str, *, z: float = OUTLIER_Z,
             min_rel: float = OUTLIER_MIN_REL) -> pl.DataFrame:
    """``rank, value, robust_z`` of the ranks whose ``column`` is an outlier, furthest first.

    A rank is an outlier when ``|value − median| > max(z · 1.4826 · MAD, min_rel · |median|)``
    over the ranks with a value (MAD: median absolute deviation). ``robust_z`` is
    ``(value − median) / (1.4826 · MAD)``, null when MAD is 0. Fewer than 3 ranks: none.
    """
    v = per_rank.select("rank", value=pl.col(column)).filter(pl.col("value").is_not_null())
    empty = pl.DataFrame(schema={"rank": v.schema["rank"], "value": v.schema["value"],
                                 "robust_z": pl.Float64})
    if v.height < 3:
        return empty
    med = v["value"].median()
    mad = (v["value"] - med).abs().median()
    scale = _MAD_TO_SD * mad
    bound = max(z * scale, min_rel * abs(med))
    dev = (pl.col("value") - med)
    return (v.filter(dev.abs() > bound)
            .with_columns(robust_z=dev / scale if scale > 0 else pl.lit(None, pl.Float64))
            .sort(dev.abs(), "rank", descending=[True, False]))


def distribution(per_rank: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """One row per column of ``per_rank`` (one row per rank): ``metric, ranks, median, p90,
    max, max_rank, min, min_rank, outlier_ranks`` (p90: linear interpolation; ties for the
    max or min go to the lowest rank; ``outlier_ranks``: :func:`outliers`, furthest first,
    each rank once when ``per_rank`` has several rows per rank, e.g. one per step)."""
    rows = []
    for col in columns:
        v = per_rank.select("rank", value=pl.col(col)).filter(pl.col("value").is_not_null())
        if v.height == 0:
            rows.append({"metric": col, "ranks": 0, "median": None, "p90": None, "max": None,
                         "max_rank": None, "min": None, "min_rank": None, "outlier_ranks": []})
            continue
        top = v.sort("value", "rank", descending=[True, False]).row(0, named=True)
        low = v.sort("value", "rank").row(0, named=True)
        rows.append({"metric": col, "ranks": v.height, "median": v["value"].median(),
                     "p90": v["value"].quantile(0.9, "linear"), "max": top["value"],
                     "max_rank": top["rank"], "min": low["value"], "min_rank": low["rank"],
                     "outlier_ranks": outliers(v, "value")["rank"].unique(
                         maintain_order=True).to_list()})
    return pl.DataFrame(rows, schema={
        "metric": pl.String, "ranks": pl.Int64, "median": pl.Float64, "p90": pl.Float64,
        "max": pl.Float64, "max_rank": pl.Int64, "min": pl.Float64, "min_rank": pl.Int64,
        "outlier_ranks": pl.List(pl.Int64)})


def binned_steps(per_step: pl.DataFrame, value: str, *, bins: int = 300) -> pl.DataFrame:
    """``per_step`` (``step`` and ``value``, one row per step or per rank and step) in at most
    ``bins`` runs of consecutive steps of equal width: ``first_step, last_step, n, median,
    max, max_step`` (the step holding the bin's max; ties: the earliest). With no more steps
    than ``bins`` every bin is one step."""
    rows = per_step.select("step", v=pl.col(value)).filter(pl.col("v").is_not_null())
    if rows.height == 0:
        return pl.DataFrame(schema={"first_step": pl.Int64, "last_step": pl.Int64,
                                    "n": pl.UInt32, "median": pl.Float64, "max": pl.Float64,
                                    "max_step": pl.Int64})
    lo, hi = rows["step"].min(), rows["step"].max()
    width = max(1, -(-(hi - lo + 1) // bins))  # ceil: at most `bins` bins
    return (rows.with_columns(_bin=(pl.col("step") - lo) // width)
            .sort("v", "step", descending=[True, False])
            .group_by("_bin", maintain_order=False)
            .agg(first_step=pl.col("step").min().cast(pl.Int64),
                 last_step=pl.col("step").max().cast(pl.Int64), n=pl.len(),
                 median=pl.col("v").median(), max=pl.col("v").first().cast(pl.Float64),
                 max_step=pl.col("step").first().cast(pl.Int64))
            .sort("_bin").drop("_bin"))
