"""The replay's culprit verdict (``verdicts.culprits``) as ``diagnose`` findings and as one
line of words, so ``diagnose``, ``stragglers``, ``summary`` and the report say the same.

The straggler analysis (``analyses.stragglers``) reads the collectives' lateness over every
step; where it flags a rank, that steady straggler is the answer and the replay gives its
gain. Where it flags nobody, the replay alone can see what it cannot (docs/metrics.md,
*Replay verdicts*):

* ``several_stragglers``: two or more ranks, each slow on most steps, each named with its own
  (marginal) gain; the finding's gain is their combined replayed gain, never a sum;
* ``intermittent_stall``: one rank slow on a few steps, with those steps, the cost per step
  over the window (the finding's gain) and per occurrence;
* ``moving_stall``: a stall on a different rank at different steps: no rank is named (the
  finding's ``rank`` is null); its gain is the replay of all of them typical at once.

A lone replay culprit that the straggler analysis did not flag makes no finding: its
collectives show no lateness that sets it apart from the run's noise, so it stays evidence in
``stragglers --json`` (``replay_culprits``). Every finding carries the replay's confidence:
``low`` when the replay is not trusted (its p90 error above 5%), the steps and dependencies
that do not reproduce then named in its evidence; a replay-only finding is at most
``medium``, as no second analysis backs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RECOMMENDATIONS: dict[str, str] = {
    "several_stragglers": (
        "Investigate each named rank: the others wait for each of them in turn. Fix the one "
        "with the largest gain first; the combined gain is what fixing all of them saves."),
    "intermittent_stall": (
        "Find what rank {rank} does on the named steps only: a checkpoint write, a garbage "
        "collection, a data-loader refill, a log flush. Move it off the training thread or "
        "spread it over the steps."),
    "moving_stall": (
        "A stall that visits a different rank each time is a job-wide cause, not one bad "
        "host: look for periodic work every rank does at its own moment (logging, GC, data "
        "loading from shared storage) and align or remove it."),
}


def replay_named(verdict: dict[str, Any] | None, *, flagged: list[int]) -> str | None:
    """Which replay-only pattern is a verdict of every command: ``moving``, ``few_steps`` or
    ``several`` (None: the straggler analysis flags a rank, or the replay names no pattern
    of its own: nobody, or one steady culprit the lateness does not set apart)."""
    if verdict is None or flagged:
        return None
    pattern = verdict.get("pattern")
    if pattern in ("moving", "few_steps") and (pattern == "moving" or verdict.get("culprits")):
        return pattern
    if pattern == "steady" and len(verdict.get("culprits") or []) >= 2:
        return "several"
    return None


def replay_findings(verdict: dict[str, Any] | None, *, flagged: list[int],
                    causes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The replay-only findings (none when the straggler analysis flags a rank or there is no
    verdict). ``causes``: what does not reproduce (``SelfCheck.causes``' ``what``), evidence
    of a low confidence."""
    pattern = replay_named(verdict, flagged=flagged)
    if verdict is None or pattern is None:
        return []
    # diagnose keeps a finding of at least its KEEP share of the step (no "keep" here)
    named = verdict.get("culprits") or []
    trusted = bool(verdict.get("trusted"))
    doubt = [] if trusted else [_ev("replay_not_reproduced", len(causes), "count",
                                    "; ".join(causes[:5]) or "replay error p90 above 5%")]
    confidence = "medium" if trusted else "low"
    if pattern == "moving":
        cost = float(verdict.get("moving_cost_ns_per_step") or 0.0)
        ranks = verdict.get("moving_ranks") or []
        return [{
            "id": "moving_stall", "rank": None, "gain_ns_per_step": int(round(cost)),
            "title": f"A stall moves between ranks {_ranks(ranks)}: no single straggler; it "
                     f"costs {_time(cost)} per step (replayed with them all typical)",
            "evidence": [_ev("moving_cost_ns_per_step", cost, "ns"),
                         _ev("moving_ranks", len(ranks), "count", _ranks(ranks)),
                         *[_ev("rank_steps", len(c["steps"]), "count",
                               f"rank {c['rank']}: steps {_ranks(c['steps'])}")
                           for c in named if c.get("steps")], *doubt],
            "recommendation": RECOMMENDATIONS["moving_stall"], "confidence": confidence,
            "max_severity": "medium" if not trusted else None}]
    out = []
    if pattern == "few_steps":
        for c in named:
            per_step = float(c["gain_ns_per_step"])
            occurrence = float(c.get("cost_ns_per_occurrence") or 0.0)
            out.append({
                "id": "intermittent_stall", "rank": c["rank"],
                "gain_ns_per_step": int(round(per_step)),
                "title": f"Rank {c['rank']} stalls on steps {_ranks(c['steps'])} only: "
                         f"{_time(occurrence)} each time, {_time(per_step)} per step over "
                         "the window",
                "evidence": [_ev("stall_steps", len(c["steps"]), "count", _ranks(c["steps"])),
                             _ev("cost_ns_per_occurrence", occurrence, "ns"),
                             _ev("replay_gain_ns_per_step", per_step, "ns",
                                 "replayed with the rank typical"),
                             _ev("slowdown", c.get("slowdown"), "ratio"), *doubt],
                "recommendation": RECOMMENDATIONS["intermittent_stall"].format(rank=c["rank"]),
                "confidence": _at_most(c.get("confidence"), confidence),
                "max_severity": "medium" if not trusted else None})
        return out
    if pattern == "several":
        combined = float(verdict.get("combined_gain_ns_per_step") or 0.0)
        each = ", ".join(f"rank {c['rank']} {_time(c['gain_ns_per_step'])}" for c in named)
        return [{
            "id": "several_stragglers", "rank": None, "gain_ns_per_step": int(round(combined)),
            "title": f"Ranks {_ranks([c['rank'] for c in named])} each hold the others back "
                     f"({each} per step, each on top of the ones before); fixing all saves "
                     f"{_time(combined)} per step (replayed, not summed)",
            "evidence": [*[_ev("replay_gain_ns_per_step", c["gain_ns_per_step"], "ns",
                               f"rank {c['rank']}") for c in named],
                         _ev("combined_gain_ns_per_step", combined, "ns",
                             "replayed with all of them typical"), *doubt],
            "recommendation": RECOMMENDATIONS["several_stragglers"],
            "confidence": confidence, "max_severity": "medium" if not trusted else None}]
    return []


def culprit_evidence(verdict: dict[str, Any] | None, rank: int) -> list[dict[str, Any]]:
    """Evidence for a flagged straggler ``rank``: the replay's other culprits, each with its
    own gain on top of the ones before, and their combined (replayed) gain; none when the
    replay names no other rank."""
    others = [c for c in (verdict or {}).get("culprits") or [] if c["rank"] != rank]
    if not others:
        return []
    return [*(_ev("replay_other_culprit_gain_ns_per_step", c["gain_ns_per_step"], "ns",
                  f"rank {c['rank']} ({c.get('confidence')})") for c in others),
            _ev("replay_combined_gain_ns_per_step", verdict.get("combined_gain_ns_per_step"),
                "ns", "replayed with every culprit typical")]


def verdict_words(verdict: dict[str, Any] | None) -> str | None:
    """One line for the text outputs: the replay's culprits or pattern (None: nothing)."""
    if not verdict:
        return None
    pattern = verdict.get("pattern")
    low = "" if verdict.get("trusted") else " (low confidence: the replay is not trusted)"
    named = verdict.get("culprits") or []
    if pattern == "moving":
        return (f"moving stall across ranks {_ranks(verdict.get('moving_ranks') or [])}: "
                f"{_time(verdict.get('moving_cost_ns_per_step') or 0)} per step, no single "
                f"straggler{low}")
    if pattern == "few_steps":
        return "; ".join(f"intermittent stall on steps {_ranks(c['steps'])} (rank {c['rank']}: "
                         f"{_time(c.get('cost_ns_per_occurrence') or 0)} each, "
                         f"{_time(c['gain_ns_per_step'])} per step)" for c in named) + low
    if named:
        each = ", ".join(f"rank {c['rank']} {_time(c['gain_ns_per_step'])}" for c in named)
        more = f"; together {_time(verdict.get('combined_gain_ns_per_step') or 0)} " \
               "(replayed)" if len(named) > 1 else ""
        lead = "several stragglers" if len(named) > 1 else "replay culprit"
        return f"{lead}: {each} per step{more}{low}"
    return None


def _at_most(level: str | None, cap: str) -> str:
    order = ["low", "medium", "high"]
    level = level or "low"
    return level if order.index(level) <= order.index(cap) else cap


def _ranks(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _time(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def _ev(metric: str, value: float | None = None, unit: str | None = None,
        text: str | None = None) -> dict[str, Any]:
    return {"metric": metric, "value": None if value is None else float(value), "unit": unit,
            "text": text}


__all__ = ["RECOMMENDATIONS", "culprit_evidence", "replay_findings", "replay_named", "verdict_words"]
