"""``traceview hang DUMPS…``: why a job hung, from PyTorch flight-recorder dumps.

:func:`hang_result` reads the per-rank dumps (``parsers.flight_recorder``, plain data only,
bounded) and asks ``analyses.hang`` for the verdict. ``--json`` contract::

    {"culprit_ranks": [...], "stuck_seq": N, "missing_dumps": [...],
     "mismatches": [{"seq", "ranks", "ops", ...}], "groups": [...], "ranks": [...], ...}

``groups``: per process group, its members, the last collective all completed
(``completed_by_all``), the stuck one (``stuck_seq``), the rule that found it, its culprits
with a reason, and what the others wait in (``waiting``: rank, op, sizes, seq, state).
``ranks`` (the main table): one row per (group, rank). Definitions: docs/metrics.md, section
*Hangs from flight-recorder dumps*.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from traceview.analyses.hang import hang
from traceview.errors import UnreadableTraceError
from traceview.parsers import flight_recorder
from traceview.run.result import Result

RANKS_SCHEMA: dict[str, pl.DataType] = {
    "group": pl.String, "rank": pl.Int32, "dump": pl.Boolean, "last_enqueued": pl.Int64,
    "last_started": pl.Int64, "last_completed": pl.Int64, "culprit": pl.Boolean,
}


def read_dumps(paths: Sequence[str | Path]) -> tuple[list[flight_recorder.Dump], list[str]]:
    """Every dump the paths name (files, or folders of them), and the folders' other files
    passed over (their names); one-line errors."""
    found, other = flight_recorder.dump_paths(list(paths))
    dumps = [flight_recorder.read(p) for p in found]
    seen: dict[int, str] = {}
    for d in dumps:
        if d.rank in seen:
            raise UnreadableTraceError(
                d.path, f"rank {d.rank} again (also {seen[d.rank]}): one dump per rank")
        seen[d.rank] = d.path
    if not dumps:
        raise UnreadableTraceError(', '.join(map(str, paths)), "no flight-recorder dump found")
    return dumps, [str(p) for p in other]


def hang_verdict(dumps: Sequence[flight_recorder.Dump], *,
                 world_size: int | None = None) -> dict[str, Any]:
    """``analyses.hang.hang`` over the dumps' tables."""
    def cat(tables: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
        return pl.concat(tables) if tables else pl.DataFrame(schema=schema)
    return hang(cat([d.entries for d in dumps], flight_recorder.ENTRY_SCHEMA),
                cat([d.status for d in dumps], flight_recorder.STATUS_SCHEMA),
                cat([d.config for d in dumps], flight_recorder.CONFIG_SCHEMA),
                dumped=[d.rank for d in dumps], world_size=world_size)


def hang_result(paths: Sequence[str | Path], *, world_size: int | None = None) -> Result:
    """The ``hang`` answer for the dumps at ``paths``."""
    dumps, passed = read_dumps(paths)
    found = hang_verdict(dumps, world_size=world_size)
    rows = [{"group": g["group"], "rank": r, "dump": r not in g["missing_dumps"],
             **{k: None for k in ("last_enqueued", "last_started", "last_completed")},
             **next((p for p in g["per_rank"] if p["rank"] == r), {}),
             "culprit": r in g["culprits"]}
            for g in found["groups"] for r in g["ranks"]]
    ranks = pl.DataFrame(rows, schema=RANKS_SCHEMA) if rows else pl.DataFrame(schema=RANKS_SCHEMA)
    versions = sorted({d.version for d in dumps})
    warnings = [*found["notes"]]
    if passed:
        warnings.append(f"passed over {len(passed)} file(s) not named <prefix><rank>: "
                        f"{', '.join(passed[:5])}{' ...' if len(passed) > 5 else ''}")
    if len(versions) > 1:
        warnings.append(f"dumps of different formats ({', '.join(versions)}): compared as far "
                        f"as their common fields go")
    fields = {**found, "ranks": ranks, "dumps": [{"rank": d.rank, "path": d.path,
                                                  "version": d.version,
                                                  "entries": d.entries.height}
                                                 for d in sorted(dumps, key=lambda d: d.rank)]}
    return Result("hang", fields, main="ranks", warnings=tuple(warnings))


__all__ = ["hang_result", "hang_verdict", "read_dumps"]
