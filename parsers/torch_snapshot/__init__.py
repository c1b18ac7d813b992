"""CUDA caching-allocator snapshots: the pickles ``torch.cuda.memory._dump_snapshot`` writes.

A snapshot (format: ``torch.cuda.memory._snapshot``'s docstring, read by PyTorch's
``torch/cuda/_memory_viz.py`` and ``MemoryViz.js``) is a dict of

* ``segments``: what the allocator holds from ``cudaMalloc`` at snapshot time, each with its
  ``device``, ``address``, ``total_size``, ``stream`` and ``blocks`` (``size``,
  ``requested_size``, ``state``: ``active_allocated``, ``active_pending_free`` / awaiting free,
  ``inactive``; ``frames``: where the block was allocated);
* ``device_traces``: per device, the allocator's recent actions in order (``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
  ``segment_map``, ``segment_unmap``, ``oom``, ``snapshot``), each with ``addr``, ``size``,
  ``stream``, ``frames`` and, recently, ``time_us``.

:func:`read` turns one file into three tables (:class:`Snapshot`). The pickle is untrusted
input: it is read by :mod:`._unpickle`, which builds plain data only and refuses anything else
before it runs (``UnreadableTraceError``, one line).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from traceview.errors import UnreadableTraceError
from traceview.parsers._files import file_problem, rank_from_file_name
from traceview.parsers.torch_snapshot._unpickle import RefusedPickle, plain_load

__all__ = ["SNAPSHOT_SUFFIXES", "Snapshot", "is_snapshot_path", "read", "stack_text"]

SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
#: Frames the allocator's stack walker adds that say nothing about the program (as
#: ``_memory_viz._frame_filter`` leaves them out).
_OMIT_FUNCTIONS = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
                   "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")
_OMIT_FILES = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
               "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c",
               "cpython/abstract.h")

SEGMENTS_SCHEMA = {"device": pl.Int32, "address": pl.Int64, "total_size": pl.Int64,
                   "stream": pl.Int64, "segment_type": pl.String, "blocks": pl.Int32}
BLOCKS_SCHEMA = {"device": pl.Int32, "segment_address": pl.Int64, "address": pl.Int64,
                 "size": pl.Int64, "requested_size": pl.Int64, "state": pl.String,
                 "stack": pl.String}
TRACE_SCHEMA = {"device": pl.Int32, "seq": pl.Int64, "action": pl.String, "addr": pl.Int64,
                "size": pl.Int64, "stream": pl.Int64, "time_us": pl.Int64,
                "device_free": pl.Int64, "stack": pl.String}


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file as tables. ``rank``: from the file name (``rank-3...``), else None."""

    path: str
    rank: int | None
    segments: pl.DataFrame  #: SEGMENTS_SCHEMA, one row per segment at snapshot time
    blocks: pl.DataFrame  #: BLOCKS_SCHEMA, one row per block of those segments
    trace: pl.DataFrame  #: TRACE_SCHEMA, the device traces in order (``seq`` per device)
    warnings: list[str] = field(default_factory=list)


def is_snapshot_path(path: str | Path) -> bool:
    """True for a file named like a snapshot (``.pickle``, ``.pkl``)."""
    return str(path).lower().endswith(SNAPSHOT_SUFFIXES)


def read(path: str | Path) -> Snapshot:
    """The snapshot in ``path``; ``UnreadableTraceError`` naming the file when it is not one
    or asks for anything but plain data."""
    p = Path(path)
    if problem := file_problem(p):  # before opening: a FIFO would block the open
        raise UnreadableTraceError(p, problem)
    try:
        size = p.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise UnreadableTraceError(p, f"a pickle of {size} bytes, more than the "
                                          f"{MAX_SNAPSHOT_BYTES} a snapshot may be")
        with open(p, "rb") as fp:
            data = plain_load(fp)
    except RefusedPickle as exc:
        raise UnreadableTraceError(p, f"refused: {exc}") from None
    except OSError as exc:
        raise UnreadableTraceError(p, f"cannot read: {exc.strerror or exc}") from None
    except UnreadableTraceError:
        raise
    except Exception as exc:  # a damaged pickle raises anything from EOFError to ValueError
        why = (str(exc).strip().splitlines() or [""])[0]
        raise UnreadableTraceError(p, f"not a readable pickle ({type(exc).__name__}: {why})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise UnreadableTraceError(p, "not an allocator snapshot (no 'segments' list; written "
                                      "by torch.cuda.memory._dump_snapshot?)")
    warnings: list[str] = []
    traces = data.get("device_traces")
    if not isinstance(traces, list):
        warnings.append(f"{p}: no device_traces (history was not recorded): the state at "
                        "snapshot time only")
        traces = []
    budget = _Budget(max(MIN_SNAPSHOT_ITEMS, size))
    try:
        segments, blocks = _segment_rows(data["segments"], budget)
        trace = _trace_rows(traces, budget)
    except _OverBudget:
        raise UnreadableTraceError(p, f"more than {budget.left_at_start} rows and frames "
                                      "(one per byte of the file: shared references "
                                      "repeat the same objects)") from None
    except (TypeError, KeyError, ValueError, AttributeError, OverflowError,
            pl.exceptions.PolarsError) as exc:
        why = (str(exc).strip().splitlines() or [""])[0]
        raise UnreadableTraceError(p, f"malformed allocator snapshot ({type(exc).__name__}: "
                                      f"{why})") from None
    said: list[str] = []
    rank = rank_from_file_name(p.name, said)
    warnings += [f"{p}: {w}" for w in said]
    return Snapshot(str(p), rank, segments, blocks, trace, warnings)


#: The largest pickle read (its Python objects take several times its size).
MAX_SNAPSHOT_BYTES = 4 << 30
#: Rows and frames a snapshot may make: one per byte of the file, at least this many. A
#: pickle's shared references (its memo) let a small file name one big list a million times;
#: each row or frame of a real snapshot costs the file several bytes.
MIN_SNAPSHOT_ITEMS = 1 << 20


class _OverBudget(Exception):
    """More rows and frames than the file's size allows."""


class _Budget:
    def __init__(self, items: int) -> None:
        self.left = self.left_at_start = items

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget


def stack_text(frames: Iterable[dict[str, Any]] | None) -> str | None:
    """A stack as one string, outermost frame first, ``file:line:function`` joined by ``;``
    (flame-graph order); the allocator's own frames left out. None without frames.

    >>> stack_text([{"filename": "/x/model.py", "line": 9, "name": "forward"},
    ...             {"filename": "/x/train.py", "line": 3, "name": "main"}])
    'train.py:3:main;model.py:9:forward'
    """
    if not frames:
        return None
    texts = (_frame_text(f.get("filename"), f.get("line"), f.get("name")) for f in frames)
    return ";".join(reversed([t for t in texts if t])) or None


@lru_cache(maxsize=1 << 16)
def _frame_text(filename: Any, line: Any, name: Any) -> str | None:
    """``file:line:function`` of one frame, None for the allocator's own frames. Cached: a
    history repeats the same frames in every entry (millions of them in a large snapshot)."""
    name_s, file_s = str(name or ""), str(filename or "")
    if any(o in name_s for o in _OMIT_FUNCTIONS) or any(o in file_s for o in _OMIT_FILES):
        return None
    return f"{_file_name(file_s) or '?'}:{'?' if line is None else line}:{name_s or '?'}"


def _file_name(path: str) -> str:
    """A frame's file as a stack names it: the base name, but PyTorch's own files from their
    package (``torch/cuda/memory.py``), so the analyses tell the allocator's Python frames
    from a user's ``memory.py``."""
    at = path.replace("\\", "/").rfind("/torch/")
    return path[at + 1:] if at >= 0 else path.rsplit("/", 1)[-1]


def _segment_rows(segments: list[dict[str, Any]], budget: _Budget
                  ) -> tuple[pl.DataFrame, pl.DataFrame]:
    seg_rows, block_rows = [], []
    for seg in segments:
        device, address = _size(seg.get("device", 0), "device"), _size(seg["address"], "address")
        blocks = seg.get("blocks") or []
        budget.spend(1 + len(blocks))
        seg_rows.append((device, address, _size(seg["total_size"], "total_size"),
                         _i64(seg.get("stream", 0), "stream"), seg.get("segment_type"),
                         len(blocks)))
        offset = address  # older snapshots give no block address: blocks tile the segment
        for b in blocks:
            size = _size(b["size"], "size")
            requested = b.get("requested_size")
            frames = b.get("frames")
            if requested is None or frames is None:  # the legacy layout keeps them in history
                first = (b.get("history") or [{}])[0]
                requested = requested if requested is not None else first.get("real_size", size)
                frames = frames if frames is not None else first.get("frames")
            budget.spend(len(frames or ()))
            block_rows.append((device, address, _size(b.get("address", offset), "address"), size,
                               _size(requested, "requested_size"), str(b["state"]),
                               stack_text(frames)))
            offset += size
    return (pl.DataFrame(seg_rows, schema=SEGMENTS_SCHEMA, orient="row"),
            pl.DataFrame(block_rows, schema=BLOCKS_SCHEMA, orient="row"))


def _trace_rows(traces: list[list[dict[str, Any]]], budget: _Budget) -> pl.DataFrame:
    rows = []
    for device, entries in enumerate(traces):
        budget.spend(len(entries or ()))
        for seq, e in enumerate(entries or []):
            budget.spend(len(e.get("frames") or ()))
            rows.append((device, seq, str(e["action"]), _int(e.get("addr"), "addr", least=0),
                         _int(e.get("size"), "size", least=0), _int(e.get("stream"), "stream"),
                         _int(e.get("time_us"), "time_us"),
                         _int(e.get("device_free"), "device_free"),
                         stack_text(e.get("frames"))))
    return pl.DataFrame(rows, schema=TRACE_SCHEMA, orient="row")


def _int(value: Any, field: str, least: int | None = None) -> int | None:
    return None if value is None else _i64(value, field, least)


def _size(value: Any, field: str) -> int:
    """A device, address or size: an int64 of at least 0 (a negative one makes every total
    and the peak meaningless, so the snapshot is refused naming the field)."""
    return _i64(value, field, least=0)


def _i64(value: Any, field: str, least: int | None = None) -> int:
    """``value`` as an int64 (the tables' type), at least ``least`` when given; a ValueError
    naming ``field`` otherwise."""
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise ValueError(f"field {field} holds {number}, beyond int64")
    if least is not None and number < least:
        raise ValueError(f"field {field} holds {number}, below {least}")
    return number
