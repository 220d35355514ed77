"""Severity and action for findings whose grade depends on who is at fault, in one table.

`cordon` only when the node's hardware or host set-up is at fault and the evidence is unambiguous; a
job's own choices are `fix_config`. docs/messages.md shows the same table (tests/test_verdicts.py keeps
the two equal). The Xid catalog proper lives in collectors/xid_catalog.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from gna_sdk import Severity, SuggestedAction


@dataclass(frozen=True)
class Verdict:
    severity: Severity
    action: SuggestedAction
    why: str


# (type, reason) -> verdict
POLICY: dict[tuple[str, str], Verdict] = {
    ("NCCLSocketFallback", "SocketChosenByJob"): Verdict(
        "warning", "fix_config", "the job set NCCL_IB_DISABLE or NCCL_NET=Socket (its log's 'set by environment' "
        "echo or /proc/<pid>/environ): a job setting, not a node fault"),
    ("NCCLSocketFallback", "NoIBDeviceInJob"): Verdict(
        "warning", "fix_config", "NCCL saw no IB device (or no libibverbs) while the node's ports are ACTIVE: the "
        "job's container does not see the HCAs"),
    ("NCCLSocketFallback", "NoRDMAOnNode"): Verdict(
        "info", "none", "the node has no ACTIVE IB/RoCE port: sockets are the only transport"),
    ("NCCLSocketFallback", "SocketTransport"): Verdict(
        "critical", "inspect_hardware", "sockets on an IB node with no explanation in the log: ambiguous, so "
        "never a cordon on its own"),
    ("GPUXidError", "Nonfatal"): Verdict(
        "warning", "none", "Xid 144-150 graded Nonfatal by the firmware's own word; NVIDIA's catalog resolves most "
        "IGNORE (leptonai/gpud#1174)"),
    ("GPUXidError", "Fatal"): Verdict("critical", "cordon", "Xid 144-150 graded Fatal: NVLink5 fatal error"),
    ("NvidiaPeermemError", "KnownHarmless"): Verdict(
        "info", "none", "'detected invalid context' is a harmless diagnostic of a mitigation (NVIDIA, "
        "Mellanox/nv_peer_memory#120), gone in R560+"),
    ("NvidiaPeermemError", "RegistrationFailed"): Verdict(
        "warning", "none", "nvidia-peermem could not register with the RDMA stack: kernel_modules judges "
        "GPUDirect RDMA"),
    ("NvidiaPeermemError", "P2PError"): Verdict("warning", "none", "a GPU memory pin/map for GPUDirect RDMA failed"),
    ("KernelLogUnparsable", "NotKmsgFormat"): Verdict(
        "warning", "fix_config", "the kmsg source holds no kernel record in any known rendering: every Xid is "
        "missed"),
}


def verdict(type_: str, reason: str) -> Verdict:
    return POLICY[(type_, reason)]
