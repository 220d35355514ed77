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


def scan(host: HostPaths) -> Inventory:
    """Every pass reads the vendor of each PCI function (about 70 on an HGX node), the class of NVIDIA's, with
    pcie_tree's attribute reader and string paths (pathlib objects and buffered files cost more than the reads)."""
    pci: dict[str, int | None] = {}
    base = str(host.path("/sys/bus/pci/devices"))
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = []
    for name in names:
        if _read(f"{base}/{name}", "vendor") != "0x10de" or not (_read(f"{base}/{name}", "class") or "").startswith(
                GPU_CLASSES):
            continue
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
