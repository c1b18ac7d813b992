"""Verdicts read off the replay: who costs the step time, what kind of slowness it is, and
the path the replay's step time follows.

Definitions with a worked example: ``docs/metrics.md``, section *Replay*.

* **Per-rank gain and slowdown** (the OSDI'25 study's S_w): rank w's ``rank=w:typical``
  replay against the replay of the measured run: ``gain_ns_per_step`` = T - T_w (means over
  the window's steps), ``slowdown`` = T / T_w. Replayed for the ``MAX_CANDIDATES`` ranks with
  the most *own excess* (the sum over their stretches of the work above the stretch's
  median), the only ranks whose typical can gain; the others gain 0 by construction.
* **Per-type slowdown** (S_t): T / T_t for each kind of time set to typical in turn:
  ``work`` (every rank's stretches, ``ranks=all:typical``), ``stalls`` (``stalls=off``),
  ``transfer`` (``comm=typical``).
* **Culprits**: the ranks whose gain is at least ``MIN_GAIN_SHARE`` of the step and
  ``NOISE_FACTOR`` times the median |gain| of the candidates (the run's noise), chosen
  greedily: the rank that gains most, then, with it typical, the rank that gains most on top
  (a second slow rank gains nothing alone while the first sets the pace), and so on. Each is
  named with its own (marginal) gain; their **combined** gain is the replay with all of them
  typical at once, never a sum.
* **Pattern**: a culprit's gain on a few steps only (at most a quarter of the steps carry
  ``FEW_STEPS_SHARE`` of it) is a **stall on steps** S, with its cost per occurrence;
  several ranks each slow on steps of their own (disjoint) are one **moving stall**: its
  cost is their combined replayed gain, and no single rank is named. With no culprit over
  the window but, on most steps, one rank gaining ``MOVING_STEP_SHARE`` of the step alone
  (3x the next rank), not always the same one, the slowness moves too: its cost is the
  replayed gain of all those ranks typical at once.
* **Confidence**: ``low`` wherever the replay is not trusted (its self-check), else ``high``
  for a gain of 10% of the step or more, ``medium`` below.
* **Critical path**: from the last step's latest end, back along each node's binding
  predecessor (the edge that set its replayed time), so it crosses to another rank wherever
  the replay waited there (a collective's last arrival, a send). Its time per rank and per
  kind of edge (``work``, ``transfer``, ``launch``, ...).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.schema import STEP_PATTERN

from .check import rank_step_times, step_times
from .waits import named
from .whatif import Replay, replay_scenario

np = lazy_module("numpy")

#: At most this many ranks are replayed one by one (those with the most own excess).
MAX_CANDIDATES = 8
#: A culprit gains at least this share of the mean step ...
MIN_GAIN_SHARE = 0.05
#: ... and this many times the run's noise: the median |gain| of the candidates (most ranks
#: are no culprit: what their typical gains is what the run's noise gives any rank).
NOISE_FACTOR = 3.0
#: At most this many culprits are named (each costs a replay per candidate).
MAX_CULPRITS = 4
#: A moving stall: on most steps one rank alone gains at least this share of the step.
MOVING_STEP_SHARE = 0.10
#: A "stall on steps" puts this share of its gain on at most a quarter of the steps.
FEW_STEPS_SHARE = 0.75


def own_excess(replay: Replay) -> pl.DataFrame:
    """``rank, excess_ns``: per rank, the sum over its stretches of the work above the
    median over the ranks of the same stretch."""
    pts = replay.graph.points.filter(pl.col("stretch").is_not_null())
    per = pts.group_by("stretch", "rank").agg(w=pl.col("work_ns").sum())
    per = per.with_columns(m=pl.col("w").median().over("stretch"))
    return per.group_by("rank").agg(excess_ns=(pl.col("w") - pl.col("m")).clip(0).sum()) \
        .sort("excess_ns", "rank", descending=[True, False])


def rank_gains(replay: Replay) -> pl.DataFrame:
    """Per candidate rank: ``gain_ns_per_step``, ``slowdown`` (S_w), and per step the gain
    (``step_gains``: a list in step order)."""
    base = replay.check.steps.select("step", "replayed_ns")
    out = []
    for rank, _ in own_excess(replay).head(MAX_CANDIDATES).rows():
        steps = _scenario_steps(replay, f"rank={rank}:typical", base)
        out.append({"rank": rank, "gain_ns_per_step": _mean_gain(steps),
                    "slowdown": _slowdown(steps),
                    "step_gains": steps.get_column("gain").round(0).cast(pl.Int64).to_list()})
    schema = {"rank": pl.Int32, "gain_ns_per_step": pl.Float64, "slowdown": pl.Float64,
              "step_gains": pl.List(pl.Int64)}
    return pl.DataFrame(out, schema=schema).sort("gain_ns_per_step", descending=True)


def type_slowdowns(replay: Replay) -> pl.DataFrame:
    """S_t: ``type, spec, gain_ns_per_step, slowdown`` for work, stalls and transfer."""
    base = replay.check.steps.select("step", "replayed_ns")
    rows = []
    for kind, spec in (("work", "ranks=all:typical"), ("stalls", "stalls=off"),
                       ("transfer", "comm=typical")):
        steps = _scenario_steps(replay, spec, base)
        rows.append({"type": kind, "spec": spec, "gain_ns_per_step": _mean_gain(steps),
                     "slowdown": _slowdown(steps)})
    return pl.DataFrame(rows, schema={"type": pl.String, "spec": pl.String,
                                      "gain_ns_per_step": pl.Float64, "slowdown": pl.Float64})


def culprits(replay: Replay, gains: pl.DataFrame | None = None) -> dict[str, Any]:
    """The culprit verdict: ``pattern`` (``steady``, ``few_steps``, ``moving``, ``none``),
    ``culprits`` (each ``rank, gain_ns_per_step, slowdown, steps, cost_ns_per_occurrence,
    confidence``), ``combined_gain_ns_per_step`` (replayed), ``moving_cost_ns_per_step``,
    ``trusted``."""
    check = replay.check
    steps = check.steps
    trusted = check.trusted
    empty = {"pattern": "none", "culprits": [], "combined_gain_ns_per_step": 0.0,
             "moving_cost_ns_per_step": None, "trusted": trusted}
    if steps.height == 0:
        return empty
    gains = rank_gains(replay) if gains is None else gains
    mean_step = float(steps.get_column("replayed_ns").mean())
    noise = float(gains.get_column("gain_ns_per_step").abs().median() or 0.0) \
        if gains.height >= 3 else 0.0
    floor = max(MIN_GAIN_SHARE * mean_step, NOISE_FACTOR * noise)
    base = steps.select("step", "replayed_ns")
    # greedy: the rank that gains most, then with it typical the rank that gains most on
    # top (a second slow rank gains nothing alone while the first one sets the pace)
    chosen: list[tuple[int, np.ndarray, float | None]] = []
    total = np.zeros(steps.height)
    round_gains = {r: (np.asarray(g, dtype=float), w) for r, g, w in
                   gains.select("rank", "step_gains", "slowdown").rows()}
    while round_gains and len(chosen) < MAX_CULPRITS:
        rank = max(round_gains, key=lambda r: (round_gains[r][0].mean(), -r))
        per, slow = round_gains[rank]
        marginal = per - total
        if marginal.mean() < floor:
            break
        chosen.append((rank, marginal, slow))
        total = per
        round_gains = {}
        for other in gains.get_column("rank").to_list():
            if other in {c[0] for c in chosen}:
                continue
            spec = "ranks=" + "+".join(str(r) for r in sorted([*(c[0] for c in chosen),
                                                               other])) + ":typical"
            found = _scenario_steps(replay, spec, base)
            round_gains[other] = (found.get_column("gain").to_numpy(), _slowdown(found))
    named = []
    for rank, per, slow in chosen:
        hit = _few_steps(per)
        share = per.mean() / mean_step if mean_step > 0 else 0.0
        named.append({
            "rank": rank, "gain_ns_per_step": float(per.mean()), "slowdown": slow,
            "steps": [int(s) for s, h in zip(steps.get_column("step"), hit) if h]
            if hit.any() else [],
            "cost_ns_per_occurrence": float(per[hit].mean()) if hit.any() else None,
            "confidence": "low" if not trusted else ("high" if share >= 0.10 else "medium")})
    if named:
        combined = float(total.mean())
        hit = [set(c["steps"]) for c in named]
        if len(named) > 1 and all(hit) and sum(map(len, hit)) == len(set().union(*hit)):
            # each rank slow on steps of its own: one stall moving between ranks
            return {**empty, "pattern": "moving", "moving_cost_ns_per_step": combined,
                    "moving_ranks": sorted(c["rank"] for c in named),
                    "combined_gain_ns_per_step": combined}
        pattern = "few_steps" if all(hit) else "steady"
        return {**empty, "pattern": pattern, "culprits": named,
                "combined_gain_ns_per_step": combined}
    # nobody over the window: one slowness moving from rank to rank? On most steps one rank
    # gains a real part of the step alone (3x the next), and not always the same rank
    tops = _per_step_top(gains, floor=MOVING_STEP_SHARE * mean_step)
    if len(tops) >= max(2, steps.height // 2) and len(set(tops)) > 1:
        spec = "ranks=" + "+".join(str(r) for r in sorted(set(tops))) + ":typical"
        cost = _mean_gain(_scenario_steps(replay, spec, steps.select("step", "replayed_ns")))
        if cost >= floor:
            return {**empty, "pattern": "moving", "moving_cost_ns_per_step": cost,
                    "moving_ranks": sorted(set(tops)), "combined_gain_ns_per_step": cost}
    return empty


def critical_path(replay: Replay) -> pl.DataFrame:
    """The replay's longest path, one row per edge on it: ``rank, kind`` (the edge's kind;
    a queue edge is ``work``; ``step_tail``: below), ``ns`` (its time), ``step`` (the
    destination's step), in time order.

    A rank's step is done when its host's step marker has ended *and* the GPU work it
    launched has ended (``step_finish``): the path starts at the latest finish of the last
    step, and where it reaches a step end whose GPU work ended after the host's previous
    point and while the host thread ran no op (``step_finish``'s ``idle_ns``), it goes on
    into that GPU work, not along the host's uncovered time (a host that never synchronises
    ends its marker on its own; the step's work was the GPU's). The host's time from that GPU
    op's end to its marker's end is a ``step_tail`` edge of the rank. Step times stay the
    markers' (``check``)."""
    pts = replay.graph.points
    times, pred = replay.base.time, replay.base.pred
    schema = {"rank": pl.Int32, "kind": pl.String, "ns": pl.Int64, "step": pl.Int64}
    finish = step_finish(replay)
    if finish.height == 0:
        return pl.DataFrame(schema=schema)
    last = finish.filter(pl.col("step") == pl.col("step").max())
    ends = np.concatenate([last.get_column("end").to_numpy(),
                           last.get_column("gpu").drop_nulls().to_numpy()])
    node = int(ends[np.argmax(times[ends])])
    into_gpu = {e: (g, idle) for e, g, idle in
                finish.drop_nulls("gpu").select("end", "gpu", "idle_ns").rows()}
    n_points = pts.height
    chain, tails = [], []
    while node >= 0:
        chain.append(node)
        gpu, idle = into_gpu.get(node, (None, 0))
        before = int(pred[node])
        # the GPU still ran when the host thread went idle before its marker's end
        if gpu is not None and times[node] - idle <= times[gpu] <= times[node] \
                and (before < 0 or times[before] < times[gpu]):
            tails.append((gpu, node))
            node = gpu
        else:
            node = before
    chain = np.asarray(chain[::-1], dtype=np.int64)
    if chain.size < 2:
        return pl.DataFrame(schema=schema)
    src, dst = chain[:-1], chain[1:]
    edges = replay.graph.edges
    kinds = pl.concat([
        pl.DataFrame(tails, schema={"src": pl.Int64, "dst": pl.Int64}, orient="row")
        .with_columns(kind=pl.lit("step_tail")),
        edges.select("src", "dst", "kind")]).unique(["src", "dst"], keep="first")
    rows = pl.DataFrame({"src": src, "dst": dst, "ns": times[dst] - times[src]}).join(
        kinds, on=["src", "dst"], how="left", maintain_order="left")
    # an instance node is on no rank: its edge out counts on the rank it leads to
    at = np.where(dst < n_points, dst, src)
    where = pts.select("rank", "step").with_row_index("i")
    return rows.with_columns(i=pl.Series(at, dtype=pl.UInt32)).join(
        where, on="i", how="left", maintain_order="left").select(
        pl.col("rank").cast(pl.Int32),
        kind=pl.col("kind").replace("queue", "work").fill_null("work"),
        ns=pl.col("ns").cast(pl.Int64), step=pl.col("step"))


def step_finish(replay: Replay) -> pl.DataFrame:
    """``rank, step, end, gpu, idle_ns``: per rank and step, its ``step_end`` point; ``gpu``,
    the point of the GPU op it launched that ends last in the replay (null: no GPU work; a GPU
    op belongs to the step of its launch, not to the step running when it ends: a host that
    runs ahead starts step N+1 while step N's kernels run); ``idle_ns``, how long the host's
    step-marker thread ran no op before the marker's end (measured)."""
    pts = replay.graph.points
    marks = pts.filter(pl.col("kind").is_in(["step_start", "step_end"]))
    ends = marks.filter(pl.col("kind") == "step_end").select(
        "rank", "tid", "step", end="point", t="t_ns").join(
        marks.filter(pl.col("kind") == "step_start").select("rank", "step", start="t_ns"),
        on=["rank", "step"], how="left")
    host = replay.graph.ops.filter(pl.col("tid") >= 0)
    ops = host.filter(~named(host, STEP_PATTERN))
    busy = ends.sort("t").join_asof(
        ops.select("rank", "tid", busy="end_ns").sort("busy"), left_on="t", right_on="busy",
        by=["rank", "tid"], strategy="backward", check_sortedness=False)
    idle = pl.col("t") - pl.max_horizontal("busy", pl.col("start").fill_null(pl.col("t")))
    launched = pts.filter(pl.col("kind") == "launch").select("rank", "correlation", "step")
    gpu = pts.with_columns(t=pl.Series(replay.base.time[:pts.height])).filter(
        (pl.col("tid") < 0) & pl.col("correlation").is_not_null()
        & pl.col("kind").is_in(["kernel", "complete"])).select("rank", "correlation", "point", "t")
    last = gpu.join(launched, on=["rank", "correlation"]).sort("t", "point").group_by(
        "rank", "step").agg(gpu=pl.col("point").last())
    return busy.select("rank", "step", "end", idle_ns=idle.clip(0)).join(
        last, on=["rank", "step"], how="left").sort("rank", "step").select(
        "rank", "step", "end", "gpu", "idle_ns")


def path_ranks(path: pl.DataFrame) -> pl.DataFrame:
    """``rank, path_ns, share, top_kind``: the path's time per rank."""
    total = path.get_column("ns").sum() if path.height else 0
    per = path.group_by("rank", "kind").agg(ns=pl.col("ns").sum())
    return per.group_by("rank").agg(
        path_ns=pl.col("ns").sum(), top_kind=pl.col("kind").sort_by("ns").last()).with_columns(
        share=pl.col("path_ns") / total if total else pl.lit(None, pl.Float64)) \
        .sort("path_ns", descending=True).select("rank", "path_ns", "share", "top_kind")


def _scenario_steps(replay: Replay, spec: str, base: pl.DataFrame) -> pl.DataFrame:
    found = step_times(replay.graph.points, replay_scenario(replay.graph, spec).time)
    return base.join(found.select("step", s="replayed_ns"), on="step", how="left").with_columns(
        gain=(pl.col("replayed_ns") - pl.col("s")).cast(pl.Float64))


def _mean_gain(steps: pl.DataFrame) -> float:
    return float(steps.get_column("gain").mean()) if steps.height else 0.0


def _slowdown(steps: pl.DataFrame) -> float | None:
    ideal = steps.get_column("s").mean()
    return float(steps.get_column("replayed_ns").mean()) / ideal if ideal else None


def _few_steps(per: np.ndarray) -> np.ndarray:
    """The steps that carry a gain concentrated on at most a quarter of them (else none)."""
    total = per.clip(0).sum()
    if total <= 0 or per.size < 4:
        return np.zeros(per.size, dtype=bool)
    order = np.argsort(-per)
    most = max(1, per.size // 4)
    if per[order[:most]].clip(0).sum() < FEW_STEPS_SHARE * total:
        return np.zeros(per.size, dtype=bool)
    # those of the top quarter that carry a real part of it (a step's share of the top)
    hit = np.zeros(per.size, dtype=bool)
    top = per[order[:most]]
    hit[order[:most][top >= 0.25 * top.max()]] = True
    return hit


def _per_step_top(gains: pl.DataFrame, *, floor: float) -> list[int]:
    """Per step where one rank dominates (its gain there at least ``floor`` and 3x the
    next rank's), that rank."""
    if gains.height == 0:
        return []
    ranks = gains.get_column("rank").to_list()
    table = np.asarray(gains.get_column("step_gains").to_list(), dtype=float)
    tops = []
    for col in table.T:
        order = np.argsort(-col)
        best = col[order[0]]
        second = max(col[order[1]], 0.0) if col.size > 1 else 0.0
        if best >= floor and best >= 3 * second:
            tops.append(int(ranks[int(order[0])]))
    return tops


__all__ = ["critical_path", "culprits", "own_excess", "path_ranks", "rank_gains",
           "rank_step_times", "step_finish", "type_slowdowns"]
