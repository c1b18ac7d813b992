"""Subcommands for people and for CI: ``report``, ``diff``, ``baseline``, ``check``,
``export-perfetto``.

``--json`` contracts (fields may be added, never renamed):

* ``diff``: ``{"test", "base_rank_steps", "test_rank_steps", "metrics": [{"metric", "base",
  "test", "change", "change_pct", "p_value", "significant", "test_method", ...}],
  "kernels": [...], "cpu_ops": [...], "collectives": [...], "contributors": [{"kind", "name",
  "base_ns", "test_ns", "delta_ns", "share_of_step_change"}]}``
* ``check``: ``{"status", "exit_code", "counts", "metrics": [{"metric", "unit", "baseline",
  "now", "allowed", "tolerance_pct", "change_pct", "status", "note", "change_frac",
  "baseline_runs", "spread", "noise_allowed", "p_value", "test_method"}], "warnings",
  "damaged_input"}`` (``change_pct`` percent, ``change_frac`` and diff's ``change_pct`` a
  fraction)
* ``report`` / ``export-perfetto`` / ``baseline``: ``{"output", ...counts}``.

``check`` exits 0 within tolerance, 1 on a regression or on damaged input (the Run's
``warnings``; unless ``--allow-partial``), 2 on bad input (unreadable traces or baseline, bad
``--tolerance``). ``baseline`` learns from one run (PATHs) or several (``--run DIR`` each). The CLI only formats: numbers come from the analyses.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

from traceview.cli._options import (
    MAX_ROWS,
    add_include_osrt_arg,
    add_input_args,
    add_json_arg,
    add_window_args,
    open_run,
    real,
    whole,
)
from traceview.cli._render import dumps, emit_json, ms, short, table, warn
from traceview.errors import UsageError
from traceview.outputs import gate
from traceview.outputs.diff import diff_tables, run_tables
from traceview.outputs.perfetto import export
from traceview.outputs.report import gather, write_html
from traceview.store.safe_write import check_file_target, refuse_input_overlap, write_text


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    {"report": _report_options, "diff": _diff_options, "baseline": _baseline_options,
     "check": _check_options, "export-perfetto": _export_options}[command](p)


def _report_options(p: argparse.ArgumentParser) -> None:
    _inputs(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="HTML file to write")
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, metavar="N", help="kernels / gaps to list")
    p.add_argument("--nccl-log", nargs="+", default=[], metavar="FILE",
                   help="NCCL debug logs: add the algorithms and protocols NCCL chose")
    p.set_defaults(run=run_report)


def _diff_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", metavar="BASE", help="baseline run (traces, folder or store)")
    p.add_argument("test", metavar="TEST", help="run to compare")
    p.add_argument("--alpha", type=real(0, 1, above_low=True), default=0.05, help="significance level (0.05)")
    p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, metavar="N", help="contributors to list")
    _shared(p)
    p.set_defaults(run=run_diff)


def _baseline_options(p: argparse.ArgumentParser) -> None:
    _inputs(p, optional=True)
    p.add_argument("--run", action="append", default=[], metavar="PATH", dest="runs",
                   help="one run of the job (traces, folder or store); repeat for each run "
                        "to learn the run-to-run spread (3 or more recommended)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="baseline JSON to write")
    p.add_argument("--tolerance", action="append", default=[], metavar="METRIC=PCT",
                   help="store a tolerance for a metric in the baseline (repeatable; all=PCT)")
    p.set_defaults(run=run_baseline)


def _check_options(p: argparse.ArgumentParser) -> None:
    _inputs(p)
    p.add_argument("--baseline", required=True, metavar="FILE", help="from `traceview baseline`")
    p.add_argument("--tolerance", action="append", default=[], metavar="METRIC=PCT",
                   help="allowed increase in percent (repeatable; all=PCT sets every metric)")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    p.add_argument("--allow-partial", action="store_true",
                   help="judge damaged input (truncated files, dropped events, skipped files) "
                        "instead of failing it")
    p.add_argument("--noise-k", type=real(0, 1e6), default=None, metavar="K",
                   help="a change must exceed K x the baseline runs' spread (default: the "
                        "baseline's, 3)")
    p.add_argument("--alpha", type=real(0, 1, above_low=True), default=None, metavar="A",
                   help="significance level of the one-sided step test (default: the "
                        "baseline's, 0.01)")
    p.add_argument("--min-effect", type=real(0, 1e6), default=None, metavar="D",
                   help="the steps must move by D robust standard deviations of their noise "
                        "(default: the baseline's, 3)")
    p.set_defaults(run=run_check)


def _export_options(p: argparse.ArgumentParser) -> None:
    _inputs(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="JSON file to write")
    p.add_argument("--critical-path", action="store_true",
                   help="draw the cross-rank critical path (traceview critical-path)")
    p.set_defaults(run=run_export)


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable files")
    p.add_argument("--no-cache", action="store_true", help="do not read or write a cache")
    p.add_argument("--cache-dir", metavar="DIR", help="where the Parquet cache lives")
    add_include_osrt_arg(p)
    add_window_args(p)
    p.add_argument("--align", choices=("auto", "collectives", "host", "none"), default="auto",
                   help="clock alignment across ranks (default auto)")
    add_json_arg(p)


def _inputs(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    add_input_args(p, optional=optional)
    add_window_args(p)
    p.add_argument("--align", choices=("auto", "collectives", "host", "none"), default="auto",
                   help="clock alignment across ranks (default auto)")
    add_json_arg(p)


def _open(args: argparse.Namespace, paths: list[str] | None = None) -> Any:
    """The Run of the command's inputs (or of ``paths``), window and alignment."""
    ns = argparse.Namespace(**vars(args))
    if paths is not None:
        ns.paths, ns.rank_map = paths, []
    run = open_run(ns)
    for warning in run.warnings:
        warn(warning)
    return run


def _output(args: argparse.Namespace, path: str, option: str = "-o") -> str:
    """``path`` checked as a file to write before any input is read: its folder exists, it is
    not a folder, and it is none of the command's inputs nor inside an input folder."""
    check_file_target(path, option=option)
    inputs = [*(getattr(args, "paths", None) or []), *(getattr(args, "runs", None) or []),
              *(p for p in (getattr(args, "baseline", None), getattr(args, "comm_config", None))
                if p)]
    refuse_input_overlap(path, inputs, option=option)
    return path


def run_report(args: argparse.Namespace) -> int:
    _output(args, args.output)
    run = _open(args)
    title = args.title or "traceview report: " + ", ".join(Path(p).name for p in args.paths)
    data = gather(run, title=title, top=args.top, nccl_logs=args.nccl_log)
    buf = io.StringIO()
    figures = write_html(data, buf)
    write_text(args.output, buf.getvalue())
    sections = {k: v for k, v in data.notes.items()}
    for warning in data.warnings[len(run.warnings):]:  # the inputs' were printed on opening
        warn(warning)
    if args.json:
        emit_json({"output": args.output, "figures": figures, "ranks": data.meta["ranks"],
                   "partial_sections": sections, "worst_straggler": data.worst_straggler,
                   "warnings": data.warnings})
        return 0
    print(f"wrote {args.output} ({figures} figures, {data.meta['ranks']} ranks)")
    for section, items in sections.items():
        for item in items:
            print(f"note: {section}: {item}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    base = _open(args, [args.base])
    test = _open(args, [args.test])
    res = diff_tables(run_tables(base), run_tables(test), alpha=args.alpha, top=args.top)
    # Both runs' warnings, each naming its file (printed on stderr as each run opened).
    warnings = [*base.warnings, *base.table_warnings("match", "offsets"),
                *test.warnings, *test.table_warnings("match", "offsets")]
    for warning in warnings[len(base.warnings):]:
        if warning not in test.warnings:
            warn(warning)
    if args.json:
        emit_json({**res.to_dict(), "warnings": warnings})
        return 0
    print(f"base: {args.base} ({res.base_rank_steps} rank-steps)   "
          f"test: {args.test} ({res.test_rank_steps} rank-steps)")
    print("significance: two-sided Mann-Whitney U over per-step samples, "
          f"alpha {args.alpha:g}")
    print(table(["metric", "base_ms", "test_ms", "change_ms", "change", "p", "significant",
                 "note"],
                [[r["metric"], ms(r["base"]), ms(r["test"]), ms(r["change"]),
                  None if r["change_pct"] is None else f"{100 * r['change_pct']:+.1f}%",
                  None if r["p_value"] is None else f"{r['p_value']:.2g}",
                  None if r["significant"] is None else ("yes" if r["significant"] else "no"),
                  r["note"] or ""]
                 for r in res.metrics.iter_rows(named=True)],
                left={"metric", "significant", "note"}, max_width=None))
    print("\nTop contributors (ms per rank-step, test - base)")
    print(table(["kind", "base_ms", "test_ms", "delta_ms", "name"],
                [[r["kind"], ms(r["base_ns"]), ms(r["test_ns"]), ms(r["delta_ns"]),
                  short(r["name"], 70)] for r in res.contributors.iter_rows(named=True)],
                left={"kind", "name"}, max_width=70))
    return 0


def _inputs_info(run: Any) -> dict[str, Any]:
    files = sorted(Path(p).name for p in run.files["path"].to_list())
    return {"files": files, "ranks": len(run.ranks_present)}


def _baseline_runs(args: argparse.Namespace) -> list[list[str]]:
    """The runs to learn from: the PATHs as one run, or each ``--run``."""
    if args.paths and args.runs:
        raise UsageError("baseline: give PATHs (one run) or --run PATH for each run, not both")
    if not args.paths and not args.runs:
        raise UsageError("baseline: no input; give PATHs (one run) or --run PATH per run")
    return [[r] for r in args.runs] if args.runs else [args.paths]


def run_baseline(args: argparse.Namespace) -> int:
    tolerances = gate.parse_tolerances(args.tolerance)
    _output(args, args.output)
    measured, inputs, notes = [], [], []
    for paths in _baseline_runs(args):
        run = _open(args, paths)
        measured.append(gate.measure(run))
        inputs.append(_inputs_info(run))
        notes += run.traceset.notes
    doc = gate.baseline(measured, inputs=inputs, tolerances=tolerances)
    write_text(args.output, dumps(doc) + "\n")
    if args.json:
        emit_json({"output": args.output, "runs": len(measured), "metrics": doc["metrics"],
                   "warnings": doc["warnings"], "notes": notes})
        return 0
    print(f"wrote {args.output} ({len(measured)} run{'s' if len(measured) > 1 else ''})")
    for name, entry in doc["metrics"].items():
        unit = entry["unit"]
        v, spread = entry["value"], entry["spread"]
        shown = "-" if v is None else (f"{v / 1e6:.3f} ms" if unit == "ns" else f"{v:.4f}")
        noise = ("" if len(measured) < 2 or spread is None else
                 f"  spread {spread / 1e6:.3f} ms" if unit == "ns" else f"  spread {spread:.4f}")
        print(f"  {name:<36}{shown:>14}{noise}"
              + (f"  ({entry['note']})" if "note" in entry else ""))
    for w in doc["warnings"]:
        print(f"warning recorded: {w}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    tolerances = gate.parse_tolerances(args.tolerance)
    if args.junit:
        _output(args, args.junit, "--junit")
    path = Path(args.baseline)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise gate.BaselineError(f"{path}: cannot read baseline ({exc.strerror})") from None
    doc = gate.read_baseline(text, source=str(path))
    run = _open(args)
    now = gate.measure(run)
    result = gate.check(now.values, doc, tolerances=tolerances, now_notes=now.notes,
                        now_samples=now.samples, warnings=now.warnings,
                        allow_partial=args.allow_partial, noise_k=args.noise_k,
                        alpha=args.alpha, min_effect=args.min_effect)
    if args.junit:
        write_text(args.junit, gate.junit_xml(result))
    if args.json:  # notes: how the input was read (the cache), no damage of it
        emit_json({**result.to_dict(), "notes": list(run.traceset.notes)})
        return result.exit_code
    for w in result.warnings:
        print(f"{'FAIL' if result.damaged else 'warn'} damaged input: {w}")
    for row in result.rows.iter_rows(named=True):
        mark = {"ok": "ok  ", "regression": "FAIL", "missing": "FAIL"}.get(row["status"], "skip")
        print(f"{mark} {gate.describe(row)}")
    counts = result.to_dict()["counts"]
    failed = counts.get("regression", 0) + counts.get("missing", 0)
    print(f"check: {result.status.upper()}: {counts.get('ok', 0)} ok, "
          f"{failed} failed, {len(result.rows) - counts.get('ok', 0) - failed} skipped"
          + (" (damaged input: rerun the profile, or pass --allow-partial to judge it)"
             if result.damaged else ""))
    return result.exit_code


def run_export(args: argparse.Namespace) -> int:
    _output(args, args.output)
    buf = io.StringIO()
    run = _open(args)
    info = export(run, buf, critical_path=getattr(args, "critical_path", False))
    write_text(args.output, buf.getvalue())
    table_warnings = run.table_warnings("match", "offsets")  # the inputs' were printed already
    for warning in table_warnings:
        warn(warning)
    if args.json:
        emit_json({"output": args.output, **info, "warnings": [*run.warnings, *table_warnings]})
        return 0
    print(f"wrote {args.output}: {info['events']} events, {info['ranks']} ranks "
          f"(one process each), {info['gaps']} idle gaps, {info['waits']} collective waits; "
          f"alignment {', '.join(info['alignment']) or 'none'}"
          + (f"; stragglers: {', '.join(map(str, info['stragglers']))}"
             if info["stragglers"] else ""))
    return 0
