"""The node's PCIe tree from sysfs and the distance between any two of its devices in ``nvidia-smi topo -m``'s
words: shared by the topology collector and the NCCL collectors (a collector plugin does not import another).

The tree is read, never guessed: ``/sys/bus/pci/devices/<bdf>`` is a symlink whose target spells the
route from the host bridge (``/sys/devices/pci0000:15/<root port>/<switch up>/<switch down>/<bdf>``).
Every path is resolved under the host root and a link that leaves it, loops or names another device
is refused and counted, never followed. Attribute files are read with O_NOFOLLOW|O_NONBLOCK, only
when they are regular files, and at most a few KiB (docs/topology.md has the sources: the kernel's
sysfs ABI, nvidia-smi's legend).

Distances (nvidia-smi's legend): X self; NV# a bonded set of # NVLinks; PIX at most one PCIe switch;
PXB several switches below one root port; PHB through a host bridge (same root complex); NODE across
host bridges of one NUMA node; SYS across the SMP interconnect (or a NUMA node the kernel does not
know, as nvidia-smi prints SYS there: vllm-project/vllm#11122). NCCL's own view of the same tree is
collectors/nccl/rank_paths.py.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gna_sdk import HostPaths, Severity, SuggestedAction
from gna_types.entities import normal_pci

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

BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_SPEED = re.compile(r"^([0-9]{1,3}(?:\.[0-9]{1,2})?) GT/s(?: PCIe)?$")
_HEX = re.compile(r"^0x([0-9a-fA-F]{1,8})$")
_INT = re.compile(r"^-?[0-9]{1,7}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")

Distance = str  # "X", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"
PCIE_LADDER: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")


# -- value parsers (sysfs ABI; each bounded, None for anything else) ------------------------------

def parse_hex(text: str | None, bits: int) -> int | None:
    """'0x10de' -> 0x10de; None unless a hex number that fits ``bits`` (vendor 16, class 24)."""
    m = _HEX.fullmatch((text or "").strip())
    if not m:
        return None
    value = int(m.group(1), 16)
    return value if value < (1 << bits) else None


def parse_numa(text: str | None) -> int | None:
    """numa_node: "%d", -1 when the firmware names no node (pci-sysfs.c numa_node_show); None for -1 and junk."""
    t = (text or "").strip()
    if not _INT.fullmatch(t):
        return None
    value = int(t)
    return value if 0 <= value <= 4095 else None


def parse_link_speed(text: str | None) -> float | None:
    """'32.0 GT/s PCIe' (pci_speed_string, kernel >= 5.7) or '8 GT/s' (older) -> GT/s; None for 'Unknown'."""
    m = _SPEED.fullmatch((text or "").strip())
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
        bdf = normal_pci(ref) if ":" in ref else ref
        if bdf in self.nodes:
            return bdf
        raise KeyError(ref)


# -- reading sysfs under a host root ----------------------------------------------------------------

def read_attr(directory: str | int, name: str, limit: int = ATTR_LIMIT) -> str | None:
    """A small attribute file as text, or None when absent, a symlink, not a regular file (a FIFO would
    block a plain open) or unreadable. Never more than ``limit`` bytes. ``directory``: a path, or a descriptor
    of the directory (the name opened relative to it)."""
    try:
        if isinstance(directory, int):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        else:
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


def kernel_realpath(path: str) -> str:
    """os.path.realpath(path, strict=True), resolved by the kernel: the path opened O_PATH and read back from
    /proc/self/fd (one open and one readlink, where Python's realpath lstats every component: ~70 links a
    topology pass). OSError as realpath's (ENOENT, ELOOP); Python's where /proc is not mounted."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path, strict=True)
    finally:
        os.close(fd)
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return os.path.realpath(path, strict=True)  # not a path the kernel could name now
    return real


def bounded_listdir(path: str, limit: int) -> tuple[list[str], bool]:
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
            real = kernel_realpath(link)
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
        hb = max((i for i, p in enumerate(parts) if _HOST_BRIDGE.fullmatch(p)), default=-1)
        if hb < 0:
            self.skip(entry, "not below a PCI host bridge (pci<domain>:<bus>)")
            return None
        chain = tuple(parts[hb + 1:])
        if not chain or len(chain) > MAX_CHAIN or not all(BDF.fullmatch(p) for p in chain):
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
        try:  # the attributes opened relative to it: the path is walked once, not once an attribute
            dir_fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            dir_fd = None
        try:
            return self._node(bdf, host_bridge, chain, dir_fd)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)

    def _node(self, bdf: str, host_bridge: str, chain: tuple[str, ...], dir_fd: int | None) -> PciNode:
        def value(name: str, parse: Callable[[str | None], Any], limit: int = ATTR_LIMIT) -> Any:
            raw = read_attr(dir_fd, name, limit) if dir_fd is not None else None
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
        names, more = bounded_listdir(devices, self.max_devices)
        if more:
            self.skip(devices, f"more than {self.max_devices} entries: the rest not read")
        for name in names:
            entry = f"/sys/bus/pci/devices/{name}"
            if not BDF.fullmatch(name):
                self.skip(entry, "not a PCI bus id")
                continue
            real = self.resolve(os.path.join(devices, name), entry)
            if real is not None:
                self.add(real, entry, expect=name)

    def scan_class(self, klass: str, directory: str) -> dict[str, str]:
        """name -> bdf for /sys/class/<klass>/<name>/device links into the PCI tree."""
        out: dict[str, str] = {}
        names, more = bounded_listdir(directory, MAX_CLASS_ENTRIES)
        if more:
            self.skip(directory, f"more than {MAX_CLASS_ENTRIES} entries: the rest not read")
        for name in names:
            entry = f"/sys/class/{klass}/{name}"
            if not _NAME.fullmatch(name):
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
            if not BDF.fullmatch(os.path.basename(real)):
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


def is_switch(topo: Topology, remote: str, switch_remotes: frozenset[str] | set[str]) -> bool:
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
    sw_a = sum(1 for r in ra if r != b and is_switch(topo, r, switch_remotes))
    sw_b = sum(1 for r in rb if r != a and is_switch(topo, r, switch_remotes))
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


# -- what a check concludes --------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    type: str
    severity: Severity
    reason: str
    message: str
    entity: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    suggested_action: SuggestedAction = "none"


