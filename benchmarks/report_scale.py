"""The HTML report at cluster scale, against the bounds of issue 11 (docs/report.md).

For each run shape (256 ranks x 12 steps, 8 ranks x 2,000 steps; generated once by
``fixtures/cluster_runs.py`` under ``benchmarks/out/report_scale/``):

* ``report_s``: ``traceview report RUN -o FILE`` in a child process, from an empty cache
  (ingest included, as a user's first report), wall seconds;
* ``load_ms``: navigation start to the load event in headless Chromium (real time, no virtual
  time budget; the median of ``--repeat`` loads), with every figure drawn by then;
* ``height``, ``max_figure``: the page's and the tallest figure's height (px, 1280 px wide);
* ``marks``: whether every figure drew marks; ``errors``, ``requests``; ``html_mb``.

Each figure is printed with its bound and the ratio measured / bound (<= 1 is within).
Not a test: the suite's ``tests/test_report_browser.py`` checks the same page bounds without
timing anything.

    .venv/bin/python benchmarks/report_scale.py            # both shapes
    .venv/bin/python benchmarks/report_scale.py --only ranks --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fixtures.cluster_runs import many_ranks, many_steps  # noqa: E402
from tests.page_probe import chromium, probe  # noqa: E402

SHAPES = {"ranks": (many_ranks, 256, 12), "steps": (many_steps, 8, 2000)}
BOUNDS = {"report_s": 60.0, "load_ms": 4000.0, "height": 12_000, "max_figure": 1_600,
          "html_mb": 10.0}


def _run_dir(out: Path, shape: str) -> tuple[Path, int | None]:
    make, ranks, steps = SHAPES[shape]
    run = out / f"{shape}_{ranks}x{steps}"
    done = run / "ground_truth.json"
    if not done.is_file():
        shutil.rmtree(run, ignore_errors=True)
        make(run, ranks=ranks, steps=steps)
    return run, json.loads(done.read_text())["slow_rank"]


def measure(out: Path, shape: str, repeat: int) -> dict:
    run, slow = _run_dir(out, shape)
    cache, page = out / f"{shape}.cache", out / f"{shape}.html"
    shutil.rmtree(cache, ignore_errors=True)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "traceview", "report", str(run), "-o",
                           str(page), "--cache-dir", str(cache)], cwd=REPO,
                          capture_output=True, text=True)
    report_s = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"report failed: {proc.stderr.strip()}")
    text = page.read_text(encoding="utf-8")
    needle = f"Worst straggler: rank {slow}"
    loads = [probe(chromium(), text, out / f"{shape}.probe{i}", needle=needle,
                   virtual_time_ms=None) for i in range(repeat)]
    st = loads[0]
    return {"shape": run.name, "report_s": report_s,
            "load_ms": statistics.median(s["load_ms"] for s in loads),
            "height": st["height"], "max_figure": max(f["height"] for f in st["figures"]),
            "figures": len(st["figures"]),
            "every_figure_marks": all(f["marks"] > 0 for f in st["figures"]),
            "errors": st["errors"], "requests": st["remote"],
            "html_mb": len(text.encode()) / 1e6, "slow_rank_named": st["text_has"],
            "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=sorted(SHAPES), action="append")
    p.add_argument("--repeat", type=int, default=3, help="page loads per shape (median kept)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "report_scale")
    args = p.parse_args(argv)
    if chromium() is None:
        raise SystemExit("headless Chromium is not installed (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    results = [measure(args.out, shape, args.repeat) for shape in args.only or SHAPES]
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("| run | measure | value | bound | measured / bound |\n|---|---|---|---|---|")
    ok = True
    for r in results:
        for key, bound in BOUNDS.items():
            ok &= r[key] <= bound
            print(f"| {r['shape']} | {key} | {r[key]:,.2f} | {bound:,g} | {r[key] / bound:.2f} |")
        for key in ("every_figure_marks", "slow_rank_named"):
            ok &= bool(r[key])
            print(f"| {r['shape']} | {key} | {r[key]} | True | |")
        for key in ("errors", "requests"):
            ok &= not r[key]
            print(f"| {r['shape']} | {key} | {len(r[key])} | 0 | |")
        la = r["load_average"]
        print(f"| {r['shape']} | load average (1/5/15 min) | {la[0]:.2f} / {la[1]:.2f} / "
              f"{la[2]:.2f} | | |")
    print("within every bound" if ok else "OUT OF BOUNDS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
