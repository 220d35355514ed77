"""#20 deliver 3, liveness: a central service whose NATS connection closes for good exits 75 (its
supervisor restarts it), and the cordoner's wait for a verdict never holds up another node's cordon.

Real nats-server on loopback, the real central commands as subprocesses, a recording ``scontrol`` on
PATH. Two ways the server closes a client for good (nats-py does not reconnect after either): a
control line longer than the server's ``max_control_line`` (the correlator's 5,000-character KV key
of the issue; here the cordoner's audit subject built from a long node name), and credentials revoked
by a configuration reload (``-ERR 'Authorization Violation'``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from agent import natsclient
from agent.message import make_message, to_dict
from agent.nats_server import NatsServerProcess, free_port
from agent.natsclient import EX_TEMPFAIL, ConnectionWatch, run_until_closed_or_stopped, until_closed
from gna_types.subjects import event_subject
from tests.conftest import AGENT_CMD, python_env
from tests.test_adversarial_fleet import (  # the black-box suite's recording scontrol and helpers
    SLURM_CONFIG,
    Bus,
    Central,
    argv_log,
    start_cordoner,
    tool_env,
    until,
)

__all__ = ["tool_env"]  # a fixture, used by name

AUTH = 'authorization {{\n  users = [ {{user: "u", password: "{}"}} ]\n}}\n'


def _cond(node: str, type_: str = "GPUFellOffBus", entity: str = "gpu:0000:18:00.0") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector="kmsg_xid", kind="condition", type=type_, status="firing",
                                severity="critical", entity=entity, reason="R", message="m"))


def _timeout(node: str, job: str, pid: int) -> dict[str, Any]:
    return to_dict(make_message(node=node, collector="nccl_logs", kind="event", type="NCCLCollectiveTimeout",
                                severity="critical", entity=f"nccl:{node}:{pid}", reason="WatchdogTimeout",
                                message="timed out", details={"job": job, "host": node, "pid": pid}))


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


# -- the mechanism, in-process ------------------------------------------------------------------

async def test_a_watched_connection_closed_for_good_ends_the_service_with_75(tmp_path: Path) -> None:
    """natsclient.connect registers with the task's watch; the server closing it for good (a control
    line past max_control_line) makes run_until_closed_or_stopped return 75 within a second, and the
    reason names the server's error. A service stopped by its duration returns 0 and its own close
    afterwards is not a failure."""
    server = NatsServerProcess(tmp_path / "ns", extra_config="max_control_line: 512\n")
    server.start()
    try:
        watch = natsclient.watching()
        assert natsclient.watching() is watch  # one per task (and the tasks it starts)
        nc = await natsclient.connect([server.url], name="svc-a", timeout=5)
        assert [w for w, _c in watch.clients] == ["svc-a"]

        async def poison() -> None:
            await asyncio.sleep(0.3)
            await nc.publish("gna." + "x" * 600, b"")  # a subject no server accepts: -ERR, then it hangs up

        t0 = time.monotonic()
        task = asyncio.get_running_loop().create_task(poison())
        rc = await run_until_closed_or_stopped(watch, 20.0)
        await task
        assert rc == EX_TEMPFAIL and time.monotonic() - t0 < 3
        assert nc.is_closed and "maximum control line exceeded" in watch.reason, watch.reason

        quiet = ConnectionWatch()
        nc2 = await natsclient.connect([server.url], name="svc-b", timeout=5, watch=quiet)
        assert await run_until_closed_or_stopped(quiet, 0.3) == 0
        await nc2.close()  # the service's own close after it stopped
        assert not quiet.closed.is_set() and quiet.stopping
    finally:
        server.stop(kill=True)


async def test_until_closed_cancels_a_looping_command_and_keeps_a_finished_ones_status(tmp_path: Path) -> None:
    """`top`'s and `events --follow`'s wrapper: a command that would loop for ever on a dead connection is
    cancelled (its finally runs) and the status is 75; a command that closes its own connection as it ends
    keeps its own status."""
    server = NatsServerProcess(tmp_path / "ns", extra_config="max_control_line: 512\n")
    server.start()
    try:
        watch = ConnectionWatch()
        cleaned: list[str] = []

        async def looping() -> int:
            nc = await natsclient.connect([server.url], name="top", timeout=5, watch=watch)
            await nc.publish("gna." + "y" * 600, b"")
            try:
                while True:
                    await asyncio.sleep(0.1)
            finally:
                cleaned.append("finally")

        t0 = time.monotonic()
        assert await until_closed(looping(), watch) == EX_TEMPFAIL
        assert time.monotonic() - t0 < 3 and cleaned == ["finally"]

        own = ConnectionWatch()

        async def finishing() -> int:
            nc = await natsclient.connect([server.url], name="events", timeout=5, watch=own)
            await nc.close()
            return 3

        assert await until_closed(finishing(), own) == 3
    finally:
        server.stop(kill=True)


# -- the central commands, black-box --------------------------------------------------------------

async def test_the_cordoner_exits_75_when_the_server_closes_its_connection(
        tmp_path: Path, tool_env: dict[str, str]) -> None:
    """The issue's failure on the cordoner: a server with max_control_line 512, and a node whose name makes
    the audit subject (plus reply inbox) longer than that. The server closes the cordoner's connection for
    good; the cordoner exits 75 within seconds, saying why, instead of staying up deaf."""
    server = NatsServerProcess(tmp_path / "ns", extra_config="max_control_line: 512\n")
    server.start()
    centrals: list[Central] = []
    try:
        nc = await nats.connect(server.url)
        bus = Bus(nc)
        await bus.ensure_stream()
        cord = await start_cordoner(tmp_path, server.url, tool_env, bus, centrals, enforce=False)
        long = "\u00e9" * 75  # 75 characters, a 450-character subject token: the publisher's own line fits
        m = _cond(long)
        subject = event_subject(long, "kmsg_xid", "critical")
        assert 420 < len(subject) < 512 - 30
        await nc.publish(subject, json.dumps(m).encode())  # a core publish: no reply inbox on this line
        await nc.flush()
        t0 = time.monotonic()
        rc = await asyncio.to_thread(_wait_exit, cord.proc, 8)
        if rc is None:  # a loaded machine: the cordoner's consumer may have come up after the first one
            m = _cond(long)
            await nc.publish(subject, json.dumps(m).encode())
            await nc.flush()
            t0 = time.monotonic()
            rc = await asyncio.to_thread(_wait_exit, cord.proc, 15)
        took = time.monotonic() - t0
        await nc.close()
        assert rc == EX_TEMPFAIL, (rc, cord.stderr[-2000:])
        assert took < 8, took
        last = cord.stderr.strip().splitlines()[-1]
        assert "closed for good" in last and "maximum control line exceeded" in last and "exiting 75" in last, last
        assert "Traceback" not in cord.stderr
    finally:
        for c in centrals:
            c.stop()
        server.stop(kill=True)


async def test_dashboard_top_events_and_cordoner_exit_75_when_their_credentials_are_revoked(
        tmp_path: Path, tool_env: dict[str, str]) -> None:
    """A configuration reload revokes the central user's password: the server closes each connection with
    -ERR 'Authorization Violation', which nats-py never reconnects from. `dashboard`, `top`, `events
    --follow` and `cordoner` each exit 75 within seconds (a supervisor restarts them with the new
    credentials), not 0 and not a traceback."""
    monitor = free_port()
    server = NatsServerProcess(tmp_path / "ns", extra_config=AUTH.format("old-secret") + f"http: 127.0.0.1:{monitor}\n")
    server.start()
    url = f"nats://u:old-secret@127.0.0.1:{server.port}"
    centrals: list[Central] = []
    try:
        nc = await nats.connect(url)
        bus = Bus(nc)
        await bus.ensure_stream()
        await bus.event(_cond("node-1"))
        cord = await start_cordoner(tmp_path, url, tool_env, bus, centrals, enforce=False)
        env = {**python_env(), "COLUMNS": "120"}
        ready = tmp_path / "dashboard.url"
        others = {
            "dashboard": Central(tmp_path, "dashboard", ["dashboard", "--nats", url, "--listen", "127.0.0.1:0",
                                                         "--ready-file", str(ready), "--duration", "60"], env),
            "top": Central(tmp_path, "top", ["top", "--nats", url, "--duration", "60", "--width", "120"], env),
            "events": Central(tmp_path, "events", ["events", "--follow", "--nats", url, "--duration", "60"], env),
        }
        centrals.extend(others.values())
        await until(lambda: ready.exists() and ready.read_text().endswith("\n"), 30, "the dashboard")
        await until(lambda: "node-1" in others["events"].out_path.read_text(errors="replace"), 30,
                    "events printing the history")
        async with aiohttp.ClientSession() as http:  # every command connected: the server's own list
            deadline = time.monotonic() + 30
            while True:
                async with http.get(f"http://127.0.0.1:{monitor}/connz") as r:
                    names = sorted(c.get("name", "") for c in (await r.json())["connections"] or [])
                if names.count("gpu-node-agent-fleet") == 2 and "gpu-node-agent-events" in names:
                    break
                assert time.monotonic() < deadline and all(c.proc.poll() is None for c in others.values()), names
                await asyncio.sleep(0.1)
        await nc.close()
        server.extra_config = AUTH.format("new-secret") + f"http: 127.0.0.1:{monitor}\n"
        server._write_config()
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)  # reload: the old password no longer authorizes
        t0 = time.monotonic()
        procs = {"cordoner": cord, **others}
        codes = {name: await asyncio.to_thread(_wait_exit, c.proc, max(0.1, 15 - (time.monotonic() - t0)))
                 for name, c in procs.items()}
        took = time.monotonic() - t0
        for name, c in procs.items():
            assert codes[name] == EX_TEMPFAIL, (name, codes[name], c.stderr[-1500:])
            assert "Traceback" not in c.stderr, (name, c.stderr[-1500:])
            assert "closed for good" in c.stderr and "exiting 75" in c.stderr, (name, c.stderr[-800:])
        assert took < 10, took
    finally:
        for c in centrals:
            c.stop()
        server.stop(kill=True)


# -- the cordoner's wait for a verdict ------------------------------------------------------------

RULES = SLURM_CONFIG + ('[[remediations.rules]]\nname = "cordon-on-timeout"\naction = "cordon"\n'
                        '[remediations.rules.match]\ntype = ["NCCLCollectiveTimeout"]\nstatus = ["event"]\n')


async def test_a_flood_of_unjudged_jobs_never_delays_another_nodes_hardware_cordon(
        nats_server: NatsServerProcess, tmp_path: Path, tool_env: dict[str, str]) -> None:
    """The issue's delay attack, with a rule that cordons on timeouts (so every timeout of an unjudged job
    wants to wait for the verdict): node A publishes NCCL timeouts for 1,000 fake jobs, none of which the
    correlator (not running) ever judges, then node B's GPU falls off the bus. B is drained within 3 s of
    its message. A's flood is bounded: at most 32 of its messages wait at a time, the rest are decided at once
    and, with no verdict, skipped (never cordoned); every message is settled (nothing left pending)."""
    nc = await nats.connect(nats_server.url)
    bus = Bus(nc)
    await bus.watch_audits()
    centrals: list[Central] = []
    try:
        cfg = tmp_path / "rules.toml"
        cfg.write_text(RULES)
        argv = ["cordoner", "--config", str(cfg), "--nats", nats_server.url, "--duration", "60", "--enforce",
                "--metrics-listen", ""]
        cord = Central(tmp_path, "cordoner", argv, tool_env)
        centrals.append(cord)
        deadline = time.monotonic() + 30
        while True:
            assert cord.proc.poll() is None, cord.stderr
            try:
                await bus.js.consumer_info("GNA_EVENTS", "gna-cordoner")
                break
            except Exception:
                assert time.monotonic() < deadline, cord.stderr
                await asyncio.sleep(0.1)
        subject = event_subject("node-a", "nccl_logs", "critical")
        for i in range(1000):
            await nc.publish(subject, json.dumps(_timeout("node-a", f"0xfake{i:04x}", 100 + i % 8)).encode())
        await nc.flush()
        await until(lambda: any(a["node"] == "node-a" for a in bus.audits), 15, "the cordoner on A's flood")
        b = _cond("node-b")
        t0 = time.monotonic()
        await bus.event(b)

        def drained_b() -> bool:
            return ["scontrol", "update", "NodeName=node-b", "State=DRAIN",
                    "Reason=gpu-node-agent: GPUFellOffBus"] in argv_log(tool_env)

        await until(lambda: drained_b() and any(a["trigger"]["id"] == b["id"] for a in bus.audits), 15,
                    "B's drain and its audit")
        took = time.monotonic() - t0
        assert took < 3.0, f"B's GPUFellOffBus was decided {took:.2f} s after it was published"
        (b_audit,) = [a for a in bus.audits if a["trigger"]["id"] == b["id"]]
        assert (b_audit["node"], b_audit["decision"]) == ("node-b", "executed"), b_audit

        await until(lambda: len([a for a in bus.audits if a["node"] == "node-a"]) >= 1000, 30, "A's 1,000 decisions")
        a_audits = [a for a in bus.audits if a["node"] == "node-a"]
        no_room = [a for a in a_audits if "no room to wait" in a["reason"]]
        # at most 32 wait at once: a few rounds of 32 while the lane drains (each waits its 3 s), the rest never
        assert len(a_audits) == 1000 and len(no_room) >= 800, (len(a_audits), len(no_room))
        assert all(a["decision"] == "skipped" and "node-a already has 32 messages waiting" in a["reason"]
                   for a in no_room), no_room[:2]
        deadline = time.monotonic() + 10
        while True:
            ci = await bus.js.consumer_info("GNA_EVENTS", "gna-cordoner")
            if (ci.num_ack_pending, ci.num_pending) == (0, 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert (ci.num_ack_pending, ci.num_pending, ci.num_redelivered) == (0, 0, 0), ci
        assert cord.stop() == 0, cord.stderr[-2000:]
        assert "Traceback" not in cord.stderr
    finally:
        for c in centrals:
            c.stop()
        await nc.close()


@pytest.mark.parametrize("share", [True, False])
async def test_the_lanes_bound_waiting_per_node_and_overall(nats_server: NatsServerProcess, tmp_path: Path,
                                                            tool_env: dict[str, str], share: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process, the real Cordoner on a real server: node A's timeouts of unjudged jobs take at most its
    share of the waiting room; another node's timeout still waits (its own share) unless the room as a whole
    is full; a verdict that arrives ends a wait at once and spares the victim."""
    from agent import config as configmod
    from agent.remediation.incidents import INCIDENTS_BUCKET
    from fleet.cordoner import Cordoner

    monkeypatch.setenv("PATH", tool_env["PATH"])
    for k in ("GNA_TEST_ARGV_LOG", "GNA_TEST_STATE"):
        monkeypatch.setenv(k, tool_env[k])
    cfg = configmod.parse(RULES, file="<t>").agent
    nc = await nats.connect(nats_server.url)
    bus = Bus(nc)
    await bus.watch_audits()
    cord = Cordoner(cfg, [nats_server.url], max_waiting=4 if share else 3, max_waiting_per_node=3)
    await cord.start()
    try:
        subject = event_subject("node-a", "nccl_logs", "critical")
        for i in range(10):
            await nc.publish(subject, json.dumps(_timeout("node-a", f"0xa{i}", 7)).encode())
        await until(lambda: len([a for a in bus.audits if a["node"] == "node-a"]) >= 7, 10, "A's overflow decided")
        assert cord.waiting == {"node-a": 3} and cord.no_room == 7
        c = _timeout("node-c", "0xc1", 9)
        await bus.event(c, subject=event_subject("node-c", "nccl_logs", "critical"))
        if share:  # room overall (4) for C's one message beyond A's 3
            await until(lambda: cord.waiting.get("node-c") == 1, 5, "C's message waiting")
            kv = await bus.js.key_value(INCIDENTS_BUCKET)
            await kv.put("0xc1", json.dumps({"job": "0xc1", "status": "open", "victims": ["node-c"],
                                             "culprit": None, "confidence": 0.0}).encode())
            await until(lambda: any(a["trigger"]["id"] == c["id"] for a in bus.audits), 2, "C decided on its verdict")
            (audit,) = [a for a in bus.audits if a["trigger"]["id"] == c["id"]]
            assert audit["decision"] == "skipped" and "victim of incident 0xc1" in audit["reason"], audit
        else:  # the room is full: decided at once, without a verdict: never cordoned for a symptom
            await until(lambda: any(a["trigger"]["id"] == c["id"] for a in bus.audits), 2, "C decided")
            (audit,) = [a for a in bus.audits if a["trigger"]["id"] == c["id"]]
            assert audit["decision"] == "skipped" and "3 messages are waiting" in audit["reason"], audit
        await until(lambda: not cord.waiting, 6, "A's waits ending with their grace")
        # their decision (and its audit) follows the end of the wait: A's own timeouts, decided by the rules
        await until(lambda: any(a["node"] == "node-a" and a["decision"] == "dry_run" for a in bus.audits), 5,
                    "A's own waited timeouts without a verdict decided by the rules (its own node)")
        assert not [x for x in argv_log(tool_env) if "NodeName=node-c" in x]
    finally:
        await cord.stop()
        await nc.close()


def test_every_command_that_runs_long_documents_exit_75() -> None:
    out = subprocess.run([*AGENT_CMD, "events", "--help"], capture_output=True, text=True, env=python_env(),
                         timeout=60)
    assert "75" in out.stdout and "closed for good" in out.stdout
    out = subprocess.run([*AGENT_CMD, "cordoner", "--help"], capture_output=True, text=True, env=python_env(),
                         timeout=60)
    assert "75" in out.stdout and "closed for good" in out.stdout
