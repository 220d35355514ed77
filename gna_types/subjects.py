"""NATS subject layout and node-name encoding (see docs/subjects.md).

A node name becomes one token valid both in a subject and as a JetStream KV key
(``[-_=A-Za-z0-9]``): ``.`` maps to ``=`` (hostnames are full of dots), every other byte
outside ``[A-Za-z0-9-]`` to ``_XX`` (hex). The mapping is reversible; the real name is
always in the payload too.
"""

from __future__ import annotations

import functools
import re

from gna_types import details

_SAFE = re.compile(r"[A-Za-z0-9-]")
_SAFE_NAME = re.compile(r"[A-Za-z0-9-]+")  # a name that is its own token (most node and job names)
_TOKEN = re.compile(r"^[-_=A-Za-z0-9]+$")

EVENTS_PREFIX = "gna.events"
ACTIONS_PREFIX = "gna.actions"
HEARTBEAT_PREFIX = "gna.heartbeat"
INCIDENTS_PREFIX = "gna.incidents"  # fleet.incidents: the correlator's records, gna.incidents.<job token>
JOBS_PREFIX = "gna.jobs"  # gna.jobs.<job token>.<node token>.member|evidence (docs/subjects.md)
# Messages that are facts about a job, not about the node: published only under the job's subjects
# (NCCLProcessEnded: one of the job's processes on the node ended: an incident resolves on evidence)
JOB_FACT_TYPES = frozenset({"NCCLJobMember", "NCCLProcessEnded"})
# a job id's longest accepted form (gna_types/details.py, where the fleet's bound comes from too): NCCL's
# commId (0x + 16 hex digits) or an operator's namespace/name (Kubernetes: 253 + 63). Every job id the
# fleet accepts has its job subjects, so a replica reading only its partitions' jobs
# (fleet/incident_service.py) misses none.
JOB_MAX = details.JOB_MAX
JOB_KINDS = ("member", "evidence")
# Partitions split reading at the server (issue 21): the jobs stream stores every job subject with a
# bucket token in front of the job, ``gna.jobs.<bucket>.<job>.<node>.<kind>``, computed by nats-server
# itself from the job token (a stream subject transform, ``JOBS_TRANSFORM``; publishers keep publishing
# ``gna.jobs.<job>.<node>.<kind>``). A correlator replica's consumer then asks only for its partitions'
# buckets (filter subjects), and receives nothing of the others' jobs. The bucket is
# nats-server's ``{{partition(n, 1)}}`` (server/subject_transform.go, getHashPartition: FNV-1a 32 of the
# wildcard token, modulo n), computed the same here by ``job_bucket`` (tests/test_job_buckets.py holds
# both to agreement on a real server). 120 buckets split evenly over 1-6, 8, 10, 12, 15, 20... replicas.
JOB_BUCKETS = 120
JOBS_TRANSFORM = (f"{JOBS_PREFIX}.*.*.*",
                  f"{JOBS_PREFIX}.{{{{partition({JOB_BUCKETS},1)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"
                  ".{{wildcard(3)}}")
SIGNALS_PREFIX = "gna.signals"  # gna.signals.<node token>.<collector>: straggler vectors (docs/subjects.md)
SIGNAL_TYPES = frozenset({"StragglerSignals", "NCCLInspectorSummary"})
# gna.validate.<node token>: the central cordoner asks a node to validate itself (core NATS, no payload the node
# acts on; the node runs its own level when its GPUs are free and publishes NodeValidation on its events subject)
VALIDATE_PREFIX = "gna.validate"
STRAGGLERS_PREFIX = "gna.stragglers"  # fleet/stragglers.py: gna.stragglers.<node token>, the correlator's records

# The streams, KV buckets and durable consumers the halves share, by their default names (each is a setting:
# [nats] stream/jobs_stream/signals_stream/kv_bucket, [remediations.budget] bucket, the NATS layout's [names]).
EVENTS_STREAM = "GNA_EVENTS"  # gna.events.> and gna.actions.>
JOBS_STREAM = "GNA_JOBS"  # gna.jobs.>: jobs' membership and evidence
SIGNALS_STREAM = "GNA_SIGNALS"  # gna.signals.>: straggler vectors, the latest few per node and collector
NODES_BUCKET = "gna-nodes"  # each node's state document (agent/nodestate.py)
BUDGET_BUCKET = "gna-budget"  # the fleet-wide cordon budget (agent/remediation/budget.py)
INCIDENTS_BUCKET = "gna-incidents"  # the correlator's current incident per job (fleet/incidents.py)
LEASES_BUCKET = "gna-correlator-leases"  # which correlator replica judges which jobs (fleet/leases.py)
STRAGGLERS_BUCKET = "gna-stragglers"  # the current straggler records (fleet/stragglers.py)
CORDONER_DURABLE = "gna-cordoner"  # the central cordoner's durable queue consumer
EXPORT_DURABLE = "gna-export-cloudevents"  # fleet/exporter.py, CloudEvents
OTLP_DURABLE = "gna-export-otlp"  # fleet/exporter.py, OTLP logs


def encode_token(name: str) -> str:
    if not name:
        return "_"  # an empty name still needs a token
    if _SAFE_NAME.fullmatch(name):
        return name  # one scan: the correlator encodes a job and a node per message (issue 21)
    out: list[str] = []
    for ch in name:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        elif ch == ".":
            out.append("=")
        else:
            out.extend(f"_{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_token(token: str) -> str:
    if token == "_":
        return ""
    if "_" not in token and "=" not in token:
        return token  # nothing escaped (most node names): each character stands for itself
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "_":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
            continue
        raw.extend(b"." if ch == "=" else ch.encode())
        i += 1
    return raw.decode("utf-8")


def is_valid_token(token: str) -> bool:
    return bool(_TOKEN.fullmatch(token))


PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def check_plugin_name(name: str) -> str:
    """Collector and remediation names are used verbatim as subject tokens."""
    if not PLUGIN_NAME.fullmatch(name):
        raise ValueError(f"plugin name {name!r} must match {PLUGIN_NAME.pattern}")
    return name


def event_subject(node: str, collector: str, severity: str) -> str:
    return f"{EVENTS_PREFIX}.{encode_token(node)}.{check_plugin_name(collector)}.{severity}"


def job_subject(job: str, node: str, kind: str) -> str:
    if kind not in JOB_KINDS:
        raise ValueError(f"job subject kind {kind!r} is not one of {JOB_KINDS}")
    return f"{JOBS_PREFIX}.{encode_token(job)}.{encode_token(node)}.{kind}"


@functools.lru_cache(maxsize=4096)  # a fleet has hundreds of jobs; every message of one asks again
def job_bucket(job_token: str) -> int:
    """The bucket nats-server stores a job's subjects under (``JOBS_TRANSFORM``): FNV-1a 32 of the job's
    subject token, modulo ``JOB_BUCKETS``."""
    h = 0x811C9DC5
    for b in job_token.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % JOB_BUCKETS


def stored_job_subject(job: str, node: str, kind: str) -> str:
    """The subject the jobs stream stores ``job_subject(job, node, kind)`` under (its bucket in front)."""
    token = encode_token(job)
    return f"{JOBS_PREFIX}.{job_bucket(token)}.{token}.{encode_token(node)}.{kind}"


def job_bucket_filters(buckets: list[int] | range, kind: str = "*") -> list[str]:
    """Filter subjects of a consumer of the jobs stream that reads only these buckets' jobs."""
    if len(buckets) == JOB_BUCKETS:
        return [f"{JOBS_PREFIX}.*.*.*.{kind}"]
    return [f"{JOBS_PREFIX}.{b}.*.*.{kind}" for b in sorted(buckets)]


def signals_subject(node: str, collector: str) -> str:
    return f"{SIGNALS_PREFIX}.{encode_token(node)}.{check_plugin_name(collector)}"


def subjects_for(node: str, collector: str, severity: str, type_: str, details: object) -> list[str]:
    """Where a message is published: a job's membership fact only under the job
    (``gna.jobs.<job>.<node>.member``); a job's symptom (warning or critical, with the job in its
    details) under the node's events and, as evidence, under the job; everything else under the
    node's events. The node token is the publisher's own either way (its NATS permissions)."""
    if type_ in SIGNAL_TYPES:  # periodic measurements: their own bounded stream, never the event history
        return [signals_subject(node, collector)]
    job = details.get("job") if isinstance(details, dict) else None
    if isinstance(job, str) and 0 < len(job) <= JOB_MAX:
        if type_ in JOB_FACT_TYPES:
            return [job_subject(job, node, "member")]
        if severity in ("warning", "critical"):
            return [event_subject(node, collector, severity), job_subject(job, node, "evidence")]
    return [event_subject(node, collector, severity)]


def action_subject(node: str, remediation: str) -> str:
    return f"{ACTIONS_PREFIX}.{encode_token(node)}.{check_plugin_name(remediation)}"


def validate_subject(node: str) -> str:
    return f"{VALIDATE_PREFIX}.{encode_token(node)}"


def heartbeat_subject(node: str) -> str:
    return f"{HEARTBEAT_PREFIX}.{encode_token(node)}"


def events_filter(node: str | None = None, collector: str | None = None, severity: str | None = None) -> str:
    parts = [
        encode_token(node) if node else "*",
        check_plugin_name(collector) if collector else "*",
        severity or "*",
    ]
    return ".".join([EVENTS_PREFIX, *parts])
