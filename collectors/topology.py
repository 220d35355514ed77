"""Node topology from sysfs: the PCIe tree, where GPUs, NICs and NVSwitches sit, the distance between
any two of them in ``nvidia-smi topo -m``'s words, NVLinks from NVML, and the checks built on them.

The tree and its distances are collectors/formats/pcie_tree.py, NCCL's view of it (its path ladder,
NCCL_NET_GDR_LEVEL) collectors/nccl_paths.py: the NCCL collectors use both, and a collector plugin does
not import another. docs/topology.md has the sources (the kernel's sysfs ABI, NCCL's topo.cc/xml.cc/paths.cc
at each tag, nvidia-smi's legend, NVML via nvidia-ml-py).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec

from collectors.formats.pcie_tree import (
    BDF,
    MAX_PCI_DEVICES,
    Finding,
    Topology,
    bdf_key,
    bounded_listdir,
    format_cpulist,
    is_switch,
    nearest_nics,
    nvlink_count,
    pcie_distance,
    read_attr,
    read_topology,
)
from collectors.nccl.rank_paths import nccl_path
from collectors.shared.nvml_lib import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    error_code,
    load_nvml,
)
from gna_sdk import CollectorSettings, Emitter, HostPaths, plural
from gna_sdk.hostroot import HostRoot
from gna_sdk.persist import BootScopedSet, boot_id
from gna_types import entities
from gna_types.entities import normal_pci
from gna_types.gpu_details import FabricManagerNotRunning, GPUFabricNotReady, NVLinkDegraded, PCIeLinkDegraded
from gna_types.node_details import wire
from gna_types.policy import verdict

MAX_NVML_GPUS = 64
MAX_NVLINKS = 64

LEGEND: dict[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}



def matrix(topo: Topology, nvlinks: Mapping[str, Sequence[str]] | None = None, *,
           switch_remotes: frozenset[str] | set[str] = frozenset()) -> dict[str, dict[str, str]]:
    """Every GPU and NIC against every other, keyed GPU<i>/NIC<j> like nvidia-smi (X on the diagonal)."""
    devices = [(f"GPU{i}", g) for i, g in enumerate(topo.gpus)] + [(f"NIC{j}", n.bdf) for j, n in
                                                                    enumerate(topo.nics)]
    out: dict[str, dict[str, str]] = {}
    for ra, ba in devices:
        row: dict[str, str] = {}
        for rb, bb in devices:
            if ra == rb:
                row[rb] = "X"
                continue
            d = pcie_distance(topo, ba, bb)
            if nvlinks is not None and ra.startswith("GPU") and rb.startswith("GPU"):
                n = nvlink_count(topo, nvlinks, ba, bb, switch_remotes)
                d = f"NV{n}" if n else d
            row[rb] = d
        out[ra] = row
    return out



def finding(type_: str, reason: str, message: str, *, entity: str = "",
            details: Mapping[str, Any] | None = None) -> Finding:
    v = verdict(type_, reason)  # gna_types/policy.py TOPOLOGY_FINDINGS
    return Finding(type_, v.severity, reason, message, entity, dict(details or {}), v.action)


# -- NVML (pynvml): NVLinks, utilization, fabric state ---------------------------------------------------

NVML_NVLINK_DEVICE_TYPE_SWITCH = 2  # pynvml NVML_NVLINK_DEVICE_TYPE_SWITCH
UNKNOWN_REMOTE, UNKNOWN_SWITCH = "unknown", "nvswitch"  # remotes NVML would not name
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}  # NVML_GPU_FABRIC_STATE_*
FABRIC_COMPLETED = 3


class _Lost(Exception):
    pass


@dataclass
class NvmlView:
    available: bool
    why: str = ""
    gpus: list[str] = field(default_factory=list)  # bus ids NVML answered for
    nvlinks: dict[str, list[str]] = field(default_factory=dict)  # bus id -> remote bus id per active link
    link_total: dict[str, int] = field(default_factory=dict)  # bus id -> links NVML knows (up or down)
    switch_remotes: set[str] = field(default_factory=set)
    utilization: dict[str, int] = field(default_factory=dict)  # percent
    fabric: dict[str, tuple[int, int]] = field(default_factory=dict)  # bus id -> (state, NVML return of it)
    lost: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # "call: code" -> skips


_SKIP = object()


def _call(lib: Any, view: NvmlView, name: str, *args: Any, stop: tuple[int, ...] = ()) -> Any:
    """A pynvml call: its value; _SKIP when the library or device lacks it (or it answers one of ``stop``);
    other NVML errors are counted in view.errors and give _SKIP too. _Lost on GPU_IS_LOST."""
    fn = getattr(lib, name, None)
    if fn is None:
        return _SKIP
    try:
        return fn(*args)
    except Exception as exc:
        code = error_code(exc)
        if code == NVML_ERROR_GPU_IS_LOST:
            raise _Lost(name) from exc
        if code is None:
            raise
        if code not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, *stop):
            key = f"{name}: {type(exc).__name__} ({code})"
            view.errors[key] = view.errors.get(key, 0) + 1
        return _SKIP


def read_nvlinks(lib: Any, handles: Mapping[str, Any], view: NvmlView | None = None) -> NvmlView:
    """For each GPU handle (keyed by bus id), the remote PCI bus id of every active NVLink
    (nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2) and which remotes NVML types as an
    NVSwitch (nvmlDeviceGetNvLinkRemoteDeviceType). A link index past the GPU's last answers
    INVALID_ARGUMENT; a board without NVLink NOT_SUPPORTED."""
    view = view if view is not None else NvmlView(True)
    max_links = getattr(lib, "NVML_NVLINK_MAX_LINKS", 18)
    max_links = max_links if isinstance(max_links, int) and 0 < max_links <= MAX_NVLINKS else 18
    for bus, h in handles.items():
        remotes: list[str] = []
        total = 0
        for link in range(max_links):
            state = _call(lib, view, "nvmlDeviceGetNvLinkState", h, link,
                          stop=(NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED))
            if state is _SKIP:
                break
            total += 1
            if not state:
                continue
            pci = _call(lib, view, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            kind = _call(lib, view, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if pci is not _SKIP and hasattr(pci, "busId"):
                remote = normal_pci(pci.busId)
            else:  # the link is up but its far end unnamed: an NVSwitch only if NVML says so
                remote = UNKNOWN_SWITCH if kind == NVML_NVLINK_DEVICE_TYPE_SWITCH else UNKNOWN_REMOTE
            if kind == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                view.switch_remotes.add(remote)
            remotes.append(remote)
        view.link_total[bus] = total
        if total:
            view.nvlinks[bus] = remotes
    return view


def _fabric_info(lib: Any, view: NvmlView, h: Any) -> tuple[int, int] | None:
    """(state, status) from nvmlDeviceGetGpuFabricInfoV (nvidia-ml-py >= 12.550) or the older
    nvmlDeviceGetGpuFabricInfo; both fill a struct the caller passes (c_nvmlGpuFabricInfo*_t)."""
    for fn, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                       ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        make = getattr(lib, struct, None)
        if make is None or getattr(lib, fn, None) is None:
            continue
        info = make()
        if _call(lib, view, fn, h, info) is _SKIP:
            return None
        state, status = getattr(info, "state", None), getattr(info, "status", None)
        if isinstance(state, int) and isinstance(status, int):
            return state, status
        return None
    return None


def probe_nvml(lib: Any) -> NvmlView:
    """Everything this collector asks NVML, per GPU (blocking calls: run it in a thread)."""
    view = NvmlView(True)
    count = _call(lib, view, "nvmlDeviceGetCount")
    if not isinstance(count, int):
        return NvmlView(False, "nvmlDeviceGetCount failed")
    handles: dict[str, Any] = {}
    for i in range(min(count, MAX_NVML_GPUS)):
        try:
            h = _call(lib, view, "nvmlDeviceGetHandleByIndex", i)
            pci = _call(lib, view, "nvmlDeviceGetPciInfo", h) if h is not _SKIP else _SKIP
            if pci is _SKIP:
                continue
            bus = normal_pci(pci.busId)
            util = _call(lib, view, "nvmlDeviceGetUtilizationRates", h)
            if util is not _SKIP and isinstance(getattr(util, "gpu", None), int):
                view.utilization[bus] = util.gpu
            fabric = _fabric_info(lib, view, h)
            if fabric is not None:
                view.fabric[bus] = fabric
            read_nvlinks(lib, {bus: h}, view)
            handles[bus] = h
        except _Lost:
            view.lost.append(str(i))
    view.gpus = sorted(handles, key=lambda b: bdf_key(b) if BDF.match(b) else (0, 0, 0, 0))
    return view


# -- Fabric Manager ------------------------------------------------------------------------------

FM_COMMS = ("nv-fabricmanage", "nv-fabricmanager")  # comm keeps 15 characters (TASK_COMM_LEN 16)


@dataclass(frozen=True)
class ProcScan:
    visible: bool  # at least one /proc/<pid>/comm could be read: the host's processes are in view
    fm_pids: tuple[int, ...] = ()


def scan_fabric_manager(host: HostPaths, max_processes: int = 65536) -> ProcScan:
    proc = str(host.path("/proc"))
    names, _ = bounded_listdir(proc, max_processes)
    visible, pids = False, []
    for name in names:
        if not (name.isascii() and name.isdigit()):
            continue
        d = os.path.join(proc, name)
        if os.path.islink(d):
            continue
        comm = read_attr(d, "comm", 64)
        if comm is None:
            continue
        visible = True
        if comm.strip() in FM_COMMS:
            argv0 = (read_attr(d, "cmdline", 4096) or "").split("\0", 1)[0]
            if not argv0 or os.path.basename(argv0) == "nv-fabricmanager":
                pids.append(int(name))
    return ProcScan(visible, tuple(sorted(pids)))


# -- checks -------------------------------------------------------------------------------------------

def expected_link(topo: Topology, bdf: str) -> tuple[float | None, int | None]:
    """The speed and width this link should train to: the smaller of the device's and its upstream port's
    capability (NCCL's xml.cc takes the same minimum of max_link_* and ../max_link_*)."""
    node = topo.nodes[bdf]
    up = topo.nodes.get(node.parent) if node.parent else None
    speeds = [s for s in (node.max_speed, up.max_speed if up else None) if s is not None]
    widths = [w for w in (node.max_width, up.max_width if up else None) if w is not None]
    return (min(speeds) if speeds else None), (min(widths) if widths else None)


def pcie_findings(topo: Topology, utilization: Mapping[str, int] | None, busy_pct: int) -> list[Finding]:
    """A GPU link narrower than expected, always; slower than expected only while the GPU is busy (GPUs
    drop the link speed when idle to save power, so an idle Gen1 link is normal)."""
    out: list[Finding] = []
    for i, g in enumerate(topo.gpus):
        node = topo.nodes[g]
        speed, width = expected_link(topo, g)
        busy = utilization.get(g) if utilization is not None else None
        details = wire(PCIeLinkDegraded(gpu=f"GPU{i}", current_speed_gts=node.cur_speed, expected_speed_gts=speed,
                                        current_width=node.cur_width, expected_width=width,
                                        max_speed_gts=node.max_speed, max_width=node.max_width,
                                        utilization_pct=busy))
        if width is not None and node.cur_width is not None and node.cur_width < width:
            out.append(finding("PCIeLinkDegraded", "WidthBelowMax",
                               f"GPU{i} ({g}) PCIe link trained at x{node.cur_width}, below the x{width} both ends "
                               f"support: its host-device bandwidth is cut to {node.cur_width}/{width}.",
                               entity=entities.gpu(g), details=details))
        elif (busy is not None and busy >= busy_pct and speed is not None and node.cur_speed is not None
              and node.cur_speed < speed):
            out.append(finding("PCIeLinkDegraded", "SpeedBelowMaxUnderLoad",
                               f"GPU{i} ({g}) PCIe link runs at {node.cur_speed:g} GT/s while {busy}% busy, below "
                               f"the {speed:g} GT/s both ends support.", entity=entities.gpu(g), details=details))
    return out


def nvswitch_system(topo: Topology, view: NvmlView | None) -> bool:
    return bool(topo.nvswitches) or bool(view and view.available and view.switch_remotes)


def nvlink_findings(topo: Topology, view: NvmlView, expected_per_pair: int,
                    best_seen: Mapping[tuple[str, str], int]) -> list[Finding]:
    """GPU pairs with fewer NVLinks than they should have.

    NVSwitch system: every GPU of a board has the same links (18 on HGX H100), so the expected count is the
    configured one or the most links any GPU here has; the GPU whose own switch links are down is named
    (its peers are not: their links are fine). Direct NVLink (bridged PCIe cards): a pair that had links is
    expected to keep the most it had since boot (or the configured count, if higher), named as the pair."""
    known = [g for g in topo.gpus if g in view.link_total]
    if not any(view.link_total[g] for g in known):
        return []
    out: list[Finding] = []
    if nvswitch_system(topo, view):
        want = expected_per_pair or max(view.link_total[g] for g in known)
        for g in known:
            up = sum(1 for r in view.nvlinks.get(g, []) if is_switch(topo, r, view.switch_remotes))
            if up >= want:
                continue
            pairs = {topo.label(p): f"NV{nvlink_count(topo, view.nvlinks, g, p, view.switch_remotes)}"
                     for p in known if p != g}
            out.append(finding(
                "NVLinkDegraded", "NoNVLinkLeft" if up == 0 else "FewerNVLinksThanExpected",
                f"{topo.label(g)} ({g}) has {up} of {want} NVLinks to the NVSwitches up: its GPU pairs run at "
                f"NV{up} instead of NV{want}" + (" (no NVLink at all: peer traffic falls back to PCIe)" if up == 0
                                                 else "") + ".",
                entity=entities.gpu(g), details=wire(NVLinkDegraded(
                    gpu=topo.label(g), links_up=up, expected=want, links_known=view.link_total[g], pairs=pairs,
                    nvswitch=True))))
        return out
    for a, b in itertools.combinations(known, 2):
        best = best_seen.get((min(a, b), max(a, b)), 0)
        want = max(expected_per_pair, best) if best else 0
        now = nvlink_count(topo, view.nvlinks, a, b, view.switch_remotes)
        if want and now < want:
            out.append(finding(
                "NVLinkDegraded", "NoNVLinkLeft" if now == 0 else "FewerNVLinksThanExpected",
                f"{topo.label(a)} ({a}) and {topo.label(b)} ({b}) are joined by NV{now}, expected NV{want}"
                + (": their traffic falls back to PCIe." if now == 0 else ": less bandwidth between them."),
                entity=f"nvlink:{a}-{b}", details=wire(NVLinkDegraded(
                    gpus=[topo.label(a), topo.label(b)], now=now, expected=want, most_seen_since_boot=best,
                    nvswitch=False))))
    return out


def fabric_findings(topo: Topology, view: NvmlView | None, procs: ProcScan | None) -> list[Finding]:
    """Fabric Manager on an NVSwitch system, and every GPU's fabric registration (nvmlDeviceGetGpuFabricInfo*:
    a GPU that is not COMPLETED/SUCCESS fails new CUDA work with cudaErrorSystemNotReady, 802)."""
    out: list[Finding] = []
    nvml_ok = view is not None and view.available
    not_ready: dict[str, str] = {}
    if nvml_ok:
        assert view is not None
        for g, (state, status) in sorted(view.fabric.items()):
            if state == 0:  # NOT_SUPPORTED: no fabric on this GPU (PCIe boards, pre-Hopper)
                continue
            if state == FABRIC_COMPLETED and status == 0:
                continue
            label = topo.label(g)
            what = FABRIC_STATES.get(state, f"state {state}")
            reason = "CompletedWithError" if state == FABRIC_COMPLETED else (
                "NotStarted" if state == 1 else "InProgress" if state == 2 else "UnknownState")
            not_ready[g] = what
            out.append(finding(
                "GPUFabricNotReady", reason,
                f"{label} ({g}) fabric registration is {what}"
                + (f" with NVML error {status}" if state == FABRIC_COMPLETED else "")
                + ": new CUDA work on it fails with cudaErrorSystemNotReady (802) until Fabric Manager completes it.",
                entity=entities.gpu(g), details=wire(GPUFabricNotReady(state=what, status=status))))
    if nvswitch_system(topo, view) and procs is not None and procs.visible and not procs.fm_pids:
        confirmed = bool(not_ready)
        all_done = nvml_ok and view is not None and bool(view.fabric) and not not_ready
        out.append(finding(
            "FabricManagerNotRunning",
            "FabricRegistered" if all_done else ("GPUsNotRegistered" if confirmed else "NoProcess"),
            "NVSwitch system without a running nv-fabricmanager: "
            + ("the GPUs registered earlier keep working, but a GPU reset or driver reload will leave them "
               "unusable until it runs." if all_done else
               "GPUs cannot join the NVLink fabric, so new CUDA work fails with cudaErrorSystemNotReady (802)."),
            entity="service:nvidia-fabricmanager",
            details=wire(FabricManagerNotRunning(nvswitches=topo.nvswitches, gpus_not_registered=not_ready,
                                                 nvml=nvml_ok))))
    return out


# -- report and rendering (gpu-node-agent topo) ------------------------------------------------------------

def build_report(topo: Topology, view: NvmlView | None, *, pcie_only: bool = False,
                 host_root: str = "/", nvml_used: bool = True) -> dict[str, Any]:
    """The JSON document of ``gpu-node-agent topo --format json``; render_text() prints it."""
    nvl = None if pcie_only or view is None or not view.available else view.nvlinks
    sw = frozenset(view.switch_remotes) if view is not None else frozenset()
    devices: dict[str, Any] = {}
    for i, g in enumerate(topo.gpus):
        n = topo.nodes[g]
        speed, width = expected_link(topo, g)
        devices[f"GPU{i}"] = {
            "kind": "gpu", "bus_id": g, "device_id": f"0x{n.device:04x}" if n.device is not None else None,
            "numa_node": n.numa_node, "cpu_affinity": format_cpulist(n.cpus) if n.cpus else None,
            "pcie": {"current_speed_gts": n.cur_speed, "max_speed_gts": n.max_speed, "expected_speed_gts": speed,
                     "current_width": n.cur_width, "max_width": n.max_width, "expected_width": width},
            "nvlinks": len(view.nvlinks.get(g, [])) if view is not None and view.available else None,
            "nearest_nics": nearest_nics(topo, g),
            "nccl_path_to_nearest": nccl_path(topo, g, nearest_nics(topo, g)[0]) if topo.nics else None,
        }
    for j, nic in enumerate(topo.nics):
        n = topo.nodes[nic.bdf]
        devices[f"NIC{j}"] = {"kind": "nic", "name": nic.name, "bus_id": nic.bdf, "netdevs": list(nic.netdevs),
                              "numa_node": n.numa_node,
                              "cpu_affinity": format_cpulist(n.cpus) if n.cpus else None}
    return {
        "host_root": host_root,
        "devices": devices,
        "matrix": matrix(topo, nvl, switch_remotes=sw),
        "pcie_only": pcie_only,
        "nvlink_known": nvl is not None,  # False: GPU-to-GPU cells are PCIe distances, NVLink or not
        "nvlink_source": "nvml" if nvl is not None else "not used (--pcie-only)" if pcie_only else
                         f"unavailable: {view.why}" if view is not None else "not used (--no-nvml)" if not nvml_used
                         else "no GPU",
        "nvswitches": topo.nvswitches,
        "netdevs": topo.netdevs,
        "legend": {k: v for k, v in LEGEND.items() if not (pcie_only and k == "NV#")},
        "skipped": [{"entry": s.entry, "reason": s.reason} for s in topo.skipped],
        "unparsable": [{"entry": s.entry, "value": s.reason} for s in topo.bad_values],
    }


def render_text(report: Mapping[str, Any]) -> str:
    """nvidia-smi topo -m's layout: tab-separated matrix, CPU/NUMA affinity, the legend, the NIC legend."""
    devices: Mapping[str, Any] = report["devices"]
    names = list(devices)
    lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for r in names:
        cells = [" X " if r == c else report["matrix"][r][c] for c in names]
        d = devices[r]
        extra = ([d.get("cpu_affinity") or "N/A", "N/A" if d.get("numa_node") is None else str(d["numa_node"]),
                  "", "N/A"] if d["kind"] == "gpu" else ["", "", "", ""])
        lines.append("\t".join([r, *cells, *extra]))
    out = "\n".join(lines) + "\n"
    gpus = sum(1 for d in devices.values() if d["kind"] == "gpu")
    if gpus > 1 and not report.get("pcie_only") and report.get("nvlink_known") is False:
        # not nvidia-smi's: without NVML a GPU pair's SYS/NODE must not read as "no NVLink"
        out += (f"\nNVLink: unknown without NVML ({report.get('nvlink_source')}). GPU-to-GPU cells show the "
                f"PCIe path only; GPUs that NVLink joins would read NV# there.\n")
    out += "\nLegend:\n\n"
    out += "".join(f"  {k:<4} = {v}\n" for k, v in report["legend"].items())
    nics = [(r, d["name"]) for r, d in devices.items() if d["kind"] == "nic"]
    if nics:
        out += "\nNIC Legend:\n\n" + "".join(f"  {r}: {name}\n" for r, name in nics)
    return out + "\n"


def topology_report(host_root: str | Path, *, use_nvml: bool = True, pcie_only: bool = False,
                    nvml: Any = None) -> tuple[dict[str, Any], list[str]]:
    """(report, notes for stderr) for ``gpu-node-agent topo``. ``nvml``: an injected pynvml-like module."""
    host = HostRoot(host_root)
    topo = read_topology(host)
    notes: list[str] = []
    if not topo.pci_bus_readable:
        notes.append(f"{host.path('/sys/bus/pci/devices')} is missing: no PCI devices read")
    elif not topo.gpus:
        notes.append("no NVIDIA GPU on the PCI bus")
    if topo.skipped:
        notes.append(f"{plural(len(topo.skipped), 'sysfs entry', 'sysfs entries')} refused or unreadable "
                     "(listed under 'skipped' in JSON)")
    view: NvmlView | None = None
    if topo.gpus and not pcie_only:
        if use_nvml:
            lib, why = (nvml, "") if nvml is not None else load_nvml()
            view = probe_nvml(lib) if lib is not None else NvmlView(False, why)
            if not view.available:
                notes.append(f"NVLink unknown ({view.why}): GPU pairs show their PCIe distance")
        else:
            notes.append("NVLink not read (--no-nvml): GPU pairs show their PCIe distance")
    return build_report(topo, view, pcie_only=pcie_only, host_root=str(host.root), nvml_used=use_nvml), notes


# -- the collector -------------------------------------------------------------------------------------------

class TopologyConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 60.0
    nvml: bool = True
    busy_utilization_pct: Annotated[int, msgspec.Meta(ge=1, le=100)] = 30  # a GPU this busy runs its link at speed
    fabric_grace: Annotated[float, msgspec.Meta(ge=0)] = 300.0  # Fabric Manager's start-up after boot is normal
    expected_nvlinks_per_pair: Annotated[int, msgspec.Meta(ge=0, le=MAX_NVLINKS)] = 0  # 0: inferred
    max_pci_devices: Annotated[int, msgspec.Meta(ge=1, le=65536)] = MAX_PCI_DEVICES
    max_processes: Annotated[int, msgspec.Meta(ge=1, le=4194304)] = 65536


@dataclass
class Probe:
    topo: Topology
    view: NvmlView | None
    procs: ProcScan | None


class TopologyCollector:
    """PCIe link width/speed, NVLink pairs, Fabric Manager and GPU fabric state, from the node's topology."""

    name: ClassVar[str] = "topology"
    config_type: ClassVar[type[TopologyConfig]] = TopologyConfig
    phase: ClassVar[int] = 40
    # for `gpu-node-agent topo`, which reaches this module only through the entry point
    report = staticmethod(topology_report)
    render_text = staticmethod(render_text)

    def __init__(self, config: TopologyConfig, host: HostPaths, emit: Emitter, *, nvml: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self._injected = nvml
        self.clock = clock
        self._since: dict[str, float] = {}  # condition key -> first pass that saw it (grace periods)
        self.pairs = BootScopedSet(emit.state_dir / "nvlink_pairs.json" if emit.state_dir else None, boot_id(host))

    def _lib(self) -> tuple[Any, str]:
        if not self.config.nvml:
            return None, "disabled in the config (collectors.topology.nvml = false)"
        if self._injected is not None:
            return self._injected, ""
        return load_nvml()

    def _probe(self) -> Probe:
        topo = read_topology(self.host, max_devices=self.config.max_pci_devices)
        view: NvmlView | None = None
        if topo.gpus:
            lib, why = self._lib()
            view = probe_nvml(lib) if lib is not None else NvmlView(False, why)
        procs = scan_fabric_manager(self.host, self.config.max_processes) if nvswitch_system(topo, view) else None
        return Probe(topo, view, procs)

    def _best_seen(self, view: NvmlView, topo: Topology) -> dict[tuple[str, str], int]:
        """Most NVLinks seen per GPU pair since boot (persisted), including now."""
        now: set[str] = set()
        gpus = [g for g in topo.gpus if g in view.nvlinks]
        for a, b in itertools.combinations(gpus, 2):
            n = nvlink_count(topo, view.nvlinks, a, b, view.switch_remotes)
            if n:
                now.add(f"{a}|{b}={n}")
        self.pairs.add_all(now)
        best: dict[tuple[str, str], int] = {}
        for item in self.pairs.items:
            pair, _, count = item.partition("=")
            a, _, b = pair.partition("|")
            if count.isascii() and count.isdigit() and len(count) <= 3 and a and b:
                key = (min(a, b), max(a, b))
                best[key] = max(best.get(key, 0), int(count))
        return best

    def _due(self, key: str, grace: bool) -> bool:
        """True once ``key`` has been seen for fabric_grace seconds (at once when not ``grace``)."""
        first = self._since.setdefault(key, self.clock())
        return not grace or self.clock() - first >= self.config.fabric_grace

    async def collect(self) -> None:
        await self._pass(grace=True)

    async def check(self) -> None:
        """`gpu-node-agent check`: no grace periods (a prolog must not start a job on an unready fabric)."""
        await self._pass(grace=False)

    async def _pass(self, *, grace: bool) -> None:
        probe = await asyncio.to_thread(self._probe)
        topo, view = probe.topo, probe.view
        for s in topo.skipped:
            self.emit.unparsed("/sys (topology)", f"{s.entry}: {s.reason}")
        for s in topo.bad_values:
            self.emit.unparsed("/sys/devices attributes", f"{s.entry}: {s.reason!r}")
        if not topo.pci_bus_readable:
            self.emit.not_seen("/sys/bus/pci/devices", "missing under the host root: no topology")
            return
        if not topo.gpus:
            return  # gpu_devices says whether GPUs are expected here
        findings = pcie_findings(topo, view.utilization if view and view.available else None,
                                 self.config.busy_utilization_pct)
        if view is None or not view.available:
            self.emit.not_seen("NVML", f"{view.why if view else 'not loaded'}: NVLink pairs, GPU fabric state and "
                                       f"the PCIe speed under load are not checked (link width is)")
        else:
            for call, n in sorted(view.errors.items()):
                self.emit.not_seen(f"NVML {call.split(':')[0]}", f"{call}: skipped {plural(n, 'time')}")
            findings += nvlink_findings(topo, view, self.config.expected_nvlinks_per_pair,
                                        self._best_seen(view, topo))
        if nvswitch_system(topo, view) and probe.procs is not None and not probe.procs.visible:
            self.emit.not_seen("/proc/*/comm", "no process visible under the host root: Fabric Manager not checked")
        fabric = fabric_findings(topo, view, probe.procs)
        live = {f"{f.type}|{f.entity}" for f in fabric}
        for key in [k for k in self._since if k not in live]:
            del self._since[key]  # cleared: a later recurrence waits its grace again
        # Fabric Manager and registration take a while after boot; a registration that completed with an
        # error will not fix itself, so it is not held back
        held = [f for f in fabric if self._due(f"{f.type}|{f.entity}", grace and f.reason != "CompletedWithError")]
        for f in findings + held:
            await self.emit.condition(f.type, firing=True, severity=f.severity, entity=f.entity, reason=f.reason,
                                      message=f.message, details=dict(f.details),
                                      suggested_action=f.suggested_action)
        gpus: dict[str, Any] = {}
        for i, g in enumerate(topo.gpus):
            near = nearest_nics(topo, g)
            gpus[g] = {"index": i, "numa_node": topo.nodes[g].numa_node, "nearest_nics": near,
                       "nic_distance": pcie_distance(topo, g, topo.resolve(near[0])) if near else None}
        self.emit.facts.set("topology.gpus", gpus)
