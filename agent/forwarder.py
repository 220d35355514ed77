"""Spool -> JetStream, lossless and pipelined.

Up to ``publish_window`` publishes are in flight at once (publish_async); the spool's ack
pointer advances over the contiguous prefix that JetStream acknowledged. On any failure the
in-flight tail is re-sent from the ack pointer: JetStream drops what it already stored by
``Nats-Msg-Id`` within the stream's duplicate window, so downstream sees each message once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from agent.bus import split_record
from agent.metrics import AgentMetrics
from agent.nats_link import NatsLink
from agent.spool import SEVERITY_NAMES, Spool
from gna_sdk.aio import aligned_delay, raise_if_cancelling
from gna_sdk.ids import id_time_ms
from gna_sdk.retry import Backoff

log = structlog.get_logger(__name__)

Announce = Callable[[dict[str, int]], Awaitable[bool]]


class Forwarder:
    def __init__(self, spool: Spool, link: NatsLink, metrics: AgentMetrics, *, window: int,
                 timeout: float, announce: Announce | None = None) -> None:
        self.spool = spool
        self.link = link
        self.metrics = metrics
        self.window = window
        self.timeout = timeout
        self.announce = announce
        self.published = 0
        self.duplicates = 0
        self.idle = asyncio.Event()  # set whenever the spool is fully drained

    async def run(self) -> None:
        backoff = Backoff(0.2, 5.0)
        while True:
            raise_if_cancelling()  # nats-py's requests can swallow a cancellation (3.11 wait_for)
            await self.link.connected.wait()
            try:
                await self.link.ensure_stream()
                await self._pump()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.publish_errors.inc()
                self.spool.rewind()
                self.link.stream_ready = False
                delay = backoff.next()
                log.warning("publish_failed", error=repr(exc), depth=self.spool.depth, retry_in=delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()

    async def _announce_drops(self) -> None:
        pending = self.spool.unannounced_drops()
        if self.announce is None or not any(pending):
            return
        counts = {SEVERITY_NAMES[i]: n for i, n in enumerate(pending) if n}
        if await self.announce(counts):
            self.spool.mark_announced(pending)

    async def _pump(self) -> None:
        js = self.link.js
        assert js is not None
        while True:
            raise_if_cancelling()
            after = self.spool.acked_seq
            records = self.spool.read(after, self.window)
            if not records:
                # Drained: announce overflow drops now, when the announcement itself has room.
                await self._announce_drops()
                if self.spool.last_seq > after:
                    continue
                self.idle.set()
                # Appends wake this at once; the timeout only bounds a missed wake-up.
                await self.spool.wait_new(after, aligned_delay(30.0))  # with the rest (gna_sdk.aio)
                if not self.link.connected.is_set():
                    return
                continue
            self.idle.clear()
            futures = []
            for rec in records:
                subject, msg_id, payload = split_record(rec.payload)
                futures.append(await js.publish_async(subject, payload, headers={"Nats-Msg-Id": msg_id}))
            done, pending = await asyncio.wait(futures, timeout=self.timeout)
            acked = 0
            error: BaseException | None = None
            now_ms = time.time() * 1000
            for rec, fut in zip(records, futures, strict=True):
                if fut not in done or fut.cancelled() or fut.exception() is not None:
                    error = (fut.exception() if fut in done and not fut.cancelled() else None) or TimeoutError(
                        f"no PubAck within {self.timeout}s")
                    break
                ack = fut.result()
                if getattr(ack, "duplicate", False):
                    self.duplicates += 1
                acked += 1
                try:
                    created_ms = id_time_ms(split_record(rec.payload)[1])
                except ValueError:
                    continue
                self.metrics.publish_latency.observe(max(0.0, now_ms - created_ms) / 1000)
            for fut in pending:
                fut.cancel()
            if acked:
                self.spool.ack(records[acked - 1].seq, acked)
                self.published += acked
                self.metrics.published.inc(acked)
            if error is not None:
                raise error

    async def drain(self, timeout: float) -> bool:
        """Wait (bounded) until the spool is empty; used at shutdown."""
        deadline = time.monotonic() + timeout
        while self.spool.depth > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.spool.depth == 0
