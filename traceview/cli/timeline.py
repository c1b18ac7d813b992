"""GPU timeline subcommands: gaps, overlap, breakdown, summary.

Every command takes the shared input options, ``--ranks 0-3,7``, ``--steps 5:9``,
``--skip-warmup N`` and ``--time A:B`` (relative to the first event; units ns, us, ms, s), and
``--json``. The CLI only formats: every number comes from ``traceview.analyses``.
"""

from __future__ import annotations

import argparse
from typing import Any

import polars as pl

from traceview.cli._options import (
    add_align_arg, add_input_args, add_json_arg, add_window_args, emit_result, open_run,
)
from traceview.selection import parse_duration, parse_time_window  # noqa: F401 - re-exported


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gaps", help="GPU idle gaps per device (or stream) and their causes")
    _common(p)
    p.add_argument("--per-stream", action="store_true", help="gaps per stream, not per device")
    p.add_argument("--top", type=int, default=10, metavar="N", help="largest gaps to list")
    p.add_argument("--launch-overhead", default="10us", metavar="T",
                   help="gaps shorter than this with work queued are launch overhead")
    p.set_defaults(run=run_gaps)

    p = sub.add_parser("overlap", help="compute/communication overlap per rank (and step)")
    _common(p)
    p.add_argument("--per-step", action="store_true", help="one row per step as well")
    p.set_defaults(run=run_overlap)

    p = sub.add_parser("breakdown", help="per-step GPU time breakdown, top kernels and ops")
    _common(p)
    p.add_argument("--top", type=int, default=10, metavar="N", help="kernels / ops to list")
    p.set_defaults(run=run_breakdown)

    p = sub.add_parser("summary", help="one screen per run: steps, compute, comm, idle, gaps")
    _common(p)
    p.set_defaults(run=run_summary)


def _common(p: argparse.ArgumentParser) -> None:
    add_input_args(p)
    add_window_args(p)
    p.add_argument("--time", metavar="A:B", help="time window relative to the first event, "
                   "e.g. 0:2s or 100ms:300ms (events are clipped to it)")
    add_align_arg(p)
    add_json_arg(p, csv=True)


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v / 1e6:.3f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(headers), *(line(r) for r in rows)])


def _notes(df: pl.DataFrame) -> list[str]:
    if "note" not in df.columns:
        return []
    out = []
    for r in df.filter(pl.col("note").is_not_null()).iter_rows(named=True):
        where = f"rank {r['rank']}" + (f" step {r['step']}" if r.get("step") is not None else "")
        out.append(f"note: {where}: {r['note']}")
    return sorted(set(out))


def run_gaps(args: argparse.Namespace) -> int:
    result = open_run(args).gaps(per_stream=args.per_stream, top=args.top,
                                 launch_overhead=args.launch_overhead)
    if emit_result(result, args):
        return 0
    by = ["rank", "device", "stream"] if args.per_stream else ["rank", "device"]
    causes, hist, top, missing = (result[k] for k in ("causes", "histogram", "largest", "notes"))
    print("GPU idle gaps by cause (ms)")
    print(_table([*by, "cause", "count", "total_ms", "max_ms", "share"],
                 [[*(str(r[k]) for k in by), r["cause"], str(r["count"]), _ms(r["total_gap_ns"]),
                   _ms(r["max_gap_ns"]), _pct(r["share_of_idle"])]
                  for r in causes.iter_rows(named=True)]))
    print("\nHistogram")
    print(_table([*by, "from", "to", "count", "total_ms"],
                 [[*(str(r[k]) for k in by), _dur(r["bucket_lo_ns"]), _dur(r["bucket_hi_ns"]),
                   str(r["count"]), _ms(r["total_gap_ns"])] for r in hist.iter_rows(named=True)]))
    print(f"\nLargest {top.height} gaps")
    print(_table(["rank", "device", "start_ns", "gap_ms", "cause", "before", "after", "launch_op",
                  "host ops during"],
                 [[str(r["rank"]), str(r["device"]), str(r["gap_start_ns"]), _ms(r["gap_ns"]),
                   r["cause"], _short(r["prev_name"]), _short(r["next_name"]),
                   _short(r["launch_op"]), ", ".join(_short(x) for x in (r["ops_during"] or []))]
                  for r in top.iter_rows(named=True)]))
    for r in missing.iter_rows(named=True):
        print(f"note: rank {r['rank']}: {r['note']}")
    return 0


def _dur(ns: int | None) -> str:
    if ns is None:
        return "inf"
    for unit, f in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= f:
            return f"{ns / f:g}{unit}"
    return f"{ns}ns"


def _short(name: str | None, n: int = 40) -> str:
    if not name:
        return "-"
    return name if len(name) <= n else name[: n - 1] + "…"


def run_overlap(args: argparse.Namespace) -> int:
    result = open_run(args).overlap(per_step=args.per_step)
    if emit_result(result, args):
        return 0
    df = result["rows"]
    print(_table(
        ["rank", "dev", "step", "compute_ms", "comm_ms", "overlap_ms", "exposed_ms", "hidden",
         "efficiency", "exp_memcpy_ms", "idle_ms", "bound"],
        [[str(r["rank"]), str(r["device"]), "all" if r["step"] is None else str(r["step"]),
          _ms(r["compute_ns"]), _ms(r["comm_ns"]), _ms(r["overlap_ns"]),
          _ms(r["exposed_comm_ns"]), _pct(r["hidden_fraction"]),
          _pct(r["overlap_efficiency"]), _ms(r["exposed_memcpy_ns"]), _ms(r["idle_ns"]),
          r["bound"] or "-"] for r in df.iter_rows(named=True)]))
    for line in _notes(df):
        print(line)
    return 0


def run_breakdown(args: argparse.Namespace) -> int:
    result = open_run(args).breakdown(top=args.top)
    if emit_result(result, args):
        return 0
    steps, kernels, ops_self, delays = (result[k] for k in (
        "steps", "top_kernels", "top_cpu_ops_by_self", "launch_delay"))
    print("Per-step GPU time (ms): window = compute + exposed comm + exposed memcpy "
          "+ exposed memset + idle")
    print(_table(["rank", "dev", "step", "step_ms", "window_ms", "compute", "exp_comm",
                  "exp_memcpy", "exp_memset", "idle", "idle%"],
                 [[str(r["rank"]), str(r["device"]), "all" if r["step"] is None else str(r["step"]),
                   _ms(r["step_time_ns"]), _ms(r["window_ns"]), _ms(r["compute_ns"]),
                   _ms(r["exposed_comm_ns"]), _ms(r["exposed_memcpy_ns"]),
                   _ms(r["exposed_memset_ns"]), _ms(r["idle_ns"]), _pct(r["idle_fraction"])]
                  for r in steps.iter_rows(named=True)]))
    print(f"\nTop {args.top} GPU kernels by total time")
    print(_table(["rank", "class", "count", "total_ms", "mean_us", "p50_us", "p99_us", "name"],
                 [[str(r["rank"]), r["gpu_class"], str(r["count"]), _ms(r["total_ns"]),
                   f"{r['mean_ns'] / 1e3:.1f}", f"{r['p50_ns'] / 1e3:.1f}",
                   f"{r['p99_ns'] / 1e3:.1f}", _short(r["name"], 60)]
                  for r in kernels.iter_rows(named=True)]))
    print(f"\nTop {args.top} CPU ops by self time")
    print(_table(["rank", "count", "self_ms", "total_ms", "name"],
                 [[str(r["rank"]), str(r["count"]), _ms(r["self_ns"]), _ms(r["total_ns"]),
                   _short(r["name"], 60)] for r in ops_self.iter_rows(named=True)]))
    print("\nLaunch delay (runtime call start -> GPU start), us")
    print(_table(["rank", "dev", "count", "p50", "p99", "max", "queue_p50", "graph_launched"],
                 [[str(r["rank"]), str(r["device"]), str(r["count"]),
                   f"{r['launch_delay_p50_ns'] / 1e3:.1f}", f"{r['launch_delay_p99_ns'] / 1e3:.1f}",
                   f"{r['launch_delay_max_ns'] / 1e3:.1f}", f"{r['queue_delay_p50_ns'] / 1e3:.1f}",
                   str(r["graph_launched"])] for r in delays.iter_rows(named=True)]))
    for line in _notes(steps):
        print(line)
    return 0


def run_summary(args: argparse.Namespace) -> int:
    result = open_run(args).summary()
    if emit_result(result, args):
        return 0
    df, straggler = result["ranks"], result["worst_straggler"]
    print(_table(
        ["rank", "steps", "step_p50_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "hidden",
         "idle", "top gap cause"],
        [[str(r["rank"]), str(r["steps"]), _ms(r["step_time_ns_p50"]), _ms(r["compute_ns"]),
          _ms(r["comm_ns"]), _ms(r["exposed_comm_ns"]), _pct(r["hidden_fraction"]),
          _pct(r["idle_fraction"]),
          "-" if r["top_gap_cause"] is None else
          f"{r['top_gap_cause']} ({_ms(r['top_gap_cause_ns'])} ms)"]
         for r in df.iter_rows(named=True)]))
    if straggler.get("rank") is not None:
        print(f"worst straggler: rank {straggler['rank']} "
              f"(imposed wait {_ms(straggler.get('imposed_wait_ns'))} ms)")
    else:
        print(f"worst straggler: none ({straggler.get('reason')})")
    for r in df.filter(pl.col("note").is_not_null()).iter_rows(named=True):
        print(f"note: rank {r['rank']}: {r['note']}")
    return 0
