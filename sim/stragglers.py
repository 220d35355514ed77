"""Randomized fleets of straggler-signal vectors with one degraded GPU or link, for fleet/stragglers.py.

Every node publishes what collectors/nvml.py and collectors/infiniband.py publish: a
``StragglerSignals`` event per collector (docs/straggler-signals.md) with one vector per GPU
(``details.gpus[<pci>]``) and per port (``details.ports[<hca>/<port>]``), and the job's
``NCCLJobMember`` facts (which GPUs and NICs its ranks use). Nothing here knows how the fleet
judges them: the ground truth is what was injected.

Healthy noise (issue 27, "fair baselines"; :class:`Noise`): every healthy device draws its own
expected error rate from a log-normal (a heavy right tail, no cap: a healthy link can read anything,
past the fleet's floors and past the published limits too) and its published rate is that rate
counted over the collector's window (Poisson), as the counters count. Each parameter cites the
public value it comes from, or says that none was found and what is assumed instead; the bench's
sensitivity sweep (bench/stragglers.py) reports the result for a range of every assumed parameter.
None is chosen relative to the fleet detector's floors (docs/straggler-signals.md "Healthy noise").
Besides the counters: the SW power cap on busy GPUs, HW slowdowns seen now and held a heavy-tailed
while, thermal margins with a Student-t spread, idle nodes (cool, 0 % SM, links at Gen1), a second
hardware class (A100 nodes: other temperatures and link widths), a storage NIC at another rate, and
vectors whose rates are not measured yet (null) or over a partial window (an agent that started less
than a window ago: the rate extrapolated from the seconds there are, as the collectors publish it,
with its count in ``partial_counts``: one symbol error 10 s after a start reads 360/h).

Faults (one device, the culprit an expert names; unchanged by issue 27):

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

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from collectors.nvml import PCIE_LANE_GBPS, pcie_replay_limit_per_min

FAULTS = ("pcie_replays", "pcie_downtrain", "nvlink_crc", "hw_slowdown", "thermal", "ib_symbol_errors", "ib_rate",
          "ib_link_recovery", "healthy")
GPU_FAULTS = FAULTS[:5]
GPUS = 8
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
CLASSES = {"h100": ("NVIDIA H100 80GB HBM3", 5, 16, 18), "a100": ("NVIDIA A100-SXM4-80GB", 4, 16, 12)}


@dataclass(frozen=True)
class Noise:
    """What a healthy device publishes: per device, an expected rate ``median * 10**(sigma * N(0, 1))`` (a
    log-normal, ``sigma`` in decades), counted over the collector's window. Sources, and what is assumed
    where none was found (bench/stragglers.py sweeps every assumed median; docs/straggler-signals.md):

    PCIe replays (per GPU): in units of DCGM's budget for the link as it runs now, a 1e-12 bit error rate
    at the lane rate x 60 s x lanes (NVIDIA/DCGM v4.6.0, commit 51b65cce, modules/health/DcgmHealthWatch.cpp
    ``GetExpectedPcieReplayRate`` l. 1519: 30.72/min at Gen5 x16, 2.4/min at Gen1 x16), the line DCGM
    warns past. Two points fix the log-normal: (1) public data: on AWS p5 (H100, Gen5 x16) DCGM's former
    flat limit of 8 replays/min (common/DcgmGPUHardwareLimits.h ``DCGM_LIMIT_MAX_PCIREPLAY_RATE 8``,
    removed in v3.3.8, commit 903d7455) fired "consistently from the time the instance is launched" and
    NVIDIA answered that the limit was not normalized to the generation (github.com/NVIDIA/DCGM/issues/184,
    2024-08): healthy Gen5 x16 links do run past 8/min; read here as 2 % of healthy GPUs above 8/min (so one
    8-GPU node in seven trips it: an assumption, the issue gives no share); (2) assumed: DCGM's own budget
    sits at the healthy population's 99.9th percentile (a published limit that fires on 1 healthy device in
    1,000). Hence sigma 0.56 decades and a median of 0.018 budgets (0.56/min at Gen5 x16).

    NVLink CRC errors (per GPU, all links): no public rate found. DCGM warns at >= 1 in a minute and fails at
    >= 100/s, "CRC errors only matter at rates of 100+ per second" (DCGM v4.6.0 common/DcgmGPUHardwareLimits.h
    l. 28-30, DcgmHealthWatch.cpp ``MonitorNVLink4Fields`` l. 2747-2784), and NVIDIA's own NVSentinel maps the
    >= 1/min warning to IGNORE (NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/gpu-health-monitor/
    dcgmerrorsmapping.csv @b6180c37, ``DCGM_FR_NVLINK_ERROR_THRESHOLD,IGNORE``): healthy GPUs trip it. Assumed:
    median 0.01/min, sigma 1 decade (2.3 % of healthy GPUs at >= 1/min, none near 100/s). CRC data errors:
    assumed a tenth of the flit errors' rate. Replay and recovery errors, "failures, not warnings" in DCGM
    (``MonitorNVLink4Fields`` l. 2766): assumed median 1e-5/min (one in ~70 days), sigma 1 decade.

    IB symbol errors (per port): NVSentinel's design puts a healthy link's BER under 1e-15, "~0 post-FEC",
    and a failed one over 1e-12 (NVSentinel's design "NIC Health Monitor: Link Counter Detection" §2.3 and
    §2.4.2, docs.nvidia.com/nvsentinel components/nic-health-monitor/link-counter-detection, the source of
    its 120/h ``symbol_error_fatal``). Assumed: log-normal BER, median 1e-17,
    sigma 1 decade, so 1e-15 is the 97.7th percentile; errors/h = BER x rate_gbps x 1e9 x 3600 (1.44/h at
    1e-15 on NDR 400 Gb/s). Link error recovery: Azure's node health checks fail a node at 5 link flaps in
    24 h (Azure/azurehpc-health-checks @0e0a1ac2 customTests/azure_ib_link_flapping.nhc
    ``check_ib_link_flapping``, defaults 24 h and 5): a healthy port retrains less than that; assumed median
    0.01/day, sigma 1 decade. Port receive errors: no public rate found (NVSentinel warns past 10/s);
    assumed median 0.001/s, sigma 1 decade.

    Thermal margin: no public distribution found of a fleet's T.Limit margins (Sinha et al., "Not All GPUs
    Are Created Equal", SC'22, arXiv 2208.11035, report same-SKU temperature and performance variation with
    outliers, not a distribution); assumed a Student-t with 3 degrees of freedom (heavy tails, no clip),
    scale 2 degrees, around the class's mean margin.

    HW slowdown transients: no public rate found (Azure's node health checks only log a warning for any
    reason but idle and the SW power cap: customTests/azure_gpu_clock_throttling.nhc @0e0a1ac2). Assumed: 3 %
    of busy GPUs have one set now, held for a log-normal time, median 2 s, sigma 0.5 decades (0.16 % of them
    held a minute or more).
    """

    pcie_replay_median: float = 0.018  # x DCGM's budget at the link's gen and width (fitted: see above)
    pcie_replay_sigma: float = 0.56
    nvlink_crc_median_per_min: float = 0.01  # assumed
    nvlink_crc_sigma: float = 1.0
    nvlink_crc_data_share: float = 0.1  # assumed
    nvlink_replay_median_per_min: float = 1e-5  # assumed (replay and recovery alike)
    nvlink_replay_sigma: float = 1.0
    ib_ber_median: float = 1e-17  # assumed, under NVSentinel's healthy 1e-15
    ib_ber_sigma: float = 1.0
    ib_recovery_median_per_day: float = 0.01  # assumed, under Azure's 5 per 24 h
    ib_recovery_sigma: float = 1.0
    ib_rcv_errors_median_per_s: float = 0.001  # assumed
    ib_rcv_errors_sigma: float = 1.0
    thermal_scale_c: float = 2.0  # assumed (Student-t scale)
    thermal_dof: float = 3.0  # assumed
    hw_slowdown_share: float = 0.03  # assumed
    hw_slowdown_median_s: float = 2.0  # assumed
    hw_slowdown_sigma: float = 0.5  # assumed

    def scaled(self, family: str, k: float) -> Noise:
        """This noise with one family's assumed medians (or the thermal spread) multiplied by ``k``: what the
        bench sweeps. Families: ``pcie``, ``nvlink``, ``ib``, ``thermal``, ``clocks``, and ``rates``: every
        rate and duration median at once (all but the thermal spread)."""
        families = {"pcie": ("pcie_replay_median",),
                    "nvlink": ("nvlink_crc_median_per_min", "nvlink_replay_median_per_min"),
                    "ib": ("ib_ber_median", "ib_recovery_median_per_day", "ib_rcv_errors_median_per_s"),
                    "thermal": ("thermal_scale_c",), "clocks": ("hw_slowdown_median_s",)}
        families["rates"] = tuple(key for f in ("pcie", "nvlink", "ib", "clocks") for key in families[f])
        keys = families[family]
        return replace(self, **{key: getattr(self, key) * k for key in keys})


NOISE = Noise()
NOISE_FAMILIES = ("pcie", "nvlink", "ib", "thermal", "clocks", "rates")
# A background well under every floor of fleet/stragglers.py (every rate median / 1000, near-normal thermal
# margins): for tests of the detector's mechanisms, one signal at a time, and never for a precision figure:
# a background chosen under the detector's floors is what issue 27 found the old default to be.
QUIET = replace(NOISE.scaled("rates", 0.001), thermal_dof=30.0)


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
    """A Poisson count of mean ``lam`` (Knuth's product below 30; a rounded normal above, where the two agree
    to well under one count in the tails that matter here)."""
    if lam <= 0:
        return 0
    if lam >= 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def _lognormal(rng: random.Random, median: float, sigma_decades: float) -> float:
    return median * math.pow(10.0, sigma_decades * rng.gauss(0.0, 1.0))


def _rate(rng: random.Random, per_unit: float, window_units: float) -> float:
    """A rate of mean ``per_unit`` counted over a window of ``window_units`` units, as published."""
    return _poisson(rng, per_unit * window_units) / window_units


def _student_t(rng: random.Random, dof: float) -> float:
    return rng.gauss(0.0, 1.0) / math.sqrt(rng.gammavariate(dof / 2.0, 2.0) / dof)


def _gpu(rng: random.Random, klass: str, busy: bool, noise: Noise) -> dict[str, Any]:
    name, gen, width, links = CLASSES[klass]
    margin_mean = 24.0 if klass == "h100" else 30.0
    gen_now = gen if busy or rng.random() < 0.5 else 1  # an idle link drops to Gen1
    budget = 1e-12 * PCIE_LANE_GBPS[gen_now - 1] * 1e9 * 60 * width  # DCGM's (before its ceil), per minute
    replay_rate = _lognormal(rng, noise.pcie_replay_median * budget, noise.pcie_replay_sigma)
    crc_rate = _lognormal(rng, noise.nvlink_crc_median_per_min, noise.nvlink_crc_sigma)
    v: dict[str, Any] = {
        "index": 0, "name": name, "pcie_gen": gen_now, "pcie_width": width,
        "pcie_replay_per_min": _rate(rng, replay_rate, 1.0),  # the collector's window: 60 s
        "pcie_replay_limit_per_min": None,  # set by generate() from the link as it finally runs
        "nvlink_crc_flit_per_min": _rate(rng, crc_rate, 1.0),
        "nvlink_crc_data_per_min": _rate(rng, crc_rate * noise.nvlink_crc_data_share, 1.0),
        "nvlink_replay_per_min": _rate(rng, _lognormal(rng, noise.nvlink_replay_median_per_min,
                                                       noise.nvlink_replay_sigma), 1.0),
        "nvlink_recovery_per_min": _rate(rng, _lognormal(rng, noise.nvlink_replay_median_per_min,
                                                         noise.nvlink_replay_sigma), 1.0),
        "nvlinks": links, "nvlinks_down": 0,
        "clock_slowdown_reasons": [], "clock_slowdown_held_s": {},
        "thermal_margin_c": round(noise.thermal_scale_c * _student_t(rng, noise.thermal_dof)
                                  + (margin_mean if busy else margin_mean + 25)),
        "thermal_margin_source": "tlimit", "gpu_temp_c": round(rng.gauss(62 if busy else 35, 4)),
        "memory_temp_c": round(rng.gauss(68 if busy else 38, 4)),
        "sm_active": round(rng.uniform(0.82, 0.95), 3) if busy else 0.0,
        "tensor_active": round(rng.uniform(0.35, 0.55), 3) if busy else 0.0, "partial": [],
    }
    if busy and rng.random() < 0.35:
        v["clock_slowdown_reasons"] = ["sw_power_cap"]
        v["clock_slowdown_held_s"] = {"sw_power_cap": float(rng.randint(30, 900))}
    if busy and rng.random() < noise.hw_slowdown_share:  # a load transient, held a heavy-tailed while
        v["clock_slowdown_reasons"] = [*v["clock_slowdown_reasons"], "hw_slowdown"]
        v["clock_slowdown_held_s"]["hw_slowdown"] = float(round(
            _lognormal(rng, noise.hw_slowdown_median_s, noise.hw_slowdown_sigma)))
    r = rng.random()
    if r < 0.03:  # not measured yet: the agent just started, or a counter reset
        for k in ("pcie_replay_per_min", "nvlink_crc_flit_per_min"):
            v[k] = None
    elif r < 0.06:  # the agent started (or the counter reset) less than a minute ago: what it publishes then
        span = rng.uniform(10.0, 50.0)
        count = _poisson(rng, replay_rate * span / 60.0)
        v["pcie_replay_per_min"] = round(count * 60.0 / span, 3)  # extrapolated from the seconds there are
        v["partial"] = ["pcie_replay_per_min"]
        v["partial_counts"] = {"pcie_replay_per_min": count}
    return v


def _port(rng: random.Random, noise: Noise, storage: bool = False) -> dict[str, Any]:
    rate_gbps = 200.0 if storage else 400.0
    symbols_per_h = _lognormal(rng, noise.ib_ber_median, noise.ib_ber_sigma) * rate_gbps * 1e9 * 3600
    p: dict[str, Any] = {
        "active": True, "rate_gbps": rate_gbps,
        "link_layer": "Ethernet" if storage else "InfiniBand",
        "hca_type": "MT4129", "board_id": "MT_0000000838",
        "symbol_error_per_h": _rate(rng, symbols_per_h, 1.0),  # the collector's window: 3600 s
        "link_error_recovery_per_min": _rate(rng, _lognormal(rng, noise.ib_recovery_median_per_day,
                                                             noise.ib_recovery_sigma) / 1440.0, 1.0),
        "port_rcv_errors_per_s": _rate(rng, _lognormal(rng, noise.ib_rcv_errors_median_per_s,
                                                       noise.ib_rcv_errors_sigma), 10.0),  # 10 s
        "port_xmit_wait_per_s": round(rng.uniform(0, 2e5), 1), "resets": 0, "partial": []}
    if rng.random() < 0.03:  # the agent started (or the counters reset) less than an hour ago
        span = rng.uniform(10.0, 3600.0)
        count = _poisson(rng, symbols_per_h * span / 3600.0)
        p["symbol_error_per_h"] = round(count * 3600.0 / span, 3)  # one error in 10 s reads 360/h
        p["partial"] = ["symbol_error_per_h"]
        p["partial_counts"] = {"symbol_error_per_h": count}
    return p


def generate(seed: int, *, nodes: int = 64, fault: str | None = None, noise: Noise = NOISE) -> StragglerScenario:
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
    gpus = {n: {f"0000:{b}:00.0": _gpu(rng, klass[n], n in job_of, noise) for b in BUSES} for n in names}
    for n in names:
        for i, v in enumerate(gpus[n].values()):
            v["index"] = i
    ports = {n: {**{f"mlx5_{i}/1": _port(rng, noise) for i in range(GPUS)},
                 f"mlx5_{GPUS}/1": _port(rng, noise, storage=True)} for n in names}
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
    for n in names:  # DCGM's limit for each link as it runs now, as collectors/nvml.py publishes it
        for gv in gpus[n].values():
            gv["pcie_replay_limit_per_min"] = pcie_replay_limit_per_min(gv["pcie_gen"], gv["pcie_width"])
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
