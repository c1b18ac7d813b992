"""Subcommands for people and for CI: ``report``, ``diff``, ``baseline``, ``check``,
``export-perfetto``.

``--json`` contracts (fields may be added, never renamed):

* ``diff``: ``{"test", "stat_test", "base_rank_steps", "test_rank_steps", "metrics":
  [{"metric", "base", "test", "change", "change_pct", "change_frac", "p_value", "significant",
  "test_method", ...}], "kernels": [...], "cpu_ops": [...], "collectives": [...] (each with
  ``base_count_per_step`` / ``test_count_per_step``), "contributors": [{"kind", "name",
  "base_ns", "test_ns", "delta_ns", "share_of_step_change"}], "base_path", "test_path",
  "warnings"}``. ``change_pct`` is a **fraction** here (as it always was; ``change_frac`` is
  the same number under a name that says so); ``test`` and ``stat_test`` both name the
  statistical test.
* ``check``: ``{"status", "exit_code", "counts", "metrics": [{"metric", "unit", "baseline",
  "now", "allowed", "tolerance_pct", "change_pct", "status", "note", "change_frac",
  "baseline_runs", "spread", "noise_allowed", "p_value", "test_method"}], "warnings",
  "damaged_input"}`` (``change_pct`` percent, ``change_frac`` and diff's ``change_pct`` a
  fraction)
* ``report`` / ``export-perfetto`` / ``baseline``: ``{"output", ...counts}``; ``report
  --history`` adds ``"history": {"db", "metric", "runs", "current"}``.
* ``check --history URL``: the same fields as with ``--baseline``, plus ``"history"``,
  ``"label"``, ``"last"`` and ``"history_runs"`` (the ids of the runs the baseline was made
  of).

``check`` exits 0 within tolerance, 1 on a regression or on damaged input (the Run's
``warnings``; unless ``--allow-partial``) or on an inconclusive metric with ``--inconclusive
fail`` (the default ``pass`` reports it and exits 0), 2 on bad input (unreadable traces or baseline, bad
``--tolerance``). ``baseline`` learns from one run (PATHs) or several (``--run DIR`` each). The CLI only formats: numbers come from the analyses.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
from dataclasses import replace
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
from traceview._dependencies import lazy_module
from traceview.cli._render import dumps, emit_json, ms, short, table, warn, warnings_for
from traceview.errors import UsageError
from traceview.outputs import gate
from traceview.outputs.perfetto import export
from traceview.parsers import file_problem
from traceview.outputs.report import (
    PLOTLY_CDN,
    PLOTLY_INLINE,
    gather,
    shared_plotly,
    write_html,
)
from traceview.outputs.report_data import HistoryTrend
from traceview.store.safe_write import (
    atomic_write,
    check_file_target,
    refuse_input_overlap,
    write_text,
)

#: The results database (SQLAlchemy) only for --history: the other commands do not pay for it.
history = lazy_module("traceview.outputs.history")


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
    p.add_argument("--fr-dumps", nargs="+", default=[], metavar="DUMPS",
                   help="flight-recorder dumps (or folders): add the hang verdict "
                        "(traceview hang)")
    p.add_argument("--plotly", default="inline", metavar="inline|cdn|FILE",
                   help="where the figures' plotly.js comes from: inline (default: one "
                        "self-contained file), cdn (loaded from cdn.plot.ly when opened), or "
                        "FILE: a shared copy written there once, which reports of many runs "
                        "reference instead of holding 4.9 MB each")
    p.add_argument("--history", metavar="URL", default=None,
                   help="add the trend of a gate metric over the runs recorded in this "
                        "database (`traceview history record`), this run marked")
    p.add_argument("--history-metric", default="step_time_p50_ns", metavar="NAME",
                   choices=list(gate.METRICS), help="the metric of the trend (step_time_p50_ns)")
    p.add_argument("--history-label", default=None, metavar="GLOB",
                   help="only recorded runs whose label matches")
    p.add_argument("--history-last", type=int, default=30, metavar="N",
                   help="the last N matching recorded runs (default 30)")
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
    p.add_argument("--baseline", metavar="FILE", help="from `traceview baseline`")
    p.add_argument("--history", metavar="URL",
                   help="instead of --baseline: the last --last runs recorded with `traceview "
                        "history record` in this database (a SQLite path or a URL)")
    p.add_argument("--last", type=int, default=DEFAULT_HISTORY_RUNS, metavar="N",
                   help=f"--history: the last N matching runs (default {DEFAULT_HISTORY_RUNS})")
    p.add_argument("--label", default=None, metavar="GLOB",
                   help="--history: only runs whose label matches (e.g. main)")
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
    p.add_argument("--inconclusive", choices=gate.INCONCLUSIVE_POLICIES,
                   default=gate.DEFAULT_INCONCLUSIVE,
                   help="a metric beyond its tolerance that the evidence cannot decide: 'pass' "
                        "(exit 0, reported INCONCLUSIVE; the default) or 'fail' (exit 1)")
    p.set_defaults(run=run_check)


#: check --history: the recorded runs that make the baseline (docs/ci-gate.md recommends 3-5).
DEFAULT_HISTORY_RUNS = 5


def _export_options(p: argparse.ArgumentParser) -> None:
    _inputs(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="JSON file to write (gzip-compressed when it ends in .gz)")
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
              *(getattr(args, "graph_capture", None) or []),
              *(p for p in (getattr(args, "baseline", None), getattr(args, "comm_config", None))
                if p)]
    refuse_input_overlap(path, inputs, option=option)
    return path


def run_report(args: argparse.Namespace) -> int:
    _output(args, args.output)
    if args.plotly not in (PLOTLY_INLINE, PLOTLY_CDN):
        _output(args, args.plotly, "--plotly")  # before any trace is read
    db = None
    if args.history is not None:
        if args.history_last < 1:
            raise UsageError(f"report: --history-last wants a number >= 1, got "
                             f"{args.history_last}")
        db = _history_if_any(args.history, "report")
    run = _open(args)
    title = args.title or "traceview report: " + ", ".join(Path(p).name for p in args.paths)
    data = gather(run, title=title, top=args.top, nccl_logs=args.nccl_log,
                  fr_dumps=args.fr_dumps)
    if db is not None:
        data = replace(data, history=_history_trend(args, db, run))
    buf = io.StringIO()
    figures = write_html(data, buf, plotly=_plotly_source(args))
    write_text(args.output, buf.getvalue())
    sections = {k: v for k, v in data.notes.items()}
    for warning in data.warnings[len(run.warnings):]:  # the inputs' were printed on opening
        warn(warning)
    if args.json:
        emit_json({"output": args.output, "figures": figures, "ranks": data.meta["ranks"],
                   "partial_sections": sections, "worst_straggler": data.worst_straggler,
                   "bound": data.bound,  # the run's, as summary, overlap and diagnose
                   "warnings": data.warnings,
                   **({} if data.history is None else {"history": {
                       "db": data.history.source, "metric": data.history.metric,
                       "runs": data.history.runs["id"].to_list(),
                       "current": data.history.current}})})
        return 0
    print(f"wrote {args.output} ({figures} figures, {data.meta['ranks']} ranks)")
    for section, items in sections.items():
        for item in items:
            print(f"note: {section}: {item}")
    return 0


def _plotly_source(args: argparse.Namespace) -> str:
    """``--plotly``: inline, cdn, or a shared copy written now (never over an input), named
    in the report relative to the report's folder."""
    if args.plotly in (PLOTLY_INLINE, PLOTLY_CDN):
        return args.plotly
    copy = Path(args.plotly)
    _output(args, args.plotly, "--plotly")
    shared_plotly(copy)
    return Path(os.path.relpath(copy.resolve(), Path(args.output).resolve().parent)).as_posix()


def _history_if_any(url: str, command: str) -> Any:
    """The history database ``url`` names, checked before any trace is read (one that cannot
    be used is exit 2); None, with a warning, where there is none yet: a SQLite file no run
    was recorded into, or an empty URL (an unset secret on a fork's pull request). The first
    run of a CI job then passes and reports without a trend, instead of failing."""
    try:
        db = history.open_database(url, create=False)
    except history.NoHistoryYet as exc:
        warn(f"{command}: {exc}; going on without recorded runs")
        return None
    history.probe(db)
    return db


def _history_trend(args: argparse.Namespace, db: Any, run: Any) -> HistoryTrend:
    """The report's trend: the metric over the recorded runs and this run's value."""
    stored = history.recorded_runs(db, label=args.history_label, last=args.history_last)
    metric = args.history_metric
    return HistoryTrend(metric, gate.METRICS[metric][0], history.trend(stored, metric),
                        gate.measure(run).values.get(metric), db.where)


def run_diff(args: argparse.Namespace) -> int:
    base = _open(args, [args.base])
    test = _open(args, [args.test])
    res = base.diff(test, alpha=args.alpha, top=args.top)  # = Run.diff in Python
    # Both runs' warnings, each naming its file (the inputs' printed as each run opened).
    for warning in warnings_for(res, args):
        if warning not in base.warnings and warning not in test.warnings:
            warn(warning)
    if args.json:
        doc = res.to_dict()  # the inputs compared, beside the Result's fields
        emit_json({**doc, "base_path": args.base, "test_path": args.test})
        return 0
    print(f"base: {args.base} ({res['base_rank_steps']} rank-steps)   "
          f"test: {args.test} ({res['test_rank_steps']} rank-steps)")
    print("significance: two-sided Mann-Whitney U over per-step samples, "
          f"alpha {args.alpha:g}")
    print(table(["metric", "base_ms", "test_ms", "change_ms", "change", "p", "significant",
                 "note"],
                [[r["metric"], ms(r["base"]), ms(r["test"]), ms(r["change"]),
                  None if r["change_pct"] is None else f"{100 * r['change_pct']:+.1f}%",
                  None if r["p_value"] is None else f"{r['p_value']:.2g}",
                  None if r["significant"] is None else ("yes" if r["significant"] else "no"),
                  r["note"] or ""]
                 for r in res["metrics"].iter_rows(named=True)],
                left={"metric", "significant", "note"}, max_width=None))
    print("\nTop contributors (ms per rank-step, test - base)")
    print(table(["kind", "base_ms", "test_ms", "delta_ms", "name"],
                [[r["kind"], ms(r["base_ns"]), ms(r["test_ns"]), ms(r["delta_ns"]),
                  short(r["name"], 70)] for r in res["contributors"].iter_rows(named=True)],
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
    if (args.baseline is None) == (args.history is None):
        raise UsageError("check: give --baseline FILE or --history URL (one of them)")
    if args.history is None and (args.label is not None
                                 or args.last != DEFAULT_HISTORY_RUNS):
        raise UsageError("check: --label and --last choose runs of --history")
    if args.last < 1:
        raise UsageError(f"check: --last wants a number >= 1, got {args.last}")
    if args.junit:
        _output(args, args.junit, "--junit")
    source: dict[str, Any] = {}
    if args.history is not None:
        db = _history_if_any(args.history, "check")  # before the traces are read
        run = _open(args)
        now = gate.measure(run)
        # the run being checked is no evidence about itself, if it was recorded already
        _, digest = history.inputs_of(run.files)
        stored = [] if db is None else history.recorded_runs(
            db, label=args.label, last=args.last, exclude_inputs=digest)
        if stored:
            doc = history.baseline_doc(stored, source=db.where)
        else:  # the first run: every metric is "not_in_baseline" (skipped), the gate passes
            if db is not None:
                warn(f"check: {db.where}: no recorded run matches"
                     + (f" label {args.label}" if args.label else "")
                     + ": nothing to compare with yet (`traceview history record` builds "
                     "the baseline); passing")
            doc = {"metrics": {}}
        source = {"history": None if db is None else db.where, "label": args.label,
                  "last": args.last, "history_runs": [s.id for s in stored]}
    else:
        path = Path(args.baseline)
        problem = file_problem(path)  # before opening: a FIFO would block the open
        if problem:
            raise gate.BaselineError(f"{path}: cannot read baseline ({problem})")
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
                        alpha=args.alpha, min_effect=args.min_effect,
                        inconclusive=args.inconclusive)
    if args.junit:
        write_text(args.junit, gate.junit_xml(result))
    if args.json:  # notes: how the input was read (the cache), no damage of it
        emit_json({**result.to_dict(), "notes": list(run.traceset.notes), **source})
        return result.exit_code
    if source and not source["history_runs"]:
        print("baseline: no recorded run yet: every metric skipped")
    elif source:
        ids = source["history_runs"]
        print(f"baseline: {len(ids)} recorded run{'s' if len(ids) > 1 else ''} "
              f"(#{', #'.join(map(str, ids))}) from {source['history']}"
              + (f", label {args.label}" if args.label else ""))
    for w in result.warnings:
        print(f"{'FAIL' if result.damaged else 'warn'} damaged input: {w}")
    for row in result.rows.iter_rows(named=True):
        mark = {"ok": "ok  ", "regression": "FAIL", "missing": "FAIL",
                "inconclusive": "FAIL inconclusive:" if args.inconclusive == "fail"
                else "INCONCLUSIVE"}.get(row["status"], "skip")
        print(f"{mark} {gate.describe(row)}")
    counts = result.to_dict()["counts"]
    failed = counts.get("regression", 0) + counts.get("missing", 0)
    undecided = counts.get("inconclusive", 0)
    skipped = len(result.rows) - counts.get("ok", 0) - failed - undecided
    print(f"check: {result.status.upper()}: {counts.get('ok', 0)} ok, {failed} failed, "
          + (f"{undecided} inconclusive ("
             + ("failing: --inconclusive fail), " if args.inconclusive == "fail" else
                "not failing the job; --inconclusive fail would), ")
             if undecided else "") + f"{skipped} skipped"
          + (" (damaged input: rerun the profile, or pass --allow-partial to judge it)"
             if result.damaged else ""))
    return result.exit_code


def run_export(args: argparse.Namespace) -> int:
    _output(args, args.output)
    buf = io.StringIO()
    run = _open(args)
    info = export(run, buf, critical_path=getattr(args, "critical_path", False))
    if args.output.endswith(".gz"):  # the name says gzip: Perfetto and chrome://tracing read it
        data = gzip.compress(buf.getvalue().encode(), compresslevel=6, mtime=0)
        atomic_write(Path(args.output), lambda tmp: tmp.write_bytes(data))
    else:
        write_text(args.output, buf.getvalue())
    table_warnings = run.table_warnings("match", "offsets")  # the inputs' were printed already
    for warning in (table_warnings if getattr(args, "verbose", False)
                    else run.plain_table_warnings("match", "offsets")):
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
