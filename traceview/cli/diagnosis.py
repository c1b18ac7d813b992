"""Diagnosis subcommands: ``critical-path`` and ``diagnose``.

``--json`` outputs are contracts (field names stable; fields may be added):

* ``critical-path``: ``{"window", "ranks": [{"rank", "path_ns", "share", "top_category",
  "source" ("replay": the replay's longest path; "path": the measured one),
  "measured_path_ns", "measured_share"}],
  "steps": [{"step", "path_ns", "step_ns", "coverage", "top_rank", "top_rank_share",
  "jumps"}], "categories": {CATEGORY: {"path_ns", "per_step_ns", "share"}},
  "top_ops": [{"name", "category", "ranks", "path_ns", "per_step_ns", "share"}],
  "warnings"}``;
* ``diagnose``: ``{"window", "step_ns", "findings": [{"id", "title", "severity", "rank",
  "gain_ns_per_step", "gain_share", "evidence": [{"metric", "value", "unit", "text"}],
  "recommendation", "confidence", "path_ns_per_step", "path_share", "name"}], "bound":
  {"bound", "bound_share", "shares", "gpu_ranks", "window_ns", "path", "path_shares"} (the run's
  bound, as summary's and overlap's ``bound``; ``path``/``path_shares``: what the critical path
  is made of, docs/metrics.md), "mfu": {...} | null, "warnings"}``, findings in
  ``analyses.diagnose``'s order (gains of 3% of the step or more, kernel families, smaller
  gains), information (``severity`` ``info``) last; a refused MFU (above 100%) is null with
  ``refused`` true and its reason in ``warnings``.
"""

from __future__ import annotations

import argparse

from traceview.cli._options import (
    MAX_ROWS,
    add_align_arg,
    add_input_args,
    add_json_arg,
    add_window_args,
    open_run,
    real,
    whole,
)
from traceview.cli._render import emit_result, ms, pct, short, table
from traceview.outputs.words import finding_headline


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    add_input_args(p)
    add_json_arg(p, csv=True)
    add_window_args(p)
    add_align_arg(p)
    if command == "critical-path":
        p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, help="ops on the path to list")
        p.add_argument("--per-step", action="store_true",
                       help="list every step (default: the first 12); bare --steps too")
        _steps_also_a_flag(p)
        p.set_defaults(run=run_critical_path)
        return
    model = p.add_argument_group("model size, for MFU")
    model.add_argument("--params", type=real(0, 1e18, above_low=True), default=None, metavar="N",
                       help="model parameters (MFU: 6 x N FLOPs per token, training)")
    model.add_argument("--tokens-per-step", type=real(0, 1e18, above_low=True), default=None, metavar="T",
                       help="tokens per step, all ranks together")
    model.add_argument("--flops-per-step", type=real(0, 1e30, above_low=True), default=None, metavar="F",
                       help="model FLOPs per step, all ranks together (instead of N and T)")
    model.add_argument("--layers", type=whole(1, 1_000_000), default=None, help="layers (attention FLOPs)")
    model.add_argument("--hidden", type=whole(1, 1 << 30), default=None, help="hidden size (attention)")
    model.add_argument("--seq-len", type=whole(1, 1 << 40), default=None, help="sequence length (attention)")
    model.add_argument("--peak-tflops", type=real(0, 1e9, above_low=True), default=None, metavar="P",
                       help="peak TFLOP/s of one device (default: from the device name)")
    model.add_argument("--dtype", default="bf16",
                       help="math precision for the peak: bf16, fp16, tf32, fp32, fp8")
    model.add_argument("--device", default=None,
                       help="device name for the peak table (default: the trace's)")
    p.set_defaults(run=run_diagnose)


#: ``critical-path --steps`` without a range: list every step (the issue's spelling).
EVERY_STEP = "every step"


def _steps_also_a_flag(p: argparse.ArgumentParser) -> None:
    """``--steps A:B`` stays the window; a bare ``--steps`` lists every step."""
    for action in p._actions:
        if "--steps" in action.option_strings:
            action.nargs, action.const = "?", EVERY_STEP
            action.help = f"{action.help}; without a range: list every step"


def run_critical_path(args: argparse.Namespace) -> int:
    if getattr(args, "steps", None) == EVERY_STEP:
        args.steps, args.per_step = None, True
    result = open_run(args).critical_path(top=args.top)
    if emit_result(result, args):
        return 0
    steps, ranks = result["steps"], result["ranks"]
    if steps.height == 0:
        print("no critical path: no events in the window")
        return 0
    path, step = steps.get_column("path_ns").sum(), steps.get_column("step_ns").sum()
    print(f"critical path over {steps.height} step(s): {ms(path)} ms"
          + (f" against {ms(step)} ms of steps (coverage {pct(path / step)})" if step else ""))
    shown = steps if args.per_step or steps.height <= 12 else steps.head(12)
    print(table(["step", "path_ms", "step_ms", "coverage", "top_rank", "its_share", "jumps"],
                [[r["step"], ms(r["path_ns"]), ms(r["step_ns"]), pct(r["coverage"]),
                  r["top_rank"], pct(r["top_rank_share"]), r["jumps"]]
                 for r in shown.iter_rows(named=True)]))
    if shown.height < steps.height:
        print(f"... {steps.height - shown.height} more steps (--per-step lists them)")
    print()
    replayed = ranks.height and ranks.get_column("source")[0] == "replay"
    if replayed:  # the per-rank shares follow the replay's longest path (issue 46)
        err = result["replay"]["replay_error"]["p90"]
        print(f"per rank: the replay's longest path (replay error p90 {pct(err)}"
              + ("" if result["replay"]["trusted"] else ", not trusted: low confidence")
              + "), which crosses ranks where the replay waited; 'mostly' is its edge kind")
    print(table(["rank", "path_ms", "share", "mostly"],
                [[r["rank"], ms(r["path_ns"]), pct(r["share"]), r["top_category"]]
                 for r in ranks.filter(ranks["path_ns"] > 0).iter_rows(named=True)],
                left={"mostly"}))
    print()
    cats = result["categories"]
    print(table(["category", "per_step_ms", "share"],
                [[c, ms(v["per_step_ns"]), pct(v["share"])] for c, v in cats.items()],
                left={"category"}))
    print()
    print(table(["op", "category", "ranks", "per_step_ms", "share"],
                [[short(r["name"], 50), r["category"], ",".join(map(str, r["ranks"])),
                  ms(r["per_step_ns"]), pct(r["share"])]
                 for r in result["top_ops"].iter_rows(named=True)],
                left={"op", "category", "ranks"}))
    return 0


def run_diagnose(args: argparse.Namespace) -> int:
    model = {k: getattr(args, k) for k in ("params", "tokens_per_step", "flops_per_step",
                                           "layers", "hidden", "seq_len", "peak_tflops",
                                           "dtype", "device")}
    result = open_run(args).diagnose(**model)
    if emit_result(result, args):
        return 0
    findings = result["findings"]
    todo = findings.filter(findings["severity"] != "info")
    step = result["step_ns"]
    windowed = todo.height and todo["per"][0] == "window" if "per" in todo.columns else False
    gains = [g for g in todo.get_column("gain_ns_per_step").to_list() if g is not None]
    order = ("biggest gain first" if gains == sorted(gains, reverse=True) else
             "biggest gain first, a straggler's cause just before it")
    # the gains are per mean step (summary's step_p50_ms is the median)
    span = f"window {ms(step)} ms, no steps" if windowed else f"mean step {ms(step)} ms"
    print(f"to do, {order} ({span}):" if todo.height else
          "nothing to fix found on the critical path")
    for i, f in enumerate(todo.iter_rows(named=True), 1):
        print(f"{i}. [{f['severity']}] {finding_headline(f)}")
        print(f"   fix: {f['recommendation']}")
        print(f"   evidence: {_evidence(f['evidence'])}; confidence: {f['confidence']}")
    for f in findings.filter(findings["severity"] == "info").iter_rows(named=True):
        print(f"note: {f['title']}")
    for sentence in result.fields.get("node_findings", []):
        print(f"node: {sentence}")
    time_is = result.fields.get("collectives_time_is")
    if time_is is not None and time_is.height:
        print("collectives, what the time is: " + "; ".join(
            f"{r['name']} {r['size_bucket']} ({r['locality']}): {r['time_is']}"
            for r in time_is.iter_rows(named=True)))
    mfu = result["mfu"]
    if mfu is not None and mfu.get("note") and not mfu.get("refused"):
        print(f"note: MFU: {mfu['note']}")  # a refused MFU is a warning (stderr)
    return 0


def _evidence(items: list[dict]) -> str:
    """The evidence in words: a time in ms or µs, named without its ``_ns`` (the --json
    value stays in ns under the metric's own name)."""
    def one(e: dict) -> str:
        v, unit, name = e["value"], e["unit"], e["metric"]
        if unit == "ns":
            name = name.replace("_ns_", "_").removesuffix("_ns")
        shown = ("-" if v is None else _duration(v) if unit == "ns" else
                 pct(v) if unit == "ratio" else f"{v:g}")
        return f"{name}={shown}" + (f" ({e['text']})" if e["text"] else "")
    return "; ".join(one(e) for e in items)


def _duration(ns: float) -> str:
    """A time readable at any size: ms from 0.1 ms up, else µs (a 4 µs kernel was 0.00 ms)."""
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 1e5 else f"{ns / 1e3:.1f} µs"
