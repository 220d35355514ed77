"""A message's ``details`` as the fleet decides on them: a typed Struct, decoded once per message.

The fleet's boundary (fleet/wire.py ``check_bounds``) decodes a NCCL message's details (collector
nccl_logs) as its type (gna_types/details.py ``DETAILS_BY_TYPE``) and refuses one that does not fit; the
value it decoded is kept on the message under ``TYPED`` (``decode_event``/``decode_job`` with
``typed=True``: the correlator's consumers), so a verdict, a membership or an incident reads attributes
of that Struct and never a key of the dict. The dict ``details`` stays on the message as it came, for
display only (incident briefs, dashboards, timelines).

A message that did not come through the wire (offline ``correlate``, ``diagnose`` of host roots, the
simulator, tests building dicts) goes through the same decoding where the correlator takes it in
(``with_typed``: a shallow copy carrying its typed details, so the caller's dict is never changed and
never carries a Struct into its JSON). That decoding is lenient: a field of the wrong type or out of its
bound counts as absent (what the fleet's dict reads did with ``isinstance`` checks), never an exception;
a list of Structs is decoded item by item, after the cut the decision reads (``SUSPECTS_READ``,
``COUNTERS_READ``), an item that does not decode left out.

Of the other collectors' details the fleet reads one field (``IBErrorCountersIncreasing``'s counters:
whether a rate rule fired over a full window); ``CountersRead`` declares what it reads of them and
nothing more (the node's full shape: gna_types/network_details.py ``IBCounterFinding``). Every other
message decodes as ``NothingRead``: the fleet decides nothing on its details.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, TypeVar

import msgspec
from msgspec import Meta

from gna_types.details import DETAILS_BY_TYPE, ProcessSummary, RASReport, RasSuspect

__all__ = ["COUNTERS_READ", "NCCL_COLLECTOR", "SUSPECTS_READ", "TYPED", "CounterRead", "CountersRead",
           "NothingRead", "counters", "decode", "nccl", "typed", "typed_class", "with_typed"]

TYPED: Final = "_typed"  # the key a message's decoded details are kept under (never published, never shown)
NCCL_COLLECTOR: Final = "nccl_logs"
SUSPECTS_READ: Final = 64  # RAS suspects read per report (fleet/correlator.py _ras)
COUNTERS_READ: Final = 32  # counters read per finding (fleet/correlator.py _counter_over_real_window)


class NothingRead(msgspec.Struct, gc=False):
    """The details of a message the fleet decides nothing on (shown as they came)."""


class CounterRead(msgspec.Struct, kw_only=True, gc=False):
    """What the fleet reads of one offending counter (collectors/infiniband.py ``_counters``: ``info``;
    gna_types/network_details.py ``IBCounterFinding``)."""

    severity: Annotated[str, Meta(max_length=16)] | None = None  # "critical" | "warning"
    rule: Annotated[str, Meta(max_length=64)] | None = None  # "any increase", "> 100/hour", ...
    full_window: bool | None = None  # the rate's window was full (not extrapolated from a few seconds)


class CountersRead(msgspec.Struct, kw_only=True, gc=False):
    """``IBErrorCountersIncreasing`` as the fleet reads it: every offending counter of the port."""

    counters: Annotated[list[CounterRead], Meta(max_length=64)] = []


# message type -> what the fleet reads of its details, for collectors other than nccl_logs
OTHER_BY_TYPE: Final[dict[str, type[msgspec.Struct]]] = {"IBErrorCountersIncreasing": CountersRead}
# (class, field) -> (the Struct of its items, how many the fleet reads): decoded item by item when lenient
_ITEMS: Final[dict[tuple[type[msgspec.Struct], str], tuple[type[msgspec.Struct], int]]] = {
    (RASReport, "suspects"): (RasSuspect, SUSPECTS_READ),
    (CountersRead, "counters"): (CounterRead, COUNTERS_READ),
}
_FIELDS: dict[type[msgspec.Struct], tuple[tuple[str, Any], ...]] = {}

S = TypeVar("S", bound=msgspec.Struct)


def typed_class(collector: Any, type_: Any) -> type[msgspec.Struct]:
    """The Struct a message's details decode as."""
    if collector == NCCL_COLLECTOR:
        return DETAILS_BY_TYPE.get(type_, ProcessSummary) if isinstance(type_, str) else ProcessSummary
    return OTHER_BY_TYPE.get(type_, NothingRead) if isinstance(type_, str) else NothingRead


def _fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, Any], ...]:
    got = _FIELDS.get(cls)
    if got is None:
        got = _FIELDS[cls] = tuple((f.encode_name, f.type) for f in msgspec.structs.fields(cls))
    return got


def decode(cls: type[S], d: Any) -> S:
    """``d`` as ``cls``, leniently: whole when it fits, else field by field, a field that does not fit absent."""
    if not isinstance(d, dict):
        return cls()
    try:
        return msgspec.convert(d, cls)
    except msgspec.ValidationError:
        pass
    kw: dict[str, Any] = {}
    for name, t in _fields(cls):
        if name not in d:
            continue
        v = d[name]
        try:
            kw[name] = msgspec.convert(v, t)
        except msgspec.ValidationError:
            items = _ITEMS.get((cls, name))
            if items is not None and isinstance(v, list):
                item_cls, most = items
                kw[name] = [x for x in (_item(item_cls, raw) for raw in v[:most]) if x is not None]
    return cls(**kw)


def _item(cls: type[S], raw: Any) -> S | None:
    if not isinstance(raw, dict):
        return None
    try:
        return decode(cls, raw)
    except TypeError:  # a required field absent or of the wrong type: the item names nothing
        return None


def typed(m: dict[str, Any]) -> msgspec.Struct:
    """The message's details as its Struct: the one kept on it (the wire's, ``with_typed``'s), else decoded
    now (not kept: the dict is the caller's)."""
    cls = typed_class(m.get("collector"), m.get("type"))
    t = m.get(TYPED)
    return t if t.__class__ is cls else decode(cls, m.get("details"))


def with_typed(m: dict[str, Any]) -> dict[str, Any]:
    """The message as the correlator keeps it: itself when it carries its typed details (the wire decoded
    them) or the fleet reads none of them, else a shallow copy carrying them (decoded once, here)."""
    cls = typed_class(m.get("collector"), m.get("type"))
    if cls is NothingRead or m.get(TYPED).__class__ is cls:
        return m
    return {**m, TYPED: decode(cls, m.get("details"))}


def nccl(m: dict[str, Any]) -> ProcessSummary:
    """A NCCL message's details (collector nccl_logs): its process summary and its type's fields; for any
    other message an empty summary."""
    t = typed(m)
    return t if isinstance(t, ProcessSummary) else _EMPTY


def counters(m: dict[str, Any]) -> list[CounterRead]:
    """The offending counters of an ``IBErrorCountersIncreasing`` finding (no other message has any)."""
    t = typed(m)
    return t.counters if isinstance(t, CountersRead) else []


_EMPTY: Final = ProcessSummary()
