"""What remediation knows of the fleet correlator's incidents: never cordon a victim for its job's symptoms.

The correlator (fleet/incidents.py) keeps each job's current incident in the KV bucket
``gna-incidents``. Whoever decides a cordon -- the central cordoner, or a node agent that runs its
own remediations (per-node mode) -- watches the bucket. Records are validated like any input from
the wire, with bounds (``check_incident``): a record that fails is counted, never raised.

The trust model's cordoner side (#20; docs/remediation.md "Incidents and the cordon decision"):

* **What a victim is spared for** (``spare``): only its *symptoms of that job* -- the reports of a
  process that waited (``NCCLCollectiveTimeout``, ``NCCLWatchdogProgress``) and IB completion errors
  that name a peer -- events on the process's own ``nccl:`` entity, from the node the incident lists
  as a victim, never from the culprit's node. Never a finding about the node's own resources (socket
  fallback, IB async port events, FarNIC/GDR, anything on a ``gpu:`` or ``ib:`` entity, any
  condition): being listed as a victim is something another node's word can cause, so it must buy
  nothing but "my waiting is not my fault".
* **Which verdicts spare**: a waiting symptom (a timeout, a watchdog's progress line names no
  culprit) is spared for a listed victim of any open incident of the job -- culprit-less, "shown"
  (below the cordon threshold) or actionable alike: the verdict's strength is not what makes a
  timeout harmless, and sparing it can only keep the reporter's own node up. A completion error
  naming a peer is a claim about another node; it is spared only when the incident names an
  *actionable* culprit on another node (``culprit_actionable``), i.e. the error is explained by a
  verdict that is itself acted on. A shown-only verdict never spares anything a culprit-less one
  would not.
* **Who waits for a verdict** (``needs_verdict``): only such a symptom, when a rule would cordon on
  it, the job is not judged yet and its grace (``GRACE`` s from the job's first message here) is
  running. Hardware findings and conditions never wait: waiting could only end in a sparing they can
  never get.
* **What an ``IncidentCulprit`` may act on** (``culprit_actionable``): an open record whose confidence
  is at least ``CULPRIT_MIN_CONFIDENCE`` and that says it is actionable (``"actionable": true``). A
  record without the field counts as actionable only for hardware culprits (kind ``gpu``,
  ``hca_port``, ``transport``); software-only verdicts (``rank``, ``link``, anything else) need the
  correlator's explicit ``true`` (corroborated, not one reporter's word).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gna_types import subjects

log = structlog.get_logger(__name__)

INCIDENTS_BUCKET = subjects.INCIDENTS_BUCKET  # key: the job's token, value: its current incident record
GRACE = 3.0  # s: a job's first NCCL message that would cordon waits this long for the correlator's verdict
MAX_JOBS = 100_000
CULPRIT_MIN_CONFIDENCE = 0.85  # a verdict below this is shown, never acted on

# bounds of an incident record (check_incident): past them the record is refused and counted
MAX_RECORD_BYTES = 4 << 20
MAX_JOB = 320  # characters of a job id: fleet.wire.JOB_MAX (what the fleet decoder lets through)
MAX_VICTIMS = 65_536  # nodes a job's incident may list as victims
MAX_NAME = 256  # a node name (a DNS name is at most 253)
MAX_ENTITY = 512
MAX_SHORT = 64  # kind, status, rank
MAX_REASON = 4096

# the job's symptoms a victim is spared for (see the module docstring)
WAITING_SYMPTOMS = frozenset({"NCCLCollectiveTimeout", "NCCLWatchdogProgress"})
PEER_SYMPTOMS = frozenset({"NCCLIBCompletionError"})  # only when it names a peer
HARDWARE_CULPRITS = frozenset({"gpu", "hca_port", "transport"})  # actionable without an explicit flag
PROCESS_ENTITY = "nccl:"  # a job's process (nccl:<host>:<pid>): the only entity a symptom may be spared on


class BadIncident(ValueError):
    """An incident record refused; ``reason`` is the counter's key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _str(v: Any, limit: int, what: str) -> str:
    if not isinstance(v, str):
        raise BadIncident("bad_incident", f"{what} is not a string")
    if len(v) > limit:
        raise BadIncident("incident_too_long", f"{what}: {len(v)} characters (at most {limit})")
    return v


def check_incident(data: bytes) -> dict[str, Any]:
    """An incident record, bounded; BadIncident (with the counter's reason) when it is not one."""
    if len(data) > MAX_RECORD_BYTES:
        raise BadIncident("incident_too_long", f"{len(data)} bytes")
    try:
        rec = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadIncident("bad_incident", f"not JSON: {type(exc).__name__}") from None
    if not isinstance(rec, dict):
        raise BadIncident("bad_incident", "not an object")
    _str(rec.get("job"), MAX_JOB, "job")
    if not rec["job"]:
        raise BadIncident("bad_incident", "empty job")
    if rec.get("status") not in ("open", "resolved"):
        raise BadIncident("bad_incident", "status is neither open nor resolved")
    victims = rec.get("victims", [])
    if not isinstance(victims, list):
        raise BadIncident("bad_incident", "victims is not a list")
    if len(victims) > MAX_VICTIMS:
        raise BadIncident("incident_too_long", f"{len(victims)} victims (at most {MAX_VICTIMS})")
    for v in victims:
        _str(v, MAX_NAME, "a victim")
    c = rec.get("culprit")
    if c is not None:
        if not isinstance(c, dict):
            raise BadIncident("bad_incident", "culprit is not an object")
        _str(c.get("node"), MAX_NAME, "culprit.node")
        for key, limit in (("entity", MAX_ENTITY), ("kind", MAX_SHORT), ("rank", MAX_SHORT)):
            if c.get(key) is not None:
                _str(c[key], limit, f"culprit.{key}")
    conf = rec.get("confidence")
    if conf is not None and (isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 <= conf <= 1):
        raise BadIncident("bad_incident", "confidence is not a number in [0, 1]")
    if rec.get("actionable") is not None and not isinstance(rec["actionable"], bool):
        raise BadIncident("bad_incident", "actionable is not a boolean")
    if rec.get("reason") is not None:
        _str(rec["reason"], MAX_REASON, "reason")
    return rec


def parse_incident(data: bytes) -> dict[str, Any] | None:
    """An incident record, or None when it is not one (counted by the caller)."""
    try:
        return check_incident(data)
    except BadIncident:
        return None


def culprit_actionable(rec: dict[str, Any] | None) -> bool:
    """The record's culprit may be acted on (an ``IncidentCulprit`` trigger; a peer error spared)."""
    if not rec or rec.get("status") != "open":
        return False
    c = rec.get("culprit")
    conf = rec.get("confidence")
    if not isinstance(c, dict) or isinstance(conf, bool) or not isinstance(conf, (int, float)):
        return False
    if conf < CULPRIT_MIN_CONFIDENCE:
        return False
    flag = rec.get("actionable")
    if flag is not None:
        return flag is True
    return c.get("kind") in HARDWARE_CULPRITS  # a record from before the field: hardware verdicts only


def job_of(msg: dict[str, Any]) -> str | None:
    details = msg.get("details")
    job = details.get("job") if isinstance(details, dict) and msg.get("collector") == "nccl_logs" else None
    return job if isinstance(job, str) and job and len(job) <= MAX_JOB else None


def symptom_kind(msg: dict[str, Any]) -> str | None:
    """"waiting" or "peer" when ``msg`` is a job's symptom a victim may be spared for, else None."""
    if msg.get("kind") != "event" or job_of(msg) is None:
        return None
    entity = msg.get("entity")
    if not isinstance(entity, str) or not entity.startswith(PROCESS_ENTITY):
        return None  # gpu:, ib:, module:, ... are the node's own resources: never spared
    type_ = msg.get("type")
    if type_ in WAITING_SYMPTOMS:
        return "waiting"
    if type_ in PEER_SYMPTOMS:
        details = msg.get("details")
        peer = details.get("peer") if isinstance(details, dict) else None
        return "peer" if isinstance(peer, str) and peer else None
    return None


def culprit_trigger(rec: dict[str, Any], c: dict[str, Any], *, firing: bool) -> dict[str, Any]:
    """An incident's culprit as the ``IncidentCulprit`` condition the engine decides on (its reason: the
    culprit's kind — gpu, hca_port, transport for hardware; rank, link for software evidence)."""
    from agent.message import make_message, to_dict

    return to_dict(make_message(
        node=c["node"], collector="correlator", kind="condition", type="IncidentCulprit",
        severity="critical" if firing else "info", status="firing" if firing else "resolved",
        entity=str(c.get("entity", "node"))[:200], reason=str(c.get("kind", "culprit"))[:64],
        message=f"culprit of job {rec.get('job_name') or rec['job']}: {str(rec.get('reason', ''))[:300]}",
        details={"job": rec["job"], "job_name": rec.get("job_name"), "confidence": rec.get("confidence"),
                 "victims": len(rec.get("victims", [])),
                 "actionable": culprit_actionable(rec) if firing else None}))


def culprit_changes(before: dict[str, Any] | None, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """What one update of a job's record means for the engine: the previous actionable culprit's trigger
    ends when the verdict is withdrawn or changed, the new actionable culprit's fires."""
    out = []
    c, old = rec.get("culprit"), (before or {}).get("culprit")
    acts, acted = culprit_actionable(rec), culprit_actionable(before)
    if old and before and acted and (old != c or not acts):
        out.append(culprit_trigger(before, old, firing=False))
    if c and acts:
        out.append(culprit_trigger(rec, c, firing=True))
    return out


OnCulprit = Callable[[dict[str, Any]], Awaitable[Any]]


class IncidentView:
    """The open incidents, by job, as the bucket says."""

    def __init__(self, *, grace: float = GRACE,
                 on_invalid: Callable[[BadIncident, bytes], None] | None = None) -> None:
        self.incidents: dict[str, dict[str, Any]] = {}
        self.job_first_seen: dict[str, float] = {}
        self.grace = grace
        self.invalid = 0
        self.on_invalid = on_invalid  # told of each refused record (the cordoner counts it with a sample)
        # per-node mode: (this node's name, what to do with an IncidentCulprit naming it), see watch()
        self.own_culprit: tuple[str, OnCulprit] | None = None

    def file(self, data: bytes) -> dict[str, Any] | None:
        """A record from the bucket; a bad one is counted (never raised)."""
        try:
            rec = check_incident(data)
        except BadIncident as exc:
            self.invalid += 1
            if self.on_invalid is not None:
                self.on_invalid(exc, data)
            return None
        self.put(rec)
        return rec

    def put(self, rec: dict[str, Any]) -> None:
        if rec["job"] not in self.incidents and len(self.incidents) >= MAX_JOBS:
            self.incidents.pop(next(iter(self.incidents)))
        self.incidents[rec["job"]] = rec

    def spare(self, msg: dict[str, Any]) -> str | None:
        """Why this message must not cordon its node: it is a victim's symptom of that job, and the
        job's open incident lists the node as a victim (module docstring); None otherwise."""
        kind = symptom_kind(msg)
        job = job_of(msg)
        inc = self.incidents.get(job) if kind and job else None
        node = msg.get("node")
        if inc is None or inc.get("status") != "open" or node not in inc.get("victims", []):
            return None
        c = inc.get("culprit") or {}
        if c and c.get("node") == node:
            return None  # the culprit's node is nobody's victim
        if kind == "peer" and not culprit_actionable(inc):
            return None  # a claim about a peer is explained only by a verdict that is acted on
        who = f"{c.get('node')} {c.get('entity')}" if c else "not yet named"
        return f"victim of incident {job} (culprit {who}): its symptoms never cordon it"

    def needs_verdict(self, msg: dict[str, Any], would_cordon: bool) -> bool:
        """This message should wait for the correlator's verdict: a symptom a verdict could spare, that a
        rule would cordon on, of a job not judged yet whose grace (from its first message) is running."""
        job = job_of(msg)
        if job is None or not would_cordon or job in self.incidents or symptom_kind(msg) is None:
            return False
        now = time.monotonic()
        if job not in self.job_first_seen and len(self.job_first_seen) >= MAX_JOBS:
            for old in [j for j, t in self.job_first_seen.items() if now - t >= self.grace]:
                del self.job_first_seen[old]
            if len(self.job_first_seen) >= MAX_JOBS:
                return False  # no room to remember it: decided without waiting
        first = self.job_first_seen.setdefault(job, now)
        return now - first < self.grace

    async def wait_verdict(self, msg: dict[str, Any]) -> None:
        """Until the job is judged or its grace ran out (at most ``grace`` s)."""
        job = job_of(msg)
        if job is None:
            return
        first = self.job_first_seen.get(job, time.monotonic())
        while job not in self.incidents and time.monotonic() - first < self.grace:
            await asyncio.sleep(0.05)

    async def await_verdict(self, msg: dict[str, Any], would_cordon: bool) -> None:
        """Per-node mode (the agent's own bus): wait in line. Only what ``needs_verdict`` waits, once per
        job, at most ``grace`` s; the rest never waits."""
        if self.needs_verdict(msg, would_cordon):
            await self.wait_verdict(msg)

    async def _filed(self, data: bytes) -> None:
        """File a record; in per-node mode, a verdict naming this node is decided by its own engine (the
        node's word about itself is never needed: the correlator's record is the evidence)."""
        before = self.incidents.get(str(json.loads(data).get("job"))) if self.own_culprit else None
        rec = self.file(data)
        if rec is None or self.own_culprit is None:
            return
        node, handle = self.own_culprit
        for trigger in culprit_changes(before, rec):
            if trigger["node"] == node:
                try:
                    await handle(trigger)
                except Exception:  # the watch must outlive one bad decision
                    log.exception("own_culprit_failed", job=rec.get("job"))

    async def watch(self, js: Any) -> None:
        """Follow the bucket for ever (retrying while it does not exist yet or NATS is away)."""
        while True:
            try:
                from agent.nats_link import open_kv  # here: remediation loads without NATS

                kv = await open_kv(js, INCIDENTS_BUCKET)  # verified: a bucket carrying foreign settings is refused
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is not None and entry.value:
                        await self._filed(entry.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("incident_watch_retry", error=repr(exc))
                await asyncio.sleep(1)
