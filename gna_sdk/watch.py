"""The fast paths a collector's ``run()`` holds: kernel uevents (udev) and inotify watches.

Either may be missing (no netlink in a container, no inotify for a path): each one that cannot
start is logged once with what takes its place, never an error, because the collector's periodic
pass still decides. Everything started is closed when ``run()`` is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import structlog

from gna_sdk.inotify import Inotify, InotifyEvent
from gna_sdk.udev import UdevMonitor, Uevent

log = structlog.get_logger(__name__)


class Watches:
    """``async with Watches("gpu_devices") as w: w.udev(...); w.inotify(...); await w.hold()``"""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._udev: list[UdevMonitor] = []
        self._inotify: list[Inotify] = []

    def udev(self, on_event: Callable[[Uevent], None], subsystems: tuple[str, ...], *, fallback: str) -> str:
        """Listen to uevents of ``subsystems``: "on", or "unavailable: <why>" (logged with ``fallback``)."""
        mon = UdevMonitor(on_event, subsystems=subsystems, name=self.owner)
        if mon.start():
            self._udev.append(mon)
            return "on"
        log.warning(f"{self.owner}_udev_unavailable", error=mon.error, fallback=fallback)
        return f"unavailable: {mon.error}"

    def inotify(self, path: Path, mask: int, on_events: Callable[[list[InotifyEvent]], None], *,
                fallback: str) -> bool:
        """Watch ``path`` for ``mask``; False (logged with ``fallback``) when it cannot be watched."""
        watcher: Inotify | None = None
        try:
            watcher = Inotify(on_events)
            watcher.add_watch(str(path), mask)
            watcher.start()
        except OSError as exc:
            log.warning(f"{self.owner}_inotify_unavailable", path=str(path), error=str(exc), fallback=fallback)
            if watcher is not None:
                watcher.close()
            return False
        self._inotify.append(watcher)
        return True

    async def hold(self) -> None:
        """Keep the watches until cancelled (a collector's run() ends only that way)."""
        await asyncio.Event().wait()

    def close(self) -> None:
        for mon in self._udev:
            mon.close()
        for w in self._inotify:
            w.close()
        self._udev.clear()
        self._inotify.clear()

    async def __aenter__(self) -> Watches:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
