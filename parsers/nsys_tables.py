"""nsys tables -> event rows: one reader per table, each a query plus Polars expressions.

Every reader returns a frame in the *staging layout*: the event-store columns it can fill plus
``gpid`` (the serialized process id, tid bits cleared: the key that scopes correlation ids and
NVTX domains), ``end_rel`` / ``start_rel`` (session-relative ns) and, for NVTX, ``domain_id``.
Names stay integer ``StringIds`` ids (``name_id``) until :func:`resolve_names`, one join for
all tables.
"""

from __future__ import annotations

import polars as pl

from traceview.parsers.nsys_db import Export, read_frame

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
OSRT = "OSRT_API"

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

I64 = pl.Int64


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


def _gpu_common(export: Export, table: str) -> tuple[str, dict[str, pl.DataType]]:
    """Columns every GPU activity table shares."""
    select = (f'start, "end", deviceId, streamId, {export.col(table, "correlationId")}, '
              f'{export.col(table, "globalPid")}')
    schema = {"start_rel": I64, "end_rel": I64, "device": I64, "stream": I64,
              "correlation": I64, "gpid": I64}
    return select, schema


def _gpu_staging(frame: pl.DataFrame, kind: str, category: str) -> pl.DataFrame:
    return frame.with_columns(
        pl.lit(kind).alias("kind"),
        pl.lit(category).alias("category"),
        _pid_from_gpid("gpid").alias("pid"),
        pl.when(pl.col("stream") == NO_STREAM).then(None).otherwise(pl.col("stream"))
        .alias("stream"),
    )


def kernels(export: Export, *, launch_args: bool = True) -> pl.DataFrame:
    """CUPTI_ACTIVITY_KIND_KERNEL -> ``kernel`` rows; name = demangled name (short name in
    args_json with the launch geometry)."""
    select, schema = _gpu_common(export, KERNEL)
    select += f', demangledName, {export.col(KERNEL, "shortName")}'
    schema |= {"name_id": I64, "short_id": I64}
    extra = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
             "staticSharedMemory", "dynamicSharedMemory")
    if launch_args:
        select += ", " + ", ".join(export.col(KERNEL, c) for c in extra)
        schema |= {c: I64 for c in extra}
    frame = read_frame(export, f"SELECT {select} FROM {KERNEL}", schema, numeric=True)
    frame = _gpu_staging(frame, "kernel", KERNEL)
    if launch_args:  # JSON text built once per distinct launch configuration
        combos = frame.select(extra).unique().with_columns(
            pl.concat_str(
                pl.lit('{"grid":['), pl.col("gridX"), pl.lit(","), pl.col("gridY"), pl.lit(","),
                pl.col("gridZ"), pl.lit('],"block":['), pl.col("blockX"), pl.lit(","),
                pl.col("blockY"), pl.lit(","), pl.col("blockZ"),
                pl.lit('],"registers per thread":'), pl.col("registersPerThread"),
                pl.lit(',"shared memory":'),
                pl.col("staticSharedMemory") + pl.col("dynamicSharedMemory"),
                ignore_nulls=False).alias("launch_json"))
        frame = frame.join(combos, on=list(extra), how="left", nulls_equal=True).drop(extra)
    return frame


def runtime(export: Export, table: str = RUNTIME) -> pl.DataFrame:
    """CUDA runtime and driver API calls. ``eventClass`` 1 (or a ``cu*`` name in the
    ``DRIVER`` table) is a driver call; the kind is fixed after names are resolved."""
    select = (f'start, "end", {export.col(table, "eventClass", "0")}, globalTid, '
              f'{export.col(table, "correlationId")}, nameId, '
              f'{export.col(table, "returnValue", "0")}')
    schema = {"start_rel": I64, "end_rel": I64, "event_class": I64, "gtid": I64,
              "correlation": I64, "name_id": I64, "return_value": I64}
    frame = read_frame(export, f'SELECT {select} FROM "{table}"', schema, numeric=True)
    driver = (pl.lit(True) if table == DRIVER else pl.col("event_class") == 1)
    return frame.with_columns(
        pl.when(driver).then(pl.lit("cuda_driver")).otherwise(pl.lit("cuda_runtime"))
        .alias("kind"),
        pl.lit(table).alias("category"),
        *_thread_ids(),
    )


def _thread_ids() -> list[pl.Expr]:
    return [
        gpid_of("gtid").alias("gpid"),
        _pid_from_gpid("gtid").alias("pid"),
        tid_of("gtid").alias("tid"),
    ]


def memcpy(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, MEMCPY)
    select += (f', bytes, copyKind, {export.col(MEMCPY, "srcKind")}, '
               f'{export.col(MEMCPY, "dstKind")}')
    schema |= {"bytes": I64, "copy_kind_id": I64, "src_kind": I64, "dst_kind": I64}
    frame = read_frame(export, f"SELECT {select} FROM {MEMCPY}", schema, numeric=True)
    direction = pl.col("copy_kind_id").replace_strict(COPY_KIND, default=None,
                                                      return_dtype=pl.String)
    src = pl.col("src_kind").replace_strict(MEM_KIND, default=None, return_dtype=pl.String)
    dst = pl.col("dst_kind").replace_strict(MEM_KIND, default=None, return_dtype=pl.String)
    name = pl.coalesce(
        pl.concat_str(pl.lit("Memcpy "), direction, pl.lit(" ("), src, pl.lit(" -> "), dst,
                      pl.lit(")"), ignore_nulls=False),
        pl.concat_str(pl.lit("Memcpy "), pl.coalesce(direction, pl.lit("Unknown"))))
    return _gpu_staging(frame, "memcpy", MEMCPY).with_columns(
        name.alias("name"), direction.alias("copy_kind"),
        pl.struct(pl.col("copy_kind_id").alias("copyKind"), pl.col("src_kind").alias("srcKind"),
                  pl.col("dst_kind").alias("dstKind")).struct.json_encode().alias("args_json"),
    ).drop("copy_kind_id", "src_kind", "dst_kind")


def memset(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, MEMSET)
    select += f', bytes, {export.col(MEMSET, "memKind")}, {export.col(MEMSET, "value")}'
    schema |= {"bytes": I64, "mem_kind": I64, "value": I64}
    frame = read_frame(export, f"SELECT {select} FROM {MEMSET}", schema, numeric=True)
    kind_label = pl.col("mem_kind").replace_strict(MEM_KIND, default=None,
                                                   return_dtype=pl.String)
    return _gpu_staging(frame, "memset", MEMSET).with_columns(
        pl.coalesce(pl.concat_str(pl.lit("Memset ("), kind_label, pl.lit(")")),
                    pl.lit("Memset")).alias("name"),
        pl.struct(pl.col("value"), pl.col("mem_kind").alias("memKind")).struct.json_encode()
        .alias("args_json"),
    ).drop("mem_kind", "value")


def sync(export: Export) -> pl.DataFrame:
    select, schema = _gpu_common(export, SYNC)
    select += f', syncType, {export.col(SYNC, "eventId")}'
    schema |= {"sync_type": I64, "event_id": I64}
    frame = read_frame(export, f"SELECT {select} FROM {SYNC}", schema, numeric=True)
    return _gpu_staging(frame, "sync", SYNC).with_columns(
        pl.col("sync_type").replace_strict(SYNC_NAME, default="Unknown Sync",
                                           return_dtype=pl.String).alias("name"),
        pl.struct(pl.col("sync_type").alias("syncType"), pl.col("event_id").alias("eventId"))
        .struct.json_encode().alias("args_json"),
    ).drop("sync_type", "event_id")


def osrt(export: Export) -> pl.DataFrame:
    schema = {"start_rel": I64, "end_rel": I64, "gtid": I64, "name_id": I64}
    frame = read_frame(export, f'SELECT start, "end", globalTid, nameId FROM {OSRT}', schema,
                       numeric=True)
    return frame.with_columns(pl.lit("os_runtime").alias("kind"), pl.lit(OSRT).alias("category"),
                              *_thread_ids())


def nvtx(export: Export) -> pl.DataFrame:
    """All NVTX rows (ranges, marks and bookkeeping); :func:`nvtx_events` picks the events."""
    payload_int = [c for c in ("int64Value", "uint64Value", "int32Value", "uint32Value")
                   if export.has(NVTX, c)]
    payload_float = [c for c in ("doubleValue", "floatValue") if export.has(NVTX, c)]
    pint = f"COALESCE({', '.join(payload_int)}, NULL)" if payload_int else "NULL"
    pfloat = f"COALESCE({', '.join(payload_float)}, NULL)" if payload_float else "NULL"
    select = (f'start, "end", eventType, {export.col(NVTX, "text")}, '
              f'{export.col(NVTX, "textId")}, globalTid, {export.col(NVTX, "domainId", "0")}, '
              f'{pint}, {pfloat}, {export.col(NVTX, "jsonText")}')
    schema = {"start_rel": I64, "end_rel": I64, "event_type": I64, "text": pl.String,
              "name_id": I64, "gtid": I64, "domain_id": I64, "payload_int": I64,
              "payload_float": pl.Float64, "json_text": pl.String}
    frame = read_frame(export, f"SELECT {select} FROM {NVTX}", schema)
    return frame.with_columns(*_thread_ids())


def domain_names(export: Export, nvtx_rows: pl.DataFrame) -> pl.DataFrame:
    """``(gpid, domain_id, domain)``: NVTX domain ids are per process; names come from the
    domain-creation rows (eventType 75), or the generation-1 ``DomainStrings`` table."""
    created = (nvtx_rows.filter(pl.col("event_type") == NVTX_DOMAIN_CREATE)
               .select("gpid", "domain_id", pl.col("text").alias("domain"))
               .unique(["gpid", "domain_id"], keep="first"))
    if export.has("DomainStrings", "id", "domainName") and created.is_empty():
        legacy = read_frame(export, "SELECT id, domainName FROM DomainStrings",
                            {"domain_id": I64, "domain": pl.String})
        gpids = nvtx_rows.select("gpid").unique()
        created = (gpids.join(legacy, how="cross").select("gpid", "domain_id", "domain")
                   .unique(["gpid", "domain_id"], keep="first"))
    return created


def nvtx_events(rows: pl.DataFrame, domains: pl.DataFrame,
                strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Ranges and marks with their text and domain; counts of the rows that are not events."""
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
    domain = pl.when(pl.col("domain_id").fill_null(0) == 0).then(pl.lit("default")).otherwise(
        pl.coalesce(pl.col("domain"), pl.format("domain {}", pl.col("domain_id"))))
    events = events.with_columns(
        pl.lit("nvtx").alias("kind"),
        pl.coalesce(pl.col("text"), pl.col("_registered"), pl.lit("")).alias("name"),
        domain.alias("category"),
        pl.when(is_mark).then(pl.lit(None, dtype=I64)).otherwise(pl.col("end_rel"))
        .alias("end_rel"),
    )
    payload = pl.struct(
        pl.col("category").alias("domain"), pl.col("event_type").alias("eventType"),
        pl.col("payload_int").alias("payload"), pl.col("payload_float").alias("payload_float"),
        pl.col("json_text").alias("json"))
    events = events.with_columns(payload.struct.json_encode().alias("args_json"))
    return (events.drop("text", "_registered", "domain", "event_type", "payload_int",
                        "payload_float", "json_text", "name_id"),
            {k: v for k, v in dropped.items() if v})


def name_lookup(strings: pl.DataFrame) -> pl.DataFrame:
    """StringIds with what every row needs derived once per string, not once per row:
    ``name_id``, ``_sid_name``, ``_api_name`` (nsys's ``_v7000`` version suffix dropped, as Kineto
    names API calls), ``_api_json`` (``{"nsys_name": raw}``) and ``_str_json`` (JSON literal)."""
    return strings.select(
        pl.col("id").alias("name_id"), pl.col("value").alias("_sid_name"),
        pl.col("value").str.replace(r"_v\d+$", "").alias("_api_name"),
        pl.struct(pl.col("value").alias("nsys_name")).struct.json_encode().alias("_api_json"),
        _json_strings(pl.col("value")).alias("_str_json"),
    )


def resolve_names(frame: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """Fill ``name`` from ``name_id`` (StringIds); API calls keep their raw nsys name (and a
    non-zero return value) in args_json. Kernel args_json gets the short name."""
    lookup = name_lookup(strings)
    frame = frame.join(lookup.drop("_str_json"), on="name_id", how="left")
    is_api = pl.col("kind").is_in(["cuda_runtime", "cuda_driver", "os_runtime"])
    frame = frame.with_columns(
        pl.coalesce(pl.when(is_api).then(pl.col("_api_name")).otherwise(pl.col("_sid_name")),
                    pl.col("name")).alias("name"),
        pl.when(is_api & (pl.col("return_value").fill_null(0) != 0)).then(
            pl.concat_str(pl.col("_api_json").str.head(-1), pl.lit(',"returnValue":'),
                          pl.col("return_value"), pl.lit("}")))
        .when(is_api).then(pl.col("_api_json"))
        .otherwise(pl.col("args_json")).alias("args_json"),
    ).drop("_sid_name", "_api_name", "_api_json")
    if "short_id" in frame.columns:
        short = lookup.select(pl.col("name_id").alias("short_id"),
                              pl.col("_sid_name").alias("short_name"), "_str_json")
        frame = frame.drop("short_name", strict=False).join(short, on="short_id", how="left")
        short_json = pl.concat_str(pl.lit('"shortName":'), pl.col("_str_json"))
        launch = pl.col("launch_json") if "launch_json" in frame.columns else pl.lit(None)
        frame = frame.with_columns(
            pl.when(pl.col("kind") == "kernel").then(
                pl.coalesce(pl.concat_str(launch, pl.lit(","), short_json, pl.lit("}")),
                            pl.concat_str(pl.lit("{"), short_json, pl.lit("}")),
                            pl.lit("{}")))
            .otherwise(pl.col("args_json")).alias("args_json"),
        ).drop("_str_json", "short_id", *(["launch_json"] if "launch_json" in frame.columns
                                          else []))
    return frame


def _json_strings(value: pl.Expr) -> pl.Expr:
    """JSON string literals of a string column (``"a\"b"``), vectorised."""
    return pl.struct(value.alias("v")).struct.json_encode().str.slice(5).str.head(-1)
