"""The Kubernetes NodeCondition each finding belongs to, named per category as Amazon EKS's node
monitoring agent names its own (``AcceleratedHardwareReady``, ``NetworkingReady``, ``StorageReady``,
``KernelReady``; the EKS user guide, "node health": status ``False`` while the category has a problem)
and as node-problem-detector groups its problems into per-area conditions.

The kubernetes remediation plugin sets the category's condition beside the per-type one when it
cordons (remediations/kubernetes.py), and back to ``True`` when it uncordons. A job's own findings
(NCCL logs, its environment, NCCL Inspector) and the agent's health are no node's condition: None.
docs/exports.md's table is generated from ``CATEGORY_BY_TYPE`` (``python -m gna_types.generate``).
"""

from __future__ import annotations

ACCELERATED = "AcceleratedHardwareReady"
NETWORKING = "NetworkingReady"
STORAGE = "StorageReady"
KERNEL = "KernelReady"
CATEGORIES = (ACCELERATED, NETWORKING, STORAGE, KERNEL)

# every node-level message type (docs/messages.md) -> its category
CATEGORY_BY_TYPE: dict[str, str] = {
    # the GPUs, their links, switches and fabric (gpu_devices, nvml, topology, kmsg_xid)
    "GPUDevicesMissing": ACCELERATED, "NvidiaControlDeviceMissing": ACCELERATED, "GPUPCIeError": ACCELERATED,
    "GPUFatalXid": ACCELERATED, "GPUFellOffBus": ACCELERATED, "NVSwitchSXidError": ACCELERATED,
    "GPULost": ACCELERATED, "GPUEccUncorrectable": ACCELERATED, "GPUThrottled": ACCELERATED,
    "GPUPCIeReplayRate": ACCELERATED, "GPUNVLinkErrors": ACCELERATED, "GPUThermalMarginLow": ACCELERATED,
    "GPUMIGModePending": ACCELERATED, "PCIeLinkDegraded": ACCELERATED, "NVLinkDegraded": ACCELERATED,
    "FabricManagerNotRunning": ACCELERATED, "GPUFabricNotReady": ACCELERATED, "GPUXidError": ACCELERATED,
    "GPUGSPTimeout": ACCELERATED, "GPUPCIeAERError": ACCELERATED,
    # the RDMA fabric and GPUDirect RDMA (infiniband, kmsg_xid's nvidia-peermem lines)
    "IBDeviceMissing": NETWORKING, "IBPortDown": NETWORKING, "IBPortFlapping": NETWORKING,
    "IBPortDegraded": NETWORKING, "IBErrorCountersIncreasing": NETWORKING, "IBCounterSaturated": NETWORKING,
    "RoCECongestion": NETWORKING, "NvidiaPeermemError": NETWORKING,
    "RoCEQoSMisconfigured": NETWORKING, "RoCEPauseStorm": NETWORKING,
    # the dataset cache (juicefs)
    "JuiceFSCacheDirMissing": STORAGE, "JuiceFSCacheEphemeral": STORAGE, "JuiceFSCacheLowSpace": STORAGE,
    "JuiceFSCacheSizeSuspicious": STORAGE, "JuiceFSCacheHitRatioLow": STORAGE, "JuiceFSCacheCold": STORAGE,
    "JuiceFSReadAmplification": STORAGE,
    # the kernel and its modules (kernel_modules, kmsg_xid); a module is refined by its name below
    "KernelModuleNotLoaded": KERNEL, "KernelModuleLoadError": KERNEL, "KernelLogUnparsable": KERNEL,
}
# what nodes publish that is a measurement, not a finding: the fleet compares it across nodes (fleet/stragglers.py)
MEASUREMENTS = frozenset({"StragglerSignals"})
# a kernel module's category by its name: the GPU driver's are the GPUs', the RDMA stack's the network's
_MODULE_PREFIXES = ((("nvidia_peermem", "ib_", "mlx5_", "rdma_", "nv_peer_mem"), NETWORKING),
                    (("nvidia", "gdrdrv"), ACCELERATED))


def category(type_: str, entity: str = "") -> str | None:
    """The NodeCondition type for a finding, or None where it is no node's condition."""
    cat = CATEGORY_BY_TYPE.get(type_)
    if cat == KERNEL and entity.startswith("module:"):
        name = entity.removeprefix("module:")
        for prefixes, refined in _MODULE_PREFIXES:
            if name.startswith(prefixes):
                return refined
    return cat
