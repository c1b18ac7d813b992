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
from dataclasses import dataclass

import polars as pl

from traceview.analyses.collective_match import (
    BLOCKING,
    P2P,
    MatchResult,
)
from traceview.errors import UsageError

METHODS: tuple[str, ...] = ("auto", "none", "host", "collectives")

OFFSETS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "offset_ns": pl.Int64, "drift_ppm": pl.Float64,
    "uncertainty_ns": pl.Int64, "anchors": pl.Int64, "method": pl.String, "host": pl.String,
    "drift_epoch_ns": pl.Int64, "residual_ns": pl.Int64, "causal_low_ns": pl.Int64,
    "causal_high_ns": pl.Int64, "note": pl.String, "quality": pl.String,
    "effective_anchors": pl.Float64, "disagreement_ns": pl.Int64,
}

#: ``quality`` values, best first (rule in ``docs/metrics.md``, section *Alignment*).
QUALITIES: tuple[str, ...] = ("good", "fair", "poor", "none")
#: Fewer effective (independent) anchors than this: ``poor``; fewer than ``FAIR_ANCHORS``: ``fair``.
POOR_ANCHORS = 3.0
FAIR_ANCHORS = 10.0
#: Below this many anchors their independence cannot be tested (no autocorrelation): ``poor``.
MIN_ANCHORS = 4

#: Two per-rank offsets on one host that differ by less than this (plus 3x their uncertainty)
#: are taken as one shared clock.
HOST_FLOOR_NS = 20_000
#: A drift slope is applied only when it exceeds this many standard errors, with this many
#: anchors at least.
DRIFT_SIGMAS = 4.0
DRIFT_MIN_ANCHORS = 12


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
    not enqueue-only CPU ops. Columns: instance, rank, collective, ts_ns, end_ns, blocking."""
    inst = match.instances
    return (
        inst.filter(~pl.col("collective").is_in(list(P2P)) & ~pl.col("enqueue_only"))
        .filter(pl.col("rank").n_unique().over("instance") >= 2)
        .select("instance", "rank", "collective", "ts_ns", "end_ns",
                blocking=pl.col("collective").is_in(list(BLOCKING)))
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

    per_rank = _solve(anchors, {r: f"rank {r}" for r in anchored}, reference_rank)
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
    import numpy as np  # here, not at the top: the CLI loads this module for every command
    wide = x.pivot(on="rank", index="instance", values="x", aggregate_function="first")
    inst = wide.get_column("instance")
    rank_cols = [c for c in wide.columns if c != "instance"]
    mat = wide.select(rank_cols).cast(pl.Float64).to_numpy()
    clock_of = dict(x.select(pl.col("rank").cast(pl.String), "clock").unique().rows())
    clocks = sorted(set(clock_of.values()))
    cols = {c: [i for i, r in enumerate(rank_cols) if clock_of[r] == c] for c in clocks}
    off = {c: 0.0 for c in clocks}
    big_e = np.zeros(mat.shape[0])
    for _ in range(iters):
        o_vec = np.array([off[clock_of[r]] for r in rank_cols])
        big_e = np.nanmedian(mat - o_vec, axis=1)
        new = {c: float(np.nanmedian(mat[:, cols[c]] - big_e[:, None])) for c in clocks}
        ref = new[ref_clock]
        new = {c: v - ref for c, v in new.items()}
        delta = max(abs(new[c] - off[c]) for c in clocks)
        off = new
        if delta < 0.25:
            break
    o_vec = np.array([off[clock_of[r]] for r in rank_cols])
    big_e = np.nanmedian(mat - o_vec, axis=1)
    return off, pl.DataFrame({"instance": inst, "E": big_e})


def _solve(anchors: pl.DataFrame, clock_of: dict[int, str], reference_rank: int) -> dict:
    """Offsets, drift, uncertainty and causality bounds per rank for a rank -> clock map."""
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
    errors = _clock_errors(a, ref_clock, t0)
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
            quality, why = alignment_quality(err, moved=moved, contradicted=contradicted)
        offset = int(base_of[c] - ref_base) + math.floor(o + 0.5)
        out[r] = {
            "offset": offset,
            "drift_ppm": (drift.get(c, 0.0) - drift.get(ref_clock, 0.0)) * 1e6,
            "uncertainty": unc,
            "anchors": int(a.filter(pl.col("rank") == r).height),
            "epoch": int(ref_base + round(t0)),
            "residual": int(round(err.residual)),
            "low": None if lo is None else int(math.floor(offset + lo)),
            "high": None if hi is None else int(math.ceil(offset + hi)),
            "note": note, "quality": quality, "why": why,
            "n_eff": None if c == ref_clock else round(err.n_eff, 1),
            "disagreement": None if c == ref_clock else int(round(err.disagreement)),
        }
    return out


@dataclass(frozen=True)
class ClockError:
    """What the anchors of one clock say about the error of its offset (all in ns).

    ``d`` below is, per anchor instance, this clock's aligned completion minus the reference
    clock's: its scatter is the noise of *both* clocks, which the residuals of the joint median
    fit understate (with two ranks they are exactly half of it).
    """

    n: int                 # anchor instances shared with the reference clock
    n_eff: float           # independent anchors: n (1 - rho) / (1 + rho), rho = lag-1 autocorr.
    spread: float          # 1.4826 MAD(d): scatter of one completion difference
    residual: float        # 1.4826 MAD of the fit residuals (``residual_ns``, as before)
    statistical: float     # 1.2533 spread / sqrt(n_eff): standard error of the median
    floor: float           # spread: an exit-order bias as large as the completion scatter
    disagreement: float    # largest excess of a kind's / a half's median over the others
    disagree_with: str     # which anchors disagree ("" when none)
    drift_term: float      # slope standard error x half the anchors' span

    @staticmethod
    def none() -> ClockError:
        return ClockError(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "", 0.0)


def _clock_errors(a: pl.DataFrame, ref_clock: str, t0: float) -> dict[str, ClockError]:
    """One :class:`ClockError` per clock other than the reference, from the solved anchors
    ``a`` (columns instance, clock, collective, ea = aligned end, E, resid)."""
    per = a.group_by("instance", "clock").agg(
        y=pl.col("ea").median(), t=pl.col("E").first() - t0, kind=pl.col("collective").first(),
        resid=pl.col("resid").median())
    ref = per.filter(pl.col("clock") == ref_clock).select("instance", ref_y="y")
    per = per.filter(pl.col("clock") != ref_clock).join(ref, on="instance", how="left")
    out: dict[str, ClockError] = {}
    for (clock,), g in per.group_by("clock"):
        shared = g.filter(pl.col("ref_y").is_not_null())
        if shared.height:
            d = shared.select(d=pl.col("y") - pl.col("ref_y"), t="t", kind="kind")
        else:  # no instance shared with the reference: the residual is half a difference
            d = g.select(d=pl.col("resid") * math.sqrt(2.0), t="t", kind="kind")
        d = d.sort("t")
        resid = g.get_column("resid").to_numpy()
        out[clock] = clock_error(d.get_column("d").to_numpy(), d.get_column("t").to_numpy(),
                                 d.get_column("kind").cast(pl.String).to_list(), resid)
    return out


def clock_error(d, t, kinds: list[str], resid=None) -> ClockError:
    """:class:`ClockError` from completion differences ``d`` to the reference (time order),
    their times ``t`` and collective names ``kinds``."""
    import numpy as np
    d = np.asarray(d, dtype=float)
    t = np.asarray(t, dtype=float)
    n = len(d)
    if n == 0:
        return ClockError.none()
    med = float(np.median(d))
    spread = 1.4826 * float(np.median(np.abs(d - med)))
    residual = (1.4826 * float(np.median(np.abs(resid - np.median(resid))))
                if resid is not None and len(resid) else spread / 2)
    n_eff = _effective_anchors(d, med, spread)
    # A scale read off a few anchors is itself uncertain and the MAD of few values runs low:
    # below FAIR_ANCHORS correct it (Croux-Rousseeuw, n / (n - 0.8)) and widen it by
    # Student's t over the normal quantile for n_eff - 1 degrees of freedom.
    scale = spread
    if n_eff < FAIR_ANCHORS and n >= 2:
        scale = spread * n / (n - 0.8) * _t_over_z(n_eff - 1)
    statistical = 1.2533 * scale / math.sqrt(n_eff)
    disagreement, label = _disagreement(d, t, kinds, med, spread * math.sqrt(n / n_eff))
    # Floor: a fixed exit-order bias between this rank and the reference as large as their
    # completion scatter; no residual can show it (s / sqrt(2) covered only 94% of such runs).
    return ClockError(n, n_eff, spread, residual, statistical, scale,
                      disagreement, label, _drift_term(d, t, med, spread, n / n_eff))


def _t_over_z(dof: float) -> float:
    """Student's t 97.5% quantile over the normal one (Cornish-Fisher, two terms)."""
    nu = max(dof, 1.0)
    z = 1.959964
    t = z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
    return t / z


def _effective_anchors(d, med: float, spread: float) -> float:
    """Anchors close in time share noise (one slow step delays every exit in it): the
    variance of a mean of AR(1) noise is that of n (1 - rho) / (1 + rho) independent ones."""
    import numpy as np
    n = len(d)
    if n < 4 or spread <= 0:
        return float(n)
    w = np.clip(d, med - 3 * spread, med + 3 * spread)  # one outlier must not set rho
    w = w - w.mean()
    den = float(np.dot(w, w))
    rho = float(np.dot(w[:-1], w[1:])) / den if den > 0 else 0.0
    rho = min(max(rho, 0.0), 0.9)
    return max(1.0, n * (1 - rho) / (1 + rho))


def _disagreement(d, t, kinds: list[str], med: float, spread: float) -> tuple[float, str]:
    """Largest excess of a group's median over the overall one, beyond twice the group's own
    standard error. Groups: each collective kind, the first and second half in time. A bias
    that one kind of anchor has (a barrier exits in a fixed rank order, an all-reduce does
    not) or that changes in time (drift, a clock step) shows here; residuals cannot see it."""
    import numpy as np
    kinds_arr = np.asarray(kinds, dtype=object)
    groups = [(f"{k} anchors", kinds_arr == k) for k in sorted(set(kinds))] if len(
        set(kinds)) > 1 else []
    if len(t) >= 6:
        mid = float(np.median(t))
        groups += [("first half", t < mid), ("second half", t >= mid)]
    best, label = 0.0, ""
    for name, mask in groups:
        m = int(mask.sum())
        if m < 3:
            continue
        excess = abs(float(np.median(d[mask])) - med) - 2 * 1.2533 * spread / math.sqrt(m)
        if excess > best:
            best, label = excess, name
    return best, label


def _drift_term(d, t, med: float, spread: float, inflate: float) -> float:
    """Standard error of a line through ``d`` against time times half the span: how far the
    offset may be off at the ends of the trace because drift is (or is not) corrected."""
    import numpy as np
    if len(d) < DRIFT_MIN_ANCHORS:
        return 0.0
    keep = np.abs(d - med) <= max(4 * spread, 1.0)
    tt, dd = t[keep], d[keep]
    if len(dd) < DRIFT_MIN_ANCHORS or np.ptp(tt) <= 0:
        return 0.0
    slope, icept = np.polyfit(tt, dd, 1)
    res = dd - (slope * tt + icept)
    se = math.sqrt(float(np.sum(res**2)) / max(len(dd) - 2, 1) * inflate) / math.sqrt(
        float(np.sum((tt - tt.mean()) ** 2)))
    return se * float(np.ptp(tt)) / 2


def calibrated_uncertainty(err: ClockError, *, moved: float = 0.0, low: float | None = None,
                           high: float | None = None) -> int:
    """``uncertainty_ns`` of one clock: the error of its offset at one standard deviation,
    so that 3x covers the truth (derivation in ``docs/metrics.md``, *Alignment*).

    >>> calibrated_uncertainty(ClockError(25, 25.0, 1000.0, 500.0, 250.66, 707.1, 0.0, "", 0.0))
    751
    """
    unc = math.sqrt(err.statistical**2 + err.floor**2 + err.disagreement**2 + err.drift_term**2)
    # The end median was moved to a causal bound: the ends are biased by at least that much.
    unc = max(unc, moved)
    if low is not None and high is not None:
        half_window = max(-low, high)
        if err.n < MIN_ANCHORS or err.n_eff < POOR_ANCHORS:
            # Two or three anchors cannot measure their own noise (two equal ones give a
            # scatter of 0): the causal window is the only bound the data support.
            unc = max(unc, half_window)
        # Causality is a hard bound on the truth, but it is itself read off noisy starts and
        # ends: widen the window by one completion scatter before it caps anything.
        unc = min(unc, half_window + err.spread)
    return int(math.ceil(unc - 1e-9))


def alignment_quality(err: ClockError, *, moved: float = 0.0,
                      contradicted: bool = False) -> tuple[str, str]:
    """``(quality, why)`` of one clock's offset: ``poor`` with fewer than 4 anchors or fewer
    than 3 independent ones,
    contradicted causality or anchors that disagree by more than 3x the statistical error;
    ``fair`` with fewer than 10, any significant disagreement or a causal move; else
    ``good``. ``why`` is "" for good, else the reason (it goes into ``note``).

    >>> alignment_quality(ClockError(2, 2.0, 10.0, 5.0, 8.9, 7.1, 0.0, "", 0.0))
    ('poor', 'quality poor: 2.0 effective anchors (of 2)')
    """
    few = f"{err.n_eff:.1f} effective anchors (of {err.n})"
    noise = math.hypot(err.statistical, err.floor)
    disagree = (f"{err.disagree_with} disagree with the rest by "
                f"{err.disagreement:.0f} ns beyond their noise")
    if err.n < MIN_ANCHORS or err.n_eff < POOR_ANCHORS:
        return "poor", f"quality poor: {few}"
    if contradicted:
        return "poor", "quality poor: causality contradicted"
    if err.disagreement > 3 * noise:
        return "poor", f"quality poor: {disagree}"
    if err.n_eff < FAIR_ANCHORS:
        return "fair", f"quality fair: {few}"
    if err.disagreement > 0:
        return "fair", f"quality fair: {disagree}"
    if moved > 0:
        return "fair", "quality fair: the completions violated causality"
    return "good", ""


def alignment_warnings(offsets: pl.DataFrame) -> list[str]:
    """One warning per rank whose alignment quality is ``poor`` (ranks with ``none`` are
    warned about by their note already). For ``Run.table_warnings``."""
    if "quality" not in offsets.columns:
        return []
    bad = offsets.filter(pl.col("quality") == "poor").select(
        "rank", "offset_ns", "uncertainty_ns", "note")
    return [f"alignment: rank {r}: poor clock alignment, offset {off} ns +- {unc} ns "
            f"(cross-rank times with this rank can be off by up to {3 * (unc or 0)} ns): "
            f"{note}" for r, off, unc, note in bad.rows()]


def _fit_drift(a: pl.DataFrame, off: dict[str, float], big_e: pl.DataFrame, t0: float,
               ref_clock: str) -> dict[str, float]:
    """Per-clock slope of the end residuals against time; 0 unless significant."""
    import numpy as np
    t = a.with_columns(o=pl.col("clock").replace_strict(off, return_dtype=pl.Float64)).join(
        big_e, on="instance").with_columns(y=pl.col("x") - pl.col("o") - pl.col("E"),
                                           u=pl.col("E") - t0)
    slopes: dict[str, float] = {}
    for (clock,), g in t.group_by("clock"):
        slopes[clock] = 0.0
        if g.height < DRIFT_MIN_ANCHORS:
            continue
        y = g.get_column("y").to_numpy()
        u = g.get_column("u").to_numpy()
        med = np.median(y)
        mad = 1.4826 * np.median(np.abs(y - med))
        keep = np.abs(y - med) <= max(4 * mad, 1.0)
        if keep.sum() < DRIFT_MIN_ANCHORS or np.ptp(u[keep]) <= 0:
            continue
        uu, yy = u[keep], y[keep]
        slope, icept = np.polyfit(uu, yy, 1)
        res = yy - (slope * uu + icept)
        se = math.sqrt(float(np.sum(res**2)) / max(len(yy) - 2, 1)) / (
            math.sqrt(float(np.sum((uu - uu.mean()) ** 2))) or 1.0)
        if abs(slope) > DRIFT_SIGMAS * se and abs(slope) > 1e-9:
            slopes[clock] = float(slope)
    ref = slopes.get(ref_clock, 0.0)
    if all(v == 0.0 for k, v in slopes.items() if k != ref_clock):
        return {k: 0.0 for k in slopes}
    return {k: v - ref for k, v in slopes.items()}


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
    pairs = per.join(per, on="instance", suffix="_o").filter(pl.col("clock") != pl.col("clock_o"))
    bounds = pairs.group_by("instance", "clock").agg(
        other_e_min=pl.col("e_min_o").min(), other_a_max=pl.col("a_max_o").max(),
        own_a=pl.col("a_max").first(), own_e=pl.col("e_min").first())
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
