"""Start-up and the warm path against issue 23's targets: ``traceview --version``, ``--help``
and a cached ``summary --json`` of a large trace (the command line asked again: its kept
answer), and beside them the same summary computed from the cached events and tables (a
command line not asked before), each a fresh process. With ``--before``, two checkouts side
by side in one run, alternating which side goes first every round.

    python benchmarks/startup.py                          # this checkout against the targets
    git worktree add --detach /tmp/bench-before REV
    python benchmarks/startup.py --before /tmp/bench-before --repeat 10

Each side runs ``python -m traceview`` from a scratch folder with that checkout alone on
``PYTHONPATH`` (one interpreter for both, so only the code differs; a compiled Kineto scanner
must be built in each). Bytecode is compiled in each checkout first (``compileall``, as a wheel
install does): without it every run compiles traceview's sources again, ~0.2 CPU s that no
installed copy pays. The large trace is ``--trace PATH``, else the real-derived ~250 MB set
(``inputs.real_set``, from the corpus), else the synthetic 300 MB one (``benchmarks/out/inputs``,
made once); each side's cache is filled once, untimed.

Prints per command and side the wall time (best, median) and the CPU time (user + sys of the
child, best, median: less sensitive to other users' load on a shared machine), the load
average at start and end, and each target against the best wall time of ``--after``: exit 1
when one is missed. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Issue 23, item 4: seconds of wall time, best of the runs. A cached ``summary`` is the
#: same command line asked again: its answer was kept (``traceview/cli/_answers.py``).
TARGETS = {"--version": 0.25, "--help": 0.25, "summary (cached)": 0.5}

#: Shown beside them, without a target: the summary computed from the cached events and
#: tables, as for a command line not asked before (``TRACEVIEW_ANSWERS=off``).
ROWS = (*TARGETS, "summary (cached events)")


def commands(trace: Path, cache: str) -> dict[str, list[str]]:
    summary = ["summary", str(trace), "--json", "--cache-dir", cache]
    return {"--version": ["--version"], "--help": ["--help"], "summary (cached)": summary,
            "summary (cached events)": summary}


def timed(checkout: Path, argv: list[str], cwd: str, **env_: str) -> tuple[float, float]:
    """(wall s, CPU s: user + sys) of ``python -m traceview ARGV`` with ``checkout``'s code
    and the environment variables ``env_`` added."""
    env = {**os.environ, "PYTHONPATH": str(checkout), **env_}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceview", *argv], cwd=cwd, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compile_bytecode(checkout: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "traceview", "parsers",
                    "analyses"], cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)


def large_trace(out: Path) -> Path:
    """The real-derived ~250 MB trace, else the synthetic 300 MB one (made once)."""
    root = out / "inputs"
    real = inputs.real_set(root, "single", ranks=1, mb_per_rank=250)
    chosen = real or inputs.kineto_set(root, ranks=1, mb_per_rank=300, gzip_files=False)
    return chosen.paths[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="a checkout to compare with (optional)")
    p.add_argument("--after", type=Path, default=ROOT)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--trace", type=Path, help="the large trace (default: made once, see above)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    args = p.parse_args(argv)
    sides = {"after": args.after.resolve()}
    if args.before:
        sides = {"before": args.before.resolve(), **sides}
    trace = (args.trace or large_trace(args.out)).resolve()
    load_start = os.getloadavg()[0]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        caches = {side: str(Path(scratch, f"cache-{side}")) for side in sides}
        for side, checkout in sides.items():  # compile, fill each side's cache: untimed
            compile_bytecode(checkout)
            timed(checkout, commands(trace, caches[side])["summary (cached)"], scratch)
        for round_ in range(args.repeat):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in ROWS:
                for side in order:
                    argv_ = commands(trace, caches[side])[name]
                    env = {"TRACEVIEW_ANSWERS": "off"} if "events" in name else {}
                    times.setdefault((name, side), []).append(
                        timed(sides[side], argv_, scratch, **env))
    print(f"trace {trace} ({trace.stat().st_size / 1e6:.0f} MB); {args.repeat} rounds; load "
          f"average {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    for side, checkout in sides.items():
        print(f"  {side}: {checkout}")
    print(f"{'command':<23} {'side':<7} {'wall best':>9} {'median':>7} {'CPU best':>9} "
          f"{'median':>7}  target")
    missed = []
    for name in ROWS:
        target = TARGETS.get(name)
        for side in sides:
            wall = [w for w, _ in times[(name, side)]]
            cpu = [c for _, c in times[(name, side)]]
            verdict = ""
            if side == "after" and target is not None:
                met = min(wall) <= target
                verdict = f"<= {target:.2f} s wall: {'met' if met else 'MISSED'}"
                missed += [] if met else [name]
            print(f"{name:<23} {side:<7} {min(wall):>8.3f}s {statistics.median(wall):>6.3f}s "
                  f"{min(cpu):>8.3f}s {statistics.median(cpu):>6.3f}s  {verdict}")
    if missed:
        print(f"missed: {', '.join(missed)} (read them with the load average: the machine is "
              "shared)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
