"""Compare two runs: step time, compute, exposed communication and idle per step, per-kernel,
per-operator and per-collective totals, with a significance test over steps. ``run.diff``,
``traceview diff`` and the CI gate's samples all come from here.

Metrics (docs/metrics.md, section *Run comparison*):

* Per-step metrics (``step_time_ns`` from the host ``ProfilerStep`` ranges; ``compute_ns``,
  ``exposed_comm_ns``, ``idle_ns`` from the per-step GPU breakdown): the samples are the
  (rank, step) values of each run; ``base``/``test`` are their **medians**, ``change`` = test −
  base, ``change_pct`` = change / base -- a **fraction** here, unlike ``check``'s percent, kept
  for compatibility; ``change_frac`` is the same fraction under a name that says its unit
  (``check --json`` has ``change_frac`` too). The significance test is the two-sided
  **Mann–Whitney U test** of the two sample sets (exact distribution without ties when both
  runs have at most 30 samples, else the normal approximation with tie correction and
  continuity correction); ``significant`` = p < ``alpha`` (0.05).
* Totals (kernels by name, host operators by self time, collectives by type): summed over ranks
  and divided by the run's number of (rank, step) pairs (its number of ranks when it has no
  steps), so runs of different lengths compare: ``*_ns`` columns are **per rank-step**, and so
  are ``base_count_per_step`` / ``test_count_per_step`` (calls per rank-step; ``base_count`` /
  ``test_count`` are the runs' totals).
* ``fields()``: ``stat_test`` names the statistical test (``test``, the same string, is kept
  for compatibility; ``traceview diff --json`` adds ``base_path`` / ``test_path``).
* Top contributors: the kernel, operator and collective totals with the largest absolute
  change. The step markers themselves (``ProfilerStep#N``: their host time *is* the step time,
  and each run names its own steps) and totals that did not change are left out: they explain
  nothing. Kernels run asynchronously to the host, so the contributions overlap and do not add
  up to the step-time change; ``share_of_step_change`` = delta / change of the mean step time
  is a guide, not a partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.analyses.breakdown import step_breakdown, top_cpu_ops, top_kernels, with_self_time
from traceview.schema import STEP_PATTERN

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

Frame = pl.LazyFrame | pl.DataFrame

#: Exact Mann–Whitney distribution up to this many samples per side (and no ties).
EXACT_MAX = 30
#: The statistical test of the per-step metrics (``stat_test`` and ``test`` in ``fields()``).
STAT_TEST = "mann-whitney-u (two-sided)"

METRICS: tuple[tuple[str, str], ...] = (
    ("step_time_ns", "host ProfilerStep duration"),
    ("compute_ns", "GPU compute time per step window"),
    ("exposed_comm_ns", "GPU communication not hidden by compute, per step window"),
    ("idle_ns", "GPU idle time per step window"),
)


@dataclass(frozen=True)
class DiffResult:
    """``metrics``: one row per metric; ``kernels``, ``cpu_ops``, ``collectives``: totals per
    rank-step; ``contributors``: the largest changes among them."""

    metrics: pl.DataFrame
    kernels: pl.DataFrame
    cpu_ops: pl.DataFrame
    collectives: pl.DataFrame
    contributors: pl.DataFrame
    base_rank_steps: int
    test_rank_steps: int

    def fields(self) -> dict[str, Any]:
        """The ``diff --json`` fields in order, tables as frames (a Result's fields)."""
        return {"test": STAT_TEST, "stat_test": STAT_TEST,
                "base_rank_steps": self.base_rank_steps,
                "test_rank_steps": self.test_rank_steps,
                "metrics": self.metrics, "kernels": self.kernels, "cpu_ops": self.cpu_ops,
                "collectives": self.collectives, "contributors": self.contributors}

    def to_dict(self) -> dict[str, Any]:
        return {k: v.to_dicts() if isinstance(v, pl.DataFrame) else v
                for k, v in self.fields().items()}

    def _repr_html_(self) -> str:
        return ("<p><b>Run comparison</b> (Mann–Whitney U over steps)</p>"
                + self.metrics._repr_html_() + "<p>Top contributors</p>"
                + self.contributors._repr_html_())


# ------------------------------------------------------------------------------- statistics

def _exact_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u) for u = 0..m*n under H0 (no ties), by the counting recursion
    f(m, n; u) = f(m-1, n; u-n) + f(m, n-1; u)."""
    # f[j] holds the counts for (i, j) while sweeping i = 0..m
    f = [np.ones(1, dtype=np.float64) for _ in range(n + 1)]  # i = 0: U = 0 only
    for i in range(1, m + 1):
        g = [np.ones(1, dtype=np.float64)]  # j = 0: U = 0 only
        for j in range(1, n + 1):
            size = i * j + 1
            cur = np.zeros(size)
            prev_i = f[j]  # (i-1, j), shifted by j
            cur[j:j + prev_i.size] += prev_i
            prev_j = g[j - 1]  # (i, j-1)
            cur[:prev_j.size] += prev_j
            g.append(cur)
        f = g
    counts = f[n]
    return np.cumsum(counts) / counts.sum()


def mann_whitney_u(x: Any, y: Any, *, alternative: str = "two-sided") -> dict[str, Any]:
    """Mann–Whitney U test of samples ``x`` and ``y``.

    ``alternative``: ``"two-sided"`` (x and y differ) or ``"greater"`` (x tends to be larger
    than y: the CI gate asks whether this run's steps are slower than the baseline's).
    Returns ``{"u": U of x, "p_value", "method"}``; p is None when a side is empty.

    >>> mann_whitney_u([1, 2, 3], [4, 5, 6])["p_value"]
    0.1
    >>> mann_whitney_u([4, 5, 6], [1, 2, 3], alternative="greater")["p_value"]
    0.05
    """
    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    one_sided = alternative == "greater"
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    m, n = a.size, b.size
    if m == 0 or n == 0:
        return {"u": None, "p_value": None, "method": "not enough samples"}
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(both.size)
    sorted_vals = both[order]
    # average ranks of ties
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u = float(ranks[:m].sum() - m * (m + 1) / 2.0)
    ties = bool((counts > 1).any())
    if not ties and m <= EXACT_MAX and n <= EXACT_MAX:
        cdf = _exact_cdf(m, n)
        k = int(round(u))
        low = cdf[k]
        high = 1.0 - (cdf[k - 1] if k > 0 else 0.0)  # P(U >= u): x larger
        p = high if one_sided else min(1.0, 2.0 * min(low, high))
        return {"u": u, "p_value": float(round(p, 12)), "method": "exact"}
    big_n = m + n
    tie_term = float(((counts ** 3) - counts).sum()) / (big_n * (big_n - 1))
    var = m * n / 12.0 * ((big_n + 1) - tie_term)
    if var <= 0:
        return {"u": u, "p_value": 1.0, "method": "normal approximation (all values tied)"}
    if one_sided:  # upper tail of U, continuity-corrected
        z = (u - m * n / 2.0 - 0.5) / math.sqrt(var)
        p = 0.5 * math.erfc(z / math.sqrt(2.0))
    else:
        z = (abs(u - m * n / 2.0) - 0.5) / math.sqrt(var)
        p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return {"u": u, "p_value": min(1.0, p), "method": "normal approximation, tie-corrected"}


# ------------------------------------------------------------------------------ run samples

@dataclass(frozen=True)
class RunTables:
    """What one run contributes to a comparison (all from the analyses)."""

    samples: dict[str, list[int]]
    rank_steps: int
    kernels: pl.DataFrame
    cpu_ops: pl.DataFrame
    collectives: pl.DataFrame
    notes: dict[str, str]


def run_tables(run: Any) -> RunTables:
    """Per-step samples and per-rank-step totals of one Run (its shared tables: steps, gpu,
    host, collective_ranks). Collective waits are on the aligned timeline, as every other
    command reports them."""
    spans = run.steps
    n_ranks = len(run.ranks_present)
    rank_steps = spans.height or n_ranks or 1
    samples: dict[str, list[int]] = {"step_time_ns": spans["step_time_ns"].to_list()}
    notes: dict[str, str] = {}
    if not spans.height:
        notes["step_time_ns"] = "no ProfilerStep ranges"
    bd = step_breakdown(run.gpu, spans, run.ranks_table, include_trace=False).filter(
        pl.col("step").is_not_null() & pl.col("window_ns").is_not_null())
    for col in ("compute_ns", "exposed_comm_ns", "idle_ns"):
        samples[col] = bd[col].to_list()
        if not bd.height:
            notes[col] = ("no GPU events (CPU-only trace)" if spans.height
                          else "no GPU step windows")
    big = 1 << 30
    kern = (top_kernels(run.gpu, n=big).group_by("name", "gpu_class")
            .agg(total_ns=pl.col("total_ns").sum(), count=pl.col("count").sum()))
    ops = (top_cpu_ops(with_self_time(run.host), n=big, by="self_ns").group_by("name")
           .agg(total_ns=pl.col("self_ns").sum(), count=pl.col("count").sum()))
    per = run.collective_ranks
    coll = (per.group_by(pl.col("collective").alias("name"))
            .agg(total_ns=pl.col("dur_ns").sum(), wait_ns=pl.col("wait_ns").sum(),
                 count=pl.len().cast(pl.Int64))
            if per.height else pl.DataFrame(schema={"name": pl.String, "total_ns": pl.Int64,
                                                    "wait_ns": pl.Int64, "count": pl.Int64}))
    return RunTables(samples, rank_steps, kern, ops, coll, notes)


def _per_rank_step(base: pl.DataFrame, test: pl.DataFrame, keys: list[str], nb: int, nt: int,
                   extra: tuple[str, ...] = ()) -> pl.DataFrame:
    cols = ["total_ns", "count", *extra]
    b = base.select(*keys, *[pl.col(c).alias(f"base_{c}") for c in cols])
    t = test.select(*keys, *[pl.col(c).alias(f"test_{c}") for c in cols])
    j = b.join(t, on=keys, how="full", coalesce=True)
    out = j.with_columns(
        [pl.col(f"{s}_{c}").fill_null(0) for s in ("base", "test") for c in cols]
    ).with_columns(
        base_ns=pl.col("base_total_ns") / nb, test_ns=pl.col("test_total_ns") / nt,
        base_count_per_step=pl.col("base_count") / nb,
        test_count_per_step=pl.col("test_count") / nt,
        **{f"base_{c}_per_rank_step": pl.col(f"base_{c}") / nb for c in extra},
        **{f"test_{c}_per_rank_step": pl.col(f"test_{c}") / nt for c in extra},
    ).with_columns(delta_ns=pl.col("test_ns") - pl.col("base_ns"))
    return (out.drop("base_total_ns", "test_total_ns", *[f"{s}_{c}" for s in ("base", "test")
                                                         for c in extra])
            .sort(pl.col("delta_ns").abs(), *keys, descending=[True] + [False] * len(keys)))


def diff_tables(b: RunTables, t: RunTables, *, alpha: float = 0.05, top: int = 10) -> DiffResult:
    """The comparison of two runs' :func:`run_tables` (``Run.diff``, ``traceview diff``)."""
    rows = []
    for metric, meaning in METRICS:
        xs, ys = b.samples.get(metric, []), t.samples.get(metric, [])
        bm = float(np.median(xs)) if xs else None
        tm = float(np.median(ys)) if ys else None
        change = None if bm is None or tm is None else tm - bm
        pct = None if change is None or not bm else change / bm
        stat = mann_whitney_u(xs, ys)
        note = "; ".join(f"{side}: {n[metric]}" for side, n in (("base", b.notes), ("test", t.notes))
                         if metric in n) or None
        rows.append({"metric": metric, "meaning": meaning, "unit": "ns", "base": bm, "test": tm,
                     "change": change, "change_pct": pct, "change_frac": pct,
                     "base_samples": len(xs),
                     "test_samples": len(ys), "u": stat["u"], "p_value": stat["p_value"],
                     "test_method": f"mann-whitney-u ({stat['method']})",
                     "significant": None if stat["p_value"] is None
                     else bool(stat["p_value"] < alpha), "note": note})
    metrics = pl.DataFrame(rows, schema={
        "metric": pl.String, "meaning": pl.String, "unit": pl.String, "base": pl.Float64,
        "test": pl.Float64, "change": pl.Float64, "change_pct": pl.Float64,
        "change_frac": pl.Float64, "base_samples": pl.Int64, "test_samples": pl.Int64, "u": pl.Float64,
        "p_value": pl.Float64, "test_method": pl.String, "significant": pl.Boolean,
        "note": pl.String})
    nb, nt = b.rank_steps, t.rank_steps
    kernels = _per_rank_step(b.kernels, t.kernels, ["name", "gpu_class"], nb, nt)
    ops = _per_rank_step(b.cpu_ops, t.cpu_ops, ["name"], nb, nt)
    coll = _per_rank_step(b.collectives, t.collectives, ["name"], nb, nt, extra=("wait_ns",))
    xs, ys = b.samples["step_time_ns"], t.samples["step_time_ns"]
    step_change = (float(np.mean(ys)) - float(np.mean(xs))) if xs and ys else None
    parts = [df.select(pl.lit(kind).alias("kind"), pl.col("name").cast(pl.String), "base_ns",
                       "test_ns", "delta_ns")
             for kind, df in (("kernel", kernels), ("cpu_op", ops), ("collective", coll))]
    contributors = (
        pl.concat(parts)
        .filter((pl.col("delta_ns") != 0) & pl.col("name").str.contains(STEP_PATTERN).not_())
        .sort(pl.col("delta_ns").abs(), "kind", "name",
                              descending=[True, False, False]).head(top)
        .with_columns(share_of_step_change=(pl.col("delta_ns") / step_change)
                      if step_change else pl.lit(None, pl.Float64))
    )
    return DiffResult(metrics, kernels, ops, coll, contributors, nb, nt)
