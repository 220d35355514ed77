"""Heartbeats on ``gna.heartbeat.<node>`` and the node's current state in the ``gna-nodes`` KV bucket."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import structlog

from agent import __version__
from agent.aio import raise_if_cancelling, wait_event
from agent.emitter import ConditionTracker
from agent.message import rfc3339
from agent.nats_link import NatsLink
from agent.spool import Spool
from agent.subjects import encode_token, heartbeat_subject

log = structlog.get_logger(__name__)


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
        return {
            "schema_version": 1,
            "node": self.node,
            "agent_version": __version__,
            "time": rfc3339(),
            "started": rfc3339(self.started),
            "heartbeat_interval": self.interval,
            "spool_depth": self.spool.depth if self.spool else 0,
            "conditions": self.tracker.snapshot(),
        }

    async def publish_once(self) -> None:
        assert self.link.nc is not None
        state = self.state()
        body = json.dumps(state, separators=(",", ":")).encode()
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
            if await wait_event(self.changed, self.interval):
                await asyncio.sleep(0.2)
