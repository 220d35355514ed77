"""`juicefs warmup --threads N --background` over the dataset paths configured for a mount.

Paths come from this plugin's config only (never from a message); at most one warmup per mount at
a time, and at most one per ``min_interval`` per mount.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import msgspec

from gna_sdk import Result, resolve_executable, run_command
from gna_sdk.hostroot import HostRoot


class WarmupConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    juicefs: str = ""
    threads: int = 50
    background: bool = True
    min_interval: float = 3600.0
    mounts: dict[str, list[str]] = msgspec.field(default_factory=dict)  # mountpoint -> dataset paths
    timeout: float = 120.0


class JuiceFSWarmupRemediation:
    name: ClassVar[str] = "juicefs_warmup"
    config_type: ClassVar[type[WarmupConfig]] = WarmupConfig
    needs_budget: ClassVar[bool] = False

    def __init__(self, config: WarmupConfig, host: HostRoot) -> None:
        self.config = config
        self.juicefs = resolve_executable("juicefs", config.juicefs)
        self.last: dict[str, float] = {}
        self.running: set[str] = set()

    def _mount(self, msg: dict[str, Any], args: dict[str, Any]) -> tuple[str, list[str]]:
        entity = str(msg.get("entity", ""))
        mount = str(args.get("mount") or entity.removeprefix("juicefs:").split(":", 1)[0])
        paths = self.config.mounts.get(mount)
        if not paths:
            raise ValueError(f"no dataset paths configured for mount {mount!r}")
        return mount, paths

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        mount, paths = self._mount(msg, args)
        return f"warm {len(paths)} dataset paths of {mount} ({self.config.threads} threads)"

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        mount, paths = self._mount(msg, args)
        if mount in self.running:
            return Result("already_done", f"a warmup of {mount} is running")
        since = time.monotonic() - self.last.get(mount, -1e12)
        if since < self.config.min_interval:
            return Result("already_done", f"{mount} was warmed {since:.0f}s ago (rate limit)")
        argv = [self.juicefs, "warmup", "--threads", str(self.config.threads)]
        if self.config.background:
            argv.append("--background")
        self.running.add(mount)
        try:
            rc, _out, err = await run_command([*argv, *paths], timeout=self.config.timeout)
        finally:
            self.running.discard(mount)
        if rc != 0:
            return Result("failed", f"juicefs warmup exited {rc}: {err.strip()}")
        self.last[mount] = time.monotonic()
        return Result("executed", f"warmup of {mount} started", {"paths": paths})
