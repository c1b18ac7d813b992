"""Step times from a replay, and the replay's self-check against the measured run.

A rank's step time is its step marker's end minus its start; a step's time is the longest
rank's (replayed: the same on the replayed times of the same two points). The
**replay error** of a step is |replayed - measured| / measured; the run's ``median`` and
``p90`` are over the window's steps (linear interpolation). The replay is **trusted** when
the p90 is at most ``TRUSTED_P90`` (the OSDI'25 straggler study kept only traces within 5%).
Where it is not, each step beyond it names the point whose replayed time moved most against
its queue's previous point: the rank, the queue, the kind of point and the dependency it
waited on, so a missing or wrong edge is named, not hidden; ``cause`` says which: ``transfer``
(a member's completion set by its instance: its own transfer differed from the instance's
typical one, the one-transfer model's error) or ``dependency`` (any other point: an edge the
run does not bear out).

>>> import polars as pl
>>> pts = pl.DataFrame({"point": [0, 1, 2, 3], "rank": [0, 0, 1, 1], "kind": ["step_start",
...     "step_end"] * 2, "t_ns": [0, 100, 0, 110], "step": [1, 1, 1, 1]})
>>> step_times(pts, [0, 100, 0, 100]).rows()
[(1, 110, 100)]
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceview._dependencies import lazy_module

from .graph import ReplayGraph
from .simulate import Replayed

np = lazy_module("numpy")

#: Above this p90 of the per-step error, verdicts built on the replay are low-confidence.
TRUSTED_P90 = 0.05

STEP_SCHEMA: dict[str, pl.DataType] = {"step": pl.Int64, "measured_ns": pl.Int64,
                                       "replayed_ns": pl.Int64}


#: The step of a run without step markers: its whole window, as one step.
WHOLE_WINDOW = -1


def rank_step_times(points: pl.DataFrame, time: object) -> pl.DataFrame:
    """``rank, step, measured_ns, replayed_ns`` per rank and step (``time``: replayed time
    per node, the points first). A run without step markers is one step, ``WHOLE_WINDOW``:
    per rank, its first point to its last."""
    if points.height and not points.get_column("kind").is_in(["step_start"]).any():
        r = pl.Series(np.asarray(time)[:points.height])
        return points.select("rank", "t_ns", r=r).group_by("rank").agg(
            step=pl.lit(WHOLE_WINDOW, pl.Int64),
            measured_ns=pl.col("t_ns").max() - pl.col("t_ns").min(),
            replayed_ns=pl.col("r").max() - pl.col("r").min()).sort("rank")
    marks = points.filter(pl.col("kind").is_in(["step_start", "step_end"])).select(
        "rank", "step", "kind", "t_ns", r=pl.Series(np.asarray(time)[:points.height])
        .gather(points.filter(pl.col("kind").is_in(["step_start", "step_end"]))
                .get_column("point")))
    wide = marks.pivot("kind", index=["rank", "step"], values=["t_ns", "r"],
                       aggregate_function="first")
    if "t_ns_step_end" not in wide.columns or "t_ns_step_start" not in wide.columns:
        return pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64,
                                    "measured_ns": pl.Int64, "replayed_ns": pl.Int64})
    return wide.select(
        "rank", "step", measured_ns=pl.col("t_ns_step_end") - pl.col("t_ns_step_start"),
        replayed_ns=pl.col("r_step_end") - pl.col("r_step_start")).drop_nulls() \
        .sort("step", "rank")


def step_times(points: pl.DataFrame, time: object) -> pl.DataFrame:
    """``STEP_SCHEMA``: per step, the longest rank's measured and replayed times (the job's
    step lasts as long as its slowest rank's)."""
    per = rank_step_times(points, time)
    return per.group_by("step").agg(
        measured_ns=pl.col("measured_ns").max(), replayed_ns=pl.col("replayed_ns").max()) \
        .sort("step").select(list(STEP_SCHEMA))


@dataclass(frozen=True)
class SelfCheck:
    """The replay of the measured run against the run: ``steps`` (``STEP_SCHEMA`` with
    ``error``), the error's ``median`` and ``p90``, ``trusted``, and ``causes``: per step
    beyond ``TRUSTED_P90``, the point that reproduces worst (empty when trusted)."""

    steps: pl.DataFrame
    median: float | None
    p90: float | None
    trusted: bool
    causes: pl.DataFrame
    forced: int

    def to_dict(self) -> dict[str, object]:
        return {"median": self.median, "p90": self.p90}


def self_check(graph: ReplayGraph, replayed: Replayed) -> SelfCheck:
    steps = step_times(graph.points, replayed.time).with_columns(
        error=((pl.col("replayed_ns") - pl.col("measured_ns")).abs()
               / pl.col("measured_ns").cast(pl.Float64)))
    # a step the replay found no time in (no sync point, nothing measured) checks nothing
    err = steps.filter(pl.col("measured_ns") > 0).get_column("error")
    if err.len() == 0:
        return SelfCheck(steps, None, None, False, _no_causes(), replayed.forced)
    median = float(err.median())
    p90 = float(err.quantile(0.9, "linear"))
    trusted = p90 <= TRUSTED_P90 and replayed.forced == 0
    bad = steps.filter(pl.col("error") > TRUSTED_P90).get_column("step")
    causes = _causes(graph, replayed, bad) if bad.len() else _no_causes()
    return SelfCheck(steps, median, p90, trusted, causes, replayed.forced)


def _no_causes() -> pl.DataFrame:
    return pl.DataFrame(schema={"step": pl.Int64, "rank": pl.Int32, "role": pl.String,
                                "kind": pl.String, "instance": pl.String,
                                "drift_ns": pl.Int64, "what": pl.String, "cause": pl.String})


def _causes(graph: ReplayGraph, replayed: Replayed, steps: pl.Series) -> pl.DataFrame:
    """Per step, the point whose replayed time drifts most from the measured one relative
    to its queue's previous point: there the replay's dependencies and the run disagree."""
    pts = graph.points
    measured = np.concatenate([pts.get_column("t_ns").to_numpy(),
                               graph.instances.get_column("last_arrival_ns").to_numpy()])
    dev = replayed.time - measured
    # drift: how far the point moved against the node that set its replayed time
    by = np.where(replayed.pred >= 0, replayed.pred, np.arange(len(dev)))
    drift = (dev - dev[by])[:pts.height]
    # set by its instance's node: a member's completion after the last arrival, the instance's
    # typical transfer where the member's own was drift longer or shorter (the transfer model)
    by_instance = (replayed.pred >= pts.height)[:pts.height]
    pts = pts.with_columns(drift_ns=pl.Series(drift, dtype=pl.Int64),
                           _transfer=pl.Series(by_instance, dtype=pl.Boolean))
    # a step's time is its end minus its start: a drift in the step before moves its start
    bad = pl.DataFrame({"bad": steps.cast(pl.Int64)})
    near = pts.drop_nulls("step").join(bad, how="cross").filter(
        (pl.col("step") == pl.col("bad")) | (pl.col("step") == pl.col("bad") - 1))
    worst = near.sort(pl.col("drift_ns").abs(), descending=True).group_by(
        "bad", maintain_order=True).first().sort("bad").with_columns(
        pl.col("step").alias("at_step"), pl.col("bad").alias("step"))
    on = pl.when(pl.col("instance").is_null()).then(pl.lit("")).otherwise(
        pl.lit(" of ") + pl.col("instance"))
    transfer = (pl.col("kind") == "complete") & pl.col("_transfer")
    why = pl.when(transfer).then(pl.format(
        " (the transfer model: this member completed {} ms after the instance's last arrival, "
        "its typical transfer is {} ms)",
        ((pl.col("t_ns") - pl.col("_last")) / 1e6).round(3),
        ((pl.col("t_ns") - pl.col("_last") + pl.col("drift_ns")) / 1e6).round(3))) \
        .otherwise(pl.lit(""))
    what = pl.format("step {}: rank {} thread {} ({}, step {}): {}{} {} ms {} in the replay "
                     "than measured{}", "step", "rank", "tid", "role", "at_step", "kind", on,
                     (pl.col("drift_ns").abs() / 1e6).round(3),
                     pl.when(pl.col("drift_ns") < 0).then(pl.lit("earlier"))
                     .otherwise(pl.lit("later")), why)
    worst = worst.join(graph.instances.select("instance", _last="last_arrival_ns"),
                       on="instance", how="left", maintain_order="left")
    return worst.select("step", "rank", "role", "kind", "instance", "drift_ns", what=what,
                        cause=pl.when(transfer).then(pl.lit("transfer"))
                        .otherwise(pl.lit("dependency"))).cast(_no_causes().schema)


__all__ = ["STEP_SCHEMA", "SelfCheck", "TRUSTED_P90", "WHOLE_WINDOW", "rank_step_times",
           "self_check", "step_times"]
