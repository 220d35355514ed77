#!/usr/bin/env python3
"""CPU per Prometheus scrape cycle of an 8-HCA NDR sysfs tree: our agent's /metrics vs node_exporter's.

Like for like: two server processes read the same simulated tree (mlx5_0..mlx5_7 NDR + a RoCE
storage NIC, counters and hw_counters moved before every cycle) and are each scraped over HTTP on
loopback by the same client (urllib, no gzip), in alternation, cycle by cycle:

* node_exporter (Debian's prometheus-node-exporter, installed here with apt if missing; only its
  infiniband collector): a scrape reads sysfs, renders and serves, so one cycle is one HTTP scrape.
* ours: a child Python process (this script, ``--serve-child``) built as the agent builds it
  (agent/daemon.py): the infiniband collector under a ``CollectorRunner``, its
  ``prometheus_families`` registered in ``AgentMetrics.plugins``, served by the agent's
  ``MetricsServer`` (with the refresh of the self-metrics the daemon does on each scrape). In the
  agent a scrape only renders the last pass's values and the pass runs on its own interval (10 s);
  so one cycle here is one supervised pass (``CollectorRunner.run_once``, asked for over a pipe by
  the bench, instead of the timer) followed by one HTTP scrape of its /metrics -- as if Prometheus
  scraped at the collector's interval. The pass and the scrape are also reported on their own.

CPU of either server: the on-CPU time of all its threads (/proc/<pid>/task/*/schedstat, ns) read
before and after each step, after the same short settle on both sides. Medians of --scrapes
cycles (after 5 warm-up cycles), the ratio in the same invocation, and each server's RSS after
the cycles. Events and conditions of our passes go to an in-memory sink (the spool/NATS path is
bench/spool_drain.py's). Then, with --idle, the idle CPU (and RSS) of a real agent running only
this collector at its default interval.

    python bench/ib_scrape.py [--scrapes 100] [--idle 60] [--no-record]

The result goes to bench/results/ib_scrape.jsonl (bench/record.py: figures, baseline, parameters,
commit, machine, and a fingerprint of the code measured).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record as results
from procstat import status_mib, threads_cpu_ns

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.framework import CollectorRunner
from agent.logsetup import configure
from agent.message import Message
from agent.metrics import AgentMetrics, MetricsServer
from agent.nats_server import NatsServerProcess, free_port
from collectors.infiniband import InfinibandCollector, InfinibandConfig
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost

NODE_EXPORTER = "prometheus-node-exporter"
WARMUP = 5
SETTLE_S = 0.02  # before and after each measured step, on both sides: background work done, tail work counted
NODE = "ib-bench"
AGENT_COLLECTOR = "agent"  # agent/daemon.py


def ensure_node_exporter() -> str:
    found = shutil.which(NODE_EXPORTER)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", NODE_EXPORTER], check=True, env=env)
    subprocess.run(["pkill", "-f", f"^/usr/bin/{NODE_EXPORTER}$"], check=False)  # the package may start one
    return shutil.which(NODE_EXPORTER) or f"/usr/bin/{NODE_EXPORTER}"


def settled_cpu_ns(pid: int) -> int:
    time.sleep(SETTLE_S)
    return threads_cpu_ns(pid)


def move_counters(host: SimHost, n: int) -> None:
    for i in range(9):
        hca = f"mlx5_{i}"
        host.add_counter(hca, 1, "port_xmit_data", 10**9 + n)
        host.add_counter(hca, 1, "port_rcv_data", 10**9 + n)
        host.add_counter(hca, 1, "port_xmit_packets", 10**6)
        host.add_counter(hca, 1, "np_cnp_sent", 10, hw=True)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode} before serving")
        try:
            scrape(url)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url}: not serving after 10 s")


@dataclass
class Body:
    bytes: int = 0
    series: int = 0  # sample lines
    ib_series: int = 0  # node_infiniband_* sample lines (the names both export)

    @classmethod
    def of(cls, text: str) -> Body:
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        return cls(len(text.encode()), len(lines), sum(1 for ln in lines if ln.startswith("node_infiniband_")))


@dataclass
class Samples:
    ne: list[float] = field(default_factory=list)  # node_exporter: CPU ms per HTTP scrape
    passes: list[float] = field(default_factory=list)  # ours: CPU ms per supervised pass
    scrapes: list[float] = field(default_factory=list)  # ours: CPU ms per HTTP scrape (render + serve)
    cycles: list[float] = field(default_factory=list)  # ours: pass + scrape
    ne_body: Body = field(default_factory=Body)
    our_body: Body = field(default_factory=Body)
    ne_rss: float = 0.0
    our_rss: float = 0.0


class OurServer:
    """The child process: the collector under the agent's runner, behind the agent's MetricsServer."""

    def __init__(self, root: Path, state: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-child", str(root),
                                      "--state", str(state)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._in: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        self._out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        first = self._out.readline().decode().split()
        if len(first) != 2 or first[0] != "port":
            self.stop()
            raise RuntimeError(f"bench child did not start (said {first!r})")
        self.url = f"http://127.0.0.1:{first[1]}/metrics"
        wait_up(self.url, self.proc)

    def run_pass(self) -> None:
        self._in.write(b"pass\n")
        self._in.flush()
        said = self._out.readline().strip()
        if said != b"ok":
            raise RuntimeError(f"bench child: pass failed ({said!r})")

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def bench(binary: str, host: SimHost, work: Path, cycles: int) -> Samples:
    port = free_port()
    ne = subprocess.Popen([binary, f"--path.sysfs={host.root / 'sys'}", "--collector.disable-defaults",
                           "--collector.infiniband", f"--web.listen-address=127.0.0.1:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ne_url = f"http://127.0.0.1:{port}/metrics"
    ours: OurServer | None = None
    s = Samples()
    try:
        wait_up(ne_url, ne)
        ours = OurServer(host.root, work / "state")
        pid = ours.proc.pid
        for n in range(cycles + WARMUP):
            move_counters(host, n)
            # node_exporter: one scrape reads, renders, serves
            c0 = settled_cpu_ns(ne.pid)
            ne_text = scrape(ne_url)
            c1 = settled_cpu_ns(ne.pid)
            # ours: the pass (the agent's interval timer, here the bench's request), then the scrape
            o0 = settled_cpu_ns(pid)
            ours.run_pass()
            o1 = settled_cpu_ns(pid)
            our_text = scrape(ours.url)
            o2 = settled_cpu_ns(pid)
            if n >= WARMUP:
                s.ne.append((c1 - c0) / 1e6)
                s.passes.append((o1 - o0) / 1e6)
                s.scrapes.append((o2 - o1) / 1e6)
                s.cycles.append((o2 - o0) / 1e6)
                s.ne_body, s.our_body = Body.of(ne_text), Body.of(our_text)
        s.ne_rss, s.our_rss = status_mib(ne.pid), status_mib(pid)
        return s
    finally:
        if ours is not None:
            ours.stop()
        ne.terminate()
        ne.wait(10)


async def serve_child(root: Path, state: Path) -> None:
    """``--serve-child``: what agent/daemon.py builds for one collector, without the bus, spool and NATS.
    Prints ``port N``; then each line on stdin runs one supervised pass and answers ``ok``."""
    configure("warning")
    metrics = AgentMetrics()
    tracker = ConditionTracker(None)
    facts = FactStore()

    async def sink(msg: Message) -> bool:  # Agent._sink, the bus replaced by acceptance
        metrics.observe_message(msg.kind, msg.collector, msg.type, msg.severity)
        return True

    settings = InfinibandConfig()
    emitter = CollectorEmitter(NODE, "infiniband", sink, tracker, facts=facts,
                               state_dir=state / "collectors" / "infiniband", max_conditions=settings.max_conditions)
    agent_emitter = CollectorEmitter(NODE, AGENT_COLLECTOR, sink, tracker, facts=facts,
                                     state_dir=state / "collectors" / AGENT_COLLECTOR)
    collector = InfinibandCollector(settings, HostRoot(root), emitter)
    runner = CollectorRunner(collector, settings, emitter, metrics, agent_emitter)
    metrics.plugins.sources[collector.name] = collector.prometheus_families
    metrics.collector_up.labels(collector.name).set(1)  # as CollectorRunner.run() starts

    def refresh() -> None:  # Agent.refresh_metrics, for the parts that exist here
        metrics.conditions_active.set(len(tracker.active))
        metrics.set_conditions(tracker.active.values())
        for source, (count, _sample) in emitter.skipped.items():
            metrics.source_unparsed.labels(collector.name, source).set(count)
        for source in emitter.blind:
            metrics.source_not_seen.labels(collector.name, source).set(1)

    server = MetricsServer(metrics, "127.0.0.1:0", lambda: (True, "ok"), refresh)
    await server.start(quiet=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    sys.stdout.write(f"port {server.port}\n")
    sys.stdout.flush()
    try:
        while await reader.readline():
            ok = await runner.run_once()
            sys.stdout.write("ok\n" if ok else "failed\n")
            sys.stdout.flush()
    finally:
        await server.stop()


def idle_agent(host: SimHost, work: Path, seconds: float) -> tuple[float, float]:
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
        c0, t0 = threads_cpu_ns(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = threads_cpu_ns(proc.pid), time.monotonic()
        return (c1 - c0) / 1e6 / (t1 - t0), status_mib(proc.pid)  # ms of CPU per second = millicores
    finally:
        proc.terminate()
        proc.wait(15)
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=100, help="measured cycles (after 5 warm-up ones)")
    ap.add_argument("--idle", type=float, default=0.0, help="also measure idle agent CPU for this many seconds")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    ap.add_argument("--serve-child", type=Path, help=argparse.SUPPRESS)  # the bench's own server process
    ap.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_child:
        asyncio.run(serve_child(args.serve_child, args.state or Path(tempfile.mkdtemp(prefix="gna-ib-state-"))))
        return
    binary = ensure_node_exporter()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory(prefix="gna-ib-") as tmp:
        work = Path(tmp)
        host = SimHost.gpu_node(work / "host", gpus=8, hcas=8, storage_nic=True)
        s = bench(binary, host, work, args.scrapes)
        idle = idle_agent(host, work, args.idle) if args.idle else None
    m_ne, m_cycle = statistics.median(s.ne), statistics.median(s.cycles)
    m_pass, m_scrape = statistics.median(s.passes), statistics.median(s.scrapes)
    ne_b, our_b = s.ne_body, s.our_body
    print(f"tree: 9 ports (8x NDR + 1 RoCE storage NIC); {args.scrapes} cycles (+{WARMUP} warm-up), "
          f"servers scraped alternately over HTTP on loopback; {version}")
    print("CPU = on-CPU time of all the server process's threads (/proc/<pid>/task/*/schedstat); medians")
    print(f"node_exporter, CPU per HTTP scrape (read + render + serve): {m_ne:7.3f} ms   "
          f"RSS {s.ne_rss:5.1f} MiB   /metrics {ne_b.bytes:,} B, {ne_b.series} series "
          f"({ne_b.ib_series} node_infiniband_)")
    print(f"ours, CPU per cycle (pass + HTTP scrape of /metrics):        {m_cycle:7.3f} ms   "
          f"RSS {s.our_rss:5.1f} MiB   /metrics {our_b.bytes:,} B, {our_b.series} series "
          f"({our_b.ib_series} node_infiniband_)")
    print(f"  of which the pass (CollectorRunner.run_once, sysfs + rates + conditions): {m_pass:.3f} ms")
    print(f"  of which the HTTP scrape (render last pass + serve):                     {m_scrape:.3f} ms")
    print(f"ratio, like for like (ours per cycle / node_exporter per scrape): {m_cycle / m_ne:.2f}x "
          f"(node_exporter / ours: {m_ne / m_cycle:.2f}x)")
    print("(in the agent a scrape renders the last pass; passes run every 10 s whether scraped or not: "
          "here one pass per scrape, as if scraped at the collector's interval)")
    print(f"collector's share at the default 10 s interval: {m_pass / 10:.3f} millicores (goal <= 0.5); "
          f"a Prometheus scrape every 15 s adds {m_scrape / 15:.3f}")
    figs = [
        results.figure("ours: CPU per scrape cycle (pass + HTTP scrape of /metrics)", round(m_cycle, 3), "ms",
                       baseline=round(m_ne, 3), baseline_name="node_exporter, CPU per HTTP scrape",
                       higher_is_better=False),
        results.figure("ours: CPU per pass", round(m_pass, 3), "ms"),
        results.figure("ours: CPU per HTTP scrape (render + serve)", round(m_scrape, 3), "ms"),
        results.figure("ours: RSS of the serving process (collector + metrics server)", round(s.our_rss, 1), "MiB",
                       baseline=round(s.ne_rss, 1), baseline_name="node_exporter RSS", higher_is_better=False),
        results.figure("ours: /metrics series", our_b.series, baseline=ne_b.series,
                       baseline_name="node_exporter /metrics series"),
        results.figure("collector's share at the 10 s interval", round(m_pass / 10, 3), "millicores",
                       goal="<= 0.5"),
        results.figure("a scrape every 15 s adds", round(m_scrape / 15, 3), "millicores"),
    ]
    if idle is not None:
        print(f"measured: agent with only this collector, {args.idle:.0f} s: {idle[0]:.3f} millicores, "
              f"RSS {idle[1]:.1f} MiB")
        figs += [results.figure(f"agent with only this collector, idle {args.idle:.0f} s", round(idle[0], 3),
                                "millicores"),
                 results.figure("agent with only this collector, RSS", round(idle[1], 1), "MiB")]
    results.record("ib_scrape", figs, params={k: v for k, v in vars(args).items()
                                              if k not in ("no_record", "serve_child", "state")},
                   raw={"node_exporter_ms": [round(x, 4) for x in s.ne], "pass_ms": [round(x, 4) for x in s.passes],
                        "scrape_ms": [round(x, 4) for x in s.scrapes], "node_exporter": version},
                   write=not args.no_record)


if __name__ == "__main__":
    main()
