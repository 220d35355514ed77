#!/usr/bin/env python3
"""The cost of reading every pod's container log on a node: 100 chatty non-GPU pods, one training pod.

Issue 24 (1): the nccl_logs collector reads /var/log/pods/*/*/*.log by default. A node runs many pods
that never touch NCCL (sidecars, exporters, a service mesh, log shippers); their logs pass the same byte
prefilter (collectors/nccl/prefilter.py: Hyperscan/RE2/re over raw records, in C) and are decoded only where
a needle is. This bench lays out the kubelet's tree (``<namespace>_<pod>_<uid>/<container>/0.log``, CRI
records, some lines cut into P records) with realistic non-GPU output -- access logs, JSON logs, Java stack
traces, Go panics -- plus one training pod whose NCCL and PyTorch lines must all be found, then times in one
invocation, alternating, `grep -cE <the prefilter's needles>` over the same files (the baseline: a C
scanner doing only the search) and the collector's whole ingest (tailer -> prefilter -> CRI records ->
rules -> events into an accepting sink). It prints medians, CPU per MB, and what that CPU is as a share
of one core at a given write rate (``--rate-kb``: each chatty pod's bytes per second).

    python bench/pod_logs.py [--pods 100] [--mb-per-pod 2] [--runs 5] [--rate-kb 20] [--no-record]

The result goes to bench/results/pod_logs.jsonl (bench/record.py: figures, baseline, parameters, commit,
machine, and a fingerprint of the code measured).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record as results
from nccl_ingest import GREP_PATTERN

CHATTY = [
    '10.42.{a}.{b} - - [03/Dec/2026:10:{m:02d}:{s:02d} +0000] "GET /api/v1/items/{n}?page={p} HTTP/1.1" 200 {z} "-" '
    '"kube-probe/1.31"',
    '{{"level":"info","ts":"2026-12-03T10:{m:02d}:{s:02d}.{n:03d}Z","caller":"server/handler.go:{p}","msg":"request '
    'served","method":"POST","path":"/v2/orders","status":201,"latency_ms":{z}}}',
    "2026-12-03 10:{m:02d}:{s:02d}.{n:03d}  WARN 1 --- [nio-8080-exec-{p}] o.h.engine.jdbc.spi.SqlExceptionHelper    : "
    "SQL Error: 0, SQLState: 57014",
    "\tat org.springframework.web.servlet.FrameworkServlet.processRequest(FrameworkServlet.java:{z})",
    "goroutine {n} [running]:",
    "I1203 10:{m:02d}:{s:02d}.{n:06d}       1 reflector.go:{p}] Watch close - *v1.Pod total {z} items received",
]
TRAINING = [
    ("stdout", "gpu-train-0:42:57 [3] NCCL INFO comm 0x55d0c8a0 rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 5d000 "
               "commId 0x8b1f2e3d4c5b6a79 - Init COMPLETE"),
    ("stderr", "[rank3]:[E1203 10:30:00.100000 77 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=4712, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, "
               "Timeout(ms)=600000) ran for 600081 milliseconds before timing out."),
]


def record(stream: str, tag: str, text: str, rnd: random.Random) -> str:
    when = f"2026-12-03T10:{rnd.randrange(60):02d}:{rnd.randrange(60):02d}.{rnd.randrange(10**9):09d}Z"
    return f"{when} {stream} {tag} {text}\n"


def generate(root: Path, pods: int, mb_per_pod: float, seed: int = 11) -> tuple[int, int]:
    rnd = random.Random(seed)
    total = 0
    for i in range(pods):
        pod = f"svc-{i % 7}_app-{i}-{rnd.randrange(16**5):05x}_{uuid.UUID(int=rnd.getrandbits(128))}"
        d = root / "var/log/pods" / pod / "app"
        d.mkdir(parents=True)
        out: list[str] = []
        size = 0
        while size < mb_per_pod * 1e6:
            text = rnd.choice(CHATTY).format(a=rnd.randrange(256), b=rnd.randrange(256), m=rnd.randrange(60),
                                             s=rnd.randrange(60), n=rnd.randrange(1000), p=rnd.randrange(200),
                                             z=rnd.randrange(100000))
            if rnd.random() < 0.01:  # a long line the runtime cut: two P records and an F
                third = len(text) // 3
                parts = [text[:third], text[third:2 * third], text[2 * third:]]
                lines = [record("stdout", "P", parts[0], rnd), record("stdout", "P", parts[1], rnd),
                         record("stdout", "F", parts[2], rnd)]
            else:
                lines = [record("stdout" if rnd.random() < 0.8 else "stderr", "F", text, rnd)]
            out.extend(lines)
            size += sum(len(x) for x in lines)
        (d / "0.log").write_text("".join(out))
        total += size
    t = root / f"var/log/pods/team-a_gpu-train-0_{uuid.UUID(int=7)}/pytorch"
    t.mkdir(parents=True)
    head, tail = TRAINING[1][1][:90], TRAINING[1][1][90:]
    text = (record(*("stdout", "F", TRAINING[0][1]), rnd) + record("stderr", "P", head, rnd)
            + record("stderr", "F", tail, rnd))
    (t / "0.log").write_text(text)
    return total + len(text), pods + 1


INGEST = r"""
import asyncio, json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from gna_sdk.hostroot import HostRoot
from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig

types = []
async def sink(msg):
    types.append(msg.type)
    return True

async def main():
    em = CollectorEmitter("bench", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(globs=[], pod_logs="yes", flight_recorder=False), HostRoot(sys.argv[1]), em)
    t0, c0 = time.perf_counter(), time.process_time()
    await c.check()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"wall": wall, "cpu": cpu, "files": len(c.tailer.stats) and c.tailer.stats["files_opened"],
                      "matched": c.lines_matched, "types": sorted(set(types)), "joined": c.container_stats["joined"],
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))

asyncio.run(main())
"""


def time_grep(files: list[Path]) -> float:
    t0 = time.perf_counter()
    subprocess.run(["grep", "-cE", GREP_PATTERN, *map(str, files)], capture_output=True, check=False)
    return time.perf_counter() - t0


def time_ours(root: Path) -> dict[str, Any]:
    repo = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", INGEST, str(root), repo], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--mb-per-pod", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate-kb", type=float, default=20.0, help="bytes each chatty pod writes per second, in KB")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gna-pods-") as tmp:
        root = Path(tmp)
        size, nfiles = generate(root, args.pods, args.mb_per_pod)
        files = sorted(root.glob("var/log/pods/*/*/*.log"))
        for f in files:
            f.read_bytes()  # the page cache, for both
        greps, ours = [], []
        for _ in range(args.runs):
            greps.append(time_grep(files))
            ours.append(time_ours(root))
    mb = size / 1e6
    g = statistics.median(greps)
    o = statistics.median(r["wall"] for r in ours)
    cpu = statistics.median(r["cpu"] for r in ours)
    ms_per_mb = cpu / mb * 1000
    load = args.pods * args.rate_kb / 1000  # MB/s the node's pods write
    share = ms_per_mb * load / 1000
    found = ours[0]["types"]
    print(f"{nfiles} container logs, {mb:.0f} MB (CRI records, 1 % of lines cut into P records); training pod's lines "
          f"found: {found}, partial runs joined {ours[0]['joined']}")
    print(f"grep -cE (baseline): median {g:.2f} s ({mb / g:.0f} MB/s): " + ", ".join(f"{x:.2f}" for x in greps))
    print(f"nccl_logs          : median {o:.2f} s ({mb / o:.0f} MB/s): " + ", ".join(f"{r['wall']:.2f}" for r in ours)
          + f"; ratio {g / o:.2f}x grep; CPU {ms_per_mb:.2f} ms/MB; peak RSS {max(r['rss_mib'] for r in ours):.0f} MiB")
    print(f"at {args.rate_kb:.0f} KB/s per pod ({load:.1f} MB/s on the node): {share:.2%} of one core")
    rss = max(r["rss_mib"] for r in ours)
    results.record("pod_logs", [
        results.figure("ingest throughput", round(mb / o), "MB/s", baseline=round(mb / g),
                       baseline_name="grep -cE, the prefilter's needles"),
        results.figure("CPU per MB", round(ms_per_mb, 3), "ms/MB", higher_is_better=False),
        results.figure(f"CPU at {args.rate_kb:g} KB/s from each of {args.pods} pods", round(share * 100, 3),
                       "% of a core", higher_is_better=False),
        results.figure("peak RSS", round(rss, 1), "MiB", higher_is_better=False),
        results.figure("training pod's findings", ", ".join(found)),
    ], params={k: v for k, v in vars(args).items() if k != "no_record"},
        raw={"mb": round(mb, 1), "grep_s": [round(x, 4) for x in greps], "ours_s": [round(r["wall"], 4) for r in ours],
             "joined": ours[0]["joined"]},
        write=not args.no_record)


if __name__ == "__main__":
    main()
