"""Local event bus: durable accept, then fan-out to subscribers that can never block a collector.

``publish`` first appends to the spool (the NATS forwarder tails it), then puts the message
on every subscriber's bounded queue; a full queue drops its oldest entry and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from agent import message as msgmod
from agent.message import Message
from agent.spool import Spool, SpoolError
from gna_sdk.aio import cancel_and_wait, within
from gna_types.subjects import subjects_for

log = structlog.get_logger(__name__)

Handler = Callable[[Message], Awaitable[None]]


class Subscription:
    def __init__(self, name: str, handler: Handler, maxsize: int) -> None:
        self.name = name
        self.handler = handler
        self.queue: asyncio.Queue[Message] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.errors = 0
        self.task: asyncio.Task[None] | None = None

    def offer(self, msg: Message) -> None:
        if self.queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(msg)

    async def pump(self) -> None:
        while True:
            msg = await self.queue.get()
            try:
                await self.handler(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                log.error("subscriber_failed", subscriber=self.name, error=repr(exc), type=msg.type)


class LocalBus:
    def __init__(self, spool: Spool | None, *, subscriber_queue: int = 10000) -> None:
        self.spool = spool
        self.subscriber_queue = subscriber_queue
        self.subscriptions: list[Subscription] = []
        self.accepted = 0
        self.refused = 0  # dropped by spool policy or a spool write failure
        self.copies_refused = 0  # a job's evidence copy the spool refused (the message itself was accepted)
        self._running = False
        self.abandoned: list[str] = []  # subscriber tasks that ignored cancellation at stop()

    def subscribe(self, name: str, handler: Handler, maxsize: int | None = None) -> Subscription:
        sub = Subscription(name, handler, maxsize or self.subscriber_queue)
        self.subscriptions.append(sub)
        if self._running:
            sub.task = asyncio.get_running_loop().create_task(sub.pump(), name=f"bus:{name}")
        return sub

    def start(self) -> None:
        self._running = True
        loop = asyncio.get_running_loop()
        for sub in self.subscriptions:
            if sub.task is None:
                sub.task = loop.create_task(sub.pump(), name=f"bus:{sub.name}")

    async def stop(self, drain_timeout: float = 1.0) -> None:
        async def drain() -> None:
            for sub in self.subscriptions:
                while not sub.queue.empty() and sub.task and not sub.task.done():
                    await asyncio.sleep(0.01)

        with contextlib.suppress(TimeoutError):
            await within(drain(), drain_timeout)
        self.abandoned = [t.get_name() for t in await cancel_and_wait(
            [s.task for s in self.subscriptions if s.task], max(0.5, drain_timeout))]
        self._running = False

    async def publish(self, msg: Message) -> bool:
        """Accept a message: True once it is durable (or fanned out, with no spool)."""
        if self.spool is not None:
            payload = msgmod.encode(msg)
            subjects = subjects_for(msg.node, msg.collector, msg.severity, msg.type, msg.details)
            for k, subject in enumerate(subjects):
                # one record per subject, the same Msg-Id (each stream dedups its own); the first is
                # the message, a job's evidence copy after it is counted if the spool refuses it
                record = b"%s\n%s\n%s" % (subject.encode(), msg.id.encode(), payload)
                try:
                    seq = await self.spool.append(msg.severity, record)
                except SpoolError as exc:
                    seq = None
                    log.error("spool_write_failed", error=str(exc), type=msg.type, entity=msg.entity)
                if seq is None:
                    if k:
                        self.copies_refused += 1
                        log.warning("job_evidence_copy_dropped", type=msg.type, subject=subject)
                        break
                    self.refused += 1
                    log.warning("spool_full_dropped", type=msg.type, severity=msg.severity,
                                policy=self.spool.policy)
                    return False
        self.accepted += 1
        for sub in self.subscriptions:
            sub.offer(msg)
        return True


    async def publish_record(self, subject: str, msg_id: str, payload: bytes, severity: str = "info") -> bool:
        """A non-message record (a remediation audit) on its own subject, durably like the rest."""
        if self.spool is None:
            return False
        try:
            seq = await self.spool.append(severity, b"%s\n%s\n%s" % (subject.encode(), msg_id.encode(), payload))
        except SpoolError as exc:
            self.refused += 1
            log.error("spool_write_failed", error=str(exc), subject=subject)
            return False
        if seq is None:
            self.refused += 1
            return False
        return True


def split_record(record: bytes) -> tuple[str, str, bytes]:
    """Inverse of the spool record layout used by ``LocalBus.publish``: subject, msg id, JSON."""
    subject, msg_id, payload = record.split(b"\n", 2)
    return subject.decode(), msg_id.decode(), payload
