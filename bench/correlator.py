"""Precision and recall of the fleet correlator on randomized fleets, against naive blame.

    .venv/bin/python bench/correlator.py [--scenarios 20] [--min-nodes 1] [--max-nodes 128] [--seed 0]

Each scenario (sim/scenarios.py): a fleet of host-root trees with one or two jobs (8 ranks per node,
so 8 to 1,024 ranks), one injected fault or none, noise on any node. Every node's one-shot checks
run in this process (the same code as `gpu-node-agent check`), then:

* the correlator (fleet/correlator.py) over all nodes' messages;
* naive blame, the baseline: for each job with a symptom, the first node of the job (in time) with
  any critical hardware or transport condition.

Printed: true/false positives and misses per fault kind for both, precision and recall, and the
correlator's own time per scenario (the checks' time is the nodes' and is reported apart).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.logsetup import configure
from fleet.correlator import correlate, members_of
from sim.scenarios import generate


def naive(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    jobs = members_of(messages)
    incidents = []
    for job, members in jobs.items():
        nodes = {m.node for m in members.members.values()}
        symptomatic = any(m.get("collector") == "nccl_logs" and m.get("type") in (
            "NCCLCollectiveTimeout", "NCCLIBCompletionError") and (m.get("details") or {}).get("job") == job
            for m in messages)
        blamed = [m for m in sorted(messages, key=lambda m: str(m.get("time")))
                  if m.get("node") in nodes and m.get("severity") == "critical"
                  and str(m.get("entity", "")).startswith(("gpu:", "ib:", "nccl:"))
                  and m.get("type") not in ("NCCLCollectiveTimeout", "NCCLIBCompletionError")]
        if symptomatic or blamed:
            first = blamed[0] if blamed else None
            kind = ("gpu" if str(first["entity"]).startswith("gpu:") else "hca_port"
                    if str(first["entity"]).startswith("ib:") else "transport") if first else ""
            entity = "nccl:transport" if kind == "transport" else str(first["entity"]) if first else ""
            incidents.append({"job": job, "culprit": {"node": first["node"], "entity": entity, "kind": kind}
                              if first else None})
    return incidents


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", type=int, default=20)
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    configure("error", "json")
    import random

    rng = random.Random(args.seed)
    per_kind: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"ours": [0, 0, 0], "naive": [0, 0, 0]})
    corr_ms: list[float] = []
    check_s: list[float] = []
    ranks: list[int] = []
    for i in range(args.scenarios):
        nodes = rng.randint(args.min_nodes, args.max_nodes)
        with tempfile.TemporaryDirectory(prefix="gna-corr-") as tmp:
            sc = generate(Path(tmp), seed=args.seed * 100000 + i, nodes=nodes)
            t0 = time.perf_counter()
            msgs = asyncio.run(sc.messages())
            t1 = time.perf_counter()
            ours = [inc.to_dict() for inc in correlate(msgs)]
            t2 = time.perf_counter()
        check_s.append(t1 - t0)
        corr_ms.append((t2 - t1) * 1000)
        ranks.append(max(j.size for j in sc.jobs))
        for name, incidents in (("ours", ours), ("naive", naive(msgs))):
            s = sc.score(incidents)
            acc = per_kind[sc.fault][name]
            acc[0] += s["tp"]
            acc[1] += s["fp"]
            acc[2] += s["fn"]
        print(f"scenario {i}: {sc.fault:18} {nodes:4} nodes, job of {ranks[-1]:5} ranks: ours "
              f"{sc.score(ours)} naive {sc.score(naive(msgs))}", flush=True)
    print(f"\n{args.scenarios} scenarios, {args.min_nodes}-{args.max_nodes} nodes (8 ranks each), jobs up to "
          f"{max(ranks)} ranks; checks {statistics.median(check_s):.1f} s median per fleet, correlator "
          f"{statistics.median(corr_ms):.1f} ms median (max {max(corr_ms):.1f} ms)")
    print(f"{'fault':20} {'ours tp/fp/fn':>14} {'naive tp/fp/fn':>15}")
    tot = {"ours": [0, 0, 0], "naive": [0, 0, 0]}
    for kind, d in sorted(per_kind.items()):
        print(f"{kind:20} {'/'.join(map(str, d['ours'])):>14} {'/'.join(map(str, d['naive'])):>15}")
        for name in tot:
            tot[name] = [a + b for a, b in zip(tot[name], d[name], strict=True)]
    for name, (tp, fp, fn) in tot.items():
        print(f"{name:6} precision {ratio(tp, tp + fp)}  recall {ratio(tp, tp + fn)}  (tp {tp}, fp {fp}, fn {fn})")


if __name__ == "__main__":
    main()
