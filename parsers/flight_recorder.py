"""PyTorch flight-recorder dumps: one pickle per rank, its last N collectives, as tables.

A dump (``torch._C._distributed_c10d._dump_fr_trace()``, or the file the watchdog writes at
``TORCH_FR_DUMP_TEMP_FILE`` + rank, read by ``torch.distributed.flight_recorder.fr_trace``) is
a dict (pickled; or JSON, from ``_dump_fr_trace_json``) of ``version``, ``pg_config`` (per process group: ``name``, ``desc``, ``ranks`` as
text), ``pg_status`` (per group id: ``last_enqueued_collective``, ``last_started_collective``,
``last_completed_collective``) and ``entries``: one per call, with ``process_group`` (name,
desc), ``collective_seq_id``, ``p2p_seq_id``, ``profiling_name`` (``nccl:all_reduce``,
``gloo:broadcast``), ``input_sizes``/``output_sizes``, ``state`` (``scheduled``, ``started``,
``completed``), ``retired``, ``is_p2p``, ``time_created_ns`` and ``frames``.

The rank is the file name's trailing number (as fr_trace: ``<prefix><rank>``). The pickle is
untrusted input: it is read by the project's plain-data unpickler
(:mod:`traceview.parsers.torch_snapshot._unpickle`) and bounded (``MAX_DUMP_BYTES``,
``MAX_ENTRIES``); anything else is :class:`~traceview.errors.UnreadableTraceError`, one line
naming the file.

>>> import pickle, tempfile, os
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "rank_3")
>>> _ = open(p, "wb").write(pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {},
...     "entries": [{"process_group": ("1", "train"), "collective_seq_id": 7,
...                  "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
...                  "state": "scheduled", "retired": False}]}))
>>> dump = read(p)
>>> dump.rank, dump.entries.select("group", "seq", "op", "sizes").rows()
(3, [('1', 7, 'all_reduce', '[[4]]')])
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceview.errors import UnreadableTraceError
from traceview.parsers._files import file_problem, rank_from_file_name
from traceview.parsers.torch_snapshot._unpickle import RefusedPickle, plain_load

__all__ = ["ENTRY_SCHEMA", "MAX_DUMP_BYTES", "MAX_ENTRIES", "Dump", "dump_paths",
           "looks_like_dumps", "read"]

#: A dump holds ``TORCH_FR_BUFFER_SIZE`` entries (2,000 by default, each ~2 KB with its
#: frames): a file far beyond that is not a dump, and is refused before it is read.
MAX_DUMP_BYTES = 512 << 20
MAX_ENTRIES = 1_000_000

ENTRY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "group": pl.String, "group_desc": pl.String, "seq": pl.Int64,
    "p2p_seq": pl.Int64, "is_p2p": pl.Boolean, "op": pl.String, "profiling_name": pl.String,
    "sizes": pl.String, "out_sizes": pl.String, "state": pl.String, "retired": pl.Boolean,
    "record_id": pl.Int64, "time_created_ns": pl.Int64, "timeout_ms": pl.Int64,
    "frame": pl.String, "src": pl.Int32, "dst": pl.Int32,
}
STATUS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "group": pl.String, "last_enqueued": pl.Int64, "last_started": pl.Int64,
    "last_completed": pl.Int64,
}
CONFIG_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "group": pl.String, "group_desc": pl.String, "ranks": pl.List(pl.Int32),
}


@dataclass(frozen=True)
class Dump:
    """One rank's dump as tables: ``entries`` (``ENTRY_SCHEMA``), ``status`` (per group, from
    ``pg_status``), ``config`` (per group, from ``pg_config``: its member ranks)."""

    path: str
    rank: int
    version: str
    entries: pl.DataFrame
    status: pl.DataFrame
    config: pl.DataFrame


def _rank_of(path: Path) -> int | None:
    found = re.search(r"(\d+)(?:\.(?:pkl|pickle))?$", path.name)
    return int(found.group(1)) if found else rank_from_file_name(path.name)


def dump_paths(paths: list[str | Path]) -> tuple[list[Path], list[Path]]:
    """(dumps, passed over): files as given; in folders, the regular files named
    ``<prefix><rank>`` (not hidden, sorted), the others passed over as fr_trace passes over
    names without its prefix (a README, a log). A missing path is an UnreadableTraceError."""
    out: list[Path] = []
    other: list[Path] = []
    for item in paths:
        p = Path(item)
        if not os.path.lexists(p):
            raise UnreadableTraceError(p, "no such file or directory")
        if p.is_dir():
            for f in sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")):
                (out if re.search(r"\d+(\.(pkl|pickle))?$", f.name) else other).append(f)
        else:
            out.append(p)
    return out, other


def looks_like_dumps(path: str | Path) -> bool:
    """Whether ``path`` is a dump or a folder of them, by names and first bytes only: files
    named ``<prefix><rank>`` that start as a pickle (protocol 2 or later), and no trace."""
    p = Path(path)
    try:
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")) \
            if p.is_dir() else [p]
        if not files or not all(re.search(r"\d+$", f.name) for f in files):
            return False
        with files[0].open("rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False


def read(path: str | Path) -> Dump:
    """One dump file as a :class:`Dump`; UnreadableTraceError (one line) when it is not one."""
    p = Path(path)
    if problem := file_problem(p):
        raise UnreadableTraceError(p, f"cannot read flight-recorder dump ({problem})")
    rank = _rank_of(p)
    if rank is None:
        raise UnreadableTraceError(p, "no rank in the file name (flight-recorder dumps are "
                                   "named <prefix><rank>)")
    if p.stat().st_size > MAX_DUMP_BYTES:
        raise UnreadableTraceError(p, f"{p.stat().st_size} bytes, more than a flight-recorder "
                                   f"dump holds ({MAX_DUMP_BYTES >> 20} MB at most)")
    try:
        with p.open("rb") as fh:
            # the JSON form (``_dump_fr_trace_json``) has the same keys, its counters as text
            is_json = fh.read(1) == b"{"
            fh.seek(0)
            data = orjson.loads(fh.read()) if is_json else plain_load(fh)
    except RefusedPickle as exc:
        raise UnreadableTraceError(p, f"not read: {exc}") from None
    except (Exception, RecursionError) as exc:  # any damage: one line, never a traceback
        raise UnreadableTraceError(p, f"not a flight-recorder dump ({type(exc).__name__}: "
                                   f"{exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise UnreadableTraceError(p, "not a flight-recorder dump (no 'entries' list)")
    if len(data["entries"]) > MAX_ENTRIES:
        raise UnreadableTraceError(p, f"{len(data['entries'])} entries, more than "
                                   f"{MAX_ENTRIES} (not a flight-recorder dump)")
    return Dump(str(p), rank, str(data.get("version", "")),
                _entries(rank, data["entries"]), _status(rank, data.get("pg_status")),
                _config(rank, data.get("pg_config")))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _op(name: str | None) -> tuple[str | None, int | None, int | None]:
    """``nccl:all_reduce`` -> (``all_reduce``, None, None); a point-to-point call names its
    group-local ranks as fr_trace reads them: ``nccl:send 0->1`` -> (``send``, 0, 1),
    ``nccl:recv 1<-0`` -> (``recv``, 0, 1) (source, destination)."""
    if name is None:
        return None, None, None
    op, _, meta = name.split(":", 1)[-1].partition(" ")
    if m := re.fullmatch(r"(\d+)->(\d+)", meta):
        return op, int(m.group(1)), int(m.group(2))
    if m := re.fullmatch(r"(\d+)<-(\d+)", meta):
        return op, int(m.group(2)), int(m.group(1))
    return op, None, None


def _entries(rank: int, entries: list[Any]) -> pl.DataFrame:
    rows = []
    for e in entries:  # plain data of a bounded size: one pass to typed columns
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        pg = pg if isinstance(pg, (tuple, list)) and len(pg) == 2 else (None, None)  # JSON: list
        frames = [f for f in e.get("frames") or () if isinstance(f, dict)] \
            if isinstance(e.get("frames"), list) else []
        # the caller: the first frame outside torch.distributed (its own wrappers say nothing)
        top = next((f for f in frames if "torch/distributed/" not in str(f.get("filename"))
                    and "torch/nn/parallel/" not in str(f.get("filename"))),
                   frames[0] if frames else {})
        where = (f"{top.get('filename')}:{top.get('line')} ({top.get('name')})"
                 if top else None)
        op, src, dst = _op(_text(e.get("profiling_name")))
        rows.append({
            "src": src, "dst": dst, "rank": rank, "group": _text(pg[0]) if pg[0] is not None else None,
            "group_desc": _text(pg[1]), "seq": _int(e.get("collective_seq_id")),
            "p2p_seq": _int(e.get("p2p_seq_id")), "is_p2p": bool(e.get("is_p2p", False)),
            "op": op,
            "profiling_name": _text(e.get("profiling_name")),
            "sizes": orjson.dumps(e.get("input_sizes")).decode()
            if e.get("input_sizes") is not None else None,
            "out_sizes": orjson.dumps(e.get("output_sizes")).decode()
            if e.get("output_sizes") is not None else None,
            "state": _text(e.get("state")), "retired": bool(e.get("retired", False)),
            "record_id": _int(e.get("record_id")),
            "time_created_ns": _int(e.get("time_created_ns")),
            "timeout_ms": _int(e.get("timeout_ms")), "frame": where,
        })
    return pl.DataFrame(rows, schema=ENTRY_SCHEMA, orient="row") if rows else \
        pl.DataFrame(schema=ENTRY_SCHEMA)


def _counter(v: Any) -> int | None:
    """A ``pg_status`` counter: an int in pickles, its text in the JSON form."""
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return _int(v)


def _status(rank: int, status: Any) -> pl.DataFrame:
    rows = [{"rank": rank, "group": str(g),
             "last_enqueued": _counter(s.get("last_enqueued_collective")),
             "last_started": _counter(s.get("last_started_collective")),
             "last_completed": _counter(s.get("last_completed_collective"))}
            for g, s in (status.items() if isinstance(status, dict) else ())
            if isinstance(s, dict)]
    return pl.DataFrame(rows, schema=STATUS_SCHEMA) if rows else pl.DataFrame(schema=STATUS_SCHEMA)


def _config(rank: int, config: Any) -> pl.DataFrame:
    rows = []
    for key, c in (config.items() if isinstance(config, dict) else ()):
        if not isinstance(c, dict):
            continue
        ranks = [int(r) for r in re.findall(r"-?\d+", str(c.get("ranks", "")))]
        name = _text(c.get("name")) or str(key)
        if not name or not ranks:  # gloo registers no group: one empty entry
            continue
        rows.append({"rank": rank, "group": name, "group_desc": _text(c.get("desc")),
                     "ranks": ranks})
    return pl.DataFrame(rows, schema=CONFIG_SCHEMA) if rows else pl.DataFrame(schema=CONFIG_SCHEMA)
