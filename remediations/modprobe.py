"""Reload an allowlisted kernel module, then verify it through /sys/module/<name>/initstate."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import msgspec

from gna_sdk import Result, resolve_executable, run_command
from gna_sdk.hostroot import HostRoot


class ModprobeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    modprobe: str = ""
    allowed: list[str] = msgspec.field(default_factory=lambda: ["nvidia_peermem"])
    verify_timeout: float = 5.0
    timeout: float = 60.0


class ModprobeRemediation:
    name: ClassVar[str] = "modprobe"
    config_type: ClassVar[type[ModprobeConfig]] = ModprobeConfig
    needs_budget: ClassVar[bool] = False

    def __init__(self, config: ModprobeConfig, host: HostRoot) -> None:
        self.config = config
        self.host = host
        self.modprobe = resolve_executable("modprobe", config.modprobe)

    def _module(self, args: dict[str, Any]) -> str:
        module = str(args.get("module", ""))
        if module not in self.config.allowed:
            raise ValueError(f"module {module!r} is not in the allowlist {self.config.allowed}")
        return module

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        return f"load kernel module {self._module(args)}"

    def _loaded(self, module: str) -> bool:
        return (self.host.read_text(f"/sys/module/{module}/initstate") or "").strip() == "live"

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        module = self._module(args)
        if self._loaded(module):
            return Result("already_done", f"{module} is loaded")
        rc, _out, err = await run_command([self.modprobe, module], timeout=self.config.timeout)
        if rc != 0:
            return Result("failed", f"modprobe {module} exited {rc}: {err.strip()}", {"stderr": err.strip()})
        deadline = asyncio.get_running_loop().time() + self.config.verify_timeout
        while not self._loaded(module):
            if asyncio.get_running_loop().time() > deadline:
                return Result("failed", f"modprobe {module} succeeded but the module is not live")
            await asyncio.sleep(0.1)
        return Result("executed", f"{module} loaded and live")
