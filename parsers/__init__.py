"""Parsers: one function per format, ``path -> ParsedFile`` (an Arrow table in the events schema).

Parsers know nothing of analyses. Each returns the events of one input file together with what
it learned about the ranks inside it, the count of entries in the input, and why any entry was
not stored (``input_events == events.num_rows + sum(dropped.values())``, always).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa


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
class ParsedFile:
    """One input file, parsed. ``events.rank`` is filled when every rank is known."""

    path: str
    format: str
    events: pa.Table
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
