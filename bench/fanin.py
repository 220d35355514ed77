#!/usr/bin/env python3
"""Fan-in: 10,000 simulated nodes heartbeating every 10 s plus bursts of 2,000 events/s into one
dashboard process. Reports end-to-end lag (event time -> applied in the dashboard) p50/p99 and the
dashboard's CPU. Baseline in the same invocation: the same load with no dashboard, so the load
generator's own cost is visible.

    python bench/fanin.py [--nodes 10000] [--rate 2000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats

from agent.message import rfc3339
from agent.nats_server import NatsServerProcess, free_port
from gna_sdk.ids import new_id
from gna_types.subjects import encode_token, event_subject

TYPES = ["GPUDevicesMissing", "IBPortDown", "NCCLSocketFallback", "JuiceFSCacheHitRatioLow", "GPUFatalXid"]


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100


async def load(url: str, nodes: int, rate: int, seconds: float) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream()
    from agent.nats_link import STREAM_SUBJECTS

    try:
        await js.add_stream(name="GNA_EVENTS", subjects=STREAM_SUBJECTS, duplicate_window=600)
    except Exception:
        pass
    kv = None
    try:
        kv = await js.create_key_value(bucket="gna-nodes", history=1)
    except Exception:
        kv = await js.key_value("gna-nodes")
    names = [f"sim-{i:05d}.dc1" for i in range(nodes)]
    for name in names[:nodes]:  # the KV state a fleet of agents keeps
        await kv.put(encode_token(name), json.dumps({"node": name, "time": rfc3339(), "heartbeat_interval": 10,
                                                     "conditions": [], "agent_version": "0.1.0"}).encode())
    sent = 0
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        # 1/10 of the fleet heartbeats each 1 s tick (every node every 10 s)
        for name in names[tick % 10::10]:
            await nc.publish(f"gna.heartbeat.{encode_token(name)}",
                             json.dumps({"node": name, "time": rfc3339(), "heartbeat_interval": 10}).encode())
        futs = []
        for k in range(rate):
            node = names[(tick * rate + k) % nodes]
            status = "firing" if (k // nodes) % 2 == 0 else "resolved"
            msg = {"schema_version": 1, "id": new_id(), "time": rfc3339(), "node": node, "collector": "infiniband",
                   "kind": "condition", "type": TYPES[k % len(TYPES)], "status": status, "severity": "critical",
                   "entity": f"ib:mlx5_{k % 8}/1", "reason": "Bench", "message": "bench", "details": {},
                   "suggested_action": "none"}
            futs.append(await js.publish_async(event_subject(node, "infiniband", "critical"),
                                               json.dumps(msg).encode(), headers={"Nats-Msg-Id": msg["id"]}))
        await asyncio.gather(*futs)
        sent += rate
        tick += 1
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    await nc.close()
    return sent


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gna-fanin-") as tmp:
        server = NatsServerProcess(Path(tmp) / "nats", extra_config="max_payload: 1MB")
        server.start()
        try:
            t0, c0 = time.monotonic(), time.process_time()
            base_sent = await load(server.url, args.nodes, args.rate, min(10.0, args.seconds))
            gen_cpu = (time.process_time() - c0) / (time.monotonic() - t0)
            port = free_port()
            dash = subprocess.Popen([sys.executable, "-m", "agent", "dashboard", "--nats", server.url, "--listen",
                                     f"127.0.0.1:{port}", "--history-hours", "0.001"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(100):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/stats", timeout=1).read()
                        break
                    except OSError:
                        await asyncio.sleep(0.2)
                await asyncio.sleep(2.0)  # the KV watch delivers the fleet's state
                before = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/stats").read())
                d0, w0 = cpu_s(dash.pid), time.monotonic()
                sent = await load(server.url, args.nodes, args.rate, args.seconds)
                await asyncio.sleep(2.0)
                d1, w1 = cpu_s(dash.pid), time.monotonic()
                stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/stats").read())
                t_api = time.perf_counter()
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview").read()
                overview_ms = (time.perf_counter() - t_api) * 1000
            finally:
                dash.terminate()
                dash.wait(10)
        finally:
            server.stop()
    print(f"load: {args.nodes:,} nodes heartbeating every 10 s + {args.rate:,} events/s for {args.seconds:.0f} s "
          f"({sent:,} events); baseline without a dashboard: load generator at {gen_cpu * 100:.0f}% of a core "
          f"({base_sent:,} events)")
    print(f"dashboard saw {stats['nodes']:,} nodes, {stats['messages'] - before['messages']:,} new events")
    print(f"end-to-end lag (event time -> applied): p50 {stats['lag_p50_s'] * 1000:.0f} ms, "
          f"p99 {stats['lag_p99_s'] * 1000:.0f} ms, max {stats['lag_max_s'] * 1000:.0f} ms  (goal p99 <= 1 s)")
    print(f"dashboard CPU: {(d1 - d0) / (w1 - w0) * 100:.0f}% of a core; /api/overview of the whole fleet: "
          f"{overview_ms:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
