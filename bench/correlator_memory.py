"""Bytes the correlator's state holds per rank, and the cost of filing a message, in process.

    TMPDIR=/dev/shm .venv/bin/python bench/correlator_memory.py --nodes 4096 --fault hung_rank
    .venv/bin/python bench/correlator_memory.py --messages CACHE.jsonl.gz   # bench/incidents_scale.py --cache

The live bench (bench/incidents_scale.py) reports the correlator process's VmHWM growth per rank:
that includes what passes through (nats-py's queue of undelivered messages during a flood, decoded
dicts before they are reduced to facts). This one measures what stays: one job's messages from
sim/scenarios.py (the agents' own checks over simulated host trees; 8 ranks a node), decoded at the
boundary as the service decodes them (fleet/wire.py), then filed into a fresh ``IncidentTracker``
under tracemalloc; after a full collection, the traced bytes still allocated over the ranks held. As
a baseline in the same run: the same messages kept as the decoded dicts a window of messages would
hold (what the tracker held before issue 21), traced the same way.

It also prints what the state costs CPython's cycle collector, which the live correlator pays as a
stall of its event loop at every full collection: the objects the state adds to the collector's
lists, and how long one full collection (``gc.collect()``) takes with the state held, against the
same with nothing held and with the window held (medians of the runs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.incidents import IncidentTracker
from fleet.typed_details import TYPED
from fleet.wire import as_received


def scenario(nodes: int, fault: str, seed: int) -> list[dict[str, Any]]:
    from sim.scenarios import generate

    with tempfile.TemporaryDirectory(prefix="gna-mem-") as tmp:
        sc = generate(Path(tmp), seed=seed, nodes=nodes, fault=fault, job_nodes=nodes, second_job=False)
        return asyncio.run(sc.messages())


def decoded(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # as the incident service decodes them: the typed details kept for the correlator (fleet/typed_details.py)
    return [as_received(m) for m in msgs]


def traced(build: Any) -> tuple[int, Any, float]:
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    held = build()
    dt = time.perf_counter() - t0
    gc.collect()
    cur, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return cur, held, dt


def collector_cost(held: Any) -> tuple[int, float]:
    """Objects ``held`` adds to the cycle collector's lists, and one full collection's time with it held."""
    del held  # the caller keeps its own reference: this only documents that it must
    gc.collect()
    n = len(gc.get_objects())
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    return n, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--fault", default="hung_rank")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--messages", help="a gzip JSON-lines file of messages (bench/incidents_scale.py --cache)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.messages:
        with gzip.open(args.messages, "rt") as f:
            msgs = [json.loads(line) for line in f]
    else:
        msgs = scenario(args.nodes, args.fault, args.seed)
    ms = decoded(msgs)
    del msgs
    gc.collect()
    gc.freeze()  # the input messages out of the collector's lists: a full collection then walks what was built
    state, window, per_msg = [], [], []
    gc_none, gc_state, gc_window = [], [], []
    members = 0
    for _ in range(args.runs):
        def fill() -> IncidentTracker:
            t = IncidentTracker()
            for m in ms:
                t.add(m)
            return t

        gc_none.append(collector_cost(None))
        cur, t, dt = traced(fill)
        members = t.stats()["members"]
        state.append(cur)
        per_msg.append(dt / len(ms))
        gc_state.append(collector_cost(t))
        del t
        cur, w, _dt = traced(lambda: [json.loads(json.dumps({k: v for k, v in m.items() if k != TYPED}))
                                      for m in ms])  # a window's copies (the dicts as published)
        window.append(cur)
        gc_window.append(collector_cost(w))
        del w
    s, w = statistics.median(state), statistics.median(window)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    print(f"{len(ms)} messages, {members} ranks held (commit {commit}; medians of {args.runs})")
    print(f"  tracker state       {s / 2**20:7.1f} MiB  {s / max(1, members):6.0f} B/rank   "
          f"filing {statistics.median(per_msg) * 1e6:.1f} us/message (under tracemalloc)")
    print(f"  baseline: a window  {w / 2**20:7.1f} MiB  {w / max(1, members):6.0f} B/rank   "
          f"(the decoded messages kept as they are)")
    print(f"  state / window      {s / w:.2f}")
    base_n = statistics.median(n for n, _ in gc_none)
    base_t = statistics.median(t for _, t in gc_none)
    for what, got in (("tracker state", gc_state), ("baseline: a window", gc_window)):
        n = statistics.median(n for n, _ in got) - base_n
        t = statistics.median(t for _, t in got)
        print(f"  {what:<19} {n:9.0f} objects for the cycle collector ({n / max(1, members):.2f}/rank); "
              f"a full collection {t * 1e3:6.1f} ms (with nothing held: {base_t * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
