"""In-process blackboard where collectors leave what others can use.

Example: kmsg_xid records ``kernel.module_errors`` (peermem load failures) that
kernel_modules attaches as evidence; kernel_modules records ``kernel.modules`` that the
NCCL collector cross-checks. Values are plain data; a key has one writer.
"""

from __future__ import annotations

import time
from typing import Any


class FactStore:
    def __init__(self) -> None:
        self._data: dict[str, tuple[float, Any]] = {}

    def set(self, key: str, value: Any) -> None:
        self._data[key] = (time.time(), value)

    def get(self, key: str, default: Any = None, *, max_age: float | None = None) -> Any:
        item = self._data.get(key)
        if item is None or (max_age is not None and time.time() - item[0] > max_age):
            return default
        return item[1]

    def keys(self) -> list[str]:
        return sorted(self._data)
