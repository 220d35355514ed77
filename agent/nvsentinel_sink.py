"""The node's findings, fed to NVSentinel's platform connector as a health monitor ([exports.nvsentinel]).

A subscriber of the local bus (agent/bus.py): it never blocks a collector, and NATS delivery is not its
business. NVSentinel keeps state per check (a healthy event clears the unhealthy one), so this sink is
level-triggered for conditions: it holds the latest state of every condition it reported and sends
what changed; after any failure, and every ``resync_seconds``, every firing condition is sent again
(a restarted platform connector, a lost request), and a resolved one until it was delivered once.
At start it takes the firing conditions from the agent's ConditionTracker (persisted across restarts,
which publish transitions only). Events (not conditions) are queued up to ``max_pending_events`` while
NVSentinel is away, the oldest dropped and counted.

Transport: gRPC over the Unix socket platform-connectors listens on (``--socket``; NVSentinel's monitors
dial ``unix:///var/run/nvsentinel.sock``), no TLS, one ``HealthEventOccurredV1`` call per batch with a
deadline, retried with a doubling backoff (1 s to 60 s). grpcio comes with the [nvsentinel] extra and
is imported only when the export is enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from typing import Any

import structlog

from agent.config import NVSentinelConfig
from agent.emitter import ActiveCondition
from agent.message import Message, to_dict
from agent.nvsentinel_event import METHOD, HealthEvent, encode_events, health_event
from gna_sdk import severity_rank

log = structlog.get_logger(__name__)

BATCH = 100  # events a request at most
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
Key = tuple[str, str, str]  # (collector, type, entity)


def _condition_message(node: str, c: ActiveCondition) -> dict[str, Any]:
    """A firing condition the tracker holds, as the message that fired it (for the first send after a start)."""
    return {"id": c.message_id, "time": c.since, "node": node, "collector": c.collector, "kind": "condition",
            "type": c.type, "status": "firing", "severity": c.severity, "entity": c.entity, "reason": c.reason,
            "message": c.message, "details": {}, "suggested_action": c.suggested_action}


class NVSentinelSink:
    def __init__(self, cfg: NVSentinelConfig, node: str) -> None:
        self.cfg = cfg
        self.node = node
        self.conditions: dict[Key, HealthEvent] = {}  # the latest state of each condition reported
        self.unsent: set[Key] = set()
        self.events: deque[HealthEvent] = deque()
        self.sent = 0
        self.failures = 0
        self.dropped_events = 0
        self.last_error = ""
        self.delivering = False  # the last call succeeded
        self._wake = asyncio.Event()
        self._channel: Any = None
        self._call: Any = None
        self._last_resync = time.monotonic()

    def stats(self) -> dict[str, Any]:
        return {"sent": self.sent, "failures": self.failures, "dropped_events": self.dropped_events,
                "pending_conditions": len(self.unsent), "pending_events": len(self.events),
                "delivering": self.delivering, "last_error": self.last_error}

    def _wanted(self, severity: str) -> bool:
        return severity_rank(severity) >= severity_rank(self.cfg.min_severity)

    def seed(self, active: list[ActiveCondition]) -> None:
        """The tracker's firing conditions at start: NVSentinel may never have heard of them."""
        for c in active:
            if self._wanted(c.severity):
                key = (c.collector, c.type, c.entity)
                self.conditions[key] = health_event(_condition_message(self.node, c))
                self.unsent.add(key)
        self._wake.set()

    async def on_message(self, msg: Message) -> None:
        """The bus's handler: state kept, the sender woken; never waits on NVSentinel."""
        d = to_dict(msg)
        if msg.kind == "condition":
            key = (msg.collector, msg.type, msg.entity)
            if msg.status == "firing" and self._wanted(msg.severity):
                self.conditions[key] = health_event(d)
            elif msg.status == "resolved" and key in self.conditions:
                self.conditions[key] = health_event(d)  # the healthy event that clears NVSentinel's entry
            else:
                return
            self.unsent.add(key)
        elif self._wanted(msg.severity):
            if len(self.events) >= self.cfg.max_pending_events:
                self.events.popleft()
                self.dropped_events += 1
            self.events.append(health_event(d))
        else:
            return
        self._wake.set()

    def _batch(self) -> tuple[list[Key], list[HealthEvent]]:
        keys = sorted(self.unsent)[:BATCH]
        events = [self.conditions[k] for k in keys]
        events += list(self.events)[:BATCH - len(events)]
        return keys, events

    async def _send(self, payload: bytes) -> None:
        if not os.path.exists(self.cfg.socket):
            raise ConnectionError(f"{self.cfg.socket}: no such socket (is NVSentinel's platform connector running?)")
        if self._call is None:
            import grpc  # the [nvsentinel] extra

            self._channel = grpc.aio.insecure_channel(f"unix://{self.cfg.socket}")
            self._call = self._channel.unary_unary(METHOD, request_serializer=lambda b: b,
                                                   response_deserializer=lambda b: b)
        await self._call(payload, timeout=self.cfg.timeout_seconds)

    async def _reset(self) -> None:
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()

    async def run(self) -> None:
        delay = BACKOFF_MIN_S
        while True:
            now = time.monotonic()
            if now - self._last_resync >= self.cfg.resync_seconds:
                self._last_resync = now
                self.unsent |= {k for k, e in self.conditions.items() if not e.is_healthy}
            if not self.unsent and not self.events:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(),
                                           max(0.1, self.cfg.resync_seconds - (now - self._last_resync)))
                continue
            keys, events = self._batch()
            try:
                await self._send(encode_events(events))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                if self.delivering or self.failures == 1:
                    log.warning("nvsentinel_unreachable", socket=self.cfg.socket, error=self.last_error,
                                pending=len(self.unsent) + len(self.events))
                self.delivering = False
                await self._reset()
                # what was delivered before may be lost on the other side: every firing condition goes again
                self.unsent |= {k for k, e in self.conditions.items() if not e.is_healthy}
                await asyncio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            if not self.delivering:
                log.info("nvsentinel_delivering", socket=self.cfg.socket, events=len(events))
            self.delivering, delay = True, BACKOFF_MIN_S
            self.sent += len(events)
            for k, e in zip(keys, events, strict=False):
                if self.conditions.get(k) is not e:
                    continue  # changed while the call was out: the newer state is still to send
                self.unsent.discard(k)
                if e.is_healthy:
                    del self.conditions[k]  # cleared on the other side: nothing left to assert
            done = {id(e) for e in events[len(keys):]}
            while self.events and id(self.events[0]) in done:  # those not pushed out meanwhile
                self.events.popleft()

    async def close(self) -> None:
        await self._reset()


def start_nvsentinel(cfg: NVSentinelConfig, node: str, bus: Any, active: list[ActiveCondition],
                     loop: asyncio.AbstractEventLoop) -> tuple[NVSentinelSink, asyncio.Task[None]] | None:
    """[exports.nvsentinel] wired into the agent: a bus subscriber and its sending task, or None when the
    export is off or its extra is missing (the agent runs on and says why once; nothing depends on it)."""
    if not cfg.enabled:
        return None
    import importlib.util

    if importlib.util.find_spec("grpc") is None:
        log.error("nvsentinel_export_unavailable", reason="module 'grpc' is not installed: "
                  "pip install 'gpu-node-agent[nvsentinel]'")
        return None
    sink = NVSentinelSink(cfg, node)
    sink.seed(active)
    bus.subscribe("nvsentinel", sink.on_message)
    return sink, loop.create_task(sink.run(), name="exports:nvsentinel")
