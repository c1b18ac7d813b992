"""GPU timeline subcommands: gaps, overlap, breakdown, summary.

Every command takes the shared input options, ``--ranks 0-3,7``, ``--steps 5:9``,
``--skip-warmup N`` and ``--time A:B`` (relative to the first event; units ns, us, ms, s),
``--json`` and ``--csv`` (the main table). The CLI only formats: every number comes from
``Run``.
"""

from __future__ import annotations

import argparse

import polars as pl

from traceview.analyses.names import unique_short_names
from traceview.analyses.run_bound import bound_phrase
from traceview.cli._options import (
    MAX_ROWS,
    add_timeline_args,
    add_all_arg,
    open_run,
    whole,
)
from traceview.cli._render import (
    duration,
    emit_result,
    fixed,
    is_many,
    ms,
    not_shown,
    outlier_ranks,
    pct,
    short,
    spread,
    table,
    us,
)
from traceview.outputs.words import straggler_sentence


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, and the function it runs."""
    _common(p)
    if command == "gaps":
        p.add_argument("--per-stream", action="store_true",
                       help="gaps per stream, not per device")
        p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, metavar="N", help="largest gaps to list")
        p.add_argument("--launch-overhead", default="10us", metavar="T",
                       help="gaps shorter than this with work queued are launch overhead")
    elif command == "overlap":
        p.add_argument("--per-step", action="store_true", help="one row per step as well")
    elif command == "breakdown":
        p.add_argument("--top", type=whole(0, MAX_ROWS), default=10, metavar="N", help="kernels / ops to list")
    p.set_defaults(run={"gaps": run_gaps, "overlap": run_overlap, "breakdown": run_breakdown,
                        "summary": run_summary}[command])


def _common(p: argparse.ArgumentParser) -> None:
    add_timeline_args(p)
    add_all_arg(p)


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
    if is_many(causes, args):
        _print_causes_over_ranks(causes, hist)
    else:
        print("GPU idle gaps by cause (ms)")
        print(table([*by, "cause", "count", "total_ms", "max_ms", "share"],
                    [[*(r[k] for k in by), r["cause"], r["count"], ms(r["total_gap_ns"]),
                      ms(r["max_gap_ns"]), pct(r["share_of_idle"])]
                     for r in causes.iter_rows(named=True)]))
        print("\nHistogram")
        print(table([*by, "from", "to", "count", "total_ms"],
                    [[*(r[k] for k in by), duration(r["bucket_lo_ns"]),
                      duration(r["bucket_hi_ns"]), r["count"], ms(r["total_gap_ns"])]
                     for r in hist.iter_rows(named=True)]))
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


def _print_causes_over_ranks(causes: pl.DataFrame, hist: pl.DataFrame) -> None:
    """Gap causes and the histogram summed over the ranks, each cause with the rank that
    has the most of it (``--all`` prints the rows per rank)."""
    per = (causes.group_by("rank", "cause").agg(n=pl.col("count").sum(),
                                                 ns=pl.col("total_gap_ns").sum())
           .sort("ns", "rank", descending=[True, False])
           .group_by("cause", maintain_order=True)
           .agg(ranks=pl.len(), count=pl.col("n").sum(), total=pl.col("ns").sum(),
                rank_median=pl.col("ns").median(), rank_max=pl.col("ns").first(),
                max_rank=pl.col("rank").first()).sort("total", descending=True))
    print(f"GPU idle gaps by cause over {causes['rank'].n_unique()} ranks (ms; "
          "`traceview gaps --all` prints every rank)")
    print(table(["cause", "ranks", "count", "total_ms", "rank_median_ms", "rank_max_ms",
                 "max_rank"],
                [[r["cause"], r["ranks"], r["count"], ms(r["total"]), ms(r["rank_median"]),
                  ms(r["rank_max"]), r["max_rank"]] for r in per.iter_rows(named=True)],
                left={"cause"}))
    buckets = (hist.group_by("bucket_lo_ns", "bucket_hi_ns")
               .agg(count=pl.col("count").sum(), total=pl.col("total_gap_ns").sum())
               .sort("bucket_lo_ns"))
    print("\nHistogram, all ranks")
    print(table(["from", "to", "count", "total_ms"],
                [[duration(r["bucket_lo_ns"]), duration(r["bucket_hi_ns"]), r["count"],
                  ms(r["total"])] for r in buckets.iter_rows(named=True)]))


def run_overlap(args: argparse.Namespace) -> int:
    result = open_run(args).overlap(per_step=args.per_step)
    if emit_result(result, args):
        return 0
    df = all_rows = result["rows"]
    if is_many(df, args):
        print(spread(df, [("compute_ns", "compute (ms)", ms), ("comm_ns", "comm (ms)", ms),
                          ("exposed_comm_ns", "exposed comm (ms)", ms),
                          ("hidden_fraction", "comm hidden", pct), ("idle_ns", "idle (ms)", ms)],
                     what="rows (rank, device" + (", step)" if args.per_step else ")")))
        keep = outlier_ranks(df, ["compute_ns", "exposed_comm_ns", "idle_ns"])
        df = df.filter(pl.col("rank").is_in(keep)).head(20)
        print(f"\nRows of the outlier ranks ({df.height}):")
    print(table(
        ["rank", "dev", "step", "compute_ms", "comm_ms", "overlap_ms", "exposed_ms", "hidden",
         "efficiency", "exp_memcpy_ms", "idle_ms", "bound"],
        [[r["rank"], r["device"], "all" if r["step"] is None else r["step"],
          ms(r["compute_ns"]), ms(r["comm_ns"]), ms(r["overlap_ns"]),
          ms(r["exposed_comm_ns"]), pct(r["hidden_fraction"]),
          pct(r["overlap_efficiency"]), ms(r["exposed_memcpy_ns"]), ms(r["idle_ns"]),
          _bound_cell(r)] for r in df.iter_rows(named=True)]))
    if df.height < all_rows.height:
        print(not_shown(df.height, all_rows.height, "overlap"))
    print(_run_bound_line(result["bound"]))
    _print_capped(_notes(all_rows), args, "overlap")
    return 0


def _run_bound_line(bound: dict) -> str:
    """The run's bound (``Run.bound``), the line ``summary``, ``overlap`` and ``diagnose``
    all print in the same words."""
    return (f"run bound: {bound_phrase(bound)}"
            + (f" (all {bound['gpu_ranks']} GPU ranks)" if bound.get("gpu_ranks", 0) > 1 else ""))


def _bound_cell(r: dict) -> str:
    """A row's bound with the share it rests on: ``idle 86%``, ``compute-bound 60%``."""
    if r.get("bound") is None:
        return "-"
    if r.get("bound_share") is None:  # a rank without GPU work: host-bound, no GPU share
        return str(r["bound"])
    if r["bound"] == "balanced":  # no share leads: the largest is no bound's share
        return f"balanced, top {pct(r.get('bound_share'))}"
    return f"{r['bound']} {pct(r.get('bound_share'))}"


def run_breakdown(args: argparse.Namespace) -> int:
    result = open_run(args).breakdown(top=args.top)
    if emit_result(result, args):
        return 0
    steps, kernels, ops_self, delays = (result[k] for k in (
        "steps", "top_kernels", "top_cpu_ops_by_self", "launch_delay"))
    print("Per-step GPU time (ms): window = compute + exposed comm + exposed memcpy "
          "+ exposed memset + idle")
    shown = steps
    if is_many(steps, args):
        stepped = steps.filter(pl.col("window_ns").is_not_null())
        if stepped.filter(pl.col("step").is_not_null()).height:  # not the whole-trace rows
            stepped = stepped.filter(pl.col("step").is_not_null())
        print(spread(stepped, [
            ("window_ns", "window (ms)", ms), ("compute_ns", "compute (ms)", ms),
            ("exposed_comm_ns", "exposed comm (ms)", ms), ("idle_ns", "idle (ms)", ms)],
            what="rank-steps"))
        shown = steps.sort("window_ns", "rank", "step", descending=[True, False, False],
                           nulls_last=True).head(10)
        print("\nThe 10 longest rank-steps:")
    print(table(["rank", "dev", "step", "step_ms", "window_ms", "compute", "exp_comm",
                 "exp_memcpy", "exp_memset", "idle", "idle%"],
                [[r["rank"], r["device"], "all" if r["step"] is None else r["step"],
                  ms(r["step_time_ns"]), ms(r["window_ns"]), ms(r["compute_ns"]),
                  ms(r["exposed_comm_ns"]), ms(r["exposed_memcpy_ns"]),
                  ms(r["exposed_memset_ns"]), ms(r["idle_ns"]), pct(r["idle_fraction"])]
                 for r in shown.iter_rows(named=True)]))
    if shown.height < steps.height:
        print(not_shown(shown.height, steps.height, "breakdown"))
    if is_many(kernels, args):
        across = result["kernels_across_ranks"]
        labels = unique_short_names(across.get_column("name").to_list(), 60)
        print(f"\nTop {args.top} GPU kernels by total time over all ranks")
        print(table(["ranks", "class", "count", "total_ms", "rank_median_ms", "rank_max_ms",
                     "max_rank", "name"],
                    [[r["ranks"], r["gpu_class"], r["count"], ms(r["total_ns"]),
                      ms(r["rank_median_ns"]), ms(r["rank_max_ns"]), r["max_rank"],
                      labels.get(r["name"])] for r in across.iter_rows(named=True)],
                    max_width=None))
    else:
        labels = unique_short_names(kernels.get_column("name").to_list(), 60)
        print(f"\nTop {args.top} GPU kernels by total time")
        print(table(["rank", "class", "count", "total_ms", "mean_us", "p50_us", "p99_us",
                     "name"],
                    [[r["rank"], r["gpu_class"], r["count"], ms(r["total_ns"]),
                      us(r["mean_ns"]), us(r["p50_ns"]), us(r["p99_ns"]), labels.get(r["name"])]
                     for r in kernels.iter_rows(named=True)], max_width=None))
    many_ops = is_many(ops_self, args)
    ops_shown = (ops_self.sort("self_ns", "rank", descending=[True, False]).head(args.top)
                 if many_ops else ops_self)
    print(f"\nTop {args.top} CPU ops by self time"
          + (" (the largest of any rank)" if many_ops else ""))
    print(table(["rank", "count", "self_ms", "total_ms", "name"],
                [[r["rank"], r["count"], ms(r["self_ns"]), ms(r["total_ns"]),
                  short(r["name"], 60)] for r in ops_shown.iter_rows(named=True)]))
    print("\nLaunch delay (runtime call start -> GPU start), us")
    if is_many(delays, args):
        print(spread(delays, [("launch_delay_p50_ns", "p50 (us)", us),
                              ("launch_delay_p99_ns", "p99 (us)", us),
                              ("launch_delay_max_ns", "max (us)", us)], what="devices"))
    else:
        print(table(["rank", "dev", "count", "p50", "p99", "max", "queue_p50", "graph_launched"],
                    [[r["rank"], r["device"], r["count"],
                      us(r["launch_delay_p50_ns"]), us(r["launch_delay_p99_ns"]),
                      us(r["launch_delay_max_ns"]), us(r["queue_delay_p50_ns"]),
                      r["graph_launched"]] for r in delays.iter_rows(named=True)]))
    _print_flops(result["flops"], args)
    _print_capped(_notes(steps), args, "breakdown")
    return 0


def _print_flops(flops: pl.DataFrame | None, args: argparse.Namespace) -> None:
    """Achieved TFLOP/s and MFU per rank (median step), when the trace carries FLOPs."""
    if flops is None or flops.height == 0:
        return
    per_rank = (flops.group_by("rank").agg(
        steps=pl.len(), achieved_tflops=pl.col("achieved_tflops").median(),
        mfu=pl.col("mfu").median(), peak_tflops=pl.col("peak_tflops").first(),
        note=pl.col("note").drop_nulls().first()).sort("rank"))
    print("\nAchieved TFLOP/s and MFU (median step of each rank; FLOPs recorded by "
          "with_flops=True)")
    if is_many(per_rank, args):
        print(spread(per_rank, [("achieved_tflops", "TFLOP/s", lambda v: fixed(v, 2)),
                                ("mfu", "MFU", pct)]))
    else:
        print(table(["rank", "steps", "tflops", "mfu", "peak_tflops", "note"],
                    [[r["rank"], r["steps"], fixed(r["achieved_tflops"], 2), pct(r["mfu"]),
                      r["peak_tflops"], r["note"]] for r in per_rank.iter_rows(named=True)],
                    left={"note"}, max_width=None))


def run_summary(args: argparse.Namespace) -> int:
    result = open_run(args).summary()
    if emit_result(result, args):
        return 0
    df, straggler = result["ranks"], result["worst_straggler"]
    rows = df
    # Compute and comm are window totals; next to the step time they are read per step, so
    # per step where the ranks have steps, and headers that say which.
    each = "_per_step" if df.get_column("steps").max() else ""
    unit = "ms/step" if each else "ms total"
    if is_many(df, args):
        print(spread(df, [("step_time_ns_p50", "step p50 (ms)", ms),
                          (f"compute_ns{each}", f"compute ({unit})", ms),
                          (f"comm_ns{each}", f"comm ({unit})", ms),
                          (f"exposed_comm_ns{each}", f"exposed comm ({unit})", ms),
                          ("idle_fraction", "GPU idle", pct)]))
        keep = outlier_ranks(df, ["step_time_ns_p50", f"compute_ns{each}", f"comm_ns{each}",
                                  f"exposed_comm_ns{each}", "idle_fraction"])
        named = straggler.get("ranks") or ([straggler["rank"]] if straggler.get("rank")
                                           is not None else [])
        for rank in reversed(named):  # every rank the verdict names (several, intermittent)
            if rank not in keep:
                keep.insert(0, rank)
        rows = df.filter(pl.col("rank").is_in(keep))
        print(f"\nOutlier ranks and the worst straggler ({rows.height}):")
    tag = "/step" if each else "_total"
    print(table(
        ["rank", "steps", "step_p50_ms", f"compute_ms{tag}", f"comm_ms{tag}",
         f"exposed_comm_ms{tag}", "hidden", "idle", "bound", "top gap cause"],
        [[r["rank"], r["steps"], ms(r["step_time_ns_p50"]), ms(r[f"compute_ns{each}"]),
          ms(r[f"comm_ns{each}"]), ms(r[f"exposed_comm_ns{each}"]), pct(r["hidden_fraction"]),
          pct(r["idle_fraction"]), _bound_cell(r),
          "-" if r["top_gap_cause"] is None else
          f"{r['top_gap_cause']} ({ms(r['top_gap_cause_ns'])} ms)"]
         for r in rows.iter_rows(named=True)]))
    print("step_p50_ms: median step; " + (
        "*/step: window totals / steps (totals in --json)" if each else
        "*_total: window totals (no profiler steps)") + "; hidden, idle, bound: whole window")
    print("bound: the largest share of the GPU's window (compute, exposed comm, copies, idle) "
          "when 1.2x the next, else balanced")
    print(_run_bound_line(result["bound"]))
    if rows.height < df.height:
        print(not_shown(rows.height, df.height, "summary"))
    print(straggler_sentence(straggler))
    notes = [f"note: rank {r['rank']}: {r['note']}"
             for r in df.filter(pl.col("note").is_not_null()).iter_rows(named=True)]
    _print_capped(notes, args, "summary")
    for s in result["skipped"]:  # a skipped file's rank is missing from the table above
        print(f"skipped: {s['error']}")
    return 0


def _print_capped(lines: list[str], args: argparse.Namespace, command: str,
                  most: int = 20) -> None:
    """Note lines, at most ``most`` of them unless --all (a note per rank of 1,024)."""
    shown = lines if getattr(args, "all", False) else lines[:most]
    for line in shown:
        print(line)
    if len(shown) < len(lines):
        print(f"({len(lines) - len(shown)} more notes: `traceview {command} --all`)")
