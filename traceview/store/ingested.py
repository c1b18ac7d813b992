"""What ingest learns of each file and of the whole input: the records handed from ingest to
placement (which rank and window each file's rows belong to) and on to the TraceSet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FileResult:
    """What a worker returns for one file: where its events are and what it learned."""

    path: str
    format: str
    size_bytes: int
    content_id: str
    events_path: str
    ranks: list[dict[str, Any]]
    input_events: int
    stored_events: int
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    from_cache: bool = False
    #: the events file's bytes when no folder would take them (``events_path`` is then ""):
    #: the cache's disk full, a file size limit; read from memory (``Part.data``)
    events_data: bytes | None = None
    #: what writing the file said about the cache rather than the data (``IngestResult.notes``)
    notes: list[str] = field(default_factory=list)
    #: the first and last event start and step of the events file (``windows.rough_span``),
    #: read by the worker that wrote it and kept in the cache entry: placement compares the
    #: files of a host by it (reading 5,000 footers there cost ~2 s); None: read it then
    rough_span: dict[str, int | None] | None = None
    #: per rank as parsed (text key): its events of each kind, span and GPU events without a
    #: launch, learnt while the events were written (``rank_facts``): the ``ingest`` and
    #: ``info`` reports need not read the events back. None: an entry written before them
    rank_facts: dict[str, dict[str, Any]] | None = None

    @property
    def events_source(self) -> str | bytes:
        """The events file to read: its path, or its bytes when it is in memory."""
        return self.events_path if self.events_data is None else self.events_data


@dataclass
class IngestResult:
    files: list[FileResult]
    #: final rank for each (file index, rank as parsed) pair
    rank_of: dict[tuple[int, int | None], int]
    skipped: list[tuple[str, str]]
    #: profiling window of each (file index, final rank) pair (``traceview.store.windows``); a
    #: pair left out is window 0
    window_of: dict[tuple[int, int], int] = field(default_factory=dict)
    #: what reading said about the cache rather than the data (a damaged entry parsed again)
    notes: list[str] = field(default_factory=list)
