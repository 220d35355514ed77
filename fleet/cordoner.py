"""The central cordoner: the fleet's messages from JetStream, the same engine, cluster credentials.

A durable push consumer with a queue group: several replicas can run and exactly one handles
each message; node agents then need no Kubernetes rights at all. A message is acknowledged only
after the engine decided and audited it.

Incidents (fleet/incidents.py): every replica watches the ``gna-incidents`` KV bucket, and a node
that is a victim of an open incident is never cordoned for that job's NCCL symptoms (audited as
"skipped"); an NCCL message of a job no incident has judged yet waits up to ``INCIDENT_GRACE``
seconds once per job, so the correlator can speak first. The culprit of an incident (confidence
>= ``CULPRIT_MIN_CONFIDENCE``) becomes an ``IncidentCulprit`` condition through the same engine:
the rules, dry-run, cooldowns and the fleet budget apply; one replica decides each incident update
(a durable queue consumer on the bucket's stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agent import config as configmod
from agent.message import encode, make_message, to_dict
from agent.metrics import AgentMetrics
from agent.nats_link import NatsLink
from agent.natsclient import NatsUnavailable, redact
from agent.remediation.budget import FleetBudget
from agent.remediation.engine import Engine
from agent.remediation.incidents import GRACE, INCIDENTS_BUCKET, IncidentView, parse_incident
from agent.remediation.loader import load_plugins
from agent.subjects import EVENTS_PREFIX, action_subject, event_subject
from fleet.wire import Rejected, Rejections, decode_event
from gna_sdk.aio import within
from gna_sdk.hostroot import HostRoot
from gna_sdk.persist import until_stopped

log = structlog.get_logger(__name__)

CORDONER_NODE = "cordoner"  # the "node" the cordoner's own alerts come from (docs/nats-security.md)
MAX_DELIVER = 5
INCIDENT_GRACE = GRACE  # s: a job's first NCCL message waits this long for the correlator's verdict
CULPRIT_MIN_CONFIDENCE = 0.85


class Cordoner:
    def __init__(self, cfg: configmod.AgentConfig, servers: list[str], *, durable: str = "gna-cordoner",
                 queue: str = "gna-cordoner", name: str = "cordoner") -> None:
        self.cfg = cfg
        self.servers = servers
        self.durable = durable
        self.queue = queue
        self.name = name
        self.link = NatsLink(cfg.nats, servers, AgentMetrics(), name=f"gpu-node-agent-cordoner/{name}",
                             inbox="cordoner")
        self.engine: Engine | None = None
        self.handled = 0
        self.rejections = Rejections(who="cordoner")  # terminated unhandled (never redelivered), with samples
        self.rejected = self.rejections.counts
        self._sub: Any = None
        self._incident_sub: Any = None
        self.view = IncidentView(grace=INCIDENT_GRACE)  # job -> its current incident record
        self.incidents = self.view.incidents
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        await self.link.connect()
        await self.link.ensure_stream()
        js = self.link.js
        assert js is not None
        budget = FleetBudget.for_agent(js, self.cfg)

        async def audit(record: dict[str, Any]) -> None:
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
        self.engine = Engine(self.cfg.remediations, plugins, audit=audit, alert=alert, budget=lambda: budget,
                             unavailable=loaded.unavailable, spare=self.view.spare)
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_incidents(js), name="cordoner:incidents"))
        self._sub = await js.subscribe(
            f"{EVENTS_PREFIX}.>", queue=self.queue, durable=self.durable, cb=self._on_msg, manual_ack=True,
            # max_deliver: a message that kills or hangs the cordoner itself (no term possible) is given
            # up after a few tries instead of being redelivered for ever
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW, ack_wait=60,
                                  max_ack_pending=1000, max_deliver=MAX_DELIVER))
        log.info("cordoner_started", durable=self.durable, queue=self.queue, plugins=sorted(plugins),
                 enforce=self.cfg.remediations.enforce)

    async def _await_verdict(self, msg: dict[str, Any]) -> None:
        """A job's first NCCL message that a rule would cordon on waits for the correlator (IncidentView)."""
        await self.view.await_verdict(msg, self.engine is not None and self.engine.would_take_budget(msg))

    async def _watch_incidents(self, js: Any) -> None:
        """Every replica keeps the open incidents (for spare()); one replica decides each update."""
        while True:
            try:
                try:
                    kv = await js.key_value(INCIDENTS_BUCKET)
                except Exception:
                    kv = await js.create_key_value(bucket=INCIDENTS_BUCKET, history=5,
                                                   replicas=self.cfg.nats.stream_replicas)
                self._incident_sub = await js.subscribe(
                    f"$KV.{INCIDENTS_BUCKET}.>", queue=f"{self.queue}-incidents", durable=f"{self.durable}-incidents",
                    stream=f"KV_{INCIDENTS_BUCKET}", cb=self._on_incident, manual_ack=True,
                    config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW,
                                          ack_wait=60, max_deliver=MAX_DELIVER))
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None or entry.value is None:
                        continue
                    self.view.file(entry.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("cordoner_incident_watch_retry", error=repr(exc))
                await asyncio.sleep(1)

    async def _on_incident(self, msg: Any) -> None:
        rec = parse_incident(msg.data)
        if rec is None:
            self._reject("bad_incident", msg.subject, msg.data)
            await msg.term()
            return
        before = self.incidents.get(rec["job"])
        self.incidents[rec["job"]] = rec
        c = rec.get("culprit")
        conf = rec.get("confidence")
        old = (before or {}).get("culprit")
        if old and before and before.get("status") == "open" and (old != c or rec["status"] != "open"):
            await self._culprit(before, old, firing=False)  # a verdict withdrawn or changed: its trigger ends
        if c and isinstance(conf, (int, float)) and conf >= CULPRIT_MIN_CONFIDENCE and rec["status"] == "open":
            await self._culprit(rec, c, firing=True)
        await msg.ack()

    async def _culprit(self, rec: dict[str, Any], c: dict[str, Any], *, firing: bool) -> None:
        """The culprit as a condition through the engine: rules, dry-run, cooldowns and the budget apply;
        its end (resolved) lets the engine's uncordon logic run."""
        if self.engine is None:
            return
        trigger = make_message(
            node=c["node"], collector="correlator", kind="condition", type="IncidentCulprit",
            severity="critical" if firing else "info", status="firing" if firing else "resolved",
            entity=str(c.get("entity", "node"))[:200], reason=str(c.get("kind", "culprit"))[:64],
            message=f"culprit of job {rec['job']}: {str(rec.get('reason', ''))[:300]}",
            details={"job": rec["job"], "confidence": rec.get("confidence"), "victims": len(rec.get("victims", []))})
        try:
            await self.engine.handle(to_dict(trigger))
        except Exception as exc:
            self._reject(f"unhandled:{type(exc).__name__}", f"incident {rec['job']}", json.dumps(rec)[:500].encode())

    def _reject(self, reason: str, subject: str, sample: bytes, detail: str = "") -> None:
        self.rejections.record(reason, subject, sample, detail)

    async def _on_msg(self, msg: Any) -> None:
        """Identity is the subject (per-node NATS permissions make it authentic), never the payload; a
        message that cannot be decided is terminated and counted, so it never blocks the ones behind it."""
        try:
            data = decode_event(msg.subject, msg.data)
        except Rejected as exc:
            self._reject(exc.reason, msg.subject, msg.data, str(exc))
            await msg.term()
            return
        if data.get("collector") != "agent":
            assert self.engine is not None
            await self._await_verdict(data)
            try:
                await self.engine.handle(data)
            except Exception as exc:  # a poison message: decided as rejected, not redelivered for ever
                self._reject(f"unhandled:{type(exc).__name__}", msg.subject, msg.data)
                await msg.term()
                return
            self.handled += 1
        await msg.ack()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        if self._incident_sub is not None:
            with contextlib.suppress(Exception):
                await self._incident_sub.unsubscribe()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await self.link.close()


async def run_cordoner(cfg: configmod.AgentConfig, servers: list[str], duration: float | None = None) -> int:
    """Until SIGTERM/SIGINT or ``duration`` seconds from the call; NatsUnavailable when the first
    connection (and the stream) cannot be had within the connect timeout."""
    start = time.monotonic()
    timeout = cfg.nats.connect_timeout if duration is None else min(cfg.nats.connect_timeout, duration)
    c = Cordoner(cfg, servers)
    try:
        await within(c.start(), timeout)
    except TimeoutError:
        where = ", ".join(redact(s) for s in servers)
        raise NatsUnavailable(f"cannot reach NATS JetStream at {where} within {timeout:g} s") from None
    await until_stopped(None if duration is None else max(0.0, start + duration - time.monotonic()))
    await c.stop()
    return 0
