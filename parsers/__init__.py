"""Parsers: one package per format, each with one entry, ``parse(path) -> ParsedFile`` (an Arrow
table in the events schema); :func:`parse` here picks the format.

* ``kineto/``: PyTorch-profiler (Kineto) JSON, ``.json`` or ``.json.gz``
* ``nsys/``: Nsight Systems SQLite exports (and ``.nsys-rep`` reports, through ``nsys``)
* ``nccl_log``: NCCL_DEBUG=INFO logs, beside a trace rather than a trace

Parsers know nothing of analyses. Each returns the events of one input file together with what
it learned about the ranks inside it, the count of entries in the input, and why any entry was
not stored (``input_events == events.num_rows + sum(dropped.values())``, always).
"""

from __future__ import annotations

from pathlib import Path

from traceview._dependencies import lazy_module
from traceview.parsers._files import (
    FOLLOW_FROM_BYTES,
    PARSER_VERSIONS,
    TRACE_SUFFIXES,
    detect_format,
    family,
    file_problem,
    is_trace_name,
    rank_from_file_name,
    refuse_non_json,
)
from traceview.parsers._result import EventBatches, ParsedFile, RankInfo

# Each format's parser is imported when a file of it is parsed: a run read from the cache needs
# neither (the Kineto parser's imports cost ~0.2 s, the nsys one's ~0.04 s).
kineto = lazy_module("traceview.parsers.kineto")
nsys = lazy_module("traceview.parsers.nsys")

__all__ = ["PARSER_VERSIONS", "TRACE_SUFFIXES", "EventBatches", "ParsedFile", "RankInfo",
           "detect_format", "family", "file_problem", "hashes_as_it_reads",
           "is_trace_name", "parse", "parse_batched", "rank_from_file_name", "refuse_non_json"]


def parse(path: Path, **options: object) -> ParsedFile:
    """Parse one file of any supported format."""
    if family(detect_format(path)) == "nsys":
        return nsys.parse(path, **options)

    return kineto.parse(path, **options)


def parse_batched(path: Path, **options: object) -> ParsedFile:
    """Like :func:`parse`, but formats that can build their events in batches (Kineto JSON)
    return :class:`EventBatches`; the others return their table."""
    if family(detect_format(path)) == "nsys":
        return parse(path, **options)

    return kineto.parse_batched(path, **options)


def hashes_as_it_reads(path: Path) -> bool:
    """Whether :func:`parse_batched` will hash the file's bytes as it reads them
    (``ParsedFile.content_id``, when it read them whole): a large uncompressed Kineto file,
    which the C scanner maps and hashes beside its scan (gzip is inflated: what is scanned is
    not the file's bytes). The store then parses such a file it has never seen before hashing
    it, instead of reading every byte twice."""
    # cheapest first: one stat for each small file of a large run, and the Kineto parser
    # (~0.2 s of imports) never loaded to answer for an nsys export
    return (path.stat().st_size >= FOLLOW_FROM_BYTES and detect_format(path) == "kineto-json"
            and kineto.parser_path()[0] == "C scanner")
