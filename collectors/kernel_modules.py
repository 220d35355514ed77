"""nvidia, nvidia_uvm, nvidia_peermem: loaded or not, and what that means on this node.

A real verdict, not "healthy" regardless: ``nvidia`` missing while NVIDIA GPUs are on the bus is
critical; ``nvidia_peermem`` missing on a node with GPUs and InfiniBand HCAs means GPUDirect
RDMA is off (NCCL falls back to bouncing through host memory) — unless GPUDirect goes through
DMA-BUF or the GDR files of another peer-memory provider exist.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from msgspec import structs

from collectors.shared.gpu_inventory import PciGpus, scan
from gna_sdk import CollectorSettings, Emitter, HostPaths, plural
from gna_sdk.udev import Uevent
from gna_sdk.watch import Watches
from gna_types.host_details import KernelModuleNotLoaded
from gna_types.node_details import wire

GDR_FILES = ("/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
             "/sys/module/nvidia_peermem/version")
PROC_STATES = {"Live": "live", "Loading": "coming", "Unloading": "going"}


class KernelModulesConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 30.0
    # auto: peermem required on GPU+HCA nodes unless a GDR provider's files exist;
    # peermem: required on GPU+HCA nodes; dmabuf / none: not required.
    gpudirect: Literal["auto", "peermem", "dmabuf", "none"] = "auto"
    udev: bool = True


def parse_proc_modules(text: str) -> dict[str, str]:
    """``name size refcount deps state addr [taint]`` -> {name: live|coming|going}; tolerant."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[1].isdigit():
            out[parts[0]] = PROC_STATES.get(parts[4], parts[4].lower())
    return out


def module_state(host: HostPaths, name: str, proc: dict[str, str] | None) -> str:
    """live | coming | going | builtin | absent."""
    initstate = host.read_text(f"/sys/module/{name}/initstate")
    if initstate is not None:
        return initstate.strip() or "unknown"
    if proc is not None and name in proc:
        return proc[name]
    if host.path(f"/sys/module/{name}").is_dir():
        return "builtin"  # built-in modules have /sys/module/<name> without initstate
    return "absent"


class KernelModulesCollector:
    name: ClassVar[str] = "kernel_modules"
    config_type: ClassVar[type[KernelModulesConfig]] = KernelModulesConfig
    phase: ClassVar[int] = 20
    wakeup: asyncio.Event | None = None

    def __init__(self, config: KernelModulesConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.pci_gpus = PciGpus()  # which bus entries are GPUs, read once per entry

    def _on_uevent(self, ev: Uevent) -> None:
        if ev.get("DEVPATH", "").rsplit("/", 1)[-1].startswith(("nvidia", "mlx", "ib_")) and self.wakeup:
            self.wakeup.set()

    async def run(self) -> None:
        async with Watches("kernel_modules") as w:
            if self.config.udev:
                w.udev(self._on_uevent, ("module",), fallback="the periodic pass")
            await w.hold()

    def _evidence(self, module: str) -> dict[str, Any]:
        errors = (self.emit.facts.get("kernel.module_errors") or {}).get(module) or []
        return {"kernel_log": [e["text"] for e in errors[-3:]]} if errors else {}

    async def collect(self) -> None:
        proc_text, why = None, ""
        try:  # not host.read_text: a missing file and an unreadable one are said apart
            with open(self.host.path("/proc/modules"), "rb") as fh:
                proc_text = fh.read(1 << 20).decode("utf-8", "replace")
        except FileNotFoundError:
            why = "missing"
        except OSError as exc:
            why = f"unreadable: {exc.strerror or exc}"
        proc = parse_proc_modules(proc_text) if proc_text is not None else None
        if proc_text is None:
            self.emit.not_seen("/proc/modules", f"{why}: module states come from /sys/module alone")
        states = {m: module_state(self.host, m, proc) for m in ("nvidia", "nvidia_uvm", "nvidia_peermem")}
        loaded = {m: s in ("live", "builtin") for m, s in states.items()}
        gpus = len((await asyncio.to_thread(scan, self.host, self.pci_gpus)).pci)
        try:
            hcas = sorted(p.name for p in self.host.path("/sys/class/infiniband").iterdir())
        except OSError:
            hcas = []
        gdr_files = [f for f in GDR_FILES if self.host.path(f).exists()]
        self.emit.facts.set("kernel.modules", {
            "states": states, "gpus_on_pci": gpus, "hcas": hcas, "gdr_files": gdr_files,
            "gpudirect_available": bool(gdr_files) or loaded["nvidia_peermem"] or self.config.gpudirect == "dmabuf"})
        base = KernelModuleNotLoaded(states=states, gpus_on_pci=gpus, hcas=hcas, proc_modules=proc is not None)
        if gpus and not loaded["nvidia"]:
            ev = self._evidence("nvidia")
            await self.emit.condition(
                "KernelModuleNotLoaded", firing=True, severity="critical", entity="module:nvidia",
                reason="VersionMismatch" if ev else "NotLoaded",
                message=f"The nvidia kernel module is not loaded ({states['nvidia']}) while "
                        f"{plural(gpus, 'NVIDIA GPU')} {'is' if gpus == 1 else 'are'} on the PCI bus: no GPU is "
                        f"usable (driver not built for this kernel?).",
                details=wire(structs.replace(base, **ev)), suggested_action="cordon")
        if gpus and loaded["nvidia"] and not loaded["nvidia_uvm"]:
            await self.emit.condition(
                "KernelModuleNotLoaded", firing=True, severity="warning", entity="module:nvidia_uvm",
                reason="NotLoaded",
                message="nvidia_uvm is not loaded: CUDA programs will fail until nvidia-modprobe loads it.",
                details=wire(base), suggested_action="reload_module")
        need_peermem = gpus and hcas and loaded["nvidia"] and (
            self.config.gpudirect == "peermem" or (self.config.gpudirect == "auto" and not gdr_files))
        if need_peermem and not loaded["nvidia_peermem"]:
            ev = self._evidence("nvidia_peermem")
            await self.emit.condition(
                "KernelModuleNotLoaded", firing=True, severity="critical", entity="module:nvidia_peermem",
                reason=("VersionMismatch" if any("disagrees" in t for t in ev.get("kernel_log", []))
                        else "LoadFailed" if ev else "NotLoaded"),
                message=f"nvidia_peermem is not loaded on a node with {plural(gpus, 'GPU')} and "
                        f"{plural(len(hcas), 'RDMA HCA')}: "
                        f"GPUDirect RDMA is off and NCCL stages every transfer through host memory.",
                details=wire(structs.replace(base, gdr_files=gdr_files, gpudirect=self.config.gpudirect, **ev)),
                suggested_action="reload_module")
