"""Where `traceview ingest FILE --no-cache` spends its time, phase by phase (one Kineto file).

    python benchmarks/ingest_phases.py FILE [--rounds 3]

Each round is a fresh process that runs ``traceview.cli.main(["ingest", FILE, "--no-cache"])``
with hooks that only note the wall clock and the process's CPU time (all threads: the scanner's
two and the Parquet writer's) where a phase ends: imports, reading and hashing, the C scan, the
work after it (columns, row keys, text facts), the steps and the first batch, the other
batches with the Parquet write beside them, and the rest (cache meta, report). Prints the
fastest of the rounds per phase. CPU seconds are what a phase costs; on a shared machine, read
the wall column with the load average (printed). docs/performance.md, log 42.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as a script: the checkout's traceview
    sys.path.insert(0, REPO)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _one_round(path: str) -> list[tuple[str, float, float]]:
    """(phase, wall s, CPU s) of one ingest in this process (imports included)."""
    marks = [("start", time.perf_counter(), _cpu())]

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter(), _cpu()))

    import traceview.cli
    from traceview.parsers.kineto import _parse
    from traceview.store import ingest

    mark("imports")
    scan, with_steps = _parse._kineto_scan.scan, ingest.batches_with_steps

    def timed_scan(*args):
        mark("read, hash, open")
        out = scan(*args)
        mark("C scan (two threads)")
        return out

    def timed_batches(batches, steps=None):
        mark("after the scan: columns, row keys, text facts, steps found")
        for i, table in enumerate(with_steps(batches, steps)):
            if i == 0:
                mark("steps + first batch")
            yield table
        mark("other batches + Parquet write (writer thread)")

    from traceview.cli import core

    report = core.info_report

    def timed_report(ts):
        mark("cache meta, placement, the TraceSet")
        out = report(ts)
        mark("the command's report (info_report)")
        return out

    _parse._kineto_scan.scan, ingest.batches_with_steps = timed_scan, timed_batches
    core.info_report = timed_report
    with contextlib.redirect_stdout(io.StringIO()):
        traceview.cli.main(["ingest", path, "--no-cache"])
    mark("printing, temporary cache removed")
    return [(b[0], b[1] - a[1], b[2] - a[2]) for a, b in zip(marks, marks[1:])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_one_round(args.path)))
        return 0
    rounds = []
    for _ in range(args.rounds):
        out = subprocess.run([sys.executable, __file__, args.path, "--child"], check=True,
                             capture_output=True, text=True, env=os.environ).stdout
        rounds.append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {len(rounds)}: load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    mb = os.path.getsize(args.path) / 1e6
    print(f"{args.path}: {mb:.0f} MB, fastest of {args.rounds} rounds per phase")
    print("| phase | wall s | CPU s |\n|---|---|---|")
    for i, (name, *_) in enumerate(rounds[0]):
        wall, cpu = min(r[i][1] for r in rounds), min(r[i][2] for r in rounds)
        print(f"| {name} | {wall:.3f} | {cpu:.3f} |")
    totals = [(sum(x[1] for x in r), sum(x[2] for x in r)) for r in rounds]
    print(f"| total (fastest round) | {min(t[0] for t in totals):.3f} | "
          f"{min(t[1] for t in totals):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
