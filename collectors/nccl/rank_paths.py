"""NCCL's view of the node's PCIe tree: its path ladder per release, the path it computes between a GPU and a
NIC, how it reads NCCL_NET_GDR_LEVEL, and the checks that hold a rank's GPU and NICs against the tree
(NCCLFarNIC, NCCLGDRLevel). Pure functions shared by the topology collector and the NCCL collectors
(collectors/nccl/plugin.py, collectors/nccl_env.py); the tree itself is collectors/formats/pcie_tree.py.

Sources, read with ``git show <tag>:<path>`` on the NVIDIA/nccl mirror (docs/topology.md has the tables):
``src/graph/topo.h`` / ``src/include/graph.h`` (the ladder), ``src/graph/paths.cc`` (``ncclGetLevel``,
``ncclTopoCheckGdr``), ``src/graph/xml.cc`` / ``topo.cc`` (NCCL's own tree), ``src/graph/search.cc`` (which NIC a
channel gets), ``src/transport/net.cc`` (the channel lines) and ``src/transport/net_ib.cc`` (which devices
NCCL lists, ``NCCL_IB_HCA``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from collectors.formats.pcie_tree import PCIE_LADDER, Finding, PciNode, Topology, pcie_distance, rank
from gna_types.policy import verdict

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



# -- findings --------------------------------------------------------------------------------------------

def _finding(type_: str, reason: str, message: str, *, entity: str = "",
             details: Mapping[str, Any] | None = None) -> Finding:
    v = verdict(type_, reason)  # gna_types/policy.py NCCL_PATH_FINDINGS
    return Finding(type_, v.severity, reason, message, entity, dict(details or {}), v.action)


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
        return _finding("NCCLGDRLevel", "NotReadByThisVersion",
                       f"NCCL {shown} does not read NCCL_NET_GDR_LEVEL ({parsed.note}).", details=details)
    on = gdr_enabled(parsed.effective, dist, version)
    details["gdr"] = on
    old = nccl_ladder(version) is OLD_LADDER
    if parsed.form == "ignored":
        return _finding("NCCLGDRLevel", "InvalidLevel",
                       f"NCCL {shown} ignores NCCL_NET_GDR_LEVEL={level[:60]!r} ({parsed.note}) and uses its "
                       f"default {parsed.effective}: GPUDirect RDMA at {gpu_nic_distance} is "
                       f"{'on' if on else 'off'}.", details=details)
    if not on:
        how = (f"NCCL {shown} reads it as the integer {parsed.note.rsplit(' ', 1)[-1]}" if old
               else f"NCCL {shown} reads it as {parsed.effective or 'undefined'}"
               + (f" ({parsed.note})" if parsed.form == "integer" else ""))
        return _finding("NCCLGDRLevel", "GDRDisabledByLevel",
                       f"NCCL_NET_GDR_LEVEL={level[:60]} is tighter than the GPU-NIC distance {gpu_nic_distance}: "
                       f"{how}, so GPUDirect RDMA is off for this GPU and NIC and traffic is staged through host "
                       f"memory (only an INFO line says so).", details=details)
    if parsed.form == "integer" and not old:
        return _finding("NCCLGDRLevel", "IntegerLevel",
                       f"NCCL_NET_GDR_LEVEL={level[:60]} is a legacy integer ({parsed.note}); the integers NCCL "
                       f"logs as 'distance %d' are path types that moved with each release, so write the name "
                       f"({', '.join(p for p in PCIE_LADDER if p != 'NODE')}).", details=details)
    return None




def nccl_gpu_nic_distance(topo: Topology, gpu: str, nic: str, version: tuple[int, int, int] | None) -> str:
    """The GPU-NIC distance that NCCL compares with NCCL_NET_GDR_LEVEL: its own path type from 2.6 (nccl_path:
    a Broadcom two-level switch is one PIX hop, a NUMA node's host bridges are one CPU), nvidia-smi's word for
    2.4-2.5 (whose ladder PIX PXB PHB NODE SYS is nvidia-smi's)."""
    if version is not None and version < (2, 6, 0):
        return pcie_distance(topo, topo.resolve(gpu), topo.resolve(nic))
    return nccl_path(topo, gpu, nic)


def rank_gdr_finding(topo: Topology, gpu: str, nics: Sequence[str], level: str,
                     nccl_version: str | None) -> Finding | None:
    """gdr_level_finding for a rank's GPU and each NIC it uses (NCCL checks every pair: paths.cc
    ncclTopoCheckGdr): the first pair whose GPUDirect RDMA the value leaves off, else the first finding."""
    version = parse_nccl_version(nccl_version)
    found: list[Finding] = []
    for nic in nics:
        f = gdr_level_finding(level, nccl_gpu_nic_distance(topo, gpu, nic, version), nccl_version)
        if f is not None:
            found.append(Finding(f.type, f.severity, f.reason, f"{topo.label(gpu)} ({gpu}) and {nic}: {f.message}",
                                 f.entity,
                                 {**f.details, "gpu": gpu, "gpu_label": topo.label(gpu), "nic": nic},
                                 f.suggested_action))
    off = [f for f in found if f.details.get("gdr") is False]
    return (off or found)[0] if found else None


# -- NCCL_IB_HCA as NCCL applies it ---------------------------------------------------------------------

def _atoi(text: str) -> int:
    """C atoi: leading blanks, a sign, digits up to the first other character; 0 without digits."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]{1,18})", text)
    return int(m.group(1)) if m else 0


def hca_filter_selects(value: str | None, name: str, port: int = -1,
                       version: tuple[int, int, int] | None = None) -> bool:
    """Whether NCCL_IB_HCA=``value`` lets NCCL list RDMA device ``name`` (port ``port``; -1: any port).

    src/transport/net_ib.cc ncclIbInit with src/misc/utils.cc parseStringList/matchIfList (v2.21.5-1): a
    leading '^' excludes what follows, then a leading '=' compares names exactly, else each entry is a prefix
    (mlx5_1 also selects mlx5_10); ':<port>' (atoi) restricts the port; at most MAX_IB_DEVS entries (16 before
    2.19, 32 since) are read; no value, or a value with no entry, selects every device."""
    if value is None:
        return True
    text = value[:4096]
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    cap = 16 if (version or (2, 30, 7)) < (2, 19, 0) else 32
    entries: list[tuple[str, int]] = []
    for item in text.split(","):
        prefix, sep, rest = item.partition(":")
        if prefix:
            entries.append((prefix, _atoi(rest) if sep else -1))
        if len(entries) == cap:
            break
    if not entries:
        return True  # matchIfList: "no user list is defined"
    hit = any((name == p if exact else name.startswith(p)) and (port == -1 or q == -1 or port == q)
              for p, q in entries)
    return hit != exclude


# -- a rank on a far NIC ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Unjudged:
    """Why a check could not be made (said under `not seen`, never read as healthy)."""

    why: str


NicState = Literal["listed by NCCL", "port down", "not listed by NCCL"]


def nearest_nic_names(topo: Topology, gpu: str, exclude: Collection[str] = ()) -> list[str]:
    """The RDMA devices at the GPU's smallest PCIe distance, leaving out ``exclude`` (storage NICs)."""
    dist = {n.name: rank(pcie_distance(topo, gpu, n.bdf)) for n in topo.nics if n.name not in exclude}
    best = min(dist.values(), default=None)
    return [name for name, r in dist.items() if r == best]


def far_nic_finding(topo: Topology, gpu: str, used: Sequence[str], *, listed: Collection[str],
                    active: Collection[str], hca_filter: str | None = None, exclude: Collection[str] = (),
                    version: tuple[int, int, int] | None = None) -> Finding | Unjudged | None:
    """A rank whose own channels use a NIC farther from its GPU than the GPU's nearest NIC.

    ``gpu`` is the rank's PCI bus id, ``used`` the RDMA devices its non-PXN channel lines name (a PXN send,
    ``via NET/IB/<n>(<proxyRank>)``, leaves through another GPU's NIC over NVLink: net.cc sendSetup prints the
    proxy rank exactly then), ``listed`` what ``NET/IB : Using`` listed, ``active`` the devices with an ACTIVE
    port in sysfs, ``hca_filter`` the job's NCCL_IB_HCA, ``exclude`` storage NICs that never count as nearest.

    NCCL's own search starts every graph at typeInter = PATH_PIX and offers each GPU its local NICs first
    (search.cc ncclTopoSelectNets, ncclTopoCompute, v2.21.5-1), relaxing the path type only when nothing
    fits; and it lists only ACTIVE ports that NCCL_IB_HCA selects (net_ib.cc ncclIbInit). So a far NIC means
    the near one was down (NearestNICDown), hidden by NCCL_IB_HCA or the job's container
    (NearestNICNotSelected), or listed yet passed over by the search (NearestNICUnused: NCCL_TOPO_FILE,
    NCCL_CROSS_NIC and the like steer it)."""
    if not topo.pci_bus_readable:
        return Unjudged("/sys/bus/pci/devices is missing under the host root")
    node = topo.nodes.get(gpu)
    if node is None or node.kind != "gpu":
        return Unjudged(f"GPU {gpu} is not on this node's PCI bus")
    by_name = {n.name: n for n in topo.nics}
    candidates = [n for n in topo.nics if n.name not in exclude]
    if not candidates:
        return Unjudged("no RDMA device of /sys/class/infiniband links into the PCI tree")
    missing = [u for u in used if u not in by_name]
    if missing:
        return Unjudged(f"{', '.join(missing[:4])} (named by NCCL) is no RDMA device of this node's PCI tree")
    dist = {n.name: pcie_distance(topo, gpu, n.bdf) for n in topo.nics}
    nearest = nearest_nic_names(topo, gpu, exclude)
    best = rank(dist[nearest[0]])
    far = sorted({u for u in used if rank(dist[u]) > best}, key=lambda u: (-rank(dist[u]), u))
    if not far:
        return None

    def state(name: str) -> NicState:
        if name in listed:
            return "listed by NCCL"
        return "port down" if name not in active else "not listed by NCCL"

    states = {n: state(n) for n in nearest}
    # a down NIC counts as the cause only where the job's NCCL_IB_HCA would have taken it
    down = [n for n, s in states.items() if s == "port down" and hca_filter_selects(hca_filter, n, version=version)]
    if any(s == "listed by NCCL" for s in states.values()):
        reason = "NearestNICUnused"
        why = (f"NCCL listed {', '.join(n for n, s in states.items() if s == 'listed by NCCL')} yet its search put "
               f"these channels on the farther NIC (NCCL_TOPO_FILE, NCCL_CROSS_NIC or a similar setting steers it)")
    elif down:
        reason = "NearestNICDown"
        why = (f"{', '.join(down)} {'has' if len(down) == 1 else 'have'} no ACTIVE port, so NCCL could not list "
               f"{'it' if len(down) == 1 else 'them'} and fell back to a farther NIC")
    else:
        reason = "NearestNICNotSelected"
        hidden = [n for n, s in states.items() if s != "listed by NCCL"]
        filtered = hca_filter is not None and not any(hca_filter_selects(hca_filter, n, version=version)
                                                      for n in hidden)
        cause = (f"excluded by NCCL_IB_HCA={hca_filter[:120]}" if filtered and hca_filter is not None
                 else "not visible to the job (NCCL_IB_HCA or its container)")
        one = len(hidden) == 1
        why = f"{', '.join(hidden)} {'is' if one else 'are'} {cause}, so NCCL never listed {'it' if one else 'them'}"
    worst = far[0]
    label = topo.label(gpu)
    message = (f"{label} ({gpu}) uses {worst} ({dist[worst]}) although {', '.join(nearest)} "
               f"{'is' if len(nearest) == 1 else 'are'} {dist[nearest[0]]} to it: {why}. Its inter-node traffic "
               f"crosses {'the CPU interconnect' if dist[worst] == 'SYS' else 'more of the PCIe tree'} and is "
               f"slower for it.")
    return _finding("NCCLFarNIC", reason, message, details={
        "gpu": gpu, "gpu_label": label, "used_nics": {u: dist[u] for u in sorted(set(used))},
        "far_nics": far, "used_distance": dist[worst], "nearest_nics": nearest,
        "nearest_distance": dist[nearest[0]], "nearest_state": states, "nccl_listed": sorted(listed)[:32],
        "nccl_ib_hca": hca_filter})
