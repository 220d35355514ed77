"""The live correlator: the fleet's event stream in, incidents out, as evidence arrives.

``IncidentTracker`` is the state (no I/O): every decoded message is filed under its job (NCCL
messages name it) or its node (hardware findings), and a job touched by a new message is judged
again by fleet/correlator.py. A verdict that changed is an incident record to publish; a job quiet
for ``resolve_after`` seconds (it ended, or recovered) resolves its incident.

fleet/incident_service.py runs it on NATS (``IncidentService``): replicas split the jobs by
``owner``, each judging only the jobs whose commId hashes to a partition it holds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog

from agent.remediation.incidents import INCIDENTS_BUCKET as INCIDENTS_BUCKET  # re-exported: the correlator writes it
from fleet.correlator import (
    SYMPTOMS,
    fast_verdict,
    hardware_key,
    incident,
    is_incident,
    new_facts,
    slow_verdict,
    waits_to_settle,
)
from fleet.typed_details import NCCL_COLLECTOR, nccl, with_typed
from gna_types.subjects import JOB_BUCKETS, encode_token, job_bucket

log = structlog.get_logger(__name__)

JUDGE_SLICE_S = 0.005  # s: the longest the judge loop runs before it lets the event loop serve others


MAX_KEY = 1024  # characters of a KV key or subject token: nats-server closes a connection whose control
# line passes max_control_line (4 KiB by default), so nothing this service puts may come near it


def owner(job: str, partitions: int) -> int:
    """The partition that judges ``job``: stable across replicas and restarts. By the bucket nats-server
    stores the job's subjects under (gna_types/subjects.py), so a replica's consumer can ask for its own jobs'
    buckets only: partition ``p`` of ``n`` holds the buckets ``b`` with ``b % n == p``."""
    return job_bucket(encode_token(job)) % max(1, partitions)


def partition_buckets(partition: int, partitions: int) -> list[int]:
    """The jobs stream's buckets whose jobs partition ``partition`` of ``partitions`` judges."""
    return [b for b in range(JOB_BUCKETS) if b % max(1, partitions) == partition]


# Per-reporter shares (issue 20, "suppression"): one node's messages can crowd out only its own. A
# job's state is kept per node and per process: a node has at most PROCESSES_PER_NODE processes in a
# job (an HGX node runs 8 ranks; a process beyond the share is refused, never one already known
# evicted: first claims stand); a node takes part in at most JOBS_PER_NODE jobs of the table, and a
# job has at most NODES_PER_JOB nodes. What a process said is reduced to its facts
# (fleet/job_facts.py: one member record and one set of watchdog numbers per process, whatever how
# many lines it printed), so the job's size and these shares bound a job's state.
PROCESSES_PER_NODE = 64
JOBS_PER_NODE = 256
NODES_PER_JOB = 8192
# A replica's budget, in the facts it holds over every job: a member record per process plus a
# watchdog record per process that reported (so a rank that timed out counts twice: 2^20 holds
# 512k such ranks, 25 times a 4,096-node job); over it the table forgets jobs as it does when full
# (counted in dropped_jobs). Bytes per rank: docs/benchmarks.md (bench/incidents_scale.py).
MAX_PROCESSES = 1 << 20
IDS_PER_JOB = 1 << 14  # message ids remembered per job (two generations): a replayed message is filed once
SETTLE_MAX = 2.0  # s: however often symptoms arrive, a verdict waits at most this long after the first
ABANDON_AFTER = 24 * 3600.0  # s: an open incident of a job nobody has said anything about for this long
# A job fact a node publishes when one of its processes of the job ended (collectors/nccl_logs.py)
PROCESS_ENDED = "NCCLProcessEnded"


class _Job:
    __slots__ = ("ended", "ended_members", "facts", "ids", "ids_old", "last_seen", "last_symptom", "node_procs",
                 "published", "unsettled_since")

    def __init__(self, job: str) -> None:
        self.facts = new_facts(job, members_per_node=PROCESSES_PER_NODE)
        self.node_procs: dict[str, set[str]] = {}  # node -> its processes (entities) in the job
        # a job's evidence may arrive twice (a replay after a takeover): filed once, by the id's hash
        self.ids: set[int] = set()
        self.ids_old: set[int] = set()
        self.ended: set[tuple[str, str]] = set()  # (node, entity) whose process ended
        self.ended_members = 0  # how many of the job's members are in ``ended``
        self.last_seen = 0.0
        self.last_symptom = 0.0  # when the last timeout/completion error/fallback was received
        self.unsettled_since: float | None = None  # the first symptom since the last verdict
        self.published: dict[str, Any] | None = None  # the last record sent

    @property
    def nodes(self) -> dict[str, set[str]]:
        return self.node_procs

    def weight(self) -> int:
        return self.facts.weight()

    def seen(self, mid: str) -> bool:
        h = hash(mid)
        if h in self.ids or h in self.ids_old:
            return True
        if len(self.ids) >= IDS_PER_JOB:
            self.ids_old, self.ids = self.ids, set()
        self.ids.add(h)
        return False

    def processes_ended(self) -> bool:
        """Every process the job's nodes said was a member has ended (NCCLProcessEnded from its node)."""
        return self.ended_members > 0 and self.ended_members >= len(self.facts.ms.members)


class IncidentTracker:
    def __init__(self, *, partitions: int = 1, partition: int = 0, resolve_after: float = 600.0,
                 max_jobs: int = 10000, settle: float = 1.0, settle_max: float = SETTLE_MAX,
                 abandon_after: float = ABANDON_AFTER, max_processes: int = MAX_PROCESSES) -> None:
        if not 0 <= partition < partitions:
            raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
        self.partitions, self.partition = partitions, partition
        self.owned: set[int] = {partition}  # with leases (fleet.leases), what this replica holds now
        self.resolve_after = resolve_after
        self.abandon_after = max(abandon_after, resolve_after)
        self.max_jobs = max_jobs
        self.max_processes = max_processes
        self.jobs: dict[str, _Job] = {}
        self.hardware: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # node -> (type, entity) -> msg
        self.node_jobs: dict[str, set[str]] = {}
        self.dropped_jobs = 0
        self.refused: dict[str, int] = {}  # reason -> messages refused by a per-reporter share
        self._arrival = 0
        self._weight = 0  # processes held over every job (approximately: refreshed as jobs change)
        # A hung rank is the one that did NOT time out: while timeouts still arrive, the last ranks to
        # report would look silent. Such a verdict (and "no culprit yet") waits until no symptom
        # arrived for ``settle`` s (watchdogs with one timeout fire within a second of each other), but
        # never longer than ``settle_max`` s after the first symptom (a node re-sending its own
        # timeout cannot hold a verdict back); a hardware fault on a resource the job used is
        # published at once.
        self.settle = settle
        self.settle_max = max(settle, settle_max)
        self.pending: dict[str, float] = {}  # job -> when to judge it again

    def stats(self) -> dict[str, int]:
        """Self-metrics for the service's periodic stats line: jobs, members, processes held, refusals."""
        return {"jobs": len(self.jobs), "nodes_with_hardware": len(self.hardware),
                "members": sum(len(j.facts.ms.members) for j in self.jobs.values()),
                "processes_held": self._weight,  # members + process facts (MAX_PROCESSES)
                "dropped_jobs": self.dropped_jobs,
                "refused": sum(self.refused.values())}

    def owns(self, job: str) -> bool:
        return owner(job, self.partitions) in self.owned

    def lose(self, partition: int) -> None:
        """Stop judging a partition (its lease went to another replica): forget its jobs, publish nothing."""
        self.owned.discard(partition)
        for job in [job for job in self.jobs if owner(job, self.partitions) == partition]:
            self._drop(job)

    def _refuse(self, reason: str) -> set[str]:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return set()

    def _drop(self, job: str) -> None:
        j = self.jobs.pop(job)
        self._weight -= j.weight()
        for n in j.node_procs:
            self.node_jobs.get(n, set()).discard(job)
        self.pending.pop(job, None)

    def add(self, msg: dict[str, Any], now: float | None = None) -> set[str]:
        """File one decoded message; the jobs (of this partition) to judge again."""
        now = time.time() if now is None else now
        node = msg.get("node")
        if not isinstance(node, str):
            return set()
        msg = with_typed(msg)  # the wire's typed details, else decoded once here (fleet/typed_details.py)
        d = nccl(msg) if msg.get("collector") == NCCL_COLLECTOR else None
        job = d.job if d is not None else None
        if job:
            if not self.owns(job):
                return set()
            j = self.jobs.get(job)
            mine = self.node_jobs.get(node, set())
            if job not in mine and len(mine) >= JOBS_PER_NODE:
                return self._refuse("jobs_per_node")  # one node cannot fill the job table
            if j is None:
                while self.jobs and (len(self.jobs) >= self.max_jobs or self._weight >= self.max_processes):
                    self._forget_one()
                j = self.jobs[job] = _Job(job)
            elif node not in j.node_procs and len(j.node_procs) >= NODES_PER_JOB:
                return self._refuse("nodes_per_job")
            mid = msg.get("id")
            if isinstance(mid, str) and j.seen(mid):
                return set()
            proc = str(msg.get("entity", ""))[:600]
            procs = j.node_procs.get(node)
            if procs is not None and proc not in procs and len(procs) >= PROCESSES_PER_NODE:
                return self._refuse("processes_per_node")  # the node's known processes stand
            self._arrival += 1
            before = j.weight()
            members_before = len(j.facts.ms.members)
            if not j.facts.add(msg, self._arrival, d):
                return self._refuse("processes_per_node")
            self._weight += j.weight() - before
            if procs is None:
                procs = j.node_procs[node] = set()
            procs.add(proc)
            if msg.get("type") == PROCESS_ENDED and (node, proc) not in j.ended and len(j.ended) < 1 << 20:
                j.ended.add((node, proc))
                if j.facts.ms.member_of(node, proc) is not None:
                    j.ended_members += 1
            elif len(j.facts.ms.members) > members_before and (node, proc) in j.ended:
                j.ended_members += 1  # a process that said it ended before its membership arrived
            j.last_seen = now
            if msg.get("type") in SYMPTOMS and msg.get("status") != "resolved":
                j.last_symptom = now
                if j.unsettled_since is None:
                    j.unsettled_since = now
            self.node_jobs.setdefault(node, set()).add(job)
            return {job}
        key = hardware_key(msg)
        if key is not None:
            held = self.hardware.setdefault(node, {})
            if msg.get("status") == "resolved":
                held.pop(key, None)
            elif msg.get("severity") == "critical":
                if key not in held and len(held) >= 256:
                    return set()  # a node flooding findings: the first 256 are evidence enough
                held[key] = msg
            else:
                return set()
            if not held:
                del self.hardware[node]
            touched = self.node_jobs.get(node, set())
            for job in touched:
                self.jobs[job].last_seen = max(self.jobs[job].last_seen, now)
            return set(touched)
        return set()

    def _forget_one(self) -> None:
        """The table is full: forget a job no incident is open for, reported by the fewest nodes, the
        longest quiet (a node's flood of jobs of its own goes before a job several nodes report)."""
        def cost(k: str) -> tuple[bool, int, float]:
            j = self.jobs[k]
            return (bool(j.published and j.published["status"] == "open"), len(j.node_procs), j.last_seen)
        self._drop(min(self.jobs, key=cost))
        self.dropped_jobs += 1

    def judge(self, jobs: set[str], now: float | None = None) -> list[dict[str, Any]]:
        """Incident records whose verdict changed, for these jobs."""
        now = time.time() if now is None else now
        out = []
        for job in sorted(jobs):
            if (record := self.judge_one(job, now)) is not None:
                out.append(record)
        return out

    def _hardware_of(self, j: _Job) -> dict[str, list[dict[str, Any]]]:
        nodes = j.node_procs
        if len(self.hardware) <= len(nodes):
            return {n: list(held.values()) for n, held in self.hardware.items() if n in nodes}
        return {n: list(held.values()) for n in nodes if (held := self.hardware.get(n))}

    def judge_one(self, job: str, now: float) -> dict[str, Any] | None:
        """The job's new record, when its verdict changed (the service judges one job at a time and
        yields between them, so no round holds the event loop). A judgement reads the job's facts
        (fleet/job_facts.py), not its messages: cheap verdicts first, the ones from symptoms only once
        the symptoms settled."""
        j = self.jobs.get(job)
        if j is None:
            return None
        if j.processes_ended():
            # every process of the job ended: what it said is over, whatever the timers say
            record = None
            if j.published and j.published["status"] == "open":
                record = {**j.published, "status": "resolved", "updated": now,
                          "reason": "the job's processes ended (their nodes said so)"}
            self._drop(job)
            return record
        f = j.facts
        v = fast_verdict(f, self._hardware_of(j))
        # the registry says which verdicts wait for the symptoms to settle (fleet/correlator.py VERDICT_RULES)
        unsettled = waits_to_settle(v, f.symptomatic)
        if unsettled and now - j.last_symptom < self.settle:
            since = j.unsettled_since if j.unsettled_since is not None else j.last_symptom
            if now - since < self.settle_max:
                self.pending[job] = min(j.last_symptom + self.settle, since + self.settle_max)
                return None
        if v is None and f.symptomatic:
            v = slow_verdict(f)
        self.pending.pop(job, None)
        j.unsettled_since = None
        record = None
        was_open = bool(j.published and j.published["status"] == "open")
        if v is not None and is_incident(f, v):
            # when it opened: kept across its versions, so the views can say how long it has been open
            opened = j.published.get("opened", now) if j.published is not None and was_open else now
            record = {"status": "open", **incident(f, v).to_dict(), "opened": opened}
        elif was_open:
            assert j.published is not None
            reason = "no symptom or fault left" if v is None else f"not an incident any more: {v.reason}"
            record = {**j.published, "status": "resolved", "reason": reason}
        if record is not None and _verdict(record) != _verdict(j.published):
            record["updated"] = now
            j.published = record
            return record
        return None

    def due(self, now: float | None = None) -> set[str]:
        """Jobs whose settling time is over."""
        now = time.time() if now is None else now
        return {job for job, t in self.pending.items() if t <= now}

    def next_due(self) -> float | None:
        return min(self.pending.values(), default=None)

    def still_firing(self, job: str) -> list[str]:
        """The hardware evidence of the job's open incident that its nodes have not resolved."""
        j = self.jobs.get(job)
        rec = j.published if j else None
        if not rec or rec.get("status") != "open":
            return []
        out = []
        for c in rec.get("culprits") or ([rec["culprit"]] if rec.get("culprit") else []):
            held = self.hardware.get(c.get("node", ""), {})
            if c.get("kind") in ("gpu", "hca_port") and any(
                    entity == c.get("entity") and m.get("kind") == "condition" for (_t, entity), m in held.items()):
                out.append(f"{c.get('node')} {c.get('entity')}")  # a condition until its node resolves it
        return out

    def sweep(self, now: float | None = None) -> list[dict[str, Any]]:
        """Jobs quiet for resolve_after are forgotten; an open incident resolves only on evidence: it
        stays while its hardware evidence still fires or its processes may be alive and silent (a hung
        job says nothing until its watchdog fires, 600-1,800 s by default), and is given up only after
        ``abandon_after`` s without a word from any of its nodes."""
        now = time.time() if now is None else now
        out = []
        for job, j in list(self.jobs.items()):
            quiet = now - j.last_seen
            if quiet < self.resolve_after:
                continue
            if j.published and j.published["status"] == "open":
                if self.still_firing(job) or quiet < self.abandon_after:
                    continue
                out.append({**j.published, "status": "resolved", "updated": now,
                            "reason": f"no word from the job's nodes for {self.abandon_after / 3600:g} h "
                                      f"and no fault of it still firing"})
            self._drop(job)
        return out


def _verdict(record: dict[str, Any] | None) -> Any:
    if record is None:
        return None
    return (record["status"], json.dumps(record.get("culprit"), sort_keys=True), tuple(record.get("victims", ())),
            record.get("evidence_total"), record.get("actionable"), record.get("contested"),
            round(float(record.get("confidence") or 0), 2))


def same_version(stored: bytes, record: dict[str, Any]) -> bool:
    """Whether the KV's record is this version of the incident: the same standing, culprit and victims,
    with at least this much evidence (a replica that rebuilt the state from the streams counts the
    same or fewer messages; it never adds a second record of the same verdict)."""
    try:
        old = json.loads(stored)
        if not isinstance(old, dict):
            return False
        if _verdict(old) == _verdict(record):
            return True
        return bool(_identity(old) == _identity(record)
                    and int(old.get("evidence_total") or 0) >= int(record.get("evidence_total") or 0))
    except (ValueError, TypeError, KeyError):
        return False


def _identity(r: dict[str, Any]) -> Any:
    return (r.get("status"), json.dumps(r.get("culprit"), sort_keys=True), tuple(r.get("victims") or ()),
            r.get("actionable"), r.get("contested"))
