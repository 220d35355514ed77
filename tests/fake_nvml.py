"""A small, honest stand-in for pynvml: same call names and shapes, errors carry pynvml's codes.

Only what collectors/nvml.py and gpu_devices use. A GPU marked lost raises GPU_IS_LOST (15) on
every per-device call, as the real library does after Xid 79. Structures NVML fills in place
(nvmlGpmMetricsGet_t, nvmlFieldValue_t) and GPM samples are pynvml's own ctypes types, so a
collector that sets a field the real structure lacks fails here too. A call named in a GPU's
``unsupported`` answers NOT_SUPPORTED, as an older board or driver does.
"""

from __future__ import annotations

import collections
import ctypes
import queue
from dataclasses import dataclass, field
from typing import Any

import pynvml

NVML_ERROR_UNINITIALIZED = 1  # nvml.h nvmlReturn_t
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

# H100 SXM-like readings: far from every limit
H100_THRESHOLDS = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
                   pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87}
BUSY_GPM = {pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 97.0, pynvml.NVML_GPM_METRIC_SM_UTIL: 91.5,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 38.0, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 47.25,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 55.0, pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0,
            pynvml.NVML_GPM_METRIC_FP32_UTIL: 12.0, pynvml.NVML_GPM_METRIC_FP16_UTIL: 3.5}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


@dataclass
class FakeGPU:
    bus_id: str  # NVML form: 00000000:18:00.0
    lost: bool = False
    dbe_volatile: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    nvlinks: list[int] = field(default_factory=lambda: [1] * 18)
    pcie: tuple[int, int, int, int] = (5, 16, 5, 16)  # cur gen, cur width, max gen, max width
    clock_reasons: int = 0
    mig: tuple[int, int] | None = (0, 0)
    ecc_error: int | None = None  # an NVML error code nvmlDeviceGetTotalEccErrors raises (a sick driver)
    name: bytes = b"NVIDIA H100 80GB HBM3"
    pcie_replays: Any = 0  # whatever nvmlDeviceGetPcieReplayCounter returns (tests feed impossible values too)
    nvlink_errors: dict[tuple[int, int], Any] = field(default_factory=dict)  # (link, NVML_NVLINK_ERROR_DL_*) -> value
    temp: Any = 45
    memory_temp: int | None = 50
    margin: Any = 30  # T.Limit margin; None: NOT_SUPPORTED (A100 and older)
    slowdown_tlimit: int | None = -2  # NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT
    thresholds: dict[int, int] = field(default_factory=lambda: dict(H100_THRESHOLDS))
    gpm: dict[int, float] | None = field(default_factory=lambda: dict(BUSY_GPM))  # None: not a GPM device
    # calls answering NOT_SUPPORTED; "nvmlDeviceGetNvLinkErrorCounter:<NVML_NVLINK_ERROR_DL_*>" for one counter
    unsupported: set[str] = field(default_factory=set)


@dataclass
class _PciInfo:
    busId: str


@dataclass
class _EventData:
    device: Any
    eventData: int
    eventType: int = 0x8


class FakeNVML:
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self, gpus: list[FakeGPU]) -> None:
        self.gpus = gpus
        self.calls: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()  # per-device call -> times called
        self.events: queue.Queue[_EventData] = queue.Queue()
        self.registered: list[int] = []
        self.samples: dict[int, tuple[int, dict[int, float]] | None] = {}  # GPM sample address -> (gpu, readings)
        self._sample_refs: dict[int, Any] = {}
        self.initialized = True  # as after the collector's nvmlInit
        self.lifecycle: list[str] = []  # init, shutdown, event set create/free, in order
        self.used_uninitialized = 0  # device calls made between nvmlShutdown and nvmlInit (each raised)

    def nvmlInit(self) -> None:
        self.lifecycle.append("init")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        # nvml.h: "NVML_ERROR_UNINITIALIZED if the library has not been successfully initialized"
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.lifecycle.append("shutdown")
        self.initialized = False

    def _live(self) -> None:
        if not self.initialized:
            self.used_uninitialized += 1
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, h: int) -> FakeGPU:
        self._live()
        g = self.gpus[h]
        if g.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return g

    def _dev(self, h: int, call: str) -> FakeGPU:
        self.counts[call] += 1
        g = self._gpu(h)
        if call in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    @property
    def live_samples(self) -> int:
        """GPM samples allocated and not yet freed (a leak shows here)."""
        return sum(1 for v in self.samples.values() if v is not None)

    def nvmlDeviceGetCount(self) -> int:
        self._live()
        self.calls.append("count")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> _PciInfo:
        return _PciInfo(self._gpu(h).bus_id)

    def nvmlDeviceGetTotalEccErrors(self, h: int, etype: int, counter: int) -> int:
        assert (etype, counter) == (1, 0), "uncorrected, volatile"
        g = self._gpu(h)
        if g.ecc_error is not None:
            raise NVMLError(g.ecc_error)
        return g.dbe_volatile

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._gpu(h).remapped

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self._gpu(h).nvlinks
        if link >= len(links):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT if links else NVML_ERROR_NOT_SUPPORTED)
        return links[link]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h).pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h).pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h).pcie[3]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h).clock_reasons

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._dev(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> Any:
        return self._dev(h, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> Any:
        g = self._dev(h, "nvmlDeviceGetNvLinkErrorCounter")
        if f"nvmlDeviceGetNvLinkErrorCounter:{counter}" in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(g.nvlinks) or counter >= pynvml.NVML_NVLINK_ERROR_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetTemperatureV(self, h: int, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev(h, "nvmlDeviceGetTemperatureV").temp

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetMarginTemperature(self, h: int) -> Any:
        g = self._dev(h, "nvmlDeviceGetMarginTemperature")
        if g.margin is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.margin

    def nvmlDeviceGetTemperatureThreshold(self, h: int, threshold: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTemperatureThreshold")
        if threshold not in g.thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g.thresholds[threshold]

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]) -> Any:
        g = self._dev(h, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP and g.memory_temp is not None:
                values[i].valueType, values[i].value.uiVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, g.memory_temp
            elif fid == pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT and g.slowdown_tlimit is not None:
                values[i].valueType, values[i].value.siVal = pynvml.NVML_VALUE_TYPE_SIGNED_INT, g.slowdown_tlimit
            else:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        g = self._dev(h, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(g.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self.counts["nvmlGpmSampleAlloc"] += 1
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        addr = ctypes.addressof(sample.contents)
        self._sample_refs[addr] = sample
        self.samples[addr] = (-1, {})
        return sample

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        g = self._dev(h, "nvmlGpmSampleGet")
        addr = ctypes.addressof(sample.contents)
        if self.samples.get(addr) is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.samples[addr] = (h, dict(g.gpm or {}))
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self.counts["nvmlGpmMetricsGet"] += 1
        if mg.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.samples.get(ctypes.addressof(mg.sample1.contents))
        second = self.samples.get(ctypes.addressof(mg.sample2.contents))
        if first is None or second is None or first[0] != second[0] or first[0] < 0:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._gpu(second[0])
        for i in range(mg.numMetrics):
            metric = mg.metrics[i]
            if metric.metricId in second[1]:
                metric.nvmlReturn, metric.value = 0, second[1][metric.metricId]
            else:
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return mg

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.counts["nvmlGpmSampleFree"] += 1
        addr = ctypes.addressof(sample.contents)
        if self.samples.get(addr) is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a double free
        self.samples[addr] = None

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        mig = self._gpu(h).mig
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return mig

    def nvmlEventSetCreate(self) -> str:
        self._live()
        self.lifecycle.append("event set created")
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, event_set: str) -> None:
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> _EventData:
        self._live()
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self._live()
        self.lifecycle.append("event set freed")

    def inject_xid(self, index: int, xid: int) -> None:
        self.events.put(_EventData(device=index, eventData=xid))
