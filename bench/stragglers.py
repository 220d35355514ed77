"""Precision and recall of fleet straggler detection on randomized fleets, against node-local thresholds.

    .venv/bin/python bench/stragglers.py [--scenarios 100] [--sizes 64,128,256] [--seed 0]

Each scenario (sim/stragglers.py): a fleet of N nodes (8 GPUs and 8 rail NICs plus a storage NIC
each; an A100 class beside the H100s; idle nodes; two or three jobs) publishing StragglerSignals
vectors with healthy noise, and one degraded GPU or link, or none. Compared:

* the fleet detector (fleet/stragglers.py): each device against its job's peers of its class;
* the baseline, node-local thresholds only (what a single-node tool such as DCGM's health watches or
  NVSentinel's NIC monitor flags): a device is named only past a published limit.

Printed per fault kind and in total: true/false positives and misses for both, precision and
recall, and the detector's time per fleet (median of the scenarios).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.stragglers import GPU_SIGNALS, PORT_SIGNALS, detect, devices_of, signal_value
from sim.stragglers import FAULTS, generate


def node_local(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What single-node tools flag, device by device, whatever the peers and whether a job uses it: DCGM's
    health watches (PCIe replays past the link's limit, any NVLink CRC error in a minute is a WARN, replay
    or recovery errors), the agent's own node findings (a slowdown held >= 60 s, a link below its width, a
    margin at or below 0, a port below its rate) and NVSentinel's NIC thresholds (docs/straggler-signals.md)."""
    out = []
    sigs = {sig.key: sig for sig in (*GPU_SIGNALS, *PORT_SIGNALS)}

    def value(v: dict[str, Any], key: str) -> float:
        # a rate over a partial window counts as its count over the whole window, as DCGM and NVSentinel judge
        # a window only once it has elapsed (and the agent's own findings: WindowStats.over)
        x = signal_value(v, sigs[key]) if key in sigs else v.get(key)
        return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0

    for dev in devices_of(messages):
        v = dev.vector

        def num(key: str, v: dict[str, Any] = v) -> float:
            return value(v, key)

        if dev.kind == "gpu":
            raw = v.get("clock_slowdown_held_s")
            held: dict[str, Any] = raw if isinstance(raw, dict) else {}
            hit = (num("pcie_replay_per_min") > num("pcie_replay_limit_per_min") > 0
                   or num("nvlink_crc_flit_per_min") >= 1 or num("nvlink_crc_data_per_min") >= 1
                   or num("nvlink_replay_per_min") >= 1 or num("nvlink_recovery_per_min") >= 1
                   or any(isinstance(held.get(r), int | float) and held[r] >= 60
                          for r in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"))
                   or 0 < num("pcie_width") < 16 or ("thermal_margin_c" in v and v["thermal_margin_c"] is not None
                                                     and num("thermal_margin_c") <= 0))
        else:
            full = 200.0 if v.get("link_layer") == "Ethernet" else 400.0
            hit = (num("symbol_error_per_h") > 120 or num("link_error_recovery_per_min") > 5
                   or num("port_rcv_errors_per_s") > 10 or 0 < num("rate_gbps") < full)
        if hit:
            out.append({"node": dev.node, "entity": dev.entity})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=100, help="fleets per size (default 100)")
    ap.add_argument("--sizes", default="64,128,256", help="fleet sizes in nodes (default 64,128,256)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    args = ap.parse_args(argv)
    for size in (int(s) for s in args.sizes.split(",")):
        per: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
        times: list[float] = []
        for k in range(args.scenarios):
            sc = generate(args.seed + k, nodes=size)
            t0 = time.perf_counter()
            found = detect(sc.messages)
            times.append(time.perf_counter() - t0)
            for name, got in (("fleet", found), ("node-local", node_local(sc.messages))):
                for key, v in sc.score(got).items():
                    per[name][sc.fault][key] += v
                    per[name]["total"][key] += v
        print(f"\n{size} nodes ({size * 8} GPUs, {size * 9} ports), {args.scenarios} fleets, "
              f"detector {statistics.median(times) * 1000:.1f} ms per fleet (median)")
        print(f"{'fault':<18}{'fleet tp/fp/fn':>18}{'node-local tp/fp/fn':>22}")
        for fault in (*FAULTS, "total"):
            a, b = per["fleet"].get(fault), per["node-local"].get(fault)
            if a is None or b is None:
                continue
            print(f"{fault:<18}{a['tp']:>8}/{a['fp']}/{a['fn']:<6}{b['tp']:>12}/{b['fp']}/{b['fn']}")
        for name in ("fleet", "node-local"):
            t = per[name]["total"]
            p = t["tp"] / max(1, t["tp"] + t["fp"])
            r = t["tp"] / max(1, t["tp"] + t["fn"])
            print(f"{name:<11} precision {p:.3f} recall {r:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
