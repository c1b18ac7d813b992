"""The report's data: the result frames behind each section, gathered from one Run by
:func:`traceview.outputs.report.gather` and rendered by :mod:`traceview.outputs.report_sections`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceview.outputs import report_html as H


@dataclass(frozen=True)
class HistoryTrend:
    """A gate metric over the recorded runs (``traceview.outputs.history.trend``) and this
    run's value of it (None: the run has none), from the database ``source``."""

    metric: str
    unit: str
    runs: pl.DataFrame
    current: float | None
    source: str


@dataclass(frozen=True)
class ReportData:
    """Result frames behind the report. ``notes[section]`` says why a section is partial."""

    title: str
    meta: dict[str, Any]
    summary: pl.DataFrame
    worst_straggler: dict[str, Any]
    step_spans: pl.DataFrame
    breakdown: pl.DataFrame
    lateness: pl.DataFrame
    collectives: pl.DataFrame
    stragglers: pl.DataFrame
    gap_causes: pl.DataFrame
    largest_gaps: pl.DataFrame
    top_kernels: pl.DataFrame
    top_cpu_ops: pl.DataFrame
    offsets: pl.DataFrame
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: what the inputs and the shared tables said about the data (shown first in the page)
    warnings: list[str] = field(default_factory=list)
    #: the top kernels over all ranks (``analyses.breakdown.kernels_across_ranks``)
    kernel_totals: pl.DataFrame | None = None
    #: achieved FLOP/s and MFU per rank and step, when the trace carries FLOP counts
    flops: pl.DataFrame | None = None
    #: the NCCL debug log's view (``--nccl-log``): ``choices`` and ``calls`` tables
    nccl: dict[str, pl.DataFrame] | None = None
    #: ``collectives``' summary rows (per group, op, size, locality) with ``time_is``
    collective_summary: pl.DataFrame | None = None
    #: the flight-recorder verdict (``--fr-dumps``, ``traceview.run.hang``), as ``hang --json``
    hang: dict[str, Any] | None = None
    #: the memory timeline (``analyses.memory.timeline_points``) and the trace rows of
    #: ``run.memory()`` with ``peak_ms`` on the timeline's axis
    memory_points: pl.DataFrame = field(default_factory=pl.DataFrame)
    memory_peaks: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: ``critical-path`` and ``diagnose`` results (``Result`` objects), None when not gathered
    critical_path: Any = None
    diagnose: Any = None
    #: the ``pipeline`` result (``Result``, with its ``timeline``) when the run has send/recv
    #: pairs, None otherwise
    pipeline: Any = None
    #: the ``alltoall`` result (a ``Result``), None when the run has no all-to-all
    alltoall: Any = None
    #: ``report --history``: one gate metric over recorded runs and this run's value
    #: (:class:`HistoryTrend`), None without a history database
    history: HistoryTrend | None = None
    #: the ``ops`` result by shape (a ``Result``), None without GPU events
    ops: Any = None
    #: the run's bound (``Run.bound``), the one summary, overlap and diagnose name
    bound: dict[str, Any] = field(default_factory=dict)
    #: the registered analyses that ask for a section (``traceview.run.registry``,
    #: ``report=True``): command -> (its help line, its ``Result``, None where it failed)
    registered: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th>{H.e(k)}</th><td>{H.e(v)}</td></tr>"
                       for k, v in self.meta.items())
        return (f"<p><b>{H.e(self.title)}</b></p><table>{rows}</table>"
                + self.summary._repr_html_())
