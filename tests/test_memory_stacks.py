"""Memory stacks that point at the user (issue 49, item 5): the allocator's own frames
(``c10::``, ``CUDACachingAllocator``, ``torch/cuda/memory.py``) are skipped when a stack and
``peak_op`` are named; the user's innermost frame is shown, the whole stack stays in --json.
A hand-drawn snapshot whose frames are what PyTorch records with ``context="all"``."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from snapshot_helpers import write
from traceview.analyses.memory_snapshot import user_frame
from traceview.cli import main
from traceview.run.memory import memory_result

#: Innermost first, as the allocator records them: its C++ frames, PyTorch's Python
#: allocator wrapper, then the user's code.
_ALLOCATOR = [
    {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1234,
     "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
    {"filename": "??", "line": 0,
     "name": "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate"},
    {"filename": "/usr/lib/python3/site-packages/torch/cuda/memory.py", "line": 170,
     "name": "caching_allocator_alloc"},
]
_ATEN = [{"filename": "/pytorch/aten/src/ATen/native/TensorFactories.cpp", "line": 88,
          "name": "at::native::empty_cuda"}]


def _user(*names: str) -> list[dict]:
    return [{"filename": f"/home/me/{n}.py", "line": 10 + i, "name": n}
            for i, n in enumerate(names)]


def _snapshot() -> dict:
    """Device 0: one 4096 B segment; recorded: alloc A 1000 (model.forward through the
    allocator), alloc B 3000 (a user's memory.py, through ATen and the allocator). Peak 4000
    at action 1 (B): peak_op is memory.py:10:memory (the user's file named memory.py, not
    PyTorch's torch/cuda/memory.py)."""
    a = [*_ALLOCATOR, *_user("forward", "train")]
    b = [*_ALLOCATOR, *_ATEN, *_user("memory", "train")]
    seg = {"device": 0, "address": 0, "total_size": 4096, "stream": 0, "segment_type": "large",
           "allocated_size": 4000, "active_size": 4000,
           "blocks": [{"address": 0, "size": 1024, "requested_size": 1000,
                       "state": "active_allocated", "frames": a},
                      {"address": 1024, "size": 3072, "requested_size": 3000,
                       "state": "active_allocated", "frames": b}]}
    trace = [{"action": "alloc", "addr": 0, "size": 1000, "stream": 0, "time_us": 5,
              "frames": a},
             {"action": "alloc", "addr": 1024, "size": 3000, "stream": 0, "time_us": 9,
              "frames": b}]
    return {"segments": [seg], "device_traces": [trace]}


def test_user_frame_skips_the_allocator() -> None:
    stacks = pl.DataFrame({"stack": [
        "train.py:11:train;model.py:10:forward;torch/cuda/memory.py:170:caching_allocator_alloc;"
        "CUDACachingAllocator.cpp:1234:c10::cuda::CUDACachingAllocator::malloc",
        "train.py:11:train;TensorFactories.cpp:88:at::native::empty_cuda;"
        "CUDACachingAllocator.cpp:1:c10::cuda::CUDACachingAllocator::malloc",
        "CUDACachingAllocator.cpp:1:c10::cuda::CUDACachingAllocator::malloc",
        # PyTorch's own Python between the user and the allocator: the user's line names it
        "train.py:11:train;model.py:20:forward;torch/nn/modules/linear.py:125:forward;"
        "TensorFactories.cpp:88:at::native::empty_cuda;CUDACachingAllocator.cpp:1:malloc",
        "torch/optim/adam.py:90:step;torch/cuda/memory.py:170:caching_allocator_alloc",
        None]})
    got = stacks.select(user_frame(pl.col("stack"))).to_series().to_list()
    assert got == ["model.py:10:forward", "train.py:11:train",
                   "CUDACachingAllocator.cpp:1:c10::cuda::CUDACachingAllocator::malloc",
                   "model.py:20:forward", "torch/optim/adam.py:90:step", None]


def test_peak_op_and_top_stacks_name_the_user(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "rank-0.snapshot.pickle", _snapshot())
    res = memory_result(None, [str(path)])
    dev = res.table("devices").row(0, named=True)
    assert dev["peak_allocated_bytes"] == 4000 and dev["peak_op"] == "memory.py:10:memory"
    assert "torch/cuda/memory.py:170:caching_allocator_alloc" in dev["peak_stack"]
    stacks = res.table("top_stacks")
    assert stacks.select("bytes", "frame").rows() == [(3000, "memory.py:10:memory"),
                                                      (1000, "forward.py:10:forward")]
    assert stacks["stack"][0].endswith("DeviceCachingAllocator::malloc")  # whole in --json
    assert main(["memory", str(path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("Top allocation stacks"):]
    assert "c10::" not in table and "caching_allocator_alloc" not in table
    assert "train.py:11:train > memory.py:10:memory > " \
           "TensorFactories.cpp:88:at::native::empty_cuda" in table
    assert main(["memory", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["top_stacks"][0]["frame"] == "memory.py:10:memory"
    assert "CUDACachingAllocator" in doc["top_stacks"][0]["stack"]
