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
spread (median + max(k * 1.4826 * MAD, a minimum gap)). A signal that stands out on more than
one device in eight of the group is a fleet-wide condition (a hot aisle, a noisy fabric), not a
straggler: nobody is named for it. Values not measured yet (null) are skipped.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

MIN_PEERS = 8  # below this many devices a job's group borrows the class's fleet-wide peers
MAX_SHARE = 1 / 8  # standing out on more devices than this is a fleet condition, not a straggler


@dataclass(frozen=True)
class Signal:
    key: str
    worse: str  # "higher" or "lower"
    floor: float  # an absolute value a straggler must pass (noise in any healthy fleet stays on the other side)
    gap: float  # the minimum distance from the peers' median
    limit_key: str | None = None  # the vector's own published limit (DCGM's PCIe replay limit of this link)
    limit: float | None = None  # a published limit (value) past which the device is named whatever its peers
    source: str = ""


GPU_SIGNALS = (
    Signal("pcie_replay_per_min", "higher", 5.0, 4.0, limit_key="pcie_replay_limit_per_min",
           source="DCGM DcgmHealthWatch GetExpectedPcieReplayRate (docs/straggler-signals.md)"),
    Signal("nvlink_crc_flit_per_min", "higher", 3.0, 2.0, source="DCGM MonitorNVLink4Fields: any CRC error is WARN"),
    Signal("nvlink_crc_data_per_min", "higher", 3.0, 2.0, source="DCGM MonitorNVLink4Fields"),
    Signal("nvlink_replay_per_min", "higher", 1.0, 1.0, limit=1.0, source="DCGM: replay errors are failures"),
    Signal("nvlink_recovery_per_min", "higher", 1.0, 1.0, limit=1.0, source="DCGM: recovery errors are failures"),
    Signal("thermal_margin_c", "lower", 6.0, 10.0, limit=0.0,
           source="NVSentinel ADR-042 T.Limit margin; 0: at max operating temperature"),
    Signal("pcie_width", "lower", 16.0, 1.0, source="a link trained below its peers' width"),
    Signal("nvlinks_down", "higher", 1.0, 1.0, source="NVLinks inactive where peers have none"),
)
PORT_SIGNALS = (
    Signal("symbol_error_per_h", "higher", 20.0, 15.0, limit=120.0,
           source="NVSentinel nic-health-monitor: symbol_error > 120/h (IBTA BER 1e-12)"),
    Signal("link_error_recovery_per_min", "higher", 1.0, 1.0, limit=5.0,
           source="NVSentinel nic-health-monitor: link_error_recovery > 5/min"),
    Signal("port_rcv_errors_per_s", "higher", 1.0, 0.5, limit=10.0,
           source="NVSentinel nic-health-monitor: port_rcv_errors > 10/s"),
    Signal("rate_gbps", "lower", 1e9, 1.0, source="a port negotiated below its peers' rate"),
)
HW_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
PERSIST_S = 60.0  # DCGM's one-minute health window: a slowdown held this long slows every step


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if f == f and abs(f) < 1e18 else None


@dataclass
class Device:
    node: str
    entity: str  # gpu:<pci> or ib:<hca>/<port>
    kind: str  # "gpu" or "hca_port"
    klass: str
    vector: dict[str, Any]
    jobs: set[str]


def devices_of(messages: list[dict[str, Any]]) -> list[Device]:
    """The latest vector of every GPU and port, with the jobs that use it (from membership)."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    used_gpus: dict[tuple[str, str], set[str]] = defaultdict(set)
    used_nics: dict[tuple[str, str], set[str]] = defaultdict(set)
    for m in sorted(messages, key=lambda m: str(m.get("time") or "")):
        node, d = m.get("node"), m.get("details")
        if not isinstance(node, str) or not isinstance(d, dict):
            continue
        if m.get("type") == "StragglerSignals" and m.get("collector") in ("nvml", "infiniband"):
            latest[(node, str(m.get("collector")))] = d
        elif m.get("type") == "NCCLJobMember" and isinstance(d.get("job"), str):
            if isinstance(d.get("pci"), str):
                used_gpus[(node, d["pci"])].add(d["job"])
            nics = d.get("nics") if isinstance(d.get("nics"), list) else d.get("hcas")
            for nic in (nics if isinstance(nics, list) else [])[:64]:
                if isinstance(nic, str):
                    used_nics[(node, nic)].add(d["job"])
    out: list[Device] = []
    for (node, collector), d in sorted(latest.items()):
        table = d.get("gpus") if collector == "nvml" else d.get("ports")
        if not isinstance(table, dict):
            continue
        for key, vec in list(table.items())[:256]:
            if not isinstance(key, str) or not isinstance(vec, dict):
                continue
            if collector == "nvml":
                out.append(Device(node, f"gpu:{key}", "gpu", str(vec.get("name") or "?"), vec,
                                  used_gpus.get((node, key), set())))
            else:
                klass = f"{vec.get('hca_type') or '?'}/{vec.get('link_layer') or '?'}"
                out.append(Device(node, f"ib:{key}", "hca_port", klass, vec, used_nics.get((node, key), set())))
    return out


def _outliers(group: list[Device], sig: Signal) -> list[tuple[Device, float, float, str]]:
    vals = [(dev, v) for dev in group if (v := _num(dev.vector.get(sig.key))) is not None]
    if len(vals) < MIN_PEERS:
        return []
    numbers = [v for _d, v in vals]
    med = statistics.median(numbers)
    mad = statistics.median(abs(v - med) for v in numbers)
    spread = max(4.0 * 1.4826 * mad, sig.gap)
    hits: list[tuple[Device, float, float, str]] = []
    relative: list[tuple[Device, float, float, str]] = []
    for dev, v in vals:
        limit = _num(dev.vector.get(sig.limit_key)) if sig.limit_key else sig.limit
        if limit is not None and (v > limit if sig.worse == "higher" else v <= limit):
            hits.append((dev, v, med, f"{sig.key} {v:g} is past its published limit {limit:g} ({sig.source})"))
        elif sig.worse == "higher" and v >= sig.floor and v >= med + spread:
            relative.append((dev, v, med, f"{sig.key} {v:g} stands out from {len(vals)} peers (median {med:g})"))
        elif sig.worse == "lower" and v <= sig.floor and v <= med - spread:
            relative.append((dev, v, med, f"{sig.key} {v:g} is below {len(vals)} peers (median {med:g})"))
    if len(relative) > max(1, int(len(vals) * MAX_SHARE)):
        relative = []  # the whole group is like this: a fleet condition, not one straggler
    return hits + relative


def _slowdowns(group: list[Device]) -> list[tuple[Device, float, float, str]]:
    held: list[tuple[Device, float, str]] = []
    for dev in group:
        h = dev.vector.get("clock_slowdown_held_s")
        if not isinstance(h, dict):
            continue
        for reason in HW_SLOWDOWNS:
            s = _num(h.get(reason))
            if s is not None and s >= PERSIST_S:
                held.append((dev, s, reason))
                break
    if len(held) > max(1, int(len(group) * MAX_SHARE)):
        return []
    return [(dev, s, 0.0, f"clocks held down by {reason} for {s:.0f} s (its peers run free)")
            for dev, s, reason in held]


def detect(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stragglers: one record per (node, device), the strongest signal first in ``signals``."""
    devices = [d for d in devices_of(messages) if d.jobs]  # only what a job uses
    by_class: dict[tuple[str, str], list[Device]] = defaultdict(list)
    by_job: dict[tuple[str, str, str], list[Device]] = defaultdict(list)
    for dev in devices:
        by_class[(dev.kind, dev.klass)].append(dev)
        for job in dev.jobs:
            by_job[(dev.kind, dev.klass, job)].append(dev)
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def note(dev: Device, value: float, median: float, why: str, signal: str, scope: str) -> None:
        rec = found.setdefault((dev.node, dev.entity), {
            "node": dev.node, "entity": dev.entity, "kind": dev.kind, "class": dev.klass,
            "jobs": sorted(dev.jobs), "signals": [], "confidence": 0.0})
        if any(s["signal"] == signal for s in rec["signals"]):
            return
        past_limit = "published limit" in why
        rec["signals"].append({"signal": signal, "value": value, "peer_median": median, "scope": scope,
                               "reason": why})
        rec["confidence"] = max(rec["confidence"], 0.95 if past_limit else 0.85)

    groups: list[tuple[str, list[Device]]] = []
    for (kind, klass, job), members in sorted(by_job.items()):
        peers = members if len(members) >= MIN_PEERS else by_class[(kind, klass)]
        groups.append((f"job {job}" if peers is members else f"class {klass}", peers))
    for scope, peers in groups:
        kind = peers[0].kind
        for sig in GPU_SIGNALS if kind == "gpu" else PORT_SIGNALS:
            for dev, v, med, why in _outliers(peers, sig):
                note(dev, v, med, why, sig.key, scope)
        if kind == "gpu":
            for dev, v, med, why in _slowdowns(peers):
                note(dev, v, med, why, "clock_slowdown_held_s", scope)
    return sorted(found.values(), key=lambda r: (-r["confidence"], r["node"], r["entity"]))


def late_ranks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks NCCL Inspector's per-rank numbers single out (fleet/inspector_compare.py): one that arrives
    last at its communicator's collectives (the others wait for it), or both ends of a slow point-to-point
    path. Named as the rank's process on its node, in the straggler records' shape."""
    from fleet.inspector_compare import comm_summaries, slow_ranks

    out = []
    for summaries in comm_summaries(messages).values():
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


STRAGGLERS_BUCKET = "gna-stragglers"  # key: <node token>.<entity token>; value: the current record
MAX_MEMBERS = 200_000


class StragglerWatch:
    """Live: the latest vector per node and collector and the membership per process, judged again
    when either changed; records change state (open, updated, resolved) only when the verdict does."""

    def __init__(self) -> None:
        self.vectors: dict[tuple[str, str], dict[str, Any]] = {}
        self.members: dict[tuple[str, str], dict[str, Any]] = {}  # (node, entity) -> its latest NCCLJobMember
        self.inspector: dict[tuple[str, str], dict[str, Any]] = {}  # (node, process) -> latest NCCLInspectorSummary
        self.open: dict[tuple[str, str], dict[str, Any]] = {}
        self.changed = False

    def add(self, msg: dict[str, Any]) -> bool:
        node = msg.get("node")
        if not isinstance(node, str):
            return False
        if msg.get("type") == "StragglerSignals" and msg.get("collector") in ("nvml", "infiniband"):
            self.vectors[(node, str(msg["collector"]))] = msg
        elif msg.get("type") == "NCCLInspectorSummary":
            key = (node, str(msg.get("entity")))
            if key not in self.inspector and len(self.inspector) >= MAX_MEMBERS:
                self.inspector.pop(next(iter(self.inspector)))
            self.inspector[key] = msg
        elif msg.get("type") == "NCCLJobMember":
            key = (node, str(msg.get("entity")))
            if key not in self.members and len(self.members) >= MAX_MEMBERS:
                self.members.pop(next(iter(self.members)))
            self.members[key] = msg
        else:
            return False
        self.changed = True
        return True

    def evaluate(self, now: float) -> list[dict[str, Any]]:
        """Records whose state changed since the last evaluation."""
        self.changed = False
        found = {(r["node"], r["entity"]): r for r in detect([*self.vectors.values(), *self.members.values()])}
        for r in late_ranks(list(self.inspector.values())):
            found.setdefault((r["node"], r["entity"]), r)
        out = []
        for key, rec in found.items():
            before = self.open.get(key)
            summary = (sorted(s["signal"] for s in rec["signals"]), rec["jobs"])
            if before is None or (sorted(s["signal"] for s in before["signals"]), before["jobs"]) != summary:
                rec = {**rec, "status": "open", "since": before["since"] if before else now, "updated": now}
                self.open[key] = rec
                out.append(rec)
        for key in [k for k in self.open if k not in found]:
            out.append({**self.open.pop(key), "status": "resolved", "updated": now})
        return out
