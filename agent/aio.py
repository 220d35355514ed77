"""Waiting with a timeout without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the awaited future completes in
the same loop iteration as an outer ``cancel()``: the cancellation is swallowed and a task asked
to stop goes on looping (an agent stayed up for minutes after SIGTERM that way, parked in
``NodeStatePublisher.run``). ``asyncio.timeout`` keeps the cancellation; every loop that waits
with a timeout goes through these helpers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """True once ``event`` is set, False after ``timeout`` seconds; a cancellation always propagates."""
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
    async with asyncio.timeout(timeout):
        return await aw


async def cancel_and_wait(tasks: list[asyncio.Task[object]] | set[asyncio.Task[object]],
                          timeout: float) -> list[asyncio.Task[object]]:
    """Cancel ``tasks`` and wait up to ``timeout``; returns those still running (they ignored it).

    ``gather`` would wait for a task that swallows its cancellation for ever; ``wait`` does not.
    """
    live = [t for t in tasks if not t.done()]
    for t in live:
        t.cancel()
    if not live:
        return []
    _done, pending = await asyncio.wait(live, timeout=timeout)
    return sorted(pending, key=lambda t: t.get_name())
