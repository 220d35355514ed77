from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from agent.nats_server import NatsServerProcess
from agent.simhost import SimHost
from tests.conftest import AGENT_CMD, agent_config, running_agent, validate_message


async def test_events_prints_json_lines_filtered(tmp_path: Path, nats_server: NatsServerProcess,
                                                 sim_host: SimHost) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=sim_host.root,
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        await agent.emitter_for("burst").event("BurstEvent", severity="info", entity="x", reason="T", message="m")
        proc = await asyncio.create_subprocess_exec(
            *AGENT_CMD, "events", "--nats", nats_server.url, "--node", "node-a.example.com",
            "--severity", "critical", "--count", "2", "--duration", "20",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        await asyncio.sleep(1.5)  # subscribed (deliver new)
        sim_host.remove_dev_node("nvidia1")
        sim_host.remove_dev_node("nvidia2")
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    lines = [json.loads(x) for x in out.decode().splitlines()]
    assert len(lines) == 2
    for m in lines:
        validate_message(m)
        assert m["severity"] == "critical" and m["type"] == "GPUDevicesMissing"
    assert {m["details"]["device_node"] for m in lines} == {"/dev/nvidia1", "/dev/nvidia2"}


def test_events_replays_history_with_all(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    async def emit() -> None:
        async with running_agent(agent_config(tmp_path, servers=[nats_server.url])) as agent:
            for i in range(3):
                await agent.emitter_for("burst").event("BurstEvent", severity="warning", entity=f"b{i}",
                                                       reason="T", message="m")
            while agent.spool is not None and agent.spool.depth:
                await asyncio.sleep(0.05)

    asyncio.run(emit())
    r = subprocess.run([*AGENT_CMD, "events", "--nats", nats_server.url, "--all", "--count", "3",
                        "--duration", "15"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert [json.loads(x)["entity"] for x in r.stdout.splitlines()] == ["b0", "b1", "b2"]
