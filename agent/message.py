"""The wire message: one schema for events and conditions (agent/schema/message.schema.json)."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

import msgspec

from gna_sdk import Kind, Severity, Status, SuggestedAction
from gna_sdk.ids import new_id

SCHEMA_VERSION = 1
TYPE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    schema_version: int = SCHEMA_VERSION
    id: str
    time: str
    node: str
    collector: str
    kind: Kind
    type: str
    status: Status | None = None
    severity: Severity
    entity: str
    reason: str
    message: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)
    suggested_action: SuggestedAction = "none"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)


def rfc3339(ts: float | None = None) -> str:
    now = _dt.datetime.now(_dt.UTC) if ts is None else _dt.datetime.fromtimestamp(ts, _dt.UTC)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(rfc3339_time: str) -> tuple[int, int] | None:
    """A message's RFC 3339 time as (seconds, nanoseconds) since the epoch (no zone: UTC); None when it
    does not parse. What the exports write (OTLP's timeUnixNano, NVSentinel's Timestamp)."""
    try:
        t = _dt.datetime.fromisoformat(rfc3339_time.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    delta = t - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
    return delta.days * 86400 + delta.seconds, delta.microseconds * 1000


def message_time(msg: dict[str, Any]) -> float:
    """A message dict's ``time`` as epoch seconds on its author's clock; 0.0 when absent or unparsable."""
    value = msg.get("time")
    when = epoch(value[:64]) if isinstance(value, str) else None
    return when[0] + when[1] / 1e9 if when is not None else 0.0


def make_message(
    *,
    node: str,
    collector: str,
    kind: Kind,
    type: str,
    severity: Severity,
    entity: str,
    reason: str,
    message: str,
    status: Status | None = None,
    details: dict[str, Any] | None = None,
    suggested_action: SuggestedAction = "none",
    msg_id: str | None = None,
) -> Message:
    if not TYPE_NAME.fullmatch(type):
        raise ValueError(f"message type {type!r} must be CamelCase")
    if (kind == "condition") != (status is not None):
        raise ValueError("conditions carry a status, events do not")
    return Message(
        id=msg_id or new_id(),
        time=rfc3339(),
        node=node,
        collector=collector,
        kind=kind,
        type=type,
        status=status,
        severity=severity,
        entity=entity,
        reason=reason,
        message=message,
        details=dict(details or {}),
        suggested_action=suggested_action,
    )


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


def to_dict(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(msg)
    return out
