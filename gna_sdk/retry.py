"""One backoff: the delay after consecutive failures doubles from ``first`` up to ``maximum``.

Every retry loop of the agent (NATS connect, the forwarder, a crashing collector, a remediation
that failed, the budget's compare-and-set) uses it, so "how long until the next try" means the same
everywhere and is visible in one place.
"""

from __future__ import annotations

import math
import random


def delay_after(failures: int, first: float, maximum: float = math.inf, *, factor: float = 2.0) -> float:
    """The wait after ``failures`` consecutive failures: 0 for none, ``first`` for one, then growing."""
    if failures <= 0:
        return 0.0
    # the exponent is capped so a long outage never overflows a float
    return min(first * factor ** min(failures - 1, 64), maximum)


class Backoff:
    """A retry loop's state: ``next()`` after a failure, ``reset()`` after a success.

    ``jitter`` spreads many clients that failed together (a hundred agents after one NATS restart,
    a compare-and-set race) over ``[first/10, delay]`` instead of having them retry in lock-step.
    """

    def __init__(self, first: float, maximum: float, *, factor: float = 2.0, jitter: bool = False) -> None:
        if not 0 < first <= maximum:
            raise ValueError(f"backoff wants 0 < first <= maximum, got {first}, {maximum}")
        self.first = first
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.failures = 0

    def next(self) -> float:
        """Count one more failure; the delay to wait before the next try."""
        self.failures += 1
        d = delay_after(self.failures, self.first, self.maximum, factor=self.factor)
        return random.uniform(self.first / 10, d) if self.jitter else d

    def reset(self) -> None:
        self.failures = 0

    @property
    def current(self) -> float:
        """The delay the last failure asked for (no jitter), 0 before any."""
        return delay_after(self.failures, self.first, self.maximum, factor=self.factor)
