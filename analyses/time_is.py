"""What a collective's time is made of: ``transfer``, ``skew``, ``mixed`` or ``inconclusive``.

Definition, thresholds and their derivation: ``docs/metrics.md``, section *Collectives: what
the time is*. Per instance, on the dependency graph's terms
(:mod:`traceview.analyses.dependency_graph`): the *arrival spread* ``S`` the ranks' own time
made (``own_spread_ns``: last arrival minus the later of the first arrival and the last
arriver's previous release; ``collectives.own_spread``), the *transfer*
``T`` (``comm_ns``: the last arriver's call, which waits for nobody; clock-free) and the
clocks' uncertainty ``U`` (``uncertainty_ns``, :mod:`traceview.analyses.align_error`:
``|error| <= 3U`` for 95% of clocks).

* ``skew`` when ``S >= SKEW_RATIO x T``: waiting is at least two thirds of the first
  arriver's time in the call;
* ``transfer`` when ``S <= T / SKEW_RATIO``: the transfer is at least two thirds of it;
* ``mixed`` in between;
* ``inconclusive`` when the label at ``S - 3U`` and at ``S + 3U`` differ (the clocks cannot
  tell which side of a threshold the spread is on), or when there is no transfer time.

>>> df = pl.DataFrame({"skew_ns": [100, 5000, 1500, 900, 0], "comm_ns": [1000, 1000, 1000,
...                    1000, 0], "uncertainty_ns": [10, 10, 10, 400, 0]})
>>> df.select(label=time_is(pl.col("skew_ns"), pl.col("comm_ns"),
...                         pl.col("uncertainty_ns"))).get_column("label").to_list()
['transfer', 'skew', 'mixed', 'inconclusive', 'inconclusive']
"""

from __future__ import annotations

import polars as pl

#: A component *dominates* when it is at least this many times the other (docs/metrics.md).
SKEW_RATIO = 2.0
#: The clocks' error bound in units of ``uncertainty_ns`` (align_error's calibration: 95%).
UNCERTAINTY_BOUND = 3.0

LABELS: tuple[str, ...] = ("transfer", "skew", "mixed", "inconclusive")


def _label(spread: pl.Expr, transfer: pl.Expr) -> pl.Expr:
    s, t = spread.cast(pl.Float64), transfer.cast(pl.Float64)
    return (pl.when(t.is_null() | s.is_null() | ((t <= 0) & (s <= 0))).then(None)
            .when(s >= SKEW_RATIO * t).then(pl.lit("skew"))
            .when(s * SKEW_RATIO <= t).then(pl.lit("transfer"))
            .otherwise(pl.lit("mixed")))


def time_is(spread: pl.Expr, transfer: pl.Expr, uncertainty: pl.Expr) -> pl.Expr:
    """The label (module docstring) of arrival spread ``spread`` against ``transfer``, with
    clocks uncertain by ``uncertainty`` (ns; null counts as 0: one clock)."""
    bound = UNCERTAINTY_BOUND * uncertainty.fill_null(0).cast(pl.Float64)
    s = spread.cast(pl.Float64)
    low, high = _label((s - bound).clip(0.0), transfer), _label(s + bound, transfer)
    return (pl.when(low.is_not_null() & (low == high)).then(_label(s, transfer))
            .otherwise(pl.lit("inconclusive")))


def wait_share(spread: pl.Expr, transfer: pl.Expr) -> pl.Expr:
    """``S / (S + T)``: the share of the first arriver's time in the call spent waiting."""
    s, t = spread.cast(pl.Float64), transfer.cast(pl.Float64)
    return pl.when((s + t) > 0).then(s / (s + t))


def label_counts(label: pl.Expr) -> list[pl.Expr]:
    """Aggregations counting each label (``time_is_transfer`` ... ``time_is_inconclusive``)."""
    return [(label == name).sum().cast(pl.Int64).alias(f"time_is_{name}") for name in LABELS]


__all__ = ["LABELS", "SKEW_RATIO", "UNCERTAINTY_BOUND", "label_counts", "time_is", "wait_share"]
