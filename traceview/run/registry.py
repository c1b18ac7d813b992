"""The analyses a Run answers: one table that the Run, the command line and the report read.

Each :class:`Analysis` names its method ``run.NAME(**options)`` (the command is ``NAME`` with
``-`` for ``_``), its help line, the function that builds its
:class:`~traceview.run.result.Result` and the ``traceview.cli`` module that adds its options
and prints its text. From this table the Run gets its methods (``traceview.run.run``), the
command line its analysis commands and their kept answers (``traceview.cli.COMMANDS``), and
the report the sections of analyses that ask for one (``report=True``).

An analysis is either *composed* (``answer``: a function of the Run that builds the Result
itself, for answers that join several analyses) or *a table of tables* (``function``: a pure
function under ``analyses/`` and the Run's shared ``tables`` it takes, in order; the Result is
built for it: ``traceview.run.answers``). The second kind is how a new analysis is added:
its module, its test, and one line here (docs/architecture.md, "Adding an analysis"):

    Analysis("long_kernels", "GPU kernels of at least a duration",
             function="traceview.analyses.long_kernels:long_kernels", tables=("gpu",),
             options={"min_ns": "shortest kernel to list (ns)"}),

This module imports nothing of traceview's (functions are named as ``module:function`` and
imported on first use), so the command line reads the table before it imports Polars. An
analysis added at run time (a plugin's, a test's) goes through ``traceview.run.run.register``,
which also gives the Run its method.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Analysis:
    """One analysis command: ``run.NAME(**options) -> Result`` and ``traceview NAME``."""

    name: str  #: the Run's method; the command is the name with ``-`` for ``_``
    help: str  #: the command's help line
    #: composed: ``"module:function"``, ``function(run, **options) -> Result``
    answer: str | None = None
    #: a table of tables: ``"module:function"``, ``function(*tables, **options)`` returning a
    #: frame (the main table, ``rows``) or a dict of fields (the first frame is the main one)
    function: str | None = None
    #: the Run's shared tables ``function`` takes, in order (``gpu``, ``host``, ``steps``,
    #: ``ranks_table``, ``collective_ranks`` ...)
    tables: tuple[str, ...] = ()
    #: keyword option -> its help on the command line (names, defaults and types come from
    #: ``function``'s keyword-only parameters); ``cli="analysis"`` adds them
    options: Mapping[str, str] = field(default_factory=dict)
    #: the ``traceview.cli`` module that adds the command's options and prints its text
    #: (``configure(parser, command)``); ``analysis``: the options above, the main table
    cli: str = "analysis"
    #: a table of tables only: the report shows its main table in a section of its own
    report: bool = False

    def __post_init__(self) -> None:
        if (self.answer is None) == (self.function is None):
            raise ValueError(f"analysis {self.name!r}: give answer or function, not both")
        if self.answer is not None and (self.tables or self.report):
            raise ValueError(f"analysis {self.name!r}: tables and report= are for a function")

    @property
    def command(self) -> str:
        """The command's name: ``critical_path`` -> ``critical-path``."""
        return self.name.replace("_", "-")


def resolve(reference: str) -> Callable[..., Any]:
    """``"package.module:function"``, imported now."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


_RUN = "traceview.run"

#: Every analysis, in the order ``traceview --help`` lists them.
ANALYSES: dict[str, Analysis] = {a.name: a for a in (
    Analysis("align", "per-rank clock offsets from collectives",
             answer=f"{_RUN}.distributed:align", cli="distributed"),
    Analysis("collectives", "collectives matched across ranks: skew, wait, bandwidth, tails",
             answer=f"{_RUN}.distributed:collectives", cli="distributed"),
    Analysis("stragglers", "which rank holds the others back",
             answer=f"{_RUN}.distributed:stragglers", cli="distributed"),
    Analysis("pipeline", "pipeline stages from send/recv: where each stage's step goes, the "
                         "bubble, the schedule, the bottleneck stage",
             answer=f"{_RUN}.distributed:pipeline", cli="distributed"),
    Analysis("alltoall", "all-to-all volumes per rank, the rank x rank matrix, the hot rank "
                         "and the step time its imbalance costs",
             answer=f"{_RUN}.distributed:alltoall", cli="distributed"),
    Analysis("critical_path", "the critical path across ranks, per step: its ranks, "
                              "categories and ops",
             answer=f"{_RUN}.diagnosis:critical_path", cli="diagnosis"),
    Analysis("diagnose", "what to fix first: findings ranked by the time each fix would save "
                         "per step",
             answer=f"{_RUN}.diagnosis:diagnose", cli="diagnosis"),
    Analysis("whatif", "replay the run from its dependency graph: the replay's error against "
                       "the measured steps, and what-if scenarios' step times and gains",
             answer=f"{_RUN}.diagnosis:whatif", cli="whatif"),
    Analysis("gaps", "GPU idle gaps per device (or stream) and their causes",
             answer=f"{_RUN}.timeline:gaps", cli="timeline"),
    Analysis("overlap", "compute/communication overlap per rank (and step)",
             answer=f"{_RUN}.timeline:overlap", cli="timeline"),
    Analysis("breakdown", "per-step GPU time breakdown, top kernels and ops",
             answer=f"{_RUN}.timeline:breakdown", cli="timeline"),
    Analysis("summary", "one screen per run: steps, compute, comm, idle, gaps",
             answer=f"{_RUN}.timeline:summary", cli="timeline"),
    Analysis("ops", "per operator: GPU time, FLOPs and bytes from shapes, achieved TFLOP/s and "
                    "TB/s, roofline bound and fraction",
             answer=f"{_RUN}.ops:ops", cli="ops"),
    Analysis("memory", "peak memory per rank and device, growth, pressure; snapshots",
             answer=f"{_RUN}.memory:memory", cli="memory"),
)}
