"""The hard bound on stopping: once a stop is requested the process ends within a known time.

The orderly shutdown (agent/daemon.py) bounds each step and abandons tasks that ignore their
cancellation. This guard covers what it cannot: an event loop blocked in synchronous code never
runs the orderly path at all. A timer thread, armed by the signal handler itself (a Python-level
handler runs in the main thread even while the loop is blocked), ends the process with
``EX_SOFTWARE`` after dumping every thread's stack to stderr, so the journal shows where it hung.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import structlog

log = structlog.get_logger(__name__)

EX_SOFTWARE = 70  # sysexits: the agent had to abandon work to stop in time
STOP_GRACE_S = 3.0  # past shutdown_timeout: for the steps after the spool flush and the exit itself


class ShutdownGuard:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self.armed_at: float | None = None

    def arm(self) -> None:
        """Idempotent: the deadline counts from the first stop request."""
        with self._lock:
            if self._timer is not None:
                return
            self.armed_at = time.monotonic()
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.name = "shutdown-guard"
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        try:
            log.error("shutdown_deadline_exceeded", seconds=self.seconds, exit_code=EX_SOFTWARE,
                      hint="stacks of every thread follow on stderr")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        finally:
            os._exit(EX_SOFTWARE)
