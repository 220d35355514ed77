"""Severity and suggested action, decided in one place: for every (type, reason) whose grade is a policy
rather than a fact (who is at fault, how sure the evidence is), one row with the reason it is so.

`cordon` only when the node's hardware or host set-up is at fault and the evidence is unambiguous
(NVML says the fabric is not registered, the firmware grades an Xid Fatal); a host set-up step that
cannot be confirmed is `fix_config`; a job's own choices are `fix_config` and never a cordon;
hardware that may be at fault is `inspect_hardware`. The documentation's tables are generated from
these (``python -m gna_types.generate``; docs/messages.md for ``GRADED``, docs/topology.md sections 4
and 8 for ``TOPOLOGY_FINDINGS`` and ``NCCL_PATH_FINDINGS``); tests keep them equal.

Not here: NVIDIA's Xid catalog (collectors/formats/xid_catalog.py, a catalog of NVIDIA's own buckets).
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
    # NVRM's GSP lines without an Xid (collectors/kmsg_xid.py; NVIDIA/open-gpu-kernel-modules kernel_gsp.c)
    ("GPUGSPTimeout", "GSPTimeout"): Verdict(
        "critical", "cordon",
        "the 'GSP Timeout' banner, 'GSP core/RM unresponsive' or 'The GPU likely needs to be reset': the driver's "
        "own word that GSP-RM stopped answering, what Xid 119 says when it is printed (NVIDIA's RESET_GPU): drain "
        "the node so the GPU can be reset"),
    ("GPUGSPTimeout", "MemorySubsystemError"): Verdict(
        "critical", "cordon",
        "the driver's probe of a GSP timeout found the memory subsystem stuck (kern_gmmu.c, the timeout's "
        "MEMORY_SUBSYSTEM_ERROR class): the GPU needs a reset"),
    ("GPUGSPTimeout", "HeartbeatTimedOut"): Verdict(
        "warning", "none",
        "a GSP heartbeat missed its timeout with no banner yet: also seen after a resume from suspend "
        "(NVIDIA/open-gpu-kernel-modules#1125); evidence until a GSP Timeout or Xid 119 follows"),
    # the kernel's PCIe AER lines (collectors/kmsg_xid.py; linux drivers/pci/pcie/aer.c, err.c)
    ("GPUPCIeAERError", "RecoveryFailed"): Verdict(
        "critical", "reboot",
        "err.c's recovery of a GPU's link failed ('device recovery failed' on its port, or the GPU's 'can't "
        "recover': nvidia registers no AER error handlers): the kernel leaves the GPU disconnected, as after "
        "Xid 79; only a reboot brings it back"),
    ("GPUPCIeAERError", "UncorrectableFatal"): Verdict(
        "warning", "inspect_hardware",
        "an uncorrectable fatal error on a GPU's link whose recovery did not (yet) fail: the link was reset; "
        "a fatal link error is the slot's, riser's or GPU's hardware to look at"),
    ("KernelLogUnparsable", "NotKmsgFormat"): Verdict(
        "warning", "fix_config",
        "the kmsg source holds no kernel record in any known rendering: every Xid is missed"),
    # NVML checks of how a GPU is used and set up (collectors/nvml.py, docs/nvml-checks.md)
    ("GPUTensorPipeIdle", "SMBusyTensorIdle"): Verdict(
        "warning", "none",
        "SM activity > 0.8 with tensor pipe activity < 0.3, sustained: the job spins on communication or runs "
        "matrix work on CUDA cores -- its inefficiency, not a node fault; which of the two (or a slow peer) is not "
        "known here, so no action on this node"),
    ("GPUMIGMisconfigured", "NoMIGDevices"): Verdict(
        "warning", "fix_config",
        "MIG enabled and no GPU/compute instance created: the device plugin advertises nothing of this GPU"),
    ("GPUMIGMisconfigured", "MixedProfilesUnderSingle"): Verdict(
        "warning", "fix_config",
        "--mig-strategy=single with MIG devices of more than one profile on the node: the plugin refuses the node"),
    ("GPUMIGMisconfigured", "MIGDisabledGPUUnderSingle"): Verdict(
        "warning", "fix_config",
        "--mig-strategy=single with MIG enabled on some GPUs only: the plugin refuses the node"),
    ("GPUMIGMisconfigured", "GFDStrategyDiffers"): Verdict(
        "warning", "fix_config",
        "GPU Feature Discovery labels the node for another --mig-strategy than the device plugin runs: workloads "
        "selecting by its labels (nvidia.com/mig.strategy, gpu.product) ask for resources that are not advertised"),
    ("GPUMIGMisconfigured", "GFDMIGCountDiffers"): Verdict(
        "warning", "fix_config",
        "GPU Feature Discovery's labels count other MIG devices than NVML shows: they describe a past layout "
        "(GFD not relabelling) and mislead schedulers"),
    ("GPUMIGMisconfigured", "StrategyNoneWithMIG"): Verdict(
        "warning", "fix_config",
        "--mig-strategy=none (the default) on a MIG-enabled GPU: the whole GPU is advertised, no MIG device is"),
    # lossless RoCE on mlx5 (collectors/infiniband.py with collectors/roce.py): docs/operations.md "Lossless RoCE"
    ("RoCEQoSMisconfigured", "ECNDisabled"): Verdict(
        "warning", "fix_config",
        "ECN is off at the notification or reaction point for the RoCE priority (MLNX_OFED's ecn/roce_np|roce_rp/"
        "enable/<prio>): no CNPs, DCQCN cannot slow senders, congestion turns into PFC pauses and P99 stalls"),
    ("RoCEQoSMisconfigured", "PFCDisabled"): Verdict(
        "warning", "fix_config",
        "PFC is off on every priority of a RoCE port in `mode = \"lossless\"` (DCB netlink IEEE pfc_en): the switch "
        "cannot pause the sender, congestion drops RoCE packets and go-back-N retransmissions stall collectives"),
    ("RoCEQoSMisconfigured", "PFCWrongPriority"): Verdict(
        "warning", "fix_config",
        "PFC is on for other priorities than the RoCE one (DCB netlink IEEE pfc_en): RoCE traffic is lossy while "
        "the fabric is configured lossless"),
    ("RoCEQoSMisconfigured", "TrustMismatch"): Verdict(
        "warning", "fix_config",
        "the port classifies by PCP where DSCP is expected (no DSCP entry in mlx5's DCB APP table), or the "
        "reverse: untagged RoCE traffic lands on priority 0, outside PFC and ECN for the RoCE priority"),
    ("RoCEQoSMisconfigured", "DSCPMapMismatch"): Verdict(
        "warning", "fix_config",
        "in DSCP trust, the RoCE DSCP (`roce.dscp`) maps to another priority than the RoCE one (mlx5's "
        "dscp2prio, as its DCB APP table shows it)"),
    ("RoCEPauseStorm", "PauseStorm"): Verdict(
        "warning", "inspect_hardware",
        "the port spent more than `pause_fraction_warning` of a full window paused on the RoCE priority: a "
        "congested fabric or a slow receiver; never a cordon on its own"),
    ("RoCEPauseStorm", "PauseStormSevere"): Verdict(
        "critical", "inspect_hardware",
        "the same above `pause_fraction_critical`: the priority barely moves (a PFC storm); inspect the NIC, "
        "its switch port and the PFC watchdog, never a cordon on its own"),
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
    ("GPUP2PUnavailable", "ACSRedirect"): Verdict(
        "warning", "fix_config",
        "a GPU pair under one PCIe switch without P2P, and ACS redirects P2P on a port between them (BIOS or "
        "kernel setting): its traffic goes through the root complex or host memory"),
    ("GPUP2PUnavailable", "P2PNotSupported"): Verdict(
        "warning", "inspect_hardware",
        "a GPU pair under one PCIe switch or NVLink-connected without P2P in NVML, no ACS redirect seen"),
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

# What a training job's own NCCL and PyTorch lines say (collectors/nccl/: each rule's message, the plugin's
# conditions over a process's state, hang evidence): docs/messages.md's NCCL table. A job's log never cordons
# on its own: a port NCCL saw fail is the node's hardware to inspect, and the fleet correlator decides who
# is to blame across the job's nodes.
NCCL_FINDINGS: dict[tuple[str, str], Verdict] = {
    ("NCCLJobMember", "CommInit"): Verdict(
        "info", "none", "a process joined a communicator: membership for the fleet correlator"),
    ("NCCLProcessEnded", "ProcessEnded"): Verdict(
        "info", "none", "a job's process is gone from /proc: its incidents may resolve"),
    ("NCCLProcessEnded", "LogGone"): Verdict(
        "info", "none", "the log of a process this node cannot check by pid was deleted"),
    ("NCCLCollectiveTimeout", "WatchdogTimeout"): Verdict(
        "critical", "none",
        "PyTorch's watchdog gave up on a collective: the job hangs, and the rank at fault is usually "
        "another node's (the fleet correlator names it)"),
    ("NCCLCollectiveTimeout", "HeartbeatTimeout"): Verdict(
        "critical", "none",
        "PyTorch's heartbeat monitor found the rank's own watchdog stuck (a CUDA/NCCL call or the GIL): the rank "
        "hangs and is terminated; the job's hang symptom without a SeqNum (the fleet correlator compares ranks)"),
    ("NCCLWatchdogProgress", "WatchdogProgress"): Verdict(
        "warning", "none", "a process group's progress when its watchdog gave up: evidence for the correlator"),
    ("NCCLWatchdogProgress", "DumpSignal"): Verdict(
        "warning", "none", "a rank heard of another rank's timeout; its own progress, evidence for the correlator"),
    ("NCCLIBCompletionError", "IBStatus12"): Verdict(
        "critical", "inspect_hardware",
        "IBV_WC_RETRY_EXC_ERR: the transport retries ran out -- the peer is gone or the link is down"),
    ("NCCLIBCompletionError", "IBStatus13"): Verdict(
        "critical", "inspect_hardware", "IBV_WC_RNR_RETRY_EXC_ERR: the peer stopped posting receives"),
    ("NCCLIBCompletionError", "*"): Verdict(
        "warning", "none",
        "any other completion status (a registration, a flushed queue after another error): evidence for the "
        "correlator's link verdict, not a fault of this node by itself"),
    ("NCCLIBAsyncEvent", "IBAsyncEvent"): Verdict(
        "critical", "inspect_hardware", "a fatal async event on an HCA port under a running job"),
    ("NCCLIBAsyncEvent", "IBAsyncEventNonFatal"): Verdict(
        "warning", "none", "an event NCCL calls non-fatal, or a port coming back (PORT_ACTIVE, LID/GID change)"),
    ("NCCLSocketError", "SocketError"): Verdict(
        "warning", "none", "a socket NCCL uses failed: the other end's process or network; evidence, not a verdict"),
    ("TorchRankFailed", "OOMKilled"): Verdict(
        "warning", "fix_config",
        "the node's kernel OOM killer ended the rank's process: the job's memory, not a node fault (the fleet "
        "names the rank as its job's culprit)"),
    ("TorchRankFailed", "KilledBySignal"): Verdict(
        "warning", "none",
        "a rank's process died of a signal (a segfault, an abort, a kill): the fleet names it as its job's "
        "culprit, or the hardware its node reports"),
    ("TorchRankFailed", "ExitedWithError"): Verdict(
        "warning", "none", "a rank exited non-zero on an error of its own (not a peer's failure)"),
    ("TorchRankFailed", "PeerFailure"): Verdict(
        "info", "none",
        "a rank exited because a peer's failure broke its collectives (an NCCL remote error): a victim"),
    ("NCCLBackendError", "RemoteError"): Verdict(
        "info", "none",
        "PyTorch raised ncclRemoteError: a peer process exited or the network failed; evidence for the "
        "correlator, not this rank's fault"),
    ("NCCLBackendError", "*"): Verdict(
        "warning", "none",
        "PyTorch raised an NCCL error on this rank of its own (a CUDA error, a system or internal error, an "
        "invalid usage): the rank failed here"),
    ("NCCLWarning", "NCCLWarn"): Verdict(
        "warning", "none", "an NCCL WARN no rule explains, shown once per process and text"),
    ("NCCLWarning", "NCCLWarnRepeated"): Verdict(
        "warning", "none", "the same WARN repeated within the window, counted into one summary"),
    ("NCCLRASReport", "RASSuspects"): Verdict(
        "warning", "none", "NCCL's RAS named processes that died, stopped answering or are stuck"),
    ("NCCLRASReport", "RASHealthy"): Verdict(
        "info", "none", "NCCL's RAS: every process answered, no communicator in error"),
    ("TorchFlightRecord", "FlightRecorderDump"): Verdict(
        "warning", "none", "a rank's Flight Recorder dump shows a collective it waits in"),
    ("TorchFlightRecord", "FlightRecorderIdle"): Verdict(
        "info", "none", "a rank's Flight Recorder dump with nothing pending"),
    ("NCCLNoGDRDMA", "GDRNotUsed"): Verdict(
        "warning", "fix_config",
        "IB traffic staged in host memory although the node supports GPUDirect RDMA: the job's settings or "
        "its container"),
    ("NCCLP2PViaHost", "SHMOnNVLinkNode"): Verdict(
        "warning", "fix_config", "GPU-to-GPU traffic through host shared memory on an NVLink node: P2P disabled"),
    ("NCCLHCASelection", "PrefixMatch"): Verdict(
        "warning", "fix_config", "NCCL_IB_HCA without '=' is a prefix: it selected HCAs it did not name"),
    ("NCCLHCASelection", "StorageNIC"): Verdict(
        "warning", "fix_config", "NCCL selected a NIC the configuration reserves for storage"),
    ("NCCLInspectorSummary", "Periodic"): Verdict(
        "info", "none", "NCCL Inspector's per-communicator performance over the window: straggler evidence"),
    # a running job's environment (/proc/<pid>/environ) as NCCL will read it (collectors/nccl_env.py lint)
    ("NCCLEnvMisconfigured", "PrefixMatch"): Verdict(
        "warning", "fix_config", "NCCL_IB_HCA without '=' also selects HCAs whose names it prefixes"),
    ("NCCLEnvMisconfigured", "SetByHand"): Verdict(
        "warning", "fix_config", "NCCL_IB_GID_INDEX fixed by hand (NCCL >= 2.21 selects the GID itself)"),
    ("NCCLEnvMisconfigured", "IntegerLevel"): Verdict(
        "warning", "fix_config", "NCCL_NET_GDR_LEVEL as a legacy integer whose meaning moved between releases"),
    ("NCCLEnvMisconfigured", "InvalidLevel"): Verdict(
        "warning", "fix_config", "NCCL_NET_GDR_LEVEL that NCCL ignores (not an exact name, not a number)"),
    ("NCCLEnvMisconfigured", "TooShort"): Verdict(
        "warning", "fix_config", "NCCL_IB_TIMEOUT below the configured minimum: congestion becomes retry errors"),
    ("NCCLEnvMisconfigured", "OutOfRange"): Verdict(
        "warning", "fix_config", "NCCL_IB_RETRY_CNT outside the 3-bit field's 0-7"),
    ("NCCLEnvMisconfigured", "NoSuchInterface"): Verdict(
        "warning", "fix_config", "NCCL_SOCKET_IFNAME selects no interface of this node"),
    ("NCCLEnvMisconfigured", "IBDisabledOnIBNode"): Verdict(
        "warning", "fix_config", "NCCL_IB_DISABLE=1 where IB/RoCE ports are ACTIVE: sockets by the job's choice"),
    ("NCCLEnvMisconfigured", "FallbackInvisible"): Verdict(
        "info", "fix_config", "NCCL_DEBUG below INFO: a fallback to sockets or lost GPUDirect RDMA goes unseen"),
}

# the page and marker name each table is generated into (gna_types/generate.py)
TABLES: dict[str, tuple[str, dict[tuple[str, str], Verdict]]] = {
    "graded": ("docs/messages.md", GRADED),
    "nccl": ("docs/messages.md", NCCL_FINDINGS),
    "topology": ("docs/topology.md", TOPOLOGY_FINDINGS),
    "nccl-paths": ("docs/topology.md", NCCL_PATH_FINDINGS),
}

POLICY: dict[tuple[str, str], Verdict] = {k: v for _page, table in TABLES.values() for k, v in table.items()}
assert len(POLICY) == sum(len(t) for _p, t in TABLES.values()), "a (type, reason) in two tables"


# Another node's log line, read by this node in a job-wide file (srun's forwarded output on the batch host, a
# launcher's aggregated log) and relayed (details ``relayed``): never the reading node's own finding; the
# fleet grades it by the row of its type and reason (fleet/job_facts.py) as one reporter's word.
RELAYED = Verdict("info", "none", "another node's line read here: that node's finding, this node's word about it")


def verdict(type_: str, reason: str) -> Verdict:
    """The row for (type_, reason), else the type's ``"*"`` row (every other reason of that type); KeyError
    for one no table holds (a programming error: tests cover every reason each collector emits)."""
    got = POLICY.get((type_, reason))
    return got if got is not None else POLICY[(type_, "*")]
