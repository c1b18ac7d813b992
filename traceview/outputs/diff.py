"""Run comparison for runs or events in memory: ``diff(base, test)``, computed as
``Run.diff`` and ``traceview diff`` do (``traceview.run.compare``; docs/metrics.md, section
*Run comparison*)."""

from __future__ import annotations

from typing import Any

from traceview.run.compare import DiffResult, RunTables, diff_tables, mann_whitney_u
from traceview.run.compare import run_tables as _run_tables
from traceview.run.run import as_run

__all__ = ["DiffResult", "RunTables", "diff", "diff_tables", "mann_whitney_u", "run_tables"]


def run_tables(source: Any) -> RunTables:
    """``compare.run_tables`` of a Run, or of events in memory (``Run.from_events``)."""
    return _run_tables(as_run(source))


def diff(base: Any, test: Any, *, alpha: float = 0.05, top: int = 10) -> DiffResult:
    """Compare run ``base`` with run ``test``: Runs, or events of each (``TraceSet.events``).
    ``base.diff(test)`` of two Runs is the same comparison as a Result, with warnings."""
    return diff_tables(run_tables(base), run_tables(test), alpha=alpha, top=top)
