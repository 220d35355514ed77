"""Small persistent bits collectors share: a set of names remembered for the current boot, and
"run until SIGTERM/SIGINT or a duration" for the central commands."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from gna_sdk import HostPaths
from gna_sdk.statefile import is_str_list, read_state, write_state


def boot_id(host: HostPaths) -> str:
    """This boot's id (the kernel's random boot_id under the host root); "" when unreadable, which
    makes boot-scoped state start fresh rather than be carried into another boot."""
    return (host.read_text("/proc/sys/kernel/random/boot_id") or "").strip()


class BootScopedSet:
    """Names seen during this boot (GPUs on the bus, HCAs), kept across agent restarts so one that
    disappeared while the agent was down is still expected; forgotten when the boot id changes."""

    def __init__(self, path: Path | None, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.items: set[str] = set()
        if path is not None:
            data = read_state(path, version=1, what="names seen this boot",
                              valid=lambda d: isinstance(d.get("boot_id"), str) and is_str_list(d.get("seen")))
            if data.get("boot_id") == boot_id:
                self.items = set(data["seen"])

    def add_all(self, names: set[str]) -> None:
        if names <= self.items:
            return
        self.items |= names
        if self.path is not None:
            write_state(self.path, {"boot_id": self.boot_id, "seen": sorted(self.items)}, version=1)


async def until_stopped(duration: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), duration)
