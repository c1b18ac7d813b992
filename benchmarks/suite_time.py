"""Time the analysis suite as a user runs it: one child process per command, from the cache.

    python benchmarks/suite_time.py PATH --cache-dir DIR [--repeat 3] [--only gaps,overlap]

Each run is ``benchmarks/ops.py analysis`` (imports warmed, then ``traceview.cli.main([CMD,
PATH, "--json", "--cache-dir", DIR])`` timed) under ``/usr/bin/time -v``. Per command it prints
the fastest and the median wall time, the CPU time of the same span (this process and its
workers: robust to other users' load where wall time is not), and the largest peak RSS
(``/usr/bin/time``'s maximum resident set size). The load average is printed before and after:
on a shared machine, read the numbers with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

SUITE = ("align", "collectives", "stragglers", "gaps", "overlap", "breakdown", "summary")
OPS = Path(__file__).resolve().parent / "ops.py"


def run_once(command: str, path: str, cache_dir: str) -> dict:
    args = json.dumps({"command": command, "paths": [path], "cache_dir": cache_dir})
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, str(OPS), "analysis", args],
                          capture_output=True, text=True, check=False)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    result["time_v_rss_mb"] = int(rss.group(1)) / 1024 if rss else None
    if result.get("error"):
        raise SystemExit(f"{command}: {result['error']}\n{proc.stderr[-2000:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", help="comma list of commands (default: the whole suite)")
    args = p.parse_args(argv)
    commands = args.only.split(",") if args.only else SUITE
    print(f"load before: {os.getloadavg()}")
    print(f"{'command':<12} {'wall_min':>9} {'wall_med':>9} {'cpu_min':>8} {'cpu_med':>8} "
          f"{'rss_mb':>8}")
    totals = {"wall_min": 0.0, "wall_med": 0.0, "cpu_min": 0.0, "cpu_med": 0.0}
    for cmd in commands:
        rows = [run_once(cmd, args.path, args.cache_dir) for _ in range(args.repeat)]
        wall = [r["wall_s"] for r in rows]
        cpu = [r["cpu_s"] for r in rows]
        rss = max(r["time_v_rss_mb"] for r in rows)
        stats = {"wall_min": min(wall), "wall_med": statistics.median(wall),
                 "cpu_min": min(cpu), "cpu_med": statistics.median(cpu)}
        for k, v in stats.items():
            totals[k] += v
        print(f"{cmd:<12} {stats['wall_min']:>9.2f} {stats['wall_med']:>9.2f} "
              f"{stats['cpu_min']:>8.2f} {stats['cpu_med']:>8.2f} {rss:>8.0f}", flush=True)
    print(f"{'total':<12} {totals['wall_min']:>9.2f} {totals['wall_med']:>9.2f} "
          f"{totals['cpu_min']:>8.2f} {totals['cpu_med']:>8.2f}")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
