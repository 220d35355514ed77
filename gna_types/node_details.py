"""Every message type a node publishes -> the Struct of its ``details``: the NCCL ones
(gna_types/details.py ``DETAILS_BY_TYPE``, the fleet's typed boundary) and every other collector's and the
agent's own (gna_types/gpu_details.py, network_details.py, host_details.py, storage_details.py).

A collector builds its details through its Struct and hands :func:`wire` of it to the emitter: the same plain
dict as before (the same keys, ``null`` where it sent ``null``, a key it did not give left out), but a
misspelt, missing or mistyped field fails mypy and the collector's tests instead of reaching the wire. The
bounds are checked where messages are checked (the tests, agent/schema/message.schema.json), never by
cutting a value on the node.

The details of a condition's firing message are typed per type; a resolved one carries what the emitter
adds (``ConditionCleared``), and a folded one, reason ``Aggregated``, ``ConditionsAggregated``
(agent/emitter.py). A NCCL type of collector nccl_logs without its own Struct carries the process summary.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from gna_types.details import DETAILS_BY_TYPE, ProcessSummary
from gna_types.gpu_details import GPU_DETAILS, GPUStragglerSignals
from gna_types.host_details import HOST_DETAILS, ConditionCleared, ConditionsAggregated
from gna_types.network_details import NETWORK_DETAILS, IBStragglerSignals
from gna_types.storage_details import STORAGE_DETAILS

__all__ = ["AGGREGATED_REASON", "CLEARED_REASON", "DETAILS_BY_COLLECTOR", "NODE_DETAILS_BY_TYPE", "ConditionCleared",
           "ConditionsAggregated", "StragglerSignals", "details_type", "wire"]

NCCL_COLLECTOR: Final = "nccl_logs"
AGGREGATED_REASON: Final = "Aggregated"  # agent/emitter.py _fold
CLEARED_REASON: Final = "NoLongerObserved"  # agent/emitter.py resolve_unasserted


class StragglerSignals(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``StragglerSignals``: what both collectors' vectors share (docs/straggler-signals.md); each collector's
    own shape is ``DETAILS_BY_COLLECTOR``'s."""

    schema: int
    truncated: int
    interval_s: float


# type -> its details, for every type a node publishes
NODE_DETAILS_BY_TYPE: Final[dict[str, type[msgspec.Struct]]] = {
    **DETAILS_BY_TYPE,
    **GPU_DETAILS,
    **NETWORK_DETAILS,
    **HOST_DETAILS,
    **STORAGE_DETAILS,
    "StragglerSignals": StragglerSignals,
}
# (collector, type) -> its details, where one type has a shape per collector
DETAILS_BY_COLLECTOR: Final[dict[tuple[str, str], type[msgspec.Struct]]] = {
    ("nvml", "StragglerSignals"): GPUStragglerSignals,
    ("infiniband", "StragglerSignals"): IBStragglerSignals,
}


def details_type(type_: str, collector: str = "", *, reason: str = "", status: str | None = None
                 ) -> type[msgspec.Struct] | None:
    """The Struct of one message's details: its collector's shape, else its type's; for a condition's
    resolution or a folded aggregate the emitter's; ``None`` for a type no node publishes."""
    if status == "resolved":
        return ConditionCleared
    if reason == AGGREGATED_REASON and status == "firing":
        return ConditionsAggregated
    found = DETAILS_BY_COLLECTOR.get((collector, type_)) or NODE_DETAILS_BY_TYPE.get(type_)
    if found is None and collector == NCCL_COLLECTOR:
        return ProcessSummary
    return found


def wire(details: msgspec.Struct) -> dict[str, Any]:
    """``details`` as the emitter takes them: a plain dict of its fields in declaration order, without the
    fields left ``UNSET``."""
    out: dict[str, Any] = msgspec.to_builtins(details)
    return out
