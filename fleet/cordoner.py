"""The central cordoner: the fleet's messages from JetStream, the same engine, cluster credentials.

A durable push consumer with a queue group: several replicas can run and exactly one handles
each message; node agents then need no Kubernetes rights at all. A message is acknowledged only
after the engine decided and audited it.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agent import config as configmod
from agent.message import encode, make_message
from agent.metrics import AgentMetrics
from agent.nats_link import NatsLink
from agent.natsclient import NatsUnavailable, redact
from agent.remediation.budget import FleetBudget
from agent.remediation.engine import Engine
from agent.remediation.loader import load_plugins
from agent.subjects import EVENTS_PREFIX, action_subject, event_subject
from fleet.wire import Rejected, Rejections, decode_event
from gna_sdk.aio import within
from gna_sdk.hostroot import HostRoot
from gna_sdk.persist import until_stopped

log = structlog.get_logger(__name__)

CORDONER_NODE = "cordoner"  # the "node" the cordoner's own alerts come from (docs/nats-security.md)
MAX_DELIVER = 5


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
                             unavailable=loaded.unavailable)
        self._sub = await js.subscribe(
            f"{EVENTS_PREFIX}.>", queue=self.queue, durable=self.durable, cb=self._on_msg, manual_ack=True,
            # max_deliver: a message that kills or hangs the cordoner itself (no term possible) is given
            # up after a few tries instead of being redelivered for ever
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW, ack_wait=60,
                                  max_ack_pending=1000, max_deliver=MAX_DELIVER))
        log.info("cordoner_started", durable=self.durable, queue=self.queue, plugins=sorted(plugins),
                 enforce=self.cfg.remediations.enforce)

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
            try:
                await self.engine.handle(data)
            except Exception as exc:  # a poison message: decided as rejected, not redelivered for ever
                self._reject(f"unhandled:{type(exc).__name__}", msg.subject, msg.data)
                await msg.term()
                return
            self.handled += 1
        await msg.ack()

    async def stop(self) -> None:
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
