"""Capture traces that analyse well: ``torch.profiler`` with per-rank names, sync probes, run.json.

>>> import traceview.capture as cap                                  # doctest: +SKIP
>>> with cap.profile("runs/exp1", wait=1, warmup=1, active=3) as prof:  # doctest: +SKIP
...     for batch in loader:
...         train_step(batch)
...         prof.step()

What it adds to a bare ``torch.profiler.profile``:

* **Per-rank file names** in one run directory, gzipped:
  ``rank-<R>.<host>.<pid>.pt.trace.json.gz`` (``.w<K>`` before ``.pt`` when ``repeat != 1``,
  one file per active window). The rank comes from ``torch.distributed`` when it is initialised,
  else from ``RANK`` / ``LOCAL_RANK``, else 0.
* **A clock-sync probe** (:func:`traceview.capture.sync_probe.sync_probe`) at the start and the end of
  every active window: a few barriers, each inside a ``traceview::sync`` span. They are
  blocking collectives on every rank, so the alignment finds anchors even in a run without
  collectives of its own. Skipped (harmlessly) when torch.distributed is not initialised, and
  when the block exits with an exception (other ranks might never reach the barrier).
* **run.json**, written by rank 0: world size, ranks with their hosts, pids and file names,
  torch/CUDA/NCCL versions, the command line and the schedule. ``traceview validate`` reads it.
* **CUDA sync events** whenever CUDA is profiled: Kineto then writes every stream and event
  synchronisation (``cuda_sync``: ``Stream Wait Event``, ``Event Sync``, ...) with the stream
  and the ``cudaEventRecord`` it waits on (``wait_on_stream``,
  ``wait_on_cuda_event_record_corr_id``). Without them a replay of the trace cannot see one
  stream waiting for another (NCCL's stream for the compute stream, and back):
  ``traceview.analyses.stream_waits``. A torch without the option records without them and
  says so in run.json (``options.cuda_sync_events``).
* **Allocator snapshots** with ``memory=True``: the CUDA caching allocator records its history
  (``torch.cuda.memory._record_memory_history``) from the start of the block, and every rank
  writes ``rank-<R>.<host>.<pid>.memory_snapshot.pickle`` when the block ends (also when it
  fails: an out-of-memory error is when it is wanted most). ``traceview memory`` reads them.
  Without a CUDA device there is no caching allocator to record: the flag does nothing, says so
  in a warning and in run.json (``memory``), and the traces are written as usual.

torch is imported only when :func:`profile` is entered; without it a :class:`CaptureUnavailable`
error names the ``capture`` extra.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from traceview._dependencies import lazy_module, loaded
from traceview.capture.sync_probe import DEFAULT_ROUNDS, SYNC_NAME, Identity, identity, sync_probe
from traceview.capture.sync_probe import trace_file_name as _file_name
from traceview.errors import TraceviewError

RUN_FILE = "run.json"
RUN_FORMAT = 1
#: Allocator actions kept (a ring buffer: the latest win); a few hundred bytes to KB each.
MEMORY_MAX_ENTRIES = 100_000
NO_GPU_MEMORY_NOTE = ("memory=True records the CUDA caching allocator's history, and there is "
                      "no CUDA device here: no allocator snapshot is written (profile_memory="
                      "True records the trace's [memory] events on any device)")

__all__ = ["Capture", "CaptureUnavailable", "RUN_FILE", "SYNC_NAME", "profile", "import_torch"]


class CaptureUnavailable(TraceviewError):
    """torch (the ``capture`` extra) is not installed."""


torch = lazy_module("torch", submodules=("torch.distributed", "torch.profiler"),
                    error=CaptureUnavailable,
                    missing="traceview.capture needs torch: install it with pip install torch "
                            "(in a traceview checkout: pip install '.[capture]')")


def import_torch() -> Any:
    """torch, imported now, with a message naming the extra to install when it is missing."""
    return loaded(torch)


class Capture:
    """The handle :func:`profile` yields: call :meth:`step` once per training iteration."""

    def __init__(self, torch: Any, prof: Any, out_dir: Path, ident: Identity, *, repeat: int,
                 sync: bool, sync_rounds: int, cuda_profiler_api: bool) -> None:
        self._torch = torch
        self.profiler = prof
        self.out_dir = out_dir
        self.identity = ident
        self.rank = ident.rank
        self.files: list[Path] = []
        self.sync_timings: list[dict[str, Any]] = []
        self.steps = 0
        self._repeat = repeat
        self._sync = sync
        self._rounds = sync_rounds
        self._cuda_api = cuda_profiler_api and torch.cuda.is_available()
        self._in_window = False
        #: the allocator snapshot this rank wrote (``memory=True`` on a GPU), else None
        self.snapshot: Path | None = None
        #: what the capture could not do as asked (also in run.json)
        self.notes: list[str] = []

    # -- schedule bookkeeping -------------------------------------------------------------
    def _recording(self) -> bool:
        action = self._torch.profiler.ProfilerAction
        return self.profiler.current_action in (action.RECORD, action.RECORD_AND_SAVE)

    def _last_of_window(self) -> bool:
        return self.profiler.current_action == self._torch.profiler.ProfilerAction.RECORD_AND_SAVE

    def _probe(self, where: str) -> None:
        if not self._sync:
            return
        for t in sync_probe(self._torch, self._rounds):
            self.sync_timings.append({"where": where, "step": self.profiler.step_num, **t})

    def _window_start(self) -> None:
        self._in_window = True
        if self._cuda_api:
            self._torch.cuda.cudart().cudaProfilerStart()
        self._probe("start")

    def _window_end(self) -> None:
        self._probe("end")
        if self._cuda_api:
            self._torch.cuda.synchronize()
            self._torch.cuda.cudart().cudaProfilerStop()
        self._in_window = False

    def step(self) -> None:
        """End this iteration: probe at a window's end, ``prof.step()``, probe at a start."""
        if self._last_of_window():
            self._window_end()
        self.profiler.step()
        self.steps += 1
        if self._recording() and not self._in_window:
            self._window_start()

    def _trace_ready(self, prof: Any) -> None:
        window = len(self.files) if self._repeat != 1 else None
        path = self.out_dir / _file_name(self.identity, window)
        prof.export_chrome_trace(str(path))
        self.files.append(path)


def _run_info(torch: Any, ident: Identity, peers: list[dict[str, Any]], *,
              schedule: dict[str, int], options: dict[str, Any]) -> dict[str, Any]:
    nccl = None
    with contextlib.suppress(Exception):
        if torch.cuda.is_available():
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return {
        "traceview_run": RUN_FORMAT,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": ident.world_size,
        "distributed": ident.distributed,
        "backend": ident.backend,
        "rank_from": ident.rank_from,
        "hosts": sorted({p["host"] for p in peers}),
        "ranks": sorted(peers, key=lambda p: p["rank"]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": sys.version.split()[0],
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "schedule": schedule,
        "options": options,
        "sync_probe": {"name": SYNC_NAME, "rounds": options.get("sync_rounds"),
                       "enabled": bool(options.get("sync")) and ident.distributed},
        "completed": False,
    }


def snapshot_file_name(ident: Identity) -> str:
    """``rank-<R>.<host>.<pid>.memory_snapshot.pickle``: the trace's name, another suffix."""
    return _file_name(ident, None).replace(".pt.trace.json.gz", ".memory_snapshot.pickle")


def _record_memory(torch: Any, max_entries: int) -> None:
    torch.cuda.memory._record_memory_history(enabled="all", max_entries=max_entries)


def _dump_memory(torch: Any, path: Path) -> Path:
    """Write the allocator snapshot (via a temporary name: a reader never sees half a file)
    and stop recording."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.cuda.memory._dump_snapshot(str(tmp))
        os.replace(tmp, path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def cuda_sync_config(torch: Any, activities: Iterable[Any]) -> Any | None:
    """The profiler's ``experimental_config`` asking Kineto for CUDA sync events, when CUDA is
    among ``activities`` and this torch has the option (torch >= 2.3); else None."""
    if not any(str(a).rsplit(".", 1)[-1] == "CUDA" for a in activities):
        return None
    config = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if config is None:
        return None
    try:
        return config(enable_cuda_sync_events=True)
    except TypeError:  # a torch from before the option
        return None


def _peers(torch: Any, ident: Identity, file_name: str) -> list[dict[str, Any]]:
    """Every rank's identity (one all_gather_object, before profiling starts)."""
    me = {"rank": ident.rank, "host": ident.host, "pid": ident.pid,
          "local_rank": ident.local_rank, "file": file_name}
    if not ident.distributed or ident.world_size == 1:
        return [me]
    out: list[Any] = [None] * ident.world_size
    torch.distributed.all_gather_object(out, me)
    return [p for p in out if p]


@contextlib.contextmanager
def profile(out_dir: str | os.PathLike[str], *, wait: int = 1, warmup: int = 1, active: int = 3,
            repeat: int = 1, skip_first: int = 0, record_shapes: bool = True,
            profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
            activities: Iterable[Any] | None = None, sync: bool = True,
            sync_rounds: int = DEFAULT_ROUNDS,
            cuda_profiler_api: bool = False, memory: bool = False,
            memory_max_entries: int = MEMORY_MAX_ENTRIES) -> Iterator[Capture]:
    """Profile the block with ``torch.profiler`` into ``out_dir`` (see the module docstring).

    ``wait``/``warmup``/``active``/``repeat``/``skip_first`` are the ``torch.profiler.schedule``
    arguments; the flags are passed to ``torch.profiler.profile``. ``activities`` defaults to
    CPU, plus CUDA when available. ``sync=False`` turns the clock-sync probe off;
    ``cuda_profiler_api=True`` also brackets each active window with
    ``cudaProfilerStart/Stop`` (for ``nsys --capture-range=cudaProfilerApi``).
    ``memory=True`` records the CUDA caching allocator's history (the last
    ``memory_max_entries`` actions) and writes an allocator snapshot per rank at the end; without
    a CUDA device it does nothing but warn (see the module docstring).
    """
    if active < 1 or wait < 0 or warmup < 0 or repeat < 0 or skip_first < 0:
        raise TraceviewError(f"bad schedule: wait={wait} warmup={warmup} active={active} "
                             f"repeat={repeat} skip_first={skip_first}")
    torch = import_torch()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = identity(torch.distributed)
    if activities is None:
        activity = torch.profiler.ProfilerActivity
        activities = [activity.CPU] + ([activity.CUDA] if torch.cuda.is_available() else [])
    activities = list(activities)
    sched = {"wait": wait, "warmup": warmup, "active": active, "repeat": repeat,
             "skip_first": skip_first}
    sync_config = cuda_sync_config(torch, activities)
    record_memory = memory and torch.cuda.is_available()
    options = {"record_shapes": record_shapes, "profile_memory": profile_memory,
               "memory": memory, "with_stack": with_stack, "with_flops": with_flops,
               "activities": [str(a).rsplit(".", 1)[-1] for a in activities],
               "sync": sync, "sync_rounds": sync_rounds, "cuda_profiler_api": cuda_profiler_api,
               "cuda_sync_events": sync_config is not None}
    peers = _peers(torch, ident, _file_name(ident, None if repeat == 1 else 0))
    run_path = out / RUN_FILE
    info = _run_info(torch, ident, peers, schedule=sched, options=options)
    notes = [NO_GPU_MEMORY_NOTE] if memory and not record_memory else []
    if memory:
        info["memory"] = {"recorded": record_memory, "notes": notes,
                          "snapshot": snapshot_file_name(ident) if record_memory else None}
    if notes:
        warnings.warn(f"traceview.capture: {notes[0]}", stacklevel=3)
    if ident.rank == 0:
        _write_json(run_path, info)
    if record_memory:
        _record_memory(torch, memory_max_entries)

    handle: Capture | None = None

    def on_ready(prof: Any) -> None:
        assert handle is not None
        handle._trace_ready(prof)

    extra = {} if sync_config is None else {"experimental_config": sync_config}
    prof = torch.profiler.profile(activities=activities,
                                  schedule=torch.profiler.schedule(**sched),
                                  on_trace_ready=on_ready, record_shapes=record_shapes,
                                  profile_memory=profile_memory, with_stack=with_stack,
                                  with_flops=with_flops, **extra)
    handle = Capture(torch, prof, out, ident, repeat=repeat, sync=sync,
                     sync_rounds=sync_rounds, cuda_profiler_api=cuda_profiler_api)
    handle.notes = notes
    failed = False
    prof.start()
    try:
        if handle._recording():
            handle._window_start()
        yield handle
    except BaseException:
        failed = True
        raise
    finally:
        if handle._in_window and not failed:
            handle._window_end()
        prof.stop()
        if record_memory:
            handle.snapshot = _dump_memory(torch, out / snapshot_file_name(ident))
        if ident.rank == 0:
            info.update(completed=not failed, steps=handle.steps,
                        windows_written=len(handle.files),
                        files_written=[p.name for p in handle.files])
            _write_json(run_path, info)
