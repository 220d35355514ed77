"""#15: the live correlator on a real nats-server: incidents as evidence arrives, state rebuilt from
the stream after a restart, jobs split across replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig

from agent import config as configmod
from agent.nats_link import JOBS_STREAM_SUBJECTS, JOBS_STREAM_TRANSFORM, STREAM_SUBJECTS
from agent.nats_server import NatsServerProcess
from fleet.incident_service import IncidentService
from fleet.incidents import INCIDENTS_BUCKET, IncidentTracker, owner
from gna_types.subjects import event_subject, job_subject, subjects_for
from sim.scenarios import generate


async def _messages(tmp: Path, fault: str, seed: int = 11, nodes: int = 4) -> tuple[Any, list[dict[str, Any]]]:
    sc = generate(tmp, seed=seed, nodes=nodes, fault=fault, job_nodes=3, second_job=False)
    return sc, await sc.messages()


def _is_symptom_or_fault(m: dict[str, Any]) -> bool:
    return m["type"] != "NCCLJobMember" and (m["severity"] == "critical" or m["type"].startswith("NCCL"))


async def test_tracker_judges_when_evidence_arrives_and_resolves_when_the_job_goes_quiet(tmp_path: Path) -> None:
    sc, msgs = await _messages(tmp_path, "gpu_fell_off")
    t = IncidentTracker(resolve_after=60, settle=0)
    members = [m for m in msgs if m["type"] == "NCCLJobMember"]
    rest = [m for m in msgs if m["type"] != "NCCLJobMember"]
    touched: set[str] = set()
    for m in members:
        touched |= t.add(m, now=100.0)
    assert t.judge(touched, now=100.0) == []  # a job starting: nothing to say
    for m in rest:
        touched |= t.add(m, now=101.0)
    (rec,) = t.judge(touched, now=101.0)
    want = sc.expected[sc.jobs[0].comm_id]
    assert rec["status"] == "open" and {k: rec["culprit"][k] for k in want} == want
    assert t.judge(touched, now=102.0) == []  # the same verdict is not published again
    assert rec["actionable"] and rec["corroboration"] == "own node"  # the node's own hardware finding
    # quiet, but the GPU is still off the bus (issue 20): the incident stays open, the job is kept
    assert t.sweep(now=200.0) == [] and rec["job"] in t.jobs
    assert t.still_firing(rec["job"]) == [f"{rec['culprit']['node']} {rec['culprit']['entity']}"]
    assert t.sweep(now=101.0 + t.abandon_after) == []  # a day later the node still says its GPU is gone
    # the GPU's conditions resolve (its node says so); the Xid event stays evidence, nothing fires any more
    for i, c in enumerate(m for m in rest if m["kind"] == "condition" and m["entity"] == rec["culprit"]["entity"]):
        t.judge(t.add({**c, "status": "resolved", "id": f"01RESOLVED{i:016d}"}, now=102.0), now=102.0)
    assert t.still_firing(rec["job"]) == []
    assert t.sweep(now=102.0 + t.abandon_after / 2) == []  # its processes may still be alive and silent
    # a day without a word from any of its nodes (their agents gone too, no fault firing): given up
    (done,) = t.sweep(now=102.0 + t.abandon_after)
    assert done["status"] == "resolved" and done["job"] == rec["job"] and not t.jobs


async def test_an_incident_resolves_on_evidence_not_on_silence(tmp_path: Path) -> None:
    """Issue 20, lifecycle: a hung job is silent until its watchdog fires; quiet is no evidence. The
    incident resolves when the fault resolves or every process of the job ended (NCCLProcessEnded)."""
    _sc, msgs = await _messages(tmp_path, "gpu_fell_off")
    t = IncidentTracker(resolve_after=60, settle=0)
    touched: set[str] = set()
    for m in msgs:
        touched |= t.add(m, now=100.0)
    (rec,) = t.judge(touched, now=100.0)
    job = rec["job"]
    gpu = next(m for m in msgs if m["type"] == "GPUFellOffBus")
    assert t.judge(t.add({**gpu, "status": "resolved", "id": "01RESOLVEDGPU"}, now=150.0), now=150.0)
    assert t.sweep(now=400.0) == [] and job in t.jobs  # the processes may be alive and silent
    ended = []
    for m in msgs:
        d = m["details"]
        if m["type"] == "NCCLJobMember" and d.get("job") == job:
            ended.append({**m, "id": f"01END{len(ended):021d}", "type": "NCCLProcessEnded"})
    records = []
    for m in ended:
        records += t.judge(t.add(m, now=500.0), now=500.0)
    final = [r for r in records if r["status"] == "resolved"]
    assert len(final) == 1 and "processes ended" in final[0]["reason"] and job not in t.jobs


async def test_partitions_split_the_jobs(tmp_path: Path) -> None:
    _sc, msgs = await _messages(tmp_path, "hung_rank")
    job = next(m["details"]["job"] for m in msgs if m["type"] == "NCCLJobMember")
    trackers = [IncidentTracker(partitions=3, partition=i, settle=0) for i in range(3)]
    results = []
    for t in trackers:
        touched: set[str] = set()
        for m in msgs:
            touched |= t.add(m)
        results.append(t.judge(touched))
    assert [bool(r) for r in results] == [i == owner(job, 3) for i in range(3)]
    with pytest.raises(ValueError):
        IncidentTracker(partitions=2, partition=2)


async def _fleet_bus(url: str) -> tuple[Any, Any, asyncio.Queue[dict[str, Any]]]:
    """A connection with the agents' events and jobs streams, and a queue of the incidents published."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS))
    await js.add_stream(StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS,
                                     subject_transform=JOBS_STREAM_TRANSFORM))
    got: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_incident(msg: Any) -> None:
        await got.put(json.loads(msg.data))

    await nc.subscribe("gna.incidents.>", cb=on_incident)
    return nc, js, got


async def _publish(js: Any, msgs: list[dict[str, Any]]) -> None:
    for m in msgs:
        for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
            await js.publish(subject, json.dumps(m).encode(), headers={"Nats-Msg-Id": m["id"]})


async def test_live_incident_within_seconds_and_rebuilt_after_a_restart(tmp_path: Path,
                                                                        nats_server: NatsServerProcess) -> None:
    sc, msgs = await _messages(tmp_path, "ib_port_down")
    want = sc.expected[sc.jobs[0].comm_id]
    nc, js, got = await _fleet_bus(nats_server.url)
    svc = IncidentService([nats_server.url], debounce=0.02)
    await svc.start()
    try:
        await _publish(js, [m for m in msgs if m["type"] == "NCCLJobMember"])  # the job starts
        await asyncio.sleep(0.5)
        assert got.empty()
        t0 = time.monotonic()
        await _publish(js, [m for m in msgs if _is_symptom_or_fault(m)])  # the port goes down, ranks time out
        rec = await asyncio.wait_for(got.get(), 10)
        latency = time.monotonic() - t0
        assert rec["status"] == "open" and {k: rec["culprit"][k] for k in want} == want, rec
        assert latency < 3.0, latency
        assert want["node"] not in rec["victims"]
        with contextlib.suppress(TimeoutError):  # later versions (more evidence), until the job is quiet
            while True:
                rec = await asyncio.wait_for(got.get(), 2.0)
        # the job's first version created without a read (one request, not two, during a flood); each later
        # one read and compared before its compare-and-set
        assert svc.kv_reads == svc.published + svc.publish_same - 1, (svc.kv_reads, svc.published)
    finally:
        await svc.stop()
    kv = await js.key_value(INCIDENTS_BUCKET)
    stored = json.loads((await kv.get(rec["job"])).value)
    assert stored["culprit"] == rec["culprit"]
    revision = (await kv.get(rec["job"])).revision
    # a replica that starts later (or replaces a lost one) rebuilds the same verdict from the stream, and
    # finds it in the KV already: one record per incident version, whoever publishes it (issue 21)
    svc2 = IncidentService([nats_server.url], debounce=0.02)
    await svc2.start()
    try:
        t0 = time.monotonic()
        while svc2.publish_same == 0 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.05)
        again = svc2.tracker.jobs[rec["job"]].published
        assert again is not None and again["culprit"] == rec["culprit"] and again["victims"] == rec["victims"]
        assert svc2.publish_same == 1 and svc2.published == 0 and not svc2._outbox
        assert svc2.kv_reads == 1  # its create found the key: read, the same version, left as it is
        await asyncio.sleep(0.5)
        assert got.empty(), "the same verdict published again"
        assert (await kv.get(rec["job"])).revision == revision
    finally:
        await svc2.stop()
        await nc.close()


class _AnswerLost:
    """The incidents KV as an election shows it: the first create is stored, its answer never arrives."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.lost = kv, 0

    async def create(self, key: str, value: bytes) -> int:
        rev = await self.kv.create(key, value)
        if not self.lost:
            self.lost += 1
            raise TimeoutError("nats: timeout")
        return int(rev)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def test_a_write_whose_answer_was_lost_is_still_announced(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """The record was stored but the answer lost (a leader changing): the retry finds its own version in the KV,
    writes nothing more, and announces it on the incident's subject -- nobody else did."""
    sc, msgs = await _messages(tmp_path, "ib_port_down_early")  # one finding: one version
    want = sc.expected[sc.jobs[0].comm_id]
    nc, js, got = await _fleet_bus(nats_server.url)
    svc = IncidentService([nats_server.url], debounce=0.02)
    await svc.start()
    try:
        svc._kv = lossy = _AnswerLost(await js.create_key_value(bucket=INCIDENTS_BUCKET, history=5))
        await _publish(js, [m for m in msgs if m["type"] == "NCCLJobMember" or _is_symptom_or_fault(m)])
        rec = await asyncio.wait_for(got.get(), 10)
        assert {k: rec["culprit"][k] for k in want} == want, rec
        assert lossy.lost == 1 and svc.publish_retries >= 1 and svc.publish_same >= 1, svc.stats()
        entry = await (await js.key_value(INCIDENTS_BUCKET)).get(rec["job"])
        assert json.loads(entry.value)["culprit"] == rec["culprit"]
    finally:
        await svc.stop()
        await nc.close()


async def test_spoofed_and_broken_messages_are_counted_not_used(tmp_path: Path,
                                                               nats_server: NatsServerProcess) -> None:
    _sc, msgs = await _messages(tmp_path, "healthy")
    nc, js, _got = await _fleet_bus(nats_server.url)
    svc = IncidentService([nats_server.url], debounce=0.02)
    await svc.start()
    try:
        member = next(m for m in msgs if m["type"] == "NCCLJobMember")
        finding = {**member, "collector": "gpu_devices", "type": "GPUMissing", "entity": "gpu:0000:17:00.0"}
        await js.publish(event_subject("someone-else", "gpu_devices", "critical"),
                         json.dumps(finding).encode())  # payload names another node
        # a job's NCCL messages on the events stream are read as the job's evidence on the jobs stream:
        # skipped here by their subject, never decoded (issue 21: partitions split reading)
        skipped = svc.skipped
        await js.publish(event_subject("someone-else", member["collector"], member["severity"]),
                         json.dumps(member).encode())
        await js.publish(event_subject("n1", "kmsg_xid", "critical"), b"{not json")
        job, node = member["details"]["job"], member["node"]
        await js.publish(job_subject(job, "someone-else", "member"), json.dumps(member).encode())
        await js.publish(job_subject("0xbad", node, "member"), json.dumps(member).encode())  # another job's subject
        for _ in range(100):
            if sum(svc.rejections.counts.values()) >= 4:
                break
            await asyncio.sleep(0.05)
        assert svc.rejections.counts.get("node_mismatch") == 2 and svc.rejections.counts.get("not_json") == 1
        assert svc.rejections.counts.get("job_mismatch") == 1 and svc.skipped == skipped + 1
        from fleet.wire import Rejected, decode_job

        with pytest.raises(Rejected, match="NCCLJobMember"):  # a fact on the evidence subject (other readers)
            decode_job(job_subject(job, node, "evidence"), json.dumps(member).encode())
        assert not svc.tracker.jobs
    finally:
        await svc.stop()
        await nc.close()


@pytest.mark.parametrize("fault", ["ib_port_down", "hung_rank"])
async def test_cordoner_acts_on_the_culprit_and_spares_the_victims(tmp_path: Path, nats_server: NatsServerProcess,
                                                                  monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """#15 deliver 4: with a rule that would cordon on any timeout, only the culprit's node is acted on;
    every victim's timeout is audited as spared (victim of the open incident). #20: the culprit becomes an
    IncidentCulprit trigger exactly when its record is actionable (a hardware culprit is, without the
    record's ``actionable`` field; a software-only one needs the correlator's ``"actionable": true``)."""
    import os
    import stat

    from agent.remediation.incidents import culprit_actionable
    from fleet.cordoner import Cordoner

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"  # a recording fake: the slurm plugin needs the binary to exist
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'argv.log'}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    sc, msgs = await _messages(tmp_path / "fleet", fault)
    culprit = sc.expected[sc.jobs[0].comm_id]
    assert culprit is not None
    cfg = configmod.parse('[remediations]\ncordon_with = "slurm"\n[[remediations.rules]]\nname = "cordon-on-timeout"\n'
                          'action = "cordon"\n[remediations.rules.match]\ntype = ["NCCLCollectiveTimeout"]\n'
                          'status = ["event"]\n', file="<t>").agent
    nc, js, got = await _fleet_bus(nats_server.url)
    audits: list[dict[str, Any]] = []

    async def on_audit(m: Any) -> None:
        audits.append(json.loads(m.data))

    await nc.subscribe("gna.actions.>", cb=on_audit)
    svc = IncidentService([nats_server.url], debounce=0.02)
    cord = Cordoner(cfg, [nats_server.url])
    await svc.start()
    await cord.start()
    try:
        await _publish(js, [m for m in msgs if m["type"] == "NCCLJobMember"])
        await asyncio.sleep(0.3)
        await _publish(js, [m for m in msgs if _is_symptom_or_fault(m)])
        timeouts = [m for m in msgs if m["type"] == "NCCLCollectiveTimeout"]
        records: list[dict[str, Any]] = []
        for _ in range(200):
            while not got.empty():
                records.append(got.get_nowait())
            acts = bool(records) and culprit_actionable(records[-1])
            if len([a for a in audits if a["trigger"]["type"] == "NCCLCollectiveTimeout"]) >= len(timeouts) and (
                    records and (not acts or any(a["trigger"]["type"] == "IncidentCulprit" for a in audits))):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # an IncidentCulprit that should not come has had its chance
    finally:
        await cord.stop()
        await svc.stop()
        await nc.close()
    # what the job's stall caused; a node's own unrelated fault (the scenario's noise: a storage NIC down,
    # an idle node's Xid 79) is still acted on, as it should be
    acted = [a for a in audits if a["decision"] in ("dry_run", "executed")
             and (a["trigger"]["type"].startswith("NCCL") or a["trigger"]["type"] == "IncidentCulprit")]
    assert acted and {a["node"] for a in acted} == {culprit["node"]}, [(a["node"], a["trigger"]["type"]) for a in acted]
    assert records and records[-1]["culprit"]["node"] == culprit["node"], records
    actionable = culprit_actionable(records[-1])
    if fault == "ib_port_down":
        assert actionable, records[-1]  # a NIC port of the culprit's own node: acted on
    # decided through the engine (a cooldown after the port's own IBPortDown drained the node is a decision too)
    culprit_audits = [a for a in audits if a["trigger"]["type"] == "IncidentCulprit"]
    assert bool(culprit_audits) == actionable, (records[-1], culprit_audits)
    assert {a["node"] for a in culprit_audits} <= {culprit["node"]}
    spared = [a for a in audits if a["decision"] == "skipped" and "victim of incident" in a["reason"]]
    victims = set(sc.jobs[0].nodes) - {culprit["node"]}
    assert {a["node"] for a in spared} == victims


async def test_the_cordoner_waits_for_a_verdict_only_for_messages_that_would_cordon(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's NCCL message no rule would cordon on (the default policy ignores timeouts) is decided at once:
    500 jobs' symptoms never stall the consumer for 500 x the grace period. A finding about the node's own
    resources (socket fallback) never waits either, though a rule cordons on it: no verdict can spare it
    (agent/remediation/incidents.py). A victim's symptom that a rule cordons on waits, once per job."""
    import os
    import stat

    from agent.remediation.engine import Engine
    from fleet.cordoner import Cordoner

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    from agent.remediation.loader import load_plugins
    from gna_sdk.hostroot import HostRoot

    cfg = configmod.parse('[remediations]\ncordon_with = "slurm"\n', file="<t>").agent
    cord = Cordoner(cfg, ["nats://127.0.0.1:1"])

    async def audit(record: dict[str, Any]) -> None:
        return None

    cord.engine = Engine(cfg.remediations, load_plugins(cfg.remediations, HostRoot("/")).available, audit=audit)
    timeout = {"collector": "nccl_logs", "type": "NCCLCollectiveTimeout", "kind": "event", "severity": "critical",
               "node": "n1", "entity": "nccl:n1:1", "details": {"job": "0x1"}}
    t0 = time.monotonic()
    for i in range(500):
        await cord._await_verdict({**timeout, "details": {"job": f"0x{i:x}"}})
    assert time.monotonic() - t0 < 1.0
    fallback = {**timeout, "type": "NCCLSocketFallback", "kind": "condition", "status": "firing"}
    assert cord.engine.would_take_budget(fallback)  # the default policy cordons this one, and it does not wait
    t0 = time.monotonic()
    await cord._await_verdict(fallback)
    assert time.monotonic() - t0 < 0.5
    strict = configmod.parse('[remediations]\ncordon_with = "slurm"\n[[remediations.rules]]\nname = "t"\n'
                             'action = "cordon"\n[remediations.rules.match]\ntype = ["NCCLCollectiveTimeout"]\n'
                             'status = ["event"]\n', file="<t>").agent
    cord.engine = Engine(strict.remediations, load_plugins(strict.remediations, HostRoot("/")).available, audit=audit)
    t0 = time.monotonic()
    await cord._await_verdict({**timeout, "details": {"job": "0xwait"}})
    assert time.monotonic() - t0 >= 2.5
    t0 = time.monotonic()
    await cord._await_verdict({**timeout, "details": {"job": "0xwait"}})  # its grace is spent: once per job
    assert time.monotonic() - t0 < 0.5


async def test_a_lost_replicas_partition_is_taken_over_and_handed_back(tmp_path: Path,
                                                                       nats_server: NatsServerProcess) -> None:
    """fleet/leases.py: replica A judges the job's partition; A dies without a word (no lease released);
    within the lease TTL replica B takes the partition over, replays the membership it had dropped, and
    publishes the incident when the port goes down. When A is back, B hands the partition back."""
    from fleet.incidents import owner

    sc, msgs = await _messages(tmp_path, "ib_port_down")
    want = sc.expected[sc.jobs[0].comm_id]
    p = owner(sc.jobs[0].comm_id, 2)
    nc, js, got = await _fleet_bus(nats_server.url)
    a = IncidentService([nats_server.url], partitions=2, partition=p, lease_ttl=1.5, debounce=0.02)
    b = IncidentService([nats_server.url], partitions=2, partition=1 - p, lease_ttl=1.5, debounce=0.02)
    await a.start()
    await b.start()
    a2: IncidentService | None = None
    try:
        assert a.leases is not None and b.leases is not None
        assert set(a.leases.held) == {p} and set(b.leases.held) == {1 - p}
        await _publish(js, [m for m in msgs if m["type"] == "NCCLJobMember"])
        await asyncio.sleep(0.3)
        assert sc.jobs[0].comm_id in a.tracker.jobs and sc.jobs[0].comm_id not in b.tracker.jobs
        for t in a._tasks:  # a crash: no lease handed back, no alive key removed
            t.cancel()
        await asyncio.wait(a._tasks, timeout=5)
        await a.nc.close()
        t0 = time.monotonic()
        while p not in b.leases.held and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.1)
        assert p in b.leases.held and b.leases.takeovers == 1, "B did not take the lost partition over"
        for _ in range(100):
            if sc.jobs[0].comm_id in b.tracker.jobs:
                break
            await asyncio.sleep(0.05)
        assert sc.jobs[0].comm_id in b.tracker.jobs, "the membership history was not replayed"
        await _publish(js, [m for m in msgs if _is_symptom_or_fault(m)])
        rec = await asyncio.wait_for(got.get(), 10)
        assert {k: rec["culprit"][k] for k in want} == want, rec
        a2 = IncidentService([nats_server.url], partitions=2, partition=p, lease_ttl=1.5, debounce=0.02)
        await a2.start()
        t0 = time.monotonic()
        while (p in b.leases.held or a2.leases is None or p not in a2.leases.held) and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.1)
        assert a2.leases is not None and p in a2.leases.held and p not in b.leases.held
        assert sc.jobs[0].comm_id not in b.tracker.jobs  # B forgot what it no longer judges
    finally:
        await b.stop()
        if a2 is not None:
            await a2.stop()
        await nc.close()
