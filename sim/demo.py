"""`gpu-node-agent demo`: a simulated fleet — an embedded nats-server with JetStream, N real agent
processes each on its own simulated GPU node, the dashboard, and a scripted fault scenario.
Remediation runs in dry-run and shows what it would do. Ends by itself after ``duration``."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.nats_server import NatsServerProcess, free_port
from agent.remediation.incidents import INCIDENTS_BUCKET
from fleet.text import clean_text, shorten
from gna_sdk import plural
from sim.host import SimHost
from sim.scenarios import BUSES, GPUS, INIT_FORMATS, Job, watchdog_timeout, write_rank

EMPTYDIR = "/var/lib/kubelet/pods/7d4f-demo/volumes/kubernetes.io~empty-dir/jfs-cache"

NODE_CONFIG = """\
node = "{node}"
host_root = "{root}"
state_dir = "{state}"
[nats]
servers = ["{url}"]
heartbeat_interval = 2.0
[metrics]
listen = ""
[log]
format = "json"
[collectors.gpu_devices]
interval = 1.0
jitter = 0.0
expected_count = 8
[collectors.kernel_modules]
interval = 1.0
[collectors.infiniband]
interval = 1.0
expected_rate_gbps = 400.0
flap_hold_down = 60.0
[collectors.juicefs]
interval = 2.0
[collectors.nccl_logs]
interval = 2.0
rescan_interval = 1.0
[collectors.kmsg_xid]
poll_interval = 0.5
[remediations]
cordon_with = "kubernetes"
[remediations.plugins.modprobe]
modprobe = "{modprobe}"
"""

# A simulated node has no kernel to load modules into: its modprobe acts on the node's simulated
# sysfs, so the demo never depends on (or touches) the machine's own modprobe.
SIM_MODPROBE = """#!/bin/sh
# modprobe of a simulated demo node: "loads" a module into {root}/sys/module
set -eu
mod=""
for arg in "$@"; do case "$arg" in -*) ;; *) mod="$arg" ;; esac; done
mkdir -p "{root}/sys/module/$mod" && echo live > "{root}/sys/module/$mod/initstate"
"""


def _node_host(base: Path, i: int) -> SimHost:
    host = SimHost.gpu_node(base / f"node-{i:02d}" / "host", gpus=8, hcas=8)
    host.write("/etc/hostname", f"gpu-{i:02d}\n")  # `diagnose --host-root` over a kept demo names it
    host.write("/proc/sys/kernel/hostname", f"gpu-{i:02d}\n")
    host.add_juicefs("/mnt/jfs", EMPTYDIR if i == 5 else "/var/jfsCache", cache_size=20 << 30)
    host.p("/var/log/nccl").mkdir(parents=True, exist_ok=True)
    modprobe = host.write("/usr/sbin/modprobe", SIM_MODPROBE.format(root=host.root))
    modprobe.chmod(0o755)
    return host


# Set when the demo ends: a scripted fault still running (a flap takes seconds) stops writing
# into the simulated nodes before their directory is removed.
_END = threading.Event()


def _flap(host: SimHost) -> None:
    for _ in range(4):
        host.set_port("mlx5_3", state="1: DOWN", phys_state="2: Polling")
        if _END.wait(1.2):
            return
        host.set_port("mlx5_3", state="4: ACTIVE", phys_state="5: LinkUp")
        host.add_counter("mlx5_3", 1, "link_downed", 1)
        if _END.wait(1.2):
            return


def _nccl_fallback(host: SimHost, node: str) -> None:
    with open(host.p(f"/var/log/nccl/{node}.4242.log"), "ab") as fh:
        fh.write((f"{node}:4242:4242 [0] NCCL INFO NET/IB : No device found.\n"
                  f"{node}:4242:4242 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.4<0>\n"
                  f"{node}:4242:4242 [0] NCCL INFO Using network Socket\n"
                  f"{node}:4242:4300 [0] NCCL INFO comm 0x55d0 rank 3 nranks 64 cudaDev 0 nvmlDev 0 busId 18000 "
                  f"commId 0x8b1f2e3d4c5b6a79 - Init COMPLETE\n").encode())
    host.write("/proc/4242/environ", "NCCL_DEBUG=INFO\0NCCL_IB_HCA=mlx5_1\0")


# The training job the demo runs on gpu-05 to gpu-08 (gpu-05 and gpu-06 with fewer than eight nodes: the
# others have faults of their own), its ranks' NCCL and PyTorch lines written as sim/scenarios.py writes
# them (each format cited there), each rank a live process in its node's /proc. gpu-06's GPU at bus 9a
# falls off the bus; the other ranks' watchdogs then time out: the correlator names gpu-06's GPU, the
# other nodes are victims.
JOB_ID = "0x5eed0d3e0a1b2c3d"
JOB_SEQ = 4211  # the collective every rank waits in


def _job(hosts: list[SimHost]) -> tuple[Job, dict[str, SimHost]]:
    n = len(hosts)
    picked = {f"gpu-{(i - 1) % n + 1:02d}": hosts[(i - 1) % n] for i in ((5, 6, 7, 8) if n >= 8 else (5, 6))}
    return Job(JOB_ID, list(picked), len(picked) * GPUS), picked


def _start_job(job: Job, hosts: dict[str, SimHost]) -> None:
    import random

    rng = random.Random(7)
    ips = {node: f"10.0.0.{10 + i}" for i, node in enumerate(job.nodes)}
    for node, host in hosts.items():
        for gpu in range(GPUS):
            write_rank(host, rng, job, node, gpu, max(INIT_FORMATS), ips, socket=False, timeout=False,
                       completion_peer=None, glog=False)
            host.write(f"/proc/{40000 + gpu}/cmdline", "python\0train.py\0")  # alive while the demo runs


def _job_times_out(job: Job, hosts: dict[str, SimHost], stuck: tuple[str, int]) -> None:
    for node, host in hosts.items():
        for gpu in range(GPUS):
            if (node, gpu) == stuck:
                continue  # its GPU is gone: the rank never gets to time out
            with open(host.p(f"/var/log/nccl/{node}.{40000 + gpu}.log"), "a") as fh:
                fh.write(watchdog_timeout(job.rank_of(node, gpu), JOB_SEQ, 600_137) + "\n")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_demo(duration: float = 30.0, workdir: str | None = None, nodes: int = 8, port: int = 8080,
             keep: bool = False) -> int:
    """A temporary fleet directory is removed at the end unless ``keep`` (or the run failed: its
    logs are the evidence); a ``workdir`` the user named is always kept."""
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gna-fleet-"))
    rc = 1
    try:
        rc = _run_fleet(base, duration, nodes, port)
    finally:
        if workdir or keep or rc != 0:
            print(f"demo: state and logs kept under {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)
            print(f"demo: removed {base} (--keep or --workdir keeps the state and logs)", flush=True)
    return rc


def _run_fleet(base: Path, duration: float, nodes: int, port: int) -> int:
    for child in [*base.glob("node-*"), base / "nats"]:  # a fresh fleet every run
        shutil.rmtree(child, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    server = NatsServerProcess(base / "nats", die_with_parent=True)
    server.start()
    print(f"demo: nats-server (JetStream) at {server.url}; {nodes} simulated GPU nodes under {base}", flush=True)
    hosts = [_node_host(base, i) for i in range(1, nodes + 1)]
    job, job_hosts = _job(hosts)
    _start_job(job, job_hosts)
    # the admin step (docs/nats-security.md): every stream and bucket, before the fleet connects
    setup = subprocess.run([sys.executable, "-m", "agent", "nats", "setup", "--nats", server.url],
                           capture_output=True, text=True, timeout=60)
    if setup.returncode != 0:
        print(f"demo: nats setup failed ({setup.returncode}): {setup.stderr.strip()[-500:]}", flush=True)
        server.stop()
        return 1
    procs: list[subprocess.Popen[bytes]] = []
    for i, host in enumerate(hosts, 1):
        cfg = base / f"node-{i:02d}" / "config.toml"
        cfg.write_text(NODE_CONFIG.format(node=f"gpu-{i:02d}", root=host.root, state=cfg.parent / "state",
                                          url=server.url, modprobe=host.p("/usr/sbin/modprobe")))
        procs.append(subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)],
                                      stdout=subprocess.DEVNULL, stderr=open(cfg.parent / "agent.log", "w")))  # noqa: SIM115
    correlator = subprocess.Popen([sys.executable, "-m", "agent", "correlator", "--nats", server.url],
                                  stdout=subprocess.DEVNULL, stderr=open(base / "correlator.log", "w"))  # noqa: SIM115
    dash_port = port if port and _port_free(port) else free_port()  # 8080 taken: any free port
    ready = base / "dashboard.url"
    ready.unlink(missing_ok=True)
    dash = subprocess.Popen([sys.executable, "-m", "agent", "dashboard", "--nats", server.url, "--listen",
                             f"127.0.0.1:{dash_port}", "--ready-file", str(ready)],
                            stdout=subprocess.DEVNULL, stderr=open(base / "dashboard.log", "w"))  # noqa: SIM115
    started = time.monotonic()
    while not ready.exists() and time.monotonic() - started < 30 and dash.poll() is None:
        time.sleep(0.1)
    print(f"demo: dashboard at {ready.read_text().strip() if ready.exists() else '(failed: see dashboard.log)'}",
          flush=True)
    print("demo: remediation is in dry-run: audits say what it would do (gna.actions.>)", flush=True)
    print(f"demo: a training job ({job.comm_id}) runs on {', '.join(job.nodes)}; the correlator names the node that "
          "stalls it (incidents at /incidents)", flush=True)
    try:
        rc = asyncio.run(_follow(server.url, hosts, duration, started, job, job_hosts))
    finally:
        for p in [dash, correlator, *procs]:
            p.send_signal(signal.SIGTERM)
        codes = [_reap(p, 20) for p in procs]
        _reap(dash, 10)
        _reap(correlator, 10)
        server.stop()
    print(f"demo: {nodes} agents exited with {sorted(set(codes))}", flush=True)
    return 0 if rc == 0 and all(c == 0 for c in codes) else 1


def _reap(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


MESSAGE_WIDTH = 90  # a console line's message: longer ones end at a word with "…" (fleet/text.py shorten)


def event_line(m: dict[str, Any], t: float) -> str:
    """One event or condition as the demo prints it; wire text shown as text (fleet/text.py)."""
    state = clean_text(m.get("status") or "event").upper()
    node, sev, type_, entity = (clean_text(m.get(k)) for k in ("node", "severity", "type", "entity"))
    return (f"  +{t:5.1f}s  {node:<7} {sev:<8} {state:<8} {type_:<28} {entity:<26} "
            f"{shorten(clean_text(m.get('message')), MESSAGE_WIDTH)}")


async def _follow(url: str, hosts: list[SimHost], duration: float, started: float, job: Job,
                  job_hosts: dict[str, SimHost]) -> int:
    import nats

    nc = await nats.connect(url, max_reconnect_attempts=-1)
    seen = {"messages": 0, "actions": 0, "incidents": 0}

    async def on_msg(msg: object) -> None:
        m = json.loads(msg.data)  # type: ignore[attr-defined]
        t = time.monotonic() - started
        if msg.subject.startswith("gna.actions."):  # type: ignore[attr-defined]
            seen["actions"] += 1
            print(f"  +{t:5.1f}s  {m['node']:<7} ACTION  {m['remediation']:<14} {m['decision']:<8} {m['reason']}",
                  flush=True)
            return
        seen["messages"] += 1
        print(event_line(m, t), flush=True)

    from nats.js.api import DeliverPolicy

    js = nc.jetstream()
    for subject in ("gna.events.>", "gna.actions.>"):  # from the start (`nats setup` made the streams)
        await js.subscribe(subject, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)

    async def on_incident(msg: object) -> None:
        r = json.loads(msg.data)  # type: ignore[attr-defined]
        seen["incidents"] += 1
        c = r.get("culprit") or {}
        who = f"culprit {c.get('node')} {c.get('entity')}" if c else "no culprit named"
        print(f"  +{time.monotonic() - started:5.1f}s  INCIDENT job {r.get('job')} {str(r.get('status')).upper()}: "
              f"{who}, confidence {round(100 * float(r.get('confidence') or 0))} %, "
              f"{plural(len(r.get('victims') or []), 'victim')}: {r.get('reason', '')}", flush=True)

    await js.subscribe(f"$KV.{INCIDENTS_BUCKET}.>", cb=on_incident, ordered_consumer=True,
                       deliver_policy=DeliverPolicy.ALL)
    n = len(hosts)
    stuck = (f"gpu-{(6 - 1) % n + 1:02d}", BUSES.index("9a"))  # the rank on gpu-06's GPU at bus 9a

    def at(i: int) -> SimHost:
        return hosts[(i - 1) % n]

    script: list[tuple[float, str, Callable[[], object]]] = [
        (4.0, "gpu-01: /dev/nvidia3 vanishes (driver/kernel mismatch)", lambda: at(1).remove_dev_node("nvidia3")),
        (6.0, "gpu-02: nvidia_peermem unloads (GPUDirect RDMA off)", lambda: at(2).unload_module("nvidia_peermem")),
        (8.0, "gpu-03: IB port mlx5_3/1 starts flapping", lambda: _flap(at(3))),
        (10.0, "gpu-04: a job's NCCL falls back to TCP sockets", lambda: _nccl_fallback(at(4), "gpu-04")),
        (12.0, "gpu-06: Xid 79, GPU fallen off the bus",
         lambda: at(6).kmsg("NVRM: Xid (PCI:0000:9a:00): 79, pid=77, name=python, GPU has fallen off the bus.")),
        (14.0, f"job {job.comm_id}: the other ranks' watchdogs time out (collective {JOB_SEQ})",
         lambda: _job_times_out(job, job_hosts, stuck)),
        (20.0, "gpu-01: device node recreated", lambda: at(1).add_dev_node("nvidia3")),
    ]
    print("  (gpu-05's JuiceFS cache sits on a kubelet emptyDir from the start)", flush=True)
    _END.clear()
    running: list[threading.Thread] = []
    for when, text, action in script:
        if when >= duration:
            break
        await asyncio.sleep(max(0.0, started + when - time.monotonic()))
        print(f"  +{time.monotonic() - started:5.1f}s  ** {text}", flush=True)
        running.append(threading.Thread(target=action, daemon=True))  # a flap takes seconds: others go on
        running[-1].start()
    await asyncio.sleep(max(0.0, started + duration - time.monotonic()))
    _END.set()
    for t in running:
        await asyncio.to_thread(t.join, 5.0)
    await nc.close()
    print(f"demo: {plural(seen['messages'], 'message')}, {plural(seen['actions'], 'remediation audit')} and "
          f"{plural(seen['incidents'], 'incident record')} seen", flush=True)
    return 0 if seen["messages"] else 1
