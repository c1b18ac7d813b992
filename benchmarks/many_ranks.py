"""Many large real-derived ranks on one machine (issue 25, item 3): a cold ``summary --json``
of a folder of N ranks in torch's layout, its process tree's summed RSS, its cached answer,
and the same folder through ``--executor dask`` on a local two-worker cluster.

    python benchmarks/many_ranks.py --ranks 64 --mb 25           # ~1.7 GB folder
    python benchmarks/many_ranks.py --ranks 64 --mb 211          # the issue's 13.5 GB
    python benchmarks/many_ranks.py --ranks 1,8,16,32,64 --mb 25 --no-dask   # growth in N
    python benchmarks/many_ranks.py --steps 1,10,100,1000,2000    # growth in steps

``--steps``: instead, synthetic 8-rank NCCL jobs (``fixtures.synthetic``, seed 0, 12 kernels
a step, gzip) of each number of steps, the cold ``summary --json`` of each: how the cost
grows with the steps of a run rather than its ranks.

The folder (``benchmarks/out/inputs/torch-ranks-<N>r-<MB>mb``, never committed) is HTA's
16-rank NCCL job's rank 0 replicated to ``--mb`` MB per rank (``inputs.real_set``: the
source's own text, ~6 lines an event, 38 % flows), each rank with its own ``distributedInfo``
rank and a 7 us clock offset per rank. Several ``--ranks`` use the first N files of the
largest folder. Each measure is the whole command in a fresh process
(``measure.measure_command``: interpreter, imports and printing included), with the process
tree's summed RSS sampled every 20 ms, the number of processes alive at once, and the load
average. Prints a JSON line per measure and a table; writes ``benchmarks/out/many_ranks.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import inputs  # noqa: E402
from measure import measure_command  # noqa: E402


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _command(name: str, argv: list[str], cache: Path | None = None, *,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    load = _load()
    out = measure_command(argv, env=env, keep_output=True)
    out.update(name=name, load_before=load, load_after=_load())
    print(json.dumps({k: v for k, v in out.items() if k not in ("stderr_tail", "output")}),
          file=sys.stderr, flush=True)
    return out


def _folder_of(source: inputs.InputSet, n: int, root: Path) -> Path:
    """A folder holding the first ``n`` rank files of ``source`` (hard links)."""
    if n == len(source.paths):
        return source.paths[0].parent
    folder = root / f"{source.name}-first{n}"
    if not folder.is_dir() or len(list(folder.glob("*.json"))) != n:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for p in source.paths[:n]:
            os.link(p, folder / p.name)
        # a link changes the file's ctime: a kept answer waits for inputs settled for 2 s
        time.sleep(2.5)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64", help="rank counts (comma list)")
    ap.add_argument("--mb", type=float, default=25, help="MB of JSON per rank")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--no-cached", action="store_true")
    ap.add_argument("--steps", default="", help="step counts (comma list): synthetic runs")
    args = ap.parse_args(argv)
    if args.steps:
        return _steps_growth([int(c) for c in args.steps.split(",")], args.out)
    counts = [int(c) for c in args.ranks.split(",")]
    root = args.out / "inputs"
    made = inputs.real_set(root, "ranks", ranks=max(counts), mb_per_rank=args.mb,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    if made is None:
        print("corpus absent: nothing to measure", file=sys.stderr)
        return 2
    rows = []
    for n in counts:
        folder = _folder_of(made, n, root)
        json_mb = n * made.json_bytes / len(made.paths) / 1e6
        cache = args.out / "cache" / f"many-{n}"
        base = ["summary", str(folder), "--json", "--cache-dir", str(cache)]
        row: dict[str, Any] = {"ranks": n, "json_mb": json_mb}
        row["cold"] = _command(f"cold summary, {n} ranks", base, cache)
        if not args.no_cached:
            row["cached"] = _command(f"cached summary, {n} ranks", base)
        if not args.no_dask:
            dask_cache = args.out / "cache" / f"many-{n}-dask"
            row["dask"] = _command(
                f"cold summary --executor dask, {n} ranks",
                ["summary", str(folder), "--json", "--cache-dir", str(dask_cache),
                 "--executor", "dask"], dask_cache)
            row["dask_identical_json"] = (row["dask"].get("output") == row["cold"].get("output")
                                          and bool(row["cold"].get("output")))
        rows.append(row)
    for r in rows:  # the answers compared above; the results file keeps their size only
        for key in ("cold", "cached", "dask"):
            r.get(key, {}).pop("output", None)
    (args.out / "many_ranks.json").write_text(json.dumps(rows, indent=1, default=str))
    print("| ranks | JSON MB | cold s | cold CPU s | tree RSS MB | processes at once | "
          "cached s | dask s | dask tree RSS MB | dask --json identical | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, k, d = r["cold"], r.get("cached", {}), r.get("dask", {})
        print(f"| {r['ranks']} | {r['json_mb']:,.0f} | {c['wall_s']:.2f} | {c['cpu_s']:.2f} | "
              f"{c['tree_rss_mb']:,.0f} | {c.get('most_processes', '-')} | "
              f"{k.get('wall_s', float('nan')):.2f} | {d.get('wall_s', float('nan')):.2f} | "
              f"{d.get('tree_rss_mb', float('nan')):,.0f} | "
              f"{r.get('dask_identical_json', '-')} | {c['load_before']}-{c['load_after']} |")
    return 0


def _steps_growth(counts: list[int], out: Path) -> int:
    import subprocess

    rows = []
    for steps in counts:
        folder = out / "inputs" / f"synthetic-8r-{steps}steps"
        if not (folder / "ground_truth.json").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "fixtures.synthetic", "--out", str(folder),
                            "--world-size", "8", "--steps", str(steps), "--seed", "0"],
                           check=True, cwd=HERE.parent, capture_output=True)
        files = sorted(folder.glob("rank-*.json*"))
        json_mb = sum(inputs._uncompressed(f) for f in files) / 1e6
        cache = out / "cache" / f"steps-{steps}"
        cold = _command(f"cold summary, 8 ranks x {steps} steps",
                        ["summary", str(folder), "--json", "--cache-dir", str(cache)], cache)
        rows.append({"steps": steps, "json_mb": json_mb, "cold": cold})
    for r in rows:
        r["cold"].pop("output", None)
    (out / "many_steps.json").write_text(json.dumps(rows, indent=1, default=str))
    print("| steps | JSON MB (8 ranks) | cold s | cold CPU s | tree RSS MB | load |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        c = r["cold"]
        print(f"| {r['steps']} | {r['json_mb']:,.1f} | {c['wall_s']:.2f} | {c['cpu_s']:.2f} | "
              f"{c['tree_rss_mb']:,.0f} | {c['load_before']}-{c['load_after']} |")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    raise SystemExit(code)
