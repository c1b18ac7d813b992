"""The replay graph's fast paths (issue 46 item 7, cost) give what the plain code gives.

Each fast path replaces a plain Polars expression by a cheaper one where the input allows
(rows already in thread order, a window that fits an int64 key); these properties check it
against the plain expression on any input, the ones it must refuse included (rows out of
order, nulls, ties, negative durations, huge thread ids)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.analyses.replay.graph import _by_thread_in_time
from traceview.analyses.replay.waits import NAME_CODE, _boundaries, name_codes, named
from traceview.schema import STEP_PATTERN

_OP = st.tuples(st.sampled_from([0, 1, 7]),                      # rank
                st.sampled_from([-3, 1, 2, 1 << 40]),            # tid (streams < 0)
                st.integers(0, 40).map(lambda t: t * 1_000),     # ts_ns (ties likely)
                st.sampled_from([-2_000, 0, 1_000, 5_000, 30_000]),  # duration (damaged < 0)
                st.sampled_from(["ProfilerStep#3", "aten::mm", "c10d::allreduce_"]))


def _frame(rows: list[tuple], in_order: bool) -> pl.DataFrame:
    ops = pl.DataFrame(rows, schema={"rank": pl.Int32, "tid": pl.Int64, "ts_ns": pl.Int64,
                                     "dur": pl.Int64, "name": pl.String}, orient="row")
    ops = ops.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur")).drop("dur")
    return ops.sort("rank", "tid", "ts_ns") if in_order else ops


@settings(max_examples=200, deadline=None)
@given(st.lists(_OP, max_size=40), st.booleans())
def test_boundaries_are_the_four_key_sort(rows, in_order) -> None:
    ops = _frame(rows, in_order)
    inner = pl.when(pl.col("name").str.starts_with("ProfilerStep")).then(0).otherwise(1) \
        .cast(pl.Int64)
    q = ["rank", "tid"]
    plain = pl.concat([ops.select(*q, a="ts_ns", d=inner),
                       ops.select(*q, a="end_ns", d=-inner)]).sort(*q, "a", "d")
    fast = _boundaries(ops, inner)
    assert fast.schema == plain.schema
    assert fast.equals(plain)


def test_boundaries_of_a_window_too_long_for_the_key_take_the_plain_sort() -> None:
    ops = pl.DataFrame({"rank": [0, 0], "tid": [1, 1], "ts_ns": [0, 1 << 43],
                        "end_ns": [5, (1 << 43) + 5], "name": ["a", "b"]},
                       schema_overrides={"rank": pl.Int32})
    inner = pl.lit(1, pl.Int64)
    assert _boundaries(ops, inner)["a"].to_list() == [0, 5, 1 << 43, (1 << 43) + 5]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([None, "ProfilerStep#2", "c10d::allreduce_", "gloo:all_reduce",
                                 "aten::mm", "NCCL_send", "record_param_comms"]), max_size=30),
       st.sampled_from([STEP_PATTERN, r"^(c10d::|record_param_comms$)",
                        r"^(gloo|mpi|ucc|nccl):|^c10d::|(?i)nccl"]))
def test_a_name_pattern_is_matched_once_per_name_with_the_same_answer(names, pattern) -> None:
    ops = pl.DataFrame({"name": names}, schema={"name": pl.String})
    plain = ops.select(pl.col("name").str.contains(pattern))
    # by the names themselves, and by their codes (the graph's ops carry them)
    for frame in (ops, ops.with_columns(name_codes(pl.col("name")).alias(NAME_CODE))):
        assert frame.select(named(frame, pattern).alias("name")).equals(plain)
        assert frame.filter(~named(frame, pattern)).select("name").equals(
            ops.filter(~pl.col("name").str.contains(pattern)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 3]), st.sampled_from([1, 2, 1 << 40]),
                          st.integers(0, 30)), max_size=40),
       st.lists(st.tuples(st.sampled_from([0, 1, 3]), st.sampled_from([1, 2, 1 << 40]),
                          st.integers(0, 30)), min_size=1, max_size=15),
       st.booleans())
def test_rows_in_thread_order_answer_an_asof_join_as_rows_sorted_by_time(rows, probes,
                                                                         in_order) -> None:
    schema = {"rank": pl.Int32, "tid": pl.Int64, "next_ns": pl.Int64}
    work = pl.DataFrame(rows, schema=schema, orient="row")
    if in_order:
        work = work.sort("rank", "tid", "next_ns")
    left = pl.DataFrame(probes, schema={"rank": pl.Int32, "tid": pl.Int64, "arrival_ns": pl.Int64},
                        orient="row").sort("arrival_ns")

    def joined(right: pl.DataFrame) -> pl.DataFrame:
        return left.join_asof(right, left_on="arrival_ns", right_on="next_ns",
                              by=["rank", "tid"], strategy="forward",
                              allow_exact_matches=False, check_sortedness=False)

    assert joined(_by_thread_in_time(work, "next_ns")).equals(joined(work.sort("next_ns")))
