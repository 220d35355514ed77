#!/usr/bin/env python3
"""NCCL log ingest throughput vs `grep -cE` over the same file with the same patterns.

Generates an NCCL_DEBUG=INFO log (``--mb``), then times, in one invocation and alternating, `grep -cE PATTERNS
file` (PATTERNS: the prefilter's needles) and the nccl_logs collector's full ingest (tailer chunks -> byte
prefilter -> repeated lines counted, the rest decoded by the rules -> per-process state -> events into an
accepting sink). Prints medians, the ratio (grep time / ours: 1.0 = as fast as grep), CPU per MB and peak RSS
of a subprocess doing only our ingest.

Two mixes of NCCL lines (``--mix``): ``default``, a large job's steady output (channel set-up over P2P and
NET/IB/GDRDMA, tuning, ring and per-op lines, a few Init COMPLETE, WARN and non-GDR lines); ``init``, a job
start on eight local ranks (a third of the lines channels via NET/IB, then Init COMPLETE, NET/IB : Using and
Using network). ``--nccl-fraction`` of the lines are NCCL's, the rest the trainer's own progress: 0.02 is a
training log, 1.0 a job start's.

    python bench/nccl_ingest.py [--mb 400] [--runs 3] [--mix init] [--nccl-fraction 0.02] [--no-record]

The result goes to bench/results/nccl_ingest.jsonl (bench/record.py: figures, baseline, parameters, commit,
machine, and a fingerprint of the code measured), one variant per mix and fraction.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record as results

from collectors.nccl.prefilter import grep_pattern

# The prefilter's needles, as each rule declares them (collectors/nccl/rules/ Rule.needles), in ERE.
GREP_PATTERN = grep_pattern()

RARE = 0.0005  # share of NCCL lines that are rare ones (non-GDR channels, WARN, another Init COMPLETE)

# What a training job mostly writes: its own progress, not NCCL's (--nccl-fraction of lines are NCCL's).
TRAINER = [
    "[rank{r}]:[2026-12-02 10:{c:02d}:{e:02d}] step {s} | loss {l:.4f} | lr 3.000e-04 | grad_norm {g:.3f} | "
    "tokens/s {t} | mfu 41.{e}%",
    "{c:3d}%|{bar}| {s}/1024 [00:{e:02d}<05:00, {g:.2f}it/s]",
    "INFO:trainer:epoch {n} step {s}: saved checkpoint shard {d} of 8 to /ckpt/step_{s}",
]


# --mix init: what a job start writes (NCCL 2.18.6+ formats, docs/formats.md sections 1, 2, 5 and 8 cite the
# lines): eight local ranks (one process each, as in a training pod's or a Slurm job's output) set up their
# communicators. A third of the NCCL lines are channels over the network, as NVIDIA/nccl src/transport/net.cc
# prints them ("Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s", PXN "via NET/%s/%d(%d)%s%s",
# "[receive] via NET/%s/%d%s%s"; "/GDRDMA" when GPUDirect RDMA is used); then intra-node channels (p2p.cc
# "via P2P/CUMEM%s%s"), ring and tree set-up, tuning lines, and, once per communicator or process, the lines
# that state what NCCL chose: src/init.cc "Using network %s" and "%s comm %p rank %d nranks %d cudaDev %d
# nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE", src/transport/net_ib.cc "NET/IB : Using%s %s; OOB %s:%s"
# (devices " [%d]%s:%d/%s"). Weights: the lines of one rank's communicator set-up (32 channels to 2 net peers,
# send and receive, about as many intra-node hops, ring, tree and tuning lines), its Init COMPLETE and Using
# network about 1 in 250 NCCL lines, NET/IB : Using (once per process) 1 in 500. Each process's Init COMPLETE
# lines are those of its 4 communicators (the world and 3 splits), as many times as it sets them up.
INIT_MIX: list[tuple[int, str]] = [
    (80, "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {s}[{d}] [send] via NET/IB/{d}/GDRDMA"),
    (80, "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {s}[{d}] -> {r}[{d}] [receive] via NET/IB/{d}/GDRDMA"),
    (8, "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {s}[{d}] [send] via NET/IB/{y}({x})/GDRDMA"),
    (100, "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {x}[{y}] via P2P/CUMEM/read"),
    (64, "{h}:{p}:{t} [{d}] NCCL INFO Channel {c:02d}/32 :    0   1   2   3   4   5   6   7   8   9  10  11  12  13"
         "  14  15"),
    (40, "{h}:{p}:{t} [{d}] NCCL INFO Trees [{c}] {s}/-1/-1->{r}->{x} [{n}] -1/-1/-1->{r}->{s}"),
    (24, "{h}:{p}:{t} [{d}] NCCL INFO Ring {c:02d} : {s} -> {r} -> {x}"),
    (20, "{h}:{p}:{t} [{d}] NCCL INFO threadThresholds 8/8/64 | 1024/8/64 | 512 | 512"),
    (20, "{h}:{p}:{t} [{d}] NCCL INFO 32 coll channels, 32 collnet channels, 0 nvls channels, 32 p2p channels, "
         "32 p2p channels per peer"),
    (20, "{h}:{p}:{t} [{d}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1"),
    (20, "{h}:{p}:{t} [{d}] NCCL INFO comm {comm} rank {r} nRanks 128 nNodes 16 localRanks 8 localRank {d} MNNVL 0"),
    (10, "{h}:{p}:{t} [{d}] NCCL INFO P2P Chunksize set to 131072"),
    (10, "{h}:{p}:{t} [{d}] NCCL INFO ncclCommInitRank comm {comm} rank {r} nranks 128 cudaDev {d} nvmlDev {d} "
         "busId {bus} commId {cid} - Init START"),
    (2, "{h}:{p}:{t} [{d}] NCCL INFO ncclCommInitRank comm {comm} rank {r} nranks 128 cudaDev {d} nvmlDev {d} "
        "busId {bus} commId {cid} - Init COMPLETE"),
    (2, "{h}:{p}:{t} [{d}] NCCL INFO Using network IB"),
    (1, "{h}:{p}:{t} [{d}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB "
        "[4]mlx5_4:1/IB [5]mlx5_5:1/IB [6]mlx5_6:1/IB [7]mlx5_7:1/IB [RO]; OOB ib0:10.0.5.17<0>"),
]
_BUS = ("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")


def generate(path: Path, mb: int, seed: int = 7, nccl_fraction: float = 1.0, rare: float = RARE,
             mix: str = "default") -> int:
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
    init_weights = [w for w, _ in INIT_MIX]
    init_lines = [t for _, t in INIT_MIX]
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
                if rnd.random() < rare:
                    tpl = rnd.choice(rare_lines)
                elif mix == "init":
                    tpl = rnd.choices(init_lines, init_weights)[0]
                    d, k, y = rnd.randrange(8), rnd.randrange(4), rnd.randrange(8)  # local rank, communicator, peer
                    lines.append(tpl.format(
                        h=host, p=pid + d, t=pid + d + rnd.randrange(1, 12), d=d, c=rnd.randrange(32), r=40 + d,
                        s=(40 + d + rnd.choice((8, 120))) % 128, x=40 + y, y=y, e=rnd.randrange(8),
                        n=rnd.randrange(32), comm=f"0x55d0c8a{d}{k:x}0", bus=_BUS[d],
                        cid=f"0x{0x8b1f2e3d4c5b6a70 + k:x}"))
                    continue
                else:
                    tpl = rnd.choice(boring)
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
    from collectors.nccl.prefilter import best_engine, engine as compiled
    engine = best_engine() if c.engine == "auto" else c.engine
    info = getattr(compiled(engine), "info", lambda: "")()
    print(json.dumps({"wall": wall, "cpu": cpu, "matched": c.lines_matched, "engine": engine, "info": info,
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
    ap.add_argument("--engines", default="auto",
                    help="comma list of auto,hyperscan,hyperscan-wheel,re2,re to compare (hyperscan: the system's "
                         "libhs.so.5 where it loads, else the wheel's)")
    ap.add_argument("--nccl-fraction", type=float, default=1.0,
                    help="share of lines that are NCCL's (the rest the trainer's own output); 0.02 is a training log")
    ap.add_argument("--rare", type=float, default=RARE,
                    help="share of NCCL lines the rules must decode (non-GDR channels, WARN, Init COMPLETE); "
                         "0.5 is a job start on a node without GPUDirect")
    ap.add_argument("--mix", choices=("default", "init"), default="default",
                    help="the NCCL lines: default, a large job's steady mix (channels, tuning, per-op lines); init, "
                         "a job start on 8 local ranks (a third channels via NET/IB, Init COMPLETE, NET/IB : Using, "
                         "Using network)")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args()
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory(prefix="gna-nccl-") as tmp:
        root = Path(tmp)
        log = root / "var/log/nccl/gpu-0417.31337.log"
        log.parent.mkdir(parents=True)
        # the log is this node's own process's (issue 25: a node judges only the lines its processes wrote)
        (root / "etc").mkdir()
        (root / "etc/hostname").write_text("gpu-0417\n")
        size = generate(log, args.mb, nccl_fraction=args.nccl_fraction, rare=args.rare, mix=args.mix)
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
    goal = goal_for(args.mix, args.nccl_fraction)
    print(f"file: {mb:.0f} MB log ({args.mix} mix), {args.nccl_fraction:.0%} of lines NCCL's, {args.rare:.2%} of "
          f"those rare ones; grep -cE matched {count:,} lines")
    print(f"grep -cE:                 median {g:.2f} s  ({mb / g:.0f} MB/s) over {args.runs} runs: "
          + ", ".join(f"{x:.2f}" for x in greps))
    figures: list[dict[str, Any]] = []
    for runs in ours.values():
        o = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        rss = max(r["rss_mib"] for r in runs)
        name = runs[0]["engine"]
        if runs[0].get("info"):
            print(f"  {name}: {runs[0]['info']}")
        print(f"nccl_logs ({name:>9}):     median {o:.2f} s  ({mb / o:.0f} MB/s): "
              + ", ".join(f"{r['wall']:.2f}" for r in runs)
              + f"  matched {int(runs[0]['matched']):,}; ratio {g / o:.2f}x grep{f' (goal {goal})' if goal else ''}; "
              f"CPU {cpu / mb * 1000:.2f} ms/MB; peak RSS {rss:.0f} MiB")
        suffix = "" if len(ours) == 1 else f", {name}"
        figures += [
            results.figure(f"ingest throughput{suffix}", round(mb / o), "MB/s", baseline=round(mb / g),
                           baseline_name="grep -cE, the prefilter's needles", goal=goal),
            results.figure(f"CPU per MB{suffix}", round(cpu / mb * 1000, 3), "ms/MB", higher_is_better=False),
            results.figure(f"peak RSS{suffix}", round(rss, 1), "MiB", higher_is_better=False),
            results.figure(f"lines found{suffix}", int(runs[0]["matched"]), "lines", baseline=count,
                           baseline_name="lines grep -cE matched", goal="= grep's"),
        ]
    variant = f"{args.mix}-{args.nccl_fraction:g}" + (f"-rare{args.rare:g}" if args.rare != RARE else "")
    results.record("nccl_ingest", figures, variant=variant,
                   params={k: v for k, v in vars(args).items() if k != "no_record"},
                   raw={"mb": round(mb, 1), "grep_s": [round(x, 4) for x in greps],
                        "engines": {runs[0]["engine"]: runs[0].get("info", "") for runs in ours.values()},
                        "ours_s": {e: [round(r["wall"], 4) for r in runs] for e, runs in ours.items()}},
                   write=not args.no_record)


def goal_for(mix: str, fraction: float) -> str:
    """Issue 27 (4): as fast as grep on a training log whose NCCL lines are a job start's; a fifth of grep's
    speed when nearly every line is NCCL's."""
    if mix != "init":
        return ""
    return ">= 1.0x grep" if fraction <= 0.05 else ">= 0.2x grep" if fraction >= 0.5 else ""


if __name__ == "__main__":
    main()
