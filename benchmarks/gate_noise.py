"""False alarms and detection of the CI gate (`traceview check`) on real re-runs of one job.

Not a test: it measures the rule of docs/ci-gate.md (*Run-to-run noise*) on runs made on this
machine, so the figures quoted there can be reproduced.

1. Generate re-runs of one unchanged 2-rank gloo DDP job, and runs of the same job with rank 1
   slowed by 40 ms per step (one every four unchanged runs, so both see the same load); about
   20 s a run on 2 cores::

       .venv/bin/python benchmarks/gate_noise.py generate --out /tmp/gate_runs --same 16 --slow 4

   Each run is ``python -m fixtures.gloo_ddp --threads 4 --batch 256 --steps 6 --seed 1``
   (``--slow-rank 1 --delay-ms 40`` for the slowed ones) into ``same_<i>`` / ``slow_<i>``.
   Four torch threads per rank on two cores oversubscribe the machine: the noise a shared CI
   runner shows. ``--wait-absent FILE`` waits before each run while FILE exists (a lock other
   benchmarks on a shared machine hold while they time something).

2. Measure::

       .venv/bin/python benchmarks/gate_noise.py measure /tmp/gate_runs
       .venv/bin/python benchmarks/gate_noise.py measure /tmp/gate_runs --noise-k 2 --alpha 0.05

   For a baseline of n = 1, 2, 3 runs: every n-subset of the unchanged runs is a baseline
   (``gate.baseline``, read back through JSON as `traceview check` reads the file), and
   ``gate.check`` judges every other unchanged run (a failure is a false alarm) and every
   slowed run (a failure is a detection). Damaged input counts as a failure, as in CI.
   Subsets share runs, so the checks are not independent: the rate is an average over
   subsets, its precision is that of the ~16 runs behind it, not of the number of checks.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

JOB = ["--threads", "4", "--batch", "256", "--steps", "6", "--seed", "1"]
SLOWED = ["--slow-rank", "1", "--delay-ms", "40"]


def generate(out: Path, same: int, slow: int, wait_absent: Path | None) -> None:
    """``same`` unchanged runs, and ``slow`` slowed ones spread evenly among them."""
    out.mkdir(parents=True, exist_ok=True)
    every = max(1, same // slow) if slow else 0
    plan = []
    for i in range(1, same + 1):
        plan.append((f"same_{i}", JOB))
        if every and i % every == 0 and sum(n.startswith("slow") for n, _ in plan) < slow:
            plan.append((f"slow_{i // every}", JOB + SLOWED))
    for name, args in plan:
        while wait_absent is not None and wait_absent.exists():
            time.sleep(20)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fixtures.gloo_ddp", "--out", str(out / name),
                        *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{name}: {time.perf_counter() - t0:.1f} s, load {os.getloadavg()[0]:.2f}",
              flush=True)


def _runs(folder: Path, prefix: str) -> list[Path]:
    return sorted(folder.glob(f"{prefix}_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))


def measure(folder: Path, noise_k: float | None, alpha: float | None,
            sizes: list[int], min_effect: float | None = None,
            inconclusive: str = "pass") -> dict:
    """The rates per baseline size (see the module docstring)."""
    import traceview
    from traceview.outputs import gate

    same, slow = _runs(folder, "same"), _runs(folder, "slow")
    if len(same) < max(sizes) + 1:
        raise SystemExit(f"{folder}: {len(same)} unchanged runs, need {max(sizes) + 1}")
    runs = {p.name: gate.measure(traceview.open(p)) for p in same + slow}
    ms = 1e6
    print(f"{'run':>8}  {'step p50':>9}  {'step max':>9}  {'wait/step':>9}  warnings")
    for name, r in runs.items():
        v = r.values
        print(f"{name:>8}  {v['step_time_p50_ns'] / ms:7.2f}ms  {v['step_time_max_ns'] / ms:7.2f}ms"
              f"  {v['collective_wait_per_step_ns'] / ms:7.2f}ms  {len(r.warnings)}")

    def fails(base: tuple[str, ...], now: str) -> list[str]:
        doc = orjson.loads(orjson.dumps(gate.baseline([runs[b] for b in base])))
        r = runs[now]
        res = gate.check(r.values, doc, now_notes=r.notes, now_samples=r.samples,
                         warnings=r.warnings, noise_k=noise_k, alpha=alpha,
                         min_effect=min_effect, inconclusive=inconclusive)
        undecided[0] = res.undecided
        if not res.failed:
            return []
        failing = ["regression", "missing", *(["inconclusive"] if inconclusive == "fail" else [])]
        bad = res.rows.filter(res.rows["status"].is_in(failing))["metric"]
        return bad.to_list() or ["damaged_input"]

    undecided = [False]  # the last check had an inconclusive metric
    result: dict = {"inconclusive": inconclusive, "noise_k": noise_k, "alpha": alpha, "min_effect": min_effect, "same": len(same), "slow": len(slow),
                    "step_time_p50_ms": {n: runs[n].values["step_time_p50_ns"] / ms
                                         for n in runs},
                    "sizes": {}}
    names_same = [p.name for p in same]
    for n in sizes:
        alarms = checks = detected = slow_checks = passed_undecided = 0
        by_metric: Counter[str] = Counter()
        by_run: Counter[str] = Counter()
        missed: Counter[str] = Counter()
        for base in itertools.combinations(names_same, n):
            for now in names_same:
                if now in base:
                    continue
                checks += 1
                bad = fails(base, now)
                passed_undecided += not bad and undecided[0]
                if bad:
                    alarms += 1
                    by_run[now] += 1
                    by_metric.update(bad)
            for s in slow:
                slow_checks += 1
                if fails(base, s.name):
                    detected += 1
                else:
                    missed[s.name] += 1
        result["sizes"][n] = {
            "false_alarms": alarms, "checks": checks, "false_alarm_rate": alarms / checks,
            "detected": detected, "slow_checks": slow_checks,
            "detection_rate": detected / slow_checks if slow_checks else None,
            "false_alarms_by_metric": dict(by_metric), "false_alarms_by_run": dict(by_run),
            "missed_by_run": dict(missed),
            "passed_with_inconclusive": passed_undecided}
        det = (f"detection {detected}/{slow_checks} = {detected / slow_checks:.1%}"
               if slow_checks else "no slowed runs")
        print(f"baseline of {n} run(s): false alarms {alarms}/{checks} = {alarms / checks:.1%}; "
              f"{det}; re-runs passed with an inconclusive metric: {passed_undecided}")
        if by_metric:
            print(f"    false alarms by metric: {dict(by_metric.most_common())}")
            print(f"    by run checked: {dict(by_run.most_common())}")
        if missed:
            print(f"    slowed runs passed: {dict(missed.most_common())}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="run the job: unchanged re-runs and slowed runs")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--same", type=int, default=16, help="unchanged re-runs")
    g.add_argument("--slow", type=int, default=4, help="runs with rank 1 slowed by 40 ms/step")
    g.add_argument("--wait-absent", type=Path, default=None, metavar="FILE",
                   help="before each run, wait while FILE exists")
    m = sub.add_parser("measure", help="false-alarm and detection rates per baseline size")
    m.add_argument("folder", type=Path, help="the --out of generate")
    m.add_argument("--noise-k", type=float, default=None, help="override k (default: gate's)")
    m.add_argument("--alpha", type=float, default=None, help="override alpha")
    m.add_argument("--min-effect", type=float, default=None,
                   help="override the effect-size threshold")
    m.add_argument("--sizes", default="1,2,3", help="baseline sizes (runs), comma list")
    m.add_argument("--inconclusive", choices=("pass", "fail"), default="pass",
                   help="what an inconclusive metric does (check --inconclusive)")
    m.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        generate(args.out, args.same, args.slow, args.wait_absent)
        return 0
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    res = measure(args.folder, args.noise_k, args.alpha,
                  [int(x) for x in args.sizes.split(",")], args.min_effect, args.inconclusive)
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2
                                           | orjson.OPT_NON_STR_KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
