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
from typing import Any, ClassVar

import structlog

from collectors.nvml_lib import load_nvml, normalize_bus_id
from gna_sdk import CollectorSettings, Emitter, HostPaths
from gna_sdk.inotify import DIR_CHANGES, IN_ONLYDIR, Inotify, InotifyEvent
from gna_sdk.persist import BootScopedSet
from gna_sdk.udev import UdevMonitor, Uevent

log = structlog.get_logger(__name__)

GPU_CLASSES = ("0x0300", "0x0302")
_DEV_NODE = re.compile(r"^nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_WATCHED_DEV = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


class GPUDevicesConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 10.0
    expected_count: int = 0  # 0: whatever the PCI bus shows (and GPUs seen on it since boot)
    require_uvm: bool = True
    udev: bool = True
    inotify: bool = True
    nvml: bool = True


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
            if m := _DEV_NODE.match(node.name):
                minors.add(int(m.group(1)))
    except OSError:
        pass
    control = {name: host.path(f"/dev/{name}").exists() for name in ("nvidiactl", "nvidia-uvm")}
    return Inventory(pci=pci, dev_minors=frozenset(minors), control=control)


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
        self.aer: dict[str, tuple[str, dict[str, Any]]] = {}  # bus -> (severity, details)
        self.udev_status = "off"
        boot_id = (host.read_text("/proc/sys/kernel/random/boot_id") or "").strip()
        # a GPU that fell off the bus while the agent was down is still expected
        self.seen = BootScopedSet(emit.state_dir / "seen_pci.json" if emit.state_dir else None, boot_id)

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
                self.aer[sig.bus_id] = (severity, {"error_event": sig.error_event or None,
                                                   "device_online": sig.device_online or None})
        self._wake()

    def _on_dev_events(self, events: list[InotifyEvent]) -> None:
        if any(_WATCHED_DEV.match(e.name) or not e.name for e in events):
            self._wake()

    async def run(self) -> None:
        watcher: Inotify | None = None
        udev: UdevMonitor | None = None
        try:
            if self.config.inotify:
                dev = self.host.path("/dev")
                try:
                    watcher = Inotify(self._on_dev_events)
                    watcher.add_watch(str(dev), DIR_CHANGES | IN_ONLYDIR)
                    watcher.start()
                except OSError as exc:
                    log.warning("gpu_devices_inotify_unavailable", path=str(dev), error=str(exc))
                    if watcher:
                        watcher.close()
                    watcher = None
            if self.config.udev:
                udev = UdevMonitor(self._on_uevent, subsystems=("pci", "module", "nvidia-caps", "misc"),
                                   name="gpu_devices")
                if udev.start():
                    self.udev_status = "on"
                else:
                    self.udev_status = f"unavailable: {udev.error}"
                    log.warning("gpu_devices_udev_unavailable", error=udev.error,
                                fallback="inotify and periodic reconciliation")
                    udev = None
            await asyncio.Event().wait()
        finally:
            if watcher:
                watcher.close()
            if udev:
                udev.close()

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
                    ids.add(normalize_bus_id(lib.nvmlDeviceGetPciInfo(lib.nvmlDeviceGetHandleByIndex(i)).busId))
                except Exception:
                    continue  # a lost GPU: it will be missing from the set, which is the point
        except Exception:
            return None
        return ids

    async def collect(self) -> None:
        inv, nvml_ids = await asyncio.to_thread(lambda: (scan(self.host), self._nvml_bus_ids()))
        self.seen.add_all(set(inv.pci))
        gone = sorted(self.seen.items - set(inv.pci))
        on_pci = len(inv.pci)
        expected = max(self.config.expected_count, on_pci + len(gone))
        if not self.host.path("/sys/bus/pci/devices").is_dir():
            self.emit.not_seen("/sys/bus/pci/devices", "missing under the host root: the PCI bus was not read")
        elif not on_pci and not expected:
            self.emit.not_seen("GPUs", "no NVIDIA GPU on the PCI bus (set expected_count or --expected-gpus "
                               "where there must be some)")
        base = {"expected": expected, "on_pci": on_pci, "device_nodes": len(inv.dev_minors),
                "nvml": len(nvml_ids) if nvml_ids is not None else None,
                "configured_expected": self.config.expected_count or None}
        # Which GPU lacks its node: by the driver's bus->minor map when it exists, else by index.
        wanted: dict[int, str] = {}
        for i, (bus, minor) in enumerate(sorted(inv.pci.items())):
            wanted[minor if minor is not None else i] = bus
        for bus in gone:
            await self._missing(f"gpu:{bus}", "RemovedFromPCIBus",
                                f"GPU {bus} was on the PCI bus and is gone (fell off the bus or was removed).",
                                {**base, "pci_address": bus})
        spare = (i for i in range(64) if i not in wanted)
        while len(wanted) + len(gone) < expected:
            wanted[next(spare)] = ""
        for minor, bus in sorted(wanted.items()):
            if minor in inv.dev_minors:
                if bus and nvml_ids is not None and bus not in nvml_ids:
                    await self._missing(f"gpu:{bus}", "NotVisibleToNVML",
                                        f"GPU {bus} has /dev/nvidia{minor} but NVML does not see it.",
                                        {**base, "pci_address": bus, "device_node": f"/dev/nvidia{minor}"})
                continue
            if bus:
                await self._missing(f"gpu:{bus}", "DeviceNodeMissing",
                                    f"GPU {bus} has no /dev/nvidia{minor}: workloads cannot use it.",
                                    {**base, "pci_address": bus, "device_node": f"/dev/nvidia{minor}"})
            else:
                await self._missing(f"gpu:nvidia{minor}", "GPUNotOnPCIBus",
                                    f"Expected GPU {minor} is neither on the PCI bus nor in /dev.",
                                    {**base, "pci_address": None, "device_node": f"/dev/nvidia{minor}"})
        if on_pci:
            for node, present in inv.control.items():
                if present or (node == "nvidia-uvm" and not self.config.require_uvm):
                    continue
                await self.emit.condition(
                    "NvidiaControlDeviceMissing", firing=True, severity="critical", entity=f"dev:{node}",
                    reason="DeviceNodeMissing",
                    message=f"/dev/{node} is missing while {on_pci} NVIDIA GPUs are on the PCI bus.",
                    details=base, suggested_action="cordon")
        for bus, (severity, details) in sorted(self.aer.items()):
            await self.emit.condition(
                "GPUPCIeError", firing=True, severity=severity, entity=f"gpu:{bus}",  # type: ignore[arg-type]
                reason="AERRecoveryFailed" if severity == "critical" else "AERRecovery",
                message=f"PCIe AER on GPU {bus}: {details.get('error_event') or 'device offline'}.",
                details=details, suggested_action="inspect_hardware" if severity == "critical" else "none")
        self.emit.facts.set("gpu.inventory", {"on_pci": sorted(inv.pci), "device_minors": sorted(inv.dev_minors),
                                              "nvml": sorted(nvml_ids) if nvml_ids is not None else None,
                                              "udev": self.udev_status})

    async def _missing(self, entity: str, reason: str, message: str, details: dict[str, Any]) -> None:
        await self.emit.condition("GPUDevicesMissing", firing=True, severity="critical", entity=entity,
                                  reason=reason, message=message, details=details, suggested_action="cordon")
