"""How the daemon hears SIGTERM, SIGINT (stop) and SIGHUP (reload the config).

In a test (no ShutdownGuard) asyncio's own handlers are used. Under the CLI daemon, Python-level
handlers: they run in the main thread even while the event loop is blocked in synchronous code, so the
hard shutdown deadline (agent/shutdown.py) is armed whatever the loop is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from agent.shutdown import ShutdownGuard


def install_signal_handlers(loop: asyncio.AbstractEventLoop, *, stop: Callable[[], None],
                            reload: Callable[[], None], guard: ShutdownGuard | None) -> None:
    if guard is None:
        for sig, handler in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, reload)):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, handler)
        return

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            loop.call_soon_threadsafe(reload)
            return
        guard.arm()
        loop.call_soon_threadsafe(stop)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
