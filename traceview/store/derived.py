"""Results derived from stored events, kept in the cache folder beside them.

Four commands (gaps, overlap, breakdown, summary) start from the same classified GPU rows
(``analyses.overlap.prepared_gpu``). Classifying them takes 0.13-0.28 s on 8 x 100 MB of
traces; reading them back takes ~0.02 s (docs/performance.md, log 22). So the first command
on a trace set keeps them in ``CACHE_DIR/derived/`` and the next ones read them. The tables
the Run builds from them and the host rows are kept the same way (``Run._kept``): the GPU
idle gaps with their causes (``analyses.gaps.gaps``, behind summary, gaps, the report and
diagnose: finding them needs every host row besides), the steps, the overlap rows and the
GPU work launched before the profiler started. Together they were 0.25-0.36 s of a cached
summary's answer on a 262 MB trace; read back, 0.03 s (log 49).

The key names everything the rows depend on: each events file (a content-addressed cache
entry, with its size and modification time), how its ranks map to the set's ranks, the
window's ranks, the rows' definition (their kind, its version and options) and the code that
made them (``cache_folder.code_identity``: traceview's sources and the installed libraries),
so an edit to a checkout never serves rows its code would not make. Inputs the key cannot
name are computed afresh every time: events outside the cache folder (a store folder,
``--no-cache``), windows of steps or time (the CLI collects those in memory). The
classification rules (``ClassifyPatterns``, e.g. ``--comm-pattern``) are in the key, so rows
classified under other rules are never served.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import polars as pl
import xxhash

from traceview import __version__
from traceview.store import cache_folder
from traceview.store import parquet as store

#: The version of the classified GPU rows' definition: bump it with any change to what
#: ``analyses.overlap.prepared_gpu`` gives (classes, patterns, steps, columns). The code's
#: hash in the key covers an edit too; the version says that the definition changed.
GPU_ROWS_VERSION = 3  # 3: other accelerators' device work (MTIA) is GPU work


class Inputs(NamedTuple):
    """What a kept table is computed from: the events files of a set of ranks in a cache
    folder (``inputs_of``). Named once per Run: stat'ing 5,000 files for each of the five
    tables a summary keeps took 0.2 s."""

    folder: Path  #: the cache folder, where the tables are kept
    names: list[Any]  #: each events file's identity (``parts_identity``) and the ranks


def inputs_of(ts: Any, ranks: Sequence[int] | None, cache_dir: str | Path | None
              ) -> Inputs | None:
    """The inputs of tables kept from ``ts``'s events restricted to ``ranks``; None when they
    cannot be named safely (see ``parts_identity``): such tables are computed every time."""
    files = parts_identity(getattr(ts, "_parts", None) or [None], cache_dir)
    if files is None:
        return None
    return Inputs(Path(cache_dir), [files, sorted(ranks) if ranks is not None else None])


def cached_gpu(ts: Any, ranks: Sequence[int] | None, compute: Callable[[], pl.DataFrame],
               cache_dir: str | Path | None, *, patterns: Any = None,
               warn: Callable[[str], None] | None = None) -> pl.DataFrame:
    """``compute()`` (the classified GPU rows of ``ts``'s events restricted to ``ranks``,
    under the classification rules ``patterns``, a ``ClassifyPatterns``; None: the default),
    read from the cache folder when an earlier command kept them, else computed and kept.
    ``warn(text)``: told when kept rows were damaged and computed again (as a damaged cache
    entry of events is: one note, the answer whole)."""
    return cached("gpu", gpu_definition(patterns), inputs_of(ts, ranks, cache_dir), compute,
                  warn=warn)


def gpu_definition(patterns: Any = None) -> list[Any]:
    """What names the classified GPU rows' definition in a key: its version and rules."""
    return [GPU_ROWS_VERSION, None if patterns is None else dataclasses.asdict(patterns)]


def cached(kind: str, definition: Any, inputs: Inputs | None,
           compute: Callable[[], pl.DataFrame], *,
           warn: Callable[[str], None] | None = None) -> pl.DataFrame:
    """``compute()``, the rows of ``kind`` (``gpu``, ``gaps``, ``steps`` ...) of ``inputs``
    under ``definition`` (JSON-able: versions and options), read from the cache folder when
    an earlier command kept them, else computed and kept; computed every time without
    ``inputs``. ``warn(text)``: told when kept rows were damaged and computed again."""
    if inputs is None:
        return compute()
    path = _path(kind, definition, inputs)
    kept, problem = _read_kept(path)
    if kept is not None:
        return kept
    if problem and warn is not None:
        warn(f"cache entry {path} could not be used ({problem}); discarded, the rows were "
             "computed again")
    rows = compute()
    # uncompressed: written in 0.04 s, read in 0.01 s; zstd or LZ4 took 2-3x that. Checked by
    # its record (Parquet page checksums did the same but needed pyarrow's writer: 0.25-0.30 s
    # against 0.04-0.06 s plus a 0.015 s hash for 737 k rows; log 30). A read-only cache
    # folder: computed next time too.
    keep(path, lambda tmp: rows.write_parquet(tmp, compression="uncompressed", statistics=False))
    return rows


def kept(kind: str, definition: Any, inputs: Inputs | None) -> pl.DataFrame | None:
    """The rows ``cached`` would read back, or None when none are kept (or they are
    damaged: ``cached`` then says so and computes them again). Nothing is computed: a
    caller that needs other tables only to compute the rows asks this first."""
    return None if inputs is None else _read_kept(_path(kind, definition, inputs))[0]


def _path(kind: str, definition: Any, inputs: Inputs) -> Path:
    """Where the rows are kept: named by everything they depend on, the code included."""
    key = xxhash.xxh3_128_hexdigest(orjson.dumps(
        [kind, definition, __version__, pl.__version__, cache_folder.code_identity(),
         inputs.names]))
    return inputs.folder / "derived" / f"{kind}-{key}.parquet"


def _record_of(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _read_kept(path: Path) -> tuple[pl.DataFrame | None, str | None]:
    """(the rows kept at ``path``, None); (None, None) when there are none (never kept, or the
    writer stopped before the record, which is written last); (None, why) when the file is not
    the one its record describes (damaged: computing them again replaces it)."""
    found, problem = check_kept(path)
    if not found:
        return None, problem
    try:
        return pl.read_parquet(path), None
    except FileNotFoundError:
        return None, "missing"
    except Exception as exc:  # noqa: BLE001 - any damage (footer, pages, schema)
        return None, f"not readable ({type(exc).__name__})"


def keep(path: Path, write: Callable[[Path], None]) -> bool:
    """Write a derived file with ``write(tmp)`` (atomically), then its record (size and hash)
    beside it, last: a damaged or half-written file is then computed again rather than read
    as other numbers. False when the cache folder will not take it (read-only, full)."""
    try:
        store.atomic_write(path, write)
        store.write_json(store.events_record(path), _record_of(path))
    except OSError:
        return False
    return True


def check_kept(path: Path) -> tuple[bool, str | None]:
    """(True, None) when the file kept at ``path`` is the one its record describes; (False,
    None) when none is kept (never, or its writer stopped before the record); (False, why)
    when it is damaged (keeping it again replaces it)."""
    record_path = _record_of(path)
    if not record_path.exists():
        return False, None
    distrusted = cache_folder.untrusted_files(path.parent, record_path, path)
    if distrusted is not None:  # planted by another user in a shared cache folder
        return False, f"{distrusted[0].name}: {distrusted[1]}: not trusted"
    try:
        record = store.read_json(record_path)
        if not isinstance(record, dict):
            return False, f"{record_path.name} is not its record"
        size = path.stat().st_size
        if size != record.get("bytes"):
            return False, f"{size} bytes, {record.get('bytes')} were written"
        if store.content_id(path) != record.get("xxh3"):
            return False, "content changed since it was written"
        return True, None
    except FileNotFoundError:
        return False, "missing"
    except Exception as exc:  # noqa: BLE001 - any damage of the record
        return False, f"not readable ({type(exc).__name__})"


def parts_identity(parts: Sequence[Any], cache_dir: str | Path | None) -> list[Any] | None:
    """What names the events files ``parts`` read, for a key: each file's path, size and
    modification time (content-addressed cache entries), file id, rank and rank map; None when
    a part cannot be named safely (in memory, or outside the cache folder, which the cache
    does not own)."""
    if cache_dir is None:
        return None
    # Inside the cache folder as it is named or as it resolves. Each part's own path is not
    # resolved: ingest placed it under the folder, and resolving 5,000 of them took 0.16 s of
    # the 0.5 s this took, on every command that keeps a table (log 49).
    inside = tuple({os.path.join(os.path.abspath(cache_dir), ""),
                    os.path.join(os.path.realpath(cache_dir), "")})
    files = []
    for part in parts:
        if part is None or getattr(part, "data", None) is not None:  # None, or in memory
            return None
        path = os.path.abspath(getattr(part, "path", "") or "")
        if not path.startswith(inside):
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        files.append([path, st.st_size, st.st_mtime_ns, part.file_id, part.rank,
                      sorted(part.rank_map.items())])
    return files
