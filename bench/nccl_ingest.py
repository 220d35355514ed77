#!/usr/bin/env python3
"""NCCL log ingest throughput vs `grep -cE` over the same file with the same patterns.

Generates a ~400 MB NCCL_DEBUG=INFO log shaped like a large job's (channel set-up over P2P and
NET/IB/GDRDMA, tuning and ring lines, a few Init COMPLETE, WARN and non-GDR lines), then times,
in one invocation and alternating, `grep -cE PATTERNS file` and the nccl_logs collector's full
ingest (tailer chunks -> byte prefilter -> decode and rules -> per-process state -> events into an
accepting sink). Prints medians, the ratio (grep time / ours: 1.0 = as fast as grep), CPU per MB
and peak RSS of a subprocess doing only our ingest.

    python bench/nccl_ingest.py [--mb 400] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collectors.nccl.prefilter import grep_pattern

# The prefilter's needles, as each rule declares them (collectors/nccl/rules/ Rule.needles), in ERE.
GREP_PATTERN = grep_pattern()

# What a training job mostly writes: its own progress, not NCCL's (--nccl-fraction of lines are NCCL's).
TRAINER = [
    "[rank{r}]:[2026-12-02 10:{c:02d}:{e:02d}] step {s} | loss {l:.4f} | lr 3.000e-04 | grad_norm {g:.3f} | "
    "tokens/s {t} | mfu 41.{e}%",
    "{c:3d}%|{bar}| {s}/1024 [00:{e:02d}<05:00, {g:.2f}it/s]",
    "INFO:trainer:epoch {n} step {s}: saved checkpoint shard {d} of 8 to /ckpt/step_{s}",
]


def generate(path: Path, mb: int, seed: int = 7, nccl_fraction: float = 1.0, rare: float = 0.0005) -> int:
    rnd = random.Random(seed)
    host, pid = "gpu-0417", 31337
    boring = [
        "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {s}[{e}] via P2P/IPC/read",
        "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {s}[{e}] [send] via NET/IB/{n}/GDRDMA",
        "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {s}[{e}] -> {r}[{d}] [receive] via NET/IB/{n}/GDRDMA",
        "{h}:{p}:{t} [{d}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
        "{h}:{p}:{t} [{d}] NCCL INFO comm 0x7f{c:04x} rank {r} nRanks 1024 nNodes 128 localRanks 8 localRank {d} "
        "MNNVL 0",
        "{h}:{p}:{t} [{d}] NCCL INFO Trees [{c}] {s}/-1/-1->{r}->{e} [{n}] -1/-1/-1->{r}->{s}",
        "{h}:{p}:{t} [{d}] NCCL INFO threadThresholds 8/8/64 | 8192/8/64 | 512 | 512",
        "{h}:{p}:{t} [{d}] NCCL INFO {c} coll channels, 32 collnet channels, 0 nvls channels, 32 p2p channels, "
        "32 p2p channels per peer",
        "{h}:{p}:{t} [{d}] NCCL INFO AllReduce: opCount {c:x} sendbuff 0x7f0a00000000 recvbuff 0x7f0a00000000 count "
        "262144 datatype 7 op 0 root 0 comm 0x7f{c:04x} [nranks=1024] stream 0x55e1271cb4f0",
    ]
    rare_lines = [
        "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {s}[{e}] [send] via NET/IB/{n}",
        "{h}:{p}:{t} [{d}] misc/socket.cc:50 NCCL WARN socketProgressOpt: Connection closed by remote peer "
        "10.0.{n}.{c}<4{c:04d}>",
        "{h}:{p}:{t} [{d}] NCCL INFO comm 0x7f{c:04x} rank {r} nranks 1024 cudaDev {d} nvmlDev {d} busId 18000 "
        "commId 0x{c:016x} - Init COMPLETE",
    ]
    target = mb * 1024 * 1024
    written = 0
    with open(path, "wb") as fh:
        while written < target:
            lines = []
            for _ in range(20000):
                if rnd.random() >= nccl_fraction:
                    lines.append(rnd.choice(TRAINER).format(
                        r=rnd.randrange(1024), c=rnd.randrange(60), e=rnd.randrange(60), s=rnd.randrange(100000),
                        l=rnd.random() * 3, g=rnd.random() * 2, t=rnd.randrange(10**6), n=rnd.randrange(90),
                        d=rnd.randrange(8), bar="#" * rnd.randrange(10)))
                    continue
                tpl = rnd.choice(rare_lines) if rnd.random() < rare else rnd.choice(boring)
                lines.append(tpl.format(h=host, p=pid, t=pid + rnd.randrange(64), d=rnd.randrange(8),
                                        c=rnd.randrange(64), r=rnd.randrange(1024), s=rnd.randrange(1024),
                                        e=rnd.randrange(8), n=rnd.randrange(8)))
            blob = ("\n".join(lines) + "\n").encode()
            fh.write(blob)
            written += len(blob)
    return written


def time_grep(path: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    r = subprocess.run(["grep", "-cE", GREP_PATTERN, str(path)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, usage.ru_utime + usage.ru_stime, int(r.stdout.strip() or 0)


INGEST = r"""
import asyncio, json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from gna_sdk.hostroot import HostRoot
from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig

async def sink(msg):
    return True

async def main():
    em = CollectorEmitter("bench", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(globs=[sys.argv[2]], scanner=sys.argv[4]), HostRoot(sys.argv[1]), em)
    t0, c0 = time.perf_counter(), time.process_time()
    await c.check()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    from collectors.nccl.prefilter import best_engine
    engine = best_engine() if c.engine == "auto" else c.engine
    print(json.dumps({"wall": wall, "cpu": cpu, "matched": c.lines_matched, "engine": engine,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))

asyncio.run(main())
"""


def time_ours(root: Path, rel: str, engine: str) -> dict[str, Any]:
    repo = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", INGEST, str(root), rel, repo, engine], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engines", default="auto", help="comma list of auto,hyperscan,re2,re to compare")
    ap.add_argument("--nccl-fraction", type=float, default=1.0,
                    help="share of lines that are NCCL's (the rest the trainer's own output); 0.02 is a training log")
    ap.add_argument("--rare", type=float, default=0.0005,
                    help="share of NCCL lines the rules must decode (non-GDR channels, WARN, Init COMPLETE); "
                         "0.5 is a job start on a node without GPUDirect")
    args = ap.parse_args()
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory(prefix="gna-nccl-") as tmp:
        root = Path(tmp)
        log = root / "var/log/nccl/gpu-0417.31337.log"
        log.parent.mkdir(parents=True)
        # the log is this node's own process's (issue 25: a node judges only the lines its processes wrote)
        (root / "etc").mkdir()
        (root / "etc/hostname").write_text("gpu-0417\n")
        size = generate(log, args.mb, nccl_fraction=args.nccl_fraction, rare=args.rare)
        mb = size / 1e6
        with open(log, "rb") as fh:  # warm the page cache for both
            while fh.read(1 << 24):
                pass
        greps: list[float] = []
        ours: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
        count = 0
        for _ in range(args.runs):
            g_wall, _cpu, count = time_grep(log)
            greps.append(g_wall)
            for e in engines:
                ours[e].append(time_ours(root, "/var/log/nccl/*.log", e))
        os.sync()
    g = statistics.median(greps)
    print(f"file: {mb:.0f} MB log, {args.nccl_fraction:.0%} of lines NCCL's, {args.rare:.2%} of those decoded; "
          f"grep -cE matched {count:,} lines")
    print(f"grep -cE:                 median {g:.2f} s  ({mb / g:.0f} MB/s) over {args.runs} runs: "
          + ", ".join(f"{x:.2f}" for x in greps))
    for runs in ours.values():
        o = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        rss = max(r["rss_mib"] for r in runs)
        print(f"nccl_logs ({runs[0]['engine']:>9}):     median {o:.2f} s  ({mb / o:.0f} MB/s): "
              + ", ".join(f"{r['wall']:.2f}" for r in runs)
              + f"  matched {int(runs[0]['matched']):,}; ratio {g / o:.2f}x grep (goal >= 0.5x); "
              f"CPU {cpu / mb * 1000:.2f} ms/MB; peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
