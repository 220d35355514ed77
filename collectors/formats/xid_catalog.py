"""Xid classification, in one place (NVIDIA's catalog actions; see shared field facts section 3).

13/31/43/45/68 are usually the application's fault — one crashing job can make them appear on
many nodes at once — so they are warnings and never a reason to cordon on their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gna_sdk import Emitter, Severity, SuggestedAction
from gna_types import entities
from gna_types.detail_fields import UNSET, UnsetType
from gna_types.gpu_details import GPUXidError, NVSwitchSXidError, WindowSummary, XidEvidence
from gna_types.node_details import wire
from gna_types.policy import verdict


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    severity: Severity
    action: SuggestedAction
    nvidia_action: str  # the catalog's resolution bucket
    fatal: bool  # raises GPUFatalXid until the GPU is seen healthy again (reset/reboot class)
    application: bool = False


_NAMES = {
    13: "Graphics Engine Exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors", 46: "GPU stopped processing (hardware)",
    48: "Double Bit ECC Error", 61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 68: "Video processor exception",
    69: "Graphics Engine class error", 74: "NVLink Error", 79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate", 94: "Contained ECC error", 95: "Uncontained ECC error",
    109: "Context Switch Timeout Error", 110: "Security Fault Error", 119: "GSP RPC Timeout",
    120: "GSP Error", 140: "Unrecovered ECC Error", 143: "GPU Initialization Failure",
}

REBOOT = {79}
RESET_GPU = {46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158}
DRAIN = {48, 74, *range(144, 151)}
APPLICATION = {13, 31, 43, 45, 68}
RESTART_APP = {69, 94}
IGNORE = {63, 92}
CONTACT_SUPPORT = {61}


# Xid 144-150 (NVLink5) carry their own severity: "<UNIT> Fatal|Nonfatal XC0 i0 Link N (...)", written by
# the GPU's firmware (only the "NVRM: Xid (PCI:...): %d, " prefix is in open-gpu-kernel-modules; the
# body as logged in leptonai/gpud#1160/#1174, NVIDIA/nccl#2241). A Nonfatal one is not a reason to
# cordon: NVIDIA's catalog resolves most of them IGNORE (some RESET_GPU after evaluation).
_SELF_GRADED = range(144, 151)
_GRADE = re.compile(r"^\s*[A-Z0-9_/]+ (?P<grade>Fatal|Nonfatal)\b")


def classify(code: int, text: str = "") -> XidInfo:
    name = _NAMES.get(code, f"Xid {code}")
    if code in _SELF_GRADED and (m := _GRADE.match(text)):
        v = verdict("GPUXidError", m["grade"])
        fatal = m["grade"] == "Fatal"
        return XidInfo(code, name, v.severity, v.action, "WORKFLOW_NVLINK5_ERR" if fatal else "IGNORE_OR_EVALUATE",
                       fatal=fatal)
    if code in REBOOT:
        return XidInfo(code, name, "critical", "reboot", "REBOOT_SYSTEM", fatal=True)
    if code in RESET_GPU:
        return XidInfo(code, name, "critical", "cordon", "RESET_GPU", fatal=True)
    if code in APPLICATION:
        return XidInfo(code, name, "warning", "none", "RESTART_APP", fatal=False, application=True)
    if code in DRAIN:
        return XidInfo(code, name, "critical", "cordon", "WORKFLOW_DRAIN", fatal=True)
    if code in RESTART_APP:
        return XidInfo(code, name, "warning", "none", "RESTART_APP", fatal=False)
    if code in IGNORE:
        return XidInfo(code, name, "info", "none", "IGNORE", fatal=False)
    if code in CONTACT_SUPPORT:
        return XidInfo(code, name, "critical", "inspect_hardware", "CONTACT_SUPPORT", fatal=False)
    return XidInfo(code, name, "warning", "inspect_hardware", "UNKNOWN", fatal=False)


async def emit_xid(emit: Emitter, info: XidInfo, bus: str, *, source: str, count: int = 1, span: str = "",
                   evidence: XidEvidence | None = None, window: WindowSummary | None = None, process: str = "",
                   pid: int | None = None) -> bool:
    """The one GPUXidError: the first occurrence (count 1, with its record's ``evidence``) and its summaries
    (count > 1, ``span`` the records' own span, ``window`` what the aggregator adds) carry the same severity
    and action, from whichever source saw it."""
    who = f", process {process} (pid {pid})" if process and pid else ""
    times = f" repeated {count} times {span}".rstrip() if count > 1 else ""
    e, w = evidence, window
    details = GPUXidError(
        xid=info.code, name=info.name, nvidia_action=info.nvidia_action, application_error=info.application,
        count=w.count if w else count, source=source,
        pid=e.pid if e else UNSET, process=e.process if e else UNSET, mig=e.mig if e else UNSET,
        text=e.text if e else UNSET, logged_at=e.logged_at if e else UNSET,
        window_s=w.window_s if w else UNSET, aggregated=w.aggregated if w else UNSET,
        first_seen=w.first_seen if w else UNSET, span_s=w.span_s if w else UNSET)
    return await emit.event(
        "GPUXidError", severity=info.severity, entity=entities.gpu(bus), reason=f"Xid{info.code}",
        message=f"Xid {info.code} ({info.name}) on GPU {bus}{who}{times}" + (" (NVML event)" if source == "nvml"
                                                                            else "") + ".",
        details=wire(details), suggested_action=info.action)


async def emit_sxid(emit: Emitter, bus: str, code: int, *, fatal: bool, count: int = 1, span: str = "",
                    switch: str = "", text: str = "", logged_at: str | UnsetType = UNSET,
                    window: WindowSummary | None = None) -> bool:
    """The one NVSwitchSXidError: a fatal SXid is critical with inspect_hardware, its summary too."""
    severity: Severity = "critical" if fatal else "warning"
    what = f"{switch} reported SXid {code}: {text[:200]}" if count == 1 else \
        f"SXid {code}{' (fatal)' if fatal else ''} on NVSwitch {bus} repeated {count} times {span}".rstrip() + "."
    w = window
    details = NVSwitchSXidError(
        sxid=code, fatal=fatal, switch=switch or None, text=text or None, count=w.count if w else count,
        logged_at=logged_at, window_s=w.window_s if w else UNSET, aggregated=w.aggregated if w else UNSET,
        first_seen=w.first_seen if w else UNSET, span_s=w.span_s if w else UNSET)
    return await emit.event(
        "NVSwitchSXidError", severity=severity, entity=entities.nvswitch(bus), reason=f"SXid{code}", message=what,
        details=wire(details), suggested_action="inspect_hardware" if fatal else "none")
