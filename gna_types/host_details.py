"""The ``details`` of the node's host messages, as typed, bounded Structs: the kernel modules the GPUs and
GPUDirect RDMA need (collectors/kernel_modules.py), what the kernel log says about them and about itself
(collectors/kmsg_xid.py), and the agent's own health (agent/framework.py, agent/daemon.py,
agent/emitter.py, agent/remediation/).

Each field names where its format comes from as its writer cites it; see gna_types/gpu_details.py for how
a collector builds its details through them.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import Meta

from gna_types.detail_fields import (
    ERROR_MAX,
    UNSET,
    Count,
    Hcas,
    KmsgText,
    Module,
    Name,
    Occurrences,
    Paths,
    Texts,
    UnsetType,
    Word,
)
from gna_types.validation import NODE_VALIDATION, ValidationReport

Entity = Annotated[str, Meta(max_length=512)]  # fleet/wire.py FIELD_MAX["entity"]


# -- kernel modules (collectors/kernel_modules.py) ---------------------------------------------------------

class KernelModuleNotLoaded(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``KernelModuleNotLoaded``: the modules' states (/proc/modules, /sys/module/<m>/initstate), what needs
    them, and the kernel's own words when kmsg_xid saw a load error."""

    states: Annotated[dict[Module, Word], Meta(max_length=16)]  # live, builtin, loading, unloading, missing
    gpus_on_pci: Count
    hcas: Hcas
    proc_modules: bool  # /proc/modules was readable
    gdr_files: Paths | UnsetType = UNSET  # nvidia_peermem: the dma-buf/GDR files present
    gpudirect: Word | UnsetType = UNSET  # the configured GPUDirect mode: auto | peermem | dmabuf
    kernel_log: Texts | UnsetType = UNSET  # the last three load errors' text


# -- the kernel log (collectors/kmsg_xid.py, collectors/formats/kmsg_records.py) -------------------------------------

class KernelModuleLoadError(Occurrences, kw_only=True, omit_defaults=True):
    """``KernelModuleLoadError``: "disagrees about version of symbol", "Unknown symbol", "could not insert"
    for an nvidia* module (formats.kmsg_records ModuleError); the first occurrence, then one summary per window."""

    module: Module
    kind: Word  # version_mismatch | unknown_symbol | insert_failed
    symbol: Name | UnsetType = UNSET
    text: KmsgText | UnsetType = UNSET


class NvidiaPeermemError(Occurrences, kw_only=True, omit_defaults=True):
    """``NvidiaPeermemError``: nvidia-peermem's peer_err lines (formats.kmsg_records PeermemError); ``harmless`` and
    ``fixed_in`` for "detected invalid context" (Mellanox/nv_peer_memory#120, gone in R560)."""

    function: Name | UnsetType = UNSET
    kind: Word  # invalid_context | registration_failed | p2p_error
    text: KmsgText | UnsetType = UNSET
    harmless: bool | UnsetType = UNSET
    fixed_in: Word | UnsetType = UNSET


class KernelLogUnparsable(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``KernelLogUnparsable``: lines read from the kmsg source, none a record in a known rendering."""

    malformed: Count
    records: Count


# -- the agent itself ------------------------------------------------------------------------------------

class CollectorFailing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``CollectorFailing`` (agent/framework.py): a collector's part failed FAILING_AFTER times in a row."""

    consecutive_failures: Count
    part: Word  # collect | run
    last_error: Annotated[str, Meta(max_length=ERROR_MAX)]


class SpoolOverflow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``SpoolOverflow`` (agent/daemon.py): what the spool's policy dropped during an outage, per severity."""

    dropped: Annotated[dict[Word, Count], Meta(max_length=8)]
    policy: Word
    max_bytes: Count


class SpoolCorrupted(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``SpoolCorrupted`` (agent/daemon.py, agent/spool.py ``corruption``): damaged frames found at start."""

    segments: Count
    bytes: Count
    records: Count


class RemediationBudgetExhausted(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``RemediationBudgetExhausted`` (agent/remediation/engine.py): the fleet cordon budget refused a slot."""

    used: Count
    limit: Count
    node: Annotated[str, Meta(max_length=253)] | None
    trigger: Annotated[str, Meta(max_length=128)] | None  # the triggering message's type


class RemediationNodeKeptOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``RemediationNodeKeptOut`` (agent/remediation/repair.py): a node this agent cordoned stays out of
    service — a repeat offender, no repair step left, or handed off — until an operator acts."""

    node: Annotated[str, Meta(max_length=253)] | None
    trigger: Annotated[str, Meta(max_length=128)] | None  # the triggering message's type
    entity: Annotated[str, Meta(max_length=256)] | None
    why: Annotated[str, Meta(max_length=ERROR_MAX)]
    ladder: Annotated[str, Meta(max_length=128)]
    steps: Annotated[list[Annotated[str, Meta(max_length=64)]], Meta(max_length=32)]  # the repair steps that ran


class ConditionsAggregated(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Any condition type, reason ``Aggregated`` (agent/emitter.py ``_fold``): the conditions beyond a
    collector's cap, folded into one per type."""

    aggregated: Count
    cap: Count
    entities_sample: Annotated[list[Entity], Meta(max_length=10)]


class ConditionCleared(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Any resolved condition, reason ``NoLongerObserved`` (agent/emitter.py ``resolve_unasserted``): when it
    fired and by which message."""

    firing_since: Annotated[str, Meta(max_length=32)] | UnsetType = UNSET
    firing_message_id: Annotated[str, Meta(max_length=64)] | UnsetType | None = UNSET


HOST_DETAILS: Final[dict[str, type[msgspec.Struct]]] = {
    "KernelModuleNotLoaded": KernelModuleNotLoaded,
    "KernelModuleLoadError": KernelModuleLoadError,
    "NvidiaPeermemError": NvidiaPeermemError,
    "KernelLogUnparsable": KernelLogUnparsable,
    "CollectorFailing": CollectorFailing,
    "SpoolOverflow": SpoolOverflow,
    "SpoolCorrupted": SpoolCorrupted,
    "RemediationBudgetExhausted": RemediationBudgetExhausted,
    "RemediationNodeKeptOut": RemediationNodeKeptOut,
    NODE_VALIDATION: ValidationReport,  # agent/validate/service.py: a validation's whole report
}
