"""Xid classification, in one place: every Xid of NVIDIA's catalog (collectors/formats/xid_catalog_data.py,
generated from NVIDIA's Xid catalog by ``python -m collectors.formats.xid_catalog_generate``) with its
description, NVIDIA's resolution bucket and this agent's grade for it.

13/31/43/45/68 are usually the application's fault — one crashing job can make them appear on
many nodes at once — so they are warnings and never a reason to cordon on their own. Xid 144-150 carry
the firmware's own Fatal/Nonfatal word; Xid 154 names the GPU's new recovery action. An Xid not in the
catalog is reported as such (reason ``XidUnknown``), never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collectors.formats.xid_catalog_data import BUCKET_GRADES, CATALOG
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
    nvidia_action: str  # the catalog's resolution bucket ("UNKNOWN" for an Xid not in the catalog)
    fatal: bool  # raises GPUFatalXid until the GPU is seen healthy again (reset/reboot class)
    application: bool = False
    known: bool = True  # in NVIDIA's catalog


# Xid 144-150 (NVLink5) carry their own severity: "<UNIT> Fatal|Nonfatal XC0 i0 Link N (...)", written by
# the GPU's firmware (only the "NVRM: Xid (PCI:...): %d, " prefix is in open-gpu-kernel-modules; the
# body as logged in leptonai/gpud#1160/#1174, NVIDIA/nccl#2241). A Nonfatal one is not a reason to
# cordon: NVIDIA's catalog resolves most of them IGNORE (some RESET_GPU after evaluation).
_SELF_GRADED = range(144, 151)
_GRADE = re.compile(r"^\s*[A-Z0-9_/]+ (?P<grade>Fatal|Nonfatal)\b")

# Xid 154 (GPU_RECOVERY_ACTION_CHANGED, nverror.h): "GPU recovery action changed from 0x%x (%s) to 0x%x (%s)",
# printed by _gpuRefreshRecoveryActionInLock with _gpuRecoveryActionName's words (NVIDIA/open-gpu-kernel-modules
# 595.45.04 src/nvidia/src/kernel/gpu/gpu.c; NV2080_CTRL_GPU_RECOVERY_ACTION in ctrl2080gpu.h: 0 None,
# 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET, 5 RECOVER_IMEX_DOMAIN). Logs of other driver
# branches print other numbers and words ("0x2 (GPU Reset Required)", "0x2 (OS Reboot)", "0x1 (PF FLR)"), so the
# words decide and the number only when the words are unknown. The new action becomes the Xid's bucket.
_RECOVERY = re.compile(r"recovery action changed from\s+0x[0-9a-fA-F]+\s*\([^)]*\)\s+to\s+"
                       r"0x(?P<num>[0-9a-fA-F]{1,8})\s*\((?P<words>[^)]{0,64})\)", re.IGNORECASE)
_RECOVERY_WORDS = {
    "none": "IGNORE", "gpu reset required": "RESET_GPU", "gpu reset": "RESET_GPU", "reset": "RESET_GPU",
    "pf flr": "RESET_GPU", "bus reset": "RESET_GPU", "drain and reset": "RESET_GPU",
    "node reboot required": "RESTART_BM", "node reboot": "RESTART_BM", "os reboot": "RESTART_BM",
    "system reboot": "RESTART_BM", "drain p2p": "DRAIN_P2P", "recover imex domain": "RECOVER_IMEX_DOMAIN",
}
_RECOVERY_NUMBERS = {0: "IGNORE", 1: "RESET_GPU", 2: "RESTART_BM", 3: "DRAIN_P2P", 4: "RESET_GPU",
                     5: "RECOVER_IMEX_DOMAIN"}
UNKNOWN_NAME = "not in NVIDIA's catalog"


def recovery_action(text: str) -> tuple[str, str] | None:
    """Xid 154's new recovery action: (the driver's words, the bucket they mean), or None."""
    m = _RECOVERY.search(text[:512])
    if m is None:
        return None
    words = " ".join(m["words"].split())
    bucket = _RECOVERY_WORDS.get(words.lower()) or _RECOVERY_NUMBERS.get(int(m["num"], 16))
    return (words, bucket) if bucket else None


def classify(code: int, text: str = "") -> XidInfo:
    entry = CATALOG.get(code)
    if entry is None:
        g = BUCKET_GRADES[""]
        return XidInfo(code, UNKNOWN_NAME, g.severity, g.action, "UNKNOWN", fatal=False, known=False)
    if code in _SELF_GRADED and (m := _GRADE.match(text)):
        v = verdict("GPUXidError", m["grade"])
        fatal = m["grade"] == "Fatal"
        return XidInfo(code, entry.name, v.severity, v.action,
                       "WORKFLOW_NVLINK5_ERR" if fatal else "IGNORE_OR_EVALUATE", fatal=fatal)
    if code == 154 and (rec := recovery_action(text)):
        words, bucket = rec
        g = BUCKET_GRADES[bucket]
        return XidInfo(code, f"{entry.name} to {words}"[:200], g.severity, g.action, bucket, fatal=g.fatal)
    return XidInfo(code, entry.name, entry.severity, entry.action, entry.immediate or "UNSPECIFIED",
                   fatal=entry.fatal, application=entry.application)


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
        "GPUXidError", severity=info.severity, entity=entities.gpu(bus),
        reason=f"Xid{info.code}" if info.known else "XidUnknown",
        message=(f"Xid {info.code} ({info.name}) on GPU {bus}" if info.known
                 else f"Xid {info.code}: {UNKNOWN_NAME}, on GPU {bus}") + f"{who}{times}"
                + (" (NVML event)" if source == "nvml" else "") + ".",
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
