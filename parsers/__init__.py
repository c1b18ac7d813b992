"""Parsers: one function per format, ``path -> ParsedFile`` (an Arrow table in the events schema).

Parsers know nothing of analyses. Each returns the events of one input file together with what
it learned about the ranks inside it, the count of entries in the input, and why any entry was
not stored (``input_events == events.num_rows + sum(dropped.values())``, always).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

#: Each format family's parser version, part of the cache key: bump it when the parser's output
#: for the same input changes. Kept here, apart from the parsers, so that a cache lookup does not
#: import them (the Kineto parser's import is ~0.07 s of every analysis command).
PARSER_VERSIONS: dict[str, int] = {"kineto": 2, "nsys": 1}


@dataclass
class RankInfo:
    """What one file says about one rank. ``rank`` is None when the file does not say."""

    rank: int | None
    world_size: int | None = None
    host: str | None = None
    devices: list[str] = field(default_factory=list)
    backend: str | None = None
    clock_base_ns: int | None = None
    rank_from: str = "unknown"
    pg_config: str | None = None
    #: nsys: the process (pid) whose events belong to this rank; None for one-rank files.
    pid: int | None = None


@dataclass
class EventBatches:
    """A file's events as row batches in the events schema, built one at a time on demand, so
    that the whole table is never in memory at once (see ``store.write_event_batches``).

    ``step_keys`` holds, for every row, the columns the step assignment needs (rank, kind,
    name, ts_ns, dur_ns, correlation): steps depend on the whole file, batches do not.
    ``batch(start, stop)`` returns rows ``[start, stop)`` with ``step`` null.
    """

    num_rows: int
    step_keys: pl.DataFrame
    batch: Callable[[int, int], pa.Table]
    batch_rows: int = 1 << 16
    #: columns null in every row, known before the batches are built: cache files leave
    #: them out (``store.write_event_batches``)
    null_columns: frozenset[str] = frozenset()

    def ranges(self) -> Iterator[tuple[int, int]]:
        """Row ranges of the batches; an empty file has one empty batch (it has a schema)."""
        for start in range(0, max(self.num_rows, 1), self.batch_rows):
            yield start, min(start + self.batch_rows, self.num_rows)

    def __iter__(self) -> Iterator[pa.Table]:
        for start, stop in self.ranges():
            yield self.batch(start, stop)

    def table(self) -> pa.Table:
        """All rows as one table (for callers that want it whole: tests, small files)."""
        return pa.concat_tables(list(self))


@dataclass
class ParsedFile:
    """One input file, parsed. ``events.rank`` is filled when every rank is known.
    ``events`` is a table, or :class:`EventBatches` from :func:`parse_batched`."""

    path: str
    format: str
    events: pa.Table | EventBatches
    ranks: list[RankInfo]
    input_events: int
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def detect_format(path: Path) -> str:
    """``kineto-json``, ``kineto-json-gz``, ``nsys-sqlite`` or ``nsys-rep``, by content first."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head.startswith(b"\x1f\x8b"):
        return "kineto-json-gz"
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if path.suffix in (".nsys-rep", ".qdrep"):
        return "nsys-rep"
    return "kineto-json"


TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".qdrep")


def is_trace_name(path: Path) -> bool:
    """Whether a file in a directory looks like an input we should read."""
    name = path.name
    return name.endswith(TRACE_SUFFIXES) and not name.startswith(".") and name not in (
        "run.json", "ground_truth.json", "baseline.json")


def parse(path: Path, **options: object) -> ParsedFile:
    """Parse one file of any supported format."""
    fmt = detect_format(path)
    if fmt.startswith("nsys"):
        from traceview.parsers import nsys

        return nsys.parse(path, **options)
    from traceview.parsers import kineto

    return kineto.parse(path, **options)


def parse_batched(path: Path, **options: object) -> ParsedFile:
    """Like :func:`parse`, but formats that can build their events in batches (Kineto JSON)
    return :class:`EventBatches`; the others return their table."""
    if detect_format(path).startswith("nsys"):
        return parse(path, **options)
    from traceview.parsers import kineto

    return kineto.parse_batched(path, **options)
