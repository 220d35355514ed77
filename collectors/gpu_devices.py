"""GPUs that vanish, within a second: udev + inotify for speed, reconciliation for truth.

After a kernel upgrade without a rebuilt driver the PCI devices are there but /dev/nvidia*
and the ``nvidia`` module are not, while Kubernetes still shows the device plugin Running.
Signals: (1) kernel uevents through pyudev (PCI remove/unbind/change incl. AER, nvidia*
module removal, DEVNAME=nvidia*); (2) inotify on <host-root>/dev (nodes are usually made by
nvidia-modprobe with mknod, so udev may say nothing); (3) a periodic pass comparing GPUs on
the PCI bus, /dev/nvidiaN present, NVML's view and a configured expected count.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import ClassVar

import structlog
from msgspec import structs

from collectors.shared.gpu_inventory import PciGpus, scan
from collectors.shared.nvml_lib import load_nvml
from gna_sdk import CollectorSettings, Emitter, HostPaths
from gna_sdk.inotify import DIR_CHANGES, IN_ONLYDIR, InotifyEvent
from gna_sdk.persist import BootScopedSet, boot_id
from gna_sdk.udev import Uevent
from gna_sdk.watch import Watches
from gna_types import entities
from gna_types.entities import normal_pci
from gna_types.gpu_details import GPUDevicesMissing, GPUInventory, GPUPCIeError
from gna_types.node_details import wire

log = structlog.get_logger(__name__)

_WATCHED_DEV = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


class GPUDevicesConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 10.0
    expected_count: int = 0  # 0: whatever the PCI bus shows (and GPUs seen on it since boot)
    require_uvm: bool = True
    udev: bool = True
    inotify: bool = True
    nvml: bool = True


@dataclass(frozen=True)
class Signal:
    kind: str  # "pci_remove", "pci_unbind", "aer", "module_remove", "devnode"
    bus_id: str = ""
    module: str = ""
    error_event: str = ""
    device_online: str = ""


def classify_uevent(ev: Uevent) -> Signal | None:
    """Which kernel uevents matter for NVIDIA GPUs (tested against captured property dicts)."""
    action, subsystem = ev.get("ACTION", ""), ev.get("SUBSYSTEM", "")
    if subsystem == "pci" and ev.get("PCI_ID", "").upper().startswith("10DE:"):
        bus = ev.get("PCI_SLOT_NAME", "") or ev.get("DEVPATH", "").rsplit("/", 1)[-1]
        if action == "change" and (ev.get("ERROR_EVENT") or "DEVICE_ONLINE" in ev):
            return Signal("aer", bus_id=bus.lower(), error_event=ev.get("ERROR_EVENT", ""),
                          device_online=ev.get("DEVICE_ONLINE", ""))
        if action == "remove":
            return Signal("pci_remove", bus_id=bus.lower())
        if action == "unbind":
            return Signal("pci_unbind", bus_id=bus.lower())
        if action in ("add", "bind"):
            return Signal("pci_add", bus_id=bus.lower())
        return None
    if subsystem == "module" and action in ("remove", "add"):
        name = ev.get("DEVPATH", "").rsplit("/", 1)[-1]
        if name.startswith("nvidia"):
            return Signal("module_" + action, module=name)
        return None
    if ev.get("DEVNAME", "").removeprefix("/dev/").startswith("nvidia"):
        return Signal("devnode")
    return None


class GPUDevicesCollector:
    name: ClassVar[str] = "gpu_devices"
    config_type: ClassVar[type[GPUDevicesConfig]] = GPUDevicesConfig
    phase: ClassVar[int] = 20
    wakeup: asyncio.Event | None = None

    def __init__(self, config: GPUDevicesConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.aer: dict[str, tuple[str, GPUPCIeError]] = {}  # bus -> (severity, details)
        self.udev_status = "off"
        # a GPU that fell off the bus while the agent was down is still expected
        self.seen = BootScopedSet(emit.state_dir / "seen_pci.json" if emit.state_dir else None, boot_id(host))
        self.pci_gpus = PciGpus()  # which bus entries are GPUs, read once per entry

    # -- fast paths -------------------------------------------------------------------
    def _wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()

    def _on_uevent(self, ev: Uevent) -> None:
        sig = classify_uevent(ev)
        if sig is None:
            return
        if sig.kind == "aer" and sig.bus_id:
            if sig.error_event == "SUCCESSFUL_RECOVERY" or (sig.device_online == "1" and not sig.error_event):
                self.aer.pop(sig.bus_id, None)
            else:
                severity = "critical" if sig.error_event == "FAILED_RECOVERY" or sig.device_online == "0" else "warning"
                self.aer[sig.bus_id] = (severity, GPUPCIeError(error_event=sig.error_event or None,
                                                               device_online=sig.device_online or None))
        self._wake()

    def _on_dev_events(self, events: list[InotifyEvent]) -> None:
        if any(_WATCHED_DEV.fullmatch(e.name) or not e.name for e in events):
            self._wake()

    async def run(self) -> None:
        async with Watches("gpu_devices") as w:
            if self.config.inotify:
                w.inotify(self.host.path("/dev"), DIR_CHANGES | IN_ONLYDIR, self._on_dev_events,
                          fallback="udev and periodic reconciliation")
            if self.config.udev:
                self.udev_status = w.udev(self._on_uevent, ("pci", "module", "nvidia-caps", "misc"),
                                          fallback="inotify and periodic reconciliation")
            await w.hold()

    # -- the reconciliation pass ------------------------------------------------------
    def _nvml_bus_ids(self) -> set[str] | None:
        if not self.config.nvml:
            return None
        lib, _why = load_nvml()
        if lib is None:
            return None
        ids: set[str] = set()
        try:
            for i in range(lib.nvmlDeviceGetCount()):
                try:
                    ids.add(normal_pci(lib.nvmlDeviceGetPciInfo(lib.nvmlDeviceGetHandleByIndex(i)).busId))
                except Exception:
                    continue  # a lost GPU: it will be missing from the set, which is the point
        except Exception:
            return None
        return ids

    async def collect(self) -> None:
        inv, nvml_ids = await asyncio.to_thread(lambda: (scan(self.host, self.pci_gpus), self._nvml_bus_ids()))
        self.seen.add_all(set(inv.pci))
        gone = sorted(self.seen.items - set(inv.pci))
        on_pci = len(inv.pci)
        expected = max(self.config.expected_count, on_pci + len(gone))
        if not self.host.path("/sys/bus/pci/devices").is_dir():
            self.emit.not_seen("/sys/bus/pci/devices", "missing under the host root: the PCI bus was not read")
        elif not on_pci and not expected:
            self.emit.not_seen("GPUs", "no NVIDIA GPU on the PCI bus (set expected_count or --expected-gpus "
                               "where there must be some)")
        base = GPUInventory(expected=expected, on_pci=on_pci, device_nodes=len(inv.dev_minors),
                            nvml=len(nvml_ids) if nvml_ids is not None else None,
                            configured_expected=self.config.expected_count or None)
        inventory = structs.asdict(base)
        # Which GPU lacks its node: by the driver's bus->minor map when it exists, else by index.
        wanted: dict[int, str] = {}
        for i, (bus, minor) in enumerate(sorted(inv.pci.items())):
            wanted[minor if minor is not None else i] = bus
        for bus in gone:
            await self._missing(entities.gpu(bus), "RemovedFromPCIBus",
                                f"GPU {bus} was on the PCI bus and is gone (fell off the bus or was removed).",
                                GPUDevicesMissing(**inventory, pci_address=bus))
        spare = (i for i in range(64) if i not in wanted)
        while len(wanted) + len(gone) < expected:
            wanted[next(spare)] = ""
        for minor, bus in sorted(wanted.items()):
            if minor in inv.dev_minors:
                if bus and nvml_ids is not None and bus not in nvml_ids:
                    await self._missing(entities.gpu(bus), "NotVisibleToNVML",
                                        f"GPU {bus} has /dev/nvidia{minor} but NVML does not see it.",
                                        GPUDevicesMissing(**inventory, pci_address=bus,
                                                          device_node=f"/dev/nvidia{minor}"))
                continue
            if bus:
                await self._missing(entities.gpu(bus), "DeviceNodeMissing",
                                    f"GPU {bus} has no /dev/nvidia{minor}: workloads cannot use it.",
                                    GPUDevicesMissing(**inventory, pci_address=bus, device_node=f"/dev/nvidia{minor}"))
            else:
                await self._missing(f"gpu:nvidia{minor}", "GPUNotOnPCIBus",
                                    f"Expected GPU {minor} is neither on the PCI bus nor in /dev.",
                                    GPUDevicesMissing(**inventory, pci_address=None,
                                                      device_node=f"/dev/nvidia{minor}"))
        if on_pci:
            for node, present in inv.control.items():
                if present or (node == "nvidia-uvm" and not self.config.require_uvm):
                    continue
                await self.emit.condition(
                    "NvidiaControlDeviceMissing", firing=True, severity="critical", entity=f"dev:{node}",
                    reason="DeviceNodeMissing",
                    message=f"/dev/{node} is missing while {on_pci} NVIDIA GPUs are on the PCI bus.",
                    details=wire(base), suggested_action="cordon")
        for bus, (severity, details) in sorted(self.aer.items()):
            await self.emit.condition(
                "GPUPCIeError", firing=True, severity=severity, entity=entities.gpu(bus),  # type: ignore[arg-type]
                reason="AERRecoveryFailed" if severity == "critical" else "AERRecovery",
                message=f"PCIe AER on GPU {bus}: {details.error_event or 'device offline'}.",
                details=wire(details), suggested_action="inspect_hardware" if severity == "critical" else "none")
        self.emit.facts.set("gpu.inventory", {"on_pci": sorted(inv.pci), "device_minors": sorted(inv.dev_minors),
                                              "nvml": sorted(nvml_ids) if nvml_ids is not None else None,
                                              "udev": self.udev_status})

    async def _missing(self, entity: str, reason: str, message: str, details: GPUDevicesMissing) -> None:
        await self.emit.condition("GPUDevicesMissing", firing=True, severity="critical", entity=entity,
                                  reason=reason, message=message, details=wire(details), suggested_action="cordon")
