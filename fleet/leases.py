"""Partition leases: which correlator replica judges which share of the jobs, and takeover of a lost one's.

Replicas split the jobs by a hash of the job (``fleet.incidents.owner``). Each replica holds the
lease of its own partition in a KV bucket whose entries expire after ``ttl`` unless renewed. A
partition whose lease expired (its replica died, or lost NATS) is taken by a surviving replica
with a create-if-absent, so exactly one replica wins it; the winner replays the streams for it and
judges its jobs from then on. When the partition's own replica is back (its ``alive`` key is
present again), the stand-in releases the lease and the owner takes it on its next renewal.

Takeover rule (issue 21: failover within a few seconds, measured in bench/incidents_scale.py): a
replica ticks every ``ttl / 3`` s. A partition whose replica this one has *seen alive* is taken over
once its ``alive`` key is found missing on two ticks in a row, each after this replica's own write
succeeded (the bucket works now: an election that stalled every replica's renewals is not a death;
the second tick gives a replica that just came back one tick to say so). The lost replica's key
expires ``ttl`` after its last write, at most ``ttl / 3`` before it died, so a partition moves within
``ttl`` + two ticks of a death: 3 to 5 s at the default 3 s. A partition never seen alive (replicas
starting one after another) is taken only after ``STARTUP_GRACE_S``, so a slow start is not a loss.

Every write is a compare-and-set on the entry's revision: a replica that lost a lease (another
replica took it while this one was cut off) finds out on its next renewal and stops judging. An
election is not a loss: a renewal that fails without an answer keeps the lease until a TTL after
the last good renewal; a compare-and-set refused because the entry expired meanwhile (nobody else
claimed it) or because our last renewal was stored but its answer lost (the entry names us) keeps it
too (``reclaimed``) -- dropping it would forget the partition's jobs and replay their history.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gna_types import subjects

log = structlog.get_logger(__name__)

LEASES_BUCKET = subjects.LEASES_BUCKET
DEFAULT_TTL = 3.0  # `gpu-node-agent correlator --lease-ttl` and `nats setup --lease-ttl`: one default
ABSENT_TICKS = 2  # ticks in a row a seen-alive replica's key must be missing before its partition moves
STARTUP_GRACE_S = 20.0  # s a partition never seen alive is left to its own replica to claim


def bucket_config(*, ttl: float = DEFAULT_TTL, replicas: int = 1) -> Any:
    """The leases bucket as `gpu-node-agent nats setup` creates it: one entry per key, expiring after ``ttl``."""
    from nats.js.api import KeyValueConfig

    return KeyValueConfig(bucket=LEASES_BUCKET, history=1, ttl=ttl, replicas=replicas)


async def open_bucket(js: Any, *, ttl: float = DEFAULT_TTL, replicas: int = 1) -> Any:
    """The leases bucket, its backing stream verified (agent.nats_link.open_kv: a republish, mirror or sources
    on it is refused, loudly); created only when missing and this connection may (dev set-ups, tests)."""
    from agent.nats_link import open_kv

    return await open_kv(js, LEASES_BUCKET, create_with=bucket_config(ttl=ttl, replicas=replicas))


def lease_key(partition: int) -> str:
    return f"partition-{partition}"


def alive_key(partition: int) -> str:
    return f"alive-{partition}"


class Leases:
    """Acquire, renew, take over and release partition leases.

    ``on_gain(p)`` runs when this replica starts judging partition ``p`` (its own at start-up, or a
    lost replica's); ``on_loss(p)`` when it stops (a lease it could not renew, or one handed back).
    """

    def __init__(self, kv: Any, *, partitions: int, partition: int, holder: str, ttl: float,
                 on_gain: Callable[[int], Awaitable[None]], on_loss: Callable[[int], Awaitable[None]],
                 takeover: bool = True) -> None:
        self.kv = kv
        self.partitions, self.partition = partitions, partition
        self.holder = holder
        self.ttl = ttl
        self.on_gain, self.on_loss = on_gain, on_loss
        self.takeover = takeover
        self.held: dict[int, int] = {}  # partition -> revision of our lease entry
        self.takeovers = 0
        self.reclaimed = 0  # own leases kept through an election (an expired entry or a lost answer)
        self.errors = 0
        self._renewed: dict[int, float] = {}  # partition -> when we last renewed (monotonic)
        self._seen_alive: set[int] = set()  # partitions whose replica we saw alive
        self._absent: dict[int, int] = {}  # partition -> ticks in a row its alive key was missing
        self._started = time.monotonic()
        self.grace = max(STARTUP_GRACE_S, ttl)

    def _value(self, p: int) -> bytes:
        return json.dumps({"holder": self.holder, "partition": p, "time": time.time()}).encode()

    async def _get(self, key: str) -> Any | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            return await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None

    async def _try_create(self, p: int) -> bool:
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            self.held[p] = await self.kv.create(lease_key(p), self._value(p))
            self._renewed[p] = time.monotonic()
            return True
        except KeyWrongLastSequenceError:
            return False  # someone holds it
        except Exception as exc:
            if "wrong last sequence" in str(exc).lower():
                return False
            raise

    async def _renew(self, p: int) -> bool | None:
        """True: renewed; False: lost (another replica holds it, or it went unrenewed for a TTL);
        None: not known yet (NATS is away or electing: kept until a TTL after the last renewal)."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            self.held[p] = await self.kv.update(lease_key(p), self._value(p), last=self.held[p])
            self._renewed[p] = time.monotonic()
            return True
        except Exception as exc:
            wrong = isinstance(exc, KeyWrongLastSequenceError) or "wrong last sequence" in str(exc).lower()
            if wrong:
                # an election can lose a renewal's ack (stored, the revision we hold is stale) or let
                # the entry expire (nobody renewed for a TTL): neither is another replica's claim
                try:
                    entry = await self._get(lease_key(p))
                    if entry is None:
                        if await self._try_create(p):
                            self._renewed[p] = time.monotonic()
                            self.reclaimed += 1
                            log.info("lease_reclaimed", partition=p, why="expired while the bucket was away")
                            return True
                    elif _holder(entry.value) == self.holder:
                        self.held[p] = entry.revision
                        self._renewed[p] = time.monotonic()
                        self.reclaimed += 1
                        log.info("lease_reclaimed", partition=p, why="a renewal stored, its answer lost")
                        return True
                    log.warning("lease_lost", partition=p, holder=_holder(entry.value) if entry else None)
                    return False
                except Exception as again:
                    exc = again
            if time.monotonic() - self._renewed.get(p, 0.0) > self.ttl:
                log.warning("lease_lost", partition=p, error=repr(exc)[:200], unrenewed_s=self.ttl)
                return False
            log.info("lease_renewal_failed", partition=p, error=repr(exc)[:200])
            return None

    async def tick(self) -> None:
        """One round: renew what we hold, claim our own, take over expired ones, hand back stand-ins."""
        await self.kv.put(alive_key(self.partition), self._value(self.partition))
        for p in sorted(self.held):
            own_back = p != self.partition and await self._get(alive_key(p)) is not None
            if own_back:
                # the partition's own replica is alive again: hand its lease back
                await self._release(p)
                continue
            if await self._renew(p) is False:
                del self.held[p]
                await self.on_loss(p)
        candidates = [self.partition] if self.partition not in self.held else []
        if self.takeover:
            starting = time.monotonic() - self._started < self.grace
            for p in range(self.partitions):
                if p == self.partition or p in self.held:
                    continue
                if await self._get(alive_key(p)) is not None:
                    self._seen_alive.add(p)
                    self._absent.pop(p, None)
                    continue
                self._absent[p] = self._absent.get(p, 0) + 1
                if self._absent[p] >= ABSENT_TICKS and (p in self._seen_alive or not starting):
                    candidates.append(p)
        for p in candidates:
            if await self._try_create(p):
                if p != self.partition:
                    self.takeovers += 1
                    log.warning("lease_taken_over", partition=p, holder=self.holder)
                await self.on_gain(p)

    async def _release(self, p: int) -> None:
        rev = self.held.pop(p, None)
        await self.on_loss(p)
        if rev is not None:
            try:
                await self.kv.delete(lease_key(p), last=rev)
            except Exception as exc:  # expired meanwhile: nothing to hand back
                log.info("lease_release_failed", partition=p, error=repr(exc))

    async def run(self) -> None:
        """Tick every ttl/3 until cancelled; a NATS error is logged and retried on the next tick."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                self._absent.clear()  # "in a row" counts only ticks whose own write went through
                log.warning("lease_tick_failed", error=repr(exc))
            await asyncio.sleep(self.ttl / 3)

    async def release_all(self) -> None:
        """At a clean stop: hand every lease back and say we are gone, so another replica takes over at once."""
        for p in list(self.held):
            await self._release(p)
        try:
            await self.kv.delete(alive_key(self.partition))
        except Exception as exc:
            log.info("alive_release_failed", error=repr(exc))


def _holder(value: bytes | None) -> str | None:
    try:
        doc = json.loads(value or b"")
    except (ValueError, TypeError):
        return None
    h = doc.get("holder") if isinstance(doc, dict) else None
    return h if isinstance(h, str) else None
