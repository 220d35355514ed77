from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.nats_server import NatsServerProcess
from collectors.nccl.hca_names import exact_hca_value, hca_prefix_surprises
from collectors.nccl.line import parse_line
from collectors.nccl.matching import match_line
from collectors.nccl.prefilter import candidate_lines
from collectors.nccl.process import parse_ib_devices
from collectors.nccl_env import hca_prefix_overmatch, ifname_matches, lint, parse_environ
from sim.host import SimHost
from tests.conftest import AGENT_CMD, agent_config, running_agent, stream_messages

# -- line parser properties ------------------------------------------------------------

@given(st.binary(max_size=3000), st.integers(0, 10**9))
def test_prefilter_and_parser_never_crash(data: bytes, base: int) -> None:
    for off, raw in candidate_lines(data, base):
        assert off >= base and b"\n" not in raw
        match_line(parse_line(off, raw))


@given(st.text(max_size=400))
def test_any_text_after_a_real_prefix(text: str) -> None:
    for level in ("INFO", "WARN"):
        line = parse_line(0, f"host:1:2 [0] misc/x.cc:1 NCCL {level} {text}".encode())
        match_line(line)


def test_prefix_forms() -> None:
    a = parse_line(0, b"[2026-11-20 08:00:01] node-e:99:120 [2] p2p.cc:648 (fn) NCCL WARN boom")
    assert (a.host, a.pid, a.dev, a.level, a.ts, a.src, a.func, a.msg) == (
        "node-e", 99, 2, "WARN", "2026-11-20 08:00:01", "p2p.cc:648", "fn", "boom")
    b = parse_line(0, b"node-a:1:2 [0] NCCL INFO Using network IB")
    assert (b.level, b.src, b.msg) == ("INFO", "", "Using network IB")
    assert parse_line(0, b"\xff\xfe garbage").host == ""


def test_healthy_lines_never_reach_the_decoder() -> None:
    """Intra-node channels and progress chatter are skipped by the byte scan; NET channels pass (once
    per connection at start-up): they say which NIC each rank really uses."""
    healthy = (b"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
               b"h:1:1 [0] NCCL INFO Connected all rings\n"
               b"[rank0]: step 10 | loss 2.3 | tokens/s 412345\n") * 100
    assert candidate_lines(healthy, 0) == []
    net = b"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/10/GDRDMA\n"
    assert len(candidate_lines(healthy + net, 0)) == 1


def test_ib_device_list_and_prefix_surprises() -> None:
    devs = parse_ib_devices("[0]mlx5_1:1/IB [1]mlx5_10:1/RoCE/SHARP")
    assert devs == [{"index": 0, "name": "mlx5_1", "port": 1, "link": "IB", "sharp": False},
                    {"index": 1, "name": "mlx5_10", "port": 1, "link": "RoCE", "sharp": True}]
    assert hca_prefix_surprises("mlx5_1", ["mlx5_1", "mlx5_10"]) == ["mlx5_10"]


def test_advice_names_the_hcas_exactly() -> None:
    hcas = [f"mlx5_{i}" for i in (0, 1, 2, 10, 11)]
    # a bare prefix means what it selects now, one by one: "=mlx5" would select no HCA at all
    assert exact_hca_value("mlx5", hcas) == "=mlx5_0,mlx5_1,mlx5_2,mlx5_10,mlx5_11"
    assert exact_hca_value("mlx5_1", hcas) == "=mlx5_1"  # names an HCA: that one, not mlx5_10/11
    assert exact_hca_value("mlx5_1:1,mlx5_2:1", hcas) == "=mlx5_1:1,mlx5_2:1"
    assert exact_hca_value("mlx5_1", []) == "=mlx5_1"
    assert exact_hca_value("=mlx5_1", hcas) == "=mlx5_1" and exact_hca_value("^mlx5_0", hcas) == "^mlx5_0"
    findings = lint({"NCCL_IB_HCA": "mlx5"}, hcas=hcas, active_ib=True, ifaces=[], min_ib_timeout=20)
    (msg,) = [f[3] for f in findings if f[0] == "NCCL_IB_HCA"]
    assert "set NCCL_IB_HCA to '=mlx5_0,mlx5_1,mlx5_2,mlx5_10,mlx5_11'" in msg and "'=mlx5'" not in msg
    assert hca_prefix_surprises("=mlx5_1", ["mlx5_1", "mlx5_10"]) == []
    assert hca_prefix_surprises("mlx5_1:1,mlx5_10", ["mlx5_1", "mlx5_10"]) == []


# -- environment lint ------------------------------------------------------------------

def test_environ_lint_rules() -> None:
    env = parse_environ(b"PATH=/bin\0NCCL_IB_HCA=mlx5_1\0NCCL_IB_GID_INDEX=3\0NCCL_NET_GDR_LEVEL=5\0"
                        b"NCCL_IB_TIMEOUT=14\0NCCL_SOCKET_IFNAME=eth9\0NCCL_IB_DISABLE=1\0NCCL_DEBUG=WARN\0"
                        b"NCCL_IB_RETRY_CNT=9\0broken\0")
    hcas = [f"mlx5_{i}" for i in range(12)]
    found = {v: (sev, reason) for v, sev, reason, _m, _d in lint(env, hcas=hcas, active_ib=True,
                                                                 ifaces=["eth0", "ib0", "lo"], min_ib_timeout=20)}
    assert found == {
        "NCCL_IB_HCA": ("warning", "PrefixMatch"), "NCCL_IB_GID_INDEX": ("warning", "SetByHand"),
        "NCCL_NET_GDR_LEVEL": ("warning", "IntegerLevel"), "NCCL_IB_TIMEOUT": ("warning", "TooShort"),
        "NCCL_SOCKET_IFNAME": ("warning", "NoSuchInterface"), "NCCL_IB_DISABLE": ("warning", "IBDisabledOnIBNode"),
        "NCCL_DEBUG": ("info", "FallbackInvisible"), "NCCL_IB_RETRY_CNT": ("warning", "OutOfRange")}
    good = {"NCCL_IB_HCA": "=mlx5_0,=mlx5_1", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_DEBUG": "INFO",
            "NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_TIMEOUT": "22"}
    assert lint(good, hcas=hcas, active_ib=True, ifaces=["eth0", "lo", "docker0"], min_ib_timeout=20) == []
    assert lint({"NCCL_NET_GDR_LEVEL": "NODE", "NCCL_DEBUG": "INFO"}, hcas=[], active_ib=False, ifaces=[],
                min_ib_timeout=20)[0][2] == "InvalidLevel"  # there is no NODE level
    assert hca_prefix_overmatch("mlx5_1", ["mlx5_1", "mlx5_2"]) == {}
    assert ifname_matches("=eth", ["eth0"]) == [] and ifname_matches("eth", ["eth0"]) == ["eth0"]


def test_env_collector_on_a_simulated_proc(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=12)
    host.write("/proc/4242/environ", "HOME=/root\0NCCL_IB_HCA=mlx5_1\0NCCL_DEBUG=INFO\0")
    host.write("/proc/4343/environ", "HOME=/root\0PATH=/bin\0")  # not an NCCL job
    host.write("/sys/class/net/eth0/operstate", "up\n")
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    conds = [c for c in json.loads(r.stdout)["conditions"] if c["type"] == "NCCLEnvMisconfigured"]
    assert [(c["entity"], c["reason"]) for c in conds] == [("proc:4242/NCCL_IB_HCA", "PrefixMatch")]
    assert conds[0]["details"]["matches"] == {"mlx5_1": ["mlx5_1", "mlx5_10", "mlx5_11"]}


# -- live ---------------------------------------------------------------------------------

async def test_live_fallback_fires_within_a_second_and_resolves_when_the_job_ends(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
    host.write("/proc/sys/kernel/hostname", "worker-7\n")
    host.write("/proc/5151/environ", "NCCL_DEBUG=INFO\0")  # the job's process exists
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root,
                       extra="[collectors.nccl_logs]\ninterval = 0.3\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        with open(logdir / "worker-7.5151.log", "ab") as fh:
            fh.write(b"worker-7:5151:5151 [0] NCCL INFO NET/IB : No device found.\n"
                     b"worker-7:5151:5151 [0] NCCL INFO Using network Socket\n")
        while not any(c.type == "NCCLSocketFallback" for c in agent.tracker.active.values()):  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
            assert time.monotonic() - t0 < 3
        latency = time.monotonic() - t0
        host.p("/proc/5151/environ").unlink()
        host.p("/proc/5151").rmdir()  # the job ended
        while agent.tracker.active:  # type: ignore[union-attr]
            await asyncio.sleep(0.02)
            assert time.monotonic() - t0 < 10
        while agent.spool and agent.spool.depth:
            await asyncio.sleep(0.02)
    msgs = [m for m in await stream_messages(nats_server.url) if m["type"] == "NCCLSocketFallback"]
    # NCCL saw no HCA while the node's ports are up: the job's container is at fault, not the node (#12)
    assert [(m["status"], m["severity"], m["reason"]) for m in msgs] == [
        ("firing", "warning", "NoIBDeviceInJob"), ("resolved", "warning", "ProcessEnded")]
    assert msgs[0]["suggested_action"] == "fix_config"
    assert latency < 1.0


def test_kill_and_restart_loses_no_line_and_rereads_none(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    logdir = host.p("/var/log/nccl")
    logdir.mkdir(parents=True)
    log = logdir / "trainer.77.log"
    n_lines = 1500
    cfg = tmp_path / "a.toml"
    off = "".join(f"[collectors.{c}]\nenabled = false\n" for c in ("gpu_devices", "kernel_modules", "kmsg_xid",
                                                                     "nvml", "infiniband", "nccl_env"))
    cfg.write_text(f'node = "trainer"\nhost_root = "{host.root}"\nstate_dir = "{tmp_path / "st"}"\n'
                   f'[nats]\nservers = ["{nats_server.url}"]\n[metrics]\nlisten = ""\n{off}')

    def write() -> None:
        with open(log, "ab", buffering=0) as fh:
            for i in range(n_lines):
                fh.write(b"trainer:77:78 [0] misc/socket.cc:1 NCCL WARN distinct warning %d\n" % i)
                if i % 20 == 0:
                    time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    kills = 0
    while True:
        proc = subprocess.Popen([*AGENT_CMD, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(1.2 + (kills % 3) * 0.3)
        if kills < 5:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        writer.join()
        deadline = time.monotonic() + 60  # the last agent catches up (slower on a loaded machine), then stops
        while time.monotonic() < deadline and sum(
                m["type"] == "NCCLWarning" for m in asyncio.run(stream_messages(nats_server.url))) < n_lines:
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        break
    msgs = [m for m in asyncio.run(stream_messages(nats_server.url)) if m["type"] == "NCCLWarning"]
    offsets = [m["details"]["offset"] for m in msgs]
    assert len(offsets) == len(set(offsets)), "a line was re-read and re-published"
    texts = sorted(int(m["details"]["line"].rsplit(" ", 1)[1]) for m in msgs)
    assert texts == list(range(n_lines)), f"{n_lines - len(texts)} lines lost"


@given(st.lists(st.sampled_from([
    b"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/1", b"via NET/IB/12/GDRDMA",
    b"via NET/IB/3(1)/GDRDMA", b"NCCL WARN x", b"Using network IB", b"NET/IB : Using [0]mlx5_0:1/IB ; OOB e:1",
    b"via SHM/direct", b"GPU Direct RDMA Disabled", b"Init COMPLETE", b"\xff\x00 junk", b"", b"via NET/IB/",
    b"NET/IB: Got completion", b"Watchdog caught", b"NCCL_IB_HCA set by environment to x",
    b"h:1:1 [0] NCCL INFO Connected all rings"]), max_size=40), st.sampled_from([b"\n", b""]))
def test_all_scanner_engines_find_the_same_lines(parts: list[bytes], tail: bytes) -> None:
    from collectors.nccl import prefilter as nccl_parse

    data = b"\n".join(parts) + tail
    engines = ["re"] + [e for e in ("re2", "hyperscan", "hyperscan-wheel") if nccl_parse.engine(e) is not None]
    results = {e: candidate_lines(data, 0, engine=e) for e in engines}
    assert all(r == results["re"] for r in results.values()), results


async def test_a_refused_warning_is_retried_not_counted_as_its_own_repeat(tmp_path: Path) -> None:
    """#13 D9: with the spool full, the first NCCL WARN was counted before the bus took it."""
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    log = host.p("/var/log/nccl/n.7.log")
    log.parent.mkdir(parents=True)
    log.write_bytes(b"n:7:8 [0] misc/foo.cc:1 NCCL WARN something odd\n" * 3)
    sink = Sink()
    em = CollectorEmitter("n", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(), HostRoot(host.root), em)
    c.tailer.rescan()
    (tf,) = c.tailer.files.values()
    sink.accept = False
    assert not await c._handle(tf, log.read_bytes(), 0)
    assert c.warn_windows == {}, "nothing was accepted, so nothing may count as a repeat"
    sink.accept = True
    assert await c._handle(tf, log.read_bytes(), 0)
    (first,) = sink.of("NCCLWarning")
    assert first.details["count"] == 1
    assert [w[1] for w in c.warn_windows.values()] == [3]


async def test_lines_of_other_hosts_are_attributed_not_judged_here(tmp_path: Path) -> None:
    """#13 D8 and issue 25: a job log naming 4,000 other hosts' processes raised 3,602 critical conditions on
    this node; per-rank files of other nodes on a shared /home were judged as this node's. A line is judged
    only when one of this node's processes wrote it (its hostname, a pod of this node, ``own_hosts``); other
    hosts' lines are counted (relayed from a job-wide file, never judged); with ``own_hosts`` a copied log is
    judged whole and 300 hosts cannot flood the fleet; a process this host cannot check expires with its log."""
    from agent.emitter import CollectorEmitter, ConditionTracker, overflow_entity
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
    host.write("/proc/sys/kernel/hostname", "gpu-0007.cluster.local\n")
    host.p("/var/log/pods/team-a_trainer-0_0b1f7f0e-2d1c-4a53-9d4e-1c2b3a4d5e6f/trainer").mkdir(parents=True)
    logdir = host.p("/var/log/training")
    logdir.mkdir(parents=True)
    fallback = b"%s:%d:%d [0] NCCL INFO NET/IB : No device found.\n%s:%d:%d [0] NCCL INFO Using network Socket\n"

    def lines(*hosts: tuple[bytes, int]) -> bytes:
        return b"".join(fallback % (h, p, p, h, p, p) for h, p in hosts)

    sink = Sink()

    def collector(**cfg: Any) -> tuple[NCCLLogsCollector, CollectorEmitter]:
        em = CollectorEmitter("gpu-0007", "nccl_logs", sink, ConditionTracker(None), facts=FactStore(),
                              max_conditions=64)
        return NCCLLogsCollector(NCCLLogsConfig(globs=["/var/log/training/*.log"], **cfg), HostRoot(host.root),
                                 em), em

    c, em = collector()
    assert c.node_host == "gpu-0007"

    async def feed(c: NCCLLogsCollector, name: str, data: bytes) -> None:
        path = logdir / name
        base = path.stat().st_size if path.exists() else 0
        with open(path, "ab") as fh:
            fh.write(data)
        c.tailer.rescan()
        (tf,) = [t for t in c.tailer.files.values() if t.path.endswith("/" + name)]
        assert await c._handle(tf, data, base)

    # a launcher's aggregated log: this node's rank, then 4,000 other hosts' ranks: tracked apart, never judged
    await feed(c, "launcher.log", lines((b"gpu-0007", 107), *((b"gpu-%04d" % i, 100 + i) for i in range(1000, 5000))))
    firing = {m.entity for m in sink.of("NCCLSocketFallback") if m.status == "firing"}
    assert firing == {"nccl:gpu-0007:107"}
    assert c.foreign_lines == 2 * 4000 and set(c.procs) == {"gpu-0007:107"} and len(c.relayed) == 4000
    assert {m.entity for m in sink.messages} == {"nccl:gpu-0007:107"}  # nothing the fleet reads in their lines

    # a pod of this node writes its own file under its own hostname: judged (its logs are this node's)
    await feed(c, "pod.log", lines((b"trainer-0", 11)))
    assert "nccl:trainer-0:11" in {e for _t, e, _s in em.active_conditions()}

    # another node's file on a shared filesystem: counted, never judged
    await feed(c, "gpu-0042.77.log", lines((b"gpu-0042", 77)))
    assert "nccl:gpu-0042:77" not in {e for _t, e, _s in em.active_conditions()}
    ((count, sample),) = [v for k, v in em.skipped.items() if "gpu-0042.77.log" in k]
    assert count == 2 and sample.startswith("gpu-0042:77:77 [0] NCCL INFO")

    # a log copied here to be checked (own_hosts): judged whole, and 300 hosts cannot flood the fleet
    c2, em2 = collector(own_hosts=["node-*"])
    await feed(c2, "copied.log", lines(*((b"node-%03d" % i, i + 1) for i in range(300))))
    assert len(em2.active_conditions()) == 300
    assert len({m.entity for m in sink.messages if m.entity.startswith(("nccl:node-", "overflow"))}) == 64 + 1
    assert overflow_entity("nccl_logs") in {m.entity for m in sink.messages}

    # trainer-0's pid cannot be checked here: its conditions expire when its log is deleted
    (logdir / "pod.log").unlink()
    await c.collect()
    assert [(m.status, m.reason) for m in sink.messages if m.entity == "nccl:trainer-0:11"][-1] == (
        "resolved", "LogGone")


async def test_a_watchdog_line_joins_the_nccl_process_of_its_file(tmp_path: Path) -> None:
    """#15: NCCL on stdout next to the trainer's stderr in one file (kubectl logs, a launcher's per-rank
    file, no NCCL_DEBUG_FILE): PyTorch's watchdog line has no NCCL prefix, and is tied to the NCCL
    process of its file that holds the rank PyTorch names (or the file's only one), so the timeout
    carries the job, rank and GPU the correlator needs."""
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    host.write("/proc/sys/kernel/hostname", "gpu-7\n")
    logdir = host.p("/var/log/pods")
    logdir.mkdir(parents=True)
    init = ("gpu-7:{pid}:{pid} [{g}] NCCL INFO ncclCommInitRank comm 0x55d0{g} rank {r} nranks 16 cudaDev {g} "
            "nvmlDev {g} busId {bus}000 commId 0xabc123 - Init COMPLETE\n")
    dog = ("[rank{r}]:[E1203 07:44:26.123456789 77 ProcessGroupNCCL.cpp:655] [Rank {r}] Watchdog caught collective "
           "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
           "for 600042 milliseconds before timing out.\n")
    text = (init.format(pid=501, g=0, r=8, bus="18") + init.format(pid=502, g=1, r=9, bus="2a")
            + "step 100 loss 1.234\n" + dog.format(r=9) + dog.format(r=8))
    (logdir / "trainer-0.log").write_text(text)  # no %h.%p in the name: only the lines say whose they are
    sink = Sink()
    em = CollectorEmitter("gpu-7", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(globs=["/var/log/pods/*.log"]), HostRoot(host.root), em)
    await c.check()
    timeouts = {m.entity: m.details for m in sink.of("NCCLCollectiveTimeout")}
    assert set(timeouts) == {"nccl:gpu-7:501", "nccl:gpu-7:502"}, timeouts
    assert timeouts["nccl:gpu-7:502"]["job"] == "0xabc123" and timeouts["nccl:gpu-7:502"]["world_rank"] == 9
    assert timeouts["nccl:gpu-7:501"]["pci"] == "0000:18:00.0" and timeouts["nccl:gpu-7:501"]["rank"] == 8


@contextlib.asynccontextmanager
async def live_collector(host: SimHost, members: int) -> AsyncIterator[tuple[Any, Any]]:
    """A running nccl_logs collector (daemon mode) over ``host`` and what it emitted, once ``members``
    NCCLJobMember events are out."""
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    sink = Sink()
    em = CollectorEmitter("gpu-a", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(interval=0.2), HostRoot(host.root), em)
    task = asyncio.get_running_loop().create_task(c.run())
    try:
        for _ in range(100):
            if len(sink.of("NCCLJobMember")) == members:
                break
            await asyncio.sleep(0.05)
        yield c, sink
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_hung_job_s_ras_port_is_asked_once_and_its_suspects_published(tmp_path: Path) -> None:
    """#15 deliver 2: the daemon sees rank 7's watchdog fire and asks the RAS port in the process's
    NCCL_RAS_ADDR (a loopback fake replaying a 2.30.7 report built from NCCL's format: process 4301 on
    10.10.1.13 dead); NCCLRASReport carries the suspects and the job, once per job per cooldown. An answer
    about another job on the shared port is dropped."""
    from tests.fake_ras import FakeRas

    report = (Path(__file__).parent / "corpus" / "ras" / "v2.30.7-dead-and-timeouts.txt").read_text()
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
    host.write("/proc/sys/kernel/hostname", "gpu-a\n")
    async with FakeRas(report) as ras:
        for pid, job in ((4007, "0x5b1e0c3f9a7d2e41"), (5007, "0x77")):
            host.write(f"/proc/{pid}/environ", f"NCCL_DEBUG=INFO\0NCCL_RAS_ADDR=127.0.0.1:{ras.port}\0")
            host.write(f"/var/log/nccl/gpu-a.{pid}.log",
                       f"gpu-a:{pid}:{pid + 1} [7] NCCL INFO comm 0x7f00 rank 7 nranks 32 cudaDev 7 nvmlDev 7 busId "
                       f"db000 commId {job} - Init COMPLETE\n")
        async with live_collector(host, 2) as (c, sink):
            timeout = ("[Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=40, OpType=ALLREDUCE, "
                       "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
            for pid in (4007, 5007):
                for _ in range(2):  # the second timeout of the same job does not ask again
                    with open(host.p(f"/var/log/nccl/gpu-a.{pid}.log"), "a") as fh:
                        fh.write(timeout)
            for _ in range(200):
                if c.ras.reports + c.ras.foreign >= 2:
                    break
                await asyncio.sleep(0.05)
    (rep,) = sink.of("NCCLRASReport")
    assert (rep.entity, rep.severity, rep.details["job"]) == ("nccl:gpu-a:4007", "warning", "0x5b1e0c3f9a7d2e41")
    first = rep.details["suspects"][0]
    assert (first["reason"], first["host"], first["pid"]) == ("dead", "10.10.1.13", 4301)
    assert all(s["reason"] != "remote_error" for s in rep.details["suspects"])
    assert c.ras.reports == 1 and c.ras.foreign == 1  # job 0x77's answer was about another job
    assert ras.connections == 2  # one question per job, whatever the number of timeouts


async def test_the_daemon_picks_up_the_flight_recorder_dump_written_after_the_timeout(tmp_path: Path) -> None:
    """torch writes the dump after its watchdog fired (15 s and more): the daemon keeps looking for it at
    the paths the process's environment names (TORCH_FR_DUMP_TEMP_FILE here), and reads it once."""
    import shutil

    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.write("/proc/sys/kernel/hostname", "gpu-a\n")
    host.write("/proc/4007/environ", "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/scratch/fr/trace_\0NCCL_RAS_ENABLE=0\0")
    uid = os.getuid()  # the dump must be the process's user's (collectors/nccl/hang_evidence.py process_uids)
    host.write("/proc/4007/status", f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    host.write("/var/log/nccl/gpu-a.4007.log", "gpu-a:4007:4008 [0] NCCL INFO comm 0x7f00 rank 0 nranks 2 cudaDev 0 "
                                               "busId 18000 commId 0xabc - Init COMPLETE\n")
    sink = Sink()
    em = CollectorEmitter("gpu-a", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(interval=0.2), HostRoot(host.root), em)
    c.flight.poll = 0.1
    task = asyncio.get_running_loop().create_task(c.run())
    try:
        for _ in range(100):
            if sink.of("NCCLJobMember"):
                break
            await asyncio.sleep(0.05)
        with open(host.p("/var/log/nccl/gpu-a.4007.log"), "a") as fh:
            fh.write("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, "
                     "NumelIn=4, NumelOut=4, Timeout(ms)=60000) ran for 60081 milliseconds before timing out.\n")
        await asyncio.sleep(0.5)
        assert not sink.of("TorchFlightRecord")
        host.p("/scratch/fr").mkdir(parents=True)
        shutil.copy(Path(__file__).parent / "corpus" / "flight_recorder" / "hang_rank_0",
                    host.p("/scratch/fr/trace_0"))
        for _ in range(100):
            if sink.of("TorchFlightRecord"):
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    (rec,) = sink.of("TorchFlightRecord")
    assert rec.details["job"] == "0xabc" and rec.details["pgs"]["0"]["first_not_completed"]["collective_seq_id"] == 6
    assert rec.details["dump"].endswith("/scratch/fr/trace_0") and rec.details["provenance"] == "tenant"


def test_the_ingest_benchmark_greps_for_exactly_the_prefilter_s_needles() -> None:
    """bench/nccl_ingest.py compares the collector with grep on the same needles: keep them the same."""
    import re
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.nccl_ingest import GREP_PATTERN
    from collectors.nccl.prefilter import NEEDLES

    # the pattern escapes ERE's specials ("Root Cause \\(first observed failure\\)"); no needle holds a "|"
    assert sorted(re.sub(r"\\(.)", r"\1", p) for p in GREP_PATTERN.split("|")) == sorted(n.decode() for n in NEEDLES)


async def test_a_process_of_a_job_that_ends_is_told_to_the_fleet_a_quiet_one_is_not(tmp_path: Path) -> None:
    """Issue 20, lifecycle: an incident resolves on evidence -- every process of the job gone from /proc
    (or its log deleted) -- so the collector says so as a job fact (NCCLProcessEnded, under the job's
    member subject); a hung rank's quiet log is no such evidence."""
    from gna_types.subjects import subjects_for

    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
    host.write("/proc/sys/kernel/hostname", "gpu-a\n")
    for pid in (4007, 4008):
        host.write(f"/proc/{pid}/environ", "NCCL_DEBUG=INFO\0")
        host.write(f"/var/log/nccl/gpu-a.{pid}.log",
                   f"gpu-a:{pid}:{pid + 1} [{pid - 4007}] NCCL INFO comm 0x7f00 rank {pid - 4007} nranks 16 cudaDev 0 "
                   f"nvmlDev 0 busId db000 commId 0x5b1e0c3f9a7d2e41 - Init COMPLETE\n")
    async with live_collector(host, 2) as (c, sink):
        (host.p("/proc/4007/environ")).unlink()
        host.p("/proc/4007").rmdir()  # rank 0 ended; rank 1 lives on, silent
        await c.collect()
        (ended,) = sink.of("NCCLProcessEnded")
        assert ended.reason == "ProcessEnded" and ended.details["job"] == "0x5b1e0c3f9a7d2e41"
        assert ended.details["world_rank"] == 0 and ended.entity == "nccl:gpu-a:4007"
        assert subjects_for("gpu-a", "nccl_logs", ended.severity, ended.type, ended.details) == [
            "gna.jobs.0x5b1e0c3f9a7d2e41.gpu-a.member"]
        c.config.quiet_resolve = 0.0  # rank 1's log goes quiet: no proof it ended
        await c.collect()
        assert len(sink.of("NCCLProcessEnded")) == 1
