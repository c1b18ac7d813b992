"""nsys tables -> event rows: one reader per table, each a query plus Polars expressions.

Every reader returns a frame in the *staging layout*: the event-store columns it can fill plus
``gpid`` (the serialized process id, tid bits cleared: the key that scopes correlation ids and
NVTX domains) and ``end_rel`` / ``start_rel`` (session-relative ns).

Strings that repeat are dictionary-typed from the start (``kind`` an Enum of the schema's kinds,
category, name and copy_kind Categoricals), and text is made once per distinct
value, not once per row: what a row needs from ``StringIds`` (its name, its kernel args_json,
...) is derived once per string by :func:`name_lookup` and gathered at the row's string id
(:func:`by_id`), and the labels and args_json of memcpy and memset once per distinct
combination. A table of millions of kernels then carries no string per row but its args_json.

Each reader names the columns it cannot do without (:data:`NEEDS`: a table lacking one is not
read) and the outputs that may not be NULL (:data:`TIMED`); a row whose cell is not of its
column's type is skipped by the read (``_db``, ``_typed``). A row whose string id StringIds
lacks keeps its time, with an empty name, and is counted in ``export.unresolved``.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceview.naming import collective_from_text
from traceview.parsers.nsys._db import Export, read_parts, read_table
from traceview.parsers.nsys._nccl import is_comm_kernel_name, kernel_collective
from traceview.parsers.nsys._sql import ident
from traceview.schema import KINDS, SOURCES

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
OSRT = "OSRT_API"
MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"

TID_MASK = 0xFFFFFF
PID_KEY_MASK = ~0xFFFFFF  # globalTid -> globalPid

#: ENUM_CUDA_MEMCPY_OPER id -> direction as Kineto names it (the schema's copy_kind values).
COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
             8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
#: ENUM_CUDA_MEM_KIND id -> label, as in Kineto's "Memcpy HtoD (Pageable -> Device)".
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
            5: "Device Static", 6: "Managed Static", 7: "Unknown"}
#: ENUM_CUPTI_SYNC_TYPE id -> the name Kineto gives the same cuda_sync event.
SYNC_NAME = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync",
             4: "Context Sync"}
#: NVTX_EVENTS.eventType values that are events: ranges (push/pop, start/end, NVTXT variants)
#: and marks. Everything else (domain/category/thread naming, ...) is bookkeeping.
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_MARK_TYPES = (34, 65)
NVTX_DOMAIN_CREATE = 75
#: 0xFFFFFFFF in streamId means "no stream" (event syncs).
NO_STREAM = 0xFFFFFFFF

#: The columns each reader cannot do without: a table lacking one is not read (a warning says
#: so). Every other column a reader takes is optional (NULL when absent: ``Export.col``).
NEEDS: dict[str, tuple[str, ...]] = {
    KERNEL: ("start", "end", "deviceId", "streamId", "demangledName"),
    RUNTIME: ("start", "end", "globalTid", "nameId"),
    DRIVER: ("start", "end", "globalTid", "nameId"),
    MEMCPY: ("start", "end", "deviceId", "streamId", "bytes", "copyKind"),
    MEMSET: ("start", "end", "deviceId", "streamId", "bytes"),
    SYNC: ("start", "end", "deviceId", "streamId", "syncType"),
    OSRT: ("start", "end", "globalTid", "nameId"),
    NVTX: ("start", "end", "eventType", "globalTid"),
    MEMORY_USAGE: ("start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType"),
}
#: Outputs a row cannot lack: a NULL there skips the row like a cell of the wrong type.
TIMED = ("start_rel", "end_rel")

I64 = pl.Int64
CAT = pl.Categorical
#: ``kind`` and ``source`` are closed vocabularies: as Enums they go to Arrow as they are, where
#: a Categorical column is re-encoded (~40 ms per 2 M rows).
KIND = pl.Enum(KINDS)
SOURCE = pl.Enum(SOURCES)


def kind(name: str) -> pl.Expr:
    """A constant ``kind`` column."""
    return pl.lit(name, dtype=KIND)


def label(text: str) -> pl.Expr:
    """A constant Categorical column (``category``, ``name``)."""
    return pl.lit(text, dtype=CAT)


def _pid_from_gpid(col: str) -> pl.Expr:
    """``(globalId >> 24) & 0xFFFFFF`` (serialized ids are non-negative)."""
    return (pl.col(col) // (1 << 24)) % (1 << 24)


def gpid_of(col: str) -> pl.Expr:
    """globalTid -> globalPid: the low 24 (thread) bits cleared."""
    return pl.col(col) - pl.col(col) % (1 << 24)


def tid_of(col: str) -> pl.Expr:
    return pl.col(col) % (1 << 24)


def pid_of(col: str) -> pl.Expr:
    return _pid_from_gpid(col)


def _gpu_common(export: Export, table: str) -> tuple[list[str], dict[str, pl.DataType]]:
    """Columns every GPU activity table shares."""
    select = ["start", '"end"', "deviceId", "streamId", export.col(table, "correlationId"),
              export.col(table, "globalPid")]
    schema = {"start_rel": I64, "end_rel": I64, "device": I64, "stream": I64,
              "correlation": I64, "gpid": I64}
    return select, schema


def _gpu_staging(frame: pl.DataFrame, kind_name: str, category: str) -> pl.DataFrame:
    return frame.with_columns(
        kind(kind_name).alias("kind"),
        label(category).alias("category"),
        _pid_from_gpid("gpid").alias("pid"),
        pl.when(pl.col("stream") == NO_STREAM).then(None).otherwise(pl.col("stream"))
        .alias("stream"),
    )


#: A kernel's launch geometry (``launch_args=True``).
LAUNCH_COLUMNS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                  "staticSharedMemory", "dynamicSharedMemory")


def kernel_query(columns: Collection[str], *, launch_args: bool
                 ) -> tuple[list[str], dict[str, pl.DataType], tuple[str, ...]]:
    """The select list, staging schema and required outputs of the kernel read, for a kernel
    table with ``columns`` (also used to read it ahead: ``_read_ahead``)."""
    def col(name: str) -> str:
        return ident(name) if name in columns else "NULL"

    select = ["start", '"end"', "deviceId", "streamId", col("correlationId"), col("globalPid"),
              "demangledName", col("shortName")]
    schema = {"start_rel": I64, "end_rel": I64, "device": I64, "stream": I64,
              "correlation": I64, "gpid": I64, "name_id": I64, "short_id": I64}
    if launch_args:
        select += [col(c) for c in LAUNCH_COLUMNS]
        schema |= {c: I64 for c in LAUNCH_COLUMNS}
    return select, schema, TIMED


def kernels(export: Export, lookup: pl.DataFrame, *, launch_args: bool = True) -> pl.DataFrame:
    """CUPTI_ACTIVITY_KIND_KERNEL -> ``kernel`` rows; name = demangled name (short name in
    args_json with the launch geometry), NCCL kernels' collective from their name.
    ``lookup``: :func:`name_lookup`."""
    select, schema, required = kernel_query(export.tables[KERNEL], launch_args=launch_args)
    # part by part (one per rowid range): the gathers below would otherwise copy every column
    # of a frame of several chunks into one
    frame = pl.concat([_kernel_rows(part, lookup, LAUNCH_COLUMNS if launch_args else ())
                       for part in read_parts(export, KERNEL, select, schema, required)],
                      how="vertical", rechunk=False)
    return _note_unresolved(export, KERNEL, frame, {"demangledName": "_no_name",
                                                    "shortName": "_no_short"})


def _kernel_rows(frame: pl.DataFrame, lookup: pl.DataFrame,
                 extra: tuple[str, ...]) -> pl.DataFrame:
    """Kernel rows (a part of the table) in the staging layout; ``extra``: the launch
    geometry columns, when asked for."""
    launch_args = bool(extra)
    frame = _gpu_staging(frame, "kernel", KERNEL)
    short = by_id(lookup, "_sid_name", "short_id")
    # args_json: {launch geometry, "shortName": ...}; {} without a short name
    if launch_args:  # the geometry's JSON made once per distinct launch configuration
        combos = frame.select(extra).unique().with_columns(pl.concat_str(
            pl.lit('{"grid":['), pl.col("gridX"), pl.lit(","), pl.col("gridY"), pl.lit(","),
            pl.col("gridZ"), pl.lit('],"block":['), pl.col("blockX"), pl.lit(","),
            pl.col("blockY"), pl.lit(","), pl.col("blockZ"),
            pl.lit('],"registers per thread":'), pl.col("registersPerThread"),
            pl.lit(',"shared memory":'),
            pl.col("staticSharedMemory") + pl.col("dynamicSharedMemory"),
            ignore_nulls=False).alias("_launch_json"))
        frame = _join(frame, combos, list(extra)).drop(extra)
        short_json = pl.concat_str(pl.lit('"shortName":'), by_id(lookup, "_str_json", "short_id"))
        args = pl.coalesce(pl.concat_str(pl.col("_launch_json"), pl.lit(","), short_json,
                                         pl.lit("}")),
                           pl.concat_str(pl.lit("{"), short_json, pl.lit("}")), pl.lit("{}"))
    else:
        args = by_id(lookup, "_short_args", "short_id").fill_null("{}")
    # NCCL kernels: the collective their short name (else name) tells; none when no string of
    # the export names an NCCL kernel (four gathers per row saved)
    told = pl.when(short.is_not_null()).then(by_id(lookup, "_collective", "short_id")).otherwise(
        by_id(lookup, "_collective", "name_id"))
    collective = (kernel_collective(by_id(lookup, "_comm_kernel", "name_id"), told)
                  if lookup["_comm_kernel"].any() else pl.lit(None, dtype=pl.String))
    return frame.with_columns(
        by_id(lookup, "_sid_name", "name_id").alias("name"), args.alias("args_json"),
        collective.alias("collective"), _unresolved(lookup, "name_id").alias("_no_name"),
        _unresolved(lookup, "short_id").alias("_no_short"),
    ).drop("name_id", "short_id", *(["_launch_json"] if launch_args else []))


def _unresolved(lookup: pl.DataFrame, id_col: str) -> pl.Expr:
    """Whether a row's string id is one StringIds lacks (a null id is none)."""
    return pl.col(id_col).is_not_null() & ~by_id(lookup, "_known", id_col).fill_null(False)


def _note_unresolved(export: Export, table: str, frame: pl.DataFrame,
                     flags: dict[str, str]) -> pl.DataFrame:
    """``frame`` without its ``flags`` columns ({column: flag}), their counts of rows with a
    string id StringIds lacks noted in ``export.unresolved``."""
    counts = frame.select(pl.col(f).sum().alias(c) for c, f in flags.items()).row(0, named=True)
    if any(counts.values()):
        noted = export.unresolved.setdefault(table, {})
        for column, n in counts.items():
            noted[column] = noted.get(column, 0) + int(n or 0)
    return frame.drop(flags.values())


def runtime(export: Export, lookup: pl.DataFrame, table: str = RUNTIME) -> pl.DataFrame:
    """CUDA runtime and driver API calls. ``eventClass`` 1 (or any row of the ``DRIVER``
    table) is a driver call. ``lookup``: :func:`name_lookup`."""
    select = ["start", '"end"', export.col(table, "eventClass", "0"), "globalTid",
              export.col(table, "correlationId"), "nameId", export.col(table, "returnValue", "0")]
    schema = {"start_rel": I64, "end_rel": I64, "event_class": I64, "gtid": I64,
              "correlation": I64, "name_id": I64, "return_value": I64}
    frame = read_table(export, table, select, schema, TIMED)
    driver = (pl.lit(True) if table == DRIVER else pl.col("event_class") == 1)
    frame = frame.with_columns(
        pl.when(driver).then(kind("cuda_driver")).otherwise(kind("cuda_runtime"))
        .alias("kind"),
        label(table).alias("category"),
        *_thread_ids(),
    )
    return _api_names(export, table, frame, lookup)


def _api_names(export: Export, table: str, frame: pl.DataFrame,
               lookup: pl.DataFrame) -> pl.DataFrame:
    """API calls: the name without nsys's version suffix; the raw name (and a non-zero return
    value) in args_json."""
    raw = by_id(lookup, "_api_json", "name_id")
    frame = frame.with_columns(
        by_id(lookup, "_api_name", "name_id").alias("name"),
        pl.when(pl.col("return_value").fill_null(0) != 0).then(
            pl.concat_str(raw.str.head(-1), pl.lit(',"returnValue":'), pl.col("return_value"),
                          pl.lit("}")))
        .otherwise(raw).alias("args_json"),
        _unresolved(lookup, "name_id").alias("_no_name"),
    ).drop("name_id")
    return _note_unresolved(export, table, frame, {"nameId": "_no_name"})


def _join(frame: pl.DataFrame, labels: pl.DataFrame, keys: str | list[str]) -> pl.DataFrame:
    """``frame`` with the columns of ``labels`` (one row per distinct key), rows in order."""
    return frame.join(labels, on=keys, how="left", nulls_equal=True, maintain_order="left")


def _thread_ids() -> list[pl.Expr]:
    return [
        gpid_of("gtid").alias("gpid"),
        _pid_from_gpid("gtid").alias("pid"),
        tid_of("gtid").alias("tid"),
    ]


def memcpy(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, MEMCPY)
    select += ["bytes", "copyKind", export.col(MEMCPY, "srcKind"), export.col(MEMCPY, "dstKind")]
    schema |= {"bytes": I64, "copy_kind_id": I64, "src_kind": I64, "dst_kind": I64}
    frame = read_table(export, MEMCPY, select, schema, TIMED)
    direction = pl.col("copy_kind_id").replace_strict(COPY_KIND, default=None,
                                                      return_dtype=pl.String)
    src = pl.col("src_kind").replace_strict(MEM_KIND, default=None, return_dtype=pl.String)
    dst = pl.col("dst_kind").replace_strict(MEM_KIND, default=None, return_dtype=pl.String)
    name = pl.coalesce(
        pl.concat_str(pl.lit("Memcpy "), direction, pl.lit(" ("), src, pl.lit(" -> "), dst,
                      pl.lit(")"), ignore_nulls=False),
        pl.concat_str(pl.lit("Memcpy "), pl.coalesce(direction, pl.lit("Unknown"))))
    keys = ["copy_kind_id", "src_kind", "dst_kind"]
    combos = frame.select(keys).unique().with_columns(
        name.cast(CAT).alias("name"), direction.cast(CAT).alias("copy_kind"),
        pl.struct(pl.col("copy_kind_id").alias("copyKind"), pl.col("src_kind").alias("srcKind"),
                  pl.col("dst_kind").alias("dstKind")).struct.json_encode().alias("args_json"))
    return _join(_gpu_staging(frame, "memcpy", MEMCPY), combos, keys).drop(keys)


def memset(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, MEMSET)
    select += ["bytes", export.col(MEMSET, "memKind"), export.col(MEMSET, "value")]
    schema |= {"bytes": I64, "mem_kind": I64, "value": I64}
    frame = read_table(export, MEMSET, select, schema, TIMED)
    kind_label = pl.col("mem_kind").replace_strict(MEM_KIND, default=None,
                                                   return_dtype=pl.String)
    keys = ["mem_kind", "value"]
    combos = frame.select(keys).unique().with_columns(
        pl.coalesce(pl.concat_str(pl.lit("Memset ("), kind_label, pl.lit(")")),
                    pl.lit("Memset")).cast(CAT).alias("name"),
        pl.struct(pl.col("value"), pl.col("mem_kind").alias("memKind")).struct.json_encode()
        .alias("args_json"))
    return _join(_gpu_staging(frame, "memset", MEMSET), combos, keys).drop(keys)


#: ENUM_CUDA_MEM_KIND ids of host memory (pageable, pinned): their rows are the host's.
HOST_MEM_KINDS = (0, 1)


def memory_usage(export: Export) -> pl.DataFrame:
    """CUDA_GPU_MEMORY_USAGE_EVENTS (``--cuda-memory-usage=true``) -> ``memory`` instants:
    ``mem_bytes`` + on allocation (``memoryOperationType`` 0), − on free (1), ``device`` the
    GPU (host memory kinds: −1); the driver keeps no running total, so readers sum them."""
    select = ["start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType",
              export.col(MEMORY_USAGE, "correlationId"), export.col(MEMORY_USAGE, "address")]
    schema = {"start_rel": I64, "gpid": I64, "device": I64, "size": I64, "mem_kind": I64,
              "operation": I64, "correlation": I64, "address": I64}
    frame = read_table(export, MEMORY_USAGE, select, schema, ("start_rel",))
    return frame.with_columns(
        kind("memory").alias("kind"), label(MEMORY_USAGE).alias("category"),
        label("[memory]").alias("name"), pl.col("start_rel").alias("end_rel"),
        _pid_from_gpid("gpid").alias("pid"),
        pl.when(pl.col("mem_kind").is_in(HOST_MEM_KINDS)).then(-1).otherwise(pl.col("device"))
        .alias("device"),
        pl.when(pl.col("operation") == 1).then(-pl.col("size")).otherwise(pl.col("size"))
        .alias("mem_bytes"),
        pl.struct(pl.col("address").alias("Addr"), pl.col("mem_kind").alias("memKind"),
                  pl.col("operation").alias("memoryOperationType"))
        .struct.json_encode().alias("args_json"),
    ).drop("size", "mem_kind", "operation", "address")


def sync(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, SYNC)
    select += ["syncType", export.col(SYNC, "eventId")]
    schema |= {"sync_type": I64, "event_id": I64}
    frame = read_table(export, SYNC, select, schema, TIMED)
    return _gpu_staging(frame, "sync", SYNC).with_columns(
        pl.col("sync_type").replace_strict(SYNC_NAME, default="Unknown Sync",
                                           return_dtype=CAT).alias("name"),
        pl.struct(pl.col("sync_type").alias("syncType"), pl.col("event_id").alias("eventId"))
        .struct.json_encode().alias("args_json"),
    ).drop("sync_type", "event_id")


def osrt(export: Export, lookup: pl.DataFrame) -> pl.DataFrame:
    schema = {"start_rel": I64, "end_rel": I64, "gtid": I64, "name_id": I64}
    frame = read_table(export, OSRT, ["start", '"end"', "globalTid", "nameId"], schema, TIMED)
    frame = frame.with_columns(kind("os_runtime").alias("kind"), label(OSRT).alias("category"),
                               pl.lit(None, dtype=I64).alias("return_value"), *_thread_ids())
    return _api_names(export, OSRT, frame, lookup)


def nvtx(export: Export) -> pl.DataFrame:
    """All NVTX rows (ranges, marks and bookkeeping); :func:`nvtx_events` picks the events."""
    payload_int = [c for c in ("int64Value", "uint64Value", "int32Value", "uint32Value")
                   if export.has(NVTX, c)]
    payload_float = [c for c in ("doubleValue", "floatValue") if export.has(NVTX, c)]
    pint = f"COALESCE({', '.join(map(ident, payload_int))}, NULL)" if payload_int else "NULL"
    pfloat = (f"COALESCE({', '.join(map(ident, payload_float))}, NULL)" if payload_float
              else "NULL")
    select = ["start", '"end"', "eventType", export.col(NVTX, "text"), export.col(NVTX, "textId"),
              "globalTid", export.col(NVTX, "domainId", "0"), pint, pfloat,
              export.col(NVTX, "jsonText")]
    schema = {"start_rel": I64, "end_rel": I64, "event_type": I64, "text": pl.String,
              "name_id": I64, "gtid": I64, "domain_id": I64, "payload_int": I64,
              "payload_float": pl.Float64, "json_text": pl.String}
    # "end" may be NULL: an unclosed range (or a mark)
    return read_table(export, NVTX, select, schema, ("start_rel",)).with_columns(*_thread_ids())


def domain_names(export: Export, nvtx_rows: pl.DataFrame) -> pl.DataFrame:
    """``(gpid, domain_id, domain)``: NVTX domain ids are per process; names come from the
    domain-creation rows (eventType 75), or the generation-1 ``DomainStrings`` table."""
    created = (nvtx_rows.filter(pl.col("event_type") == NVTX_DOMAIN_CREATE)
               .select("gpid", "domain_id", pl.col("text").alias("domain"))
               .unique(["gpid", "domain_id"], keep="first"))
    if export.has("DomainStrings", "id", "domainName") and created.is_empty():
        legacy = read_table(export, "DomainStrings", ["id", "domainName"],
                            {"domain_id": I64, "domain": pl.String})
        gpids = nvtx_rows.select("gpid").unique()
        created = (gpids.join(legacy, how="cross").select("gpid", "domain_id", "domain")
                   .unique(["gpid", "domain_id"], keep="first"))
    return created


def nvtx_events(rows: pl.DataFrame, domains: pl.DataFrame,
                strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int], int]:
    """Ranges and marks with their text and domain; counts of the rows that are not events;
    the events without text whose textId StringIds lacks (their name is empty)."""
    is_range = pl.col("event_type").is_in(NVTX_RANGE_TYPES)
    is_mark = pl.col("event_type").is_in(NVTX_MARK_TYPES)
    dropped = {
        "nvtx_not_an_event": rows.filter(~is_range & ~is_mark).height,
        "nvtx_unclosed_range": rows.filter(is_range & pl.col("end_rel").is_null()).height,
    }
    events = rows.filter(is_mark | (is_range & pl.col("end_rel").is_not_null()))
    events = (events.join(domains, on=["gpid", "domain_id"], how="left")
              .join(strings.rename({"id": "name_id", "value": "_registered"}), on="name_id",
                    how="left"))
    unresolved = events.select((pl.col("text").is_null() & pl.col("name_id").is_not_null()
                                & pl.col("_registered").is_null()).sum()).item()
    domain = pl.when(pl.col("domain_id").fill_null(0) == 0).then(pl.lit("default")).otherwise(
        pl.coalesce(pl.col("domain"), pl.format("domain {}", pl.col("domain_id"))))
    events = events.with_columns(
        kind("nvtx").alias("kind"),
        pl.coalesce(pl.col("text"), pl.col("_registered"), pl.lit("")).cast(CAT).alias("name"),
        domain.alias("category"),
        pl.when(is_mark).then(pl.lit(None, dtype=I64)).otherwise(pl.col("end_rel"))
        .alias("end_rel"),
    )
    payload = pl.struct(
        pl.col("category").alias("domain"), pl.col("event_type").alias("eventType"),
        pl.col("payload_int").alias("payload"), pl.col("payload_float").alias("payload_float"),
        pl.col("json_text").alias("json"))
    events = events.with_columns(payload.struct.json_encode().alias("args_json"),
                                 pl.col("category").cast(CAT))
    return (events.drop("text", "_registered", "domain", "event_type", "payload_int",
                        "payload_float", "json_text", "name_id"),
            {k: v for k, v in dropped.items() if v}, int(unresolved or 0))


#: StringIds are numbered 0, 1, 2, ... in exports; up to this many unused ids (or twice the
#: strings) are kept as null rows so that a row's id is its row in :func:`name_lookup`.
_ID_GAPS = 65_536


def name_lookup(strings: pl.DataFrame) -> pl.DataFrame:
    """StringIds with what rows need derived once per string, not once per row: ``name_id``,
    ``_sid_name``, ``_api_name`` (nsys's ``_v7000`` version suffix dropped, as Kineto names API
    calls), ``_api_json`` (``{"nsys_name": raw}``), ``_str_json`` (JSON literal),
    ``_short_args`` (a kernel's args_json ``{"shortName": ...}``), ``_comm_kernel`` (an
    NCCL/RCCL kernel name), ``_collective`` (the collective the text tells) and ``_known``
    (true: the id has a string; false on the null rows of unused ids).

    One row per id from 0 up, null rows for unused ids, when the ids are that dense (they are in
    exports): then :func:`by_id` resolves a column by gathering at the id instead of a join."""
    strings = strings.unique("id", keep="first", maintain_order=True).sort("id")
    ids = strings["id"]
    if strings.height and ids.min() >= 0 and ids.max() < 2 * strings.height + _ID_GAPS:
        strings = pl.DataFrame({"id": pl.int_range(ids.max() + 1, eager=True)}).join(
            strings, on="id", how="left", maintain_order="left")
    value = pl.col("value")
    return strings.select(
        pl.col("id").alias("name_id"), value.cast(CAT).alias("_sid_name"),
        value.is_not_null().alias("_known"),
        value.str.replace(r"_v\d+$", "").cast(CAT).alias("_api_name"),
        pl.struct(value.alias("nsys_name")).struct.json_encode().alias("_api_json"),
        _json_strings(value).alias("_str_json"),
        pl.concat_str(pl.lit('{"shortName":'), _json_strings(value), pl.lit("}"))
        .alias("_short_args"),
        is_comm_kernel_name(value).alias("_comm_kernel"),
        collective_from_text(value).alias("_collective"),
    )


def by_id(lookup: pl.DataFrame, column: str, id_col: str) -> pl.Expr:
    """``lookup[column]`` (a :func:`name_lookup` column) at each row's ``id_col``; null for a
    null or unknown id."""
    ids = pl.col(id_col)
    if lookup.height and lookup["name_id"][-1] == lookup.height - 1:  # id i is row i
        row = pl.when(ids.is_between(0, lookup.height - 1)).then(ids)
    else:  # ids too far apart to lay out by id: look each one up
        row = ids.replace_strict(lookup["name_id"], pl.int_range(lookup.height, eager=True),
                                 default=None)
    return pl.lit(lookup[column]).gather(row)


def _json_strings(value: pl.Expr) -> pl.Expr:
    """JSON string literals of a string column (``"a\"b"``), vectorised."""
    return pl.struct(value.alias("v")).struct.json_encode().str.slice(5).str.head(-1)
