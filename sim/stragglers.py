"""Randomized fleets of straggler-signal vectors with one degraded GPU or link, for fleet/stragglers.py.

Every node publishes what collectors/nvml.py and collectors/infiniband.py publish: a
``StragglerSignals`` event per collector (docs/straggler-signals.md) with one vector per GPU
(``details.gpus[<pci>]``) and per port (``details.ports[<hca>/<port>]``), and the job's
``NCCLJobMember`` facts (which GPUs and NICs its ranks use). Nothing here knows how the fleet
judges them: the ground truth is what was injected.

Healthy noise, on every node: PCIe replays now and then (a few per minute at most), rare NVLink
CRC errors, the SW power cap on busy GPUs, brief HW slowdowns that do not persist, thermal margins
spread over ~10 degrees, an IB symbol error or two per hour, idle nodes (cool, 0 % SM), a second
hardware class (A100 nodes: other temperatures and link widths), a storage NIC at another rate,
and vectors whose rates are not measured yet (null) or over a partial window (an agent that started
less than a window ago: the rate extrapolated from the seconds there are, as the collectors publish
it, with its count in ``partial_counts``: one symbol error 10 s after a start reads 360/h).

Faults (one device, the culprit an expert names):

* ``pcie_replays``: one GPU's PCIe replays at 8-25/min, under DCGM's 31/min Gen5 x16 limit;
* ``pcie_downtrain``: one GPU's link trained at x8 while its peers run x16;
* ``nvlink_crc``: one GPU's NVLink CRC errors at 3-40/min;
* ``hw_slowdown``: one GPU held in HW slowdown (or power brake) for minutes;
* ``thermal``: one GPU 1-6 degrees from its slowdown temperature while its peers have ~25;
* ``ib_symbol_errors``: one port at 25-110 symbol errors/h, under NVSentinel's 120/h;
* ``ib_rate``: one port at 200 Gb/s while its peers run 400;
* ``ib_link_recovery``: one port retraining 1-4 times a minute;
* ``healthy``: nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("pcie_replays", "pcie_downtrain", "nvlink_crc", "hw_slowdown", "thermal", "ib_symbol_errors", "ib_rate",
          "ib_link_recovery", "healthy")
GPU_FAULTS = FAULTS[:5]
GPUS = 8
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
CLASSES = {"h100": ("NVIDIA H100 80GB HBM3", 5, 16, 18), "a100": ("NVIDIA A100-SXM4-80GB", 4, 16, 12)}


@dataclass
class StragglerScenario:
    seed: int
    fault: str
    messages: list[dict[str, Any]]
    expected: set[tuple[str, str]]  # (node, entity) of the degraded device; empty when healthy
    jobs: dict[str, list[str]] = field(default_factory=dict)  # job -> its nodes

    def score(self, found: list[dict[str, Any]]) -> dict[str, int]:
        named = {(f["node"], f["entity"]) for f in found}
        return {"tp": len(named & self.expected), "fp": len(named - self.expected),
                "fn": len(self.expected - named)}


def _poisson(rng: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, pow(2.718281828459045, -lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def _gpu(rng: random.Random, klass: str, busy: bool) -> dict[str, Any]:
    name, gen, width, links = CLASSES[klass]
    margin_mean = 24.0 if klass == "h100" else 30.0
    v: dict[str, Any] = {
        "index": 0, "name": name, "pcie_gen": gen if busy or rng.random() < 0.5 else 1, "pcie_width": width,
        # healthy hardware: a few replays or CRC errors now and then, never a sustained rate
        "pcie_replay_per_min": float(min(3, _poisson(rng, 0.3))) if rng.random() < 0.3 else 0.0,
        "pcie_replay_limit_per_min": {5: 31, 4: 16}[gen],
        "nvlink_crc_flit_per_min": float(min(2, _poisson(rng, 0.2))) if rng.random() < 0.05 else 0.0,
        "nvlink_crc_data_per_min": 0.0, "nvlink_replay_per_min": 0.0, "nvlink_recovery_per_min": 0.0,
        "nvlinks": links, "nvlinks_down": 0,
        "clock_slowdown_reasons": [], "clock_slowdown_held_s": {},
        "thermal_margin_c": round(min(max(rng.gauss(0, 3.0), -9), 9) + (margin_mean if busy else margin_mean + 25)),
        "thermal_margin_source": "tlimit", "gpu_temp_c": round(rng.gauss(62 if busy else 35, 4)),
        "memory_temp_c": round(rng.gauss(68 if busy else 38, 4)),
        "sm_active": round(rng.uniform(0.82, 0.95), 3) if busy else 0.0,
        "tensor_active": round(rng.uniform(0.35, 0.55), 3) if busy else 0.0, "partial": [],
    }
    if busy and rng.random() < 0.35:
        v["clock_slowdown_reasons"] = ["sw_power_cap"]
        v["clock_slowdown_held_s"] = {"sw_power_cap": float(rng.randint(30, 900))}
    if busy and rng.random() < 0.03:  # a load transient: seen, never held
        v["clock_slowdown_reasons"] = [*v["clock_slowdown_reasons"], "hw_slowdown"]
        v["clock_slowdown_held_s"]["hw_slowdown"] = 0.0
    r = rng.random()
    if r < 0.03:  # not measured yet: the agent just started, or a counter reset
        for k in ("pcie_replay_per_min", "nvlink_crc_flit_per_min"):
            v[k] = None
    elif r < 0.06:  # the agent started (or the counter reset) less than a minute ago: what it publishes then
        span = rng.uniform(10.0, 50.0)
        count = _poisson(rng, 0.3 * span / 60.0)
        v["pcie_replay_per_min"] = round(count * 60.0 / span, 3)  # extrapolated from the seconds there are
        v["partial"] = ["pcie_replay_per_min"]
        v["partial_counts"] = {"pcie_replay_per_min": count}
    return v


def _port(rng: random.Random, storage: bool = False) -> dict[str, Any]:
    p: dict[str, Any] = {
        "active": True, "rate_gbps": 200.0 if storage else 400.0,
        "link_layer": "Ethernet" if storage else "InfiniBand",
        "hca_type": "MT4129", "board_id": "MT_0000000838",
        "symbol_error_per_h": float(_poisson(rng, 1.0)) if rng.random() < 0.15 else 0.0,
        "link_error_recovery_per_min": 0.0,
        "port_rcv_errors_per_s": 0.0 if rng.random() < 0.97 else round(rng.uniform(0.01, 0.2), 3),
        "port_xmit_wait_per_s": round(rng.uniform(0, 2e5), 1), "resets": 0, "partial": []}
    if rng.random() < 0.03:  # the agent started (or the counters reset) less than an hour ago
        span = rng.uniform(10.0, 3600.0)
        count = _poisson(rng, 0.15 * span / 3600.0)  # a healthy port: an error or two an hour at most
        p["symbol_error_per_h"] = round(count * 3600.0 / span, 3)  # one error in 10 s reads 360/h
        p["partial"] = ["symbol_error_per_h"]
        p["partial_counts"] = {"symbol_error_per_h": count}
    return p


def generate(seed: int, *, nodes: int = 64, fault: str | None = None) -> StragglerScenario:
    rng = random.Random(seed)
    fault = fault or rng.choice(FAULTS)
    names = [f"node-{seed % 1000:03d}-{i:03d}" for i in range(nodes)]
    klass = {n: ("a100" if i >= nodes - max(2, nodes // 8) else "h100") for i, n in enumerate(names)}
    h100 = [n for n in names if klass[n] == "h100"]
    idle = set(rng.sample(h100, k=max(1, len(h100) // 10)))
    busy_h100 = [n for n in h100 if n not in idle]
    split = rng.randint(len(busy_h100) // 3, 2 * len(busy_h100) // 3)
    first, second = (f"0x{rng.getrandbits(64):x}" for _ in range(2))
    jobs = {first: busy_h100[:split], second: busy_h100[split:]}
    a100 = [n for n in names if klass[n] == "a100"]
    if a100:
        jobs[f"0x{rng.getrandbits(64):x}"] = a100
    job_of = {n: j for j, ns in jobs.items() for n in ns}
    gpus = {n: {f"0000:{b}:00.0": _gpu(rng, klass[n], n in job_of) for b in BUSES} for n in names}
    for n in names:
        for i, v in enumerate(gpus[n].values()):
            v["index"] = i
    ports = {n: {**{f"mlx5_{i}/1": _port(rng) for i in range(GPUS)}, f"mlx5_{GPUS}/1": _port(rng, storage=True)}
             for n in names}
    expected: set[tuple[str, str]] = set()
    victims = [n for n in busy_h100 if n in job_of]
    node = rng.choice(victims)
    g = rng.randrange(GPUS)
    bus = f"0000:{BUSES[g]}:00.0"
    v = gpus[node][bus]
    p = ports[node][f"mlx5_{g}/1"]
    if fault == "pcie_replays":
        v["pcie_replay_per_min"] = float(rng.randint(8, 25))
    elif fault == "pcie_downtrain":
        v["pcie_width"] = 8
    elif fault == "nvlink_crc":
        v["nvlink_crc_flit_per_min"] = float(rng.randint(3, 40))
    elif fault == "hw_slowdown":
        reason = rng.choice(["hw_slowdown", "hw_power_brake_slowdown", "hw_thermal_slowdown"])
        v["clock_slowdown_reasons"] = [*v["clock_slowdown_reasons"], reason]
        v["clock_slowdown_held_s"][reason] = float(rng.randint(120, 1800))
    elif fault == "thermal":
        v["thermal_margin_c"] = rng.randint(1, 6)
    elif fault == "ib_symbol_errors":
        p["symbol_error_per_h"] = float(rng.randint(25, 110))
    elif fault == "ib_rate":
        p["rate_gbps"] = 200.0
    elif fault == "ib_link_recovery":
        p["link_error_recovery_per_min"] = float(rng.randint(1, 4))
    if fault in GPU_FAULTS:
        v["partial"] = []  # the fault's own rate is measured over its full window
        v.pop("partial_counts", None)
        expected.add((node, f"gpu:{bus}"))
    elif fault != "healthy":
        p["partial"] = []
        p.pop("partial_counts", None)
        expected.add((node, f"ib:mlx5_{g}/1"))
    messages: list[dict[str, Any]] = []
    t = "2026-12-03T08:00:00.000Z"
    for n in names:
        messages.append({"node": n, "collector": "nvml", "kind": "event", "type": "StragglerSignals",
                         "severity": "info", "entity": "signals:gpu", "time": t,
                         "details": {"schema": 1, "gpus": gpus[n]}})
        messages.append({"node": n, "collector": "infiniband", "kind": "event", "type": "StragglerSignals",
                         "severity": "info", "entity": "signals:ib", "time": t,
                         "details": {"schema": 1, "ports": ports[n]}})
        if n in job_of:
            base = names.index(n) * GPUS
            for i, b in enumerate(BUSES):
                messages.append({"node": n, "collector": "nccl_logs", "kind": "event", "type": "NCCLJobMember",
                                 "severity": "info", "entity": f"nccl:{n}:{40000 + i}", "time": t,
                                 "details": {"job": job_of[n], "host": n, "pid": 40000 + i, "world_rank": base + i,
                                             "pci": f"0000:{b}:00.0", "hcas": [f"mlx5_{k}/1" for k in range(GPUS)],
                                             "nics": [f"mlx5_{i}/1"], "transport": "IB"}})
    return StragglerScenario(seed, fault, messages, expected, jobs)
