"""Issue 21, "partitions split reading too": the jobs stream stores every job subject under a bucket that
nats-server computes (gna_types/subjects.py JOBS_TRANSFORM), and a correlator replica's consumer asks the server
for its own partitions' buckets only. Real nats-server throughout: the bucket this code computes must be the
one the server stores, or a replica would read another's jobs (or none of its own)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import nats
import pytest
from nats.js.api import StreamConfig, SubjectTransform

from agent.config import NatsConfig
from agent.message import encode, make_message
from agent.nats_link import JOBS_STREAM_TRANSFORM, StreamRefused, ensure_stream, stream_configs
from agent.nats_server import NatsServerProcess
from fleet.incident_service import LAG_HOLD_LIMIT_S, LAG_HOLD_MAX_S, STREAM_SKEW_S, IncidentService
from fleet.incidents import owner, partition_buckets
from gna_types.subjects import JOB_BUCKETS, encode_token, job_bucket, job_subject, stored_job_subject


def _names(n: int, seed: int) -> list[str]:
    """Job ids as operators and NCCL write them: commIds, namespace/name, dots, Unicode, odd bytes."""
    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_./:é漢 "
    out = [f"0x{rnd.getrandbits(64):016x}" for _ in range(n // 2)]
    out += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 60))) for _ in range(n - len(out))]
    return out


async def test_the_server_stores_each_job_under_the_bucket_this_code_computes(
        nats_server: NatsServerProcess) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    try:
        jobs_cfg = stream_configs(NatsConfig())[1]
        assert await ensure_stream(js, jobs_cfg) == "created"
        jobs = _names(300, seed=21)
        for job in jobs:
            await js.publish(job_subject(job, "gpu-017.dc1", "member"), b"{}")
        info = await js.stream_info(str(jobs_cfg.name))
        stored = [(await js.get_msg(str(jobs_cfg.name), seq=s)).subject for s in range(1, info.state.last_seq + 1)]
        assert stored == [stored_job_subject(job, "gpu-017.dc1", "member") for job in jobs]
        assert len({job_bucket(encode_token(j)) for j in jobs}) > JOB_BUCKETS * 0.8  # spread over the buckets
        # a second check of the stream as made: verified, nothing changed
        assert await ensure_stream(js, jobs_cfg) == "verified"
    finally:
        await nc.close()


async def test_a_stream_made_before_the_transform_gets_it_in_place_and_a_foreign_one_is_refused(
        nats_server: NatsServerProcess) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    try:
        want = stream_configs(NatsConfig())[1]
        await js.add_stream(StreamConfig(name=want.name, subjects=want.subjects, max_age=3600.0))
        await js.publish(job_subject("0x1", "n1", "member"), b"{}")  # stored before: keeps its subject
        with pytest.raises(StreamRefused, match="nats setup"):  # a reader that may not change it says what to do
            await ensure_stream(js, want, create=False)
        assert await ensure_stream(js, want) == "verified"  # nats setup (and an agent allowed to) adds it
        info = await js.stream_info(str(want.name))
        assert info.config.subject_transform is not None
        assert info.config.subject_transform.dest == JOBS_STREAM_TRANSFORM.dest
        assert info.config.max_age == 3600.0  # the operator's own settings kept
        await js.publish(job_subject("0x1", "n1", "member"), b"{}")
        assert (await js.get_msg(str(want.name), seq=1)).subject == "gna.jobs.0x1.n1.member"
        assert (await js.get_msg(str(want.name), seq=2)).subject == stored_job_subject("0x1", "n1", "member")
        # another transform (fewer buckets: every replica would read the wrong jobs): refused, never rewritten
        cfg = info.config
        cfg.subject_transform = SubjectTransform(src="gna.jobs.*.*.*",
                                                 dest="gna.jobs.{{partition(60,1)}}.{{wildcard(1)}}."
                                                      "{{wildcard(2)}}.{{wildcard(3)}}")
        await js.update_stream(cfg)
        with pytest.raises(StreamRefused, match="partition\\(60,1\\)"):
            await ensure_stream(js, want)
    finally:
        await nc.close()


def _member(job: str, node: str, rank: int) -> bytes:
    return encode(make_message(node=node, collector="nccl_logs", kind="event", type="NCCLJobMember",
                               severity="info", entity=f"nccl:{node}:{100 + rank}", reason="x", message="x",
                               details={"job": job, "host": node, "pid": 100 + rank, "rank": rank, "nranks": 4,
                                        "world_rank": rank, "world_size": 4}))


async def test_each_replica_receives_only_its_own_jobs(nats_server: NatsServerProcess) -> None:
    """Three replicas (a static split): the server delivers each one only the jobs of its buckets. Nothing
    of another partition's jobs reaches it, so a replica's reading (and decoding) falls as replicas are added;
    every job is held by exactly one replica."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    svcs = [IncidentService([nats_server.url], partitions=3, partition=p, lease_ttl=0.0, debounce=0.02)
            for p in range(3)]
    try:
        for cfg in stream_configs(NatsConfig()):
            await ensure_stream(js, cfg)
        jobs = [f"0x{i:016x}" for i in range(1, 61)]
        for job in jobs:
            for rank in range(4):
                node = f"node-{rank // 2}"
                await js.publish(job_subject(job, node, "member"), _member(job, node, rank),
                                 headers={"Nats-Msg-Id": f"{job}:{rank}"})
        for svc in svcs:
            await svc.start()
        want = {p: {j for j in jobs if owner(j, 3) == p} for p in range(3)}
        assert all(want.values())
        t0 = time.monotonic()
        while any(set(s.tracker.jobs) != want[p] for p, s in enumerate(svcs)) and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.1)
        for p, svc in enumerate(svcs):
            assert set(svc.tracker.jobs) == want[p]
            # two consumers a partition (membership, evidence): each asks for its partition's buckets only
            members = next(f for f in svc.followers if f.name == f"incidents:jobs:{p}:member")
            evidence = next(f for f in svc.followers if f.name == f"incidents:jobs:{p}:evidence")
            assert members.handed == 4 * len(want[p]), "the server handed this replica another partition's jobs"
            assert evidence.handed == 0
            assert svc.skipped == 0 and not svc.rejections.counts
            assert members.filters == [f"gna.jobs.{b}.*.*.member" for b in partition_buckets(p, 3)]
            assert evidence.filters == [f"gna.jobs.{b}.*.*.evidence" for b in partition_buckets(p, 3)]
        # the holder of partition 0 also reads every job's membership for the straggler watch
        assert {f.name for f in svcs[0].followers} >= {"stragglers:membership"}
        assert all("stragglers:membership" not in {f.name for f in s.followers} for s in svcs[1:])
    finally:
        for svc in svcs:
            await svc.stop()
        await nc.close()


class _Findings:
    """The events stream's follower as the incident service reads it: ``last`` handed on, ``end(n)`` the
    stream's last sequence at the n-th question (``target``)."""

    until = None
    stream = "GNA_EVENTS"
    name = "incidents:GNA_EVENTS"
    last_stored = 0.0
    resubscribes = failures = unanswered = 0
    recovering = False

    def __init__(self, last: int, end: Callable[[int], int]) -> None:
        self.last, self.end, self.marks = last, end, 0
        self.ready = asyncio.Event()

    async def target(self) -> int:
        self.marks += 1
        return self.end(self.marks)

    async def reached(self, mark: int) -> bool:
        return self.last >= mark

    async def drained(self) -> bool:
        return False


async def _judging(svc: IncidentService) -> bool:
    """Whether a judge round may judge every job touched so far (``_findings_cover`` covers them all)."""
    cover = await svc._findings_cover()
    return cover >= 0 and all(n <= cover for n in svc._dirty.values())


async def test_verdicts_wait_for_the_hardware_findings_stored_before_them() -> None:
    """Hardware findings (events stream) and a job's evidence (jobs stream) arrive on two consumers: after a
    server loss one may be behind the other. While the findings' follower has not handed on what its stream
    held, no job is judged (a symptom judged without the finding stored before it names the wrong culprit),
    for at most LAG_HOLD_MAX_S while it shows no life, LAG_HOLD_LIMIT_S while it recovers."""
    svc = IncidentService(["nats://127.0.0.1:1"])

    f = _Findings(7, lambda n: 9 + n)  # the stream grows while the follower reads: a moving mark
    svc.followers = [f]  # type: ignore[list-item]
    assert await _judging(svc)  # not following yet: the start's catch-up gate applies
    f.ready.set()
    assert not await _judging(svc) and not await _judging(svc)
    assert svc.findings_waits == 2 and f.marks == 1  # the mark is taken once and waited for
    f.last = 10  # the follower reaches what the stream held when the hold began, though it grew since
    assert await _judging(svc) and svc._findings_behind_since is None
    assert not await _judging(svc) and f.marks == 2  # a new round, a new mark (11)
    assert svc._findings_behind_since is not None
    svc._findings_behind_since -= LAG_HOLD_MAX_S + 0.1
    svc._findings_alive_at -= LAG_HOLD_MAX_S + 0.1
    f.resubscribes += 1  # recovering from a server's loss: waited for longer
    assert not await _judging(svc)
    svc._findings_behind_since -= LAG_HOLD_LIMIT_S  # but not for ever: judged anyway (logged)
    assert await _judging(svc)
    assert svc._findings_mark is None
    assert not await _judging(svc)  # a new hold; a follower that shows no life: LAG_HOLD_MAX_S
    assert svc._findings_behind_since is not None
    svc._findings_behind_since -= LAG_HOLD_MAX_S + 0.1
    svc._findings_alive_at -= LAG_HOLD_MAX_S + 0.1
    f.recovering = True  # waiting for a new consumer (js.subscribe through an election): life, though no count moved
    assert not await _judging(svc)
    f.recovering = False
    svc._findings_behind_since -= LAG_HOLD_MAX_S + 0.1
    svc._findings_alive_at -= LAG_HOLD_MAX_S + 0.1
    assert await _judging(svc)


async def test_a_mark_asked_before_a_jobs_evidence_does_not_cover_it() -> None:
    """The flake of test_cluster_failover (one run in twelve): an idle round began a hold and asked for the
    events stream's end (330); a job's membership and symptoms were filed after it, with the port-down
    finding stored on the events stream just before them (~1000); the follower, recovering from a server's
    loss, reached 330 and the job was judged without the finding: a link named, then the port 28 ms later.
    A mark covers what was filed before it was asked for: the job waits for the next mark, the jobs the old
    one covers are judged at once."""
    svc = IncidentService(["nats://127.0.0.1:1"])

    f = _Findings(89, lambda n: (330, 1000)[n - 1])
    f.ready.set()
    svc.followers = [f]  # type: ignore[list-item]
    svc._touch({"old-job"})  # filed before the hold began: the first mark covers it
    assert await svc._findings_cover() == -1 and svc._findings_mark == 330
    svc._touch({"job-107"})  # its evidence arrives while the follower is behind
    f.last = 686  # past the first mark, not yet at the finding (~1000)
    cover = await svc._findings_cover()
    assert svc._dirty["old-job"] <= cover < svc._dirty["job-107"], "the old mark must not cover job-107"
    assert svc._findings_mark is None and svc._findings_behind_since is not None  # still holding job-107
    assert await svc._findings_cover() == -1 and svc._findings_mark == 1000  # asked after job-107 was filed
    f.last = 1000
    assert await svc._findings_cover() >= svc._dirty["job-107"] and svc._findings_behind_since is None


async def test_the_judge_loop_judges_what_a_mark_covers_and_holds_the_rest() -> None:
    """The same ordering through the judge loop itself: the job filed before the first mark is judged once the
    follower reaches it; the job filed after waits, dirty, for the second mark, then is judged."""
    svc = IncidentService(["nats://127.0.0.1:1"], debounce=0.01)
    svc._judging = True  # the history is in
    f = _Findings(89, lambda n: (330, 1000)[n - 1])
    f.ready.set()
    svc.followers = [f]  # type: ignore[list-item]
    judged: list[str] = []

    def judge_one(job: str, now: float) -> None:
        judged.append(job)

    svc.tracker.judge_one = judge_one  # type: ignore[method-assign]

    async def until(cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not cond():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.01)

    loop = asyncio.ensure_future(svc._judge_loop())
    try:
        svc._touch({"old-job"})
        await until(lambda: svc._findings_mark == 330, "the first mark asked for")
        svc._touch({"job-107"})  # filed after the first mark was asked for
        f.last = 686
        await until(lambda: "old-job" in judged, "the covered job judged")
        await until(lambda: svc._findings_mark == 1000, "a second mark asked for the held job")
        assert "job-107" not in judged and "job-107" in svc._dirty
        f.last = 1000
        await until(lambda: "job-107" in judged, "the held job judged once its mark is reached")
        assert judged.count("old-job") == 1 and not svc._dirty
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_findings_read_past_the_evidence_filed_are_current_without_asking_the_server() -> None:
    """Both streams are stored in order: once the findings' follower handed on a message its stream stored
    after the newest evidence the jobs' followers filed (plus the clocks' skew), every finding stored before
    that evidence was read: no mark, no round trip, and in a flood no wait for the events stream's end."""
    svc = IncidentService(["nats://127.0.0.1:1"])

    class Follower:
        until = None
        last = 7
        resubscribes = failures = unanswered = 0
        recovering = False
        marks = 0

        def __init__(self, stream: str, stored: float) -> None:
            self.stream, self.name, self.last_stored = stream, f"incidents:{stream}", stored
            self.ready = asyncio.Event()
            self.ready.set()

        async def target(self) -> int:
            self.marks += 1
            return 1000  # the events stream's end, far ahead during a flood

        async def reached(self, mark: int) -> bool:
            return self.last >= mark

        async def drained(self) -> bool:
            return False

    findings = Follower(svc.nats_cfg.stream, 100.0)
    jobs = Follower(svc.nats_cfg.jobs_stream, 100.0)
    svc.followers = [findings, jobs]  # type: ignore[list-item]
    assert not await _judging(svc) and findings.marks == 1  # stored no later than the evidence
    findings.last_stored = 100.0 + STREAM_SKEW_S / 2
    assert not await _judging(svc)  # within the clocks' skew: not proof
    findings.last_stored = 100.0 + STREAM_SKEW_S + 0.01
    assert await _judging(svc) and findings.marks == 1 and svc._findings_mark is None
    jobs.last_stored = 200.0  # newer evidence filed: the findings must be read past it again
    assert not await _judging(svc)


def test_partitions_hold_every_bucket_once() -> None:
    for n in (1, 2, 3, 5, 7, 8, 16, JOB_BUCKETS):
        held = [b for p in range(n) for b in partition_buckets(p, n)]
        assert sorted(held) == list(range(JOB_BUCKETS))
        sizes = [len(partition_buckets(p, n)) for p in range(n)]
        assert max(sizes) - min(sizes) <= 1
