"""NCCL debug logs (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,COLL``) -> tables.

Lines look like ``<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <message>``; the prefix may be
missing (the short form quoted in course notes). What is read:

* **calls** (``NCCL_DEBUG_SUBSYS=COLL``): ``AllReduce: opCount 139d sendbuff 0x.. recvbuff 0x..
  count 7382228 datatype 7 op 0 root 0 comm 0x.. [nranks=128] stream 0x..``. ``opCount`` is
  hexadecimal; ``count`` is elements, so ``bytes = count x sizeof(datatype)``. The older short
  form ``AllReduce: opCount 42 bytes 104857600 datatype 7 op 0`` gives bytes directly.
* **comms** (``INIT``): ``comm 0x.. rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 1b000 commId
  0x.. - Init COMPLETE`` (also the older ``ncclCommInitRank comm 0x.. rank ..`` form): the rank of
  each (host, pid, comm). The process's global ``rank`` is its rank in its largest communicator.
* **choices** (``NCCL_DEBUG_SUBSYS=TUNING``, rank 0 only; also TRACE-level COLL): the algorithm
  and protocol NCCL picked for a call, ``AllReduce: 4096 Bytes -> Algo Tree proto LL
  channel{Lo..Hi}={0..1}`` (NCCL 2.20 and later: names) or ``37756928 Bytes -> Algo 1 proto 2
  time 2860.208008`` (older: ``ALGORITHMS`` / ``PROTOCOLS`` codes, the collective name
  sometimes missing). Names are kept upper case: ``RING``, ``TREE``, ``NVLS``; ``LL``,
  ``LL128``, ``SIMPLE``.
* **topology**: ``Ring 00 : 0 -> 1 -> 2 -> 3 -> 0`` (older NCCL), ``Channel 00/02 :  0 1 2 3``
  (ring order, newer NCCL), and connections ``Channel 00/08 : 0[0] -> 1[1] via P2P/CUMEM``
  (also ``[send]``/``[receive]`` over ``NET/IB/0``, ``SHM``, ``P2P/IPC``).

Calls carry ``rank`` and ``order`` (position among the calls of that rank and comm), so they join
with trace collectives by rank and order; :func:`match_trace` finds the offset between a log
(all calls of the run) and a trace (the profiled window only) from the sequence of collective
names.

>>> log = parse_text("h:7:9 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\\n"
...                  "h:7:9 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x1 recvbuff 0x2 count 10 "
...                  "datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x3")
>>> log.calls.select("rank", "collective", "op_count", "bytes", "reduction").rows()
[(0, 'all_reduce', 31, 40, 'sum')]
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceview._dependencies import lazy_module
from traceview.errors import UnreadableTraceError
from traceview.parsers._files import file_problem

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

#: ncclDataType_t codes -> (name, bytes per element).
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
    9: ("bfloat16", 2), 10: ("float8_e4m3", 1), 11: ("float8_e5m2", 1),
}
#: ncclRedOp_t codes (user-defined PreMulSum ops have larger codes: left null).
REDUCTIONS: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
#: ncclAlgo codes (the older "Algo 1 proto 2" lines) -> names, in NCCL's enum order.
ALGORITHMS: dict[int, str] = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN",
                              4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
#: ncclProto codes -> names.
PROTOCOLS: dict[int, str] = {0: "LL", 1: "LL128", 2: "SIMPLE"}
#: NCCL call names -> traceview's normalised collective names.
COLLECTIVES: dict[str, str] = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Bcast": "broadcast", "Reduce": "reduce", "AllToAll": "all_to_all",
    "Send": "send", "Recv": "recv", "Gather": "gather", "Scatter": "scatter",
}

_PREFIX = (r"^(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] )?"
           r"NCCL (?P<level>INFO|WARN|TRACE) (?P<msg>.*?)\s*$")
_CALL = r"^(?P<name>" + "|".join(COLLECTIVES) + r"): opCount (?P<opcount>[0-9a-fA-F]+)\b"
_COMM = r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<crank>\d+) nranks (?P<cnranks>\d+)"
_CHOICE = (r"^(?:(?P<name>" + "|".join(COLLECTIVES) + r"):\s*)?(?P<nbytes>\d+) Bytes -> "
           r"Algo (?P<algo>\w+) proto (?P<proto>\w+)"
           r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?(?: time (?P<time>[-\d.]+))?")
_RING = r"^Ring (?P<ch>\d+) : (?P<ring>\d+(?: -> \d+)+)$"
_ORDER = r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :(?P<ring>(?:\s+\d+)+)$"
_CONN = (r"^Channel (?P<ch>\d+)(?:/(?P<nch>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-fA-F]+)\] -> "
         r"(?P<dst>\d+)\[(?P<dstdev>[0-9a-fA-F]+)\](?: \[(?P<dir>send|receive)\])? via "
         r"(?P<via>\S+)")

CALL_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64, "host": pl.String, "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int32,
    "rank": pl.Int32, "comm_rank": pl.Int32, "comm": pl.String, "nranks": pl.Int32,
    "nccl_name": pl.String, "collective": pl.String, "op_count": pl.Int64, "count": pl.Int64,
    "datatype": pl.Int32, "dtype": pl.String, "bytes": pl.Int64, "op": pl.Int32,
    "reduction": pl.String, "root": pl.Int32, "stream": pl.String, "order": pl.Int64,
}
COMM_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64, "host": pl.String, "pid": pl.Int64, "device": pl.Int32,
    "comm": pl.String, "comm_rank": pl.Int32, "nranks": pl.Int32, "rank": pl.Int32,
    "bus_id": pl.String, "comm_id": pl.String,
}
CHOICE_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64, "host": pl.String, "pid": pl.Int64, "device": pl.Int32, "rank": pl.Int32,
    "nccl_name": pl.String, "collective": pl.String, "bytes": pl.Int64, "algorithm": pl.String,
    "protocol": pl.String, "channel_lo": pl.Int32, "channel_hi": pl.Int32,
    "time_us": pl.Float64,
}
TOPOLOGY_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64, "host": pl.String, "pid": pl.Int64, "device": pl.Int32,
    "rank": pl.Int32, "kind": pl.String, "channel": pl.Int32, "channels": pl.Int32,
    "ring": pl.String, "src": pl.Int32, "src_dev": pl.String, "dst": pl.Int32,
    "dst_dev": pl.String, "direction": pl.String, "transport": pl.String, "via": pl.String,
}


@dataclass(frozen=True)
class NcclLog:
    """``calls`` (one row per collective call), ``comms`` (communicator inits), ``topology``,
    ``choices`` (the algorithm and protocol chosen per call, where the log says)."""

    calls: pl.DataFrame
    comms: pl.DataFrame
    topology: pl.DataFrame
    choices: pl.DataFrame = dataclasses.field(
        default_factory=lambda: pl.DataFrame(schema=CHOICE_SCHEMA))


def _kv_int(msg: pl.Expr, key: str) -> pl.Expr:
    return msg.str.extract(rf"\b{key} (-?\d+)\b").cast(pl.Int64, strict=False)


def _lines(lines: list[str], numbers: list[int]) -> pl.DataFrame:
    df = pl.DataFrame([pl.Series("line", numbers, dtype=pl.Int64),
                       pl.Series("text", lines, dtype=pl.String)])
    pre = pl.col("text").str.extract_groups(_PREFIX)
    return df.with_columns(pre.alias("p")).unnest("p").filter(pl.col("msg").is_not_null()).select(
        "line", "host", pl.col("pid").cast(pl.Int64, strict=False),
        pl.col("tid").cast(pl.Int64, strict=False),
        device=pl.col("dev").cast(pl.Int32, strict=False), msg=pl.col("msg"))


def parse_text(text: str) -> NcclLog:
    """Parse the text of one or more NCCL logs (lines of many processes may interleave)."""
    lines = text.splitlines()
    return _parse_lines(lines, list(range(1, len(lines) + 1)))


def _parse_lines(lines: list[str], numbers: list[int]) -> NcclLog:
    """The tables of log ``lines``, each with its line number."""
    return _assembled([_extracted(lines, numbers)])


def _extracted(lines: list[str], numbers: list[int]) -> dict[str, pl.DataFrame]:
    """What each kind of line of a batch of log ``lines`` says, as small tables (the text
    is dropped): the calls, the communicators, the topology and the algorithm choices,
    before they are joined with each other (:func:`_assembled`)."""
    df = _lines(lines, numbers)
    msg = pl.col("msg")
    comms = (
        df.filter(msg.str.contains(_COMM) & msg.str.contains("Init COMPLETE"))
        .with_columns(msg.str.extract_groups(_COMM).alias("c")).unnest("c")
        .select("line", "host", "pid", "device", "comm",
                comm_rank=pl.col("crank").cast(pl.Int32, strict=False),
                nranks=pl.col("cnranks").cast(pl.Int32, strict=False),
                bus_id=msg.str.extract(r"busId ([0-9a-fA-F]+)"),
                comm_id=msg.str.extract(r"commId (0x[0-9a-fA-F]+)"))
    )
    call = msg.str.extract_groups(_CALL)
    calls = (
        df.filter(msg.str.contains(_CALL))
        .with_columns(call.alias("c")).unnest("c")
        .with_columns(
            comm=msg.str.extract(r"\bcomm (0x[0-9a-fA-F]+)"),
            count=_kv_int(msg, "count"),
            logged_bytes=_kv_int(msg, "bytes"),
            datatype=_kv_int(msg, "datatype").cast(pl.Int32, strict=False),
            op=_kv_int(msg, "op").cast(pl.Int32, strict=False),
            root=_kv_int(msg, "root").cast(pl.Int32, strict=False),
            nranks=msg.str.extract(r"\[nranks=(\d+)\]").cast(pl.Int32, strict=False),
            stream=msg.str.extract(r"\bstream (0x[0-9a-fA-F]+)"),
            op_count=pl.col("opcount").str.to_integer(base=16, strict=False),
        )
        .drop("msg", "opcount")
    )
    return {"comms": comms, "calls": calls, "topology": _topology(df),
            "choices": _choices(df)}


def _assembled(parts: list[dict[str, pl.DataFrame]]) -> NcclLog:
    """The log's tables from the batches' :func:`_extracted` tables: each call with its
    communicator's rank and size and its process's global rank, numbered per communicator."""
    def joined(kind: str) -> pl.DataFrame:
        return pl.concat([p[kind] for p in parts], how="diagonal_relaxed", rechunk=False)

    comms = joined("comms")
    # the calls in one query (each step a copy of the largest table otherwise)
    calls = pl.concat([p["calls"].lazy() for p in parts], how="diagonal_relaxed")
    for p in parts:
        p["calls"] = p["calls"].clear()
    # The process's global rank: its rank in its largest communicator.
    proc_rank = (comms.sort("nranks", "line", descending=[True, False])
                 .group_by("host", "pid", maintain_order=True)
                 .agg(rank=pl.col("comm_rank").first()))
    comms = comms.join(proc_rank, on=["host", "pid"], how="left", nulls_equal=True)
    size = pl.col("datatype").replace_strict({k: v[1] for k, v in DATATYPES.items()},
                                             default=None, return_dtype=pl.Int64)
    calls = calls.with_columns(
        nccl_name=pl.col("name"),
        collective=pl.col("name").replace_strict(COLLECTIVES, return_dtype=pl.String),
        dtype=pl.col("datatype").replace_strict({k: v[0] for k, v in DATATYPES.items()},
                                                default=None, return_dtype=pl.String),
        bytes=pl.coalesce(pl.col("logged_bytes"), pl.col("count") * size),
        reduction=pl.col("op").replace_strict(REDUCTIONS, default=None,
                                              return_dtype=pl.String),
    )
    per_comm = comms.select("host", "pid", "comm", "comm_rank", cnr="nranks").unique(
        ["host", "pid", "comm"], keep="first")
    # the lines are read in order: joins that keep it need no sort
    calls = (calls.join(per_comm.lazy(), on=["host", "pid", "comm"], how="left",
                        nulls_equal=True, maintain_order="left")
             .join(proc_rank.lazy(), on=["host", "pid"], how="left", nulls_equal=True,
                   maintain_order="left")
             .with_columns(nranks=pl.coalesce("nranks", "cnr"))
             .with_columns(order=pl.int_range(pl.len()).over("host", "pid", "comm")
                           .cast(pl.Int64, strict=False))
             .select(list(CALL_SCHEMA)).cast(CALL_SCHEMA).collect())
    topo = joined("topology").join(proc_rank, on=["host", "pid"], how="left",
                                   nulls_equal=True)
    choices = joined("choices").join(proc_rank, on=["host", "pid"], how="left",
                                     nulls_equal=True)
    return NcclLog(
        calls=calls,
        comms=comms.select(list(COMM_SCHEMA)).cast(COMM_SCHEMA),
        topology=topo.select(list(TOPOLOGY_SCHEMA)).cast(TOPOLOGY_SCHEMA).sort("line"),
        choices=choices.select(list(CHOICE_SCHEMA)).cast(CHOICE_SCHEMA).sort("line"),
    )


def _named(code: pl.Expr, names: dict[int, str]) -> pl.Expr:
    """An algorithm or protocol as its upper-case name, whether logged as a name or a code."""
    as_code = code.cast(pl.Int64, strict=False).replace_strict(names, default=None,
                                                               return_dtype=pl.String)
    return pl.when(code.str.contains(r"^\d+$")).then(as_code).otherwise(code.str.to_uppercase())


def _choices(df: pl.DataFrame) -> pl.DataFrame:
    msg = pl.col("msg")
    return (df.filter(msg.str.contains(_CHOICE))
            .with_columns(msg.str.extract_groups(_CHOICE).alias("g")).unnest("g")
            .select("line", "host", "pid", "device", nccl_name="name",
                    collective=pl.col("name").replace_strict(COLLECTIVES, default=None,
                                                             return_dtype=pl.String),
                    bytes=pl.col("nbytes").cast(pl.Int64, strict=False),
                    algorithm=_named(pl.col("algo"), ALGORITHMS),
                    protocol=_named(pl.col("proto"), PROTOCOLS),
                    channel_lo=pl.col("lo").cast(pl.Int32, strict=False), channel_hi=pl.col("hi").cast(pl.Int32, strict=False),
                    time_us=pl.col("time").cast(pl.Float64, strict=False)))


def _topology(df: pl.DataFrame) -> pl.DataFrame:
    msg = pl.col("msg")
    base = ["line", "host", "pid", "device"]
    rings = (df.filter(msg.str.contains(_RING)).with_columns(msg.str.extract_groups(_RING)
                                                            .alias("g")).unnest("g")
             .select(*base, kind=pl.lit("ring"), channel=pl.col("ch").cast(pl.Int32, strict=False),
                     ring=pl.col("ring").str.replace_all(" -> ", " ")))
    orders = (df.filter(msg.str.contains(_ORDER)).with_columns(msg.str.extract_groups(_ORDER)
                                                              .alias("g")).unnest("g")
              .select(*base, kind=pl.lit("ring"), channel=pl.col("ch").cast(pl.Int32, strict=False),
                      channels=pl.col("nch").cast(pl.Int32, strict=False),
                      ring=pl.col("ring").str.strip_chars().str.replace_all(r"\s+", " ")))
    conns = (df.filter(msg.str.contains(_CONN)).with_columns(msg.str.extract_groups(_CONN)
                                                            .alias("g")).unnest("g")
             .select(*base, kind=pl.lit("connection"), channel=pl.col("ch").cast(pl.Int32, strict=False),
                     channels=pl.col("nch").cast(pl.Int32, strict=False),
                     src=pl.col("src").cast(pl.Int32, strict=False), src_dev="srcdev",
                     dst=pl.col("dst").cast(pl.Int32, strict=False), dst_dev="dstdev", direction="dir",
                     via="via", transport=pl.col("via").str.extract(r"^([^/]+)")))
    return pl.concat([rings, orders, conns], how="diagonal_relaxed")


#: Bounds on what a log may ask of memory: a line longer than this is no NCCL line (it is
#: passed over), and a read keeps at most this many NCCL lines, all files together. Read a
#: batch at a time (``BATCH_LINES``), a call line costs ~0.45 KB at the peak of the parse
#: and ~0.12 KB kept (3 M lines: 1.3 GB; all in one batch, 2.6 GB): the bound keeps a log's
#: parse within ~4 GB (docs/formats.md, *Bounds*).
MAX_LINE_BYTES = 64 << 10
MAX_NCCL_LINES = 8_000_000


def parse(paths: str | os.PathLike[str] | list[str | os.PathLike[str]]) -> NcclLog:
    """Parse NCCL log files (``NCCL_DEBUG_FILE=nccl_%h_%p.log`` writes one per process).

    Lines are numbered across the files in the order given. Invalid UTF-8 is replaced. The
    files are read a line at a time and only NCCL lines are kept (bounded:
    :data:`MAX_LINE_BYTES`, :data:`MAX_NCCL_LINES`), so a huge log costs what its NCCL lines
    do; more NCCL lines than that is an ``UnreadableTraceError`` naming the file.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for p in items:  # before opening: a FIFO would block the open, /dev/zero never end
        if problem := file_problem(p):
            raise UnreadableTraceError(p, problem)
    batch = _Batches()
    line = 0
    for item in items:
        line = _read_nccl_lines(Path(item), line, batch)
    batch.flush()
    return _assembled(batch.parts)


#: NCCL lines read before their text is turned into tables (and let go): the text of a
#: batch costs ~0.6 KB a line while it is parsed, what it says ~0.1 KB.
BATCH_LINES = 200_000


class _Batches:
    """NCCL lines as they are read, turned into small tables a batch at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.numbers: list[int] = []
        self.parts: list[dict[str, pl.DataFrame]] = []
        self.total = 0

    def add(self, text: str, number: int) -> None:
        self.lines.append(text)
        self.numbers.append(number)
        self.total += 1
        if len(self.lines) >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        if self.lines or not self.parts:
            self.parts.append(_extracted(self.lines, self.numbers))
        self.lines, self.numbers = [], []


def _read_nccl_lines(path: Path, line: int, kept: _Batches) -> int:
    """Add ``path``'s NCCL lines (and their numbers, counting on from ``line``) to
    ``kept``; the number of the file's last line."""
    with open(path, "rb") as fh:
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return line
            line += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while (rest := fh.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of an overlong line: no NCCL line is that long
                continue
            if b"NCCL " not in raw:
                continue
            if kept.total >= MAX_NCCL_LINES:
                raise UnreadableTraceError(path, f"more than {MAX_NCCL_LINES} NCCL lines")
            kept.add(raw.decode("utf-8", errors="replace").rstrip("\r\n"), line)


def match_trace(calls: pl.DataFrame, trace: pl.DataFrame) -> pl.DataFrame:
    """Pair each rank's logged calls with its trace collectives, in order.

    ``trace``: one row per collective call with ``rank``, ``collective`` and ``ts_ns`` (e.g.
    :func:`traceview.analyses.collective_match.comm_events` on GPU ranks). The log usually holds
    every call of the run and the trace only the profiled window, so for each rank the trace's
    sequence of collective names is slid along the log's and the offset with the most equal
    names wins (ties: the earliest). Returns the trace rows with ``log_order``, ``op_count``,
    ``count``, ``bytes_logged``, ``dtype``, ``comm`` and ``name_match`` (the names agree).
    Loops over ranks and offsets, never over calls.
    """
    out = []
    for (rank,), tr in trace.sort("ts_ns").group_by("rank", maintain_order=True):
        lg = calls.filter(pl.col("rank") == rank).sort("line")
        if lg.height == 0:
            continue
        vocab = {n: i for i, n in enumerate(sorted(set(lg["collective"].to_list())
                                                   | set(tr["collective"].to_list())))}
        a = np.array([vocab[n] for n in lg["collective"].to_list()])
        b = np.array([vocab[n] for n in tr["collective"].to_list()])
        best, best_lag = -1, 0
        for lag in range(-(len(b) - 1), len(a)):
            lo, hi = max(0, lag), min(len(a), lag + len(b))
            score = int((a[lo:hi] == b[lo - lag:hi - lag]).sum())
            if score > best:
                best, best_lag = score, lag
        tr = tr.with_row_index("_pos").with_columns(
            log_order=pl.col("_pos").cast(pl.Int64, strict=False) + best_lag)
        logged = lg.select(pl.int_range(pl.len()).cast(pl.Int64, strict=False).alias("log_order"),
                           "op_count", "count", pl.col("bytes").alias("bytes_logged"),
                           "dtype", "comm", log_collective="collective")
        joined = tr.join(logged, on="log_order", how="left").with_columns(
            name_match=pl.col("log_collective") == pl.col("collective")).drop("_pos")
        out.append(joined)
    if not out:
        return trace.head(0)
    return pl.concat(out, how="diagonal_relaxed")
