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

Beacons (issue 21: a replica and a nats-server killed together moved the partition 5.1 s after the kill,
its next incident 7.1 s): the alive key says a replica is gone only when it expires, a TTL after its last
write. Each replica also beats on core NATS (``BEACON_PREFIX``.<partition>, every ``ttl / 12`` s, no
JetStream: it crosses the cluster's routes while the streams elect) and hears every replica's beats,
its own included. A replica whose beats stopped while this one kept hearing its own for
``BEACON_MISSED`` beats (the path through NATS works: a survivor cut off itself hears nothing, and
decides nothing) is dead: its partition's lease entry, when it names a dead holder, is deleted by a
compare-and-set on the entry's revision and created anew by the survivor, without waiting for it to
expire (about 1-1.5 s after the death instead of 3-5). The survivor that claims is the live replica of
the lowest partition (the others keep the alive-key rule as a fallback; compare-and-sets settle any
race). When the bucket itself cannot be asked (the dead server led it: no answer until its election
ends, 4-9 s), that replica judges the dead one's partition provisionally meanwhile (``provisional``;
incident records are compare-and-set, so a second judge adds no version), hands it back at once if its
replica beats again, and takes the lease or gives the partition up once the bucket answers.
A replica wrongly taken for dead (its beats held up) loses the lease on its next renewal and claims it
back when the stand-in sees its alive key and hears its beats again; nothing it published is lost. Beats
are bounded at the boundary: one over ``BEACON_MAX_BYTES``, not JSON, or naming another partition than its
subject's is counted (``beats_rejected``) and ignored; only the correlator's role may publish or read
them (fleet/nats_permissions.py).

Every write is a compare-and-set on the entry's revision: a replica that lost a lease (another
replica took it while this one was cut off) finds out on its next renewal and stops judging. An
election is not a loss: a renewal that fails without an answer keeps the lease until a TTL after
the last good renewal; a compare-and-set refused because the entry expired meanwhile (nobody else
claimed it) or because our last renewal was stored but its answer lost (the entry names us) keeps it
too (``reclaimed``) -- dropping it would forget the partition's jobs and replay their history.
"""

from __future__ import annotations

import asyncio
import contextlib
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
# core NATS, BEACON_PREFIX.<partition>: the replicas' beats (only the correlator's role: fleet/nats_permissions.py).
# Central-only (no node publishes or reads it), so it lives with the leases, not in gna_types/subjects.py.
BEACON_PREFIX = "gna.correlator.beat"
BEATS_PER_TTL = 12  # a beat every ttl / 12 s (0.25 s at the default TTL)
BEACON_MISSED = 4  # beats of a replica missed while ours arrived before it counts as dead (1 s at the default TTL)
BEACON_MAX_BYTES = 512
HOLDER_MAX = 200  # characters of a holder name (host:pid:partition)


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


def beacon_subject(partition: int) -> str:
    return f"{BEACON_PREFIX}.{partition}"


class Leases:
    """Acquire, renew, take over and release partition leases.

    ``on_gain(p)`` runs when this replica starts judging partition ``p`` (its own at start-up, or a
    lost replica's); ``on_loss(p)`` when it stops (a lease it could not renew, or one handed back).
    """

    def __init__(self, kv: Any, *, partitions: int, partition: int, holder: str, ttl: float,
                 on_gain: Callable[[int], Awaitable[None]], on_loss: Callable[[int], Awaitable[None]],
                 takeover: bool = True, nc: Any = None, beat_s: float | None = None) -> None:
        self.kv = kv
        self.nc = nc  # the core connection the beats go over (None: no beats, the alive keys alone)
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
        self.beat_s = beat_s or ttl / BEATS_PER_TTL
        self.beats_rejected = 0
        self.beat_takeovers = 0  # of ``takeovers``: taken when the holder's beats stopped, before its entry expired
        self._heard: dict[int, tuple[float, str]] = {}  # partition -> (monotonic, holder) of its replica's last beat
        self._self_heard = -1e9  # when we last heard our own beat come back (monotonic)
        self._self_since = 0.0  # since when we have heard our own beats without a break
        self._dead_checked: dict[int, float] = {}  # partition -> when its lease entry was last looked at
        self._lock = asyncio.Lock()  # one tick or one takeover at a time (both create and hand over leases)
        # partitions judged without a lease: their replica's beats stopped while the bucket could not be asked
        # (its leader died too: an election, 4-9 s); settled once the bucket answers (``_settle_provisional``)
        self.provisional: dict[int, float] = {}  # partition -> since when (monotonic): a later beat hands it back
        self.provisional_takeovers = 0

    def _value(self, p: int) -> bytes:
        return json.dumps({"holder": self.holder, "partition": p, "time": time.time()}).encode()

    async def _get(self, key: str) -> Any | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            return await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None

    async def _try_create(self, p: int) -> bool:
        try:
            self.held[p] = await self.kv.create(lease_key(p), self._value(p))
            self._renewed[p] = time.monotonic()
            return True
        except Exception as exc:
            if _wrong_last(exc):
                return False  # someone holds it
            raise

    async def _renew(self, p: int) -> bool | None:
        """True: renewed; False: lost (another replica holds it, or it went unrenewed for a TTL);
        None: not known yet (NATS is away or electing: kept until a TTL after the last renewal)."""
        try:
            self.held[p] = await self.kv.update(lease_key(p), self._value(p), last=self.held[p])
            self._renewed[p] = time.monotonic()
            return True
        except Exception as exc:
            if _wrong_last(exc):
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
        async with self._lock:
            await self._tick()

    async def _tick(self) -> None:
        await self.kv.put(alive_key(self.partition), self._value(self.partition))
        silent = self.silent()
        for p in sorted(self.held):
            # its replica is back when its alive key is there -- unless its beats stopped: the key of a replica
            # that just died lives on for a TTL, and handing its partition back to nobody would only delay it
            own_back = p != self.partition and p not in silent and await self._get(alive_key(p)) is not None
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
                await self._gained(p, "its alive key expired")
        await self._settle_provisional(silent)

    async def _gained(self, p: int, why: str) -> None:
        """A lease created: judged from now on (a partition judged provisionally already is, and stays)."""
        if p != self.partition:
            self.takeovers += 1
            log.warning("lease_taken_over", partition=p, holder=self.holder, why=why)
        if self.provisional.pop(p, None) is not None:
            return
        await self.on_gain(p)

    async def _settle_provisional(self, silent: dict[int, str]) -> None:
        """Each tick, what the bucket says of the partitions judged without a lease: ours once we create it,
        given up when another replica holds it (left to the beats while the holder it names is a dead one)."""
        for p in sorted(self.provisional):
            entry = await self._get(lease_key(p))
            if entry is None:
                if await self._try_create(p):
                    await self._gained(p, "provisional, now leased")
            elif (h := _holder(entry.value)) != self.holder and h not in set(silent.values()):
                del self.provisional[p]
                log.warning("lease_provisional_given_up", partition=p, holder=h)
                await self.on_loss(p)

    async def _release(self, p: int) -> None:
        rev = self.held.pop(p, None)
        await self.on_loss(p)
        if rev is not None:
            try:
                await self.kv.delete(lease_key(p), last=rev)
            except Exception as exc:  # expired meanwhile: nothing to hand back
                log.info("lease_release_failed", partition=p, error=repr(exc))

    # -- beats ---------------------------------------------------------------------------------------------

    def _on_beat(self, subject: str, data: bytes) -> None:
        """One beat heard, bounded and checked (a bad one is counted and ignored)."""
        try:
            if len(data) > BEACON_MAX_BYTES:
                raise ValueError("oversized")
            doc = json.loads(data)
            p, holder = doc.get("partition"), doc.get("holder")
            if (type(p) is not int or not 0 <= p < self.partitions or subject != beacon_subject(p)
                    or not isinstance(holder, str) or not 0 < len(holder) <= HOLDER_MAX):
                raise ValueError("malformed")
        except (ValueError, TypeError, AttributeError):
            self.beats_rejected += 1
            return
        now = time.monotonic()
        if p == self.partition and holder == self.holder:
            if now - self._self_heard > 2 * self.beat_s:
                self._self_since = now  # a new unbroken run of our own beats
            self._self_heard = now
        elif p != self.partition:
            self._heard[p] = (now, holder)

    def silent(self) -> dict[int, str]:
        """Partition -> holder of each replica whose beats stopped while ours kept coming back: heard from
        nothing for ``BEACON_MISSED`` beats of an unbroken run of our own (a run breaks when two of ours go
        missing: then we were cut off, and their silence meanwhile says nothing about them)."""
        now = time.monotonic()
        if now - self._self_heard > 2 * self.beat_s:
            return {}
        window = BEACON_MISSED * self.beat_s
        return {p: h for p, (t, h) in self._heard.items() if self._self_heard - max(t, self._self_since) > window}

    async def _take_from_dead(self) -> None:
        """A dead replica's partition (and what it stood in for), taken without waiting for the entry's expiry.
        Each silent partition's entry is looked at once a tick at most (a partition that stays without its
        replica, held by a stand-in, costs one read a tick, not one a beat). Only the live replica of the lowest
        partition claims (survivors racing would move a partition twice); the others keep the alive-key rule.
        When the bucket cannot be asked (its leader died with the replica: an election of 4-9 s), it judges the
        partition provisionally meanwhile -- records are compare-and-set, so a second judge adds no version --
        and a replica whose beats are back gets it back at once."""
        silent = self.silent()
        for p, since in sorted(self.provisional.items()):
            if self._heard.get(p, (-1e9, ""))[0] > since:  # its replica beats again
                del self.provisional[p]
                log.warning("lease_provisional_handed_back", partition=p)
                await self.on_loss(p)
        dead = set(silent.values())
        live = {self.partition} | {q for q in self._heard if q not in silent}
        if self.partition != min(live):
            return  # the live replica of the lowest partition claims; the others' alive-key rule is the fallback
        now = time.monotonic()
        for p in sorted(silent):
            if p in self.held or now - self._dead_checked.get(p, -1e9) < min(self.ttl / 3, BEACON_MISSED * self.beat_s):
                continue
            self._dead_checked[p] = now
            try:
                got = await self._claim_from(p, dead)
            except Exception as exc:  # no leader, no answer: the bucket is electing
                log.info("lease_claim_failed", partition=p, error=repr(exc)[:200])
                if p not in self.provisional:
                    self.provisional[p] = time.monotonic()
                    self.provisional_takeovers += 1
                    log.warning("lease_provisional", partition=p, holder=self.holder,
                                why="its replica's beats stopped and the bucket does not answer")
                    await self.on_gain(p)
                continue
            if got:
                self.beat_takeovers += 1
                await self._gained(p, "its replica's beats stopped")

    async def _claim_from(self, p: int, dead: set[str]) -> bool:
        """Partition ``p``'s lease created for us when nobody or a dead holder has it (False: someone alive
        holds it, or another survivor was faster)."""
        entry = await self._get(lease_key(p))
        if entry is not None:
            if _holder(entry.value) not in dead:
                return False  # held by someone alive (a stand-in), or by a holder we never heard: its TTL decides
            try:
                await self.kv.delete(lease_key(p), last=entry.revision)
            except Exception as exc:
                if _wrong_last(exc):
                    return False  # renewed or taken meanwhile
                raise
        return await self._try_create(p)

    async def _beat_loop(self) -> None:
        """Beat every ``beat_s``, whatever else waits: a beat held up behind a takeover that waits for the
        bucket would make this replica look cut off to itself (and dead to the others)."""
        subject = beacon_subject(self.partition)
        beat = json.dumps({"holder": self.holder, "partition": self.partition}).encode()
        while True:
            try:
                await self.nc.publish(subject, beat)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnecting: the next beat tries again
                self.errors += 1
                log.info("lease_beat_failed", error=repr(exc)[:200])
            await asyncio.sleep(self.beat_s)

    async def _watch_loop(self) -> None:
        """Every ``beat_s``: take what dead replicas held, hand provisional partitions back."""
        while True:
            try:
                if self.takeover and (self.provisional or self.silent()):
                    async with self._lock:
                        await self._take_from_dead()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the bucket electing: the next round tries again
                self.errors += 1
                log.info("lease_watch_failed", error=repr(exc)[:200])
            await asyncio.sleep(self.beat_s)

    async def run(self) -> None:
        """Tick every ttl/3 until cancelled; a NATS error is logged and retried on the next tick. With a core
        connection, beat and listen too."""
        beats: asyncio.Future[Any] | None = None
        sub: Any = None
        try:
            if self.nc is not None:
                async def on_beat(m: Any) -> None:
                    self._on_beat(m.subject, m.data)

                sub = await self.nc.subscribe(f"{BEACON_PREFIX}.*", cb=on_beat)
                beats = asyncio.gather(asyncio.create_task(self._beat_loop(), name="incidents:lease-beats"),
                                       asyncio.create_task(self._watch_loop(), name="incidents:lease-watch"))
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
        finally:
            if beats is not None:
                beats.cancel()
                await asyncio.gather(beats, return_exceptions=True)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def release_all(self) -> None:
        """At a clean stop: hand every lease back and say we are gone, so another replica takes over at once."""
        for p in list(self.held):
            await self._release(p)
        for p in list(self.provisional):
            del self.provisional[p]
            await self.on_loss(p)
        try:
            await self.kv.delete(alive_key(self.partition))
        except Exception as exc:
            log.info("alive_release_failed", error=repr(exc))


def _wrong_last(exc: Exception) -> bool:
    """A compare-and-set refused: the key's revision is not the one named (nats-py raises
    KeyWrongLastSequenceError, or an APIError carrying the server's "wrong last sequence")."""
    from nats.js.errors import KeyWrongLastSequenceError

    return isinstance(exc, KeyWrongLastSequenceError) or "wrong last sequence" in str(exc).lower()


def _holder(value: bytes | None) -> str | None:
    try:
        doc = json.loads(value or b"")
    except (ValueError, TypeError):
        return None
    h = doc.get("holder") if isinstance(doc, dict) else None
    return h if isinstance(h, str) else None
