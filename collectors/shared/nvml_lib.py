"""Loading NVML (pynvml from nvidia-ml-py) once per process, and the helpers both NVML users share."""

from __future__ import annotations

import threading
from typing import Any

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
    """(pynvml module after nvmlInit, "") or (None, why not). Initialised once; cheap to call."""
    with _lock:
        if "lib" in _state:
            return _state["lib"], _state["why"]
        try:
            import pynvml

            pynvml.nvmlInit()
            lib, why = pynvml, ""
        except Exception as exc:  # NVMLError_LibraryNotFound here; DriverNotLoaded on a broken node
            lib, why = None, f"{type(exc).__name__}: {exc}"
        _state["lib"], _state["why"] = lib, why
        return lib, why


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None
