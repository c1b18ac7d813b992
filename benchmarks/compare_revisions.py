"""Two revisions side by side in one run: the analysis suite, and the cold ingest as a control.

    git worktree add --detach /work/bench-before REV     # and /work/bench-after, each with
    (cd DIR && python3 -m venv .venv && .venv/bin/pip install -e ".[bench]")   # its own venv
    python benchmarks/compare_revisions.py --before /work/bench-before/.venv/bin/python \\
        --after /work/bench-after/.venv/bin/python --inputs r8,gloo --scale 0.5 --repeat 5

Each side is a checkout with its own interpreter (its checkout is where that interpreter imports
``traceview`` from). Per input: (1) each side ingests it into its own cache folder; (2) each side
runs every suite command once as ``traceview CMD PATHS --json`` (``traceview.cli.main``; the
module in one revision, the package in the other), and the two outputs are compared value by
value: fields only AFTER has are listed, floats equal to ~1e-9 relative are reported as
last-place differences, anything else is a difference (exit code 1); (3) ``--repeat`` rounds,
each running the cold ingest (into a scratch folder) and then each command, BEFORE and AFTER
one after the other, the order swapped every round so the shared machine's load and a
command's position after an ingest weigh on both sides alike. Every timed run is a fresh child
process through that side's own ``benchmarks/ops.py`` (imports before the clock, wall and CPU
time of the operation, peak RSS). It prints one table per input (best and median wall, median
CPU, the median wall time of a whole ``traceview CMD`` process (interpreter start and imports
included: the time to the first answer), largest peak RSS, after/before ratios, the suite's
sum) and the load average before and after. Ratios in one run only: no threshold, nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402

SUITE = ("align", "collectives", "stragglers", "gaps", "overlap", "breakdown", "summary")
CLI = "import sys; from traceview.cli import main; sys.exit(main(sys.argv[1:]))"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


#: The children's environment: with compiled bytecode kept (``__pycache__``), as a user's
#: install has it. Where ``PYTHONDONTWRITEBYTECODE`` is set every process compiles every module
#: it imports from source, and a side whose code moved into modules imported later (the Run)
#: would be charged for compiling them inside its timings.
#: Each timed command computes its answer from the cache: an answer kept by the run before
#: (traceview/cli/_answers.py) would time nothing but its printing.
CHILD_ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
             "TRACEVIEW_ANSWERS": "off"}


def checkout_of(python: str) -> Path:
    """The checkout ``python`` imports traceview from (run outside any checkout)."""
    code = "import pathlib, traceview; print(pathlib.Path(traceview.__file__).parents[1])"
    return Path(subprocess.run([python, "-c", code], cwd="/", capture_output=True, text=True,
                               check=True).stdout.strip())


def measure(side: dict[str, Any], op: str, **args: Any) -> dict[str, Any]:
    """One operation in a fresh child: that side's ``benchmarks/ops.py OP ARGS``."""
    proc = subprocess.run([side["python"], str(side["dir"] / "benchmarks" / "ops.py"), op,
                           json.dumps(args)], cwd=side["dir"], capture_output=True, text=True,
                          env=CHILD_ENV)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result.get("error"):
        raise SystemExit(f"{side['name']} {op}: {result['error']}\n{proc.stderr[-2000:]}")
    return result


def cli_process(side: dict[str, Any], command: str, paths: list[str], cache: Path) -> Any:
    """A user's process, ``traceview CMD PATHS --json``: its parsed output and its wall time,
    interpreter start and imports included (the time to the first answer)."""
    t = time.perf_counter()
    proc = subprocess.run([side["python"], "-c", CLI, command, *paths, "--json",
                           "--cache-dir", str(cache)], cwd=side["dir"], capture_output=True,
                          text=True, env=CHILD_ENV)
    if proc.returncode:
        raise SystemExit(f"{side['name']} {command}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout), time.perf_counter() - t


def diff(a: Any, b: Any, where: str, out: dict[str, list[str]]) -> None:
    """Differences of ``b`` (after) from ``a`` (before), sorted into added / float / other."""
    if isinstance(a, dict) and isinstance(b, dict):
        out["added"] += [f"{where}.{k}" for k in b if k not in a]
        out["other"] += [f"{where}.{k}: missing after" for k in a if k not in b]
        for k in a.keys() & b.keys():
            diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float) and a != b and math.isclose(a, b, rel_tol=1e-9):
        out["float"].append(f"{where}: {a!r} -> {b!r}")
    elif a != b or type(a) is not type(b):
        out["other"].append(f"{where}: {str(a)[:80]} -> {str(b)[:80]}")


def compare(name: str, paths: list[str], sides: list[dict[str, Any]], repeat: int,
            out: Path) -> bool:
    for s in sides:
        s["cache"], s["scratch"] = out / name / s["name"] / "cache", out / name / s["name"] / "ingest"
        measure(s, "ingest", paths=paths, cache_dir=str(s["cache"]))
    same = True
    for command in SUITE:  # also fills each side's derived cache before the timed rounds
        found: dict[str, list[str]] = {"added": [], "float": [], "other": []}
        diff(*(cli_process(s, command, paths, s["cache"])[0] for s in sides), command, found)
        same &= not found["other"]
        for kind, items in found.items():
            if items:
                log(f"{name} {command}: {len(items)} {kind}: {'; '.join(items[:4])}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s["name"]: {} for s in sides}
    for r in range(repeat):
        order = sides if r % 2 == 0 else sides[::-1]
        for op in ("ingest", *SUITE):
            for s in order:
                if op == "ingest":
                    res = measure(s, "ingest", paths=paths, cache_dir=str(s["scratch"]))
                else:
                    res = measure(s, "analysis", command=op, paths=paths, cache_dir=str(s["cache"]))
                    res["process_s"] = cli_process(s, op, paths, s["cache"])[1]
                runs[s["name"]].setdefault(op, []).append(res)
        log(f"{name}: round {r + 1}/{repeat}, load {os.getloadavg()}")
    (out / f"{name}.json").write_text(json.dumps(runs, indent=1))
    table(name, paths, runs)
    return same


def stats(rows: list[dict[str, Any]]) -> dict[str, float]:
    wall = [r["wall_s"] for r in rows]
    return {"best": min(wall), "median": statistics.median(wall),
            "cpu": statistics.median(r["cpu_s"] for r in rows),
            "rss": max(r["peak_rss_mb"] for r in rows),
            "process": statistics.median(r.get("process_s", math.nan) for r in rows)}


def table(name: str, paths: list[str], runs: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    before, after = (runs[k] for k in ("before", "after"))
    rows = {op: (stats(before[op]), stats(after[op])) for op in before}
    total = tuple({k: sum(rows[c][i][k] for c in SUITE)
                   for k in ("best", "median", "cpu", "process")}
                  for i in (0, 1))
    print(f"\n{name} ({len(paths)} path(s)), {len(next(iter(before.values())))} rounds; "
          "seconds (after/before); peak RSS MB")
    print("| command | wall best: before / after (ratio) | wall median | CPU s median "
          "| whole process, median | peak RSS |")
    print("|---|---|---|---|---|---|")
    for op, (b, a) in [*rows.items(), ("**suite**", total)]:
        cells = [f"{b[k]:.3f} / {a[k]:.3f} ({a[k] / b[k]:.2f})" if b[k] == b[k] else "-"
                 for k in ("best", "median", "cpu", "process")]
        rss = f"{b['rss']:.0f} / {a['rss']:.0f}" if "rss" in b else "-"
        print(f"| {op} | {' | '.join(cells)} | {rss} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the BEFORE checkout's interpreter")
    ap.add_argument("--after", required=True, help="the AFTER checkout's interpreter")
    ap.add_argument("--inputs", default="r8,gloo", help="comma list of r8 (the harness's 8 ranks "
                    "at --scale) and gloo (fixtures/data/gloo_ddp_2r)")
    ap.add_argument("--scale", type=float, default=0.5, help="r8 is 8 x 100*SCALE MB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args(argv)
    sides = [{"name": n, "python": p, "dir": checkout_of(p)}
             for n, p in (("before", args.before), ("after", args.after))]
    for s in sides:
        rev = subprocess.run(["git", "-C", str(s["dir"]), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        log(f"{s['name']}: {s['dir']} at {rev}")
    out = args.out / "compare"
    print(f"load before: {os.getloadavg()}")
    same = True
    for name in [n.strip() for n in args.inputs.split(",") if n.strip()]:
        if name == "r8":
            s = inputs.kineto_set(args.out / "inputs", ranks=8, mb_per_rank=round(100 * args.scale, 1),
                                  gzip_files=False, log=log)
            name, paths = s.name, [str(p) for p in s.paths]
        elif name == "gloo":
            paths = [str(HERE.parent / "fixtures" / "data" / "gloo_ddp_2r")]
        else:
            ap.error(f"unknown input {name!r}")
        same &= compare(name, paths, sides, args.repeat, out)
    print(f"load after: {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
