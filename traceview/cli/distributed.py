"""Distributed subcommands: ``align``, ``collectives``, ``stragglers``.

``--json`` outputs are contracts (field names stable; fields may be added):

* ``align``: ``{"reference_rank", "ranks": [{"rank", "offset_ns", "drift_ppm",
  "uncertainty_ns", "anchors", "method", ...}], "problems": [...]}``
* ``collectives``: ``{"instances": [{"group", "seq", "name", "n_ranks", "bytes", "skew_ns",
  "last_rank", ...}], "summary": [...], "alpha_beta": [...], "problems": [...],
  "alignment": {...}}``
* ``stragglers``: ``{"ranks": [{"rank", "flagged", "imposed_wait_ns", "last_arrivals",
  "explanation", ...}], "alignment": {...}}``, sorted by ``imposed_wait_ns``, largest first.
"""

from __future__ import annotations

import argparse

import polars as pl

from traceview.cli._options import (
    add_align_arg, add_input_args, add_json_arg, add_window_args, emit_result, open_run,
)


def register(sub: argparse._SubParsersAction) -> None:
    for name, help_, run in (
        ("align", "per-rank clock offsets from collectives", run_align),
        ("collectives", "collectives matched across ranks: skew, wait, bandwidth, tails", run_collectives),
        ("stragglers", "which rank holds the others back", run_stragglers),
    ):
        p = sub.add_parser(name, help=help_)
        add_input_args(p)
        add_json_arg(p, csv=True)
        add_window_args(p)
        add_align_arg(p)
        p.add_argument("--reference-rank", type=int, default=None, metavar="R",
                       help="rank whose clock is the reference (default: lowest)")
        p.add_argument("--tolerance-us", type=float, default=500.0,
                       help="completion-time tolerance for matching by time (us)")
        p.set_defaults(run=run)


def run_align(args: argparse.Namespace) -> int:
    result = open_run(args).align()
    if emit_result(result, args):
        return 0
    offsets = result["ranks"]
    print(f"reference rank: {result['reference_rank']}")
    print(f"{'rank':>5} {'offset_ns':>16} {'drift_ppm':>10} {'uncert_ns':>11} {'anchors':>8}"
          f"  method       note")
    for r in offsets.iter_rows(named=True):
        unc = "-" if r["uncertainty_ns"] is None else str(r["uncertainty_ns"])
        print(f"{r['rank']:>5} {r['offset_ns']:>16} {r['drift_ppm']:>10.3f} {unc:>11} "
              f"{r['anchors']:>8}  {r['method']:<12} {r['note'] or ''}")
    _print_problems(result["problems"])
    return 0


def _print_problems(problems: pl.DataFrame) -> None:
    for p in problems.iter_rows(named=True):
        who = "" if p["rank"] is None else f" rank {p['rank']}"
        print(f"note: group {p['group']}{who}: {p['problem']}: {p['detail']}")


def run_collectives(args: argparse.Namespace) -> int:
    result = open_run(args).collectives()
    if emit_result(result, args):
        return 0
    inst, summary, fits = result["instances"], result["summary"], result["alpha_beta"]
    if inst.height == 0:
        print("no collective was matched across ranks")
        _print_problems(result["problems"])
        return 0
    print(f"{inst.height} collective instances matched across ranks "
          f"(alignment uncertainty up to {result['alignment']['max_uncertainty_ns']} ns)")
    print(f"{'name':<16} {'size':<22} {'n':>5} {'p50_us':>10} {'p90_us':>10} {'p99_us':>10}"
          f" {'tail':>6} {'skew_p50_us':>12} {'busbw_GB/s':>11}")
    for r in summary.iter_rows(named=True):
        bw = "-" if r["busbw_p50_gbps"] is None else f"{r['busbw_p50_gbps']:.2f}"
        print(f"{r['name']:<16} {r['size_bucket']:<22} {r['instances']:>5} "
              f"{r['p50_ns'] / 1e3:>10.1f} {r['p90_ns'] / 1e3:>10.1f} {r['p99_ns'] / 1e3:>10.1f}"
              f" {r['tail_ratio']:>6.2f} {r['skew_p50_ns'] / 1e3:>12.1f} {bw:>11}")
    for r in fits.iter_rows(named=True):
        if r["alpha_ns"] is not None:
            beta = "-" if r["beta_gbps"] is None else f"{r['beta_gbps']:.2f} GB/s"
            print(f"alpha-beta {r['name']}: alpha {r['alpha_ns'] / 1e3:.1f} us, beta {beta}, "
                  f"relative RMS error {100 * r['rel_rms_error']:.1f}% over {r['instances']}")
    _print_problems(result["problems"])
    return 0


def run_stragglers(args: argparse.Namespace) -> int:
    result = open_run(args).stragglers()
    if emit_result(result, args):
        return 0
    res = result["ranks"]
    flagged = res.filter(pl.col("flagged"))
    print(f"{flagged.height} straggler(s) flagged" if flagged.height else "no straggler flagged")
    for r in res.iter_rows(named=True):
        print(f"rank {r['rank']}: imposed {r['imposed_wait_ns'] / 1e6:.2f} ms, last at "
              f"{r['last_arrivals']} of {r['instances']}: {r['explanation']}")
    return 0
