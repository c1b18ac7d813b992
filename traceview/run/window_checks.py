"""What the window of a Run cannot give, said before any analysis runs: a window of steps,
time or warm-up with no event is a usage error naming what there is; a ``--steps`` range
past the trace's steps is analysed over those it has, with a note saying so.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview import selection
from traceview.errors import UsageError

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def check_window_not_empty(run: Run, selected: pl.DataFrame) -> None:
    """A window of steps, time or warm-up that holds no event of a run that has events is
    a usage error naming the steps there are and how long the run lasts."""
    if selected.height:
        return
    whole = run._rank_events.select(
        first=pl.col("step").min(), last=pl.col("step").max(), start=pl.col("ts_ns").min(),
        end=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max()).collect().row(0)
    if whole[2] is None:
        return  # no event at all: the analyses say so themselves

    asked = ", ".join(f"{name} {value}" for name, value in (
        ("--steps", selection.describe_steps(run.window.steps)),
        ("--time", selection.describe_time(run.options.time)),
        ("--skip-warmup", run.window.skip_warmup or None)) if value is not None)
    steps = ("no profiler steps" if whole[0] is None else
             f"steps present: {selection.say_steps(whole[0], whole[1])}")
    raise UsageError(f"{asked} selects no event of this run; {steps}, "
                     f"{(whole[3] - whole[2]) / 1e6:.3f} ms of events")


def steps_short_note(run: Run, selected: pl.DataFrame) -> list[str]:
    """A ``--steps`` range reaching past the steps the trace has is analysed over those it
    has: say so, with steps as people write them (inclusive)."""
    asked = run.window.steps
    if asked is None or selected.height == 0:
        return []
    have = selected.get_column("step").drop_nulls()
    if have.len() == 0:
        return []
    first, last = int(have.min()), int(have.max())
    lo = first if asked[0] is None else asked[0]
    hi = last if asked[1] is None else asked[1] - 1
    if lo >= first and hi <= last:
        return []
    whole = run._rank_events.select(first=pl.col("step").min(),
                                     last=pl.col("step").max()).collect().row(0)
    n = have.n_unique()
    return [f"steps: asked for steps {selection.say_steps(lo, hi)}, the trace has "
            f"{selection.say_steps(*whole)}: analysing {n} step{'s' if n != 1 else ''} "
            f"({selection.say_steps(first, last)})"]
