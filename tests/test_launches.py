"""Launch lookups by (rank, correlation) (analyses/launches.py): the packed one-integer key and
the two-column key give the same answer, including ids that cannot be packed."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.analyses.launches import launch_table, with_launches


def _calls(rows: list[tuple[int, str, int | None, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "kind": pl.String,
                                      "correlation": pl.Int64, "ts_ns": pl.Int64}, orient="row")


def test_lookup_by_hand() -> None:
    calls = _calls([(0, "cuda_runtime", 7, 50), (0, "cuda_driver", 7, 40), (1, "cuda_runtime", 7, 9),
                    (0, "cpu_op", 8, 1), (0, "cuda_runtime", None, 2)])
    table = launch_table(calls, first_ts=pl.col("ts_ns").first(), launch_ts_ns=pl.col("ts_ns").min())
    assert table.sort("rank").rows() == [(0, 7, 50, 40), (1, 7, 9, 9)]
    work = pl.DataFrame({"rank": [1, 0, 0, 0], "next": [7, 8, 7, None]},
                        schema={"rank": pl.Int32, "next": pl.Int64})
    got = with_launches(work, table, correlation="next")
    assert got.select("rank", "next", "launch_ts_ns").rows() == [
        (1, 7, 9), (0, 8, None), (0, 7, 40), (0, None, None)]
    assert with_launches(work, table, correlation="next", how="inner").height == 2


_row = st.tuples(st.integers(0, 2), st.sampled_from(["cuda_runtime", "cuda_driver", "kernel"]),
                 st.one_of(st.none(), st.integers(0, 5), st.sampled_from([-3, 2**40, 2**62])),
                 st.integers(0, 100))


@settings(max_examples=80, deadline=None)
@given(st.lists(_row, max_size=25), st.lists(_row, max_size=10))
def test_packed_and_plain_keys_agree(calls, work) -> None:
    c = _calls(calls)
    table = launch_table(c, launch_ts_ns=pl.col("ts_ns").min(), n=pl.len())
    plain = (c.filter(pl.col("kind").is_in(["cuda_runtime", "cuda_driver"])
                      & pl.col("correlation").is_not_null())
             .group_by("rank", "correlation").agg(launch_ts_ns=pl.col("ts_ns").min(), n=pl.len()))
    assert table.sort("rank", "correlation").equals(plain.sort("rank", "correlation"))
    w = _calls(work).select("rank", "correlation")
    got = with_launches(w, table)
    want = w.join(plain, on=["rank", "correlation"], how="left", maintain_order="left")
    assert got.equals(want)
    inner = w.join(plain, on=["rank", "correlation"], how="inner", maintain_order="left")
    assert with_launches(w, table, how="inner").equals(inner)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 6)),
                          st.integers(0, 9)), max_size=12),
       st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 6))),
                max_size=12))
def test_any_table_is_joined_like_a_join(table_rows, work_rows) -> None:
    """A table made by hand (unsorted, repeated pairs) is looked up as a join would."""
    table = pl.DataFrame(table_rows, schema={"rank": pl.Int32, "correlation": pl.Int64,
                                             "v": pl.Int64}, orient="row")
    work = pl.DataFrame(work_rows, schema={"rank": pl.Int32, "correlation": pl.Int64},
                        orient="row")
    for how in ("left", "inner"):
        want = work.join(table, on=["rank", "correlation"], how=how, maintain_order="left")
        assert with_launches(work, table, how=how).equals(want)
