"""TraceSet: one run's ranks, opened once, queried many times (frames, SQL, pandas).

>>> import traceview                                   # doctest: +SKIP
>>> ts = traceview.open("fixtures/data/gloo_ddp_2r")   # doctest: +SKIP
>>> ts.sql("select rank, count(*) as n from events group by rank")  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceview import schema, store
from traceview.errors import UnreadableTraceError, UsageError
from traceview.ingest import IngestResult, ingest, rank_info_rows


@dataclass
class _Part:
    """One Parquet file of events and how its rank column maps to final ranks."""

    path: str
    file_id: int
    rank: int | None  # the file's single rank, or None when its rank column is kept/mapped
    rank_map: dict[int, int] = field(default_factory=dict)

    def scan(self) -> pl.LazyFrame:
        frame = store.scan_events(self.path)
        rank = (pl.lit(self.rank, dtype=pl.Int32) if self.rank is not None else
                pl.col("rank").replace_strict(self.rank_map, default=pl.col("rank"),
                                              return_dtype=pl.Int32))
        return frame.with_columns(rank.alias("rank"),
                                  pl.lit(self.file_id, dtype=pl.Int32).alias("file_id"))


class TraceSet:
    """The events of one run (all ranks, long form) with its ranks and files tables."""

    def __init__(self, parts: list[_Part], ranks: pl.DataFrame, files: pl.DataFrame,
                 skipped: Sequence[tuple[str, str]] = ()) -> None:
        self._parts = parts
        self.ranks = ranks
        self.files = files
        self.skipped = list(skipped)
        #: where per-rank work runs (``traceview.executors.ExecutorSpec``/``Executor``), or None
        self.executor: Any = None
        #: the cache folder the events files live in (results derived from them may be kept
        #: there too: ``traceview.derived``); None for a store, a URL or ``cache=False``
        self.cache_dir: str | Path | None = None
        self._frame: pl.LazyFrame | None = None  # events held in memory (``from_frame``)

    @classmethod
    def from_frame(cls, events: pl.LazyFrame | pl.DataFrame,
                   ranks: pl.DataFrame | None = None) -> TraceSet:
        """A trace set over events already in memory (a notebook's frame, a test's hand-made
        timeline); ``ranks``: its ranks table (hosts, world size), else one row per rank."""
        frame = events.lazy()
        if ranks is None:
            present = frame.select(pl.col("rank").unique().sort()).collect()
            ranks = present.select(pl.col("rank").cast(pl.Int32), file_id=pl.lit(0, pl.Int32),
                                   source=pl.lit("memory"))
            empty = pl.DataFrame(schema=schema.polars_schema(schema.RANK_COLUMNS))
            ranks = pl.concat([empty, ranks], how="diagonal_relaxed")
        ts = cls([], ranks, pl.DataFrame(schema=schema.polars_schema(schema.FILE_COLUMNS)))
        ts._frame = frame
        return ts

    @property
    def events(self) -> pl.LazyFrame:
        """All events as a Polars LazyFrame in the schema of ``traceview.schema``."""
        if self._frame is not None:
            return self._frame
        if not self._parts:
            return schema.empty_events().lazy()
        return pl.concat([p.scan() for p in self._parts], how="vertical")

    def analysis_events(self) -> pl.LazyFrame:
        """The events without ``args_json``: every column an analysis reads, and a fraction of
        the bytes (the raw args text is most of a trace), so collecting a window is cheap."""
        return self.events.drop("args_json", strict=False)

    def ranks_with_events(self) -> list[int] | None:
        """The ranks with at least one event, from the row counts in the files' footers (no
        event is read); None when a file holds several ranks or is not a local file (then
        only its events can tell)."""
        if self._frame is not None or not all(type(p) is _Part and p.rank is not None
                                              for p in self._parts):
            return None
        return sorted({p.rank for p in self._parts if store.row_count(p.path) > 0})

    def kernels(self) -> pl.LazyFrame:
        """GPU kernels only."""
        return self.events.filter(pl.col("kind") == "kernel")

    @property
    def warnings(self) -> list[str]:
        out = []
        for path, warns in self.files.select("path", "warnings").iter_rows():
            out += [f"{path}: {w}" for w in orjson.loads(warns or "[]")]
        return out

    def sql(self, query: str, *, events: pl.LazyFrame | None = None) -> pl.DataFrame:
        """Run SQL over the tables ``events``, ``kernels``, ``ranks`` and ``files``.
        ``events``: a selection of the events to query instead of all of them."""
        events = self.events if events is None else events
        kernels = events.filter(pl.col("kind") == "kernel")
        context = pl.SQLContext(events=events, kernels=kernels,
                                ranks=self.ranks.lazy(), files=self.files.lazy())
        try:
            return context.execute(query, eager=True)
        except (pl.exceptions.SQLInterfaceError, pl.exceptions.SQLSyntaxError,
                pl.exceptions.ColumnNotFoundError, pl.exceptions.InvalidOperationError) as exc:
            raise UsageError(f"SQL error: {str(exc).splitlines()[0]}") from None

    def to_pandas(self) -> Any:
        """All events as a pandas DataFrame (categoricals stay categorical)."""
        return self.events.collect().to_pandas()

    def write_store(self, out_dir: str | Path) -> Path | str:
        """Write a self-contained store folder: one zstd Parquet file per rank.

        ``out_dir`` may be a URL (``file://``, ``s3://``, ``memory://`` ...); then, or when
        this TraceSet was opened with an executor, the workers write the rank files
        (:func:`traceview.remote_store.write_store`).
        """
        from traceview import remote_store

        if remote_store.is_url(out_dir) or self.executor is not None:
            return remote_store.write_store(self, out_dir, executor=self.executor)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for rank in self.ranks["rank"].to_list():
            target = out / f"rank-{rank:05d}.parquet"
            table = self.events.filter(pl.col("rank") == rank).collect().to_arrow()
            store.write_events(schema.conform(table), target)
        store.atomic_write(out / "ranks.parquet", lambda tmp: self.ranks.write_parquet(tmp))
        store.atomic_write(out / "files.parquet", lambda tmp: self.files.write_parquet(tmp))
        store.write_json({"traceview_store": store.CACHE_VERSION,
                          "schema_version": schema.SCHEMA_VERSION,
                          "ranks": self.ranks["rank"].to_list()}, out / store.STORE_MANIFEST)
        return out

    def __repr__(self) -> str:
        n = self.files["stored_events"].sum() if self.files.height else 0
        return f"<TraceSet {self.ranks.height} ranks, {self.files.height} files, {n} events>"

    def _repr_html_(self) -> str:
        summary = self.ranks.select("rank", "world_size", "source", "backend", "file_id").join(
            self.files.select("file_id", "path", "stored_events"), on="file_id", how="left")
        return f"<p>{self!r}</p>" + summary._repr_html_()


def open(paths: str | Path | Iterable[str | Path], *, skip_bad: bool = False,  # noqa: A001
         rank_map: dict[str, int] | None = None, cache: bool = True,
         cache_dir: str | Path | None = None, progress: bool = False,
         options: dict[str, Any] | None = None, executor: Any = None,
         scheduler: str | None = None) -> TraceSet:
    """Open trace files, folders of traces, or a store (folder or URL) written by ``ingest -o``.

    ``executor``: where files are parsed: ``"local"`` (local processes), ``"dask"`` (with
    ``scheduler`` ADDRESS, or a local cluster started and closed here), an
    ``ExecutorSpec`` or any ``concurrent.futures.Executor``; None: in this process for small
    inputs, local processes for large ones.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise UsageError("no input paths")
    if isinstance(executor, str) or scheduler:
        from traceview.executors import ExecutorSpec

        executor = ExecutorSpec(executor or "dask", scheduler=scheduler)
    from traceview import remote_store

    urls = [p for p in items if remote_store.is_url(p)]
    if urls:
        if len(items) > 1 or not remote_store.is_store(urls[0]):
            raise UsageError("a URL input must be a traceview store, and the only input")
        return remote_store.open_store(urls[0])
    stores = [Path(p) for p in items if store.is_store(Path(p))]
    if stores:
        if len(items) > 1:
            raise UsageError("a store folder must be the only input")
        return _open_store(stores[0])
    if not cache:
        # Lazy frames read these Parquet files after this function returns, possibly after the
        # TraceSet is gone (``open(p, cache=False).events.collect()``): remove them at exit.
        cache_dir = tempfile.mkdtemp(prefix="traceview-")
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    elif cache_dir is None:
        cache_dir = store.default_cache_dir()
    result = ingest(items, cache_dir=cache_dir, skip_bad=skip_bad, rank_map=rank_map,
                    options=options, progress=progress, executor=executor)
    ts = _from_ingest(result)
    ts.executor = executor
    ts.cache_dir = cache_dir if cache else None  # a temporary folder is not worth keeping in
    return ts


def _from_ingest(result: IngestResult) -> TraceSet:
    parts = []
    for i, file in enumerate(result.files):
        mapping = {parsed if parsed is not None else 0: final
                   for (fi, parsed), final in result.rank_of.items() if fi == i}
        single = next(iter(mapping.values())) if len(file.ranks) == 1 else None
        parts.append(_Part(file.events_path, i, single, mapping))
    ranks = pl.DataFrame(rank_info_rows(result), schema=schema.polars_schema(schema.RANK_COLUMNS))
    files = pl.DataFrame([{
        "file_id": i, "path": f.path, "format": f.format, "size_bytes": f.size_bytes,
        "content_id": f.content_id, "input_events": f.input_events,
        "stored_events": f.stored_events, "dropped": orjson.dumps(f.dropped).decode(),
        "warnings": orjson.dumps(f.warnings).decode()} for i, f in enumerate(result.files)],
        schema=schema.polars_schema(schema.FILE_COLUMNS))
    return TraceSet(parts, ranks.sort("rank"), files, result.skipped)


def _open_store(folder: Path) -> TraceSet:
    manifest = store.read_json(folder / store.STORE_MANIFEST)
    if manifest.get("schema_version") != schema.SCHEMA_VERSION:
        raise UnreadableTraceError(folder, f"store has schema version "
                                   f"{manifest.get('schema_version')}, this traceview reads "
                                   f"{schema.SCHEMA_VERSION}: ingest the traces again")
    ranks = pl.read_parquet(folder / "ranks.parquet")
    files = pl.read_parquet(folder / "files.parquet")
    parts = [_Part(str(folder / f"rank-{r:05d}.parquet"), fid, r)
             for r, fid in ranks.select("rank", "file_id").iter_rows()]
    return TraceSet(parts, ranks, files)
