"""Time from the first evidence reaching NATS to the correlator's incident, live.

    .venv/bin/python bench/incidents_live.py [--nodes 128] [--trials 8]

A real nats-server and a real `gpu-node-agent correlator` process. Each trial is a fresh randomized
fleet of ``--nodes`` simulated nodes (sim/scenarios.py; one job on all of them: 8 ranks a node) with
one fault, cycling through the kinds. Every node's one-shot checks produce the messages that node
would publish; they are published on the node's subjects into the GNA_EVENTS stream: first the
job's membership (the job starts), then, a second later, the fault and the symptoms in time order
(the watchdogs' timeouts of every rank). Measured: from publishing the first evidence message to
the first incident on gna.incidents.> that names the culprit's node (what a cordon acts on); right
= no other node was ever blamed and the exact entity (port, GPU, rank) followed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats
from nats.js.api import StreamConfig

from agent.logsetup import configure
from agent.nats_link import JOBS_STREAM_SUBJECTS, JOBS_STREAM_TRANSFORM, SIGNALS_STREAM_SUBJECTS, STREAM_SUBJECTS
from agent.nats_server import NatsServerProcess
from gna_types.subjects import subjects_for
from sim.scenarios import generate

KINDS = ("ib_port_down_early", "gpu_fell_off", "hung_rank", "socket_node", "ib_port_down")


async def publish(js: Any, m: dict[str, Any]) -> None:
    for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
        await js.publish(subject, json.dumps(m).encode())


async def trial(js: Any, got: asyncio.Queue[dict[str, Any]], work: Path, seed: int, nodes: int,
                kind: str) -> tuple[float | None, bool, int]:
    sc = generate(work / f"t{seed}", seed=seed, nodes=nodes, fault=kind, job_nodes=nodes, second_job=False)
    msgs = await sc.messages()
    want = sc.expected[sc.jobs[0].comm_id]
    members = [m for m in msgs if m["type"] == "NCCLJobMember"]
    evidence = sorted((m for m in msgs if m["type"] != "NCCLJobMember"), key=lambda m: m["time"])
    for m in members:  # on the subjects an agent uses: membership under the job (gna.jobs.<job>.<node>.member)
        await publish(js, m)
    await asyncio.sleep(1.0)
    while not got.empty():
        got.get_nowait()
    t0 = time.monotonic()
    # every node publishes its own messages at the same time, each in its own order (as 128 agents would:
    # one sequential publisher would time the bench's own loop over 2,000+ messages, not the correlator)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for m in evidence:  # events, and a job's symptoms also as evidence under the job
        by_node.setdefault(m["node"], []).append(m)

    async def node_publishes(msgs: list[dict[str, Any]]) -> None:
        for m in msgs:
            await publish(js, m)

    await asyncio.gather(*(node_publishes(ms) for ms in by_node.values()))
    deadline = t0 + 15
    first_node: float | None = None  # the culprit's node named (what a cordon acts on)
    while time.monotonic() < deadline:
        try:
            rec = await asyncio.wait_for(got.get(), deadline - time.monotonic())
        except TimeoutError:
            break
        if rec.get("job") != sc.jobs[0].comm_id or rec.get("status") != "open":
            continue
        c = rec.get("culprit") or {}
        if not c:
            continue
        if want is None or c.get("node") != want["node"]:
            return time.monotonic() - t0, False, sc.jobs[0].size  # a wrong node blamed
        first_node = first_node or time.monotonic() - t0
        if all(c.get(k) == v for k, v in want.items()):  # the exact entity (the port, the GPU, the rank)
            return first_node, True, sc.jobs[0].size
    return None, False, sc.jobs[0].size


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args()
    configure("error", "json")
    with tempfile.TemporaryDirectory(prefix="gna-inc-") as tmp:
        work = Path(tmp)
        server = NatsServerProcess(work / "nats")
        server.start()
        proc = subprocess.Popen([sys.executable, "-m", "agent", "correlator", "--nats", server.url,
                                 "--metrics-listen", ""],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS))
            await js.add_stream(StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS,
                                     subject_transform=JOBS_STREAM_TRANSFORM))
            await js.add_stream(StreamConfig(name="GNA_SIGNALS", subjects=SIGNALS_STREAM_SUBJECTS))
            got: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            async def on_incident(m: Any) -> None:
                await got.put(json.loads(m.data))

            await nc.subscribe("gna.incidents.>", cb=on_incident)
            await asyncio.sleep(2.0)  # the correlator is up
            results: dict[str, list[tuple[float | None, bool]]] = {}
            for i in range(args.trials):
                kind = KINDS[i % len(KINDS)]
                latency, right, ranks = await trial(js, got, work, 7000 + i, args.nodes, kind)
                results.setdefault(kind, []).append((latency, right))
                shown = f"{latency * 1000:.0f} ms" if latency is not None else "no incident"
                print(f"trial {i}: {kind:20} {args.nodes} nodes / {ranks} ranks: {shown}, "
                      f"{'right culprit' if right else 'WRONG'}", flush=True)
        finally:
            await nc.close()
            proc.terminate()
            proc.wait(10)
            server.stop()
    print(f"\n{args.nodes} nodes, one job on all of them ({args.nodes * 8} ranks); first evidence on NATS -> incident")
    allv = []
    for kind, rs in results.items():
        ok = [lat for lat, right in rs if right and lat is not None]
        allv += ok
        med = f"{statistics.median(ok) * 1000:.0f} ms" if ok else "n/a"
        print(f"{kind:20} right {len(ok)}/{len(rs)}  median {med}  max "
              f"{max(ok) * 1000 if ok else float('nan'):.0f} ms")
    if allv:
        print(f"all: right {len(allv)}/{args.trials}, median {statistics.median(allv) * 1000:.0f} ms, "
              f"max {max(allv) * 1000:.0f} ms (goal: within 3 s)")


if __name__ == "__main__":
    asyncio.run(main())
