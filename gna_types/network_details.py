"""The ``details`` of the node's network messages, as typed, bounded Structs: the InfiniBand/RoCE ports from
sysfs (collectors/infiniband.py, collectors/formats/ib_sysfs.py), a job's NCCL environment (collectors/nccl_env.py)
and the NCCL Inspector's per-process summary (collectors/nccl_inspector.py, docs/nccl-inspector.md).

Each field names where its format comes from as the collector cites it; see gna_types/gpu_details.py for
how a collector builds its details through them.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

from gna_types.detail_fields import (
    UNSET,
    Citation,
    Count,
    Hcas,
    Name,
    Pid,
    Rule,
    Seconds,
    Severity,
    UnsetType,
    Vector,
    Word,
    Words,
)

PortName = Annotated[str, Meta(max_length=72, description="an HCA port, mlx5_0/1")]
PortVectors = Annotated[dict[PortName, Vector], Meta(max_length=128)]  # collectors/infiniband.py MAX_SIGNAL_PORTS
Gbps = Annotated[float, Meta(ge=0, le=1 << 20)]  # sysfs ports/<n>/rate "400 Gb/sec (4X NDR)"
Rates = Annotated[dict[Word, Annotated[float, Meta(ge=0)]], Meta(max_length=64)]  # counter -> per second
EnvValue = Annotated[str, Meta(max_length=4096, description="an environment variable's value as the job set it")]


# -- InfiniBand / RoCE (collectors/infiniband.py) --------------------------------------------------------

class IBDeviceMissing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``IBDeviceMissing``: an HCA seen earlier in this boot, or configured, is gone from /sys/class/infiniband."""

    expected: Hcas  # expected_hcas as configured
    present: Hcas


class IBPortState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``IBPortDown``: a port's sysfs state (ports/<n>/state "4: ACTIVE", phys_state "5: LinkUp", rate,
    link_layer), as the kernel's ib_core prints it (drivers/infiniband/core/sysfs.c)."""

    state: Word | None  # the name after "<n>: "; None when unreadable
    phys_state: Word | None
    rate: Annotated[str, Meta(max_length=32)] | None  # "400 Gb/sec"
    link_layer: Word  # "InfiniBand" | "Ethernet"; "" when not given


class IBPortFlapping(IBPortState, kw_only=True, omit_defaults=True):
    """``IBPortFlapping``: down/up transitions and link_downed increments in ``flap_window``."""

    flaps_in_window: Count
    window_s: Seconds
    hold_down_s: Seconds


class IBPortDegraded(IBPortState, kw_only=True, omit_defaults=True):
    """``IBPortDegraded``: the rate below ``expected_rate_gbps``; width and speed from the rate's "(4X NDR)"."""

    expected_gbps: Gbps
    width: Annotated[int, Meta(ge=0, le=32)] | None  # lanes: 1, 2, 4, 8, 12 (collectors/formats/ib_sysfs.py Rate)
    speed: Word  # SDR DDR QDR FDR10 FDR EDR HDR NDR XDR, "" when not given


class IBCounterFinding(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One error counter over its threshold (NVSentinel nic-health-monitor's counterDetection rules, or the
    configured ``thresholds``): the rule that fired and the window it was measured over."""

    counter: Word  # the PMA counter (ports/<n>/counters/<name>)
    delta: Count
    last_hour: Count | UnsetType = UNSET
    rate_per_hour: Annotated[float, Meta(ge=0)] | UnsetType = UNSET
    rate_per_s: Annotated[float, Meta(ge=0)] | UnsetType = UNSET
    last_minute: Count | UnsetType = UNSET
    rate_per_min: Annotated[float, Meta(ge=0)] | UnsetType = UNSET
    full_window: bool | UnsetType = UNSET
    severity: Severity
    rule: Rule
    window_s: Seconds | UnsetType = UNSET
    threshold_from: Word | UnsetType = UNSET  # "config" | "default"
    citation: Citation | UnsetType = UNSET  # the default's source


class IBErrorCountersIncreasing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``IBErrorCountersIncreasing``: every offending counter of the port."""

    counters: Annotated[list[IBCounterFinding], Meta(max_length=64)]


class IBCounterSaturated(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``IBCounterSaturated``: PMA counters stuck at all-ones (IBTA PortCounters: 16/32-bit, saturating)."""

    counters: Words
    bits: Annotated[dict[Word, Annotated[int, Meta(ge=1, le=64)]], Meta(max_length=64)]


class RoCECongestion(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``RoCECongestion``: mlx5 hw_counters (np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets) and
    port_xmit_wait per second against the ``congestion`` thresholds."""

    rates_per_s: Rates
    over: Rates
    drop_rate_per_s: Annotated[float, Meta(ge=0)]


class RoCEQoSProblems(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``RoCEQoSMisconfigured``: a RoCE port's lossless-Ethernet configuration problems, in check order (the
    first is the condition's reason): ``ECNDisabled`` (MLNX_OFED's /sys/class/net/<if>/ecn/<proto>/enable/<prio>
    off at the notification point roce_np or the reaction point roce_rp), ``PFCDisabled`` / ``PFCWrongPriority``
    (DCB netlink IEEE pfc_en without the RoCE priority, in lossless mode), ``TrustMismatch`` (the port classifies
    by PCP where DSCP is expected, or the reverse), ``DSCPMapMismatch`` (the RoCE DSCP mapped to another
    priority). collectors/roce.py, collectors/formats/roce_qos.py and dcb_netlink.py."""

    interface: Word
    priority: Annotated[int, Meta(ge=0, le=7)]
    problems: Annotated[list[Word], Meta(min_length=1, max_length=8)]
    mode: Word  # "lossless" | "lossy"
    expected_trust: Word  # "dscp" | "pcp" | "any"
    roce_np: bool | None = None  # ECN at the notification point; None: unreadable or not checked
    roce_rp: bool | None = None
    np_enabled_priorities: Annotated[list[Annotated[int, Meta(ge=0, le=7)]], Meta(max_length=8)] = []
    rp_enabled_priorities: Annotated[list[Annotated[int, Meta(ge=0, le=7)]], Meta(max_length=8)] = []
    pfc_enabled_priorities: Annotated[list[Annotated[int, Meta(ge=0, le=7)]], Meta(max_length=8)] | None = None
    pfc_cap: Annotated[int, Meta(ge=0, le=255)] | None = None
    trust: Word | None = None  # what the port does: "dscp" | "pcp"
    dscp: Annotated[int, Meta(ge=0, le=63)] | None = None
    dscp_priority: Annotated[int, Meta(ge=0, le=7)] | None = None
    citations: Annotated[list[Citation], Meta(max_length=4)]


class RoCEPauseStorm(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``RoCEPauseStorm``: the share of a window a port was paused on its RoCE priority (mlx5 ethtool
    rx_prio<p>_pause_duration / tx_prio<p>_pause_duration, microseconds) over the ``roce`` thresholds."""

    interface: Word
    priority: Annotated[int, Meta(ge=0, le=7)]
    direction: Word  # "rx": the switch paused us; "tx": we paused the switch
    paused_fraction: Annotated[float, Meta(ge=0)]
    rates_per_s: Rates  # every pause counter of the priority over the window
    window_s: Seconds
    full_window: bool
    rule: Rule
    threshold_from: Word  # "config" | "default"
    citation: Citation


class IBStragglerSignals(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``StragglerSignals`` of collector infiniband: the per-port vector (docs/straggler-signals.md)."""

    schema: Annotated[int, Meta(ge=1, le=1)]
    ports: PortVectors
    truncated: Count  # ports beyond MAX_SIGNAL_PORTS
    windows_s: Annotated[dict[Word, Seconds], Meta(max_length=32)]
    thresholds: Annotated[dict[Word, dict[Word, Any]], Meta(max_length=32)]  # counter -> its Threshold
    citation: Citation
    interval_s: Seconds


# -- NCCL's environment and its Inspector ------------------------------------------------------------------

class NCCLEnvMisconfigured(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``NCCLEnvMisconfigured``: one variable of a process's environment (/proc/<pid>/environ) that NCCL reads
    otherwise than the job meant (collectors/nccl_env.py ``lint``)."""

    pid: Pid
    variable: Word  # NCCL_IB_HCA, NCCL_NET_GDR_LEVEL, ...
    value: EnvValue | None  # None: NCCL_DEBUG unset
    matches: Annotated[dict[Name, Hcas], Meta(max_length=256)] | UnsetType = UNSET  # NCCL_IB_HCA prefix -> HCAs
    exact: Annotated[str, Meta(max_length=4096)] | UnsetType = UNSET  # the value naming them exactly
    valid: Words | UnsetType = UNSET  # NCCL_NET_GDR_LEVEL: the ladder's names (src/graph/paths.cc)
    parsed_as: Word | UnsetType = UNSET  # "name" | "integer" | "ignored"
    effective_level: Word | UnsetType | None = UNSET
    note: Rule | UnsetType | None = UNSET
    default: Annotated[int, Meta(ge=0, le=31)] | UnsetType = UNSET  # NCCL_IB_TIMEOUT's (ibv_qp_attr.timeout)
    interfaces: Words | UnsetType = UNSET  # NCCL_SOCKET_IFNAME: this node's interfaces


class NCCLInspectorSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``NCCLInspectorSummary``: one process's NCCL Inspector dumps over the window (docs/nccl-inspector.md);
    ``comms`` per (communicator, rank), carried as summarised (collectors/nccl_inspector.py ``summarize``)."""

    schema: Annotated[int, Meta(ge=1, le=1 << 16)]
    window_s: Seconds
    records: Count
    first_us: Annotated[int, Meta(ge=0, le=1 << 62)] | None  # nccl_inspector.py MAX_TS_US
    last_us: Annotated[int, Meta(ge=0, le=1 << 62)] | None
    comms: Annotated[list[dict[Word, Any]], Meta(max_length=4096)]
    comms_truncated: Count
    records_truncated: Count
    host: Annotated[str, Meta(max_length=253)]
    hostname: Annotated[str, Meta(max_length=253)] | None
    pid: Pid
    file: Annotated[str, Meta(max_length=4096)] | None
    interval_s: Seconds
    job: Annotated[str, Meta(max_length=320)] | None  # gna_types/details.py JOB_MAX
    job_prefix: Annotated[str, Meta(max_length=320)] | None
    world_rank: Annotated[int, Meta(ge=0, le=(1 << 24) - 1)] | None  # nccl_inspector.py MAX_RANKS
    world_size: Annotated[int, Meta(ge=1, le=1 << 24)] | None
    records_total: Count
    keys_dropped: Count
    format_versions: Annotated[dict[Name, Count], Meta(max_length=16)]
    skipped: Annotated[dict[Name, Count], Meta(max_length=64)]


NETWORK_DETAILS: Final[dict[str, type[msgspec.Struct]]] = {
    "IBDeviceMissing": IBDeviceMissing,
    "IBPortDown": IBPortState,
    "IBPortFlapping": IBPortFlapping,
    "IBPortDegraded": IBPortDegraded,
    "IBErrorCountersIncreasing": IBErrorCountersIncreasing,
    "IBCounterSaturated": IBCounterSaturated,
    "RoCECongestion": RoCECongestion,
    "RoCEQoSMisconfigured": RoCEQoSProblems,
    "RoCEPauseStorm": RoCEPauseStorm,
    "NCCLEnvMisconfigured": NCCLEnvMisconfigured,
    "NCCLInspectorSummary": NCCLInspectorSummary,
}
