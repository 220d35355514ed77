"""GPU device nodes vs the GPUs on the PCI bus (reconciliation pass).

After a kernel upgrade without a rebuilt driver the PCI devices are there but /dev/nvidia*
and the ``nvidia`` module are not, while Kubernetes still shows the device plugin Running.
This pass compares the NVIDIA display/3D controllers on the PCI bus with the /dev/nvidiaN
nodes present and an optional expected count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from agent.config import CollectorSettings
from agent.types import Emitter, HostPaths

GPU_CLASSES = ("0x0300", "0x0302")
_DEV_NODE = re.compile(r"^nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


class GPUDevicesConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 10.0
    expected_count: int = 0  # 0: whatever the PCI bus shows
    require_uvm: bool = True


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
    devices = host.path("/sys/bus/pci/devices")
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        entries = []
    for dev in entries:
        vendor = _read(dev / "vendor")
        klass = _read(dev / "class") or ""
        if vendor != "0x10de" or not klass.startswith(GPU_CLASSES):
            continue
        info = _read(host.path(f"/proc/driver/nvidia/gpus/{dev.name}/information")) or ""
        m = _MINOR.search(info)
        pci[dev.name] = int(m.group(1)) if m else None
    minors: set[int] = set()
    try:
        for node in host.path("/dev").iterdir():
            if m := _DEV_NODE.match(node.name):
                minors.add(int(m.group(1)))
    except OSError:
        pass
    control = {name: host.path(f"/dev/{name}").exists() for name in ("nvidiactl", "nvidia-uvm")}
    return Inventory(pci=pci, dev_minors=frozenset(minors), control=control)


class GPUDevicesCollector:
    name: ClassVar[str] = "gpu_devices"
    config_type: ClassVar[type[GPUDevicesConfig]] = GPUDevicesConfig

    def __init__(self, config: GPUDevicesConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit

    async def collect(self) -> None:
        inv = scan(self.host)
        on_pci = len(inv.pci)
        expected = max(self.config.expected_count, on_pci)
        details = {"expected": expected, "on_pci": on_pci, "device_nodes": len(inv.dev_minors),
                   "configured_expected": self.config.expected_count or None}
        # Which GPU lacks its node: by the driver's bus->minor map when it exists, else by index.
        wanted: dict[int, str] = {}
        for i, (bus, minor) in enumerate(sorted(inv.pci.items())):
            wanted[minor if minor is not None else i] = bus
        for i in range(expected):
            if len(wanted) >= expected:
                break
            wanted.setdefault(i, "")
        for minor, bus in sorted(wanted.items()):
            if minor in inv.dev_minors:
                continue
            entity = f"gpu:{bus}" if bus else f"gpu:nvidia{minor}"
            where = f"GPU {bus}" if bus else f"expected GPU {minor}"
            reason = "DeviceNodeMissing" if bus else "GPUNotOnPCIBus"
            await self.emit.condition(
                "GPUDevicesMissing", firing=True, severity="critical", entity=entity, reason=reason,
                message=f"{where} has no /dev/nvidia{minor}: workloads cannot use it.",
                details={**details, "pci_address": bus or None, "device_node": f"/dev/nvidia{minor}"},
                suggested_action="cordon")
        if on_pci:
            for name, present in inv.control.items():
                if present or (name == "nvidia-uvm" and not self.config.require_uvm):
                    continue
                await self.emit.condition(
                    "NvidiaControlDeviceMissing", firing=True, severity="critical", entity=f"dev:{name}",
                    reason="DeviceNodeMissing",
                    message=f"/dev/{name} is missing while {on_pci} NVIDIA GPUs are on the PCI bus.",
                    details=details, suggested_action="cordon")
