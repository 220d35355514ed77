"""Shared fixtures: a real nats-server on a free loopback port, simulated host roots, agent helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest

from agent import config as configmod
from agent import natsclient
from agent.daemon import Agent
from agent.nats_server import NatsServerProcess
from sim.host import SimHost

pytest_plugins = ["tests.host_guard"]  # nothing left in the temporary directory or the kernel log

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "agent" / "schema" / "message.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


class Sink:
    """Records what a collector emits; ``accept = False`` makes it refuse like a full spool."""

    def __init__(self) -> None:
        from agent.message import Message

        self.messages: list[Message] = []
        self.accept = True

    async def __call__(self, m: Any) -> bool:
        if self.accept:
            self.messages.append(m)
        return self.accept

    def of(self, type_: str) -> list[Any]:
        return [m for m in self.messages if m.type == type_]


class Clock:
    """A settable clock (``t``, s) for code that takes a ``clock`` callable."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def validate_message(data: dict[str, Any]) -> None:
    VALIDATOR.validate(data)


@pytest.fixture(autouse=True)
def _no_connection_watch_left_behind() -> Iterator[None]:
    """A NATS connection watch belongs to a task and the tasks it starts (agent.natsclient.watching).
    One made by a synchronous caller lands in the thread's root context, and every later test's tasks
    would share it (CI once failed in test_liveness on a watch holding another test's twelve clients):
    the test that leaves one behind fails itself, and the next starts clean."""
    before = natsclient._current.get()
    yield
    after = natsclient._current.get()
    if after is not before:
        natsclient._current.set(before)
        pytest.fail("this test left a NATS connection watch in the thread's root context "
                    "(natsclient.watching() called outside a task)")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(tmp_path / "nats-server")
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def sim_host(tmp_path: Path) -> SimHost:
    return SimHost.gpu_node(tmp_path / "host", gpus=8)


def agent_config(tmp_path: Path, *, servers: list[str], host_root: Path | None = None, extra: str = "",
                 node: str = "node-a.example.com") -> configmod.Config:
    text = f"""
node = "{node}"
host_root = "{host_root or tmp_path / 'empty-host'}"
state_dir = "{tmp_path / 'state'}"
shutdown_timeout = 5.0
[nats]
servers = {json.dumps(servers)}
heartbeat_interval = 0.5
publish_timeout = 2.0
[metrics]
listen = "127.0.0.1:0"
{extra}
"""
    return configmod.parse(text, file="<test>")


@contextlib.asynccontextmanager
async def running_agent(cfg: configmod.Config) -> AsyncIterator[Agent]:
    agent = Agent(cfg)
    task = asyncio.get_running_loop().create_task(agent.run())
    for _ in range(500):
        if agent.bus is not None and agent.runners is not None and agent.forwarder is not None:
            break
        await asyncio.sleep(0.01)
    try:
        yield agent
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 20)


async def stream_messages(url: str, subject: str = "gna.events.>", *, expect: int | None = None,
                          timeout: float = 20.0, stream: str = "GNA_EVENTS") -> list[dict[str, Any]]:
    """Everything stored in the stream under ``subject`` (waits until ``expect`` are there)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                count = (await js.stream_info(stream)).state.messages
            except (nats.errors.TimeoutError, TimeoutError):  # a leader election after a server was lost
                if loop.time() > deadline + 30:
                    raise
                count = -1
            target = 0 if expect is None else expect
            if count >= target or loop.time() > deadline:
                break
            await asyncio.sleep(0.1)
        while True:
            try:  # right after a cluster lost a server the stream may still be electing a leader
                sub = await js.pull_subscribe(subject, durable=None, stream=stream)
                break
            except (nats.errors.TimeoutError, TimeoutError):
                if loop.time() > deadline + 30:
                    raise
                await asyncio.sleep(0.5)
        out: list[dict[str, Any]] = []
        while True:
            try:
                batch = await sub.fetch(1000, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either at the end
                break
            for m in batch:
                out.append(json.loads(m.data))
                await m.ack()
        return out
    finally:
        await nc.close()


def python_env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return env


AGENT_CMD = [sys.executable, "-m", "agent"]


PLUGIN_ENTRY_POINTS = {
    "burst_plugin": ["burst = burst_plugin:BurstCollector"],
    "stubborn_plugin": ["stubborn = stubborn_plugin:StubbornCollector",
                        "blocking = stubborn_plugin:BlockingCollector"],
}


def install_plugin_dist(site: Path, module: str = "burst_plugin") -> Path:
    """Make tests/plugins/<module>.py discoverable as an installed third-party distribution."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text((ROOT / "tests" / "plugins" / f"{module}.py").read_text())
    name = f"gna_{module}"
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gpu_node_agent.collectors]\n" + "\n".join(PLUGIN_ENTRY_POINTS[module])
                                           + "\n")
    return site
