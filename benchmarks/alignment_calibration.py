"""Is ``uncertainty_ns`` calibrated? Fraction of ranks whose true offset error is within 3x the
stated uncertainty, on runs with known clock offsets: before (``--baseline REV``'s
``analyses/align.py``) and after (the working tree's).

    .venv/bin/python benchmarks/alignment_calibration.py                 # all parts
    .venv/bin/python benchmarks/alignment_calibration.py --runs 20 --no-real
    .venv/bin/python benchmarks/alignment_calibration.py --gloo-dir DIR  # more real gloo runs

Parts:
* ``noisy``: :mod:`fixtures.noisy_clocks`, every scenario x world sizes 2/4/8 x anchors
  3/8/40 x ``--runs`` seeds, completion noise sigma 20 us (offsets +-5 s);
* ``synthetic``: :mod:`fixtures.synthetic` traces (exact completions, offsets +-3 s) opened
  with ``traceview.open``;
* ``real``: the committed 2-rank gloo DDP runs (one machine: true offset 0) and any run
  directories under ``--gloo-dir``, rank 1 shifted by :mod:`fixtures.clock_shift` by several
  offsets between -3 s and +3 s.

A rank is covered when ``|offset_ns - truth| <= 3 * uncertainty_ns + 1`` (1 ns: rounding).
The reference rank (error 0 by definition) is not counted. Not a timed benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from fixtures.noisy_clocks import NOISE, noisy_run  # noqa: E402
from traceview.analyses import align as after  # noqa: E402
from traceview.analyses.collective_match import comm_events, match_collectives  # noqa: E402

SHIFTS_NS = (-2_999_999_937, -1_700_000_123, -250_000_001, 777_777_777, 2_500_000_077)


def load_baseline(rev: str) -> ModuleType:
    """``analyses/align.py`` as of ``rev``, imported as a module of its own."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:analyses/align.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "align_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("align_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def judge(off: pl.DataFrame, truth: dict[int, float]) -> list[dict]:
    """One row per non-reference rank: error, uncertainty, covered, quality."""
    rows = []
    for r in off.iter_rows(named=True):
        if r["rank"] == 0 or r["rank"] not in truth:
            continue
        err = abs(r["offset_ns"] - truth[r["rank"]])
        unc = r["uncertainty_ns"] or 0
        rows.append({"error_ns": err, "uncertainty_ns": unc, "covered": err <= 3 * unc + 1,
                     "quality": r.get("quality", "-")})
    return rows


def noisy_cases(runs: int):
    for noise in NOISE:
        for world in (2, 4, 8):
            for n in (3, 8, 40):
                for seed in range(runs):
                    yield noise, world, n, seed


def part_noisy(before: ModuleType, runs: int) -> dict[str, dict[str, list[dict]]]:
    out: dict[str, dict[str, list[dict]]] = {"before": defaultdict(list),
                                             "after": defaultdict(list)}
    for noise, world, n, seed in noisy_cases(runs):
        run = noisy_run(world, n, noise, sigma_ns=20_000, seed=seed)
        match = match_collectives(comm_events(run.events))
        ranks = list(range(world))
        for label, mod in (("before", before), ("after", after)):
            off = mod.estimate_offsets(match, ranks, reference_rank=0)
            epoch = off.get_column("drift_epoch_ns").drop_nulls()
            at = int(epoch[0]) if len(epoch) else run.mid_ns
            truth = {r: run.true_offset_at(r, at) for r in ranks}
            key = f"{noise} n={n}"
            out[label][key] += judge(off, truth)
    return out


def part_synthetic(before: ModuleType) -> dict[str, dict[str, list[dict]]]:
    import traceview
    from fixtures.synthetic import SyntheticSpec, generate

    out: dict[str, dict[str, list[dict]]] = {"before": defaultdict(list),
                                             "after": defaultdict(list)}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(4):
            spec = SyntheticSpec(world_size=4, steps=4, seed=seed, idle_gaps=())
            truth = generate(spec, Path(tmp) / f"s{seed}")
            ev = traceview.open(Path(tmp) / f"s{seed}", cache=False).events.collect()
            match = match_collectives(comm_events(ev))
            for label, mod in (("before", before), ("after", after)):
                off = mod.estimate_offsets(match, list(range(4)), reference_rank=0)
                out[label]["synthetic nccl"] += judge(off, dict(enumerate(
                    truth.clock_offset_ns)))
    return out


def part_real(before: ModuleType, dirs: list[Path]) -> dict[str, dict[str, list[dict]]]:
    import traceview
    from fixtures.clock_shift import inject_clock_offsets

    out: dict[str, dict[str, list[dict]]] = {"before": defaultdict(list),
                                             "after": defaultdict(list)}
    with tempfile.TemporaryDirectory() as tmp:
        for src in dirs:
            for shift in SHIFTS_NS:
                dst = Path(tmp) / f"{src.name}_{shift}"
                inject_clock_offsets(src, dst, {1: shift})
                ts = traceview.open(dst, cache=False)
                ev = ts.events.collect()
                ranks = sorted(ev.get_column("rank").unique().to_list())
                match = match_collectives(comm_events(ev))
                for label, mod in (("before", before), ("after", after)):
                    off = mod.estimate_offsets(match, ranks, hosts=ts.ranks, reference_rank=0)
                    truth = {r: (shift if r == 1 else 0) for r in ranks}
                    out[label][f"gloo {src.name}"] += judge(off, truth)
    return out


def report(parts: list[dict[str, dict[str, list[dict]]]]) -> None:
    print(f"{'case':<28}{'ranks':>6}{'before':>9}{'after':>9}{'med unc b/a':>22}"
          f"  quality after (good/fair/poor)")
    total = {"before": [], "after": []}
    for part in parts:
        for key in part["after"]:
            b, a = part["before"][key], part["after"][key]
            total["before"] += b
            total["after"] += a
            q = defaultdict(int)
            for row in a:
                q[row["quality"]] += 1
            print(f"{key:<28}{len(a):>6}{_cov(b):>9}{_cov(a):>9}"
                  f"{_med(b):>11}/{_med(a):<10}  {q['good']}/{q['fair']}/{q['poor']}")
    print(f"{'ALL':<28}{len(total['after']):>6}{_cov(total['before']):>9}"
          f"{_cov(total['after']):>9}")
    bad = [r for r in total["after"] if not r["covered"]]
    for r in sorted(bad, key=lambda r: -r["error_ns"])[:10]:
        print("  not covered after:", r)


def _cov(rows: list[dict]) -> str:
    return f"{100 * sum(r['covered'] for r in rows) / max(len(rows), 1):.1f}%"


def _med(rows: list[dict]) -> str:
    vals = sorted(r["uncertainty_ns"] for r in rows)
    return str(vals[len(vals) // 2]) if vals else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", default="72ef0c8", help="git revision of 'before'")
    p.add_argument("--runs", type=int, default=10, help="seeds per noisy case")
    p.add_argument("--no-real", action="store_true", help="skip synthetic and gloo traces")
    p.add_argument("--gloo-dir", type=Path, default=None,
                   help="folder of extra gloo run folders (python -m fixtures.gloo_ddp --out)")
    args = p.parse_args(argv)
    before = load_baseline(args.baseline)
    parts = [part_noisy(before, args.runs)]
    if not args.no_real:
        parts.append(part_synthetic(before))
        dirs = [REPO / "fixtures" / "data" / n for n in ("gloo_ddp_2r", "gloo_ddp_2r_slow1")]
        if args.gloo_dir is not None:
            dirs += sorted(d for d in args.gloo_dir.iterdir() if d.is_dir())
        parts.append(part_real(before, [d for d in dirs if d.is_dir()]))
    report(parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
