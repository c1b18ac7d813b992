"""The replay's predictions against the replay fixtures' balanced twins (issue 46, items 3, 4
and 6): per real gloo run in ``fixtures/data/replay``, the replay error of the unmodified run,
``rank=R:typical`` for its slowed ranks, ``ranks=all:typical``, each beside the twin's
measured mean step (the issue's bar: +-5% here, +-10% on the held-out runs), and
``diagnose``'s gain beside the twins' measured difference (bar +-25%), with the verdict.

    /work/venv/bin/python benchmarks/replay_predictions.py            # every fixture
    /work/venv/bin/python benchmarks/replay_predictions.py --only ddp1b_stall_r2 --json

Prints one Markdown table (the one docs/metrics.md, section *Replay*, carries).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import traceview  # noqa: E402

DATA = REPO / "fixtures" / "data" / "replay"


def slow_spec(truth: dict[str, Any]) -> str | None:
    """The SPEC that removes the slowness, as ``tests/test_replay_scenarios.py`` asks it: each
    slowed rank typical (a stall that moves between ranks: every rank)."""
    if not truth["slow_ranks"]:
        return None
    if truth["pattern"] == "rotating":
        return "ranks=all:typical"
    return ",".join(f"rank={r}:typical" for r in truth["slow_ranks"])


def measure(name: str) -> dict[str, Any]:
    truth = json.loads((DATA / name / "truth.json").read_text())
    twin = truth["measured"]["twin_step_ms_mean"]
    run = traceview.open(DATA / name, cache=False)
    specs = list(dict.fromkeys(["ranks=all:typical", *([slow_spec(truth)] if slow_spec(truth)
                                                        else [])]))
    got = run.whatif(*specs).to_dict()
    pred = {s["spec"]: s["step_ns_mean"] / 1e6 for s in got["scenarios"]}
    diag = run.diagnose().to_dict()
    findings = [f for f in diag.get("findings", [])
                if f["id"] in ("straggler", "several_stragglers", "intermittent_stall",
                               "moving_stall")]
    gain = sum(f["gain_ns_per_step"] or 0 for f in findings[:1]) / 1e6 if findings else 0.0
    verdict = ", ".join(f"{f['id']}({f['rank']})" for f in findings) or "none"
    return {"name": name, "measured": truth["measured"]["step_ms_mean"], "twin": twin,
            "difference": truth["measured"]["twin_difference_ms"],
            "error": got["replay_error"], "trusted": got["trusted"],
            "all": pred["ranks=all:typical"], "slow_spec": slow_spec(truth),
            "slow": pred.get(slow_spec(truth)) if slow_spec(truth) else None,
            "gain": gain, "verdict": verdict}


def _pct(value: float, ref: float) -> str:
    return f"{(value - ref) / ref:+.0%}" if ref else "–"


def row(m: dict[str, Any]) -> str:
    err = m["error"]
    error = f"{err['median']:.1%} / {err['p90']:.1%}" if err["median"] is not None else "–"
    slow = f"{m['slow']:.1f} ({_pct(m['slow'], m['twin'])})" if m["slow"] is not None else "–"
    gain = f"{m['gain']:.1f} vs {m['difference']:.1f} ({_pct(m['gain'], m['difference'])})" \
        if m["difference"] else f"{m['gain']:.1f} vs 0"
    return (f"| {m['name']} | {error} | {'yes' if m['trusted'] else 'no'} | {m['measured']:.1f} | "
            f"{m['twin']:.1f} | {slow} | {m['all']:.1f} ({_pct(m['all'], m['twin'])}) | "
            f"{gain} | {m['verdict']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="fixture names (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per fixture")
    args = parser.parse_args()
    names = args.only or sorted(p.name for p in DATA.iterdir() if p.is_dir())
    if not args.json:
        print("| run | error median / p90 | trusted | measured | twin | slow ranks typical "
              "| all typical | diagnose gain vs twins (ms/step) | verdict |")
        print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        m = measure(name)
        print(json.dumps(m) if args.json else row(m), flush=True)


if __name__ == "__main__":
    main()
