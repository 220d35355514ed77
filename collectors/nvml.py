"""NVML health through pynvml (nvidia-ml-py): lost GPUs, ECC, row remapping, NVLink, PCIe width,
clock slowdowns, MIG mode, and Xid events from NVML event sets (a blocking wait in a thread).

Where libnvidia-ml does not load (no GPU, no driver) the collector says so once and stays quiet.
Tests inject a small fake with pynvml's call and error shapes (tests/fake_nvml.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar, Literal

import structlog

from collectors.nvml_lib import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    error_code,
    load_nvml,
    normalize_bus_id,
)
from collectors.xid_catalog import classify, emit_xid
from gna_sdk import Aggregator, CollectorSettings, Emitter, HostPaths

log = structlog.get_logger(__name__)

MEMORY_ERROR_TYPE_UNCORRECTED = 1
VOLATILE_ECC = 0
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS is larger; Hopper has 18, we stop at the first unsupported
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
SLOWDOWN_REASONS = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown"}


class NVMLConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 30.0
    # auto: NVML Xid events only while kmsg_xid is not reading the kernel log (no double reports)
    xid_events: Literal["auto", "on", "off"] = "auto"
    pcie_gen_check: bool = False  # GPUs drop PCIe gen at idle to save power; width is always checked
    aggregation_window: float = 10.0


class GPULost(Exception):
    pass


class NVMLCollector:
    name: ClassVar[str] = "nvml"
    config_type: ClassVar[type[NVMLConfig]] = NVMLConfig
    phase: ClassVar[int] = 30

    def __init__(self, config: NVMLConfig, host: HostPaths, emit: Emitter, *, nvml: Any = None) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self._injected = nvml
        self._said_unsupported = False
        self.agg = Aggregator(config.aggregation_window)
        self.timings: dict[str, float] = {}
        self.call_errors: dict[str, int] = {}  # "call: error (code)" -> times a check was skipped

    def lib(self) -> Any:
        if self._injected is not None:
            return self._injected
        lib, why = load_nvml()
        if lib is None and not self._said_unsupported:
            self._said_unsupported = True
            log.info("nvml_unsupported", reason=why)
            self.emit.facts.set("nvml.available", False)
        return lib

    def _call(self, name: str, *args: Any, absent: tuple[int, ...] = ()) -> Any:
        """A pynvml call. None when the GPU or driver does not have it (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
        or the binding lacks it): nothing to check. GPULost on GPU_IS_LOST. Any other NVML error also
        gives None, but the check it skipped is counted and reported (``check`` lists it under
        not_seen, the daemon logs it): a skipped check never passes for a healthy one. ``absent``: codes
        that mean "this one does not exist" for this call (INVALID_ARGUMENT for a link past the last)."""
        fn = getattr(self.lib(), name, None)
        if fn is None:
            return None
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as exc:
            code = error_code(exc)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise GPULost(name) from exc
            if code is None:
                raise
            if code not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, *absent):
                key = f"{name}: {type(exc).__name__} ({code})"
                self.call_errors[key] = self.call_errors.get(key, 0) + 1
                self.emit.not_seen(f"NVML {name}", f"{type(exc).__name__} (NVML error {code}): check skipped "
                                                   f"({self.call_errors[key]} times)")
            return None
        finally:
            self.timings[name] = time.perf_counter() - t0

    async def collect(self) -> None:
        if self.lib() is None:
            self.emit.not_seen("NVML", f"libnvidia-ml not loadable: {load_nvml()[1]}")
            return
        await asyncio.to_thread(self._probe_sync_then_emit_later)
        for item in self._pending:
            await item[0](*item[1], **item[2])

    def _probe_sync_then_emit_later(self) -> None:
        """All NVML calls in a worker thread (they can block for seconds on a sick GPU)."""
        self._pending: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        emit_cond = self.emit.condition
        count = self._call("nvmlDeviceGetCount") or 0
        devices: list[dict[str, Any]] = []
        for i in range(count):
            entity = f"gpu:nvml{i}"
            try:
                h = self._call("nvmlDeviceGetHandleByIndex", i)
                pci = self._call("nvmlDeviceGetPciInfo", h)
                if pci is not None:
                    entity = f"gpu:{normalize_bus_id(pci.busId)}"
                dev = {"index": i, "entity": entity}
                devices.append(dev)
                self._checks(h, entity, dev)
            except GPULost as lost:
                self._pending.append((emit_cond, ("GPULost",), dict(
                    firing=True, severity="critical", entity=entity, reason="GPUIsLost",
                    message=f"NVML reports GPU {entity[4:]} as lost ({lost}): it fell off the bus or hung.",
                    details={"index": i, "call": str(lost)}, suggested_action="reboot")))
        self.emit.facts.set("nvml.available", True)
        self.emit.facts.set("nvml.devices", devices)

    def _cond(self, type_: str, entity: str, severity: str, reason: str, message: str, details: dict[str, Any],
              action: str = "none") -> None:
        self._pending.append((self.emit.condition, (type_,), dict(
            firing=True, severity=severity, entity=entity, reason=reason, message=message, details=details,
            suggested_action=action)))

    def _checks(self, h: Any, entity: str, dev: dict[str, Any]) -> None:
        bus = entity[4:]
        dbe = self._call("nvmlDeviceGetTotalEccErrors", h, MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC)
        dev["ecc_volatile_uncorrected"] = dbe
        if dbe:
            self._cond("GPUEccUncorrectable", entity, "critical", "VolatileDoubleBitECC",
                       f"GPU {bus} has {dbe} uncorrectable (double-bit) ECC errors since the driver loaded.",
                       {"volatile_uncorrected": dbe}, "cordon")
        rows = self._call("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, pending, failure = rows
            dev["remapped_rows"] = {"correctable": corr, "uncorrectable": unc, "pending": bool(pending),
                                    "failure": bool(failure)}
            if failure:
                self._cond("GPURowRemapFailure", entity, "critical", "RowRemapFailed",
                           f"GPU {bus} could not remap a failing memory row: replace it.",
                           dev["remapped_rows"], "inspect_hardware")
            elif pending:
                self._cond("GPURowRemapPending", entity, "warning", "ResetRequired",
                           f"GPU {bus} has a memory row remap pending: it applies at the next GPU reset.",
                           dev["remapped_rows"], "cordon")
        links_down, links = [], 0
        for link in range(NVLINK_MAX_LINKS):
            # NVML answers INVALID_ARGUMENT for a link index past this GPU's last link
            state = self._call("nvmlDeviceGetNvLinkState", h, link, absent=(NVML_ERROR_INVALID_ARGUMENT,))
            if state is None:
                break
            links += 1
            if not state:
                links_down.append(link)
        dev["nvlinks"], dev["nvlinks_down"] = links, links_down
        if links_down:
            self._cond("GPUNVLinkDown", entity, "critical" if len(links_down) == links else "warning",
                       "LinkInactive",
                       f"GPU {bus} has {len(links_down)} of {links} NVLinks down: GPU-to-GPU traffic falls back "
                       f"to PCIe (topology shows PIX/SYS instead of NV#).", {"links_down": links_down, "links": links},
                       "inspect_hardware")
        cur_w, max_w = self._call("nvmlDeviceGetCurrPcieLinkWidth", h), self._call("nvmlDeviceGetMaxPcieLinkWidth", h)
        cur_g, max_g = (self._call("nvmlDeviceGetCurrPcieLinkGeneration", h),
                        self._call("nvmlDeviceGetMaxPcieLinkGeneration", h))
        dev["pcie"] = {"width": cur_w, "max_width": max_w, "gen": cur_g, "max_gen": max_g}
        if (cur_w and max_w and cur_w < max_w) or (self.config.pcie_gen_check and cur_g and max_g and cur_g < max_g):
            self._cond("GPUPCIeLinkDegraded", entity, "warning", "LinkBelowMax",
                       f"GPU {bus} PCIe link runs at Gen{cur_g} x{cur_w}, below its Gen{max_g} x{max_w}.",
                       dev["pcie"], "inspect_hardware")
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        active = [n for bit, n in SLOWDOWN_REASONS.items() if reasons and reasons & bit]
        dev["slowdown"] = active
        if active:
            self._cond("GPUThrottled", entity, "warning", "ClockSlowdown",
                       f"GPU {bus} clocks are held down by {', '.join(active)}.", {"reasons": active,
                                                                                   "mask": reasons})
        mig = self._call("nvmlDeviceGetMigMode", h)
        if mig is not None:
            cur, pend = mig
            dev["mig"] = {"current": cur, "pending": pend}
            if cur != pend:
                self._cond("GPUMIGModePending", entity, "warning", "ResetRequired",
                           f"GPU {bus} MIG mode change ({cur} -> {pend}) waits for a GPU reset.", dev["mig"])

    # -- Xid events ---------------------------------------------------------------------
    def _xids_wanted(self) -> bool:
        if self.config.xid_events == "off":
            return False
        return self.config.xid_events == "on" or not self.emit.facts.get("kmsg_xid.active", False)

    async def run(self) -> None:
        lib = self.lib()
        if lib is None or self.config.xid_events == "off":
            await asyncio.Event().wait()
            return
        event_set = await asyncio.to_thread(lib.nvmlEventSetCreate)
        buses: dict[Any, str] = {}
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            try:
                lib.nvmlDeviceRegisterEvents(h, EVENT_XID, event_set)
                buses[h] = normalize_bus_id(lib.nvmlDeviceGetPciInfo(h).busId)
            except Exception as exc:
                log.warning("nvml_xid_events_unavailable", index=i, error=repr(exc))
        try:
            while True:
                try:
                    data = await asyncio.to_thread(lib.nvmlEventSetWait_v2, event_set, 1000)
                except Exception as exc:
                    if error_code(exc) == NVML_ERROR_TIMEOUT:
                        for key, w in self.agg.due(time.time()):
                            await emit_xid(self.emit, classify(key[2]), key[1], source="nvml", count=w.count,
                                           span=w.span())
                        continue
                    raise
                bus = buses.get(data.device, "unknown")
                if self._xids_wanted() and self.agg.add(("xid", bus, int(data.eventData)), time.time()):
                    await emit_xid(self.emit, classify(int(data.eventData)), bus, source="nvml")
        finally:
            free = getattr(lib, "nvmlEventSetFree", None)
            if free:
                await asyncio.to_thread(free, event_set)
