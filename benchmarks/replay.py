"""What the what-if replay costs (analyses/replay): graph building, one replay, one scenario,
on a synthetic DDP run of R ranks x S steps, as throughput (CPU seconds per million events
and per million graph nodes), not as a timed unit test.

    .venv/bin/python benchmarks/replay.py                      # 256 ranks x 200 steps
    .venv/bin/python benchmarks/replay.py --ranks 32 --steps 50 --ops 40

Each rank's step: the step marker, ``--ops`` small host ops (forward and backward), two
gradient buckets, each issued by ``c10d::allreduce_`` on the main thread and run by gloo's
worker thread (a collective instance across every rank), the reducer's wait (a gap that ends
at the last bucket's completion), the optimizer. Rank 3 is slower (a 5 ms stall). The goal
(issue #46): <= 1 CPU-second per million events, 256 ranks x 200 steps in <= 60 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from traceview.analyses.replay import build_graph, replay_graph, self_check  # noqa: E402
from traceview.analyses.replay.whatif import replay_scenario  # noqa: E402

US = 1_000


def synthetic(ranks: int, steps: int, ops: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(ops, collective_rows)`` of the run described in the module docstring."""
    rng = np.random.default_rng(seed)
    step_ns = (ops * 30 + 4_000) * US
    rows: dict[str, list] = {k: [] for k in ("rank", "tid", "name", "ts_ns", "end_ns",
                                             "collective")}
    coll: dict[str, list] = {k: [] for k in ("instance", "rank", "collective", "name",
                                             "arrival_ns", "end_ns")}
    half = ops // 2
    for s in range(steps):
        base = s * (step_ns + 10_000 * US)
        stall = np.where(np.arange(ranks) == 3, 5_000 * US, 0)
        jitter = rng.integers(0, 200 * US, size=ranks)
        issue1 = base + half * 30 * US + stall + jitter
        issue2 = issue1 + (ops - half) * 30 * US
        done1 = issue1.max() + 1_000 * US
        done2 = max(issue2.max(), done1) + 1_000 * US
        for b, (issue, done) in enumerate(((issue1, done1), (issue2, done2))):
            coll["instance"] += [f"default#{2 * s + b}"] * ranks
            coll["rank"] += list(range(ranks))
            coll["collective"] += ["all_reduce"] * ranks
            coll["name"] += ["gloo:all_reduce"] * ranks
            coll["arrival_ns"] += list(issue + 50 * US)
            coll["end_ns"] += [done] * ranks
        for r in range(ranks):
            start = base
            names = ["ProfilerStep#%d" % s]
            ts = [start]
            ends = [done2 + 2_000 * US]
            first = np.arange(half) * 30 * US + start + (stall[r] + jitter[r] if half else 0)
            names += ["aten::mm"] * half + ["c10d::allreduce_"]
            ts += list(first) + [issue1[r]]
            ends += list(first + 20 * US) + [issue1[r] + 30 * US]
            second = issue1[r] + 30 * US + np.arange(ops - half) * 30 * US
            names += ["aten::mm_backward"] * (ops - half) + ["c10d::allreduce_"]
            ts += list(second) + [issue2[r]]
            ends += list(second + 20 * US) + [issue2[r] + 30 * US]
            names += ["Optimizer.step"]
            ts += [done2 + 100 * US]
            ends += [done2 + 1_900 * US]
            n = len(names)
            rows["rank"] += [r] * n
            rows["tid"] += [1] * n
            rows["name"] += names
            rows["ts_ns"] += [int(t) for t in ts]
            rows["end_ns"] += [int(e) for e in ends]
            rows["collective"] += [("all_reduce" if x.startswith("c10d") else None) for x in names]
            for b, (issue, done) in enumerate(((issue1, done1), (issue2, done2))):
                rows["rank"].append(r)
                rows["tid"].append(2)
                rows["name"].append("gloo:all_reduce")
                rows["ts_ns"].append(int(issue[r] + 50 * US))
                rows["end_ns"].append(int(done))
                rows["collective"].append("all_reduce")
    return pl.DataFrame(rows), pl.DataFrame(coll)


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ops", type=int, default=40, help="small host ops per rank and step")
    args = p.parse_args(argv)
    ops, coll = synthetic(args.ranks, args.steps, args.ops)
    events = ops.height
    wall0, cpu0 = time.perf_counter(), cpu()
    graph = build_graph(ops, coll)
    cpu1, wall1 = cpu(), time.perf_counter()
    base = replay_graph(graph)
    check = self_check(graph, base)
    cpu2, wall2 = cpu(), time.perf_counter()
    replay_scenario(graph, "rank=3:typical")
    cpu3, wall3 = cpu(), time.perf_counter()
    nodes = graph.n_nodes
    print(f"{args.ranks} ranks x {args.steps} steps: {events:,} events, {nodes:,} graph nodes "
          f"({graph.points.filter(pl.col('kind') == 'wait').height:,} waits); "
          f"load {os.getloadavg()[0]:.2f}")
    for what, c, w in (("build graph", cpu1 - cpu0, wall1 - wall0),
                       ("replay + self-check", cpu2 - cpu1, wall2 - wall1),
                       ("one scenario", cpu3 - cpu2, wall3 - wall2)):
        print(f"  {what:20s} {c:7.2f} CPU-s {w:7.2f} s wall   "
              f"{c / events * 1e6:6.3f} CPU-s per M events   {c / nodes * 1e6:6.3f} per M nodes")
    total = cpu3 - cpu0
    print(f"  total               {total:7.2f} CPU-s {wall3 - wall0:7.2f} s wall   "
          f"{total / events * 1e6:6.3f} CPU-s per M events (goal <= 1; 256x200 in <= 60 s)")
    print(f"  replay error median {check.median:.4f} p90 {check.p90:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
