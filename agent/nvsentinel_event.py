"""A message of this agent as NVSentinel's ``HealthEvent``, and the protobuf bytes of a ``HealthEvents``.

The interface: agent/schema/nvsentinel_health_event.proto (from github.com/NVIDIA/NVSentinel,
data-models/protobufs/health_event.proto at commit d87e985). The bytes are written here by hand (proto3
wire format: varint and length-delimited fields, defaults omitted, a map as repeated key/value entries,
Timestamp as seconds/nanos): a node agent carries no protobuf runtime, and tests/test_nvsentinel.py
decodes every field with the classes protoc compiles from that file.

How a message maps (docs/exports.md, "NVSentinel"):

- ``checkName`` is the message type, ``agent`` this agent (``gpu-node-agent``), ``nodeName`` the node;
  NVSentinel's fault-quarantine matches a healthy event to the unhealthy one it clears on (agent,
  componentClass, checkName, node, entities), so a resolved condition clears its own firing one;
- ``componentClass`` by the entity's kind (GPU, NVSWITCH, NIC, STORAGE, NODE) and WORKLOAD for a job's
  findings (collectors nccl_logs, nccl_env, nccl_inspector);
- ``entitiesImpacted``: ``PCI`` for a GPU (NVSentinel's syslog-health-monitor names GPUs so),
  ``NVSWITCH`` + ``PCI`` for a switch, ``NIC`` + ``NIC_PORT`` for an InfiniBand port, else the
  entity's kind upper-cased;
- ``isFatal`` only where this agent's own policy says cordon (a critical condition with
  suggested_action cordon): NVSentinel's default rules cordon on isFatal, and this agent never lets a
  job's log, an ambiguous finding or an event cordon;
- ``processingStrategy``: EXECUTE_REMEDIATION for the node's conditions, STORE_ONLY for events (an event
  is never resolved, so it must not hold a quarantine) and for a job's findings;
- ``recommendedAction``: an Xid's from NVIDIA's catalog bucket, mapped as NVSentinel maps it (exact
  names; RESTART_APP and IGNORE -> NONE; RESET_GPU, RESET_FABRIC, WORKFLOW_XID_48 -> COMPONENT_RESET;
  anything else CONTACT_SUPPORT); else from the suggested action (cordon -> CONTACT_SUPPORT, a GPU off
  the bus -> RESTART_BM, reboot -> RESTART_BM, inspect_hardware -> CONTACT_SUPPORT, others NONE);
- ``errorCode``: the Xid number, else the reason; empty on a healthy event (NVSentinel: any code);
- ``id``: the message's id; ``metadata``: reason, collector, entity, severity, suggested action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.message import epoch
from gna_types.entities import kind_of, parse_ib

AGENT = "gpu-node-agent"
METHOD = "/datamodels.PlatformConnector/HealthEventOccurredV1"
VERSION = 1
MAX_TEXT = 1024  # bytes of a message text sent (NVSentinel stores it; ours are bounded already)
MAX_FIELD = 256

EXECUTE_REMEDIATION, STORE_ONLY = 1, 2
ACTIONS = {"NONE": 0, "COMPONENT_RESET": 2, "CONTACT_SUPPORT": 5, "RUN_FIELDDIAG": 6, "RESTART_VM": 15,
           "RESTART_BM": 24, "REPLACE_VM": 25, "RUN_DCGMEUD": 26, "UNKNOWN": 99}
# NVIDIA's Xid catalog resolution buckets NVSentinel reads differently from their names
_BUCKET_AS = {"RESTART_APP": "NONE", "IGNORE": "NONE", "RESET_GPU": "COMPONENT_RESET",
              "RESET_FABRIC": "COMPONENT_RESET", "WORKFLOW_XID_48": "COMPONENT_RESET"}
_SUGGESTED_AS = {"cordon": "CONTACT_SUPPORT", "reboot": "RESTART_BM", "inspect_hardware": "CONTACT_SUPPORT"}
_BY_TYPE = {"GPUFellOffBus": "RESTART_BM"}  # as NVSentinel's own syslog monitor recommends for it
JOB_COLLECTORS = frozenset({"nccl_logs", "nccl_env", "nccl_inspector"})
_CLASS_BY_KIND = {"gpu": "GPU", "nvlink": "GPU", "dev": "GPU", "nvswitch": "NVSWITCH", "ib": "NIC",
                  "juicefs": "STORAGE"}


@dataclass
class HealthEvent:
    check_name: str
    component_class: str
    is_fatal: bool
    is_healthy: bool
    message: str
    recommended_action: int
    error_code: list[str]
    entities: list[tuple[str, str]]
    metadata: dict[str, str]
    generated: str  # RFC 3339
    node_name: str
    processing_strategy: int
    id: str
    agent: str = AGENT
    version: int = VERSION


def _cut(s: Any, n: int = MAX_FIELD) -> str:
    return str(s)[:n]


def entities_of(entity: str) -> list[tuple[str, str]]:
    kind, rest = kind_of(entity), entity.partition(":")[2]
    if not entity:
        return []
    if kind == "gpu":
        return [("PCI", rest)]
    if kind == "nvswitch":
        return [("NVSWITCH", rest), ("PCI", rest)]
    if kind == "ib" and (hp := parse_ib(entity)) is not None:
        hca, port = hp
        return [("NIC", hca)] + ([("NIC_PORT", f"{hca}/{port}")] if port is not None else [])
    return [((kind or "ENTITY").upper()[:32], _cut(rest if kind else entity))]


def recommended(msg: Mapping[str, Any]) -> int:
    if msg.get("status") == "resolved":
        return ACTIONS["NONE"]
    details = msg.get("details") if isinstance(msg.get("details"), Mapping) else {}
    bucket = details.get("nvidia_action") if isinstance(details, Mapping) else None
    if isinstance(bucket, str) and bucket:
        name = bucket.strip().upper()
        return ACTIONS.get(_BUCKET_AS.get(name, name), ACTIONS["CONTACT_SUPPORT"])
    if msg.get("suggested_action") == "cordon" and msg.get("type") in _BY_TYPE:
        return ACTIONS[_BY_TYPE[str(msg["type"])]]
    return ACTIONS[_SUGGESTED_AS.get(str(msg.get("suggested_action")), "NONE")]


def health_event(msg: Mapping[str, Any]) -> HealthEvent:
    """``msg``: a message of this agent (agent/message.py, as a dict)."""
    healthy = msg.get("status") == "resolved"
    condition = msg.get("kind") == "condition"
    job = msg.get("collector") in JOB_COLLECTORS
    strategy = EXECUTE_REMEDIATION if condition and not job else STORE_ONLY
    fatal = (not healthy and strategy == EXECUTE_REMEDIATION and msg.get("severity") == "critical"
             and msg.get("suggested_action") == "cordon")
    details = msg.get("details") if isinstance(msg.get("details"), Mapping) else {}
    xid = details.get("xid") if isinstance(details, Mapping) else None
    codes = [] if healthy else [str(xid) if isinstance(xid, int) else _cut(msg.get("reason", ""), 64)]
    entity = str(msg.get("entity") or "")
    return HealthEvent(
        check_name=_cut(msg["type"], 128),
        component_class="WORKLOAD" if job else _CLASS_BY_KIND.get(kind_of(entity), "NODE"),
        is_fatal=fatal, is_healthy=healthy,
        message=_cut(msg.get("message", ""), MAX_TEXT), recommended_action=recommended(msg),
        error_code=[c for c in codes if c], entities=entities_of(entity),
        metadata={"reason": _cut(msg.get("reason", "")), "collector": _cut(msg.get("collector", "")),
                  "entity": _cut(entity), "severity": _cut(msg.get("severity", "")),
                  "suggested_action": _cut(msg.get("suggested_action", "none"))},
        generated=str(msg["time"]), node_name=_cut(msg["node"]), processing_strategy=strategy,
        id=_cut(msg["id"], 64))


# -- proto3 wire format ----------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 as two's complement (never written here, but not an endless loop)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


def _str(number: int, s: str) -> bytes:
    return _len(number, s.encode("utf-8", "replace")) if s else b""


def _uint(number: int, n: int) -> bytes:
    return _key(number, 0) + _varint(n) if n else b""


def _bool(number: int, b: bool) -> bytes:
    return _key(number, 0) + b"\x01" if b else b""


def _timestamp(rfc3339: str) -> bytes:
    parts = epoch(rfc3339)
    if parts is None or parts[0] <= 0:
        return b""
    return _uint(1, parts[0]) + _uint(2, parts[1])


def encode_event(e: HealthEvent) -> bytes:
    out = [_uint(1, e.version), _str(2, e.agent), _str(3, e.component_class), _str(4, e.check_name),
           _bool(5, e.is_fatal), _bool(6, e.is_healthy), _str(7, e.message), _uint(8, e.recommended_action)]
    out += [_len(9, c.encode("utf-8", "replace")) for c in e.error_code]
    out += [_len(10, _str(1, t) + _str(2, v)) for t, v in e.entities]
    out += [_len(11, _str(1, k) + _str(2, v)) for k, v in sorted(e.metadata.items())]
    ts = _timestamp(e.generated)
    out += [_len(12, ts) if ts else b"", _str(13, e.node_name), _uint(16, e.processing_strategy), _str(17, e.id)]
    return b"".join(out)


def encode_events(events: list[HealthEvent]) -> bytes:
    """A ``HealthEvents`` request: version 1 and the events."""
    return _uint(1, VERSION) + b"".join(_len(2, encode_event(e)) for e in events)
