"""Issue 21: the correlator survives its own cluster. A routed 3-node JetStream cluster with R3 streams
(the shipped stream settings, agent/nats_link.stream_configs), three partitioned correlator replicas,
background traffic; each nats-server is SIGKILLed in turn (and started again), then a correlator
replica is killed without a word: every fault published after a loss gets its incident, with the
right culprit, once (one record per incident version in the gna-incidents KV).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.config import NatsConfig
from agent.message import make_message, to_dict
from agent.nats_link import stream_configs
from agent.nats_server import NatsCluster
from fleet.incident_service import IncidentService, incident_versions
from fleet.incidents import owner
from gna_types.subjects import subjects_for
from sim.scenarios import generate

PARTITIONS = 3


async def _retry(what: str, make: Any, timeout: float = 40.0) -> Any:
    t0 = time.monotonic()
    while True:
        try:
            return await make()
        except Exception:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{what}: not within {timeout} s") from None
            await asyncio.sleep(0.3)


async def _publish(js: Any, msgs: list[dict[str, Any]]) -> None:
    for m in msgs:
        for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
            data = json.dumps(m).encode()
            await _retry(f"publish {subject}", lambda s=subject, d=data, i=m["id"]: js.publish(
                s, d, headers={"Nats-Msg-Id": f"{i}:{s}"}, timeout=2.0))


class Fault:
    """One job on its own nodes with one IB port down (every rank times out): the culprit is the port."""

    def __init__(self, tmp: Path, seed: int) -> None:
        self.sc = generate(tmp / f"s{seed}", seed=seed, nodes=3, fault="ib_port_down", job_nodes=3, second_job=False)
        self.job = self.sc.jobs[0].comm_id
        self.want = self.sc.expected[self.job]
        self.partition = owner(self.job, PARTITIONS)

    async def publish(self, js: Any) -> None:
        msgs = await self.sc.messages()
        await _publish(js, [m for m in msgs if m["type"] == "NCCLJobMember"])
        await _publish(js, sorted((m for m in msgs if m["type"] != "NCCLJobMember"), key=lambda m: m["time"]))


def _faults(tmp: Path, seeds: range, partition: int | None = None) -> list[Fault]:
    out = []
    for seed in seeds:
        f = Fault(tmp, seed)
        if partition is None or f.partition == partition:
            out.append(f)
    return out


async def _incident(got: dict[str, list[dict[str, Any]]], f: Fault, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for rec in got.get(f.job, []):
            if rec["status"] == "open" and rec.get("culprit"):
                return rec
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {f.job} (partition {f.partition}): no incident within {timeout} s")


async def _noise(js: Any, stop: asyncio.Event) -> None:
    """Background load: node-level info events on the events stream (what every agent sends)."""
    i = 0
    while not stop.is_set():
        m = to_dict(make_message(node=f"busy-{i % 50:03d}", collector="kernel_modules", kind="event",
                                 type="KernelModuleLoaded", severity="info", entity="nvidia_peermem",
                                 reason="Loaded", message="nvidia_peermem loaded"))
        for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
            with contextlib.suppress(Exception):
                await js.publish(subject, json.dumps(m).encode(), timeout=1.0)
        i += 1
        await asyncio.sleep(0.01)


async def _start(cluster: NatsCluster, tmp: Path) -> tuple[Any, Any, dict[str, list[dict[str, Any]]]]:
    nc = await nats.connect(cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2)
    js = nc.jetstream(timeout=5)
    for cfg in stream_configs(NatsConfig(stream_replicas=3)):
        await _retry(f"stream {cfg.name}", lambda c=cfg: js.add_stream(c), timeout=60)
    got: dict[str, list[dict[str, Any]]] = {}

    async def on_incident(msg: Any) -> None:
        rec = json.loads(msg.data)
        got.setdefault(rec["job"], []).append(rec)

    await nc.subscribe("gna.incidents.>", cb=on_incident)
    return nc, js, got


def _replica(cluster: NatsCluster, p: int) -> IncidentService:
    return IncidentService(cluster.urls, nats_cfg=NatsConfig(stream_replicas=3), partitions=PARTITIONS, partition=p,
                           debounce=0.02, stats_interval=5.0)


async def _die(svc: IncidentService) -> None:
    """A replica's death (SIGKILL): no lease handed back, no goodbye."""
    for t in svc._tasks:
        t.cancel()
    await asyncio.gather(*svc._tasks, return_exceptions=True)
    with contextlib.suppress(Exception):
        await svc.nc.close()


def _no_duplicate_versions(versions: list[dict[str, Any]]) -> None:
    keys = [(v["status"], json.dumps(v.get("culprit"), sort_keys=True), tuple(v.get("victims") or ()),
             v.get("evidence_total")) for v in versions]
    assert len(keys) == len(set(keys)), f"a version written twice: {keys}"


@pytest.mark.parametrize("killed", [(0,), pytest.param((0, 1, 2), marks=pytest.mark.slow)])
async def test_every_fault_after_each_server_loss_gets_its_incident(tmp_path: Path, killed: tuple[int, ...]) -> None:
    """Default run: one server lost and back (keeps the suite under CI's 10 minutes); the slow run loses each
    of the three in turn."""
    cluster = NatsCluster(tmp_path / "cluster", size=3)
    cluster.start()
    replicas: list[IncidentService] = []
    stop = asyncio.Event()
    noise = None
    nc = None
    try:
        nc, js, got = await _start(cluster, tmp_path)
        replicas = [_replica(cluster, p) for p in range(PARTITIONS)]
        for r in replicas:
            await r.start()
        noise = asyncio.ensure_future(_noise(js, stop))
        faults = _faults(tmp_path, range(100, 112))
        assert {f.partition for f in faults} == set(range(PARTITIONS)), "the seeds must cover every partition"
        before = faults[0]
        await before.publish(js)
        await _incident(got, before, 15)
        for i in killed:
            server = cluster.servers[i]
            server.stop(kill=True)
            after = faults[1 + 2 * i: 3 + 2 * i]  # two faults, other partitions, while the server is gone
            for f in after:
                await f.publish(js)
            for f in after:
                rec = await _incident(got, f, 30)
                assert {k: rec["culprit"][k] for k in f.want} == f.want, rec
            server.start()
            back = faults[7 + i]
            await back.publish(js)
            rec = await _incident(got, back, 30)
            assert {k: rec["culprit"][k] for k in back.want} == back.want, rec
        # no replica went deaf: each still follows both streams, none gave up
        for r in replicas:
            assert not r.watch.closed.is_set(), r.watch.reason
            assert all(f.resubscribes + f.failures >= 0 for f in r.followers)
        for f in [before, *(f for i in killed for f in (*faults[1 + 2 * i: 3 + 2 * i], faults[7 + i]))]:
            _no_duplicate_versions(await incident_versions(js, f.job))
    finally:
        stop.set()
        if noise is not None:
            await asyncio.gather(noise, return_exceptions=True)
        for r in replicas:
            await r.stop()
        if nc is not None:
            await nc.close()
        cluster.stop(kill=True)


@pytest.mark.slow
async def test_a_killed_replica_and_a_server_together_fail_over_in_seconds_without_duplicates(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "cluster", size=3)
    cluster.start()
    replicas: dict[int, IncidentService] = {}
    nc = None
    try:
        nc, js, got = await _start(cluster, tmp_path)
        for p in range(PARTITIONS):
            replicas[p] = _replica(cluster, p)
            await replicas[p].start()
        victim = 1
        faults = _faults(tmp_path, range(200, 260), partition=victim)[:3]
        await faults[0].publish(js)
        first = await _incident(got, faults[0], 15)
        await asyncio.sleep(2.5)  # the survivors have seen the victim's replica alive
        await _die(replicas.pop(victim))
        cluster.servers[0].stop(kill=True)
        t0 = time.monotonic()
        await faults[1].publish(js)
        await _incident(got, faults[1], 30)
        failover = time.monotonic() - t0
        cluster.servers[0].start()
        replicas[victim] = _replica(cluster, victim)  # the replica returns and takes its partition back
        await replicas[victim].start()
        t0 = time.monotonic()
        while not (replicas[victim].leases and victim in replicas[victim].leases.held) and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.2)
        await faults[2].publish(js)
        await _incident(got, faults[2], 30)
        await asyncio.sleep(2.0)
        for f in faults:
            _no_duplicate_versions(await incident_versions(js, f.job))
        versions = await incident_versions(js, faults[0].job)
        assert versions[0]["culprit"] == first["culprit"]
        assert failover < 15, f"failover took {failover:.1f} s"
    finally:
        for r in replicas.values():
            await r.stop()
        if nc is not None:
            await nc.close()
        cluster.stop(kill=True)
