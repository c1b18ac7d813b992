"""What a Run looks at, written as people write it: ranks ``0-3,7``, steps ``5:9``, a time
window ``100ms:300ms``, durations ``250us``.

The CLI's options and ``traceview.open``'s keywords take the same text (or the plain Python
values), so a window asked for either way is the same window, and describes itself the same way
in ``--json`` (:func:`describe_ranks`, :func:`describe_steps`).

>>> parse_ranks("0-2,7")
[0, 1, 2, 7]
>>> describe_ranks([0, 1, 2, 7])
'0-2,7'
>>> parse_steps("5:9"), describe_steps((5, 9))
((5, 9), '5:9')
>>> parse_duration("1.5ms")
1500000
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from traceview.errors import UsageError

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "": 1}

Steps = tuple[int | None, int | None]

#: Clock alignment methods (``traceview.analyses.align`` defines what each does). Kept here, at
#: the bottom of the layers, so checking ``--align`` imports no alignment code.
ALIGN_METHODS: tuple[str, ...] = ("auto", "none", "host", "collectives")


#: The highest rank a ``--ranks`` text may name (ranks are stored as Int32).
MAX_RANK = 2**31 - 1


def rank_ranges(spec: str) -> list[tuple[int, int]]:
    """``"0-3,7"`` -> ``[(0, 3), (7, 7)]``: the ranges as written, never expanded (a range
    may be ``0-1000000000``); a usage error for text that is not ranks."""
    ranges = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise UsageError(f"--ranks wants e.g. 0-3,7, got {spec!r}") from None
        if not 0 <= first <= last <= MAX_RANK:
            raise UsageError(f"--ranks wants ranks from 0 to {MAX_RANK}, low before high, "
                             f"got {spec!r}")
        ranges.append((first, last))
    return ranges


def parse_ranks(spec: str | Iterable[int] | None,
                present: Iterable[int] | None = None) -> list[int] | None:
    """``"0-3,7"`` (or any iterable of ints) -> sorted unique ranks; None: every rank.

    ``present``: the ranks there are; the answer is those the text names (a range is
    compared with them, never expanded, so ``0-1000000000`` costs what the run's ranks do).
    Without it a range is expanded, which the caller may do only for short texts."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    if not isinstance(spec, str):
        wanted = {int(r) for r in spec}
        return sorted(wanted if present is None else wanted & set(present))
    ranges = rank_ranges(spec)
    if present is not None:
        return sorted({r for r in present if any(lo <= r <= hi for lo, hi in ranges)})
    if sum(hi - lo + 1 for lo, hi in ranges) > MAX_EXPANDED_RANKS:
        raise UsageError(f"--ranks {spec} names more than {MAX_EXPANDED_RANKS} ranks")
    return sorted({r for lo, hi in ranges for r in range(lo, hi + 1)})


#: The most ranks :func:`parse_ranks` expands without the ranks present to compare with.
MAX_EXPANDED_RANKS = 1 << 20


def require_known_ranks(wanted: Iterable[int] | None, known: Iterable[int],
                        spec: object = None) -> None:
    """A ``--ranks`` choice naming none of the ranks there are is a usage error, naming them
    (``spec``: the text asked for, when ``wanted`` is already cut to the ranks present).

    >>> require_known_ranks([7], [0, 1, 2, 3])
    Traceback (most recent call last):
    ...
    traceview.errors.UsageError: --ranks 7 selects no rank of this run; ranks present: 0-3
    """
    known = list(known)
    if wanted is not None and known and not set(wanted) & set(known):
        asked = spec if isinstance(spec, str) else describe_ranks(wanted)
        raise UsageError(f"--ranks {asked} selects no rank of this run; "
                         f"ranks present: {describe_ranks(known)}")


def describe_ranks(ranks: Iterable[int] | None) -> str | None:
    """The shortest ``parse_ranks`` text for ``ranks``: runs of consecutive ranks as ``a-b``."""
    if ranks is None:
        return None
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def say_ranks(ranks: Iterable[int]) -> str:
    """Ranks as people write them in a sentence: ``2–127``, ``1, 3–5`` (inclusive ranges, an
    en dash), unlike ``describe_ranks``' option text.

    >>> say_ranks(range(2, 128)), say_ranks([1, 3, 4, 5]), say_ranks([7])
    ('2–127', '1, 3–5', '7')
    """
    spec = describe_ranks(ranks) or ""
    return ", ".join(part.replace("-", "–") for part in spec.split(",") if part)


def say_steps(first: int, last: int) -> str:
    """Steps ``first`` to ``last`` inclusive as people write them: ``551–552``, ``7``.

    >>> say_steps(551, 552), say_steps(7, 7)
    ('551–552', '7')
    """
    return f"{first}" if first == last else f"{first}–{last}"


def parse_steps(spec: str | Steps | range | None) -> Steps | None:
    """``"5:9"`` -> ``(5, 9)`` (half open); ``"5:"`` -> ``(5, None)``; ``"5"`` -> ``(5, 6)``;
    a ``range`` or a ``(start, stop)`` pair as it is."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    if isinstance(spec, range):
        return spec.start, spec.stop
    if not isinstance(spec, str):
        start, stop = spec
        return start, stop
    lo, sep, hi = spec.partition(":")
    try:
        start = int(lo) if lo.strip() else None
        stop = int(hi) if hi.strip() else (None if sep else start + 1 if start is not None else None)
    except ValueError:
        raise UsageError(f"--steps wants A:B, got {spec!r}") from None
    # stop is exclusive: the last step, MAX_STEP, is selected by a stop one past it
    if (start is not None and not 0 <= start <= MAX_STEP) or \
            (stop is not None and not 0 <= stop <= MAX_STEP + 1):
        raise UsageError(f"--steps wants steps from 0 to {MAX_STEP}, got {spec!r}")
    return start, None if stop == MAX_STEP + 1 else stop  # past every step: no end


#: The highest step number (step numbers are int64).
MAX_STEP = 2**63 - 1


def describe_steps(steps: Steps | None) -> str | None:
    if steps is None:
        return None
    start, stop = steps
    return f"{'' if start is None else start}:{'' if stop is None else stop}"


def parse_duration(text: str | int) -> int:
    """``"1.5ms"`` -> 1500000 (ns); a bare number is ns."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|)\s*", text)
    if not m:
        raise UsageError(f"not a duration: {text!r} (e.g. 250us, 1.5ms, 2s)")
    ns = float(m.group(1)) * _UNITS[m.group(2)]
    if not ns <= MAX_DURATION_NS:  # also nan and inf (a number of 400 digits)
        raise UsageError(f"a duration of at most {MAX_DURATION_NS // 1_000_000_000} s, "
                         f"got {text!r}")
    return round(ns)


#: The longest duration a text may give (about 292 years: ns in an int64).
MAX_DURATION_NS = 2**63 - 1


def parse_time_window(spec: str | tuple[int | None, int | None] | None
                      ) -> tuple[int | None, int | None] | None:
    """``"100ms:300ms"`` -> ns from the first event; a ``(start_ns, stop_ns)`` pair as it is."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    if not isinstance(spec, str):
        lo, hi = spec
        return lo, hi
    lo, sep, hi = spec.partition(":")
    if not sep:
        raise UsageError(f"--time wants A:B, got {spec!r}")
    return (parse_duration(lo) if lo.strip() else None,
            parse_duration(hi) if hi.strip() else None)


def describe_time(spec: str | tuple[int | None, int | None] | None) -> str | None:
    """The text the user gave, or ``"Ans:Bns"`` for a pair of nanoseconds."""
    if spec is None or isinstance(spec, str):
        return spec or None
    lo, hi = spec
    return f"{'' if lo is None else f'{lo}ns'}:{'' if hi is None else f'{hi}ns'}"
