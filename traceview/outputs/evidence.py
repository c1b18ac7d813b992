"""How much evidence the gate's step test has: how many baseline steps (and so baseline runs)
it would take to decide a change, so that ``check`` can say "inconclusive: record N runs"
rather than calling an undecided change ``ok``.

The test is the one-sided Mann–Whitney U test of this run's ``m`` per-step samples against
``n`` pooled baseline samples. Two bounds, both pure arithmetic:

* :func:`min_baseline_steps`: the smallest ``n`` at which the test could reach ``alpha`` at
  all (every step of this run above every baseline step: ``p = 1 / C(m + n, m)``). Below it
  the test cannot say "slower" whatever the data.
* :func:`baseline_steps_to_decide`: a power-style estimate. The observed effect is
  ``theta = U / (m n)``, the share of (this step, baseline step) pairs in which this run's
  step is slower (0.5: no shift). Holding ``theta`` and ``m`` fixed, the normal approximation
  of ``U`` gives ``z = (theta - 1/2) / sqrt((m + n + 1) / (12 m n))``; the smallest ``n`` with
  ``z >= z_alpha`` (and with the exact bound above) is the baseline size at which a change of
  the size seen would be significant. As ``n`` grows ``z`` tends to
  ``(theta - 1/2) sqrt(12 m)``: when that is below ``z_alpha`` no number of baseline runs
  decides; this run needs more steps.

It is an estimate, not a promise: it assumes the next baseline runs' steps look like these.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from traceview.run.compare import mann_whitney_u

#: Past this many baseline steps the estimate gives up (the answer is "none would").
MAX_STEPS = 1_000_000


def min_p_value(m: int, n: int) -> float:
    """The smallest one-sided Mann-Whitney p-value ``m`` against ``n`` samples can give,
    1 / C(m + n, m): every sample of one side above every sample of the other.

    >>> round(min_p_value(4, 4), 4)
    0.0143
    """
    return 1.0 / math.comb(m + n, m)


def min_baseline_steps(m: int, alpha: float) -> int | None:
    """The smallest ``n`` with ``1 / C(m + n, m) < alpha``: fewer baseline steps cannot make
    the test significant whatever they hold. None when ``m`` is 0.

    >>> min_baseline_steps(4, 0.01), min_baseline_steps(6, 0.01), min_baseline_steps(1, 0.01)
    (5, 4, 100)
    """
    if m <= 0:
        return None
    n = 1
    while min_p_value(m, n) >= alpha:
        n += 1
    return n


def slower_share(now: list[float], base: list[float]) -> float | None:
    """``theta = U / (m n)``: the share of (this step, baseline step) pairs in which this
    run's step is the larger (ties count half). None when a side is empty.

    >>> slower_share([3.0, 4.0], [1.0, 2.0]), slower_share([1.0, 4.0], [2.0, 3.0])
    (1.0, 0.5)
    """
    if not now or not base:
        return None
    u = mann_whitney_u(now, base, alternative="greater")["u"]
    return float(u) / (len(now) * len(base))


def baseline_steps_to_decide(theta: float, m: int, alpha: float) -> int | None:
    """The smallest number of pooled baseline steps at which a change whose ``theta`` is what
    was observed would be significant at ``alpha`` against this run's ``m`` steps; None when
    no number would (``theta`` too close to 1/2 for ``m`` steps).

    >>> baseline_steps_to_decide(30 / 36, 6, 0.01)   # the ResNet-50 case: 6 steps vs 6
    15
    >>> baseline_steps_to_decide(0.7, 6, 0.01) is None  # 6 steps cannot show this at 0.01
    True
    """
    if m <= 0:
        return None
    z = NormalDist().inv_cdf(1.0 - alpha)
    d = theta - 0.5
    gain = 12.0 * m * d * d - z * z  # n (12 m d^2 - z^2) >= z^2 (m + 1)
    if d <= 0 or gain <= 0:
        return None
    n = max(1, math.ceil(z * z * (m + 1) / gain))
    floor = min_baseline_steps(m, alpha) or 1
    n = max(n, floor)
    return n if n <= MAX_STEPS else None


def runs_for(steps: int, steps_per_run: float) -> int:
    """Baseline runs holding ``steps`` steps at ``steps_per_run`` each (at least 1).

    >>> runs_for(15, 6.0), runs_for(5, 12.0)
    (3, 1)
    """
    return max(1, math.ceil(steps / steps_per_run)) if steps_per_run > 0 else 1
