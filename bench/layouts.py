"""Culprit naming per log layout and fault, on seeded multi-node failure snapshots (tests/layouts/generate.py).

    .venv/bin/python bench/layouts.py [--per-cell 5] [--nodes 4] [--seed 0] [--layouts a,b] [--faults a,b] [-j 2] [-v]

For every (layout, fault) cell, ``--per-cell`` scenarios (seeds ``--seed`` .. ``--seed + per-cell - 1``, each
``--nodes`` nodes of 8 GPUs) are generated under /dev/shm (else the temporary directory), ``gpu-node-agent diagnose``
runs over each as an operator would run it, and its answer is judged against the scenario's expected.json
(tests/layouts/verdict.py). Printed per cell:

* ``ok``: judged as expected (the culprit node named and nobody else, no finding filed under the wrong node;
  a healthy job: no incident);
* ``right/named``: precision, culprit namings that were the culprit node over all culprit namings;
* ``kind``: of the right namings, those with the expected entity kind (rank / gpu / hca_port);
* ``healthy named``: healthy nodes (or names of nothing the job ran on) named as culprits, summed over the cell;
* ``pod``: scenarios where the culprit's pod or host name was given where its node's name belongs;
* ``no verdict``: fault scenarios where nobody was named; ``misattr``: scenarios with a critical finding filed
  under a node it is not about, or a hardware finding on a healthy node; ``false alarm``: healthy jobs reported.

The commit (``git rev-parse --short HEAD``) and the product's dirty state head the table. ``-v`` prints each
failing scenario's incidents.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.layouts.generate import ENTITY_KIND, FAULTS, LAYOUTS, generate
from tests.layouts.verdict import Judgement, judge, run_diagnose

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + (" (working tree modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def one(base: Path, layout: str, fault: str, nodes: int, seed: int, keep: bool) -> Judgement:
    d = base / f"{layout}-{fault}-{nodes}n-s{seed}"
    try:
        exp = generate(d, layout, fault, nodes=nodes, gpus_per_node=8, seed=seed)
        rc, out, err = run_diagnose(exp)
        return judge(exp, rc, out, err)
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-cell", type=int, default=5, help="scenarios per (layout, fault) (default 5)")
    ap.add_argument("--nodes", type=int, default=4, help="nodes per scenario, 2..64 (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("-j", "--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--keep", action="store_true", help="keep the generated scenarios (their directory is printed)")
    ap.add_argument("-v", "--verbose", action="store_true", help="explain every scenario not judged as expected")
    a = ap.parse_args(argv)
    layouts = [x for x in a.layouts.split(",") if x]
    faults = [x for x in a.faults.split(",") if x]
    for x in layouts:
        if x not in LAYOUTS:
            ap.error(f"unknown layout {x!r}: {', '.join(LAYOUTS)}")
    for x in faults:
        if x not in FAULTS:
            ap.error(f"unknown fault {x!r}: {', '.join(FAULTS)}")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="gna-layouts-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
    t0 = time.monotonic()
    cells = [(lay, f) for lay in layouts for f in faults]
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futs = {(lay, f, s): pool.submit(one, base, lay, f, a.nodes, s, a.keep)
                for lay, f in cells for s in range(a.seed, a.seed + a.per_cell)}
        res = {k: v.result() for k, v in futs.items()}
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)
    print(f"bench/layouts.py at {commit()}: {a.per_cell} scenario(s) per cell, {a.nodes} nodes x 8 GPUs, seeds "
          f"{a.seed}..{a.seed + a.per_cell - 1}, {time.monotonic() - t0:.0f} s")
    head = (f"{'layout':<16} {'fault':<13} {'ok':>6} {'right/named':>12} {'precision':>9} {'kind':>6} "
            f"{'healthy named':>13} {'pod':>4} {'no verdict':>10} {'misattr':>7} {'false alarm':>11}")
    print(head)
    print("-" * len(head))
    tot_ok = tot_n = tot_right = tot_named = tot_healthy = 0
    for lay, f in cells:
        js = [res[(lay, f, s)] for s in range(a.seed, a.seed + a.per_cell)]
        ok = sum(j.as_expected for j in js)
        right = sum(j.named_right for j in js)
        named = sum(j.named_times for j in js)
        kind = sum(1 for j in js if j.right and j.kind == ENTITY_KIND[f])
        healthy = sum(len(j.wrong) for j in js)
        pods = sum(1 for j in js if j.aliases)
        nover = sum(1 for j in js if j.expected_node and not j.named)
        mis = sum(1 for j in js if j.misattributed or j.healthy_flagged)
        fa = sum(1 for j in js if j.expected_node is None and j.incidents)
        errs = sum(1 for j in js if j.error)
        prec = f"{right / named:.2f}" if named else "-"
        kinds = f"{kind}/{sum(j.right for j in js)}" if f != "healthy" else "-"
        print(f"{lay:<16} {f:<13} {ok:>3}/{len(js):<2} {f'{right}/{named}':>12} {prec:>9} {kinds:>6} {healthy:>13} "
              f"{pods:>4} {nover if f != 'healthy' else '-':>10} {mis:>7} {fa if f == 'healthy' else '-':>11}"
              + (f"  ({errs} error(s))" if errs else ""))
        tot_ok += ok
        tot_n += len(js)
        tot_right += right
        tot_named += named
        tot_healthy += healthy
    print("-" * len(head))
    print(f"{'all':<16} {'':<13} {tot_ok:>3}/{tot_n:<2} {f'{tot_right}/{tot_named}':>12} "
          f"{(f'{tot_right / tot_named:.2f}' if tot_named else '-'):>9} {'':>6} {tot_healthy:>13}")
    if a.verbose:
        for _cell, j in sorted(res.items()):
            if not j.as_expected:
                print()
                print(j.explain())
    if a.keep:
        print(f"\nscenarios kept under {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
