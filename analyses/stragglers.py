"""Which rank holds the others back, and by how much: name-agnostic straggler detection.

Works on matched collective instances of any implementation (``ncclKernel_*``,
``ncclDevKernel_*``, gloo work items, custom kernels with NCCL in the name), on the aligned
timeline. Per rank (definitions and a worked example in ``docs/metrics.md``, *Stragglers*):

* ``last_arrivals``: instances at which the rank arrived last;
* ``imposed_wait_ns``: sum over those instances of its lateness behind the second-to-last
  arrival, the time every other rank spent waiting for it alone (the union of those
  intervals: collectives in flight together, like DDP buckets, are counted once);
* ``compute_before_ns``: sum of its busy time before each collective (own arrival minus the
  end of its previous collective), and ``compute_ratio`` against the median rank;
* ``step_time_ns``: its median ``ProfilerStep`` duration, ``step_ratio`` against the median.

A rank is **flagged** only when all of these hold (each is reported, so a person can see why):

1. *significant lateness*: an instance counts only when the last arrival leads the
   second-to-last by more than ``max(2 x alignment uncertainty, 1% of the median step time,
   50 us)`` (below that, who is last is noise);
2. *persistence*: the rank is last at >= ``min_share`` of those significant instances, or
   holds >= ``min_share`` of all the imposed wait (near-ties decided by noise cannot then hide
   a rank that causes nearly all the waiting), and is last at least ``min_instances`` times;
3. *effect size*: its imposed wait per step is >= ``min_effect`` of the median step time
   (without steps: of the span covered by the collectives);
4. *leave-one-out dominance*: its imposed wait is >= ``dominance`` x the median of the
   other ranks' (robust on 2 ranks, where median/MAD across ranks degenerates).

A balanced run fails 1-3 for every rank, so nobody is flagged.
"""

from __future__ import annotations

import bisect
import math

import polars as pl

from traceview.analyses.collective_match import P2P
from traceview.analyses.dependency_graph import culprits, sync_points
from traceview.analyses.intervals import total_length, union

RESULT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "flagged": pl.Boolean, "imposed_wait_ns": pl.Int64,
    "imposed_wait_per_step_ns": pl.Int64, "last_arrivals": pl.Int64,
    "significant_last_arrivals": pl.Int64, "significant_instances": pl.Int64,
    "instances": pl.Int64, "wait_suffered_ns": pl.Int64, "compute_before_ns": pl.Int64,
    "compute_ratio": pl.Float64, "step_time_ns": pl.Int64, "step_ratio": pl.Float64,
    "steps": pl.Int64, "effect": pl.Float64, "explanation": pl.String,
    "median_imposed_wait_per_step_ns": pl.Int64, "steps_last": pl.Int64,
    "steps_compared": pl.Int64, "noise_floor_ns": pl.Int64, "confidence": pl.String,
    "confidence_score": pl.Float64,
    # culprit, not victim (analyses.dependency_graph): the lateness the rank's own time caused,
    # wherever it surfaced, and the lateness it only passed on
    "caused_wait_ns": pl.Int64, "caused_wait_per_step_ns": pl.Int64,
    "median_caused_wait_per_step_ns": pl.Int64, "culprit_instances": pl.Int64,
    "inherited_wait_ns": pl.Int64, "steps_culprit": pl.Int64, "verdict": pl.String,
    "evidence_steps": pl.List(pl.Int64), "evidence_instances": pl.List(pl.String),
    # the verdict's one short reason (``explanation`` has the evidence)
    "reason": pl.String,
}

#: A lead counts as "clear" when above this many times the run's own arrival noise (the
#: median spread of the non-last ranks' arrivals at an instance).
NOISE_MULTIPLE = 1.5
#: A straggler is last, by a clear lead, in at least this share of the steps compared.
MIN_STEP_SHARE = 0.5
#: A flag needs a consistency score (``_consistency``) of at least this: the lead recurs in
#: more steps than chance would make it, at the 10% level.
SURE_SCORE = 0.9
#: Verdicts resting on fewer steps than this are low confidence.
MIN_STEPS_FOR_CONFIDENCE = 4

LATENESS_FLOOR_NS = 50_000
#: The largest instances a verdict's evidence lists by name.
EVIDENCE_INSTANCES = 10


def stragglers(
    collective_rows: pl.DataFrame,
    host_steps: pl.DataFrame,
    ranks: pl.DataFrame,
    *,
    p2p_rows: pl.DataFrame | None = None,
    graph: pl.DataFrame | None = None,
    min_effect: float = 0.05,
    min_share: float = 0.75,
    min_instances: int = 3,
    dominance: float = 3.0,
) -> pl.DataFrame:
    """One row per rank of ``ranks`` (``RESULT_SCHEMA``), largest ``imposed_wait_ns`` first.

    ``collective_rows``: :func:`~traceview.analyses.collectives.collective_ranks` on the
    aligned timeline (raw clocks are only right when all ranks share one clock);
    ``host_steps``: :func:`~traceview.analyses.window.step_spans`; ``p2p_rows``:
    :func:`~traceview.analyses.p2p.p2p_sync_rows` (aligned), the send/recv pairs, through
    which a receiver waits for its sender; ``graph``: the dependency graph's culprits
    (:func:`~traceview.analyses.dependency_graph.culprits` of these rows) when the caller has
    built it already (the Run shares one), else built here.
    """
    per = collective_rows.filter(~pl.col("collective").is_in(list(P2P)))
    if p2p_rows is not None and p2p_rows.height and per.height == 0:
        per = p2p_rows.with_columns(uncertainty_ns=pl.lit(0, pl.Int64),
                                    wait_ns=pl.col("last_arrival_ns") - pl.col("arrival_ns"))
    steps = host_steps
    ranks_all = ranks.get_column("rank").cast(pl.Int32).to_list()
    if per.height == 0:
        return _empty_rows(ranks_all, "no collective was matched across ranks: nothing to "
                                      "compare (single rank, CPU-only without comms, or "
                                      "ranks profiled over disjoint windows)")
    step_by_rank = steps.group_by("rank").agg(
        step_time_ns=pl.col("step_time_ns").median().round(0).cast(pl.Int64),
        steps=pl.len()).with_columns(pl.col("rank").cast(pl.Int32))
    median_step = step_by_rank.get_column("step_time_ns").median() if steps.height else None
    n_steps = int(step_by_rank.get_column("steps").median()) if steps.height else None
    unc = int(per.get_column("uncertainty_ns").max() or 0)
    spread = per.group_by("instance").agg(
        s=pl.col("arrival_ns").sort(descending=True).slice(1).max()
        - pl.col("arrival_ns").min()).get_column("s").median()
    floor = max(2 * unc, LATENESS_FLOOR_NS,
                int(0.01 * median_step) if median_step else 0,
                int(NOISE_MULTIPLE * spread) if spread else 0)

    # one row per instance (collectives and send/recv pairs) from the dependency graph: its
    # last arriver's lead over the others that waited, and whose own time caused it
    if graph is None:
        graph = culprits(sync_points(per.filter(~pl.col("collective").is_in(list(P2P))),
                                     p2p_rows))
    inst = graph.with_columns(
        significant=pl.col("lateness_ns") > floor)
    inst = _with_step(inst, steps)
    per_step = _per_step(inst, ranks_all, floor, by="last_rank").join(
        _per_step(inst, ranks_all, floor, by="culprit_rank").rename(
            {"median_imposed_wait_per_step_ns": "median_caused_wait_per_step_ns",
             "steps_last": "steps_culprit"}).drop("steps_compared"), on="rank")
    n_sig = int(inst.get_column("significant").sum())
    span = int(inst.get_column("end_ns").max() - inst.get_column("first_ns").min())

    by_last = inst.group_by("last_rank").agg(
        last_arrivals=pl.len(),
        significant_last_arrivals=pl.col("significant").sum().cast(pl.Int64),
        inherited_wait_ns=pl.col("lateness_ns").filter(
            pl.col("culprit_rank").is_null() | (pl.col("culprit_rank") != pl.col("last_rank")))
        .sum(),
    ).rename({"last_rank": "rank"})
    by_culprit = inst.filter(pl.col("culprit_rank").is_not_null()).group_by("culprit_rank").agg(
        culprit_instances=pl.col("significant").sum().cast(pl.Int64),
        names=pl.col("collective").filter(pl.col("significant")).unique().sort(),
        # instances before the first step are compared as one unit (step -1), but are in
        # no step to name
        evidence_steps=pl.col("step").filter(pl.col("significant") & (pl.col("step") >= 0))
        .unique().sort().cast(pl.Int64),
        evidence_instances=pl.col("instance").filter(pl.col("significant"))
        .sort_by(pl.col("lateness_ns").filter(pl.col("significant")), descending=True)
        .head(EVIDENCE_INSTANCES),
    ).rename({"culprit_rank": "rank"})
    # Imposed wait: lateness intervals of the rank's last arrivals; caused wait: of the
    # instances whose lateness its own time caused. Concurrent ones (DDP buckets in flight
    # together, a TP wait and the DP wait it causes) are counted once.
    by_last = by_last.join(_wait_union(inst, "last_rank", "imposed_wait_ns"), on="rank",
                           how="left")
    by_culprit = by_culprit.join(_wait_union(inst, "culprit_rank", "caused_wait_ns"), on="rank",
                                 how="left")
    before = (
        per.sort("rank", "arrival_ns")
        .with_columns(prev_end=pl.col("end_ns").shift(1).over("rank"))
        .with_columns(gap=(pl.col("arrival_ns") - pl.col("prev_end")).clip(0))
        .group_by("rank").agg(
            instances=pl.len(), wait_suffered_ns=pl.col("wait_ns").sum(),
            compute_before_ns=pl.col("gap").sum())
    )
    rows = (
        pl.DataFrame({"rank": ranks_all}, schema={"rank": pl.Int32})
        .join(before, on="rank", how="left")
        .join(by_last, on="rank", how="left")
        .join(by_culprit, on="rank", how="left")
        .join(step_by_rank, on="rank", how="left")
        .join(per_step, on="rank", how="left")
        .with_columns(
            pl.col("last_arrivals", "significant_last_arrivals", "imposed_wait_ns",
                   "instances", "wait_suffered_ns", "compute_before_ns", "caused_wait_ns",
                   "culprit_instances", "inherited_wait_ns").fill_null(0).cast(pl.Int64),
            pl.col("evidence_steps").fill_null([]), pl.col("evidence_instances").fill_null([]))
    )
    med_before = rows.filter(pl.col("instances") > 0).get_column("compute_before_ns").median()
    caused_col = rows.get_column("caused_wait_ns")
    rows = rows.with_columns(
        compute_ratio=_ratio(rows.get_column("compute_before_ns"), med_before)
        if med_before else None,
        step_ratio=_ratio(rows.get_column("step_time_ns"), median_step) if median_step else None,
        imposed_wait_per_step_ns=(pl.col("imposed_wait_ns") // n_steps) if n_steps
        else pl.col("imposed_wait_ns"),
        caused_wait_per_step_ns=(pl.col("caused_wait_ns") // n_steps) if n_steps
        else pl.col("caused_wait_ns"),
        effect=_ratio(_ratio(caused_col, n_steps), median_step) if n_steps and median_step
        else (_ratio(caused_col, span) if span > 0 else pl.lit(0.0)),
        significant_instances=pl.lit(n_sig, pl.Int64),
        noise_floor_ns=pl.lit(floor, pl.Int64),
    )
    caused = dict(rows.select("rank", "caused_wait_ns").rows())
    total_caused = sum(caused.values())
    others_caused = _OthersMedian(caused)
    others_typical = _OthersMedian(dict(rows.select("rank",
                                                    "median_caused_wait_per_step_ns").rows()))
    out = []
    for row in rows.iter_rows(named=True):
        r = row["rank"]
        other_med = others_caused(r)
        k = row["culprit_instances"]
        checks = {
            # Persistent by count, or by weight: noise makes near-ties (e.g. a barrier right
            # after an all-reduce) fall either way, so a rank that causes >= min_share of all
            # the wait over >= min_instances clear instances is persistent too.
            "persistent": n_sig > 0 and k >= min_instances and (
                k / n_sig >= min_share or (total_caused > 0
                                           and row["caused_wait_ns"] / total_caused
                                           >= min_share)),
            "effect": row["effect"] is not None and row["effect"] >= min_effect,
            "dominant": row["caused_wait_ns"] > 0
            and row["caused_wait_ns"] >= dominance * other_med,
            # Noise makes a few steps' waits huge for anyone: the verdict rests on the typical
            # step (median) and on causing the wait in most steps, not on a sum.
            "consistent": row["steps_compared"] > 0
            and row["steps_culprit"] >= MIN_STEP_SHARE * row["steps_compared"]
            and row["median_caused_wait_per_step_ns"] > floor
            and row["median_caused_wait_per_step_ns"]
            >= dominance * others_typical(r),
        }
        score = _consistency(row["steps_culprit"], row["steps_compared"], len(ranks_all))
        # a flag needs the lead to recur more often than chance would make it (a balanced run
        # on a busy machine still has one rank last in most of a few steps)
        checks["beyond_chance"] = score is not None and score >= SURE_SCORE
        flagged = row["instances"] > 0 and all(checks.values())
        names = row.pop("names") or []
        row["flagged"] = flagged
        row["confidence_score"], row["confidence"] = score, _confidence(
            flagged, score, row["steps_compared"])
        # big enough to flag, but the evidence falls short: the verdict is "unsure"
        row["_size"] = checks["effect"] and checks["dominant"] \
            and row["median_caused_wait_per_step_ns"] > floor
        row["explanation"] = _explain(row, flagged, checks, names, n_sig, floor, median_step,
                                      n_steps, min_effect, min_share, unc)
        row["reason"] = _reason(row, flagged, checks, n_sig, min_instances, min_effect, unc)
        out.append(row)
    result = pl.DataFrame(out).select([*[c for c in RESULT_SCHEMA if c != "verdict"], "_size"]) \
        .with_columns(verdict=pl.lit("not a straggler")).cast(RESULT_SCHEMA).sort(
        ["median_caused_wait_per_step_ns", "caused_wait_ns", "imposed_wait_ns", "rank"],
        descending=[True, True, True, False])
    return _with_verdicts(result, floor).select(list(RESULT_SCHEMA))


def _wait_union(inst: pl.DataFrame, by: str, name: str) -> pl.DataFrame:
    """Per rank of column ``by``: the total length of its instances' lateness intervals,
    overlapping ones once."""
    late = union(inst.select(pl.col(by).alias("rank"), "late_from_ns", "late_to_ns"),
                 by=["rank"], start="late_from_ns", end="late_to_ns")
    return total_length(late, by=["rank"], start="late_from_ns", end="late_to_ns", name=name)


def _with_verdicts(rows: pl.DataFrame, floor: int) -> pl.DataFrame:
    """``verdict`` per rank: ``straggler`` (flagged); ``unsure`` for the leading unflagged rank
    when either its caused wait is big enough to flag (effect, dominance, typical step above
    the noise floor) but the evidence falls short (too few instances or steps, or a lead not
    beyond chance), or its lead recurs beyond chance (score >= SURE_SCORE in at least half
    the steps) with a typical caused wait above half the noise floor, but too small to flag.
    Its confidence is then low, never a confident "not a straggler". ``not a straggler``
    otherwise."""
    if rows.height == 0:
        return rows
    flagged = rows.get_column("flagged")
    lead = rows.row(0, named=True)  # sorted: the largest typical caused wait first
    # the lead is consistent beyond chance (binomial score >= 0.9) and its typical step stands
    # out of the noise at least half-way, yet the flag's checks did not all hold
    recurring = (2 * lead["median_caused_wait_per_step_ns"] > floor
                 and lead["steps_culprit"] >= MIN_STEP_SHARE * lead["steps_compared"]
                 and (lead["confidence_score"] or 0) >= SURE_SCORE)
    suspicious = (not flagged.any() and lead["instances"] > 0 and lead["steps_compared"] > 0
                  and lead["caused_wait_ns"] > 0 and (lead["_size"] or recurring))
    verdict = pl.when(pl.col("flagged")).then(pl.lit("straggler")).otherwise(
        pl.lit("not a straggler"))
    if suspicious:
        is_lead = pl.col("rank") == lead["rank"]
        return rows.with_columns(
            verdict=pl.when(is_lead).then(pl.lit("unsure")).otherwise(verdict),
            confidence=pl.when(is_lead).then(pl.lit("low")).otherwise(pl.col("confidence")),
            explanation=pl.when(is_lead).then(
                pl.lit("UNSURE: leads the others but not clearly above the run's noise; ")
                + pl.col("explanation")).otherwise(pl.col("explanation")),
            reason=pl.when(is_lead).then(
                pl.lit("unsure: leads the others, but ") + pl.col("reason"))
            .otherwise(pl.col("reason")))
    return rows.with_columns(verdict=verdict)


class _OthersMedian:
    """``_median`` of the values of every key but one, from one sort (done on first use): a
    new list per rank made the verdicts cost ranks^2 log(ranks)."""

    def __init__(self, values: dict) -> None:
        self._values = values
        self._ordered: list | None = None

    def __call__(self, key: object) -> float:
        if key not in self._values:
            return _median(list(self._values.values()))
        if self._ordered is None:
            self._ordered = sorted(self._values.values())
        ordered = self._ordered
        gone = bisect.bisect_left(ordered, self._values[key])  # equal values: any one of them
        m = len(ordered) - 1

        def at(j: int):
            return ordered[j] if j < gone else ordered[j + 1]

        if m == 0:
            return 0.0
        return float(at(m // 2)) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def _median(values: list[int]) -> float:
    v = sorted(values)
    if not v:
        return 0.0
    return float(v[len(v) // 2]) if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _with_step(inst: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each instance's step: the reference (lowest) rank's step in which it began; without
    steps every instance is its own unit of comparison."""
    if steps.height == 0:
        return inst.with_columns(step=pl.col("first_ns").rank("dense").cast(pl.Int64))
    ref = steps.filter(pl.col("rank") == steps.get_column("rank").min())
    spans = ref.select(pl.col("step").cast(pl.Int64), pl.col("step_start_ns").cast(pl.Int64))
    return inst.sort("first_ns").join_asof(spans.sort("step_start_ns"), left_on="first_ns",
                                           right_on="step_start_ns", strategy="backward"
                                           ).with_columns(pl.col("step").fill_null(-1))


def _per_step(inst: pl.DataFrame, ranks: list[int], floor: int, *,
              by: str = "last_rank") -> pl.DataFrame:
    """Per rank of column ``by`` (the last arriver, or the culprit): its wait in each step
    (lateness intervals of its instances, concurrent ones once), the median over all steps
    compared (zeros included), and the number of steps in which that wait is above the
    noise floor."""
    late = union(inst.select(pl.col(by).alias("rank"), "step", "late_from_ns", "late_to_ns"),
                 by=["rank", "step"],
                 start="late_from_ns", end="late_to_ns")
    waits = total_length(late, by=["rank", "step"], start="late_from_ns", end="late_to_ns",
                         name="wait")
    grid = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int32}).join(
        inst.select(pl.col("step").unique()), how="cross")
    full = grid.join(waits.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "step"],
                     how="left").with_columns(pl.col("wait").fill_null(0))
    return full.group_by("rank").agg(
        median_imposed_wait_per_step_ns=pl.col("wait").median().round(0).cast(pl.Int64),
        steps_last=(pl.col("wait") > floor).sum().cast(pl.Int64),
        steps_compared=pl.len().cast(pl.Int64))


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), each term in log space: ``comb(n, i)`` of a
    2,000-step run (thousands of instances) is too large for a float."""
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return min(1.0, math.fsum(
        math.exp(log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p
                 + (n - i) * log_q) for i in range(k, n + 1)))


def _consistency(k: int, n: int, ranks: int) -> float | None:
    """One minus the chance of a rank causing the wait in ``k`` or more of ``n`` steps if
    every rank were equally likely to (binomial tail, p = 1/ranks): near 1 when the lead is
    too consistent to be chance. None without steps or ranks to compare."""
    if n == 0 or ranks < 2:
        return None
    return round(1.0 - _binomial_tail(k, n, 1.0 / ranks), 4)


def _confidence(flagged: bool, score: float | None, n: int) -> str:
    """How sure the verdict is, from the consistency score: a flag is ``high`` from 0.99,
    ``medium`` from SURE_SCORE (below, nothing is flagged); no flag is ``high`` below 0.75 (no
    rank's lead recurs), ``medium`` below SURE_SCORE, ``low`` above (a recurring lead that
    is too small to flag). ``low`` with fewer than MIN_STEPS_FOR_CONFIDENCE steps."""
    if score is None or n < MIN_STEPS_FOR_CONFIDENCE:
        return "low"
    if flagged:
        return "high" if score >= 0.99 else "medium"
    return "high" if score < 0.75 else "medium" if score < SURE_SCORE else "low"


def _ratio(values: pl.Series, denominator: float) -> pl.Series:
    """``values / denominator``, correctly rounded. Polars divides by a scalar through its
    reciprocal (200625 / 200625.0 gives 0.9999999999999999), and which path a division takes
    depends on how the frame was built, so the same ranks could get ratios one unit apart in
    the last place from a whole trace and from per-rank summaries. A divisor column divides
    exactly."""
    return values / pl.Series([float(denominator)] * len(values), dtype=pl.Float64)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if abs(ns) >= 100_000 else f"{ns / 1e3:.0f} us"


def _explain(row: dict, flagged: bool, checks: dict, names: list[str], n_sig: int, floor: int,
             median_step: float | None, n_steps: int | None, min_effect: float,
             min_share: float, unc: int) -> str:
    r = row["rank"]
    if row["instances"] == 0:
        return f"rank {r} took part in no matched collective"
    what = "/".join(names) if names else "collectives"
    k, n = row["significant_last_arrivals"], n_sig
    per_step = row["imposed_wait_per_step_ns"]
    held = (f"held the others {_ms(per_step)} per step" if n_steps
            else f"held the others {_ms(row['imposed_wait_ns'])} in total")
    parts = [f"rank {r} arrived last at {k} of {n} {what} instances with a clear last "
             f"arrival (lead > {_ms(floor)})",
             f"its own time caused the lead at {row['culprit_instances']} instances"
             + (f" (the others' lateness it passed on, {_ms(row['inherited_wait_ns'])}, was "
                f"caused by another rank)" if row["inherited_wait_ns"] else ""),
             (f"caused {_ms(row['caused_wait_per_step_ns'])} of waiting per step" if n_steps
              else f"caused {_ms(row['caused_wait_ns'])} of waiting in total")
             + f"; {held}"]
    if median_step:
        parts[-1] += f" ({100 * row['effect']:.0f}% of the median step time)"
    if row["compute_ratio"] is not None and math.isfinite(row["compute_ratio"]):
        parts.append(f"its compute before collectives takes {row['compute_ratio']:.1f}x the "
                     f"median rank")
    if row["step_ratio"] is not None:
        parts.append(f"its step time is {row['step_ratio']:.2f}x the median (synchronous "
                     f"collectives equalise step times)")
    parts.append(f"caused a wait above the noise floor ({_ms(floor)}) in "
                 f"{row['steps_culprit']} of {row['steps_compared']} steps, typical step "
                 f"{_ms(row['median_caused_wait_per_step_ns'])}")
    if row["evidence_steps"]:
        parts.append("evidence: steps " + ", ".join(map(str, row["evidence_steps"][:12]))
                     + "; instances " + ", ".join(row["evidence_instances"][:5]))
    text = "; ".join(parts)
    if flagged:
        return "STRAGGLER: " + text
    why = []
    if not checks["persistent"]:
        why.append(f"its own time did not persistently cause the lead (needs >= "
                   f"{min_share:.0%} of clear last arrivals or of all caused wait)")
    if not checks["effect"]:
        why.append(f"effect below {min_effect:.0%} of step time")
    if not checks["dominant"]:
        why.append("causes no more wait than the others")
    if not checks["consistent"]:
        why.append(f"did not cause a clear wait in most steps ({row['steps_culprit']} of "
                   f"{row['steps_compared']}; typical step "
                   f"{_ms(row['median_caused_wait_per_step_ns'])} vs noise floor {_ms(floor)})")
    if not checks["beyond_chance"]:
        why.append(f"its lead recurs in {row['steps_culprit']} of {row['steps_compared']} "
                   f"steps, which chance alone would give {100 * (1 - (row['confidence_score'] or 0)):.0f}"
                   "% of the time")
    if unc and n_sig == 0:
        why.append(f"arrival order within alignment uncertainty ({_ms(unc)})")
    return "not flagged: " + ", ".join(why) + ". " + text


def _reason(row: dict, flagged: bool, checks: dict, n_sig: int, min_instances: int,
            min_effect: float, unc: int) -> str:
    """The verdict in one short clause: the first check that failed, in the order a reader
    asks (was it there, was anyone clearly last, was it this rank, often enough, enough to
    matter, more than chance)."""
    k = row["culprit_instances"]
    if flagged:
        return (f"its own time caused the lead at {k} of {n_sig} clear instances, "
                f"{100 * (row['effect'] or 0):.0f}% of the median step")
    if row["instances"] == 0:
        return "took part in no matched collective"
    if n_sig == 0:
        return "no collective had a clear last arrival" + (
            f" (arrival order within the alignment uncertainty, {_ms(unc)})" if unc else "")
    if k == 0:
        return "its own time never caused a clear lead"
    if k < min_instances:
        return (f"too few clear instances: its own time caused {k} clear lead"
                f"{'s' if k > 1 else ''}, {min_instances} needed")
    if not checks["persistent"]:
        return f"caused only {k} of {n_sig} clear leads"
    if not checks["effect"]:
        return (f"the wait it causes is {100 * (row['effect'] or 0):.0f}% of a step, below "
                f"{min_effect:.0%}")
    if not checks["dominant"]:
        return "causes no more wait than the others"
    if not checks["consistent"]:
        return (f"a clear wait in only {row['steps_culprit']} of {row['steps_compared']} "
                "steps")
    return (f"too few steps to tell its lead from chance ({row['steps_culprit']} of "
            f"{row['steps_compared']})")


def _empty_rows(ranks: list[int], reason: str) -> pl.DataFrame:
    rows = [{"rank": r, "flagged": False, "imposed_wait_ns": 0, "imposed_wait_per_step_ns": 0,
             "last_arrivals": 0, "significant_last_arrivals": 0, "significant_instances": 0,
             "instances": 0, "wait_suffered_ns": 0, "compute_before_ns": 0,
             "compute_ratio": None, "step_time_ns": None, "step_ratio": None, "steps": None,
             "effect": None, "explanation": f"not flagged: {reason}",
             "median_imposed_wait_per_step_ns": 0, "steps_last": 0, "steps_compared": 0,
             "noise_floor_ns": None, "confidence": "low", "confidence_score": None,
             "caused_wait_ns": 0, "caused_wait_per_step_ns": 0,
             "median_caused_wait_per_step_ns": 0, "culprit_instances": 0,
             "inherited_wait_ns": 0, "steps_culprit": 0, "verdict": "unsure",
             "evidence_steps": [], "evidence_instances": [], "reason": reason}
            for r in ranks]
    return pl.DataFrame(rows, schema=RESULT_SCHEMA)
