"""Every host path the agent reads goes through HostRoot, so a fixture tree and a node run the same code."""

from __future__ import annotations

from pathlib import Path


class HostRoot:
    def __init__(self, root: str | Path = "/") -> None:
        self._root = Path(root).resolve()

    @property
    def root(self) -> Path:
        return self._root

    def path(self, host_path: str) -> Path:
        """Map an absolute host path ("/sys/class/...") under the root; never escapes it lexically."""
        rel = host_path.lstrip("/")
        return self._root / rel if rel else self._root

    def read_text(self, host_path: str, limit: int = 65536) -> str | None:
        """Small sysfs/procfs file as text, or None when absent/unreadable (callers count the skip)."""
        try:
            with open(self.path(host_path), "rb") as fh:
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return None

    def __repr__(self) -> str:
        return f"HostRoot({str(self._root)!r})"
