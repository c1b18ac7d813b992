"""The nsys entry point: open the export, read each event table (``_tables``), combine them,
give each process its rank (``_ranks``), attach collectives (``_nccl``), hand over to Arrow in
time order (``_arrow``), and add the process and thread name rows.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceview import schema
from traceview._dependencies import lazy_module, loaded
from traceview.errors import UnreadableTraceError
from traceview.parsers._result import ParsedFile, RankInfo
from traceview.parsers.nsys import _arrow, _nccl, _ranks, _read_ahead
from traceview.parsers.nsys import _tables as tables
from traceview.parsers.nsys._db import (
    Export,
    checked_rows,
    count_rows,
    open_export,
    query_rows,
    read_checked,
    MAX_STRING_BYTES,
    long_strings,
    string_table,
)
from traceview.parsers.nsys._sql import ident

#: The first cast to Arrow types in a process imports it (~0.05 s); see _parse_export.
pyarrow_compute = lazy_module("pyarrow.compute", missing="pyarrow.compute is missing: reinstall pyarrow")

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
#: A process with rows of these kinds uses a GPU (a GPU process, in _ranks' terms).
_CUDA_KINDS = (*schema.GPU_KINDS, "sync", *schema.RUNTIME_KINDS)


def export_command(path: Path) -> str:
    """The command that turns a report into the SQLite export this parser reads.

    >>> export_command(Path("run 1.nsys-rep"))
    "nsys export --type sqlite --output 'run 1.nsys-rep.sqlite' 'run 1.nsys-rep'"
    """
    return (f"nsys export --type sqlite --output {shlex.quote(f'{path}.sqlite')} "
            f"{shlex.quote(str(path))}")


def parse(path: Path, *, include_osrt: bool = False, rank_map: dict | None = None,
          launch_args: bool = False, use_adbc: bool | None = None,
          **_ignored: Any) -> ParsedFile:
    """Parse one nsys SQLite export (or convert a ``.nsys-rep`` when ``nsys`` is installed).

    ``rank_map``: ``{pid: rank}`` for the processes of a multi-process report. ``launch_args``:
    also keep kernel grid/block/registers/shared memory in args_json (off by default: it
    roughly doubles the parse time of kernel-heavy exports).
    ``use_adbc``: read numeric tables through ``adbc-driver-sqlite`` (None = when installed).
    """
    path = Path(path)
    with open(path, "rb") as fh:
        is_sqlite = fh.read(16) == b"SQLite format 3\x00"
    if not is_sqlite and path.name.endswith(REPORT_SUFFIXES):
        return _from_report(path, include_osrt=include_osrt, rank_map=rank_map,
                            launch_args=launch_args, use_adbc=use_adbc)
    if not is_sqlite:
        raise UnreadableTraceError(path, "is not a SQLite file (expected an nsys SQLite export)")
    # the kernel table is read (without the GIL) while SQLAlchemy is imported and opens the
    # export; used only once the export is opened and recognised (see _read_ahead)
    ahead = None if use_adbc is False else _read_ahead.start(
        path, tables.KERNEL, lambda columns: tables.kernel_query(columns, launch_args=launch_args))
    try:
        export = open_export(path, use_adbc=use_adbc)
    except BaseException:
        if ahead is not None:
            ahead.close()
        raise
    export.read_ahead = ahead
    try:
        return _parse_export(export, include_osrt=include_osrt, rank_map=rank_map,
                             launch_args=launch_args)
    finally:
        export.close()


def _from_report(path: Path, **options: Any) -> ParsedFile:
    command = export_command(path)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise UnreadableTraceError(
            path, f"is an Nsight Systems report; convert it first: {command}")
    with tempfile.TemporaryDirectory(prefix="traceview-nsys-") as tmp:
        target = Path(tmp) / f"{path.name}.sqlite"
        try:
            done = subprocess.run([nsys, "export", "--type", "sqlite", "--output", str(target),
                                   str(path)], capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UnreadableTraceError(path, f"nsys export failed ({exc}); run: {command}") \
                from None
        if done.returncode != 0 or not target.is_file():
            detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UnreadableTraceError(
                path, f"nsys export failed ({detail[0]}); run: {command}")
        parsed = parse(target, **options)
    parsed.path = str(path)
    parsed.format = "nsys-rep"
    parsed.warnings.insert(0, f"converted with `{command}` (into a temporary file)")
    return parsed


# --------------------------------------------------------------------------- the export


def _parse_export(export: Export, *, include_osrt: bool, rank_map: dict | None,
                  launch_args: bool) -> ParsedFile:
    warnings: list[str] = []
    dropped: dict[str, int] = {}
    epoch = _session_start(export, warnings)
    if "StringIds" in export.tables and not export.has("StringIds", "id", "value"):
        warnings.append("StringIds has no id or value column: names are left empty")
    # one string per id (a hostile export may repeat one): joins on the id must not add rows
    strings = string_table(export).unique("id", keep="first", maintain_order=True)
    if long := long_strings(export):
        warnings.append(f"StringIds: {long} string(s) over {MAX_STRING_BYTES} bytes (the bound "
                        "on one name) read as a placeholder giving their size")
    lookup = tables.name_lookup(strings)
    # the hand-over to Arrow casts (schema.conform), and the first cast of a process imports
    # pyarrow.compute (~0.05 s): imported now, it overlaps the kernel read ahead, which this
    # thread would otherwise wait for (0.4-0.6 s for 2 M kernels)
    loaded(pyarrow_compute)

    staged: list[pl.DataFrame] = []
    input_events = 0
    readers = [(tables.KERNEL, lambda: tables.kernels(export, lookup, launch_args=launch_args)),
               (tables.RUNTIME, lambda: tables.runtime(export, lookup)),
               (tables.DRIVER, lambda: tables.runtime(export, lookup, tables.DRIVER)),
               (tables.MEMCPY, lambda: tables.memcpy(export)),
               (tables.MEMSET, lambda: tables.memset(export)),
               (tables.SYNC, lambda: tables.sync(export))]
    if include_osrt:
        readers.append((tables.OSRT, lambda: tables.osrt(export, lookup)))
    elif export.has(tables.OSRT):
        skipped = count_rows(export, tables.OSRT)
        if skipped:
            warnings.append(f"OSRT_API: {skipped} OS runtime rows not read (--include-osrt "
                            "reads them; in Python options={'include_osrt': True})")
    readers.append((tables.MEMORY_USAGE, lambda: tables.memory_usage(export)))  # instants
    left_out: list[str] = []
    for table, reader in readers:
        if _readable(export, table, left_out):
            frame = reader()
            input_events += frame.height
            staged.append(frame)
    nvtx_raw = pl.DataFrame()
    if _readable(export, tables.NVTX, left_out):
        nvtx_raw = tables.nvtx(export)
        input_events += nvtx_raw.height
        domains = tables.domain_names(export, nvtx_raw)
        events, nvtx_dropped, unresolved = tables.nvtx_events(nvtx_raw, domains, strings)
        if unresolved:
            export.unresolved.setdefault(tables.NVTX, {})["textId"] = unresolved
        _add(dropped, nvtx_dropped)
        staged.append(events)
    warnings += left_out
    # rows skipped for a cell of the wrong type were in the tables: input, and dropped
    wrong = sum(export.skipped[t].rows for t in tables.NEEDS if t in export.skipped)
    _add(dropped, {"wrong_type": wrong})
    input_events += wrong

    # empty tables add nothing but null columns, which _ensure adds as constants: taking them
    # into the concat made Polars copy every column of a large table into one chunk
    staged = [f for f in staged if f.height] or staged[:1]
    frame = (pl.concat(staged, how="diagonal_relaxed") if staged else pl.DataFrame(
        schema={"kind": tables.KIND, "gpid": pl.Int64, "start_rel": pl.Int64}))
    frame = _ensure(frame)
    frame = _drop(frame, pl.col("gpid").is_null(), "no_process", dropped)
    frame = _drop(frame, pl.col("end_rel") < pl.col("start_rel"), "end_before_start", dropped)
    frame, past = _drop_past_int64(frame, epoch or 0, dropped)
    warnings += past
    lost_all = left_out + _skip_notes(export, tables.NEEDS) + past
    if lost_all and not frame.height:  # damage left nothing to answer with
        raise UnreadableTraceError(export.path, "no usable event rows: " + "; ".join(lost_all))
    frame = frame.with_columns(
        (pl.col("start_rel") + (epoch or 0)).alias("ts_ns"),
        (pl.col("end_rel") - pl.col("start_rel")).alias("dur_ns"),
    )

    procs = _processes(frame)
    threads = _thread_names(export)
    ranked = _ranks.assign(
        procs, mpi=_mpi_ranks(export), thread_ranks=_thread_ranks(threads, strings, nvtx_raw),
        nccl=_nccl_hints(frame), capture=_capture(export), device_env=_device_env(export),
        path=export.path, rank_map=rank_map, warnings=warnings)
    kept = [p for p in ranked if p.rank is not None]
    if not kept:
        gpu = [p for p in ranked if p.is_gpu]
        kept = gpu[:1] if len(gpu) == 1 else ranked[:1] if len(ranked) == 1 else []
        if len(ranked) > 1 and not kept:
            # every row would be dropped: an empty table (exit 0) said nothing useful
            pids = ", ".join(str(p.pid) for p in ranked[:8]) + (", ..." if len(ranked) > 8 else "")
            raise UnreadableTraceError(
                export.path, f"{len(ranked)} processes (pids {pids}) and none launched GPU work "
                "or records its rank: nothing to analyse; name them in Python: "
                "traceview.open(PATH, options={'rank_map': {'pid:PID': RANK}})")
    rank_of = {p.gpid: p.rank for p in kept}
    lost = frame.filter(~pl.col("gpid").is_in(list(rank_of)))
    if lost.height:
        pids = sorted(set(lost["pid"].drop_nulls().to_list()))
        warnings.append(f"{lost.height} rows of processes without a rank dropped (pids {pids})")
    frame = _drop(frame, ~pl.col("gpid").is_in(list(rank_of)), "no_rank_for_process", dropped)

    names = _name_rows(export, strings, threads, frame, set(rank_of))
    input_events += names.height
    frame = _nccl.nvtx_collectives(frame)
    frame = _nccl.kernel_collectives(frame)
    rank = pl.col("gpid").replace_strict(
        {g: (r if r is not None else 0) for g, r in rank_of.items()}, default=0,
        return_dtype=pl.Int32)
    events, names = (_stored_columns(f.with_columns(
        rank.alias("rank"), pl.lit(0, dtype=pl.Int32).alias("file_id"),
        pl.lit("nsys", dtype=tables.SOURCE).alias("source"))) for f in (frame, names))
    table = _arrow.in_time_order(events, names)
    infos = _rank_infos(export, kept, frame, epoch)
    # last: every table has been read by now (the rank infos read TARGET_INFO_GPU)
    warnings += _skip_notes(export, export.skipped) + _unresolved_notes(export)
    stored = table.num_rows
    if input_events != stored + sum(dropped.values()):  # a bug, but say so rather than lie
        warnings.append(f"row accounting mismatch: input {input_events}, stored {stored}, "
                        f"dropped {sum(dropped.values())}")
    return ParsedFile(
        path=str(export.path), format="nsys-sqlite", events=table,
        ranks=infos, input_events=input_events,
        dropped=dropped, warnings=warnings)


def _readable(export: Export, table: str, left_out: list[str]) -> bool:
    """Whether ``table`` is there with the columns its reader needs; one that lacks some is
    not read, and ``left_out`` says so."""
    if table not in export.tables:
        return False
    missing = [c for c in tables.NEEDS[table] if not export.has(table, c)]
    if missing:
        rows = count_rows(export, table)
        left_out.append(f"{table} has no column {', '.join(missing)}: its {rows} rows are "
                        "not read")
    return not missing


def _skip_notes(export: Export, among: Collection[str]) -> list[str]:
    """One warning per table (of ``among``) with rows skipped for a cell of the wrong type."""
    return [f"{table}: {done.rows} rows skipped, a cell not of its column's type "
            f"({done.describe()})" for table, done in export.skipped.items()
            if table in among and done.rows]


def _unresolved_notes(export: Export) -> list[str]:
    return [f"{table}: {n} rows name a string id that StringIds lacks ({column}); that name "
            "is left empty" for table, columns in export.unresolved.items()
            for column, n in columns.items() if n]


def _stored_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """The event-store columns of ``frame`` that hold a value: ``_arrow.events_table``
    makes the columns left out all null at once, where exporting a null Polars column costs
    ~25 ms per 2 M rows."""
    return frame.select([c for c in schema.EVENT_COLUMN_NAMES if c in frame.columns
                         and (frame.is_empty() or frame[c].null_count() < frame.height)])


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        if value:
            into[key] = into.get(key, 0) + value


def _drop(frame: pl.DataFrame, bad: pl.Expr, reason: str, dropped: dict[str, int]) -> pl.DataFrame:
    n = frame.select(bad.fill_null(False).sum()).item() if frame.height else 0
    if n:
        dropped[reason] = dropped.get(reason, 0) + n
        frame = frame.filter(~bad.fill_null(False))
    return frame


_INT64 = (-(2**63), 2**63 - 1)


def _drop_past_int64(frame: pl.DataFrame, epoch: int,
                     dropped: dict[str, int]) -> tuple[pl.DataFrame, list[str]]:
    """``frame`` without the rows of :func:`_past_int64` (reason ``time_out_of_range``), and
    the warning that says so, if any."""
    kept = _drop(frame, _past_int64(frame, epoch), "time_out_of_range", dropped)
    lost = frame.height - kept.height
    return kept, [f"{lost} rows whose times leave the int64 nanosecond range once the session "
                  f"start ({epoch} ns) is added were dropped"] if lost else []


def _past_int64(frame: pl.DataFrame, epoch: int) -> pl.Expr:
    """Rows whose ``start + epoch``, ``end + epoch`` or ``end - start`` leave int64 (Polars
    would wrap them around: a kernel at 9e18 ns became one at -7.7e18). Checked on the
    table's bounds first, so a sane export pays two min/max."""
    lo, hi = _INT64
    first, last, latest = frame.select(pl.col("start_rel").min().alias("a"),
                                       pl.col("start_rel").max().alias("b"),
                                       pl.col("end_rel").max().alias("c")).row(0)
    if first is None:
        return pl.lit(False)
    latest = max(last, latest if latest is not None else last)
    if lo <= first + epoch and latest + epoch <= hi and latest - first <= hi:
        return pl.lit(False)
    start, end = pl.col("start_rel").cast(pl.Int128), pl.col("end_rel").cast(pl.Int128)
    return (~(start + epoch).is_between(lo, hi) | ~(end + epoch).is_between(lo, hi)
            | ((end - start) > hi))


_STAGING: dict[str, pl.DataType] = {
    "kind": tables.KIND, "category": tables.CAT, "name": tables.CAT, "gpid": pl.Int64,
    "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
    "start_rel": pl.Int64, "end_rel": pl.Int64, "correlation": pl.Int64, "bytes": pl.Int64,
    "copy_kind": tables.CAT, "args_json": pl.String, "collective": pl.String,
    "pg_name": pl.String, "seq": pl.Int64, "in_nelems": pl.Int64, "dtype": pl.String,
    "group_size": pl.Int32, "return_value": pl.Int64,
}


def _ensure(frame: pl.DataFrame) -> pl.DataFrame:
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in _STAGING.items()
               if c not in frame.columns]
    return frame.with_columns(missing) if missing else frame


def _session_start(export: Export, warnings: list[str]) -> int | None:
    epoch = None
    if export.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        found = checked_rows(export, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"],
                             {"epoch": pl.Int64})
        epoch = found[0][0] if found else None
    if epoch is None:
        warnings.append("no TARGET_INFO_SESSION_START_TIME.utcEpochNs: times are nanoseconds "
                        "since the session start, not epoch; other reports cannot be aligned "
                        "by clock")
    shift = export.meta.get("EXPORT_PARAM_TIME_SHIFT", "0").strip() or "0"
    normalize = export.meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").strip().lower()
    if shift not in ("0", "") or normalize == "true":
        warnings.append(f"exported with time shift {shift} / normalize {normalize}: times are as "
                        "exported, the shift is not undone")
    return epoch


def _processes(frame: pl.DataFrame) -> pl.DataFrame:
    # the four columns first: a group_by of the whole frame copies every column of a frame of
    # several chunks (the rowid ranges) into one
    return (frame.select("gpid", "pid", "kind", "device").group_by("gpid").agg(
        pl.col("pid").first(),
        pl.col("kind").is_in(_CUDA_KINDS).any().alias("is_gpu"),
        pl.col("device").drop_nulls().unique().sort().cast(pl.Int64).alias("devices"))
        .sort("pid"))


def _mpi_ranks(export: Export) -> dict[int, int]:
    if not export.has("MPI_RANKS", "globalTid", "rank"):
        return {}
    rows = checked_rows(export, "MPI_RANKS", ["globalTid", "rank"],
                        {"gtid": pl.Int64, "rank": pl.Int64})
    return {g & tables.PID_KEY_MASK: r for g, r in rows}


def _thread_names(export: Export) -> pl.DataFrame:
    """ThreadNames ``(gtid, id)``: the thread and the string id of its name."""
    if not export.has("ThreadNames", "nameId", "globalTid"):
        return pl.DataFrame(schema={"gtid": pl.Int64, "id": pl.Int64})
    schema = {"gtid": pl.Int64, "id": pl.Int64}
    return pl.DataFrame(checked_rows(export, "ThreadNames", ["globalTid", "nameId"], schema),
                        schema=schema, orient="row")


def _thread_ranks(threads: pl.DataFrame, strings: pl.DataFrame,
                  nvtx_raw: pl.DataFrame) -> dict[int, int]:
    """``MPI Rank N`` thread names (NVTX eventType 39 rows or ThreadNames)."""
    names: list[tuple[int, str]] = []
    if not nvtx_raw.is_empty():
        names += [(g, t) for g, t in nvtx_raw.filter(pl.col("event_type") == 39)
                  .select("gtid", "text").drop_nulls().iter_rows()]
    names += list(threads.join(strings, on="id", how="inner").select("gtid", "value")
                  .iter_rows())
    out: dict[int, int] = {}
    for gtid, text in names:
        found = _ranks._THREAD_RANK.match(text.strip())
        if found:
            out.setdefault(int(gtid) & tables.PID_KEY_MASK, _ranks.number(found.group(1)))
    return out


def _nccl_hints(frame: pl.DataFrame) -> dict[int, tuple[int, int | None]]:
    nvtx = (frame.select("gpid", "kind", "category", "name").filter(_nccl.is_nccl_domain())
            .select("gpid", pl.col("name").cast(pl.String)))
    hints = _nccl.rank_hints(nvtx)
    return {int(g): (int(r), int(n) if n is not None else None)
            for g, r, n in hints.iter_rows()}


def _capture(export: Export) -> list[tuple[str, str]]:
    if not export.has("META_DATA_CAPTURE", "name", "value"):
        return []
    return [(str(n), str(v)) for n, v in query_rows(
        export, "SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%'")
        if n is not None and v is not None]


def _system_env(export: Export, name: str) -> str:
    if not export.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        return ""
    rows = query_rows(export, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = ? LIMIT 1",
                      (name,))
    return str(rows[0][0]) if rows and rows[0][0] is not None else ""


def _device_env(export: Export) -> str:
    return _system_env(export, "DeviceEnvironment")


def _name_rows(export: Export, strings: pl.DataFrame, threads: pl.DataFrame,
               frame: pl.DataFrame, kept: set[int]) -> pl.DataFrame:
    """``metadata`` rows: process_name / thread_name of the kept processes, pinned to the
    process's first event time (names are timeless)."""
    parts: list[pl.DataFrame] = []
    if export.has("PROCESSES", "globalPid", "name"):
        procs = read_checked(export, "PROCESSES", ["globalPid", export.col("PROCESSES", "pid"),
                                                   "name"],
                             {"gpid": pl.Int64, "pid": pl.Int64, "value": pl.String}).filter(pl.col("gpid").is_in(list(kept)))
        parts.append(procs.select("gpid", "pid", pl.lit(None, dtype=pl.Int64).alias("tid"),
                                  tables.label("process_name").alias("name"), "value")
                     .unique(["gpid"], keep="first"))
    if not threads.is_empty():
        threads = (threads.join(strings, on="id", how="inner")
                   .with_columns(tables.gpid_of("gtid").alias("gpid"))
                   .filter(pl.col("gpid").is_in(list(kept))).unique(["gtid"], keep="first"))
        parts.append(threads.select(
            "gpid", tables.pid_of("gtid").alias("pid"), tables.tid_of("gtid").alias("tid"),
            tables.label("thread_name").alias("name"),
            "value"))
    if not parts:
        return pl.DataFrame(schema={"gpid": pl.Int64})
    names = pl.concat(parts, how="vertical_relaxed")
    first = frame.group_by("gpid").agg(pl.col("ts_ns").min())
    return names.join(first, on="gpid", how="left").select(
        "gpid", "pid", "tid", "name", tables.kind("metadata").alias("kind"),
        tables.label("metadata").alias("category"), pl.col("ts_ns").fill_null(0),
        pl.struct(pl.col("value").alias("name")).struct.json_encode().alias("args_json"))


def _rank_infos(export: Export, kept: list[_ranks.ProcessRank], frame: pl.DataFrame,
                epoch: int | None) -> list[RankInfo]:
    gpu_names = _gpu_names(export)
    gpu_memory = _gpu_memory(export)
    host = _system_env(export, "Hostname") or None
    nccl_procs = set(frame.select("gpid", "kind", "category", "collective").filter(
        _nccl.is_comm_kernel() | _nccl.is_nccl_domain())["gpid"].unique())
    infos = [RankInfo(
        rank=p.rank, world_size=p.world_size, host=host,
        devices=[gpu_names.get(d, f"GPU {d}") for d in p.devices],
        device_memory=orjson.dumps({str(d): gpu_memory[d] for d in p.devices
                                    if d in gpu_memory}).decode() if gpu_memory else None,
        backend="nccl" if p.gpid in nccl_procs else None, clock_base_ns=epoch,
        rank_from=p.rank_from, pid=p.pid) for p in kept]
    return infos or [RankInfo(rank=None, host=host, clock_base_ns=epoch)]


def _gpu_memory(export: Export) -> dict[int, int]:
    """Device id -> its memory in bytes (``TARGET_INFO_GPU.totalMemory``, when exported)."""
    for id_col in ("id", "deviceId"):
        if export.has("TARGET_INFO_GPU", id_col, "totalMemory"):
            rows = checked_rows(export, "TARGET_INFO_GPU", [ident(id_col), "totalMemory"],
                                {"id": pl.Int64, "memory": pl.Int64})
            return {i: m for i, m in rows if m}
    return {}


def _gpu_names(export: Export) -> dict[int, str]:
    for id_col in ("id", "deviceId"):
        if export.has("TARGET_INFO_GPU", id_col, "name"):
            return dict(checked_rows(export, "TARGET_INFO_GPU", [ident(id_col), "name"],
                                     {"id": pl.Int64, "name": pl.String}))
    return {}
