"""NVML health through pynvml (nvidia-ml-py): lost GPUs, ECC, row remapping, NVLink, PCIe width,
clock slowdowns, MIG mode, and Xid events from NVML event sets (a blocking wait in a thread).

Straggler signals (docs/straggler-signals.md): one slow GPU slows every rank of a synchronous
ring, so per GPU the collector also measures what makes a device slower than its peers: PCIe
replay and NVLink error rates (judged by DCGM's health-watch thresholds), clock slowdown reasons
that persist, thermal margin, and GPM utilisation on Hopper and later. They are exported under
DCGM's field names (a user looks for DCGM_FI_DEV_PCIE_REPLAY_COUNTER, not for ours), kept in the
fact ``nvml.straggler_signals``, and published as a ``StragglerSignals`` event every
``signals_interval`` for the fleet to compare GPUs of one hardware class.

Where libnvidia-ml does not load (no GPU, no driver) the collector says so once and stays quiet.
A call a GPU answers NOT_SUPPORTED is remembered for that GPU and not asked again (counted in
``gna_nvml_not_supported``). Tests inject a small fake with pynvml's call and error shapes
(tests/fake_nvml.py).
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec
import structlog
from msgspec import UNSET

from collectors.formats import gfd_labels
from collectors.formats.pci_acs import PCI_CFG_SPACE_EXP_SIZE, AcsState, parse_acs
from collectors.formats.pcie_tree import Topology, pcie_distance, read_topology
from collectors.formats.xid_catalog import classify, emit_xid
from collectors.shared.counter_window import CounterWindow, WindowStats, valid_reading
from collectors.shared.device_plugin import find_device_plugin
from collectors.shared.nvml_lib import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    error_code,
    load_nvml,
)
from gna_sdk import Aggregator, CollectorSettings, Emitter, HostPaths, Severity, gpu_release, plural, severity_rank
from gna_types import entities
from gna_types.entities import normal_pci
from gna_types.gpu_details import (
    AcsPort,
    GPUEccUncorrectable,
    GPUMIGMisconfigured,
    GPUMIGModePending,
    GPUNVLinkErrors,
    GPUP2PUnavailable,
    GPUPCIeReplayRate,
    GPURowRemap,
    GPUStragglerSignals,
    GPUTensorPipeIdle,
    GPUThermalMarginLow,
    GPUThrottled,
    NVLinkCounter,
    ThermalFinding,
)
from gna_types.gpu_details import GPULost as GPULostDetails
from gna_types.node_details import wire
from gna_types.policy import verdict

log = structlog.get_logger(__name__)

MEMORY_ERROR_TYPE_UNCORRECTED = 1
VOLATILE_ECC = 0
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS is larger; Hopper has 18, we stop at the first unsupported
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError

ClockReason = Literal["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                      "hw_power_brake_slowdown"]
# nvmlClocksEventReason* bits (nvml.h, pynvml 13.615; DCGM_CLOCKS_EVENT_REASON_* are the same). GPU idle
# (0x1), applications clocks (0x2), sync boost (0x10) and display clock (0x100) are idleness or settings:
# none makes this GPU slower than its peers.
CLOCK_EVENT_REASONS: dict[int, ClockReason] = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown"}

# Where a rule comes from: carried in details["citation"] for developers and tooling; the dashboard does not
# show it (fleet/dashboard.py VIEW_HIDDEN): an operator reads the rule and the numbers, not a file at a commit.
DCGM_HEALTH = "NVIDIA/DCGM v4.6.0 modules/health/DcgmHealthWatch.cpp"
DCGM_LIMITS = "NVIDIA/DCGM v4.6.0 common/DcgmGPUHardwareLimits.h"
DCGM_GPM = "NVIDIA/DCGM v4.5.3 dcgmlib/src/dcgm_fields.cpp DcgmFieldIdToNvmlGpmMetricId, dcgmlib/src/DcgmGpmManager.cpp"
TLIMIT_SOURCE = "NVIDIA/NVSentinel docs/designs/042-gpu-temp-limit-field-monitoring.md @35a7ab9e"
NVML_THRESHOLDS = "nvml.h nvmlTemperatureThresholds_t (nvidia-ml-py 13.615)"
# DcgmHealthWatch looks one minute back (oneMinuteInUsec) for PCIe replays, NVLink errors and thermal/power
# violations: the window of the error rates and the persistence a clock slowdown needs.
HEALTH_WINDOW = 60.0

PCIE_REPLAY_BITS = 32  # nvmlDeviceGetPcieReplayCounter fills an unsigned int
NVLINK_COUNTER_BITS = 64  # nvmlDeviceGetNvLinkErrorCounter fills an unsigned long long
# DcgmHealthWatch::GetExpectedPcieReplayRate: lane rate (Gb/s) of PCIe Gen1..Gen6; a later gen is capped to Gen6
PCIE_LANE_GBPS = (2.5, 5.0, 8.0, 16.0, 32.0, 64.0)

# NVML_NVLINK_ERROR_DL_* -> (our name, the DCGM per-GPU total field DcgmHealthWatch::MonitorNVLink4Fields judges)
NVLINK_ERRORS: dict[int, tuple[str, str]] = {
    0: ("replay", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    1: ("recovery", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    2: ("crc_flit", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    3: ("crc_data", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
}
DCGM_LIMIT_MAX_NVLINK_ERROR = 1  # errors in the window: WARN (CRC), FAIL (replay, recovery)
DCGM_LIMIT_MAX_NVLINK_CRC_ERROR = 100.0  # CRC errors per second: FAIL ("only matter at rates of 100+ per second")

# NVML_GPM_METRIC_* -> (the DCGM profiling field DCGM itself fills from that GPM metric, our name). All are
# percentages DCGM divides by 100 (isPercentageField), so the values match DCGM's 0..1 ratios.
GPM_METRICS: dict[int, tuple[str, str]] = {
    1: ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active"),
    2: ("DCGM_FI_PROF_SM_ACTIVE", "sm_active"),
    3: ("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy"),
    5: ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active"),
    10: ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active"),
    11: ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active"),
    12: ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active"),
    13: ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active"),
}
NVML_GPM_METRICS_GET_VERSION = 1

NVML_TEMPERATURE_GPU = 0
# nvmlTemperatureThresholds_t: SHUTDOWN "HW protection", SLOWDOWN "begin HW slowdown", MEM_MAX "memory: begin SW
# slowdown", GPU_MAX "can be throttled below base clock"
TEMP_THRESHOLDS = {"shutdown": 0, "slowdown": 1, "memory_max": 2, "gpu_max": 3}
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT = 194  # signed T.Limit offset at which HW slowdown engages (Ada and later)
TEMP_RANGE = (-100, 250)  # degrees C a sensor, threshold or margin can report; beyond: a broken reading
# NVML_VALUE_TYPE_* -> the nvmlValue_t member that holds it
_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
MAX_SIGNAL_GPUS = 64

# "Busy but waiting" (/work/shared/seeds: "DCGM_FI_PROF_SM_ACTIVE > 0.8 and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE < 0.3",
# held "长期", i.e. sustained; the seeds give no length: ours is ``tensor_idle_window``)
TENSOR_IDLE_SOURCE = ("field notes (seeds 000, DCGM panel 4: SM_ACTIVE > 0.8 and PIPE_TENSOR_ACTIVE < 0.3 = wrong "
                      "kernels or waiting); fields: NVIDIA/DCGM v4.5.3 dcgmlib/src/dcgm_fields.cpp")
# MIG and NVIDIA's device plugin: NVIDIA/k8s-device-plugin @0b62328 cmd/nvidia-device-plugin/mig-strategy.go
# (single: every GPU MIG-enabled, else it panics; no MIG-enabled GPU: falls back to none) and internal/mig/mig.go
# AssertAllMigEnabledDevicesAreValid (every MIG-enabled GPU has >= 1 MIG device; single: all of one
# nvmlDeviceGetAttributes); the flag: cmd/nvidia-device-plugin/main.go @01421a2
GFD_SOURCE = ("NVIDIA/k8s-device-plugin v0.20.0 internal/lm/mig-strategy.go (mig.strategy only for single|mixed; "
              "mig-<profile>.count under mixed, gpu.count under single), internal/lm/output.go (key=value lines)")
DEVICE_PLUGIN_SOURCE = ("NVIDIA/k8s-device-plugin @0b62328 cmd/nvidia-device-plugin/mig-strategy.go, "
                        "internal/mig/mig.go AssertAllMigEnabledDevicesAreValid")
MAX_MIG_DEVICES = 64
# nvml.h nvmlGpuP2PCapsIndex_t (READ 0, WRITE 1, NVLINK 2, ATOMICS 3, PCI 4) and nvmlGpuP2PStatus_t (nvidia-ml-py
# 13.615's pynvml mirrors both), what nvidia-smi topo -p2p r|w|n|a prints
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}
P2P_STATUS = {0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
              4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN"}
P2P_SOURCE = ("nvml.h nvmlDeviceGetP2PStatus, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t (nvidia-ml-py 13.615); "
              "ACS: linux v6.1 include/uapi/linux/pci_regs.h PCI_EXT_CAP_ID_ACS, PCI_ACS_CTRL, PCI_ACS_RR/CR/EC")
MAX_P2P_GPUS = 16  # pairs grow with the square: an 8-GPU node has 28


def pcie_replay_limit_per_min(gen: object, width: object) -> int | None:
    """DCGM's expected PCIe replays per minute of a link (DcgmHealthWatch::GetExpectedPcieReplayRate): a
    1e-12 bit error rate at the lane rate, times 60 s, times the lanes, rounded up; computed with DCGM's own
    double arithmetic so the rounding agrees. None for an unknown link (DCGM skips the check then)."""
    for v in (gen, width):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 64:
            return None
    assert isinstance(gen, int) and isinstance(width, int)
    per_lane = PCIE_LANE_GBPS[min(gen, len(PCIE_LANE_GBPS)) - 1] / 1000 * 60
    return math.ceil(per_lane * width)


def field_value(fv: Any) -> int | float | None:
    """One nvmlFieldValue_t's value, None when NVML did not fill it."""
    if getattr(fv, "nvmlReturn", None) != 0:
        return None
    attr = _FIELD_VALUE.get(getattr(fv, "valueType", -1))
    value = getattr(getattr(fv, "value", None), attr, None) if attr else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def plausible_temp(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and \
        TEMP_RANGE[0] <= value <= TEMP_RANGE[1]


class NVMLConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 30.0
    # auto: NVML Xid events only while kmsg_xid is not reading the kernel log (no double reports)
    xid_events: Literal["auto", "on", "off"] = "auto"
    aggregation_window: float = 10.0
    # GPUThrottled once a slowdown reason held this long across samples (DCGM's one-minute health window)
    clock_event_persist: float = HEALTH_WINDOW
    # reasons that raise GPUThrottled; sw_power_cap is in the vector only (a GPU at its configured power
    # limit runs as designed: only a comparison with its peers makes that a straggler)
    clock_event_findings: list[ClockReason] = msgspec.field(default_factory=lambda: [
        "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"])
    error_hold_down: float = 300.0  # PCIe replay / NVLink error findings stay firing this long after the last
    thermal_margin_warning_c: float = 0.0  # T.Limit margin at or below: warning (0: at max operating temp)
    gpm: bool = True  # GPM metrics (Hopper and later) as DCGM_FI_PROF_*
    signals_interval: float = 300.0  # StragglerSignals event every this many seconds; 0: metrics and facts only
    # GPUTensorPipeIdle: SM activity above and tensor activity below these in every GPM sample for the window
    tensor_idle_sm_active_min: float = 0.8
    tensor_idle_tensor_active_max: float = 0.3
    tensor_idle_window: float = 600.0
    # the device plugin's --mig-strategy: auto reads it from the plugin's /proc/<pid>/cmdline and environ
    mig_strategy: Literal["auto", "none", "single", "mixed"] = "auto"
    # GPU Feature Discovery's labels (collectors/formats/gfd_labels.py) against the plugin and NVML; "" : not read
    gfd_labels_file: str = gfd_labels.DEFAULT_PATH
    gfd_grace: float = 180.0  # s a disagreement must last (GFD relabels every 60 s by default)
    p2p: bool = True  # nvmlDeviceGetP2PStatus of GPU pairs under one PCIe switch or NVLink-connected


@dataclass
class GPUState:
    """What the straggler signals of one GPU need from pass to pass."""

    pcie: CounterWindow = field(default_factory=lambda: CounterWindow(HEALTH_WINDOW, PCIE_REPLAY_BITS))
    nvlink: dict[tuple[int, int], CounterWindow] = field(default_factory=dict)  # (link, NVML counter) -> window
    reasons_since: dict[str, float] = field(default_factory=dict)  # slowdown reason -> first of its run of samples
    gpm_supported: bool | None = None
    gpm_sample: Any = None  # the previous pass's nvmlGpmSample_t
    tensor_idle_since: float | None = None  # first sample of the current run of busy-but-no-tensor samples
    nvlink_remotes: set[str] = field(default_factory=set)  # NVLink remote PCI addresses (GPU or NVSwitch)
    name: str | None = None
    over: dict[str, tuple[float, Severity, str, str, dict[str, Any]]] = field(default_factory=dict)  # held findings
    metrics: dict[str, Any] = field(default_factory=dict)  # raw values for /metrics
    vector: dict[str, Any] = field(default_factory=dict)


class GPULost(Exception):
    pass


class NVMLCollector:
    name: ClassVar[str] = "nvml"
    config_type: ClassVar[type[NVMLConfig]] = NVMLConfig
    phase: ClassVar[int] = 30

    def __init__(self, config: NVMLConfig, host: HostPaths, emit: Emitter, *, nvml: Any = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self._injected = nvml
        self._clock = clock or time.monotonic
        self._said_unsupported = False
        self.agg = Aggregator(config.aggregation_window)
        self.timings: dict[str, float] = {}
        self.call_errors: dict[str, int] = {}  # "call: error (code)" -> times a check was skipped
        self.gpus: dict[str, GPUState] = {}  # entity -> straggler state
        self.unsupported: dict[str, set[str]] = {}  # call -> GPUs that answered NOT_SUPPORTED (not asked again)
        self.impossible: dict[str, int] = {}  # call -> readings rejected (beyond the counter's width, not a number)
        self.signals: dict[str, dict[str, Any]] = {}  # bus id -> the vector of the last pass
        self._passes = 0
        self._now = 0.0
        self._signals_at: float | None = None
        self._export: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []  # a pass's metrics, for scrapes
        self._topo: Topology | None = None
        self._gfd_since: dict[str, float] = {}  # a GFD disagreement -> when it was first seen
        # a GPU reset (gna_sdk.gpu_release): no pass and no Xid wait while released, NVML shut down meanwhile
        self._released = ""  # why, while released
        self._pass_lock = asyncio.Lock()
        self._xid_parked = asyncio.Event()  # set while the Xid loop holds no NVML event set
        self._xid_parked.set()
        self._xid_go = asyncio.Event()  # set on resume: the Xid loop takes a new event set

    def lib(self) -> Any:
        if self._released:
            return None
        if self._injected is not None:
            return self._injected
        lib, why = load_nvml()
        if lib is None and not self._said_unsupported:
            self._said_unsupported = True
            log.info("nvml_unsupported", reason=why)
            self.emit.facts.set("nvml.available", False)
        return lib

    def _call(self, name: str, *args: Any, absent: tuple[int, ...] = (), entity: str | None = None,
              key: str | None = None) -> Any:
        """A pynvml call. None when the GPU or driver does not have it (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
        or the binding lacks it): nothing to check. GPULost on GPU_IS_LOST. Any other NVML error also
        gives None, but the check it skipped is counted and reported (``check`` lists it under
        not_seen, the daemon logs it): a skipped check never passes for a healthy one. ``absent``: codes
        that mean "this one does not exist" for this call (INVALID_ARGUMENT for a link past the last).
        With ``entity``, a NOT_SUPPORTED answer is remembered under ``key`` (default: the call) and that
        GPU is not asked again: support does not change while the driver stays loaded."""
        key = key or name
        if entity is not None and entity in self.unsupported.get(key, ()):
            return None
        fn = getattr(self.lib(), name, None)
        if fn is None:
            self._unsupported(entity, key)
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
            if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported(entity, key)
            elif code not in absent:
                key = f"{name}: {type(exc).__name__} ({code})"
                self.call_errors[key] = self.call_errors.get(key, 0) + 1
                self.emit.not_seen(f"NVML {name}", f"{type(exc).__name__} (NVML error {code}): check skipped "
                                                   f"({plural(self.call_errors[key], 'time')})")
            return None
        finally:
            self.timings[name] = time.perf_counter() - t0

    def _unsupported(self, entity: str | None, key: str) -> None:
        if entity is None:
            return
        gpus = self.unsupported.setdefault(key, set())
        if not gpus:  # once per call, not per GPU nor per pass; gna_nvml_not_supported counts the GPUs
            log.info("nvml_not_supported", call=key, gpu=entity[4:])
        gpus.add(entity)

    def _impossible(self, entity: str, call: str, value: object) -> None:
        """A reading no counter or sensor of its kind can hold: skipped and counted, never a rate."""
        self.impossible[call] = self.impossible.get(call, 0) + 1
        self.emit.unparsed(f"NVML {call} {entity[4:]}", f"impossible value {value!r}"[:120])

    async def collect(self) -> None:
        async with self._pass_lock:
            if self._released:
                self.emit.not_seen("NVML", f"released for {self._released}: no pass until it ends")
                return
            if self.lib() is None:
                self.emit.not_seen("NVML", f"libnvidia-ml not loadable: {load_nvml()[1]}")
                return
            await asyncio.to_thread(self._probe_sync_then_emit_later)
            for item in self._pending:
                await item[0](*item[1], **item[2])
            await self._publish_signals()

    # -- letting go of the GPUs for a reset (gna_sdk.gpu_release) ---------------------------------------
    async def _release(self, reason: str) -> None:
        """Stop: wait for a pass in flight, park the Xid loop (it frees its event set); with an injected
        library shut it down here (the process's own pynvml is shut down by collectors.shared.nvml_lib's
        holder, after this one)."""
        async with self._pass_lock:
            self._released = reason[:200] or "a GPU reset"
        self._xid_go.clear()
        await self._xid_parked.wait()
        if self._injected is not None:
            await asyncio.to_thread(self._injected.nvmlShutdown)

    async def _resume(self, _reason: str) -> None:
        """Go on with fresh baselines: a reset GPU's counters start again, which is no error rate."""
        if self._injected is not None:
            await asyncio.to_thread(self._injected.nvmlInit)
        async with self._pass_lock:
            for entity in list(self.gpus):
                self._forget(entity)
            self._released = ""
        self._xid_go.set()
        if (wakeup := getattr(self, "wakeup", None)) is not None:
            wakeup.set()

    def _probe_sync_then_emit_later(self) -> None:
        """All NVML calls in a worker thread (they can block for seconds on a sick GPU)."""
        self._pending: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        emit_cond = self.emit.condition
        now = self._now = self._clock()
        self._passes += 1
        count = self._call("nvmlDeviceGetCount") or 0
        devices: list[dict[str, Any]] = []
        handles: dict[str, Any] = {}
        seen: set[str] = set()
        for i in range(count):
            entity = f"gpu:nvml{i}"
            try:
                h = self._call("nvmlDeviceGetHandleByIndex", i)
                pci = self._call("nvmlDeviceGetPciInfo", h)
                if pci is not None:
                    entity = entities.gpu(pci.busId)
                dev = {"index": i, "entity": entity}
                devices.append(dev)
                seen.add(entity)
                self._checks(h, entity, dev, now)
                handles[entity] = h
            except GPULost as lost:
                self._forget(entity)  # it comes back (reset, reboot) with fresh counters: a new baseline
                seen.discard(entity)
                self._pending.append((emit_cond, ("GPULost",), dict(
                    firing=True, severity="critical", entity=entity, reason="GPUIsLost",
                    message=f"NVML reports GPU {entity[4:]} as lost ({lost}): it fell off the bus or hung.",
                    details=wire(GPULostDetails(index=i, call=str(lost))), suggested_action="reboot")))
        for gone in set(self.gpus) - seen:
            self._forget(gone)
        self._mig_findings(devices)
        try:
            self._p2p(handles)
        except GPULost:
            pass  # the next pass reports it on its own GPU
        # a copy: a published message must not change under its readers when the next pass updates the state
        self.signals = {e[4:]: copy.deepcopy(st.vector) for e, st in list(self.gpus.items())[:MAX_SIGNAL_GPUS]
                        if st.vector}
        for st in self.gpus.values():
            st.metrics["resets"] = {"pcie_replay": st.pcie.resets, "nvlink": sum(w.resets for w in st.nvlink.values())}
        # scrapes run on the event loop while the next pass mutates the state in this thread: they read a copy
        self._export = [(e[4:], str(st.vector.get("index", "")), dict(st.metrics), dict(st.vector))
                        for e, st in self.gpus.items()]
        self.emit.facts.set("nvml.available", True)
        self.emit.facts.set("nvml.devices", devices)
        self.emit.facts.set("nvml.straggler_signals", self.signals)

    def _forget(self, entity: str) -> None:
        st = self.gpus.pop(entity, None)
        if st is not None and st.gpm_sample is not None:
            self._free_gpm_sample(st.gpm_sample)

    def _cond(self, type_: str, entity: str, severity: str, reason: str, message: str, details: dict[str, Any],
              action: str = "none") -> None:
        self._pending.append((self.emit.condition, (type_,), dict(
            firing=True, severity=severity, entity=entity, reason=reason, message=message, details=details,
            suggested_action=action)))

    def _checks(self, h: Any, entity: str, dev: dict[str, Any], now: float) -> None:
        bus = entity[4:]
        st = self.gpus.setdefault(entity, GPUState())
        dbe = self._call("nvmlDeviceGetTotalEccErrors", h, MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC)
        dev["ecc_volatile_uncorrected"] = dbe
        if dbe:
            self._cond("GPUEccUncorrectable", entity, "critical", "VolatileDoubleBitECC",
                       f"GPU {bus} has {dbe} uncorrectable (double-bit) ECC errors since the driver loaded.",
                       wire(GPUEccUncorrectable(volatile_uncorrected=dbe)), "cordon")
        rows = self._call("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, pending, failure = rows
            remap = GPURowRemap(correctable=corr, uncorrectable=unc, pending=bool(pending), failure=bool(failure))
            dev["remapped_rows"] = wire(remap)
            if failure:
                self._cond("GPURowRemapFailure", entity, "critical", "RowRemapFailed",
                           f"GPU {bus} could not remap a failing memory row: replace it.",
                           wire(remap), "inspect_hardware")
            elif pending:
                self._cond("GPURowRemapPending", entity, "warning", "ResetRequired",
                           f"GPU {bus} has a memory row remap pending: it applies at the next GPU reset.",
                           wire(remap), "cordon")
        links_down, links = [], 0
        st.nvlink_remotes = set()
        for link in range(NVLINK_MAX_LINKS):
            # NVML answers INVALID_ARGUMENT for a link index past this GPU's last link
            state = self._call("nvmlDeviceGetNvLinkState", h, link, absent=(NVML_ERROR_INVALID_ARGUMENT,))
            if state is None:
                break
            links += 1
            if not state:
                links_down.append(link)
            elif self.config.p2p:
                remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", h, link, entity=entity)
                if remote is not None and getattr(remote, "busId", None):
                    st.nvlink_remotes.add(normal_pci(remote.busId))
        # NVLinks down and PCIe links below what both ends support are judged in one place, the topology
        # collector (pairs that should be NV#; sysfs link width/speed, speed only under load): here they are
        # facts and straggler signals only
        dev["nvlinks"], dev["nvlinks_down"] = links, links_down
        cur_w, max_w = self._call("nvmlDeviceGetCurrPcieLinkWidth", h), self._call("nvmlDeviceGetMaxPcieLinkWidth", h)
        cur_g, max_g = (self._call("nvmlDeviceGetCurrPcieLinkGeneration", h),
                        self._call("nvmlDeviceGetMaxPcieLinkGeneration", h))
        dev["pcie"] = {"width": cur_w, "max_width": max_w, "gen": cur_g, "max_gen": max_g}
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        dev["slowdown"] = self._clock_events(entity, st, reasons, now)
        mig = self._call("nvmlDeviceGetMigMode", h)
        if mig is not None:
            cur, pend = mig
            dev["mig"] = {"current": cur, "pending": pend}
            if cur == 1:
                dev["mig"]["profiles"] = self._mig_devices(h, entity)
            if cur != pend:
                self._cond("GPUMIGModePending", entity, "warning", "ResetRequired",
                           f"GPU {bus} MIG mode change ({cur} -> {pend}) waits for a GPU reset.",
                           wire(GPUMIGModePending(current=cur, pending=pend)))
        self._straggler_signals(h, entity, st, dev, now)

    # -- straggler signals (docs/straggler-signals.md) ------------------------------------
    def _clock_events(self, entity: str, st: GPUState, reasons: Any, now: float) -> list[str]:
        """Clock event reasons are a sample of this instant: power capping and short HW slowdowns come and
        go with load transients and cost a step nothing. A reason that holds in every sample for
        ``clock_event_persist`` (DCGM's one-minute health window) slows this GPU for many steps."""
        if reasons is None:
            return []
        if not valid_reading(reasons, 64):
            self._impossible(entity, "nvmlDeviceGetCurrentClocksEventReasons", reasons)
            return []
        active: list[str] = [name for bit, name in CLOCK_EVENT_REASONS.items() if reasons & bit]
        for gone in set(st.reasons_since) - set(active):
            del st.reasons_since[gone]
        held = {r: now - st.reasons_since.setdefault(r, now) for r in active}
        st.metrics["clock_events"] = reasons
        st.vector["clock_slowdown_reasons"] = active
        st.vector["clock_slowdown_held_s"] = {r: round(s, 1) for r, s in held.items()}
        firing = [r for r in active
                  if r in self.config.clock_event_findings and held[r] >= self.config.clock_event_persist]
        if firing:
            self._cond("GPUThrottled", entity, "warning", "ClockSlowdown",
                       f"GPU {entity[4:]} clocks have been held down by {', '.join(firing)} for "
                       f"{min(held[r] for r in firing):.0f} s or more.",
                       wire(GPUThrottled(
                           reasons=list[str](firing), held_s={r: round(held[r], 1) for r in firing}, mask=reasons,
                           active=active,
                           persist_s=self.config.clock_event_persist, field="DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                           citation=f"persistence: {DCGM_HEALTH} one-minute look-back (MonitorThermal, MonitorPower)")),
                       "inspect_hardware")
        return active

    def _straggler_signals(self, h: Any, entity: str, st: GPUState, dev: dict[str, Any], now: float) -> None:
        if st.name is None:
            name = self._call("nvmlDeviceGetName", h, entity=entity)
            st.name = (name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name))[:96] \
                if name is not None else None
        pcie = dev.get("pcie") or {}
        vec = st.vector
        vec.update({"index": dev["index"], "name": st.name, "pcie_gen": pcie.get("gen"),
                    "pcie_width": pcie.get("width"), "nvlinks": dev.get("nvlinks", 0),
                    "nvlinks_down": len(dev.get("nvlinks_down", []))})
        partial: dict[str, int] = {}  # rate -> the count behind it, for the rates measured over a partial window
        self._pcie_replays(h, entity, st, pcie, now, partial)
        self._nvlink_errors(h, entity, st, int(dev.get("nvlinks", 0)), now, partial)
        self._thermal(h, entity, st)
        self._gpm(h, entity, st)
        if partial:
            # measured over less than the window (the history is younger than it): the rate shown is an
            # extrapolation; the counted increase is what a comparison may use (docs/straggler-signals.md)
            vec["partial"] = list(partial)
            vec["partial_counts"] = partial
        else:
            vec.pop("partial", None)
            vec.pop("partial_counts", None)
        for type_, (t, severity, reason, message, details) in list(st.over.items()):
            if now - t <= self.config.error_hold_down:
                self._cond(type_, entity, severity, reason, message, details, "inspect_hardware")
            else:
                del st.over[type_]

    def _hold(self, st: GPUState, type_: str, now: float, severity: Severity, reason: str, message: str,
              details: dict[str, Any]) -> None:
        """An error-rate finding stays firing ``error_hold_down`` after the last window over its threshold:
        a sporadic error every few minutes is one condition, not a firing/resolved pair per error."""
        prev = st.over.get(type_)
        if prev is not None and now - prev[0] <= self.config.error_hold_down and \
                severity_rank(prev[1]) > severity_rank(severity):
            severity = prev[1]
        st.over[type_] = (now, severity, reason, message, details)

    def _pcie_replays(self, h: Any, entity: str, st: GPUState, pcie: dict[str, Any], now: float,
                      partial: dict[str, int]) -> None:
        raw = self._call("nvmlDeviceGetPcieReplayCounter", h, entity=entity)
        limit = pcie_replay_limit_per_min(pcie.get("gen"), pcie.get("width"))
        st.vector["pcie_replay_limit_per_min"] = limit
        if raw is not None and not valid_reading(raw, PCIE_REPLAY_BITS):
            self._impossible(entity, "nvmlDeviceGetPcieReplayCounter", raw)
            raw = None
        if raw is not None:
            st.pcie.add(now, raw)
            st.metrics["pcie_replay"] = raw
        stats = st.pcie.stats(HEALTH_WINDOW) if raw is not None else None
        st.vector["pcie_replay_per_min"] = round(stats.per(60.0), 3) if stats else None
        if stats is None:
            return
        if not stats.full:
            partial["pcie_replay_per_min"] = stats.count
        if limit is not None and stats.over(limit, HEALTH_WINDOW):
            rate = stats.per(60.0)
            self._hold(st, "GPUPCIeReplayRate", now, "warning", "ReplayRateAboveBER",
                       f"GPU {entity[4:]} PCIe link replays {rate:.1f}/min at Gen{pcie.get('gen')} "
                       f"x{pcie.get('width')}, above DCGM's {limit}/min (a 1e-12 bit error rate): its transfers "
                       f"are retransmitted and every rank waits for them.",
                       wire(GPUPCIeReplayRate(
                           replays=stats.count, window_s=round(stats.span, 3), full_window=stats.full,
                           rate_per_min=round(rate, 3), limit_per_min=limit, gen=pcie.get("gen"),
                           width=pcie.get("width"),
                           rule="replays/min > ceil(1e-12 x lane Gb/s x 1e9 x 60 x lanes)",
                           field="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                           citation=f"{DCGM_HEALTH} GetExpectedPcieReplayRate, MonitorPcie (WARN)")))

    def _nvlink_errors(self, h: Any, entity: str, st: GPUState, links: int, now: float,
                       partial: dict[str, int]) -> None:
        raw_total: dict[int, int] = {}
        per_link: dict[str, int] = {}
        for link in range(links):
            for counter, (name, _field) in NVLINK_ERRORS.items():
                value = self._call("nvmlDeviceGetNvLinkErrorCounter", h, link, counter, entity=entity,
                                   key=f"nvmlDeviceGetNvLinkErrorCounter:{name}", absent=(NVML_ERROR_INVALID_ARGUMENT,))
                if value is None:
                    continue
                if not valid_reading(value, NVLINK_COUNTER_BITS):
                    self._impossible(entity, f"nvmlDeviceGetNvLinkErrorCounter:{name}", value)
                    continue
                st.nvlink.setdefault((link, counter), CounterWindow(HEALTH_WINDOW, NVLINK_COUNTER_BITS)).add(now, value)
                raw_total[counter] = raw_total.get(counter, 0) + value
                per_link[f"{link}:{name}"] = value
        for key in [k for k in st.nvlink if k[0] >= links]:
            del st.nvlink[key]  # a link this GPU no longer reports
        st.metrics["nvlink_total"] = raw_total
        st.metrics["nvlink_link"] = per_link
        offending: list[NVLinkCounter] = []
        for counter, (name, dcgm_field) in NVLINK_ERRORS.items():
            stats = {link: s for (link, c), w in st.nvlink.items() if c == counter
                     if (s := w.stats(HEALTH_WINDOW)) is not None}
            if not stats:
                st.vector[f"nvlink_{name}_per_min"] = None
                continue
            total = WindowStats(sum(s.count for s in stats.values()), max(s.span for s in stats.values()),
                                all(s.full for s in stats.values()))
            st.vector[f"nvlink_{name}_per_min"] = round(total.per(60.0), 3)
            if not total.full:
                partial[f"nvlink_{name}_per_min"] = total.count
            if total.count < DCGM_LIMIT_MAX_NVLINK_ERROR:
                continue
            severity: Severity = "warning"
            rule = f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (DCGM WARN)"
            if name in ("replay", "recovery"):
                severity, rule = "critical", f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (DCGM FAIL)"
            elif total.per(1.0) >= DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:
                severity, rule = "critical", f">= {DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:g}/s (DCGM FAIL)"
            offending.append(NVLinkCounter(
                counter=name, field=dcgm_field, count=total.count, window_s=round(total.span, 3),
                full_window=total.full, rate_per_min=round(total.per(60.0), 3), severity=severity, rule=rule,
                links={str(link): s.count for link, s in sorted(stats.items()) if s.count}))
        if offending:
            worst: Severity = "critical" if any(o.severity == "critical" for o in offending) else "warning"
            names = ", ".join(o.counter for o in offending)
            self._hold(st, "GPUNVLinkErrors", now, worst, "NVLinkErrorRate",
                       f"GPU {entity[4:]} NVLink {names} errors in the last minute: the links retry and this GPU's "
                       f"collectives run slower than its peers'.",
                       wire(GPUNVLinkErrors(counters=offending,
                                            citation=f"{DCGM_HEALTH} MonitorNVLink4Fields; {DCGM_LIMITS}")))

    def _field_values(self, h: Any, entity: str, ids: tuple[int, ...]) -> dict[int, int | float | None]:
        values = self._call("nvmlDeviceGetFieldValues", h, list(ids), entity=entity)
        out: dict[int, int | float | None] = dict.fromkeys(ids)
        if values is None:
            return out
        try:
            for i, fid in enumerate(ids):
                out[fid] = field_value(values[i])
        except (IndexError, TypeError):
            self._impossible(entity, "nvmlDeviceGetFieldValues", type(values).__name__)
        return out

    def _temp(self, entity: str, call: str, value: Any) -> int | float | None:
        if value is None:
            return None
        if not plausible_temp(value):
            self._impossible(entity, call, value)
            return None
        out: int | float = value
        return out

    def _thermal(self, h: Any, entity: str, st: GPUState) -> None:
        bus = entity[4:]
        gpu_temp = self._call("nvmlDeviceGetTemperatureV", h, NVML_TEMPERATURE_GPU, entity=entity)
        if gpu_temp is None:  # drivers before nvmlDeviceGetTemperatureV
            gpu_temp = self._call("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU, entity=entity)
        gpu_temp = self._temp(entity, "nvmlDeviceGetTemperature", gpu_temp)
        margin = self._temp(entity, "nvmlDeviceGetMarginTemperature",
                            self._call("nvmlDeviceGetMarginTemperature", h, entity=entity))
        fields = self._field_values(h, entity, (NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT))
        mem_temp = self._temp(entity, "NVML_FI_DEV_MEMORY_TEMP", fields[NVML_FI_DEV_MEMORY_TEMP])
        tlimit = self._temp(entity, "NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT",
                            fields[NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT])
        thr = {k: self._temp(entity, f"nvmlDeviceGetTemperatureThreshold:{k}",
                             self._call("nvmlDeviceGetTemperatureThreshold", h, v, entity=entity,
                                        key=f"nvmlDeviceGetTemperatureThreshold:{k}"))
               for k, v in TEMP_THRESHOLDS.items()}
        st.metrics.update(gpu_temp=gpu_temp, memory_temp=mem_temp, margin=margin, slowdown=thr["slowdown"],
                          shutdown=thr["shutdown"])
        source = None
        tmargin: int | float | None = None
        if margin is not None:
            tmargin, source = margin, "tlimit"  # NVML's signed T.Limit margin (DCGM field 153)
        elif gpu_temp is not None and thr["slowdown"] is not None:
            tmargin, source = thr["slowdown"] - gpu_temp, "slowdown_threshold"  # no T.Limit (A100 and older)
        st.vector.update(thermal_margin_c=tmargin, thermal_margin_source=source, gpu_temp_c=gpu_temp,
                         memory_temp_c=mem_temp)
        found: list[ThermalFinding] = []
        if margin is not None and tlimit is not None and margin < tlimit:
            found.append(ThermalFinding(
                severity="critical", reason="PastHWSlowdownTLimit", margin_c=margin, limit_c=tlimit,
                rule="T.Limit margin < slowdown T.Limit offset (NVML field 194)", citation=TLIMIT_SOURCE))
        elif margin is not None and margin <= self.config.thermal_margin_warning_c:
            found.append(ThermalFinding(
                severity="warning", reason="TLimitMarginExhausted", margin_c=margin,
                limit_c=self.config.thermal_margin_warning_c,
                rule="T.Limit margin <= 0: at or past max operating temperature, clocks may be reduced",
                citation=f"nvidia-smi T.Limit, as tabulated in {TLIMIT_SOURCE}"))
        elif margin is None and gpu_temp is not None and thr["slowdown"] is not None and gpu_temp >= thr["slowdown"]:
            found.append(ThermalFinding(
                severity="critical", reason="AtHWSlowdownTemp", temp_c=gpu_temp, limit_c=thr["slowdown"],
                rule="GPU temp >= NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", citation=NVML_THRESHOLDS))
        elif margin is None and gpu_temp is not None and thr["gpu_max"] is not None and gpu_temp >= thr["gpu_max"]:
            found.append(ThermalFinding(
                severity="warning", reason="AtMaxOperatingTemp", temp_c=gpu_temp, limit_c=thr["gpu_max"],
                rule="GPU temp >= NVML_TEMPERATURE_THRESHOLD_GPU_MAX", citation=NVML_THRESHOLDS))
        if mem_temp is not None and thr["memory_max"] is not None and mem_temp >= thr["memory_max"]:
            found.append(ThermalFinding(
                severity="warning", reason="MemoryAtSWSlowdownTemp", temp_c=mem_temp, limit_c=thr["memory_max"],
                rule="memory temp >= NVML_TEMPERATURE_THRESHOLD_MEM_MAX", citation=NVML_THRESHOLDS))
        if found:
            worst = max(found, key=lambda f: severity_rank(f.severity))
            self._cond("GPUThermalMarginLow", entity, worst.severity, worst.reason,
                       f"GPU {bus} runs at its thermal limit ({', '.join(f.reason for f in found)}): its clocks "
                       f"are reduced and it falls behind its peers.",
                       wire(GPUThermalMarginLow(
                           findings=found, thermal_margin_c=tmargin, gpu_temp_c=gpu_temp, memory_temp_c=mem_temp,
                           thresholds_c=thr, slowdown_tlimit_c=tlimit, field="DCGM_FI_DEV_GPU_TEMP_LIMIT")),
                       "inspect_hardware")

    def _free_gpm_sample(self, sample: Any) -> None:
        free = getattr(self.lib(), "nvmlGpmSampleFree", None)
        if free is not None:
            try:
                free(sample)
            except Exception as exc:  # a sample of a GPU that fell off the bus: nothing left to free
                log.debug("nvml_gpm_free_failed", error=repr(exc))

    def _gpm(self, h: Any, entity: str, st: GPUState) -> None:
        """GPM (Hopper and later) utilisation between this pass's sample and the previous one, as DCGM
        computes its DCGM_FI_PROF_* fields on these GPUs (DcgmGpmManager: nvmlGpmMetricsGet over two samples,
        percentages divided by 100, NaN is blank)."""
        if not self.config.gpm:
            return
        lib = self.lib()
        if st.gpm_supported is None:
            support = self._call("nvmlGpmQueryDeviceSupport", h, entity=entity)
            st.gpm_supported = bool(getattr(support, "isSupportedDevice", 0)) if support is not None else False
            if not st.gpm_supported:
                self._unsupported(entity, "nvmlGpmQueryDeviceSupport")
        if not st.gpm_supported:
            return
        sample = self._call("nvmlGpmSampleAlloc", entity=entity)
        if sample is None:
            return
        try:
            if self._call("nvmlGpmSampleGet", h, sample, entity=entity) is None:
                self._free_gpm_sample(sample)
                return
        except GPULost:
            self._free_gpm_sample(sample)
            raise
        prev, st.gpm_sample = st.gpm_sample, sample
        if prev is None:
            return  # the first sample: utilisation needs two
        try:
            mg = lib.c_nvmlGpmMetricsGet_t()
            mg.version = getattr(lib, "NVML_GPM_METRICS_GET_VERSION", NVML_GPM_METRICS_GET_VERSION)
            ids = list(GPM_METRICS)
            mg.numMetrics = len(ids)
            mg.sample1, mg.sample2 = prev, sample
            for i, metric in enumerate(ids):
                mg.metrics[i].metricId = metric
            if self._call("nvmlGpmMetricsGet", mg, entity=entity) is None:
                return
            for i, metric in enumerate(ids):
                dcgm_field, name = GPM_METRICS[metric]
                m = mg.metrics[i]
                value = m.value
                if m.nvmlReturn != 0 or not math.isfinite(value):
                    st.vector.pop(name, None)
                    st.metrics.pop(dcgm_field, None)
                    continue
                if not 0.0 <= value <= 100.0:
                    self._impossible(entity, f"nvmlGpmMetricsGet:{name}", value)
                    continue
                st.vector[name] = round(value / 100.0, 4)
                st.metrics[dcgm_field] = value / 100.0
            self._tensor_idle(entity, st)
        finally:
            self._free_gpm_sample(prev)

    # -- how the GPU is used and set up (docs/nvml-checks.md) ------------------------------
    def _verdict_cond(self, type_: str, entity: str, reason: str, message: str, details: dict[str, Any]) -> None:
        v = verdict(type_, reason)  # gna_types/policy.py
        self._cond(type_, entity, v.severity, reason, message, details, v.action)

    def _tensor_idle(self, entity: str, st: GPUState) -> None:
        """SM busy and the tensor pipes idle in every GPM sample for ``tensor_idle_window``: nvidia-smi shows
        100 % utilisation while the job spins on communication or runs its matrices on CUDA cores."""
        cfg, now = self.config, self._now
        sm, tensor = st.vector.get("sm_active"), st.vector.get("tensor_active")
        if sm is None or tensor is None or not (sm > cfg.tensor_idle_sm_active_min and
                                                tensor < cfg.tensor_idle_tensor_active_max):
            st.tensor_idle_since = None
            return
        if st.tensor_idle_since is None:
            # the sample covers the interval since the previous one: the run began then
            st.tensor_idle_since = now - cfg.interval
        held = now - st.tensor_idle_since
        if held < cfg.tensor_idle_window:
            return
        self._verdict_cond(
            "GPUTensorPipeIdle", entity, "SMBusyTensorIdle",
            f"GPU {entity[4:]} SMs {sm:.0%} active with tensor pipes {tensor:.0%} for {held:.0f} s: busy but "
            f"waiting (communication, or matrix work off the tensor cores).",
            wire(GPUTensorPipeIdle(
                sm_active=sm, tensor_active=tensor, sm_active_min=cfg.tensor_idle_sm_active_min,
                tensor_active_max=cfg.tensor_idle_tensor_active_max, held_s=round(held, 1),
                window_s=cfg.tensor_idle_window,
                fields=["DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"],
                rule=f"SM_ACTIVE > {cfg.tensor_idle_sm_active_min:g} and PIPE_TENSOR_ACTIVE < "
                     f"{cfg.tensor_idle_tensor_active_max:g} in every sample for {cfg.tensor_idle_window:g} s",
                citation=TENSOR_IDLE_SOURCE)))

    def _mig_devices(self, h: Any, entity: str) -> dict[str, int]:
        """This MIG-enabled GPU's MIG devices by profile (as the device plugin tells them apart: by
        nvmlDeviceGetAttributes; named <GPU instance slices>g.<memory MB>mb)."""
        out: dict[str, int] = {}
        top = self._call("nvmlDeviceGetMaxMigDeviceCount", h, entity=entity)
        if not isinstance(top, int):
            return out
        for i in range(min(top, MAX_MIG_DEVICES)):
            mh = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, i,
                            absent=(NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT))
            if mh is None:
                continue
            attrs = self._call("nvmlDeviceGetAttributes", mh)
            key = f"{getattr(attrs, 'gpuInstanceSliceCount', '?')}g.{getattr(attrs, 'memorySizeMB', '?')}mb" \
                if attrs is not None else "unknown"
            out[key[:64]] = out.get(key[:64], 0) + 1
        return out

    def _mig_findings(self, devices: list[dict[str, Any]]) -> None:
        enabled = [d for d in devices if (d.get("mig") or {}).get("current") == 1]
        if not enabled:
            return
        disabled = [d for d in devices if (d.get("mig") or {}).get("current") == 0]
        profiles: dict[str, int] = {}
        for d in enabled:
            for k, n in d["mig"].get("profiles", {}).items():
                profiles[k] = profiles.get(k, 0) + n
        pid: int | None = None
        strategy: str | None
        if self.config.mig_strategy != "auto":
            strategy, source = self.config.mig_strategy, "config"
        else:
            found = find_device_plugin(self.host)
            if found is None:
                strategy, source = None, "unknown"
            else:
                pid, strategy = found
                source = "cmdline_or_environ" if strategy is not None else "default"
                strategy = strategy or "none"
        gfd, gfd_why = self._gfd_disagreement(strategy, sum(profiles.values()))
        for d in enabled:
            n = sum(d["mig"].get("profiles", {}).values())
            if n == 0:
                reason = "NoMIGDevices"
                message = f"GPU {d['entity'][4:]} has MIG enabled and no MIG device: nothing of it can be scheduled."
            elif strategy == "none":
                reason = "StrategyNoneWithMIG"
                message = (f"GPU {d['entity'][4:]} has MIG enabled and the device plugin runs --mig-strategy=none: "
                           f"its {n} MIG devices are not advertised.")
            elif strategy == "single" and disabled:
                reason = "MIGDisabledGPUUnderSingle"
                message = (f"--mig-strategy=single with {len(disabled)} GPU(s) of this node MIG-disabled: the "
                           f"device plugin refuses the node (GPU {d['entity'][4:]}).")
            elif strategy == "single" and len(profiles) > 1:
                reason = "MixedProfilesUnderSingle"
                message = (f"--mig-strategy=single with MIG devices of {len(profiles)} profiles "
                           f"({', '.join(sorted(profiles))}): the device plugin refuses the node "
                           f"(GPU {d['entity'][4:]}).")
            elif gfd_why:
                reason = gfd_why
                message = (f"GPU Feature Discovery's labels say mig.strategy={gfd.strategy if gfd else '?'} while the "
                           f"device plugin runs --mig-strategy={strategy}: pods selecting by these labels ask for "
                           f"resources the plugin does not advertise (GPU {d['entity'][4:]})."
                           if gfd_why == "GFDStrategyDiffers" else
                           f"GPU Feature Discovery's labels count {gfd.mig_devices() if gfd else '?'} MIG devices, "
                           f"NVML {sum(profiles.values())}: the labels describe another MIG layout (GPU "
                           f"{d['entity'][4:]}; GFD not relabelling, or the layout changed under it).")
            else:
                continue
            self._verdict_cond("GPUMIGMisconfigured", d["entity"], reason, message, wire(GPUMIGMisconfigured(
                mig_devices=n, profiles=dict(sorted(profiles.items())[:32]), mig_enabled_gpus=len(enabled),
                mig_disabled_gpus=len(disabled), strategy=strategy, strategy_source=source,
                **({"plugin_pid": pid} if pid is not None else {}),
                gfd_strategy=gfd.strategy[:64] if gfd else UNSET,
                gfd_file=self.config.gfd_labels_file[:256] if gfd else UNSET,
                gfd_mig_devices=c if gfd and (c := gfd.mig_devices()) is not None else UNSET,
                rule={"NoMIGDevices": "MIG enabled, 0 MIG devices",
                      "StrategyNoneWithMIG": "mig-strategy none, MIG enabled",
                      "MIGDisabledGPUUnderSingle": "mig-strategy single, a MIG-disabled GPU on the node",
                      "MixedProfilesUnderSingle": "mig-strategy single, > 1 MIG profile on the node",
                      "GFDStrategyDiffers": "GFD's mig.strategy label != the device plugin's --mig-strategy",
                      "GFDMIGCountDiffers": "GFD's MIG device count != NVML's"}[reason],
                citation=DEVICE_PLUGIN_SOURCE if not reason.startswith("GFD") else GFD_SOURCE)))

    def _gfd_disagreement(self, strategy: str | None, mig_devices: int) -> tuple[gfd_labels.GFDLabels | None, str]:
        """GFD's labels and what disagrees with them for ``gfd_grace`` s: ("", none), GFDStrategyDiffers (its
        strategy is not the plugin's) or GFDMIGCountDiffers (its MIG device count is not NVML's)."""
        if not self.config.gfd_labels_file:
            return None, ""
        gfd = gfd_labels.read(self.host, self.config.gfd_labels_file)
        if gfd is None:
            self._gfd_since.clear()
            return None, ""
        if gfd.unparsed:
            self.emit.unparsed(f"GFD labels {self.config.gfd_labels_file}",
                               f"{plural(gfd.unparsed, 'line')} no label or past a bound")
        why = ""
        if strategy is not None and gfd.strategy != strategy:
            why = "GFDStrategyDiffers"
        elif (labelled := gfd.mig_devices()) is not None and labelled != mig_devices:
            why = "GFDMIGCountDiffers"
        now = self._clock()
        for other in [k for k in self._gfd_since if k != why]:
            del self._gfd_since[other]
        if not why:
            return gfd, ""
        since = self._gfd_since.setdefault(why, now)
        return gfd, why if now - since >= self.config.gfd_grace else ""

    def _acs_between(self, topo: Topology, a: str, b: str) -> tuple[list[AcsPort], list[str]]:
        """The ports between two GPUs of one host bridge (the common switch port and both downward chains) whose
        ACS control redirects peer-to-peer traffic, and those whose extended config space was not readable."""
        ca, cb = topo.nodes[a].chain, topo.nodes[b].chain
        k = 0
        for x, y in zip(ca, cb, strict=False):
            if x != y:
                break
            k += 1
        ports = ([ca[k - 1]] if k else []) + list(ca[k:-1]) + list(cb[k:-1])
        redirect: list[AcsPort] = []
        unknown: list[str] = []
        for port in ports[:16]:
            try:
                with open(self.host.path(f"/sys/bus/pci/devices/{port}/config"), "rb") as f:
                    config = f.read(PCI_CFG_SPACE_EXP_SIZE)
            except OSError:
                unknown.append(port)
                continue
            acs = parse_acs(config)
            if acs is False:
                unknown.append(port)
            elif isinstance(acs, AcsState) and acs.redirects_p2p:
                redirect.append(AcsPort(port=port, control=acs.control, enabled=acs.enabled))
        return redirect, unknown

    def _p2p(self, handles: dict[str, Any]) -> None:
        """``nvidia-smi topo -p2p`` for the pairs that should have it: one PCIe switch (PIX/PXB) or an NVLink
        between them (direct, or both on NVSwitches)."""
        if not self.config.p2p or len(handles) < 2:
            return
        if self._topo is None:
            self._topo = read_topology(self.host)
        topo = self._topo
        gpus = [(e, h) for e, h in handles.items()][:MAX_P2P_GPUS]
        buses = {e[4:] for e, _h in gpus}
        for i, (ea, ha) in enumerate(gpus):
            for eb, hb in gpus[i + 1:]:
                a, b = ea[4:], eb[4:]
                ra, rb = self.gpus[ea].nvlink_remotes, self.gpus[eb].nvlink_remotes
                switched = bool(ra - buses) and bool(rb - buses)  # both reach an NVSwitch
                distance = pcie_distance(topo, a, b) if a in topo.nodes and b in topo.nodes else "unknown"
                caps: tuple[str, ...]
                if b in ra or a in rb or switched:
                    via, caps = "nvlink", ("nvlink",)
                elif distance in ("PIX", "PXB"):
                    via, caps = "pcie_switch", ("read", "write")
                else:
                    continue
                status: dict[str, str] = {}
                for cap in caps:
                    got = self._call("nvmlDeviceGetP2PStatus", ha, hb, P2P_CAPS[cap], entity=ea,
                                     key="nvmlDeviceGetP2PStatus")
                    if isinstance(got, int) and not isinstance(got, bool):
                        status[cap] = P2P_STATUS.get(got, f"status_{got}")
                if not status or all(v == "OK" for v in status.values()):
                    continue
                redirect, unknown = self._acs_between(topo, a, b) if via == "pcie_switch" and \
                    distance != "unknown" else ([], [])
                reason = "ACSRedirect" if redirect else "P2PNotSupported"
                bad = ", ".join(f"{k} {v}" for k, v in status.items() if v != "OK")
                cause = (f"; ACS redirects P2P on {', '.join(p.port for p in redirect)}" if redirect else "")
                self._verdict_cond("GPUP2PUnavailable", ea, reason,
                                   f"GPUs {a} and {b} ({'NVLink' if via == 'nvlink' else distance}) have no P2P: "
                                   f"{bad}{cause}.",
                                   wire(GPUP2PUnavailable(peer=b, expected_via=via, distance=distance,
                                                          status=status, acs_redirect=redirect,
                                                          acs_unknown=unknown, citation=P2P_SOURCE)))

    async def _publish_signals(self) -> None:
        """The per-GPU vector as one info event every ``signals_interval``, from the second pass on (the
        first has no rates)."""
        interval = self.config.signals_interval
        if not self.signals or self._passes < 2 or interval <= 0 or (
                self._signals_at is not None and self._now - self._signals_at < interval):
            return
        details = GPUStragglerSignals(
            schema=1, gpus=self.signals, truncated=max(0, len(self.gpus) - MAX_SIGNAL_GPUS),
            interval_s=interval,
            windows_s={"pcie_replay_per_min": HEALTH_WINDOW, "nvlink_*_per_min": HEALTH_WINDOW,
                       "clock_slowdown_held_s": self.config.clock_event_persist, "gpm": self.config.interval},
            thresholds={"pcie_replay_per_min": "> pcie_replay_limit_per_min",
                        "nvlink_crc_flit_per_min": f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (warning), "
                                                   f">= {DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:g}/s (critical)",
                        "nvlink_crc_data_per_min": f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (warning), "
                                                   f">= {DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:g}/s (critical)",
                        "nvlink_replay_per_min": f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (critical)",
                        "nvlink_recovery_per_min": f">= {DCGM_LIMIT_MAX_NVLINK_ERROR} per minute (critical)",
                        "clock_slowdown_held_s": f">= {self.config.clock_event_persist:g} s for "
                                                 f"{', '.join(self.config.clock_event_findings)}",
                        "thermal_margin_c": f"< slowdown T.Limit (critical), <= "
                                            f"{self.config.thermal_margin_warning_c:g} (warning)"},
            citation={"pcie": DCGM_HEALTH, "nvlink": f"{DCGM_HEALTH}; {DCGM_LIMITS}", "thermal": TLIMIT_SOURCE,
                      "gpm": DCGM_GPM},
        )
        if await self.emit.event("StragglerSignals", severity="info", entity="signals:gpu", reason="Periodic",
                                 message=f"Straggler signals of {plural(len(self.signals), 'GPU')}.",
                                 details=wire(details)):
            self._signals_at = self._now

    # -- Prometheus: DCGM's field names where DCGM has the quantity ------------------------
    def prometheus_families(self) -> list[Any]:
        """From the last pass (a scrape never calls NVML). Gauges, as dcgm-exporter exposes these fields: a
        prometheus_client counter would add ``_total`` and no DCGM dashboard would find the series."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["gpu", "pci_bus_id"]
        fams: dict[str, Any] = {}

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            if name not in fams:
                fams[name] = GaugeMetricFamily(name, doc, labels=[*labels, *extra])
            return fams[name]

        plain = {"pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays since the driver loaded"),
                 "clock_events": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Clock event reasons (nvmlClocksEventReason)"),
                 "gpu_temp": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (C)"),
                 "memory_temp": ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (C)"),
                 "margin": ("DCGM_FI_DEV_GPU_TEMP_LIMIT", "Thermal margin to the T.Limit (C, signed)"),
                 "slowdown": ("DCGM_FI_DEV_SLOWDOWN_TEMP", "Temperature at which HW slowdown begins (C)"),
                 "shutdown": ("DCGM_FI_DEV_SHUTDOWN_TEMP", "Temperature at which the GPU shuts down (C)")}
        for name, doc in plain.values():
            gauge(name, doc)  # present (without samples) on GPUs that lack them: the name is always there
        for name, dcgm_field in NVLINK_ERRORS.values():
            gauge(dcgm_field, f"NVLink {name} errors, all links")
        for dcgm_field, name in GPM_METRICS.values():
            gauge(dcgm_field, f"GPM {name} ratio (0-1) over the last interval")
        per_link = gauge("gna_nvml_nvlink_error_count", "NVLink error counter per link", ("link", "counter"))
        signal = gauge("gna_nvml_straggler_signal", "Per-GPU straggler signal vector (docs/straggler-signals.md)",
                       ("signal",))
        resets = CounterMetricFamily("gna_nvml_counter_resets", "Counter resets seen (driver reload, GPU reset)",
                                     labels=[*labels, "counter"])
        for bus, index, metrics, vector in self._export:
            lv = [index, bus]
            for metric, (name, _doc) in plain.items():
                if metrics.get(metric) is not None:
                    fams[name].add_metric(lv, float(metrics[metric]))
            for counter, total in metrics.get("nvlink_total", {}).items():
                fams[NVLINK_ERRORS[counter][1]].add_metric(lv, float(total))
            for key, value in metrics.get("nvlink_link", {}).items():
                link, _, name = key.partition(":")
                per_link.add_metric([*lv, link, name], float(value))
            for dcgm_field, _name in GPM_METRICS.values():
                if metrics.get(dcgm_field) is not None:
                    fams[dcgm_field].add_metric(lv, float(metrics[dcgm_field]))
            for key, value in vector.items():
                if isinstance(value, bool | int | float) and key != "index":
                    signal.add_metric([*lv, key], float(value))
            for counter, n in metrics.get("resets", {}).items():
                resets.add_metric([*lv, counter], n)
        unsupported = GaugeMetricFamily("gna_nvml_not_supported", "GPUs that answered NOT_SUPPORTED, per call "
                                        "(asked once per GPU)", labels=["call"])
        for call, gpus in sorted(self.unsupported.items()):
            unsupported.add_metric([call], len(gpus))
        impossible = CounterMetricFamily("gna_nvml_impossible_readings", "Readings rejected as impossible, per call",
                                         labels=["call"])
        for call, n in sorted(self.impossible.items()):
            impossible.add_metric([call], n)
        return [*fams.values(), resets, unsupported, impossible]

    # -- Xid events ---------------------------------------------------------------------
    def _xids_wanted(self) -> bool:
        if self.config.xid_events == "off":
            return False
        return self.config.xid_events == "on" or not self.emit.facts.get("kmsg_xid.active", False)

    async def run(self) -> None:
        unregister = gpu_release.register("nvml-collector", self._release, self._resume, order=10)
        try:
            while True:
                lib = self.lib()
                if lib is None or self.config.xid_events == "off":
                    # no NVML here (or released for a reset): wait for a resume, which sets _xid_go
                    self._xid_go.clear()
                    await self._xid_go.wait()
                    continue
                self._xid_parked.clear()
                try:
                    await self._xid_events(lib)
                finally:
                    self._xid_parked.set()
        finally:
            unregister()

    async def _xid_events(self, lib: Any) -> None:
        """Xid events until released for a reset (then the event set is freed and this returns)."""
        event_set = await asyncio.to_thread(lib.nvmlEventSetCreate)
        buses: dict[Any, str] = {}
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            try:
                lib.nvmlDeviceRegisterEvents(h, EVENT_XID, event_set)
                buses[h] = normal_pci(lib.nvmlDeviceGetPciInfo(h).busId)
            except Exception as exc:
                log.warning("nvml_xid_events_unavailable", index=i, error=repr(exc))
        try:
            while not self._released:
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
