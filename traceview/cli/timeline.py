"""GPU timeline subcommands: gaps, overlap, breakdown, summary.

Every command takes the shared input options, ``--ranks 0-3,7``, ``--steps 5:9``,
``--skip-warmup N`` and ``--time A:B`` (relative to the first event; units ns, us, ms, s),
``--json`` and ``--csv`` (the main table). The CLI only formats: every number comes from
``Run``.
"""

from __future__ import annotations

import argparse

import polars as pl

from traceview.cli._options import (
    add_align_arg, add_input_args, add_json_arg, add_window_args, open_run,
)
from traceview.cli._render import duration, emit_result, ms, pct, short, table, us


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    _common(p)
    if command == "gaps":
        p.add_argument("--per-stream", action="store_true",
                       help="gaps per stream, not per device")
        p.add_argument("--top", type=int, default=10, metavar="N", help="largest gaps to list")
        p.add_argument("--launch-overhead", default="10us", metavar="T",
                       help="gaps shorter than this with work queued are launch overhead")
    elif command == "overlap":
        p.add_argument("--per-step", action="store_true", help="one row per step as well")
    elif command == "breakdown":
        p.add_argument("--top", type=int, default=10, metavar="N", help="kernels / ops to list")
    p.set_defaults(run={"gaps": run_gaps, "overlap": run_overlap, "breakdown": run_breakdown,
                        "summary": run_summary}[command])


def _common(p: argparse.ArgumentParser) -> None:
    add_input_args(p)
    add_window_args(p)
    p.add_argument("--time", metavar="A:B", help="time window relative to the first event, "
                   "e.g. 0:2s or 100ms:300ms (events are clipped to it)")
    add_align_arg(p)
    add_json_arg(p, csv=True)


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
    print(table([*by, "cause", "count", "total_ms", "max_ms", "share"],
                [[*(r[k] for k in by), r["cause"], r["count"], ms(r["total_gap_ns"]),
                  ms(r["max_gap_ns"]), pct(r["share_of_idle"])]
                 for r in causes.iter_rows(named=True)]))
    print("\nHistogram")
    print(table([*by, "from", "to", "count", "total_ms"],
                [[*(r[k] for k in by), duration(r["bucket_lo_ns"]), duration(r["bucket_hi_ns"]),
                  r["count"], ms(r["total_gap_ns"])] for r in hist.iter_rows(named=True)]))
    print(f"\nLargest {top.height} gaps (at: ms from the rank's first GPU event)")
    print(table(["rank", "device", "at_ms", "gap_ms", "cause", "before", "after", "launch_op",
                 "host ops during"],
                [[r["rank"], r["device"], ms(r["gap_start_from_gpu_start_ns"]), ms(r["gap_ns"]),
                  r["cause"], short(r["prev_name"]), short(r["next_name"]),
                  short(r["launch_op"]), ", ".join(short(x) for x in (r["ops_during"] or []))]
                 for r in top.iter_rows(named=True)],
                max_width=None))  # every name is cut already; the list of ops is the clue
    for r in missing.iter_rows(named=True):
        print(f"note: rank {r['rank']}: {r['note']}")
    return 0


def run_overlap(args: argparse.Namespace) -> int:
    result = open_run(args).overlap(per_step=args.per_step)
    if emit_result(result, args):
        return 0
    df = result["rows"]
    print(table(
        ["rank", "dev", "step", "compute_ms", "comm_ms", "overlap_ms", "exposed_ms", "hidden",
         "efficiency", "exp_memcpy_ms", "idle_ms", "bound"],
        [[r["rank"], r["device"], "all" if r["step"] is None else r["step"],
          ms(r["compute_ns"]), ms(r["comm_ns"]), ms(r["overlap_ns"]),
          ms(r["exposed_comm_ns"]), pct(r["hidden_fraction"]),
          pct(r["overlap_efficiency"]), ms(r["exposed_memcpy_ns"]), ms(r["idle_ns"]),
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
    print(table(["rank", "dev", "step", "step_ms", "window_ms", "compute", "exp_comm",
                 "exp_memcpy", "exp_memset", "idle", "idle%"],
                [[r["rank"], r["device"], "all" if r["step"] is None else r["step"],
                  ms(r["step_time_ns"]), ms(r["window_ns"]), ms(r["compute_ns"]),
                  ms(r["exposed_comm_ns"]), ms(r["exposed_memcpy_ns"]),
                  ms(r["exposed_memset_ns"]), ms(r["idle_ns"]), pct(r["idle_fraction"])]
                 for r in steps.iter_rows(named=True)]))
    print(f"\nTop {args.top} GPU kernels by total time")
    print(table(["rank", "class", "count", "total_ms", "mean_us", "p50_us", "p99_us", "name"],
                [[r["rank"], r["gpu_class"], r["count"], ms(r["total_ns"]),
                  us(r["mean_ns"]), us(r["p50_ns"]), us(r["p99_ns"]), short(r["name"], 60)]
                 for r in kernels.iter_rows(named=True)]))
    print(f"\nTop {args.top} CPU ops by self time")
    print(table(["rank", "count", "self_ms", "total_ms", "name"],
                [[r["rank"], r["count"], ms(r["self_ns"]), ms(r["total_ns"]),
                  short(r["name"], 60)] for r in ops_self.iter_rows(named=True)]))
    print("\nLaunch delay (runtime call start -> GPU start), us")
    print(table(["rank", "dev", "count", "p50", "p99", "max", "queue_p50", "graph_launched"],
                [[r["rank"], r["device"], r["count"],
                  us(r["launch_delay_p50_ns"]), us(r["launch_delay_p99_ns"]),
                  us(r["launch_delay_max_ns"]), us(r["queue_delay_p50_ns"]),
                  r["graph_launched"]] for r in delays.iter_rows(named=True)]))
    for line in _notes(steps):
        print(line)
    return 0


def run_summary(args: argparse.Namespace) -> int:
    result = open_run(args).summary()
    if emit_result(result, args):
        return 0
    df, straggler = result["ranks"], result["worst_straggler"]
    print(table(
        ["rank", "steps", "step_p50_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "hidden",
         "idle", "top gap cause"],
        [[r["rank"], r["steps"], ms(r["step_time_ns_p50"]), ms(r["compute_ns"]),
          ms(r["comm_ns"]), ms(r["exposed_comm_ns"]), pct(r["hidden_fraction"]),
          pct(r["idle_fraction"]),
          "-" if r["top_gap_cause"] is None else
          f"{r['top_gap_cause']} ({ms(r['top_gap_cause_ns'])} ms)"]
         for r in df.iter_rows(named=True)]))
    if straggler.get("rank") is not None:
        print(f"worst straggler: rank {straggler['rank']} "
              f"(imposed wait {ms(straggler.get('imposed_wait_ns'))} ms)")
    else:
        print(f"worst straggler: none ({straggler.get('reason')})")
    for r in df.filter(pl.col("note").is_not_null()).iter_rows(named=True):
        print(f"note: rank {r['rank']}: {r['note']}")
    for s in result["skipped"]:  # a skipped file's rank is missing from the table above
        print(f"skipped: {s['error']}")
    return 0
