"""The Kineto entry points, and the C scanner's columns handed over to Arrow.

:func:`parse_batched` reads the bytes (``_input``), scans them with the C scanner or, when it
declines, the tolerant reader (``_tolerant``), derives kind and exact times for every row, and
leaves the rest of each row to be built one batch at a time. :func:`parse` gathers the batches
into one table.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from traceview.errors import UnreadableTraceError
from traceview.parsers._files import FOLLOW_FROM_BYTES
from traceview.parsers._buffers import values_and_validity
from traceview.parsers._result import EventBatches, ParsedFile
from traceview.parsers.kineto._arrow_types import strings
from traceview.parsers.kineto._bounds import (
    MAX_EVENT_BYTES,
    MAX_EVENT_DEPTH,
    TOO_DEEP,
    TOO_LARGE,
    skipped_warnings,
)
from traceview.parsers.kineto._columns import RawColumns, Sparse, SparseText
from traceview.parsers.kineto._events import REPEATING_TEXT, as_int, table_of
from traceview.parsers.kineto._input import Input, open_input, read_bytes
from traceview.parsers.kineto._ranks import rank_info
from traceview.parsers.kineto._salvage import ends_in_damage, truncation_warning
from traceview.parsers.kineto._derived import int_values, text_facts
from traceview.parsers.kineto._rows import batch, constant_int32, empty_columns, row_keys
from traceview.parsers.kineto._stream import Column
from traceview.parsers.kineto._tolerant import read_events
from traceview.schema import KINETO_ARGS, KINETO_TEXT_ARGS

#: Set to 1 to read with the pure-Python path although the C scanner is built: what a user
#: without a compiler or a wheel gets (benchmarks measure it this way).
PURE_PYTHON_ENV = "TRACEVIEW_PURE_PYTHON"

try:  # the C fast path (_scan.c); without it (no compiler at install) the tolerant path does all
    import traceview.parsers.kineto._scan as _kineto_scan
    _SCAN_MISSING = ""
except ImportError as exc:  # pragma: no cover - exercised by setting the module to None in tests
    _kineto_scan = None
    _built = [p for p in Path(__file__).parent.glob("_scan.*") if p.suffix != ".c"]
    _SCAN_MISSING = (f"the compiled {_built[0].name} does not load ({exc})" if _built else
                     "traceview was installed without compiling it (no C compiler)")
if os.environ.get(PURE_PYTHON_ENV) == "1":
    _kineto_scan = None

#: How to get the C scanner where it is missing (the pure-Python path is 3-4.6x slower).
SCANNER_FIX = ("install a C compiler (e.g. apt-get install gcc python3-dev) and reinstall "
               "traceview, or install a prebuilt wheel")


def parser_path() -> tuple[str, str | None]:
    """Which path parses Kineto JSON here: ``("C scanner", None)``, or ``("pure Python",
    why)`` when the compiled scanner is not there (installed without a C compiler)."""
    if _kineto_scan is not None:
        return "C scanner", None
    return "pure Python", (f"no C scanner: {_SCAN_MISSING}" if _SCAN_MISSING
                           else f"the C scanner is turned off ({PURE_PYTHON_ENV}=1)")

# When the parser's output for the same input changes, bump ``PARSER_VERSIONS["kineto"]``
# (traceview.parsers): it is part of the cache key.

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
    with open_input(path, warnings, follow=_worth_following(path)) as given:
        scanned = _scan(given)
        if scanned is None and given.progress is not None:
            # the scan that followed an inflating thread failed (a gzip stream cut short, a
            # trace cut short before it was gzipped, anything the scanner does not read):
            # what inflates, read once, is scanned again keeping the rows before any damage,
            # and the tolerant path reads the same bytes if that declines too
            given = Input(read_bytes(path, warnings), releasable=False)
            scanned = _scan(given)
        fast = None if scanned is None else _fast_columns(given, scanned, dropped, warnings)
        content_id = None
        if fast is not None:
            raw, header, content_id = fast
            input_events = raw.num_rows + sum(dropped.values())
        else:
            columns, rows, header, input_events = _read_tolerantly(path, given, warnings,
                                                                   dropped)
            raw = _raw_columns(columns, rows)
    warnings += skipped_warnings(dropped)
    base_ns = clock_base(path, header, raw)
    keys, raw = row_keys(raw, base_ns, dropped, warnings)
    step_keys = table_of({
        "rank": constant_int32(keys.num_rows, 0), "kind": keys.kind, "name": raw.full("name"),
        "ts_ns": keys.ts_ns, "dur_ns": keys.dur_ns, "correlation": raw.full("correlation")})
    raw = raw.drop("ts_ns").drop("dur_ns")  # the keys hold them (with the clock base)
    facts = text_facts(raw)
    batches = EventBatches(keys.num_rows, step_keys, partial(batch, keys, raw, facts),
                           null_columns=empty_columns(raw))
    return ParsedFile(
        path=str(path),
        format="kineto-json-gz" if path.name.endswith(".gz") else "kineto-json",
        events=batches,
        ranks=[rank_info(path, header, base_ns, warnings)],
        input_events=input_events,
        dropped={k: v for k, v in dropped.items() if v},
        warnings=warnings,
        content_id=content_id,
    )


def _worth_following(path: Path) -> bool:
    """Whether to scan the file as it is read (``open_input(follow=True)``)."""
    if _kineto_scan is None:
        return False
    try:
        return path.stat().st_size >= FOLLOW_FROM_BYTES
    except OSError:
        return True  # open_input words the error


_INT64_MAX = 2**63 - 1


def clock_base(path: Path, header: dict[str, Any], raw: RawColumns) -> int:
    """``baseTimeNanoseconds`` (0 when absent), checked against the events' times: added to
    them it must stay within int64 ns, or every time (and the end of every event) would wrap
    negative in silence. A base that does not fit is damage of that one field, which no event
    can be read without: refused, naming the field (docs/formats.md, Timestamps)."""
    value = header.get("baseTimeNanoseconds")
    base = as_int(value) or 0
    if not base:
        return 0
    problem = None
    if not 0 < base <= _INT64_MAX:
        problem = "is not a time in 64-bit nanoseconds since the epoch"
    else:
        latest, longest = _largest(raw, "ts_ns"), _largest(raw, "dur_ns")
        end = base + max(0, latest or 0) + max(0, longest or 0)  # Python ints: no wrap here
        if end > _INT64_MAX:
            problem = (f"plus the events' times (up to {latest} + {longest} ns) overflows "
                       "64-bit nanoseconds: every time would wrap negative")
    if problem:
        shown = value if isinstance(value, (int, str)) else type(value).__name__
        raise UnreadableTraceError(path, f"baseTimeNanoseconds {str(shown)[:40]} {problem}")
    return base


def _largest(raw: RawColumns, name: str) -> int | None:
    """The largest value of an integer column (None when it has none). Chunk by chunk, over
    views of the buffers: joining a two-thread scan's two chunks first, then picking the
    valid rows, copied the column twice (0.02-0.03 s a column of 1 M rows; log 48)."""
    column = raw.columns[name]
    if column is None or isinstance(column, Sparse):
        values, valid = int_values(raw, name, 0, raw.num_rows)
        return int(values[valid].max()) if valid.any() else None
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    largest = None
    for chunk in chunks:
        if len(chunk) == chunk.null_count:
            continue
        values, valid = values_and_validity(chunk)
        top = int(np.max(values, where=valid, initial=np.iinfo(values.dtype).min))
        largest = top if largest is None else max(largest, top)
    return largest


# --------------------------------------------------------------------------- decoding


_RAW_COLUMNS: dict[str, pa.DataType] = {
    "ph": pa.large_string(), "category": pa.large_string(), "name": pa.large_string(),
    "pid": pa.int64(), "pid_label": pa.large_string(), "tid": pa.int64(),
    "tid_label": pa.large_string(), "ts_ns": pa.int64(), "dur_ns": pa.int64(),
    "flow_id": pa.int64(), "args_json": pa.large_string(),
    **{attr: pa.large_string() if attr in KINETO_TEXT_ARGS else pa.int64()
       for attr in KINETO_ARGS},
}


#: Text columns stored dictionary-encoded: the scanner interns them (COL_IS_DICT in
#: _scan.c), so each distinct name is held once, not once per event; the tolerant reader
#: encodes them batch by batch.
_REPEATING_TEXT = REPEATING_TEXT


def _scan(given: Input) -> tuple[int, dict[str, Any]] | None:
    """The C scanner's rows and columns (``_scan.c``'s ``scan``), keeping the rows before any
    damage inside the events array (not behind an inflating thread); None when there is no
    scanner or it does not read the input."""
    if _kineto_scan is None:
        return None
    try:
        return _kineto_scan.scan(given.data, 8 << 20, given.releasable, given.progress,
                                 256 << 10, MAX_EVENT_BYTES, MAX_EVENT_DEPTH, given.mapped_file,
                                 True)
    except ValueError:
        return None


def _fast_columns(given: Input, scanned: tuple[int, dict[str, Any]], dropped: dict[str, int],
                  warnings: list[str]) -> tuple[RawColumns, dict[str, Any], str | None] | None:
    """The scan of well-formed input, or of input whose events array ends in damage (a file
    cut short), as (columns, header, the content id of a mapped file, hashed beside the
    scan); None sends the caller to the tolerant path. Events over the bounds on one event
    are counted in ``dropped``.

    Damage: the scanner keeps the rows before the element it broke on, and they are taken
    when nothing complete follows that element (``ends_in_damage``): exactly what the salvage
    would keep, with its warning, without its ~15x slower element-by-element decode
    (a 200 MB trace cut short: 17 s and 740 MB before; docs/performance.md, log 52)."""
    rows, columns = scanned
    try:
        if not columns["has_events"]:
            return None  # no event array: the tolerant path words the error
        damage = columns["damage"]
        if damage is not None and not ends_in_damage(given.data, damage[2]):
            return None  # complete elements after the damage: the salvage reads them
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
    for reason, count in ((TOO_LARGE, columns["too_large"]), (TOO_DEEP, columns["too_deep"])):
        if count:
            dropped[reason] = count
    if damage is not None:
        warnings.append(truncation_warning(rows))
        dropped["truncated"] = dropped.get("truncated", 0) + 1
    return (RawColumns(rows, _sparse_text(raw, rows), _RAW_COLUMNS), header,
            columns["content_id"])


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


def _read_tolerantly(path: Path, given: Input, warnings: list[str], dropped: dict[str, int]
                     ) -> tuple[dict[str, Column], int, dict[str, Any], int]:
    """The tolerant reader's columns. Without a scanner it streams from the memory map,
    handing pages back as it goes; after a scan that failed, the map may have lost pages,
    so the bytes are read anew."""
    if _kineto_scan is None:
        return read_events(path, given.data, warnings, dropped, release=given.releasable)
    data = read_bytes(path, warnings) if given.releasable else given.data
    return read_events(path, data, warnings, dropped)


def _raw_columns(pending: dict[str, Column], rows: int) -> RawColumns:
    """The tolerant path's columns (``read_events``) in the scanner's form. ``pending`` is
    emptied: each column is released as soon as its final form is made, so the two forms
    are never both whole. Text chunks stay chunks (joining them would copy ``args_json``,
    a third of the columns, beside itself)."""
    columns: dict[str, pa.Array | pa.ChunkedArray | Sparse | SparseText | None] = {}
    for name, typ in _RAW_COLUMNS.items():
        column = pending.pop(name)
        if column is None:  # no event has it
            columns[name] = (pa.DictionaryArray.from_arrays(pa.nulls(rows, pa.int32()),
                                                             strings([]))
                             if name in _REPEATING_TEXT else None)
        elif isinstance(column, SparseText):
            columns[name] = SparseText(column.rows, column.codes, column.dictionary.cast(typ))
        elif isinstance(column, Sparse):
            columns[name] = column
        elif pa.types.is_dictionary(column.type):  # encoded batch by batch (the stream)
            encoded = column.unify_dictionaries().combine_chunks()
            columns[name] = pa.DictionaryArray.from_arrays(encoded.indices,
                                                           encoded.dictionary.cast(typ))
        elif name in _REPEATING_TEXT:  # the whole-file path
            columns[name] = column.combine_chunks().cast(typ).dictionary_encode()
        else:
            columns[name] = column if column.type == typ else column.cast(typ)
    return RawColumns(rows, columns, _RAW_COLUMNS)
