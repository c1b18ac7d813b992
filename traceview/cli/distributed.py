"""Distributed subcommands: ``align``, ``collectives``, ``stragglers``, ``pipeline``, ``alltoall``.

``--json`` outputs are contracts (field names stable; fields may be added):

* ``align``: ``{"reference_rank", "ranks": [{"rank", "offset_ns", "drift_ppm",
  "uncertainty_ns", "anchors", "method", ...}], "problems": [...]}``
* ``collectives``: ``{"instances": [{"group", "seq", "name", "n_ranks", "bytes", "skew_ns",
  "last_rank", ...}], "summary": [...], "alpha_beta": [...], "problems": [...],
  "alignment": {...}}``
* ``stragglers``: ``{"ranks": [{"rank", "flagged", "imposed_wait_ns", "last_arrivals",
  "explanation", ...}], "alignment": {...}, "replay_culprits": [{"rank", "gain_ns_per_step",
  "slowdown", "steps", "cost_ns_per_occurrence", "confidence"}], "patterns": {"pattern",
  "named", "ranks", "combined_gain_ns_per_step", "moving_cost_ns_per_step", "trusted",
  "replay_error", "words"}, "rank_slowdowns": [...] (S_w), "type_slowdowns": [...] (S_t)}``,
  ``ranks`` sorted by ``imposed_wait_ns``, largest first.
* ``pipeline``: ``{"stages": [{"rank", "stage", "compute_ns", "bubble_ns", "bubble_fraction",
  "wait_upstream_ns", "wait_downstream_ns", ...}], "steps": [...], "bottleneck": {"rank",
  "stage", "gain_ns_per_step", ...}, "schedule": {"kind", "micro_batches",
  "ideal_bubble_fraction", ...}, "p2p": {"pairs", "unmatched", ...}}``, by stage.
* ``alltoall``: ``{"ranks": [{"rank", "send_bytes", "recv_bytes", ...}], "hot_rank",
  "imbalance", "cost_ns_per_step", "matrix": [{"step", "src", "dst", "bytes"}], ...,
  "warnings"}``.
"""

from __future__ import annotations

import argparse

import polars as pl

from traceview.analyses.collectives import MAX_FIT_REL_RMS
from traceview.cli._options import (
    MAX_RANK,
    add_align_arg,
    add_all_arg,
    add_input_args,
    add_json_arg,
    add_window_args,
    open_run,
    real,
    whole,
)
from traceview.cli._render import (
    emit_result,
    fixed,
    is_many,
    ms,
    not_shown,
    outlier_ranks,
    pct,
    spread,
    table,
    us,
)


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p`` (they share them), and the function it runs."""
    add_input_args(p)
    add_json_arg(p, csv=True)
    add_window_args(p)
    add_align_arg(p)
    add_all_arg(p)
    if command == "collectives":
        p.add_argument("--nccl-log", nargs="+", default=[], metavar="FILE",
                       help="NCCL debug logs (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL,"
                            "TUNING): add the algorithms and protocols NCCL chose")
    if command == "pipeline":
        p.add_argument("--timeline", action="store_true",
                       help="--json/--csv: add each stage's waits, transfers and collectives "
                            "as timeline segments (field timeline)")
    p.add_argument("--reference-rank", type=whole(0, MAX_RANK), default=None, metavar="R",
                   help="rank whose clock is the reference (default: lowest)")
    p.add_argument("--tolerance-us", type=real(0, 1e9, above_low=True), default=None,
                   help="completion-time tolerance for matching (us); default: learnt per "
                        "group from the run's own residuals")
    p.set_defaults(run={"align": run_align, "collectives": run_collectives,
                        "stragglers": run_stragglers, "pipeline": run_pipeline,
                        "alltoall": run_alltoall}[command])


def run_align(args: argparse.Namespace) -> int:
    result = open_run(args).align()
    if emit_result(result, args):
        return 0
    print(f"reference rank: {result['reference_rank']}")
    ranks = rows = result["ranks"]
    if is_many(ranks, args):
        print(spread(ranks, [("uncertainty_ns", "uncertainty (us)", us),
                             ("anchors", "anchors", lambda v: fixed(v, 0))]))
        keep = outlier_ranks(ranks, ["uncertainty_ns"])
        rows = ranks.filter(pl.col("rank").is_in(keep) | (pl.col("method") == "none")
                            | (pl.col("rank") == result["reference_rank"]))
        print(f"\nThe reference, unaligned and outlier ranks ({rows.height}):")
    print(table(["rank", "offset_ns", "drift_ppm", "uncert_ns", "anchors", "quality", "method",
                 "note"],
                [[r["rank"], r["offset_ns"], fixed(r["drift_ppm"], 3), r["uncertainty_ns"],
                  r["anchors"], r.get("quality"), r["method"], r["note"]]
                 for r in rows.iter_rows(named=True)],
                left={"quality", "method", "note"}, max_width=None))
    if rows.height < ranks.height:
        print(not_shown(rows.height, ranks.height, "align"))
    _print_problems(result["problems"], args)
    return 0


def _print_problems(problems: pl.DataFrame, args: argparse.Namespace) -> None:
    """The matching's problems: the warnings said them in plain words already, so their
    technical lines only with --verbose."""
    if problems.height and not getattr(args, "verbose", False):
        print(f"({problems.height} matching problem(s) behind the warnings: --verbose)")
        return
    for p in problems.iter_rows(named=True):
        who = "" if p["rank"] is None else f" rank {p['rank']}"
        print(f"note: group {p['group']}{who}: {p['problem']}: {p['detail']}")


def run_collectives(args: argparse.Namespace) -> int:
    result = open_run(args).collectives(nccl_logs=args.nccl_log)
    if emit_result(result, args):
        return 0
    if args.nccl_log:
        _print_nccl_log(result["nccl_choices"], result["nccl_calls"])
    inst, summary, fits = result["instances"], result["summary"], result["alpha_beta"]
    if inst.height == 0:
        print("no collective was matched across ranks")
        _print_problems(result["problems"], args)
        return 0
    print(f"{inst.height} collective instances matched across ranks "
          f"(alignment uncertainty up to {result['alignment']['max_uncertainty_ns']} ns)")
    print(table(["group", "name", "size", "nodes", "n", "p50_us", "p90_us", "p99_us", "tail",
                 "skew_p50_us", "own_p50_us", "comm_p50_us", "busbw_GB/s", "time_is"],
                [[r["group"], r["name"], r["size_bucket"], _span(r), r["instances"],
                  us(r["p50_ns"]), us(r["p90_ns"]), us(r["p99_ns"]), fixed(r["tail_ratio"], 2),
                  us(r["skew_p50_ns"]), us(r["own_spread_p50_ns"]), us(r["comm_p50_ns"]),
                  fixed(r["busbw_p50_gbps"], 2), r["time_is"]]
                 for r in summary.iter_rows(named=True)],
                left={"group", "name", "size", "nodes", "time_is"}))
    several = fits.height and fits.get_column("locality").n_unique() > 1
    for r in fits.iter_rows(named=True):
        if several:  # intra- and inter-node links fitted apart
            r = {**r, "name": f"{r['name']} ({r['locality']})"}
        if r["alpha_ns"] is not None and not r["meaningful"]:
            print(f"alpha-beta {r['name']}: no meaningful fit: times scatter around any "
                  f"latency + size/bandwidth line by {100 * r['rel_rms_error']:.0f}% (RMS, "
                  f"over {r['instances']} instances; a fit needs at most "
                  f"{100 * MAX_FIT_REL_RMS:.0f}%)")
        elif r["alpha_ns"] is not None:
            beta = "-" if r["beta_gbps"] is None else f"{r['beta_gbps']:.2f} GB/s"
            print(f"alpha-beta {r['name']}: alpha {r['alpha_ns'] / 1e3:.1f} us, beta {beta}, "
                  f"relative RMS error {100 * r['rel_rms_error']:.1f}% over {r['instances']}")
    _print_problems(result["problems"], args)
    return 0


def _span(row: dict) -> str:
    """``intra`` / ``inter (3)``: the row's locality and the most nodes it spans."""
    if row["locality"] == "intra-node":
        return "intra"
    return "-" if row["node_span"] is None else f"inter ({row['node_span']})"


def _print_nccl_log(choices: pl.DataFrame, calls: pl.DataFrame) -> None:
    """The NCCL log's view: which algorithm and protocol per collective and size."""
    if choices.height:
        print("NCCL log: algorithm and protocol chosen, per collective and message size")
        print(table(["collective", "algorithm", "protocol", "calls", "min_bytes", "max_bytes"],
                    choices.select("collective", "algorithm", "protocol", "calls", "min_bytes",
                                   "max_bytes").rows(),
                    left={"collective", "algorithm", "protocol"}))
    else:
        print("NCCL log: no algorithm or protocol named (no 'Bytes -> Algo' lines: log with "
              "NCCL_DEBUG_SUBSYS=TUNING)")
    if calls.height:
        print(table(["collective", "ranks", "calls", "bytes", "dtypes"],
                    calls.select("collective", "ranks", "calls", "bytes", "dtypes").rows(),
                    left={"collective", "dtypes"}))
    print()


def run_stragglers(args: argparse.Namespace) -> int:
    result = open_run(args).stragglers()
    if emit_result(result, args):
        return 0
    res = rows = result["ranks"]
    flagged = res.filter(pl.col("flagged"))
    print(f"{flagged.height} straggler(s) flagged" if flagged.height else "no straggler flagged")
    patterns = result["patterns"] or {}
    if patterns.get("named"):  # the replay's verdict where nobody is flagged (issue 46)
        print(f"replay: {patterns['words']}")
    if is_many(res, args):
        print(spread(res, [("imposed_wait_ns", "imposed wait (ms)", ms),
                           ("last_arrivals", "last arrivals", lambda v: fixed(v, 0))]))
        # the flagged ranks, then the largest imposed waits (the table is sorted by it)
        rows = pl.concat([flagged, res.filter(~pl.col("flagged")).head(5)])
        print()
    many = rows.height < res.height
    verbose = getattr(args, "verbose", False)
    for sentence in result["node_findings"]:
        print(f"node: {sentence}")
    for r in rows.iter_rows(named=True):
        # the evidence's paragraph for a flagged rank (or with --verbose); else one reason
        why = (r["explanation"] if r["flagged"] or verbose else
               f"{'' if r['verdict'] == 'unsure' else 'not flagged: '}{r['reason']}")
        print(f"rank {r['rank']}: imposed {r['imposed_wait_ns'] / 1e6:.2f} ms, last at "
              f"{r['last_arrivals']} of {r['instances']}: {why}")
    if not verbose and rows.filter(~pl.col("flagged")).height:
        print("(--verbose: the evidence behind each verdict)")
    print("imposed: the others' wait at the collectives the rank reached last, over the window; "
          "caused: the part of the waits its own time caused (not passed on from another "
          "rank), per step, as diagnose counts it")
    if many:
        print(not_shown(rows.height, res.height, "stragglers"))
    return 0



def run_pipeline(args: argparse.Namespace) -> int:
    result = open_run(args).pipeline(timeline=args.timeline)
    if emit_result(result, args):
        return 0
    stages, p2p = result["stages"], result["p2p"]
    print(f"send/recv: {p2p['pairs']} pairs, {p2p['unmatched']} call(s) unpaired")
    if stages.height == 0:
        print("no pipeline stages (the warnings say why)")
        return 0
    sched = result["schedule"]
    ideal, measured = sched["ideal_bubble_fraction"], sched["bubble_fraction"]
    print(f"schedule: {sched['kind'] or 'unknown'}, {sched['stages']} stages, "
          f"{sched['micro_batches'] if sched['micro_batches'] is not None else '?'} "
          f"micro-batches per step; bubble {pct(measured)} measured, {pct(ideal)} ideal "
          "(p-1)/(m+p-1)")
    rows = stages
    if is_many(stages, args):
        print(spread(stages, [("compute_per_step_ns", "compute per step (ms)", ms),
                              ("bubble_fraction", "bubble", pct)]))
        rows = stages.sort("compute_per_step_ns", descending=True).head(10).sort(
            "pipeline", "stage")
        print()
    per_step = [(pl.col(c) / pl.col("steps")).alias(c) for c in (
        "step_ns", "p2p_transfer_ns", "wait_upstream_ns", "wait_downstream_ns",
        "collective_ns", "bubble_ns")]
    shown = rows.with_columns(per_step)
    print("per stage, ms per step:")
    print(table(["stage", "rank", "step", "compute", "p2p_transfer", "wait_up", "wait_down",
                 "collective", "bubble", "bubble_%", "idle_%"],
                [[r["stage"], r["rank"], ms(r["step_ns"]), ms(r["compute_per_step_ns"]),
                  ms(r["p2p_transfer_ns"]), ms(r["wait_upstream_ns"]),
                  ms(r["wait_downstream_ns"]), ms(r["collective_ns"]), ms(r["bubble_ns"]),
                  pct(r["bubble_fraction"]), pct(r["idle_fraction"])]
                 for r in shown.iter_rows(named=True)]))
    if rows.height < stages.height:
        print(not_shown(rows.height, stages.height, "pipeline"))
    b = result["bottleneck"]
    if b["rank"] is not None:
        print(f"bottleneck: stage {b['stage']} (rank {b['rank']}): "
              f"{ms(b['gain_ns_per_step'])} ms per step more compute than the median stage; "
              f"at the median stage's speed a step would take {ms(b['step_ns_at_median_speed'])}"
              f" ms instead of {ms(b['step_ns'])} ms")
    else:
        print(f"bottleneck: none clear ({b['reason']})")


#: The matrix is printed for at most this many ranks (a 16 x 16 table still fits a screen).
MATRIX_RANKS = 16


def _kib(value: float | None) -> str | None:
    return None if value is None else f"{value / 1024:.1f}"


def run_alltoall(args: argparse.Namespace) -> int:
    result = open_run(args).alltoall()
    if emit_result(result, args):
        return 0
    ranks, matrix = result["ranks"], result["matrix"]
    exchanges = result["exchanges"]
    if exchanges.height == 0:
        print("no all-to-all was matched across ranks")
        return 0
    sources = sorted(set(exchanges.get_column("source").to_list()))
    print(f"{exchanges.height} all-to-all exchange(s) over {result['steps']} step(s); volumes "
          f"from {' and '.join(s.replace('_', ' ') for s in sources)}")
    hot = result["hot_rank"]
    if hot is None:
        print(f"balanced: the largest received volume is {result['imbalance'] or 1:.2f}x the "
              "mean (no hot rank)")
    else:
        print(f"hot rank {hot}: receives {result['imbalance']:.2f}x the mean volume "
              "(max / mean, at each step's most uneven exchange)")
    step = result["step_ns"]
    share = f" of a {ms(step)} ms step ({100 * result['cost_share']:.1f}%)" \
        if step and result["cost_share"] is not None else ""
    print(f"cost: {ms(result['cost_ns_per_step'])} ms per step{share}, against a balanced "
          "assignment of the same total")
    rows = ranks
    if is_many(ranks, args):
        print(spread(ranks, [("recv_bytes_per_step", "received (KiB/step)", _kib),
                             ("recv_ratio", "receive ratio", lambda v: fixed(v, 2))]))
        keep = outlier_ranks(ranks, ["recv_bytes_per_step"])
        rows = ranks.filter(pl.col("rank").is_in(keep) | pl.col("hot"))
        print()
    print(table(["rank", "sent_KiB/step", "received_KiB/step", "recv_ratio", "send_ratio",
                 "hot"],
                [[r["rank"], _kib(r["send_bytes_per_step"]), _kib(r["recv_bytes_per_step"]),
                  fixed(r["recv_ratio"], 2), fixed(r["send_ratio"], 2),
                  "hot" if r["hot"] else ""] for r in rows.iter_rows(named=True)]))
    if rows.height < ranks.height:
        print(not_shown(rows.height, ranks.height, "alltoall"))
    n = ranks.height
    if 0 < n <= MATRIX_RANKS and matrix.height:
        mean = matrix.group_by("src", "dst").agg(pl.col("bytes").sum() / result["steps"])
        cells = {(s, d): b for s, d, b in mean.rows()}
        order = ranks.get_column("rank").to_list()
        print("\nKiB per step, sender (row) to receiver (column):")
        print(table(["src", *map(str, order)],
                    [[s, *(_kib(cells.get((s, d))) for d in order)] for s in order]))
    return 0
