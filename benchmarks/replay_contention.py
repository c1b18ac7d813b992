"""Issue 46's CPU-contention experiment: does a processor-sharing correction of the replay's
work bring the ``typical`` predictions of the replay fixtures nearer their balanced twins?

The fixtures are real gloo runs of 4-8 ranks x 2 torch threads on a 2-core box. For each:

1. **Evidence.** ``k(t)``: the host's busy threads at ``t`` (each queue's work windows
   ``[work_from_ns, work_to_ns]``, weighted by the share of the window that leaf host ops
   cover: a sleep or a wait is not busy). Every leaf op of a repeated kind (same name, same
   ordinal within its rank's step on its thread) gets its mean ``k`` over its own interval
   and its duration over its kind's median. ``slope``: least squares of log(ratio) on
   log(k); ``C``: the core count of the law ``d = d0 * max(1, k / C)`` that fits the ratios
   best (C in 1..threads; no evidence: C = every thread, the identity).
2. **The correction.** A scenario's work is replayed; each point's work window is placed
   on the replayed timeline (it starts when its predecessor on its queue is replayed), the
   scenario's ``k`` recomputed, and the work rescaled by ``f(k_scenario) / f(k_base)``
   (``f(k) = max(1, k / C)``; ``k_base`` from the unmodified replay, so the unmodified run
   is the identity); three rounds, each rescaling the scenario's own work.

Prints the ``typical`` predictions before and after beside the twins (``%``: against the
twin's measured mean step), with the fitted law.

    /work/venv/bin/python benchmarks/replay_contention.py [--only NAME ...] [--rounds 3]

An experiment, not the tool's model: docs/metrics.md (*Replay*, "Where the predictions
miss") carries its figures and why it did not land.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import traceview  # noqa: E402
from traceview.analyses.replay.check import step_times  # noqa: E402
from traceview.analyses.replay.graph import ReplayGraph  # noqa: E402
from traceview.analyses.replay.scenarios import (  # noqa: E402
    _covered, _leaves, _typical, parse_scenario, scenario_work)
from traceview.analyses.replay.simulate import replay_graph  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from replay_predictions import DATA, slow_spec  # noqa: E402


def mean_load(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray,
              lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Mean over each ``[lo, hi]`` of k(t) = the summed ``weights`` of the windows
    ``[starts, ends]`` that hold t (the integral of a step function, read by interpolation;
    an empty window: k at its instant).

    >>> # [0, 10] and [5, 15]: k is 1, 2, 1 on [0, 5], [5, 10], [10, 15]
    >>> one = np.array([1.0, 1.0])
    >>> mean_load(np.array([0, 5]), np.array([10, 15]), one,
    ...           np.array([0, 10, 4]), np.array([10, 20, 6])).tolist()
    [1.5, 0.5, 1.5]
    """
    origin = min(int(starts.min()), int(lo.min()))
    s, e = (starts - origin).astype(np.float64), (ends - origin).astype(np.float64)
    a, b = (lo - origin).astype(np.float64), (hi - origin).astype(np.float64)
    x = np.concatenate([s, e])
    delta = np.concatenate([weights, -weights])
    order = np.argsort(x, kind="stable")
    x, delta = x[order], delta[order]
    slope = np.cumsum(delta)
    area = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(x))])
    b = np.maximum(b, a + 1.0)  # an instant: a nanosecond's mean
    return (np.interp(b, x, area) - np.interp(a, x, area)) / (b - a)


def busy_share(graph: ReplayGraph) -> np.ndarray:
    """Per point, the share of its work window that leaf host ops cover."""
    pts = graph.points
    work = pts.get_column("work_ns").to_numpy().astype(np.float64)
    covered = _covered(graph, pts, _leaves(graph.ops))
    return np.where(work > 0, np.clip(covered / np.maximum(work, 1), 0, 1), 0.0)


def evidence(graph: ReplayGraph, busy_from: str = "ops") -> dict[str, Any]:
    """The contention law the run's own repeated ops show (see the module docstring)."""
    pts = graph.points
    share = busy_share(graph) if busy_from == "ops" else np.ones(pts.height)
    starts = pts.get_column("work_from_ns").to_numpy()
    ends = pts.get_column("work_to_ns").to_numpy()
    if busy_from == "work":  # the transfers too: from the last arrival, for their lag
        moved = graph.edges.filter(pl.col("kind") == "transfer")
        t0 = graph.instances["last_arrival_ns"].to_numpy()[
            moved["src"].to_numpy() - pts.height]
        starts = np.concatenate([starts, t0])
        ends = np.concatenate([ends, t0 + moved["lag_ns"].to_numpy()])
        share = np.concatenate([share, np.ones(len(t0))])
    threads = pts.select("rank", "tid").unique().height
    leaves = _leaves(graph.ops).filter(pl.col("end_ns") > pl.col("ts_ns"))
    steps = pts.filter(pl.col("kind") == "step_start").select("rank", t="t_ns", step="step")
    leaves = leaves.sort("ts_ns").join_asof(steps.sort("t"), left_on="ts_ns", right_on="t",
                                            by="rank", check_sortedness=False).drop_nulls("step")
    leaves = leaves.sort("rank", "tid", "ts_ns").with_columns(
        ordinal=pl.int_range(pl.len()).over("rank", "tid", "step", "name"))
    k = mean_load(starts, ends, share, leaves.get_column("ts_ns").to_numpy(),
                  leaves.get_column("end_ns").to_numpy())
    leaves = leaves.with_columns(k=pl.Series(k), dur=pl.col("end_ns") - pl.col("ts_ns"))
    leaves = leaves.with_columns(ratio=pl.col("dur") / pl.col("dur").median().over(
        "name", "ordinal"), n=pl.len().over("name", "ordinal"))
    rows = leaves.filter((pl.col("n") >= 4) & (pl.col("dur") >= 20_000) & (pl.col("k") > 0))
    if rows.height < 20:
        return {"ops": rows.height, "slope": None, "cores": float(threads), "threads": threads}
    lr = np.log(rows.get_column("ratio").to_numpy())
    lk = np.log(rows.get_column("k").to_numpy())
    slope = float(np.polyfit(lk, lr, 1)[0])
    kinds = rows.select(pl.struct("name", "ordinal").rank("dense")).to_series().to_numpy()

    def misfit(cores: float) -> float:  # the law's log ratios, each kind's offset its own mean
        resid = lr - np.log(np.maximum(1.0, np.exp(lk) / cores))
        offsets = np.bincount(kinds, resid) / np.maximum(np.bincount(kinds), 1)
        return float(np.mean((resid - offsets[kinds]) ** 2))

    grid = np.arange(1.0, threads + 0.5, 0.5)
    fits = [misfit(c) for c in grid]
    cores = float(grid[int(np.argmin(fits))])
    return {"ops": rows.height, "slope": slope, "cores": cores, "threads": threads,
            "k_p10_p90": [float(np.quantile(rows["k"], q)) for q in (0.1, 0.9)]}


def corrected(graph: ReplayGraph, spec: str, cores: float, rounds: int, *,
              busy_from: str = "ops") -> tuple[Any, Any]:
    """The scenario's replay before and after the contention correction. ``busy_from``:
    ``ops`` (a work window is busy for the share its leaf ops cover; transfers as measured)
    or ``work`` (every work window and every transfer busy, both rescaled)."""
    pts = graph.points
    specs = parse_scenario(spec)
    work, scale, lags = scenario_work(graph, specs)
    plain = replay_graph(graph, work_ns=work, transfer_scale=scale, edge_lags=lags)
    edges = graph.edges
    src = edges["src"].to_numpy()
    transfer = (edges["kind"] == "transfer").to_numpy()
    moved = transfer & (busy_from == "work")
    built = edges["lag_ns"].to_numpy() if lags is None else np.asarray(lags)
    scenario_lags = np.round(built * np.where(transfer, scale, 1.0)).astype(np.int64)
    if busy_from == "ops":
        covered = _covered(graph, pts, _leaves(graph.ops))
        busy = covered
        for s in specs:  # the scenario's busy time: the same typical as its work
            if s.kind == "typical":
                busy = _typical(pts, busy, set(s.ranks) if s.ranks else None)
        busy = np.minimum(busy, work)
        share = np.where(work > 0, np.clip(busy / np.maximum(work, 1), 0, 1), 0.0)
        base_share = busy_share(graph)
    else:
        share = base_share = np.ones(pts.height)
    prev = pts.get_column("prev").fill_null(-1).to_numpy()

    def loads(times: np.ndarray, w: np.ndarray, sh: np.ndarray,
              lag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = np.where(prev >= 0, times[np.maximum(prev, 0)], times[: len(prev)] - w)
        t0 = times[src[moved]]
        starts = np.concatenate([start, t0])
        ends = np.concatenate([start + w, t0 + lag[moved]])
        k = mean_load(starts, ends, np.concatenate([sh, np.ones(moved.sum())]), starts, ends)
        return k[: len(prev)], k[len(prev):]

    base = replay_graph(graph)
    law = lambda k: np.maximum(1.0, k / cores)  # noqa: E731
    k_base, kt_base = loads(base.time, pts.get_column("work_ns").to_numpy(), base_share,
                            edges["lag_ns"].to_numpy())
    out, now, now_lags = plain, work, scenario_lags
    for _ in range(rounds):
        k_s, kt_s = loads(out.time, now, share, now_lags)
        now = np.round(work * law(k_s) / law(k_base)).astype(np.int64)
        now_lags = scenario_lags.copy()
        now_lags[moved] = np.round(scenario_lags[moved] * law(kt_s) / law(kt_base)) \
            .astype(np.int64)
        out = replay_graph(graph, work_ns=now, edge_lags=now_lags)
    return plain, out


def mean_prediction(graph: ReplayGraph, replayed: Any, base: Any) -> float:
    """The whatif mean: measured - (replayed - scenario), over the window's steps, in ms."""
    b = step_times(graph.points, base.time)
    s = step_times(graph.points, replayed.time).select("step", s="replayed_ns")
    both = b.join(s, on="step")
    return float((both["measured_ns"] - both["replayed_ns"] + both["s"]).mean()) / 1e6


def measure(name: str, rounds: int, busy_from: str,
            cores: float | None = None) -> dict[str, Any]:
    truth = json.loads((DATA / name / "truth.json").read_text())
    twin = truth["measured"]["twin_step_ms_mean"]
    run = traceview.open(DATA / name, cache=False)
    graph = run.replay.graph
    base = run.replay.base
    law = evidence(graph, busy_from)
    if cores is not None:
        law["cores"] = cores
    out = {"name": name, "twin": twin, "law": law}
    for key, spec in (("slow", slow_spec(truth)), ("all", "ranks=all:typical")):
        if spec is None:
            continue
        plain, fixed = corrected(graph, spec, law["cores"], rounds, busy_from=busy_from)
        out[key] = [mean_prediction(graph, plain, base), mean_prediction(graph, fixed, base)]
    return out


def _cell(pair: list[float] | None, twin: float) -> str:
    if pair is None:
        return "– | –"
    return " | ".join(f"{v:.1f} ({(v - twin) / twin:+.0%})" for v in pair)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="fixture names (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", choices=("ops", "work"), default="ops",
                        help="what counts busy (see corrected())")
    parser.add_argument("--cores", type=float, help="the law's C (default: fitted)")
    args = parser.parse_args()
    names = args.only or sorted(p.name for p in DATA.iterdir() if p.is_dir())
    print("| run | twin | threads | slope log d / log k | C | slow typical | corrected "
          "| all typical | corrected |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[tuple[float, float]]] = {"slow": [], "all": [], "twins": []}
    for name in names:
        m = measure(name, args.rounds, args.busy, args.cores)
        for key in ("slow", "all"):
            if m.get(key):
                pair = tuple(abs(v - m["twin"]) / m["twin"] for v in m[key])
                errors["twins" if key == "all" and "slow" not in m else key].append(pair)
        law = m["law"]
        slope = f"{law['slope']:+.2f}" if law["slope"] is not None else "–"
        print(f"| {name} | {m['twin']:.1f} | {law['threads']} | {slope} | {law['cores']:g} | "
              f"{_cell(m.get('slow'), m['twin'])} | {_cell(m.get('all'), m['twin'])} |",
              flush=True)
    print()
    for key, pairs in errors.items():
        if pairs:
            before, after = np.array(pairs).T
            print(f"{key}: mean |error| {before.mean():.1%} -> {after.mean():.1%}, within 10%: "
                  f"{(before <= 0.10).sum()} -> {(after <= 0.10).sum()} of {len(pairs)}")


if __name__ == "__main__":
    main()
