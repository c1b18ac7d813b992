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

import math

import polars as pl

from traceview.analyses.collective_match import P2P
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
}

#: A lead counts as "clear" when above this many times the run's own arrival noise (the
#: median spread of the non-last ranks' arrivals at an instance).
NOISE_MULTIPLE = 3.0
#: A straggler is last, by a clear lead, in at least this share of the steps compared.
MIN_STEP_SHARE = 0.5
#: Verdicts resting on fewer steps than this are low confidence.
MIN_STEPS_FOR_CONFIDENCE = 4

LATENESS_FLOOR_NS = 50_000


def stragglers(
    collective_rows: pl.DataFrame,
    host_steps: pl.DataFrame,
    ranks: pl.DataFrame,
    *,
    min_effect: float = 0.05,
    min_share: float = 0.75,
    min_instances: int = 3,
    dominance: float = 3.0,
) -> pl.DataFrame:
    """One row per rank of ``ranks`` (``RESULT_SCHEMA``), largest ``imposed_wait_ns`` first.

    ``collective_rows``: :func:`~traceview.analyses.collectives.collective_ranks` on the
    aligned timeline (raw clocks are only right when all ranks share one clock);
    ``host_steps``: :func:`~traceview.analyses.window.step_spans`.
    """
    per = collective_rows.filter(~pl.col("collective").is_in(list(P2P)))
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

    inst = per.group_by("instance").agg(
        last_rank=pl.col("last_rank").first(),
        collective=pl.col("collective").first(),
        late_from_ns=pl.col("arrival_ns").sort(descending=True).get(1),
        late_to_ns=pl.col("arrival_ns").max(),
        first_ns=pl.col("arrival_ns").min(), end_ns=pl.col("end_ns").max(),
    ).with_columns(lateness_ns=pl.col("late_to_ns") - pl.col("late_from_ns"))
    inst = inst.with_columns(significant=pl.col("lateness_ns") > floor)
    inst = _with_step(inst, steps)
    per_step = _per_step(inst, ranks_all, floor)
    n_sig = int(inst.get_column("significant").sum())
    span = int(inst.get_column("end_ns").max() - inst.get_column("first_ns").min())

    by_last = inst.group_by("last_rank").agg(
        last_arrivals=pl.len(),
        significant_last_arrivals=pl.col("significant").sum().cast(pl.Int64),
        names=pl.col("collective").filter(pl.col("significant")).unique().sort(),
    ).rename({"last_rank": "rank"})
    # Imposed wait: lateness intervals of the rank's last arrivals, concurrent ones (DDP buckets
    # in flight together) counted once.
    late = union(inst.rename({"last_rank": "rank"}), by=["rank"], start="late_from_ns",
                 end="late_to_ns")
    imposed_tbl = total_length(late, by=["rank"], start="late_from_ns", end="late_to_ns",
                               name="imposed_wait_ns")
    by_last = by_last.join(imposed_tbl, on="rank", how="left")
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
        .join(step_by_rank, on="rank", how="left")
        .join(per_step, on="rank", how="left")
        .with_columns(
            pl.col("last_arrivals", "significant_last_arrivals", "imposed_wait_ns",
                   "instances", "wait_suffered_ns", "compute_before_ns").fill_null(0)
            .cast(pl.Int64))
    )
    med_before = rows.filter(pl.col("instances") > 0).get_column("compute_before_ns").median()
    imposed_col = rows.get_column("imposed_wait_ns")
    rows = rows.with_columns(
        compute_ratio=_ratio(rows.get_column("compute_before_ns"), med_before)
        if med_before else None,
        step_ratio=_ratio(rows.get_column("step_time_ns"), median_step) if median_step else None,
        imposed_wait_per_step_ns=(pl.col("imposed_wait_ns") // n_steps) if n_steps
        else pl.col("imposed_wait_ns"),
        effect=_ratio(_ratio(imposed_col, n_steps), median_step) if n_steps and median_step
        else (_ratio(imposed_col, span) if span > 0 else pl.lit(0.0)),
        significant_instances=pl.lit(n_sig, pl.Int64),
        noise_floor_ns=pl.lit(floor, pl.Int64),
    )
    imposed = dict(rows.select("rank", "imposed_wait_ns").rows())
    total_imposed = sum(imposed.values())
    typical = dict(rows.select("rank", "median_imposed_wait_per_step_ns").rows())
    out = []
    for row in rows.iter_rows(named=True):
        r = row["rank"]
        others = sorted(v for q, v in imposed.items() if q != r)
        other_med = others[len(others) // 2] if len(others) % 2 else (
            (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2 if others else 0)
        k = row["significant_last_arrivals"]
        checks = {
            # Persistent by count, or by weight: noise makes near-ties (e.g. a barrier right
            # after an all-reduce) fall either way, so a rank that holds >= min_share of all the
            # imposed wait over >= min_instances clear instances is persistent too.
            "persistent": n_sig > 0 and k >= min_instances and (
                k / n_sig >= min_share or (total_imposed > 0
                                           and row["imposed_wait_ns"] / total_imposed
                                           >= min_share)),
            "effect": row["effect"] is not None and row["effect"] >= min_effect,
            "dominant": row["imposed_wait_ns"] > 0
            and row["imposed_wait_ns"] >= dominance * other_med,
            # Noise makes a few steps' waits huge for anyone: the verdict rests on the typical
            # step (median) and on being last in most steps, not on a sum.
            "consistent": row["steps_compared"] > 0
            and row["steps_last"] >= MIN_STEP_SHARE * row["steps_compared"]
            and row["median_imposed_wait_per_step_ns"] > floor
            and row["median_imposed_wait_per_step_ns"]
            >= dominance * _median([v for q, v in typical.items() if q != r]),
        }
        flagged = row["instances"] > 0 and all(checks.values())
        names = row.pop("names") or []
        row["flagged"] = flagged
        row["confidence_score"], row["confidence"] = _confidence(
            flagged, row["steps_last"], row["steps_compared"], len(ranks_all))
        row["explanation"] = _explain(row, flagged, checks, names, n_sig, floor, median_step,
                                      n_steps, min_effect, min_share, unc)
        out.append(row)
    return (pl.DataFrame(out).select(list(RESULT_SCHEMA)).cast(RESULT_SCHEMA)
            .sort(["median_imposed_wait_per_step_ns", "imposed_wait_ns", "rank"],
                  descending=[True, True, False]))


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


def _per_step(inst: pl.DataFrame, ranks: list[int], floor: int) -> pl.DataFrame:
    """Per rank: its imposed wait in each step (lateness intervals of its last arrivals,
    concurrent ones once), the median over all steps compared (zeros included), and the
    number of steps in which that wait is above the noise floor."""
    late = union(inst.rename({"last_rank": "rank"}), by=["rank", "step"],
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


def _confidence(flagged: bool, k: int, n: int, ranks: int) -> tuple[float | None, str]:
    """How sure the verdict is. The score is one minus the chance of a rank being last in
    ``k`` or more of ``n`` steps if every rank were equally likely to be last (binomial
    tail, p = 1/ranks): near 1 when the lead is too consistent to be chance. ``high``:
    score >= 0.99 for a flag (for no flag: nothing suspicious, score < 0.9); ``medium``:
    0.9 <= score < 0.99 either way; ``low``: fewer than MIN_STEPS_FOR_CONFIDENCE steps."""
    if n == 0 or ranks < 2:
        return None, "low"
    tail = _binomial_tail(k, n, 1.0 / ranks)
    score = round(1.0 - tail, 4)
    if n < MIN_STEPS_FOR_CONFIDENCE:
        return score, "low"
    if flagged:
        return score, "high" if score >= 0.99 else "medium" if score >= 0.9 else "low"
    return score, "high" if score < 0.9 else "medium"


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
             f"arrival (lead > {_ms(floor)})", held]
    if median_step:
        parts[-1] += f" ({100 * row['effect']:.0f}% of the median step time)"
    if row["compute_ratio"] is not None and math.isfinite(row["compute_ratio"]):
        parts.append(f"its compute before collectives takes {row['compute_ratio']:.1f}x the "
                     f"median rank")
    if row["step_ratio"] is not None:
        parts.append(f"its step time is {row['step_ratio']:.2f}x the median (synchronous "
                     f"collectives equalise step times)")
    parts.append(f"last by more than the noise floor ({_ms(floor)}) in {row['steps_last']} of "
                 f"{row['steps_compared']} steps, typical step "
                 f"{_ms(row['median_imposed_wait_per_step_ns'])}")
    text = "; ".join(parts)
    if flagged:
        return "STRAGGLER: " + text
    why = []
    if not checks["persistent"]:
        why.append(f"not persistently last (needs >= {min_share:.0%} of clear last arrivals "
                   "or of all imposed wait)")
    if not checks["effect"]:
        why.append(f"effect below {min_effect:.0%} of step time")
    if not checks["dominant"]:
        why.append("imposes no more wait than the others")
    if not checks["consistent"]:
        why.append(f"not last with a clear lead in most steps ({row['steps_last']} of "
                   f"{row['steps_compared']}; typical step {_ms(row['median_imposed_wait_per_step_ns'])}"
                   f" vs noise floor {_ms(floor)})")
    if unc and n_sig == 0:
        why.append(f"arrival order within alignment uncertainty ({_ms(unc)})")
    return "not flagged: " + ", ".join(why) + ". " + text


def _empty_rows(ranks: list[int], reason: str) -> pl.DataFrame:
    rows = [{"rank": r, "flagged": False, "imposed_wait_ns": 0, "imposed_wait_per_step_ns": 0,
             "last_arrivals": 0, "significant_last_arrivals": 0, "significant_instances": 0,
             "instances": 0, "wait_suffered_ns": 0, "compute_before_ns": 0,
             "compute_ratio": None, "step_time_ns": None, "step_ratio": None, "steps": None,
             "effect": None, "explanation": f"not flagged: {reason}",
             "median_imposed_wait_per_step_ns": 0, "steps_last": 0, "steps_compared": 0,
             "noise_floor_ns": None, "confidence": "low", "confidence_score": None}
            for r in ranks]
    return pl.DataFrame(rows, schema=RESULT_SCHEMA)
