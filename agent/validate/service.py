"""Validation inside the daemon: after a repair (the remediation engine's validator) and on a schedule.

Each run is one ``NodeValidation`` event on the bus (details: the report, gna_types/validation.py) and
counted in ``gna_validation_runs{level,verdict,trigger}``; ``gna_validation_last_run_timestamp_seconds
{verdict}`` says when the node last passed or failed. One run at a time on a node (an episode's and a
scheduled one never load the GPUs together).

The schedule (``validate.schedule_interval`` > 0) runs only while no job holds the GPUs — a refused
("busy") scheduled run is counted, never published (a busy node is the normal case) — and never while a
repair episode owns the node (it validates by itself).

After resolution (``validate.after_resolution``, on by default): once a critical condition of this node
fired and every critical condition has resolved again, the node validates itself — after a settle time,
then again every ``after_resolution_retry`` while a job holds the GPUs, until a run is not refused — and
publishes the report. A central cordoner uncordons a node only on such a report, started after its
triggers resolved (fleet/validations.py). Not while this agent cordons itself: its own engine validates
before it uncordons.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import structlog

from agent import config as configmod
from agent.message import Message
from gna_sdk import Emitter, Severity
from gna_sdk.hostroot import HostRoot
from gna_types.subjects import validate_subject
from gna_types.validation import NODE_VALIDATION, ValidationReport

log = structlog.get_logger(__name__)

COLLECTOR = "validate"


class ValidationHost(Protocol):
    """What the service takes from the daemon (agent/daemon.py ``Agent``)."""

    config: configmod.Config
    cfg: configmod.AgentConfig
    host: HostRoot
    node: str
    metrics: Any

    def emitter_for(self, collector: str, max_conditions: int = ...) -> Emitter: ...


def summary(report: ValidationReport) -> str:
    if report.verdict == "busy":
        return report.reason
    failed = [c.name for c in report.checks if c.status in ("failed", "error")]
    ran = sum(1 for c in report.checks if c.status != "skipped")
    return f"{ran} of {len(report.checks)} checks ran, failed: {', '.join(failed)}" if failed else \
        f"{ran} of {len(report.checks)} checks ran, none failed"


class ValidationService:
    def __init__(self, agent: ValidationHost) -> None:
        self.agent = agent
        self._lock = asyncio.Lock()
        self._owed = False  # a critical condition fired since the last run after resolution
        self._after: asyncio.Task[None] | None = None
        self._active: Callable[[], Iterable[Any]] = tuple  # the node's active conditions (ActiveCondition)
        self._skip: Callable[[], bool] = lambda: False
        self._trigger = "resolution"  # what the owed run counts as: resolution, or request (the cordoner's)
        self._last_request: float | None = None

    async def run(self, level: str, *, trigger: str, publish_busy: bool = True) -> ValidationReport:
        from agent.validate.checks import run_validation  # the tool runners, imported by the first run

        a = self.agent
        async with self._lock:
            report = await run_validation(a.cfg, a.host, level, node=a.node, collectors=a.config.collectors)
        a.metrics.validation_runs.labels(level, report.verdict, trigger).inc()
        a.metrics.validation_last_run.labels(report.verdict).set(report.ended or report.started)
        text = summary(report)
        log.info("validation", level=level, verdict=report.verdict, trigger=trigger, summary=text)
        if report.verdict != "busy" or publish_busy:
            severity: Severity = "info" if report.verdict in ("passed", "busy") else "warning"
            await a.emitter_for(COLLECTOR).event(
                NODE_VALIDATION, severity=severity, entity="validate:node", reason=report.verdict.capitalize(),
                message=f"validation ({level}, {trigger}) {report.verdict}: {text}", details=report.to_details())
        return report

    # -- after resolution ---------------------------------------------------------------------------------
    def watch_resolutions(self, subscribe: Callable[[str, Callable[[Message], Awaitable[None]]], Any],
                          active: Callable[[], Iterable[Any]], skip: Callable[[], bool]) -> None:
        """Follow this node's own conditions on its bus: ``active`` lists the conditions active now, ``skip``
        says this agent validates by itself (it cordons itself, or a repair episode owns the node)."""
        self._active, self._skip = active, skip
        subscribe("validate-after-resolution", self.on_message)

    def _critical_active(self) -> bool:
        return any(getattr(c, "severity", "") == "critical" for c in self._active())

    async def on_message(self, msg: Message) -> None:
        if msg.kind != "condition" or msg.collector == COLLECTOR or not self.agent.cfg.validate.after_resolution:
            return
        if msg.status == "firing" and msg.severity == "critical":
            self._owed = True
        elif msg.status == "resolved" and self._owed and not self._critical_active() and self._after is None:
            self._trigger = "resolution"
            self._after = asyncio.get_running_loop().create_task(self._after_resolution(),
                                                                  name="validate:after-resolution")

    # -- on the central cordoner's request ------------------------------------------------------------------
    async def listen(self, link: Any) -> None:
        """Run as a task: ``gna.validate.<this node>`` (core NATS; the shipped permissions let only the cordoner
        publish there and only this node subscribe). nats-py restores the subscription after a reconnect."""
        await link.connected.wait()
        await link.nc.subscribe(validate_subject(self.agent.node), cb=self._on_request)
        await asyncio.Event().wait()

    async def _on_request(self, msg: Any) -> None:
        """A request carries nothing the node acts on: it runs its own level, when its GPUs are free, at most
        once per ``request_min_interval`` (a flood is counted, never queued)."""
        outcome = self.request(time.monotonic())
        self.agent.metrics.validation_requests.labels(outcome).inc()
        log.info("validation_requested", outcome=outcome)

    def request(self, now: float) -> str:
        if self._owed and self._after is not None:
            return "pending"
        if self._last_request is not None and now - self._last_request < self.agent.cfg.validate.request_min_interval:
            return "too_soon"
        self._last_request = now
        self._owed = True
        self._trigger = "request"
        if self._after is None:
            self._after = asyncio.get_running_loop().create_task(self._after_resolution(),
                                                                  name="validate:requested")
        return "accepted"

    async def _after_resolution(self) -> None:
        v = self.agent.cfg.validate
        try:
            await asyncio.sleep(v.after_resolution_settle)
            while self._owed:
                if self._critical_active():
                    return  # fired again: its resolution starts this over
                if self._skip():
                    self._owed = False  # this agent's own engine validates before it uncordons
                    return
                try:
                    report = await self.run(v.after_resolution_level, trigger=self._trigger, publish_busy=False)
                except asyncio.CancelledError:
                    raise
                except Exception:  # said and counted; tried again like a busy run
                    log.exception("validation_failed", trigger="resolution")
                    self.agent.metrics.validation_runs.labels(v.after_resolution_level, "error", self._trigger).inc()
                else:
                    if report.verdict != "busy":
                        self._owed = False
                        return
                await asyncio.sleep(v.after_resolution_retry)
        finally:
            self._after = None
            self._trigger = "resolution"

    def tasks(self) -> list[asyncio.Task[None]]:
        """The run after resolution, if one is pending (the daemon cancels it on shutdown)."""
        return [self._after] if self._after is not None else []

    async def schedule(self, owned: Callable[[], bool]) -> None:
        """Run as a task: every ``schedule_interval`` (jittered 10 %), unless a repair episode owns the node."""
        v = self.agent.cfg.validate
        while True:
            await asyncio.sleep(v.schedule_interval * random.uniform(0.9, 1.1))
            if owned():
                continue
            try:
                await self.run(v.schedule_level, trigger="schedule", publish_busy=False)
            except asyncio.CancelledError:
                raise
            except Exception:  # the schedule must outlive one bad run: said, counted, next interval
                log.exception("validation_failed", trigger="schedule")
                self.agent.metrics.validation_runs.labels(v.schedule_level, "error", "schedule").inc()
