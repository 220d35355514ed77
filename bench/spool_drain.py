#!/usr/bin/env python3
"""Spool drain rate after an outage, and end-to-end publish latency, against a real nats-server.

Baseline in the same invocation: publishing the same messages with a synchronous
``js.publish`` (one round trip each). Prints medians of --runs runs and the ratio.

    python bench/spool_drain.py [--events 100000] [--runs 3] [--baseline-events 20000] [--no-record]

The result goes to bench/results/spool_drain.jsonl (bench/record.py: figures, baseline, parameters,
commit, machine, and a fingerprint of the code measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nats
import record as results

from agent.bus import LocalBus
from agent.config import NatsConfig
from agent.forwarder import Forwarder
from agent.logsetup import configure
from agent.message import encode, make_message
from agent.metrics import AgentMetrics
from agent.nats_link import NatsLink
from agent.nats_server import NatsServerProcess
from agent.spool import Spool
from gna_types.subjects import event_subject


def _message(i: int, node: str = "bench-node-01.dc1") -> object:
    return make_message(
        node=node, collector="infiniband", kind="event", type="IBErrorCountersIncreasing", severity="warning",
        entity=f"ib:mlx5_{i % 8}/1", reason="SymbolErrors",
        message=f"symbol_error on mlx5_{i % 8}/1 rose by {i % 97} in 10 s.",
        details={"counter": "symbol_error", "delta": i % 97, "window_s": 10, "rate_per_s": (i % 97) / 10, "n": i})


async def fill(bus: LocalBus, n: int) -> None:
    chunk = 2000
    for start in range(0, n, chunk):
        await asyncio.gather(*(bus.publish(_message(i)) for i in range(start, min(n, start + chunk))))  # type: ignore[arg-type]


async def drain_once(url: str, work: Path, n: int, window: int) -> float:
    spool = Spool(work / "spool", fsync=True)
    spool.open()
    bus = LocalBus(spool)
    await fill(bus, n)  # the outage: everything waits in the spool
    assert spool.depth == n
    cfg = NatsConfig(servers=[url], publish_window=window)
    link = NatsLink(cfg, [url], AgentMetrics(), name="bench")
    await link.connect()
    await link.ensure_stream()
    fwd = Forwarder(spool, link, AgentMetrics(), window=window, timeout=10)
    t0 = time.perf_counter()
    task = asyncio.create_task(fwd.run())
    while spool.depth:
        await asyncio.sleep(0.002)
    dt = time.perf_counter() - t0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await link.close()
    spool.close()
    return n / dt


async def baseline_once(url: str, n: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    bodies = []

    for i in range(n):
        m = _message(i)
        bodies.append((event_subject(m.node, m.collector, m.severity), m.id, encode(m)))  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    for subject, mid, body in bodies:
        await js.publish(subject, body, headers={"Nats-Msg-Id": mid})
    dt = time.perf_counter() - t0
    await nc.close()
    return n / dt


async def latency(url: str, work: Path, n: int, rate: float) -> list[float]:
    spool = Spool(work / "spool-lat", fsync=True)
    spool.open()
    bus = LocalBus(spool)
    cfg = NatsConfig(servers=[url])
    link = NatsLink(cfg, [url], AgentMetrics(), name="bench-lat")
    await link.connect()
    await link.ensure_stream()
    fwd = Forwarder(spool, link, AgentMetrics(), window=cfg.publish_window, timeout=10)
    task = asyncio.create_task(fwd.run())
    sub_nc = await nats.connect(url)
    lat: list[float] = []
    done = asyncio.Event()

    async def on_msg(msg: object) -> None:
        d = json.loads(msg.data)  # type: ignore[attr-defined]
        lat.append(time.time() - d["details"]["t0"])
        if len(lat) >= n:
            done.set()

    await sub_nc.subscribe("gna.events.>", cb=on_msg)
    await sub_nc.flush()
    for i in range(n):
        m = _message(i)
        m.details["t0"] = time.time()  # type: ignore[attr-defined]
        await bus.publish(m)  # type: ignore[arg-type]
        await asyncio.sleep(1 / rate)
    await asyncio.wait_for(done.wait(), 30)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await sub_nc.close()
    await link.close()
    spool.close()
    return lat


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline-events", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--latency-events", type=int, default=2000)
    ap.add_argument("--latency-rate", type=float, default=500.0)
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args()
    configure("error")
    with tempfile.TemporaryDirectory(prefix="gna-bench-") as tmp:
        work = Path(tmp)
        server = NatsServerProcess(work / "nats")
        server.start()
        try:
            drains, bases = [], []
            for r in range(args.runs):
                rate = await drain_once(server.url, work / f"run{r}", args.events, args.window)
                base = await baseline_once(server.url, args.baseline_events)
                drains.append(rate)
                bases.append(base)
                print(f"run {r + 1}: spool drain {rate:,.0f} ev/s   sync js.publish {base:,.0f} ev/s", flush=True)
            lat = sorted(await latency(server.url, work, args.latency_events, args.latency_rate))
        finally:
            server.stop()
    d, b = statistics.median(drains), statistics.median(bases)
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    print(f"\nspool drain ({args.events:,} events, window {args.window}, fsync on): median {d:,.0f} events/s")
    print(f"baseline sync js.publish ({args.baseline_events:,} events):        median {b:,.0f} events/s")
    print(f"ratio drain / sync publish: {d / b:.1f}x   (goal: >= 10,000 events/s)")
    print(f"end-to-end latency emit -> spool fsync -> JetStream -> subscriber, {args.latency_events} events at "
          f"{args.latency_rate:.0f}/s: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    results.record("spool_drain", [
        results.figure("spool drain after an outage (fsync on)", round(d), "events/s", baseline=round(b),
                       baseline_name="sync js.publish, one round trip each", goal=">= 10,000 events/s"),
        results.figure("end-to-end latency p50", round(p50, 2), "ms"),
        results.figure("end-to-end latency p99", round(p99, 2), "ms"),
    ], params={k: v for k, v in vars(args).items() if k != "no_record"},
        raw={"drains": [round(x) for x in drains], "baselines": [round(x) for x in bases]},
        write=not args.no_record)


if __name__ == "__main__":
    asyncio.run(main())
