"""The replay's self-check on every multi-rank run we have (issue 46, item 2): replay error
median and p90 per run, whether it is trusted, its worst steps and the points that do not
reproduce. The bar: median <= 1% and p90 <= 3% on every run.

    .venv/bin/python benchmarks/replay_error.py                 # every run, one table
    .venv/bin/python benchmarks/replay_error.py --only ddp --causes 3

Runs: the scenario matrix (``fixtures/data/scenarios``), the ``gloo_*`` runs, the replay
fixtures (``fixtures/data/replay``), synthetic NCCL runs (``fixtures/synthetic.py``: DDP with a
slow rank, balanced, a GPipe pipeline, an all-to-all; written to a temporary folder) and the
corpus's multi-rank GPU pair (``fixtures/corpus.py``; skipped when absent). Each run is one
``traceview.open(path).whatif()``: the numbers are the ``--json`` answer's.

Column ``causes``: the steps beyond 5% by ``not_reproduced.cause`` (``transfer`` or
``dependency``). Column ``graph``: the replay error's median / p90 with each member's own measured transfer
(``build_graph(transfers="own")``). That replay is exact wherever the graph is consistent, so
what it leaves is a wrong or missing edge; the rest of the error (``median``, ``p90``) is the
transfer model's: one typical transfer per instance against completions that scatter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from fixtures.corpus import corpus_dir  # noqa: E402
from fixtures.synthetic import SyntheticSpec, generate  # noqa: E402

DATA = REPO / "fixtures" / "data"
#: The corpus's multi-rank traces (MANIFEST.md: the only multi-rank set is this sampled pair).
CORPUS_RUNS = ("hta-tests-data/tests/data/trace_filter",)
#: Synthetic NCCL runs: (name, spec), written as a capture writes them (CUDA sync events),
#: and one without them (``_no_sync``: the replay names the missing events as its cause).
SYNTHETIC = (
    ("synthetic_ddp_slow1", SyntheticSpec(world_size=4, steps=6, slow_rank=1,
                                          cuda_sync_events=True)),
    ("synthetic_ddp_balanced", SyntheticSpec(world_size=4, steps=6, slow_rank=None,
                                             cuda_sync_events=True)),
    ("synthetic_gpipe", SyntheticSpec(world_size=4, steps=6, pipeline_micro_batches=4,
                                      cuda_sync_events=True)),
    ("synthetic_alltoall_hot2", SyntheticSpec(world_size=4, steps=6, alltoall_tokens=1400,
                                              alltoall_hot_rank=2, cuda_sync_events=True)),
    ("synthetic_ddp_slow1_no_sync", SyntheticSpec(world_size=4, steps=6, slow_rank=1)),
)


def _is_run(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*trace.json*"))


def fixture_runs() -> list[tuple[str, Path]]:
    folders = [*sorted((DATA / "scenarios").iterdir()), *sorted(DATA.glob("gloo_*")),
               *sorted((DATA / "replay").iterdir())]
    return [(f"{p.parent.name}/{p.name}", p) for p in folders if _is_run(p)]


def corpus_runs() -> list[tuple[str, Path]]:
    root = corpus_dir()
    return [(f"corpus/{Path(rel).name}", root / rel) for rel in CORPUS_RUNS
            if (root / rel).is_dir()]


def synthetic_runs(out: Path) -> list[tuple[str, Path]]:
    found = []
    for name, spec in SYNTHETIC:
        generate(spec, out / name)
        found.append((f"synthetic/{name}", out / name))
    return found


def measure(path: Path) -> dict[str, object]:
    import traceview
    from traceview.analyses.replay.check import self_check
    from traceview.run.replay import replay_of
    run = traceview.open(str(path))
    result = run.whatif()
    own = replay_of(run, transfers="own")
    own_check = self_check(own.graph, own.base)
    steps = result["steps"]
    err = result["replay_error"]
    worst = steps.drop_nulls("error").sort("error", descending=True).head(3)
    return {"median": err["median"], "p90": err["p90"], "trusted": result["trusted"],
            "steps": steps.height, "waits": result["graph"]["waits"],
            "forced": result["graph"]["forced"],
            "graph": f"{_pct(own_check.median)} / {_pct(own_check.p90)}",
            "worst": ", ".join(f"{s}:{e:.1%}" for s, e in worst.select("step", "error").rows()),
            "causes": result["not_reproduced"].get_column("what").to_list(),
            "why": ", ".join(f"{n} {c}" for c, n in result["not_reproduced"]
                             .group_by("cause").len().sort("cause").rows()) or "-",
            "notes": [n for n in result["notes"] if "not trusted" not in n
                      and not n.startswith("replay: step ")]}


def _pct(x: object) -> str:
    return "-" if x is None else f"{float(x):.1%}"  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="runs whose name contains this")
    parser.add_argument("--causes", type=int, default=2,
                        help="not_reproduced points printed per run (0: none)")
    parser.add_argument("--no-synthetic", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = fixture_runs() + corpus_runs()
        if not args.no_synthetic:
            runs += synthetic_runs(Path(tmp))
        runs = [(n, p) for n, p in runs if args.only in n]
        rows = []
        print("| run | steps | median | p90 | trusted | waits | worst steps | graph | causes |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, path in runs:
            try:
                m = measure(path)
            except Exception as exc:  # noqa: BLE001 - one broken run must not hide the others
                print(f"| {name} | failed: {type(exc).__name__}: {exc} ||||||")
                continue
            rows.append({"run": name, "median": m["median"], "p90": m["p90"]})
            if m["forced"]:
                print(f"|   ↳ {m['forced']} node(s) forced: the graph has a cycle ||||||||")
            print(f"| {name} | {m['steps']} | {_pct(m['median'])} | {_pct(m['p90'])} | "
                  f"{'yes' if m['trusted'] else 'no'} | {m['waits']} | {m['worst']} | "
                  f"{m['graph']} | {m['why']} |")
            for what in m["causes"][:args.causes]:  # type: ignore[index]
                print(f"|   ↳ {what} ||||||||")
            for note in m["notes"]:  # type: ignore[union-attr]
                print(f"|   ↳ {note} ||||||||")
    table = pl.DataFrame(rows, schema={"run": pl.String, "median": pl.Float64,
                                       "p90": pl.Float64})
    if table.height:
        met = table.filter((pl.col("median") <= 0.01) & (pl.col("p90") <= 0.03)).height
        print(f"\n{met} of {table.height} runs meet the bar (median <= 1%, p90 <= 3%); "
              f"median of medians {_pct(table.get_column('median').median())}, "
              f"worst p90 {_pct(table.get_column('p90').max())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
