"""Capture-side subcommands: ``capture nsys`` and ``validate``.

``validate RUN_DIR [--json]`` exits 0 when the run is fine, 1 when it found problems, 2 when
nothing in RUN_DIR can be read. ``--json``: ``{"run_dir", "ok", "ranks", "world_size",
"files", "problems": [{"code", "rank", "file", "message", "fix", ...}]}``.

``capture nsys [--output DIR] -- COMMAND...`` prints the ``nsys profile`` command, runs it,
exports each report to SQLite and validates the exports. ``--dry-run`` only prints.
``--json``: ``{"command", "command_line", "output_dir", "returncode", "reports", "exports",
"problems"}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

import traceview
from traceview.capture import RUN_FILE
from traceview.capture.nsys import NOT_INSTALLED, export_command, find_nsys, nsys_command
from traceview.capture.validate import Problem, files_frame, validate
from traceview.cli._options import add_json_arg
from traceview.cli._render import emit_json, warn
from traceview.errors import TraceviewError, UnreadableTraceError, UsageError
from traceview.schema import empty_events
from traceview.store.ingest import discover


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    if command == "validate":
        _validate_options(p)
    else:
        _capture_options(p)


def _validate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="directory of per-rank traces")
    p.add_argument("--no-cache", action="store_true", help="do not read or write a cache")
    p.add_argument("--cache-dir", metavar="DIR", help="where the Parquet cache lives")
    add_json_arg(p)
    p.set_defaults(run=run_validate)


def _capture_options(cap: argparse.ArgumentParser) -> None:
    cap_sub = cap.add_subparsers(dest="capture_command", metavar="TOOL")
    n = cap_sub.add_parser("nsys", help="run a command under nsys, export to SQLite, validate")
    n.add_argument("--output", "-o", default="nsys-run", metavar="DIR",
                   help="directory for the per-rank reports (default: nsys-run)")
    n.add_argument("--osrt", action="store_true", help="also trace OS runtime calls")
    n.add_argument("--no-cuda-memory-usage", action="store_true",
                   help="do not record CUDA memory usage")
    n.add_argument("--capture-range", choices=("cudaProfilerApi", "none"),
                   default="cudaProfilerApi",
                   help="cudaProfilerApi: record between cudaProfilerStart/Stop (see "
                        "traceview.capture.profile(cuda_profiler_api=True)); none: whole run")
    n.add_argument("--rank-var", default="RANK", metavar="VAR",
                   help="environment variable holding the rank (SLURM_PROCID under srun)")
    n.add_argument("--nsys", default="nsys", metavar="PATH", help="nsys executable")
    n.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    add_json_arg(n)
    n.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to profile")
    n.set_defaults(run=run_capture_nsys)
    cap.set_defaults(run=lambda args: _no_tool(cap))


def _no_tool(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# ----------------------------------------------------------------------------- validate
def load_run(paths: list[Path], *, cache: bool = True, cache_dir: str | None = None
             ) -> tuple[pl.LazyFrame, pl.DataFrame]:
    """Open each file on its own: (events of the readable files, files table).

    One file at a time so that two files claiming one rank, or an unreadable file, become
    problems to report rather than an error that stops the check.
    """
    frames: list[pl.DataFrame] = []
    rows: list[dict[str, Any]] = []
    said: set[str] = set()
    for file_id, path in enumerate(paths):
        try:
            ts = traceview.open([path], cache=cache, cache_dir=cache_dir)
        except TraceviewError as exc:
            rows.append({"file_id": file_id, "path": str(path), "error": str(exc)})
            continue
        for note in ts.traceset.notes:  # the cache's word (once, not once per file)
            if note not in said:
                said.add(note)
                warn(note)
        f = ts.files.row(0, named=True)
        for r in ts.ranks.iter_rows(named=True):
            rows.append({"file_id": file_id, "path": str(path), "rank": r["rank"],
                         "rank_from": r["rank_from"], "world_size": r["world_size"],
                         "warnings": f["warnings"], "dropped": f["dropped"],
                         **{k: r.get(k) for k in ("source", "host", "backend", "pg_config")}})
        # collected now: without a cache the TraceSet's temporary directory dies with it
        frames.append(ts.events.with_columns(pl.lit(file_id, pl.Int32).alias("file_id"))
                      .collect())
    if not frames:
        return empty_events().lazy(), files_frame(rows)
    return pl.concat(frames, how="vertical").lazy(), files_frame(rows)


def read_run_info(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """run.json as a dict (None when absent) and a problem text when it is unreadable."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return None, None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{path}: {exc}"
    return (info, None) if isinstance(info, dict) else (None, f"{path}: not a JSON object")


def validate_paths(run_dir: Path, paths: list[Path], *, cache: bool = True,
                   cache_dir: str | None = None) -> tuple[dict[str, Any], int]:
    """The validate report and its exit code for these trace files of ``run_dir``."""
    events, files = load_run(paths, cache=cache, cache_dir=cache_dir)
    if files.filter(pl.col("error").is_null()).height == 0:
        errors = "; ".join(files.get_column("error").to_list())
        raise UnreadableTraceError(run_dir, f"no readable trace ({errors})")
    info, bad = read_run_info(run_dir)
    problems = validate(events, files, run_info=info)
    if bad:
        problems.insert(0, Problem("bad_run_json", bad, "run.json is written by rank 0 of "
                                   "traceview.capture.profile: do not edit it by hand; "
                                   "delete it to validate the traces alone"))
    ok_files = files.filter(pl.col("error").is_null())
    report = {
        "run_dir": str(run_dir),
        "ok": not problems,
        "ranks": sorted({int(r) for r in ok_files.get_column("rank").drop_nulls().to_list()}),
        "world_size": (info or {}).get("world_size") or ok_files.get_column("world_size").max(),
        "files": files.get_column("path").unique(maintain_order=True).to_list(),
        "problems": [p.to_dict() for p in problems],
    }
    return report, (1 if problems else 0)


def run_validate(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UnreadableTraceError(run_dir, "not a directory")
    report, code = validate_paths(run_dir, discover([run_dir]), cache=not args.no_cache,
                                  cache_dir=args.cache_dir)
    if args.json:
        emit_json(report)
        return code
    _print_report(report)
    return code


def _print_report(report: dict[str, Any]) -> None:
    ranks = report["ranks"]
    print(f"{report['run_dir']}: {len(report['files'])} files, ranks "
          f"{','.join(map(str, ranks)) or 'none'} of world size {report['world_size']}")
    if report["ok"]:
        print("ok: every rank present once, steps, anchors and overlapping windows")
        return
    print(f"{len(report['problems'])} problem(s):")
    for p in report["problems"]:
        several = p["rank"] is None and len(p.get("ranks") or []) > 1  # said by the message
        where = (f"rank {p['rank']}" if p["rank"] is not None else "") + (
            f" {p['file']}" if p["file"] and p["rank"] is None and not several else "")
        print(f"- [{p['code']}]{' ' + where.strip() if where.strip() else ''}: {p['message']}")
        print(f"  fix: {p['fix']}")


# ----------------------------------------------------------------------------- capture nsys
def run_capture_nsys(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("capture nsys wants the command to profile after --")
    out = Path(args.output)
    try:
        cmd = nsys_command(command, output_dir=out, nsys=args.nsys, osrt=args.osrt,
                           cuda_memory_usage=not args.no_cuda_memory_usage,
                           capture_range=args.capture_range, rank_var=args.rank_var)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result: dict[str, Any] = {"command": cmd, "command_line": shlex.join(cmd),
                              "output_dir": str(out), "returncode": None, "reports": [],
                              "exports": [], "problems": []}
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    say(result["command_line"])
    if args.dry_run:
        if args.json:
            emit_json(result)
        return 0
    nsys = find_nsys(args.nsys)
    if nsys is None:
        raise UsageError(NOT_INSTALLED)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result["returncode"] = subprocess.call(cmd)
    reports = sorted(p for p in out.glob("*.nsys-rep") if p.stat().st_mtime >= started - 1)
    result["reports"] = [str(p) for p in reports]
    exports = []
    for rep in reports:
        exp = export_command(rep, nsys=nsys)
        say(shlex.join(exp))
        if subprocess.call(exp) == 0 and rep.with_suffix(".sqlite").is_file():
            exports.append(rep.with_suffix(".sqlite"))
        else:
            result["problems"].append({"code": "export_failed", "rank": None, "file": str(rep),
                                       "message": f"nsys export of {rep} failed",
                                       "fix": "run the export by hand to see nsys's message"})
    result["exports"] = [str(p) for p in exports]
    code = 0
    if not reports:
        result["problems"].append({
            "code": "no_report", "rank": None, "file": None,
            "message": f"nsys wrote no report into {out} (exit code {result['returncode']})",
            "fix": "with --capture-range cudaProfilerApi the program must call "
                   "cudaProfilerStart/Stop (traceview.capture.profile(cuda_profiler_api=True)); "
                   "or pass --capture-range none"})
        code = 2
    elif exports:
        report, vcode = validate_paths(out, exports)
        result["problems"] += report["problems"]
        code = max(code, vcode)
    if result["problems"] and code == 0:
        code = 1
    if result["returncode"]:
        code = max(code, 1)
    if args.json:
        emit_json(result)
    else:
        for p in result["problems"]:
            print(f"- [{p['code']}] {p['message']}\n  fix: {p['fix']}")
        print(f"{len(exports)} SQLite export(s) in {out}" + ("" if result["problems"] else
                                                            ", validated: ok"))
    return code
