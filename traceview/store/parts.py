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

    def fields(self) -> tuple[Any, ...]:
        """What rebuilds this part in a worker process: ``Part(*part.fields())``."""
        return (self.path, self.file_id, self.rank, self.rank_map, self.only_files)

    def scan(self) -> pl.LazyFrame:
        return self.assign(store.scan_events(self.path))

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
