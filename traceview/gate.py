"""A performance gate for CI: metrics of a run, a baseline file, a tolerance check, JUnit XML.

* :func:`extract_metrics` -> ``{metric: value or None}`` from the analyses (definitions in
  ``METRICS`` and docs/metrics.md, section *CI gate metrics*). Every metric is "lower is
  better", in ns or as a fraction; a metric the traces cannot give (CPU-only: no GPU idle) is
  None with a note.
* :func:`baseline` -> the baseline document (JSON-ready, no timestamps: identical inputs give
  identical bytes).
* :func:`check` compares current metrics with a baseline: for each metric
  ``allowed = max(baseline x (1 + tolerance_pct / 100), baseline + slack)`` (``slack`` is a
  small absolute floor per unit, so a metric whose baseline is 0 is not failed by noise);
  ``now > allowed`` is a regression. A metric with a baseline value but none now is
  ``missing`` and fails too (the run lost the data the gate relies on).
* :func:`junit_xml` renders a :class:`CheckResult` as JUnit XML (one testcase per metric).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceview.errors import TraceviewError, UsageError

Frame = pl.LazyFrame | pl.DataFrame

BASELINE_FORMAT = 1
DEFAULT_TOLERANCE_PCT = 10.0
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


class BaselineError(TraceviewError):
    """The baseline file is missing, unreadable or not a traceview baseline (exit 2)."""


def _median(values: list[int]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else (s[k - 1] + s[k]) / 2.0


def extract_metrics(source: Any, **run_options: Any
                    ) -> tuple[dict[str, float | None], dict[str, str]]:
    """Gate metrics of one run and a note for each metric it cannot give (``source``: a Run,
    or events in memory with ``RunOptions`` such as ``align=``)."""
    from traceview.diff import run_tables
    from traceview.run import as_run

    run = as_run(source, **run_options)
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
    if len(run.ranks_present) < 2:
        for m in ("collective_wait_per_step_ns", "straggler_imposed_wait_per_step_ns"):
            out[m] = None
            notes[m] = "a single rank: nothing to wait for"
    else:
        per = run.collective_ranks
        if per.height:
            out["collective_wait_per_step_ns"] = float(per["wait_ns"].sum()) / tables.rank_steps
            strag = run.stragglers()["ranks"]
            out["straggler_imposed_wait_per_step_ns"] = float(
                strag["imposed_wait_per_step_ns"].max() or 0)
        else:
            for m in ("collective_wait_per_step_ns", "straggler_imposed_wait_per_step_ns"):
                out[m] = None
                notes[m] = "no collective was matched across ranks"
    return {k: out.get(k) for k in METRICS}, notes


def baseline(metrics: dict[str, float | None], notes: dict[str, str], *,
             inputs: dict[str, Any] | None = None,
             tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """The baseline document: metrics with unit, definition and (for None) the reason."""
    doc: dict[str, Any] = {"traceview_baseline": BASELINE_FORMAT}
    if inputs:
        doc["inputs"] = inputs
    doc["default_tolerance_pct"] = DEFAULT_TOLERANCE_PCT
    if tolerances:
        doc["tolerance_pct"] = dict(sorted(tolerances.items()))
    doc["metrics"] = {
        name: {"value": metrics.get(name), "unit": unit, "definition": meaning,
               **({"note": notes[name]} if name in notes else {})}
        for name, (unit, meaning) in METRICS.items()}
    return doc


def read_baseline(text: str | bytes, *, source: str = "baseline") -> dict[str, Any]:
    """Parse and validate a baseline document (``BaselineError`` when it is not one)."""
    import orjson

    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{source}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("traceview_baseline") != BASELINE_FORMAT \
            or not isinstance(doc.get("metrics"), dict):
        raise BaselineError(f"{source}: not a traceview baseline (format "
                            f"{BASELINE_FORMAT}); write one with `traceview baseline`")
    for name, entry in doc["metrics"].items():
        value = entry.get("value") if isinstance(entry, dict) else "bad"
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise BaselineError(f"{source}: metric {name!r} has no numeric value")
    return doc


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
        if not sep or not math.isfinite(value) or value < 0:
            raise UsageError(f"--tolerance wants METRIC=PCT (PCT >= 0), got {item!r}")
        if name in ("all", "*"):
            out.update({m: value for m in METRICS})
        elif name in METRICS:
            out[name] = value
        else:
            raise UsageError(f"--tolerance: unknown metric {name!r}; metrics: "
                             f"{', '.join(METRICS)}")
    return out


@dataclass(frozen=True)
class CheckResult:
    """One row per metric: metric, unit, baseline, now, allowed, tolerance_pct, change_pct,
    status (ok / regression / missing / not_in_baseline / unavailable), note."""

    rows: pl.DataFrame

    @property
    def failed(self) -> bool:
        return bool(self.rows["status"].is_in(["regression", "missing"]).any())

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        counts = self.rows["status"].value_counts().sort("status")
        return {"status": "regression" if self.failed else "ok", "exit_code": self.exit_code,
                "counts": dict(counts.rows()), "metrics": self.rows.to_dicts()}

    def _repr_html_(self) -> str:
        return (f"<p><b>check: {'REGRESSION' if self.failed else 'ok'}</b></p>"
                + self.rows._repr_html_())


def check(now: dict[str, float | None], base_doc: dict[str, Any], *,
          tolerances: dict[str, float] | None = None,
          now_notes: dict[str, str] | None = None) -> CheckResult:
    """Compare ``now`` (from :func:`extract_metrics`) with a baseline document.

    Tolerance per metric: ``tolerances`` (command line) over the baseline's own
    ``tolerance_pct`` over its ``default_tolerance_pct``.
    """
    now_notes = now_notes or {}
    stored = base_doc.get("tolerance_pct") or {}
    default = float(base_doc.get("default_tolerance_pct", DEFAULT_TOLERANCE_PCT))
    tol_all = {m: float((tolerances or {}).get(m, stored.get(m, default))) for m in METRICS}
    rows = []
    base_metrics = base_doc["metrics"]
    names = list(METRICS) + sorted(set(base_metrics) - set(METRICS))
    for name in names:
        unit = METRICS[name][0] if name in METRICS else base_metrics[name].get("unit", "")
        entry = base_metrics.get(name)
        b = None if entry is None else entry.get("value")
        v = now.get(name)
        tol = tol_all.get(name, default)
        allowed = None
        change = None
        note = now_notes.get(name)
        if entry is None:
            status = "not_in_baseline"
        elif b is None and v is None:
            status, note = "unavailable", note or entry.get("note")
        elif b is None:
            status, note = "not_in_baseline", "the baseline run had no value"
        elif v is None:
            status = "missing"
            note = note or "no value in this run"
        else:
            allowed = max(b * (1 + tol / 100.0), b + SLACK.get(unit, 0.0))
            change = (v - b) / b if b else None
            status = "regression" if v > allowed else "ok"
        rows.append({"metric": name, "unit": unit, "baseline": None if b is None else float(b),
                     "now": None if v is None else float(v), "allowed": allowed,
                     "tolerance_pct": tol, "change_pct": None if change is None else 100 * change,
                     "status": status, "note": note})
    schema = {"metric": pl.String, "unit": pl.String, "baseline": pl.Float64, "now": pl.Float64,
              "allowed": pl.Float64, "tolerance_pct": pl.Float64, "change_pct": pl.Float64,
              "status": pl.String, "note": pl.String}
    return CheckResult(pl.DataFrame(rows, schema=schema))


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        return f"{v / 1e6:.3f} ms"
    return f"{v:.4f}"


def describe(row: dict[str, Any]) -> str:
    """One line for a metric row (used in text output and JUnit messages)."""
    u = row["unit"]
    if row["status"] in ("ok", "regression"):
        rel = "" if row["change_pct"] is None else f" ({row['change_pct']:+.1f}%)"
        op = ">" if row["status"] == "regression" else "<="
        return (f"{row['metric']}: now {_fmt(row['now'], u)}{rel} {op} allowed "
                f"{_fmt(row['allowed'], u)} (baseline {_fmt(row['baseline'], u)}, "
                f"tolerance {row['tolerance_pct']:g}%)")
    return f"{row['metric']}: {row['status']}" + (f" ({row['note']})" if row["note"] else "")


def junit_xml(result: CheckResult, *, suite: str = "traceview.check") -> str:
    """JUnit XML: one ``testcase`` per metric; regressions and missing metrics are failures,
    unavailable / not-in-baseline ones skipped. No timestamps (deterministic)."""
    rows = result.rows.to_dicts()
    fails = sum(r["status"] in ("regression", "missing") for r in rows)
    skips = sum(r["status"] in ("unavailable", "not_in_baseline") for r in rows)
    root = ET.Element("testsuites", {"name": "traceview", "tests": str(len(rows)),
                                     "failures": str(fails), "errors": "0",
                                     "skipped": str(skips)})
    ts = ET.SubElement(root, "testsuite", {"name": suite, "tests": str(len(rows)),
                                           "failures": str(fails), "errors": "0",
                                           "skipped": str(skips), "time": "0"})
    for r in rows:
        case = ET.SubElement(ts, "testcase", {"classname": suite, "name": r["metric"],
                                              "time": "0"})
        text = describe(r)
        if r["status"] in ("regression", "missing"):
            f = ET.SubElement(case, "failure", {"type": r["status"], "message": text})
            f.text = text
        elif r["status"] in ("unavailable", "not_in_baseline"):
            ET.SubElement(case, "skipped", {"message": text})
        else:
            out = ET.SubElement(case, "system-out")
            out.text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") \
        + "\n"
