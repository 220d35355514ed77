"""The wrapper every collector runs in: intervals, jitter, timeouts, crash isolation, backoff, self-metrics.

A failing collector never disturbs the others; after ``FAILING_AFTER`` consecutive failures the
agent raises a ``CollectorFailing`` condition about it. A collector may have two parts, a periodic
``collect`` and a long-running ``run``; each keeps its own failure streak, so a good housekeeping
pass never hides a watcher that keeps crashing. The condition (and ``/healthz``) resolve only when
every part is healthy now: a pass succeeded, or the restarted ``run`` stayed up ``healthy_after``.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import structlog

from agent.emitter import CollectorEmitter
from agent.metrics import AgentMetrics
from gna_sdk import Emitter, LongRunning, Periodic, auto_resolves
from gna_sdk.aio import aligned_delay, wait_event, within
from gna_sdk.retry import Backoff, delay_after
from gna_types.host_details import CollectorFailing
from gna_types.node_details import wire

log = structlog.get_logger(__name__)

FAILING_AFTER = 3
HEALTHY_RUN_RESETS_BACKOFF = 60.0  # a run() that stays up this long after a (re)start is healthy again


def is_periodic(collector: Any) -> bool:
    return isinstance(collector, Periodic)


def is_long_running(collector: Any) -> bool:
    return isinstance(collector, LongRunning)


class CollectorRunner:
    def __init__(self, collector: Any, settings: Any, emitter: CollectorEmitter, metrics: AgentMetrics,
                 agent_emitter: Emitter) -> None:
        self.collector = collector
        self.name: str = collector.name
        self.settings = settings
        self.emitter = emitter
        self.metrics = metrics
        self.agent_emitter = agent_emitter
        self.streaks = {"collect": 0, "run": 0}  # consecutive failures of each part
        self.last_error = ""
        self.passes = 0
        self._failing_fired = False
        self.healthy_after = HEALTHY_RUN_RESETS_BACKOFF

    @property
    def consecutive_failures(self) -> int:
        return max(self.streaks.values())

    @property
    def failing(self) -> bool:
        """Failing now (not: ever failed): the last pass failed or run() is down or restarting."""
        return self.consecutive_failures > 0

    async def run(self) -> None:
        self.metrics.collector_up.labels(self.name).set(1)
        # A collector with both: run() watches (udev, inotify) and sets `wakeup` to get a pass
        # right away; the periodic pass stays the source of truth.
        self.collector.wakeup = asyncio.Event()
        jobs = []
        if is_long_running(self.collector):
            jobs.append(self._supervise())
        if is_periodic(self.collector):
            jobs.append(self._periodic())
        if not jobs:
            log.error("collector_has_no_entry_point", collector=self.name)
            return
        await asyncio.gather(*jobs)

    async def _sleep_or_wakeup(self, delay: float) -> None:
        wakeup: asyncio.Event = self.collector.wakeup
        if not await wait_event(wakeup, delay):
            return
        await asyncio.sleep(0.005)  # coalesce a burst of signals (8 device nodes removed at once)
        wakeup.clear()

    def _delay(self, base: float) -> float:
        j = self.settings.jitter
        return max(0.0, base * (1 + random.uniform(-j, j)))

    async def _periodic(self) -> None:
        interval = float(self.settings.interval)
        await self._sleep_or_wakeup(random.uniform(0, interval * self.settings.jitter))
        while True:
            ok = await self.run_once()
            if not ok:
                delay = self._delay(delay_after(self.consecutive_failures, interval,
                                                max(interval, self.settings.restart_backoff_max)))
            elif self.settings.align:
                delay = aligned_delay(interval)  # with the heartbeat and the other collectors: one wake-up
            else:
                delay = self._delay(interval)
            await self._sleep_or_wakeup(delay)

    async def run_once(self) -> bool:
        """One supervised pass of ``collect``; auto-resolves conditions it no longer asserts."""
        self.emitter.begin_pass()
        start = time.perf_counter()
        try:
            await within(self.collector.collect(), self.settings.timeout)
        except TimeoutError:
            await self._failed("collect", "timeout", f"pass exceeded {self.settings.timeout}s")
            return False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("collector_failed", collector=self.name)
            await self._failed("collect", "exception", repr(exc))
            return False
        finally:
            self.metrics.collector_duration.labels(self.name).observe(time.perf_counter() - start)
            self.metrics.collector_runs.labels(self.name).inc()
            self.passes += 1
        if auto_resolves(self.collector):
            await self.emitter.resolve_unasserted()
        await self._succeeded("collect")
        return True

    async def _supervise(self) -> None:
        backoff = Backoff(self.settings.restart_backoff_min,
                          max(self.settings.restart_backoff_min, self.settings.restart_backoff_max))
        while True:
            task = asyncio.get_running_loop().create_task(self.collector.run(), name=f"collector:{self.name}:run")
            kind, error = "", ""
            try:
                if self.streaks["run"]:
                    # restarted after a failure: healthy again once it stays up a while, not when
                    # it next fails (a watcher that died for good must not look failing for ever,
                    # one that keeps dying must not look recovered)
                    done, _ = await asyncio.wait({task}, timeout=self.healthy_after)
                    if not done:
                        backoff.reset()
                        await self._succeeded("run")
                await task
                kind, error = "exited", "run() returned"
            except asyncio.CancelledError:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)  # let it close its files; a stubborn one is left behind
                raise
            except Exception as exc:
                log.exception("collector_crashed", collector=self.name)
                kind, error = "exception", repr(exc)
            await self._failed("run", kind, error)
            self.metrics.collector_restarts.labels(self.name).inc()
            await asyncio.sleep(self._delay(backoff.next()))

    async def _failed(self, part: str, kind: str, error: str) -> None:
        self.streaks[part] += 1
        self.last_error = error
        self.metrics.collector_errors.labels(self.name, kind).inc()
        self.metrics.collector_up.labels(self.name).set(0)
        log.warning("collector_error", collector=self.name, part=part, kind=kind, error=error,
                    consecutive=self.streaks[part])
        if self.streaks[part] >= FAILING_AFTER and not self._failing_fired:
            self._failing_fired = True
            await self.agent_emitter.condition(
                "CollectorFailing", firing=True, severity="warning", entity=f"collector:{self.name}",
                reason=kind.capitalize(),
                message=f"Collector {self.name} failed {self.streaks[part]} times in a row ({part}): {error}.",
                details=wire(CollectorFailing(consecutive_failures=self.streaks[part], part=part,
                                              last_error=error[:500])))

    async def _succeeded(self, part: str) -> None:
        self.streaks[part] = 0
        if self.failing:
            return  # the other part is still failing
        self.metrics.collector_up.labels(self.name).set(1)
        if self._failing_fired:
            self._failing_fired = False
            await self.agent_emitter.condition(
                "CollectorFailing", firing=False, severity="warning", entity=f"collector:{self.name}",
                reason="Recovered", message=f"Collector {self.name} is healthy again.")
