"""Loading NVML (pynvml from nvidia-ml-py) once per process, and the helpers both NVML users share."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from gna_sdk import gpu_release

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6  # nvml.h: "a query to find an object was unsuccessful" (an empty MIG slot)
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

_lock = threading.Lock()
_state: dict[str, Any] = {}


def load_nvml() -> tuple[Any | None, str]:
    """(pynvml module after nvmlInit, "") or (None, why not). Initialised once; cheap to call. While
    :func:`suspend` holds NVML shut down (a GPU reset), (None, why) without initialising it again."""
    with _lock:
        if _state.get("suspended"):
            return None, f"NVML released by this agent: {_state['suspended']}"
        if "lib" in _state:
            return _state["lib"], _state["why"]
        try:
            import pynvml

            pynvml.nvmlInit()
            lib, why = pynvml, ""
            _register_release()
        except Exception as exc:  # NVMLError_LibraryNotFound here; DriverNotLoaded on a broken node
            lib, why = None, f"{type(exc).__name__}: {exc}"
        _state["lib"], _state["why"] = lib, why
        return lib, why


def suspend(reason: str) -> None:
    """Shut NVML down for the whole process, so that it holds no ``/dev/nvidia*`` file (nvml.h, nvmlShutdown:
    "releasing all GPU resources previously allocated with nvmlInit_v2()"; this module calls nvmlInit once,
    so one nvmlShutdown brings the reference count to zero). Until :func:`resume`, ``load_nvml`` answers
    (None, why) and initialises nothing. Every handle obtained before is invalid afterwards: callers take
    fresh handles each pass. Raises what nvmlShutdown raises (the state is still marked suspended)."""
    with _lock:
        lib = _state.get("lib")
        registered = _state.get("registered", False)
        _state.clear()
        _state["registered"] = registered
        _state["suspended"] = reason[:200] or "suspended"
        if lib is not None:
            lib.nvmlShutdown()


def resume() -> None:
    """End :func:`suspend`: the next ``load_nvml`` calls nvmlInit again."""
    with _lock:
        _state.pop("suspended", None)


def _register_release() -> None:
    """NVML as one holder of the GPUs for gna_sdk.gpu_release: shut down last (after the collectors that
    use it stopped their passes), initialised again first. Registered once, when NVML first loads."""
    if _state.get("registered"):
        return
    _state["registered"] = True

    async def release(reason: str) -> None:
        await asyncio.to_thread(suspend, reason)

    async def again(_reason: str) -> None:
        resume()

    gpu_release.register("nvml-library", release, again, order=100)


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None
