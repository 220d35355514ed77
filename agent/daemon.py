"""The daemon's composition root: builds the spool, the bus, the NATS link and forwarder, the collectors,
metrics and the sd_notify protocol, starts and stops them in order.

Each other concern has its own home: signals (agent/signals.py), the configuration reload
(agent/reload.py), the embedded nats-server (agent/embedded_nats.py), the remediation engine's wiring
(agent/remediation/wiring.py), the NVSentinel export (agent/nvsentinel_sink.py). docs/architecture.md
shows the layout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import structlog

from agent import __version__
from agent import config as configmod
from agent.bus import LocalBus
from agent.embedded_nats import start_embedded_nats
from agent.emitter import DEFAULT_MAX_CONDITIONS, CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.forwarder import Forwarder
from agent.framework import CollectorRunner
from agent.message import Message, make_message
from agent.metrics import AgentMetrics, MetricsServer
from agent.nats_link import NatsLink
from agent.nats_server import NatsServerProcess
from agent.natsclient import redact
from agent.nodestate import NodeStatePublisher
from agent.registry import collector_classes
from agent.reload import reload_config
from agent.remediation.incidents import IncidentView
from agent.remediation.wiring import RemediationWiring
from agent.sdnotify import Notifier
from agent.shutdown import EX_SOFTWARE, ShutdownGuard
from agent.signals import install_signal_handlers
from agent.spool import SEVERITY_NAMES, Spool
from agent.validate.service import ValidationService
from gna_sdk import ExportsMetrics, plural
from gna_sdk.aio import cancel_and_wait, within
from gna_sdk.hostroot import HostRoot
from gna_types.host_details import SpoolCorrupted, SpoolOverflow
from gna_types.node_details import wire
from gna_types.subjects import encode_token

log = structlog.get_logger(__name__)

AGENT_COLLECTOR = "agent"


class Agent:
    def __init__(self, config: configmod.Config, *, config_path: str | None = None,
                 overrides: dict[str, Any] | None = None, notifier: Notifier | None = None,
                 guard: ShutdownGuard | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}
        self.cfg = config.agent
        self.node = self.cfg.node_name()
        self.state_dir = Path(self.cfg.state_dir)
        self.host = HostRoot(self.cfg.host_root)
        self.metrics = AgentMetrics()
        self.notifier = notifier or Notifier()
        self.spool: Spool | None = None
        self.bus: LocalBus | None = None
        self.tracker: ConditionTracker | None = None
        self.embedded: NatsServerProcess | None = None
        self.link: NatsLink | None = None
        self.remediation = RemediationWiring()  # agent/remediation/wiring.py
        self.validation = ValidationService(self)  # agent/validate/service.py: after repairs, on a schedule
        self.forwarder: Forwarder | None = None
        self.runners: dict[str, CollectorRunner] = {}
        self._collector_tasks: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self.nvsentinel: Any = None  # agent.nvsentinel_sink.NVSentinelSink when [exports.nvsentinel] is on
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self.restart_needed: dict[str, str] = {}  # config sections changed on disk that need a restart
        self.started = time.monotonic()
        self.metrics_server: MetricsServer | None = None
        self.facts = FactStore()
        # Set by the CLI daemon only: it owns the process (signal.signal, os._exit); tests running an
        # Agent in-process keep asyncio's signal handling and are never exited under them.
        self.guard = guard
        self.abandoned: list[str] = []  # what ignored its cancellation at shutdown (exit EX_SOFTWARE)

    # the remediation wiring's state, where the tests and the CLI's status look for it
    @property
    def engine(self) -> Any:
        return self.remediation.engine

    @property
    def incident_view(self) -> IncidentView:
        return self.remediation.incident_view

    @property
    def watching_incidents(self) -> bool:
        return self.remediation.watching_incidents

    # -- sinks -----------------------------------------------------------------------
    async def _sink(self, msg: Message) -> bool:
        assert self.bus is not None
        ok = await self.bus.publish(msg)
        if ok:
            self.metrics.observe_message(msg.kind, msg.collector, msg.type, msg.severity)
        else:
            self.metrics.bus_refused.inc()
        return ok

    def emitter_for(self, collector: str, max_conditions: int = DEFAULT_MAX_CONDITIONS) -> CollectorEmitter:
        assert self.tracker is not None
        return CollectorEmitter(self.node, collector, self._sink, self.tracker, facts=self.facts,
                                state_dir=self.state_dir / "collectors" / collector, max_conditions=max_conditions)

    async def _announce_drops(self, counts: dict[str, int]) -> bool:
        total = sum(counts.values())
        assert self.spool is not None
        msg = make_message(
            node=self.node, collector=AGENT_COLLECTOR, kind="event", type="SpoolOverflow",
            severity="warning", entity=f"spool:{self.spool.dir}", reason="SpoolFull",
            message=f"The spool was full during a NATS outage: {plural(total, 'message')} "
                    f"{'was' if total == 1 else 'were'} dropped by policy "
                    f"{self.spool.policy}.",
            details=wire(SpoolOverflow(dropped=counts, policy=self.spool.policy, max_bytes=self.spool.max_bytes)))
        return await self._sink(msg)

    async def _announce_corruption(self) -> None:
        assert self.spool is not None
        c = self.spool.corruption
        self.metrics.spool_dropped.labels("corrupted").inc(c["records"])
        await self._sink(make_message(
            node=self.node, collector=AGENT_COLLECTOR, kind="event", type="SpoolCorrupted", severity="warning",
            entity=f"spool:{self.spool.dir}", reason="DamagedFrames",
            message=f"The spool had damaged frames in {plural(c['segments'], 'segment')}: "
                    f"{plural(c['bytes'], 'byte')} skipped, {plural(c['records'], 'record')} lost; every intact "
                    f"record after them was kept.",
            details=wire(SpoolCorrupted(segments=c["segments"], bytes=c["bytes"], records=c["records"]))))

    def _on_spool_drop(self, sev: int, n: int) -> None:
        self.metrics.spool_dropped.labels(SEVERITY_NAMES[sev]).inc(n)

    # -- NATS ------------------------------------------------------------------------
    def _nats_servers(self) -> list[str]:
        if self.cfg.nats.servers:
            return list(self.cfg.nats.servers)
        self.embedded = start_embedded_nats(self.cfg.embedded_nats, self.state_dir)
        return [self.embedded.url]

    # -- collectors ------------------------------------------------------------------
    def start_collectors(self) -> None:
        classes = collector_classes()
        agent_emitter = self.emitter_for(AGENT_COLLECTOR)
        for name, cls in sorted(classes.items()):
            settings = self.config.collectors.get(name) or cls.config_type()
            if not settings.enabled:
                log.info("collector_disabled", collector=name)
                continue
            emitter = self.emitter_for(name, settings.max_conditions)
            try:
                collector = cls(settings, self.host, emitter)
            except Exception as exc:
                log.error("collector_init_failed", collector=name, error=repr(exc))
                self.metrics.collector_errors.labels(name, "init").inc()
                continue
            runner = CollectorRunner(collector, settings, emitter, self.metrics, agent_emitter)
            if isinstance(collector, ExportsMetrics):
                self.metrics.plugins.sources[name] = collector.prometheus_families
            self.runners[name] = runner
            self._collector_tasks[name] = asyncio.get_running_loop().create_task(runner.run(), name=f"collector:{name}")
        log.info("collectors_started", collectors=sorted(self.runners))

    async def stop_collectors(self, timeout: float = 2.0) -> None:
        stuck = await cancel_and_wait(list(self._collector_tasks.values()), timeout)
        self._abandon(stuck)
        self._collector_tasks.clear()
        self.runners.clear()
        self.metrics.plugins.sources.clear()

    # -- health / metrics ------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        problems = []
        if self.spool and self.spool.failing:
            problems.append(f"spool write errors: {self.spool.write_errors} (writes failing now)")
        elif self.spool and self.spool.write_errors:
            problems.append(f"spool recovered after {self.spool.write_errors} write errors")
        if self.forwarder and self.link and not self.link.connected.is_set():
            problems.append("nats disconnected (spooling)")
        failing = [n for n, r in self.runners.items() if r.failing]
        if self.restart_needed:
            problems.append(f"config changed on disk, restart needed for {', '.join(sorted(self.restart_needed))}")
        text = "ok" if not problems and not failing else "; ".join(problems + [f"failing: {failing}"] * bool(failing))
        # 503 only while writes fail now: a cumulative count would have the liveness probe restart a
        # recovered agent in a loop after one transient disk-full.
        return (not (self.spool and self.spool.failing)), text

    def refresh_metrics(self) -> None:
        if self.spool:
            self.metrics.spool_depth.set(self.spool.depth)
            self.metrics.spool_bytes.set(self.spool.size_bytes)
        if self.bus:
            for sub in self.bus.subscriptions:
                self.metrics.bus_queue_depth.labels(sub.name).set(sub.queue.qsize())
                self.metrics.bus_dropped.labels(sub.name).set(sub.dropped)
        if self.tracker:
            self.metrics.conditions_active.set(len(self.tracker.active))
            self.metrics.set_conditions(self.tracker.active.values())
        for name, runner in self.runners.items():
            for source, (count, _sample) in runner.emitter.skipped.items():
                self.metrics.source_unparsed.labels(name, source).set(count)
            for source in runner.emitter.blind:
                self.metrics.source_not_seen.labels(name, source).set(1)

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # -- lifecycle -------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def _abandon(self, tasks: list[asyncio.Task[Any]] | list[str]) -> None:
        names = [t if isinstance(t, str) else t.get_name() for t in tasks]
        if names:
            log.error("shutdown_abandoned_tasks", tasks=names,
                      hint="they ignored cancellation; the process exits 70 instead of waiting for them")
            self.abandoned.extend(names)

    def request_reload(self) -> None:
        self._reload.set()

    async def run(self, duration: float | None = None) -> int:
        loop = asyncio.get_running_loop()
        install_signal_handlers(loop, stop=self.request_stop, reload=self.request_reload, guard=self.guard)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        sp = self.cfg.spool
        self.spool = Spool(self.state_dir / "spool", max_bytes=sp.max_bytes, segment_bytes=sp.segment_bytes,
                           policy=sp.policy, fsync=sp.fsync)
        self.spool.on_drop = self._on_spool_drop
        await asyncio.to_thread(self.spool.open)
        self.tracker = ConditionTracker(self.state_dir / "conditions.json")
        self.bus = LocalBus(self.spool, subscriber_queue=self.cfg.bus.subscriber_queue)
        self.bus.subscribe("log", self._log_message)
        self.remediation.start(self)
        self.bus.start()
        if self.spool.corruption["segments"]:
            await self._announce_corruption()
        servers = self._nats_servers()  # in the main thread: PR_SET_PDEATHSIG follows the forking thread
        self.link = NatsLink(self.cfg.nats, servers, self.metrics, name=f"gpu-node-agent/{self.node}",
                             inbox=encode_token(self.node))
        self.forwarder = Forwarder(self.spool, self.link, self.metrics, window=self.cfg.nats.publish_window,
                                   timeout=self.cfg.nats.publish_timeout, announce=self._announce_drops)
        nodestate = NodeStatePublisher(self.node, self.link, self.tracker, self.spool,
                                       self.cfg.nats.heartbeat_interval)
        self._tasks = [loop.create_task(self.link.connect(), name="nats:connect"),
                       loop.create_task(self.forwarder.run(), name="nats:forwarder"),
                       loop.create_task(nodestate.run(), name="nats:nodestate")]
        self._tasks.append(loop.create_task(self.validation.listen(self.link), name="validate:requests"))
        tracker = self.tracker
        self.validation.watch_resolutions(
            self.bus.subscribe, lambda: list(tracker.active.values()) if tracker is not None else [],
            lambda: self.remediation.cordons_itself() or self.remediation.owns_a_node())
        if self.cfg.validate.schedule_interval > 0:
            self._tasks.append(loop.create_task(self.validation.schedule(self.remediation.owns_a_node),
                                                name="validate:schedule"))
        if self.remediation.cordons_itself():
            self.remediation.watching_incidents = True
            self.remediation.decide_own_culprit(self.node)
            self._tasks.append(loop.create_task(self.remediation.watch_incidents(self.link),
                                                name="remediation:incidents"))
        assert self.bus is not None
        if self.cfg.exports.nvsentinel.enabled:  # its encoder is imported only for a node that exports
            from agent.nvsentinel_sink import start_nvsentinel

            if (started := start_nvsentinel(self.cfg.exports.nvsentinel, self.node, self.bus,
                                            list(self.tracker.active.values()), loop)) is not None:
                self.nvsentinel, task = started
                self._tasks.append(task)
        if self.cfg.metrics.listen:
            self.metrics_server = MetricsServer(self.metrics, self.cfg.metrics.listen, self.health,
                                                self.refresh_metrics)
            await self.metrics_server.start()
            (self.state_dir / "metrics.addr").write_text(f"{self.metrics_server.host}:{self.metrics_server.port}\n")
        self.start_collectors()
        if (wd := self.notifier.watchdog_interval()) is not None:
            self._tasks.append(loop.create_task(self._watchdog(wd), name="watchdog"))
        self.notifier.ready(f"node {self.node}: {plural(len(self.runners), 'collector')}")
        log.info("agent_started", node=self.node, version=__version__, host_root=str(self.host.root),
                 state_dir=str(self.state_dir), nats=[redact(s) for s in servers], pid=os.getpid())
        deadline = None if duration is None else loop.time() + duration
        while not self._stop.is_set():
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            if timeout == 0.0:
                break
            reload_wait = loop.create_task(self._reload.wait())
            stop_wait = loop.create_task(self._stop.wait())
            await asyncio.wait({reload_wait, stop_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            reload_wait.cancel()
            stop_wait.cancel()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                await reload_config(self)
        await self._shutdown()
        return EX_SOFTWARE if self.abandoned else 0

    async def _shutdown(self) -> None:
        """Every step is bounded, so the whole fits in ``shutdown_timeout`` (the spool drain gets
        what the others leave); a task that ignores its cancellation is abandoned, not awaited."""
        if self.guard:
            self.guard.arm()
        self.notifier.stopping()
        log.info("agent_stopping")
        budget = self.cfg.shutdown_timeout
        t0 = time.monotonic()

        def left(reserve: float = 0.0, cap: float | None = None) -> float:
            rest = max(0.05, budget - (time.monotonic() - t0) - reserve)
            return rest if cap is None else min(cap, rest)

        after_drain = min(2.0, 0.4 * budget)  # what the steps after the spool drain may take together
        await self.stop_collectors(timeout=left(after_drain, cap=budget / 4))
        if self.tracker:
            with contextlib.suppress(OSError):
                self.tracker.flush()  # folded conditions saved at most once a second while running
        if self.bus:
            await self.bus.stop(drain_timeout=left(after_drain, cap=budget / 8))
            self._abandon(self.bus.abandoned)
        if self.spool:
            try:
                await within(self.spool.flush(), left(after_drain))
            except TimeoutError:
                self._abandon(["spool:flush"])
        if self.forwarder and self.link and self.link.connected.is_set():
            with contextlib.suppress(TimeoutError):
                if not await within(self.forwarder.drain(left(after_drain)), left(after_drain)):
                    log.warning("shutdown_spool_not_drained", depth=self.spool.depth if self.spool else 0)
        self._abandon(await cancel_and_wait([*self._tasks, *self.validation.tasks()], left(cap=0.5)))
        if self.nvsentinel is not None:
            with contextlib.suppress(Exception):
                await within(self.nvsentinel.close(), left(cap=0.5))
        if self.link:
            with contextlib.suppress(Exception):
                await within(self.link.close(), left(cap=0.5))
        if self.metrics_server:
            with contextlib.suppress(TimeoutError):
                await within(self.metrics_server.stop(), left(cap=0.5))
        if self.embedded:
            await asyncio.to_thread(self.embedded.stop, timeout=left(cap=0.5))
        if self.spool and "spool:flush" not in self.abandoned:
            self.spool.close()
        log.info("agent_stopped", spool_depth=self.spool.depth if self.spool else 0,
                 published=self.forwarder.published if self.forwarder else 0,
                 seconds=round(time.monotonic() - t0, 3), abandoned=self.abandoned)

    # -- remediation --------------------------------------------------------------------
    async def _log_message(self, msg: Message) -> None:
        # Info-level events can come in bursts: keep them out of the journal unless debugging.
        level = log.debug if msg.kind == "event" and msg.severity == "info" else log.info
        level("message", kind=msg.kind, type=msg.type, status=msg.status, severity=msg.severity,
                 entity=msg.entity, collector=msg.collector, id=msg.id)
