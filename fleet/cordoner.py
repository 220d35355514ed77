"""The central cordoner: the fleet's messages from JetStream, the same engine, cluster credentials.

A durable push consumer with a queue group: several replicas can run and exactly one handles
each message; node agents then need no Kubernetes rights at all. A message is acknowledged only
after the engine decided and audited it.

Incidents (fleet/incidents.py): every replica watches the ``gna-incidents`` KV bucket; a victim's
symptoms of a job (agent/remediation/incidents.py says exactly which) are never cordoned for while
the job's open incident lists it as a victim (audited as "skipped"). The culprit of an incident
becomes an ``IncidentCulprit`` condition through the same engine -- only when the record is open,
its confidence >= ``CULPRIT_MIN_CONFIDENCE`` and it is actionable (``culprit_actionable``: an explicit
``"actionable": true``, or a hardware culprit in a record without the field): the rules, dry-run,
cooldowns and the fleet budget apply; one replica decides each incident update (a durable queue
consumer on the bucket's stream). A forged or one-reporter verdict is shown, never spends a slot.

Uncordon (issue 28): after every trigger of a node resolved for the hold-down, the node returns only on a
validation it ran itself since then (``NodeValidation`` on its own subject, fleet/validations.py);
``validate_before_uncordon = false`` restores the hold-down alone.

Liveness (#20):

* **Nothing waits in line.** The consumer's callback only decodes and files a message in its
  reporting node's lane (the node of the subject); one worker takes the lanes in turn, one message
  each, so a node with a thousand messages queued delays another node's next message by at most one
  decision. A message whose job is not judged yet and that a verdict could spare (a victim's
  symptom, ``IncidentView.needs_verdict``) waits for the verdict in its own task, at most
  ``INCIDENT_GRACE`` s, while the lanes go on. Hardware findings and conditions never wait.
* **Bounded.** At most ``MAX_WAITING`` messages wait at once, and at most ``MAX_WAITING_PER_NODE`` of
  them from one reporting node, so one node's flood cannot take the others' room. A symptom that
  finds no room is decided at once *without a verdict*, and a job's symptom without a verdict never
  cordons: it is audited "skipped" (no room to wait). That is the fail-safe side -- the reporter is
  not cordoned for having waited; a real culprit is still cordoned through its hardware findings
  (never delayed, never spared) and through ``IncidentCulprit``. Only the flooding node's own symptoms
  lose their wait; a symptom that did wait and got no verdict within the grace is decided by the
  rules as before (the correlator may be down).
* **Order.** Within a lane messages are decided in arrival order; only events wait, and an event has
  no resolution to overtake, so a condition's firing and its resolution (which the engine pairs to
  uncordon) are never reordered.
* **Never raises, never deaf.** A message or record that cannot be decided is terminated and counted
  with a sample (``fleet.wire.Rejections``); a NATS connection closed for good makes ``run_cordoner``
  return ``EX_TEMPFAIL`` (agent/natsclient.py) so the supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig

from agent import config as configmod
from agent.message import encode, make_message
from agent.metrics import AgentMetrics, MetricsServer
from agent.nats_link import NatsLink, open_kv
from agent.natsclient import ConnectionWatch, NatsUnavailable, redact, run_until_closed_or_stopped
from agent.remediation.budget import FleetBudget
from agent.remediation.engine import Engine
from agent.remediation.incidents import (
    CULPRIT_MIN_CONFIDENCE,
    GRACE,
    INCIDENTS_BUCKET,
    BadIncident,
    IncidentView,
    check_incident,
    culprit_changes,
)
from agent.remediation.loader import load_plugins
from fleet.metrics import CordonerMetrics, serve_metrics
from fleet.validations import NodeValidations
from fleet.wire import Rejected, Rejections, decode_event
from gna_sdk import plural
from gna_sdk.aio import within
from gna_sdk.hostroot import HostRoot
from gna_types.subjects import CORDONER_DURABLE, EVENTS_PREFIX, action_subject, event_subject, validate_subject
from gna_types.validation import NODE_VALIDATION

log = structlog.get_logger(__name__)

__all__ = ["CULPRIT_MIN_CONFIDENCE", "Cordoner", "run_cordoner"]

CORDONER_NODE = "cordoner"  # the "node" the cordoner's own alerts come from (docs/nats-security.md)
MAX_DELIVER = 5
INCIDENT_GRACE = GRACE  # s: a job's first NCCL message waits this long for the correlator's verdict
MAX_WAITING = 512  # messages waiting for a verdict at once, all reporting nodes together
MAX_WAITING_PER_NODE = 32  # of which one reporting node may hold
# Unacknowledged messages the server lets the cordoner hold: well above MAX_WAITING, so waiting messages never
# stop it from delivering the others (a durable consumer keeps the value it was created with).
MAX_ACK_PENDING = 4096
MAX_SUBJECT = 1024  # longer subjects are refused: audits are published on a subject built from it
NO_ROOM = ("no verdict for job {job} yet and no room to wait for it ({why}): a job's symptom never cordons "
           "without the correlator's verdict")


class Cordoner:
    def __init__(self, cfg: configmod.AgentConfig, servers: list[str], *, durable: str = CORDONER_DURABLE,
                 queue: str = CORDONER_DURABLE, name: str = "cordoner", watch: ConnectionWatch | None = None,
                 max_waiting: int = MAX_WAITING, max_waiting_per_node: int = MAX_WAITING_PER_NODE,
                 metrics_listen: str = "") -> None:
        self.cfg = cfg
        self.servers = servers
        self.durable = durable
        self.queue = queue
        self.name = name
        self.watch = watch if watch is not None else ConnectionWatch()
        self.link = NatsLink(cfg.nats, servers, AgentMetrics(), name=f"gpu-node-agent-cordoner/{name}",
                             inbox="cordoner")
        self.engine: Engine | None = None
        self.handled = 0
        self.rejections = Rejections(who="cordoner")  # terminated unhandled (never redelivered), with samples
        self.rejected = self.rejections.counts
        self._sub: Any = None
        self._incident_sub: Any = None
        self.view = IncidentView(grace=INCIDENT_GRACE, on_invalid=self._bad_record)  # job -> its current record
        self.validations = NodeValidations(ask=self._ask_validation)  # each node's own last report, for the uncordon
        self.incidents = self.view.incidents
        self._tasks: list[asyncio.Task[Any]] = []
        # per reporting node, its messages not decided yet (arrival order); the worker takes them in turn
        self.lanes: dict[str, deque[tuple[Any, dict[str, Any]]]] = {}
        self._work = asyncio.Event()
        self.max_waiting = max_waiting
        self.max_waiting_per_node = max_waiting_per_node
        self.waiting: dict[str, int] = {}  # reporting node -> its messages waiting for a verdict now
        self.waited = 0  # messages that waited (for tests and `status`)
        self.no_room = 0  # symptoms decided without their wait: no room
        self._waiters: set[asyncio.Task[None]] = set()
        self._unjudged: set[int] = set()  # id() of messages being decided after finding no room to wait
        # /metrics (fleet/metrics.py): decisions counted as audited, the rest read at scrape time; "" serves none
        self.metrics = CordonerMetrics()
        self.metrics.attach(self)
        self.metrics_listen = metrics_listen
        self.metrics_server: MetricsServer | None = None

    def _health(self) -> tuple[bool, str]:
        ok = self.link.nc is not None and bool(self.link.nc.is_connected)
        return ok, "ok" if ok else "not connected to NATS"

    async def start(self) -> None:
        if self.metrics_listen and self.metrics_server is None:  # first: a port in use fails at once (ListenError)
            self.metrics_server = await serve_metrics(self.metrics, self.metrics_listen, self._health)
        await self.link.connect()
        assert self.link.nc is not None
        self.watch.track(self.link.nc, f"cordoner {self.name}")
        await self.link.ensure_stream()
        js = self.link.js
        assert js is not None
        budget = FleetBudget.for_agent(js, self.cfg)

        async def audit(record: dict[str, Any]) -> None:
            self.metrics.audited(record)
            await js.publish(action_subject(record["node"] or "unknown", record["remediation"]),
                             json.dumps(record, separators=(",", ":")).encode(), headers={"Nats-Msg-Id": record["id"]})

        async def alert(type_: str, message: str, details: dict[str, Any]) -> None:
            # a schema-valid message from "node" cordoner, so the dashboard shows it like any other
            msg = make_message(node=CORDONER_NODE, collector="agent", kind="event", type=type_, severity="critical",
                               entity="cordoner", reason=type_, message=message, details=details)
            await js.publish(event_subject(CORDONER_NODE, "agent", "critical"), encode(msg),
                             headers={"Nats-Msg-Id": msg.id})

        loaded = load_plugins(self.cfg.remediations, HostRoot("/"))
        # Only cluster-level actions (cordon/drain, which take a budget slot) run centrally: a node-local one
        # (modprobe, a cache warmup) would act on the cordoner's own host.
        plugins = {n: p for n, p in loaded.available.items() if p.needs_budget}
        for name in sorted(set(loaded.available) - set(plugins)):
            loaded.unavailable[name] = f"{name} acts on a node's own host: the node agent runs it, not the cordoner"
        # Repair episodes run on the node (its tools, its GPUs). The hold-down uncordon waits for the node's
        # own NodeValidation since its triggers resolved (fleet/validations.py; docs/repair.md, "central").
        rcfg = msgspec.structs.replace(self.cfg.remediations,
                                       repair=msgspec.structs.replace(self.cfg.remediations.repair, enabled=False))
        self.engine = Engine(rcfg, plugins, audit=audit, alert=alert, budget=lambda: budget,
                             unavailable=loaded.unavailable, spare=self._spare,
                             validator=self.validations.validator())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_incidents(js), name="cordoner:incidents"))
        self._tasks.append(loop.create_task(self._worker(), name="cordoner:lanes"))
        self._sub = await js.subscribe(
            f"{EVENTS_PREFIX}.>", queue=self.queue, durable=self.durable, cb=self._on_msg, manual_ack=True,
            # max_deliver: a message that kills or hangs the cordoner itself (no term possible) is given
            # up after a few tries instead of being redelivered for ever
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW, ack_wait=60,
                                  max_ack_pending=MAX_ACK_PENDING, max_deliver=MAX_DELIVER))
        log.info("cordoner_started", durable=self.durable, queue=self.queue, plugins=sorted(plugins),
                 enforce=self.cfg.remediations.enforce)

    async def _ask_validation(self, node: str) -> None:
        """Ask a cordoned node to validate itself (core NATS; the node decides when, fleet/validations.py)."""
        if self.link.nc is None:
            raise ConnectionError("not connected to NATS")
        await self.link.nc.publish(validate_subject(node), b"")

    def _spare(self, msg: dict[str, Any]) -> str | None:
        """The engine's question "must this message not cordon its node?": a victim's symptom (IncidentView),
        or a symptom decided without the verdict it found no room to wait for."""
        why = self.view.spare(msg)
        if why is None and id(msg) in self._unjudged:
            details = msg.get("details")
            job = details.get("job") if isinstance(details, dict) else None
            node = msg.get("node", "")
            share = self.waiting.get(node, 0) >= self.max_waiting_per_node
            return NO_ROOM.format(job=job, why=(f"{node} already has {plural(self.max_waiting_per_node, 'message')} "
                                                "waiting" if share else
                                                f"{plural(self.max_waiting, 'message')} are waiting"))
        return why

    async def _await_verdict(self, msg: dict[str, Any]) -> None:
        """Wait for the correlator like the lanes would (for tests): only what needs a verdict waits."""
        await self.view.await_verdict(msg, self.engine is not None and self.engine.would_take_budget(msg))

    async def _watch_incidents(self, js: Any) -> None:
        """Every replica keeps the open incidents (for spare()); one replica decides each update."""
        while True:
            try:
                # verified first (agent.nats_link.open_kv): a bucket with a republish, mirror or sources is refused
                kv = await open_kv(js, INCIDENTS_BUCKET, create_with=KeyValueConfig(
                    bucket=INCIDENTS_BUCKET, history=5, replicas=self.cfg.nats.stream_replicas))
                if self._incident_sub is None:
                    self._incident_sub = await js.subscribe(
                        f"$KV.{INCIDENTS_BUCKET}.>", queue=f"{self.queue}-incidents",
                        durable=f"{self.durable}-incidents", stream=f"KV_{INCIDENTS_BUCKET}", cb=self._on_incident,
                        manual_ack=True, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                                               deliver_policy=DeliverPolicy.NEW,
                                                               ack_wait=60, max_deliver=MAX_DELIVER))
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None or entry.value is None:
                        continue
                    self.view.file(entry.value)  # counts a bad record, never raises
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("cordoner_incident_watch_retry", error=repr(exc))
                await asyncio.sleep(1)

    def _bad_record(self, exc: BadIncident, data: bytes) -> None:
        self._reject(exc.reason, f"$KV.{INCIDENTS_BUCKET}", data, exc.detail)

    async def _on_incident(self, msg: Any) -> None:
        """One update of the bucket (this replica decides it): the culprit's trigger fires or ends. Never raises."""
        try:
            try:
                rec = check_incident(msg.data)
            except BadIncident as exc:
                self._reject(exc.reason, msg.subject, msg.data, exc.detail)
                await msg.term()
                return
            before = self.incidents.get(rec["job"])
            self.view.put(rec)
            for trigger in culprit_changes(before, rec):
                await self._culprit(trigger, rec)
            await msg.ack()
        except Exception as exc:  # a connection gone mid-ack, an engine bug: counted, the next update goes on
            self._reject(f"unhandled:{type(exc).__name__}", str(getattr(msg, "subject", "")), b"", repr(exc))

    async def _culprit(self, trigger: dict[str, Any], rec: dict[str, Any]) -> None:
        """The culprit as a condition through the engine: rules, dry-run, cooldowns and the budget apply;
        its end (resolved) lets the engine's uncordon logic run."""
        if self.engine is None:
            return
        try:
            await self.engine.handle(trigger)
        except Exception as exc:
            self._reject(f"unhandled:{type(exc).__name__}", f"incident {rec['job']}", json.dumps(rec)[:500].encode())

    def _reject(self, reason: str, subject: str, sample: bytes, detail: str = "") -> None:
        self.rejections.record(reason, subject, sample, detail)

    async def _on_msg(self, msg: Any) -> None:
        """The consumer's callback: decode and file in the reporting node's lane; nothing here waits for a
        decision. Identity is the subject (per-node NATS permissions make it authentic), never the payload;
        a message that cannot be decided is terminated and counted, so it never blocks the ones behind it."""
        try:
            if len(msg.subject) > MAX_SUBJECT:
                raise Rejected("subject_too_long", f"{len(msg.subject)} characters (at most {MAX_SUBJECT})")
            data = decode_event(msg.subject, msg.data)
        except Rejected as exc:
            self._reject(exc.reason, msg.subject[:MAX_SUBJECT], msg.data, str(exc))
            await self._settle(msg, term=True)
            return
        except Exception as exc:  # the decoder's own bug: still counted, never raised into the subscription
            self._reject(f"unusable:{type(exc).__name__}", msg.subject[:MAX_SUBJECT], msg.data, repr(exc))
            await self._settle(msg, term=True)
            return
        if data.get("collector") == "agent":
            await self._settle(msg)
            return
        node = str(data.get("node", ""))
        if data.get("type") == NODE_VALIDATION and (why := self.validations.file(node, data.get("details"))):
            self._reject("validation_report", msg.subject[:MAX_SUBJECT], msg.data, why)
        self.lanes.setdefault(node, deque()).append((msg, data))
        self._work.set()

    async def _worker(self) -> None:
        """The lanes in turn, one message of each node per round."""
        while True:
            await self._work.wait()
            self._work.clear()
            while self.lanes:
                for node in list(self.lanes):
                    lane = self.lanes.get(node)
                    if not lane:
                        self.lanes.pop(node, None)
                        continue
                    msg, data = lane.popleft()
                    if not lane:
                        del self.lanes[node]
                    try:
                        await self._dispatch(node, msg, data)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # never lose the worker
                        self._reject(f"unhandled:{type(exc).__name__}", msg.subject, msg.data, repr(exc))

    async def _dispatch(self, node: str, msg: Any, data: dict[str, Any]) -> None:
        assert self.engine is not None
        if self.view.needs_verdict(data, self.engine.would_take_budget(data)):
            total = sum(self.waiting.values())
            if total < self.max_waiting and self.waiting.get(node, 0) < self.max_waiting_per_node:
                self.waiting[node] = self.waiting.get(node, 0) + 1
                self.waited += 1
                task = asyncio.get_running_loop().create_task(self._decide_later(node, msg, data),
                                                              name=f"cordoner:verdict:{node[:64]}")
                self._waiters.add(task)
                task.add_done_callback(self._waiters.discard)
                return
            self.no_room += 1
            self._unjudged.add(id(data))
            try:
                await self._decide(msg, data)
            finally:
                self._unjudged.discard(id(data))
            return
        await self._decide(msg, data)

    async def _decide_later(self, node: str, msg: Any, data: dict[str, Any]) -> None:
        try:
            await self.view.wait_verdict(data)
        finally:
            left = self.waiting.get(node, 1) - 1
            if left > 0:
                self.waiting[node] = left
            else:
                self.waiting.pop(node, None)
        try:
            await self._decide(msg, data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reject(f"unhandled:{type(exc).__name__}", msg.subject, msg.data, repr(exc))

    async def _decide(self, msg: Any, data: dict[str, Any]) -> None:
        """The engine decides (and audits); then the message is acknowledged, or terminated if it broke it."""
        assert self.engine is not None
        try:
            await self.engine.handle(data)
        except Exception as exc:  # a poison message: decided as rejected, not redelivered for ever
            self._reject(f"unhandled:{type(exc).__name__}", msg.subject, msg.data, repr(exc))
            await self._settle(msg, term=True)
            return
        self.handled += 1
        await self._settle(msg)

    async def _settle(self, msg: Any, *, term: bool = False) -> None:
        """ack or term; a connection gone meanwhile is the watch's business (the message is redelivered)."""
        try:
            await (msg.term() if term else msg.ack())
        except Exception as exc:
            log.info("cordoner_ack_failed", error=repr(exc), term=term)

    async def stop(self) -> None:
        self.watch.stop()
        tasks = [*self._tasks, *self._waiters]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._incident_sub is not None:
            with contextlib.suppress(Exception):
                await self._incident_sub.unsubscribe()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self.link.close()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            self.metrics_server = None


async def run_cordoner(cfg: configmod.AgentConfig, servers: list[str], duration: float | None = None, *,
                       started: Callable[[], None] | None = None) -> int:
    """Until SIGTERM/SIGINT or ``duration`` seconds from the call (0), or until its NATS connection closed for
    good (``EX_TEMPFAIL``: the supervisor restarts it); NatsUnavailable when the first connection (and the
    stream) cannot be had within the connect timeout. ``started`` is called once it has started."""
    start = time.monotonic()
    timeout = cfg.nats.connect_timeout if duration is None else min(cfg.nats.connect_timeout, duration)
    c = Cordoner(cfg, servers, metrics_listen=cfg.metrics.listen)
    try:
        await within(c.start(), timeout)
    except TimeoutError:
        where = ", ".join(redact(s) for s in servers)
        why = f": {c.link.last_error}" if c.link.last_error else ""
        raise NatsUnavailable(f"cannot reach NATS JetStream at {where} within {timeout:g} s{why}") from None
    if started is not None:
        started()
    rc = await run_until_closed_or_stopped(
        c.watch, None if duration is None else max(0.0, start + duration - time.monotonic()))
    await c.stop()
    return rc
