#!/usr/bin/env python3
"""Where an idle node's CPU goes: each periodic collector's pass on a simulated HGX node (issue 27).

bench/node_footprint.py measures the whole daemon at idle (every collector, the heartbeat, NATS, the
interpreter's wake-ups); this bench splits the collectors' share: on ``sim.host.SimHost.hgx_node`` (8 GPUs,
4 NVSwitches, 8 NDR HCAs and a RoCE NIC, a JuiceFS mount, a running job's NCCL log), each collector the daemon
starts by default is built as the daemon builds it (its default config, one emitter into an accepting sink,
one fact store shared by all), passed ``--warmup`` times, then timed over ``--passes`` passes: CPU per pass
(``time.process_time``: every thread of this process, the passes' reading threads included) and wall per pass.
Each pass's CPU times the passes a minute its default interval makes is its idle cost; the sum, in
millicores, is the collectors' share of the daemon's idle figure. Event-driven collectors (no periodic pass)
are listed, not timed. The baseline: the same measurement of another commit's collectors (``--baseline``, a
git worktree of it) on the same tree, in a child process, alternately with this checkout's (also a child).
Medians of ``--runs`` runs.

    python bench/collector_passes.py [--passes 20] [--runs 5] [--baseline REV] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # a child measuring another tree has put that tree first
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record as results  # noqa: E402

from agent.emitter import CollectorEmitter, ConditionTracker  # noqa: E402
from agent.facts import FactStore  # noqa: E402
from agent.registry import collector_classes  # noqa: E402
from gna_sdk.hostroot import HostRoot  # noqa: E402
from sim.host import SimHost  # noqa: E402

BASELINE = "4998377"  # the commit before the idle passes' sysfs reads were reworked (issue 27, stop 43)


async def _accept(_msg: Any) -> bool:
    return True


async def _measure(root: Path, passes: int, warmup: int) -> tuple[dict[str, dict[str, float]], list[str]]:
    facts, tracker, host = FactStore(), ConditionTracker(None), HostRoot(root)
    timed: dict[str, dict[str, float]] = {}
    untimed: list[str] = []
    for name, cls in sorted(collector_classes().items()):
        settings = cls.config_type()
        if not settings.enabled:
            continue
        collector = cls(settings, host, CollectorEmitter("hgx-0001", name, _accept, tracker, facts=facts))
        if not hasattr(collector, "collect"):
            untimed.append(name)
            continue
        for _ in range(warmup):
            await collector.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(passes):
            await collector.collect()
        cpu = (time.process_time() - cpu0) / passes * 1000
        timed[name] = {"cpu_ms": cpu, "wall_ms": (time.perf_counter() - wall0) / passes * 1000,
                       "interval_s": float(settings.interval), "ms_per_min": cpu * 60 / settings.interval}
    return timed, untimed


CHILD = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import collector_passes as cp
timed, untimed = asyncio.run(cp._measure(__import__("pathlib").Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
print(json.dumps({"timed": timed, "untimed": untimed}))
"""


def _run_tree(tree: Path, host: Path, passes: int, warmup: int) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The measurement in a child process whose imports come from ``tree`` (this checkout or the baseline's)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(Path(__file__).resolve().parent), str(host),
                          str(passes), str(warmup)], capture_output=True, text=True, check=True, cwd=host.parent)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["timed"], got["untimed"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE,
                    help="the commit whose collectors are measured alongside, alternately, on the same tree "
                         "(a git worktree of it; default: the commit before issue 27's idle-pass work)")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args()
    ours: list[dict[str, dict[str, float]]] = []
    base: list[dict[str, dict[str, float]]] = []
    untimed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gna-passes-") as tmp:
        host = Path(tmp) / "host"
        SimHost.hgx_node(host)
        worktree = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(worktree), args.baseline],
                       check=True)
        try:
            for _ in range(args.runs):  # alternately
                got, untimed = _run_tree(REPO, host, args.passes, args.warmup)
                ours.append(got)
                base.append(_run_tree(worktree, host, args.passes, args.warmup)[0])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)

    def median(runs: list[dict[str, dict[str, float]]], name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in runs if name in r)

    names = sorted(ours[0], key=lambda n: -median(ours, n, "ms_per_min"))
    figures: list[dict[str, Any]] = []
    total = total_base = 0.0
    print(f"{'collector':16s} {'CPU/pass':>10s} {'baseline':>10s} {'wall/pass':>10s} {'interval':>9s} {'CPU/min':>9s}"
          f" {'baseline':>9s}")
    for n in names:
        cpu, wall, per_min = median(ours, n, "cpu_ms"), median(ours, n, "wall_ms"), median(ours, n, "ms_per_min")
        cpu_b = median(base, n, "cpu_ms") if all(n in r for r in base) else None
        per_min_b = median(base, n, "ms_per_min") if cpu_b is not None else 0.0
        total += per_min
        total_base += per_min_b
        interval = ours[0][n]["interval_s"]
        print(f"{n:16s} {cpu:8.2f} ms {cpu_b if cpu_b is not None else float('nan'):8.2f} ms {wall:8.2f} ms "
              f"{interval:7.0f} s {per_min:7.1f} ms {per_min_b:7.1f} ms")
        if per_min >= 0.05:
            figures.append(results.figure(f"{n}: CPU per pass (every {interval:g} s)", round(cpu, 2), "ms",
                                          baseline=round(cpu_b, 2) if cpu_b is not None else None,
                                          baseline_name=f"the same pass at {args.baseline}", higher_is_better=False))
    print(f"event-driven, not timed: {', '.join(untimed) or 'none'}")
    print(f"all passes: {total:.1f} ms of CPU a minute = {total / 60:.2f} millicores "
          f"(at {args.baseline}: {total_base:.1f} ms = {total_base / 60:.2f} millicores)")
    figures.append(results.figure("all passes, CPU per minute", round(total, 1), "ms", baseline=round(total_base, 1),
                                  baseline_name=f"the same collectors at {args.baseline}", higher_is_better=False))
    figures.append(results.figure("all passes, millicores", round(total / 60, 3), "millicores",
                                  goal="the daemon's idle <= 0.6 millicores (issue 27; node_footprint)"))
    results.record("collector_passes", figures, params={k: v for k, v in vars(args).items() if k != "no_record"},
                   raw={"runs": ours, "baseline_runs": base, "event_driven": untimed}, write=not args.no_record)


if __name__ == "__main__":
    main()
