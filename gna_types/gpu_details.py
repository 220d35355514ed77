"""The ``details`` of the node's GPU messages, as typed, bounded Structs: Xids and SXids from the kernel log
(collectors/kmsg_xid.py, collectors/formats/xid_catalog.py), NVML's health findings and straggler vector
(collectors/nvml.py), the GPU device nodes and PCIe AER (collectors/gpu_devices.py), and the PCIe/NVLink
topology and NVSwitch fabric (collectors/topology.py).

Each field names where its format comes from as the collector cites it. A collector builds its details
through these classes (``gna_types.node_details.wire``), so a misspelt or missing field fails at
construction and in mypy instead of going out on the wire; the bounds are checked by the tests and the
published schema (agent/schema/message.schema.json), never by truncating on the node.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import Meta

from gna_types.detail_fields import (
    U64,
    UNSET,
    Celsius,
    Citation,
    Count,
    FilePath,
    KmsgText,
    Label,
    Name,
    Numbers,
    Occurrences,
    Pci,
    Ratio,
    Rule,
    Seconds,
    Severity,
    Timestamp,
    UnsetType,
    Vector,
    Word,
    Words,
)

XidCode = Annotated[int, Meta(ge=0, le=(1 << 32) - 1)]  # NVRM "Xid (PCI:...): <n>"; NVML's eventData (u32 Xid)
NvmlIndex = Annotated[int, Meta(ge=0, le=1023)]  # nvmlDeviceGetCount's index
Lanes = Annotated[int, Meta(ge=0, le=32)]  # PCIe link width x1..x32 (PCIe Base Spec, Link Capabilities)
PcieGen = Annotated[int, Meta(ge=0, le=16)]  # PCIe generation (NVML CurrPcieLinkGeneration; Gen6 today)
GTs = Annotated[float, Meta(ge=0, le=1024)]  # sysfs current_link_speed / max_link_speed, GT/s (64 for Gen6)
Percent = Annotated[int, Meta(ge=0, le=100)]  # nvmlDeviceGetUtilizationRates .gpu
NvLinks = Annotated[int, Meta(ge=0, le=64)]  # NVML_NVLINK_MAX_LINKS (18 on Hopper, 64 reserved)
# a GPU's straggler vector (docs/straggler-signals.md), carried as it came: the fleet compares it by name
GpuVectors = Annotated[dict[Pci, Vector], Meta(max_length=64)]  # collectors/nvml.py MAX_SIGNAL_GPUS


# -- the kernel log (collectors/kmsg_xid.py, collectors/formats/xid_catalog.py) ------------------------------------

class WindowSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a kernel-log summary adds to its type's details (collectors/kmsg_xid.py ``flush``: one per key and
    ``aggregation_window`` after the first, gna_sdk.Window): a construction part, not a message's details."""

    count: Count
    window_s: Seconds
    aggregated: bool
    first_seen: float  # the first record's wall time (time.time())
    span_s: Seconds  # the records' own span (their uptime stamps)


class XidEvidence(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A first Xid's record (collectors/formats/kmsg_records.py Xid): a construction part of ``GPUXidError``."""

    pid: Annotated[int, Meta(ge=0, le=(1 << 31) - 1)] | None
    process: Name | None
    mig: Name | None
    text: KmsgText
    logged_at: Timestamp | UnsetType = UNSET


class GPUXidError(Occurrences, kw_only=True, omit_defaults=True):
    """``GPUXidError``: one Xid (NVIDIA's Xid catalog, collectors/formats/xid_catalog.py) from the kernel log or an NVML
    event: the first occurrence with its record's evidence, then one summary per window."""

    xid: XidCode
    name: Name  # the catalog's short name ("not in NVIDIA's catalog" for an unknown code)
    nvidia_action: Word  # NVIDIA's resolution bucket: RESET_GPU, REBOOT_SYSTEM, RESTART_APP, IGNORE, ...
    application_error: bool
    source: Word  # "kmsg" | "nvml"
    # the first occurrence from the kernel log (collectors/formats/kmsg_records.py Xid): NVRM's pid=, name=, MIG part
    pid: Annotated[int, Meta(ge=0, le=(1 << 31) - 1)] | UnsetType | None = UNSET
    process: Name | UnsetType | None = UNSET
    mig: Name | UnsetType | None = UNSET
    text: KmsgText | UnsetType = UNSET


class GPUFatalXid(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUFatalXid``: every reset/reboot-class Xid this GPU hit since it was last trusted."""

    xids: Annotated[list[XidCode], Meta(max_length=256)]
    nvidia_action: Word
    logged_at: Timestamp | UnsetType = UNSET


class GPUFellOffBus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUFellOffBus``: Xid 79 or NVRM's "GPU has fallen off the bus" (the first 500 characters)."""

    text: Annotated[str, Meta(max_length=500)]
    logged_at: Timestamp | UnsetType = UNSET


class NVSwitchSXidError(Occurrences, kw_only=True, omit_defaults=True):
    """``NVSwitchSXidError``: nvidia-nvswitch's "SXid (PCI:...): <n>, Fatal/Non-fatal ..."
    (formats.kmsg_records SXid)."""

    sxid: XidCode
    fatal: bool
    switch: Name | None  # "nvidia-nvswitch3"; None in a summary
    text: KmsgText | None


class GPUGSPTimeout(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUGSPTimeout``: NVRM's GSP-RM failure lines, with or without an Xid (formats.kmsg_records GspEvent):
    a missed heartbeat, a memory-subsystem error, the "GSP Timeout" banner, "GSP core/RM unresponsive", the
    rate-limit notice that says the GPU needs a reset."""

    kinds: Words  # heartbeat | memsys | timeout | unresponsive | rate_limited, as seen since boot
    gpu_instance: NvmlIndex | None  # RM's "GPU<n>" of the line; None where it named a PCI address
    gpu_from: Word  # how the entity was found: "line" | "log" (an Xid naming both) | "pci_order" | "unresolved"
    text: KmsgText  # the worst line's own words
    logged_at: Timestamp | UnsetType = UNSET


class GPUPCIeAERError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUPCIeAERError``: the kernel's PCIe AER lines (formats.kmsg_records AerLine) on a GPU or a port above it:
    an uncorrectable fatal error, or a recovery that failed (err.c "device recovery failed", "can't recover")."""

    kinds: Words  # received | bus_error | cant_recover | recovery_failed, as seen since boot
    severity: Word | None  # the AER severity last printed for it: fatal | nonfatal; None where none was
    reported_by: Pci  # the device whose line it was (the GPU itself, or the port above it)
    text: KmsgText
    logged_at: Timestamp | UnsetType = UNSET


# -- NVML (collectors/nvml.py) -------------------------------------------------------------------------------

class GPULost(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPULost``: an NVML call answered NVML_ERROR_GPU_IS_LOST."""

    index: NvmlIndex
    call: Annotated[str, Meta(max_length=512)]  # the call and its error, as the GPULost exception says it


class GPUEccUncorrectable(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUEccUncorrectable``: nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)."""

    volatile_uncorrected: U64


class GPURowRemap(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPURowRemapPending`` / ``GPURowRemapFailure``: nvmlDeviceGetRemappedRows (corrRows, uncRows,
    isPending, failureOccurred)."""

    correctable: U64
    uncorrectable: U64
    pending: bool
    failure: bool


class GPUMIGModePending(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUMIGModePending``: nvmlDeviceGetMigMode (current, pending): NVML_DEVICE_MIG_DISABLE 0 / ENABLE 1."""

    current: Annotated[int, Meta(ge=0, le=1)]
    pending: Annotated[int, Meta(ge=0, le=1)]


class GPUTensorPipeIdle(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUTensorPipeIdle``: GPM's SM activity above and tensor pipe activity below their thresholds in every
    sample for ``held_s`` (DCGM_FI_PROF_SM_ACTIVE > 0.8 and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE < 0.3, sustained)."""

    sm_active: Ratio
    tensor_active: Ratio
    sm_active_min: Ratio  # the thresholds, as configured
    tensor_active_max: Ratio
    held_s: Seconds
    window_s: Seconds
    fields: Words
    rule: Rule
    citation: Citation


# "<gpuInstanceSliceCount>g.<memorySizeMB>mb" of nvmlDeviceGetAttributes
MigProfile = Annotated[str, Meta(max_length=64)]


class GPUMIGMisconfigured(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUMIGMisconfigured``: a MIG-enabled GPU the device plugin cannot advertise as MIG devices: none created
    (nvmlDeviceGetMigDeviceHandleByIndex finds none), or the plugin's ``--mig-strategy`` does not fit the
    node's MIG layout (NVIDIA/k8s-device-plugin mig-strategy.go, internal/mig/mig.go); or GPU Feature
    Discovery's labels disagree with the plugin's strategy or NVML's MIG devices."""

    mig_devices: Count  # MIG devices (GPU + compute instances) on this GPU
    profiles: Annotated[dict[MigProfile, Count], Meta(max_length=32)]  # this node's MIG devices by profile
    mig_enabled_gpus: Count
    mig_disabled_gpus: Count
    strategy: Word | None  # the device plugin's --mig-strategy; None: unknown
    strategy_source: Word  # cmdline | environ | default | config | unknown
    plugin_pid: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    # GPU Feature Discovery's labels (collectors/formats/gfd_labels.py), when its feature file exists
    gfd_strategy: Word | UnsetType = UNSET  # its nvidia.com/mig.strategy (no label: none)
    gfd_mig_devices: Count | UnsetType = UNSET  # the MIG devices its labels count
    gfd_file: Annotated[str, Meta(max_length=256)] | UnsetType = UNSET
    rule: Rule
    citation: Citation


class AcsPort(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One PCIe port between two GPUs and its ACS control register (PCI_ACS_CTRL)."""

    port: Pci
    control: Annotated[int, Meta(ge=0, le=0xFFFF)]
    enabled: Words


class GPUP2PUnavailable(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUP2PUnavailable``: nvmlDeviceGetP2PStatus for a GPU pair that should be P2P-capable (one PCIe switch,
    or NVLink-connected) is not NVML_P2P_STATUS_OK; the ports between them whose ACS redirects P2P."""

    peer: Pci
    expected_via: Word  # pcie_switch | nvlink
    distance: Word  # nvidia-smi's PCIe distance of the pair (PIX, PXB, ...)
    status: Annotated[dict[Word, Word], Meta(max_length=8)]  # caps index -> NVML_P2P_STATUS_* name
    acs_redirect: Annotated[list[AcsPort], Meta(max_length=16)]
    acs_unknown: Annotated[list[Pci], Meta(max_length=16)]  # ports whose extended config space was not readable
    citation: Citation


class GPUThrottled(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUThrottled``: nvmlDeviceGetCurrentClocksEventReasons held for ``clock_event_persist``
    (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, DCGM's one-minute health window)."""

    reasons: Words  # the held reasons among clock_event_findings
    held_s: Numbers
    mask: U64  # the nvmlClocksEventReason bit mask
    active: Words
    persist_s: Seconds
    field: Word
    citation: Citation


class GPUPCIeReplayRate(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUPCIeReplayRate``: nvmlDeviceGetPcieReplayCounter over DCGM's window against its lane x gen limit
    (DCGM GetExpectedPcieReplayRate)."""

    replays: Count
    window_s: Seconds
    full_window: bool
    rate_per_min: Annotated[float, Meta(ge=0)]
    limit_per_min: Count | None
    gen: PcieGen | None
    width: Lanes | None
    rule: Rule
    field: Word
    citation: Citation


class NVLinkCounter(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One NVLink error counter over the window (nvmlDeviceGetNvLinkErrorCounter; DCGM MonitorNVLink4Fields)."""

    counter: Word  # crc_flit | crc_data | replay | recovery
    field: Word  # its DCGM field
    count: Count
    window_s: Seconds
    full_window: bool
    rate_per_min: Annotated[float, Meta(ge=0)]
    severity: Severity
    rule: Rule
    links: Annotated[dict[Annotated[str, Meta(max_length=4)], Count], Meta(max_length=64)]  # link -> count


class GPUNVLinkErrors(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUNVLinkErrors``: the counters over DCGM's limits (DcgmGPUHardwareLimits.h)."""

    counters: Annotated[list[NVLinkCounter], Meta(max_length=16)]
    citation: Citation


class ThermalFinding(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One thermal limit reached: the T.Limit margin (NVML field 194, nvmlDeviceGetMarginTemperature) or a
    temperature against its NVML_TEMPERATURE_THRESHOLD_*."""

    severity: Severity
    reason: Word
    margin_c: Celsius | UnsetType = UNSET
    temp_c: Celsius | UnsetType = UNSET
    limit_c: Celsius | None
    rule: Rule
    citation: Citation


class GPUThermalMarginLow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUThermalMarginLow``: the GPU at a thermal limit (docs/straggler-signals.md)."""

    findings: Annotated[list[ThermalFinding], Meta(max_length=8)]
    thermal_margin_c: Celsius | None
    gpu_temp_c: Celsius | None
    memory_temp_c: Celsius | None
    thresholds_c: Annotated[dict[Word, Celsius | None], Meta(max_length=16)]
    slowdown_tlimit_c: Celsius | None
    field: Word


class GPUStragglerSignals(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``StragglerSignals`` of collector nvml: the per-GPU vector (docs/straggler-signals.md)."""

    schema: Annotated[int, Meta(ge=1, le=1)]
    gpus: GpuVectors
    truncated: Count  # GPUs beyond MAX_SIGNAL_GPUS
    interval_s: Seconds
    windows_s: Annotated[dict[Word, Seconds], Meta(max_length=32)]
    thresholds: Annotated[dict[Word, Rule], Meta(max_length=32)]
    citation: Annotated[dict[Word, Citation], Meta(max_length=16)]


# -- device nodes and PCIe AER (collectors/gpu_devices.py) ---------------------------------------------------

class GPUInventory(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``NvidiaControlDeviceMissing``: the GPUs the node has, by each source (/sys/bus/pci, /dev, NVML)."""

    expected: Count
    on_pci: Count
    device_nodes: Count  # /dev/nvidia<N>
    nvml: Count | None  # None: NVML not asked or not loadable
    configured_expected: Count | None


class GPUDevicesMissing(GPUInventory, kw_only=True, omit_defaults=True):
    """``GPUDevicesMissing``: the inventory, and which GPU lacks what."""

    pci_address: Pci | None  # None: an expected GPU that is not on the bus either
    device_node: FilePath | UnsetType = UNSET


class GPUPCIeError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUPCIeError``: a udev uevent of the PCIe AER driver (drivers/pci/pcie/err.c: ERROR_EVENT,
    DEVICE_ONLINE)."""

    error_event: Word | None  # BEGIN_RECOVERY, SUCCESSFUL_RECOVERY, FAILED_RECOVERY
    device_online: Word | None  # "0" | "1"


# -- topology (collectors/topology.py, docs/topology.md) -----------------------------------------------------

class PCIeLinkDegraded(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``PCIeLinkDegraded``: a GPU's link (sysfs current_link_speed/width) against the smaller of what it and its
    upstream port support (max_link_*; NCCL's xml.cc takes the same minimum)."""

    gpu: Label
    current_speed_gts: GTs | None
    expected_speed_gts: GTs | None
    current_width: Lanes | None
    expected_width: Lanes | None
    max_speed_gts: GTs | None
    max_width: Lanes | None
    utilization_pct: Percent | None


class NVLinkDegraded(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``NVLinkDegraded``: on an NVSwitch system the GPU whose own links are down (``gpu``, ``links_up``,
    ``links_known``, ``pairs``); on direct NVLink the pair (``gpus``, ``now``, ``most_seen_since_boot``)."""

    gpu: Label | UnsetType = UNSET
    links_up: NvLinks | UnsetType = UNSET
    gpus: Annotated[list[Label], Meta(max_length=2)] | UnsetType = UNSET
    now: NvLinks | UnsetType = UNSET
    expected: NvLinks
    links_known: NvLinks | UnsetType = UNSET
    most_seen_since_boot: NvLinks | UnsetType = UNSET
    pairs: Annotated[dict[Label, Annotated[str, Meta(max_length=8)]], Meta(max_length=64)] | UnsetType = UNSET
    nvswitch: bool


class FabricManagerNotRunning(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``FabricManagerNotRunning``: an NVSwitch system without nv-fabricmanager."""

    nvswitches: Annotated[list[Pci], Meta(max_length=64)]
    gpus_not_registered: Annotated[dict[Pci, Word], Meta(max_length=64)]  # GPU -> its fabric state
    nvml: bool


class GPUFabricNotReady(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GPUFabricNotReady``: nvmlDeviceGetGpuFabricInfo's state (NVML_GPU_FABRIC_STATE_*) and status
    (an nvmlReturn_t)."""

    state: Word
    status: Annotated[int, Meta(ge=-(1 << 31), le=(1 << 32) - 1)]


GPU_DETAILS: Final[dict[str, type[msgspec.Struct]]] = {
    "GPUXidError": GPUXidError,
    "GPUFatalXid": GPUFatalXid,
    "GPUFellOffBus": GPUFellOffBus,
    "NVSwitchSXidError": NVSwitchSXidError,
    "GPUGSPTimeout": GPUGSPTimeout,
    "GPUPCIeAERError": GPUPCIeAERError,
    "GPULost": GPULost,
    "GPUEccUncorrectable": GPUEccUncorrectable,
    "GPURowRemapPending": GPURowRemap,
    "GPURowRemapFailure": GPURowRemap,
    "GPUMIGModePending": GPUMIGModePending,
    "GPUTensorPipeIdle": GPUTensorPipeIdle,
    "GPUMIGMisconfigured": GPUMIGMisconfigured,
    "GPUP2PUnavailable": GPUP2PUnavailable,
    "GPUThrottled": GPUThrottled,
    "GPUPCIeReplayRate": GPUPCIeReplayRate,
    "GPUNVLinkErrors": GPUNVLinkErrors,
    "GPUThermalMarginLow": GPUThermalMarginLow,
    "GPUDevicesMissing": GPUDevicesMissing,
    "NvidiaControlDeviceMissing": GPUInventory,
    "GPUPCIeError": GPUPCIeError,
    "PCIeLinkDegraded": PCIeLinkDegraded,
    "NVLinkDegraded": NVLinkDegraded,
    "FabricManagerNotRunning": FabricManagerNotRunning,
    "GPUFabricNotReady": GPUFabricNotReady,
}
