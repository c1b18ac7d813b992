"""What every parser returns: :class:`ParsedFile`, with :class:`RankInfo` per rank and, for
formats read in batches, :class:`EventBatches`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceview._dependencies import lazy_module

if TYPE_CHECKING:
    import polars as pl

#: Imported when a parser builds its table: a run read from the cache needs none of it.
pa = lazy_module("pyarrow")


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
    #: each device's memory in bytes as the file names it, JSON ``{"<device id>": bytes}``
    device_memory: str | None = None
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
    step_keys: pl.DataFrame | pa.Table
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
    #: the content id of the bytes parsed (xxh3-128, as ``store.parquet.content_id`` hashes
    #: a file), when the parser hashed them as it read them (else None: the caller hashes the
    #: file)
    content_id: str | None = None
