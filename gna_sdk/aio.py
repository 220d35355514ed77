"""Waiting with a timeout without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the awaited future completes in
the same loop iteration as an outer ``cancel()``: the cancellation is swallowed and a task asked
to stop goes on looping (an agent stayed up for minutes after SIGTERM that way, parked in
``NodeStatePublisher.run``). ``asyncio.timeout`` keeps the cancellation; every loop that waits
with a timeout goes through these helpers. Libraries we call (nats-py's requests) still use
``wait_for``: a loop of ours re-raises a cancellation they swallowed (``raise_if_cancelling``), and
``cancel_and_wait`` repeats its cancel until the task ends or the time is up.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


RECANCEL_S = 0.1

# Periodic work lands on one grid per process (the kernel's round_jiffies idea): the heartbeat and every
# collector's periodic pass wake the process together instead of each at its own jittered moment (what
# that saves depends on the machine: docs/benchmarks.md, issue 27). The grid's phase is drawn once per
# process: a fleet's nodes stay spread over the step (what per-pass jitter was for).
ALIGN_STEP_S = 10.0
_PHASE = random.uniform(0.0, ALIGN_STEP_S)


def aligned_delay(interval: float, now: float | None = None, phase: float | None = None) -> float:
    """Seconds from ``now`` (time.monotonic()) to the grid point nearest ``now + interval``. The grid's step
    is ``ALIGN_STEP_S``, or ``interval`` when shorter; the delay is never under half the interval (two passes
    never run back to back) and never over the interval plus half a step."""
    if interval <= 0:
        return 0.0
    now = time.monotonic() if now is None else now
    phase = _PHASE if phase is None else phase
    step = min(ALIGN_STEP_S, interval)
    target = now + interval
    point = phase + round((target - phase) / step) * step
    while point - now < interval / 2:
        point += step
    return point - now


def raise_if_cancelling() -> None:
    """Raise CancelledError if this task was asked to stop and some callee swallowed it: the
    request stays counted in ``Task.cancelling()`` until someone calls ``uncancel()``."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """True once ``event`` is set, False after ``timeout`` seconds; a cancellation always propagates."""
    raise_if_cancelling()
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """``aw`` bounded by ``timeout`` (TimeoutError past it), cancellation-safe unlike 3.11's wait_for."""
    raise_if_cancelling()
    async with asyncio.timeout(timeout):
        return await aw


async def cancel_and_wait(tasks: list[asyncio.Task[object]] | set[asyncio.Task[object]],
                          timeout: float) -> list[asyncio.Task[object]]:
    """Cancel ``tasks`` and wait up to ``timeout``; returns those still running (they ignored it).

    ``gather`` would wait for a task that swallows its cancellation for ever; ``wait`` does not.
    The cancel is repeated while waiting: a library that lost one in a race gets another.
    """
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _done, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    return sorted(pending, key=lambda t: t.get_name())
