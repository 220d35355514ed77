"""The live correlator: the fleet's event stream in, incidents out, as evidence arrives.

``IncidentTracker`` is the state (no I/O): every decoded message is filed under its job (NCCL
messages name it) or its node (hardware findings), and a job touched by a new message is judged
again by fleet/correlator.py. A verdict that changed is an incident record to publish; a job quiet
for ``resolve_after`` seconds (it ended, or recovered) resolves its incident.

``IncidentService`` runs it on NATS: it replays the stream's recent history at start (so a replica
that restarts, or one that takes over, rebuilds the same state), follows it, and publishes each
record on ``gna.incidents.<job token>`` and into the ``gna-incidents`` KV bucket (the current
incident per job, what views read). Replicas split the jobs: ``partitions`` replicas, each started
with its own ``partition`` index, each judging only the jobs whose commId hashes to it; all of them
read every message (a job's hardware evidence arrives from nodes that do not name the job).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog

from agent import natsclient
from agent.config import NatsConfig
from agent.remediation.incidents import INCIDENTS_BUCKET as INCIDENTS_BUCKET  # re-exported: the correlator writes it
from agent.subjects import EVENTS_PREFIX, INCIDENTS_PREFIX, JOBS_PREFIX, SIGNALS_PREFIX, STRAGGLERS_PREFIX, encode_token
from fleet.correlator import correlate
from fleet.leases import LEASES_BUCKET, Leases
from fleet.stragglers import STRAGGLERS_BUCKET, StragglerWatch
from fleet.wire import Rejected, Rejections, decode_event, decode_job, decode_signals
from gna_sdk.aio import wait_event, within

log = structlog.get_logger(__name__)

# the jobs stream's membership facts only: its evidence copies are the events stream's messages again
MEMBERSHIP = f"{JOBS_PREFIX}.*.*.member"
SYMPTOMS = ("NCCLCollectiveTimeout", "NCCLIBCompletionError", "NCCLSocketFallback", "NCCLWatchdogProgress",
            "NCCLRASReport", "TorchFlightRecord")


def owner(job: str, partitions: int) -> int:
    """The partition that judges ``job``: stable across replicas and restarts."""
    return zlib.crc32(job.encode()) % max(1, partitions)


@dataclass
class _Job:
    messages: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=4096))
    ids: set[str] = field(default_factory=set)  # a job's evidence arrives on two streams: filed once
    nodes: set[str] = field(default_factory=set)
    last_seen: float = 0.0
    last_symptom: float = 0.0  # when the last timeout/completion error/fallback was received
    published: dict[str, Any] | None = None  # the last record sent


class IncidentTracker:
    def __init__(self, *, partitions: int = 1, partition: int = 0, resolve_after: float = 600.0,
                 max_jobs: int = 10000, settle: float = 1.0) -> None:
        if not 0 <= partition < partitions:
            raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
        self.partitions, self.partition = partitions, partition
        self.owned: set[int] = {partition}  # with leases (fleet.leases), what this replica holds now
        self.resolve_after = resolve_after
        self.max_jobs = max_jobs
        self.jobs: dict[str, _Job] = {}
        self.hardware: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # node -> (type, entity) -> msg
        self.node_jobs: dict[str, set[str]] = {}
        self.dropped_jobs = 0
        # A hung rank is the one that did NOT time out: while timeouts still arrive, the last ranks to
        # report would look silent. Such a verdict (and "no culprit yet") waits until no symptom
        # arrived for ``settle`` s (watchdogs with one timeout fire within a second of each other);
        # a hardware fault on a resource the job used is published at once.
        self.settle = settle
        self.pending: dict[str, float] = {}  # job -> when to judge it again

    def owns(self, job: str) -> bool:
        return owner(job, self.partitions) in self.owned

    def lose(self, partition: int) -> None:
        """Stop judging a partition (its lease went to another replica): forget its jobs, publish nothing."""
        self.owned.discard(partition)
        for job in [job for job in self.jobs if owner(job, self.partitions) == partition]:
            for n in self.jobs[job].nodes:
                self.node_jobs.get(n, set()).discard(job)
            del self.jobs[job]
            self.pending.pop(job, None)

    def add(self, msg: dict[str, Any], now: float | None = None) -> set[str]:
        """File one decoded message; the jobs (of this partition) to judge again."""
        now = time.time() if now is None else now
        node = msg.get("node")
        if not isinstance(node, str):
            return set()
        raw = msg.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        job = details.get("job") if msg.get("collector") == "nccl_logs" else None
        if isinstance(job, str) and job:
            if not self.owns(job):
                # still remember where the job runs: its nodes' hardware findings matter only to it
                return set()
            j = self.jobs.get(job)
            if j is None:
                if len(self.jobs) >= self.max_jobs:
                    self._forget_oldest()
                j = self.jobs[job] = _Job()
            mid = msg.get("id")
            if isinstance(mid, str):
                if mid in j.ids:
                    return set()
                if len(j.ids) >= 3 * (j.messages.maxlen or 4096):
                    j.ids = {str(m.get("id")) for m in j.messages}  # forget the ids that left the window
                j.ids.add(mid)
            j.messages.append(msg)
            j.nodes.add(node)
            j.last_seen = now
            if msg.get("type") in SYMPTOMS:
                j.last_symptom = now
            self.node_jobs.setdefault(node, set()).add(job)
            return {job}
        entity = str(msg.get("entity", ""))
        if entity.startswith(("gpu:", "ib:")) and msg.get("collector") != "nccl_logs":
            held = self.hardware.setdefault(node, {})
            key = (str(msg.get("type")), entity)
            if msg.get("status") == "resolved":
                held.pop(key, None)
            elif msg.get("severity") == "critical":
                if key not in held and len(held) >= 256:
                    return set()  # a node flooding findings: the first 256 are evidence enough
                held[key] = msg
            else:
                return set()
            touched = self.node_jobs.get(node, set())
            for job in touched:
                self.jobs[job].last_seen = max(self.jobs[job].last_seen, now)
            return set(touched)
        return set()

    def _forget_oldest(self) -> None:
        job = min(self.jobs, key=lambda k: self.jobs[k].last_seen)
        for n in self.jobs.pop(job).nodes:
            self.node_jobs.get(n, set()).discard(job)
        self.dropped_jobs += 1

    def judge(self, jobs: set[str], now: float | None = None) -> list[dict[str, Any]]:
        """Incident records whose verdict changed, for these jobs."""
        now = time.time() if now is None else now
        out = []
        for job in sorted(jobs):
            j = self.jobs.get(job)
            if j is None:
                continue
            msgs = list(j.messages) + [m for n in j.nodes for m in self.hardware.get(n, {}).values()]
            found = [inc for inc in correlate(msgs) if inc.job == job]
            # verdicts from symptoms alone wait for the symptoms to settle: other ranks' timeouts may follow,
            # and a hardware finding (on the events stream) may trail the evidence (on the jobs stream)
            unsettled = found and (found[0].culprit is None or found[0].culprit["kind"] in ("rank", "link"))
            if unsettled and now - j.last_symptom < self.settle:
                self.pending[job] = j.last_symptom + self.settle  # not yet: other ranks' timeouts may follow
                continue
            self.pending.pop(job, None)
            record = None
            if found:
                record = {"status": "open", **found[0].to_dict()}
            elif j.published and j.published["status"] == "open":
                record = {**j.published, "status": "resolved", "reason": "no symptom or fault left"}
            if record is not None and _verdict(record) != _verdict(j.published):
                record["updated"] = now
                j.published = record
                out.append(record)
        return out

    def due(self, now: float | None = None) -> set[str]:
        """Jobs whose settling time is over."""
        now = time.time() if now is None else now
        return {job for job, t in self.pending.items() if t <= now}

    def next_due(self) -> float | None:
        return min(self.pending.values(), default=None)

    def sweep(self, now: float | None = None) -> list[dict[str, Any]]:
        """Jobs quiet for resolve_after: their open incident resolves, their state is forgotten."""
        now = time.time() if now is None else now
        out = []
        for job, j in list(self.jobs.items()):
            if now - j.last_seen < self.resolve_after:
                continue
            if j.published and j.published["status"] == "open":
                out.append({**j.published, "status": "resolved", "updated": now,
                            "reason": f"the job has been quiet for {self.resolve_after:g} s (ended or recovered)"})
            for n in j.nodes:
                self.node_jobs.get(n, set()).discard(job)
            del self.jobs[job]
        return out


def _verdict(record: dict[str, Any] | None) -> Any:
    if record is None:
        return None
    return (record["status"], json.dumps(record.get("culprit"), sort_keys=True), tuple(record.get("victims", ())),
            record.get("evidence_total"))


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

    async def start(self) -> None:
        self.nc = await natsclient.connect(self.servers, cfg=self.nats_cfg, name="gpu-node-agent-correlator",
                                           inbox="correlator")
        js = self.nc.jetstream()
        loop = asyncio.get_running_loop()
        if self.lease_ttl:
            self.tracker.owned = set()
            try:
                kv = await js.key_value(LEASES_BUCKET)
            except Exception:
                kv = await js.create_key_value(bucket=LEASES_BUCKET, history=1, ttl=self.lease_ttl,
                                               replicas=self.nats_cfg.stream_replicas)
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
        """The stream's history up to now, once (new messages reach the live consumers)."""
        import datetime as dt

        from nats.js.api import DeliverPolicy

        from fleet.state import start_time_config

        try:
            last = (await js.stream_info(stream)).state.last_seq
        except Exception as exc:
            log.warning("replay_failed", stream=stream, error=repr(exc))
            return
        done = asyncio.Event()
        seen = [time.monotonic()]

        async def on_msg(m: Any) -> None:
            self.accept(m.subject, m.data)
            seen[0] = time.monotonic()
            if m.metadata.sequence.stream >= last:
                done.set()

        since = dt.datetime.fromtimestamp(time.time() - self.history_s, dt.UTC)
        sub = await js.subscribe(subject, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.BY_START_TIME,
                                 config=start_time_config(since))
        try:
            while not done.is_set() and time.monotonic() - seen[0] < 5.0:  # nothing in the window: stop
                await wait_event(done, 0.5)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
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
        try:
            if subject.startswith(SIGNALS_PREFIX + "."):
                self.stragglers.add(decode_signals(subject, data))
                return
            msg = decode_job(subject, data) if subject.startswith(JOBS_PREFIX + ".") else decode_event(subject, data)
        except Rejected as exc:
            self.rejections.record(exc.reason, subject, data, str(exc))
            return
        self.stragglers.add(msg)  # membership: which GPUs and NICs each job uses
        touched = self.tracker.add(msg)
        if touched:
            self._dirty |= touched
            self._wake.set()

    async def _follow(self, js: Any, subject: str) -> None:
        import datetime as dt

        from nats.js.api import DeliverPolicy

        from fleet.state import start_time_config

        since = dt.datetime.fromtimestamp(time.time() - self.history_s, dt.UTC)

        async def on_msg(m: Any) -> None:
            self.accept(m.subject, m.data)

        while True:
            try:
                await js.subscribe(subject, cb=on_msg, ordered_consumer=True,
                                   deliver_policy=DeliverPolicy.BY_START_TIME,
                                   config=start_time_config(since))
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the stream does not exist until the first agent creates it
                log.info("incidents_waiting_for_stream", error=repr(exc))
                await asyncio.sleep(1)

    async def _judge_loop(self) -> None:
        last_sweep = time.monotonic()
        while True:
            nxt = self.tracker.next_due()
            wait = 5.0 if nxt is None else min(5.0, max(0.0, nxt - time.time()))
            await wait_event(self._wake, wait)  # not wait_for: on 3.11 it can swallow the stop's cancellation
            self._wake.clear()
            await asyncio.sleep(self.debounce)  # a burst of 1,000 timeouts is judged once, not 1,000 times
            dirty, self._dirty = self._dirty | self.tracker.due(), set()
            records = self.tracker.judge(dirty)
            if time.monotonic() - last_sweep > 30:
                records += self.tracker.sweep()
                last_sweep = time.monotonic()
            for rec in records:
                await self._publish(rec)

    async def _straggler_loop(self) -> None:
        while True:
            await asyncio.sleep(self.straggler_interval)
            if not self.stragglers.changed or 0 not in self.tracker.owned:
                continue
            for rec in self.stragglers.evaluate(time.time()):
                await self._publish_straggler(rec)

    async def _publish_straggler(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, separators=(",", ":")).encode()
        node = encode_token(record["node"])
        try:
            if self._skv is None:
                js = self.nc.jetstream()
                try:
                    self._skv = await js.key_value(STRAGGLERS_BUCKET)
                except Exception:
                    self._skv = await js.create_key_value(bucket=STRAGGLERS_BUCKET, history=5,
                                                          replicas=self.nats_cfg.stream_replicas)
            await self._skv.put(f"{node}.{encode_token(record['entity'])}", data)
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
        try:
            if self._kv is None:
                js = self.nc.jetstream()
                try:
                    self._kv = await js.key_value(INCIDENTS_BUCKET)
                except Exception:
                    self._kv = await js.create_key_value(bucket=INCIDENTS_BUCKET, history=5,
                                                         replicas=self.nats_cfg.stream_replicas)
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
