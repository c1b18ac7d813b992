"""The sentences people read about a run's verdict, written once: the CLI and the report print
the same words for the same fact (``traceview diagnose``'s findings, the worst straggler).

>>> straggler_sentence({"rank": None, "reason": "unsure: rank 1 leads, but not clearly above "
...                     "the run's noise"})
"worst straggler: unsure: rank 1 leads, but not clearly above the run's noise"
>>> finding_headline({"gain_ns_per_step": 2_500_000, "gain_share": 0.25, "title": "Idle GPU",
...                   "path_ns_per_step": None, "path_share": None})
'save ~2.500 ms/step (25.0%): Idle GPU'
"""

from __future__ import annotations

from typing import Any


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def finding_headline(finding: dict[str, Any]) -> str:
    """A ``diagnose`` finding in one line: what it would save a step, then its title."""
    # a trace without steps: the gains are the window's, never "per step"
    unit = "ms in the window" if finding.get("per") == "window" else "ms/step"
    if finding.get("gain_ns_per_step") is not None:
        gain = (f"save ~{_ms(finding['gain_ns_per_step'])} {unit} "
                f"({_pct(finding.get('gain_share'))})")
    else:
        gain = (f"{_ms(finding.get('path_ns_per_step'))} {unit} on the path "
                f"({_pct(finding.get('path_share'))}), gain unknown")
    return f"{gain}: {finding['title']}"


def straggler_sentence(worst: dict[str, Any]) -> str:
    """``summary``'s worst straggler: the flagged rank with the wait its own time caused and
    the confidence, the rank the data cannot decide on (unsure), or none with the reason."""
    if worst.get("rank") is not None:
        caused = worst.get("caused_wait_ns", worst.get("imposed_wait_ns"))
        return (f"worst straggler: rank {worst['rank']} (its own time caused {_ms(caused)} ms "
                f"of waiting in the window; confidence {worst.get('confidence') or '-'})")
    reason = worst.get("reason") or "no rank holds the others back"
    if reason.startswith("unsure") or (worst.get("patterns") or {}).get("named"):
        # the replay's verdict: several ranks, a stall on a few steps, a moving stall
        return f"worst straggler: {reason}"
    return f"worst straggler: none ({reason})"


#: Warnings that leave the answer whole: an assumption the reader should know, input passed
#: over by design. They go to a collapsed list of notes; damage and low confidence (everything
#: else) stay in the warning box. A warning not listed here is shown prominently.
_NOTES = (
    "the trace names no rank; assuming rank 0",   # a single-file run: rank 0 is right
    "assuming rank 0",
    "passed over, not a trace",                    # a README or truth.json beside the traces
    "left out (--run-of)",                         # the user chose the run
    "queued before the profiler started",          # counted as GPU work, as the user expects
    "no GPU events",                               # said once, in the verdict
)


def is_note(warning: str) -> bool:
    """Is ``warning`` a benign note rather than damage or low confidence?"""
    return any(marker in warning for marker in _NOTES)


__all__ = ["finding_headline", "is_note", "straggler_sentence"]
