"""#13 deliverable 9, node side: each adversarial finding reproduced against the real agent.

Black-box wherever it can be: the agent runs as a subprocess (``python -m agent run|check``) against
a real nats-server on loopback, and the tests look only where an operator could: the stream and
NATS subjects, /healthz and /metrics over HTTP (``<state_dir>/metrics.addr``), the agent's stderr
log, files in its state dir and /proc/<pid>/fd. Each test names its finding and fails if its fix
is reverted; where an attack cannot be staged from outside, the in-process Agent is used and the
docstring says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.nats_server import NatsServerProcess, free_port
from gna_types.subjects import encode_token
from sim.host import SimHost
from tests.conftest import AGENT_CMD, agent_config, running_agent, validate_message

COLLECTORS = ("gpu_devices", "infiniband", "juicefs", "kernel_modules", "kmsg_xid", "nccl_env", "nccl_logs", "nvml")
WARN = b"%s:%d:%d [0] misc/socket.cc:50 NCCL WARN %s\n"  # docs/formats.md: host:pid:tid [dev] file:line NCCL WARN


def only(*enabled: str, **sections: str) -> str:
    """TOML enabling only ``enabled`` collectors (with extra keys per collector); the rest disabled."""
    out = []
    for name in COLLECTORS:
        out.append(f"[collectors.{name}]\n")
        out.append(f"{sections.get(name, '')}\n" if name in enabled else "enabled = false\n")
    return "".join(out)


def write_config(tmp_path: Path, *, servers: list[str], host_root: Path, node: str = "n1", extra: str = "",
                 state_dir: Path | None = None) -> tuple[Path, Path]:
    state = state_dir or tmp_path / "state"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'node = "{node}"\nhost_root = "{host_root}"\nstate_dir = "{state}"\nshutdown_timeout = 5.0\n'
                   f'[nats]\nservers = {json.dumps(servers)}\nheartbeat_interval = 0.5\npublish_timeout = 2.0\n'
                   f'[metrics]\nlisten = "127.0.0.1:0"\n{extra}')
    return cfg, state


def http_get(addr: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class AgentProc:
    """``python -m agent run`` as an operator starts it; stderr (JSON log lines) captured."""

    def __init__(self, cfg: Path, state_dir: Path, *, preexec_fn: Callable[[], None] | None = None) -> None:
        self.cfg, self.state_dir, self.preexec_fn = cfg, state_dir, preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self) -> AgentProc:
        (self.state_dir / "metrics.addr").unlink(missing_ok=True)
        self.proc = subprocess.Popen([*AGENT_CMD, "run", "--config", str(self.cfg)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     preexec_fn=self.preexec_fn)  # the limits under test
        proc = self.proc

        def read() -> None:  # a pipe, not a file: RLIMIT_FSIZE must not reach the agent's own log
            assert proc.stderr is not None
            for raw in proc.stderr:
                self.lines.append(raw.decode(errors="replace"))

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        self.addr = wait_for(self._addr, 30, "the agent's metrics.addr")
        return self

    def _addr(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited {self.proc.returncode}:\n{''.join(self.lines)[-4000:]}")
        with contextlib.suppress(OSError):
            text = (self.state_dir / "metrics.addr").read_text().strip()
            return text or None
        return None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def health(self) -> tuple[int, str]:
        return http_get(self.addr, "/healthz")

    def metrics(self) -> str:
        return http_get(self.addr, "/metrics")[1]

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and doc.get("event") == event:
                    out.append(doc)
        return out

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        if self._reader:
            self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def agent_proc(cfg: Path, state_dir: Path, **kw: Any) -> Iterator[AgentProc]:
    a = AgentProc(cfg, state_dir, **kw)
    try:
        yield a.start()
    finally:
        a.kill()


async def _fetch(url: str, subject: str) -> list[dict[str, Any]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            sub = await js.pull_subscribe(subject, durable=None, stream="GNA_EVENTS")
        except nats.js.errors.NotFoundError:
            return []  # the agent has not created the stream yet
        out: list[dict[str, Any]] = []
        while True:
            try:
                batch = await sub.fetch(1000, timeout=0.3)
            except (nats.errors.TimeoutError, TimeoutError):
                return out
            for m in batch:
                out.append(json.loads(m.data))
                await m.ack()
    finally:
        await nc.close()


def stream(url: str, subject: str = "gna.events.>") -> list[dict[str, Any]]:
    """Everything the stream holds under ``subject`` now."""
    return asyncio.run(_fetch(url, subject))


def stream_until(url: str, pred: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str,
                 subject: str = "gna.events.>") -> list[dict[str, Any]]:
    last: list[list[dict[str, Any]]] = [[]]

    def probe() -> bool:
        last[0] = stream(url, subject)
        return pred(last[0])

    try:
        wait_for(probe, timeout, what, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the stream holds {len(last[0])} messages") from None
    return last[0]


def of_type(msgs: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [m for m in msgs if m["type"] == type_]


def warn_texts(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["details"]["line"].split("NCCL WARN ", 1)[1] for m in of_type(msgs, "NCCLWarning")
            if m["reason"] == "NCCLWarn"]


@pytest.fixture
def nats_stopped(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A nats-server with a fixed port that is not running yet (an outage the test ends)."""
    server = NatsServerProcess(tmp_path / "nats-server", port=free_port())
    yield server
    server.stop(kill=True)


# -- D6 --------------------------------------------------------------------------------------------

async def test_d6_a_tailer_exception_reopens_every_file_and_healthz_says_failing_while_it_is(
        tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """D6: after one exception the NCCL tailer closed its descriptors but kept its entries and never
    reopened them; CollectorFailing resolved itself (a good housekeeping pass reset the streak) and
    /healthz said ok while no line was read again.

    In-process (the real Agent, its real /healthz over HTTP): an exception inside the collector's line
    handler cannot be provoked from outside, every input the handler sees is parsed defensively, so one
    is injected once by patching ``NCCLLogsCollector._handle``. The restarted run() is judged healthy
    after staying up ``healthy_after`` (60 s in production), shortened on the runner to keep the test short.
    """
    from collectors.nccl.plugin import NCCLLogsCollector

    original = NCCLLogsCollector._handle
    armed = {"raise": False, "raised": 0}

    async def handle(self: NCCLLogsCollector, tf: Any, data: bytes, base: int) -> bool:
        if armed["raise"]:
            armed["raise"] = False
            armed["raised"] += 1
            raise RuntimeError("injected handler failure")
        return await original(self, tf, data, base)

    monkeypatch.setattr(NCCLLogsCollector, "_handle", handle)
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    logs = [logdir / "n1.11.log", logdir / "n1.12.log"]
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node="n1", extra=only(
        "nccl_logs", nccl_logs="interval = 0.2\njitter = 0.0\nrestart_backoff_min = 0.3\nrescan_interval = 0.5"))

    def write(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            with open(logs[i % 2], "ab") as fh:
                fh.write(WARN % (b"n1", 11 + i % 2, 11 + i % 2, b"distinct warning %d" % i))

    async def published(n: int) -> list[str]:
        deadline = time.monotonic() + 15
        while True:
            texts = warn_texts(await _fetch(nats_server.url, "gna.events.>"))
            if len(texts) >= n or time.monotonic() > deadline:
                return texts
            await asyncio.sleep(0.1)

    async with running_agent(cfg) as agent:
        while "nccl_logs" not in agent.runners or not (tmp_path / "state" / "metrics.addr").exists():
            await asyncio.sleep(0.01)
        runner = agent.runners["nccl_logs"]
        runner.healthy_after = 3.0
        addr = (tmp_path / "state" / "metrics.addr").read_text().strip()

        async def health() -> tuple[int, str]:
            return await asyncio.to_thread(http_get, addr, "/healthz")

        async def passes() -> float:
            return metric((await asyncio.to_thread(http_get, addr, "/metrics"))[1], "gna_collector_runs_total",
                          collector="nccl_logs")

        write(0, 10)
        assert len(await published(10)) == 10
        assert await health() == (200, "ok")
        armed["raise"] = True
        write(10, 20)
        while armed["raised"] == 0:
            await asyncio.sleep(0.02)
        # housekeeping passes keep succeeding; the crashed run() must still count as failing
        before = await passes()
        while await passes() < before + 2:
            await asyncio.sleep(0.05)
        code, text = await health()
        assert code == 200 and "failing: ['nccl_logs']" in text, text
        texts = await published(20)  # the restarted run() reopened both files from their checkpoints
        assert sorted(texts) == sorted(f"distinct warning {i}" for i in range(20))
        code, text = await health()
        assert "nccl_logs" in text, "healthy only once the restarted run() stayed up healthy_after"
        t0 = time.monotonic()
        while (await health())[1] != "ok":
            await asyncio.sleep(0.1)
            assert time.monotonic() - t0 < 10, "/healthz never recovered"
        write(20, 30)  # and it keeps reading after the recovery
        texts = await published(30)
        while agent.spool and agent.spool.depth:
            await asyncio.sleep(0.05)
    msgs = await _fetch(nats_server.url, "gna.events.>")
    texts = warn_texts(msgs)
    assert len(texts) == len(set(texts)) == 30, "every line published exactly once"
    offsets = [(m["details"]["file"], m["details"]["offset"]) for m in of_type(msgs, "NCCLWarning")]
    assert len(offsets) == len(set(offsets))
    assert armed["raised"] == 1


# -- D7 --------------------------------------------------------------------------------------------

def _nofile(limit: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return set_limit


def test_d7_six_hundred_logs_under_a_low_descriptor_limit(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """D7: one descriptor per log file was held for ever; under ``ulimit -n 1024`` a node with many job
    logs ran out and the NATS forwarder failed too. Here: RLIMIT_NOFILE 256, max_open_files 32 and 600
    logs with one NCCL WARN each; every warning arrives, the agent's descriptors (/proc/<pid>/fd) stay
    near its baseline + 32, and it keeps publishing (a new file, a parked file that grows)."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    cfg, state = write_config(tmp_path, servers=[nats_server.url], host_root=host.root, extra=only(
        "nccl_logs", nccl_logs="max_open_files = 32\nrescan_interval = 1.0"))
    n = 600
    with agent_proc(cfg, state, preexec_fn=_nofile(256)) as agent:
        assert agent.health()[0] == 200
        time.sleep(0.5)
        baseline = agent.fds()
        peak = [baseline]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], agent.fds())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            for i in range(n):
                (logdir / f"n1.{1000 + i}.log").write_bytes(WARN % (b"n1", 1000 + i, 1000 + i, b"warn of job %d" % i))
            msgs = stream_until(nats_server.url, lambda m: len(warn_texts(m)) >= n, 60, f"{n} NCCLWarnings")
            # still publishing: a new log, and one of the parked ones growing
            (logdir / "n1.5000.log").write_bytes(WARN % (b"n1", 5000, 5000, b"a new job"))
            with open(logdir / "n1.1000.log", "ab") as fh:
                fh.write(WARN % (b"n1", 1000, 1000, b"the first job again"))
            msgs = stream_until(nats_server.url, lambda m: len(warn_texts(m)) >= n + 2, 20, "two more warnings")
        finally:
            stop.set()
            sampler.join()
        metrics = agent.metrics()
        assert agent.stop() == 0
    texts = warn_texts(msgs)
    assert sorted(texts) == sorted([f"warn of job {i}" for i in range(n)] + ["a new job", "the first job again"])
    assert peak[0] <= baseline + 32 + 8, f"descriptors grew from {baseline} to {peak[0]}"
    assert metric(metrics, "gna_nats_publish_errors_total") == 0


# -- D8 --------------------------------------------------------------------------------------------

async def _heartbeats(url: str, subject: str, seconds: float) -> list[bytes]:
    nc = await nats.connect(url)
    got: list[bytes] = []
    try:
        async def on(msg: Any) -> None:
            got.append(msg.data)

        await nc.subscribe(subject, cb=on)
        await asyncio.sleep(seconds)
    finally:
        await nc.close()
    return got


def test_d8_four_thousand_foreign_hosts_cannot_flood_conditions_or_stop_the_heartbeat(tmp_path: Path) -> None:
    """D8: a job log naming 4,000 other hosts' host:pid raised 3,602 critical conditions here, and the
    heartbeat (carrying every condition) grew past max_payload and stopped: the node looked dead.
    Here nats-server has max_payload 16 KiB; a launcher log names this node and 4,000 other hosts (their
    socket fallbacks are not judged here) and a copied log that never names this node holds 300 hosts
    (judged, but capped: 64 conditions, then one aggregate). Heartbeats keep arriving, each within
    max_payload, with conditions_total. (The copied log's hosts are this node's by ``own_hosts``: a log copied
    here to be checked; without it they are other nodes' lines, never judged here.)"""
    server = NatsServerProcess(tmp_path / "nats-server", extra_config="max_payload: 16384")
    server.start()
    try:
        host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
        host.write("/proc/sys/kernel/hostname", "gpu-0007.cluster.local\n")
        host.write("/proc/107/environ", "NCCL_DEBUG=INFO\0")  # this node's rank is running
        logdir = host.p("/var/log/nccl")
        logdir.mkdir(parents=True)
        fallback = b"%s:%d:%d [0] NCCL INFO NET/IB : No device found.\n%s:%d:%d [0] NCCL INFO Using network Socket\n"

        def lines(hosts: list[tuple[bytes, int]]) -> bytes:
            return b"".join(fallback % (h, p, p, h, p, p) for h, p in hosts)

        (logdir / "launcher.log").write_bytes(
            lines([(b"gpu-0007", 107)] + [(b"gpu-%04d" % i, 100 + i) for i in range(1000, 5000)]))
        cfg, state = write_config(tmp_path, servers=[server.url], host_root=host.root, node="gpu-0007.cluster.local",
                                  extra=only("nccl_logs", nccl_logs='rescan_interval = 1.0\nown_hosts = ["node-*"]'))
        with agent_proc(cfg, state) as agent:
            stream_until(server.url, lambda m: any(x["entity"] == "nccl:gpu-0007:107" for x in m), 20,
                         "this node's own fallback")
            (logdir / "copied.log").write_bytes(lines([(b"node-%03d" % i, i + 1) for i in range(300)]))
            msgs = stream_until(server.url, lambda m: any(x["entity"] == "overflow:nccl_logs" for x in m), 20,
                                "the aggregate condition")
            beats = asyncio.run(_heartbeats(server.url, f"gna.heartbeat.{encode_token('gpu-0007.cluster.local')}",
                                            2.5))
            code, _ = agent.health()
            assert agent.stop() == 0
        msgs = stream(server.url)
    finally:
        server.stop(kill=True)
    for m in msgs:
        validate_message(m)
    conds = [m for m in msgs if m["kind"] == "condition" and m["collector"] == "nccl_logs"]
    entities = {m["entity"] for m in conds}
    assert "nccl:gpu-0007:107" in entities
    assert not any(e.startswith("nccl:gpu-") and e != "nccl:gpu-0007:107" for e in entities), \
        "another host's lines in a file naming this node were judged here"
    assert len(entities) <= 64 + 1 and "overflow:nccl_logs" in entities
    assert len(beats) >= 3, "the heartbeat stopped"
    docs = [json.loads(b) for b in beats]
    assert all(len(b) <= 16384 for b in beats), max(len(b) for b in beats)
    last = docs[-1]
    assert last["node"] == "gpu-0007.cluster.local"
    # this node's rank, 63 of the copied log's hosts, the aggregate; the other 237 folded into it
    assert last["conditions_total"] == 65 and last["conditions_folded"] == {"nccl_logs": 300 - 63}
    assert last["conditions_complete"] is False
    assert len(last["conditions"]) <= last["conditions_total"]
    assert code == 200


# -- D9 --------------------------------------------------------------------------------------------

def test_d9_warnings_refused_by_a_full_spool_are_published_once_and_never_counted_as_repeats(
        tmp_path: Path, nats_stopped: NatsServerProcess) -> None:
    """D9: with the spool full, NCCL warnings were counted before the bus accepted them: the first of
    each was lost and a false "repeated N times" summary went out. Here NATS is down and the spool holds
    8 KiB (policy drop_newest: a full spool refuses); 40 distinct warnings in one log (then two real repeats
    of the first) fill it, then NATS comes up within the warning window: each is published exactly once
    with count 1, and the one summary counts the real repeats only. Found here: a chunk accepted in part
    and retried counted its accepted lines again on every retry ("repeated 4 times" for lines seen once);
    fixed in collectors/nccl/plugin.py (a window remembers the last line it counted per file)."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    n = 40
    (logdir / "n1.77.log").write_bytes(b"".join(WARN % (b"n1", 77, 78, b"warning number %d" % i) for i in range(n))
                                       + WARN % (b"n1", 77, 78, b"warning number 0") * 2)  # two real repeats
    cfg, state = write_config(tmp_path, servers=[nats_stopped.url], host_root=host.root, extra=(
        "[spool]\nmax_bytes = 8192\nsegment_bytes = 4096\npolicy = \"drop_newest\"\nfsync = false\n" + only(
            "nccl_logs", nccl_logs="interval = 0.3\njitter = 0.0\nwarning_window = 2.0\nrescan_interval = 0.3")))
    with agent_proc(cfg, state) as agent:
        wait_for(lambda: agent.log("spool_full_dropped"), 15, "the spool to refuse a warning")
        nats_stopped.start()  # within warning_window: the chunk is retried while its windows are open
        msgs = stream_until(nats_stopped.url, lambda m: len(warn_texts(m)) >= n, 30, f"{n} warnings")
        time.sleep(2.5)  # past warning_window: a wrongly counted repeat is summed up by now
        assert agent.stop() == 0
    msgs = stream(nats_stopped.url)
    warnings = of_type(msgs, "NCCLWarning")
    assert sorted(warn_texts(msgs)) == sorted(f"warning number {i}" for i in range(n))
    assert all(m["details"]["count"] == 1 for m in warnings if m["reason"] == "NCCLWarn")
    # the only summary is of the real repeats: each retry of the refused chunk used to add one per line
    assert [m["message"] for m in warnings if m["reason"] == "NCCLWarnRepeated"] == [
        "NCCL WARN repeated 3 times in n1:77: warning number 0"]


# -- D10 -------------------------------------------------------------------------------------------

def test_d10_one_flipped_byte_mid_segment_loses_only_its_record(tmp_path: Path,
                                                                  nats_stopped: NatsServerProcess) -> None:
    """D10: one flipped byte mid-segment silently discarded the rest of the segment (830 of 1,000 events
    gone, gna_spool_dropped 0). Here the agent spools 1,000 warnings while NATS is unreachable, stops,
    one byte in the middle of the segment file is flipped, and it starts with NATS up: all but the
    damaged record arrive, and a SpoolCorrupted event (and gna_spool_dropped) says what was skipped."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    n = 1000
    (logdir / "n1.77.log").write_bytes(b"".join(WARN % (b"n1", 77, 78, b"spooled warning %d" % i) for i in range(n)))
    cfg, state = write_config(tmp_path, servers=[nats_stopped.url], host_root=host.root,
                              extra="[spool]\nfsync = false\n" + only("nccl_logs"))
    with agent_proc(cfg, state) as agent:
        wait_for(lambda: metric(agent.metrics(), "gna_spool_depth") >= n, 30, f"{n} records spooled")
        assert agent.stop() == 0
    (seg,) = sorted((state / "spool").glob("*.seg"))
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x01
    seg.write_bytes(bytes(data))
    nats_stopped.start()
    with agent_proc(cfg, state) as agent:
        msgs = stream_until(nats_stopped.url, lambda m: bool(of_type(m, "SpoolCorrupted")) and len(warn_texts(m))
                            >= n - 2, 30, "the spool's intact records")
        time.sleep(0.5)
        metrics = agent.metrics()
        assert agent.stop() == 0
    msgs = stream(nats_stopped.url)
    (corrupted,) = of_type(msgs, "SpoolCorrupted")
    validate_message(corrupted)
    lost = corrupted["details"]["records"]
    assert corrupted["details"]["segments"] == 1 and corrupted["details"]["bytes"] > 0 and 1 <= lost <= 2
    texts = warn_texts(msgs)
    assert len(texts) == len(set(texts)) == n - lost
    assert metric(metrics, "gna_spool_dropped_total", severity="corrupted") == lost


# -- D11 -------------------------------------------------------------------------------------------

def _fsize(limit: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return set_limit


def test_d11_healthz_recovers_after_a_transient_disk_full(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """D11: /healthz stayed 503 for ever after one transient disk-full (a liveness probe then restarts a
    recovered agent in a loop). Staged black-box without root: the agent runs with a soft RLIMIT_FSIZE
    of 48 KiB, so appending to its spool segment past that fails (EFBIG: the same OSError path as ENOSPC,
    and CPython ignores SIGXFSZ) while its small state files still fit; then ``prlimit`` on the running
    agent lifts the limit, as freeing the disk would. /healthz is 503 while writes fail, 200 after, and
    every warning refused meanwhile is published (the collector retried it)."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    cfg, state = write_config(tmp_path, servers=[nats_server.url], host_root=host.root, extra=(
        "[spool]\nsegment_bytes = 1048576\nmax_bytes = 4194304\nfsync = false\n"
        + only("nccl_logs", nccl_logs="rescan_interval = 0.3")))
    n = 120
    with agent_proc(cfg, state, preexec_fn=_fsize(48 * 1024)) as agent:
        assert agent.health()[0] == 200
        with open(logdir / "n1.77.log", "ab") as fh:
            for i in range(n):
                fh.write(WARN % (b"n1", 77, 78, b"warning during the disk-full %d" % i))
        _, text = wait_for(lambda: (h := agent.health())[0] == 503 and h, 15, "/healthz 503 while writes fail")
        assert "writes failing now" in text
        assert agent.log("spool_write_failed")
        resource.prlimit(agent.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        _, text = wait_for(lambda: (h := agent.health())[0] == 200 and h, 15, "/healthz 200 after the disk-full")
        assert "spool recovered after" in text and "writes failing now" not in text
        msgs = stream_until(nats_server.url, lambda m: len(warn_texts(m)) >= n, 20, "every refused warning")
        assert agent.health()[0] == 200
        assert agent.stop() == 0
    assert sorted(warn_texts(msgs)) == sorted(f"warning during the disk-full {i}" for i in range(n))


# -- D13 -------------------------------------------------------------------------------------------

def test_d13_a_counter_beyond_its_width_is_rejected_not_a_cordon(tmp_path: Path,
                                                                  nats_server: NatsServerProcess) -> None:
    """D13: counter values beyond their width (2^70 in the 8-bit link_downed) were accepted as a huge
    increase: a critical IBErrorCountersIncreasing and a "would cordon". ``check --format json`` lists
    the value as unparsed and is not critical; a running agent that saw 0 then 2^70 raises nothing about
    it, shows it in gna_source_unparsed_lines, and no remediation decision is audited."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=1)
    counter = "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed"
    host.set_counter("mlx5_0", 1, "link_downed", str(1 << 70))
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    report = json.loads(r.stdout)
    assert r.returncode != 2 and report["status"] != "unhealthy", report
    assert not [c for c in report["conditions"] if c["collector"] == "infiniband" and c["severity"] == "critical"]
    (rejected,) = [u for u in report["unparsed"] if u["source"] == counter]
    assert rejected["collector"] == "infiniband" and rejected["count"] >= 1

    host.set_counter("mlx5_0", 1, "link_downed", 0)
    cfg, state = write_config(tmp_path, servers=[nats_server.url], host_root=host.root,
                              extra=only("infiniband", infiniband="interval = 0.2\njitter = 0.0"))
    with agent_proc(cfg, state) as agent:
        wait_for(lambda: metric(agent.metrics(), "gna_collector_runs_total", collector="infiniband") >= 2, 15,
                 "two infiniband passes")
        host.set_counter("mlx5_0", 1, "link_downed", str(1 << 70))
        wait_for(lambda: metric(agent.metrics(), "gna_source_unparsed_lines", collector="infiniband",
                                source=counter) >= 3, 15, "the rejected value in /metrics")
        host.set_counter("mlx5_0", 1, "link_downed", 1)  # a new baseline, then a real increase is still seen
        runs = metric(agent.metrics(), "gna_collector_runs_total", collector="infiniband")
        wait_for(lambda: metric(agent.metrics(), "gna_collector_runs_total", collector="infiniband") >= runs + 2, 15,
                 "two more passes")
        host.set_counter("mlx5_0", 1, "link_downed", 2)
        wait_for(lambda: any(m["type"] == "IBErrorCountersIncreasing" for m in stream(nats_server.url)), 15,
                 "the genuine increase")
        assert agent.stop() == 0
    msgs = stream(nats_server.url)
    ib = [m for m in msgs if m["type"] == "IBErrorCountersIncreasing"]
    deltas = [c["delta"] for m in ib for c in m["details"]["counters"] if c["counter"] == "link_downed"]
    assert deltas and all(d == 1 for d in deltas), deltas
    audits = stream(nats_server.url, "gna.actions.>")
    assert str(1 << 70) not in json.dumps(msgs + audits), "the impossible value was taken as a delta"


# -- D14 -------------------------------------------------------------------------------------------

def test_d14_wrong_typed_state_files_never_stop_the_agent(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """D14: a state.json with a wrong-typed field crashed every start (a crash loop under systemd).
    Every state file the agent keeps is given wrong types or garbage: it starts, publishes, /healthz is
    200, and each bad whole file is set aside as <name>.bad-<epoch> with one log line naming it."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=1)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.")
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    (logdir / "n1.77.log").write_bytes(WARN % (b"n1", 77, 78, b"after the bad state"))
    cfg, state = write_config(tmp_path, servers=[nats_server.url], host_root=host.root)
    bad = {  # whole files a reader validates and sets aside
        "spool/state.json": '{"version": 1, "acked_seq": "12", "dropped": [0, 0, 0], "announced": [0, 0, 0]}',
        "collectors/kmsg_xid/kmsg.json": '{"version": 1, "boot_id": 7, "seq": "x", "fatal": []}',
        "collectors/gpu_devices/seen_pci.json": '{"version": 1, "boot_id": "b", "seen": [1, 2]}',
        "collectors/infiniband/seen_hcas.json": "[1, 2, 3]",
    }
    entries = {  # files whose bad entries are dropped one by one (the rest of the file is kept)
        "conditions.json": '{"version": 1, "active": [{"collector": 5}, "x"], "overflow": [[1, 2, 3]]}',
        "collectors/nccl_logs/nccl_checkpoints.json": '{"version": 1, "files": [{"dev": "x", "ino": -1}, 7]}',
    }
    for rel, text in {**bad, **entries}.items():
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_text(text)
    with agent_proc(cfg, state) as agent:
        msgs = stream_until(nats_server.url, lambda m: "after the bad state" in warn_texts(m)
                            and any(x["type"] == "GPUXid" or x["collector"] == "kmsg_xid" for x in m), 20,
                            "the agent publishing")
        code, text = agent.health()
        assert code == 200, text
        invalid = agent.log("state_file_invalid")
        ignored = agent.log("condition_state_entries_ignored")
        assert agent.stop() == 0
    for rel in bad:
        path = state / rel
        assert list(path.parent.glob(f"{path.name}.bad-*")), f"{rel} not set aside"
    assert sorted(Path(x["path"]).relative_to(state).as_posix() for x in invalid) == sorted(bad)
    assert all(Path(x["set_aside"]).name.startswith(Path(x["path"]).name + ".bad-") for x in invalid)
    assert ignored and ignored[0]["count"] == 3
    for rel in entries:  # rewritten by the agent as valid state
        assert json.loads((state / rel).read_text())["version"] == 1
    for m in msgs:
        validate_message(m)


# -- D15 -------------------------------------------------------------------------------------------

def test_d15_a_symlink_out_of_the_log_dir_is_not_followed(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """D15: the tailer followed a symlink in the (job-writable) log dir to any file, so a root-only file's
    line was published. Here /var/log/nccl holds a legit log, a symlink to a file outside the globs' roots
    (one in the host's /etc, one outside the host root) and a symlink to a file inside the roots: only the
    legit and the inside one are read, and the agent logs the refusal."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    (logdir / "archive").mkdir(parents=True)
    secret = host.write("/etc/secret-root-only", (WARN % (b"n1", 9, 9, b"SECRET from etc")).decode())
    secret.chmod(0o600)
    outside = tmp_path / "elsewhere.log"
    outside.write_bytes(WARN % (b"n1", 8, 8, b"SECRET from outside the host root"))
    (logdir / "n1.1.log").write_bytes(WARN % (b"n1", 1, 1, b"legit line"))
    (logdir / "archive" / "old-run").write_bytes(WARN % (b"n1", 2, 2, b"linked from inside the roots"))
    (logdir / "n1.9.log").symlink_to(secret)
    (logdir / "n1.8.log").symlink_to(outside)
    (logdir / "n1.2.log").symlink_to("archive/old-run")
    cfg, state = write_config(tmp_path, servers=[nats_server.url], host_root=host.root, extra=only("nccl_logs"))
    with agent_proc(cfg, state) as agent:
        stream_until(nats_server.url, lambda m: len(warn_texts(m)) >= 2, 15, "the two readable warnings")
        time.sleep(1.0)  # a followed link would have been read in the same pass
        refused = agent.log("tail_symlink_outside_roots")
        assert agent.stop() == 0
    msgs = stream(nats_server.url)
    assert sorted(warn_texts(msgs)) == ["legit line", "linked from inside the roots"]
    assert not [m for m in msgs if "SECRET" in json.dumps(m)]
    assert refused and refused[0]["path"] in ("/var/log/nccl/n1.9.log", "/var/log/nccl/n1.8.log")
