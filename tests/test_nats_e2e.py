"""End to end against a real nats-server (JetStream on) started by the tests on a loopback port."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import nats

from agent.nats_server import NatsServerProcess
from gna_types.subjects import encode_token
from sim.host import SimHost
from tests.conftest import (
    AGENT_CMD,
    agent_config,
    install_plugin_dist,
    python_env,
    running_agent,
    stream_messages,
    validate_message,
)


async def _wait(pred, timeout: float = 15.0, step: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)


async def test_roundtrip_condition_kv_and_heartbeat(tmp_path: Path, nats_server: NatsServerProcess,
                                                    sim_host: SimHost) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=sim_host.root,
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    nc = await nats.connect(nats_server.url)
    beats: list[dict[str, object]] = []

    async def on_beat(msg: nats.aio.msg.Msg) -> None:
        beats.append(json.loads(msg.data))

    await nc.subscribe(f"gna.heartbeat.{encode_token('node-a.example.com')}", cb=on_beat)
    async with running_agent(cfg) as agent:
        await asyncio.sleep(1.0)
        sim_host.remove_dev_node("nvidia5")
        await asyncio.sleep(1.0)  # several passes: still one firing message
        sim_host.add_dev_node("nvidia5")
        await asyncio.sleep(0.8)
        assert agent.forwarder is not None
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0)
        kv = await nc.jetstream().key_value("gna-nodes")
        state = json.loads((await kv.get(encode_token("node-a.example.com"))).value)
    msgs = await stream_messages(nats_server.url)
    gpu = [m for m in msgs if m["type"] == "GPUDevicesMissing"]
    assert [m["status"] for m in gpu] == ["firing", "resolved"]
    assert gpu[0]["entity"] == "gpu:0000:ab:00.0" and gpu[0]["node"] == "node-a.example.com"
    for m in msgs:
        validate_message(m)
    assert state["node"] == "node-a.example.com" and state["conditions"] == []
    assert len(beats) >= 2 and beats[0]["agent_version"]
    await nc.close()


async def test_kv_holds_active_conditions(tmp_path: Path, nats_server: NatsServerProcess, sim_host: SimHost) -> None:
    sim_host.remove_dev_node("nvidiactl")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=sim_host.root,
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg):
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        deadline = time.monotonic() + 10
        state: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                kv = await js.key_value("gna-nodes")
                state = json.loads((await kv.get(encode_token("node-a.example.com"))).value)
                if state["conditions"]:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.1)
        await nc.close()
    conds = state["conditions"]
    assert isinstance(conds, list) and [c["type"] for c in conds] == ["NvidiaControlDeviceMissing"]


async def test_outage_5000_events_arrive_exactly_once_in_order(tmp_path: Path,
                                                              nats_server: NatsServerProcess) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url])
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        em = agent.emitter_for("burst")
        await em.event("BurstEvent", severity="info", entity="burst:pre", reason="Test", message="before")
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0)
        nats_server.stop()
        for i in range(5000):
            assert await em.event("BurstEvent", severity="warning", entity=f"burst:{i}", reason="Test",
                                  message=f"event {i}", details={"n": i})
        assert agent.spool is not None and agent.spool.depth == 5000
        nats_server.start()
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0, timeout=60)
    msgs = [m for m in await stream_messages(nats_server.url, expect=5001) if m["type"] == "BurstEvent"]
    ns = [m["details"]["n"] for m in msgs if "n" in m["details"]]
    assert ns == list(range(5000)), "all 5,000 exactly once, in order"
    assert len({m["id"] for m in msgs}) == len(msgs)


async def test_spool_full_policy_applied_counted_and_announced(tmp_path: Path,
                                                               nats_server: NatsServerProcess) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url],
                       extra="[spool]\nmax_bytes = 65536\nsegment_bytes = 8192\n")
    async with running_agent(cfg) as agent:
        assert agent.link is not None and agent.spool is not None
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        nats_server.stop()
        em = agent.emitter_for("burst")
        accepted_crit = 0
        for i in range(1500):
            sev = "critical" if i % 50 == 0 else "info"
            ok = await em.event("BurstEvent", severity=sev, entity=f"burst:{i}", reason="Test",  # type: ignore[arg-type]
                                message=f"event {i}", details={"n": i})
            accepted_crit += ok and sev == "critical"
        assert accepted_crit == 30
        dropped_info = agent.spool.dropped[0]
        assert dropped_info > 0 and agent.spool.dropped[2] == 0
        agent.refresh_metrics()
        text = agent.metrics.render().decode()
        assert 'gna_spool_dropped_total{severity="info"}' in text
        nats_server.start()
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0 and not any(
            agent.spool.unannounced_drops()), timeout=30)
    msgs = await stream_messages(nats_server.url)
    overflow = [m for m in msgs if m["type"] == "SpoolOverflow"]
    assert len(overflow) == 1
    assert overflow[0]["details"]["dropped"]["info"] == dropped_info
    assert overflow[0]["collector"] == "agent" and overflow[0]["severity"] == "warning"
    crit = [m for m in msgs if m["type"] == "BurstEvent" and m["severity"] == "critical"]
    assert len(crit) == 30, "no critical message was dropped"


async def test_metrics_and_healthz_endpoints(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url])
    async with running_agent(cfg) as agent:
        assert agent.metrics_server is not None and agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        base = f"http://127.0.0.1:{agent.metrics_server.port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200
        for name in ("gna_collector_runs_total", "gna_spool_depth", "gna_nats_connected 1.0",
                     "gna_bus_queue_depth", "gna_nats_publish_latency_seconds_bucket"):
            assert name in body, name
        status, body = await asyncio.to_thread(get, "/healthz")
        assert status == 200 and body.strip() == "ok"
        assert (await asyncio.to_thread(get, "/nope"))[0] == 404


def _stream_burst(url: str) -> list[dict[str, object]]:
    return [m for m in asyncio.run(stream_messages(url)) if m["type"] == "BurstEvent"]


def test_sigkill_mid_burst_loses_nothing_and_dedups(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    site = install_plugin_dist(tmp_path / "site")
    accepted = tmp_path / "accepted.txt"
    cfg = tmp_path / "agent.toml"
    (tmp_path / "empty").mkdir()  # an existing host root with nothing in it
    cfg.write_text(f'node = "killme"\nhost_root = "{tmp_path / "empty"}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[nats]\nservers = ["{nats_server.url}"]\n[metrics]\nlisten = ""\n'
                   f'[collectors.burst]\ntotal = 3000\naccepted_file = "{accepted}"\n')
    env = python_env(site)
    cmd = [*AGENT_CMD, "run", "--config", str(cfg)]
    kills = 0
    while True:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = 3000 if kills == 3 else 600 * (kills + 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = len(accepted.read_text().split()) if accepted.exists() else 0
            if n >= min(target, 3000):
                break
            time.sleep(0.02)
        if kills < 3:
            proc.send_signal(signal.SIGKILL)  # mid-burst: spool has accepted but unpublished records
            proc.wait()
            kills += 1
            continue
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        break
    accepted_ns = [int(x) for x in accepted.read_text().split()]
    assert accepted_ns == list(range(3000))
    msgs = _stream_burst(nats_server.url)
    ids = [str(m["id"]) for m in msgs]
    assert len(ids) == len(set(ids)), "re-sent records were de-duplicated by Nats-Msg-Id"
    seen = {m["details"]["n"] for m in msgs}  # type: ignore[index]
    assert set(accepted_ns) <= seen, "every accepted event reached the stream"
    assert kills == 3


async def test_resend_after_lost_ack_pointer_is_deduplicated(tmp_path: Path,
                                                             nats_server: NatsServerProcess) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url])
    async with running_agent(cfg) as agent:
        em = agent.emitter_for("burst")
        for i in range(100):
            await em.event("BurstEvent", severity="warning", entity=f"burst:{i}", reason="Test",
                           message=f"event {i}", details={"n": i})
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0)
    # a crash right after publishing, before the ack pointer hit the disk
    state = tmp_path / "state" / "spool" / "state.json"
    data = json.loads(state.read_text())
    data["acked_seq"] = 0
    state.write_text(json.dumps(data))
    async with running_agent(agent_config(tmp_path, servers=[nats_server.url])) as agent2:
        await _wait(lambda: agent2.forwarder is not None and agent2.forwarder.published >= 100)
        assert agent2.forwarder is not None and agent2.forwarder.duplicates == 100
    msgs = [m for m in await stream_messages(nats_server.url) if m["type"] == "BurstEvent"]
    assert len(msgs) == 100


async def test_a_flipped_byte_mid_segment_costs_one_record_and_is_announced(tmp_path: Path,
                                                                           nats_server: NatsServerProcess) -> None:
    """#13 D10: 1,000 spooled events, one flipped byte in the middle: 999 arrive, SpoolCorrupted says so."""
    from agent.message import encode, make_message
    from agent.spool import Spool
    from gna_types.subjects import event_subject

    state = tmp_path / "state"
    sp = Spool(state / "spool", fsync=False, segment_bytes=16 << 20)
    sp.open()
    for i in range(1000):
        m = make_message(node="node-a.example.com", collector="burst", kind="event", type="BurstEvent",
                         severity="warning", entity=f"burst:{i}", reason="Test", message=f"event {i}",
                         details={"n": i})
        await sp.append("warning", b"%s\n%s\n%s" % (event_subject(m.node, m.collector, m.severity).encode(),
                                                     m.id.encode(), encode(m)))
    sp.close()
    (seg,) = (state / "spool").glob("*.seg")
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    cfg = agent_config(tmp_path, servers=[nats_server.url])
    async with running_agent(cfg) as agent:
        assert agent.spool is not None and agent.spool.corruption["records"] == 1
        await _wait(lambda: agent.spool is not None and agent.spool.depth == 0, timeout=30)
    msgs = await stream_messages(nats_server.url)
    assert len([m for m in msgs if m["type"] == "BurstEvent"]) == 999
    (c,) = [m for m in msgs if m["type"] == "SpoolCorrupted"]
    assert c["details"]["records"] == 1 and c["details"]["bytes"] > 0 and c["severity"] == "warning"
