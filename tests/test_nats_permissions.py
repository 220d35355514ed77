"""#13: the account/permission layout of fleet/nats_permissions.py, enforced by a real nats-server
started with the rendered config and nkeys generated here. Every role runs its real code path
(the agent, FleetFeed, `events`, the cordoner, the budget) and the server must log no violation for
it; every forbidden action must be refused and leave the stream untouched."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from agent.config import NatsConfig
from agent.nats_server import NatsServerProcess, find_nats_server, free_port
from fleet.nats_permissions import (
    Layout,
    Roles,
    ServerSettings,
    load_layout,
    new_user_seed,
    node_permissions,
    render_config,
)
from gna_types.subjects import encode_token, event_subject, heartbeat_subject, validate_subject
from tests.conftest import ROOT, agent_config, running_agent

NODE_A, NODE_B = "node-a.example.com", "node-b.example.com"
ROLES = ("a", "b", "cordoner", "reader", "admin", "correlator", "exporter")
DENIED_WAIT = 0.5  # a refused request gets no reply: how long to wait for one


class RenderedServer(NatsServerProcess):
    """nats-server started with exactly the rendered config (no extra settings of the base class)."""

    def __init__(self, store_dir: Path, layout: Layout) -> None:
        super().__init__(store_dir, port=int(layout.server.listen.rsplit(":", 1)[1]))
        self.layout = layout

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(render_config(self.layout))
        return conf

    def violations(self) -> list[str]:
        text = (self.store_dir / "nats-server.log").read_text(errors="replace")
        return [line for line in text.splitlines() if "Violation" in line]


@dataclass
class Fleet:
    server: RenderedServer
    seeds: dict[str, Path]
    keys: dict[str, str]
    errors: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def cfg(self, who: str) -> NatsConfig:
        return NatsConfig(servers=[self.url], nkey_seed=str(self.seeds[who]), connect_timeout=5)

    async def connect(self, who: str) -> Client:
        async def on_error(exc: Exception) -> None:
            self.errors.append(f"{who}: {exc}")

        # the private reply inbox the agent and the central tools use (agent.nats_link.connect_options)
        inbox = {"a": encode_token(NODE_A), "b": encode_token(NODE_B)}.get(who, who)
        return await nats.connect(self.url, nkeys_seed=str(self.seeds[who]), error_cb=on_error,
                                  allow_reconnect=False, inbox_prefix=f"_INBOX_{inbox}")

    def violations_of(self, who: str) -> list[str]:
        return [v for v in self.server.violations() if self.keys[who] in v]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    seeds, keys = {}, {}
    for who in ROLES:
        seed, public = new_user_seed()
        seeds[who] = tmp_path / f"{who}.nk"
        seeds[who].write_text(seed + "\n")
        seeds[who].chmod(0o600)
        keys[who] = public
    layout = Layout(server=ServerSettings(listen=f"127.0.0.1:{free_port()}", store_dir=str(tmp_path / "js")),
                    nodes={NODE_A: keys["a"], NODE_B: keys["b"]},
                    roles=Roles(cordoner=[keys["cordoner"]], readers=[keys["reader"]], admins=[keys["admin"]],
                                correlators=[keys["correlator"]], exporters=[keys["exporter"]]))
    server = RenderedServer(tmp_path / "nats", layout)
    server.start()
    yield Fleet(server, seeds, keys)
    server.stop(kill=True)


async def set_up(nc: Client) -> list[Any]:
    """The admin step (`gpu-node-agent nats setup`) with the default names: every stream and bucket."""
    from agent import config as configmod
    from fleet.nats_setup import setup, wanted

    return await setup(nc.jetstream(), wanted(configmod.parse("", file="<test>").agent))


@pytest.fixture
async def admin(fleet: Fleet) -> AsyncIterator[Any]:
    """The admin, after it ran the admin step: no other role may create a stream or bucket (#20)."""
    nc = await fleet.connect("admin")
    assert {o.status for o in await set_up(nc)} == {"created"}
    yield nc
    await nc.close()


async def _stored(admin_nc: Any, subject: str) -> int:
    info = await admin_nc.jetstream().stream_info("GNA_EVENTS", subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def _denied(coro: Any) -> None:
    with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
        await asyncio.wait_for(coro, DENIED_WAIT * 2)


async def _emit_as_node_a(tmp_path: Path, fleet: Fleet, entity: str, admin_nc: Any) -> None:
    """The real agent, node A's seed: one event, drained to JetStream, and its state in the KV bucket."""
    cfg = agent_config(tmp_path, servers=[fleet.url], node=NODE_A)
    cfg.agent.nats.nkey_seed = str(fleet.seeds["a"])
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 15)
        assert await agent.emitter_for("burst").event("BurstEvent", severity="warning", entity=entity,
                                                      reason="T", message="as node A")
        for _ in range(300):
            if agent.spool is not None and agent.spool.depth == 0 and await _has_state(admin_nc, NODE_A):
                break
            await asyncio.sleep(0.05)
        assert agent.spool is not None and agent.spool.depth == 0, "node A's events did not reach JetStream"
        assert await _has_state(admin_nc, NODE_A), "node A's state did not reach the KV bucket"


async def _has_state(admin_nc: Any, node: str) -> bool:
    try:
        kv = await admin_nc.jetstream().key_value("gna-nodes")
        return bool((await kv.get(encode_token(node))).value)
    except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return False


async def test_agent_as_node_a_publishes_and_readers_read(tmp_path: Path, fleet: Fleet, admin: Any,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """(a) The real agent with node A's seed verifies the streams and bucket the admin created, publishes events,
    heartbeats and its KV state with no violation; the dashboard's feed and `events` read all of it as a reader."""
    from fleet.events import EventsQuery, run_events
    from fleet.state import FleetFeed, FleetState

    reader = await fleet.connect("reader")
    beats: list[str] = []

    async def on_beat(msg: Any) -> None:
        beats.append(msg.subject)

    await reader.subscribe("gna.heartbeat.>", cb=on_beat)
    await reader.flush()

    await _emit_as_node_a(tmp_path, fleet, "perm-a", admin)

    token = encode_token(NODE_A)
    assert await _stored(admin, f"gna.events.{token}.>") >= 1
    assert heartbeat_subject(NODE_A) in beats
    kv = await admin.jetstream().key_value("gna-nodes")
    assert json.loads((await kv.get(token)).value)["node"] == NODE_A

    state = FleetState()
    feed = FleetFeed(state, [fleet.url], nats_cfg=fleet.cfg("reader"))
    await feed.start()
    try:
        for _ in range(100):
            nv = state.nodes.get(NODE_A)
            if nv is not None and any(e.get("entity") == "perm-a" for e in nv.events) and nv.last_seen:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the reader's FleetFeed did not see node A: {state.nodes}")
    finally:
        await feed.stop()

    capfd.readouterr()
    assert await run_events([fleet.url], EventsQuery(node=NODE_A, collector="burst"), fleet.cfg("reader")) == 0
    assert [json.loads(line)["entity"] for line in capfd.readouterr().out.splitlines()] == ["perm-a"]
    await reader.close()

    for who in ("a", "reader"):
        assert fleet.violations_of(who) == [], f"{who}'s permissions miss a subject its code uses"


async def test_node_a_cannot_speak_for_node_b(tmp_path: Path, fleet: Fleet, admin: Any) -> None:
    """(b) Node A's credentials cannot publish node B's events, audits, heartbeat or KV state, nor read
    the fleet's subjects: each is a permission violation and nothing of it lands anywhere."""
    await _emit_as_node_a(tmp_path, fleet, "own", admin)  # the stream and bucket exist; node A works
    reader = await fleet.connect("reader")
    beats: list[str] = []

    async def on_beat(msg: Any) -> None:
        beats.append(msg.subject)

    await reader.subscribe("gna.heartbeat.>", cb=on_beat)
    await reader.flush()

    a = await fleet.connect("a")
    js = a.jetstream(timeout=DENIED_WAIT)
    forged = event_subject(NODE_B, "burst", "critical")
    body = json.dumps({"node": NODE_B, "type": "Forged", "severity": "critical"}).encode()
    await _denied(js.publish(forged, body))
    await _denied(js.publish(f"gna.actions.{encode_token(NODE_B)}.kubernetes", body))
    await _denied(js.publish(f"$KV.gna-nodes.{encode_token(NODE_B)}", body))
    await a.publish(heartbeat_subject(NODE_B), body)
    await a.subscribe("gna.events.>")  # a node reads nothing of the fleet
    await a.subscribe(f"_INBOX_{encode_token(NODE_B)}.>")  # nor another node's replies
    await a.subscribe("_INBOX_reader.>")  # nor the dashboard's stream deliveries
    await a.flush()
    await asyncio.sleep(0.3)

    errors = " ".join(fleet.errors).lower()
    for subject in (forged, heartbeat_subject(NODE_B), f"$kv.gna-nodes.{encode_token(NODE_B)}"):
        assert f'publish to "{subject.lower()}"' in errors, fleet.errors
    assert 'subscription to "gna.events.>"' in errors, fleet.errors
    assert f'subscription to "_inbox_{encode_token(NODE_B).lower()}.>"' in errors, fleet.errors
    assert 'subscription to "_inbox_reader.>"' in errors, fleet.errors
    assert await _stored(admin, f"gna.events.{encode_token(NODE_B)}.>") == 0
    assert await _stored(admin, "gna.actions.>") == 0
    assert heartbeat_subject(NODE_B) not in beats
    kv = await admin.jetstream().key_value("gna-nodes")
    assert await kv.keys() == [encode_token(NODE_A)]
    await a.close()
    await reader.close()


async def test_reader_consumes_but_never_writes(tmp_path: Path, fleet: Fleet, admin: Any) -> None:
    """(c) A reader can consume the stream but cannot publish events or audits, delete anything, or
    repoint the cordoner's durable consumer (CONSUMER.CREATE by name creates *or updates*)."""
    await _emit_as_node_a(tmp_path, fleet, "r1", admin)
    before = await _stored(admin, "gna.>")
    r = await fleet.connect("reader")
    js = r.jetstream(timeout=DENIED_WAIT)
    sub = await js.pull_subscribe("gna.events.>", durable=None, stream="GNA_EVENTS")
    assert [json.loads(m.data)["entity"] for m in await sub.fetch(1, timeout=5)] == ["r1"]

    await _denied(js.publish(event_subject(NODE_A, "burst", "critical"), b"{}"))
    await _denied(js.publish("gna.actions.x.kubernetes", b"{}"))
    await _denied(js.purge_stream("GNA_EVENTS"))
    await _denied(js.delete_stream("GNA_EVENTS"))
    from nats.js.api import ConsumerConfig

    await _denied(js.add_consumer("GNA_EVENTS", ConsumerConfig(name="gna-cordoner", durable_name="gna-cordoner",
                                                               filter_subject="gna.events.>")))
    # The bare (ephemeral) CREATE it may use cannot name a durable either: the server refuses that itself.
    req = {"stream_name": "GNA_EVENTS", "config": {"durable_name": "gna-cordoner", "deliver_subject": "_INBOX.r",
                                                   "filter_subject": "gna.events.>"}}
    reply = await r.request("$JS.API.CONSUMER.CREATE.GNA_EVENTS", json.dumps(req).encode(), timeout=5)
    assert "error" in json.loads(reply.data), reply.data
    assert await _stored(admin, "gna.>") == before
    assert len(fleet.violations_of("reader")) == 5
    await r.close()


async def test_cordoner_uses_the_budget_and_node_cannot_harm_the_stream(tmp_path: Path, fleet: Fleet,
                                                                        admin: Any) -> None:
    """(d) The real cordoner starts (stream, durable queue consumer, acks) and takes budget slots with no
    violation; node A cannot delete, purge or reshape the stream, nor touch the budget."""
    from agent import config as configmod
    from agent.remediation.budget import BudgetUnavailable, FleetBudget
    from fleet.cordoner import Cordoner

    await _emit_as_node_a(tmp_path, fleet, "before-cordoner", admin)
    cfg = configmod.parse("", file="<test>").agent
    cfg.nats = fleet.cfg("cordoner")
    cordoner = Cordoner(cfg, [fleet.url])
    await asyncio.wait_for(cordoner.start(), 15)
    try:
        await _emit_as_node_a(tmp_path, fleet, "seen-by-cordoner", admin)
        for _ in range(100):
            if cordoner.handled >= 1:
                break
            await asyncio.sleep(0.05)
        assert cordoner.handled >= 1
        js = cordoner.link.js
        assert js is not None
        budget = FleetBudget(js, max_nodes=1, max_percent=0)
        assert (await budget.take(NODE_A, "test")).granted
        assert not (await budget.take(NODE_B, "test")).granted  # the limit, not a permission, refused it
        assert (await budget.status())["fleet_size"] == 1  # reads the nodes bucket's keys
        await js.publish(f"gna.actions.{encode_token(NODE_B)}.kubernetes", b"{}")  # its audits, any node
        await js.publish("gna.events.cordoner.agent.critical", b"{}")  # its alerts
        for _ in range(100):
            info = await js.consumer_info("GNA_EVENTS", "gna-cordoner")
            if info.num_ack_pending == 0 and info.num_pending == 0:
                break
            await asyncio.sleep(0.05)
        assert info.num_ack_pending == 0, "the cordoner could not ack"
    finally:
        await cordoner.stop()
    assert fleet.violations_of("cordoner") == []

    stored = await _stored(admin, "gna.>")
    a = await fleet.connect("a")
    js_a = a.jetstream(timeout=DENIED_WAIT)
    await _denied(js_a.delete_stream("GNA_EVENTS"))
    await _denied(js_a.purge_stream("GNA_EVENTS"))
    await _denied(js_a.update_stream(StreamConfig(name="GNA_EVENTS", subjects=["gna.>"], max_age=1)))
    await _denied(js_a.add_stream(StreamConfig(name="GNA_EVENTS", subjects=["gna.>"], max_age=1)))  # no CREATE
    with pytest.raises(BudgetUnavailable):
        await asyncio.wait_for(FleetBudget(js_a).take(NODE_A, "x"), 10)
    info = await admin.jetstream().stream_info("GNA_EVENTS")
    assert info.config.subjects == ["gna.events.>", "gna.actions.>"] and info.config.max_age != 1
    assert await _stored(admin, "gna.>") == stored
    await a.close()


def test_node_budget_adds_only_the_budget() -> None:
    _, key = new_user_seed()
    off = node_permissions(NODE_A, Layout(nodes={NODE_A: key}))
    on = node_permissions(NODE_A, Layout(nodes={NODE_A: key}, node_budget=True))
    assert set(on.publish) - set(off.publish) >= {"$KV.gna-budget.cordons", "$JS.API.STREAM.INFO.KV_gna-budget"}
    assert "gna.events.node-a=example=com.*.*" in off.publish
    assert off.subscribe == on.subscribe == ["_INBOX_node-a=example=com.>", "gna.validate.node-a=example=com"]


def test_layout_errors_are_refused() -> None:
    _, k1 = new_user_seed()
    with pytest.raises(ValueError, match="share the nkey"):
        render_config(Layout(nodes={"a": k1}, roles=Roles(readers=[k1])))
    with pytest.raises(ValueError, match="not a user public nkey"):
        render_config(Layout(nodes={"a": "S" + k1[1:]}))
    with pytest.raises(ValueError, match="cordoner"):
        render_config(Layout(nodes={"cordoner": k1}))


def test_shipped_config_is_rendered_and_accepted() -> None:
    """(e) deploy/nats/nats-server.conf is exactly the renderer's output for the shipped layout, and
    nats-server accepts it."""
    layout_path = "deploy/nats/layout.example.toml"
    shipped = ROOT / "deploy" / "nats" / "nats-server.conf"
    rendered = render_config(load_layout(ROOT / layout_path), source=layout_path)
    assert shipped.read_text() == rendered, (
        f"re-render it: .venv/bin/python -m fleet.nats_permissions render {layout_path} > {shipped.relative_to(ROOT)}")
    r = subprocess.run([find_nats_server(), "-t", "-c", str(shipped)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    cli = subprocess.run([sys.executable, "-m", "fleet.nats_permissions", "render",
                          layout_path], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert cli.returncode == 0 and cli.stdout == rendered, cli.stderr


async def test_correlator_and_cordoner_work_on_incidents_with_their_own_permissions(
        tmp_path: Path, fleet: Fleet, admin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """#15: the correlator reads the stream and writes incidents only; the cordoner and readers read them."""
    import json as _json

    from agent import config as configmod
    from fleet.cordoner import Cordoner
    from fleet.incident_service import IncidentService
    from fleet.incidents import INCIDENTS_BUCKET, owner
    from fleet.leases import beacon_subject
    from gna_types.subjects import event_subject, subjects_for
    from sim.scenarios import generate

    sc = generate(tmp_path / "fleet", seed=5, nodes=3, fault="gpu_fell_off", job_nodes=2, second_job=False)
    msgs = await sc.messages()
    js = admin.jetstream()  # the streams and buckets: the admin's (the fixture ran `nats setup`)
    # two partitions: the replica leases its own (fleet/leases.py) with the correlator's permissions
    svc = IncidentService([fleet.url], nats_cfg=fleet.cfg("correlator"), debounce=0.02, partitions=2,
                          partition=owner(sc.jobs[0].comm_id, 2), lease_ttl=2.0)
    cfg = configmod.parse('[remediations]\ncordon_with = "slurm"\n', file="<t>").agent
    cfg.nats = fleet.cfg("cordoner")
    cord = Cordoner(cfg, [fleet.url])
    await svc.start()
    await cord.start()
    try:
        for m in msgs:  # as the nodes would have (the admin may publish on any node's subject)
            for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
                await js.publish(subject, _json.dumps(m).encode())
        for _ in range(200):
            if svc.published and cord.incidents:
                break
            await asyncio.sleep(0.05)
        assert svc.published and cord.incidents, (svc.published, cord.incidents)
        assert svc.leases is not None and svc.tracker.partition in svc.leases.held and svc.leases.errors == 0
        reader = await fleet.connect("reader")
        kv = await reader.jetstream().key_value(INCIDENTS_BUCKET)
        rec = _json.loads((await kv.get(sc.jobs[0].comm_id)).value)
        assert rec["culprit"]["node"] == sc.expected[sc.jobs[0].comm_id]["node"]  # type: ignore[index]
        await reader.close()
        nc = await fleet.connect("correlator")
        await nc.publish(event_subject("gpu-005-000", "kmsg_xid", "critical"), b"{}")  # not its to write
        await nc.flush()
        # the replicas' beats (fleet/leases.py): a node cannot fake another replica alive, a reader cannot listen
        other = 1 - svc.tracker.partition
        node = await fleet.connect("a")
        await node.publish(beacon_subject(other), _json.dumps({"holder": "forged", "partition": other}).encode())
        await node.flush()
        listener = await fleet.connect("reader")
        await listener.subscribe(beacon_subject(svc.tracker.partition))
        await listener.flush()
        await asyncio.sleep(DENIED_WAIT)
        assert other not in svc.leases._heard and svc.leases._self_heard > 0, "the replica hears only itself"
        await node.close()
        await listener.close()
        await nc.close()
    finally:
        await cord.stop()
        await svc.stop()
    assert any("gna.correlator.beat" in v for v in fleet.violations_of("a"))
    assert [v for v in fleet.violations_of("reader") if "gna.correlator.beat" not in v] == []
    assert any("gna.correlator.beat" in v for v in fleet.violations_of("reader"))
    assert fleet.violations_of("cordoner") == []
    assert [v for v in fleet.violations_of("correlator") if "gna.events" not in v] == []
    assert any("gna.events" in v for v in fleet.violations_of("correlator"))


NON_ADMIN = ("a", "cordoner", "correlator", "reader", "exporter")


def test_no_role_but_the_admin_may_create_or_change_a_stream_or_bucket() -> None:
    """#20: every stream and bucket is the admin step's; any other role could shape one (a republish onto another
    node's subjects). Nodes (with and without node_budget), the cordoner, correlators and readers: INFO at most."""
    from fleet.nats_permissions import (
        cordoner_permissions,
        correlator_permissions,
        exporter_permissions,
        reader_permissions,
    )

    _, key = new_user_seed()
    perms = {"node": node_permissions(NODE_A, Layout(nodes={NODE_A: key})),
             "node with node_budget": node_permissions(NODE_A, Layout(nodes={NODE_A: key}, node_budget=True)),
             "cordoner": cordoner_permissions(Layout()), "correlator": correlator_permissions(Layout()),
             "reader": reader_permissions(Layout()), "exporter": exporter_permissions(Layout())}
    for who, p in perms.items():
        shaping = [s for s in p.publish if s.startswith(("$JS.API.STREAM.", "$JS.API.>", "$JS.>", ">"))
                   and not s.startswith(("$JS.API.STREAM.INFO.", "$JS.API.STREAM.MSG.GET.", "$JS.API.STREAM.NAMES"))]
        assert shaping == [], f"{who} may shape streams: {shaping}"
    assert "$JS.API.STREAM.INFO.GNA_SIGNALS" in perms["node"].publish  # what the verification needs


async def test_no_role_but_the_admin_can_create_any_stream_or_bucket(fleet: Fleet) -> None:
    """(f) Against the server: each non-admin role's creation of every stream and bucket is refused (no reply, a
    violation), and nothing was created; the agent's own creation path reports the stream missing."""
    from agent import config as configmod
    from agent.nats_link import StreamMissing, ensure_stream
    from fleet.nats_setup import wanted

    items = wanted(configmod.parse("", file="<test>").agent)
    conns = {who: await fleet.connect(who) for who in NON_ADMIN}
    try:
        attempts = []
        for nc in conns.values():
            js = nc.jetstream(timeout=DENIED_WAIT)
            for item in items:
                attempts.append(_denied(js.add_stream(item.stream) if item.stream is not None
                                        else js.create_key_value(item.bucket)))
        await asyncio.gather(*attempts)
        with pytest.raises(StreamMissing, match=r"GNA_SIGNALS .*may not create it.*nats setup"):
            await ensure_stream(conns["a"].jetstream(timeout=DENIED_WAIT), items[2].stream)  # type: ignore[arg-type]
    finally:
        for nc in conns.values():
            await nc.close()
    admin_nc = await fleet.connect("admin")
    try:
        assert await admin_nc.jetstream().streams_info() == []
    finally:
        await admin_nc.close()
    for who in NON_ADMIN:
        assert len([v for v in fleet.violations_of(who) if "$JS.API.STREAM.CREATE." in v]) >= len(items), who


async def test_node_waits_for_the_admin_step_and_loses_nothing(tmp_path: Path, fleet: Fleet,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    """(g) The real agent as node A before the admin ran setup: no crash, a loud line, its event kept in the spool;
    once the admin ran `nats setup`, the event reaches the stream and its state the bucket."""
    cfg = agent_config(tmp_path, servers=[fleet.url], node=NODE_A)
    cfg.agent.nats.nkey_seed = str(fleet.seeds["a"])
    admin_nc = await fleet.connect("admin")
    try:
        async with running_agent(cfg) as agent:
            assert agent.link is not None and agent.spool is not None
            await asyncio.wait_for(agent.link.connected.wait(), 15)
            assert await agent.emitter_for("burst").event("BurstEvent", severity="warning", entity="kept",
                                                          reason="T", message="before setup")
            for _ in range(200):
                said = capfd.readouterr()
                if "stream_missing" in said.out + said.err:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("no loud line for the missing stream")
            assert agent.spool.depth == 1 and not agent.link.stream_ready
            assert {o.status for o in await set_up(admin_nc)} == {"created"}
            for _ in range(300):
                if agent.spool.depth == 0 and await _has_state(admin_nc, NODE_A):
                    break
                await asyncio.sleep(0.05)
            assert agent.spool.depth == 0, "the spooled event did not reach JetStream after setup"
            assert await _has_state(admin_nc, NODE_A)
        assert await _stored(admin_nc, f"gna.events.{encode_token(NODE_A)}.>") == 1
    finally:
        await admin_nc.close()


@pytest.mark.parametrize("name", ["gpu-001\nlisten: \"0.0.0.0:9999\"", "gpu-001\r", "gpu\t001", "gpu\x00",
                                  "gpu\x7f", "gpu\u2028x", "gpu\u200f001", "gpu\ufeff", "gpu 001", "gpu/001",
                                  "gpu\"001", "gpu}001", "", "-gpu", "gpu.", "g" * 254])
def test_layout_refuses_a_node_name_that_is_no_host_name(tmp_path: Path, name: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """#20: a newline in a node name injected a config line into the rendered layout (`nats-server -t` took it).
    Control and format characters, and anything else that is no host name, are refused with the entry named."""
    _, key = new_user_seed()
    with pytest.raises(ValueError, match=r"^\[nodes\] entry " + re.escape(repr(name))):
        render_config(Layout(nodes={name: key}))
    layout = tmp_path / "layout.toml"
    layout.write_text(f"[nodes]\n{json.dumps(name)} = {json.dumps(key)}\n")  # a TOML basic string: JSON's escapes
    # the loader and the renderer's command line refuse it the same way
    with pytest.raises(ValueError, match=r"\[nodes\] entry "):
        load_layout(layout)
    from fleet.nats_permissions import main as permissions_main

    assert permissions_main(["render", str(layout)]) == 78
    err = capsys.readouterr().err
    assert "[nodes] entry" in err and repr(name)[:20] in err


def test_layout_accepts_host_names_and_refuses_bad_nats_names() -> None:
    _, k1 = new_user_seed()
    _, k2 = new_user_seed()
    text = render_config(Layout(nodes={"gpu-001.dc1.example.com": k1, "GPU_02": k2}))
    assert "# node gpu-001.dc1.example.com (token gpu-001=dc1=example=com)" in text
    from fleet.nats_permissions import Names

    with pytest.raises(ValueError, match=r"\[names\] account"):
        render_config(Layout(names=Names(account="GNA: {}\nX"), nodes={"a": k1}))
    with pytest.raises(ValueError, match=r"\[names\] signals_stream"):
        render_config(Layout(names=Names(signals_stream="GNA.SIGNALS"), nodes={"a": k1}))


def test_cordoner_before_the_admin_step_exits_69_and_says_why(tmp_path: Path, fleet: Fleet) -> None:
    """A central service that finds a stream missing and may not create it: one line naming the stream and the
    admin step, exit 69 (its supervisor starts it again; it works once `nats setup` ran), no traceback."""
    from tests.conftest import AGENT_CMD

    conf = tmp_path / "cordoner.toml"
    conf.write_text(f'[nats]\nnkey_seed = "{fleet.seeds["cordoner"]}"\npublish_timeout = 1.0\nconnect_timeout = 5.0\n')
    r = subprocess.run([*AGENT_CMD, "cordoner", "--config", str(conf), "--nats", fleet.url, "--duration", "5",
                        "--metrics-listen", ""],
                       capture_output=True, text=True, timeout=60)
    err = r.stderr
    assert r.returncode == 69, err
    assert "stream GNA_EVENTS does not exist" in err and "nats setup" in err and "Traceback" not in err, err


async def test_the_exporter_exports_with_its_own_permissions_and_nobody_repoints_its_consumer(
        tmp_path: Path, fleet: Fleet, admin: Any) -> None:
    """Issue 23 (4): the CloudEvents exporter (role exporters) reads the events stream through its one durable
    consumer and acknowledges its deliveries, and can publish nothing; a reader cannot create or update a
    consumer by the exporter's name (it could narrow the filter and silence the export)."""
    from aiohttp import web
    from nats.js.api import ConsumerConfig

    from fleet.exporter import CloudEventsExporter, ExportSettings

    got: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        got.append(json.loads(await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    await _emit_as_node_a(tmp_path, fleet, "e1", admin)
    exp = CloudEventsExporter([fleet.url], ExportSettings(url=url), nats_cfg=fleet.cfg("exporter"))
    await exp.start()
    try:
        for _ in range(200):
            if exp.exported:
                break
            await asyncio.sleep(0.05)
        assert [(e["source"], e["subject"]) for e in got] == [(f"/gpu-node-agent/nodes/{NODE_A}", "e1")]
        info = await admin.jetstream().consumer_info("GNA_EVENTS", "gna-export-cloudevents")
        assert info.num_ack_pending == 0 and info.num_pending == 0  # its acks were allowed
        js = exp.nc.jetstream(timeout=DENIED_WAIT)
        await _denied(js.publish(event_subject(NODE_A, "burst", "critical"), b"{}"))
    finally:
        await exp.stop()
        await runner.cleanup()
    r = await fleet.connect("reader")
    try:
        await _denied(r.jetstream(timeout=DENIED_WAIT).add_consumer("GNA_EVENTS", ConsumerConfig(
            name="gna-export-cloudevents", durable_name="gna-export-cloudevents", filter_subject="gna.events.none")))
    finally:
        await r.close()
    assert len(fleet.violations_of("exporter")) == 1 and len(fleet.violations_of("reader")) == 1


async def test_only_the_cordoner_asks_a_node_to_validate_and_only_that_node_hears_it(fleet: Fleet) -> None:
    """gna.validate.<node> (fleet/validations.py): the cordoner may publish it for any node; a node subscribes to
    its own only, and can neither ask another node nor listen to another node's requests."""
    a, b, cordoner = await fleet.connect("a"), await fleet.connect("b"), await fleet.connect("cordoner")
    heard: dict[str, list[str]] = {"a": [], "b": []}

    def recorder(who: str) -> Any:
        async def on_msg(msg: Any) -> None:
            heard[who].append(msg.subject)
        return on_msg

    await a.subscribe(validate_subject(NODE_A), cb=recorder("a"))
    await b.subscribe(validate_subject(NODE_B), cb=recorder("b"))
    await b.subscribe(validate_subject(NODE_A), cb=recorder("b"))  # listening to node A's: refused
    await a.flush()
    await b.flush()
    await b.publish(validate_subject(NODE_A), b"")  # node B asking node A: refused
    await b.flush()
    await cordoner.publish(validate_subject(NODE_A), b"")
    await cordoner.flush()
    for _ in range(100):
        if heard["a"]:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert heard == {"a": [validate_subject(NODE_A)], "b": []}
    errors = " ".join(fleet.errors).lower()
    assert f'subscription to "{validate_subject(NODE_A).lower()}"' in errors, fleet.errors
    assert f'publish to "{validate_subject(NODE_A).lower()}"' in errors, fleet.errors
    assert not any(e.startswith(("a:", "cordoner:")) for e in fleet.errors), fleet.errors
    for c in (a, b, cordoner):
        await c.close()
