"""What the PCI bus, /proc/driver/nvidia and /dev say about the node's GPUs, in one pass.

Shared by the gpu_devices collector (reconciliation) and kernel_modules (a module verdict depends on
whether the node has GPUs at all).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from collectors.formats.pcie_tree import read_attr
from gna_sdk import HostPaths

GPU_CLASSES = ("0x0300", "0x0302")
_DEV_NODE = re.compile(r"^nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
READ_LIMIT = 4096  # /proc/driver/nvidia/gpus/<bus id>/information is a few hundred bytes


@dataclass(frozen=True)
class Inventory:
    pci: dict[str, int | None]  # bus id -> minor (from /proc/driver/nvidia) or None
    dev_minors: frozenset[int]
    control: dict[str, bool]


def _read(directory: str, name: str) -> str | None:
    text = read_attr(directory, name, READ_LIMIT)
    return text.strip() if text is not None else None


class PciGpus:
    """Which PCI functions are NVIDIA GPUs, remembered per directory entry (name and inode) of
    ``/sys/bus/pci/devices``: a function's ``vendor`` and ``class`` files print fields of its ``struct pci_dev``
    (drivers/pci/pci-sysfs.c ``pci_config_attr``, not a read of config space), filled when the kernel
    enumerated it, so they do not change while it exists; a function removed and
    found again (a rescan, a GPU back on the bus) is a new sysfs link with a new inode, read afresh. The
    listing itself is read every pass (the ``d_ino`` comes with it), so a pass reads attributes only of
    functions it has not seen; an unreadable attribute is not remembered. Entries not listed any more
    are forgotten (bounded by the bus)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, bool]] = {}  # name -> (d_ino, is an NVIDIA display/3D controller)

    def gpus(self, base: str) -> list[str]:
        try:
            with os.scandir(base) as it:
                entries = sorted((e.name, e.inode()) for e in it)
        except OSError:
            entries = []
        known: dict[str, tuple[int, bool]] = {}
        out = []
        for name, ino in entries:
            seen = self._known.get(name)
            if seen is not None and seen[0] == ino:
                known[name] = seen
            else:
                vendor = _read(f"{base}/{name}", "vendor")
                klass = _read(f"{base}/{name}", "class") if vendor == "0x10de" else ""
                if vendor is None or klass is None:
                    continue  # unreadable now: not a GPU this pass, read again next pass
                known[name] = (ino, klass.startswith(GPU_CLASSES))
            if known[name][1]:
                out.append(name)
        self._known = known
        return out


def scan(host: HostPaths, pci_gpus: PciGpus | None = None) -> Inventory:
    """The GPUs on the PCI bus (``pci_gpus`` remembers which functions are GPUs between passes: a caller that
    scans repeatedly keeps one; without it every function's vendor is read), each one's minor from
    /proc/driver/nvidia, the /dev nodes. Attributes are read with pcie_tree's reader and string paths
    (pathlib objects and buffered files cost more than the reads)."""
    pci: dict[str, int | None] = {}
    base = str(host.path("/sys/bus/pci/devices"))
    for name in (pci_gpus or PciGpus()).gpus(base):
        info = _read(str(host.path(f"/proc/driver/nvidia/gpus/{name}")), "information") or ""
        m = _MINOR.search(info)
        pci[name] = int(m.group(1)) if m else None
    minors: set[int] = set()
    try:
        for node in os.listdir(host.path("/dev")):
            if m := _DEV_NODE.fullmatch(node):
                minors.add(int(m.group(1)))
    except OSError:
        pass
    control = {name: host.path(f"/dev/{name}").exists() for name in ("nvidiactl", "nvidia-uvm")}
    return Inventory(pci=pci, dev_minors=frozenset(minors), control=control)
