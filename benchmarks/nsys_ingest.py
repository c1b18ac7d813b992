"""Cold ingest of one nsys SQLite export through ``traceview.open``, as ``ops.op_nsys`` times it.

    python benchmarks/nsys_ingest.py PATH [--cache-dir DIR] [--repeat 3] [--profile pyinstrument]
    python benchmarks/nsys_ingest.py PATH --stages      # one run: each step's wall, CPU, faults

Each run is a fresh process (as in the harness, so lazy imports inside the parser are paid): it
imports what ``ops._warm_imports`` imports, removes the cache folder, then times
``traceview.open`` and counts the kernel rows in the store. Prints wall and CPU seconds (the
process and its waited-for children), kernel rows/s and the peak RSS of each run. Not a unit
test.

``--stages`` times the main steps of one run (wall and CPU seconds, system seconds and MB of
page faults, which a fresh process pays for every buffer it fills first), by wrapping them;
threads overlap, so nested and parallel lines do not add up.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.ops import _warm_imports  # noqa: E402


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cold_open(path: Path, cache: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, kernel rows) of one cold ``traceview.open``."""
    import polars as pl

    import traceview

    shutil.rmtree(cache, ignore_errors=True)
    wall, cpu = time.perf_counter(), _cpu()
    ts = traceview.open([path], cache_dir=cache)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    kernels = ts.events.filter(pl.col("kind") == "kernel").select(pl.len()).collect().item()
    return wall, cpu, int(kernels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/traceview-nsys-bench-cache"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", choices=("pyinstrument", "cprofile"))
    ap.add_argument("--once", action="store_true", help="one run in this process, as JSON")
    ap.add_argument("--stages", action="store_true", help="one run, timing its main steps")
    args = ap.parse_args(argv)
    if not args.once and not args.profile and not args.stages:
        return _repeat(args)
    _warm_imports()
    if args.stages:
        _time_stages()
        wall, cpu, _ = cold_open(args.path, args.cache_dir)
        print(f"traceview.open: wall {wall:.3f} s  cpu {cpu:.3f} s")
        return 0
    if args.profile == "pyinstrument":
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
        profiler.start()
        cold_open(args.path, args.cache_dir)
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
        return 0
    if args.profile == "cprofile":
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        cold_open(args.path, args.cache_dir)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        return 0
    wall, cpu, kernels = cold_open(args.path, args.cache_dir)
    peak = max(resource.getrusage(who).ru_maxrss / 1024
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "kernels": kernels, "peak_rss_mb": peak}))
    return 0


#: (module, function) pairs that ``--stages`` times.
STAGES = (("traceview.store.parquet", "known_content_id"),
          ("traceview.parsers.nsys._parse", "open_export"),
          ("traceview.parsers.nsys._parse", "string_table"),
          ("traceview.parsers.nsys._db", "adbc_parts"),
          ("traceview.parsers.nsys._tables", "kernels"),
          ("traceview.parsers.nsys._parse", "_processes"),
          ("traceview.parsers.nsys._arrow", "in_time_order"),
          ("traceview.parsers.nsys._parse", "_parse_export"), ("traceview.store.ingest", "with_steps"),
          ("traceview.store.parquet", "write_events"))


def _time_stages() -> None:
    import functools
    import importlib

    start = time.perf_counter()

    def usage() -> tuple[float, float, float, int]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return (time.perf_counter() - start, own.ru_utime + own.ru_stime, own.ru_stime,
                own.ru_minflt)

    def timed(label: str, function):  # noqa: ANN001, ANN202
        @functools.wraps(function)
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            before = usage()
            try:
                return function(*args, **kwargs)
            finally:
                after = usage()
                print(f"{label:36s} at {before[0]:6.3f}  wall {after[0] - before[0]:6.3f}  "
                      f"cpu {after[1] - before[1]:6.3f}  sys {after[2] - before[2]:6.3f}  "
                      f"faulted {(after[3] - before[3]) * 4 / 1024:5.0f} MB", flush=True)
        return wrapper

    for module_name, name in STAGES:
        module = importlib.import_module(module_name)
        setattr(module, name, timed(f"{module_name.rsplit('.', 1)[-1]}.{name}",
                                    getattr(module, name)))


def _repeat(args: argparse.Namespace) -> int:
    command = [sys.executable, __file__, str(args.path), "--cache-dir", str(args.cache_dir),
               "--once"]
    for i in range(args.repeat):
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"run {i + 1}: wall {r['wall_s']:5.2f} s  cpu {r['cpu_s']:5.2f} s  "
              f"{r['kernels']:,} kernels  {r['kernels'] / r['wall_s']:>9,.0f} kernel rows/s "
              f"(wall)  {r['kernels'] / r['cpu_s']:>9,.0f} (CPU)  "
              f"peak RSS {r['peak_rss_mb']:,.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
