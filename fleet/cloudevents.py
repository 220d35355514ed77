"""A fleet message as a CloudEvent 1.0 (JSON event format, structured content mode).

Format: the CloudEvents specification 1.0.2 (github.com/cloudevents/spec, cloudevents/spec.md at tag
v1.0.2: required ``id``, ``source`` (URI-reference), ``specversion`` ``"1.0"``, ``type``; optional
``subject``, ``time`` (RFC 3339), ``datacontenttype``; extension attribute names lower-case ASCII letters
and digits, at most 20 characters advised), its JSON event format (cloudevents/formats/json-format.md:
``data`` as a JSON value when ``datacontenttype`` is ``application/json``; media types
``application/cloudevents+json`` and, for a batch, ``application/cloudevents-batch+json``, a JSON array)
and its HTTP binding (cloudevents/bindings/http-protocol-binding.md, structured and batched modes). The
severity extension (cloudevents/extensions/severity.md): ``severitytext`` and ``severitynumber`` as
OpenTelemetry's log data model numbers them (INFO 9, WARN 13, ERROR 17).

What each attribute holds, and why a receiver can rely on it:

- ``id``: the message's own id (a ULID the node made once; the spool and the forwarder keep it through
  retries), so every redelivery of one message is the same event;
- ``source``: ``<source_prefix>/nodes/<node>``, the node taken from the NATS subject the message was
  published on -- the authenticated publisher's own (docs/nats-security.md), never the payload's word.
  The spec makes ``source`` + ``id`` an event's identity: a node can only collide with its own events;
- ``type``: ``<type_prefix>.<collector>.<Type>``, reverse-DNS prefixed (the spec's SHOULD); the
  prefix is the operator's (``--type-prefix``), since this project owns no domain;
- ``subject``: the entity (``gpu:0000:3b:00.0``, ``ib:mlx5_0/1``, ``nccl:<host>:<pid>``; gna_types/entities.py);
- ``time``: the node's RFC 3339 time of the message;
- ``gnakind``, ``gnastatus``, ``gnaaction``: event or condition, firing or resolved, the suggested action
  (extension attributes, so a broker's trigger filters can route on them without reading ``data``);
- ``data``: the whole message as the fleet accepted it (fleet/wire.py), ``datacontenttype`` application/json.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/cloudevents+json"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
DEFAULT_SOURCE_PREFIX = "/gpu-node-agent"
DEFAULT_TYPE_PREFIX = "io.github.gpu-node-agent"
# OpenTelemetry's SeverityNumber ranges (logs data model): INFO 9-12, WARN 13-16, ERROR 17-20
SEVERITY: dict[str, tuple[str, int]] = {"info": ("INFO", 9), "warning": ("WARN", 13), "critical": ("ERROR", 17)}
EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")  # the spec's attribute naming rule (length: advised)
TYPE_PREFIX = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")  # a reverse-DNS name


def check_type_prefix(prefix: str) -> str:
    if not TYPE_PREFIX.fullmatch(prefix) or len(prefix) > 200:
        raise ValueError(f"type prefix {prefix[:80]!r} is not a reverse-DNS name (e.g. com.example.gpu)")
    return prefix


def event_type(collector: str, type_: str, type_prefix: str = DEFAULT_TYPE_PREFIX) -> str:
    return f"{type_prefix}.{collector}.{type_}"


def to_cloudevent(msg: Mapping[str, Any], *, source_prefix: str = DEFAULT_SOURCE_PREFIX,
                  type_prefix: str = DEFAULT_TYPE_PREFIX) -> dict[str, Any]:
    """``msg``: a message fleet/wire.py accepted (its node is its subject's, every field bounded)."""
    text, number = SEVERITY.get(str(msg.get("severity")), ("INFO", 9))
    ce: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": msg["id"],
        "source": f"{source_prefix}/nodes/{quote(str(msg['node']), safe='')}",
        "type": event_type(str(msg["collector"]), str(msg["type"]), type_prefix),
        "time": msg["time"],
        "datacontenttype": "application/json",
        "severitytext": text,
        "severitynumber": number,
        "gnakind": msg["kind"],
        "gnaaction": msg.get("suggested_action") or "none",
    }
    if msg.get("entity"):
        ce["subject"] = msg["entity"]  # the spec: if present, non-empty
    if msg.get("status"):
        ce["gnastatus"] = msg["status"]
    ce["data"] = dict(msg)
    return ce
