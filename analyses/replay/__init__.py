"""What-if replay of a run's dependency graph: one simulation behind the self-check, the
scenarios and the verdicts (``docs/metrics.md``, section *Replay*)."""

from __future__ import annotations

from .check import SelfCheck, self_check, step_times
from .graph import ReplayGraph, build_graph
from .simulate import Replayed, replay_graph
from .waits import WaitOptions, find_waits

__all__ = ["ReplayGraph", "Replayed", "SelfCheck", "WaitOptions", "build_graph", "find_waits",
           "replay_graph", "self_check", "step_times"]
