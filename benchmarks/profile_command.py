"""Where one CLI command spends its time: cProfile with a process-time clock.

    python benchmarks/profile_command.py CMD PATH --cache-dir DIR [other CLI options]

Runs ``traceview.cli.main([CMD, PATH, "--json", "--cache-dir", DIR, *EXTRA])`` once in this
process (imports warmed first, as ``benchmarks/ops.py`` does) and prints the wall and CPU time
and the traceview functions by cumulative CPU time. The clock is ``time.process_time`` (all
threads of this process), so other users' load on a shared machine distorts it less than a
wall-clock profile.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command")
    p.add_argument("path")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--top", type=int, default=30, help="functions to list")
    args, extra = p.parse_known_args(argv)  # the rest goes to the command
    import polars  # noqa: F401  (warm, like benchmarks/ops.py)

    import traceview.cli
    import traceview.store.traceset  # noqa: F401

    os.environ["TRACEVIEW_ANSWERS"] = "off"  # profile the computation, not a kept answer
    profiler = cProfile.Profile(timer=time.process_time)
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        profiler.enable()
        rc = traceview.cli.main([args.command, args.path, "--json", "--cache-dir",
                                 args.cache_dir, *extra])
        profiler.disable()
    print(f"rc {rc}  wall {time.perf_counter() - wall:.3f} s  cpu {time.process_time() - cpu:.3f} s")
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"traceview|analyses|parsers", args.top)
    print("\n".join(line[:150] for line in out.getvalue().splitlines()
                    if "/" in line or "cumtime" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
