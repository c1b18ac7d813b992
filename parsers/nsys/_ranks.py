"""Which rank each process of an nsys report is.

One report can hold several processes (``nsys profile torchrun ...``); one report per rank works
too. For every *GPU process* (one with CUDA API or GPU activity rows; when there is none, every
process with events) the rank comes from, in order:

1. ``rank_map`` given by the caller: ``{pid: rank}`` (the caller knows best);
2. the report itself: ``MPI_RANKS(globalTid, rank)``; an NVTX thread name ``MPI Rank N``; an NCCL
   communicator-init text ``... rank R nranks N ...``; for a single-process report (or a
   ``PROCESS_k`` whose recorded PID matches) the recorded environment of the launched command in
   ``META_DATA_CAPTURE`` (``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``,
   ``SLURM_PROCID``, ``MV2_COMM_WORLD_RANK``) or its arguments (``--rank N``, ``--rank=N``),
   then ``TARGET_INFO_SYSTEM_ENV.DeviceEnvironment``, then the file name (``rank3``, ...);
3. else, with several GPU processes, by device: processes ordered by the lowest GPU they use get
   ranks 0, 1, 2, ... (torchrun's ``LOCAL_RANK`` = device convention);
4. else by process id order (``rank_from = "default"``, with a warning).

A single process with no evidence keeps ``rank = None`` (the ingest layer then uses the file-level
mapping or rank 0). A process that is not a GPU process and has no evidence gets no rank; its
rows are dropped (reason ``no_rank_for_process``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceview.parsers._files import MAX_RANK, rank_from_file_name

_ENV_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
             "MV2_COMM_WORLD_RANK")
_ENV_WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
              "MV2_COMM_WORLD_SIZE")
_ARG_RANK = re.compile(r"(?:^|\s)--(?:node_?)?rank[=\s]+(\d+)")
_THREAD_RANK = re.compile(r"^MPI Rank (\d+)$")
#: A number of the report beyond int64 (any longer run of digits) stands as this one.
_BEYOND_INT64 = (1 << 63) - 1


def number(digits: str) -> int:
    """A run of ASCII digits from the report as an int; beyond int64, :data:`_BEYOND_INT64`
    (which no bound admits: a string of the report may hold a million digits, more than
    ``int()`` reads).

    >>> number("0007"), number("9" * 5000) == _BEYOND_INT64
    (7, True)
    """
    significant = digits.lstrip("0")
    return int(digits) if len(significant) < 19 else _BEYOND_INT64


@dataclass
class ProcessRank:
    gpid: int
    pid: int
    rank: int | None
    rank_from: str
    world_size: int | None = None
    devices: list[int] = field(default_factory=list)
    is_gpu: bool = True


def env_pairs(text: str, separator: str = ";") -> dict[str, str]:
    """``K=V;K2=V2`` (DeviceEnvironment) -> dict; quotes around values removed.

    >>> env_pairs('RANK="3";PATH=/bin')
    {'RANK': '3', 'PATH': '/bin'}
    """
    out: dict[str, str] = {}
    for item in text.split(separator):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out.setdefault(key.strip(), value.strip().strip('"'))
    return out


def captured_processes(capture: list[tuple[str, str]]) -> dict[int, dict[str, object]]:
    """META_DATA_CAPTURE ``PROCESS_k:*`` rows -> {k: {"pid", "env", "args"}}."""
    procs: dict[int, dict[str, object]] = {}
    for name, value in capture:
        m = re.match(r"^PROCESS_(\d+):(\w+?)(?:_\d+)?$", name or "")
        if not m or value is None:
            continue
        entry = procs.setdefault(int(m.group(1)), {"pid": None, "env": {}, "args": []})
        key = m.group(2)
        if key == "ENVIRONMENT_VARIABLE":
            entry["env"].update(env_pairs(value, "\x00"))  # type: ignore[union-attr]
        elif key == "ARGUMENT":
            entry["args"].append(value)  # type: ignore[union-attr]
        elif key == "PID" and value.strip().isdigit():
            entry["pid"] = int(value)
    return procs


def _first_int(env: dict[str, str], keys: tuple[str, ...]) -> tuple[int | None, str | None]:
    for key in keys:
        value = env.get(key, "").strip()
        if value.isascii() and value.isdigit():
            return number(value), key
    return None, None


def assign(processes: pl.DataFrame, *, mpi: dict[int, int], thread_ranks: dict[int, int],
           nccl: dict[int, tuple[int, int | None]], capture: list[tuple[str, str]],
           device_env: str, path: Path, rank_map: dict | None,
           warnings: list[str]) -> list[ProcessRank]:
    """Ranks for ``processes`` (columns gpid, pid, is_gpu, devices: list[int]).

    ``mpi``/``thread_ranks``: gpid -> rank; ``nccl``: gpid -> (rank, nranks).
    """
    rows = processes.sort("pid").to_dicts()
    explicit = _explicit_map(rank_map)
    captured = captured_processes(capture)
    single = len([r for r in rows if r["is_gpu"]]) == 1 or len(rows) == 1
    out: list[ProcessRank] = []
    for row in rows:
        gpid, pid = int(row["gpid"]), int(row["pid"])
        pr = ProcessRank(gpid=gpid, pid=pid, rank=None, rank_from="unknown",
                         devices=sorted(row["devices"] or []), is_gpu=bool(row["is_gpu"]))
        evidence = _evidence(gpid, pid, bool(row["is_gpu"]), single, len(rows) == 1,
                             explicit=explicit, mpi=mpi, thread_ranks=thread_ranks, nccl=nccl,
                             captured=captured, device_env=device_env, path=path,
                             warnings=warnings)
        for rank, world, source in evidence:
            world = _believed_world(world, source, pid, warnings)
            if _believed_rank(rank, world, source, pid, warnings):
                pr.rank, pr.rank_from, pr.world_size = rank, source, world
                break
        out.append(pr)
    _fill_missing(out, warnings)
    return out


def _evidence(gpid: int, pid: int, is_gpu: bool, single: bool, only: bool, *,
              explicit: dict[int, int], mpi: dict[int, int], thread_ranks: dict[int, int],
              nccl: dict[int, tuple[int, int | None]], captured: dict[int, dict[str, object]],
              device_env: str, path: Path,
              warnings: list[str]) -> Iterator[tuple[int, int | None, str]]:
    """``(rank, world size, source)`` for one process, from the best evidence down (module
    docstring): the caller takes the first it believes."""
    if pid in explicit:
        yield explicit[pid], None, "mapping"
    if gpid in mpi:
        yield mpi[gpid], None, "MPI_RANKS"
    if gpid in thread_ranks:
        yield thread_ranks[gpid], None, "NVTX thread name"
    if gpid in nccl:
        yield nccl[gpid][0], nccl[gpid][1], "NCCL NVTX"
    env_sources = [(e, f"environment of PROCESS_{k}") for k, e in captured.items()
                   if e["pid"] == pid or (single and is_gpu)]
    if single and is_gpu and device_env:
        env_sources.append(({"env": env_pairs(device_env), "args": []}, "DeviceEnvironment"))
    for entry, label in env_sources:
        env = entry["env"]  # type: ignore[index]
        rank, key = _first_int(env, _ENV_RANK)  # type: ignore[arg-type]
        if rank is None:
            found = _ARG_RANK.search(" ".join(entry["args"]))  # type: ignore[index]
            rank, key = (number(found.group(1)), "--rank") if found else (None, None)
        if rank is not None:
            yield rank, _first_int(env, _ENV_WORLD)[0], f"{key} in {label}"  # type: ignore[arg-type]
    if single and is_gpu or only:
        by_name = rank_from_file_name(path.name, warnings)
        if by_name is not None:
            yield by_name, None, "file name"


def _shown(value: int) -> str:
    return str(value) if abs(value) < _BEYOND_INT64 else "beyond int64"


def _believed_world(world: int | None, source: str, pid: int,
                    warnings: list[str]) -> int | None:
    """A world size of 1 to 2^31 (ranks are int32), else None with a warning."""
    if world is None or 1 <= world <= MAX_RANK + 1:
        return world
    warnings.append(f"process {pid}: world size {_shown(world)} ({source}) is out of bounds "
                    "(1 to 2^31): left out")
    return None


def _believed_rank(rank: int, world: int | None, source: str, pid: int,
                   warnings: list[str]) -> bool:
    """A rank of 0 to 2^31-1 and below its world size; else False, with a warning (the next
    evidence is tried, as a Kineto trace's file name is after its distributedInfo)."""
    if 0 <= rank <= MAX_RANK and (world is None or rank < world):
        return True
    of = f"rank of a world of {world}" if world is not None else "rank (0 to 2^31-1)"
    warnings.append(f"process {pid}: rank {_shown(rank)} ({source}) is no {of}: left out")
    return False


def _explicit_map(rank_map: dict | None) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, value in (rank_map or {}).items():
        text = str(key).removeprefix("pid:").strip()
        if text.isdigit():
            out[int(text)] = int(value)
    return out


def _fill_missing(procs: list[ProcessRank], warnings: list[str]) -> None:
    gpu = [p for p in procs if p.is_gpu]
    if len(gpu) <= 1:
        return
    ranks = [p.rank for p in gpu]
    if None not in ranks and len(set(ranks)) == len(ranks):
        return
    if None not in ranks:
        warnings.append(f"processes claim the same rank ({sorted(ranks)}); ranks reassigned")
    first_devices = [p.devices[0] if p.devices else None for p in gpu]
    by_device = None not in first_devices and len(set(first_devices)) == len(first_devices)
    order = sorted(gpu, key=(lambda p: p.devices[0]) if by_device else (lambda p: p.pid))
    for rank, proc in enumerate(order):
        proc.rank = rank
        proc.rank_from = "device" if by_device else "default"
    if by_device:
        warnings.append(f"{len(gpu)} GPU processes without a recorded rank: ranked by device "
                        "(lowest GPU id first); pass rank_map={pid: rank} to override")
    else:
        warnings.append(f"{len(gpu)} GPU processes without a recorded rank and no distinct "
                        "device each: ranked by process id; pass rank_map={pid: rank}")
