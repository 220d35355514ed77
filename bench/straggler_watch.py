"""The correlator's straggler watch at 100k+ members: how long one evaluation holds the event loop.

    .venv/bin/python bench/straggler_watch.py [--nodes 13000] [--runs 3] [--old] [--freeze] [--no-record]

A fleet from sim/stragglers.py (8 GPUs and 9 ports per node, one NCCLJobMember per GPU: 13,000 nodes
are 104,000 members, 117,000 ports) is fed to fleet.stragglers.StragglerWatch, then judged with
``evaluate_async`` while a ticker task measures how late the loop runs it (the real stall), in
three rounds: everything new (a correlator starting), 1 % of the members replaced (jobs starting
processes), 5 % of the nodes publishing a new vector. Printed per round, the median of ``--runs``:
the evaluation's wall time, the longest synchronous slice (StragglerWatch.max_slice_s) and the
ticker's worst lateness. ``--old``: the same for the previous ``StragglerWatch.evaluate`` (git
show 96d274a:fleet/stragglers.py), which judged everything in one synchronous call. ``--freeze``:
``gc.freeze()`` once the fleet is loaded (what a long-running correlator can do after replaying
history): CPython's full collections then skip the watch's long-lived objects; without it a full
collection (100-400 ms over a heap of this size) lands in whichever slice allocates at that moment.

The result goes to bench/results/straggler_watch.jsonl (bench/record.py; variant ``old`` and/or
``freeze``): per round, the evaluation's wall time, the longest slice and the loop's lateness, the
longest slice against the goal of a few milliseconds. ``--no-record``: print only.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import importlib.util
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

from fleet.stragglers import SLICE_S, StragglerWatch
from sim.stragglers import generate


async def _timed(coro_factory: Any) -> tuple[float, float, Any]:
    """(wall s, the ticker's worst lateness s, result) of one awaited call."""
    worst = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0)
            worst = max(worst, time.perf_counter() - t)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    result = await coro_factory()
    wall = time.perf_counter() - t0
    stop.set()
    await task
    return wall, worst, result


def _rounds(messages: list[dict[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    members = [m for m in messages if m["type"] == "NCCLJobMember"]
    vectors = [m for m in messages if m["type"] == "StragglerSignals"]
    churn = []
    for m in members[seed % 100::100]:  # 1 %: the same GPUs, new processes
        m2 = copy.deepcopy(m)
        m2["entity"] += "-r"
        m2["details"]["pid"] += 100000
        churn.append(m2)
    fresh = []
    for m in vectors[seed % 20::20]:  # 5 % of the vectors again, newer
        m2 = copy.deepcopy(m)
        m2["time"] = "2026-12-03T08:05:00.000Z"
        fresh.append(m2)
    return [messages, churn, fresh]


def _old_watch() -> Any:
    src = subprocess.run(["git", "show", "96d274a:fleet/stragglers.py"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout
    path = Path(tempfile.mkdtemp()) / "old_stragglers.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_stragglers", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_stragglers"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.StragglerWatch()


async def run(nodes: int, runs: int, old: bool, freeze: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Print the table; return its figures (bench/record.py) and the per-run numbers."""
    names = ("start (all new)", "1 % members replaced", "5 % vectors new")
    rows: dict[str, list[tuple[float, float, float, int]]] = {n: [] for n in names}
    members = 0
    for r in range(runs):
        sc = generate(7000 + r, nodes=nodes)
        members = sum(m["type"] == "NCCLJobMember" for m in sc.messages)
        watch = _old_watch() if old else StragglerWatch()
        for name, batch in zip(names, _rounds(sc.messages, r), strict=True):
            for m in batch:
                watch.add(m)
            if freeze:
                gc.collect()
                gc.freeze()
            if old:
                async def call(w: Any = watch) -> list[dict[str, Any]]:
                    return list(w.evaluate(time.time()))
            else:
                watch.max_slice_s = 0.0

                async def call(w: Any = watch) -> list[dict[str, Any]]:
                    out: list[dict[str, Any]] = await w.evaluate_async(time.time())
                    return out
            wall, late, recs = await _timed(call)
            rows[name].append((wall, 0.0 if old else watch.max_slice_s, late, len(recs)))
    print(f"{'old' if old else 'new'} StragglerWatch, {nodes} nodes, {members} members, {nodes * 9} ports, "
          f"median of {runs} runs{', gc.freeze()' if freeze else ''}")
    print(f"{'round':<24}{'wall':>10}{'longest slice':>16}{'loop late by':>15}{'records':>9}")
    figures: list[dict[str, Any]] = []
    for name in names:
        wall, sl, late, n = (statistics.median(x[i] for x in rows[name]) for i in range(4))
        print(f"{name:<24}{wall * 1000:>8.0f} ms{sl * 1000:>13.1f} ms{late * 1000:>12.1f} ms{n:>9.0f}")
        figures.append(results.figure(f"{name}: wall", round(wall * 1000), "ms", higher_is_better=False))
        if not old:
            figures.append(results.figure(f"{name}: longest synchronous slice", round(sl * 1000, 1), "ms",
                                          higher_is_better=False,
                                          goal=f"a step past slice_s ({SLICE_S * 1000:g} ms): a few ms"))
        figures.append(results.figure(f"{name}: loop late by", round(late * 1000, 1), "ms", higher_is_better=False))
    raw = {"members": members, "runs": {name: [[round(x, 6) for x in row] for row in rows[name]] for name in names}}
    return figures, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=13000, help="fleet size in nodes (default 13000: 104k members)")
    ap.add_argument("--runs", type=int, default=3, help="fleets (default 3); the median is printed")
    ap.add_argument("--old", action="store_true", help="the previous synchronous StragglerWatch.evaluate")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() once the fleet is loaded")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args(argv)
    figures, raw = asyncio.run(run(args.nodes, args.runs, args.old, args.freeze))
    variant = "-".join(v for v, on in (("old", args.old), ("freeze", args.freeze)) if on)
    results.record("straggler_watch", figures, variant=variant,
                   params={k: v for k, v in vars(args).items() if k != "no_record"}, raw=raw,
                   write=not args.no_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
