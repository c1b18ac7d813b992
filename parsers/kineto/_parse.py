"""The Kineto entry points, and the C scanner's columns handed over to Arrow.

:func:`parse_batched` reads the bytes (``_input``), scans them with the C scanner or, when it
declines, the tolerant reader (``_tolerant``), derives kind and exact times for every row, and
leaves the rest of each row to be built one batch at a time. :func:`parse` gathers the batches
into one table.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from traceview import schema
from traceview.naming import collective_from_text, copy_kind_from_name, dtype_bytes
from traceview.parsers import EventBatches, ParsedFile, RankInfo
from traceview.parsers.kineto._arrow_types import as_type, series_of, strings
from traceview.parsers.kineto._columns import RawColumns, Sparse, SparseText
from traceview.parsers.kineto._input import Input, open_input, read_bytes
from traceview.parsers.kineto._tolerant import ARG_FIELDS, as_int, read_events, table_of

try:  # the C fast path (_scan.c); without it (no compiler at install) the tolerant path does all
    from traceview.parsers.kineto import _scan as _kineto_scan
except ImportError:  # pragma: no cover - exercised by setting the module to None in tests
    _kineto_scan = None

# When the parser's output for the same input changes, bump ``PARSER_VERSIONS["kineto"]``
# (traceview.parsers): it is part of the cache key.

_CAT_TO_KIND: dict[str, str] = {
    "cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
    "python_function": "python_function", "kernel": "kernel", "gpu_memcpy": "memcpy",
    "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime", "cuda_driver": "cuda_driver", "cuda_sync": "sync",
    "trace": "trace_span",
}

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)


def parse(path: Path, **options: object) -> ParsedFile:
    """Read one Kineto trace file (``.json`` or ``.json.gz``) into one events table."""
    parsed = parse_batched(path, **options)
    parsed.events = parsed.events.table()
    return parsed


def parse_batched(path: Path, **_options: object) -> ParsedFile:
    """Read one Kineto trace file; its events come as :class:`EventBatches`.

    The scan covers the whole file (steps and timeless metadata depend on all of it), but only
    the key columns are derived for every row at once; the rest of each row is built one batch
    at a time, so the finished table is never whole in memory.
    """
    path = Path(path)
    warnings: list[str] = []
    dropped: dict[str, int] = {}
    with open_input(path, warnings, follow=_kineto_scan is not None) as given:
        fast = _scan_fast(path, given)
        if fast is not None:
            raw, header = fast
            input_events = raw.num_rows
        else:  # a failed scan may have released pages of a map: read the bytes anew
            data = read_bytes(path, warnings) if given.releasable else given.data
            table, header, input_events = read_events(path, data, warnings, dropped)
            raw = _raw_columns(table)
            del table
    base_ns = as_int(header.get("baseTimeNanoseconds")) or 0
    keys, raw = _key_frame(raw, base_ns, dropped, warnings)
    step_keys = keys.select(pl.lit(0, dtype=pl.Int32).alias("rank"), "kind", "name", "ts_ns",
                            "dur_ns", series_of(raw.full("correlation"), "correlation"))
    raw = raw.drop("ts_ns").drop("dur_ns")  # the key frame holds them (with the clock base)
    facts = _text_facts(raw)
    batches = EventBatches(keys.height, step_keys, partial(_batch, keys, raw, facts),
                           null_columns=_empty_columns(raw))
    return ParsedFile(
        path=str(path),
        format="kineto-json-gz" if path.name.endswith(".gz") else "kineto-json",
        events=batches,
        ranks=[_rank_info(path, header, base_ns, warnings)],
        input_events=input_events,
        dropped={k: v for k, v in dropped.items() if v},
        warnings=warnings,
    )


# --------------------------------------------------------------------------- decoding


_RAW_COLUMNS: dict[str, pa.DataType] = {
    "ph": pa.large_string(), "category": pa.large_string(), "name": pa.large_string(),
    "pid": pa.int64(), "pid_label": pa.large_string(), "tid": pa.int64(),
    "tid_label": pa.large_string(), "ts_ns": pa.int64(), "dur_ns": pa.int64(),
    "flow_id": pa.int64(), "args_json": pa.large_string(),
    **{attr: pa.large_string() if attr in ("collective_name", "pg_name", "pg_desc", "pg_ranks",
                                          "dtype") else pa.int64() for attr in ARG_FIELDS},
}


#: Text columns stored dictionary-encoded: the scanner interns them (COL_IS_DICT in
#: _scan.c), so each distinct name is held once, not once per event.
_REPEATING_TEXT = ("ph", "category", "name", "pid_label", "tid_label", "collective_name",
                   "pg_name", "pg_desc", "pg_ranks", "dtype")


def _scan_fast(path: Path, given: Input) -> tuple[RawColumns, dict[str, Any]] | None:
    """The C scanner over well-formed input; None sends the caller to the tolerant path."""
    if _kineto_scan is None:
        return None
    try:
        rows, columns = _kineto_scan.scan(given.data, 8 << 20, given.releasable,
                                          given.progress)
        if not columns["has_events"]:
            return None  # no event array: the tolerant path words the error
        header = {key: msgspec.json.decode(raw) for key, raw in columns["header"].items()}
    except (msgspec.DecodeError, ValueError):
        return None
    if header.get("nodes") is not None or columns["begin_end_events"]:
        return None  # an Execution Trace, or B/E pairs to match: the tolerant path does both
    raw: dict[str, pa.Array | Sparse | None] = {}
    for name, typ in _RAW_COLUMNS.items():
        column = raw[name] = _scanned_column(columns.pop(name), typ, rows)
        if column is None and name in _REPEATING_TEXT:
            raw[name] = pa.DictionaryArray.from_arrays(pa.nulls(rows, pa.int32()),
                                                       strings([]))
        elif typ == pa.large_string() and column is not None:
            try:  # invalid UTF-8: let the tolerant path repair it
                (column.dictionary if name in _REPEATING_TEXT else column).validate(full=True)
            except pa.ArrowInvalid:
                return None
    return RawColumns(rows, _sparse_text(raw, rows), _RAW_COLUMNS), header


#: Text columns that few events carry (labels, process-group fields, dtypes).
_RARE_TEXT = ("pid_label", "tid_label", "collective_name", "pg_name", "pg_desc", "pg_ranks",
              "dtype")


def _sparse_text(raw: dict[str, Any], rows: int) -> dict[str, Any]:
    """Rare text columns held as (row, index) pairs while the batches are built: a dense int32
    index per row for each was ~40 MB of a 300 MB trace's peak memory."""
    for name in _RARE_TEXT:
        column = raw[name]
        if column is not None and column.null_count * 8 >= rows * 7:
            raw[name] = SparseText.of(column)
    return raw


def _scanned_column(column: tuple | None, typ: pa.DataType,
                    rows: int) -> pa.Array | pa.ChunkedArray | Sparse | None:
    """One column of the C scanner (see col_to_py in _scan.c), without copying. Plain
    text and dense integers of a two-thread scan come as two chunks, one per thread."""
    if column is None:
        return None
    kind, *blocks = column
    if kind == "chunks":
        head_rows, *halves = blocks
        sizes = (head_rows, rows - head_rows)
        return pa.chunked_array([pa.nulls(n, typ) if half is None
                                 else _scanned_column(half, typ, n)
                                 for half, n in zip(halves, sizes, strict=True)], type=typ)
    buffers = [pa.foreign_buffer(address, size, base=owner) for address, size, owner in blocks]
    if kind == "sparse":
        return Sparse(np.frombuffer(buffers[0], dtype=np.uint32),
                      np.frombuffer(buffers[1], dtype=np.int64))
    if kind == "int":
        return pa.Array.from_buffers(typ, rows, [buffers[1], buffers[0]])
    if kind == "dict":  # the scanner interned the text: indices into the distinct values
        indices = pa.Array.from_buffers(pa.int32(), rows, [buffers[1], buffers[0]])
        entries = buffers[3].size // 8 - 1
        values = pa.Array.from_buffers(typ, entries, [None, buffers[3], buffers[2]])
        return pa.DictionaryArray.from_arrays(indices, values)
    return pa.Array.from_buffers(typ, rows, [buffers[2], buffers[1], buffers[0]])


def _raw_columns(table: pa.Table) -> RawColumns:
    """The tolerant path's dense columns in the scanner's form."""
    columns = {}
    for name, typ in _RAW_COLUMNS.items():
        column = table.column(name).combine_chunks().cast(typ)
        columns[name] = column.dictionary_encode() if name in _REPEATING_TEXT else column
    return RawColumns(table.num_rows, columns, _RAW_COLUMNS)


def _key_frame(raw: RawColumns, base_ns: int, dropped: dict[str, int],
               warnings: list[str]) -> tuple[pl.DataFrame, RawColumns]:
    """Kind, name, category and exact times of every row, and what cannot be stored counted.
    Returns them with the raw columns of the rows kept."""
    frame = pl.from_arrow(table_of({
        "kind": _kinds(raw.full("ph"), raw.full("category"), raw.full("name")),
        **{n: raw.full(n) for n in ("ph", "category", "name", "ts_ns", "dur_ns")}}))
    if base_ns:
        frame = frame.with_columns((pl.col("ts_ns") + base_ns).alias("ts_ns"))
    # Count with sums, never with filter(...).height: a filter copies every column.
    missing_ts, no_dur, negative = frame.select(
        (pl.col("ts_ns").is_null() & (pl.col("kind") != "metadata")).sum().alias("a"),
        (pl.col("dur_ns").is_null() & (pl.col("ph") == "X")).sum().alias("b"),
        (pl.col("dur_ns") < 0).sum().alias("c"),
    ).row(0)
    if missing_ts:
        dropped["missing_ts"] = dropped.get("missing_ts", 0) + missing_ts
    frame = _timeless_metadata(frame)
    if missing_ts:
        raw = raw.filter(frame.get_column("ts_ns").is_not_null().to_arrow())
        frame = frame.filter(pl.col("ts_ns").is_not_null())
    if no_dur:
        warnings.append(f"{no_dur} complete events without a duration (dur_ns left null)")
    if negative:
        warnings.append(f"{negative} events with a negative duration (dur_ns set to null)")
        frame = frame.with_columns(
            pl.when(pl.col("dur_ns") < 0).then(None).otherwise(pl.col("dur_ns")).alias("dur_ns"))
    return frame.drop("ph", "category"), raw  # the batches take these two from raw


def _kind_of(ph: pl.Expr, category: pl.Expr) -> pl.Expr:
    """The event kind from the phase and the category (instants named ``[memory]`` aside)."""
    return (
        pl.when(ph.is_in(["s", "t", "f"])).then(pl.lit("flow"))
        .when(ph == "M").then(pl.lit("metadata"))
        .when(ph == "C").then(pl.lit("counter"))
        .when(ph.is_in(["i", "I"])).then(pl.lit("instant"))
        .when(ph == "X").then(category.str.to_lowercase()
                              .replace_strict(_CAT_TO_KIND, default="other"))
        .otherwise(pl.lit("other"))
    )


def _codes(column: pa.DictionaryArray) -> np.ndarray:
    """Dictionary indices with null rows as one more code (``len(dictionary)``)."""
    # through Polars: pyarrow's to_numpy() imports pandas (~0.4 s per worker process)
    return series_of(column.indices).fill_null(len(column.dictionary)).to_numpy().astype(np.int64)


def _kinds(ph: pa.DictionaryArray, category: pa.DictionaryArray,
           name: pa.DictionaryArray) -> pa.DictionaryArray:
    """The kind of every row, worked out once per (ph, category) pair of dictionary entries
    (a few dozen pairs for millions of rows) and spread over the rows by their indices."""
    ph_values = ph.dictionary.to_pylist() + [None]
    cat_values = category.dictionary.to_pylist() + [None]
    pairs = pl.DataFrame({"ph": [p for p in ph_values for _ in cat_values],
                          "category": cat_values * len(ph_values)},
                         schema={"ph": pl.String, "category": pl.String})
    kinds = pairs.select(_kind_of(pl.col("ph"), pl.col("category")))[:, 0].to_list()
    names = sorted(set(kinds) | {"memory"})
    pair_code = np.array([names.index(k) for k in kinds], dtype=np.int32)
    code = pair_code[_codes(ph) * len(cat_values) + _codes(category)]
    memory = series_of(name.dictionary).eq("[memory]").arg_true()
    if len(memory):  # instants named [memory] are memory events
        is_memory = _codes(name) == memory[0]
        code[is_memory & (code == names.index("instant"))] = names.index("memory")
    indices = pa.Array.from_buffers(pa.int32(), len(code), [None, pa.py_buffer(code)])
    return pa.DictionaryArray.from_arrays(indices, strings(names))


def _text_facts(raw: RawColumns) -> dict[str, pl.DataFrame]:
    """What the text columns say, worked out once per distinct value (dictionary entry); rows
    look it up by their dictionary index. From the name: the collective of an NCCL/RCCL kernel
    or of a c10d/gloo/nccl/mpi op, the memcpy direction; from ``Collective name`` the
    collective; from ``dtype`` the element size."""
    def entries(column: str) -> pl.DataFrame:
        return series_of(raw.columns[column].dictionary, "v").to_frame()

    v = pl.col("v")
    return {
        "name": entries("name").select(
            pl.when(v.str.contains(r"(?i)nccl|rccl")).then(collective_from_text(v))
            .alias("kernel_collective"),
            pl.when(v.str.contains(r"(?i)^(nccl|gloo|c10d|mpi)[:_]"))
            .then(collective_from_text(v)).alias("op_collective"),
            copy_kind_from_name(v).alias("name_copy_kind")),
        "collective_name": entries("collective_name").select(
            collective_from_text(v).alias("arg_collective")),
        "dtype": entries("dtype").select(dtype_bytes(v).alias("dtype_bytes")),
    }


def _looked_up(facts: dict[str, pl.DataFrame], raw: RawColumns, start: int,
               stop: int) -> list[pl.DataFrame]:
    return [table.select(pl.all().gather(series_of(raw.slice(column, start, stop).indices)))
            for column, table in facts.items()]


#: Raw columns the derived columns are computed from.
_DERIVE_INPUTS = ("ph", "flow_id", "device", "mem_device", "stream", "collective_name",
                  "in_nelems", "out_nelems", "bytes")
#: Columns the batch builds (the others are stored as the scanner read them), in Polars types
#: that export as the schema's Arrow types without an Arrow cast (text as Categorical: a
#: dictionary, so ``as_type`` only narrows it).
_DERIVED: dict[str, pl.DataType] = {
    "flow_phase": pl.Categorical(), "flow_id": pl.Int64(), "device": pl.Int32(),
    "stream": pl.Int64(), "collective": pl.Categorical(), "copy_kind": pl.Categorical(),
    "bytes": pl.Int64(),
}


def _batch(keys: pl.DataFrame, raw: RawColumns, facts: dict[str, pl.DataFrame], start: int,
           stop: int) -> pa.Table:
    """Rows ``[start, stop)`` in the events schema (step left null). Only the derived columns
    go through Polars; the rest are the scanner's arrays, cast to the schema's types."""
    rows = stop - start
    key_rows = keys.slice(start, rows)
    inputs = pl.concat([
        key_rows.select("kind"),
        pl.from_arrow(table_of({n: raw.slice(n, start, stop) for n in _DERIVE_INPUTS})),
        *_looked_up(facts, raw, start, stop),
    ], how="horizontal")
    columns = {
        "rank": _constant_int32(rows, 0), "file_id": _constant_int32(rows, 0),
        "source": _constant_text(rows, "kineto"), "step": None,
        **{n: raw.slice(n, start, stop) for n in raw.columns if n in schema.EVENT_COLUMN_NAMES},
        **{n: key_rows.get_column(n).to_arrow() for n in ("kind", "ts_ns", "dur_ns")},
        **{n: c.to_arrow() for n, c in _derive(inputs).select(
            pl.col(n).cast(t) for n, t in _DERIVED.items()).to_dict().items()},
    }
    return pa.Table.from_arrays(
        [pa.nulls(rows, f.type) if columns[f.name] is None else as_type(columns[f.name], f.type)
         for f in schema.EVENTS_ARROW], schema=schema.EVENTS_ARROW)


def _empty_columns(raw: RawColumns) -> frozenset[str]:
    """The stored columns that the batches take from the scanner as they are (not derived)
    and that hold no value in any row: labels, memory or FLOP counters a trace never has."""
    as_scanned = (set(raw.columns) & set(schema.EVENT_COLUMN_NAMES)) - set(_DERIVED) - {
        "kind", "ts_ns", "dur_ns"}
    return frozenset(name for name in as_scanned if not raw.has_values(name))


def _constant_int32(rows: int, value: int) -> pa.Array:
    values = np.full(rows, value, dtype=np.int32)  # pa.array(numpy) would import pandas
    return pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(values)])


def _constant_text(rows: int, text: str) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(_constant_int32(rows, 0), strings([text]))


def _derive(frame: pl.DataFrame) -> pl.DataFrame:
    """Device, stream, flow and collective columns, as vectorised expressions."""
    is_gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset", "gpu_user_annotation"])
    collective = pl.coalesce(
        pl.col("arg_collective"),
        pl.when(pl.col("kind") == "kernel").then(pl.col("kernel_collective")),
        pl.when(pl.col("kind").is_in(["cpu_op", "user_annotation"])).then(
            pl.col("op_collective")),
        pl.when(pl.col("collective_name").is_not_null()).then(pl.lit("other")),
    )
    elements = pl.max_horizontal("in_nelems", "out_nelems")
    return (
        frame.with_columns(
            pl.when(pl.col("kind") == "flow").then(pl.col("ph")).alias("flow_phase"),
            pl.when(pl.col("kind") == "flow").then(pl.col("flow_id")).alias("flow_id"),
            pl.when(is_gpu).then(pl.col("device")).otherwise(
                pl.when(pl.col("kind") == "memory").then(pl.col("mem_device"))).alias("device"),
            pl.when(is_gpu).then(pl.col("stream")).alias("stream"),
            collective.alias("collective"),
            pl.when(pl.col("kind") == "memcpy").then(pl.col("name_copy_kind")).alias("copy_kind"),
        )
        .with_columns(
            pl.coalesce(
                pl.when(pl.col("kind").is_in(["memcpy", "memset"])).then(pl.col("bytes")),
                pl.when(pl.col("collective").is_not_null())
                .then(elements * pl.col("dtype_bytes")),
            ).alias("bytes"),
        )
    )


def _timeless_metadata(frame: pl.DataFrame) -> pl.DataFrame:
    """Metadata events may lack ``ts``; they are timeless, so pin them to the file's first time."""
    timeless = (pl.col("kind") == "metadata") & pl.col("ts_ns").is_null()
    if not frame.select(timeless.any()).item():
        return frame  # the usual case: no new column
    first = frame.select(pl.col("ts_ns").min()).item()
    return frame.with_columns(
        pl.when((pl.col("kind") == "metadata") & pl.col("ts_ns").is_null())
        .then(pl.lit(first if first is not None else 0, dtype=pl.Int64))
        .otherwise(pl.col("ts_ns")).alias("ts_ns"))


# --------------------------------------------------------------------------- ranks


def _rank_info(path: Path, header: dict[str, Any], base_ns: int,
               warnings: list[str]) -> RankInfo:
    info = header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    devices = header.get("deviceProperties")
    names = [d.get("name", "") for d in devices if isinstance(d, dict)] if isinstance(
        devices, list) else []
    rank = as_int(info.get("rank"))
    rank_from = "distributedInfo"
    if rank is None:
        rank = rank_from_file_name(path.name)
        rank_from = "file name"
        if info and rank is not None:
            warnings.append("distributedInfo has no rank; rank taken from the file name")
    if rank is None:
        rank_from = "unknown"
    pg_config = info.get("pg_config")
    return RankInfo(
        rank=rank,
        world_size=as_int(info.get("world_size")),
        host=header.get("host_name") if isinstance(header.get("host_name"), str) else None,
        devices=names,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        clock_base_ns=base_ns or None,
        rank_from=rank_from,
        pg_config=msgspec.json.encode(pg_config).decode() if pg_config is not None else None,
    )


def rank_from_file_name(name: str) -> int | None:
    """``rank-3.json`` / ``rank_3`` / ``worker3.pt.trace.json`` / ``job_rank_3_x`` -> 3.

    >>> [rank_from_file_name(n) for n in ["rank-3.json", "a_rank_12_b.json", "worker0.1.json",
    ...                                   "trace.json"]]
    [3, 12, 0, None]
    """
    found = _RANK_IN_NAME.search(name)
    return int(found.group(1)) if found else None
