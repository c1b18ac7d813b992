"""A performance gate for CI: metrics of a run, a baseline file, a tolerance check, JUnit XML.

* :func:`extract_metrics` -> ``{metric: value or None}`` from the analyses (definitions in
  ``METRICS`` and docs/metrics.md, section *CI gate metrics*). Every metric is "lower is
  better", in ns or as a fraction; a metric the traces cannot give (CPU-only: no GPU idle) is
  None with a note.
* :func:`measure` -> :class:`RunMetrics`: those values plus the per-step samples behind them
  and the input files' warnings.
* :func:`baseline` -> the baseline document from one run or several runs of the same job
  (JSON-ready, no timestamps: identical inputs give identical bytes). Per metric it keeps each
  run's value, their centre (median) and spread (``1.4826 x MAD``, a robust standard
  deviation), and per sample kind each run's per-step samples.
* :func:`check` compares current metrics with a baseline. A metric regresses only when its
  change is beyond the tolerance AND beyond the run-to-run noise::

      allowed = max(centre x (1 + tolerance_pct / 100), centre + slack, centre + k x spread)
      effect = (median(now steps) - median(baseline steps)) / max(robust sd of either side)
      regression = now > allowed  and  (p < alpha, where the steps can be tested)
                                  and  (effect >= min_effect, where there are steps)

  ``slack`` is a small absolute floor per unit (a metric whose baseline is 0 is not failed by
  noise); ``p`` is the one-sided Mann-Whitney U test "this run's per-step samples are larger
  than the pooled baseline samples". Why both: the test alone fires on every run that is a
  little slower as a whole (steps of one run are not independent of each other: a loaded
  machine slows them all), the spread alone cannot see a shift hidden in a noisy median.
  ``effect`` is a standardized effect size: a loaded machine slows a whole run *and* scatters
  its steps, so a shift smaller than ``min_effect`` robust standard deviations of the noisier
  side's steps is within what the machine's noise shows inside one run, while a regression in
  the job (a slow rank, a slower kernel) moves every step by more than their scatter. A
  metric with a baseline value but none now is ``missing`` and fails too (the run lost the
  data the gate relies on). A metric beyond ``allowed`` that the rule does not call a
  regression (the step test not significant, or the shift within the steps' noise) is
  ``inconclusive``, never ``ok``: the note says why and how many baseline runs would decide
  (:mod:`traceview.outputs.evidence`); ``inconclusive="fail"`` fails the check on it. Damaged input (the Run's ``warnings``) fails the check unless the
  caller allows a partial run.
* :func:`junit_xml` renders a :class:`CheckResult` as JUnit XML (one testcase per metric).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import orjson
import polars as pl

from traceview.errors import TraceviewError, UsageError
from traceview.outputs.evidence import (
    baseline_steps_to_decide,
    min_baseline_steps,
    min_p_value,
    runs_for,
    slower_share,
)
from traceview.run.compare import mann_whitney_u, run_tables
from traceview.outputs.safe_text import printable
from traceview.run.run import as_run

Frame = pl.LazyFrame | pl.DataFrame

#: 2: several runs (values, centre, spread, per-step samples, warnings). 1 is still read.
BASELINE_FORMAT = 2
READABLE_FORMATS = (1, 2)
DEFAULT_TOLERANCE_PCT = 10.0
#: The largest tolerance a command line or a baseline may give (beyond it nothing is judged).
MAX_TOLERANCE_PCT = 1e6
#: A change must exceed k robust standard deviations of the baseline runs' values ...
DEFAULT_NOISE_K = 3.0
#: ... and the one-sided Mann-Whitney p-value of the steps must be below alpha.
DEFAULT_ALPHA = 0.01
#: ... and the steps' medians must be this many robust standard deviations apart.
DEFAULT_MIN_EFFECT = 3.0
#: What an inconclusive metric does to the exit code (docs/ci-gate.md, *Inconclusive*).
INCONCLUSIVE_POLICIES = ("pass", "fail")
DEFAULT_INCONCLUSIVE = "pass"
#: MAD x 1.4826 estimates the standard deviation of normally distributed values.
MAD_TO_SD = 1.4826
#: Absolute slack per unit (see module docstring).
SLACK: dict[str, float] = {"ns": 50_000.0, "fraction": 0.01}

#: name -> (unit, definition). Order is the output order.
METRICS: dict[str, tuple[str, str]] = {
    "step_time_p50_ns": ("ns", "median host ProfilerStep duration over all (rank, step)"),
    "step_time_max_ns": ("ns", "longest host ProfilerStep duration over all (rank, step)"),
    "compute_per_step_ns": ("ns", "median GPU compute time per (rank, device, step) window"),
    "exposed_comm_per_step_ns": ("ns", "median exposed communication per (rank, device, step)"),
    "idle_per_step_ns": ("ns", "median GPU idle time per (rank, device, step) window"),
    "gpu_idle_fraction": ("fraction", "sum of GPU idle / sum of GPU spans over ranks (whole "
                          "trace, first to last GPU event per device)"),
    "collective_wait_per_step_ns": ("ns", "sum over ranks and matched collectives of the wait "
                                    "for the last arriver, divided by the (rank, step) count"),
    "straggler_imposed_wait_per_step_ns": ("ns", "largest per-step imposed wait of any rank "
                                           "(stragglers analysis; 0 when no rank imposes any)"),
}


#: metric -> the per-step samples its test uses (None: no per-step form; tolerance and spread
#: only). step_time_max_ns is tested on all steps: a max that grows while the steps as a whole
#: do not is one slow step, which run-to-run noise makes on its own.
SAMPLES_OF: dict[str, str | None] = {
    "step_time_p50_ns": "step_time_ns", "step_time_max_ns": "step_time_ns",
    "compute_per_step_ns": "compute_ns", "exposed_comm_per_step_ns": "exposed_comm_ns",
    "idle_per_step_ns": "idle_ns", "gpu_idle_fraction": None,
    "collective_wait_per_step_ns": "wait_per_step_ns",
    "straggler_imposed_wait_per_step_ns": "wait_per_step_ns",
}
SAMPLE_MEANINGS: dict[str, str] = {
    "step_time_ns": "host ProfilerStep duration per (rank, step)",
    "compute_ns": "GPU compute per (rank, device, step) window",
    "exposed_comm_ns": "exposed communication per (rank, device, step) window",
    "idle_ns": "GPU idle per (rank, device, step) window",
    "wait_per_rank_step_ns": "collective wait for the last arriver summed per (rank, step)",
    "wait_per_step_ns": "collective wait summed over ranks per step (what the step's late "
                        "arrivers imposed)",
}


class BaselineError(TraceviewError):
    """The baseline file is missing, unreadable or not a traceview baseline (exit 2)."""


def _median(values: list[int]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else (s[k - 1] + s[k]) / 2.0


@dataclass(frozen=True)
class RunMetrics:
    """One run as the gate sees it: metric values (None: not available, see ``notes``), the
    per-step samples behind them (``SAMPLE_MEANINGS``) and the input files' warnings."""

    values: dict[str, float | None]
    notes: dict[str, str]
    samples: dict[str, list[int]]
    warnings: tuple[str, ...] = ()


def extract_metrics(source: Any, **run_options: Any
                    ) -> tuple[dict[str, float | None], dict[str, str]]:
    """Gate metrics of one run and a note for each metric it cannot give (``source``: a Run,
    or events in memory with ``RunOptions`` such as ``align=``)."""
    measured = measure(source, **run_options)
    return measured.values, measured.notes


def measure(source: Any, **run_options: Any) -> RunMetrics:
    """:func:`extract_metrics` plus the per-step samples and the Run's warnings."""
    run = as_run(source, **run_options)
    values, notes, samples = _metrics_and_samples(run)
    # the data's warnings: a cache parsed again or not writable is no damage of the input
    return RunMetrics(values, notes, samples, tuple(run.data_warnings))


def _collective_wait_samples(per: pl.DataFrame, steps: pl.DataFrame) -> dict[str, list[int]]:
    """Collective waits per (rank, step) and per step (summed over ranks), zeros included.

    A collective belongs to the step of its rank whose range holds its arrival. Per-collective
    samples would not do: most are 0 (the last arriver waits for nobody), so a rank that
    arrives late at every step moves few of them.
    """
    if not per.height or not steps.height:
        return {"wait_per_rank_step_ns": [], "wait_per_step_ns": []}
    spans = steps.select(pl.col("rank").cast(pl.Int64), "step", "step_start_ns", "step_end_ns")
    tagged = (per.select(pl.col("rank").cast(pl.Int64), "arrival_ns", "wait_ns")
              .sort("arrival_ns")
              .join_asof(spans.sort("step_start_ns"), left_on="arrival_ns",
                         right_on="step_start_ns", by="rank", strategy="backward",
                         check_sortedness=False)  # sorted above, within each rank too
              .filter(pl.col("arrival_ns") < pl.col("step_end_ns"))
              .group_by("rank", "step").agg(pl.col("wait_ns").sum()))
    per_rank_step = (spans.join(tagged, on=["rank", "step"], how="left")
                     .with_columns(pl.col("wait_ns").fill_null(0)).sort("rank", "step"))
    per_step = per_rank_step.group_by("step").agg(pl.col("wait_ns").sum()).sort("step")
    return {"wait_per_rank_step_ns": per_rank_step["wait_ns"].to_list(),
            "wait_per_step_ns": per_step["wait_ns"].to_list()}


def _metrics_and_samples(run: Any) -> tuple[dict[str, float | None], dict[str, str],
                                            dict[str, list[int]]]:
    tables = run_tables(run)
    s = tables.samples
    notes: dict[str, str] = {}
    out: dict[str, float | None] = {
        "step_time_p50_ns": _median(s["step_time_ns"]),
        "step_time_max_ns": float(max(s["step_time_ns"])) if s["step_time_ns"] else None,
        "compute_per_step_ns": _median(s["compute_ns"]),
        "exposed_comm_per_step_ns": _median(s["exposed_comm_ns"]),
        "idle_per_step_ns": _median(s["idle_ns"]),
    }
    for name, key in (("step_time_p50_ns", "step_time_ns"), ("step_time_max_ns", "step_time_ns"),
                      ("compute_per_step_ns", "compute_ns"),
                      ("exposed_comm_per_step_ns", "exposed_comm_ns"),
                      ("idle_per_step_ns", "idle_ns")):
        if out[name] is None:
            notes[name] = tables.notes.get(key, "no samples")
    summ = run.summary()["ranks"]
    span = summ["span_ns"].drop_nulls()
    if span.len() and span.sum() > 0:
        out["gpu_idle_fraction"] = float(summ["idle_ns"].drop_nulls().sum() / span.sum())
    else:
        out["gpu_idle_fraction"] = None
        notes["gpu_idle_fraction"] = "no GPU events (CPU-only trace)"
    samples = {k: s[k] for k in ("step_time_ns", "compute_ns", "exposed_comm_ns", "idle_ns")}
    samples.update(_collective_wait_samples(pl.DataFrame(), run.steps))
    if len(run.ranks_present) < 2:
        for m in ("collective_wait_per_step_ns", "straggler_imposed_wait_per_step_ns"):
            out[m] = None
            notes[m] = "a single rank: nothing to wait for"
    else:
        per = run.collective_ranks
        if per.height:
            samples.update(_collective_wait_samples(per, run.steps))
            out["collective_wait_per_step_ns"] = float(per["wait_ns"].sum()) / tables.rank_steps
            strag = run.stragglers()["ranks"]
            out["straggler_imposed_wait_per_step_ns"] = float(
                strag["imposed_wait_per_step_ns"].max() or 0)
        else:
            for m in ("collective_wait_per_step_ns", "straggler_imposed_wait_per_step_ns"):
                out[m] = None
                notes[m] = "no collective was matched across ranks"
    return {k: out.get(k) for k in METRICS}, notes, samples


def median(values: list[float]) -> float:
    """The median (mean of the middle two for an even count).

    >>> median([3.0, 1.0, 2.0]), median([1.0, 2.0, 4.0, 10.0])
    (2.0, 3.0)
    """
    s = sorted(values)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else (s[k - 1] + s[k]) / 2.0


def robust_spread(values: list[float]) -> float:
    """Run-to-run spread: 1.4826 x the median absolute deviation from the median (a standard
    deviation that one wild run cannot inflate); 0 for a single run.

    >>> robust_spread([10.0, 12.0])      # MAD 1
    1.4826
    >>> robust_spread([10.0, 11.0, 30.0])  # MAD 1: the outlier does not count
    1.4826
    """
    if len(values) < 2:
        return 0.0
    centre = median(values)
    return MAD_TO_SD * median([abs(v - centre) for v in values])


def baseline(metrics: dict[str, float | None] | list[RunMetrics],
             notes: dict[str, str] | None = None, *,
             inputs: dict[str, Any] | list[dict[str, Any]] | None = None,
             tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """The baseline document from one run (``metrics``, ``notes``) or several runs of the same
    job (a list of :class:`RunMetrics`; ``inputs``: one description per run).

    Per metric: ``value`` (= ``centre``, the median of the runs' values), ``runs`` (each run's
    value), ``spread`` (:func:`robust_spread`), ``samples`` (the sample kind its test uses);
    ``samples`` at the top level holds each run's per-step samples of each kind.
    """
    runs = metrics if isinstance(metrics, list) else [RunMetrics(metrics, notes or {}, {})]
    run_inputs = inputs if isinstance(inputs, list) else [inputs] if inputs else []
    doc: dict[str, Any] = {"traceview_baseline": BASELINE_FORMAT}
    if len(runs) == 1 and run_inputs:
        doc["inputs"] = run_inputs[0]  # format 1's field, kept for one-run baselines
    doc["runs"] = [{**(run_inputs[i] if i < len(run_inputs) else {}),
                    "warnings": list(r.warnings)} for i, r in enumerate(runs)]
    doc["warnings"] = [w for r in runs for w in r.warnings]
    doc["default_tolerance_pct"] = DEFAULT_TOLERANCE_PCT
    if tolerances:
        doc["tolerance_pct"] = dict(sorted(tolerances.items()))
    doc["noise"] = {"k": DEFAULT_NOISE_K, "alpha": DEFAULT_ALPHA,
                    "min_effect": DEFAULT_MIN_EFFECT,
                    "spread": "1.4826 x median absolute deviation of the runs' values",
                    "test": "one-sided Mann-Whitney U, this run's samples vs the pooled "
                            "baseline samples",
                    "effect": "shift of the step medians / the larger robust standard "
                              "deviation (1.4826 x MAD) of this run's and the baseline's steps"}
    doc["metrics"] = {name: _baseline_entry(name, runs) for name in METRICS}
    kinds = sorted({k for r in runs for k in r.samples})
    doc["samples"] = {k: [list(r.samples.get(k, [])) for r in runs] for k in kinds}
    return doc


def _baseline_entry(name: str, runs: list[RunMetrics]) -> dict[str, Any]:
    unit, meaning = METRICS[name]
    values = [r.values.get(name) for r in runs]
    known = [float(v) for v in values if v is not None]
    entry: dict[str, Any] = {"value": median(known) if known else None, "unit": unit,
                             "definition": meaning, "runs": values,
                             "centre": median(known) if known else None,
                             "spread": robust_spread(known) if known else None,
                             "samples": SAMPLES_OF[name]}
    note = next((r.notes[name] for r in runs if name in r.notes), None)
    if note is not None:
        entry["note"] = note
    return entry


def read_baseline(text: str | bytes, *, source: str = "baseline") -> dict[str, Any]:
    """Parse and validate a baseline document (``BaselineError`` when it is not one)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{source}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("traceview_baseline") not in READABLE_FORMATS \
            or not isinstance(doc.get("metrics"), dict):
        raise BaselineError(f"{source}: not a traceview baseline (formats "
                            f"{', '.join(map(str, READABLE_FORMATS))}); write one with "
                            "`traceview baseline`")
    _check_fields(doc, source)
    return doc


#: The most per-step samples a baseline may hold, all kinds and runs together.
MAX_BASELINE_SAMPLES = 10_000_000


def _number(value: Any) -> bool:
    """A finite JSON number (true and false are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _check_fields(doc: dict[str, Any], source: str) -> None:
    """Each field ``check`` reads has its type and range (a hand-edited baseline with a
    tolerance as a string, or samples holding strings, lists or nulls, was an internal
    error); ``BaselineError`` naming the file and the field otherwise."""
    def refuse(field: str, want: str) -> None:
        raise BaselineError(f"{source}: field {field} {want}")

    def in_range(field: str, value: Any, low: float, high: float) -> None:
        if value is not None and not (_number(value) and low <= value <= high):
            refuse(field, f"must be a number from {low:g} to {high:g}")

    samples = doc.get("samples", {})
    if not isinstance(samples, dict):
        refuse("samples", "is not a table of per-run lists")
    count = 0
    for kind, runs in samples.items():
        if not isinstance(runs, list) or not all(isinstance(xs, list) for xs in runs):
            refuse(f"samples.{kind}", "is not a list of per-run lists")
        for xs in runs:
            count += len(xs)
            if not all(map(_number, xs)):
                refuse(f"samples.{kind}", "holds something other than finite numbers")
    if count > MAX_BASELINE_SAMPLES:
        refuse("samples", f"holds {count} samples, more than {MAX_BASELINE_SAMPLES}")
    in_range("default_tolerance_pct", doc.get("default_tolerance_pct"), 0, MAX_TOLERANCE_PCT)
    stored = doc.get("tolerance_pct")
    if stored is not None and not isinstance(stored, dict):
        refuse("tolerance_pct", "is not a table of metric -> percent")
    for name, pct in (stored or {}).items():
        in_range(f"tolerance_pct.{name}", pct, 0, MAX_TOLERANCE_PCT)
    noise = doc.get("noise")
    if noise is not None and not isinstance(noise, dict):
        refuse("noise", "is not a table")
    for key, (low, high) in {"k": (0, 1e6), "alpha": (1e-300, 1), "min_effect": (0, 1e6)}.items():
        in_range(f"noise.{key}", (noise or {}).get(key), low, high)
    for name, entry in doc["metrics"].items():
        if not isinstance(entry, dict):
            refuse(f"metrics.{name}", "is not a table")
        for key in ("value", "centre", "spread"):
            if entry.get(key) is not None and not _number(entry[key]):
                refuse(f"metrics.{name}.{key}", "is not a finite number")
        runs = entry.get("runs", [])
        if not isinstance(runs, list) or not all(v is None or _number(v) for v in runs):
            refuse(f"metrics.{name}.runs", "is not a list of numbers or nulls")
        for key in ("unit", "samples", "note"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                refuse(f"metrics.{name}.{key}", "is not text")


def parse_tolerances(items: list[str]) -> dict[str, float]:
    """``["step_time_p50_ns=5", "all=20%"]`` -> ``{...}``; ``all`` (or ``*``) sets every metric.

    >>> parse_tolerances(["idle_per_step_ns=25%"])
    {'idle_per_step_ns': 25.0}
    """
    out: dict[str, float] = {}
    for item in items:
        name, sep, pct = item.partition("=")
        name = name.strip()
        try:
            value = float(pct.strip().rstrip("%"))
        except ValueError:
            value = float("nan")
        if not sep or not 0 <= value <= MAX_TOLERANCE_PCT:
            raise UsageError(f"--tolerance wants METRIC=PCT (0 <= PCT <= "
                             f"{MAX_TOLERANCE_PCT:g}), got {item!r}")
        if name in ("all", "*"):
            out.update({m: value for m in METRICS})
        elif name in METRICS:
            out[name] = value
        else:
            raise UsageError(f"--tolerance: unknown metric {name!r}; metrics: "
                             f"{', '.join(METRICS)}")
    return out


#: check's row schema (the ``check --json`` metric fields, in order).
ROW_SCHEMA: dict[str, Any] = {
    "metric": pl.String, "unit": pl.String, "baseline": pl.Float64, "now": pl.Float64,
    "allowed": pl.Float64, "tolerance_pct": pl.Float64, "change_pct": pl.Float64,
    "status": pl.String, "note": pl.String, "change_frac": pl.Float64,
    "baseline_runs": pl.Int64, "spread": pl.Float64, "noise_allowed": pl.Float64,
    "p_value": pl.Float64, "test_method": pl.String, "effect_size": pl.Float64}


@dataclass(frozen=True)
class CheckResult:
    """One row per metric: metric, unit, baseline, now, allowed, tolerance_pct, change_pct,
    status (ok / regression / inconclusive / missing / not_in_baseline / unavailable), note,
    change_frac, baseline_runs, spread, noise_allowed, p_value, test_method, effect_size; and
    the input's warnings (damaged input fails unless ``allow_partial``). ``inconclusive``:
    ``"pass"`` or ``"fail"``, what an inconclusive metric does to the exit code."""

    rows: pl.DataFrame
    warnings: tuple[str, ...] = ()
    allow_partial: bool = False
    inconclusive: str = DEFAULT_INCONCLUSIVE

    @property
    def regressed(self) -> bool:
        return bool(self.rows["status"].is_in(["regression", "missing"]).any())

    @property
    def undecided(self) -> bool:
        """A metric is beyond its tolerance and the evidence cannot say whether it regressed."""
        return bool((self.rows["status"] == "inconclusive").any())

    @property
    def damaged(self) -> bool:
        """The input files were damaged and the caller did not allow a partial run."""
        return bool(self.warnings) and not self.allow_partial

    @property
    def failed(self) -> bool:
        return self.regressed or self.damaged or (self.undecided
                                                  and self.inconclusive == "fail")

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def status(self) -> str:
        return ("regression" if self.regressed else "damaged_input" if self.damaged
                else "inconclusive" if self.undecided else "ok")

    def to_dict(self) -> dict[str, Any]:
        counts = self.rows["status"].value_counts().sort("status")
        return {"status": self.status, "exit_code": self.exit_code,
                "counts": dict(counts.rows()), "metrics": self.rows.to_dicts(),
                "warnings": list(self.warnings), "damaged_input": self.damaged,
                "inconclusive_policy": self.inconclusive}

    def _repr_html_(self) -> str:
        return f"<p><b>check: {self.status.upper()}</b></p>" + self.rows._repr_html_()


def _pooled_samples(base_doc: dict[str, Any], kind: str | None) -> tuple[list[float], int]:
    """Every baseline run's per-step samples of ``kind``, pooled, and how many runs hold
    some (to turn a number of steps into a number of runs)."""
    runs = (base_doc.get("samples") or {}).get(kind or "", [])
    return [float(x) for xs in runs for x in xs], sum(1 for xs in runs if xs)


def steps_slower(now_samples: list[float], base_samples: list[float], alpha: float
                 ) -> tuple[float | None, str | None, bool]:
    """One-sided Mann-Whitney p-value of "this run's samples are larger than the baseline's",
    the method, and whether the test can decide: False when a side has no samples, or when
    even the most extreme outcome could not reach ``alpha`` (4 steps against 4 give at best
    p = 0.014): a test that cannot say "slower" must not veto."""
    if not now_samples or not base_samples:
        return None, None, False
    res = mann_whitney_u(now_samples, base_samples, alternative="greater")
    method = f"mann-whitney-u one-sided ({res['method']})"
    if min_p_value(len(now_samples), len(base_samples)) >= alpha:
        return res["p_value"], method + f"; too few samples to reach {alpha:g}, not used", False
    return res["p_value"], method, True


def step_effect(now_samples: list[float], base_samples: list[float], *, floor: float = 0.0
                ) -> float | None:
    """How far this run's steps moved, in units of their noise: the shift of the medians over
    the larger robust standard deviation (:func:`robust_spread`) of this run's steps and of the
    pooled baseline steps (at least ``floor``). None when a side has no samples.

    >>> round(step_effect([20.0, 21.0, 22.0], [10.0, 11.0, 12.0]), 2)   # 10 / (1.4826 x 1)
    6.74
    >>> round(step_effect([12.0, 20.0, 35.0], [10.0, 11.0, 12.0]), 2)   # 9 / (1.4826 x 8)
    0.76
    """
    if not now_samples or not base_samples:
        return None
    noise = max(robust_spread(now_samples), robust_spread(base_samples), floor)
    shift = median(now_samples) - median(base_samples)
    return shift / noise if noise > 0 else (math.inf if shift > 0 else 0.0)


def check(now: dict[str, float | None], base_doc: dict[str, Any], *,
          tolerances: dict[str, float] | None = None,
          now_notes: dict[str, str] | None = None,
          now_samples: dict[str, list[int]] | None = None,
          warnings: list[str] | tuple[str, ...] = (), allow_partial: bool = False,
          noise_k: float | None = None, alpha: float | None = None,
          min_effect: float | None = None,
          inconclusive: str = DEFAULT_INCONCLUSIVE) -> CheckResult:
    """Compare ``now`` (from :func:`extract_metrics` / :func:`measure`) with a baseline.

    Tolerance per metric: ``tolerances`` (command line) over the baseline's own
    ``tolerance_pct`` over its ``default_tolerance_pct``. ``noise_k`` and ``alpha`` (command
    line), and ``min_effect``, over the baseline's ``noise`` over the defaults. The rule is in
    the module docstring. ``inconclusive``: ``"pass"`` or ``"fail"`` (see :class:`CheckResult`).
    """
    if inconclusive not in INCONCLUSIVE_POLICIES:
        raise UsageError(f"--inconclusive wants one of {', '.join(INCONCLUSIVE_POLICIES)}, "
                         f"got {inconclusive!r}")
    now_notes = now_notes or {}
    stored = base_doc.get("tolerance_pct") or {}
    default = float(base_doc.get("default_tolerance_pct", DEFAULT_TOLERANCE_PCT))
    tol_all = {m: float((tolerances or {}).get(m, stored.get(m, default))) for m in METRICS}
    noise = base_doc.get("noise") or {}
    k = float(noise_k if noise_k is not None else noise.get("k", DEFAULT_NOISE_K))
    a = float(alpha if alpha is not None else noise.get("alpha", DEFAULT_ALPHA))
    d = float(min_effect if min_effect is not None
              else noise.get("min_effect", DEFAULT_MIN_EFFECT))
    base_metrics = base_doc["metrics"]
    names = list(METRICS) + sorted(set(base_metrics) - set(METRICS))
    rows = []
    for name in names:
        unit = METRICS[name][0] if name in METRICS else base_metrics[name].get("unit", "")
        kind = SAMPLES_OF.get(name)
        now_steps = [float(x) for x in (now_samples or {}).get(kind or "", [])]
        rows.append(_check_metric(
            name, unit, base_metrics.get(name), now.get(name), now_notes.get(name),
            tol_all.get(name, default), k, a, d, now_steps, *_pooled_samples(base_doc, kind)))
    return CheckResult(pl.DataFrame(rows, schema=ROW_SCHEMA), tuple(warnings), allow_partial,
                       inconclusive)


def _check_metric(name: str, unit: str, entry: dict[str, Any] | None, v: float | None,
                  note: str | None, tol: float, k: float, alpha: float, min_effect: float,
                  now_steps: list[float], base_steps: list[float],
                  base_runs: int = 1) -> dict[str, Any]:
    """One metric's row (see :data:`ROW_SCHEMA`)."""
    b = None if entry is None else entry.get("value")
    runs = [x for x in (entry or {}).get("runs", [b]) if x is not None]
    spread = float((entry or {}).get("spread") or 0.0)
    row: dict[str, Any] = {"metric": name, "unit": unit,
                           "baseline": None if b is None else float(b),
                           "now": None if v is None else float(v), "allowed": None,
                           "tolerance_pct": tol, "change_pct": None, "status": "",
                           "note": note, "change_frac": None, "baseline_runs": len(runs),
                           "spread": spread if entry is not None and b is not None else None,
                           "noise_allowed": None, "p_value": None, "test_method": None,
                           "effect_size": None}
    if entry is None:
        row["status"] = "not_in_baseline"
    elif b is None and v is None:
        row["status"], row["note"] = "unavailable", note or entry.get("note")
    elif b is None:
        row["status"], row["note"] = "not_in_baseline", "the baseline run had no value"
    elif v is None:
        row["status"], row["note"] = "missing", note or "no value in this run"
    else:
        row["noise_allowed"] = b + k * spread
        row["allowed"] = max(b * (1 + tol / 100.0), b + SLACK.get(unit, 0.0),
                             row["noise_allowed"])
        row["change_frac"] = (v - b) / b if b else None
        row["change_pct"] = None if row["change_frac"] is None else 100 * row["change_frac"]
        row["p_value"], row["test_method"], decides = steps_slower(now_steps, base_steps, alpha)
        row["effect_size"] = step_effect(now_steps, base_steps, floor=SLACK.get(unit, 0.0))
        beyond = v > row["allowed"]
        not_significant = decides and row["p_value"] >= alpha
        within_noise = row["effect_size"] is not None and row["effect_size"] < min_effect
        # beyond the tolerance and not shown to be a regression is not shown to be fine either
        row["status"] = ("ok" if not beyond else "inconclusive"
                         if not_significant or within_noise else "regression")
        if beyond and not_significant:
            row["note"] = _underpowered(row["p_value"], alpha, now_steps, base_steps, base_runs)
        elif beyond and within_noise:
            row["note"] = (f"the steps are slower, but their medians are "
                           f"{row['effect_size']:.2g} robust standard deviations apart "
                           f"(< {min_effect:g}): within the steps' own noise on this machine; "
                           f"more baseline runs would not decide, a re-run on a quieter "
                           f"machine would")
        elif beyond and now_steps and base_steps and not decides:
            need = min_baseline_steps(len(now_steps), alpha) or 0
            row["note"] = (f"judged by the tolerance alone: {len(base_steps)} baseline steps "
                           f"cannot make the step test reach {alpha:g} against "
                           f"{len(now_steps)} (it needs {need}, about "
                           f"{_runs(need, base_steps, base_runs)})")
    return row


def _runs(steps: int, base_steps: list[float], base_runs: int) -> str:
    n = runs_for(steps, len(base_steps) / max(base_runs, 1))
    return f"{n} baseline run{'s' if n > 1 else ''}"


def _underpowered(p: float, alpha: float, now_steps: list[float], base_steps: list[float],
                  base_runs: int) -> str:
    """Why the step test did not decide, and how many baseline runs would at this effect."""
    theta = slower_share(now_steps, base_steps) or 0.0
    text = (f"the step test cannot tell: one-sided Mann-Whitney p = {p:.2g} >= {alpha:g} "
            f"({len(now_steps)} steps against {len(base_steps)} from {base_runs} baseline "
            f"run{'s' if base_runs != 1 else ''}; this run's step is the slower in "
            f"{100 * theta:.0f}% of pairs)")
    need = baseline_steps_to_decide(theta, len(now_steps), alpha)
    if need is None:
        return (text + "; at this effect no number of baseline runs would decide with "
                f"{len(now_steps)} steps in this run: profile more steps")
    if need <= len(base_steps):  # the estimate is a normal approximation; say so plainly
        return text + "; a change this size is at the edge of what these steps can show"
    return (text + f"; at this effect about {_runs(need, base_steps, base_runs)} "
            f"({need} steps) would decide")


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        return f"{v / 1e6:.3f} ms"
    return f"{v:.4f}"


def describe(row: dict[str, Any]) -> str:
    """One line for a metric row (used in text output and JUnit messages)."""
    u = row["unit"]
    if row["status"] in ("ok", "regression", "inconclusive"):
        rel = "" if row["change_pct"] is None else f" ({row['change_pct']:+.1f}%)"
        op = ">" if row["now"] > row["allowed"] else "<="
        runs = row.get("baseline_runs") or 1
        noise = (f", {runs} runs, spread {_fmt(row['spread'], u)}" if runs > 1 else "")
        test = ("" if row.get("p_value") is None else f", steps p = {row['p_value']:.2g}")
        if row.get("effect_size") is not None:
            test += f", effect {row['effect_size']:.2g} sd"
        text = (f"{row['metric']}: now {_fmt(row['now'], u)}{rel} {op} allowed "
                f"{_fmt(row['allowed'], u)} (baseline {_fmt(row['baseline'], u)}, "
                f"tolerance {row['tolerance_pct']:g}%{noise}{test})")
        return text + (f"; {row['note']}" if row["note"] else "")
    return f"{row['metric']}: {row['status']}" + (f" ({row['note']})" if row["note"] else "")


def junit_xml(result: CheckResult, *, suite: str = "traceview.check") -> str:
    """JUnit XML: one ``testcase`` per metric; regressions and missing metrics are failures,
    unavailable / not-in-baseline ones skipped, inconclusive ones failures or skipped by the
    result's policy. No timestamps (deterministic)."""
    rows = result.rows.to_dicts()
    if result.warnings:  # the input's health is a testcase of its own
        rows = [{"metric": "input", "status": "damaged_input" if result.damaged else "ok",
                 "note": "; ".join(result.warnings)}, *rows]
    # an inconclusive metric fails under --inconclusive fail; else it shows as skipped, with
    # its reason (a CI page lists skipped tests; a passing one would hide it)
    failing = ("regression", "missing", "damaged_input",
               *(("inconclusive",) if result.inconclusive == "fail" else ()))
    skipping = ("unavailable", "not_in_baseline",
                *(("inconclusive",) if result.inconclusive != "fail" else ()))
    fails = sum(r["status"] in failing for r in rows)
    skips = sum(r["status"] in skipping for r in rows)
    root = ET.Element("testsuites", {"name": "traceview", "tests": str(len(rows)),
                                     "failures": str(fails), "errors": "0",
                                     "skipped": str(skips)})
    ts = ET.SubElement(root, "testsuite", {"name": suite, "tests": str(len(rows)),
                                           "failures": str(fails), "errors": "0",
                                           "skipped": str(skips), "time": "0"})
    for r in rows:
        case = ET.SubElement(ts, "testcase", {"classname": suite, "name": r["metric"],
                                              "time": "0"})
        text = (describe(r) if r["metric"] != "input"
                else f"input: {r['status']} ({r['note']})")
        if r["status"] in failing:
            f = ET.SubElement(case, "failure", {"type": r["status"], "message": text})
            f.text = text
        elif r["status"] in skipping:
            ET.SubElement(case, "skipped", {"message": text})
        else:
            out = ET.SubElement(case, "system-out")
            out.text = text
    ET.indent(root)
    # ElementTree writes control characters as they are, and XML 1.0 has no way to hold most
    # of them: every one (and a bidi override, for the CI page showing it) becomes its escape
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + printable(
        ET.tostring(root, encoding="unicode"), keep="\n") + "\n"
