"""Stragglers across the fleet: the one GPU or link of a job that is worse than its peers, before any timeout.

A synchronous collective runs at the pace of its slowest rank, and a device can slow a ring while
under every absolute threshold (a PCIe link retrying 15 times a minute under DCGM's 31, a port
counting 60 symbol errors an hour under NVSentinel's 120). The nodes publish a straggler vector per
GPU and per port (``StragglerSignals``, docs/straggler-signals.md); here each device is compared
with its *peers*: the devices of the same hardware class that the same job uses (the GPUs its ranks
run on, the NICs their channels use: ``NCCLJobMember``), falling back to the whole class in the
fleet when the job has too few. Only resources a job uses are judged: an idle GPU or a storage NIC
is nobody's straggler.

A device is named when one signal is past its published limit, or stands out from its peers:
past an absolute floor below which the signal is noise in any fleet, and far outside the peers'
spread (median + max(k * 1.4826 * MAD, a minimum gap)). A signal that stands out on devices of
several nodes (more than one node in eight of the group, and at least ``MIN_CONDITION_NODES`` even
with any one node set aside) is a fleet-wide condition (a hot aisle, a noisy fabric), not a
straggler: nobody is named for it. Values not measured yet (null) are skipped.

Rates (docs/stragglers.md "Rates"): a rate the vector marks ``partial`` (measured over less than
its window: the first hour after an agent start or a counter reset) is never compared as it
stands, it is an extrapolation; it counts as its counted increase spread over the whole window
(``partial_counts``: what the rate is if nothing more happens), so one symbol error in the first
10 s is 1/h, not 396/h. A vector that marks a rate partial without its count gives no value for it.

Trust (docs/stragglers.md "Trust"): a vector and a membership message count only for the devices
of the node that published them (the node of the authenticated subject: fleet/wire.py), and one
node's share of any peer statistic is capped at what a typical node of the group contributes
(``_weights``): a node reporting 40 GPUs weighs what a node of 8 does. A node's vector is bounded
(``MAX_GPUS_PER_NODE``, ``MAX_PORTS_PER_NODE``: the rest is rejected and counted), and so are its
processes (``MAX_MEMBERS_PER_NODE``) and the watch as a whole.

Bounded evaluation: :class:`StragglerWatch` re-judges only the jobs and classes whose inputs
changed, and :meth:`StragglerWatch.evaluate_async` hands the event loop back every
``slice_s`` (2 ms) of work.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sys
import time
from collections import OrderedDict, defaultdict
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.heap import TrackedDict
from fleet.typed_details import nccl
from gna_types import entities, subjects

MIN_PEERS = 8  # below this many devices (with any one node set aside) a job's group borrows the class's peers
MAX_SHARE = 1 / 8  # standing out on more nodes than this share of the group is a fleet condition
MIN_CONDITION_NODES = 3  # ... and on at least this many nodes even with any one node set aside
MAX_GPUS_PER_NODE = 16  # an HGX node has 8 GPUs (and 4 NVSwitches): twice that is headroom, not a fleet
MAX_PORTS_PER_NODE = 32  # 8 rails + storage + management on an HGX node: ~10
MAX_MEMBERS_PER_NODE = 256  # processes with membership per node (8 ranks per job on 8 GPUs; many jobs over time)
MAX_JOBS_PER_DEVICE = 16  # jobs one device's record lists
MAX_NODES = 65536  # nodes with vectors; beyond, the node heard from longest ago goes
MAX_MEMBERS = 200_000  # processes with membership in all
MAX_INSPECTOR = 200_000  # NCCLInspectorSummary processes in all
MAX_INSPECTOR_PER_NODE = 256
MAX_RANKS_PER_NODE_COMM = 16  # ranks one node may report for one communicator (one per GPU, with headroom)
MAX_BASELINE_DEVICES = 4096  # a group's median and MAD come from at most this many devices (sampled by node)
SLICE_S = 0.002  # evaluate_async yields to the loop after this much work
_CHECK_EVERY = 128  # devices between two checkpoints of the evaluation
MAX_TEXT = 128  # node names, job ids, class names, entity keys
_PCI = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_PORT = re.compile(r"[A-Za-z0-9_.-]{1,64}/[0-9]{1,3}")
_PRINTABLE = re.compile(r"[\x21-\x7e]{1,128}")
_SALT = os.urandom(16)  # which nodes a sampled baseline uses: not predictable from a node's name


@dataclass(frozen=True)
class Signal:
    key: str
    worse: str  # "higher" or "lower"
    floor: float  # an absolute value a straggler must pass (noise in any healthy fleet stays on the other side)
    gap: float  # the minimum distance from the peers' median
    limit_key: str | None = None  # the vector's own published limit (DCGM's PCIe replay limit of this link)
    limit: float | None = None  # a published limit (value) past which the device is named whatever its peers
    source: str = ""
    window: float = 0.0  # the window (s) the node measures this rate over (0: not a windowed counter rate)
    unit: float = 1.0  # the rate's unit in seconds (60: per minute)


GPU_SIGNALS = (
    Signal("pcie_replay_per_min", "higher", 5.0, 4.0, limit_key="pcie_replay_limit_per_min",
           source="DCGM DcgmHealthWatch GetExpectedPcieReplayRate (docs/straggler-signals.md)", window=60.0, unit=60.0),
    Signal("nvlink_crc_flit_per_min", "higher", 3.0, 2.0, source="DCGM MonitorNVLink4Fields: any CRC error is WARN",
           window=60.0, unit=60.0),
    Signal("nvlink_crc_data_per_min", "higher", 3.0, 2.0, source="DCGM MonitorNVLink4Fields", window=60.0, unit=60.0),
    Signal("nvlink_replay_per_min", "higher", 1.0, 1.0, limit=1.0, source="DCGM: replay errors are failures",
           window=60.0, unit=60.0),
    Signal("nvlink_recovery_per_min", "higher", 1.0, 1.0, limit=1.0, source="DCGM: recovery errors are failures",
           window=60.0, unit=60.0),
    Signal("thermal_margin_c", "lower", 6.0, 10.0, limit=0.0,
           source="NVSentinel ADR-042 T.Limit margin; 0: at max operating temperature"),
    Signal("pcie_width", "lower", 16.0, 1.0, source="a link trained below its peers' width"),
    Signal("nvlinks_down", "higher", 1.0, 1.0, source="NVLinks inactive where peers have none"),
)
PORT_SIGNALS = (
    Signal("symbol_error_per_h", "higher", 20.0, 15.0, limit=120.0,
           source="NVSentinel nic-health-monitor: symbol_error > 120/h (IBTA BER 1e-12)", window=3600.0, unit=3600.0),
    Signal("link_error_recovery_per_min", "higher", 1.0, 1.0, limit=5.0,
           source="NVSentinel nic-health-monitor: link_error_recovery > 5/min", window=60.0, unit=60.0),
    Signal("port_rcv_errors_per_s", "higher", 1.0, 0.5, limit=10.0,
           source="NVSentinel nic-health-monitor: port_rcv_errors > 10/s", window=10.0, unit=1.0),
    Signal("rate_gbps", "lower", 1e9, 1.0, source="a port negotiated below its peers' rate"),
)
SIGNALS = {"gpu": GPU_SIGNALS, "hca_port": PORT_SIGNALS}
HW_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
PERSIST_S = 60.0  # DCGM's one-minute health window: a slowdown held this long slows every step


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if f == f and abs(f) < 1e18 else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and _PRINTABLE.fullmatch(v) else None


def signal_value(vec: dict[str, Any], sig: Signal, partial: frozenset[str] | None = None) -> float | None:
    """The value of ``sig`` the fleet may compare: a full-window rate as measured; a rate the vector marks
    ``partial`` only as its counted increase spread over the whole window (never the extrapolated rate the
    vector shows); None when it is not measured, or partial without its count. The one place this rule
    lives on the fleet side (the node side's is collectors/shared/counter_window.py WindowStats.sure_per).
    ``partial``: the vector's partial list, when the caller has it already."""
    v = _num(vec.get(sig.key))
    if v is None or sig.window <= 0:
        return v
    if partial is None:
        partial = _partial(vec)
    if sig.key not in partial:
        return v
    counts = vec.get("partial_counts")
    c = _num(counts.get(sig.key)) if isinstance(counts, dict) else None
    if c is None or c < 0:
        return None  # an extrapolation with nothing to check it by: not compared
    return c * sig.unit / sig.window


def _partial(vec: dict[str, Any]) -> frozenset[str]:
    p = vec.get("partial")
    return frozenset(k for k in p[:64] if isinstance(k, str)) if isinstance(p, list) and p else frozenset()


@dataclass
class Device:
    node: str
    entity: str  # gpu:<pci> or ib:<hca>/<port>
    kind: str  # "gpu" or "hca_port"
    klass: str
    vector: dict[str, Any]
    jobs: set[str]
    values: dict[str, float] = field(default_factory=dict)  # signal -> the value the fleet compares
    limits: dict[str, float] = field(default_factory=dict)  # signal -> its published limit for this device
    held: tuple[float, str] | None = None  # the longest HW slowdown held, and its reason
    key: tuple[str, str] = ("", "")  # (node, entity), made once: an evaluation creates no tuples per device

    def __post_init__(self) -> None:
        self.key = (self.node, self.entity)


def _device(node: str, collector: str, key: str, vec: dict[str, Any]) -> Device:
    if collector == "nvml":
        dev = Device(node, entities.gpu(key), "gpu", str(vec.get("name") or "?")[:MAX_TEXT], vec, set())
    else:
        klass = f"{str(vec.get('hca_type') or '?')[:48]}/{str(vec.get('link_layer') or '?')[:48]}"
        dev = Device(node, f"ib:{key}", "hca_port", klass, vec, set())
    partial = _partial(vec)
    for sig in SIGNALS[dev.kind]:
        v = signal_value(vec, sig, partial)
        if v is not None:
            dev.values[sig.key] = v
        limit = _num(vec.get(sig.limit_key)) if sig.limit_key else sig.limit
        if limit is not None:
            dev.limits[sig.key] = limit
    h = vec.get("clock_slowdown_held_s")
    if dev.kind == "gpu" and isinstance(h, dict):
        for reason in HW_SLOWDOWNS:
            s = _num(h.get(reason))
            if s is not None and s >= PERSIST_S:
                dev.held = (s, reason)
                break
    return dev


def parse_vector(msg: dict[str, Any]) -> tuple[str, str, dict[str, Device], int] | None:
    """(node, collector, entity -> Device, devices rejected) of a StragglerSignals message, None when it
    is not one. At most MAX_GPUS_PER_NODE GPUs / MAX_PORTS_PER_NODE ports count; malformed keys and the
    excess are rejected (counted by the caller)."""
    node, d, collector = _text(msg.get("node")), msg.get("details"), msg.get("collector")
    if node is None or not isinstance(d, dict) or msg.get("type") != "StragglerSignals" \
            or collector not in ("nvml", "infiniband"):
        return None
    table = d.get("gpus") if collector == "nvml" else d.get("ports")
    if not isinstance(table, dict):
        return node, str(collector), {}, 0
    cap, pattern = (MAX_GPUS_PER_NODE, _PCI) if collector == "nvml" else (MAX_PORTS_PER_NODE, _PORT)
    out: dict[str, Device] = {}
    rejected = 0
    for i, (key, vec) in enumerate(table.items()):
        if i >= 4 * cap:
            rejected += len(table) - i
            break
        if len(out) >= cap or not isinstance(key, str) or not pattern.fullmatch(key) or not isinstance(vec, dict):
            rejected += 1
            continue
        dev = _device(node, str(collector), key, vec)
        out[dev.entity] = dev
    return node, str(collector), out, rejected


def parse_member(msg: dict[str, Any]) -> tuple[str, str, str, tuple[str, ...]] | None:
    """(node, process entity, job, device entities its rank uses) of an NCCLJobMember, None when it is not
    one or is malformed. The devices are the publishing node's own (``gpu:<pci>``, ``ib:<hca>/<port>``)."""
    node = _text(msg.get("node"))
    if node is None or msg.get("type") != "NCCLJobMember" or not isinstance(msg.get("details"), dict):
        return None
    d = nccl(msg)  # typed at the fleet's boundary (fleet/typed_details.py)
    job, entity = _text(d.job), msg.get("entity")
    if job is None or not isinstance(entity, str) or not 0 < len(entity) <= 2 * MAX_TEXT:
        return None
    devs: list[str] = []
    if d.pci is not None and _PCI.fullmatch(d.pci):
        devs.append(entities.gpu(d.pci))
    for nic in (d.nics if d.nics is not None else d.hcas or [])[:MAX_PORTS_PER_NODE]:
        if _PORT.fullmatch(nic):
            devs.append(f"ib:{nic}")
    # held per member for as long as the job runs: one copy of each job id, node and device name (every
    # rank of a job names the job, a node's ranks the node and its NICs), not one per message (issue 21)
    return (sys.intern(node), entity, sys.intern(job),
            tuple(sys.intern(dev) for dev in dict.fromkeys(devs)))


def devices_of(messages: list[dict[str, Any]]) -> list[Device]:
    """The latest vector of every GPU and port, with the jobs that use it (from membership)."""
    watch = StragglerWatch()
    for m in sorted(messages, key=lambda m: str(m.get("time") or "") if isinstance(m, dict) else ""):
        if isinstance(m, dict):
            watch.add(m)
    return [dev for _k, dev in sorted(watch.devices().items())]


# -- robust peer statistics ------------------------------------------------------------

def _weights(devs: list[Device]) -> dict[str, float]:
    """Per node, the weight of each of its devices: a node's devices together weigh at most what the
    median node of the group contributes (an HGX node's 8 GPUs weigh 8; a node reporting 16 weighs 8 too)."""
    return _run(_weights_work(devs))  # type: ignore[no-any-return]


def _per_node_work(devs: list[Device]) -> _Work:
    """(devices per node, the lower median of those counts): what one node may weigh in the group."""
    per: dict[str, int] = defaultdict(int)
    for i, d in enumerate(devs):
        per[d.node] += 1
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
    counts = sorted(per.values())
    return per, (counts[(len(counts) - 1) // 2] if counts else 1)


def _weights_work(devs: list[Device]) -> _Work:
    per, cap = yield from _per_node_work(devs)
    return {n: min(1.0, cap / c) for n, c in per.items()}


def peer_size(devs: list[Device]) -> float:
    """The group's weighted size with its heaviest node set aside: how many peers it has that no single
    node controls (a job on one node has none: it borrows the class)."""
    return float(_run(_peer_size_work(devs)))


def _peer_size_work(devs: list[Device]) -> _Work:
    per, cap = yield from _per_node_work(devs)  # each node weighs at most the lower median, as _weights
    capped = [min(c, cap) for c in per.values()]
    return float(sum(capped) - max(capped, default=0))


def _sample_nodes(devs: list[Device]) -> set[str] | None:
    """The nodes whose devices make a group's baseline when it has more than MAX_BASELINE_DEVICES (None: all),
    whole nodes at a time, chosen by a keyed hash (no node can make itself part of every baseline)."""
    return _run(_sample_nodes_work(devs))  # type: ignore[no-any-return]


def _sample_nodes_work(devs: list[Device]) -> _Work:
    if len(devs) <= MAX_BASELINE_DEVICES:
        return None
    per: dict[str, int] = defaultdict(int)
    for i, d in enumerate(devs):
        per[d.node] += 1
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
    keyed = []
    for i, n in enumerate(per):
        keyed.append((hashlib.blake2b(n.encode(), key=_SALT, digest_size=8).digest(), n))
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
    keyed.sort()
    yield None
    order = [n for _k, n in keyed]
    out: set[str] = set()
    total = 0
    for n in order:
        if total + per[n] > MAX_BASELINE_DEVICES:
            break
        out.add(n)
        total += per[n]
    return out


def _condition(nodes_out: set[str], nodes_in_group: int) -> bool:
    """Standing out on this many nodes is a fleet condition, not a straggler; it holds with any one node
    set aside (one reporter cannot turn a straggler into a "condition")."""
    k = len(nodes_out) - 1
    return k >= MIN_CONDITION_NODES and k > max(1, int((nodes_in_group - 1) * MAX_SHARE))


Hit = tuple[Device, str, float, float, str, bool]  # device, signal, value, peer median, reason, past a limit
_Work = Generator[None, None, Any]


def _limit_hits(dev: Device) -> list[Hit]:
    """Past a published limit: the device's own node's evidence about its own device, whatever its peers."""
    out: list[Hit] = []
    for sig in SIGNALS[dev.kind]:
        v, limit = dev.values.get(sig.key), dev.limits.get(sig.key)
        if v is not None and limit is not None and (v > limit if sig.worse == "higher" else v <= limit):
            out.append((dev, sig.key, v, 0.0,
                        f"{sig.key} {v:g} is past its published limit {limit:g} ({sig.source})", True))
    return out


def _wmedian_of(order: list[int], values: list[float], weights: list[float]) -> float:
    """Weighted median of ``values[i]`` (weights ``weights[i]``) for the indices ``order``, sorted by value:
    equal to statistics.median for unit weights. Indices and floats, no tuples: nothing for the cyclic
    garbage collector to trace, however large the group."""
    total = sum(weights[i] for i in order)
    half, cum = total / 2, 0.0
    for k, i in enumerate(order):
        cum += weights[i]
        if cum > half + 1e-9:
            return values[i]
        if abs(cum - half) <= 1e-9:
            return (values[i] + values[order[k + 1]]) / 2 if k + 1 < len(order) else values[i]
    return values[order[-1]] if order else 0.0


def _judge(group: list[Device], sig: Signal, weights: dict[str, float], sample: set[str] | None) -> _Work:
    """Devices of ``group`` standing out for ``sig`` (a generator: yields at checkpoints, returns the hits).
    ``weights``: per node (``_weights``); ``sample``: the nodes whose devices make the baseline (None: all)."""
    vdev: list[Device] = []
    vval: list[float] = []
    vw: list[float] = []
    base: list[int] = []  # the indices of the devices that make the baseline (of the sampled nodes)
    per: dict[str, float] = defaultdict(float)
    for i, d in enumerate(group):
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
        v = d.values.get(sig.key)
        if v is not None:
            w = weights[d.node]
            if sample is None or d.node in sample:
                base.append(len(vdev))
            vdev.append(d)
            vval.append(v)
            vw.append(w)
            per[d.node] += w
    if sum(per.values()) - max(per.values(), default=0.0) < MIN_PEERS:
        return []
    yield None
    order = sorted(base, key=vval.__getitem__)
    yield None
    med = _wmedian_of(order, vval, vw)
    yield None
    dist = [0.0] * len(vval)  # the deviations the MAD reads: the baseline's only (a group of GPUs is 100k)
    for i in base:
        dist[i] = abs(vval[i] - med)
    yield None
    order = sorted(base, key=dist.__getitem__)
    yield None
    mad = _wmedian_of(order, dist, vw)
    spread = max(4.0 * 1.4826 * mad, sig.gap)
    yield None
    relative: list[Hit] = []
    n = len(vdev)
    for i in range(n):
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
        dev, v = vdev[i], vval[i]
        if sig.key in dev.limits and (v > dev.limits[sig.key] if sig.worse == "higher" else v <= dev.limits[sig.key]):
            continue  # named past its limit already
        if sig.worse == "higher" and v >= sig.floor and v >= med + spread:
            relative.append((dev, sig.key, v, med, f"{sig.key} {v:g} stands out from {n} peers (median {med:g})",
                             False))
        elif sig.worse == "lower" and v <= sig.floor and v <= med - spread:
            relative.append((dev, sig.key, v, med, f"{sig.key} {v:g} is below {n} peers (median {med:g})", False))
    if _condition({h[0].node for h in relative}, len(per)):
        return []  # the group is like this on many nodes: a fleet condition, not one straggler
    return relative


def _slowdowns(group: list[Device]) -> _Work:
    """The GPUs of ``group`` whose clocks are held down while most of their peers' run free (a generator:
    yields at checkpoints, returns the hits; a class of GPUs is 100k devices)."""
    held: list[Device] = []
    nodes: set[str] = set()
    for i, d in enumerate(group):
        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
            yield None
        nodes.add(d.node)
        if d.held is not None:
            held.append(d)
    if not held or _condition({d.node for d in held}, len(nodes)):
        return []
    return [(d, "clock_slowdown_held_s", d.held[0], 0.0,
             f"clocks held down by {d.held[1]} for {d.held[0]:.0f} s (its peers run free)", False)
            for d in held if d.held is not None]


def _judge_group(group: list[Device]) -> _Work:
    """Every signal of a group: {(node, entity): [hit, ...]}."""
    out: dict[tuple[str, str], list[Hit]] = defaultdict(list)
    if not group:
        return out
    weights = yield from _weights_work(group)
    sample = yield from _sample_nodes_work(group)
    for sig in SIGNALS[group[0].kind]:
        for h in (yield from _judge(group, sig, weights, sample)):
            out[(h[0].node, h[0].entity)].append(h)
    if group[0].kind == "gpu":
        for h in (yield from _slowdowns(group)):
            out[(h[0].node, h[0].entity)].append(h)
    yield None
    return dict(out)


def _run(work: _Work) -> Any:
    try:
        while True:
            next(work)
    except StopIteration as stop:
        return stop.value


def detect(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stragglers: one record per (node, device), the strongest signal first in ``signals``."""
    watch = StragglerWatch()
    for m in sorted(messages, key=lambda m: str(m.get("time") or "") if isinstance(m, dict) else ""):
        if isinstance(m, dict) and m.get("type") in ("StragglerSignals", "NCCLJobMember"):
            watch.add(m)
    recs = [{k: v for k, v in r.items() if k not in ("status", "since", "updated")}
            for r in watch.evaluate(0.0) if r.get("kind") != "rank"]
    return sorted(recs, key=lambda r: (-r["confidence"], r["node"], r["entity"]))


def late_ranks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks NCCL Inspector's per-rank numbers single out (fleet/inspector_compare.py): one that arrives
    last at its communicator's collectives (the others wait for it), or both ends of a slow point-to-point
    path. Named as the rank's process on its node, in the straggler records' shape."""
    from fleet.inspector_compare import comm_summaries

    out = []
    for summaries in comm_summaries(messages).values():
        out += _rank_records(summaries)
    return out


def _rank_records(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from fleet.inspector_compare import slow_ranks

    out = []
    for f in slow_ranks(summaries):
        node, pid = f.get("node"), f.get("pid")
        if not isinstance(node, str) or f.get("rank") is None:
            continue
        host = f.get("hostname") or node
        out.append({"node": node, "entity": f"nccl:{str(host).split('.')[0]}:{pid}", "kind": "rank",
                    "class": "nccl_inspector", "jobs": [str(f.get("comm_id"))], "confidence": 0.8,
                    "signals": [{"signal": str(f.get("kind")), "value": None, "peer_median": None,
                                 "scope": f"communicator {f.get('comm_id')}",
                                 "reason": str(f.get("message") or "")[:300]}]})
    return out


STRAGGLERS_BUCKET = subjects.STRAGGLERS_BUCKET  # key: <node token>.<entity token>; value: the current record

GroupKey = tuple[str, str, str]  # (job, kind, class)
DevId = tuple[str, str]  # (node, entity)


@dataclass
class _Vector:
    time: str
    devices: dict[str, Device]


class StragglerWatch:
    """Live: the latest vector per node and collector and the membership per process; each evaluation
    re-judges only the jobs and classes whose inputs changed; records change state (open, updated,
    resolved) only when the verdict does.

    The correlator (fleet/incidents.py) calls :meth:`add` for every message and, every 10 s while
    :attr:`changed`, ``await`` :meth:`evaluate_async` (never blocks its loop more than ``slice_s`` at a
    time); :meth:`evaluate` does the same synchronously (tests, benches)."""

    def __init__(self, *, max_nodes: int = MAX_NODES, max_members: int = MAX_MEMBERS,
                 max_inspector: int = MAX_INSPECTOR) -> None:
        self.max_nodes, self.max_members, self.max_inspector = max_nodes, max_members, max_inspector
        self.vectors: OrderedDict[tuple[str, str], _Vector] = OrderedDict()  # (node, collector), LRU
        self.members: dict[str, OrderedDict[str, tuple[str, tuple[str, ...]]]] = {}  # node -> entity -> (job, devs)
        self.member_count = 0
        self.uses: dict[DevId, dict[str, int]] = {}  # device -> job -> ranks of the job on it
        self.job_devs: dict[str, dict[DevId, int]] = {}  # job -> device -> ranks
        self.class_devs: dict[tuple[str, str], set[DevId]] = defaultdict(set)  # used devices with a vector
        self._class_of: dict[DevId, tuple[str, str]] = {}
        self.inspector: dict[str, OrderedDict[str, dict[str, Any]]] = {}  # node -> process -> latest summary
        self.inspector_count = 0
        self.comm_procs: dict[str, set[tuple[str, str]]] = defaultdict(set)  # comm id -> (node, process)
        self._proc_comms: dict[tuple[str, str], tuple[str, ...]] = {}
        self.open: dict[DevId, dict[str, Any]] = {}
        self.job_hits: dict[GroupKey, dict[DevId, list[Hit]] | None] = {}  # None: the group borrows its class
        self.class_hits: dict[tuple[str, str], dict[DevId, list[Hit]]] = {}
        self._job_classes: dict[str, set[tuple[str, str]]] = {}  # job -> the classes of its groups
        self.borrowers: dict[tuple[str, str], set[str]] = {}  # class -> jobs too small to judge on their own
        self.comm_recs: dict[str, list[dict[str, Any]]] = {}
        self._rank_comms: dict[DevId, set[str]] = defaultdict(set)
        self.dirty_jobs: set[str] = set()
        self.dirty_classes: set[tuple[str, str]] = set()
        self.dirty_devices: set[DevId] = set()
        self.dirty_comms: set[str] = set()
        self.rejected: dict[str, int] = defaultdict(int)  # reason -> count
        self.rejected_sample: dict[str, str] = {}
        self.max_slice_s = 0.0  # the longest synchronous slice of evaluate_async so far
        self._evaluating = False

    @property
    def changed(self) -> bool:
        """Something arrived since the last evaluation that may change a verdict."""
        return bool(self.dirty_jobs or self.dirty_classes or self.dirty_devices or self.dirty_comms)

    def _reject(self, reason: str, sample: Any, n: int = 1) -> None:
        self.rejected[reason] += n
        self.rejected_sample.setdefault(reason, str(sample)[:200])

    # -- input ----------------------------------------------------------------------------
    def add(self, msg: dict[str, Any]) -> bool:
        """Take one message (a StragglerSignals vector, an NCCLJobMember, an NCCLInspectorSummary); True
        when it was one of these and was kept. O(size of the message)."""
        if not isinstance(msg, dict):
            return False
        kind = msg.get("type")
        if kind == "StragglerSignals":
            return self._add_vector(msg)
        if kind == "NCCLJobMember":
            return self._add_member(msg)
        if kind == "NCCLInspectorSummary":
            return self._add_inspector(msg)
        return False

    def _add_vector(self, msg: dict[str, Any]) -> bool:
        parsed = parse_vector(msg)
        if parsed is None:
            return False
        node, collector, devices, rejected = parsed
        if rejected:
            self._reject("vector_devices", f"{node}: {rejected} devices over the bound or malformed", rejected)
        t = str(msg.get("time") or "")[:40]
        key = (node, collector)
        old = self.vectors.get(key)
        if old is not None and t < old.time:
            return False  # an older vector (history replayed out of order) never replaces a newer one
        if old is None and len(self.vectors) >= self.max_nodes * 2:
            (gone_node, gone_col), gone = self.vectors.popitem(last=False)
            self._replace_vector((gone_node, gone_col), gone, None)
        self._replace_vector(key, old, _Vector(t, devices))
        return True

    def _replace_vector(self, key: tuple[str, str], old: _Vector | None, new: _Vector | None) -> None:
        node = key[0]
        if new is None:
            self.vectors.pop(key, None)
        else:
            self.vectors[key] = new
            self.vectors.move_to_end(key)
        for entity in {*(old.devices if old else ()), *(new.devices if new else ())}:
            dev_id = (node, entity)
            self._reindex(dev_id)
            self.dirty_devices.add(dev_id)
            self.dirty_jobs.update(self.uses.get(dev_id, ()))

    def _device(self, dev_id: DevId) -> Device | None:
        node, entity = dev_id
        v = self.vectors.get((node, "nvml" if entity.startswith("gpu:") else "infiniband"))
        return v.devices.get(entity) if v is not None else None

    def _reindex(self, dev_id: DevId) -> None:
        """Keep ``class_devs`` (the used devices of each class) right for one device; dirty its classes."""
        dev = self._device(dev_id)
        was = self._class_of.pop(dev_id, None)
        if was is not None:
            self.class_devs[was].discard(dev_id)
            if not self.class_devs[was]:
                del self.class_devs[was]
            self.dirty_classes.add(was)
        if dev is not None and self.uses.get(dev_id):
            now = (dev.kind, dev.klass)
            self._class_of[dev_id] = now
            self.class_devs[now].add(dev_id)
            self.dirty_classes.add(now)

    def _add_member(self, msg: dict[str, Any]) -> bool:
        parsed = parse_member(msg)
        if parsed is None:
            self._reject("member_malformed", {k: msg.get(k) for k in ("node", "entity")})
            return False
        node, entity, job, devs = parsed
        procs = self.members.setdefault(node, OrderedDict())
        old = procs.pop(entity, None)
        if old is not None:
            self._unuse(node, *old)
            self.member_count -= 1
        elif len(procs) >= MAX_MEMBERS_PER_NODE:  # the node's own oldest process goes, nobody else's
            gone_entity, gone = procs.popitem(last=False)
            self._unuse(node, *gone)
            self.member_count -= 1
            self._reject("members_per_node", f"{node}: {gone_entity}")
        elif self.member_count >= self.max_members:  # the node with the most processes gives one up
            big = max(self.members, key=lambda n: (len(self.members[n]), n == node))  # ties: the adding node
            if not self.members[big]:
                return False
            _e, gone = self.members[big].popitem(last=False)
            self._unuse(big, *gone)
            self.member_count -= 1
            self._reject("members_total", big)
        procs[entity] = (job, devs)
        self.member_count += 1
        self._use(node, job, devs)
        return True

    def _use(self, node: str, job: str, devs: tuple[str, ...]) -> None:
        self.dirty_jobs.add(job)
        jd = self.job_devs.get(job)
        if jd is None:  # device-tuple keys, int values: an exact dict would bounce out of the freezes (fleet/heap.py)
            jd = self.job_devs[job] = TrackedDict()
        for entity in devs:
            dev_id = (node, entity)
            u = self.uses.setdefault(dev_id, {})
            first = not u
            u[job] = u.get(job, 0) + 1
            jd[dev_id] = jd.get(dev_id, 0) + 1
            self.dirty_devices.add(dev_id)
            if first:
                self._reindex(dev_id)

    def _unuse(self, node: str, job: str, devs: tuple[str, ...]) -> None:
        self.dirty_jobs.add(job)
        jd = self.job_devs.get(job, {})
        for entity in devs:
            dev_id = (node, entity)
            u = self.uses.get(dev_id, {})
            if job in u:
                u[job] -= 1
                if u[job] <= 0:
                    del u[job]
            if dev_id in jd:
                jd[dev_id] -= 1
                if jd[dev_id] <= 0:
                    del jd[dev_id]
            self.dirty_devices.add(dev_id)
            if not u:
                self.uses.pop(dev_id, None)
                self._reindex(dev_id)
        if not jd:
            self.job_devs.pop(job, None)

    def _add_inspector(self, msg: dict[str, Any]) -> bool:
        node, entity, d = _text(msg.get("node")), msg.get("entity"), msg.get("details")
        if node is None or not isinstance(entity, str) or not 0 < len(entity) <= 2 * MAX_TEXT \
                or not isinstance(d, dict):
            return False
        comms = d.get("comms")
        ids = tuple(dict.fromkeys(c["comm_id"] for c in (comms[:256] if isinstance(comms, list) else [])
                                  if isinstance(c, dict) and isinstance(c.get("comm_id"), str)
                                  and len(c["comm_id"]) <= 40))
        procs = self.inspector.setdefault(node, OrderedDict())
        old = procs.pop(entity, None)
        if old is not None:
            if str(msg.get("time") or "") < str(old.get("time") or ""):
                procs[entity] = old
                return False
            self.inspector_count -= 1
        elif len(procs) >= MAX_INSPECTOR_PER_NODE:
            gone, _m = procs.popitem(last=False)
            self._drop_proc((node, gone))
            self.inspector_count -= 1
            self._reject("inspector_per_node", f"{node}: {gone}")
        elif self.inspector_count >= self.max_inspector:
            big = max(self.inspector, key=lambda n: (len(self.inspector[n]), n == node))
            if not self.inspector[big]:
                return False
            gone, _m = self.inspector[big].popitem(last=False)
            self._drop_proc((big, gone))
            self.inspector_count -= 1
        self._drop_proc((node, entity))
        procs[entity] = msg
        self.inspector_count += 1
        self._proc_comms[(node, entity)] = ids
        for c in ids:
            self.comm_procs[c].add((node, entity))
            self.dirty_comms.add(c)
        return True

    def _drop_proc(self, key: tuple[str, str]) -> None:
        for c in self._proc_comms.pop(key, ()):
            procs = self.comm_procs.get(c)
            if procs is not None:
                procs.discard(key)
                if not procs:
                    del self.comm_procs[c]
            self.dirty_comms.add(c)

    def devices(self) -> dict[DevId, Device]:
        """Every device with a vector, its ``jobs`` filled from membership."""
        out: dict[DevId, Device] = {}
        for (node, _c), vec in self.vectors.items():
            for entity, dev in vec.devices.items():
                dev.jobs = set(self.uses.get((node, entity), {}))
                out[(node, entity)] = dev
        return out

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, now: float) -> list[dict[str, Any]]:
        """Records whose state changed since the last evaluation (synchronously: tests and benches)."""
        if self._evaluating:
            return []
        self._evaluating = True
        try:
            out: list[dict[str, Any]] = _run(self._evaluate(now))
        finally:
            self._evaluating = False
        return out

    async def evaluate_async(self, now: float, *, slice_s: float = SLICE_S) -> list[dict[str, Any]]:
        """As :meth:`evaluate`, handing the event loop back (``await asyncio.sleep(0)``) after every
        ``slice_s`` of work; the longest slice is kept in :attr:`max_slice_s`. Messages added meanwhile are
        judged at the next evaluation. A second call while one runs returns nothing."""
        if self._evaluating:
            return []
        self._evaluating = True
        work = self._evaluate(now)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    while time.perf_counter() - t0 < slice_s:
                        next(work)
                except StopIteration as stop:
                    self.max_slice_s = max(self.max_slice_s, time.perf_counter() - t0)
                    result: list[dict[str, Any]] = stop.value
                    return result
                self.max_slice_s = max(self.max_slice_s, time.perf_counter() - t0)
                await asyncio.sleep(0)
        finally:
            self._evaluating = False

    def _group_devices(self, ids: Iterable[DevId]) -> list[Device]:
        out = []
        for dev_id in ids:
            dev = self._device(dev_id)
            if dev is not None:
                out.append(dev)
        return out

    def _evaluate(self, now: float) -> _Work:
        classes, self.dirty_classes = self.dirty_classes, set()
        jobs, self.dirty_jobs = self.dirty_jobs, set()
        touched, self.dirty_devices = self.dirty_devices, set()
        comms, self.dirty_comms = self.dirty_comms, set()
        for job in sorted(jobs):  # 1. the jobs whose devices, vectors or membership changed
            members = list(self.job_devs.get(job, {}))
            by_class: dict[tuple[str, str], list[Device]] = defaultdict(list)
            for i, dev_id in enumerate(members):
                if (dev := self._device(dev_id)) is not None:
                    by_class[(dev.kind, dev.klass)].append(dev)
                if i % _CHECK_EVERY == _CHECK_EVERY - 1:
                    yield None
            for key in [(job, *c) for c in self._job_classes.pop(job, set()) if c not in by_class]:
                touched.update(self.job_hits.pop(key, None) or ())
                self._borrow(key, False, classes)
            if by_class:
                self._job_classes[job] = set(by_class)
            for (kind, klass), group in sorted(by_class.items()):
                gk = (job, kind, klass)
                hits: dict[DevId, list[Hit]] | None = None
                size = yield from _peer_size_work(group)
                if size >= MIN_PEERS:
                    hits = yield from _judge_group(group)
                had = gk in self.job_hits
                old_hits = self.job_hits.get(gk)
                self.job_hits[gk] = hits
                self._borrow(gk, hits is None, classes)
                if not had or (old_hits is None) != (hits is None):  # the group's scope changed
                    for i, d in enumerate(group):
                        touched.add(d.key)
                        if i % _CHECK_EVERY == _CHECK_EVERY - 1:
                            yield None
                else:
                    a, b = old_hits or {}, hits or {}
                    touched.update(k for k in {*a, *b} if a.get(k) != b.get(k))
            yield None
        for c in sorted(classes):  # 2. the classes a small job borrows, when their devices changed
            new: dict[DevId, list[Hit]] = {}
            if self.borrowers.get(c):
                group = []
                for i, dev_id in enumerate(list(self.class_devs.get(c, ()))):
                    if (found := self._device(dev_id)) is not None:
                        group.append(found)
                    if i % _CHECK_EVERY == _CHECK_EVERY - 1:
                        yield None
                new = yield from _judge_group(group)
            old = self.class_hits.pop(c, {})
            if new:
                self.class_hits[c] = new
            touched.update(k for k in {*old, *new} if old.get(k) != new.get(k))
        out: list[dict[str, Any]] = []
        settled = 0
        while touched:  # 3. the devices whose verdict may have changed
            # popped, not copied: each key freed as it is settled (100k keys freed at once held the loop 64 ms)
            dev_id = touched.pop()
            self._settle(dev_id, self._record(dev_id), now, out)
            settled += 1
            if settled % _CHECK_EVERY == 0:
                yield None
        yield from self._evaluate_comms(comms, now, out)
        out.sort(key=lambda r: (r["node"], r["entity"]))
        return out

    def _borrow(self, gk: GroupKey, small: bool, classes: set[tuple[str, str]]) -> None:
        """Keep ``borrowers`` (the small job groups of each class) right; a class that gains its first
        borrower is judged in this evaluation."""
        c = (gk[1], gk[2])
        jobs = self.borrowers.get(c)
        if small:
            if not jobs:
                classes.add(c)
            self.borrowers.setdefault(c, set()).add(gk[0])
        elif jobs is not None:
            jobs.discard(gk[0])
            if not jobs:
                del self.borrowers[c]
                classes.add(c)

    def _record(self, dev_id: DevId) -> dict[str, Any] | None:
        dev = self._device(dev_id)
        jobs = sorted(self.uses.get(dev_id, {}))
        if dev is None or not jobs:
            return None
        hits: list[tuple[Hit, str]] = [(h, "node") for h in _limit_hits(dev)]
        klass = (dev.kind, dev.klass)
        for job in jobs:
            gk = (job, dev.kind, dev.klass)
            if gk not in self.job_hits:
                continue
            group_hits = self.job_hits[gk]
            if group_hits is None:
                hits += [(h, f"class {dev.klass}") for h in self.class_hits.get(klass, {}).get(dev_id, ())]
            else:
                hits += [(h, f"job {job}") for h in group_hits.get(dev_id, ())]
        if not hits:
            return None
        rec: dict[str, Any] = {"node": dev.node, "entity": dev.entity, "kind": dev.kind, "class": dev.klass,
                               "jobs": jobs[:MAX_JOBS_PER_DEVICE], "signals": [], "confidence": 0.0}
        seen: set[str] = set()
        for (_d, signal, value, median, why, past_limit), scope in hits:
            if signal in seen:
                continue
            seen.add(signal)
            rec["signals"].append({"signal": signal, "value": value, "peer_median": median,
                                   "scope": f"job {jobs[0]}" if scope == "node" else scope, "reason": why})
            rec["confidence"] = max(rec["confidence"], 0.95 if past_limit else 0.85)
        return rec

    def _settle(self, key: DevId, rec: dict[str, Any] | None, now: float, out: list[dict[str, Any]]) -> None:
        before = self.open.get(key)
        if rec is None:
            if before is not None:
                out.append({**self.open.pop(key), "status": "resolved", "updated": now})
            return
        summary = (sorted(s["signal"] for s in rec["signals"]), rec["jobs"])
        if before is None or (sorted(s["signal"] for s in before["signals"]), before["jobs"]) != summary:
            rec = {**rec, "status": "open", "since": before["since"] if before else now, "updated": now}
            self.open[key] = rec
            out.append(rec)

    def _evaluate_comms(self, comms: set[str], now: float, out: list[dict[str, Any]]) -> _Work:
        touched: set[DevId] = set()
        for comm in sorted(comms):
            summaries = self._comm_summaries(comm)
            yield None
            recs = _rank_records(summaries) if summaries else []
            yield None
            for r in self.comm_recs.pop(comm, []):
                self._rank_comms[(r["node"], r["entity"])].discard(comm)
                touched.add((r["node"], r["entity"]))
            if recs:
                self.comm_recs[comm] = recs
            for r in recs:
                self._rank_comms[(r["node"], r["entity"])].add(comm)
                touched.add((r["node"], r["entity"]))
        for key in sorted(touched):
            rec = None
            for comm in sorted(self._rank_comms.get(key, ())):
                rec = next((r for r in self.comm_recs.get(comm, []) if (r["node"], r["entity"]) == key), None)
                if rec is not None:
                    break
            if not self._rank_comms.get(key):
                self._rank_comms.pop(key, None)
            if rec is None and key not in self.open:
                continue
            self._settle(key, rec, now, out)

    def _comm_summaries(self, comm: str) -> list[dict[str, Any]]:
        """The per-rank summaries of one communicator, each rank counted from one node only: a rank two
        nodes both claim is contested and left out (counted), and a node reports at most
        MAX_RANKS_PER_NODE_COMM ranks of a communicator."""
        per_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for node, entity in sorted(self.comm_procs.get(comm, ())):
            procs = self.inspector.get(node)
            m = procs.get(entity) if procs is not None else None
            comms = m["details"].get("comms") if m is not None else None
            for c in comms[:256] if isinstance(comms, list) else []:
                if isinstance(c, dict) and c.get("comm_id") == comm:
                    per_node[node].append({**c, "node": node})
        claimed: dict[Any, set[str]] = defaultdict(set)
        for node, items in per_node.items():
            if len(items) > MAX_RANKS_PER_NODE_COMM:
                self._reject("inspector_ranks_per_node", f"{node}: {len(items)} ranks of {comm}")
                del items[MAX_RANKS_PER_NODE_COMM:]
            for c in items:
                r = c.get("rank")
                if isinstance(r, int) and not isinstance(r, bool):
                    claimed[r].add(node)
        contested = {r for r, nodes in claimed.items() if len(nodes) > 1}
        if contested:
            self._reject("inspector_rank_contested", f"{comm}: ranks {sorted(contested)[:8]}", len(contested))
        return [c for items in per_node.values() for c in items if c.get("rank") not in contested]
