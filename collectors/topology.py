"""Node topology from sysfs: the PCIe tree, where GPUs, NICs and NVSwitches sit, the distance between
any two of them in ``nvidia-smi topo -m``'s words, NCCL's own path ladder, and the checks built on it.

The tree is read, never guessed: ``/sys/bus/pci/devices/<bdf>`` is a symlink whose target spells the
route from the host bridge (``/sys/devices/pci0000:15/<root port>/<switch up>/<switch down>/<bdf>``).
Every path is resolved under the host root and a link that leaves it, loops or names another device
is refused and counted, never followed. Attribute files are read with O_NOFOLLOW|O_NONBLOCK, only
when they are regular files, and at most a few KiB (docs/topology.md has the sources: the kernel's
sysfs ABI, NCCL's topo.cc/xml.cc/paths.cc at each tag, nvidia-smi's legend, NVML via nvidia-ml-py).

Distances (nvidia-smi's legend): X self; NV# a bonded set of # NVLinks; PIX at most one PCIe switch;
PXB several switches below one root port; PHB through a host bridge (same root complex); NODE across
host bridges of one NUMA node; SYS across the SMP interconnect (or a NUMA node the kernel does not
know, as nvidia-smi prints SYS there: vllm-project/vllm#11122).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from collectors.nvml_lib import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    error_code,
    load_nvml,
    normalize_bus_id,
)
from gna_sdk import CollectorSettings, Emitter, HostPaths, Severity, SuggestedAction
from gna_sdk.hostroot import HostRoot
from gna_sdk.persist import BootScopedSet, boot_id

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA, 3D controller (class >> 8)
NVSWITCH_CLASS = 0x0680  # "Bridge: other", vendor NVIDIA (NCCL's kvDictPciClass maps 0x068000 to NVS)
BRIDGE_CLASSES = (0x0604, 0x0609)

MAX_PCI_DEVICES = 4096  # entries of /sys/bus/pci/devices looked at; a real node has a few hundred
MAX_CLASS_ENTRIES = 1024  # /sys/class/infiniband, /sys/class/net
MAX_CHAIN = 16  # PCI functions from a host bridge down to a device; real trees are under 8
ATTR_LIMIT = 256
CPULIST_LIMIT = 8192
MAX_CPU = 65535
MAX_NVML_GPUS = 64
MAX_NVLINKS = 64

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_SPEED = re.compile(r"^([0-9]{1,3}(?:\.[0-9]{1,2})?) GT/s(?: PCIe)?$")
_HEX = re.compile(r"^0x([0-9a-fA-F]{1,8})$")
_INT = re.compile(r"^-?[0-9]{1,7}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")

Distance = str  # "X", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"
PCIE_LADDER: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND: dict[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}


# -- value parsers (sysfs ABI; each bounded, None for anything else) ------------------------------

def parse_hex(text: str | None, bits: int) -> int | None:
    """'0x10de' -> 0x10de; None unless a hex number that fits ``bits`` (vendor 16, class 24)."""
    m = _HEX.match((text or "").strip())
    if not m:
        return None
    value = int(m.group(1), 16)
    return value if value < (1 << bits) else None


def parse_numa(text: str | None) -> int | None:
    """numa_node: "%d", -1 when the firmware names no node (pci-sysfs.c numa_node_show); None for -1 and junk."""
    t = (text or "").strip()
    if not _INT.match(t):
        return None
    value = int(t)
    return value if 0 <= value <= 4095 else None


def parse_link_speed(text: str | None) -> float | None:
    """'32.0 GT/s PCIe' (pci_speed_string, kernel >= 5.7) or '8 GT/s' (older) -> GT/s; None for 'Unknown'."""
    m = _SPEED.match((text or "").strip())
    if not m:
        return None
    value = float(m.group(1))
    return value if 0 < value <= 256 else None


def parse_link_width(text: str | None) -> int | None:
    """'16' -> 16 (0 is a link that is down); None beyond x32 or for junk."""
    t = (text or "").strip()
    if not (t.isascii() and t.isdigit()) or len(t) > 2:
        return None
    value = int(t)
    return value if value <= 32 else None


def parse_cpulist(text: str | None) -> frozenset[int] | None:
    """A kernel cpulist ('0-55,112-167', cpumap_print_to_pagebuf) -> CPU numbers; None for junk or
    lists beyond MAX_CPU. An empty list (a memoryless node's) is an empty set."""
    t = (text or "").strip()
    if len(t) > CPULIST_LIMIT:
        return None
    if not t:
        return frozenset()
    cpus: set[int] = set()
    for part in t.split(","):
        lo_s, sep, hi_s = part.partition("-")
        if not (lo_s.isascii() and lo_s.isdigit() and len(lo_s) <= 5) or (
                sep and not (hi_s.isascii() and hi_s.isdigit() and len(hi_s) <= 5)):
            return None
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if lo > hi or hi > MAX_CPU:
            return None
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """CPU numbers -> '0-55,112-167' (the kernel's own rendering)."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(cpus)), key=lambda p: p[1] - p[0]):
        vals = [v for _, v in run]
        out.append(str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}")
    return ",".join(out)


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """mlx5_2 < mlx5_10 < mlx5_bond_0: nvidia-smi's NIC Legend order (numbers compared as numbers)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def bdf_key(bdf: str) -> tuple[int, int, int, int]:
    dom, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)


# -- the model ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PciNode:
    bdf: str
    host_bridge: str  # the pci<domain>:<bus> directory's path under /sys/devices (unique per root complex)
    chain: tuple[str, ...]  # functions from the one under the host bridge down to this one (inclusive)
    vendor: int | None = None
    device: int | None = None
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    klass: int | None = None  # 24-bit class code
    numa_node: int | None = None
    cpus: frozenset[int] | None = None
    cur_speed: float | None = None
    max_speed: float | None = None
    cur_width: int | None = None
    max_width: int | None = None

    @property
    def kind(self) -> Literal["gpu", "nvswitch", "bridge", "other"]:
        base = self.klass >> 8 if self.klass is not None else None
        if self.vendor == NVIDIA_VENDOR and base in GPU_CLASSES:
            return "gpu"
        if self.vendor == NVIDIA_VENDOR and base == NVSWITCH_CLASS:
            return "nvswitch"
        return "bridge" if base in BRIDGE_CLASSES else "other"

    @property
    def parent(self) -> str | None:
        return self.chain[-2] if len(self.chain) > 1 else None


@dataclass(frozen=True)
class Nic:
    name: str  # the RDMA device (mlx5_0): nvidia-smi's NIC Legend names these
    bdf: str
    netdevs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skip:
    entry: str
    reason: str


@dataclass
class Topology:
    nodes: dict[str, PciNode] = field(default_factory=dict)
    nics: list[Nic] = field(default_factory=list)
    netdevs: dict[str, str] = field(default_factory=dict)  # interface -> bdf (RDMA or not)
    skipped: list[Skip] = field(default_factory=list)
    bad_values: list[Skip] = field(default_factory=list)  # attribute files present but unparsable
    pci_bus_readable: bool = True

    @property
    def gpus(self) -> list[str]:
        """GPU bus ids in NVML's enumeration order (by PCI bus id): index i is GPU<i>."""
        return sorted((b for b, n in self.nodes.items() if n.kind == "gpu"), key=bdf_key)

    @property
    def nvswitches(self) -> list[str]:
        return sorted((b for b, n in self.nodes.items() if n.kind == "nvswitch"), key=bdf_key)

    def label(self, bdf_or_name: str) -> str:
        """GPU<i> / NIC<j> for a device in the matrix, else the input."""
        gpus = self.gpus
        if bdf_or_name in gpus:
            return f"GPU{gpus.index(bdf_or_name)}"
        for j, nic in enumerate(self.nics):
            if bdf_or_name in (nic.name, nic.bdf):
                return f"NIC{j}"
        return bdf_or_name

    def resolve(self, ref: str) -> str:
        """A PCI function for GPU<i>, NIC<j>, an RDMA device, an interface or a bus id (NVML's 8-digit
        domain too); KeyError when there is none."""
        m = re.fullmatch(r"(GPU|NIC)(\d{1,4})", ref)
        if m:
            idx = int(m.group(2))
            if m.group(1) == "GPU" and idx < len(self.gpus):
                return self.gpus[idx]
            if m.group(1) == "NIC" and idx < len(self.nics):
                return self.nics[idx].bdf
            raise KeyError(ref)
        for nic in self.nics:
            if ref == nic.name:
                return nic.bdf
        if ref in self.netdevs:
            return self.netdevs[ref]
        bdf = normalize_bus_id(ref) if ":" in ref else ref
        if bdf in self.nodes:
            return bdf
        raise KeyError(ref)


# -- reading sysfs under a host root ----------------------------------------------------------------

def read_attr(directory: str, name: str, limit: int = ATTR_LIMIT) -> str | None:
    """A small attribute file as text, or None when absent, a symlink, not a regular file (a FIFO would
    block a plain open) or unreadable. Never more than ``limit`` bytes."""
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit + 1).decode("ascii", "replace")
    except OSError:  # EINVAL/EIO: an attribute whose device does not answer
        return None
    finally:
        os.close(fd)


def _bounded_listdir(path: str, limit: int) -> tuple[list[str], bool]:
    """Up to ``limit`` names of a directory (and whether there were more); [] when unreadable."""
    try:
        with os.scandir(path) as it:
            names = [e.name for e in itertools.islice(it, limit + 1)]
    except OSError:
        return [], False
    return sorted(names[:limit]), len(names) > limit


class _Reader:
    def __init__(self, root: str, max_devices: int) -> None:
        self.root = root
        self.devroot = os.path.join(root, "sys", "devices")
        self.max_devices = max_devices
        self.topo = Topology()

    def skip(self, entry: str, reason: str) -> None:
        if len(self.topo.skipped) < 1000:
            self.topo.skipped.append(Skip(entry, reason))

    def resolve(self, link: str, entry: str) -> str | None:
        """Where ``link`` leads, if that is inside the host root's /sys/devices."""
        try:
            real = os.path.realpath(link, strict=True)
        except OSError as exc:  # ELOOP for a loop, ENOENT for a dangling link
            self.skip(entry, f"unresolvable link ({exc.strerror or type(exc).__name__})")
            return None
        if os.path.commonpath([real, self.devroot]) != self.devroot or real == self.devroot:
            self.skip(entry, "link leads outside the host root's /sys/devices: refused")
            return None
        return real

    def add(self, real: str, entry: str, expect: str | None = None) -> str | None:
        """Register the PCI function at ``real`` and every bridge above it; its bdf, or None (counted)."""
        parts = os.path.relpath(real, self.devroot).split(os.sep)
        hb = max((i for i, p in enumerate(parts) if _HOST_BRIDGE.match(p)), default=-1)
        if hb < 0:
            self.skip(entry, "not below a PCI host bridge (pci<domain>:<bus>)")
            return None
        chain = tuple(parts[hb + 1:])
        if not chain or len(chain) > MAX_CHAIN or not all(_BDF.match(p) for p in chain):
            self.skip(entry, "not a chain of PCI functions below the host bridge")
            return None
        if expect is not None and chain[-1] != expect:
            self.skip(entry, f"links to another device ({chain[-1]})")
            return None
        host_bridge = "/".join(parts[:hb + 1])
        for i, bdf in enumerate(chain):
            known = self.topo.nodes.get(bdf)
            if known is not None:
                if known.chain != chain[:i + 1] or known.host_bridge != host_bridge:
                    self.skip(entry, f"{bdf} appears at two places in the tree")
                    return None
                continue
            directory = os.path.join(self.devroot, *parts[:hb + 2 + i])
            self.topo.nodes[bdf] = self.read_node(bdf, host_bridge, chain[:i + 1], directory)
        return chain[-1]

    def read_node(self, bdf: str, host_bridge: str, chain: tuple[str, ...], directory: str) -> PciNode:
        def value(name: str, parse: Callable[[str | None], Any], limit: int = ATTR_LIMIT) -> Any:
            raw = read_attr(directory, name, limit)
            if raw is None:
                return None
            parsed = parse(raw) if len(raw) <= limit else None
            # "-1" (numa_node: no node) and "Unknown" (a link speed the kernel cannot name) are values, not junk
            junk = parsed is None and raw.strip() not in ("-1", "Unknown", "Unknown speed")
            if junk and len(self.topo.bad_values) < 1000:
                self.topo.bad_values.append(Skip(f"{bdf}/{name}", raw[:80].strip()))
            return parsed

        return PciNode(
            bdf=bdf, host_bridge=host_bridge, chain=chain,
            vendor=value("vendor", lambda t: parse_hex(t, 16)),
            device=value("device", lambda t: parse_hex(t, 16)),
            subsystem_vendor=value("subsystem_vendor", lambda t: parse_hex(t, 16)),
            subsystem_device=value("subsystem_device", lambda t: parse_hex(t, 16)),
            klass=value("class", lambda t: parse_hex(t, 24)),
            numa_node=value("numa_node", parse_numa),
            cpus=value("local_cpulist", parse_cpulist, CPULIST_LIMIT),
            cur_speed=value("current_link_speed", parse_link_speed),
            max_speed=value("max_link_speed", parse_link_speed),
            cur_width=value("current_link_width", parse_link_width),
            max_width=value("max_link_width", parse_link_width),
        )

    def scan_pci(self, devices: str) -> None:
        if not os.path.isdir(devices):
            self.topo.pci_bus_readable = False
            return
        names, more = _bounded_listdir(devices, self.max_devices)
        if more:
            self.skip(devices, f"more than {self.max_devices} entries: the rest not read")
        for name in names:
            entry = f"/sys/bus/pci/devices/{name}"
            if not _BDF.match(name):
                self.skip(entry, "not a PCI bus id")
                continue
            real = self.resolve(os.path.join(devices, name), entry)
            if real is not None:
                self.add(real, entry, expect=name)

    def scan_class(self, klass: str, directory: str) -> dict[str, str]:
        """name -> bdf for /sys/class/<klass>/<name>/device links into the PCI tree."""
        out: dict[str, str] = {}
        names, more = _bounded_listdir(directory, MAX_CLASS_ENTRIES)
        if more:
            self.skip(directory, f"more than {MAX_CLASS_ENTRIES} entries: the rest not read")
        for name in names:
            entry = f"/sys/class/{klass}/{name}"
            if not _NAME.match(name):
                self.skip(entry, "not a device name")
                continue
            link = os.path.join(directory, name, "device")
            if not os.path.lexists(link):
                if klass == "infiniband":
                    self.skip(entry, "no device link")
                continue  # lo, bonds, bridges: interfaces without a PCI function
            real = self.resolve(link, entry)
            if real is None:
                continue
            if not _BDF.match(os.path.basename(real)):
                continue  # a virtual or non-PCI parent (a USB NIC): not part of the PCIe matrix
            bdf = self.add(real, entry)
            if bdf is not None:
                out[name] = bdf
        return out


def read_topology(host: HostPaths, *, max_devices: int = MAX_PCI_DEVICES) -> Topology:
    """The PCIe tree, GPUs, NVSwitches and NICs under ``host``'s root. Never raises for what it reads:
    what it refused or could not parse is in ``skipped`` / ``bad_values``."""
    reader = _Reader(os.path.realpath(str(host.root)), max_devices)
    reader.scan_pci(str(host.path("/sys/bus/pci/devices")))
    hcas = reader.scan_class("infiniband", str(host.path("/sys/class/infiniband")))
    nets = reader.scan_class("net", str(host.path("/sys/class/net")))
    topo = reader.topo
    topo.netdevs = dict(sorted(nets.items()))
    by_bdf: dict[str, list[str]] = {}
    for ifname, bdf in topo.netdevs.items():
        by_bdf.setdefault(bdf, []).append(ifname)
    topo.nics = sorted((Nic(name, bdf, tuple(by_bdf.get(bdf, ()))) for name, bdf in hcas.items()),
                       key=lambda n: natural_key(n.name))
    return topo


# -- distances -------------------------------------------------------------------------------------

def _usp_positions(chain: Sequence[str]) -> Iterator[int]:
    """Chain indexes that are switch upstream ports. chain[0] hangs off the host bridge (a root port
    when it has children); below it PCIe alternates upstream port (a switch's top) and downstream port."""
    return (i for i in range(1, len(chain) - 1) if i % 2 == 1)


def pcie_distance(topo: Topology, a: str, b: str) -> Distance:
    """nvidia-smi's PCIe distance between two PCI functions (bus ids)."""
    if a == b:
        return "X"
    na, nb = topo.nodes[a], topo.nodes[b]
    if na.host_bridge != nb.host_bridge:
        # NVML's NODE needs one NUMA node; where the kernel knows none nvidia-smi prints SYS (vllm#11122)
        if na.numa_node is not None and na.numa_node == nb.numa_node:
            return "NODE"
        return "SYS"
    k = 0
    for x, y in zip(na.chain, nb.chain, strict=False):
        if x != y:
            break
        k += 1
    if k == 0:
        return "PHB"  # different root ports (or root-complex endpoints) of one host bridge
    common = k - 1
    switches: set[str] = set()
    if common % 2 == 1 and common >= 1:
        switches.add(na.chain[common])  # across two downstream ports of the switch whose top is common
    for chain in (na.chain, nb.chain):
        switches.update(chain[i] for i in _usp_positions(chain) if i > common)
    return "PIX" if len(switches) <= 1 else "PXB"


def _is_switch(topo: Topology, remote: str, switch_remotes: frozenset[str] | set[str]) -> bool:
    """An NVLink's far end is an NVSwitch when the tree says so, NVML typed it so, or it is no GPU of
    this tree (NCCL's rule in xml.cc: a remote not visible here is assumed to be an NVSwitch)."""
    node = topo.nodes.get(remote)
    if remote in switch_remotes or (node is not None and node.kind == "nvswitch"):
        return True
    return remote != "unknown" and (node is None or node.kind != "gpu")


def nvlink_count(topo: Topology, nvlinks: Mapping[str, Sequence[str]], a: str, b: str,
                 switch_remotes: frozenset[str] | set[str] = frozenset()) -> int:
    """Active NVLinks joining GPUs ``a`` and ``b``: direct links (the fewer that either side reports)
    plus, through NVSwitches, the smaller of the two GPUs' switch links (every switch link carries
    traffic to every peer; nvidia-smi prints NV18 for each pair of an HGX H100)."""
    ra, rb = nvlinks.get(a), nvlinks.get(b)
    if ra is None or rb is None or a == b:
        return 0
    direct = min(sum(1 for r in ra if r == b), sum(1 for r in rb if r == a))
    sw_a = sum(1 for r in ra if r != b and _is_switch(topo, r, switch_remotes))
    sw_b = sum(1 for r in rb if r != a and _is_switch(topo, r, switch_remotes))
    return direct + (min(sw_a, sw_b) if sw_a and sw_b else 0)


def distance(topo: Topology, a: str, b: str, nvlinks: Mapping[str, Sequence[str]] | None = None,
             switch_remotes: frozenset[str] | set[str] = frozenset()) -> Distance:
    """nvidia-smi's word for the connection between two devices (GPU<i>, NIC<j>, mlx5_0, a bus id)."""
    ba, bb = topo.resolve(a), topo.resolve(b)
    if ba == bb:
        return "X"
    if nvlinks is not None and topo.nodes[ba].kind == "gpu" and topo.nodes[bb].kind == "gpu":
        n = nvlink_count(topo, nvlinks, ba, bb, switch_remotes)
        if n:
            return f"NV{n}"
    return pcie_distance(topo, ba, bb)


def rank(d: Distance) -> int:
    """Closeness order: X 0, NV# 1, PIX 2 ... SYS 6 (higher is farther)."""
    if d == "X":
        return 0
    if d.startswith("NV"):
        return 1
    return 2 + PCIE_LADDER.index(d)


def nic_distance(topo: Topology, gpu: str, nic: str) -> Distance:
    return distance(topo, gpu, nic)


def nearest_nics(topo: Topology, gpu: str) -> list[str]:
    """RDMA devices at the GPU's smallest PCIe distance (mlx5_0, mlx5_1 ... in legend order)."""
    g = topo.resolve(gpu)
    if not topo.nics:
        return []
    dists = [(rank(pcie_distance(topo, g, n.bdf)), n.name) for n in topo.nics]
    best = min(r for r, _ in dists)
    return [name for r, name in dists if r == best]


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


# -- NCCL's view: its path ladder, its own PCI tree, NCCL_NET_GDR_LEVEL --------------------------------

# NCCL path types up to PATH_SYS per version (src/graph/topo.h, or src/include/graph.h since 2.24):
# the names ncclGetLevel (src/graph/paths.cc) accepts in NCCL_NET_GDR_LEVEL, in ladder order.
_LADDERS: tuple[tuple[tuple[int, int, int], tuple[str, ...]], ...] = (
    ((2, 6, 0), ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")),
    ((2, 8, 0), ("LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS")),
    ((2, 12, 0), ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")),
    ((2, 26, 0), ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS")),
    ((2, 27, 0), ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS")),
    ((2, 27, 5), ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")),
)
# NCCL 2.4-2.5: enum ncclPathDist in src/include/topo.h / graph.h, compared with ">=" (exclusive)
OLD_LADDER: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")
OLD_DEFAULT = 2  # NCCL_PARAM(NetGdrLevel, "NET_GDR_LEVEL", PATH_PHB)
LEVELS_OLD_TO_NEW = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # paths.cc levelsOldToNew[], 2.6-2.30
LATEST_NCCL = (2, 30, 7)
_LONG_MAX = (1 << 63) - 1


def parse_nccl_version(text: str | None) -> tuple[int, int, int] | None:
    """'2.21.5', '2.21.5+cuda12.4', 'NCCL version 2.21.5+cuda12.4' -> (2, 21, 5); None otherwise."""
    m = re.search(r"(?<![0-9])([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})(?![0-9])", (text or "")[:200])
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def nccl_ladder(version: tuple[int, int, int] | None) -> tuple[str, ...]:
    """NCCL's path types LOC..SYS at ``version`` (None: the newest known), or the 2.4-2.5 ladder."""
    v = version or LATEST_NCCL
    if v < (2, 6, 0):
        return OLD_LADDER
    return [names for since, names in _LADDERS if v >= since][-1]


def nccl_default_gdr_level(version: tuple[int, int, int] | None) -> str:
    """PATH_PXB from 2.6; PATH_P2C from 2.29 (NCCL_NET_GDR_C2C defaults to 1 since 2.27.3); 2.4-2.5: below PHB."""
    v = version or LATEST_NCCL
    if v < (2, 6, 0):
        return "PXB"
    return "P2C" if v >= (2, 29, 0) else "PXB"


_DIGITS = "0123456789"


def _c_strtol_magnitude(s: str) -> int:
    """The number strtol(s, NULL, 0) reads from a string that starts with an ASCII digit: 0x hex, a leading
    0 octal, else decimal, up to the first character that does not fit. Huge inputs give 2**64 (beyond any
    C long) rather than a Python int of any size."""
    if m := re.match(r"0[xX]([0-9a-fA-F]+)", s):
        digits, base = m.group(1), 16
    elif s.startswith("0"):
        digits, base = re.match(r"0([0-7]*)", s).group(1) or "0", 8  # type: ignore[union-attr]
    else:
        digits, base = re.match(r"[0-9]+", s).group(0), 10  # type: ignore[union-attr]
    digits = digits.lstrip("0") or "0"
    if len(digits) > 24:
        return 1 << 64
    return min(int(digits, base), 1 << 64)


def _c_strtoll(s: str) -> tuple[int, bool]:
    """strtoll(s, NULL, 0) as NCCL 2.4-2.5's NCCL_PARAM calls it: (value, ERANGE). Leading blanks and a
    sign are skipped; no digits at all is 0 with errno untouched (glibc), so any word reads as 0."""
    t = s.lstrip(" \t\n\v\f\r")
    negative = t[:1] == "-"
    if t[:1] in ("+", "-"):
        t = t[1:]
    if not t[:1] or t[0] not in _DIGITS:
        return 0, False
    mag = _c_strtol_magnitude(t)
    if negative:
        return (-(1 << 63), True) if mag > (1 << 63) else (-mag, False)
    return (_LONG_MAX, True) if mag > _LONG_MAX else (mag, False)


@dataclass(frozen=True)
class GdrLevel:
    """How NCCL reads one NCCL_NET_GDR_LEVEL value."""

    value: str
    form: Literal["name", "integer", "ignored", "unread"]
    effective: str | None  # the NCCL path type it stands for (the default when ignored); None: undefined
    note: str = ""


def parse_gdr_level(value: str, version: tuple[int, int, int] | None) -> GdrLevel:
    """NCCL_NET_GDR_LEVEL as ncclGetLevel (paths.cc, 2.6-2.30) or NCCL_PARAM (param.h, 2.4-2.5) reads it."""
    v = version or LATEST_NCCL
    value = value[:4096]
    if v < (2, 4, 0):
        return GdrLevel(value, "unread", None, "NCCL before 2.4 reads NCCL_IB_GDR_LEVEL, not NCCL_NET_GDR_LEVEL")
    if v < (2, 6, 0):
        if not value:
            return GdrLevel(value, "ignored", OLD_LADDER[OLD_DEFAULT - 1], "empty: the default applies")
        n, over = _c_strtoll(value)
        if over:
            return GdrLevel(value, "ignored", OLD_LADDER[OLD_DEFAULT - 1],
                            "out of range: NCCL logs 'Invalid value' and keeps its default")
        if n <= 0:
            return GdrLevel(value, "integer", "NONE", f"parsed as the integer {n}: no distance is below it")
        if n > len(OLD_LADDER):
            return GdrLevel(value, "integer", "SYS", f"parsed as the integer {n}")
        return GdrLevel(value, "integer", OLD_LADDER[n - 1], f"parsed as the integer {n}")
    names = nccl_ladder(v)
    if value in names:  # strcmp: exact and case-sensitive
        return GdrLevel(value, "name", value)
    if value[:1] and value[0] in _DIGITS:  # `str[0] >= '0' && str[0] <= '9'`
        n = min(_c_strtol_magnitude(value), _LONG_MAX)
        as_int = ((n + (1 << 31)) % (1 << 32)) - (1 << 31)  # `int oldLevel = strtol(...)`
        if as_int < 0:
            return GdrLevel(value, "integer", None, f"strtol gives {n}, which NCCL stores in an int as {as_int} "
                                                    f"and then reads levelsOldToNew[{as_int}]: undefined")
        return GdrLevel(value, "integer", LEVELS_OLD_TO_NEW[min(as_int, len(LEVELS_OLD_TO_NEW) - 1)],
                        f"the legacy integer {as_int} maps to {LEVELS_OLD_TO_NEW[min(as_int, 5)]} "
                        f"(levelsOldToNew)")
    return GdrLevel(value, "ignored", nccl_default_gdr_level(v),
                    f"not one of {', '.join(names)} (case-sensitive) and not a number: NCCL ignores it")


def _nccl_distance(distance_name: str, version: tuple[int, int, int] | None) -> str:
    """A GPU-NIC distance in nvidia-smi's or NCCL's words, as a path type of that NCCL version."""
    d = distance_name.strip().upper()
    ladder = nccl_ladder(version)
    if ladder is OLD_LADDER:
        if d not in OLD_LADDER:
            raise ValueError(f"not a GPU-NIC distance for NCCL 2.4-2.5: {distance_name!r}")
        return d
    d = "PHB" if d == "NODE" else d  # 2.6+ joins a NUMA node's host bridges into one CPU node: no NODE
    if d not in ladder:
        raise ValueError(f"not a GPU-NIC distance: {distance_name!r}")
    return d


def gdr_enabled(level: str | None, nccl_dist: str, version: tuple[int, int, int] | None) -> bool:
    """Whether NCCL keeps GPUDirect RDMA at that distance (paths.cc `distance > netGdrLevel` disables it;
    2.4-2.5's net.cc `distance >= netGdrLevel`, with levels meaning "below this")."""
    ladder = nccl_ladder(version)
    if level is None or level == "NONE" or level not in ladder:
        return False
    return ladder.index(nccl_dist) <= ladder.index(level)


@dataclass(frozen=True)
class Finding:
    type: str
    severity: Severity
    reason: str
    message: str
    entity: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    suggested_action: SuggestedAction = "none"


# (type, reason) -> (severity, suggested action): one table, docs/topology.md prints the same (a test compares).
# `cordon` only where the node cannot run new GPU work and the evidence is unambiguous (NVML says the fabric
# is not registered); a host set-up step that NVML cannot confirm is `fix_config`; hardware `inspect_hardware`.
FINDING_POLICY: dict[tuple[str, str], tuple[Severity, SuggestedAction]] = {
    ("PCIeLinkDegraded", "WidthBelowMax"): ("warning", "inspect_hardware"),
    ("PCIeLinkDegraded", "SpeedBelowMaxUnderLoad"): ("warning", "inspect_hardware"),
    ("NVLinkDegraded", "FewerNVLinksThanExpected"): ("warning", "inspect_hardware"),
    ("NVLinkDegraded", "NoNVLinkLeft"): ("critical", "inspect_hardware"),
    ("FabricManagerNotRunning", "GPUsNotRegistered"): ("critical", "cordon"),
    ("FabricManagerNotRunning", "NoProcess"): ("critical", "fix_config"),
    ("FabricManagerNotRunning", "FabricRegistered"): ("warning", "none"),
    ("GPUFabricNotReady", "NotStarted"): ("critical", "cordon"),
    ("GPUFabricNotReady", "InProgress"): ("critical", "cordon"),
    ("GPUFabricNotReady", "UnknownState"): ("critical", "cordon"),
    ("GPUFabricNotReady", "CompletedWithError"): ("critical", "cordon"),
    ("NCCLGDRLevel", "GDRDisabledByLevel"): ("warning", "fix_config"),
    ("NCCLGDRLevel", "InvalidLevel"): ("warning", "fix_config"),
    ("NCCLGDRLevel", "IntegerLevel"): ("warning", "fix_config"),
    ("NCCLGDRLevel", "NotReadByThisVersion"): ("info", "fix_config"),
}


def finding(type_: str, reason: str, message: str, *, entity: str = "",
            details: Mapping[str, Any] | None = None) -> Finding:
    severity, action = FINDING_POLICY[(type_, reason)]
    return Finding(type_, severity, reason, message, entity, dict(details or {}), action)


def gdr_level_finding(level: str, gpu_nic_distance: str, nccl_version: str | None) -> Finding | None:
    """What NCCL_NET_GDR_LEVEL=``level`` does to GPUDirect RDMA between a GPU and a NIC at
    ``gpu_nic_distance`` (nvidia-smi's PIX/PXB/PHB/NODE/SYS or an NCCL path type) under that NCCL.

    A finding when NCCL ignores the value, when it is a legacy integer (its meaning changed at 2.6, and the
    numbers NCCL logs in "distance %d" are path types that moved with every ladder change), or when the
    level is tighter than the distance: then NCCL silently stages the NIC's traffic through host memory.
    ValueError for a distance that is no GPU-NIC distance."""
    version = parse_nccl_version(nccl_version)
    shown = ".".join(map(str, version)) if version else "(version unknown: read as the newest)"
    dist = _nccl_distance(gpu_nic_distance, version)
    parsed = parse_gdr_level(level, version)
    details: dict[str, Any] = {"value": level[:200], "nccl_version": nccl_version, "parsed_as": parsed.form,
                               "effective_level": parsed.effective, "gpu_nic_distance": gpu_nic_distance,
                               "nccl_distance": dist, "note": parsed.note}
    if parsed.form == "unread":
        return finding("NCCLGDRLevel", "NotReadByThisVersion",
                       f"NCCL {shown} does not read NCCL_NET_GDR_LEVEL ({parsed.note}).", details=details)
    on = gdr_enabled(parsed.effective, dist, version)
    details["gdr"] = on
    old = nccl_ladder(version) is OLD_LADDER
    if parsed.form == "ignored":
        return finding("NCCLGDRLevel", "InvalidLevel",
                       f"NCCL {shown} ignores NCCL_NET_GDR_LEVEL={level[:60]!r} ({parsed.note}) and uses its "
                       f"default {parsed.effective}: GPUDirect RDMA at {gpu_nic_distance} is "
                       f"{'on' if on else 'off'}.", details=details)
    if not on:
        how = (f"NCCL {shown} reads it as the integer {parsed.note.rsplit(' ', 1)[-1]}" if old
               else f"NCCL {shown} reads it as {parsed.effective or 'undefined'}"
               + (f" ({parsed.note})" if parsed.form == "integer" else ""))
        return finding("NCCLGDRLevel", "GDRDisabledByLevel",
                       f"NCCL_NET_GDR_LEVEL={level[:60]} is tighter than the GPU-NIC distance {gpu_nic_distance}: "
                       f"{how}, so GPUDirect RDMA is off for this GPU and NIC and traffic is staged through host "
                       f"memory (only an INFO line says so).", details=details)
    if parsed.form == "integer" and not old:
        return finding("NCCLGDRLevel", "IntegerLevel",
                       f"NCCL_NET_GDR_LEVEL={level[:60]} is a legacy integer ({parsed.note}); the integers NCCL "
                       f"logs as 'distance %d' are path types that moved with each release, so write the name "
                       f"({', '.join(p for p in PCIE_LADDER if p != 'NODE')}).", details=details)
    return None


def _bcm_gen(node: PciNode, level: int) -> int:
    """NCCL's getBcmGen (topo.cc): Broadcom PEX Gen4/Gen5 switches that present two levels of one chip."""
    if None in (node.vendor, node.device, node.subsystem_vendor, node.subsystem_device):
        return 0
    pid = (node.vendor << 48) | (node.device << 32) | (node.subsystem_vendor << 16) | node.subsystem_device  # type: ignore[operator]
    if pid & ~0xFFF == 0x1000C0101000A000:
        return 4
    if pid & ~0xFFF == 0x1000C03010000000 | (level * 0x1000):
        return 5
    return 0


def _nccl_parents(topo: Topology, bdf: str) -> tuple[list[str], str]:
    """NCCL's PCI switch nodes above ``bdf`` (nearest first) and its CPU node (the NUMA id, '-1' unknown).
    xml.cc ncclTopoGetXmlFromSys rewinds two path components per step, so a switch is its upstream port
    and root ports vanish into the CPU; topo.cc then folds Broadcom's second switch level into the first."""
    chain = topo.nodes[bdf].chain
    parents = [chain[i] for i in range(len(chain) - 3, -1, -2)]
    flat: list[str] = []
    for i, p in enumerate(parents):
        above = topo.nodes[parents[i + 1]] if i + 1 < len(parents) else None
        gen = _bcm_gen(above, 0) if above is not None else 0
        if gen and _bcm_gen(topo.nodes[p], 1) == gen:
            continue
        flat.append(p)
    top = topo.nodes[parents[-1] if parents else bdf]
    return flat, str(top.numa_node if top.numa_node is not None else -1)


def nccl_path(topo: Topology, a: str, b: str) -> str:
    """The path type NCCL (2.6+) computes between two devices of this tree: LOC, PIX, PXB, PHB or SYS."""
    ba, bb = topo.resolve(a), topo.resolve(b)
    if ba == bb:
        return "LOC"
    pa, ca = _nccl_parents(topo, ba)
    pb, cb = _nccl_parents(topo, bb)
    if pa and pb and pa[0] == pb[0]:
        return "PIX"
    if set(pa) & set(pb):
        return "PXB"
    return "PHB" if ca == cb else "SYS"


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
                remote = normalize_bus_id(pci.busId)
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
            bus = normalize_bus_id(pci.busId)
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
    view.gpus = sorted(handles, key=lambda b: bdf_key(b) if _BDF.match(b) else (0, 0, 0, 0))
    return view


# -- Fabric Manager ------------------------------------------------------------------------------

FM_COMMS = ("nv-fabricmanage", "nv-fabricmanager")  # comm keeps 15 characters (TASK_COMM_LEN 16)


@dataclass(frozen=True)
class ProcScan:
    visible: bool  # at least one /proc/<pid>/comm could be read: the host's processes are in view
    fm_pids: tuple[int, ...] = ()


def scan_fabric_manager(host: HostPaths, max_processes: int = 65536) -> ProcScan:
    proc = str(host.path("/proc"))
    names, _ = _bounded_listdir(proc, max_processes)
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
        details: dict[str, Any] = {"gpu": f"GPU{i}", "current_speed_gts": node.cur_speed, "expected_speed_gts": speed,
                                   "current_width": node.cur_width, "expected_width": width,
                                   "max_speed_gts": node.max_speed, "max_width": node.max_width}
        busy = utilization.get(g) if utilization is not None else None
        details["utilization_pct"] = busy
        if width is not None and node.cur_width is not None and node.cur_width < width:
            out.append(finding("PCIeLinkDegraded", "WidthBelowMax",
                               f"GPU{i} ({g}) PCIe link trained at x{node.cur_width}, below the x{width} both ends "
                               f"support: its host-device bandwidth is cut to {node.cur_width}/{width}.",
                               entity=f"gpu:{g}", details=details))
        elif (busy is not None and busy >= busy_pct and speed is not None and node.cur_speed is not None
              and node.cur_speed < speed):
            out.append(finding("PCIeLinkDegraded", "SpeedBelowMaxUnderLoad",
                               f"GPU{i} ({g}) PCIe link runs at {node.cur_speed:g} GT/s while {busy}% busy, below "
                               f"the {speed:g} GT/s both ends support.", entity=f"gpu:{g}", details=details))
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
            up = sum(1 for r in view.nvlinks.get(g, []) if _is_switch(topo, r, view.switch_remotes))
            if up >= want:
                continue
            pairs = {topo.label(p): f"NV{nvlink_count(topo, view.nvlinks, g, p, view.switch_remotes)}"
                     for p in known if p != g}
            out.append(finding(
                "NVLinkDegraded", "NoNVLinkLeft" if up == 0 else "FewerNVLinksThanExpected",
                f"{topo.label(g)} ({g}) has {up} of {want} NVLinks to the NVSwitches up: its GPU pairs run at "
                f"NV{up} instead of NV{want}" + (" (no NVLink at all: peer traffic falls back to PCIe)" if up == 0
                                                 else "") + ".",
                entity=f"gpu:{g}", details={"gpu": topo.label(g), "links_up": up, "expected": want,
                                            "links_known": view.link_total[g], "pairs": pairs, "nvswitch": True}))
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
                entity=f"nvlink:{a}-{b}", details={"gpus": [topo.label(a), topo.label(b)], "now": now,
                                                   "expected": want, "most_seen_since_boot": best,
                                                   "nvswitch": False}))
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
                entity=f"gpu:{g}", details={"state": what, "status": status}))
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
            details={"nvswitches": topo.nvswitches, "gpus_not_registered": not_ready, "nvml": nvml_ok}))
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
    out = "\n".join(lines) + "\n\nLegend:\n\n"
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
        notes.append(f"{len(topo.skipped)} sysfs entries refused or unreadable (listed under 'skipped' in JSON)")
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
                self.emit.not_seen(f"NVML {call.split(':')[0]}", f"{call}: skipped {n} times")
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
