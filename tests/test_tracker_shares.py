"""Issue 20, deliver 2: the live correlator's state is shared fairly between reporters. One node's
messages crowd out only its own (per-node windows, a per-node share of the job table), a verdict
waits a bounded time however often a node repeats itself, and judging is one job at a time."""

from __future__ import annotations

import itertools
from typing import Any

from fleet.incident_service import IncidentService
from fleet.incidents import JOBS_PER_NODE, PROCESSES_PER_NODE, IncidentTracker

JOB = "0x7a11"
SIZE = 32  # 4 nodes x 8 ranks
_ids = itertools.count()


def _msg(node: str, type_: str, pid: int, **details: Any) -> dict[str, Any]:
    return {"id": f"{next(_ids):026d}", "collector": "nccl_logs", "kind": "event", "type": type_,
            "severity": "critical" if type_ == "NCCLCollectiveTimeout" else "info", "node": node,
            "entity": f"nccl:{node}:{pid}", "time": "2026-12-03T07:00:00.000Z", "reason": "x", "message": "x",
            "details": {"host": node, "pid": pid, **details}}


def _member(node: str, rank: int, *, job: str = JOB, size: int = SIZE, pid: int | None = None) -> dict[str, Any]:
    return _msg(node, "NCCLJobMember", rank if pid is None else pid, job=job, world_rank=rank, world_size=size)


def _timeout(node: str, rank: int, job: str = JOB) -> dict[str, Any]:
    return _msg(node, "NCCLCollectiveTimeout", rank, job=job, world_rank=rank, world_size=SIZE, seq_num=40,
                pg_id="0")


def _honest_hang(t: IncidentTracker, now: float, hung: int = 13) -> set[str]:
    touched: set[str] = set()
    for r in range(SIZE):
        touched |= t.add(_member(f"n{r // 8}", r), now=now)
    for r in range(SIZE):
        if r != hung:
            touched |= t.add(_timeout(f"n{r // 8}", r), now=now)
    return touched


def test_a_flood_of_one_nodes_members_never_pushes_out_the_others() -> None:
    t = IncidentTracker(settle=0)
    touched = _honest_hang(t, 100.0)
    for i in range(4200):  # the 4,200 fake members, from node n3 (a node of the job)
        touched |= t.add(_member("n3", 24 + i % 8, pid=100000 + i), now=100.0)
    (rec,) = t.judge(touched, now=101.0)
    assert rec["culprit"]["node"] == "n1" and rec["culprit"]["rank"] == "13", rec["reason"]
    assert len(t.jobs[JOB].node_procs["n3"]) == PROCESSES_PER_NODE  # n3's known processes stand, the rest refused
    assert t.refused["processes_per_node"] == 4200 - (PROCESSES_PER_NODE - 8)


def test_one_node_cannot_fill_the_job_table_nor_evict_a_real_job() -> None:
    t = IncidentTracker(settle=0, max_jobs=1000)
    touched = _honest_hang(t, 100.0)
    for i in range(10050):
        t.add(_member("rogue", 0, job=f"0x{i + 1:x}", size=1), now=101.0)
    assert JOB in t.jobs and t.refused["jobs_per_node"] == 10050 - JOBS_PER_NODE
    (rec,) = t.judge(touched, now=102.0)
    assert rec["culprit"]["node"] == "n1"


def test_many_small_jobs_are_forgotten_before_the_job_several_nodes_report() -> None:
    t = IncidentTracker(settle=0, max_jobs=50)
    _honest_hang(t, 100.0)
    for i in range(200):  # 200 single-node jobs from 200 nodes fill the table again and again
        t.add(_member(f"x{i}", 0, job=f"0x{i + 1:x}", size=1), now=200.0 + i)
    assert JOB in t.jobs and len(t.jobs) == 50


def test_a_node_repeating_its_timeout_cannot_hold_a_verdict_back() -> None:
    t = IncidentTracker(settle=1.0, settle_max=2.0)
    touched = _honest_hang(t, 100.0)
    assert t.judge(touched, now=100.0) == []  # settling
    now = 100.0
    published: list[dict[str, Any]] = []
    while now < 110.0 and not published:
        now += 0.4  # n0 re-sends its own timeout every 0.4 s (a new message each time)
        touched = t.add(_timeout("n0", 0), now=now)
        published = t.judge(touched | t.due(now), now=now)
    assert published and published[0]["culprit"]["rank"] == "13"
    assert now <= 100.0 + 2.0 + 0.4, now


def test_a_conflicting_claim_after_the_verdict_flags_it_and_never_moves_it() -> None:
    t = IncidentTracker(settle=0)
    (rec,) = t.judge(_honest_hang(t, 100.0), now=101.0)
    assert rec["culprit"]["node"] == "n1" and not rec["contested"]
    # n3 now claims the hung rank and another size: first claim and the most nodes' size stand (a size within
    # the typed bound: one past it is refused at the wire and, off the wire, read as absent -- fleet/typed_details.py)
    touched = t.add(_member("n3", 13, pid=7777), now=102.0) | t.add(_member("n3", 5, size=SIZE * 4, pid=7778),
                                                                    now=102.0)
    (after,) = t.judge(touched, now=103.0)
    assert after["culprit"]["node"] == "n1" and after["culprit"]["rank"] == "13"
    assert after["contested"] and after["confidence"] < 0.85 and not after["actionable"]
    kinds = {(f["kind"], f["node"]) for f in after["findings"]}
    assert ("rank_conflict", "n3") in kinds and ("size_conflict", "n3") in kinds


def test_a_poison_message_is_counted_and_the_service_goes_on(monkeypatch: Any) -> None:
    svc = IncidentService(["nats://127.0.0.1:1"])

    def boom(msg: dict[str, Any], now: float | None = None) -> set[str]:
        raise KeyError("a bug a message found")

    monkeypatch.setattr(svc.tracker, "add", boom)
    from agent.message import encode, make_message
    from gna_types.subjects import event_subject, job_subject
    m = make_message(node="n0", collector="kmsg_xid", kind="condition", type="GPUFellOffBus", status="firing",
                     severity="critical", entity="gpu:0000:18:00.0", reason="Xid79", message="x")
    svc.accept(event_subject("n0", "kmsg_xid", "critical"), encode(m))  # does not raise
    assert svc.rejections.counts == {"unhandled:KeyError": 1}
    # a 5,000-character job id never reaches the tracker (fleet/wire.py bounds it)
    monkeypatch.undo()
    long = make_message(node="n0", collector="nccl_logs", kind="event", type="NCCLCollectiveTimeout",
                        severity="critical", entity="nccl:n0:1", reason="x", message="x",
                        details={"job": "0x" + "f" * 5000, "host": "n0", "pid": 1})
    svc.accept(job_subject("0x" + "f" * 5000, "n0", "evidence"), encode(long))
    assert svc.rejections.counts.get("too_long") == 1 and not svc.tracker.jobs


def test_a_replica_decodes_only_its_partitions_jobs_and_every_nodes_hardware() -> None:
    """Issue 21: partitions split reading. The server hands a replica only its buckets' jobs (tested live in
    tests/test_job_buckets.py); what still arrives of another partition's jobs is skipped undecoded (even
    broken ones: they are another replica's to count), NCCL's copies on the events stream are never
    decoded, and every node's hardware finding is."""
    from agent.message import encode, make_message
    from fleet.incidents import owner
    from gna_types.subjects import JOB_BUCKETS, encode_token, event_subject, job_bucket, stored_job_subject

    svc = IncidentService(["nats://127.0.0.1:1"], partitions=2, partition=0)
    svc.tracker.owned = {1}  # holds only partition 1 (0 went to another replica): no straggler watch
    ours = next(f"0x{i:016x}" for i in range(100) if owner(f"0x{i:016x}", 2) == 1)
    theirs = next(f"0x{i:016x}" for i in range(100) if owner(f"0x{i:016x}", 2) == 0)

    def nccl(job: str, type_: str, severity: str) -> bytes:
        return encode(make_message(node="n0", collector="nccl_logs", kind="event", type=type_, severity=severity,
                                   entity="nccl:n0:1", reason="x", message="x",
                                   details={"job": job, "host": "n0", "pid": 1, "rank": 0, "nranks": 2}))

    # what a consumer asking for another replica's buckets could still hand over (a lease just lost)
    svc.accept(stored_job_subject(theirs, "n0", "member"), b"{broken")
    svc.accept(stored_job_subject(theirs, "n0", "member"), nccl(theirs, "NCCLJobMember", "info"))
    svc.accept(stored_job_subject(theirs, "n0", "evidence"), nccl(theirs, "NCCLCollectiveTimeout", "critical"))
    # a job's NCCL messages on the events stream: the jobs stream's evidence again, never decoded here
    svc.accept(event_subject("n0", "nccl_logs", "critical"), nccl(ours, "NCCLCollectiveTimeout", "critical"))
    svc.accept(event_subject("n0", "nccl_logs", "critical"), b"{broken")
    assert svc.skipped == 5 and svc.accepted == 0 and not svc.rejections.counts
    svc.accept(stored_job_subject(ours, "n0", "member"), nccl(ours, "NCCLJobMember", "info"))
    svc.accept(stored_job_subject(ours, "n0", "evidence"), nccl(ours, "NCCLCollectiveTimeout", "critical"))
    hw = make_message(node="n0", collector="kmsg_xid", kind="condition", type="GPUFellOffBus", status="firing",
                      severity="critical", entity="gpu:0000:18:00.0", reason="Xid79", message="x")
    svc.accept(event_subject("n0", "kmsg_xid", "critical"), encode(hw))
    svc.accept(event_subject("n0", "kmsg_xid", "critical"), b"{broken")  # a node's finding: decoded, counted
    # a stored subject whose bucket is not its job's (a forged or misconfigured store): refused, counted
    wrong = (job_bucket(encode_token(ours)) + 1) % JOB_BUCKETS
    svc.accept(f"gna.jobs.{wrong}." + stored_job_subject(ours, "n0", "member").split(".", 3)[3],
               nccl(ours, "NCCLJobMember", "info"))
    assert svc.skipped == 5 and svc.accepted == 3 and svc.rejections.counts == {"not_json": 1, "bad_bucket": 1}
    assert set(svc.tracker.jobs) == {ours} and "n0" in svc.tracker.hardware
    # the holder of partition 0 reads every job's membership for the straggler watch, judges only its own
    svc0 = IncidentService(["nats://127.0.0.1:1"], partitions=2, partition=0)
    svc0.accept_membership(stored_job_subject(ours, "n0", "member"), nccl(ours, "NCCLJobMember", "info"))
    assert svc0.skipped == 0 and not svc0.tracker.jobs
