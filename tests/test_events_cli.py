"""The command-line contract of `events` (history, --follow, --new, --count, --duration, a closed
pipe) and of every central command against an unreachable NATS (one line, exit 69, bounded)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import nats
import pytest

from agent.nats_server import NatsServerProcess
from sim.host import SimHost
from tests.conftest import AGENT_CMD, agent_config, running_agent, validate_message


async def _emit(tmp_path: Path, url: str, entities: list[str]) -> None:
    async with running_agent(agent_config(tmp_path, servers=[url])) as agent:
        for e in entities:
            await agent.emitter_for("burst").event("BurstEvent", severity="warning", entity=e, reason="T",
                                                   message="m")
        while agent.spool is not None and agent.spool.depth:
            await asyncio.sleep(0.05)


def _events(url: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT_CMD, "events", "--nats", url, "--collector", "burst", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_history_is_the_default_and_ends_by_itself(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    asyncio.run(_emit(tmp_path, nats_server.url, ["b0", "b1", "b2"]))
    t0 = time.monotonic()
    r = _events(nats_server.url)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["entity"] for x in r.stdout.splitlines()] == ["b0", "b1", "b2"]
    assert time.monotonic() - t0 < 10, "history mode must not wait for new messages"
    for line in r.stdout.splitlines():
        validate_message(json.loads(line))
    # --all is the same history (kept for scripts); a filter that matches nothing ends at once
    assert _events(nats_server.url, "--all").stdout == r.stdout
    none = _events(nats_server.url, "--node", "no-such-node")
    assert none.returncode == 0 and none.stdout == ""


@pytest.mark.parametrize("n", [1, 2, 3])
def test_count_prints_exactly_n(tmp_path: Path, nats_server: NatsServerProcess, n: int) -> None:
    asyncio.run(_emit(tmp_path, nats_server.url, [f"b{i}" for i in range(5)]))
    r = _events(nats_server.url, "--count", str(n))
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["entity"] for x in r.stdout.splitlines()] == [f"b{i}" for i in range(n)]
    f = _events(nats_server.url, "--follow", "--count", str(n), "--duration", "20")
    assert f.returncode == 0 and len(f.stdout.splitlines()) == n


async def test_follow_prints_history_then_new_and_new_skips_history(tmp_path: Path, nats_server: NatsServerProcess,
                                                                     sim_host: SimHost) -> None:
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=sim_host.root,
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 10)
        sim_host.remove_dev_node("nvidia1")  # history: one critical GPUDevicesMissing
        for _ in range(100):
            if agent.spool and not agent.spool.depth and agent.forwarder and agent.forwarder.published:
                break
            await asyncio.sleep(0.1)
        base = [*AGENT_CMD, "events", "--nats", nats_server.url, "--node", "node-a.example.com",
                "--severity", "critical", "--duration", "25"]
        follow = await asyncio.create_subprocess_exec(*base, "--follow", "--count", "2", stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE)
        new = await asyncio.create_subprocess_exec(*base, "--new", "--count", "1", stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE)
        await _consumers(nats_server.url, 2)  # both subscribed: --new sees only what comes after
        sim_host.remove_dev_node("nvidia2")
        fout, ferr = await asyncio.wait_for(follow.communicate(), 30)
        nout, nerr = await asyncio.wait_for(new.communicate(), 30)
    assert follow.returncode == 0 and new.returncode == 0, (ferr, nerr)
    followed = [json.loads(x) for x in fout.decode().splitlines()]
    assert [m["details"]["device_node"] for m in followed] == ["/dev/nvidia1", "/dev/nvidia2"]
    assert all(m["type"] == "GPUDevicesMissing" and m["severity"] == "critical" for m in followed)
    assert [json.loads(x)["details"]["device_node"] for x in nout.decode().splitlines()] == ["/dev/nvidia2"]


async def _consumers(url: str, n: int, timeout: float = 60.0) -> None:
    """Wait until ``n`` consumers (one per `events` process) exist on the stream."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        deadline = asyncio.get_running_loop().time() + timeout
        while (await js.stream_info("GNA_EVENTS")).state.consumer_count < n:
            assert asyncio.get_running_loop().time() < deadline, "the events processes never subscribed"
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


def test_follow_ends_when_the_pipe_reader_goes_away_on_a_quiet_fleet(tmp_path: Path,
                                                                      nats_server: NatsServerProcess) -> None:
    asyncio.run(_emit(tmp_path, nats_server.url, ["only"]))
    events = subprocess.Popen([*AGENT_CMD, "events", "--nats", nats_server.url, "--follow"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert events.stdout is not None
    head = subprocess.run(["head", "-n", "1"], stdin=events.stdout, capture_output=True, text=True, timeout=30)
    events.stdout.close()  # only head holds the read end now; it has exited
    t0 = time.monotonic()
    try:
        rc = events.wait(10)
    finally:
        if events.poll() is None:
            events.kill()
    assert json.loads(head.stdout)["entity"] == "only"
    assert rc == 0 and time.monotonic() - t0 < 5
    assert events.stderr is not None and b"Traceback" not in events.stderr.read()


def test_duration_ends_a_quiet_follow(nats_server: NatsServerProcess) -> None:
    t0 = time.monotonic()
    r = subprocess.run([*AGENT_CMD, "events", "--nats", nats_server.url, "--follow", "--duration", "2"],
                       capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout == ""
    assert "waiting for stream GNA_EVENTS" in r.stderr and r.stderr.count("\n") == 1
    assert 1.5 < took < 10


UNREACHABLE = [["events"], ["events", "--follow"], ["top", "--once"], ["budget", "status"],
               ["dashboard", "--listen", "127.0.0.1:0"], ["cordoner"], ["correlator"], ["nats", "setup"]]


def test_unreachable_nats_is_one_line_and_exit_69() -> None:
    """One line on stderr, as the README and each --help promise: the cordoner also printed its JSON log
    lines (nats_connecting, nats_error) before it (issue 22 item 9). Every command at once: each waits out
    its own one-second connect timeout, side by side."""
    t0 = time.monotonic()
    procs = [(argv, subprocess.Popen([*AGENT_CMD, *argv, "--nats", "nats://user:s3cret@127.0.0.1:1",
                                      "--connect-timeout", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)) for argv in UNREACHABLE]
    try:
        for argv, proc in procs:
            out, err = proc.communicate(timeout=30)
            what = " ".join(argv)
            assert proc.returncode == 69, (what, err)
            assert err.count("\n") == 1, (what, err)
            last = err.strip()
            assert last.startswith("gpu-node-agent: cannot reach NATS") and "127.0.0.1:1" in last, (what, err)
            assert "Traceback" not in err and "s3cret" not in err and out == "", (what, err, out)
    finally:
        for _argv, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert time.monotonic() - t0 < 15  # eight one-second timeouts side by side, on two cores


def test_duration_bounds_the_connect_attempt() -> None:
    t0 = time.monotonic()
    r = subprocess.run([*AGENT_CMD, "dashboard", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0",
                        "--duration", "1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 69 and "within 1 s" in r.stderr
    assert time.monotonic() - t0 < 6


def test_spoofed_and_damaged_messages_never_reach_stdout(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """#13: stdout holds only schema-valid messages of the subject's node (a pipe into jq); the others are
    summed up on stderr, and their bytes (a terminal escape) are never printed."""
    asyncio.run(_emit(tmp_path, nats_server.url, ["b0"]))
    first = _events(nats_server.url)
    assert first.returncode == 0, first.stderr
    good = json.loads(first.stdout.splitlines()[0])

    async def publish() -> None:
        from gna_types.subjects import event_subject

        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        subj = event_subject(good["node"], "burst", "warning")
        await js.publish(subj, json.dumps({**good, "id": "x1", "node": "someone-else"}).encode())
        await js.publish(subj, b"\x1b]0;owned\x07\x1b[2J not json")
        await js.publish(subj, json.dumps({**good, "id": "x2", "entity": "\x1b[31mred"}).encode())
        await nc.close()

    asyncio.run(publish())
    r = _events(nats_server.url)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["entity"] for x in lines] == ["b0", "\x1b[31mred"]  # valid, so shown, but as JSON text:
    assert "\x1b" not in r.stdout and "\\u001b[31mred" in r.stdout
    assert "skipped 2 messages that failed validation (node_mismatch: 1, not_json: 1)" in r.stderr
    assert "\x1b" not in r.stderr


def test_job_prints_only_that_jobs_messages(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """Issue 22: an incident shows a sample of its evidence; `events --job` is where the rest is."""
    async def emit() -> None:
        async with running_agent(agent_config(tmp_path, servers=[nats_server.url])) as agent:
            em = agent.emitter_for("burst")
            for i, job in enumerate(["0xaa", "0xbb", "0xaa", None]):
                await em.event("BurstEvent", severity="warning", entity=f"b{i}", reason="T", message="m",
                               details={"job": job} if job else {})
            while agent.spool is not None and agent.spool.depth:
                await asyncio.sleep(0.05)

    asyncio.run(emit())
    r = _events(nats_server.url, "--job", "0xaa")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["entity"] for x in r.stdout.splitlines()] == ["b0", "b2"]
    assert _events(nats_server.url, "--job", "0xcc").stdout == ""
