"""Trailing-window increase and rate of one cumulative hardware counter (IB port counters, NVML
PCIe replays and NVLink error counters), shared by the infiniband and nvml collectors.

Hardware counters start wherever the last driver load left them, wrap at their width, and go
back to zero when the driver reloads or an admin clears them. Everything here turns that into
increases that are never negative: the first sample is only a baseline, a wrap is an increase,
and a reset starts a new baseline with no rate until the next sample (a reset is not an event
count, and certainly not a negative one).

The window answers "how much did the counter grow over at least the last ``window`` seconds":
its baseline is the latest sample taken at or before ``now - window``, so the span covers the
whole window (plus at most one poll interval). Until the history is that long the stats say
``full=False`` and cover what there is; a rule then only fires on a count that is already over
its budget for the whole window (a sure breach, never an extrapolated one).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

Step = Literal["first", "increase", "wrap", "reset", "rejected"]
MAX_SAMPLES = 4096  # a pathologically short interval costs window coverage (full=False), never memory


def counter_increase(old: int, new: int, bits: int | None) -> int | None:
    """Increase from ``old`` to ``new``; None for a reset (the counter went back without wrapping).

    A counter of ``bits`` width wrapped when it went from its upper half to its lower half: the
    reading ran past 2^bits - 1. Anything else that goes backwards (a driver reload, an admin
    clear) is a reset: guessing a wrap there would invent billions of errors."""
    if new >= old:
        return new - old
    if bits is not None:
        half = 1 << (bits - 1)
        if old >= half > new:
            return new + (1 << bits) - old
    return None


def valid_reading(raw: object, bits: int | None) -> bool:
    """A reading a counter of ``bits`` width can hold: a non-negative int within the width (NVML's
    ctypes give ints; anything else came from a broken binding or a hostile stand-in)."""
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        return False
    return bits is None or raw >> bits == 0


@dataclass(frozen=True)
class WindowStats:
    count: int  # increase over ``span``
    span: float  # seconds covered, > 0
    full: bool  # the span covers the whole window that was asked for

    def per(self, unit: float) -> float:
        """The rate in events per ``unit`` seconds (unit 60: per minute)."""
        return self.count * unit / self.span

    def sure_per(self, unit: float, window: float) -> float:
        """The rate per ``unit`` seconds this window is sure of: over a full window the measured rate; over a
        partial one the counted increase spread over the whole ``window`` (what the rate is if nothing more
        happens before the window is full), never an extrapolation of the seconds there are. The one place
        this rule lives on the node side (the fleet's is fleet/stragglers.py ``signal_value``)."""
        if self.full or window <= 0:
            return self.per(unit)
        return self.count * unit / window

    def over(self, limit: float, window: float) -> bool:
        """More than ``limit`` events per ``window``: over a full window the measured rate decides (as
        NVSentinel's velocity thresholds do); over a partial one only a count already past the whole
        window's budget does, so a burst in the first seconds after start is not extrapolated."""
        if window <= 0:
            return self.count > limit
        return self.sure_per(window, window) > limit


class CounterWindow:
    """The corrected running total of one counter at each sample, kept for ``keep`` seconds."""

    def __init__(self, keep: float, bits: int | None = None) -> None:
        self.keep = keep
        self.bits = bits
        self._samples: deque[tuple[float, int]] = deque()  # (time, corrected running total)
        self._raw: int | None = None
        self.resets = 0
        self.wraps = 0
        self.rejected = 0

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def raw(self) -> int | None:
        """The last accepted reading (what the hardware said), None before the first."""
        return self._raw

    def restart(self, t: float) -> None:
        """A new baseline at ``t``: nothing before it counts."""
        self._samples.clear()
        self._samples.append((t, 0))

    def add(self, t: float, raw: object) -> Step:
        """Feed one reading of the counter taken at monotonic time ``t``."""
        if not valid_reading(raw, self.bits) or not math.isfinite(t) or (self._samples and t <= self._samples[-1][0]):
            self.rejected += 1  # impossible value, or a clock that did not advance: skipped, counted
            return "rejected"
        assert isinstance(raw, int)
        old, self._raw = self._raw, raw
        if old is None:
            self.restart(t)
            return "first"
        d = counter_increase(old, raw, self.bits)
        if d is None:
            self.resets += 1
            self.restart(t)
            return "reset"
        step: Step = "wrap" if raw < old else "increase"
        self.wraps += step == "wrap"
        self._append(t, d)
        return step

    def add_increase(self, t: float, d: int | None) -> Step:
        """Feed an increase the caller computed from its own reads (None: the counter reset). The
        first call only sets the baseline at ``t``."""
        if not math.isfinite(t) or (self._samples and t <= self._samples[-1][0]) or (
                d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 0)):
            self.rejected += 1
            return "rejected"
        if not self._samples:
            self.restart(t)
            return "first"
        if d is None:
            self.resets += 1
            self.restart(t)
            return "reset"
        self._append(t, d)
        return "increase"

    def _append(self, t: float, d: int) -> None:
        self._samples.append((t, self._samples[-1][1] + d))
        cutoff = t - self.keep
        while len(self._samples) > 2 and self._samples[1][0] <= cutoff:
            self._samples.popleft()  # the latest sample at or before the cutoff stays as the baseline
        while len(self._samples) > MAX_SAMPLES:
            self._samples.popleft()

    def stats(self, window: float) -> WindowStats | None:
        """Increase over at least the last ``window`` seconds (0: since the previous sample); None until
        two samples exist since the start or the last reset."""
        if len(self._samples) < 2:
            return None
        t_last, total_last = self._samples[-1]
        cutoff = t_last - window
        base_t, base_total = self._samples[0]
        for t, total in reversed(self._samples):
            if t < t_last and t <= cutoff:
                base_t, base_total = t, total
                break
        return WindowStats(total_last - base_total, t_last - base_t, base_t <= cutoff)
