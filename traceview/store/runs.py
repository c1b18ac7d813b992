"""One run or two: can files that claim one rank be one process's profiling windows?

Profiling windows are real (a ``torch.profiler`` schedule with ``repeat`` other than 1 writes
a file per cycle), but they come from one process. So the files of one rank are windows of
**one run** only when they agree on everything a process keeps for its lifetime (docs/formats.md,
*One run*):

* the capture: the format family (a Kineto trace and an nsys export are two captures);
* the process: the host and the process id, where both files record them;
* ``distributedInfo``: world size and backend; the process groups may grow (a group created
  between two windows) but never lose one;
* the steps: ``ProfilerStep`` numbers keep counting up, so a later window's first step comes
  after the earlier window's last.

Files that claim one rank but differ in any of these are two runs, never blended: an error
naming both files and what differs, unless the caller keeps one run (``--run-of FILE``:
:func:`runs_of`, :func:`nearest_run`). Files of *different* ranks must agree on world size
and backend (the job), or they are two jobs; and ranks of one host (one clock) that profiled
the same steps at different times are two runs of the job (:func:`clock_difference`).

>>> a = RunIdentity("a.json", source="kineto", world_size=16, start_ns=0, end_ns=10)
>>> b = RunIdentity("b.json", source="kineto", world_size=2, start_ns=20, end_ns=30)
>>> run_difference(a, b)
'world size 16 vs 2'
>>> [[f.path for f in run] for run in runs_of([a, b])]
[['a.json'], ['b.json']]
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class RunIdentity:
    """What a file says about the run that wrote it (None: the file does not say)."""

    path: str
    source: str | None = None
    host: str | None = None
    pid: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    first_step: int | None = None
    last_step: int | None = None


def job_difference(a: RunIdentity, b: RunIdentity) -> str | None:
    """What shows that ``a`` and ``b`` (of any ranks) come from two jobs, or None."""
    for label, x, y in (("world size", a.world_size, b.world_size),
                        ("backend", a.backend, b.backend)):
        if x is not None and y is not None and x != y:
            return f"{label} {x} vs {y}"
    return None


#: Host names that many machines share, so they do not show that two files share a clock.
_SHARED_HOST_NAMES = frozenset({"", "localhost", "localhost.localdomain", "unknown"})


def clock_difference(earlier: RunIdentity, later: RunIdentity) -> str | None:
    """What shows that files of two ranks, ``earlier`` starting first, are two runs by their
    times; None when nothing does. Ranks of one run profile the same steps at the same time.
    On one host there is one clock, so the same step numbers recorded with no time in common
    are two runs. On two hosts (or hosts unnamed) their clocks may differ instead, which
    ``traceview validate`` reports as ``windows_disjoint``; and ranks that profiled different
    steps (one run, ranks on different schedules) are ``steps_disjoint`` there."""
    host = earlier.host
    if host is None or host != later.host or host.strip().lower() in _SHARED_HOST_NAMES:
        return None
    if None in (earlier.end_ns, later.start_ns, earlier.first_step, earlier.last_step,
                later.first_step, later.last_step):
        return None
    gap = later.start_ns - earlier.end_ns
    shared = (max(earlier.first_step, later.first_step),
              min(earlier.last_step, later.last_step))
    if gap <= 0 or shared[0] > shared[1]:
        return None
    steps = f"{shared[0]}" if shared[0] == shared[1] else f"{shared[0]}..{shared[1]}"
    return (f"both profiled step {steps} on host {host}, one clock, but the second starts "
            f"{gap / 1e9:.3f} s after the first ends")


def run_difference(earlier: RunIdentity, later: RunIdentity) -> str | None:
    """What shows that two files of one rank, ``earlier`` starting first, are two runs rather
    than two profiling windows of one process; None when nothing does."""
    if earlier.source != later.source:
        return f"a {earlier.source} capture and a {later.source} capture"
    found = job_difference(earlier, later)
    if found:
        return found
    for label, x, y in (("host", earlier.host, later.host),
                        ("process id", earlier.pid, later.pid)):
        if x is not None and y is not None and x != y:
            return f"{label} {x} vs {y}"
    lost = _groups(earlier.pg_config) - _groups(later.pg_config)
    if later.pg_config is not None and earlier.pg_config is not None and lost:
        return f"process groups differ ({_group_text(sorted(lost)[0])} only in the first)"
    if (earlier.last_step is not None and later.first_step is not None
            and later.first_step <= earlier.last_step):
        return (f"steps start again ({earlier.first_step}..{earlier.last_step}, then "
                f"{later.first_step}..{later.last_step})")
    return None


def runs_of(files: list[RunIdentity]) -> list[list[RunIdentity]]:
    """The files of one rank grouped into runs, each in time order: a file joins the first
    run whose latest file it follows without overlap or difference; the runs are ordered by
    their first file."""
    runs: list[list[RunIdentity]] = []
    for f in sorted(files, key=lambda f: (f.start_ns is None, f.start_ns or 0, f.path)):
        home = next((run for run in runs if _follows(run[-1], f)), None)
        if home is None:
            runs.append([f])
        else:
            home.append(f)
    return runs


def nearest_run(runs: list[list[RunIdentity]], reference: list[RunIdentity]
                ) -> list[RunIdentity] | None:
    """The run (of another rank) that is ``reference``'s: same job, and the most time in
    common with the reference's span (ranks of one run profile the same steps; clocks differ
    by far less than runs do). None when no run of the same job overlaps it at all."""
    start = min((f.start_ns for f in reference if f.start_ns is not None), default=None)
    end = max((f.end_ns for f in reference if f.end_ns is not None), default=None)
    if start is None or end is None:
        return None  # a reference without timed events has no span to share

    def common(run: list[RunIdentity]) -> int:
        s = min((f.start_ns for f in run if f.start_ns is not None), default=end)
        e = max((f.end_ns for f in run if f.end_ns is not None), default=start)
        return min(e, end) - max(s, start)

    same_job = [run for run in runs if job_difference(run[0], reference[0]) is None]
    best = max(same_job, key=common, default=None)
    return best if best is not None and common(best) > 0 else None


def _follows(earlier: RunIdentity, later: RunIdentity) -> bool:
    disjoint = (earlier.end_ns is not None and later.start_ns is not None
                and later.start_ns >= earlier.end_ns)
    return disjoint and run_difference(earlier, later) is None


def _groups(pg_config: str | None) -> set[tuple[str, tuple[int, ...]]]:
    """``pg_config`` (JSON list of groups) as a set of (name, ranks); unreadable: empty."""
    try:
        entries = json.loads(pg_config) if pg_config else []
    except ValueError:
        return set()
    out = set()
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            ranks = e.get("ranks") if isinstance(e.get("ranks"), list) else []
            out.add((str(e.get("pg_name")), tuple(r for r in ranks if isinstance(r, int))))
    return out


def _group_text(group: tuple[str, tuple[int, ...]]) -> str:
    return f"group {group[0]} of ranks {list(group[1])}"


__all__ = ["RunIdentity", "clock_difference", "job_difference", "nearest_run", "run_difference", "runs_of"]
