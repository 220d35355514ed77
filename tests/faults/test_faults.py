"""Fault injection: NATS restarts, a 3-node cluster losing a server, SIGKILL storms, a full spool
filesystem, per-node credentials and subject permissions, bounded fuzzing. The longest ones carry
the ``slow`` marker (``make test-slow``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.nats_server import NatsServerProcess, free_port
from tests.conftest import AGENT_CMD, agent_config, install_plugin_dist, python_env, running_agent, stream_messages


async def _emit(agent: Any, i: int, sev: str = "warning") -> bool:
    return bool(await agent.emitter_for("burst").event("BurstEvent", severity=sev, entity=f"burst:{i}",  # type: ignore[arg-type]
                                                       reason="Fault", message=f"event {i}", details={"n": i}))


async def _drained(agent: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while agent.spool.depth and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert agent.spool.depth == 0, f"{agent.spool.depth} still spooled"


# restarts under a steady stream: in the default run by tests/test_nats_e2e.py's SIGKILL/outage cases and
# tests/test_follow.py's resume after a kill; the long runs here with the slow marker (CI's 10-minute budget)
@pytest.mark.parametrize("restarts", [pytest.param(8, marks=pytest.mark.slow), pytest.param(20, marks=pytest.mark.slow)])
async def test_nats_restarted_many_times_during_a_steady_stream(tmp_path: Path, nats_server: NatsServerProcess,
                                                                restarts: int) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url])
    async with running_agent(cfg) as agent:
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        stop = asyncio.Event()
        sent = 0

        async def stream() -> None:
            nonlocal sent
            while not stop.is_set():
                assert await _emit(agent, sent)
                sent += 1
                await asyncio.sleep(0.004)

        task = asyncio.create_task(stream())
        for _ in range(restarts):
            await asyncio.sleep(0.3)
            await asyncio.to_thread(nats_server.stop, kill=True)  # an abrupt restart, not a drain
            await asyncio.sleep(0.15)
            await asyncio.to_thread(nats_server.start)
        stop.set()
        await task
        await _drained(agent)
    msgs = [m for m in await stream_messages(nats_server.url, expect=sent) if m["type"] == "BurstEvent"]
    ns = [m["details"]["n"] for m in msgs]
    assert len(ns) == sent and sorted(ns) == list(range(sent)), "0 lost, 0 duplicated"
    assert ns == sorted(ns), "in order"
    assert sent > 50 * restarts


def _cluster(tmp: Path, n: int = 3) -> list[NatsServerProcess]:
    ports = [free_port() for _ in range(n)]
    servers = []
    for i in range(n):
        routes = ", ".join(f'"nats://127.0.0.1:{p}"' for j, p in enumerate(ports) if j != i)
        extra = f'cluster {{\n  name: "gna-test"\n  listen: "127.0.0.1:{ports[i]}"\n  routes: [{routes}]\n}}\n'
        servers.append(NatsServerProcess(tmp / f"n{i}", name=f"gna-{i}", extra_config=extra))
    for s in servers:
        s.start()
    return servers


@pytest.mark.slow  # a server lost from a 3-node cluster: tests/test_cluster_failover.py in the default run
async def test_three_node_cluster_loses_a_server_mid_stream(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        urls = [s.url for s in cluster]
        cfg = agent_config(tmp_path, servers=urls, extra="")
        cfg.agent.nats.stream_replicas = 3
        cfg.agent.nats.publish_timeout = 3.0
        deadline = time.monotonic() + 30
        async with running_agent(cfg) as agent:
            while not agent.link.stream_ready and time.monotonic() < deadline:  # R3 needs a meta leader
                await asyncio.sleep(0.2)
            assert agent.link.stream_ready, "the R3 stream was not created"
            for i in range(1500):
                assert await _emit(agent, i)
                if i == 500:
                    victim = next(s for s in cluster if f":{s.port}" in str(agent.link.nc.connected_url))
                    await asyncio.to_thread(victim.stop, kill=True)
                if i % 50 == 0:
                    await asyncio.sleep(0.01)
            await _drained(agent, timeout=90)
        alive = next(s for s in cluster if s.running())
        for attempt in range(30):  # the stream may still be electing a leader after the loss (503)
            try:
                read = await stream_messages(alive.url, expect=1500)
                break
            except nats.js.errors.ServiceUnavailableError:
                if attempt == 29:
                    raise
                await asyncio.sleep(1.0)
        msgs = [m for m in read if m["type"] == "BurstEvent"]
        ns = sorted(m["details"]["n"] for m in msgs)
        assert ns == list(range(1500)), f"{1500 - len(set(ns))} lost, {len(ns) - len(set(ns))} duplicated"
    finally:
        for s in cluster:
            s.stop(kill=True)


@pytest.mark.slow
def test_agent_sigkill_100_times_during_bursts(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    site = install_plugin_dist(tmp_path / "site")
    accepted = tmp_path / "accepted.txt"
    cfg = tmp_path / "agent.toml"
    total = 20000
    (tmp_path / "empty").mkdir()  # an existing host root with nothing in it
    cfg.write_text(f'node = "kill100"\nhost_root = "{tmp_path / "empty"}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[nats]\nservers = ["{nats_server.url}"]\n[metrics]\nlisten = ""\n'
                   f'[collectors.burst]\ntotal = {total}\naccepted_file = "{accepted}"\n')
    for kill in range(100):
        proc = subprocess.Popen([*AGENT_CMD, "run", "--config", str(cfg)], env=python_env(site),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.6 + (kill % 5) * 0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    proc = subprocess.Popen([*AGENT_CMD, "run", "--config", str(cfg), "--duration", "20"], env=python_env(site),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(60) == 0
    accepted_ns = {int(x) for x in accepted.read_text().split()}
    msgs = [m for m in asyncio.run(stream_messages(nats_server.url)) if m["type"] == "BurstEvent"]
    ids = [m["id"] for m in msgs]
    assert len(ids) == len(set(ids))
    assert accepted_ns <= {m["details"]["n"] for m in msgs}, "an accepted event was lost"


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


async def test_spool_filesystem_full(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    state = tmp_path / "state"
    if not _mount_tmpfs(state, "2m"):
        pytest.skip("cannot mount a small tmpfs here (needs CAP_SYS_ADMIN); the size-capped spool test covers "
                    "the policy (tests/test_nats_e2e.py)")
    try:
        # spool cap above the filesystem: the disk fills first (a misconfiguration the agent must survive)
        cfg = agent_config(tmp_path, servers=[nats_server.url],
                           extra="[spool]\nmax_bytes = 16777216\nsegment_bytes = 262144\n")
        async with running_agent(cfg) as agent:
            await asyncio.wait_for(agent.link.connected.wait(), 10)
            await asyncio.to_thread(nats_server.stop)
            results = [await _emit(agent, i) for i in range(12000)]
            accepted = [i for i, ok in enumerate(results) if ok]
            assert False in results, "the 2 MiB filesystem should have filled"
            assert agent.spool.write_errors > 0 and agent.bus.refused > 0
            ok, text = agent.health()
            assert not ok and "spool write errors" in text
            await asyncio.to_thread(nats_server.start)
            await _drained(agent, timeout=60)
            assert await _emit(agent, 99999), "writes resume once the backlog drained"
            await _drained(agent)
            ok, text = agent.health()
            assert ok and "recovered after" in text, "healthy again once writes succeed (no restart loop)"
        msgs = [m for m in await stream_messages(nats_server.url) if m["type"] == "BurstEvent"]
        got = {m["details"]["n"] for m in msgs}
        assert set(accepted) <= got, "every accepted event survived the full disk"
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _nkey() -> tuple[str, str]:
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(seed).public_key.decode()


async def test_per_node_nkeys_and_subject_permissions(tmp_path: Path) -> None:
    from gna_types.subjects import encode_token

    seeds = {}
    users = []
    for node in ("node-a", "node-b"):
        seed, pub = _nkey()
        seeds[node] = tmp_path / f"{node}.nk"
        seeds[node].write_text(seed + "\n")
        tok = encode_token(node)
        users.append(f'{{nkey: "{pub}", permissions: {{publish: {{allow: ["gna.events.{tok}.>", '
                     f'"gna.actions.{tok}.>", "gna.heartbeat.{tok}", "$JS.API.>", "$KV.gna-nodes.{tok}", '
                     f'"_INBOX.>"]}}, subscribe: {{allow: ["_INBOX_{tok}.>"]}}}}}}')  # its private inbox
    admin_seed, admin_pub = _nkey()
    users.append(f'{{nkey: "{admin_pub}"}}')
    server = NatsServerProcess(tmp_path / "nats-auth", extra_config="authorization { users: [" + ", ".join(users) + "] }")
    server.start()
    try:
        cfg = agent_config(tmp_path, servers=[server.url], node="node-a")
        cfg.agent.nats.nkey_seed = str(seeds["node-a"])
        async with running_agent(cfg) as agent:
            await asyncio.wait_for(agent.link.connected.wait(), 10)
            assert await _emit(agent, 1)
            await _drained(agent)
        # node A's credentials: publishing on node B's subject is refused by the server
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(server.url, nkeys_seed=str(seeds["node-a"]), error_cb=on_error)
        await nc.publish(f"gna.events.{encode_token('node-b')}.burst.warning", b"{}")
        await nc.flush()
        await asyncio.sleep(0.3)
        await nc.close()
        assert any("permissions violation" in e.lower() for e in errors), errors
        admin_file = tmp_path / "admin.nk"
        admin_file.write_text(admin_seed + "\n")
        msgs = await _stream_with_seed(server.url, admin_file)
        assert [(m["node"], m["type"]) for m in msgs] == [("node-a", "BurstEvent")]
    finally:
        server.stop(kill=True)


async def _stream_with_seed(url: str, seed: Path) -> list[dict[str, Any]]:
    nc = await nats.connect(url, nkeys_seed=str(seed))
    try:
        sub = await nc.jetstream().pull_subscribe("gna.events.>", stream="GNA_EVENTS")
        try:
            batch = await sub.fetch(100, timeout=2)
        except (nats.errors.TimeoutError, TimeoutError):
            batch = []
        return [json.loads(m.data) for m in batch]
    finally:
        await nc.close()


def test_parsers_fuzzed_for_a_bounded_time() -> None:
    """Every parser on random bytes for a bounded time with 0 crashes (hypothesis; atheris where installed)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.fuzz_targets import fuzz_one

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(max_size=4096))
    def run(data: bytes) -> None:
        fuzz_one(data)

    run()  # raises on the first crash, with the falsifying input
    if _atheris():
        r = subprocess.run([sys.executable, "-m", "tests.fuzz_targets", "-atheris_runs=20000"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]


def _atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True

