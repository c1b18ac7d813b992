"""A part of a trace set: one Parquet file of events and how its rows map to final ranks and
files; and a store manifest's record of one (what reopening the store needs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from traceview.errors import UnreadableTraceError
from traceview.store import parquet as store


@dataclass
class Part:
    """One Parquet file of events and how its rank column maps to final ranks."""

    path: str
    file_id: int | None  # None: a store's rank file, whose rows keep their own file_id
    rank: int | None  # the file's single rank, or None when its rank column is kept/mapped
    rank_map: dict[int, int] = field(default_factory=dict)
    #: keep only the rows of these files (a store's rank file read for one window); None: all
    only_files: tuple[int, ...] | None = None
    #: the events file's bytes, when it is in memory rather than at ``path`` (no folder would
    #: take it: ``FileResult.events_data``)
    data: bytes | None = None

    def fields(self) -> tuple[Any, ...]:
        """What rebuilds this part in a worker process: ``Part(*part.fields())``."""
        return (self.path, self.file_id, self.rank, self.rank_map, self.only_files, self.data)

    @property
    def on_disk(self) -> bool:
        """Whether the events are the file at ``path`` (not bytes in memory)."""
        return self.data is None

    def scan(self) -> pl.LazyFrame:
        return self.assign(store.scan_events(self.path if self.data is None else self.data))

    def assign(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """The file's rows (``frame``, every events column) with their final rank and
        file_id, and only the rows of ``only_files`` when it is set."""
        if self.only_files is not None:
            frame = frame.filter(pl.col("file_id").is_in(list(self.only_files)))
        rank = (pl.lit(self.rank, dtype=pl.Int32) if self.rank is not None else
                pl.col("rank").replace_strict(self.rank_map, default=pl.col("rank"),
                                              return_dtype=pl.Int32))
        file_id = (pl.col("file_id") if self.file_id is None else
                   pl.lit(self.file_id, dtype=pl.Int32))
        return frame.with_columns(rank.alias("rank"), file_id.alias("file_id"))


#: From this many parts up, ``scan_parts`` reads plain parts with one multi-file scan instead of
#: a concatenation of one scan each: Polars plans and runs every scan node of a concatenation
#: on its own, ~2 ms of CPU per file and per collect, which made a 500-file run's commands
#: spend ~16 of their ~20 CPU s there (docs/performance.md, log entry 35).
MANY_PARTS = 32


def scan_parts(parts: list[Part]) -> pl.LazyFrame:
    """The events of ``parts`` in their order, as ``pl.concat([p.scan() for p in parts])``
    gives them. Many plain parts (one rank and file_id each, every row kept) are one
    ``scan_parquet`` over their paths, rank and file_id looked up from each row's path."""
    if len(parts) < MANY_PARTS or not is_plain(parts):
        return pl.concat([p.scan() for p in parts], how="vertical")
    path = pl.col("_traceview_path")
    ranks = {p.path: p.rank for p in parts}
    files = {p.path: p.file_id for p in parts}
    frame = pl.scan_parquet([p.path for p in parts], schema=store.events_schema(),
                            missing_columns="insert", include_file_paths="_traceview_path")
    return frame.with_columns(path.replace_strict(ranks, return_dtype=pl.Int32).alias("rank"),
                              path.replace_strict(files, return_dtype=pl.Int32)
                              .alias("file_id")).drop("_traceview_path")


def is_plain(parts: list[Part]) -> bool:
    """Whether ``parts`` are plain files: one rank and file id each, every row kept, on disk,
    each path once (what :func:`scan_parts` reads with one multi-file scan)."""
    return (all(type(p) is Part and p.rank is not None and p.file_id is not None
                and p.only_files is None and p.on_disk for p in parts)
            and len({p.path for p in parts}) == len(parts))


def part_entry(part: Part, name: str) -> dict[str, Any]:
    """A store manifest's record of one events file: what ``Part`` needs to read it."""
    return {"file": name, "file_id": part.file_id, "rank": part.rank,
            "rank_map": {str(k): v for k, v in part.rank_map.items()},
            "only_files": None if part.only_files is None else list(part.only_files)}


def confined_name(entry: Any, where: object) -> str:
    """The file name a manifest entry gives, when it names a file inside the store folder
    itself (a plain name: no folder, no ``..``, not absolute); else an
    ``UnreadableTraceError`` naming the manifest: a store is input, and its manifest must not
    lead a reader to files elsewhere."""
    name = entry.get("file") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name or PurePosixPath(name).is_absolute():
        raise UnreadableTraceError(where, f"store manifest names a part outside the store "
                                   f"folder ({name!r}): ingest the traces again")
    return name


def part_of(path: str, entry: dict[str, Any]) -> Part:
    """The ``Part`` of a store manifest's entry, its file at ``path``."""
    only = entry.get("only_files")
    return Part(path, entry.get("file_id"), entry.get("rank"),
                 {int(k): v for k, v in (entry.get("rank_map") or {}).items()},
                 None if only is None else tuple(only))
