"""Severity and suggested action, decided in one place: for every (type, reason) whose grade is a policy
rather than a fact (who is at fault, how sure the evidence is), one row with the reason it is so.

`cordon` only when the node's hardware or host set-up is at fault and the evidence is unambiguous
(NVML says the fabric is not registered, the firmware grades an Xid Fatal); a host set-up step that
cannot be confirmed is `fix_config`; a job's own choices are `fix_config` and never a cordon;
hardware that may be at fault is `inspect_hardware`. The documentation's tables are generated from
these (``python -m gna_types.generate``; docs/messages.md for ``GRADED``, docs/topology.md sections 4
and 8 for ``TOPOLOGY_FINDINGS`` and ``NCCL_PATH_FINDINGS``); tests keep them equal.

Not here: NVIDIA's Xid catalog (collectors/xid_catalog.py, a catalog of NVIDIA's own buckets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "warning", "critical"]
SuggestedAction = Literal[
    "none", "cordon", "reload_module", "warmup", "reboot", "inspect_hardware", "fix_config"
]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
SUGGESTED_ACTIONS: tuple[SuggestedAction, ...] = (
    "none", "cordon", "reload_module", "warmup", "reboot", "inspect_hardware", "fix_config",
)


@dataclass(frozen=True)
class Verdict:
    severity: Severity
    action: SuggestedAction
    why: str


# Findings whose grade depends on who is at fault (kmsg_xid, nccl_logs): docs/messages.md's policy table.
GRADED: dict[tuple[str, str], Verdict] = {
    ("NCCLSocketFallback", "SocketChosenByJob"): Verdict(
        "warning", "fix_config",
        "the job set NCCL_IB_DISABLE or NCCL_NET=Socket (its log's 'set by environment' echo or "
        "/proc/<pid>/environ): a job setting, not a node fault"),
    ("NCCLSocketFallback", "NoIBDeviceInJob"): Verdict(
        "warning", "fix_config",
        "NCCL saw no IB device (or no libibverbs) while the node's ports are ACTIVE: the job's container "
        "does not see the HCAs"),
    ("NCCLSocketFallback", "NoRDMAOnNode"): Verdict(
        "info", "none",
        "the node has no ACTIVE IB/RoCE port: sockets are the only transport"),
    ("NCCLSocketFallback", "SocketTransport"): Verdict(
        "critical", "inspect_hardware",
        "sockets on an IB node with no explanation in the log: ambiguous, so never a cordon on its own"),
    ("GPUXidError", "Nonfatal"): Verdict(
        "warning", "none",
        "Xid 144-150 graded Nonfatal by the firmware's own word; NVIDIA's catalog resolves most IGNORE "
        "(leptonai/gpud#1174)"),
    ("GPUXidError", "Fatal"): Verdict(
        "critical", "cordon",
        "Xid 144-150 graded Fatal: NVLink5 fatal error"),
    ("NvidiaPeermemError", "KnownHarmless"): Verdict(
        "info", "none",
        "'detected invalid context' is a harmless diagnostic of a mitigation (NVIDIA, "
        "Mellanox/nv_peer_memory#120), gone in R560+"),
    ("NvidiaPeermemError", "RegistrationFailed"): Verdict(
        "warning", "none",
        "nvidia-peermem could not register with the RDMA stack: kernel_modules judges GPUDirect RDMA"),
    ("NvidiaPeermemError", "P2PError"): Verdict(
        "warning", "none",
        "a GPU memory pin/map for GPUDirect RDMA failed"),
    ("KernelLogUnparsable", "NotKmsgFormat"): Verdict(
        "warning", "fix_config",
        "the kmsg source holds no kernel record in any known rendering: every Xid is missed"),
}

# The PCIe tree, NVLinks and the NVSwitch fabric (topology): docs/topology.md section 4.
TOPOLOGY_FINDINGS: dict[tuple[str, str], Verdict] = {
    ("PCIeLinkDegraded", "WidthBelowMax"): Verdict(
        "warning", "inspect_hardware",
        "a GPU's `current_link_width` is below min(its `max_link_width`, its upstream port's): always "
        "checked"),
    ("PCIeLinkDegraded", "SpeedBelowMaxUnderLoad"): Verdict(
        "warning", "inspect_hardware",
        "`current_link_speed` below min(both ends' `max_link_speed`) while NVML says the GPU is at least "
        "`busy_utilization_pct` busy; GPUs drop link speed when idle, so without NVML the speed is not "
        "judged"),
    ("NVLinkDegraded", "FewerNVLinksThanExpected"): Verdict(
        "warning", "inspect_hardware",
        "NVSwitch system: a GPU with fewer switch links up than expected (`expected_nvlinks_per_pair`, "
        "else the most links NVML lists for any GPU of the node); direct NVLink: a pair below the most "
        "it had since boot (persisted per boot) or the configured count"),
    ("NVLinkDegraded", "NoNVLinkLeft"): Verdict(
        "critical", "inspect_hardware",
        "the same with no link left: that traffic falls back to PCIe"),
    ("FabricManagerNotRunning", "GPUsNotRegistered"): Verdict(
        "critical", "cordon",
        "NVSwitch system, processes visible, no `nv-fabricmanager`, and NVML reports GPUs not registered"),
    ("FabricManagerNotRunning", "NoProcess"): Verdict(
        "critical", "fix_config",
        "the same without NVML to confirm"),
    ("FabricManagerNotRunning", "FabricRegistered"): Verdict(
        "warning", "none",
        "no process, every GPU's fabric COMPLETED: running work goes on, the next driver load or GPU "
        "reset will not register"),
    ("GPUFabricNotReady", "NotStarted"): Verdict(
        "critical", "cordon",
        "`nvmlDeviceGetGpuFabricInfoV`: `NVML_GPU_FABRIC_STATE_NOT_STARTED` (1)"),
    ("GPUFabricNotReady", "InProgress"): Verdict(
        "critical", "cordon",
        "`NVML_GPU_FABRIC_STATE_IN_PROGRESS` (2)"),
    ("GPUFabricNotReady", "UnknownState"): Verdict(
        "critical", "cordon",
        "a state nvidia-ml-py does not define"),
    ("GPUFabricNotReady", "CompletedWithError"): Verdict(
        "critical", "cordon",
        "`COMPLETED` (3) with a non-zero `status` (an NVML return code); not held back by the grace "
        "period"),
}

# A rank's NIC and GPUDirect RDMA level against this node's PCIe tree (nccl_logs, nccl_env): docs/topology.md
# section 8. A job's log never cordons: a far NIC whose port is down is the node's hardware (inspect_hardware);
# a NIC the job's NCCL_IB_HCA or container hid, a level the job set, are the job's configuration (fix_config).
NCCL_PATH_FINDINGS: dict[tuple[str, str], Verdict] = {
    ("NCCLFarNIC", "NearestNICDown"): Verdict(
        "warning", "inspect_hardware",
        "a rank's own NIC is farther than its GPU's nearest, which has no ACTIVE port"),
    ("NCCLFarNIC", "NearestNICNotSelected"): Verdict(
        "warning", "fix_config",
        "the same, the nearest NIC up but never listed by NCCL (NCCL_IB_HCA, the container)"),
    ("NCCLFarNIC", "NearestNICUnused"): Verdict(
        "warning", "fix_config",
        "the same, the nearest NIC listed by NCCL but not used by these channels"),
    ("NCCLGDRLevel", "GDRDisabledByLevel"): Verdict(
        "warning", "fix_config",
        "the level is tighter than the rank's GPU-NIC distance: GPUDirect RDMA off, traffic staged in "
        "host memory"),
    ("NCCLGDRLevel", "InvalidLevel"): Verdict(
        "warning", "fix_config",
        "NCCL ignores the value (not an exact name, not a number) and keeps its default"),
    ("NCCLGDRLevel", "IntegerLevel"): Verdict(
        "warning", "fix_config",
        "a legacy integer (2.6+), mapped through `levelsOldToNew`"),
    ("NCCLGDRLevel", "NotReadByThisVersion"): Verdict(
        "info", "fix_config",
        "NCCL before 2.4 reads `NCCL_IB_GDR_LEVEL` instead"),
}

# the page and marker name each table is generated into (gna_types/generate.py)
TABLES: dict[str, tuple[str, dict[tuple[str, str], Verdict]]] = {
    "graded": ("docs/messages.md", GRADED),
    "topology": ("docs/topology.md", TOPOLOGY_FINDINGS),
    "nccl-paths": ("docs/topology.md", NCCL_PATH_FINDINGS),
}

POLICY: dict[tuple[str, str], Verdict] = {k: v for _page, table in TABLES.values() for k, v in table.items()}
assert len(POLICY) == sum(len(t) for _p, t in TABLES.values()), "a (type, reason) in two tables"


def verdict(type_: str, reason: str) -> Verdict:
    """The row for (type_, reason); KeyError for one no table holds (a programming error: tests cover
    every reason each collector emits)."""
    return POLICY[(type_, reason)]
