"""Adversarial suite, fleet side (#13 deliverable 9): each finding reproduced black-box.

A real nats-server on loopback, the central tools as real subprocesses (`cordoner`, `dashboard`,
`events`, `top`), a hostile publisher on the bus. Only what an operator sees is asserted: audits on
gna.actions.>, the argv log of a fake ``scontrol``/``modprobe``, the dashboard's HTTP API, the
JetStream consumer's own counters, stdout/stderr and exit codes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import nats
import pytest
from nats.js.api import StreamConfig

from agent.message import make_message, rfc3339, to_dict
from agent.nats_link import STREAM_SUBJECTS
from agent.nats_server import NatsServerProcess, free_port
from gna_types.subjects import encode_token, event_subject, heartbeat_subject
from tests.conftest import AGENT_CMD, python_env

# A fake scontrol/modprobe: records its argv, keeps Slurm node state in a JSON file.
FAKE_TOOL = r"""#!/usr/bin/env python3
import fcntl, json, os, sys
state = os.environ["GNA_TEST_STATE"]
lock = open(state + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)
with open(os.environ["GNA_TEST_ARGV_LOG"], "a") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
if os.path.basename(sys.argv[0]) == "scontrol":
    st = json.load(open(state)) if os.path.exists(state) else {}
    if sys.argv[1:3] == ["show", "node"]:
        s = st.get(sys.argv[3], {"State": "IDLE", "Reason": ""})
        print(f"NodeName={sys.argv[3]} Arch=x86_64\n   State={s['State']} ThreadsPerCore=2")
    elif sys.argv[1] == "update":
        args = dict(a.split("=", 1) for a in sys.argv[2:])
        st[args["NodeName"]] = ({"State": "IDLE+DRAIN", "Reason": args.get("Reason", "")}
                                if args["State"] == "DRAIN" else {"State": "IDLE", "Reason": ""})
        with open(state + ".tmp", "w") as fh:
            json.dump(st, fh)
        os.replace(state + ".tmp", state)
"""

SLURM_CONFIG = '[remediations]\ncordon_with = "slurm"\n[nats]\nconnect_timeout = 15.0\n'


# -- helpers ------------------------------------------------------------------------------------

@pytest.fixture
def tool_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a cordoner whose PATH has the recording scontrol and modprobe."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("scontrol", "modprobe"):
        p = bindir / name
        p.write_text(FAKE_TOOL)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    env = python_env()
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["GNA_TEST_ARGV_LOG"] = str(tmp_path / "argv.log")
    env["GNA_TEST_STATE"] = str(tmp_path / "slurm-state.json")
    env["GNA_TEST_HOST_ROOT"] = str(tmp_path / "cordoner-host")
    return env


def argv_log(env: dict[str, str]) -> list[list[str]]:
    log = Path(env["GNA_TEST_ARGV_LOG"])
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _cond(node: str, type_: str = "GPUFellOffBus", *, severity: str = "critical", entity: str = "gpu:0000:18:00.0",
          collector: str = "kmsg_xid", message: str = "m", status: str = "firing") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector=collector, kind="condition", type=type_, status=status,  # type: ignore[arg-type]
                                severity=severity, entity=entity, reason="R", message=message))  # type: ignore[arg-type]


def _subject(m: dict[str, Any]) -> str:
    return event_subject(m["node"], m["collector"], m["severity"])


class Bus:
    """The hostile (and the honest) publisher, and an operator watching gna.actions.>."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.audits: list[dict[str, Any]] = []

    async def watch_audits(self) -> None:
        async def on_audit(m: Any) -> None:
            self.audits.append(json.loads(m.data))

        await self.nc.subscribe("gna.actions.>", cb=on_audit)

    async def ensure_stream(self) -> None:
        await self.js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS))

    async def event(self, m: dict[str, Any], subject: str | None = None) -> None:
        await self.js.publish(subject or _subject(m), json.dumps(m).encode())

    async def raw(self, subject: str, data: bytes) -> None:
        await self.js.publish(subject, data)


@pytest.fixture
async def bus(nats_server: NatsServerProcess) -> AsyncIterator[Bus]:
    nc = await nats.connect(nats_server.url)
    try:
        yield Bus(nc)
    finally:
        await nc.close()


async def until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Central:
    """One central tool as a subprocess; its stderr goes to a file (what an operator's journal shows)."""

    def __init__(self, tmp_path: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.err_path = tmp_path / f"{name}.stderr"
        self.out_path = tmp_path / f"{name}.stdout"
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen([*AGENT_CMD, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env or python_env())

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def centrals() -> Iterator[list[Central]]:
    started: list[Central] = []
    yield started
    for c in started:
        c.stop()


async def start_cordoner(tmp_path: Path, url: str, env: dict[str, str], bus: Bus, centrals: list[Central], *,
                         enforce: bool) -> Central:
    cfg = tmp_path / "cordoner.toml"
    cfg.write_text(SLURM_CONFIG)
    argv = ["cordoner", "--config", str(cfg), "--nats", url, "--duration", "60", "--metrics-listen", "",
            *(["--enforce"] if enforce else [])]
    c = Central(tmp_path, "cordoner", argv, env)
    centrals.append(c)
    # Ready when its durable consumer exists (it delivers only messages published after that).
    deadline = time.monotonic() + 30
    while True:
        assert c.proc.poll() is None, c.stderr
        try:
            await bus.js.consumer_info("GNA_EVENTS", "gna-cordoner")
            return c
        except Exception:
            assert time.monotonic() < deadline, c.stderr
            await asyncio.sleep(0.1)


async def start_dashboard(tmp_path: Path, url: str, centrals: list[Central], name: str = "dashboard") -> tuple[Central, str]:
    ready = tmp_path / f"{name}.url"
    ready.unlink(missing_ok=True)
    c = Central(tmp_path, name, ["dashboard", "--nats", url, "--listen", "127.0.0.1:0", "--ready-file", str(ready),
                                 "--duration", "60"])
    centrals.append(c)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().endswith("\n")):
        assert c.proc.poll() is None and time.monotonic() < deadline, c.stderr
        await asyncio.sleep(0.05)
    return c, ready.read_text().strip().rstrip("/")


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        body = await r.text()
        assert r.status == 200, (url, r.status, body[:500])
        assert r.content_type == "application/json"
        return json.loads(body)


async def overview_until(http: aiohttp.ClientSession, base: str, node: str, timeout: float = 15.0) -> dict[str, Any]:
    """/api/overview (must be 200 every time) until ``node`` is in it; that node's row."""
    deadline = time.monotonic() + timeout
    while True:
        rows = (await get_json(http, f"{base}/api/overview"))["nodes"]
        for r in rows:
            if r["node"] == node:
                return dict(r)
        assert time.monotonic() < deadline, f"{node} never showed up in /api/overview: {rows}"
        await asyncio.sleep(0.1)


# -- D1 -----------------------------------------------------------------------------------------

async def test_d1_spoofed_cordon_and_node_local_plugin_never_run_centrally(
        tmp_path: Path, nats_server: NatsServerProcess, bus: Bus, tool_env: dict[str, str],
        centrals: list[Central]) -> None:
    """D1 Spoofed cordons: a critical condition published on nodeb's subject but naming nodea must not drain
    nodea; nodeb's own drains nodeb (enforcing, cordon via Slurm); a node-local rule (modprobe) is never run
    on the cordoner's host, and its audit says why."""
    await bus.watch_audits()
    cord = await start_cordoner(tmp_path, nats_server.url, tool_env, bus, centrals, enforce=True)
    spoof = _cond("nodea")
    await bus.event(spoof, subject=event_subject("nodeb", spoof["collector"], spoof["severity"]))
    peermem = _cond("nodeb", "KernelModuleNotLoaded", severity="warning", entity="module:nvidia_peermem",
                    collector="kernel_modules")
    await bus.event(peermem)
    await bus.event(_cond("nodeb"))
    await until(lambda: {a["remediation"] for a in bus.audits} >= {"slurm", "modprobe"}, 20, "both audits")
    await asyncio.sleep(0.5)
    assert cord.stop() == 0, cord.stderr

    log = argv_log(tool_env)
    assert not [a for a in log if "NodeName=nodea" in a], f"the spoof drained nodea: {log}"
    assert [a for a in log if a[:2] == ["scontrol", "update"]] == [
        ["scontrol", "update", "NodeName=nodeb", "State=DRAIN", "Reason=gpu-node-agent: GPUFellOffBus"]]
    assert not [a for a in log if a[0] == "modprobe"], f"modprobe ran on the cordoner's host: {log}"
    assert "nodea" not in {a["node"] for a in bus.audits}, bus.audits
    (drain,) = [a for a in bus.audits if a["remediation"] == "slurm"]
    assert (drain["node"], drain["decision"], drain["dry_run"]) == ("nodeb", "executed", False)
    (mod,) = [a for a in bus.audits if a["remediation"] == "modprobe"]
    assert mod["decision"] == "failed" and "acts on a node's own host" in mod["reason"], mod
    # the operator's journal names the refusal
    rejected = [json.loads(x) for x in cord.stderr.splitlines() if '"message_rejected"' in x]
    assert [(r["reason"], r["subject"]) for r in rejected] == [("node_mismatch", "gna.events.nodeb.kmsg_xid.critical")]


# -- D2 -----------------------------------------------------------------------------------------

async def test_d2_a_thousand_poison_messages_do_not_stall_the_cordoner(
        tmp_path: Path, nats_server: NatsServerProcess, bus: Bus, tool_env: dict[str, str],
        centrals: list[Central]) -> None:
    """D2 Poison messages stall the cordoner: 1,000 malformed messages (an entity that is a list, not JSON,
    wrong types, not an object, missing fields) then a valid one: the valid one is decided within seconds,
    the poison is terminated (never redelivered, nothing left pending) and the consumer caps deliveries."""
    await bus.watch_audits()
    cord = await start_cordoner(tmp_path, nats_server.url, tool_env, bus, centrals, enforce=False)
    base = _cond("nodeb")
    subj = _subject(base)
    poison: list[bytes] = []
    for i in range(1000):
        kind = i % 5
        if kind == 0:
            poison.append(json.dumps({**base, "id": f"p{i}", "entity": ["not", "a", "string"]}).encode())
        elif kind == 1:
            poison.append(b"\xff\xfe not json {" + str(i).encode())
        elif kind == 2:
            poison.append(json.dumps({**base, "id": f"p{i}", "details": "x", "time": 12345}).encode())
        elif kind == 3:
            poison.append(json.dumps([base, i]).encode())
        else:
            poison.append(json.dumps({"id": f"p{i}", "node": "nodeb"}).encode())
    for data in poison:  # core publishes: the stream stores them, in order, without 1,000 round trips
        await bus.nc.publish(subj, data)
    await bus.nc.flush()
    stored = 0

    async def count() -> None:
        nonlocal stored
        stored = (await bus.js.stream_info("GNA_EVENTS")).state.messages

    deadline = time.monotonic() + 15
    while stored < 1000:  # the stream stores core publishes asynchronously
        assert time.monotonic() < deadline, stored
        await count()
        await asyncio.sleep(0.05)
    good = _cond("nodec")
    t0 = time.monotonic()
    await bus.event(good)
    await until(lambda: any(a["trigger"]["id"] == good["id"] for a in bus.audits), 15, "the valid message's audit")
    took = time.monotonic() - t0
    assert took < 8, f"the valid message waited {took:.1f} s behind the poison"
    (audit,) = [a for a in bus.audits if a["trigger"]["id"] == good["id"]]
    assert (audit["node"], audit["remediation"], audit["decision"]) == ("nodec", "slurm", "dry_run")
    assert [a["node"] for a in bus.audits] == ["nodec"], "no poison message was decided"

    deadline = time.monotonic() + 10
    while True:
        ci = await bus.js.consumer_info("GNA_EVENTS", "gna-cordoner")
        if (ci.num_ack_pending == 0 and ci.num_pending == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert (ci.num_ack_pending, ci.num_redelivered, ci.num_pending) == (0, 0, 0), ci
    assert ci.delivered is not None and ci.delivered.consumer_seq == 1001, ci.delivered
    assert ci.config.max_deliver is not None and 0 < ci.config.max_deliver <= 10, ci.config
    await asyncio.sleep(1.0)  # a nak'd or unacked message would come back: it does not
    again = await bus.js.consumer_info("GNA_EVENTS", "gna-cordoner")
    assert (again.num_redelivered, again.delivered.consumer_seq) == (0, 1001)
    assert cord.stop() == 0
    err = cord.stderr
    assert "Traceback" not in err
    reasons = {json.loads(x)["reason"] for x in err.splitlines() if '"message_rejected"' in x}
    assert reasons == {"schema", "not_json"}, reasons  # msgspec: an array where an object belongs is "schema"


# -- D4 -----------------------------------------------------------------------------------------

async def test_d4_unknown_severity_never_breaks_the_dashboard_nor_a_restart_nor_sse(
        tmp_path: Path, nats_server: NatsServerProcess, bus: Bus, centrals: list[Central]) -> None:
    """D4 One message with an unknown severity made /api/overview 500 and killed SSE, also after a restart
    (history replays it): published on its matching subject (...infiniband.apocalyptic) and as a node state
    in the gna-nodes bucket, then a valid one: /api/overview stays 200 and shows the valid node, /api/stats
    counts the rejection with a sample; after a restart the same; an SSE client still gets updates."""
    await bus.ensure_stream()
    bad = {**_cond("nodex", "IBPortDown", entity="ib:mlx5_0/1", collector="infiniband"), "severity": "apocalyptic"}
    await bus.event(bad, subject="gna.events.nodex.infiniband.apocalyptic")
    kv = await bus.js.create_key_value(bucket="gna-nodes", history=1)
    await kv.put(encode_token("nodey"), json.dumps({
        "node": "nodey", "time": rfc3339(),
        "heartbeat_interval": 10, "conditions": [{"collector": "infiniband", "type": "IBPortDown",
                                                  "entity": "ib:mlx5_1/1", "severity": "mega", "reason": "R",
                                                  "message": "m"}]}).encode())
    await bus.event(_cond("nodeok"))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        for run in ("first", "restarted"):
            dash, base = await start_dashboard(tmp_path, nats_server.url, centrals, name=f"dashboard-{run}")
            row = await overview_until(http, base, "nodeok")
            assert row["worst"]["GPU"] == "critical", row
            await overview_until(http, base, "nodey")
            for query in ("?severity=warning", "?severity=critical", "?collector=infiniband", "?type=IBPortDown"):
                await get_json(http, f"{base}/api/overview{query}")
            names = {r["node"] for r in (await get_json(http, f"{base}/api/overview"))["nodes"]}
            assert "nodex" not in names, "the apocalyptic message was applied"
            async with http.get(f"{base}/api/node/nodey") as r:
                assert r.status == 200, await r.text()
            stats = await get_json(http, f"{base}/api/stats")
            assert stats["rejected"].get("schema", 0) >= 1, stats
            sample = stats["rejected_samples"]["schema"]
            assert sample["subject"] == "gna.events.nodex.infiniband.apocalyptic", sample
            assert "'apocalyptic'" in sample["detail"] and "$.severity" in sample["detail"], sample
            assert stats["rejected"].get("unknown_severity", 0) >= 1, stats
            if run == "first":
                assert dash.stop() == 0, dash.stderr
                assert "Traceback" not in dash.stderr

        # SSE: subscribed after the poison, it still carries updates (another poison first, then a valid one)
        async with http.get(f"{base}/api/stream") as stream:
            assert stream.status == 200 and stream.content_type == "text/event-stream"
            assert (await stream.content.readline()).startswith(b": connected")
            await bus.event({**bad, "id": "bad-2"}, subject="gna.events.nodex.infiniband.apocalyptic")
            await bus.event(_cond("nodez"))
            got: list[dict[str, Any]] = []
            deadline = time.monotonic() + 10
            while not any(r["node"] == "nodez" for r in got):
                assert time.monotonic() < deadline, got
                line = await asyncio.wait_for(stream.content.readline(), max(0.1, deadline - time.monotonic()))
                if line.startswith(b"data: "):
                    got.extend(json.loads(line[6:]))
            assert "nodex" not in {r["node"] for r in got}
        await get_json(http, f"{base}/api/overview")
    assert "Traceback" not in dash.stderr


# -- D5 -----------------------------------------------------------------------------------------

async def test_d5_identity_and_time_come_from_the_subject_and_the_clock(
        tmp_path: Path, nats_server: NatsServerProcess, bus: Bus, centrals: list[Central]) -> None:
    """D5 identity and time from the payload: a heartbeat on nodeb's subject (and a gna-nodes entry under
    nodeb's key) claiming nodea with time 2099 must not make nodea fresh, and is counted; a genuine
    heartbeat dated 2099 is clamped to its receipt (age not negative) and the node goes stale when it stops."""
    await bus.ensure_stream()
    kv = await bus.js.create_key_value(bucket="gna-nodes", history=1)
    _, base = await start_dashboard(tmp_path, nats_server.url, centrals)
    future = "2099-01-01T00:00:00.000Z"
    spoof = {"node": "nodea", "time": future, "heartbeat_interval": 86400, "conditions": []}
    await bus.nc.publish(heartbeat_subject("nodeb"), json.dumps(spoof).encode())
    await kv.put(encode_token("nodeb"), json.dumps(spoof).encode())
    await bus.nc.publish(heartbeat_subject("nodeb"), json.dumps(
        {"node": "nodeb", "time": future, "heartbeat_interval": 1, "conditions": []}).encode())
    await bus.nc.flush()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        row = await overview_until(http, base, "nodeb")
        assert row["age_s"] is not None and row["age_s"] >= 0, row
        assert not str(row["last_seen"]).startswith("2099"), row
        assert row["stale"] is False
        rows = (await get_json(http, f"{base}/api/overview"))["nodes"]
        assert "nodea" not in {r["node"] for r in rows}, rows
        async with http.get(f"{base}/api/node/nodea") as r:
            assert r.status == 404
        deadline = time.monotonic() + 10
        while True:
            stats = await get_json(http, f"{base}/api/stats")
            if stats["rejected"].get("node_mismatch", 0) >= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert stats["rejected"]["node_mismatch"] == 2, stats
        assert stats["rejected_samples"]["node_mismatch"]["subject"] in ("gna.heartbeat.nodeb", "$KV.gna-nodes.nodeb")
        await asyncio.sleep(3.3)  # 3 heartbeat intervals of 1 s without a heartbeat: a dead node
        row = await overview_until(http, base, "nodeb")
        assert row["stale"] is True and row["age_s"] >= 3, row


# -- D12 ----------------------------------------------------------------------------------------

def test_d12_credentials_in_a_url_never_reach_output(tmp_path: Path) -> None:
    """D12 Credentials in a URL: `events`, `top --once`, `dashboard`, `cordoner` given
    nats://u:<secret>@host:port work against a server with that user (exit 0), and with a wrong password
    or a dead port exit 69 with one line naming the redacted URL; no secret in stdout or stderr."""
    secret, wrong = "s3cret-in-the-url-D12", "wr0ng-s3cret-D12"
    server = NatsServerProcess(tmp_path / "ns", extra_config=f'authorization {{\n  user: "u"\n  password: "{secret}"\n}}\n')
    server.start()
    try:
        good_url = f"nats://u:{secret}@127.0.0.1:{server.port}"

        async def seed() -> None:
            nc = await nats.connect(good_url)
            b = Bus(nc)
            await b.ensure_stream()
            await b.event(_cond("node-d12"))
            await nc.close()

        asyncio.run(seed())
        urls = {"good": good_url, "wrong": f"nats://u:{wrong}@127.0.0.1:{server.port}",
                "dead": f"nats://u:{secret}@127.0.0.1:{free_port()}"}
        commands = {"events": ["events"], "top": ["top", "--once"],
                    "dashboard": ["dashboard", "--listen", "127.0.0.1:0", "--duration", "2"],
                    "cordoner": ["cordoner", "--duration", "2", "--metrics-listen", ""]}  # three at once
        procs = {}
        for case, url in urls.items():
            for name, argv in commands.items():
                timeout = ["--connect-timeout", "2"] if case != "good" else []
                procs[case, name] = subprocess.Popen([*AGENT_CMD, *argv, "--nats", url, *timeout],
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                     stdin=subprocess.DEVNULL,
                                                     env={**python_env(), "COLUMNS": "200"})
        results = {k: (p.communicate(timeout=60), p.returncode) for k, p in procs.items()}
    finally:
        server.stop(kill=True)
    for (case, name), ((out, err), rc) in results.items():
        text = (out + err).decode(errors="replace")
        assert secret not in text and wrong not in text, (case, name, text)
        if case == "good":
            assert rc == 0, (name, text)
        else:
            assert rc == 69, (case, name, rc, text)
            last = err.decode().strip().splitlines()[-1]
            assert re.match(r"gpu-node-agent: cannot reach NATS( JetStream)? at nats://\*\*\*@127\.0\.0\.1:\d+ within ",
                            last), (case, name, last)
            assert "Traceback" not in text
    assert b"node-d12" in results["good", "events"][0][0]
    assert b"node-d12" in results["good", "top"][0][0]
    assert b"dashboard: http://127.0.0.1:" in results["good", "dashboard"][0][0]
    for name in commands:  # the operator is told why, not only that
        assert "Authorization Violation" in results["wrong", name][0][1].decode(), name


# -- D3 (data side) -----------------------------------------------------------------------------

async def test_d3_markup_in_names_and_messages_is_data_and_every_page_has_a_csp(
        tmp_path: Path, nats_server: NatsServerProcess, bus: Bus, centrals: list[Central]) -> None:
    """D3 (fleet data path) HTML/script in a node name, an entity and a condition message, fed through
    NATS: /api/overview and /api/node/<name> return it as the same JSON strings, never in an HTML page;
    the timeline SVG escapes it; every HTML route carries a strict Content-Security-Policy. (The browser
    proof that nothing runs is tests/test_dashboard_xss.py.)"""
    await bus.ensure_stream()
    node = "<svg onload=alert(1)>&amp;\"'"
    entity = "gpu:<img src=x onerror=alert(2)>"
    message = "</script><script>alert(3)</script><!--"
    m = _cond(node, entity=entity, message=message)
    await bus.event(m)
    _, base = await start_dashboard(tmp_path, nats_server.url, centrals)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        row = await overview_until(http, base, node)
        assert row["worst_condition"]["entity"] == entity and row["worst_condition"]["message"] == message
        detail = await get_json(http, f"{base}/api/node/{quote(node, safe='')}")
        assert detail["node"] == node
        assert [(c["entity"], c["message"]) for c in detail["conditions"]] == [(entity, message)]
        assert detail["events"][0]["message"] == message
        async with http.get(f"{base}/api/node/{quote(node, safe='')}/timeline.svg") as r:
            svg = await r.text()
            assert r.status == 200 and r.content_type == "image/svg+xml"
        root = ET.fromstring(svg)  # well-formed: the markup stayed text
        assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "img", "foreignObject")]
        assert entity not in svg and "&lt;img src=x onerror=alert(2)&gt;" in svg
        for path in ("/", f"/node/{quote(node, safe='')}", "/node/gpu-01", "/?q=%3Cscript%3E"):
            async with http.get(base + path) as r:
                page = await r.text()
                assert r.status == 200 and r.content_type == "text/html", path
                policy = r.headers.get("Content-Security-Policy", "")
                assert "default-src 'none'" in policy and "script-src 'sha256-" in policy, (path, policy)
                assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, (path, policy)
                assert "frame-ancestors 'none'" in policy, (path, policy)
                assert r.headers.get("X-Content-Type-Options") == "nosniff", path
                assert node not in page and message not in page and "alert(" not in page, path
