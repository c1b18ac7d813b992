"""Text rules on event names, evaluated once per distinct name.

A trace repeats a few hundred names over millions of events, so a regular expression run on
every row costs orders of magnitude more than the same expression run on the distinct names
and joined back by the (dictionary-encoded) name. Both helpers stay lazy.

>>> import polars as pl
>>> ev = pl.DataFrame({"name": ["cudaLaunchKernel", "cudaDeviceSynchronize", None],
...                    "ts_ns": [0, 5, 9]})
>>> matching(ev, r"Synchronize$").collect().get_column("ts_ns").to_list()
[5]
>>> per_name(ev, short=pl.col("name").str.slice(0, 4)).collect().get_column("short").to_list()
['cuda', 'cuda', None]
"""

from __future__ import annotations

import polars as pl

Frame = pl.LazyFrame | pl.DataFrame


def matching(rows: Frame, pattern: str) -> pl.LazyFrame:
    """The rows whose ``name`` matches the regex ``pattern`` (a null name never matches), in
    their order."""
    lf = rows.lazy()
    names = lf.select(pl.col("name").unique()).filter(
        pl.col("name").cast(pl.String).str.contains(pattern))
    return lf.join(names, on="name", how="semi", maintain_order="left")


def per_name(rows: Frame, **columns: pl.Expr) -> pl.LazyFrame:
    """``rows`` with ``columns`` added, each an expression over ``pl.col("name")`` computed
    once per distinct name, in their order."""
    lf = rows.lazy()
    names = lf.select(pl.col("name").unique()).with_columns(**columns)
    return lf.join(names, on="name", how="left", nulls_equal=True, maintain_order="left")
