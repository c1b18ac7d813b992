"""Whether a rewrite of the replay's graph build changes its output: the graph (points, edges,
instances, ops) built by a base revision's ``analyses/replay/{graph,waits}.py`` and by the
checkout's, from the same inputs, must be equal frame for frame (values, dtypes, row order).

    python benchmarks/replay_identity.py                    # base: main
    python benchmarks/replay_identity.py --base HEAD~2 --corpus

Inputs: every replay, scenario and gloo fixture (``fixtures/data``), the synthetic run of
``benchmarks/replay.py`` at two small sizes, and with ``--corpus`` the corpus's GPU traces
(``fixtures/corpus.py``). Each input's ``build_graph`` arguments are captured once from the
checkout's Run (cached under ``--cache``), then both builds run on them. Exit 1 on any
difference, naming the input and the frame.
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


import polars as pl  # noqa: E402

from fixtures.corpus import corpus_dir  # noqa: E402

#: Corpus GPU traces (single-rank, with kernels and runtime calls; one with NCCL kernels).
CORPUS = (
    "hta-tests-data/tests/data/nccl_parser_config/nccl_data.json.gz",
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "param/et_replay/tests/inputs/resnet_kineto.json.gz",
    "tracelens/tests/traces/b200/eager_trace.json.gz",
)
_MODULES = ("graph", "waits")


def base_module(rev: str, where: Path):
    """``analyses/replay/graph.py`` (with its ``waits``) of revision ``rev``, as a package of
    its own under ``where``."""
    pkg = where / "replay_base"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    import traceview.analyses.replay as new
    here = Path(new.__file__).resolve().parent.relative_to(REPO.resolve())
    for name in _MODULES:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{here.as_posix()}/{name}.py"],
                              check=True, capture_output=True, text=True).stdout
        (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(where))
    return importlib.import_module("replay_base.graph")


def captured(path: Path) -> tuple[tuple, dict]:
    """The arguments ``traceview.run.replay.replay_of`` gives ``build_graph`` for ``path``."""
    import traceview
    import traceview.run.replay as run_replay
    seen: list[tuple[tuple, dict]] = []
    real = run_replay.build_graph

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    run_replay.build_graph = record
    try:
        run_replay.replay_of(traceview.open(str(path)))
    finally:
        run_replay.build_graph = real
    return seen[0]


def inputs(cache: Path, corpus: bool):
    """``(label, args, kwargs)`` of each input."""
    from replay import synthetic
    for ranks, steps, ops in ((8, 6, 10), (32, 20, 40)):
        yield f"synthetic {ranks}x{steps}", synthetic(ranks, steps, ops), {}
    data = REPO / "fixtures" / "data"
    paths = sorted({f.parent for pattern in ("replay/**/*.json.gz", "scenarios/**/*.json.gz",
                                             "gloo_*/**/*.json.gz")
                    for f in data.glob(pattern)})
    if corpus:
        paths += [corpus_dir() / c for c in CORPUS if (corpus_dir() / c).exists()]
    cache.mkdir(parents=True, exist_ok=True)
    for path in paths:
        label = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path.name)
        file = cache / (label.replace("/", "_") + ".pkl")
        if not file.exists():
            file.write_bytes(pickle.dumps(captured(path)))
        args, kwargs = pickle.loads(file.read_bytes())
        yield label, args, kwargs


def differences(a, b) -> list[str]:
    """What differs between two graphs, frame by frame (nothing: identical)."""
    out = []
    for frame in ("points", "edges", "instances", "ops"):
        x, y = getattr(a, frame), getattr(b, frame)
        if x.schema != y.schema:
            out.append(f"{frame}: schema {x.schema} != {y.schema}")
        elif not x.equals(y, null_equal=True):
            out.append(f"{frame}: {x.height} vs {y.height} rows, values differ")
    return out


def loose_differences(a, b) -> list[str]:
    """``differences`` less what the order of points at one instant decides (which of them
    gets the work before that instant, their ids, links and stretch labels): the points'
    places and kinds as a set of rows, each queue's work and blocked time, the edges' count
    and lags by kind, the instances and ops as they are."""
    out = []
    where = ["rank", "tid", "t_ns", "kind", "step", "role"]
    x, y = (g.points.select(where).sort(where, nulls_last=True) for g in (a, b))
    if not x.equals(y, null_equal=True):
        out.append("points: differ in place or kind")
    x, y = (g.points.group_by("rank", "tid").agg(pl.col("work_ns", "blocked_ns").sum())
            .sort("rank", "tid") for g in (a, b))
    if not x.equals(y):
        out.append("points: each queue's work or blocked time differs")
    x, y = (g.edges.group_by("kind").agg(pl.len(), pl.col("lag_ns").sum()).sort("kind")
            for g in (a, b))
    if not x.equals(y):
        out.append("edges: counts or lags by kind differ")
    for frame in ("instances", "ops"):
        if not getattr(a, frame).equals(getattr(b, frame), null_equal=True):
            out.append(f"{frame}: differ")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="main")
    p.add_argument("--corpus", action="store_true", help="also the corpus's GPU traces")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "replay_identity")
    args = p.parse_args(argv)
    from traceview.analyses.replay.graph import build_graph
    with tempfile.TemporaryDirectory() as tmp:
        base = base_module(args.base, Path(tmp))
        bad = 0
        for label, a, kw in inputs(args.cache, args.corpus):
            t0 = time.process_time()
            old = base.build_graph(*a, **kw)
            t1 = time.process_time()
            new = build_graph(*a, **kw)
            t2 = time.process_time()
            diff = differences(old, new)
            if diff and differences(old, base.build_graph(*a, **kw)):
                # the base itself varies run to run on this input (points at one instant whose
                # order no key decides, so their ids, links and stretch labels swap): compare
                # what does not depend on that order
                diff = loose_differences(old, new)
                label += " (base varies run to run: compared less point order)"
            bad += bool(diff)
            print(f"{'DIFF' if diff else 'same'}  {label}  ({old.points.height} points, "
                  f"{old.edges.height} edges; {t1 - t0:.2f} -> {t2 - t1:.2f} CPU-s)")
            for d in diff:
                print("      " + d)
    print("identical" if not bad else f"{bad} inputs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
