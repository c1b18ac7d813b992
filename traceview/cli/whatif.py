"""``traceview whatif``: the run replayed from its dependency graph, checked against the
measured steps, and replayed again under what-if scenarios.

``--json`` contract (``traceview.run.replay``): ``{"window", "steps": [{"step", "measured_ns",
"replayed_ns", "error"}], "replay_error": {"median", "p90"}, "trusted", "not_reproduced",
"scenarios": [{"spec", "step_ns_mean", "step_ns_p50", "gain_ns_per_step", "slowdown",
"steps": [{"step", "predicted_ns", "replayed_ns"}]}], "verdict", "ranks" (S_w), "types" (S_t),
"critical_path", "graph", "notes", "warnings"}``; fields in full: ``traceview.run.replay``.
"""

from __future__ import annotations

import argparse

from traceview.cli._options import add_align_arg, add_input_args, add_json_arg, add_window_args, open_run
from traceview.cli._render import emit_result, ms, pct, table
from traceview.errors import UsageError


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``whatif``'s options on ``p``, and the function it runs."""
    add_input_args(p)
    add_json_arg(p, csv=True)
    add_window_args(p)
    add_align_arg(p)
    p.add_argument("--scenario", action="append", default=[], metavar="SPEC",
                   help="a what-if to replay (repeatable; SPECs joined by commas combine): "
                        "rank=R:typical, ranks=all:typical, comm=xF, op=REGEX:xF, "
                        "kernel=REGEX:xF, stalls=off")
    p.set_defaults(run=run_whatif)


def run_whatif(args: argparse.Namespace) -> int:
    from traceview.analyses.replay.scenarios import SpecError, parse_scenario
    try:
        for spec in args.scenario:
            parse_scenario(spec)
    except SpecError as exc:
        raise UsageError(f"--scenario: {exc}") from None
    result = open_run(args).whatif(*args.scenario)
    if emit_result(result, args):
        return 0
    steps = result["steps"]
    if steps.height == 0:
        print("no replay: no step markers in the window")
        return 0
    err = result["replay_error"]
    print(f"replay of {steps.height} step(s): error median {pct(err['median'])}, "
          f"p90 {pct(err['p90'])}: {'trusted' if result['trusted'] else 'NOT trusted'}")
    print(table(["step", "measured_ms", "replayed_ms", "error"],
                [[r["step"], ms(r["measured_ns"]), ms(r["replayed_ns"]), pct(r["error"])]
                 for r in steps.iter_rows(named=True)]))
    for note in result["notes"]:
        print(note)
    verdict = result["verdict"]
    if verdict["pattern"] == "moving":
        print(f"a stall moving between ranks {verdict['moving_ranks']}: "
              f"{ms(verdict['moving_cost_ns_per_step'])} ms per step; no single straggler")
    for c in verdict["culprits"]:
        where = f" on steps {c['steps']} ({ms(c['cost_ns_per_occurrence'])} ms each)" \
            if c["steps"] else ""
        print(f"culprit: rank {c['rank']}{where}: its typical gains "
              f"{ms(c['gain_ns_per_step'])} ms per step ({c['confidence']} confidence)")
    if len(verdict["culprits"]) > 1:
        print(f"all culprits typical at once: {ms(verdict['combined_gain_ns_per_step'])} ms "
              "per step (replayed, not summed)")
    if result["scenarios"]:
        print()
        print(table(["scenario", "step_ms_mean", "step_ms_p50", "gain_ms_per_step", "slowdown"],
                    [[s["spec"], ms(s["step_ns_mean"]), ms(s["step_ns_p50"]),
                      ms(s["gain_ns_per_step"]),
                      "-" if s["slowdown"] is None else f"{s['slowdown']:.3f}"]
                     for s in result["scenarios"]], left={"scenario"}))
    return 0
