"""What central consumers accept from the wire: every message decoded against its schema at the
boundary, identity from the subject (per-node NATS permissions make it authentic), and every
refusal counted with a sample so it is visible (``/api/stats``, the cordoner's log), never a
silent drop and never an exception inside a view.

Events and conditions: ``gna.events.<node>.<collector>.<severity>`` carrying a
agent/schema/message.schema.json document whose node, collector and severity agree with the
subject. Audits: ``gna.actions.<node>.<remediation>`` (action.schema.json). Node state (heartbeat
or ``gna-nodes`` KV entry): a JSON object whose ``node`` is the subject's or key's node.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from agent import message as wire_message
from fleet.typed_details import TYPED, decode, typed_class
from gna_types.details import DETAILS_BY_TYPE, ProcessSummary, declared_bounds
from gna_types.subjects import (
    JOB_FACT_TYPES,
    JOB_KINDS,
    JOB_MAX,
    JOBS_PREFIX,
    SIGNAL_TYPES,
    SIGNALS_PREFIX,
    decode_token,
    encode_token,
    is_valid_token,
    job_bucket,
    subjects_for,
)

log = structlog.get_logger(__name__)

MAX_SAMPLE = 200
NCCL_COLLECTOR = "nccl_logs"  # the collector whose messages carry typed details (gna_types/details.py)
MAX_PAYLOAD = 1 << 20  # bytes: nats-server's default max_payload (a larger message never reached a server)
MAX_SUBJECT = 2048  # characters: well under nats-server's max_control_line (4 KiB by default)
# Every string a consumer keys on, bounded: a job id or entity becomes a KV key and a subject token
# (up to 3 characters per byte, gna_types/subjects.py encode_token), and a KV key longer than the server's
# control line makes it close the connection (issue 20, "silencing"). A node name is a DNS name
# (RFC 1035: 253 characters); a job id is NCCL's commId (0x + 16 hex digits) or an operator's
# namespace/name (Kubernetes: 253 + 63).
FIELD_MAX = {"id": 64, "time": 256, "node": 253, "collector": 64, "type": 128, "entity": 512, "reason": 256,
             "message": 16384}
# the fields of a NCCL message's process summary and symptoms that the fleet reads: declared once, typed and
# bounded, in gna_types/details.py; a message of another collector naming them is held to the same bounds
DETAIL_TEXT_MAX, DETAIL_INT_RANGE, LIST_MAX = declared_bounds()
_BOUNDED = frozenset(DETAIL_TEXT_MAX) | frozenset(DETAIL_INT_RANGE) | frozenset(LIST_MAX)
_STATE_TEXT = ("node", "time", "started", "agent_version")
_CONDITION_TEXT = ("collector", "type", "entity", "severity", "since", "message_id", "reason", "message",
                   "suggested_action")
_ACTION_TEXT = ("id", "time", "node", "remediation", "reason")
_DECISIONS = ("executed", "dry_run", "skipped", "failed")


class Rejected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Rejections:
    """reason -> count, with the first sample of each: what a bad publisher sent, shown to operators."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    who: str = "fleet"

    def record(self, reason: str, subject: str, data: bytes | str, detail: str = "") -> None:
        n = self.counts[reason] = self.counts.get(reason, 0) + 1
        if reason not in self.samples:
            raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
            self.samples[reason] = {"subject": subject[:MAX_SAMPLE], "detail": detail[:MAX_SAMPLE],
                                    "data": raw[:MAX_SAMPLE].decode("utf-8", "replace"), "time": time.time()}
        if n == 1 or n % 1000 == 0:
            log.warning("message_rejected", consumer=self.who, reason=reason, count=n, subject=subject[:MAX_SAMPLE],
                        detail=detail[:MAX_SAMPLE])

    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total(), "by_reason": dict(self.counts), "samples": dict(self.samples)}


def _subject_tokens(subject: str, prefix: str, n: int) -> list[str]:
    if len(subject) > MAX_SUBJECT:
        raise Rejected("too_long", f"subject of {len(subject)} characters")
    parts = subject.split(".")
    head = prefix.split(".")
    if len(parts) != len(head) + n or parts[: len(head)] != head or not all(is_valid_token(p) for p in parts[2:]):
        raise Rejected("bad_subject", subject[:MAX_SAMPLE])
    return parts[len(head):]


def _node_of(token: str) -> str:
    try:
        return decode_token(token)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected("bad_subject", f"node token {token[:80]!r}") from exc


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected("not_json", str(exc)) from exc
    if not isinstance(doc, dict):
        raise Rejected("not_an_object", type(doc).__name__)
    return doc


def decode_event(subject: str, data: bytes, *, typed: bool = False) -> dict[str, Any]:
    """An event or condition from ``gna.events.<node>.<collector>.<severity>``, as a dict; ``typed``: with the
    details the boundary decoded kept under fleet/typed_details.py ``TYPED`` (for the correlator, never
    published)."""
    node_token, collector, severity = _subject_tokens(subject, "gna.events", 3)
    msg = _message(data, node_token, typed)
    if msg["collector"] != collector or msg["severity"] != severity:
        raise Rejected("subject_mismatch", f"payload {msg['collector']}/{msg['severity']} on {subject[:120]}")
    return msg


def as_received(m: dict[str, Any]) -> dict[str, Any]:
    """A message dict as the incident service receives it: published on its first subject and decoded at this
    boundary with its typed details kept (offline tools and tests; Rejected where the wire refuses it)."""
    subject = subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"])[0]
    data = json.dumps(m).encode()
    return decode_job(subject, data, typed=True) if subject.startswith(JOBS_PREFIX + ".") \
        else decode_event(subject, data, typed=True)


def decode_job(subject: str, data: bytes, *, typed: bool = False) -> dict[str, Any]:
    """A job's membership fact or evidence from ``gna.jobs.<job>.<node>.member|evidence``: the node is the
    subject's (the publisher's own, by its permissions), the job in the payload must be the subject's,
    and only membership facts travel as ``member``. As the jobs stream stores it, the subject carries the job's
    bucket first (``gna.jobs.<bucket>.<job>.<node>.<kind>``, gna_types/subjects.py JOBS_TRANSFORM): it must be the
    job token's, or a reader of one partition would file another's job. ``typed`` as for ``decode_event``."""
    if subject.count(".") == 5:
        bucket, job_token, node_token, kind = _subject_tokens(subject, JOBS_PREFIX, 4)
        if bucket != str(job_bucket(job_token)):
            raise Rejected("bad_bucket", f"bucket {bucket[:12]!r} for job token {job_token[:80]!r}")
    else:
        job_token, node_token, kind = _subject_tokens(subject, JOBS_PREFIX, 3)
    if kind not in JOB_KINDS:
        raise Rejected("bad_subject", subject[:MAX_SAMPLE])
    msg = _message(data, node_token, typed)
    job = msg["details"].get("job")
    if not isinstance(job, str) or encode_token(job) != job_token:
        raise Rejected("job_mismatch", f"subject names job {job_token[:80]!r}, payload {str(job)[:80]!r}")
    if (msg["type"] in JOB_FACT_TYPES) != (kind == "member"):
        raise Rejected("subject_mismatch", f"{msg['type'][:80]} on {subject[:120]}")
    return msg


def decode_signals(subject: str, data: bytes) -> dict[str, Any]:
    """A straggler vector from ``gna.signals.<node>.<collector>``: the node and collector are the subject's."""
    node_token, collector = _subject_tokens(subject, SIGNALS_PREFIX, 2)
    msg = _message(data, node_token)
    if msg["collector"] != collector or msg["type"] not in SIGNAL_TYPES:
        raise Rejected("subject_mismatch", f"{msg['collector'][:40]}/{msg['type'][:80]} on {subject[:120]}")
    return msg


def check_bounds(msg: wire_message.Message) -> ProcessSummary | None:
    """Every string and number a central consumer keys on is within its bound, or Rejected
    (``too_long`` / ``out_of_range``, naming the field): never truncated into another valid value. A NCCL
    message's details are decoded as its type, and that value returned (fleet/typed_details.py keeps it on
    the message for the correlator's decisions); None for another collector's message."""
    for name, limit in FIELD_MAX.items():
        value = getattr(msg, name)
        if len(value) > limit:
            raise Rejected("too_long", f"{name} of {len(value)} characters (at most {limit})")
    d = msg.details
    if msg.collector == NCCL_COLLECTOR:  # typed: decoded as its type, every declared field its type and bound
        try:
            return msgspec.convert(d, DETAILS_BY_TYPE.get(msg.type, ProcessSummary))
        except msgspec.ValidationError as exc:
            text = str(exc)
            raise Rejected("too_long" if "of length" in text else "out_of_range" if re.search(r"`int` [<>]=", text)
                           else "schema", f"details: {text[:200]}") from None
    for name in d.keys() & _BOUNDED:  # only the bounded fields a message carries (issue 21: every message pays this)
        value = d[name]
        if name in DETAIL_TEXT_MAX:
            limit = DETAIL_TEXT_MAX[name]
            if isinstance(value, str) and len(value) > limit:
                raise Rejected("too_long", f"details.{name} of {len(value)} characters (at most {limit})")
        elif name in DETAIL_INT_RANGE:
            lo, hi = DETAIL_INT_RANGE[name]
            if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
                raise Rejected("out_of_range", f"details.{name} = {str(value)[:40]} (not in {lo}..{hi})")
        else:
            most = LIST_MAX[name]
            if isinstance(value, list | dict) and (len(value) > most or
                                                   any(isinstance(v, str) and len(v) > 64 for v in value)):
                raise Rejected("too_long", f"details.{name}: {len(value)} items (at most {most} of 64 characters)")
    return None


def _message(data: bytes, node_token: str, typed: bool = False) -> dict[str, Any]:
    if len(data) > MAX_PAYLOAD:
        raise Rejected("too_long", f"payload of {len(data)} bytes")
    try:
        msg = wire_message.decode(data)
    except msgspec.ValidationError as exc:
        raise Rejected("schema", str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise Rejected("not_json", str(exc)) from exc
    if msg.node != _node_of(node_token):
        raise Rejected("node_mismatch", f"subject names {_node_of(node_token)!r}, payload {msg.node[:80]!r}")
    if (msg.kind == "condition") != (msg.status is not None):
        raise Rejected("schema", "conditions carry a status, events do not")
    if not wire_message.TYPE_NAME.match(msg.type):
        raise Rejected("schema", f"type {msg.type[:80]!r} is not CamelCase")
    details = check_bounds(msg)
    out = wire_message.to_dict(msg)
    if typed:  # what the correlator decides on, decoded once (fleet/typed_details.py)
        out[TYPED] = details if details is not None else decode(typed_class(msg.collector, msg.type), msg.details)
    return out


class _DetailsPeek(msgspec.Struct):
    job: Any = None


class _JobPeek(msgspec.Struct):
    details: _DetailsPeek | None = None


_peek_job = msgspec.json.Decoder(_JobPeek)


def peek_job(data: bytes) -> str | None:
    """The job a message's details name, read without decoding the rest (a replica skips other
    partitions' messages by it: fleet/incident_service.py); None when it names none or cannot be read
    this way. Never a verdict on the message: what is kept is decoded in full (``decode_event``)."""
    if len(data) > MAX_PAYLOAD:
        return None
    try:
        d = _peek_job.decode(data).details
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    job = d.job if d is not None else None
    return job if isinstance(job, str) and 0 < len(job) <= JOB_MAX else None


def decode_action(subject: str, data: bytes) -> dict[str, Any]:
    """A remediation audit from ``gna.actions.<node>.<remediation>``."""
    node_token, remediation = _subject_tokens(subject, "gna.actions", 2)
    doc = _json_object(data)
    for k in _ACTION_TEXT:
        if not isinstance(doc.get(k), str):
            raise Rejected("schema", f"{k} must be a string")
    if doc.get("decision") not in _DECISIONS:
        raise Rejected("schema", f"decision {str(doc.get('decision'))[:40]!r}")
    if not isinstance(doc.get("dry_run"), bool) or not isinstance(doc.get("trigger", {}), dict):
        raise Rejected("schema", "dry_run must be a boolean, trigger an object")
    # audits of the central cordoner name the node they acted on: the cordoner may publish any node's
    # audit subject (its NATS user), a node only its own (docs/nats-security.md)
    if doc["node"] != _node_of(node_token):
        raise Rejected("node_mismatch", f"subject names {_node_of(node_token)!r}, payload {doc['node'][:80]!r}")
    if doc["remediation"] != remediation:
        raise Rejected("subject_mismatch", f"remediation {doc['remediation'][:40]!r} on {subject[:120]}")
    return doc


def decode_state(node: str, data: bytes) -> dict[str, Any]:
    """A heartbeat or ``gna-nodes`` entry of ``node`` (from the subject or KV key)."""
    doc = _json_object(data)
    for k in _STATE_TEXT:
        if k in doc and not isinstance(doc[k], str):
            raise Rejected("schema", f"{k} must be a string")
    if doc.get("node") != node:
        raise Rejected("node_mismatch", f"subject names {node[:80]!r}, payload {str(doc.get('node'))[:80]!r}")
    hb = doc.get("heartbeat_interval", 10.0)
    if isinstance(hb, bool) or not isinstance(hb, int | float) or not 0 < hb <= 86400:
        raise Rejected("schema", "heartbeat_interval must be a number of seconds in (0, 86400]")
    conds = doc.get("conditions", [])
    if not isinstance(conds, list):
        raise Rejected("schema", "conditions must be a list")
    for c in conds:
        if not isinstance(c, dict) or not all(isinstance(c.get(k, ""), str) for k in _CONDITION_TEXT):
            raise Rejected("schema", "a condition must be an object of strings")
        if not c.get("type"):  # the views file it by its type's family (state.NodeView.worst)
            raise Rejected("schema", "a condition must name its type")
    if not isinstance(doc.get("conditions_complete", True), bool):
        raise Rejected("schema", "conditions_complete must be a boolean")
    return doc
