"""analyses/spread.py: the distribution across ranks, its outliers, and binned steps, on
values small enough to check by hand."""

from __future__ import annotations

import polars as pl
import pytest

from traceview.analyses.spread import binned_steps, distribution, outliers


def test_distribution_by_hand() -> None:
    # 9 ranks at 10 ms and one at 19: median 10, p90 by linear interpolation between the 9th
    # and 10th sorted values (position 0.9 * 9 = 8.1): 10 + 0.1 * 9 = 10.9; MAD 0, so the
    # relative floor decides: |19 - 10| > 0.05 * 10 -> rank 7 is the outlier
    per_rank = pl.DataFrame({"rank": list(range(10)),
                             "step_ns": [10.0] * 7 + [19.0] + [10.0] * 2})
    row = distribution(per_rank, ["step_ns"]).row(0, named=True)
    assert row["median"] == 10.0 and row["p90"] == pytest.approx(10.9)
    assert (row["max"], row["max_rank"], row["min"], row["min_rank"]) == (19.0, 7, 10.0, 0)
    assert row["outlier_ranks"] == [7]


def test_outliers_use_the_robust_z() -> None:
    # values 10, 12, 14, 16, 18, 40: median 15, |dev| 5 3 1 1 3 25 -> MAD 3, scale 4.4478;
    # bound max(3.5 * 4.4478, 0.05 * 15) = 15.567: only 40 (dev 25, z 5.62) is out
    per_rank = pl.DataFrame({"rank": [0, 1, 2, 3, 4, 5],
                             "v": [10.0, 12.0, 14.0, 16.0, 18.0, 40.0]})
    out = outliers(per_rank, "v")
    assert out["rank"].to_list() == [5]
    assert out["robust_z"][0] == pytest.approx(25 / (1.4826 * 3))
    # near-identical ranks flag nobody: 1 % apart is below the 5 % floor
    same = pl.DataFrame({"rank": [0, 1, 2, 3], "v": [100.0, 100.0, 101.0, 100.0]})
    assert outliers(same, "v").height == 0
    assert outliers(per_rank.head(2), "v").height == 0  # fewer than 3 ranks: none


def test_binned_steps_keep_the_worst_step() -> None:
    # 10 steps in 3 bins of ceil(10 / 3) = 4 steps: 0-3, 4-7, 8-9; step 6 is slow on rank 1
    rows = pl.DataFrame({"step": list(range(10)) * 2, "rank": [0] * 10 + [1] * 10,
                         "ms": [1.0] * 10 + [1.0] * 6 + [9.0] + [1.0] * 3})
    b = binned_steps(rows, "ms", bins=3)
    assert b.select("first_step", "last_step", "n").rows() == [(0, 3, 8), (4, 7, 8), (8, 9, 4)]
    assert b["max"].to_list() == [1.0, 9.0, 1.0] and b["max_step"][1] == 6
    assert b["median"].to_list() == [1.0, 1.0, 1.0]
    one = binned_steps(rows, "ms", bins=300)  # fewer steps than bins: a bin per step
    assert one.height == 10 and one["max"][6] == 9.0
