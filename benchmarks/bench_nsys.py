"""Throughput of the nsys SQLite parser on a large synthetic export (not a unit test).

    python benchmarks/bench_nsys.py --kernels 1000000 [--launches] [--repeat 3]

Writes a generation-3 export with ``--kernels`` kernel rows (4 processes; with ``--launches`` also
one cudaLaunchKernel row per kernel) into ``benchmarks/out/`` and times
``traceview.parsers.nsys.parse`` on it, for each reader (ADBC when installed, and the
sqlite3 module) with and without kernel launch geometry in args_json. Prints kernel rows/s and
total rows/s of the best of ``--repeat`` runs, and the peak RSS of the process.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fixtures.nsys_synthetic import write_bulk  # noqa: E402
from traceview.parsers import nsys  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--launches", action="store_true", help="one runtime row per kernel too")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"nsys-bulk-{args.kernels}{'-launches' if args.launches else ''}.sqlite"
    if not path.exists():
        t = time.perf_counter()
        write_bulk(path, kernels=args.kernels, launches=args.launches)
        print(f"generated {path.name} ({path.stat().st_size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - t:.1f} s")
    readers = [True, False] if importlib.util.find_spec("adbc_driver_sqlite") else [False]
    nsys.parse(path, use_adbc=readers[0], launch_args=False)  # warm up imports and page cache
    for use_adbc in readers:
        for launch_args in (False, True):
            best, parsed = float("inf"), None
            for _ in range(args.repeat):
                t = time.perf_counter()
                parsed = nsys.parse(path, use_adbc=use_adbc, launch_args=launch_args)
                best = min(best, time.perf_counter() - t)
            assert parsed is not None
            rows = parsed.events.num_rows
            print(f"reader={'adbc' if use_adbc else 'sqlite3':7s} launch_args={launch_args!s:5s} "
                  f"{best:6.2f} s  {args.kernels / best:12,.0f} kernel rows/s  "
                  f"{rows / best:12,.0f} rows/s  ({rows:,} rows)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
