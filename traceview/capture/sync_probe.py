"""Clock-sync probe and rank identity for :mod:`traceview.capture`.

A probe is a few timed barriers, each inside a ``record_function("traceview::sync")`` span, so
every rank's trace holds the same short sequence of blocking collectives at the start and end of
every active window. The alignment (:mod:`traceview.analyses.align`) uses blocking collectives as clock
anchors: on gloo each barrier is a ``gloo:barrier`` work item on the run-loop thread, on NCCL a
one-element all-reduce kernel. So a run with no collectives of its own still gets anchors.

torch is never imported at module level: callers pass the modules in.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

#: Name of the span around each probe barrier (a Kineto ``user_annotation``).
SYNC_NAME = "traceview::sync"
#: Barriers per probe. Three give a median per probe; more only lengthen the step.
DEFAULT_ROUNDS = 3


@dataclass(frozen=True)
class Identity:
    """Who this process is: rank and world size (from torch.distributed or the environment)."""

    rank: int
    world_size: int
    local_rank: int | None
    host: str
    pid: int
    distributed: bool  # torch.distributed initialised
    backend: str | None
    rank_from: str  # "torch.distributed", "RANK", "LOCAL_RANK" or "default"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def identity(dist: Any | None) -> Identity:
    """Rank from ``torch.distributed`` when initialised, else ``RANK``/``LOCAL_RANK``, else 0.

    >>> identity(None).pid == os.getpid()
    True
    """
    host = socket.gethostname()
    local = _env_int("LOCAL_RANK")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return Identity(int(dist.get_rank()), int(dist.get_world_size()), local, host,
                        os.getpid(), True, str(dist.get_backend()), "torch.distributed")
    world = _env_int("WORLD_SIZE") or 1
    for name in ("RANK", "LOCAL_RANK"):
        value = _env_int(name)
        if value is not None:
            return Identity(value, max(world, value + 1), local, host, os.getpid(), False,
                            None, name)
    return Identity(0, world, local, host, os.getpid(), False, None, "default")


def trace_file_name(ident: Identity, window: int | None = None) -> str:
    """Per-rank file name: ``rank-<R>.<host>.<pid>[.w<K>].pt.trace.json.gz``.

    >>> trace_file_name(Identity(3, 4, 3, "node-a", 77, True, "gloo", "torch.distributed"))
    'rank-3.node-a.77.pt.trace.json.gz'
    """
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in ident.host) or "host"
    part = "" if window is None else f".w{window}"
    return f"rank-{ident.rank}.{host}.{ident.pid}{part}.pt.trace.json.gz"


def sync_probe(torch: Any, rounds: int = DEFAULT_ROUNDS) -> list[dict[str, int]]:
    """Run ``rounds`` barriers, each inside a ``traceview::sync`` span; return their timings.

    Does nothing (returns ``[]``) when torch.distributed is not initialised. On NCCL the
    barrier is followed by a device synchronise so the span covers the exchange.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or rounds <= 0:
        return []
    nccl = str(dist.get_backend()).lower() == "nccl"
    cuda = nccl and torch.cuda.is_available()
    timings = []
    for _ in range(rounds):
        with torch.profiler.record_function(SYNC_NAME):
            t0 = time.time_ns()
            if cuda:
                dist.barrier(device_ids=[torch.cuda.current_device()])
                torch.cuda.synchronize()
            else:
                dist.barrier()
            t1 = time.time_ns()
        timings.append({"start_ns": t0, "end_ns": t1})
    return timings
