"""The live correlator on NATS: fleet/incidents.py's tracker fed from the streams, its records published.

``IncidentService`` replays the streams' recent history at start (so a replica that restarts, or one
that takes over, rebuilds the same state), follows them, and publishes each record on
``gna.incidents.<job token>`` and into the ``gna-incidents`` KV bucket (the current incident per
job, what views read). Replicas split the jobs: ``partitions`` replicas, each started with its own
``partition`` index, each judging only the jobs whose commId hashes to it (fleet/leases.py moves a
lost replica's share to a survivor).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from typing import Any

import structlog
from nats.js.api import KeyValueConfig

from agent import natsclient
from agent.config import NatsConfig
from agent.nats_link import StreamRefused, await_stream, open_kv, stream_configs
from agent.subjects import (
    EVENTS_PREFIX,
    INCIDENTS_PREFIX,
    JOBS_PREFIX,
    SIGNALS_PREFIX,
    STRAGGLERS_PREFIX,
    encode_token,
)
from fleet.follow import Follower
from fleet.incidents import INCIDENTS_BUCKET, JUDGE_SLICE_S, MAX_KEY, MEMBERSHIP, IncidentTracker
from fleet.leases import Leases, open_bucket
from fleet.stragglers import STRAGGLERS_BUCKET, StragglerWatch
from fleet.wire import Rejected, Rejections, decode_event, decode_job, decode_signals
from gna_sdk.aio import wait_event, within

log = structlog.get_logger(__name__)


class IncidentService:
    def __init__(self, servers: list[str], *, nats_cfg: NatsConfig | None = None, partitions: int = 1,
                 partition: int = 0, history_s: float = 6 * 3600.0, resolve_after: float = 600.0,
                 debounce: float = 0.05, lease_ttl: float = 15.0, straggler_interval: float = 10.0) -> None:
        self.servers = servers
        self.nats_cfg = nats_cfg or NatsConfig()
        self.tracker = IncidentTracker(partitions=partitions, partition=partition, resolve_after=resolve_after)
        # with several replicas, partitions are leased (fleet/leases.py): a lost replica's share is
        # taken over by a survivor within lease_ttl; 0 keeps the split static
        self.lease_ttl = lease_ttl if partitions > 1 else 0.0
        self.leases: Leases | None = None
        self.replays = 0
        # stragglers (fleet/stragglers.py): the straggler vectors and membership of the whole fleet, judged at
        # most every straggler_interval s; one replica publishes them (the holder of partition 0)
        self.stragglers = StragglerWatch()
        self.straggler_interval = straggler_interval
        self.stragglers_published = 0
        self._skv: Any = None
        self.history_s = history_s
        self.debounce = debounce
        self.rejections = Rejections()
        self.published = 0
        self.nc: Any = None
        self._kv: Any = None
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._following = False
        self.followers: list[Follower] = []
        self.watch = natsclient.watching()  # a follower that cannot resume ends the process (75)

    async def start(self) -> None:
        self.nc = await natsclient.connect(self.servers, cfg=self.nats_cfg, name="gpu-node-agent-correlator",
                                           inbox="correlator")
        js = self.nc.jetstream()
        loop = asyncio.get_running_loop()
        if self.lease_ttl:
            self.tracker.owned = set()
            kv = await open_bucket(js, ttl=self.lease_ttl, replicas=self.nats_cfg.stream_replicas)
            self.leases = Leases(kv, partitions=self.tracker.partitions, partition=self.tracker.partition,
                                 holder=f"{socket.gethostname()}:{os.getpid()}:{self.tracker.partition}",
                                 ttl=self.lease_ttl, on_gain=self._gain, on_loss=self._loss)
            with contextlib.suppress(Exception):  # NATS trouble: the lease loop retries
                await self.leases.tick()  # before the history replays: its jobs are kept as they arrive
            self._tasks.append(loop.create_task(self.leases.run(), name="incidents:leases"))
        # membership lives on the jobs stream, symptoms and hardware findings on the events stream (a job's
        # evidence copies on the jobs stream are not read: the same messages; IncidentTracker.add files a
        # message id once anyway)
        self._tasks += [loop.create_task(self._follow(js, MEMBERSHIP), name="incidents:jobs"),
                        loop.create_task(self._follow(js, f"{EVENTS_PREFIX}.>"), name="incidents:events"),
                        loop.create_task(self._follow(js, f"{SIGNALS_PREFIX}.>"), name="incidents:signals"),
                        loop.create_task(self._judge_loop(), name="incidents:judge"),
                        loop.create_task(self._straggler_loop(), name="incidents:stragglers")]
        self._following = True

    async def _gain(self, partition: int) -> None:
        self.tracker.owned.add(partition)
        if self._following:  # a lost replica's partition: its jobs' history was dropped here, replay it
            loop = asyncio.get_running_loop()
            js = self.nc.jetstream()
            for subject, stream in ((MEMBERSHIP, self.nats_cfg.jobs_stream),
                                    (f"{EVENTS_PREFIX}.>", self.nats_cfg.stream)):
                self._tasks.append(loop.create_task(self._replay(js, subject, stream),
                                                    name=f"incidents:replay:{partition}"))

    async def _loss(self, partition: int) -> None:
        self.tracker.lose(partition)

    async def _replay(self, js: Any, subject: str, stream: str) -> None:
        """The stream's history of the last ``history_s`` up to now, once (new messages reach the live
        followers; a message both deliver is filed once, by its id)."""
        try:
            last = (await js.stream_info(stream)).state.last_seq
            f = Follower(js, stream, subject, self.accept, since=time.time() - self.history_s, until=last,
                         name=f"replay:{stream}:{subject}", on_fail=self._give_up)
            self.followers.append(f)
            await f.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the follower gave up: the process is exiting (75)
            log.warning("replay_failed", stream=stream, error=repr(exc)[:300])
            return
        finally:
            self.followers = [x for x in self.followers if x.until is None or not x.done.is_set()]
        self.replays += 1
        self._wake.set()

    async def stop(self) -> None:
        if self.leases is not None and self.nc is not None:
            with contextlib.suppress(Exception):  # hand the partitions over at once, not after the TTL
                await within(self.leases.release_all(), 3.0)
        for t in self._tasks:
            t.cancel()
        await asyncio.wait(self._tasks, timeout=5.0) if self._tasks else None
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await within(self.nc.close(), 5.0)

    def accept(self, subject: str, data: bytes) -> None:
        """One message from the wire, live or replayed: filed, or counted with a sample. Nothing a
        message holds may raise out of here (a replay that dies on a poison message would kill every
        restart after it)."""
        try:
            if subject.startswith(SIGNALS_PREFIX + "."):
                self.stragglers.add(decode_signals(subject, data))
                return
            msg = decode_job(subject, data) if subject.startswith(JOBS_PREFIX + ".") else decode_event(subject, data)
            self.stragglers.add(msg)  # membership: which GPUs and NICs each job uses
            touched = self.tracker.add(msg)
        except Rejected as exc:
            self.rejections.record(exc.reason, subject, data, str(exc))
            return
        except Exception as exc:  # a bug a message found: counted and shown, the service goes on
            self.rejections.record(f"unhandled:{type(exc).__name__}", subject, data, repr(exc))
            log.exception("incidents_message_failed", subject=subject[:200])
            return
        if touched:
            self._dirty |= touched
            self._wake.set()

    async def _follow(self, js: Any, subject: str) -> None:
        """One stream, from ``history_s`` ago on, for as long as the service runs (fleet/follow.py:
        resumed by sequence after any server loss; exits 75 when it cannot be)."""
        cfg = self._stream_for(subject)
        while True:
            try:
                # verified first: a stream carrying a republish, mirror or sources is never read
                await await_stream(js, cfg)
                break
            except asyncio.CancelledError:
                raise
            except StreamRefused as exc:
                log.error("incidents_stream_refused", subject=subject, error=str(exc))
                await asyncio.sleep(30)
            except Exception as exc:  # NATS trouble: try again
                log.info("incidents_waiting_for_stream", error=repr(exc))
                await asyncio.sleep(1)
        f = Follower(js, cfg.name, subject, self.accept, since=time.time() - self.history_s,
                     name=f"incidents:{cfg.name}", on_fail=self._give_up)
        self.followers.append(f)
        await f.run()

    def _give_up(self, reason: str) -> None:
        log.error("incidents_follower_failed", reason=reason)
        self.watch.fail(f"the correlator cannot follow its streams: {reason}")

    def _stream_for(self, subject: str) -> Any:
        events, jobs, signals = stream_configs(self.nats_cfg)
        return jobs if subject.startswith(JOBS_PREFIX) else signals if subject.startswith(SIGNALS_PREFIX) else events

    async def _judge_loop(self) -> None:
        last_sweep = time.monotonic()
        while True:
            nxt = self.tracker.next_due()
            wait = 5.0 if nxt is None else min(5.0, max(0.0, nxt - time.time()))
            await wait_event(self._wake, wait)  # not wait_for: on 3.11 it can swallow the stop's cancellation
            self._wake.clear()
            await asyncio.sleep(self.debounce)  # a burst of 1,000 timeouts is judged once, not 1,000 times
            dirty, self._dirty = self._dirty | self.tracker.due(), set()
            # one job at a time, yielding between them: a round over many jobs never holds the loop
            # (the cordoner's and the followers' callbacks run in between)
            slice_start = time.monotonic()
            for job in sorted(dirty):
                try:
                    rec = self.tracker.judge_one(job, time.time())
                except Exception as exc:  # a job whose evidence trips a bug: counted, the others go on
                    self.rejections.record(f"judge:{type(exc).__name__}", f"job {job[:200]}", b"", repr(exc))
                    log.exception("incidents_judge_failed", job=job[:200])
                    continue
                if rec is not None:
                    await self._publish(rec)
                if time.monotonic() - slice_start > JUDGE_SLICE_S:
                    await asyncio.sleep(0)
                    slice_start = time.monotonic()
            if time.monotonic() - last_sweep > 30:
                for rec in self.tracker.sweep():
                    await self._publish(rec)
                last_sweep = time.monotonic()

    async def _straggler_loop(self) -> None:
        while True:
            await asyncio.sleep(self.straggler_interval)
            if not self.stragglers.changed or 0 not in self.tracker.owned:
                continue
            for rec in await self.stragglers.evaluate_async(time.time()):  # yields every 2 ms of work
                await self._publish_straggler(rec)

    async def _publish_straggler(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, separators=(",", ":")).encode()
        node = encode_token(record["node"])
        try:
            if self._skv is None:
                js = self.nc.jetstream()
                self._skv = await open_kv(js, STRAGGLERS_BUCKET, create_with=KeyValueConfig(
                    bucket=STRAGGLERS_BUCKET, history=5, replicas=self.nats_cfg.stream_replicas))
            key = f"{node}.{encode_token(record['entity'])}"
            if len(key) > 2 * MAX_KEY + 1:  # a node token and an entity token, each bounded by fleet/wire.py
                self.rejections.record("key_too_long", f"straggler {key[:200]}", data[:200])
                return
            await self._skv.put(key, data)
            await self.nc.publish(f"{STRAGGLERS_PREFIX}.{node}", data)
            self.stragglers_published += 1
            log.info("straggler", node=record["node"], entity=record["entity"], status=record["status"],
                     signals=[s["signal"] for s in record.get("signals", [])], confidence=record.get("confidence"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS away: the state is kept; a later change publishes again
            log.warning("straggler_publish_failed", node=record["node"], error=repr(exc))

    async def _publish(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, separators=(",", ":")).encode()
        token = encode_token(record["job"])
        if len(token) > MAX_KEY:  # fleet/wire.py bounds job ids well below this: never a key the server refuses
            self.rejections.record("key_too_long", f"job {record['job'][:200]}", data[:200])
            return
        try:
            if self._kv is None:
                js = self.nc.jetstream()
                self._kv = await open_kv(js, INCIDENTS_BUCKET, create_with=KeyValueConfig(
                    bucket=INCIDENTS_BUCKET, history=5, replicas=self.nats_cfg.stream_replicas))
            await self._kv.put(token, data)  # first: whoever hears the subject finds the KV current
            await self.nc.publish(f"{INCIDENTS_PREFIX}.{token}", data)
            self.published += 1
            c = record.get("culprit")
            log.info("incident", job=record["job"], status=record["status"], culprit=c,
                     victims=len(record.get("victims", [])), confidence=record.get("confidence"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS away: the next change re-publishes; views read the KV when it is back
            log.warning("incident_publish_failed", job=record["job"], error=repr(exc))
