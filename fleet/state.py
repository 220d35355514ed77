"""The fleet as a central subscriber sees it: nodes, their active conditions, recent events,
remediation audits and the firing spans of each condition. Shared by the dashboard and `top`.

Fed from NATS: the gna-nodes KV bucket (current state, watched), heartbeats, and the GNA_EVENTS
stream (history since ``history_s`` ago, then live). Changes mark nodes dirty so views update
incrementally: 10,000 nodes never mean 10,000 rows re-sent. The correlator's incidents (the
gna-incidents KV bucket, one record per job, fleet/incidents.py) are watched too, validated like
every other input, and marked dirty per job the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from agent import natsclient
from agent.config import NatsConfig
from agent.message import rfc3339
from agent.nats_link import ensure_stream, open_kv, stream_configs
from agent.remediation.incidents import INCIDENTS_BUCKET  # key: the job's token, value: its current record
from fleet import timeline
from fleet.follow import Follower
from fleet.wire import Rejected, Rejections, decode_action, decode_event, decode_state
from gna_sdk import severity_rank
from gna_types.subjects import ACTIONS_PREFIX, EVENTS_PREFIX, HEARTBEAT_PREFIX, decode_token, is_valid_token

log = structlog.get_logger(__name__)

FAMILIES = ("GPU", "IB", "NCCL", "JuiceFS", "Agent")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")

MAX_INCIDENTS = 5000  # kept in memory; beyond, the least recently changed resolved one goes first
MAX_INCIDENT_BYTES = 1 << 20
MAX_INCIDENT_TEXT = 4096  # any one string in a record
MAX_EVIDENCE = 1000  # the correlator sends at most 24 (the rest counted in evidence_total)
MAX_INCIDENT_NODES = 20000  # victims, nodes
_EVIDENCE_TEXT = ("node", "type", "entity", "severity", "time", "message")
_EVIDENCE_EXTRA = ("rank", "seq_num", "op_type", "peer", "pci")
MAX_COUNT_KEYS = 64  # types or nodes in an incident's evidence counts (the correlator names at most 16 nodes)
_CULPRIT_TEXT = ("node", "entity", "kind")
_FINDING_KEYS = ("kind", "node", "rank", "holder", "claimed", "size")  # fleet/correlator.py Membership.finding
MAX_CULPRITS = 8
MAX_FINDINGS = 64


def family(type_: str) -> str:
    if type_.startswith(("IB", "RoCE")):
        return "IB"
    if type_.startswith("NCCL"):
        return "NCCL"
    if type_.startswith("JuiceFS"):
        return "JuiceFS"
    if type_.startswith(("Collector", "Spool", "Remediation")):
        return "Agent"
    return "GPU"  # GPU*, Nvidia*, KernelModule*, NVSwitch*


def _epoch(ts: str | None) -> float:
    if not ts:
        return 0.0
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _text(value: Any, what: str, *, optional: bool = False) -> str:
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise Rejected("schema", f"{what} must be a string, not {type(value).__name__}")
    if len(value) > MAX_INCIDENT_TEXT:
        raise Rejected("schema", f"{what} is {len(value)} characters (at most {MAX_INCIDENT_TEXT})")
    return value


def _scalar(value: Any, what: str) -> str | int:
    """A detail the correlator copies from an NCCL line (rank, seq_num, peer, pci): text or a whole number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _text(value, what)


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise Rejected("schema", f"{what} must be a list")
    if len(value) > MAX_INCIDENT_NODES:
        raise Rejected("schema", f"{what} has {len(value)} entries (at most {MAX_INCIDENT_NODES})")
    return [_text(v, f"{what}[]") for v in value]


def _culprit(culprit: Any, what: str) -> dict[str, str]:
    if not isinstance(culprit, dict):
        raise Rejected("schema", f"{what} must be an object or null")
    clean = {k: _text(culprit.get(k), f"{what}.{k}") for k in _CULPRIT_TEXT}
    if culprit.get("rank") is not None:
        clean["rank"] = str(_scalar(culprit["rank"], f"{what}.rank"))
    return clean


def incident_rank(r: dict[str, Any]) -> tuple[bool, bool, bool, float, float, str]:
    """The order every view lists incidents in (the dashboard's pages sort the same way in
    fleet/static): open before resolved; then one a cordon may act on, then one naming a culprit, the
    most confident first; then the most recently updated. A job with symptoms and no culprit no longer
    sits above a named culprit because it changed last (issue 22)."""
    return (r["status"] != "open", not r.get("actionable"), r.get("culprit") is None,
            -float(r.get("confidence") or 0), -float(r.get("updated") or 0), r["job"])


def decode_incident(data: bytes | str | dict[str, Any], *, job: str | None = None) -> dict[str, Any]:
    """One incident record (fleet/incidents.py, docs/correlator.md) as the views may use it: every
    field of the right type and size, unknown fields dropped; ``job`` (from the KV key) must be the
    record's own. Raises Rejected."""
    if isinstance(data, dict):
        doc: Any = data
    else:
        if len(data) > MAX_INCIDENT_BYTES:
            raise Rejected("too_large", f"{len(data)} bytes")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Rejected("not_json", str(exc)[:200]) from exc
    if not isinstance(doc, dict):
        raise Rejected("not_an_object", type(doc).__name__)
    name = _text(doc.get("job"), "job")
    if not name:
        raise Rejected("schema", "job is empty")
    if job is not None and name != job:
        raise Rejected("job_mismatch", f"key names {job[:80]!r}, record {name[:80]!r}")
    status = doc.get("status")
    if status not in ("open", "resolved"):
        raise Rejected("schema", f"status {str(status)[:40]!r}")
    culprit = doc.get("culprit")
    if culprit is not None:
        culprit = _culprit(culprit, "culprit")
    culprits = doc.get("culprits", [culprit] if culprit else [])
    if not isinstance(culprits, list) or len(culprits) > MAX_CULPRITS:
        raise Rejected("schema", f"culprits must be a list of at most {MAX_CULPRITS}")
    culprits = [_culprit(c, "culprits[]") for c in culprits]
    for flag in ("actionable", "contested"):
        if not isinstance(doc.get(flag, False), bool):
            raise Rejected("schema", f"{flag} must be a boolean")
    findings = doc.get("findings", [])
    if not isinstance(findings, list) or len(findings) > MAX_FINDINGS:
        raise Rejected("schema", f"findings must be a list of at most {MAX_FINDINGS}")
    clean_findings = []
    for f in findings:
        if not isinstance(f, dict):
            raise Rejected("schema", "a finding must be an object")
        clean_findings.append({k: _scalar(f[k], f"findings.{k}") for k in _FINDING_KEYS if f.get(k) is not None})
    confidence = doc.get("confidence", 0.0)
    if (isinstance(confidence, bool) or not isinstance(confidence, int | float) or not math.isfinite(confidence)
            or not 0 <= confidence <= 1):
        raise Rejected("schema", f"confidence {str(confidence)[:40]!r} is not a number in 0..1")
    evidence = doc.get("evidence", [])
    if not isinstance(evidence, list):
        raise Rejected("schema", "evidence must be a list")
    if len(evidence) > MAX_EVIDENCE:
        raise Rejected("schema", f"evidence has {len(evidence)} items (at most {MAX_EVIDENCE})")
    items = []
    for ev in evidence:
        if not isinstance(ev, dict):
            raise Rejected("schema", "an evidence item must be an object")
        item: dict[str, Any] = {k: _text(ev.get(k), f"evidence.{k}", optional=k not in ("node", "type"))
                                for k in _EVIDENCE_TEXT}
        for k in _EVIDENCE_EXTRA:
            if ev.get(k) is not None:
                item[k] = _scalar(ev[k], f"evidence.{k}")
        if ev.get("decisive") is True:
            item["decisive"] = True
        if ev.get("logged_at") is not None:  # when its source logged it (the kernel log's records)
            item["logged_at"] = _text(ev["logged_at"], "evidence.logged_at")
        items.append(item)
    total = doc.get("evidence_total", len(items))
    if isinstance(total, bool) or not isinstance(total, int) or total < len(items):
        raise Rejected("schema", f"evidence_total {str(total)[:40]!r}")
    updated = _epoch_seconds(doc.get("updated", 0.0), "updated")
    opened = _epoch_seconds(doc.get("opened", updated), "opened")
    return {"status": status, "job": name, "job_name": _text(doc.get("job_name"), "job_name", optional=True) or None,
            "culprit": culprit, "culprits": culprits, "confidence": float(confidence),
            "actionable": doc.get("actionable", False), "contested": doc.get("contested", False),
            "corroboration": _text(doc.get("corroboration"), "corroboration", optional=True),
            "reporters": _names(doc.get("reporters", []), "reporters"),
            "findings": clean_findings,
            "reason": _text(doc.get("reason"), "reason", optional=True), "evidence": items,
            "evidence_total": total, "victims": _names(doc.get("victims", []), "victims"),
            "nodes": _names(doc.get("nodes", []), "nodes"),
            "evidence_counts": _counts(doc.get("evidence_counts")),
            "first_evidence": _text(doc.get("first_evidence"), "first_evidence", optional=True) or None,
            "last_evidence": _text(doc.get("last_evidence"), "last_evidence", optional=True) or None,
            "opened": min(opened, updated), "updated": updated}


def _epoch_seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Rejected("schema", f"{what} must be a number (epoch seconds)")
    return float(value)


def _counts(value: Any) -> dict[str, Any]:
    """An incident's symptom counts (fleet/correlator.py incident): per type, per node (at most
    MAX_COUNT_KEYS each, whole non-negative numbers), and how many nodes reported any."""
    if value is None:
        return {"by_type": {}, "by_node": {}, "nodes": 0}
    if not isinstance(value, dict):
        raise Rejected("schema", "evidence_counts must be an object")
    out: dict[str, Any] = {}
    for part in ("by_type", "by_node"):
        d = value.get(part, {})
        if not isinstance(d, dict) or len(d) > MAX_COUNT_KEYS:
            raise Rejected("schema", f"evidence_counts.{part} must be an object of at most {MAX_COUNT_KEYS} keys")
        out[part] = {_text(k, f"evidence_counts.{part} key"): _count(n, f"evidence_counts.{part}")
                     for k, n in d.items()}
    out["nodes"] = _count(value.get("nodes", len(out["by_node"])), "evidence_counts.nodes")
    return out


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise Rejected("schema", f"{what} must be a whole number >= 0")
    return value


@dataclass
class NodeView:
    name: str
    last_seen: float = 0.0  # epoch of the last heartbeat or KV state
    heartbeat_interval: float = 10.0
    agent_version: str = ""
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)  # "collector|type|entity" -> condition
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))
    actions: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))
    # "type|entity" -> [[start, end or None while firing, severity]]: a new span when the severity changes
    spans: dict[str, list[list[Any]]] = field(default_factory=dict)
    conditions_total: int = 0  # what the node reports; more than len(conditions) when its heartbeat was cut
    conditions_folded: int = 0  # beyond its per-collector caps (aggregated on the node)

    def worst(self) -> dict[str, str]:
        out = dict.fromkeys(FAMILIES, "")
        for c in self.conditions.values():
            fam = family(c["type"])
            if severity_rank(c["severity"]) > severity_rank(out[fam]):
                out[fam] = c["severity"]
        return out

    def worst_condition(self) -> dict[str, Any] | None:
        """The one condition the overview names: the most severe; among equals the newest, since
        what just changed is what the reader has not seen yet."""
        if not self.conditions:
            return None
        c = max(self.conditions.values(), key=lambda c: (severity_rank(c.get("severity") or ""),
                                                          _epoch(c.get("since")), str(c.get("type"))))
        return {k: c.get(k) for k in ("severity", "type", "entity", "reason", "message", "since")}

    def stale(self, now: float) -> bool:
        return not self.last_seen or now - self.last_seen > 3 * self.heartbeat_interval


class FleetState:
    def __init__(self, *, history_s: float = 6 * 3600, max_incidents: int = MAX_INCIDENTS) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.history_s = history_s
        self.dirty: set[str] = set()
        # job -> validated incident record; the two orders say which to drop first when full
        self.incidents_by_job: dict[str, dict[str, Any]] = {}
        self.max_incidents = max(1, max_incidents)
        self.incidents_dropped = 0
        self._open_order: OrderedDict[str, None] = OrderedDict()  # least recently changed first
        self._resolved_order: OrderedDict[str, None] = OrderedDict()
        self.dirty_incidents: set[str] = set()
        self.changed = asyncio.Event()
        self.messages_seen = 0
        self.rejections = Rejections()  # reason -> messages not applied, with a sample (/api/stats)
        self.rejected = self.rejections.counts
        self.last_message_lag: deque[float] = deque(maxlen=10000)  # message time -> applied, seconds

    def node(self, name: str) -> NodeView:
        nv = self.nodes.get(name)
        if nv is None:
            nv = self.nodes[name] = NodeView(name)
        return nv

    def _touch(self, name: str) -> None:
        self.dirty.add(name)
        self.changed.set()

    # -- inputs ---------------------------------------------------------------------------
    # Identity is the subject (or KV key) a message came on, which per-node NATS permissions make
    # authentic; a payload naming another node is rejected and counted. Times from the wire are
    # clamped to the time of receipt: a "time: 2099" cannot keep a dead node fresh.
    def _identity(self, payload_node: Any, subject_node: str | None) -> str:
        name = str(payload_node or "")
        if subject_node is not None and name != subject_node:
            self.rejected["node_mismatch"] = self.rejected.get("node_mismatch", 0) + 1
            return ""
        return name

    def _severity(self, value: Any) -> str:
        if value == "" or severity_rank(value):  # "": no severity (yet)
            return str(value)
        self.rejected["unknown_severity"] = self.rejected.get("unknown_severity", 0) + 1
        return ""

    @staticmethod
    def _received(ts: Any, now: float) -> float:
        return min(_epoch(ts) or now, now)

    def apply_state(self, state: dict[str, Any], *, subject_node: str | None = None) -> None:
        """A node's KV document or heartbeat: last seen, version, the active conditions it reports."""
        name = self._identity(state.get("node"), subject_node)
        if not name:
            return
        nv = self.node(name)
        nv.last_seen = max(nv.last_seen, self._received(state.get("time"), time.time()))
        nv.heartbeat_interval = float(state.get("heartbeat_interval") or nv.heartbeat_interval)
        nv.agent_version = str(state.get("agent_version", nv.agent_version))
        conds = state.get("conditions")
        folded = state.get("conditions_folded")
        nv.conditions_folded = sum(v for v in folded.values() if isinstance(v, int)) if isinstance(folded, dict) else 0
        complete = state.get("conditions_complete", True) is not False
        if isinstance(conds, list):
            nv.conditions_total = int(state.get("conditions_total") or len(conds)) if not complete else len(conds)
            fresh = {}
            for c in conds:
                key = f"{c.get('collector')}|{c.get('type')}|{c.get('entity')}"
                prev = nv.conditions.get(key, {})
                fresh[key] = {**prev, **c, "since": c.get("since") or prev.get("since"),
                              "severity": self._severity(c.get("severity"))}
                self._open_span(nv, f"{c.get('type')}|{c.get('entity')}", fresh[key]["severity"],
                                start=_epoch(c.get("since")) or time.time(), at=time.time())
            if not complete:  # a cut heartbeat (max_payload): what it left out is still known from events
                fresh = {**nv.conditions, **fresh}
            for key in set(nv.conditions) - set(fresh):
                _, t, e = key.split("|", 2)
                self._close_span(nv, f"{t}|{e}", time.time())
            nv.conditions = fresh
        self._touch(name)

    def _open_span(self, nv: NodeView, key: str, severity: str, *, start: float, at: float,
                   stated: str | None = None) -> None:
        """A firing span from ``start``; one already open goes on, unless its severity changed: then it
        ends ``at`` and one of the new severity begins (the timeline colours each by its own). ``stated``:
        when the finding's source says it was logged (details.logged_at: the kernel's record, a training log
        line's own stamp), the span's start on the timeline (fleet/timeline.py); bounded, never trusted further."""
        spans = nv.spans.setdefault(key, [])
        if spans and spans[-1][1] is None:
            if spans[-1][2] == severity:
                return
            spans[-1][1] = start = max(at, float(spans[-1][0]))
            stated = None  # a severity change starts when it was seen
        spans.append([start, None, severity, stated[:64]] if isinstance(stated, str) and stated else
                     [start, None, severity])

    def _close_span(self, nv: NodeView, key: str, at: float) -> None:
        spans = nv.spans.get(key)
        if spans and spans[-1][1] is None:
            spans[-1][1] = at

    def apply_message(self, msg: dict[str, Any], *, subject_node: str | None = None) -> None:
        name = self._identity(msg.get("node"), subject_node)
        if not name or "type" not in msg:
            return
        nv = self.node(name)
        self.messages_seen += 1
        msg = {**msg, "severity": self._severity(msg.get("severity"))}
        at = self._received(msg.get("time"), time.time())
        self.last_message_lag.append(max(0.0, time.time() - at))
        if msg.get("kind") == "condition":
            key = f"{msg.get('collector')}|{msg['type']}|{msg.get('entity')}"
            span_key = f"{msg['type']}|{msg.get('entity')}"
            if msg.get("status") == "firing":
                prev = nv.conditions.get(key)
                nv.conditions[key] = {k: msg.get(k) for k in ("collector", "type", "entity", "severity", "reason",
                                                              "message", "details", "suggested_action")}
                nv.conditions[key]["since"] = (prev or {}).get("since") or msg.get("time")
                nv.conditions[key]["message_id"] = msg.get("id")
                details = msg.get("details")
                stated = details.get("logged_at") if isinstance(details, dict) else None
                self._open_span(nv, span_key, msg["severity"], start=at, at=at,
                                stated=stated if isinstance(stated, str) else None)
            else:
                nv.conditions.pop(key, None)
                self._close_span(nv, span_key, at)
        nv.events.appendleft({k: msg.get(k) for k in ("id", "time", "kind", "type", "status", "severity", "entity",
                                                      "collector", "message")})
        horizon = time.time() - self.history_s
        for spans in nv.spans.values():
            while spans and spans[0][1] is not None and spans[0][1] < horizon:
                spans.pop(0)
        self._touch(name)

    def apply_action(self, record: dict[str, Any], *, subject_node: str | None = None) -> None:
        name = self._identity(record.get("node"), subject_node)
        if not name:
            return
        self.node(name).actions.appendleft(record)
        self._touch(name)

    def apply_incident(self, data: bytes | str | dict[str, Any], *, key: str | None = None) -> bool:
        """The correlator's current record for one job (a ``gna-incidents`` KV entry, whose ``key``
        is the job's token, or a record as is): validated, then kept; a bad one is counted by reason
        with a sample (``/api/stats``), never raised."""
        subject = f"$KV.{INCIDENTS_BUCKET}.{key}" if key is not None else f"{INCIDENTS_BUCKET}:<direct>"
        try:
            job = None
            if key is not None:
                try:
                    if not is_valid_token(key):
                        raise ValueError("not a subject token")
                    job = decode_token(key)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise Rejected("bad_subject", f"key {key[:80]!r}") from exc
            record = decode_incident(data, job=job)
        except Rejected as exc:
            raw = data if isinstance(data, bytes | str) else repr(data)[:1000]
            self.rejections.record(exc.reason, subject, raw, str(exc))
            return False
        record["updated"] = min(record["updated"], time.time())  # a "2099" cannot keep it on top
        job = record["job"]
        if job not in self.incidents_by_job and len(self.incidents_by_job) >= self.max_incidents:
            order = self._resolved_order or self._open_order
            old, _ = order.popitem(last=False)
            del self.incidents_by_job[old]
            self.incidents_dropped += 1
            self.dirty_incidents.add(old)
        self._open_order.pop(job, None)
        self._resolved_order.pop(job, None)
        (self._open_order if record["status"] == "open" else self._resolved_order)[job] = None
        self.incidents_by_job[job] = record
        self.dirty_incidents.add(job)
        self.changed.set()
        return True

    def remove_incident(self, job: str) -> None:
        """The record was deleted from the bucket (or purged): the job has no incident any more."""
        if self.incidents_by_job.pop(job, None) is not None:
            self._open_order.pop(job, None)
            self._resolved_order.pop(job, None)
            self.dirty_incidents.add(job)
            self.changed.set()

    # -- views ------------------------------------------------------------------------------
    def incidents(self, *, status: str = "", limit: int | None = None) -> list[dict[str, Any]]:
        """Open incidents first, most actionable first (``incident_rank``); ``status`` "open" or
        "resolved" only those."""
        recs = [r for r in self.incidents_by_job.values() if not status or r["status"] == status]
        recs.sort(key=incident_rank)
        return recs if limit is None else recs[:max(0, limit)]

    def take_dirty_incidents(self) -> list[dict[str, Any]]:
        """The incidents changed since the last call: their records, or ``{"job", "removed": true}``."""
        jobs, self.dirty_incidents = self.dirty_incidents, set()
        return [self.incidents_by_job.get(j) or {"job": j, "removed": True} for j in sorted(jobs)]

    def row(self, nv: NodeView, now: float) -> dict[str, Any]:
        return {"node": nv.name, "worst": nv.worst(), "active": max(len(nv.conditions), nv.conditions_total),
                "folded": nv.conditions_folded, "stale": nv.stale(now),
                "last_seen": rfc3339(nv.last_seen) if nv.last_seen else None,
                "age_s": round(now - nv.last_seen, 1) if nv.last_seen else None,
                "types": sorted({c["type"] for c in nv.conditions.values()}),
                "collectors": sorted({c.get("collector") or "" for c in nv.conditions.values()}),
                "worst_condition": nv.worst_condition()}

    def overview(self, *, severity: str = "", collector: str = "", type_: str = "",
                 q: str = "") -> list[dict[str, Any]]:
        now = time.time()
        rows = []
        for nv in self.nodes.values():
            if q and q.lower() not in nv.name.lower():
                continue
            conds = list(nv.conditions.values())
            if severity and not any(severity_rank(c["severity"]) >= severity_rank(severity) for c in conds):
                continue
            if collector and not any(c.get("collector") == collector for c in conds):
                continue
            if type_ and not any(c["type"] == type_ for c in conds):
                continue
            rows.append(self.row(nv, now))
        rows.sort(key=lambda r: (-max(severity_rank(s) for s in r["worst"].values()), r["node"]))
        return rows

    def take_dirty(self) -> list[dict[str, Any]]:
        """The changed nodes' rows. Clears ``changed``: a caller that also shows incidents takes
        take_dirty_incidents() in the same turn."""
        now = time.time()
        names, self.dirty = self.dirty, set()
        self.changed.clear()
        return [self.row(self.nodes[n], now) for n in sorted(names) if n in self.nodes]

    def node_detail(self, name: str) -> dict[str, Any] | None:
        nv = self.nodes.get(name)
        if nv is None:
            return None
        return {"node": name, **self.row(nv, time.time()), "agent_version": nv.agent_version,
                "conditions": sorted(nv.conditions.values(),
                                     key=lambda c: (-severity_rank(c["severity"]), c["type"])),
                "events": list(nv.events)[:100], "actions": collapse_actions(nv.actions)[:100],
                "incidents": self.node_incidents(name)}

    def node_incidents(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        """The open incidents that name this node as their culprit, then those it is a victim of (in
        the views' order): its page says which job it stalls, or which job's hang it only suffers."""
        out = []
        for r in self.incidents(status="open"):
            culprits = r.get("culprits") or ([r["culprit"]] if r.get("culprit") else [])
            mine = [c for c in culprits if c.get("node") == name]
            if mine or name in r.get("victims", ()):
                out.append({"job": r["job"], "job_name": r.get("job_name"), "role": "culprit" if mine else "victim",
                            "entity": mine[0].get("entity") if mine else None,
                            "confidence": r.get("confidence"), "actionable": r.get("actionable", False),
                            "reason": r.get("reason", ""), "opened": r.get("opened"), "updated": r.get("updated")})
        out.sort(key=lambda x: x["role"] != "culprit")
        return out[:limit]

    def timeline_svg(self, name: str, *, hours: float = 6.0, width: int = 900, now: float | None = None) -> str:
        """Each condition's firing spans, zoomed to the data within the last ``hours``: when did this port flap?"""
        nv = self.nodes.get(name)
        rows = [timeline.Row(label=" ".join(key.split("|", 1)), spans=spans)
                for key, spans in sorted(nv.spans.items())] if nv else []
        return timeline.render(rows, now=time.time() if now is None else now, max_s=hours * 3600, width=width)


def collapse_actions(actions: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of audits that say the same thing become one row with ``count``, ``first_time`` and
    ``last_time``: a flapping port's "skipped: cooldown: acted 12s ago", "... 14s ago" would
    otherwise fill the trail. Digits are ignored when comparing reasons. Newest first, as given."""
    out: list[dict[str, Any]] = []
    last: tuple[Any, ...] | None = None
    for a in actions:
        trigger = a.get("trigger")
        trigger = trigger if isinstance(trigger, dict) else {}
        key = (a.get("remediation"), a.get("decision"), _DIGITS.sub("#", str(a.get("reason") or "")),
               trigger.get("type"), trigger.get("entity"))
        if out and key == last:
            out[-1]["count"] += 1
            out[-1]["first_time"] = a.get("time")
        else:
            out.append({**a, "count": 1, "first_time": a.get("time"), "last_time": a.get("time")})
            last = key
    return out


class FleetFeed:
    """Keeps a FleetState current from NATS; survives server restarts (reconnects forever)."""

    def __init__(self, state: FleetState, servers: list[str], *, nats_cfg: NatsConfig | None = None,
                 connect_timeout: float | None = None) -> None:
        self.state = state
        self.servers = servers
        self.nats_cfg = nats_cfg or NatsConfig()
        self.stream = self.nats_cfg.stream
        self.kv_bucket = self.nats_cfg.kv_bucket
        self.connect_timeout = connect_timeout
        self.nc: Any = None
        self.ready = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.followers: list[Follower] = []

    async def start(self) -> None:
        """Connected (or NatsUnavailable within the connect timeout); the stream and the KV bucket
        are followed in the background: they may not exist until the first agent publishes."""
        self.nc = await natsclient.connect(self.servers, cfg=self.nats_cfg, name="gpu-node-agent-fleet",
                                           timeout=self.connect_timeout)
        js = self.nc.jetstream()

        async def on_hb(msg: Any) -> None:
            self.accept(msg.subject, msg.data)

        await self.nc.subscribe(f"{HEARTBEAT_PREFIX}.>", cb=on_hb)

        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow_stream(js), name="fleet:stream"))
        self._tasks.append(loop.create_task(self._watch_kv(js), name="fleet:kv"))
        self._tasks.append(loop.create_task(self._watch_incidents(js), name="fleet:incidents"))

    def accept(self, subject: str, data: bytes) -> bool:
        """One message from the wire: decoded against its schema, then applied; a bad one is counted
        with a sample (``/api/stats``), never raised into the subscription."""
        state = self.state
        try:
            if subject.startswith(EVENTS_PREFIX + "."):
                state.apply_message(decode_event(subject, data), subject_node=_subject_node(subject))
            elif subject.startswith(ACTIONS_PREFIX + "."):
                state.apply_action(decode_action(subject, data), subject_node=_subject_node(subject))
            elif subject.startswith(HEARTBEAT_PREFIX + ".") and len(subject.split(".")) == 3:
                node = _subject_node(subject)
                state.apply_state(decode_state(node, data), subject_node=node)
            else:
                raise Rejected("bad_subject", subject[:200])
        except Rejected as exc:
            state.rejections.record(exc.reason, subject, data, str(exc))
            return False
        except Exception as exc:  # a shape the decoder let through that a view could not use: still counted
            state.rejections.record(f"unusable:{type(exc).__name__}", subject, data, repr(exc))
            return False
        return True

    async def _follow_stream(self, js: Any) -> None:
        """The events and actions, from ``history_s`` ago on (fleet/follow.py: resumed by sequence
        after any server loss, never by start time; the process exits 75 when it cannot resume)."""
        said = False
        while True:
            try:
                # verified first (agent.nats_link): a stream carrying a republish, mirror or sources is never read
                await ensure_stream(js, stream_configs(self.nats_cfg)[0], create=False)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the stream does not exist until the first agent creates it
                if not said:
                    log.info("fleet_waiting_for_stream", error=repr(exc))
                    said = True
                await asyncio.sleep(1)
        watch = natsclient.watching()
        since = time.time() - self.state.history_s
        self.followers = [Follower(js, self.stream, subject, self.accept, since=since, name=f"fleet:{subject}",
                                   on_fail=lambda why: watch.fail(f"the fleet feed cannot follow its stream: {why}"))
                          for subject in (f"{EVENTS_PREFIX}.>", f"{ACTIONS_PREFIX}.>")]
        runs = [asyncio.ensure_future(f.run()) for f in self.followers]
        try:
            for f in self.followers:
                await f.ready.wait()
            self.ready.set()
            await asyncio.gather(*runs)
        finally:
            for r in runs:
                r.cancel()

    async def _watch_kv(self, js: Any) -> None:
        while True:
            try:
                kv = await open_kv(js, self.kv_bucket)  # verified, as every opener does
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None or entry.value is None:
                        continue
                    self._accept_kv(entry.key, entry.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("fleet_kv_watch_retry", error=repr(exc))
                await asyncio.sleep(1)

    async def _watch_incidents(self, js: Any) -> None:
        """The gna-incidents bucket: it does not exist until a correlator publishes its first incident,
        so a missing bucket is waited for quietly (said once)."""
        said = False
        while True:
            try:
                kv = await open_kv(js, INCIDENTS_BUCKET)
                watcher = await kv.watchall()
                said = False
                async for entry in watcher:
                    if entry is None:
                        continue
                    if entry.operation in ("DEL", "PURGE"):
                        with contextlib.suppress(ValueError, UnicodeDecodeError):
                            self.state.remove_incident(decode_token(entry.key))
                        continue
                    if entry.value is None:
                        continue
                    self.state.apply_incident(entry.value, key=entry.key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not said:
                    log.info("fleet_waiting_for_incidents", bucket=INCIDENTS_BUCKET, error=repr(exc))
                    said = True
                await asyncio.sleep(2)

    def _accept_kv(self, key: str, value: bytes) -> None:
        subject = f"$KV.{self.kv_bucket}.{key}"
        try:
            node = decode_token(key)
            self.state.apply_state(decode_state(node, value), subject_node=node)
        except Rejected as exc:
            self.state.rejections.record(exc.reason, subject, value, str(exc))
        except Exception as exc:
            self.state.rejections.record(f"unusable:{type(exc).__name__}", subject, value, repr(exc))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()


def _subject_node(subject: str) -> str:
    """gna.heartbeat.<node>, gna.events.<node>.<collector>.<severity>, gna.actions.<node>.<remediation>"""
    parts = subject.split(".")
    return decode_token(parts[2]) if len(parts) >= 3 else "\0"  # no node: matches no payload
