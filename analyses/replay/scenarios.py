"""What-if scenarios: the graph's work and transfers changed, then replayed.

Definitions with a worked example: ``docs/metrics.md``, section *Replay*. A scenario is one
or more SPECs joined by commas (``rank=2:typical,comm=x0.5``):

=====================  ===================================================================
``rank=R:typical``      each of rank R's stretches (the work between two anchors, see
                        :mod:`.graph`) takes the median over the other ranks of the same
                        stretch; its points keep their shares of the stretch
``ranks=A+B:typical``   the same for ranks A and B (the median over the ranks not named)
``ranks=all:typical``   the same for every rank
``comm=xF``             every transfer scaled by F
``comm=typical``        every transfer set to the median transfer of its collective kind
``op=REGEX:xF``         the time host ops whose name matches REGEX cover, scaled by F
``kernel=REGEX:xF``     the same for GPU kernels (no effect on a CPU-only run)
``stalls=off``          each stretch's *idle* time (its work outside every leaf op: an
                        unannotated sleep, a descheduled process, Python between ops) cut
                        to the median over the ranks of the same stretch's idle time
=====================  ===================================================================

Several SPECs apply in that order: op and kernel scaling, stalls, typical, comm.

>>> parse_scenario("rank=2:typical,comm=x0.5")
(Spec(kind='typical', ranks=(2,), pattern=None, factor=1.0), Spec(kind='comm', ranks=(), pattern=None, factor=0.5))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from traceview._dependencies import lazy_module

from ..intervals import union
from .graph import ReplayGraph

np = lazy_module("numpy")

_KEYS = ("ranks", "rank", "comm", "op", "kernel", "stalls")
_SPLIT = re.compile(r",(?=(?:%s)=)" % "|".join(_KEYS))
_FACTOR = r"x(\d+(?:\.\d*)?|\.\d+)"


class SpecError(ValueError):
    """A SPEC that cannot be read: the message is one line for the user."""


@dataclass(frozen=True)
class Spec:
    """One SPEC: ``kind`` (typical, comm, op, kernel, stalls), the ranks it changes (typical;
    empty: all), the name pattern (op, kernel) and the factor (comm, op, kernel)."""

    kind: str
    ranks: tuple[int, ...] = ()
    pattern: str | None = None
    factor: float = 1.0


def parse_scenario(text: str) -> tuple[Spec, ...]:
    """The SPECs of one scenario (``SpecError`` with a one-line reason when it cannot)."""
    if not text or not text.strip():
        raise SpecError("empty scenario")
    return tuple(_parse_one(part.strip()) for part in _SPLIT.split(text.strip()))


def _parse_one(text: str) -> Spec:
    key, _, value = text.partition("=")
    if key == "rank":
        m = re.fullmatch(r"(\d+):typical", value)
        if m:
            return Spec("typical", ranks=(int(m.group(1)),))
    elif key == "ranks":
        if value == "all:typical":
            return Spec("typical")
        m = re.fullmatch(r"(\d+(?:\+\d+)*):typical", value)
        if m:
            return Spec("typical", ranks=tuple(int(r) for r in m.group(1).split("+")))
    elif key == "comm":
        if value == "typical":
            return Spec("comm_typical")
        m = re.fullmatch(_FACTOR, value)
        if m:
            return Spec("comm", factor=float(m.group(1)))
    elif key in ("op", "kernel"):
        pattern, _, factor = value.rpartition(":")
        m = re.fullmatch(_FACTOR, factor)
        if pattern and m:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SpecError(f"{text!r}: bad regular expression: {exc}") from None
            return Spec(key, pattern=pattern, factor=float(m.group(1)))
    elif key == "stalls":
        if value == "off":
            return Spec("stalls")
    raise SpecError(
        f"{text!r} is not a SPEC (rank=R:typical, ranks=all:typical, comm=xF, op=REGEX:xF, "
        "kernel=REGEX:xF, stalls=off)")


def scenario_work(graph: ReplayGraph, specs: tuple[Spec, ...]
                  ) -> tuple[np.ndarray, float, np.ndarray | None]:
    """The points' work under ``specs``, the transfer scale and the transfer edges' lags
    (None: as measured): what :func:`~.simulate.replay_graph` replays."""
    pts = graph.points
    work = pts.get_column("work_ns").cast(pl.Float64).to_numpy().copy()
    scale = 1.0
    order = {"op": 0, "kernel": 0, "stalls": 1, "typical": 2, "comm": 3, "comm_typical": 3}
    transfers = None
    for spec in sorted(specs, key=lambda s: order[s.kind]):
        if spec.kind in ("op", "kernel"):
            kinds = ("kernel",) if spec.kind == "kernel" else ("cpu_op", "user_annotation")
            matched = _covered(graph, pts, _named(graph.ops, spec.pattern, kinds))
            work = work + (spec.factor - 1.0) * matched
        elif spec.kind == "stalls":
            idle = np.clip(np.minimum(work, pts.get_column("work_ns").to_numpy()
                                      - _covered(graph, pts, _leaves(graph.ops))), 0, None)
            typical = _typical(pts, idle, None, cut_only=True)
            work = work - idle + typical
        elif spec.kind == "typical":
            work = _typical(pts, work, set(spec.ranks) if spec.ranks else None)
        elif spec.kind == "comm":
            scale *= spec.factor
        elif spec.kind == "comm_typical":
            transfers = _typical_transfers(graph)
    return np.round(np.clip(work, 0, None)).astype(np.int64), scale, transfers


def _typical_transfers(graph: ReplayGraph) -> np.ndarray:
    """Each transfer edge's lag set to the median over the edges of its collective kind."""
    edges = graph.edges.select("kind", "instance", "lag_ns").join(
        graph.instances.select("instance", "collective"), on="instance", how="left",
        maintain_order="left")
    moved = pl.col("kind") == "transfer"
    typical = pl.col("lag_ns").filter(moved).median().over("collective").round(0) \
        .cast(pl.Int64)
    return edges.select(pl.when(pl.col("kind") == "transfer").then(typical)
                        .otherwise(pl.col("lag_ns"))).to_series().to_numpy()


def _typical(pts: pl.DataFrame, values: np.ndarray, ranks: set[int] | None, *,
             cut_only: bool = False) -> np.ndarray:
    """``values`` with each stretch's total on the ``ranks`` (None: all) set to the median
    over the other ranks of the same stretch (all of them for ``None``, or when no other
    rank has it: two slow ranks of four would make the median half slow), spread over its
    points in their proportions (a stretch of nothing gets the median on its last point);
    ``cut_only``: never raised."""
    frame = pts.select("rank", "stretch", "point").with_columns(v=pl.Series(values))
    totals = frame.filter(pl.col("stretch").is_not_null()).group_by("stretch", "rank").agg(
        total=pl.col("v").sum(), last=pl.col("point").max())
    others = pl.col("total").filter(~pl.col("rank").is_in(list(ranks or ())))
    totals = totals.with_columns(median=pl.coalesce(others.median().over("stretch"),
                                                    pl.col("total").median().over("stretch")))
    if cut_only:
        totals = totals.with_columns(median=pl.min_horizontal("median", "total"))
    chosen = totals if ranks is None else totals.filter(pl.col("rank").is_in(list(ranks)))
    per = frame.join(chosen.select("stretch", "rank", "total", "median", "last"),
                     on=["stretch", "rank"], how="inner")
    new = pl.when(pl.col("total") > 0).then(pl.col("v") * pl.col("median") / pl.col("total")) \
        .when(pl.col("point") == pl.col("last")).then(pl.col("median")).otherwise(0.0)
    per = per.select("point", new=new)
    out = values.astype(np.float64).copy()
    out[per.get_column("point").to_numpy()] = per.get_column("new").to_numpy()
    return out


def _named(ops: pl.DataFrame, pattern: str | None, kinds: tuple[str, ...]) -> pl.DataFrame:
    chosen = ops.filter(pl.col("kind").is_in(list(kinds))) if "kind" in ops.columns else ops
    return chosen.filter(pl.col("name").str.contains(pattern or ""))


def _leaves(ops: pl.DataFrame) -> pl.DataFrame:
    """Host ops with no op inside them on their thread (nested properly: an op has a child
    when the next op by start begins before its end)."""
    host = ops.filter(pl.col("kind") != "kernel") if "kind" in ops.columns else ops
    ordered = host.sort("rank", "tid", "ts_ns", pl.col("end_ns"), descending=[
        False, False, False, True])
    nxt = pl.col("ts_ns").shift(-1).over("rank", "tid")
    return ordered.filter(nxt.is_null() | (nxt >= pl.col("end_ns")))


def _covered(graph: ReplayGraph, pts: pl.DataFrame, intervals: pl.DataFrame) -> np.ndarray:
    """Per point, the time ``intervals`` (on the point's own rank and thread) cover within
    its work stretch ``[work_from_ns, work_to_ns]``."""
    if intervals.height == 0:
        return np.zeros(pts.height)
    merged = union(intervals.select("rank", "tid", "ts_ns", "end_ns"), by=["rank", "tid"]) \
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("tid").cast(pl.Int64))
    merged = merged.with_columns(
        before=(pl.col("end_ns") - pl.col("ts_ns")).cum_sum().over("rank", "tid")
        - (pl.col("end_ns") - pl.col("ts_ns")))

    def upto(col: str) -> pl.Series:
        probe = pts.select("point", "rank", "tid", t=pl.col(col)).sort("t")
        hit = probe.join_asof(merged.sort("ts_ns"), left_on="t", right_on="ts_ns",
                              by=["rank", "tid"], strategy="backward", check_sortedness=False)
        return hit.sort("point").select(
            pl.col("before") + (pl.min_horizontal("t", "end_ns") - pl.col("ts_ns"))).fill_null(0) \
            .to_series()

    return (upto("work_to_ns") - upto("work_from_ns")).cast(pl.Float64).to_numpy()


__all__ = ["Spec", "SpecError", "parse_scenario", "scenario_work"]
