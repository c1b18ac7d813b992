"""Start-up cost of two checkouts side by side in one run: ``traceview --version`` and a cached
``summary``, each a fresh process, alternating which side goes first every round.

    git worktree add --detach /work/bench-before REV
    python benchmarks/startup.py --before /work/bench-before --after . --repeat 15

Each side runs ``python -m traceview`` with that checkout first on ``PYTHONPATH`` (one
interpreter for both, so only the code differs; a compiled Kineto scanner must be built in
each). The summary's cache is filled once per side before timing. Prints the median and best
wall time per command and side, and after/before ratios. Ratios in one run only: nothing here
is a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "data" / "gloo_ddp_2r"


def commands(cache: str) -> dict[str, list[str]]:
    return {"--version": ["--version"],
            "summary (cached)": ["summary", str(FIXTURE), "--json", "--cache-dir", cache]}


def timed(checkout: Path, argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceview", *argv], cwd=checkout, env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=ROOT)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args(argv)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        caches = {side: str(Path(scratch, side)) for side in sides}
        for side, checkout in sides.items():  # fill each side's cache, untimed
            timed(checkout, commands(caches[side])["summary (cached)"])
        for round_ in range(args.repeat):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in commands(""):
                for side in order:
                    argv_ = commands(caches[side])[name]
                    times.setdefault((name, side), []).append(timed(sides[side], argv_))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeat} rounds; "
          f"before={sides['before']} after={sides['after']}")
    print(f"{'command':<20} {'before med':>11} {'after med':>10} {'ratio':>6} "
          f"{'before best':>12} {'after best':>11}")
    for name in commands(""):
        b, a = times[(name, "before")], times[(name, "after")]
        print(f"{name:<20} {statistics.median(b):>10.3f}s {statistics.median(a):>9.3f}s "
              f"{statistics.median(a) / statistics.median(b):>6.2f} {min(b):>11.3f}s "
              f"{min(a):>10.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
