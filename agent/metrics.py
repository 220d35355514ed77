"""Self-metrics (prometheus-client) and a tiny asyncio HTTP server for /metrics and /healthz."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gna_types.conditions import category

log = structlog.get_logger(__name__)

# Distinct (collector, type) pairs the per-type series keep apart; a plugin that invents types beyond
# this folds them into type "Other", so the label sets stay bounded (the built-in vocabulary has ~80).
MAX_TYPES = 256
OTHER_TYPE = "Other"


class _Condition(Protocol):
    collector: str
    type: str
    entity: str
    severity: str


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.collector_runs = Counter("gna_collector_runs", "Collector passes", ["collector"], registry=r)
        self.collector_errors = Counter("gna_collector_errors", "Collector failures (exceptions, timeouts)",
                                        ["collector", "kind"], registry=r)
        self.collector_restarts = Counter("gna_collector_restarts", "Long-running collector restarts",
                                          ["collector"], registry=r)
        self.collector_duration = Histogram("gna_collector_duration_seconds", "Collector pass duration",
                                            ["collector"], registry=r,
                                            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30))
        self.collector_up = Gauge("gna_collector_up", "1 while the collector is healthy", ["collector"], registry=r)
        self.messages = Counter("gna_messages", "Messages accepted by the bus", ["kind", "severity"], registry=r)
        self.bus_refused = Counter("gna_bus_refused", "Messages the bus refused (spool full or failed)",
                                   registry=r)
        self.bus_queue_depth = Gauge("gna_bus_queue_depth", "Queued messages per subscriber", ["subscriber"],
                                     registry=r)
        self.bus_dropped = Gauge("gna_bus_subscriber_dropped", "Messages dropped by a slow subscriber",
                                 ["subscriber"], registry=r)
        self.spool_depth = Gauge("gna_spool_depth", "Messages in the spool not yet acknowledged by NATS",
                                 registry=r)
        self.spool_bytes = Gauge("gna_spool_bytes", "Bytes of spool segments on disk", registry=r)
        self.spool_dropped = Counter("gna_spool_dropped", "Messages dropped by the spool overflow policy",
                                     ["severity"], registry=r)
        self.published = Counter("gna_nats_published", "Messages acknowledged by JetStream", registry=r)
        self.publish_errors = Counter("gna_nats_publish_errors", "Failed publish batches", registry=r)
        self.publish_latency = Histogram("gna_nats_publish_latency_seconds",
                                         "Time from message creation to JetStream ack", registry=r,
                                         buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300))
        self.nats_connected = Gauge("gna_nats_connected", "1 while connected to NATS", registry=r)
        self.conditions_active = Gauge("gna_conditions_active", "Firing conditions", registry=r)
        self.source_unparsed = Gauge("gna_source_unparsed_lines", "Lines or records of a source that could not be "
                                     "parsed, since start", ["collector", "source"], registry=r)
        self.source_not_seen = Gauge("gna_source_not_seen", "1 while a source could not be looked at",
                                     ["collector", "source"], registry=r)
        # what an alert keys on (deploy/monitoring/gpu-node-agent.rules.yaml): the node's findings by type, as
        # node-problem-detector's problem_gauge/problem_counter; never per entity (that is the message's job)
        self.conditions_by_type = Gauge("gna_conditions_by_type", "Firing conditions by collector, type, severity "
                                        "and NodeCondition category ('' for a job's findings)",
                                        ["collector", "type", "severity", "category"], registry=r)
        self.events = Counter("gna_events", "Events accepted by the bus by collector, type and severity",
                              ["collector", "type", "severity"], registry=r)
        self.remediation_decisions = Counter("gna_remediation_decisions", "The node's remediation decisions "
                                             "(audited): executed, dry_run, skipped or failed, per plugin and action",
                                             ["remediation", "action", "decision"], registry=r)
        # node repair (agent/remediation/repair.py): NVSentinel's MTTR / MTBI, as histograms
        days = (60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800, 2592000)
        self.time_to_repair = Histogram("gna_remediation_time_to_repair_seconds", "From this agent's cordon to "
                                        "its uncordon after a validation passed (MTTR)", registry=r, buckets=days)
        self.time_between_incidents = Histogram("gna_remediation_time_between_incidents_seconds",
                                                "Between two repair episodes of this node (MTBI)", registry=r,
                                                buckets=days)
        self.validation_runs = Counter("gna_validation_runs", "Validations (agent/validate/) by level, verdict "
                                       "(passed, failed, busy, unavailable, error) and trigger (repair, schedule, "
                                       "resolution, request)", ["level", "verdict", "trigger"], registry=r)
        self.validation_requests = Counter("gna_validation_requests", "The central cordoner's requests to validate "
                                           "(gna.validate.<node>) by outcome: accepted, pending (a run is already "
                                           "owed), too_soon (within validate.request_min_interval)",
                                           ["outcome"], registry=r)
        self.validation_last_run = Gauge("gna_validation_last_run_timestamp_seconds", "When a validation last "
                                         "ended with this verdict", ["verdict"], registry=r)
        self._types: set[tuple[str, str]] = set()
        self._condition_labels: set[tuple[str, str, str, str]] = set()

        self.plugins = PluginMetrics()
        r.register(self.plugins)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _type(self, collector: str, type_: str) -> str:
        if (collector, type_) in self._types:
            return type_
        if len(self._types) >= MAX_TYPES:
            return OTHER_TYPE
        self._types.add((collector, type_))
        return type_

    def observe_message(self, kind: str, collector: str, type_: str, severity: str) -> None:
        """A message the bus accepted."""
        self.messages.labels(kind, severity).inc()
        if kind == "event":
            self.events.labels(collector, self._type(collector, type_), severity).inc()

    def set_conditions(self, active: Iterable[_Condition]) -> None:
        """The firing conditions now, counted per (collector, type, severity, category); a label set that
        had conditions and has none now reads 0 (not absent: a rate or a dashboard sees it go)."""
        counts: dict[tuple[str, str, str, str], int] = {}
        for c in active:
            key = (c.collector, self._type(c.collector, c.type), c.severity, category(c.type, c.entity) or "")
            counts[key] = counts.get(key, 0) + 1
        for key in self._condition_labels - counts.keys():
            self.conditions_by_type.labels(*key).set(0)
        for key, n in counts.items():
            self.conditions_by_type.labels(*key).set(n)
        self._condition_labels |= counts.keys()


class PluginMetrics:
    """Collectors with ``prometheus_families()`` export their own series (from their last pass:
    a scrape never reads sysfs)."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], list[Any]]] = {}

    def collect(self) -> list[Any]:
        out: list[Any] = []
        for name, source in list(self.sources.items()):
            try:
                out.extend(source())
            except Exception as exc:  # a plugin bug must not break /metrics
                log.error("plugin_metrics_failed", collector=name, error=repr(exc))
        return out

    def describe(self) -> list[Any]:
        return []


class Renders(Protocol):
    def render(self) -> bytes: ...


class MetricsServer:
    """HTTP/1.0-style responder: enough for Prometheus and a liveness probe, no extra dependency (the node
    agent's, and the correlator's and cordoner's: fleet/metrics.py)."""

    def __init__(self, metrics: Renders, listen: str, health: Callable[[], tuple[bool, str]],
                 refresh: Callable[[], None] | None = None) -> None:
        self.metrics = metrics
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.health = health
        self.refresh = refresh
        self._server: asyncio.Server | None = None

    async def start(self, *, quiet: bool = False) -> None:
        """Listen (an OSError when the address cannot be bound); ``quiet``: the address is logged at debug
        (a central command promises one stderr line when NATS is unreachable, and binds before connecting)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        (log.debug if quiet else log.info)("metrics_listening", address=f"{self.host}:{self.port}")

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            parts = line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            if path == "/metrics":
                if self.refresh:
                    self.refresh()
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self.metrics.render()
            elif path == "/healthz":
                ok, text = self.health()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain; charset=utf-8", (text + "\n").encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()
