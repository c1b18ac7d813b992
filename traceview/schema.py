"""The one definition of every column in the traceview event store, and of the vocabulary the
parsers and analyses share: the kinds and their groups (``GPU_KINDS``, ``RUNTIME_KINDS``, ...),
the step marker (``STEP_PATTERN``) and the Kineto ``args`` keys read into columns
(``KINETO_ARGS``).

Each column is declared once, as data: its name, Arrow type, unit, meaning, and where it comes
from in Kineto and in nsys. The Arrow schema, the Polars schema and ``docs/schema.md`` are all
derived from these declarations, so they cannot drift apart.

Times are int64 nanoseconds. Kineto writes ``ts`` as float microseconds (with fractional
nanoseconds) relative to ``baseTimeNanoseconds``; we parse the decimal text exactly and store
``ts_ns = baseTimeNanoseconds + ts_us * 1000``: epoch nanoseconds when the trace has a base,
the profiler's own clock otherwise. Never rounded to microseconds.

>>> arrow_schema(EVENT_COLUMNS).field("ts_ns").type
DataType(int64)
>>> "kernel" in KINDS
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import polars as pl

from traceview._dependencies import lazy_module

#: Imported when an Arrow schema or table is built (writing a store, parsing): a run read from
#: the cache reads Parquet through Polars and needs none of it (pyarrow and the numpy it imports
#: cost ~0.15-0.25 s of every command's start; docs/performance.md, log 41).
pa = lazy_module("pyarrow")

#: Bump when a column is added, removed or changes meaning. Stored in Parquet metadata; a cache
#: written under another version is never served. 3: ``step`` is int64 (was int32: the
#: profiler's step counter is not bounded, and ``ProfilerStep#4294967296`` failed the ingest).
SCHEMA_VERSION = 3

#: The kinds of event. Every stored event has exactly one.
KINDS: tuple[str, ...] = (
    "cpu_op",  # an operator (aten::*, record_param_comms, c10d ops, ...)
    "user_annotation",  # record_function ranges, including ProfilerStep#N
    "python_function",  # python stack tracing (with_stack)
    "kernel",  # a GPU kernel (CUDA, HIP, Triton, NCCL/RCCL)
    "memcpy",  # a GPU memory copy
    "memset",  # a GPU memory set
    "gpu_user_annotation",  # record_function ranges projected onto a GPU stream
    "cuda_runtime",  # CUDA / HIP runtime API call on the host
    "cuda_driver",  # CUDA driver API call on the host
    "sync",  # a synchronisation (cuda_sync in Kineto, SYNCHRONIZATION in nsys)
    "nvtx",  # an NVTX range or mark (nsys)
    "instant",  # an instant event (ph i/I)
    "counter",  # a counter sample (ph C)
    "memory",  # an allocator event from profile_memory ([memory])
    "flow",  # one end of a flow arrow (ph s/t/f): ac2g launch->kernel, fwdbwd, ...
    "metadata",  # ph M: process/thread names and sort indices
    "trace_span",  # profiler bookkeeping spans (cat Trace)
    "os_runtime",  # OS runtime call (nsys OSRT_API, off by default)
    "other",  # anything else; its category is kept
)

SOURCES: tuple[str, ...] = ("kineto", "nsys")

# Kind groups: every module that asks "is this GPU work?" or "is this a launch?" uses these.

#: GPU work: what occupies a GPU (split by the analyses into compute, comm, copies and sets).
GPU_KINDS: tuple[str, ...] = ("kernel", "memcpy", "memset")
#: Everything recorded on a GPU stream: the work, and record_function ranges projected onto it.
#: Parsers keep ``device`` and ``stream`` for these; they take their step through their launch.
GPU_STREAM_KINDS: tuple[str, ...] = (*GPU_KINDS, "gpu_user_annotation")
#: Host-side calls that launch GPU work (matched to it by ``correlation``).
RUNTIME_KINDS: tuple[str, ...] = ("cuda_runtime", "cuda_driver")

# Other accelerators. Kineto writes their activities under categories of their own, which the
# parsers store as they are (kind ``other``, category kept), so stored tables do not change;
# the analyses read these categories through the groups below.

#: Device work of other accelerators (Meta MTIA's command processor events): counted as
#: device kernels (``dma*`` names as copies; see ``ACCELERATOR_DEVICE_WAITS``).
ACCELERATOR_DEVICE_CATEGORIES: tuple[str, ...] = ("mtia_ccp_events",)
#: Names of device-side event records and waits in those categories: a stream marking or
#: waiting on an event, not work (as ``cudaStreamWaitEvent`` is no kernel).
ACCELERATOR_DEVICE_WAITS: tuple[str, ...] = ("event_record", "event_wait")
#: Host-side runtime and driver calls of other accelerators (MTIA, Intel XPU, PrivateUse1
#: backends): launches like ``cuda_runtime``, matched to their device work by correlation.
ACCELERATOR_RUNTIME_CATEGORIES: tuple[str, ...] = (
    "mtia_runtime", "xpu_runtime", "privateuse1_runtime", "privateuse1_driver")

# The step.

#: A step marker's name: Kineto's ``ProfilerStep#N`` record_function ranges (and NVTX ranges of
#: that name in nsys); group 1 is the step number. A number beyond int64 (the column's type) is no
#: step: its marker is passed over with a warning (``traceview.store.steps``).
STEP_PATTERN = r"^ProfilerStep#(\d+)$"
#: Host-side kinds whose ranges can be step markers.
STEP_MARKER_KINDS: tuple[str, ...] = ("user_annotation", "cpu_op", "nvtx", "python_function")


@dataclass(frozen=True)
class Column:
    """One column of a table: the single place its meaning is written down."""

    name: str
    #: the Arrow type as pyarrow writes it (``str(pa.int64())``: "int64"); ``type`` builds it
    arrow: str
    unit: str
    meaning: str
    kineto: str = ""
    nsys: str = ""
    nullable: bool = True

    @property
    def type(self) -> pa.DataType:
        """The Arrow type."""
        return _ARROW_TYPES[self.arrow]()

    @property
    def polars_type(self) -> pl.DataType:
        """The Polars type the Arrow type converts to (a dictionary of strings: Categorical)."""
        return _POLARS_TYPES[self.arrow]


_dict_str = "dictionary<values=string, indices=int32, ordered=0>"

#: Every type a column has, spelt as pyarrow prints it: how to build it in Arrow, and what
#: Polars makes of it (``pl.from_arrow``; tests/test_schema.py checks the two agree).
_ARROW_TYPES = {"int32": lambda: pa.int32(), "int64": lambda: pa.int64(),
                "string": lambda: pa.string(), "large_string": lambda: pa.large_string(),
                _dict_str: lambda: pa.dictionary(pa.int32(), pa.string())}
_POLARS_TYPES = {"int32": pl.Int32(), "int64": pl.Int64(), "string": pl.String(),
                 "large_string": pl.String(), _dict_str: pl.Categorical()}

EVENT_COLUMNS: tuple[Column, ...] = (
    Column("rank", "int32", "", "global rank of the process that recorded the event",
           "distributedInfo.rank, else file name", "process -> rank mapping", nullable=False),
    Column("file_id", "int32", "", "index of the input file in the files table",
           nullable=False),
    Column("source", _dict_str, "", "source format: kineto or nsys", nullable=False),
    Column("kind", _dict_str, "", "event kind, one of schema.KINDS", "from ph and cat",
           "from the table", nullable=False),
    Column("name", _dict_str, "", "event name (kernel name, op name, API name)", "name",
           "StringIds via shortName/demangledName/nameId/text"),
    Column("category", _dict_str, "", "category as written by the source", "cat",
           "the table name"),
    Column("pid", "int64", "", "process id (or device id for Kineto GPU rows)", "pid",
           "from globalPid / globalTid"),
    Column("tid", "int64", "", "thread id (or stream id for Kineto GPU rows)", "tid",
           "from globalTid"),
    Column("pid_label", _dict_str, "", "pid when the source wrote a non-integer", "pid"),
    Column("tid_label", _dict_str, "", "tid when the source wrote a non-integer", "tid"),
    Column("device", "int32", "", "GPU device index for GPU events", "args.device",
           "deviceId"),
    Column("stream", "int64", "", "GPU stream id for GPU events", "args.stream", "streamId"),
    Column("ts_ns", "int64", "ns", "start time, exact; epoch ns when the source has a base",
           "baseTimeNanoseconds + ts*1000", "start (+ session start)", nullable=False),
    Column("dur_ns", "int64", "ns", "duration; null for instants", "dur*1000", "end - start"),
    Column("correlation", "int64", "", "launch <-> GPU activity correlation id",
           "args.correlation", "correlationId"),
    Column("external_id", "int64", "", "Kineto external id (CPU op <-> runtime call)",
           "args['External id']"),
    Column("flow_id", "int64", "", "flow arrow id (ph s/t/f)", "id"),
    Column("flow_phase", _dict_str, "", "s (start), t (step) or f (finish)", "ph"),
    Column("step", "int64", "", "profiler step the event belongs to (GPU events through "
           "their launching runtime call)", "ProfilerStep#N containment", "NVTX step ranges"),
    Column("collective", _dict_str, "", "normalised collective name (all_reduce, all_gather, "
           "reduce_scatter, all_to_all, broadcast, reduce, send, recv, barrier, ...)",
           "args['Collective name'] or NCCL kernel name", "NCCL NVTX payload"),
    Column("pg_name", _dict_str, "", "process group name", "args['Process Group Name']"),
    Column("pg_desc", _dict_str, "", "process group description",
           "args['Process Group Description']"),
    Column("pg_ranks", _dict_str, "", "ranks of the process group, as written ('[0, 1]')",
           "args['Process Group Ranks']"),
    Column("seq", "int64", "", "collective sequence number within its process group",
           "args['Seq']"),
    Column("in_nelems", "int64", "elements", "input message elements",
           "args['In msg nelems']"),
    Column("out_nelems", "int64", "elements", "output message elements",
           "args['Out msg nelems']"),
    Column("dtype", _dict_str, "", "element type of a collective or op", "args.dtype"),
    Column("group_size", "int32", "ranks", "process group size", "args['Group size']"),
    Column("bytes", "int64", "bytes", "bytes copied/set (memcpy, memset) or the collective's "
           "message size (max(in, out) elements x dtype size)", "args.bytes / nelems x dtype",
           "bytes"),
    Column("copy_kind", _dict_str, "", "memcpy direction: HtoD, DtoH, DtoD, HtoH, PtoP",
           "memcpy name", "copyKind"),
    Column("flops", "int64", "FLOP", "floating point operations of the op (with_flops)",
           "args.flops"),
    Column("mem_bytes", "int64", "bytes", "allocation (+) or free (-) size", "args.Bytes"),
    Column("mem_total_allocated", "int64", "bytes", "allocator total allocated after the "
           "event", "args['Total Allocated']"),
    Column("mem_total_reserved", "int64", "bytes", "allocator total reserved after the "
           "event", "args['Total Reserved']"),
    Column("args_json", "large_string", "", "the event's complete args object as JSON text "
           "(lossless: nothing the columns do not take is lost)", "args", "extra columns"),
)

#: Kineto ``args`` keys read into columns: column -> its keys, the current spelling first; older
#: Kineto spellings fill the rows it leaves empty. ``collective_name`` and ``mem_device`` are read
#: but not stored: ``collective`` and a memory event's ``device`` are derived from them. Each
#: stored column's ``kineto`` source above names its first key. The C scanner has its own copy
#: (``ARG_KEYS`` in parsers/kineto/_scan.c); tests/test_kineto_args.py checks the three agree.
KINETO_ARGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "external_id": ("External id", "external id"),
    "correlation": ("correlation",),
    "device": ("device",),
    "stream": ("stream",),
    "collective_name": ("Collective name",),
    "pg_name": ("Process Group Name",),
    "pg_desc": ("Process Group Description",),
    "pg_ranks": ("Process Group Ranks",),
    "seq": ("Seq", "seq"),
    "in_nelems": ("In msg nelems",),
    "out_nelems": ("Out msg nelems",),
    "dtype": ("dtype",),
    "group_size": ("Group size",),
    "bytes": ("bytes",),
    "flops": ("flops",),
    "mem_bytes": ("Bytes",),
    "mem_total_allocated": ("Total Allocated",),
    "mem_total_reserved": ("Total Reserved",),
    "mem_device": ("Device Id",),
})
#: The ``KINETO_ARGS`` read as text; the others are read as integers.
KINETO_TEXT_ARGS: frozenset[str] = frozenset(
    {"collective_name", "pg_name", "pg_desc", "pg_ranks", "dtype"})

RANK_COLUMNS: tuple[Column, ...] = (
    Column("rank", "int32", "", "global rank", nullable=False),
    Column("file_id", "int32", "", "file the rank was read from", nullable=False),
    Column("world_size", "int32", "ranks", "world size the trace claims"),
    Column("host", "string", "", "host name when recorded"),
    Column("devices", "string", "", "device names, JSON list"),
    Column("backend", "string", "", "distributed backend (nccl, gloo, ...)"),
    Column("clock_base_ns", "int64", "ns", "baseTimeNanoseconds added to every ts"),
    Column("source", "string", "", "kineto or nsys", nullable=False),
    Column("rank_from", "string", "", "where the rank came from: distributedInfo, "
           "file name, mapping, default"),
    Column("pg_config", "string", "", "process groups as written, JSON"),
    Column("device_memory", "string", "bytes", "each device's memory, JSON {device id: "
           "bytes}", "deviceProperties[].totalGlobalMem", "TARGET_INFO_GPU.totalMemory"),
)

FILE_COLUMNS: tuple[Column, ...] = (
    Column("file_id", "int32", "", "index of the file", nullable=False),
    Column("path", "string", "", "path as given", nullable=False),
    Column("format", "string", "", "kineto-json, kineto-json-gz, nsys-sqlite", nullable=False),
    Column("size_bytes", "int64", "bytes", "size on disk", nullable=False),
    Column("content_id", "string", "", "content identity used as the cache key",
           nullable=False),
    Column("input_events", "int64", "events", "entries in the input", nullable=False),
    Column("stored_events", "int64", "events", "rows stored", nullable=False),
    Column("dropped", "string", "", "JSON map reason -> count; input = stored + sum"),
    Column("warnings", "string", "", "JSON list of warnings raised while reading"),
)


def arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema of a column declaration."""
    return pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in columns])


#: The Arrow schemas, built on first use (``schema.EVENTS_ARROW``), so that importing the
#: vocabulary does not import pyarrow.
_ARROW_SCHEMAS = {
    "EVENTS_ARROW": lambda: arrow_schema(EVENT_COLUMNS).with_metadata(
        {"traceview.schema_version": str(SCHEMA_VERSION)}),
    "RANKS_ARROW": lambda: arrow_schema(RANK_COLUMNS),
    "FILES_ARROW": lambda: arrow_schema(FILE_COLUMNS),
}
EVENT_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in EVENT_COLUMNS)


def __getattr__(name: str) -> object:
    build = _ARROW_SCHEMAS.get(name)
    if build is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value = build()  # built once
    return value


def polars_schema(columns: tuple[Column, ...] = EVENT_COLUMNS) -> pl.Schema:
    """The Polars schema of a column declaration (dictionary strings become Categorical), as
    ``pl.from_arrow`` gives it, without building the Arrow one."""
    return pl.Schema([(c.name, c.polars_type) for c in columns])


def empty_events():  # -> pl.DataFrame
    """An events frame with no rows and every column typed."""
    return pl.DataFrame(schema=polars_schema())


def events_frame(rows: list[dict]):  # -> pl.DataFrame
    """Build a typed events frame from a few dicts; missing columns are null.

    Meant for hand-built test traces and examples, not for parsers' hot paths.

    >>> events_frame([{"rank": 0, "file_id": 0, "source": "kineto", "kind": "kernel",
    ...                "name": "k", "ts_ns": 10, "dur_ns": 5}]).select("ts_ns", "dur_ns").row(0)
    (10, 5)
    """
    columns = {c.name: [row.get(c.name) for row in rows] for c in EVENT_COLUMNS}
    table = pa.table(
        {c.name: pa.array(columns[c.name], type=_plain(c.type)) for c in EVENT_COLUMNS}
    )
    return pl.from_arrow(conform(table))


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def conform(table: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
    """Cast a table to ``schema`` (default: the events'): missing columns become null, extra
    columns are an error."""
    schema = __getattr__("EVENTS_ARROW") if schema is None else schema
    extra = set(table.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"columns not in the schema: {sorted(extra)}")
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def markdown() -> str:
    """``docs/schema.md``, rendered from the declarations above."""
    out = [
        "# Event store schema",
        "",
        f"Schema version {SCHEMA_VERSION}. Generated from `traceview/schema.py` by "
        "`python -m traceview.schema > docs/schema.md`; do not edit by hand.",
        "",
        "Times are exact int64 nanoseconds. Kineto `ts` (float microseconds, relative to "
        "`baseTimeNanoseconds` when present) is parsed from its decimal text, never through a "
        "float, so sub-microsecond digits survive.",
        "",
        "Event kinds: " + ", ".join(f"`{k}`" for k in KINDS) + ".",
        "",
    ]
    for title, cols in (("events", EVENT_COLUMNS), ("ranks", RANK_COLUMNS),
                        ("files", FILE_COLUMNS)):
        out += [f"## {title}", "", "| column | type | unit | meaning | Kineto | nsys |",
                "|---|---|---|---|---|---|"]
        for c in cols:
            typ = str(c.type) + ("" if c.nullable else ", not null")
            out.append(f"| `{c.name}` | {typ} | {c.unit} | {c.meaning} | {c.kineto} | {c.nsys} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
