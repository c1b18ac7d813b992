"""``traceview analyse``: per-rank analyses on the executor, cross-rank steps on the driver.

``--json`` contract (fields may be added): ``{"ranks", "events", "offsets": [{"rank",
"offset_ns", "uncertainty_ns", ...}], "collectives": [{"instance", "name", "n_ranks",
"skew_ns", "last_rank", ...}], "stragglers": [{"rank", "flagged", "imposed_wait_ns", ...}],
"overlap": [{"rank", "device", "overlap_ns", ...}], "failed": [...], "skipped": [...],
"driver_summary_bytes"}``.
"""

from __future__ import annotations

import argparse
from typing import Any

import polars as pl

from traceview.cli._options import (
    MAX_RANK,
    add_all_arg,
    add_input_args,
    add_json_arg,
    executor_spec,
    open_traceset,
    real,
    whole,
)
from traceview.cli._render import (
    emit_json,
    is_many,
    ms,
    not_shown,
    outlier_ranks,
    spread,
    warn,
)
from traceview.run.per_rank import analyse
from traceview.selection import parse_ranks, require_known_ranks


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """The options of ``analyse`` (this module's only command) on ``p``."""
    add_input_args(p)
    add_json_arg(p)
    add_all_arg(p)
    p.add_argument("--ranks", metavar="SPEC", help="ranks to analyse, e.g. 0-3,7")
    p.add_argument("--align", choices=("auto", "none", "host", "collectives"), default="auto")
    p.add_argument("--reference-rank", type=whole(0, MAX_RANK), default=None, metavar="R")
    p.add_argument("--tolerance-us", type=real(0, 1e9, above_low=True), default=500.0)
    p.set_defaults(run=run_analyse)


def _records(df: pl.DataFrame) -> list[dict[str, Any]]:
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String)).to_dicts()


def run_analyse(args: argparse.Namespace) -> int:
    ts = open_traceset(args)
    for warning in ts.warnings:
        warn(warning)
    present = ts.ranks["rank"].to_list()
    ranks = parse_ranks(args.ranks, present)
    require_known_ranks(ranks, present, args.ranks)
    res = analyse(ts, executor=executor_spec(args), method=args.align,
                  reference_rank=args.reference_rank,
                  tolerance_ns=int(args.tolerance_us * 1000), ranks=ranks)
    events = int(res.kinds.get_column("n").sum()) if res.kinds.height else 0
    if args.json:
        emit_json({
            "ranks": res.offsets.height, "events": events,
            "offsets": _records(res.offsets), "collectives": _records(res.collectives),
            "stragglers": _records(res.stragglers), "overlap": _records(res.overlap),
            "failed": res.failed,
            "skipped": [{"file": f, "error": e} for f, e in ts.skipped],
            "driver_summary_bytes": res.summary_bytes,
        })
        return 0
    print(f"{res.offsets.height} ranks, {events:,} events summarised; the driver holds "
          f"{res.summary_bytes:,} bytes of per-rank tables")
    print(f"{res.collectives.height} collective instances matched; "
          f"max alignment uncertainty {res.offsets.get_column('uncertainty_ns').max()} ns")
    flagged = res.stragglers.filter(pl.col("flagged"))
    print(f"stragglers flagged: {flagged.get_column('rank').to_list() or 'none'}")
    overlap = shown = res.overlap.filter(pl.col("device").is_not_null())
    if is_many(overlap, args):
        print(spread(overlap, [("overlap_ns", "overlap (ms)", ms),
                               ("exposed_comm_ns", "exposed comm (ms)", ms)],
                     what="rank devices"))
        shown = overlap.filter(pl.col("rank").is_in(
            outlier_ranks(overlap, ["overlap_ns", "exposed_comm_ns"])))
    for r in shown.iter_rows(named=True):
        print(f"  rank {r['rank']} device {r['device']}: overlap {r['overlap_ns'] / 1e6:.2f} ms, "
              f"exposed comm {r['exposed_comm_ns'] / 1e6:.2f} ms")
    if shown.height < overlap.height:
        print(not_shown(shown.height, overlap.height, "analyse", "--json holds"))
    for line in res.failed:
        print(f"  failed: {line}")
    for f, e in ts.skipped:
        print(f"  skipped: {e}")
    return 0
