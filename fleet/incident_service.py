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
import math
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

import structlog
from nats.js.api import KeyValueConfig

from agent import natsclient
from agent.config import NatsConfig
from agent.metrics import MetricsServer
from agent.nats_link import StreamRefused, await_stream, open_kv, stream_configs
from fleet.follow import Follower
from fleet.heap import HeapTender
from fleet.incidents import (
    INCIDENTS_BUCKET,
    JUDGE_SLICE_S,
    MAX_KEY,
    IncidentTracker,
    owner,
    partition_buckets,
    same_version,
)
from fleet.leases import DEFAULT_TTL, Leases, open_bucket
from fleet.metrics import CorrelatorMetrics, serve_metrics
from fleet.stragglers import STRAGGLERS_BUCKET, StragglerWatch
from fleet.wire import Rejected, Rejections, decode_event, decode_job, decode_signals
from gna_sdk.aio import wait_event, within
from gna_types.subjects import (
    EVENTS_PREFIX,
    INCIDENTS_PREFIX,
    JOB_BUCKETS,
    JOB_KINDS,
    JOBS_PREFIX,
    SIGNALS_PREFIX,
    STRAGGLERS_PREFIX,
    decode_token,
    encode_token,
    job_bucket_filters,
)

log = structlog.get_logger(__name__)

CATCH_UP_MAX_S = 120.0  # s: judging starts then even if a follower has not caught up (logged)
# s two streams' leaders' clocks may disagree (servers kept by NTP agree within milliseconds): the findings
# follower is current for the evidence filed once it handed on what was stored this long after it
STREAM_SKEW_S = 0.25
LAG_HOLD_MAX_S = 5.0  # s verdicts wait for a hardware findings' follower that shows no life (``_findings_cover``)
# s verdicts wait for one that is recovering (reading, resubscribing, retrying): measured on 2 busy cores, an
# R3 events consumer whose server was SIGKILLed handed on again 6 s after the hold began (CI, stop 34)
LAG_HOLD_LIMIT_S = 15.0
STATS_INTERVAL_S = 30.0  # s between `correlator_stats` lines
STALL_PROBE_S = 0.05  # s between the loop-stall probe's wake-ups
WRITE_TIMEOUT_S = 10.0  # s one incident write may take before it is retried
# s one request of a write (create, get, compare-and-set) waits for its answer. A request sent while its stream
# elects a leader (4-9 s after a leader's death: nats-server server/raft.go minElectionTimeoutDefault..
# maxElectionTimeoutDefault, v2.15) is answered by nobody, and one the new leader would store arrives only after
# it: nats-py's 5 s default, then a backoff that doubled to 5 s, left a verdict unwritten for up to 10 s after
# the election ended. Short attempts, retried at most a second apart, write it within ~3 s of the election.
WRITE_ATTEMPT_S = 2.0
# s a follower's request (consumer create or info, stream info, message get) waits: the same election, seen from
# the reading side -- a consumer asked for while the stream elects is created by nobody, and the follower asks
# again only when the 5 s default gave up (traced: a taken-over partition read 5 s after its stream's election)
FOLLOW_REQUEST_S = 2.0
PUBLISH_BACKOFF_MAX_S = 1.0
KNOWN_MAX = 65536  # jobs whose incident key is known to exist (past it forgotten: their next write reads first)


class IncidentService:
    def __init__(self, servers: list[str], *, nats_cfg: NatsConfig | None = None, partitions: int = 1,
                 partition: int = 0, history_s: float = 6 * 3600.0, resolve_after: float = 600.0,
                 debounce: float = 0.05, lease_ttl: float = DEFAULT_TTL, straggler_interval: float = 10.0,
                 stats_interval: float = STATS_INTERVAL_S, metrics_listen: str = "",
                 freeze_heap: bool = False) -> None:
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
        self._known: set[str] = set()  # jobs whose incident key this process wrote or found (KNOWN_MAX at most)
        # jobs whose last write went unanswered: it may have been stored, so a retry that finds its version in the
        # KV announces it still (nobody else did)
        self._unsure: set[str] = set()
        self._reading_since: dict[int, float] = {}  # partition -> when its history began to be read (monotonic)
        self.kv_reads = 0
        # jobs to judge -> the count of filed messages when one last touched the job (``_filed``): what the
        # hardware findings read must cover before it is judged (``_findings_cover``)
        self._dirty: dict[str, int] = {}
        self._filed = 0  # messages that touched a job, since start
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._following = False
        self.followers: list[Follower] = []
        # a follower that cannot resume ends the process (75): the starting task's watch, taken in
        # start() -- never here, where a synchronous caller would set it in its thread's root context
        self.watch: natsclient.ConnectionWatch | None = None
        # judging waits until the live followers handed on what the streams held at start (a verdict
        # from half the history would be published, then corrected: two records for one incident)
        self._judging = False
        self._started = time.monotonic()
        self._replaying: dict[int, int] = {}  # partition -> replays in flight (its jobs are not judged yet)
        self._readers: dict[int, list[asyncio.Task[Any]]] = {}  # partition -> the tasks reading its jobs
        self._deferred: set[str] = set()
        # publishing (issue 21): the newest record per job waits here until the KV and the subject have it
        self._outbox: dict[str, dict[str, Any]] = {}
        self._outbox_wake = asyncio.Event()
        self.publish_retries = 0
        self.replay_retries = 0
        self.publish_same = 0  # records the KV already held (another replica, or ours before a restart)
        self.superseded = 0  # records replaced by a newer one of the same job before they were written
        self.findings_waits = 0  # judge rounds held until the hardware findings were read (``_findings_cover``)
        self._findings_behind_since: float | None = None
        self._findings_mark: int | None = None  # the events stream sequence the verdicts wait for
        self._findings_mark_filed = 0  # ``_filed`` when that mark was asked for: the evidence it covers
        self._findings_life: tuple[int, ...] = ()  # the follower's counters when it last showed life
        self._findings_alive_at = 0.0
        self.accepted = 0
        self.skipped = 0  # messages read off their subject as another replica's (or a copy) and not decoded
        self.stats_interval = stats_interval
        self.loop_stall_max_ms = 0.0  # the longest the event loop was held, since start
        # of it, at most this much was the process's own work (its thread's CPU time over the late interval):
        # the rest was the thread waiting for a core (on a machine shared with publishers and a server)
        self.loop_stall_cpu_max_ms = 0.0
        # CPython's cyclic collections, timed (gc.callbacks), and with ``freeze_heap`` (the CLI's service) the
        # long-lived state kept out of full collections (fleet/heap.py): a full pass over a 144k-rank fleet's
        # state held the loop ~100 ms. Off by default: freezing is process-wide (tests run services in-process).
        self.heap = HeapTender()
        self.freeze_heap = freeze_heap
        # /metrics (fleet/metrics.py): read from the state above at scrape time; "" serves none
        self.published_by_status: dict[str, int] = {}
        self.handed_retired: dict[str, int] = {}  # stream -> messages handed on by followers since removed
        self.metrics = CorrelatorMetrics()
        self.metrics.attach(self)
        self.metrics_listen = metrics_listen
        self.metrics_server: MetricsServer | None = None

    def _health(self) -> tuple[bool, str]:
        ok = self.nc is not None and bool(self.nc.is_connected)
        return ok, "ok" if ok else "not connected to NATS"

    def _retire(self, f: Follower) -> None:
        """A follower leaves: what it handed on stays counted (gna_correlator_messages_total)."""
        if f in self.followers:
            self.followers = [x for x in self.followers if x is not f]
            self.handed_retired[f.stream] = self.handed_retired.get(f.stream, 0) + f.handed

    async def start(self) -> None:
        if self.metrics_listen and self.metrics_server is None:  # first: a port in use fails at once (ListenError)
            self.metrics_server = await serve_metrics(self.metrics, self.metrics_listen, self._health)
        self.heap.install(freeze=self.freeze_heap)
        self.watch = natsclient.watching()
        self.nc = await natsclient.connect(self.servers, cfg=self.nats_cfg, name="gpu-node-agent-correlator",
                                           inbox="correlator")
        js = self.nc.jetstream(timeout=FOLLOW_REQUEST_S)
        loop = asyncio.get_running_loop()
        if self.lease_ttl:
            self.tracker.owned = set()
            # each lease request answered within a tick or given up (an election must not hold a tick 5 s)
            kv = await open_bucket(self.nc.jetstream(timeout=min(5.0, max(0.5, self.lease_ttl / 3))),
                                   ttl=self.lease_ttl, replicas=self.nats_cfg.stream_replicas)
            self.leases = Leases(kv, partitions=self.tracker.partitions, partition=self.tracker.partition,
                                 holder=f"{socket.gethostname()}:{os.getpid()}:{self.tracker.partition}",
                                 ttl=self.lease_ttl, on_gain=self._gain, on_loss=self._loss, nc=self.nc)
            with contextlib.suppress(Exception):  # NATS trouble: the lease loop retries
                await self.leases.tick()  # before the history replays: its jobs are kept as they arrive
            self._tasks.append(loop.create_task(self.leases.run(), name="incidents:leases"))
        # the nodes' hardware findings on the events stream, read by every replica (any job may have used the
        # device); a job's membership and NCCL evidence on the jobs stream, read per partition (``_gain``)
        self._tasks += [loop.create_task(self._follow(js, f"{EVENTS_PREFIX}.>"), name="incidents:events"),
                        loop.create_task(self._follow(js, f"{SIGNALS_PREFIX}.>"), name="incidents:signals"),
                        loop.create_task(self._judge_loop(), name="incidents:judge"),
                        loop.create_task(self._publish_loop(), name="incidents:publish"),
                        loop.create_task(self._stats_loop(), name="incidents:stats"),
                        loop.create_task(self._straggler_loop(), name="incidents:stragglers")]
        self._following = True
        for partition in sorted(self.tracker.owned):  # static split, or leases taken before following began
            self._read_partition(partition, taken_over=False)

    async def _gain(self, partition: int) -> None:
        self.tracker.owned.add(partition)
        if self._following:
            self._read_partition(partition, taken_over=True)

    def _read_partition(self, partition: int, *, taken_over: bool) -> None:
        """Partitions split reading at the server (issue 21): the partition's jobs are read from the jobs
        stream by their buckets only (gna_types/subjects.py JOBS_TRANSFORM), from ``history_s`` ago on, and
        judged once that history is in. Partition 0 brings the straggler watch: every job's membership
        (which GPUs and NICs each job uses) and the vectors."""
        if partition in self._readers:
            return
        loop = asyncio.get_running_loop()
        js = self.nc.jetstream(timeout=FOLLOW_REQUEST_S)
        # Two consumers a partition: its jobs' membership (bulk: a fleet start stores ~145,000 records at once)
        # and their NCCL evidence (few, urgent). One consumer reads the stream in order, so a job's symptoms
        # waited behind every membership record stored before them: traced in a 500-job fleet start, a
        # gpu_fell_off job's symptoms were filed 1.7 s after its finding though published before it, and the
        # verdict followed them by 65 ms. A job's evidence read before its membership is judged again when the
        # membership arrives (every message touches its job); the partition is judged once both caught up.
        buckets = partition_buckets(partition, self.tracker.partitions)
        self._reading_since[partition] = time.monotonic()
        readers = [Follower(js, self.nats_cfg.jobs_stream, f"{JOBS_PREFIX}.>", self.accept,
                            filters=job_bucket_filters(buckets, kind), since=time.time() - self.history_s,
                            name=f"incidents:jobs:{partition}:{kind}", on_fail=self._give_up)
                   for kind in JOB_KINDS]
        self._replaying[partition] = len(readers)
        tasks = [loop.create_task(self._run_reader(partition, f), name=f.name) for f in readers]
        if partition == 0 and self.tracker.partitions > 1:  # (one partition: its reader has every job)
            others = [b for b in range(JOB_BUCKETS) if b not in set(partition_buckets(0, self.tracker.partitions))]
            m = Follower(js, self.nats_cfg.jobs_stream, f"{JOBS_PREFIX}.>", self.accept_membership,
                         filters=job_bucket_filters(others, "member"), since=time.time() - self.history_s,
                         name="stragglers:membership", on_fail=self._give_up)
            tasks.append(loop.create_task(self._run_reader(None, m), name="stragglers:membership"))
            if taken_over:  # the live follower skipped the vectors until now: their recent history
                tasks.append(loop.create_task(
                    self._replay(js, f"{SIGNALS_PREFIX}.>", self.nats_cfg.signals_stream, partition),
                    name="incidents:replay:signals"))
        self._readers[partition] = tasks
        self._tasks += tasks

    async def _run_reader(self, partition: int | None, f: Follower) -> None:
        """One reader of the jobs stream until its partition is lost; a partition's jobs are judged from the
        moment its history is in (the follower caught up)."""
        loop = asyncio.get_running_loop()
        await self._verified(f.js, self._stream_for(f.subject), f.subject)
        self.followers.append(f)
        runner = loop.create_task(f.run(), name=f.name)
        try:
            if partition is not None:
                waiter = loop.create_task(f.caught_up.wait())
                try:
                    await asyncio.wait([runner, waiter], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if f.caught_up.is_set():
                    self.replays += 1
                    self._replay_done(partition)
            await runner
        finally:
            runner.cancel()
            self._retire(f)

    async def _loss(self, partition: int) -> None:
        self.tracker.lose(partition)
        self._replaying.pop(partition, None)
        for t in self._readers.pop(partition, []):
            t.cancel()
        if partition == 0:  # another replica judges the stragglers now: their state is its
            self.stragglers = StragglerWatch()

    async def _replay(self, js: Any, subject: str, stream: str, partition: int) -> None:
        """The straggler vectors' history of the last ``history_s`` up to now, once, for a replica that took
        partition 0 over (new vectors reach the live follower). Retried while the partition is held."""
        complete = False
        tries = 0
        try:
            while partition in self.tracker.owned and not complete:
                try:
                    last = (await js.stream_info(stream)).state.last_seq
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # an election, NATS away: again
                    self.replay_retries += 1
                    tries += 1
                    log.info("replay_retry", stream=stream, partition=partition, error=repr(exc)[:300])
                    await asyncio.sleep(min(5.0, 0.25 * 2 ** min(tries, 5)))
                    continue
                f = Follower(js, stream, subject, self.accept, since=time.time() - self.history_s, until=last,
                             name=f"replay:{stream}:{subject}", on_fail=self._give_up)
                self.followers.append(f)
                try:
                    await f.run()  # retries inside; after FAIL_S it ends the process (75) and raises
                finally:
                    self._retire(f)
                complete = f.done.is_set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the follower gave up: the process is exiting (75)
            log.warning("replay_failed", stream=stream, error=repr(exc)[:300])

    def _replay_done(self, partition: int) -> None:
        left = self._replaying.get(partition, 1) - 1
        if left > 0:
            self._replaying[partition] = left
            return
        self._replaying.pop(partition, None)
        mine = {j for j in self._deferred if owner(j, self.tracker.partitions) == partition}
        self._deferred -= mine
        if partition in self.tracker.owned:  # the partition's history is in: judged from here on
            self._touch(mine)
            began = self._reading_since.pop(partition, None)
            log.info("partition_ready", partition=partition, jobs=len(mine),
                     after_s=None if began is None else round(time.monotonic() - began, 2))

    async def stop(self) -> None:
        self.heap.remove()
        if self.leases is not None and self.nc is not None:
            with contextlib.suppress(Exception):  # hand the partitions over at once, not after the TTL
                await within(self.leases.release_all(), 3.0)
        for t in self._tasks:
            t.cancel()
        await asyncio.wait(self._tasks, timeout=5.0) if self._tasks else None
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await within(self.nc.close(), 5.0)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            self.metrics_server = None

    def accept(self, subject: str, data: bytes) -> None:
        """One message from the wire, live or replayed: filed, skipped unread (not this replica's, or
        a copy of one read elsewhere), or counted with a sample. Nothing a message holds may raise out
        of here (a replay that dies on a poison message would kill every restart after it).

        Partitions split reading (issue 21): a replica's consumers of the jobs stream ask the server
        only for its partitions' buckets (``_read_partition``), so a job's membership and NCCL evidence
        reach the one replica that judges it; what arrives here of another partition (a lease just
        lost) is skipped undecoded. The events stream is read for the nodes' hardware findings (any
        job may have used the device): its NCCL messages are the jobs stream's evidence again and are
        skipped by their subject, undecoded. Straggler vectors only on partition 0."""
        route = self._route(subject)
        if route is None:
            self.skipped += 1
            return
        try:
            if route == "signals":
                self.stragglers.add(decode_signals(subject, data))
                self.accepted += 1
                return
            # typed: the details the boundary decoded kept for the correlator's decisions (fleet/typed_details.py)
            msg = (decode_job(subject, data, typed=True) if route == "job"
                   else decode_event(subject, data, typed=True))
            if route == "job" and 0 in self.tracker.owned and subject.endswith(".member"):
                self.stragglers.add(msg)  # the straggler watch's own jobs' membership (others: accept_membership)
            touched = self.tracker.add(msg)
        except Rejected as exc:
            self.rejections.record(exc.reason, subject, data, str(exc))
            return
        except Exception as exc:  # a bug a message found: counted and shown, the service goes on
            self.rejections.record(f"unhandled:{type(exc).__name__}", subject, data, repr(exc))
            log.exception("incidents_message_failed", subject=subject[:200])
            return
        self.accepted += 1
        if touched:
            self._touch(touched)

    def _touch(self, jobs: Iterable[str]) -> None:
        self._filed += 1
        for job in jobs:
            self._dirty[job] = self._filed
        self._wake.set()

    def accept_membership(self, subject: str, data: bytes) -> None:
        """Every job's membership, for the straggler watch (partition 0's holder): which GPUs and NICs each
        job uses. Never filed for judging, and this replica's own jobs are skipped: their partition's reader
        files them and feeds the watch (``accept``)."""
        if 0 not in self.tracker.owned or self._owned_job(subject):
            self.skipped += 1
            return
        try:
            self.stragglers.add(decode_job(subject, data, typed=True))  # the boundary's Struct kept: read once
        except Rejected as exc:
            self.rejections.record(exc.reason, subject, data, str(exc))
            return
        except Exception as exc:
            self.rejections.record(f"unhandled:{type(exc).__name__}", subject, data, repr(exc))
            log.exception("incidents_message_failed", subject=subject[:200])
            return
        self.accepted += 1

    def _owned_job(self, subject: str) -> bool:
        try:
            return self.tracker.owns(decode_token(subject.split(".")[-3]))
        except (ValueError, UnicodeDecodeError, IndexError):
            return False

    def _route(self, subject: str) -> str | None:
        """"job", "event" or "signals" from the subject alone; None: skip it undecoded. What this cannot
        place is decoded (and refused there, counted)."""
        if subject.startswith(JOBS_PREFIX + "."):
            parts = subject.split(".")
            if len(parts) in (5, 6):  # gna.jobs.[<bucket>.]<job>.<node>.<kind>
                try:
                    job = decode_token(parts[-3])
                except (ValueError, UnicodeDecodeError):
                    return "job"
                if not self.tracker.owns(job):
                    return None
            return "job"
        if subject.startswith(SIGNALS_PREFIX + "."):
            return "signals" if 0 in self.tracker.owned else None
        if subject.startswith(EVENTS_PREFIX + ".") and subject.count(".") == 4 and ".nccl_logs." in subject:
            return None  # a job's NCCL messages: read as the job's evidence, by the job's partition
        return "event"

    async def _follow(self, js: Any, subject: str) -> None:
        """One stream, from ``history_s`` ago on, for as long as the service runs (fleet/follow.py:
        resumed by sequence after any server loss; exits 75 when it cannot be)."""
        cfg = self._stream_for(subject)
        await self._verified(js, cfg, subject)
        f = Follower(js, cfg.name, subject, self.accept, since=time.time() - self.history_s,
                     name=f"incidents:{cfg.name}", on_fail=self._give_up)
        self.followers.append(f)
        await f.run()

    async def _verified(self, js: Any, cfg: Any, subject: str) -> None:
        """Until the stream exists as this code made it: one carrying a republish, mirror or sources is
        never read, and a jobs stream without its bucket transform cannot be read by partition."""
        while True:
            try:
                await await_stream(js, cfg)
                return
            except asyncio.CancelledError:
                raise
            except StreamRefused as exc:
                log.error("incidents_stream_refused", subject=subject, error=str(exc))
                await asyncio.sleep(30)
            except Exception as exc:  # NATS trouble: try again
                log.info("incidents_waiting_for_stream", error=repr(exc))
                await asyncio.sleep(1)

    def _give_up(self, reason: str) -> None:
        log.error("incidents_follower_failed", reason=reason)
        (self.watch or natsclient.watching()).fail(f"the correlator cannot follow its streams: {reason}")

    def _stream_for(self, subject: str) -> Any:
        events, jobs, signals = stream_configs(self.nats_cfg)
        return jobs if subject.startswith(JOBS_PREFIX) else signals if subject.startswith(SIGNALS_PREFIX) else events

    async def _findings_cover(self) -> float:
        """How much of the filed evidence the hardware findings read so far cover: every job last touched by
        the ``_filed``-th message or earlier (``_dirty``) may be judged; ``math.inf``: all of it; -1: none yet.

        A job's evidence comes on the jobs stream, the findings that explain it on the events stream, and two
        consumers can drift apart (one of them on a server that just died, not yet replaced). Judging a
        symptom without the finding stored before it names the wrong culprit (a link, where the finding
        names the port). Both streams are stored in order, so the findings cover the evidence once the events
        follower has handed on a message stored after the newest evidence filed (plus the clocks' skew: no
        round trip, and during a flood no wait for the stream's end). Else a mark: the events stream's last
        sequence, asked once and then waited for (a fresh mark each round is never met by a follower a little
        behind under steady traffic, as on CI's 2 cores). A mark covers only the evidence filed before it was
        asked for: a hold can begin on an idle round, seconds before a job's symptoms and the finding stored
        just before them arrive; those jobs wait for the next mark, the ones it covers are judged. A follower
        that shows no life (nothing handed on, no resubscription, no retry, not waiting for a new consumer)
        is waited for LAG_HOLD_MAX_S, one recovering from a server's loss up to LAG_HOLD_LIMIT_S, counted from
        the oldest job held; then the jobs are judged anyway (logged) and judged again as the findings arrive."""
        f = next((f for f in self.followers if f.until is None and f.stream == self.nats_cfg.stream), None)
        if f is None or not f.ready.is_set():
            return math.inf  # not following yet: _ready_to_judge waits for the history
        filed = max((x.last_stored for x in self.followers if x.stream == self.nats_cfg.jobs_stream), default=0.0)
        if filed and f.last_stored >= filed + STREAM_SKEW_S:
            self._findings_behind_since = self._findings_mark = None
            return math.inf
        now = time.monotonic()
        if self._findings_mark is None:  # what the stream holds now: a fixed target
            self._findings_mark_filed = self._filed  # evidence filed before the question was stored before it
            self._findings_mark = await f.target()
        if self._findings_mark is not None and await f.reached(self._findings_mark):
            cover = self._findings_mark_filed
            self._findings_mark = None  # what was filed since needs a later mark
            if all(n <= cover for n in self._dirty.values()):
                self._findings_behind_since = None
            return cover
        if await f.drained():
            self._findings_behind_since = self._findings_mark = None
            return math.inf
        self.findings_waits += 1
        life = (f.last, f.resubscribes, f.failures, f.unanswered)
        if self._findings_behind_since is None:
            self._findings_behind_since = now
        if life != self._findings_life or f.recovering:
            self._findings_life, self._findings_alive_at = life, now
        held, quiet = now - self._findings_behind_since, now - max(self._findings_alive_at, self._findings_behind_since)
        if held < LAG_HOLD_MAX_S or (quiet < LAG_HOLD_MAX_S and held < LAG_HOLD_LIMIT_S):
            return -1
        log.warning("judging_without_current_findings", behind_s=round(held, 1), quiet_s=round(quiet, 1),
                    follower=f.name, last=f.last, mark=self._findings_mark)
        self._findings_behind_since = self._findings_mark = None  # once per hold at most
        return math.inf

    async def _judge_loop(self) -> None:
        last_sweep = time.monotonic()
        while True:
            nxt = self.tracker.next_due()
            wait = 5.0 if nxt is None else min(5.0, max(0.0, nxt - time.time()))
            if not self._ready_to_judge():
                wait = 0.2
            await wait_event(self._wake, wait)  # not wait_for: on 3.11 it can swallow the stop's cancellation
            self._wake.clear()
            if not self._ready_to_judge():
                continue  # what arrives meanwhile stays dirty
            await asyncio.sleep(self.debounce)  # a burst of 1,000 timeouts is judged once, not 1,000 times
            cover = await self._findings_cover()
            if cover < 0:
                self._wake.set()  # judged as soon as the findings are in: what is dirty stays dirty
                await asyncio.sleep(0.05)
                continue
            touched, self._dirty = self._dirty, {}
            for job, n in touched.items():
                if n > cover:  # filed after the findings' mark was asked for: the next mark's
                    self._dirty[job] = n
            dirty = {j for j in touched if j not in self._dirty} | (self.tracker.due() - self._dirty.keys())
            if self._dirty:
                self._wake.set()
            if self._replaying:  # a gained partition's jobs wait for its history
                held = {j for j in dirty if owner(j, self.tracker.partitions) in self._replaying}
                self._deferred |= held
                dirty -= held
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

    def _ready_to_judge(self) -> bool:
        if not self._judging:
            # the hardware findings' history is in (each partition's jobs wait for their own: ``_replaying``)
            live = [f for f in self.followers if f.until is None and f.stream == self.nats_cfg.stream]
            waited = time.monotonic() - self._started
            if (live and all(f.caught_up.is_set() for f in live)) or waited > CATCH_UP_MAX_S:
                self._judging = True
                log.info("incidents_caught_up", after_s=round(waited, 2), accepted=self.accepted,
                         followers={f.name: f.last for f in live},
                         complete=all(f.caught_up.is_set() for f in live))
        return self._judging

    async def _publish(self, record: dict[str, Any]) -> None:
        """Queued: the publish loop writes it, retrying until it succeeds (a write that timed out in an
        election is not lost); a newer record of the same job replaces one not yet written."""
        if len(encode_token(record["job"])) > MAX_KEY:  # fleet/wire.py bounds job ids well below this
            self.rejections.record("key_too_long", f"job {record['job'][:200]}", json.dumps(record)[:200])
            return
        if record["job"] in self._outbox:
            self.superseded += 1
        self._outbox[record["job"]] = record
        self._outbox_wake.set()

    async def _publish_loop(self) -> None:
        backoff = 0.2
        while True:
            if not self._outbox:
                await wait_event(self._outbox_wake, 5.0)
                self._outbox_wake.clear()
                continue
            failed = False
            for job in list(self._outbox):
                rec = self._outbox.get(job)
                if rec is None:
                    continue
                try:
                    await within(self._write(rec), WRITE_TIMEOUT_S)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # no leader, NATS away, a timeout: kept, tried again
                    self.publish_retries += 1
                    if len(self._unsure) < KNOWN_MAX:
                        self._unsure.add(job)
                    failed = True
                    log.warning("incident_publish_retry", job=job[:200], error=repr(exc)[:300], retry_in=backoff)
                    break
                if self._outbox.get(job) is rec:
                    del self._outbox[job]
            if failed:
                await asyncio.sleep(backoff)
                backoff = min(PUBLISH_BACKOFF_MAX_S, backoff * 2)
            else:
                backoff = 0.2

    async def _write(self, record: dict[str, Any]) -> None:
        """One record into the KV, then on its subject; idempotent: a KV already holding this version
        (written by another replica, or by this one before it restarted) is left as it is, and every
        write is a compare-and-set on the revision read, so two writers never both add a version. A job
        this process has not written yet is first created without reading (its first verdict, the one a
        flood delays most: one request to the server instead of two); a key that exists already is read
        and compared as any other."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

        data = json.dumps(record, separators=(",", ":")).encode()
        token = encode_token(record["job"])
        if self._kv is None:
            js = self.nc.jetstream(timeout=WRITE_ATTEMPT_S)
            self._kv = await open_kv(js, INCIDENTS_BUCKET, create_with=KeyValueConfig(
                bucket=INCIDENTS_BUCKET, history=5, replicas=self.nats_cfg.stream_replicas))
        first = record["job"] not in self._known
        for _attempt in range(8):
            if first:
                first = False
                try:
                    await self._kv.create(token, data)
                    break
                except KeyWrongLastSequenceError:
                    pass  # the key exists (another replica, or this one before a restart): read and compare
            self.kv_reads += 1
            try:
                entry = await self._kv.get(token)
            except (KeyNotFoundError, KeyDeletedError):
                entry = None
            if entry is not None and entry.value and same_version(entry.value, record):
                self.publish_same += 1
                self._know(record["job"])
                if record["job"] in self._unsure:  # ours, stored by an attempt whose answer was lost
                    self._unsure.discard(record["job"])
                    await self._announce(token, data, record)
                return
            try:
                if entry is None:
                    await self._kv.create(token, data)
                else:
                    await self._kv.update(token, data, last=entry.revision)
                break
            except KeyWrongLastSequenceError:
                continue  # another replica wrote meanwhile: read it again
        else:
            raise RuntimeError(f"{INCIDENTS_BUCKET}: the key of job {record['job'][:100]!r} kept changing")
        self._know(record["job"])
        self._unsure.discard(record["job"])
        await self._announce(token, data, record)

    async def _announce(self, token: str, data: bytes, record: dict[str, Any]) -> None:
        await self.nc.publish(f"{INCIDENTS_PREFIX}.{token}", data)  # after the KV: whoever hears it finds it there
        self.published += 1
        self.published_by_status[record["status"]] = self.published_by_status.get(record["status"], 0) + 1
        log.info("incident", job=record["job"], status=record["status"], culprit=record.get("culprit"),
                 victims=len(record.get("victims", [])), confidence=record.get("confidence"))

    def _know(self, job: str) -> None:
        if len(self._known) >= KNOWN_MAX:
            self._known.clear()
        self._known.add(job)

    def stats(self) -> dict[str, Any]:
        """What the periodic ``correlator_stats`` line says (and bench/incidents_scale.py reads)."""
        return {"accepted": self.accepted, "skipped": self.skipped, "rejected": self.rejections.total(),
                "published": self.published,
                "publish_same": self.publish_same, "publish_retries": self.publish_retries,
                "publish_pending": len(self._outbox), "superseded": self.superseded, "replays": self.replays,
                "replay_retries": self.replay_retries, "findings_waits": self.findings_waits,
                "judging": self._judging, "owned": sorted(self.tracker.owned),
                "followers": {f.name: f.stats() for f in self.followers},
                "leases": ({"held": sorted(self.leases.held), "takeovers": self.leases.takeovers,
                            "reclaimed": self.leases.reclaimed, "errors": self.leases.errors,
                            "beat_takeovers": self.leases.beat_takeovers,
                            "provisional": sorted(self.leases.provisional),
                            "provisional_takeovers": self.leases.provisional_takeovers,
                            "beats_rejected": self.leases.beats_rejected}
                           if self.leases is not None else None),
                "loop_stall_max_ms": round(self.loop_stall_max_ms, 1),
                "loop_stall_cpu_max_ms": round(self.loop_stall_cpu_max_ms, 1),
                 **self.heap.stats(), **self.tracker.stats()}

    async def _stats_loop(self) -> None:
        """The loop-stall probe (how late a short sleep wakes: what held the loop that long held every
        message and verdict behind it) and the periodic stats line. A late wake-up is the loop held by a
        callback, or the thread waiting for a core: the thread's CPU time over the interval bounds the
        first (``loop_stall_cpu_max_ms``)."""
        last, last_cpu = time.monotonic(), time.thread_time()
        window_max = window_cpu = 0.0
        next_line = last + self.stats_interval
        while True:
            await asyncio.sleep(STALL_PROBE_S)
            now, cpu = time.monotonic(), time.thread_time()
            stall = max(0.0, now - last - STALL_PROBE_S) * 1000.0
            own = min(stall, (cpu - last_cpu) * 1000.0)
            last, last_cpu = now, cpu
            window_max, window_cpu = max(window_max, stall), max(window_cpu, own)
            self.loop_stall_max_ms = max(self.loop_stall_max_ms, stall)
            self.metrics.loop_stall.observe(stall / 1000.0)
            self.loop_stall_cpu_max_ms = max(self.loop_stall_cpu_max_ms, own)
            self.heap.tick(quiet=not self._dirty)
            if now >= next_line:
                log.info("correlator_stats", **{**self.stats(), "loop_stall_window_ms": round(window_max, 1),
                                                "loop_stall_cpu_window_ms": round(window_cpu, 1)})
                window_max = window_cpu = 0.0
                next_line = now + self.stats_interval


async def incident_versions(js: Any, job: str, bucket: str = INCIDENTS_BUCKET) -> list[dict[str, Any]]:
    """Every record the incidents KV still holds for ``job`` (its history, oldest first: one entry per
    write; what the tests and bench/incidents_scale.py read to find a version written twice)."""
    from nats.js.errors import NotFoundError

    subject = f"$KV.{bucket}.{encode_token(job)}"
    out: list[dict[str, Any]] = []
    seq = (await js.stream_info(f"KV_{bucket}")).state.first_seq
    while True:
        try:
            m = await js.get_msg(f"KV_{bucket}", seq=seq, subject=subject, next=True)
        except NotFoundError:
            return out
        if m.data:
            out.append(json.loads(m.data))
        seq = int(m.seq or seq) + 1
