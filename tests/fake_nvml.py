"""A small, honest stand-in for pynvml: same call names and shapes, errors carry pynvml's codes.

Only what collectors/nvml.py and gpu_devices use. A GPU marked lost raises GPU_IS_LOST (15) on
every per-device call, as the real library does after Xid 79.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15


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


@dataclass
class _PciInfo:
    busId: str


@dataclass
class _EventData:
    device: Any
    eventData: int
    eventType: int = 0x8


class FakeNVML:
    def __init__(self, gpus: list[FakeGPU]) -> None:
        self.gpus = gpus
        self.calls: list[str] = []
        self.events: queue.Queue[_EventData] = queue.Queue()
        self.registered: list[int] = []

    def _gpu(self, h: int) -> FakeGPU:
        g = self.gpus[h]
        if g.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return g

    def nvmlDeviceGetCount(self) -> int:
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
        if self._gpu(h).ecc_error is not None:
            raise NVMLError(self._gpu(h).ecc_error)
        return self._gpu(h).dbe_volatile

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

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        mig = self._gpu(h).mig
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return mig

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, event_set: str) -> None:
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> _EventData:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def inject_xid(self, index: int, xid: int) -> None:
        self.events.put(_EventData(device=index, eventData=xid))
