"""Precision and recall of the fleet correlator against naive blame, on two independent scenario sets.

    .venv/bin/python bench/correlator.py [--scenarios 20] [--min-nodes 1] [--max-nodes 128] [--seed 0]
        [--layouts-per-cell 1] [--layouts-max-nodes 8] [--sets sim,layouts] [--cli-check] [--no-record]

Two scenario sources, each reported apart:

* ``sim``: sim/scenarios.py -- randomized fleets of host-root trees with one or two jobs (8 ranks per node, so 8 to
  1,024 ranks), one injected fault or none, noise on any node. This generator was written and changed in the same
  commits as the correlator's verdicts: a score on it alone says little. Every node's one-shot checks run in this
  process (agent/check.py ``check_roots``, the same code as ``gpu-node-agent check``, default configuration), then
  the correlator (fleet/correlator.py ``correlate``) over all nodes' messages, as today.
* ``layouts``: tests/layouts/generate.py -- multi-node failure snapshots written by a separate author from the
  public log formats (NCCL, PyTorch, torchrun, Slurm, Kubernetes, Open MPI, the kernel), never from this
  product's code, in six log layouts x five faults (hang, crash, ib-port-down, xid79, healthy), with the expected
  culprit in expected.json. These go through the path ``gpu-node-agent diagnose`` takes (the one bench/layouts.py
  measures, fleet/cli.py ``cmd_diagnose``), run in this process: each host root's checks with the operator's
  config the generator wrote (the kernel log capture, the log globs), fleet/diagnose.py ``join_relayed`` (lines a
  node read in a job-wide file -- srun's output on the batch host, an MPI launcher's console -- join the snapshot
  of the host that wrote them), then ``correlate``. The plain path the ``sim`` set uses (checks, then
  ``correlate``, no join) cannot be fed these snapshots faithfully without changing fleet/: it names an MPI
  launcher's relayed ranks by their pod, not their node, so its score is printed beside, not used.
  ``--cli-check`` also runs the real ``gpu-node-agent diagnose`` on each (tests/layouts/verdict.py
  ``run_diagnose``) and counts where its culprits differ from the in-process ones.

Naive blame, the baseline (bench/naive_blame.py): what a careful operator's script names from the same messages,
without the correlator -- only symptomatic jobs (a watchdog timeout, an NCCL error, a crash), only resources the
job listed (its members' GPUs, the NICs its NCCL said it uses), and ranks from the watchdog's own words (lowest
last completed SeqNum, never reported a timeout, died on its own first). Both see exactly the same messages.

Scored per job against the generator's expected culprit (none for a healthy job), from every culprit an incident
names (``culprit`` and ``culprits``):

* exact: the culprit (node, entity, kind) named -- tp; any other (node, entity, kind) named -- fp; the expected
  one not named -- fn (sim/scenarios.py ``Scenario.score`` counts each incident's first culprit only; that score
  is printed too, as before);
* node: the culprit's node named -- tp; any other node named -- fp; the culprit's node not named -- fn (what
  bench/layouts.py judges).

Time to culprit: the correlator's own time per scenario over all the scenario's messages (ms), against naive
blame's over the same messages; the checks' time is the nodes' and is reported apart. The result is recorded
(bench/record.py, bench/results/correlator.jsonl) unless ``--no-record``; a run of one set only (``--sets``) is
never recorded (the recorded result covers both).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from naive_blame import naive_blame  # noqa: E402  (bench/ is not a package)
from record import figure, record  # noqa: E402

from agent import config as configmod  # noqa: E402
from agent.check import check_roots  # noqa: E402
from agent.logsetup import configure  # noqa: E402
from fleet import diagnose  # noqa: E402
from fleet.correlator import correlate  # noqa: E402
from sim.scenarios import generate as sim_generate  # noqa: E402
from tests.layouts.generate import FAULTS as LAYOUT_FAULTS  # noqa: E402
from tests.layouts.generate import LAYOUTS  # noqa: E402
from tests.layouts.generate import generate as layouts_generate  # noqa: E402

NAIVE = "naive blame (bench/naive_blame.py)"
Culprit = tuple[str, str, str]  # (node, entity, kind)
COUNTS = ("tp", "fp", "fn", "ntp", "nfp", "nfn")  # exact, then node level


def named(incidents: list[dict[str, Any]], key: Any = None) -> dict[str, set[Culprit]]:
    """job -> every (node, entity, kind) its incidents name (``key``: one job for all, for one-job scenarios)."""
    out: dict[str, set[Culprit]] = defaultdict(set)
    for inc in incidents:
        cs = [c for c in (inc.get("culprits") or []) if isinstance(c, dict)]
        if isinstance(inc.get("culprit"), dict):
            cs.append(inc["culprit"])
        job = key if key is not None else str(inc.get("job"))
        for c in cs:
            out[job].add((str(c.get("node")), str(c.get("entity")), str(c.get("kind"))))
    return out


def score(found: dict[str, set[Culprit]], expected: dict[str, Culprit | None]) -> dict[str, int]:
    s = dict.fromkeys(COUNTS, 0)
    for job in set(found) | set(expected):
        got, want = found.get(job, set()), expected.get(job)
        nodes = {c[0] for c in got}
        if want is None:
            s["fp"] += len(got)
            s["nfp"] += len(nodes)
            continue
        s["tp"] += want in got
        s["fn"] += want not in got
        s["fp"] += len(got - {want})
        s["ntp"] += want[0] in nodes
        s["nfn"] += want[0] not in nodes
        s["nfp"] += len(nodes - {want[0]})
    return s


def ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def fmt(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "n/a"


class Tally:
    """Per fault kind and in all, for each blamer: the counts of ``COUNTS``; times per scenario."""

    def __init__(self, blamers: tuple[str, ...]) -> None:
        self.blamers = blamers
        self.kinds: dict[str, dict[str, dict[str, int]]] = defaultdict(
            lambda: {b: dict.fromkeys(COUNTS, 0) for b in blamers})
        self.ms: dict[str, list[float]] = {b: [] for b in blamers}
        self.check_s: list[float] = []
        self.n = 0

    def add(self, kind: str, blamer: str, s: dict[str, int]) -> None:
        for k in COUNTS:
            self.kinds[kind][blamer][k] += s[k]

    def total(self, blamer: str) -> dict[str, int]:
        return {k: sum(d[blamer][k] for d in self.kinds.values()) for k in COUNTS}

    def rates(self, blamer: str) -> dict[str, float | None]:
        t = self.total(blamer)
        return {"precision": ratio(t["tp"], t["tp"] + t["fp"]), "recall": ratio(t["tp"], t["tp"] + t["fn"]),
                "node_precision": ratio(t["ntp"], t["ntp"] + t["nfp"]),
                "node_recall": ratio(t["ntp"], t["ntp"] + t["nfn"])}

    def median_ms(self, blamer: str) -> float | None:
        return round(statistics.median(self.ms[blamer]), 3) if self.ms[blamer] else None

    def print(self, title: str) -> None:
        print(f"\n{title}")
        cols = "".join(f" {b + ' exact tp/fp/fn':>22} {'node tp/fp/fn':>13}" for b in self.blamers)
        print(f"{'fault':20}{cols}")
        for kind, d in sorted(self.kinds.items()):
            row = "".join(f" {'/'.join(str(d[b][k]) for k in COUNTS[:3]):>22} "
                          f"{'/'.join(str(d[b][k]) for k in COUNTS[3:]):>13}" for b in self.blamers)
            print(f"{kind:20}{row}")
        for b in self.blamers:
            t, r = self.total(b), self.rates(b)
            print(f"{b:12} exact: precision {fmt(r['precision'])} recall {fmt(r['recall'])} (tp {t['tp']}, "
                  f"fp {t['fp']}, fn {t['fn']}); node: precision {fmt(r['node_precision'])} "
                  f"recall {fmt(r['node_recall'])} (tp {t['ntp']}, fp {t['nfp']}, fn {t['nfn']}); "
                  f"median {self.median_ms(b) or 0:.2f} ms per scenario")


def timed(fn: Any, *a: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*a)
    return out, (time.perf_counter() - t0) * 1000


def run_sim(args: argparse.Namespace, base: Path) -> tuple[Tally, dict[str, list[int]]]:
    rng = random.Random(args.seed)
    tally = Tally(("ours", "naive"))
    as_before = {"ours": [0, 0, 0], "naive": [0, 0, 0]}  # Scenario.score: each incident's first culprit
    ranks: list[int] = []
    for i in range(args.scenarios):
        nodes = rng.randint(args.min_nodes, args.max_nodes)
        with tempfile.TemporaryDirectory(prefix="gna-corr-", dir=base) as tmp:
            sc = sim_generate(Path(tmp), seed=args.seed * 100000 + i, nodes=nodes)
            t0 = time.perf_counter()
            msgs = asyncio.run(sc.messages())
            tally.check_s.append(time.perf_counter() - t0)
        ours, ours_ms = timed(lambda m: [inc.to_dict() for inc in correlate(m)], msgs)
        naive, naive_ms = timed(naive_blame, msgs)
        tally.ms["ours"].append(ours_ms)
        tally.ms["naive"].append(naive_ms)
        want = {job: (c["node"], c["entity"], c["kind"]) if c else None for job, c in sc.expected.items()}
        line = []
        for name, incs in (("ours", ours), ("naive", naive)):
            s = score(named(incs), want)
            tally.add(sc.fault, name, s)
            before = sc.score(incs)
            as_before[name] = [a + before[k] for a, k in zip(as_before[name], ("tp", "fp", "fn"), strict=True)]
            line.append(f"{name} {s['tp']}/{s['fp']}/{s['fn']}")
        ranks.append(max(j.size for j in sc.jobs))
        tally.n += 1
        print(f"sim {i}: {sc.fault:18} {nodes:4} nodes, job of {ranks[-1]:5} ranks: exact tp/fp/fn "
              + ", ".join(line), flush=True)
    return tally, as_before


def expected_culprit(exp: dict[str, Any]) -> Culprit | None:
    """tests/layouts' expected.json as the (node, entity, kind) an expert names (entities: gna_types/entities.py)."""
    c = exp.get("culprit") or {}
    kind = exp.get("culprit_entity_kind")
    if not c or not kind:
        return None
    entity = {"rank": f"rank:{c.get('rank')}", "gpu": f"gpu:{c.get('gpu')}",
              "hca_port": f"ib:{c.get('hca')}/{c.get('port')}"}[kind]
    return str(c["node"]), entity, str(kind)


def run_layouts(args: argparse.Namespace, base: Path) -> tuple[Tally, dict[str, Any]]:
    rng = random.Random(args.seed)
    tally = Tally(("ours", "naive"))
    live = dict.fromkeys(COUNTS, 0)  # the plain path (no diagnose join): shown beside
    cli = {"checked": 0, "differ": 0}
    i = 0
    for layout in LAYOUTS:
        for fault in LAYOUT_FAULTS:
            for _ in range(args.layouts_per_cell):
                nodes = rng.randint(2, max(2, args.layouts_max_nodes))
                seed = args.seed * 1000 + i
                i += 1
                d = Path(tempfile.mkdtemp(prefix="gna-corr-layouts-", dir=base))
                try:
                    exp = layouts_generate(d / "s", layout, fault, nodes=nodes, gpus_per_node=8, seed=seed)
                    t0 = time.perf_counter()
                    reports = asyncio.run(check_roots([Path(r) for r in exp["roots"]],
                                                      configmod.load(exp["config"])))
                    tally.check_s.append(time.perf_counter() - t0)
                    plain = [m for r in reports for m in r["conditions"] + r["events"]]
                    live_incs = [inc.to_dict() for inc in correlate(copy.deepcopy(plain))]
                    diagnose.join_relayed(reports)  # as cmd_diagnose does
                    msgs = [m for r in reports for m in r["conditions"] + r["events"]]
                    ours, ours_ms = timed(lambda m: [inc.to_dict() for inc in correlate(m)], msgs)
                    naive, naive_ms = timed(naive_blame, msgs)
                    if args.cli_check:
                        from tests.layouts.verdict import run_diagnose

                        rc, out, err = run_diagnose(exp)
                        cli["checked"] += 1
                        if named(out.get("incidents") or [], "job") != named(ours, "job"):
                            cli["differ"] += 1
                            print(f"  cli differs: rc {rc}, {sorted(named(out.get('incidents') or [], 'job'))} "
                                  f"vs {sorted(named(ours, 'job'))} {err.strip()[-200:]}")
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                tally.ms["ours"].append(ours_ms)
                tally.ms["naive"].append(naive_ms)
                want = {"job": expected_culprit(exp)}
                line = []
                for name, incs in (("ours", ours), ("naive", naive)):
                    s = score(named(incs, "job"), want)
                    tally.add(fault, name, s)
                    line.append(f"{name} {s['tp']}/{s['fp']}/{s['fn']}")
                s = score(named(live_incs, "job"), want)
                for k in COUNTS:
                    live[k] += s[k]
                tally.n += 1
                print(f"layouts {layout:15} {fault:12} {nodes:3} nodes seed {seed}: exact tp/fp/fn "
                      + ", ".join(line), flush=True)
    return tally, {"live_path": live, "cli": cli}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=int, default=20, help="sim/scenarios.py fleets (default 20)")
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layouts-per-cell", type=int, default=1,
                    help="tests/layouts scenarios per (layout, fault): 30 cells (default 1)")
    ap.add_argument("--layouts-max-nodes", type=int, default=8, help="nodes per layouts scenario: 2..this (max 64)")
    ap.add_argument("--sets", default="sim,layouts", help="which scenario sources (default sim,layouts)")
    ap.add_argument("--cli-check", action="store_true",
                    help="also run `gpu-node-agent diagnose` on each layouts scenario and count differing culprits")
    ap.add_argument("--no-record", action="store_true", help="do not append the result to bench/results/")
    args = ap.parse_args()
    sets = [s for s in args.sets.split(",") if s]
    if not sets or set(sets) - {"sim", "layouts"}:
        ap.error("--sets: sim, layouts or both")
    if not 2 <= args.layouts_max_nodes <= 64:
        ap.error("--layouts-max-nodes: 2..64")
    configure("error", "json")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="gna-corr-", dir=shm if shm.is_dir() else None))
    figures: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    try:
        results: dict[str, tuple[Tally, Any]] = {}
        if "sim" in sets:
            results["sim"] = run_sim(args, base)
        if "layouts" in sets:
            results["layouts"] = run_layouts(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if "sim" in results:
        tally, before = results["sim"]
        tally.print(f"sim/scenarios.py: {tally.n} fleets, {args.min_nodes}-{args.max_nodes} nodes (8 ranks each); "
                    f"checks {statistics.median(tally.check_s or [0]):.1f} s median per fleet (the nodes' work)")
        print("scored as before (Scenario.score, each incident's first culprit): "
              + "; ".join(f"{b} tp/fp/fn {'/'.join(map(str, v))}" for b, v in before.items()))
        raw["sim"] = {"kinds": {k: v for k, v in tally.kinds.items()}, "as_before": before,
                      "check_s_median": round(statistics.median(tally.check_s or [0]), 2)}
    if "layouts" in results:
        tally, extra = results["layouts"]
        tally.print(f"tests/layouts (independent generator), through diagnose's path in process (checks with the "
                    f"operator's config, join_relayed, correlate): {tally.n} snapshots, {args.layouts_per_cell} per "
                    f"(layout, fault), 2-{args.layouts_max_nodes} nodes x 8 GPUs; checks "
                    f"{statistics.median(tally.check_s or [0]):.2f} s median")
        lv = extra["live_path"]
        print(f"ours on the plain path (checks, correlate; no diagnose join), not used: exact tp/fp/fn "
              f"{lv['tp']}/{lv['fp']}/{lv['fn']}, node tp/fp/fn {lv['ntp']}/{lv['nfp']}/{lv['nfn']}")
        if extra["cli"]["checked"]:
            print(f"gpu-node-agent diagnose (subprocess) named other culprits than the in-process path in "
                  f"{extra['cli']['differ']} of {extra['cli']['checked']} snapshots")
        raw["layouts"] = {"kinds": {k: v for k, v in tally.kinds.items()}, **extra,
                          "check_s_median": round(statistics.median(tally.check_s or [0]), 2)}
    for src, (tally, _) in results.items():
        ours, naive = tally.rates("ours"), tally.rates("naive")
        label = {"sim": "sim/scenarios.py", "layouts": "tests/layouts"}[src]
        for key, what in (("precision", "precision, exact culprit"), ("recall", "recall, exact culprit"),
                          ("node_precision", "precision, culprit node"), ("node_recall", "recall, culprit node")):
            value = ours[key]
            figures.append(figure(f"{label}: {what}", value if value is not None else "n/a",
                                  baseline=naive[key], baseline_name=NAIVE))
        figures.append(figure(f"{label}: median time to culprit (correlator over all messages)",
                              tally.median_ms("ours") or 0.0, "ms", baseline=tally.median_ms("naive"),
                              baseline_name=NAIVE, higher_is_better=False))
        raw.setdefault(src, {})["ms_max"] = {b: round(max(v), 2) for b, v in tally.ms.items() if v}
    print("\nfigures (baseline: naive blame):")
    for f in figures:
        print(f"  {f['name']}: {f['value']} {f['unit']}".rstrip() + f" (naive {f.get('baseline')}"
              + (f", ratio {f['ratio']})" if "ratio" in f else ")"))
    params = {"sets": sets, "scenarios": args.scenarios, "min_nodes": args.min_nodes, "max_nodes": args.max_nodes,
              "seed": args.seed, "layouts_per_cell": args.layouts_per_cell,
              "layouts_max_nodes": args.layouts_max_nodes, "cli_check": args.cli_check}
    complete = set(sets) == {"sim", "layouts"}
    if not complete and not args.no_record:
        print("(not recorded: the recorded result covers both scenario sets; this run had only "
              f"{', '.join(sets)})")
    record("correlator", figures, params=params, raw=raw, write=complete and not args.no_record)


if __name__ == "__main__":
    main()
