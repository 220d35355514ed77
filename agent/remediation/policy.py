"""Remediation rules: config schema and the safe default policy (every action starts in dry-run)."""

from __future__ import annotations

import fnmatch
from typing import Any

import msgspec

from gna_types.subjects import BUDGET_BUCKET

# Critical hardware conditions that justify taking a node out of scheduling. Application-class
# Xids never appear here: GPUXidError is an event, and GPUFatalXid only fires for reset/reboot Xids.
CORDON_TYPES = ["GPUFellOffBus", "GPUFatalXid", "GPUDevicesMissing", "GPULost", "NvidiaControlDeviceMissing",
                "GPUEccUncorrectable", "GPURowRemapFailure", "GPUGSPTimeout", "GPUPCIeAERError",
                "IBPortDown", "IBPortFlapping", "IBDeviceMissing",
                "KernelModuleNotLoaded", "NCCLSocketFallback",
                # the fleet correlator's verdict (central cordoner only): the node that stalled a job
                "IncidentCulprit"]


class Match(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: list[str] = msgspec.field(default_factory=list)  # globs; empty: any
    severity: list[str] = msgspec.field(default_factory=list)
    collector: list[str] = msgspec.field(default_factory=list)
    entity: str = "*"  # glob
    status: list[str] = msgspec.field(default_factory=lambda: ["firing"])  # "event" matches events

    def matches(self, msg: dict[str, Any]) -> bool:
        status = msg.get("status") or "event"
        return ((not self.type or any(fnmatch.fnmatchcase(msg.get("type", ""), t) for t in self.type))
                and (not self.severity or msg.get("severity") in self.severity)
                and (not self.collector or msg.get("collector") in self.collector)
                and fnmatch.fnmatchcase(msg.get("entity", ""), self.entity)
                and (not self.status or status in self.status))


class Rule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    match: Match
    action: str  # a plugin name, or "cordon" (the plugin named by cordon_with)
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    cooldown: float = 600.0  # per (rule, entity): no repeat within this
    max_attempts: int = 3  # failed attempts before giving up on (rule, entity)
    backoff: float = 60.0  # wait after a failure, doubling


class BudgetConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bucket: str = BUDGET_BUCKET
    max_nodes: int = 5
    max_percent: float = 10.0  # of nodes heartbeating in gna-nodes; the smaller limit wins
    window: float = 3600.0


class RemediationsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    enforce: bool = False  # dry-run by default: audit what would be done, do nothing
    default_policy: bool = True
    cordon_with: str = "kubernetes"  # or "slurm"
    uncordon_hold_down: float = 900.0  # every trigger resolved for this long before uncordoning
    rules: list[Rule] = msgspec.field(default_factory=list)
    plugins: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)  # per plugin: dry_run + settings
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)


def default_rules() -> list[Rule]:
    return [
        Rule(name="cordon-on-critical-hardware", action="cordon",
             match=Match(type=[t for t in CORDON_TYPES if t not in ("KernelModuleNotLoaded",)],
                         severity=["critical"], entity="*")),
        Rule(name="cordon-without-nvidia-driver", action="cordon",
             match=Match(type=["KernelModuleNotLoaded"], severity=["critical"], entity="module:nvidia")),
        Rule(name="reload-nvidia-peermem", action="modprobe", args={"module": "nvidia_peermem"},
             match=Match(type=["KernelModuleNotLoaded"], entity="module:nvidia_peermem"), cooldown=300.0),
        Rule(name="warm-cold-juicefs-cache", action="juicefs_warmup",
             match=Match(type=["JuiceFSCacheHitRatioLow", "JuiceFSCacheCold"], collector=["juicefs"]),
             cooldown=3600.0,
             max_attempts=2),
    ]


def effective_rules(cfg: RemediationsConfig) -> list[Rule]:
    rules = (default_rules() if cfg.default_policy else []) + list(cfg.rules)
    return [msgspec.structs.replace(r, action=cfg.cordon_with) if r.action == "cordon" else r for r in rules]
