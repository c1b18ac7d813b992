"""``traceview memory PATH...``: peak memory per rank and device, growth, pressure, snapshots.

PATHs are traces (Kineto JSON recorded with ``profile_memory=True``, nsys exports with CUDA
memory usage) and CUDA caching-allocator snapshots (``.pickle`` files from
``torch.cuda.memory._dump_snapshot``), in any mix. Snapshots are read as untrusted input: a
pickle that asks for anything but plain data is refused (exit 2) before it runs. Every number
comes from ``Run.memory`` (``traceview.run.memory``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from traceview.cli._options import (
    MAX_ROWS,
    add_align_arg,
    add_input_args,
    add_json_arg,
    add_window_args,
    open_run,
    whole,
)
from traceview.analyses.memory_snapshot import ALLOCATOR_FRAMES
from traceview.cli._render import emit_result, pct, short, table
from traceview.parsers import is_trace_name
from traceview.parsers.torch_snapshot import is_snapshot_path
from traceview.run.memory import memory_result


def configure(p: argparse.ArgumentParser, command: str) -> None:
    add_input_args(p)
    add_window_args(p)
    p.add_argument("--time", metavar="A:B", help="time window relative to the first event")
    add_align_arg(p)
    p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, metavar="N",
                   help="allocation stacks to list per snapshot device")
    add_json_arg(p, csv=True)
    p.set_defaults(run=run_memory)


def split_inputs(paths: list[str]) -> tuple[list[str], list[str]]:
    """(traces, snapshots): a ``.pickle`` / ``.pkl`` file is a snapshot; a folder gives its
    snapshots (one level, as its traces) and stays a trace input when it holds traces (a
    ``traceview.capture`` run directory holds both)."""
    traces: list[str] = []
    snaps: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inner = sorted(p for p in path.iterdir() if p.is_file())
            found = [str(p) for p in inner if is_snapshot_path(p) and not p.name.startswith(".")]
            snaps += found
            if not found or any(is_trace_name(p) for p in inner):
                traces.append(raw)
        elif is_snapshot_path(raw):
            snaps.append(raw)
        else:
            traces.append(raw)
    return traces, snaps


def memory_of(args: argparse.Namespace):  # -> Result
    traces, snaps = split_inputs(args.paths)
    if traces:
        args.paths = traces
        return open_run(args).memory(snapshots=snaps, top=args.top)

    return memory_result(None, snaps, top=args.top)


def size(n: float | None) -> str:
    """Bytes in their largest binary unit: ``512 B``, ``1.5 KiB``, ``2.0 GiB``.

    >>> [size(v) for v in (None, 512, 1536, 3 * 2**30)]
    ['-', '512 B', '1.5 KiB', '3.0 GiB']
    """
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def run_memory(args: argparse.Namespace) -> int:
    result = memory_of(args)
    if emit_result(result, args):
        return 0
    devices = result["devices"]
    if devices.height == 0:
        print("no allocator events and no snapshots: nothing to report (see the warnings)")
        return 0
    print("Memory per rank and device (basis: absolute = the allocator's totals, "
          "relative = from the trace's start; peak_ms: after the device's first allocator "
          "event)")
    print(table(["rank", "device", "source", "basis", "peak_alloc", "peak_reserved", "peak_ms",
                 "peak_op", "rate/s", "growth", "near_limit"],
                [[r["rank"], r["device"], r["source"], r["basis"], size(r["peak_allocated_bytes"]),
                  size(r["peak_reserved_bytes"]),
                  None if r["peak_time_ns"] is None or r["first_event_ns"] is None else
                  f"{(r['peak_time_ns'] - r['first_event_ns']) / 1e6:.3f}", short(r["peak_op"], 40),
                  size(r["allocation_rate_bytes_per_s"]), size(r["growth_bytes"]),
                  "yes" if r["near_limit"] else "no"]
                 for r in devices.iter_rows(named=True)],
                left={"device", "source", "basis", "peak_op"}))
    snaps = devices.filter(devices["source"] == "snapshot")
    if snaps.height:
        print("\nAllocator snapshots: state at snapshot time")
        print(table(["rank", "device", "segments", "allocated", "reserved", "fragmentation",
                     "largest_free", "start_alloc", "ooms"],
                    [[r["rank"], r["device"], r["segments"], size(r["allocated_bytes"]),
                      size(r["reserved_bytes"]), size(r["fragmentation_bytes"]),
                      size(r["largest_free_block_bytes"]), size(r["start_allocated_bytes"]),
                      r["ooms"]] for r in snaps.iter_rows(named=True)]))
        stacks = result["top_stacks"]
        if stacks.height:
            print("\nTop allocation stacks at the peak")
            print(table(["rank", "device", "bytes", "blocks", "share", "stack (innermost last)"],
                        [[r["rank"], r["device"], size(r["bytes"]), r["blocks"],
                          pct(r["share"]), _stack_tail(r["stack"])]
                         for r in stacks.iter_rows(named=True)],
                        left={"device", "stack (innermost last)"}, max_width=None))
    steps = result["steps"]
    if steps.height:
        print("\nAllocated at each step start")
        print(table(["rank", "device", "step", "allocated"],
                    [[r["rank"], r["device"], r["step"], size(r["allocated_bytes"])]
                     for r in steps.iter_rows(named=True)], left={"device"}))
    return 0


def _stack_tail(stack: str | None, frames: int = 3) -> str:
    """The innermost ``frames`` frames of a ``;``-joined stack, the allocator's own frames
    left out (``memory_snapshot.ALLOCATOR_FRAMES``: the user's code is what a reader looks
    for; the whole stack is in --json)."""
    if not stack:
        return "(no stack recorded)"
    parts = [f for f in stack.split(";") if not re.search(ALLOCATOR_FRAMES, f)] \
        or stack.split(";")
    return ("… " if len(parts) > frames else "") + " > ".join(parts[-frames:])
