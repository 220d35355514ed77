"""Drain a Slurm node (`scontrol update ... State=DRAIN`); resume only when the drain reason is ours."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import msgspec

from gna_sdk import Result, resolve_executable, run_command
from gna_sdk.hostroot import HostRoot

REASON_PREFIX = "gpu-node-agent:"
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TYPE = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")


class SlurmConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scontrol: str = ""
    node_name: str = ""  # the Slurm name when it differs from the agent's node name
    timeout: float = 30.0


def _checked(msg: dict[str, Any], cfg: SlurmConfig) -> tuple[str, str]:
    node, type_ = cfg.node_name or msg.get("node", ""), msg.get("type", "")
    if not _NODE.fullmatch(node) or not _TYPE.fullmatch(type_):
        raise ValueError(f"refusing node {node!r} / type {type_!r}: not a plain name")
    return node, type_


def parse_show_node(text: str) -> dict[str, str]:
    """`scontrol show node` -> {"State": ..., "Reason": ...}; Reason runs to the end of its line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            out["Reason"] = line[len("Reason="):]
            continue
        for token in line.split():
            k, sep, v = token.partition("=")
            if sep:
                out.setdefault(k, v)
    return out


class SlurmRemediation:
    name: ClassVar[str] = "slurm"
    config_type: ClassVar[type[SlurmConfig]] = SlurmConfig
    needs_budget: ClassVar[bool] = True

    def __init__(self, config: SlurmConfig, host: HostRoot) -> None:
        self.config = config
        self.scontrol = resolve_executable("scontrol", config.scontrol)

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        node, type_ = _checked(msg, self.config)
        return f"drain Slurm node {node} (Reason={REASON_PREFIX} {type_})"

    async def _show(self, node: str) -> dict[str, str]:
        rc, out, err = await run_command([self.scontrol, "show", "node", node], timeout=self.config.timeout)
        if rc != 0:
            raise RuntimeError(f"scontrol show node {node}: {err.strip() or rc}")
        return parse_show_node(out)

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        node, type_ = _checked(msg, self.config)
        state = await self._show(node)
        if "DRAIN" in state.get("State", ""):
            return Result("already_done", f"already draining (Reason={state.get('Reason', '')})")
        rc, _out, err = await run_command(
            [self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={REASON_PREFIX} {type_}"],
            timeout=self.config.timeout)
        return Result("executed", f"drained {node}") if rc == 0 else Result("failed", err.strip() or f"rc {rc}")

    async def mark_for_replacement(self, msg: dict[str, Any], why: str) -> Result:
        """Keep our drain, its reason saying the node is to be replaced (an operator's `sinfo -R` shows it)."""
        node, type_ = _checked({**msg, "type": msg.get("type") or "X"}, self.config)
        state = await self._show(node)
        if not state.get("Reason", "").startswith(REASON_PREFIX):
            return Result("already_done", f"drain reason is not ours ({state.get('Reason', '')!r}): left alone")
        reason = f"{REASON_PREFIX} replace ({type_})"
        rc, _out, err = await run_command([self.scontrol, "update", f"NodeName={node}", "State=DRAIN",
                                           f"Reason={reason}"], timeout=self.config.timeout)
        return Result("executed", f"{node}: {reason}") if rc == 0 else Result("failed", err.strip() or f"rc {rc}")

    async def uncordon(self, msg: dict[str, Any]) -> Result:
        node, _ = _checked({**msg, "type": msg.get("type") or "X"}, self.config)
        state = await self._show(node)
        if not state.get("Reason", "").startswith(REASON_PREFIX):
            return Result("already_done", f"drain reason is not ours ({state.get('Reason', '')!r}): left alone")
        rc, _out, err = await run_command([self.scontrol, "update", f"NodeName={node}", "State=RESUME"],
                                          timeout=self.config.timeout)
        return Result("executed", f"resumed {node}") if rc == 0 else Result("failed", err.strip() or f"rc {rc}")
