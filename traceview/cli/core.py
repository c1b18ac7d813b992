"""Core subcommands: ingest, info, sql."""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import polars as pl

from traceview.analyses.classify import gpu_events
from traceview.analyses.launches import unlaunched_gpu
from traceview.analyses.spread import MANY_RANKS
from traceview.cli._options import (
    MAX_ROWS,
    add_all_arg,
    add_include_osrt_arg,
    add_input_args,
    add_json_arg,
    add_profiling_window_arg,
    open_traceset,
    run_module,
    whole,
)
from traceview.cli._render import emit_json, warn
from traceview.errors import UsageError
from traceview.outputs.safe_text import one_line
from traceview.store.safe_write import check_folder_target, refuse_input_overlap


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    if command == "sql":
        _sql_options(p)
        p.set_defaults(run=run_sql)
        return
    add_input_args(p)
    if command == "ingest":
        p.add_argument("-o", "--output", metavar="DIR", help="write a self-contained store here")
    add_json_arg(p)
    add_all_arg(p)
    p.set_defaults(run={"ingest": run_ingest, "info": run_info}[command])


def _sql_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="inputs, then the query last")
    p.add_argument("--skip-bad", action="store_true")
    p.add_argument("--rank-map", action="append", default=[], metavar="FILE=RANK")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--cache-dir", metavar="DIR")
    add_include_osrt_arg(p)
    add_profiling_window_arg(p)
    p.add_argument("--limit", type=whole(0, MAX_ROWS), default=50, help="rows to print (text output)")
    add_json_arg(p)


def info_report(ts: Any) -> dict[str, Any]:
    """The ``info --json`` contract: totals and per rank input/stored/dropped/kinds, and the
    rank's profiling windows (``traceview.store.windows``)."""
    kinds = _kind_counts(ts)
    unlaunched = _unlaunched_by_rank(ts)
    files = {row["file_id"]: row for row in ts.files.iter_rows(named=True)}
    windows = ts.window_spans()
    # a file read for several ranks (nsys) counts its dropped events on its first rank
    owner = dict(windows.group_by("file_id").agg(pl.col("rank").min()).iter_rows())
    # each rank's windows and kinds split off once: a filter per rank was quadratic in the
    # ranks (~2 ms each, 20 s for 5,000 rank files)
    windows_of = _by_rank(windows)
    kinds_of = _by_rank(kinds)
    ranks_out = []
    for row in ts.ranks.iter_rows(named=True):
        own_windows = windows_of.get(row["rank"], windows.clear())
        own = kinds_of.get(row["rank"], kinds.clear())
        stored = int(own["n"].sum())
        dropped: dict[str, int] = {}
        for fid in own_windows["file_id"].to_list():
            if owner.get(fid) == row["rank"]:
                for reason, n in orjson.loads(files[fid]["dropped"] or "{}").items():
                    dropped[reason] = dropped.get(reason, 0) + n
        ranks_out.append({
            "rank": row["rank"], "file": files[row["file_id"]]["path"], "source": row["source"],
            "world_size": row["world_size"], "rank_from": row["rank_from"],
            "input_events": stored + sum(dropped.values()), "stored_events": stored,
            "dropped": dropped,
            "kinds": dict(sorted(zip(own["kind"].to_list(), own["n"].to_list()))),
            "unlaunched_gpu_events": unlaunched.get(row["rank"], 0),
            "windows": [{"window": w["window"], "file": w["path"],
                         "first_step": w["first_step"], "last_step": w["last_step"],
                         "start_ns": w["start_ns"], "end_ns": w["end_ns"]}
                        for w in own_windows.iter_rows(named=True)],
        })
    total_dropped: dict[str, int] = {}
    for r in ranks_out:
        for reason, n in r["dropped"].items():
            total_dropped[reason] = total_dropped.get(reason, 0) + n
    total_kinds = kinds.group_by("kind").agg(pl.col("n").sum()).sort("kind")
    return {
        "files": ts.files.height,
        "input_events": sum(r["input_events"] for r in ranks_out),
        "stored_events": sum(r["stored_events"] for r in ranks_out),
        "dropped": total_dropped,
        "kinds": dict(zip(total_kinds["kind"].to_list(), total_kinds["n"].to_list())),
        "unlaunched_gpu_events": sum(r["unlaunched_gpu_events"] for r in ranks_out),
        "ranks": ranks_out,
        "skipped": [{"file": f, "error": e} for f, e in ts.skipped],
        "warnings": ts.warnings,
    }


def _by_rank(frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
    """``frame``'s rows of each rank, in their order."""
    return {rank: rows for (rank,), rows in frame.partition_by("rank", as_dict=True,
                                                               maintain_order=True).items()}


def _kind_counts(ts: Any) -> pl.DataFrame:
    """``rank, kind, n``: the events of each kind per rank; from what the ingest noted when
    it did (``TraceSet.rank_facts``: nothing read back), else counted from the events."""
    if ts.rank_facts is not None:
        return pl.DataFrame([(rank, kind, n) for (rank, _), facts in ts.rank_facts.items()
                             for kind, n in facts["kinds"].items()],
                            schema={"rank": pl.Int32, "kind": pl.String, "n": pl.UInt32},
                            orient="row")
    return (ts.events.group_by("rank", "kind").agg(pl.len().alias("n"))
            .collect().with_columns(pl.col("kind").cast(pl.String)))


def _unlaunched_by_rank(ts: Any) -> dict[int, int]:
    """Rank -> GPU events whose launch is not in the trace (``launches.unlaunched_gpu``); as
    the ingest counted them on its rows when it did (``TraceSet.rank_facts``)."""
    if ts.rank_facts is not None:
        return {rank: facts["unlaunched_gpu_events"]
                for (rank, _), facts in ts.rank_facts.items()
                if facts["unlaunched_gpu_events"]}
    events = ts.analysis_events()
    gpu = gpu_events(events).select("rank", "correlation").collect()
    if gpu.height == 0:
        return {}  # nothing on a GPU (CPU-only traces): no launch lookup to pay for
    counts = unlaunched_gpu(gpu, events).group_by("rank").agg(pl.len())
    return dict(counts.iter_rows())


def _print_info(report: dict[str, Any], every: bool = False) -> None:
    print(f"{len(report['ranks'])} ranks, {report['files']} files, "
          f"{report['stored_events']:,} events stored of {report['input_events']:,} read")

    ranks = report["ranks"]
    if not every and len(ranks) > MANY_RANKS:
        # a line per rank of 1,024 is no overview: the ranks that dropped events or have
        # several windows, then the first few (--all: every rank; --json: always every rank)
        odd = [r for r in ranks if r["dropped"] or len(r["windows"]) > 1]
        rest = [r for r in ranks if r not in odd]
        ranks = odd[:MANY_RANKS] + rest[:max(0, 8 - len(odd))]
    for r in ranks:
        top = ", ".join(f"{k} {v:,}" for k, v in sorted(r["kinds"].items(), key=lambda kv: -kv[1])
                        [:6])
        drop = f"; dropped {r['dropped']}" if r["dropped"] else ""
        print(f"  rank {r['rank']:>4}  {r['stored_events']:>10,} events  ({top}){drop}  "
              f"{r['file']}")
        if len(r["windows"]) > 1:  # one line per profiling window, times from the first
            _print_windows(r["windows"], origin=r["windows"][0]["start_ns"])
    if report["unlaunched_gpu_events"]:
        print(f"  {report['unlaunched_gpu_events']:,} GPU events have no launch in the trace "
              "(queued before the profiler started)")
    if len(ranks) < len(report["ranks"]):
        print(f"  ({len(report['ranks']) - len(ranks)} more ranks: `traceview info --all` "
              "lists every rank; --json holds every rank)")
    for s in report["skipped"]:
        print(f"  skipped: {one_line(s['error'])}")
    for w in report["warnings"]:
        print(f"  warning: {one_line(w)}")


def _print_windows(windows: list[dict[str, Any]], *, origin: int | None) -> None:
    for w in windows:
        steps = ("no steps" if w["first_step"] is None else
                 f"steps {w['first_step']}-{w['last_step']}")
        times = ("" if origin is None or w["start_ns"] is None else
                 f"  {(w['start_ns'] - origin) / 1e6:9.3f} - {(w['end_ns'] - origin) / 1e6:9.3f} ms")
        print(f"      window {w['window']:>3}  {steps}{times}  {w['file']}")


def _warn_all(report: dict[str, Any]) -> None:
    """The report's skipped files and warnings on stderr too (as every command's are), when
    stdout carries ``--json``."""
    for s in report["skipped"]:
        warn(f"skipped: {s['error']}")
    for w in report["warnings"]:
        warn(w)


def run_info(args: argparse.Namespace) -> int:
    report = info_report(open_traceset(args))
    if args.json:
        _warn_all(report)
        emit_json(report)
    else:
        _print_info(report, args.all)
    return 0


def run_ingest(args: argparse.Namespace) -> int:
    if args.output:  # checked before any input is read
        check_folder_target(args.output)
        refuse_input_overlap(args.output, args.paths)
    ts = open_traceset(args)
    out = ts.write_store(args.output) if args.output else None
    report = info_report(ts)
    report["store"] = str(out) if out else None
    if args.json:
        _warn_all(report)
        emit_json(report)
    else:
        _print_info(report, args.all)
        if out:
            print(f"store written to {out}")
    return 0


def run_sql(args: argparse.Namespace) -> int:
    if len(args.paths) < 2:
        raise UsageError("sql wants PATH... QUERY")
    *args.paths, query = args.paths
    ts = open_traceset(args)
    for warning in ts.warnings:  # stderr: the --json rows are the query's alone
        warn(warning)
    for _, reason in ts.skipped:
        warn(f"skipped: {reason}")
    # the classified GPU rows (`gpu`) are the Run's, made only when the query names them
    gpu = {"gpu": lambda: run_module.Run(ts, run_module.RunOptions()).gpu.lazy()}
    said = len(ts.notes)
    result = ts.sql(query, tables=gpu)
    # what the query's own reads said: a damaged kept table (the events compacted, the
    # classified GPU rows) discarded and made again, as every other command says it
    for note in ts.notes[said:]:
        warn(note)
    if args.json:
        emit_json(_jsonable(result))
    else:
        with pl.Config(tbl_rows=args.limit, tbl_cols=-1, fmt_str_lengths=60,
                       tbl_width_chars=160):
            print(result.head(args.limit))
    return 0


def _jsonable(frame: pl.DataFrame) -> list[dict[str, Any]]:
    casted = frame.with_columns(pl.col(pl.Categorical).cast(pl.String))
    return casted.to_dicts()

