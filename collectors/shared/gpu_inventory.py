"""What the PCI bus, /proc/driver/nvidia and /dev say about the node's GPUs, in one pass.

Shared by the gpu_devices collector (reconciliation) and kernel_modules (a module verdict depends on
whether the node has GPUs at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gna_sdk import HostPaths

GPU_CLASSES = ("0x0300", "0x0302")
_DEV_NODE = re.compile(r"^nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Inventory:
    pci: dict[str, int | None]  # bus id -> minor (from /proc/driver/nvidia) or None
    dev_minors: frozenset[int]
    control: dict[str, bool]


def _read(path: object) -> str | None:
    try:
        with open(path, "rb") as fh:  # type: ignore[call-overload]
            return str(fh.read(4096).decode("ascii", "replace").strip())
    except OSError:
        return None


def scan(host: HostPaths) -> Inventory:
    pci: dict[str, int | None] = {}
    try:
        entries = sorted(host.path("/sys/bus/pci/devices").iterdir())
    except OSError:
        entries = []
    for dev in entries:
        if _read(dev / "vendor") != "0x10de" or not (_read(dev / "class") or "").startswith(GPU_CLASSES):
            continue
        info = _read(host.path(f"/proc/driver/nvidia/gpus/{dev.name}/information")) or ""
        m = _MINOR.search(info)
        pci[dev.name] = int(m.group(1)) if m else None
    minors: set[int] = set()
    try:
        for node in host.path("/dev").iterdir():
            if m := _DEV_NODE.fullmatch(node.name):
                minors.add(int(m.group(1)))
    except OSError:
        pass
    control = {name: host.path(f"/dev/{name}").exists() for name in ("nvidiactl", "nvidia-uvm")}
    return Inventory(pci=pci, dev_minors=frozenset(minors), control=control)
