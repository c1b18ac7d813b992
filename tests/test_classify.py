"""GPU-event selection and classification (analyses/classify.py) on hand-built traces."""

from __future__ import annotations

import polars as pl

from traceview.analyses.classify import ClassifyPatterns, gpu_events
from traceview.schema import events_frame


def _ev(kind: str, name: str, ts: int, dur: int | None, **kw) -> dict:
    row = {"rank": 0, "file_id": 0, "source": "kineto", "kind": kind, "name": name,
           "ts_ns": ts, "dur_ns": dur, "device": 0, "stream": 7}
    row.update(kw)
    return row


def test_classes_and_directions() -> None:
    ev = events_frame([
        _ev("kernel", "volta_sgemm_128x64_nn", 0, 10),
        _ev("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 0, 10),
        _ev("kernel", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 0, 10),
        _ev("kernel", "RCCLKERNEL_allgather", 0, 10),  # case-insensitive
        _ev("memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 10),
        _ev("memcpy", "Memcpy DtoH (Device -> Pinned)", 0, 10),
        _ev("memcpy", "whatever", 0, 10, copy_kind="DtoD"),
        _ev("memcpy", "Memcpy PtoP (Device -> Device)", 0, 10),
        _ev("memset", "Memset (Device)", 0, 10),
        _ev("cpu_op", "aten::mm", 0, 10),  # not GPU work
        _ev("cuda_runtime", "cudaLaunchKernel", 0, 10, correlation=1),
        _ev("gpu_user_annotation", "nccl:all_reduce", 0, 10),  # GPU-side annotation: not work
        _ev("kernel", "no_duration", 0, None),  # dropped: cannot be placed
    ])
    got = gpu_events(ev).collect()
    assert got.get_column("gpu_class").to_list() == [
        "compute", "comm", "comm", "comm", "memcpy", "memcpy", "memcpy", "memcpy", "memset"]
    assert got.get_column("gpu_subclass").to_list() == [
        "compute", "comm", "comm", "comm", "memcpy_htod", "memcpy_dtoh", "memcpy_dtod",
        "memcpy_ptop", "memset"]
    assert got.get_column("end_ns").to_list() == [10] * 9


def test_old_capitalised_categories_are_gpu_events() -> None:
    # a reader that left kind "other" but kept the 2021 category still yields GPU events
    ev = events_frame([
        _ev("other", "k", 5, 3, category="Kernel"),
        _ev("other", "Memcpy HtoD", 5, 3, category="Memcpy"),
        _ev("other", "Memset", 5, 3, category="gpu_memset"),
        _ev("other", "x", 5, 3, category="Operator"),
        _ev("cpu_op", "y", 5, 3, category="kernel"),  # a known kind is not overridden
    ])
    assert gpu_events(ev).collect().get_column("gpu_subclass").to_list() == [
        "compute", "memcpy_htod", "memset"]


def test_device_and_stream_fall_back_to_pid_tid() -> None:
    ev = events_frame([_ev("kernel", "k", 0, 1, device=None, stream=None, pid=3, tid=21)])
    row = gpu_events(ev).collect().row(0, named=True)
    assert (row["device"], row["stream"]) == (3, 21)


def test_user_patterns_override() -> None:
    ev = events_frame([
        _ev("kernel", "my_custom_allreduce_kernel", 0, 4),
        _ev("kernel", "ncclKernel_x", 0, 4),
        _ev("kernel", "__amd_rocclr_copyBuffer", 0, 4),
        _ev("kernel", "__amd_rocclr_fillBufferAligned", 0, 4),
        _ev("kernel", "profiler_noise", 0, 4),
    ])
    pats = ClassifyPatterns(comm=r"(?i)nccl|allreduce", memcpy_kernel=r"^__amd_rocclr_copy",
                            memset_kernel=r"^__amd_rocclr_fill", ignore=r"^profiler_")
    got = gpu_events(ev, patterns=pats).collect()
    assert got.get_column("gpu_subclass").to_list() == [
        "comm", "comm", "memcpy_other", "memset"]
    # defaults: only nccl/rccl is comm, the AMD copy kernels are compute, nothing ignored
    assert gpu_events(ev).collect().get_column("gpu_class").to_list() == [
        "compute", "comm", "compute", "compute", "compute"]


def test_lazy_and_eager_inputs_agree_and_input_is_not_mutated() -> None:
    ev = events_frame([_ev("kernel", "k", 0, 1)])
    before = ev.clone()
    assert gpu_events(ev).collect().equals(gpu_events(ev.lazy()).collect())
    assert ev.equals(before)
    assert isinstance(gpu_events(ev), pl.LazyFrame)


def test_a_name_under_two_kinds_keeps_each_rows_own_class() -> None:
    """In memory, rows find their class by name alone when every name has one combination of
    kind, category and copy kind; here one name has two, and only the GPU one is GPU work."""
    rows = [
        _ev("kernel", "shared_name", 0, 10),
        _ev("other", "shared_name", 20, 10, category="cpu_op"),  # not GPU work: dropped
        _ev("other", "copy", 40, 10, category="gpu_memcpy", copy_kind="HtoD"),
        _ev("memcpy", "copy", 60, 10, copy_kind="DtoH"),  # same name, other direction
    ]
    want = [(0, "compute", "compute"), (40, "memcpy_htod", "memcpy"),
            (60, "memcpy_dtoh", "memcpy")]
    for frame, expected in ((events_frame(rows), want), (events_frame(rows).lazy(), want),
                            (events_frame([rows[0], rows[3]]), [want[0], want[2]])):
        got = gpu_events(frame).select("ts_ns", "gpu_subclass", "gpu_class").collect().rows()
        assert got == expected
