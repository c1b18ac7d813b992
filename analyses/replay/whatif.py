"""The what-if answer: the self-check's steps and each scenario's predicted steps.

A scenario's replay and the replay of the measured run share every error of the graph, so
the scenario's effect is their difference: per step, ``predicted_ns`` = measured - (replayed
- scenario's replay), and ``gain_ns_per_step`` = mean replayed - mean scenario's replay
over the window's steps (a stall on 2 of 8 steps moves the mean by a quarter of its cost).
``slowdown`` is the study's S = T / T_ideal, both replayed: the mean replayed step over
the mean scenario step.

>>> import polars as pl
>>> base = pl.DataFrame({"step": [1, 2], "measured_ns": [100, 200], "replayed_ns": [98, 202]})
>>> scenario_summary("rank=1:typical", base, pl.Series([90, 100]))["gain_ns_per_step"]
55.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from .check import SelfCheck, self_check, step_times
from .graph import ReplayGraph
from .scenarios import parse_scenario, scenario_work
from .simulate import Replayed, replay_graph


@dataclass(frozen=True)
class Replay:
    """A run's graph, the replay of the measured run and its self-check."""

    graph: ReplayGraph
    base: Replayed
    check: SelfCheck


def replay_run(graph: ReplayGraph) -> Replay:
    base = replay_graph(graph)
    return Replay(graph, base, self_check(graph, base))


def scenario_summary(spec: str, base: pl.DataFrame, replayed_steps: pl.Series) -> dict[str, Any]:
    """One scenario's entry of the ``--json`` contract from the base steps (``step,
    measured_ns, replayed_ns``) and the scenario's replayed step times (same order)."""
    steps = base.with_columns(scenario_ns=replayed_steps).with_columns(
        predicted_ns=pl.col("measured_ns") - (pl.col("replayed_ns") - pl.col("scenario_ns")))
    gain = float(steps.get_column("replayed_ns").mean() - steps.get_column("scenario_ns").mean())
    ideal = float(steps.get_column("scenario_ns").mean())
    return {
        "spec": spec,
        "step_ns_mean": float(steps.get_column("predicted_ns").mean()),
        "step_ns_p50": float(steps.get_column("predicted_ns").median()),
        "gain_ns_per_step": gain,
        "slowdown": float(steps.get_column("replayed_ns").mean()) / ideal if ideal > 0 else None,
        "steps": [{"step": s, "predicted_ns": p, "replayed_ns": r}
                  for s, p, r in steps.select("step", "predicted_ns", "scenario_ns").rows()],
    }


def replay_scenario(graph: ReplayGraph, spec: str) -> Replayed:
    """The replay of ``graph`` under one scenario text (``SpecError`` when unreadable)."""
    work, scale, lags = scenario_work(graph, parse_scenario(spec))
    return replay_graph(graph, work_ns=work, transfer_scale=scale, edge_lags=lags)


def whatif(graph: ReplayGraph, scenarios: Sequence[str] = (), *,
           base: Replayed | None = None) -> tuple[SelfCheck, list[dict[str, Any]]]:
    """The self-check and one entry per scenario (parsed first: a bad SPEC raises
    ``SpecError`` before any replay)."""
    for spec in scenarios:
        parse_scenario(spec)
    base = base if base is not None else replay_graph(graph)
    check = self_check(graph, base)
    steps = check.steps.select("step", "measured_ns", "replayed_ns")
    out = []
    for spec in scenarios:
        replayed = step_times(graph.points, replay_scenario(graph, spec).time)
        aligned = steps.join(replayed.select("step", s="replayed_ns"), on="step", how="left")
        out.append(scenario_summary(spec, steps, aligned.get_column("s")))
    return check, out


__all__ = ["Replay", "replay_run", "replay_scenario", "scenario_summary", "whatif"]
