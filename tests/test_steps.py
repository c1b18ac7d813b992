"""Which profiler step each event belongs to (traceview/store/steps.py), worked out by hand."""

from __future__ import annotations

import polars as pl
import pytest

from traceview.schema import events_frame
from traceview.store.steps import StepsOfRows, step_of_events


def _event(kind: str, name: str, ts: int, dur: int, rank: int = 0,
           correlation: int | None = None) -> dict:
    return dict(rank=rank, file_id=0, source="kineto", kind=kind, name=name, ts_ns=ts,
                dur_ns=dur, correlation=correlation)


#: (event, its step by hand)
CASES = [
    # rank 0: steps 3 on [0, 100) and 4 on [100, 200); rank 1: step 7 on [0, 150)
    (_event("user_annotation", "ProfilerStep#3", 0, 100), 3),
    (_event("user_annotation", "ProfilerStep#4", 100, 100), 4),
    (_event("user_annotation", "ProfilerStep#7", 0, 150, rank=1), 7),
    # host rows: the step whose range contains their start, on their own rank
    (_event("cpu_op", "aten::mm", 10, 500), 3),            # starts in 3, ends long after
    (_event("cpu_op", "aten::add", 199, 1), 4),
    (_event("cpu_op", "aten::add", 200, 1), None),         # a range's end is outside it
    (_event("cpu_op", "aten::add", -5, 1), None),          # before every step
    (_event("cpu_op", "aten::add", 160, 1, rank=1), None),  # rank 0's step, not rank 1's
    # launched in step 3, runs in step 4: the launch's step
    (_event("cuda_runtime", "cudaLaunchKernel", 90, 5, correlation=11), 3),
    (_event("kernel", "gemm", 150, 20, correlation=11), 3),
    # two calls with one correlation: the earliest (here listed second) decides
    (_event("cuda_runtime", "cudaLaunchKernel", 120, 5, correlation=12), 4),
    (_event("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=12), 3),
    (_event("memcpy", "Memcpy HtoD", 130, 5, correlation=12), 3),
    # the launch has no step: the GPU row keeps its own containment
    (_event("cuda_runtime", "cudaLaunchKernel", 300, 5, correlation=13), None),
    (_event("kernel", "late", 150, 5, correlation=13), 4),
    # no launch with that correlation, or none at all: containment
    (_event("kernel", "orphan", 50, 5, correlation=99), 3),
    (_event("kernel", "uncorrelated", 120, 5), 4),
    # the same correlation on rank 1 is another launch
    (_event("cuda_runtime", "cudaLaunchKernel", 140, 5, rank=1, correlation=11), 7),
    (_event("kernel", "gemm", 190, 5, rank=1, correlation=11), 7),
]


def _events() -> pl.DataFrame:
    return events_frame([event for event, _ in CASES])


def test_steps_by_hand() -> None:
    assert step_of_events(_events()).to_list() == [step for _, step in CASES]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, len(CASES)])
def test_any_range_of_rows_gets_the_steps_of_the_whole(size: int) -> None:
    """A batched ingest asks for each batch's rows; a GPU row's launch may be in another."""
    events = _events()
    steps = StepsOfRows(events)
    parts = [steps.rows(start, min(start + size, events.height))
             for start in range(0, events.height, size)]
    assert pl.concat(parts).to_list() == [step for _, step in CASES]
    assert all(part.dtype == pl.Int64 and part.name == "step" for part in parts)


def test_without_steps_every_row_is_null() -> None:
    events = _events().filter(pl.col("kind") != "user_annotation")
    assert StepsOfRows(events).rows(2, 7).to_list() == [None] * 5
    assert step_of_events(events).null_count() == events.height


def test_step_numbers_past_int32_are_kept_and_past_int64_are_no_steps():
    """The profiler's step counter is unbounded: 2^32 and 2^63-1 are steps like any other; a
    number no int64 holds is no step (its marker passed over and counted), never a failure."""
    events = events_frame([
        _event("user_annotation", "ProfilerStep#4294967296", 0, 100),
        _event("cpu_op", "aten::mm", 10, 5),
        _event("user_annotation", "ProfilerStep#9223372036854775807", 100, 100),
        _event("cpu_op", "aten::mm", 110, 5),
        _event("user_annotation", "ProfilerStep#" + "9" * 30, 200, 100),
        _event("cpu_op", "aten::mm", 210, 5),
        _event("user_annotation", "ProfilerStep#9223372036854775808", 300, 100),
        _event("cpu_op", "aten::mm", 310, 5)])
    steps = StepsOfRows(events)
    assert steps.oversized == 2
    assert steps.rows(0, events.height).to_list() == [2**32, 2**32, 2**63 - 1, 2**63 - 1,
                                                      None, None, None, None]
