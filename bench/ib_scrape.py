#!/usr/bin/env python3
"""CPU per full read of an 8-HCA NDR sysfs tree: the infiniband collector vs node_exporter.

Both read the same simulated tree (mlx5_0..mlx5_7 NDR + a RoCE storage NIC, counters and
hw_counters, moved between reads). node_exporter (Debian's prometheus-node-exporter 1.5, installed
here with apt if missing) is scraped over HTTP on loopback; its CPU per scrape is the sum of its
threads' on-CPU time (/proc/<pid>/task/*/schedstat, ns) around each scrape. The collector's CPU
is process CPU time around one pass (sysfs reads, rates, conditions), and around pass + rendering
its Prometheus exposition. Medians of --scrapes runs, and the ratio. Then, with --idle, the idle
CPU of an agent running only this collector at its default interval.

    python bench/ib_scrape.py [--scrapes 100] [--idle 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, generate_latest

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.nats_server import NatsServerProcess, free_port
from collectors.infiniband import InfinibandCollector, InfinibandConfig
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost

NODE_EXPORTER = "prometheus-node-exporter"


def ensure_node_exporter() -> str:
    found = shutil.which(NODE_EXPORTER)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", NODE_EXPORTER], check=True, env=env)
    subprocess.run(["pkill", "-f", f"^/usr/bin/{NODE_EXPORTER}$"], check=False)  # the package may start one
    return shutil.which(NODE_EXPORTER) or f"/usr/bin/{NODE_EXPORTER}"


def task_cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def move_counters(host: SimHost, n: int) -> None:
    for i in range(9):
        hca = f"mlx5_{i}"
        host.add_counter(hca, 1, "port_xmit_data", 10**9 + n)
        host.add_counter(hca, 1, "port_rcv_data", 10**9 + n)
        host.add_counter(hca, 1, "port_xmit_packets", 10**6)
        host.add_counter(hca, 1, "np_cnp_sent", 10, hw=True)


def bench_node_exporter(binary: str, host: SimHost, scrapes: int) -> tuple[list[float], int]:
    port = free_port()
    proc = subprocess.Popen([binary, f"--path.sysfs={host.root / 'sys'}", "--collector.disable-defaults",
                             "--collector.infiniband", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.05)
        samples: list[float] = []
        series = 0
        for n in range(scrapes + 5):
            move_counters(host, n)
            time.sleep(0.02)  # let background work settle
            c0 = task_cpu_ns(proc.pid)
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            c1 = task_cpu_ns(proc.pid)
            if n >= 5:  # warm-up
                samples.append((c1 - c0) / 1e6)
                series = sum(1 for line in body.splitlines() if line.startswith("node_infiniband_"))
        return samples, series
    finally:
        proc.terminate()
        proc.wait(10)


async def bench_collector(host: SimHost, scrapes: int) -> tuple[list[float], list[float], int]:
    em = CollectorEmitter("bench", "infiniband", _sink, ConditionTracker(None), facts=FactStore())
    c = InfinibandCollector(InfinibandConfig(), HostRoot(host.root), em)
    reg = CollectorRegistry()

    class Source:
        def collect(self) -> list[object]:
            return c.prometheus_families()

    reg.register(Source())  # type: ignore[arg-type]
    passes, with_render = [], []
    series = 0
    for n in range(scrapes + 5):
        move_counters(host, n)
        t0 = time.process_time()
        await c.collect()
        t1 = time.process_time()
        body = generate_latest(reg).decode()
        t2 = time.process_time()
        if n >= 5:
            passes.append((t1 - t0) * 1000)
            with_render.append((t2 - t0) * 1000)
            series = sum(1 for line in body.splitlines() if line.startswith("node_infiniband_"))
    return passes, with_render, series


async def _sink(msg: object) -> bool:
    return True


def idle_agent(host: SimHost, work: Path, seconds: float) -> float:
    server = NatsServerProcess(work / "nats")
    server.start()
    cfg = work / "idle.toml"
    off = "".join(f"[collectors.{n}]\nenabled = false\n" for n in ("gpu_devices", "kernel_modules", "kmsg_xid",
                                                                     "nvml"))
    cfg.write_text(f'node = "ib-idle"\nhost_root = "{host.root}"\nstate_dir = "{work / "st"}"\n'
                   f'[nats]\nservers = ["{server.url}"]\n[metrics]\nlisten = ""\n[log]\nlevel = "warning"\n{off}')
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)
        c0, t0 = task_cpu_ns(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = task_cpu_ns(proc.pid), time.monotonic()
        return (c1 - c0) / 1e6 / (t1 - t0)  # ms of CPU per second = millicores
    finally:
        proc.terminate()
        proc.wait(15)
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--idle", type=float, default=0.0, help="also measure idle agent CPU for this many seconds")
    args = ap.parse_args()
    binary = ensure_node_exporter()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory(prefix="gna-ib-") as tmp:
        work = Path(tmp)
        host = SimHost.gpu_node(work / "host", gpus=8, hcas=8, storage_nic=True)
        ne, ne_series = bench_node_exporter(binary, host, args.scrapes)
        ours, ours_render, our_series = asyncio.run(bench_collector(host, args.scrapes))
        idle = idle_agent(host, work, args.idle) if args.idle else None
    m_ne, m_ours, m_render = statistics.median(ne), statistics.median(ours), statistics.median(ours_render)
    print(f"tree: 9 ports (8x NDR + 1 RoCE storage NIC); {args.scrapes} reads each; {version}")
    print(f"node_exporter, CPU per HTTP scrape:            median {m_ne:.3f} ms  ({ne_series} node_infiniband_ series)")
    print(f"infiniband collector, CPU per pass:             median {m_ours:.3f} ms  -> ratio {m_ours / m_ne:.2f}x")
    print(f"infiniband collector, pass + /metrics render:   median {m_render:.3f} ms  -> ratio {m_render / m_ne:.2f}x"
          f"  ({our_series} node_infiniband_ series)")
    print(f"collector's share at the default 10 s interval: {m_ours / 10:.3f} millicores (goal <= 0.5); "
          f"a Prometheus scrape every 15 s adds {(m_render - m_ours) / 15:.3f}")
    if idle is not None:
        print(f"measured: agent with only this collector, {args.idle:.0f} s: {idle:.3f} millicores")


if __name__ == "__main__":
    main()
