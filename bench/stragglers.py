"""Precision and recall of fleet straggler detection on randomized fleets, against node-local thresholds.

    .venv/bin/python bench/stragglers.py [--scenarios 100] [--sizes 64,128,256] [--seed 0]
        [--sweep-scenarios 30] [--sweep-size 64] [--no-sweep] [--no-record]

Each scenario (sim/stragglers.py): a fleet of N nodes (8 GPUs and 8 rail NICs plus a storage NIC
each; an A100 class beside the H100s; idle nodes; two or three jobs) publishing StragglerSignals
vectors with healthy noise (sim/stragglers.py ``Noise``: per-device rates from heavy-tailed
distributions, uncapped, their parameters cited or stated as assumptions), and one degraded GPU or
link, or none. Compared:

* the fleet detector (fleet/stragglers.py): each device against its job's peers of its class;
* the baseline, ``node-local``: what a careful operator's single-node tools flag, device by device,
  whatever the peers: the published limits DCGM's health watches, NVSentinel and Azure's node health
  checks use, each rule cited at ``node_local`` below;
* ``node-local + CRC warn``: the same plus DCGM's NVLink CRC warning (any CRC error in a minute), which
  DCGM's own severity table rates ISOLATE and NVSentinel ignores: the baseline before issue 27.

Printed per fleet size, with the default noise: per fault kind, true/false positives and misses of
each; precision and recall; how many of the fleet's false positives are healthy devices past a
published limit (the careful node-local baseline names them too: by the ground truth they are
healthy, by the published limits they are not); and the detector's time per fleet (median of the
scenarios). Then the sensitivity sweep (``--sweep-size`` nodes, ``--sweep-scenarios`` fleets): each
noise family's assumed medians (the thermal spread) multiplied by 0.1 and 10 (0.5 and 2), one family
at a time, then every rate family at once by 0.01, 0.1 and 10 (``rates``), since no public data pins
them (docs/straggler-signals.md "Healthy noise").

The result goes to bench/results/stragglers.jsonl (bench/record.py): per size, the fleet detector's
precision and recall with the node-local baseline's as their baselines, and the detector's time per
fleet; the per-fault counts and the sweep in ``raw``. ``--no-record``: print only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record as results

from fleet.stragglers import GPU_SIGNALS, PORT_SIGNALS, detect, devices_of, signal_value
from sim.stragglers import FAULTS, NOISE, NOISE_FAMILIES, Noise, generate

# The published single-node limits (docs/straggler-signals.md "Node-local baseline"):
DCGM = "NVIDIA/DCGM v4.6.0 (51b65cce)"
NVSENTINEL_DCGM_MAP = ("NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/gpu-health-monitor/"
                       "dcgmerrorsmapping.csv @b6180c37")
NVSENTINEL_NIC = "NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/nic-health-monitor/values.yaml @07b82dc2"
AZURE_NHC = "Azure/azurehpc-health-checks @0e0a1ac2"
NVLINK_CRC_FAIL_PER_MIN = 100.0 * 60  # DCGM common/DcgmGPUHardwareLimits.h DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100.0/s
NVLINK_ERROR_PER_MIN = 1.0  # DCGM_LIMIT_MAX_NVLINK_ERROR: >= 1 in the minute (MonitorNVLink4Fields l. 2747)
PERSIST_S = 60.0  # the agent's clock_event_persist (GPUThrottled), DCGM's one-minute health window
SYMBOL_ERRORS_PER_H = 120.0  # NVSentinel symbol_error_fatal: > 120/hour
SYMBOL_ERRORS_PER_S = 10.0  # NVSentinel symbol_error: > 10/second
LINK_RECOVERY_PER_MIN = 5.0  # NVSentinel link_error_recovery: > 5/minute
RCV_ERRORS_PER_S = 10.0  # NVSentinel port_rcv_errors: > 10/second
HELD_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
CLASS_WIDTH = 16  # both classes' GPUs are x16 (sim/stragglers.py CLASSES); the vector carries no max width


def node_local(messages: list[dict[str, Any]], *, crc_warn: bool = False) -> list[dict[str, Any]]:
    """What a careful operator's single-node tools flag, device by device, whatever the peers and whether a
    job uses it. Each rule is a published limit a single-node tool applies:

    GPU (DCGM's health watches as NVSentinel acts on them, and Azure's node health checks):
      * PCIe replays in the minute > DCGM's limit for the link's gen and width (the vector's
        ``pcie_replay_limit_per_min``): DCGM modules/health/DcgmHealthWatch.cpp ``MonitorPcie`` l. 1676, error
        DCGM_FR_PCI_REPLAY_RATE, which NVSentinel maps to REPORT_ISSUE;
      * NVLink CRC flit or data errors >= 100/s: DCGM ``MonitorNVLink4Fields`` l. 2784 (FAIL,
        DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD, NVSentinel RUN_FIELDDIAG). DCGM also warns at >= 1 in the minute
        (DCGM_FR_NVLINK_ERROR_THRESHOLD, severity ISOLATE in dcgmlib/src/dcgm_errors.c l. 37), which
        NVSentinel maps to IGNORE: applied only with ``crc_warn`` (the baseline before issue 27);
      * NVLink replay or recovery errors >= 1 in the minute: DCGM l. 2766 ("failures, not warnings",
        DCGM_FR_NVLINK_ERROR_CRITICAL, NVSentinel RUN_FIELDDIAG);
      * an NVLink down: DCGM_FR_NVLINK_DOWN (NVSentinel NODE_REBOOT); Azure customTests/azure_gpu_nvlink.nhc
        ``check_nvlink_status`` (any inactive link fails the node);
      * a thermal slowdown reason set now: DCGM ``MonitorThermal`` (any thermal violation time in the last
        minute, DCGM_FR_CLOCKS_EVENT_THERMAL, NVSentinel CHECK_THERMALS); or a T.Limit margin <= 0, at the
        maximum operating temperature (the agent's GPUThermalMarginLow warning; NVSentinel ADR-042 fails only
        past the slowdown offset, -2 on H100: the <= 0 line is the stronger);
      * a HW slowdown, power brake or thermal reason held >= 60 s: the agent's GPUThrottled
        (docs/straggler-signals.md). DCGM's power watch (DCGM_FR_CLOCKS_EVENT_POWER) is IGNORE in NVSentinel's
        map and Azure's ``check_gpu_clock_throttling`` only logs a warning: neither flags a transient;
      * a PCIe link narrower than the class's x16: the agent's link-width check (DCGM's diagnostic
        DCGM_FR_PCIE_WIDTH, NVSentinel REPORT_ISSUE).

    Port (NVSentinel's NIC health monitor defaults, Azure's node health checks):
      * symbol errors > 120/h (``symbol_error_fatal``) or > 10/s (``symbol_error``), link error recovery
        > 5/min, port receive errors > 10/s: NVSentinel values.yaml ``counterDetection.counters``;
      * a port below the rate its class runs at (Azure conf/nd96isr_h100_v5.conf ``check_hw_ib 400``), or
        not active (NVSentinel InfiniBandStateCheck).

    node_exporter's shipped alerts (prometheus/node_exporter v1.12.0 docs/node-mixin/alerts/alerts.libsonnet)
    have no InfiniBand rule; ``NodeNetworkReceiveErrs`` (receive errors > 1 % of packets for 1 h) is for
    netdevs and needs packet counts the vector does not carry: not applied.

    A rate over a partial window counts as its count over the whole window, as DCGM and NVSentinel judge a
    window only once it has elapsed (and the agent's own findings: WindowStats.over)."""
    out = []
    sigs = {sig.key: sig for sig in (*GPU_SIGNALS, *PORT_SIGNALS)}

    def value(v: dict[str, Any], key: str) -> float:
        x = signal_value(v, sigs[key]) if key in sigs else v.get(key)
        return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0

    for dev in devices_of(messages):
        v = dev.vector

        def num(key: str, v: dict[str, Any] = v) -> float:
            return value(v, key)

        if dev.kind == "gpu":
            raw = v.get("clock_slowdown_held_s")
            held: dict[str, Any] = raw if isinstance(raw, dict) else {}
            listed = v.get("clock_slowdown_reasons")
            reasons: list[Any] = listed if isinstance(listed, list) else []
            crc_line = NVLINK_ERROR_PER_MIN if crc_warn else NVLINK_CRC_FAIL_PER_MIN
            hit = (num("pcie_replay_per_min") > num("pcie_replay_limit_per_min") > 0
                   or num("nvlink_crc_flit_per_min") >= crc_line or num("nvlink_crc_data_per_min") >= crc_line
                   or num("nvlink_replay_per_min") >= NVLINK_ERROR_PER_MIN
                   or num("nvlink_recovery_per_min") >= NVLINK_ERROR_PER_MIN
                   or num("nvlinks_down") > 0
                   or any(r in THERMAL_REASONS for r in reasons)
                   or ("thermal_margin_c" in v and v["thermal_margin_c"] is not None and num("thermal_margin_c") <= 0)
                   or any(isinstance(held.get(r), int | float) and held[r] >= PERSIST_S for r in HELD_REASONS)
                   or 0 < num("pcie_width") < CLASS_WIDTH)
        else:
            full = 200.0 if v.get("link_layer") == "Ethernet" else 400.0
            symbols = num("symbol_error_per_h")
            hit = (symbols > SYMBOL_ERRORS_PER_H or symbols > 3600 * SYMBOL_ERRORS_PER_S
                   or num("link_error_recovery_per_min") > LINK_RECOVERY_PER_MIN
                   or num("port_rcv_errors_per_s") > RCV_ERRORS_PER_S or 0 < num("rate_gbps") < full
                   or v.get("active") is False)
        if hit:
            out.append({"node": dev.node, "entity": dev.entity})
    return out


NAMES = ("fleet", "node-local", "node-local + CRC warn")
Counts = dict[str, dict[str, dict[str, int]]]  # detector -> fault -> tp/fp/fn (and fp_limit for the fleet)


def run(size: int, scenarios: int, seed: int, noise: Noise) -> tuple[Counts, list[float], Counter[str]]:
    """Per detector and fault kind, the counts over ``scenarios`` fleets of ``size`` nodes; the detector's times;
    the fleet's false positives by the signal that named them (its first)."""
    per: Counts = {n: defaultdict(lambda: defaultdict(int)) for n in NAMES}
    times: list[float] = []
    by_signal: Counter[str] = Counter()
    for k in range(scenarios):
        sc = generate(seed + k, nodes=size, noise=noise)
        t0 = time.perf_counter()
        found = detect(sc.messages)
        times.append(time.perf_counter() - t0)
        careful = node_local(sc.messages)
        flagged = {(f["node"], f["entity"]) for f in careful}
        for name, got in (("fleet", found), ("node-local", careful),
                          ("node-local + CRC warn", node_local(sc.messages, crc_warn=True))):
            for key, v in sc.score(got).items():
                per[name][sc.fault][key] += v
                per[name]["total"][key] += v
        limit_fp = len(({(f["node"], f["entity"]) for f in found} - sc.expected) & flagged)
        by_signal.update(f["signals"][0]["signal"] for f in found if (f["node"], f["entity"]) not in sc.expected)
        per["fleet"][sc.fault]["fp_limit"] += limit_fp
        per["fleet"]["total"]["fp_limit"] += limit_fp
    return per, times, by_signal


def pr(t: dict[str, int]) -> tuple[float, float]:
    return t["tp"] / max(1, t["tp"] + t["fp"]), t["tp"] / max(1, t["tp"] + t["fn"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=100, help="fleets per size (default 100)")
    ap.add_argument("--sizes", default="64,128,256", help="fleet sizes in nodes (default 64,128,256)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--sweep-scenarios", type=int, default=30, help="fleets per sweep point (default 30)")
    ap.add_argument("--sweep-size", type=int, default=64, help="fleet size of the sweep (default 64)")
    ap.add_argument("--no-sweep", action="store_true", help="the default noise only")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: list[dict[str, Any]] = []
    raw: dict[str, Any] = {"sizes": {}, "sweep": []}
    for size in sizes:
        per, times, by_signal = run(size, args.scenarios, args.seed, NOISE)
        ms = statistics.median(times) * 1000
        print(f"\n{size} nodes ({size * 8} GPUs, {size * 9} ports), {args.scenarios} fleets, "
              f"detector {ms:.1f} ms per fleet (median)")
        print(f"{'fault':<18}{'fleet tp/fp/fn':>18}{'node-local':>16}{'+ CRC warn':>16}")
        for fault in (*FAULTS, "total"):
            a, b, c = (per[n].get(fault) for n in NAMES)
            if a is None or b is None or c is None:
                continue
            print(f"{fault:<18}{a['tp']:>10}/{a['fp']}/{a['fn']:<6}{b['tp']:>8}/{b['fp']}/{b['fn']:<6}"
                  f"{c['tp']:>8}/{c['fp']}/{c['fn']}")
        for name in NAMES:
            p, r = pr(per[name]["total"])
            print(f"{name:<22} precision {p:.3f} recall {r:.3f}")
        t = per["fleet"]["total"]
        print(f"fleet false positives past a published limit (node-local names them too): {t['fp_limit']} of "
              f"{t['fp']}; precision without them {t['tp'] / max(1, t['tp'] + t['fp'] - t['fp_limit']):.3f}")
        print("fleet false positives by the signal that named them: "
              + (", ".join(f"{k} {n}" for k, n in by_signal.most_common()) or "none"))
        (fp_, fr), (bp, br) = pr(per["fleet"]["total"]), pr(per["node-local"]["total"])
        figures += [
            results.figure(f"precision, {size} nodes", round(fp_, 3), baseline=round(bp, 3),
                           baseline_name="node-local published limits"),
            results.figure(f"recall, {size} nodes", round(fr, 3), baseline=round(br, 3),
                           baseline_name="node-local published limits"),
            results.figure(f"detector time per fleet, {size} nodes", round(ms, 1), "ms", higher_is_better=False),
        ]
        raw["sizes"][str(size)] = {**{n: {f: dict(c) for f, c in per[n].items()} for n in NAMES},
                                   "fleet_fp_by_signal": dict(by_signal)}
    if not args.no_sweep:
        print(f"\nSensitivity: {args.sweep_size} nodes, {args.sweep_scenarios} fleets per point, one noise family "
              f"at a time (its assumed medians x k; thermal: its spread x k)")
        print(f"{'family':<9}{'k':>6}{'fleet P':>9}{'fleet R':>9}{'fp (past limit)':>17}{'node-local P':>14}"
              f"{'node-local R':>14}")
        ks = {"thermal": (0.5, 2.0), "rates": (0.01, 0.1, 10.0)}
        points = [("default", 1.0)] + [(f, k) for f in NOISE_FAMILIES for k in ks.get(f, (0.1, 10.0))]
        for family, k in points:
            noise = NOISE if family == "default" else NOISE.scaled(family, k)
            per, _times, _by = run(args.sweep_size, args.sweep_scenarios, args.seed, noise)
            (fp_, fr), (bp, br) = pr(per["fleet"]["total"]), pr(per["node-local"]["total"])
            t = per["fleet"]["total"]
            print(f"{family:<9}{k:>6g}{fp_:>9.3f}{fr:>9.3f}{t['fp']:>10} ({t['fp_limit']}){bp:>12.3f}{br:>14.3f}")
            raw["sweep"].append({"family": family, "k": k, "fleet": dict(t),
                                 "node-local": dict(per["node-local"]["total"])})
    params = {k: v for k, v in vars(args).items() if k != "no_record"}
    results.record("stragglers", figures, params={**params, "noise": dict(NOISE.__dict__)}, raw=raw,
                   write=not args.no_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
