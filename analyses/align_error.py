"""How wrong a clock offset can be, and how far to trust it: ``uncertainty_ns``, ``quality``.

The offsets themselves come from :mod:`traceview.analyses.align`; this module judges them from
the same anchors. The derivation and the measured calibration are in ``docs/metrics.md``,
section *Alignment*: ``|error| <= 3 x uncertainty_ns`` for at least 95% of ranks.

>>> err = clock_error([100, -100] * 20, list(range(40)), ["all_reduce"] * 40)
>>> round(err.spread, 2), err.n_eff, alignment_quality(err)[0]
(148.26, 40.0, 'good')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from traceview._dependencies import lazy_module

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

#: ``quality`` values, best first (rule in ``docs/metrics.md``, section *Alignment*).
QUALITIES: tuple[str, ...] = ("good", "fair", "poor", "none")
#: Fewer effective (independent) anchors than this: ``poor``; fewer than ``FAIR_ANCHORS``: ``fair``.
POOR_ANCHORS = 3.0
FAIR_ANCHORS = 10.0
#: Below this many anchors their independence cannot be tested: a lag-1 autocorrelation of
#: fewer than 8 values cannot rule out that they all share one slow step (a 3-rank run with
#: its 4 anchors in one step was off by 1 us against a stated +-0.2 us), so: ``poor``.
MIN_ANCHORS = 8

#: A drift slope needs this many anchors at least (here: for the drift term).
DRIFT_MIN_ANCHORS = 12


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


def median(values) -> float:
    """``np.median`` of a 1-D array, without its generic machinery (~60 us a call against ~2
    here; ~11 calls per clock, ~3 s of a 5,000-rank alignment). NaN when any value is.

    >>> median(np.array([3.0, 1.0, 2.0])), median(np.array([4.0, 1.0, 2.0, 3.0]))
    (2.0, 2.5)
    """
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    if n == 0 or np.isnan(ordered[-1]):
        return float("nan")
    mid = n // 2
    return float(ordered[mid]) if n % 2 else float((ordered[mid - 1] + ordered[mid]) / 2)


def clock_errors(a: pl.DataFrame, ref_clock: str, t0: float) -> dict[str, ClockError]:
    """One :class:`ClockError` per clock other than the reference, from the solved anchors
    ``a`` (columns instance, clock, collective, ea = aligned end, E, resid)."""
    per = a.group_by("instance", "clock").agg(
        y=pl.col("ea").median(), t=pl.col("E").first() - t0, kind=pl.col("collective").first(),
        resid=pl.col("resid").median())
    ref = per.filter(pl.col("clock") == ref_clock).select("instance", ref_y="y")
    per = per.filter(pl.col("clock") != ref_clock).join(ref, on="instance", how="left")
    shared = pl.col("ref_y").is_not_null().any().over("clock")
    # Every clock's differences in one frame, gathered per clock by one group_by: a filter,
    # select and sort per clock cost ~1 ms each, 5 s for 5,000 ranks.
    diffs = per.filter(pl.col("ref_y").is_not_null() | ~shared).select(
        "clock", "t", kind=pl.col("kind").cast(pl.String),
        # no instance shared with the reference: the residual is half a difference
        d=pl.when(shared).then(pl.col("y") - pl.col("ref_y"))
        .otherwise(pl.col("resid") * math.sqrt(2.0)),
    ).sort("clock", "t").group_by("clock", maintain_order=True).agg("d", "t", "kind")
    resid_of = dict(per.group_by("clock").agg("resid").rows())
    rows = diffs.rows()
    # Clocks with as many anchors (and residuals) are worked out together, row by row of one
    # matrix: one clock at a time cost ~0.7 ms of numpy calls on ~20 values, 3.5 s for 5,000
    # ranks (docs/performance.md, log 44). ``clock_error`` is the definition; a property
    # test holds the two equal.
    alike: dict[tuple[int, int], list[int]] = {}
    for i, (clock, d, _, _) in enumerate(rows):
        alike.setdefault((len(d), len(resid_of[clock])), []).append(i)
    found: dict[str, ClockError] = {}
    for members in alike.values():
        errors = clock_errors_alike(
            np.array([rows[i][1] for i in members], dtype=float),
            np.array([rows[i][2] for i in members], dtype=float),
            [rows[i][3] for i in members],
            np.array([resid_of[rows[i][0]] for i in members], dtype=float))
        found.update(zip((rows[i][0] for i in members), errors, strict=True))
    return {clock: found[clock] for clock, *_ in rows}


def clock_errors_alike(d, t, kinds: list[list[str]], resid) -> list[ClockError]:
    """:func:`clock_error` of each row of ``d`` (clocks x anchors), ``t`` and ``kinds``, with
    ``resid`` (clocks x residuals), computed for all rows together."""
    clocks, n = d.shape
    if n == 0:
        return [ClockError.none()] * clocks
    med = median_rows(d)
    spread = 1.4826 * median_rows(np.abs(d - med[:, None]))
    if resid.shape[1]:
        residual = 1.4826 * median_rows(np.abs(resid - median_rows(resid)[:, None]))
    else:
        residual = spread / 2
    n_eff = _effective_anchors_rows(d, med, spread)
    scale = spread.copy()
    if n >= 2:
        few = n_eff < FAIR_ANCHORS
        scale[few] = spread[few] * n / (n - 0.8) * _t_over_z_rows(n_eff[few] - 1)
    statistical = 1.2533 * scale / np.sqrt(n_eff)
    inflate = n / n_eff
    disagreement, labels = _disagreement_rows(d, t, kinds, med, spread * np.sqrt(inflate))
    return [ClockError(n, float(n_eff[i]), float(spread[i]), float(residual[i]),
                       float(statistical[i]), float(scale[i]), float(disagreement[i]),
                       labels[i], _drift_term(d[i], t[i], float(med[i]), float(spread[i]),
                                              float(inflate[i])))
            for i in range(clocks)]


def nanmedian_rows(mat):
    """``np.nanmedian(mat, axis=1)`` (NaN for a row without a value) by one sort: numpy's
    goes through masked arrays on narrow rows, ~5x slower (150 against 30 us on 200 x 8),
    and ``align._alternate`` calls it once per iteration, up to 100 iterations.

    >>> nanmedian_rows(np.array([[3.0, np.nan, 1.0], [np.nan] * 3, [4.0, 1.0, 2.0]])).tolist()
    [2.0, nan, 2.0]
    """
    ordered = np.sort(mat, axis=1)  # NaN last
    n = (~np.isnan(mat)).sum(axis=1)
    lo = np.take_along_axis(ordered, np.maximum(n - 1, 0)[:, None] // 2, axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (n // 2)[:, None], axis=1)[:, 0]
    return np.where(n > 0, (lo + hi) / 2, np.nan)


def median_rows(values, mask=None):
    """:func:`median` of each row of a 2-D array, of the values where ``mask`` holds when it
    is given: NaN for a row holding NaN there, or nothing."""
    held = np.isnan(values) if mask is None else np.isnan(values) & mask
    kept = values if mask is None else np.where(mask, values, np.nan)
    return np.where(held.any(axis=1), np.nan, nanmedian_rows(kept))


def _t_over_z_rows(dof):
    """Student's t 97.5% quantile over the normal one (Cornish-Fisher, two terms), of each
    value of ``dof``: the one definition :func:`_t_over_z` takes too, so the rows of
    clock_errors_alike equal clock_error exactly (two copies, one with ``nu**2`` in Python's
    float power and one in numpy's square, rounded apart in the last place)."""
    nu = np.maximum(dof, 1.0)
    z = 1.959964
    t = z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * (nu * nu))
    return t / z


def _effective_anchors_rows(d, med, spread):
    """:func:`_effective_anchors` of each row of ``d``."""
    clocks, n = d.shape
    n_eff = np.full(clocks, float(n))
    if n < 4:
        return n_eff
    w = np.clip(d, (med - 3 * spread)[:, None], (med + 3 * spread)[:, None])
    w = w - w.mean(axis=1, keepdims=True)
    for i in np.flatnonzero(~(spread <= 0)):  # the dots as np.dot gives them, row by row
        den = float(np.dot(w[i], w[i]))
        rho = float(np.dot(w[i, :-1], w[i, 1:])) / den if den > 0 else 0.0
        rho = min(max(rho, 0.0), 0.9)
        n_eff[i] = max(1.0, n * (1 - rho) / (1 + rho))
    return n_eff


def _disagreement_rows(d, t, kinds: list[list[str]], med, spread) -> tuple[list[float], list[str]]:
    """:func:`_disagreement` of each row: the groups' medians with the rows' other values
    set aside (sorted past the end as +inf), the first largest excess kept."""
    clocks, n = d.shape
    groups: list[tuple[str, object]] = []
    codes = np.array(kinds, dtype=object).reshape(clocks, n)
    several = np.array([len(set(row)) > 1 for row in kinds])
    for k in sorted({k for row in kinds for k in row}):
        groups.append((f"{k} anchors", (codes == k) & several[:, None]))
    if n >= 6:
        mid = median_rows(t)
        groups += [("anchors of the first half", t < mid[:, None]),
                   ("anchors of the second half", t >= mid[:, None])]
    best = np.zeros(clocks)
    label = np.full(clocks, -1)
    for g, (_, mask) in enumerate(groups):
        m = mask.sum(axis=1)
        group_median = median_rows(d, mask)
        with np.errstate(divide="ignore", invalid="ignore"):
            excess = np.abs(group_median - med) - 2 * 1.2533 * spread / np.sqrt(m)
        better = (m >= 3) & (excess > best)
        best = np.where(better, excess, best)
        label = np.where(better, g, label)
    return best.tolist(), [groups[g][0] if g >= 0 else "" for g in label.tolist()]



def clock_error(d, t, kinds: list[str], resid=None) -> ClockError:
    """:class:`ClockError` from completion differences ``d`` to the reference (time order),
    their times ``t`` and collective names ``kinds``."""
    d = np.asarray(d, dtype=float)
    t = np.asarray(t, dtype=float)
    n = len(d)
    if n == 0:
        return ClockError.none()
    med = float(median(d))
    spread = 1.4826 * float(median(np.abs(d - med)))
    residual = (1.4826 * float(median(np.abs(resid - median(resid))))
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
    """:func:`_t_over_z_rows` of one value."""
    return float(_t_over_z_rows(dof))


def _effective_anchors(d, med: float, spread: float) -> float:
    """Anchors close in time share noise (one slow step delays every exit in it): the
    variance of a mean of AR(1) noise is that of n (1 - rho) / (1 + rho) independent ones."""
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
    kinds_arr = np.asarray(kinds, dtype=object)
    groups = [(f"{k} anchors", kinds_arr == k) for k in sorted(set(kinds))] if len(
        set(kinds)) > 1 else []
    if len(t) >= 6:
        mid = float(median(t))
        groups += [("anchors of the first half", t < mid),
                   ("anchors of the second half", t >= mid)]
    best, label = 0.0, ""
    for name, mask in groups:
        m = int(mask.sum())
        if m < 3:
            continue
        excess = abs(float(median(d[mask])) - med) - 2 * 1.2533 * spread / math.sqrt(m)
        if excess > best:
            best, label = excess, name
    return best, label


def _drift_term(d, t, med: float, spread: float, inflate: float) -> float:
    """Standard error of a line through ``d`` against time times half the span: how far the
    offset may be off at the ends of the trace because drift is (or is not) corrected."""
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


def alignment_quality(err: ClockError, *, moved: float = 0.0, contradicted: bool = False,
                      time_matched: bool = False) -> tuple[str, str]:
    """``(quality, why)`` of one clock's offset: ``poor`` with fewer than ``MIN_ANCHORS`` (8)
    anchors or fewer than 3 independent ones, most anchors paired by completion time (the
    pairing assumed offsets close to the ones it then yields, so small residuals prove little:
    a pairing shifted by one call would agree with itself as well),
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
    if time_matched:
        return "poor", ("quality poor: most anchors were paired by completion time (the call "
                        "order contradicted itself), so the offset rests on the pairing it "
                        "assumed")
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
