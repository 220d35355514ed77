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
    reason: list[str] = msgspec.field(default_factory=list)  # empty: any (IncidentCulprit: the culprit's kind)

    def matches(self, msg: dict[str, Any]) -> bool:
        status = msg.get("status") or "event"
        return ((not self.type or any(fnmatch.fnmatchcase(msg.get("type", ""), t) for t in self.type))
                and (not self.severity or msg.get("severity") in self.severity)
                and (not self.collector or msg.get("collector") in self.collector)
                and fnmatch.fnmatchcase(msg.get("entity", ""), self.entity)
                and (not self.status or status in self.status)
                and (not self.reason or msg.get("reason") in self.reason))


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


class Ladder(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The repair steps for the triggers it matches, tried in order until a validation passes."""

    name: str
    match: Match
    steps: list[str] = msgspec.field(default_factory=list)  # remediation plugin names; empty: validate only
    # software evidence alone: named a suspect in the audits, back in service when the first validation passes
    # (every episode validates before its first step: that waits for a job to leave the GPUs, and a fault that
    # has cleared needs no repair)
    suspect: bool = False


class RepairConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """After a cordon: drain, repair step by step, validate, and only then uncordon (agent/remediation/repair.py)."""

    enabled: bool = True
    drain_with: str = "drain"  # the plugin that drains a cordoned node ("" : none; Slurm's DRAIN drains itself)
    validate_level: str = "standard"
    # a validation refused as busy (a job still holds the GPUs) is tried again every validate_retry_delay until
    # the GPUs are free (never a repair under a job); after validate_retries tries the audit says it waits
    validate_retries: int = 6
    validate_retry_delay: float = 60.0
    settle: float = 30.0  # after a repair step, before validating (a reset GPU re-initialises)
    reboot_wait: float = 1800.0  # a reboot requested and the agent still up after this long: the step failed
    repeat_max: int = 3  # repair episodes of one node or GPU within repeat_window before it stays out
    repeat_window: float = 7 * 86400.0
    default_ladders: bool = True
    ladders: list[Ladder] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.validate_level not in ("quick", "standard", "full"):
            raise ValueError("validate_level is quick, standard or full")
        if self.repeat_max < 1 or self.repeat_window <= 0 or self.validate_retries < 0:
            raise ValueError("repeat_max >= 1, repeat_window > 0 and validate_retries >= 0")


class RemediationsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    enforce: bool = False  # dry-run by default: audit what would be done, do nothing
    default_policy: bool = True
    cordon_with: str = "kubernetes"  # or "slurm"
    uncordon_hold_down: float = 900.0  # every trigger resolved for this long before uncordoning
    rules: list[Rule] = msgspec.field(default_factory=list)
    plugins: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)  # per plugin: dry_run + settings
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    # a cordoned node returns only after `validate` passes (false: after the hold-down alone, as before)
    validate_before_uncordon: bool = True
    repair: RepairConfig = msgspec.field(default_factory=RepairConfig)


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


# Software evidence alone (the correlator's verdict, a job's own symptom): the node is a suspect.
SUSPECT_TYPES = ["IncidentCulprit", "NCCLSocketFallback"]
GPU_FAULT_TYPES = ["GPUFatalXid", "GPUEccUncorrectable", "GPUGSPTimeout", "GPULost", "GPUFellOffBus",
                   "GPUPCIeAERError"]


def default_ladders() -> list[Ladder]:
    """Which repair comes first for which culprit, following NVSentinel's fault-remediation (RESET_GPU
    before RESTART_BM, a hand-off when neither helps) and NVIDIA's Xid catalog resolutions (docs/repair.md)."""
    return [
        # the correlator's verdict names hardware (its culprit's kind, the message's reason): its ladder
        Ladder(name="culprit-gpu", match=Match(type=["IncidentCulprit"], reason=["gpu"], entity="gpu:*"),
               steps=["gpu_reset", "reboot_request", "breakfix"]),
        Ladder(name="culprit-network", match=Match(type=["IncidentCulprit"], reason=["hca_port", "transport"]),
               steps=["reboot_request", "breakfix"]),
        Ladder(name="suspect-software-evidence", match=Match(type=SUSPECT_TYPES, status=["firing", "event"]),
               steps=["reboot_request", "breakfix"], suspect=True),
        Ladder(name="gpu-row-remap-failure", match=Match(type=["GPURowRemapFailure"]), steps=["breakfix"]),
        Ladder(name="gpu-fault", match=Match(type=GPU_FAULT_TYPES, entity="gpu:*"),
               steps=["gpu_reset", "reboot_request", "breakfix"]),
        Ladder(name="driver-or-devices", match=Match(type=["GPUDevicesMissing", "NvidiaControlDeviceMissing",
                                                           "KernelModuleNotLoaded", *GPU_FAULT_TYPES]),
               steps=["reboot_request", "breakfix"]),
        Ladder(name="network", match=Match(type=["IBPortDown", "IBPortFlapping", "IBDeviceMissing"]),
               steps=["reboot_request", "breakfix"]),
        Ladder(name="anything-else", match=Match(type=["*"], status=["firing", "event"]), steps=["breakfix"]),
    ]


def ladder_for(cfg: RepairConfig, msg: dict[str, Any]) -> Ladder:
    """The first ladder (configured before the defaults) whose match takes the message."""
    for ladder in [*cfg.ladders, *(default_ladders() if cfg.default_ladders else [])]:
        if ladder.match.matches(msg):
            return ladder
    return Ladder(name="none", match=Match(), steps=[])
