"""Heartbeats on ``gna.heartbeat.<node>`` and the node's current state in the ``gna-nodes`` KV bucket.

The document is bounded: it never exceeds ``HEARTBEAT_MAX_BYTES`` nor the server's max_payload.
Beyond that it carries the worst conditions that fit, ``conditions_total`` and
``conditions_complete: false`` (the fleet then keeps what it knows from the event stream for the
rest); a heartbeat that grew past max_payload would be refused and the node would look dead.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import structlog

from agent import __version__
from agent.emitter import ConditionTracker
from agent.message import rfc3339
from agent.nats_link import NatsLink
from agent.spool import Spool
from gna_sdk import severity_rank
from gna_sdk.aio import aligned_delay, raise_if_cancelling, wait_event
from gna_types.subjects import encode_token, heartbeat_subject

log = structlog.get_logger(__name__)

HEARTBEAT_MAX_BYTES = 64 * 1024
_MESSAGE_CAP = 300  # a condition's message in the heartbeat (the full one is in its event)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def bounded(doc: dict[str, Any], conditions: list[dict[str, Any]], max_bytes: int) -> bytes:
    """``doc`` with as many of ``conditions`` (worst and oldest first) as fit in ``max_bytes``."""
    conds = sorted(conditions, key=lambda c: (-severity_rank(c.get("severity")), str(c.get("since"))))
    for c in conds:
        if len(str(c.get("message", ""))) > _MESSAGE_CAP:
            c["message"] = str(c["message"])[:_MESSAGE_CAP] + "…"
    doc = {**doc, "conditions_total": len(conds), "conditions_complete": True, "conditions": conds}
    body = _dumps(doc)
    if len(body) <= max_bytes:
        return body
    doc["conditions_complete"] = False
    room = max_bytes - len(_dumps({**doc, "conditions": []}))
    kept = []
    for c in conds:
        size = len(_dumps(c)) + 1
        if size > room:
            break
        kept.append(c)
        room -= size
    doc["conditions"] = kept
    return _dumps(doc)


class NodeStatePublisher:
    def __init__(self, node: str, link: NatsLink, tracker: ConditionTracker, spool: Spool | None,
                 interval: float) -> None:
        self.node = node
        self.link = link
        self.tracker = tracker
        self.spool = spool
        self.interval = interval
        self.started = time.time()
        self.changed = asyncio.Event()
        self.heartbeats = 0
        tracker.on_change = self.changed.set

    def state(self) -> dict[str, Any]:
        """The document without its conditions (``body`` adds them, bounded)."""
        return {
            "schema_version": 1,
            "node": self.node,
            "agent_version": __version__,
            "time": rfc3339(),
            "started": rfc3339(self.started),
            "heartbeat_interval": self.interval,
            "spool_depth": self.spool.depth if self.spool else 0,
            "conditions_folded": self.tracker.overflow_counts(),
        }

    def body(self, max_payload: int) -> bytes:
        limit = min(HEARTBEAT_MAX_BYTES, max(1024, max_payload - 1024))  # headroom for NATS headers
        return bounded(self.state(), self.tracker.snapshot(), limit)

    async def publish_once(self) -> None:
        assert self.link.nc is not None
        body = self.body(self.link.nc.max_payload or HEARTBEAT_MAX_BYTES)
        await self.link.nc.publish(heartbeat_subject(self.node), body)
        kv = await self.link.kv()
        await kv.put(encode_token(self.node), body)
        self.heartbeats += 1

    async def run(self) -> None:
        while True:
            raise_if_cancelling()  # nats-py's requests can swallow a cancellation (3.11 wait_for)
            await self.link.connected.wait()
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat_failed", error=repr(exc))
            self.changed.clear()
            # A condition transition refreshes the KV state early (debounced to 200 ms).
            if await wait_event(self.changed, aligned_delay(self.interval)):  # on the process's grid (gna_sdk.aio)
                await asyncio.sleep(0.2)
