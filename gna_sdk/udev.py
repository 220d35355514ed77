"""pyudev's netlink monitor driven from asyncio (pyudev has no native asyncio: add_reader on its fd).

Kernel-source uevents by default: they arrive without udevd (containers, minimal nodes) and
before udev rules run. Where netlink is not permitted, ``start`` returns False and says why,
and callers fall back to inotify and reconciliation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

Uevent = dict[str, str]


class UdevMonitor:
    def __init__(self, callback: Callable[[Uevent], None], *, subsystems: tuple[str, ...] = (),
                 source: str = "kernel", name: str = "udev") -> None:
        self.callback = callback
        self.subsystems = subsystems
        self.source = source
        self.name = name
        self.monitor: Any = None
        self.error = ""
        self.received = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> bool:
        try:
            import pyudev

            ctx = pyudev.Context()
            mon = pyudev.Monitor.from_netlink(ctx, source=self.source)
            mon.start()
        except Exception as exc:  # ImportError, OSError (EPERM in a container), pyudev errors
            self.error = repr(exc)
            return False
        self.monitor = mon
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(mon.fileno(), self._on_readable)
        return True

    def _on_readable(self) -> None:
        while True:
            try:
                dev = self.monitor.poll(timeout=0)
            except Exception as exc:  # ENOBUFS after a burst: events were lost, reconciliation covers it
                log.warning("udev_receive_failed", monitor=self.name, error=repr(exc))
                return
            if dev is None:
                return
            props = {str(k): str(v) for k, v in dev.properties.items()}
            props.setdefault("ACTION", str(dev.action or ""))
            props.setdefault("SUBSYSTEM", str(dev.subsystem or ""))
            if self.subsystems and props["SUBSYSTEM"] not in self.subsystems:
                continue
            self.received += 1
            try:
                self.callback(props)
            except Exception:
                log.exception("udev_callback_failed", monitor=self.name)

    def close(self) -> None:
        if self._loop is not None and self.monitor is not None:
            self._loop.remove_reader(self.monitor.fileno())
        self._loop = None
        self.monitor = None
