"""One timeline across ranks: per-rank clock offset, drift and uncertainty from collectives.

Each rank writes timestamps with its host's clock. Hosts disagree by milliseconds to seconds, so
cross-rank numbers need a per-rank correction first. The physics used (written up with formulas
in ``docs/metrics.md``, section *Alignment*):

* **Near-simultaneous completion.** A blocking collective (all-reduce, all-gather,
  reduce-scatter, all-to-all, barrier) completes on every rank at nearly the same instant:
  the last data to arrive finishes it everywhere. So for instance *k* seen by ranks *r*,
  ``end[r,k] = E[k] + offset[r] + drift[r] * (E[k] - T0) + noise``. We estimate ``offset`` and
  ``E`` by alternating medians (robust to outlying instances), then a drift slope per clock
  from the residuals, kept only when it is statistically significant.
* **Causality.** No rank can finish before the last rank arrived:
  ``end[r,k] - offset[r] >= start[s,k] - offset[s]`` for every pair. Each instance bounds the
  offset from both sides; the estimate is kept inside the intersection of those bounds, and the
  bounds cap the reported uncertainty.
* **Shared host clocks.** Ranks on one host read one clock. With ``method="auto"`` they are
  pooled into one clock unless their separate estimates disagree by more than their uncertainty
  (the data contradict sharing, e.g. a trace whose clock was shifted).

``offset_ns`` is this rank's clock minus the reference rank's clock at ``drift_epoch_ns``;
aligned time = raw - offset - drift (raw - offset - epoch). Raw ``ts_ns`` is never changed:
:func:`apply_offsets` adds ``ts_aligned_ns``.

>>> from traceview.schema import events_frame
>>> rows = []
>>> for k, t in enumerate((1_000_000, 3_000_000, 5_000_000)):
...     for r, off in ((0, 0), (1, 7_000_000_000)):
...         rows.append(dict(rank=r, file_id=r, source="kineto", kind="kernel", stream=7,
...                          name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
...                          ts_ns=t + off + 1000 * r * k, dur_ns=50_000 - 1000 * r * k))
>>> from traceview.analyses.collective_match import comm_events, match_collectives
>>> match = match_collectives(comm_events(events_frame(rows)))
>>> estimate_offsets(match, [0, 1]).select("rank", "offset_ns", "anchors").rows()
[(0, 0, 3), (1, 7000000000, 3)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    import numpy as np

from traceview._dependencies import lazy_module
from traceview.analyses.align_error import (  # noqa: F401  (re-exported: one import for users)
    DRIFT_MIN_ANCHORS,
    QUALITIES,
    ClockError,
    alignment_quality,
    alignment_warnings,
    calibrated_uncertainty,
    clock_error,
    clock_errors,
    median_rows,
    nanmedian_rows,
)
from traceview.analyses.collective_match import (
    BLOCKING,
    P2P,
    MatchResult,
)
from traceview.errors import UsageError
from traceview.selection import ALIGN_METHODS

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

METHODS: tuple[str, ...] = ALIGN_METHODS

OFFSETS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "offset_ns": pl.Int64, "drift_ppm": pl.Float64,
    "uncertainty_ns": pl.Int64, "anchors": pl.Int64, "method": pl.String, "host": pl.String,
    "drift_epoch_ns": pl.Int64, "residual_ns": pl.Int64, "causal_low_ns": pl.Int64,
    "causal_high_ns": pl.Int64, "note": pl.String, "quality": pl.String,
    "effective_anchors": pl.Float64, "disagreement_ns": pl.Int64,
}

#: Two per-rank offsets on one host that differ by less than this (plus 3x their uncertainty)
#: are taken as one shared clock.
HOST_FLOOR_NS = 20_000
#: A drift slope is applied only when it exceeds this many standard errors, with this many
#: anchors at least.
DRIFT_SIGMAS = 4.0


def _hosts_map(ranks: list[int], hosts: pl.DataFrame | dict[int, str] | None) -> dict[int, str]:
    if hosts is None:
        return {}
    if isinstance(hosts, dict):
        return {int(r): str(h) for r, h in hosts.items() if h is not None}
    if "host" not in hosts.columns:
        return {}
    pairs = hosts.select(pl.col("rank").cast(pl.Int64), pl.col("host").cast(pl.String)).rows()
    return {int(r): h for r, h in pairs if h}


def anchors_from(match: MatchResult) -> pl.DataFrame:
    """Matched instances usable as clock anchors: seen on >= 2 ranks, not point-to-point,
    not enqueue-only CPU ops. Columns: instance, rank, collective, ts_ns, end_ns, blocking,
    by_time (paired by completion time: the pairing itself assumed the clocks' offsets)."""
    inst = match.instances
    return (
        inst.filter(~pl.col("collective").is_in(list(P2P)) & ~pl.col("enqueue_only"))
        .filter(pl.col("rank").n_unique().over("instance") >= 2)
        .select("instance", "rank", "collective", "ts_ns", "end_ns",
                blocking=pl.col("collective").is_in(list(BLOCKING)),
                by_time=pl.col("match") == "time")
    )


def estimate_offsets(
    match: MatchResult,
    ranks: Sequence[int] | pl.DataFrame,
    *,
    method: str = "auto",
    reference_rank: int | None = None,
    hosts: pl.DataFrame | dict[int, str] | None = None,
) -> pl.DataFrame:
    """Per-rank clock offsets relative to ``reference_rank`` (default: lowest rank with anchors),
    from the collectives of ``match`` (``match_collectives``), one row per rank of ``ranks``.

    ``method``: ``auto`` (collectives, pooling ranks of one host unless the data contradict
    it), ``collectives`` (every rank its own clock), ``host`` (ranks of one host always pooled),
    ``none`` (raw clocks). ``hosts``: the TraceSet ``ranks`` table (rank, host) or a dict.
    Returns ``OFFSETS_SCHEMA``, one row per rank; ranks without anchors get offset 0 (or their
    host's) and say so in ``note``.
    """
    if method not in METHODS:
        raise UsageError(f"--align wants one of {', '.join(METHODS)}, got {method!r}")
    if isinstance(ranks, pl.DataFrame):
        ranks = ranks.get_column("rank").to_list()
    ranks = sorted(int(r) for r in ranks)
    host_of = _hosts_map(ranks, hosts)
    if method == "none" or not ranks:
        return _table([_row(r, 0, method="none", host=host_of.get(r), note="raw clocks")
                       for r in ranks])
    anchors = anchors_from(match)
    anchored = sorted(int(r) for r in anchors.get_column("rank").unique().to_list())
    if reference_rank is None:
        reference_rank = anchored[0] if anchored else ranks[0]
    if reference_rank not in ranks:
        raise UsageError(f"reference rank {reference_rank} is not in the trace")
    if not anchored or reference_rank not in anchored:
        why = ("no collective seen on two ranks: raw clocks kept" if not anchored else
               f"reference rank {reference_rank} has no matched collectives: raw clocks kept")
        return _table([_row(r, 0, method="none", host=host_of.get(r), note=why) for r in ranks])

    per_rank = _solve(anchors, {r: f"rank {r}" for r in anchored}, reference_rank,
                      start_host={f"rank {r}": host_of[r] for r in anchored if r in host_of})
    clock_of = {r: f"rank {r}" for r in anchored}
    notes: dict[int, str] = {}
    if method in ("auto", "host"):
        by_host: dict[str, list[int]] = {}
        for r in anchored:
            if r in host_of:
                by_host.setdefault(host_of[r], []).append(r)
        for host, members in by_host.items():
            if len(members) < 2:
                continue
            offs = [per_rank[r]["offset"] for r in members]
            unc = max(per_rank[r]["uncertainty"] for r in members)
            spread = max(offs) - min(offs)
            if method == "host" or spread <= 3 * unc + HOST_FLOOR_NS:
                for r in members:
                    clock_of[r] = f"host {host}"
            else:
                for r in members:
                    notes[r] = (f"host {host} clock sharing contradicted: per-rank offsets on "
                                f"it differ by {spread} ns")
        if len(set(clock_of.values())) < len(clock_of):
            solved = _solve(anchors, clock_of, reference_rank)
        else:
            solved = per_rank
    else:
        solved = per_rank

    rows = []
    for r in ranks:
        host = host_of.get(r)
        if r in solved:
            s = solved[r]
            pooled = clock_of.get(r, "").startswith("host ")
            m = "host" if pooled else "collectives"
            note = notes.get(r, s["note"])
            if r == reference_rank:
                note = "reference" + (f"; {note}" if note else "")
            rows.append(_row(r, s["offset"], drift=s["drift_ppm"], unc=s["uncertainty"],
                             anchors=s["anchors"], method=m, host=host,
                             epoch=s["epoch"], resid=s["residual"], low=s["low"],
                             high=s["high"], note=_join(note, s.get("why", "")),
                             quality=s["quality"], n_eff=s.get("n_eff"),
                             disagreement=s.get("disagreement")))
            continue
        mates = [q for q in anchored if host is not None and host_of.get(q) == host]
        if mates and method in ("auto", "host"):
            s = solved[mates[0]]
            # An assumption (one clock per host), not a measurement: never better than fair.
            quality = s["quality"] if s["quality"] in ("poor", "none") else "fair"
            rows.append(_row(r, s["offset"], drift=s["drift_ppm"], unc=s["uncertainty"],
                             method="host", host=host, epoch=s["epoch"], quality=quality,
                             note=f"no anchors; shares the clock of host {host} "
                                  f"(rank {mates[0]}); quality {quality}: assumed, "
                                  f"not measured"))
        else:
            rows.append(_row(r, 0, method="none", host=host,
                             note="no matched collectives: raw clock kept, not comparable"))
    return _table(rows)


def _row(rank: int, offset: int, *, drift: float = 0.0, unc: int | None = None,
         anchors: int = 0, method: str, host: str | None = None, epoch: int | None = None,
         resid: int | None = None, low: int | None = None, high: int | None = None,
         note: str = "", quality: str = "none", n_eff: float | None = None,
         disagreement: int | None = None) -> dict:
    return {"rank": rank, "offset_ns": int(offset), "drift_ppm": float(drift),
            "uncertainty_ns": unc, "anchors": anchors, "method": method, "host": host,
            "drift_epoch_ns": epoch, "residual_ns": resid, "causal_low_ns": low,
            "causal_high_ns": high, "note": note, "quality": quality,
            "effective_anchors": n_eff, "disagreement_ns": disagreement}


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _table(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=OFFSETS_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=OFFSETS_SCHEMA)


def _alternate(x: pl.DataFrame, ref_clock: str, iters: int = 100) -> tuple[dict[str, float],
                                                                           pl.DataFrame]:
    """Alternating medians: E[k] = med_r(x - o), o[c] = med(x - E); o[ref] = 0.

    Runs on an (instance x rank) matrix with NaN where a rank missed an instance; the loop is
    over iterations and clocks, never over events.
    """
    wide = x.pivot(on="rank", index="instance", values="x", aggregate_function="first")
    inst = wide.get_column("instance")
    rank_cols = [c for c in wide.columns if c != "instance"]
    mat = wide.select(rank_cols).cast(pl.Float64).to_numpy()
    clock_of = dict(x.select(pl.col("rank").cast(pl.String), "clock").unique().rows())
    clocks = sorted(set(clock_of.values()))
    cols: dict[str, list[int]] = {c: [] for c in clocks}  # one pass: not clocks x ranks
    for i, r in enumerate(rank_cols):
        cols[clock_of[r]].append(i)
    off = {c: 0.0 for c in clocks}
    big_e = np.zeros(mat.shape[0])
    # clocks of one rank (one process per host) take their medians together, by columns
    single = [c for c in clocks if len(cols[c]) == 1]
    single_cols = [cols[c][0] for c in single]
    several = [c for c in clocks if len(cols[c]) > 1]
    for _ in range(iters):
        o_vec = np.array([off[clock_of[r]] for r in rank_cols])
        big_e = nanmedian_rows(mat - o_vec)
        found = dict(zip(single, nanmedian_rows((mat[:, single_cols] - big_e[:, None]).T)
                         .tolist(), strict=True))
        found.update({c: float(nanmedian_rows((mat[:, cols[c]] - big_e[:, None])
                                               .reshape(1, -1))[0]) for c in several})
        new = {c: found[c] for c in clocks}
        ref = new[ref_clock]
        new = {c: v - ref for c, v in new.items()}
        delta = max(abs(new[c] - off[c]) for c in clocks)
        off = new
        if delta < 0.25:
            break
    o_vec = np.array([off[clock_of[r]] for r in rank_cols])
    big_e = nanmedian_rows(mat - o_vec)
    return off, pl.DataFrame({"instance": inst, "E": big_e})


def _solve(anchors: pl.DataFrame, clock_of: dict[int, str], reference_rank: int, *,
           start_host: dict[str, str] | None = None) -> dict:
    """Offsets, drift, uncertainty and causality bounds per rank for a rank -> clock map.

    ``start_host``: clock -> host. The medians start from each clock's first anchor, those of
    one host from the host's first: its ranks read one clock, so their raw times are the
    better first guess. (Alternating medians can stay where they start: when a rank's anchors
    are mostly instances with ranks of its own start, say its TP partner, the few that link
    it to the others, its DP peers, are outvoted, and a start tens of ms off stays off.)"""
    ranks = sorted(clock_of)
    a = anchors.filter(pl.col("rank").is_in(ranks)).with_columns(
        clock=pl.col("rank").replace_strict(clock_of, return_dtype=pl.String))
    a = a.filter(pl.col("clock").n_unique().over("instance") >= 2)
    ref_clock = clock_of[reference_rank]
    if a.height == 0 or ref_clock not in set(a.get_column("clock").to_list()):
        # Everything pooled into the reference clock (one host): offsets are 0 by assumption.
        return {r: {"offset": 0, "drift_ppm": 0.0, "uncertainty": 0,
                    "anchors": int(anchors.filter(pl.col("rank") == r).height), "epoch": None,
                    "residual": None, "low": None, "high": None, "quality": "fair",
                    "note": "shares the reference clock (assumed: one clock per host)"}
                for r in ranks if clock_of[r] == ref_clock}
    # Work in float64 on values relative to each clock's own first anchor: exact to the ns.
    base = a.group_by("clock").agg(base=pl.col("end_ns").min())
    if start_host:
        base = base.with_columns(host=pl.col("clock").replace_strict(
            start_host, default=pl.col("clock"), return_dtype=pl.String)).with_columns(
            base=pl.col("base").min().over("host")).drop("host")
    base_of = dict(base.rows())
    ref_base = base_of[ref_clock]
    a = a.join(base, on="clock").with_columns(
        x=(pl.col("end_ns") - pl.col("base")).cast(pl.Float64),
        xa=(pl.col("ts_ns") - pl.col("base")).cast(pl.Float64))
    # Initial guess: the bases coincide (undo that in the final offsets).
    off, big_e = _alternate(a, ref_clock)
    t0 = float(big_e.get_column("E").median())
    drift = {c: 0.0 for c in off}
    fitted = _fit_drift(a, off, big_e, t0, ref_clock)
    if any(v != 0.0 for v in fitted.values()):
        drift = fitted
        a2 = a.with_columns(
            d=pl.col("clock").replace_strict(drift, return_dtype=pl.Float64))
        a2 = a2.with_columns(x=pl.col("x") - pl.col("d") * (pl.col("x") - t0),
                             xa=pl.col("xa") - pl.col("d") * (pl.col("xa") - t0)).drop("d")
        off, big_e = _alternate(a2, ref_clock)
        a = a2
    a = a.with_columns(o=pl.col("clock").replace_strict(off, return_dtype=pl.Float64))
    a = a.join(big_e, on="instance").with_columns(
        resid=pl.col("x") - pl.col("o") - pl.col("E"),
        ea=pl.col("x") - pl.col("o"), aa=pl.col("xa") - pl.col("o"))
    lows, highs = _causal_bounds(a)
    errors = clock_errors(a, ref_clock, t0)
    by_time = dict(a.group_by("clock").agg(pl.col("by_time").mean()).rows())
    anchors_of = dict(a.group_by("rank").len().rows())  # one pass, not a filter per rank
    out: dict[int, dict] = {}
    for r in ranks:
        c = clock_of[r]
        if c not in off:
            continue
        o = off[c]
        lo, hi = lows.get(c), highs.get(c)
        note, moved, contradicted = "", 0.0, False
        if c == ref_clock:
            lo = hi = None
        elif lo is not None and hi is not None and lo > hi:
            note = (f"causality contradicted by {lo - hi:.0f} ns (an anchor that is not "
                    f"blocking, or clock drift)")
            lo = hi = None
            contradicted = True
        elif lo is not None and lo > 0:
            o += lo
            moved = lo
            note = f"moved {lo:.0f} ns later to respect causality"
            hi, lo = (hi - lo if hi is not None else None), 0.0
        elif hi is not None and hi < 0:
            o += hi
            moved = -hi
            note = f"moved {-hi:.0f} ns earlier to respect causality"
            lo, hi = (lo - hi if lo is not None else None), 0.0
        err = errors.get(c, ClockError.none())
        if c == ref_clock:
            unc, quality, why = 0, "good", ""
        else:
            unc = calibrated_uncertainty(err, moved=moved, low=lo, high=hi)
            time_matched = by_time.get(c, 0.0) > 0.5
            quality, why = alignment_quality(err, moved=moved, contradicted=contradicted,
                                             time_matched=time_matched)
            if time_matched and lo is not None and hi is not None:
                # a mispaired set of anchors moves every difference alike, so no scatter
                # shows it; causality still bounds the truth: take the whole window
                unc = max(unc, math.ceil(max(-lo, hi)))
        offset = int(base_of[c] - ref_base) + math.floor(o + 0.5)
        out[r] = {
            "offset": offset,
            "drift_ppm": (drift.get(c, 0.0) - drift.get(ref_clock, 0.0)) * 1e6,
            "uncertainty": unc,
            "anchors": int(anchors_of.get(r, 0)),
            "epoch": int(ref_base + round(t0)),
            "residual": int(round(err.residual)),
            "low": None if lo is None else int(math.floor(offset + lo)),
            "high": None if hi is None else int(math.ceil(offset + hi)),
            "note": note, "quality": quality, "why": why,
            "n_eff": None if c == ref_clock else round(err.n_eff, 1),
            "disagreement": None if c == ref_clock else int(round(err.disagreement)),
        }
    return out


def _fit_drift(a: pl.DataFrame, off: dict[str, float], big_e: pl.DataFrame, t0: float,
               ref_clock: str) -> dict[str, float]:
    """Per-clock slope of the end residuals against time; 0 unless significant."""
    t = a.with_columns(o=pl.col("clock").replace_strict(off, return_dtype=pl.Float64)).join(
        big_e, on="instance").with_columns(y=pl.col("x") - pl.col("o") - pl.col("E"),
                                           u=pl.col("E") - t0)
    slopes: dict[str, float] = {}
    # each clock's values as lists from one group_by: iterating the groups gathered each one
    # from the whole frame (~1 ms a clock, growing with the ranks)
    per_clock = t.group_by("clock").agg("y", "u").rows()
    # clocks with as many anchors take their medians together (median_rows)
    alike: dict[int, list[int]] = {}
    for i, (clock, ys, _) in enumerate(per_clock):
        slopes[clock] = 0.0
        if len(ys) >= DRIFT_MIN_ANCHORS:
            alike.setdefault(len(ys), []).append(i)
    for members in alike.values():
        y_rows = np.array([per_clock[i][1] for i in members], dtype=float)
        med = median_rows(y_rows)
        mad = 1.4826 * median_rows(np.abs(y_rows - med[:, None]))
        keep_rows = np.abs(y_rows - med[:, None]) <= np.maximum(4 * mad, 1.0)[:, None]
        for row in np.flatnonzero(keep_rows.sum(axis=1) >= DRIFT_MIN_ANCHORS):
            clock, _, us = per_clock[members[row]]
            slope = _significant_slope(np.asarray(us, dtype=float)[keep_rows[row]],
                                       y_rows[row][keep_rows[row]])
            if slope:
                slopes[clock] = slope
    ref = slopes.get(ref_clock, 0.0)
    if all(v == 0.0 for k, v in slopes.items() if k != ref_clock):
        return {k: 0.0 for k in slopes}
    return {k: v - ref for k, v in slopes.items()}


def _significant_slope(uu, yy) -> float:
    """The least-squares slope of ``yy`` against ``uu`` when it is more than ``DRIFT_SIGMAS``
    standard errors (and 1e-9) from 0; else 0."""
    if np.ptp(uu) <= 0:
        return 0.0
    # A first look in closed form: a slope under half the bar is no drift by any rounding,
    # and most clocks have none; the bar's own test stays polyfit's (~70 us a clock).
    uc = uu - uu.mean()
    sxx = float(np.dot(uc, uc))
    rough = float(np.dot(uc, yy - yy.mean())) / sxx
    off_line = yy - yy.mean() - rough * uc
    rough_se = math.sqrt(float(np.dot(off_line, off_line)) / max(len(yy) - 2, 1) / sxx)
    if abs(rough) < 0.5 * DRIFT_SIGMAS * rough_se or abs(rough) < 0.5e-9:
        return 0.0
    slope, icept = np.polyfit(uu, yy, 1)
    res = yy - (slope * uu + icept)
    se = math.sqrt(float(np.sum(res**2)) / max(len(yy) - 2, 1)) / (
        math.sqrt(float(np.sum((uu - uu.mean()) ** 2))) or 1.0)
    return float(slope) if abs(slope) > DRIFT_SIGMAS * se and abs(slope) > 1e-9 else 0.0


def _causal_bounds(a: pl.DataFrame) -> tuple[dict[str, float], dict[str, float]]:
    """Correction window [low, high] for each clock from blocking instances.

    Aligned start of a rank must not pass the earliest aligned end on another clock, and its
    aligned end must not precede the latest aligned start on another clock.
    """
    blk = a.filter(pl.col("blocking"))
    if blk.height == 0:
        return {}, {}
    per = blk.group_by("instance", "clock").agg(
        a_max=pl.col("aa").max(), e_min=pl.col("ea").min())
    # The other clocks' extreme of an instance is its extreme over all clocks, unless this
    # clock holds it: then the runner-up (equal to it on a tie). Pairing every clock with
    # every other one per instance (a self-join) grew as clocks^2: 2.3 GB for 1,000 ranks.
    per = per.filter(pl.len().over("instance") >= 2).with_columns(
        e_lo=pl.col("e_min").min().over("instance"),
        e_next=pl.col("e_min").bottom_k(2).max().over("instance"),
        a_hi=pl.col("a_max").max().over("instance"),
        a_next=pl.col("a_max").top_k(2).min().over("instance"))
    bounds = per.select(
        "clock", own_a="a_max", own_e="e_min",
        other_e_min=pl.when(pl.col("e_min") == pl.col("e_lo")).then("e_next")
        .otherwise("e_lo"),
        other_a_max=pl.when(pl.col("a_max") == pl.col("a_hi")).then("a_next")
        .otherwise("a_hi"))
    win = bounds.group_by("clock").agg(
        low=(pl.col("own_a") - pl.col("other_e_min")).max(),
        high=(pl.col("own_e") - pl.col("other_a_max")).min())
    return ({c: lo for c, lo, _ in win.rows()}, {c: hi for c, _, hi in win.rows()})


def apply_offsets(events: pl.LazyFrame | pl.DataFrame, offsets: pl.DataFrame) -> pl.LazyFrame:
    """``events`` with ``ts_aligned_ns`` (raw ``ts_ns`` kept). Ranks missing from ``offsets``
    keep their raw time.

    >>> import polars as pl
    >>> ev = pl.DataFrame({"rank": [0, 1], "ts_ns": [100, 5_100]})
    >>> off = pl.DataFrame({"rank": [0, 1], "offset_ns": [0, 5_000], "drift_ppm": [0.0, 0.0]})
    >>> apply_offsets(ev, off).collect().get_column("ts_aligned_ns").to_list()
    [100, 100]
    """
    cols = ["rank", "offset_ns", "drift_ppm"] + (
        ["drift_epoch_ns"] if "drift_epoch_ns" in offsets.columns else [])
    off = offsets.lazy().select(cols).with_columns(pl.col("rank").cast(pl.Int64).alias("_r"))
    if "drift_epoch_ns" not in cols:
        off = off.with_columns(drift_epoch_ns=pl.lit(0, pl.Int64))
    lf = events.lazy().with_columns(pl.col("rank").cast(pl.Int64).alias("_r")).join(
        off.drop("rank"), on="_r", how="left")
    local = pl.col("ts_ns") - pl.col("offset_ns").fill_null(0)
    drift = (pl.col("drift_ppm").fill_null(0.0) * 1e-6
             * (local - pl.col("drift_epoch_ns").fill_null(0)).cast(pl.Float64)).round(0)
    return lf.with_columns(
        ts_aligned_ns=(local - pl.when(pl.col("drift_ppm").fill_null(0.0) != 0.0)
                       .then(drift).otherwise(0.0).cast(pl.Int64))
    ).drop("_r", "offset_ns", "drift_ppm", "drift_epoch_ns")
