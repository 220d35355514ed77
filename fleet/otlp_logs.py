"""Fleet messages as OpenTelemetry logs: an OTLP/HTTP JSON ``ExportLogsServiceRequest``.

Format: opentelemetry-proto (github.com/open-telemetry/opentelemetry-proto:
opentelemetry/proto/logs/v1/logs.proto, collector/logs/v1/logs_service.proto, common/v1/common.proto;
``LogRecord.event_name`` is field 12, absent from older releases, where a receiver ignores it) and its
JSON mapping in docs/specification.md ("OTLP/HTTP", JSON Protobuf encoding: lowerCamelCase field names,
64-bit integers as decimal strings, enums as integers). tests/test_exporter.py parses every request with
the compiled classes of the opentelemetry-proto package (google.protobuf.json_format, unknown fields
refused). Requests go to ``/v1/logs`` with
``Content-Type: application/json``. Retry per the same document: 429, 502, 503 and 504 (and no answer)
are retried; every other 4xx or 5xx is not (fleet/exporter.py ``classify``).

One ``resourceLogs`` per node: resource attributes ``host.name`` (the node of the NATS subject, the
authenticated publisher's own: docs/nats-security.md) and ``service.name`` ``gpu-node-agent``; scope
``gpu-node-agent``. Each message is one ``LogRecord``: ``timeUnixNano`` the node's time, ``severityNumber``
and ``severityText`` as OpenTelemetry numbers them (INFO 9, WARN 13, ERROR 17), ``body`` the message text,
``eventName`` ``<prefix>.<collector>.<Type>`` (the CloudEvents type, fleet/cloudevents.py), attributes
``gna.id`` (the message id: a receiver dedupes on it), ``gna.node``, ``gna.collector``, ``gna.type``,
``gna.kind``, ``gna.status``, ``gna.severity``, ``gna.reason``, ``gna.entity``, ``gna.suggested_action``
and ``gna.details`` (the details as a key/value list).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.message import epoch
from fleet.cloudevents import DEFAULT_TYPE_PREFIX, SEVERITY, event_type

SCOPE = "gpu-node-agent"
CONTENT_TYPE = "application/json"
RETRY_STATUSES = frozenset({429, 502, 503, 504})  # opentelemetry-proto docs/specification.md
MAX_DEPTH = 8  # nesting of details turned into AnyValue (deeper: a string)


def _ns(rfc3339: str) -> str:
    parts = epoch(rfc3339)
    return "0" if parts is None else str(max(0, parts[0] * 1_000_000_000 + parts[1]))  # 0: "unknown" in OTLP


def any_value(v: Any, depth: int = 0) -> dict[str, Any]:
    """A JSON value as an OTLP ``AnyValue``."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)} if -(1 << 63) <= v < (1 << 63) else {"stringValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v} if v == v and abs(v) != float("inf") else {"stringValue": str(v)}
    if depth < MAX_DEPTH and isinstance(v, Mapping):
        return {"kvlistValue": {"values": [{"key": str(k), "value": any_value(x, depth + 1)} for k, x in v.items()]}}
    if depth < MAX_DEPTH and isinstance(v, Sequence) and not isinstance(v, str | bytes):
        return {"arrayValue": {"values": [any_value(x, depth + 1) for x in v]}}
    return {"stringValue": str(v)}


def _attr(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": any_value(value)}


def log_record(msg: Mapping[str, Any], *, type_prefix: str = DEFAULT_TYPE_PREFIX,
               observed_ns: int | None = None) -> dict[str, Any]:
    text, number = SEVERITY.get(str(msg.get("severity")), ("INFO", 9))
    attrs = [_attr(f"gna.{k}", msg.get(k)) for k in ("id", "node", "collector", "type", "kind", "status",
                                                     "severity", "reason", "entity", "suggested_action")
             if msg.get(k) is not None]
    if msg.get("details"):
        attrs.append(_attr("gna.details", msg["details"]))
    return {"timeUnixNano": _ns(str(msg.get("time", ""))),
            "observedTimeUnixNano": str(observed_ns if observed_ns is not None else time.time_ns()),
            "severityNumber": number, "severityText": text, "body": {"stringValue": str(msg.get("message", ""))},
            "attributes": attrs, "eventName": event_type(str(msg["collector"]), str(msg["type"]), type_prefix)}


def logs_request(msgs: Sequence[Mapping[str, Any]], *, type_prefix: str = DEFAULT_TYPE_PREFIX) -> dict[str, Any]:
    """An ``ExportLogsServiceRequest``: one resourceLogs per node, in the order the nodes first appear."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for m in msgs:
        by_node.setdefault(str(m["node"]), []).append(log_record(m, type_prefix=type_prefix))
    return {"resourceLogs": [
        {"resource": {"attributes": [_attr("host.name", node), _attr("service.name", SCOPE)]},
         "scopeLogs": [{"scope": {"name": SCOPE}, "logRecords": records}]}
        for node, records in by_node.items()]}
