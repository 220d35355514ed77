"""sd_notify(3) over $NOTIFY_SOCKET: READY=1, WATCHDOG=1, STOPPING=1, RELOADING=1, STATUS=..."""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.address = env.get("NOTIFY_SOCKET", "")
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_usec = int(usec) if usec.isdigit() and (not pid or pid == str(os.getpid())) else 0
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def watchdog_interval(self) -> float | None:
        """Ping at half the watchdog timeout, as sd_watchdog_enabled(3) recommends."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def notify(self, *lines: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(addr)
                s.sendall("\n".join(lines).encode())
        except OSError:
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets Type=notify-reload units match the reload to this notification.
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
