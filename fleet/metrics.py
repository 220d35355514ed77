"""Prometheus /metrics of the central services: the correlator, the cordoner and the dashboard.

Each service has its own registry and one collector that reads the service's existing state at scrape
time (its counters, its followers, its tracker's open incidents): nothing is added to the correlator's
hot path (issue 21) but a few counters where a record is published or a decision audited. Series are
named ``gna_<service>_*`` -- never the node agent's names, so the node alerts' fleet-wide ratios
(``count(gna_nats_connected == 0) / count(gna_nats_connected)``) count nodes only -- and carry no per-job
or per-node label: incidents are counted by whether a culprit is named and whether it is actionable,
rejections by their reason (a bounded set, folded into ``other`` past ``MAX_REASONS``).

The correlator and the cordoner serve it with agent/metrics.py's small HTTP server on ``[metrics] listen``
(``--metrics-listen``), as the node agent does; the dashboard on its own aiohttp app at ``/metrics``.
deploy/monitoring/gpu-node-agent.rules.yaml alerts on these series; docs/operations.md lists them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.metrics import MetricsServer
from agent.remediation.incidents import culprit_actionable

if TYPE_CHECKING:
    from fleet.cordoner import Cordoner
    from fleet.incident_service import IncidentService
    from fleet.state import FleetFeed, FleetState

log = structlog.get_logger(__name__)

MAX_REASONS = 64  # distinct rejection reasons exported by name; the rest are summed as "other"
OTHER = "other"
# the loop-stall probe's lateness (fleet/incident_service.py, every STALL_PROBE_S)
STALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BUDGET_REFUSALS = {"fleet budget exhausted": "exhausted", "fleet budget unavailable": "unavailable"}


class ListenError(Exception):
    """``[metrics] listen`` cannot be bound (the commands exit 71, as the dashboard does for --listen)."""


async def serve_metrics(metrics: ServiceMetrics, listen: str, health: Callable[[], tuple[bool, str]]) -> MetricsServer:
    """/metrics and /healthz on ``listen`` (HOST:PORT; port 0: any free one), or ListenError."""
    server = MetricsServer(metrics, listen, health)
    try:
        await server.start(quiet=True)  # bound before NATS is reached: an unreachable NATS stays one line
    except OSError as exc:
        raise ListenError(f"cannot listen on {listen} for /metrics: {exc.strerror or exc}") from None
    return server


def reasons(counts: dict[str, int]) -> list[tuple[str, int]]:
    """``counts`` (reason -> messages, in the order first seen) as exported: the first MAX_REASONS by
    name, later ones summed as "other" -- stable from scrape to scrape, so every series only grows."""
    out: list[tuple[str, int]] = []
    other = 0
    for i, (reason, n) in enumerate(list(counts.items())):
        if i < MAX_REASONS:
            out.append((reason, n))
        else:
            other += n
    if other:
        out.append((OTHER, other))
    return out


def _connected(nc: Any) -> float:
    return 1.0 if nc is not None and getattr(nc, "is_connected", False) else 0.0


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _rejected(name: str, doc: str, counts: dict[str, int]) -> CounterMetricFamily:
    """Refusals by reason (fleet/wire.py Rejections.counts), the reasons bounded by ``reasons``."""
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, n in reasons(counts):
        family.add_metric([reason], n)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class _Collector:
    """A prometheus-client custom collector: ``read()`` yields the families at scrape time; a bug there is
    logged, never raised into the scrape (the other series are still served)."""

    def __init__(self, name: str, read: Callable[[], Iterable[Metric]]) -> None:
        self.name, self.read = name, read

    def collect(self) -> Iterator[Metric]:
        try:
            out = list(self.read())
        except Exception as exc:
            log.error("service_metrics_failed", service=self.name, error=repr(exc))
            return iter(())
        return iter(out)

    def describe(self) -> list[Metric]:
        return []


class ServiceMetrics:
    """One central service's registry; ``render()`` is what /metrics serves."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.registry = CollectorRegistry()

    def add(self, read: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_Collector(self.name, read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


# -- the correlator ---------------------------------------------------------------------------------
class CorrelatorMetrics(ServiceMetrics):
    """What the correlator's ``stats()`` says, as series; the loop-stall probe's lateness as a histogram
    (observed by the probe itself, 20 times a second, off the message path)."""

    def __init__(self) -> None:
        super().__init__("correlator")
        self.loop_stall = Histogram("gna_correlator_loop_stall_seconds", "How late the event loop's stall probe "
                                    "woke (what held the loop held every message and verdict behind it)",
                                    registry=self.registry, buckets=STALL_BUCKETS)
        self.service: IncidentService | None = None
        self.add(self._read)

    def attach(self, service: IncidentService) -> None:
        self.service = service

    def _read(self) -> Iterator[Metric]:
        svc = self.service
        if svc is None:
            return
        yield _gauge("gna_correlator_nats_connected", "1 while connected to NATS", _connected(svc.nc))
        yield _gauge("gna_correlator_judging", "1 once the streams' history is in and verdicts are published",
                     1.0 if svc._judging else 0.0)
        consumed = CounterMetricFamily("gna_correlator_messages", "Messages its followers handed on, per stream "
                                       "(live and replayed)", labels=["stream"])
        pending = GaugeMetricFamily("gna_correlator_pending_messages", "Messages stored on its streams that its "
                                    "live followers' consumers have not delivered yet (asked every second)",
                                    labels=["stream"])
        handed = dict(svc.handed_retired)
        waiting: dict[str, int] = {}
        for f in list(svc.followers):
            handed[f.stream] = handed.get(f.stream, 0) + f.handed
            if f.until is None:
                waiting[f.stream] = waiting.get(f.stream, 0) + f.pending
        for stream, n in sorted(handed.items()):
            consumed.add_metric([stream], n)
        for stream, n in sorted(waiting.items()):
            pending.add_metric([stream], n)
        yield consumed
        yield pending
        yield _counter("gna_correlator_accepted", "Messages decoded and filed", svc.accepted)
        yield _counter("gna_correlator_skipped", "Messages read off their subject as another replica's and not "
                       "decoded", svc.skipped)
        yield _rejected("gna_correlator_rejected", "Messages refused at the wire (fleet/wire.py) "
                                       "or that tripped a bug, by reason", svc.rejections.counts)
        yield _rejected("gna_correlator_refused", "Messages refused by a per-reporter share "
                                      "(fleet/incidents.py), by reason", svc.tracker.refused)
        yield from self._incidents(svc)
        published = CounterMetricFamily("gna_correlator_incidents_published", "Incident records written (KV and "
                                        "subject), by status: open (a new or changed verdict) or resolved",
                                        labels=["status"])
        for status in ("open", "resolved"):
            published.add_metric([status], svc.published_by_status.get(status, 0))
        yield published
        yield _gauge("gna_correlator_publish_pending", "Incident records waiting to be written", len(svc._outbox))
        yield _counter("gna_correlator_publish_retries", "Incident writes retried (no leader, NATS away, a "
                       "timeout)", svc.publish_retries)
        yield _counter("gna_correlator_stragglers_published", "Straggler records published",
                       svc.stragglers_published)
        t = svc.tracker
        yield _gauge("gna_correlator_jobs", "Jobs whose evidence is held", len(t.jobs))
        yield _counter("gna_correlator_jobs_dropped", "Jobs forgotten to keep within the table's bound",
                       t.dropped_jobs)
        yield _gauge("gna_correlator_partitions", "Partitions the jobs are split into (--partitions)",
                     t.partitions)
        yield _gauge("gna_correlator_partitions_owned", "Partitions this replica judges now", len(t.owned))
        leases = svc.leases
        yield _counter("gna_correlator_lease_takeovers", "Partitions taken over from a silent replica",
                       leases.takeovers if leases is not None else 0)
        yield _counter("gna_correlator_lease_errors", "Lease renewals or claims that failed",
                       leases.errors if leases is not None else 0)
        yield _counter("gna_correlator_lease_beats_rejected", "Replica beats refused (oversized, malformed, "
                       "another partition's subject)", leases.beats_rejected if leases is not None else 0)
        yield _gauge("gna_correlator_loop_stall_max_seconds", "The longest the event loop was held, since start",
                     svc.loop_stall_max_ms / 1000.0)
        yield _gauge("gna_correlator_gc_pause_max_seconds", "The longest cyclic garbage collection, since start",
                     svc.heap.max_ms / 1000.0)
        yield _counter("gna_correlator_gc_full", "Full (generation 2) garbage collections", svc.heap.full)
        yield _counter("gna_correlator_gc_freezes", "Times the long-lived state was frozen out of full collections",
                       svc.heap.freezes)
        yield _gauge("gna_correlator_gc_frozen_objects",
                     "Objects frozen out of cyclic collections (gc.freeze) since the last thaw, counted when frozen",
                     svc.heap.frozen())

    @staticmethod
    def _incidents(svc: IncidentService) -> Iterator[Metric]:
        """Open incidents by (culprit named, actionable), and how long the oldest of each has been open:
        one pass over the jobs' last published records (thousands at most: a scrape's millisecond)."""
        now = time.time()
        count: dict[tuple[str, str], int] = {}
        oldest: dict[tuple[str, str], float] = {}
        for j in list(svc.tracker.jobs.values()):
            rec = j.published
            if not rec or rec.get("status") != "open":
                continue
            key = ("named" if rec.get("culprit") else "none", "true" if culprit_actionable(rec) else "false")
            count[key] = count.get(key, 0) + 1
            opened = rec.get("opened")
            if isinstance(opened, (int, float)) and not isinstance(opened, bool):
                oldest[key] = max(oldest.get(key, 0.0), now - float(opened))
        opened_f = GaugeMetricFamily("gna_correlator_incidents_open", "Open incidents of the jobs this replica "
                                     "judges, by whether a culprit is named and whether it is actionable",
                                     labels=["culprit", "actionable"])
        age = GaugeMetricFamily("gna_correlator_incident_open_oldest_seconds", "How long the oldest open incident "
                                "of each kind has been open (0: none open)", labels=["culprit", "actionable"])
        for culprit in ("named", "none"):
            for actionable in ("true", "false"):
                if culprit == "none" and actionable == "true":
                    continue  # no culprit: nothing to act on
                opened_f.add_metric([culprit, actionable], count.get((culprit, actionable), 0))
                age.add_metric([culprit, actionable], max(0.0, oldest.get((culprit, actionable), 0.0)))
        yield opened_f
        yield age


# -- the cordoner -----------------------------------------------------------------------------------
class CordonerMetrics(ServiceMetrics):
    """Decisions counted as they are audited (the engine's audit callback: one per decision, not per
    message); the rest read at scrape time."""

    def __init__(self) -> None:
        super().__init__("cordoner")
        self.decisions: dict[tuple[str, str, str], int] = {}
        self.budget_refusals: dict[str, int] = {"exhausted": 0, "unavailable": 0}
        self.cordoner: Cordoner | None = None
        self.add(self._read)

    def attach(self, cordoner: Cordoner) -> None:
        self.cordoner = cordoner

    def audited(self, record: dict[str, Any]) -> None:
        """One audited decision (agent/remediation/engine.py's record)."""
        key = (str(record.get("remediation", ""))[:64], str(record.get("action", "")),
               str(record.get("decision", "")))
        self.decisions[key] = self.decisions.get(key, 0) + 1
        reason = str(record.get("reason", ""))
        for prefix, why in BUDGET_REFUSALS.items():
            if record.get("decision") == "skipped" and reason.startswith(prefix):
                self.budget_refusals[why] += 1

    def _read(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily("gna_cordoner_decisions", "Audited remediation decisions by remediation, "
                                        "action (apply, uncordon) and decision (executed, dry_run, skipped, "
                                        "failed)", labels=["remediation", "action", "decision"])
        for (remediation, action, decision), n in sorted(self.decisions.items()):
            decisions.add_metric([remediation, action, decision], n)
        yield decisions
        refusals = CounterMetricFamily("gna_cordoner_budget_refusals", "Cordons not done for the fleet budget: "
                                       "exhausted, or unavailable (fail safe)", labels=["why"])
        for why, n in sorted(self.budget_refusals.items()):
            refusals.add_metric([why], n)
        yield refusals
        c = self.cordoner
        if c is None:
            return
        yield _gauge("gna_cordoner_nats_connected", "1 while connected to NATS", _connected(c.link.nc))
        yield _gauge("gna_cordoner_enforcing", "1 when decisions act (--enforce), 0 in dry-run",
                     1.0 if c.cfg.remediations.enforce else 0.0)
        yield _gauge("gna_cordoner_budget_exhausted", "1 from a cordon refused for the spent fleet budget until "
                     "one is granted again", 1.0 if c.engine is not None and c.engine.budget_exhausted else 0.0)
        yield _counter("gna_cordoner_handled", "Messages decided and acknowledged", c.handled)
        yield _rejected("gna_cordoner_rejected", "Messages or incident records refused at the wire "
                                       "(fleet/wire.py) or that tripped a bug, by reason", c.rejections.counts)
        yield _gauge("gna_cordoner_queued_messages", "Messages filed in the reporting nodes' lanes, not decided "
                     "yet", sum(len(lane) for lane in list(c.lanes.values())))
        yield _gauge("gna_cordoner_waiting_messages", "Messages waiting for the correlator's verdict",
                     sum(c.waiting.values()))
        yield _counter("gna_cordoner_waited", "Messages that waited for a verdict", c.waited)
        yield _counter("gna_cordoner_no_room", "Symptoms decided without their wait (no room): never cordoned for",
                       c.no_room)
        inc = GaugeMetricFamily("gna_cordoner_incidents_open", "Open incidents the cordoner knows (KV "
                                "gna-incidents), by whether their culprit may be acted on", labels=["actionable"])
        counts = {"true": 0, "false": 0}
        for rec in list(c.incidents.values()):
            if rec.get("status") == "open":
                counts["true" if culprit_actionable(rec) else "false"] += 1
        for k, n in counts.items():
            inc.add_metric([k], n)
        yield inc


# -- the dashboard ----------------------------------------------------------------------------------
class DashboardMetrics(ServiceMetrics):
    def __init__(self, state: FleetState, feed: FleetFeed | None = None,
                 subscribers: Callable[[], int] | None = None) -> None:
        super().__init__("dashboard")
        self.state, self.feed, self.subscribers = state, feed, subscribers
        self.add(self._read)

    def _read(self) -> Iterator[Metric]:
        s = self.state
        if self.feed is not None:
            yield _gauge("gna_dashboard_nats_connected", "1 while connected to NATS", _connected(self.feed.nc))
        yield _gauge("gna_dashboard_nodes", "Nodes the dashboard knows", len(s.nodes))
        yield _counter("gna_dashboard_messages", "Messages applied to the view", s.messages_seen)
        yield _rejected("gna_dashboard_rejected", "Messages refused at the wire (fleet/wire.py) or "
                                       "unusable by a view, by reason", s.rejections.counts)
        yield _gauge("gna_dashboard_incidents_open", "Open incidents shown",
                     sum(1 for r in list(s.incidents_by_job.values()) if r.get("status") == "open"))
        yield _counter("gna_dashboard_incidents_dropped", "Incident records dropped to keep within the view's "
                       "bound", s.incidents_dropped)
        if self.subscribers is not None:
            yield _gauge("gna_dashboard_sse_clients", "Browsers following the live stream", self.subscribers())
        lags = sorted(s.last_message_lag)
        lag = GaugeMetricFamily("gna_dashboard_message_lag_seconds", "From a message's time to the view applying "
                                "it, over the last 10,000 messages", labels=["quantile"])
        if lags:
            for q in (0.5, 0.99):
                lag.add_metric([str(q)], lags[min(len(lags) - 1, int(q * len(lags)))])
        yield lag
