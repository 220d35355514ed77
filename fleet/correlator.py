"""From many nodes' symptoms to the one that stalled the ring: jobs, culprits, victims.

Ring AllReduce is synchronous: when one rank stalls, every rank of the job times out and every
node reports its own timeout. The correlator groups what the nodes said by job and names the
culprit among the resources the job *used* — its ranks, the GPUs they ran on, the NICs NCCL chose
on each node — so a fault on a GPU or HCA no rank of the job used never becomes its culprit, and
two jobs are never mixed up.

Input: messages as the nodes published them (events and conditions, with the node taken from the
authenticated subject). What it reads:

* ``NCCLJobMember`` (and the process summary every NCCL message carries): job (the world
  communicator's commId), world rank and size, the GPU's PCI address, the NICs NCCL listed
  (``NET/IB : Using ...``), the transport, the bootstrap (OOB) address;
* symptoms: ``NCCLCollectiveTimeout`` (with the rank PyTorch's watchdog names),
  ``NCCLWatchdogProgress`` (PyTorch's last enqueued / last completed work of a process group, also
  from a rank that only heard of another's timeout), ``NCCLRASReport`` (what NCCL's RAS thread said
  when a node asked it: the processes that died, stopped answering or sent no data),
  ``TorchFlightRecord`` (a rank's PyTorch Flight Recorder dump: per process group the collective it
  waits in and the last one it enqueued),
  ``NCCLIBCompletionError`` (with the peer address), ``NCCLSocketFallback``;
* hardware: critical findings on ``gpu:<pci>`` (Xid, fell off the bus, lost, ECC, ...) and on
  ``ib:<hca>/<port>`` (port down, flapping, error counters).

Verdicts, strongest first: a critical hardware finding on a GPU or NIC port the job used (named
as soon as it arrives, before any watchdog fires); a node whose ranks run NCCL over sockets while
the job's others use IB; the rank that did not time out while every other rank did (a hung rank
with no hardware signal); the node every IB completion error points at. Anything that does not
single out one node leaves the culprit empty, with the evidence: never a guess that would cordon a
victim.

Trust (docs/correlator.md, "Who may say what"): every message's reporter is the node of its
authenticated subject. Evidence about a rank, GPU or port counts only from the node that hosts it:
membership binds a rank to the first node that claims it (the job's size is the one most nodes
claim), and a conflicting claim makes the job *contested* (a finding; no verdict from membership
alone is trusted). A verdict resting on one node's word about another is shown at
``ALONE_CONFIDENCE``, below the cordon threshold; it needs a second, independent node or the
subject's own node. Log lines, RAS answers and Flight Recorder dumps are the tenant's: a verdict
they decide alone is never ``actionable`` (only a hardware finding from the node's own collectors
is).

The facts each verdict reads are kept by fleet/job_facts.py as messages arrive (``JobFacts``):
``correlate`` feeds a list of messages through them; the live tracker (fleet/incidents.py) keeps
them per job and judges from them, so a judgement costs the facts it reads, not a re-sort of the
job's messages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.job_facts import (
    TENANT_COLLECTORS,
    JobFacts,
    Member,
    Membership,
    brief,
    is_tenant,
)
from fleet.typed_details import COUNTERS_READ, NCCL_COLLECTOR, SUSPECTS_READ, counters, nccl, with_typed
from gna_sdk import plural
from gna_types import entities
from gna_types.details import RASReport
from gna_types.reasons import RAS_CULPRIT_REASONS

__all__ = ["HANG_SYMPTOMS", "SYMPTOMS", "TENANT_COLLECTORS", "Incident", "JobFacts", "Member", "Membership",
           "correlate", "fast_verdict", "incident", "is_incident", "is_tenant", "members_of", "new_facts",
           "slow_verdict"]

EVIDENCE_MAX = 24  # victims' symptoms sampled per incident (the rest counted by type and node)
DECIDING_MAX = 64  # deciding messages kept per incident, before any sample and whatever its size
COUNT_NODES_MAX = 16  # nodes named in an incident's counts per node (the most symptomatic first)
ALONE_CONFIDENCE = 0.5  # one node's word about another, or a contested job: shown, never cordon-worthy
ACTIONABLE_CONFIDENCE = 0.85  # fleet/cordoner.py CULPRIT_MIN_CONFIDENCE: what a cordon may rest on
MAX_CULPRIT_NODES = 2  # hardware faults on more of the job's nodes than this: fabric-wide, nobody named

# a counter-rate finding is hardware evidence only once its rule fired over a real window (issue 20:
# one symbol error extrapolated from ~10 s is not 396/h); collectors/infiniband.py _evaluate
_COUNTER_TYPES = frozenset({"IBErrorCountersIncreasing"})

Hardware = Mapping[str, Iterable[dict[str, Any]]]  # node -> its critical findings on gpu:/ib: entities


@dataclass
class Incident:
    job: str
    culprit: dict[str, str] | None
    confidence: float
    evidence: list[dict[str, Any]]
    victims: list[str]
    nodes: list[str]
    reason: str
    first_evidence: str | None = None
    last_evidence: str | None = None
    evidence_total: int = 0
    evidence_counts: dict[str, Any] = field(default_factory=dict)  # by_type, by_node, nodes: what was counted
    actionable: bool = False  # a cordon may rest on it: hardware evidence from the culprit's own node
    corroboration: str = ""  # "own node", "independent nodes", "single reporter"
    reporters: list[str] = field(default_factory=list)  # the nodes whose evidence decided it
    contested: bool = False
    findings: list[dict[str, Any]] = field(default_factory=list)
    culprits: list[dict[str, str]] = field(default_factory=list)  # every culprit (hardware on up to 2 nodes)
    job_name: str | None = None  # "team-a/llama-70b (PyTorchJob)", "slurm:1234 (llama)": display; job is the key

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "job_name": self.job_name, "culprit": self.culprit, "culprits": self.culprits or
                ([self.culprit] if self.culprit else []), "confidence": round(self.confidence, 2),
                "actionable": self.actionable, "corroboration": self.corroboration, "reporters": self.reporters,
                "contested": self.contested, "findings": self.findings,
                "reason": self.reason, "evidence": self.evidence, "evidence_total": self.evidence_total,
                "evidence_counts": self.evidence_counts, "victims": self.victims, "nodes": self.nodes,
                "first_evidence": self.first_evidence, "last_evidence": self.last_evidence}


def _order(m: dict[str, Any]) -> tuple[int, str]:
    """Arrival order where the tracker numbered it (a reporter chooses its message's ``time``), else time."""
    seq = m.get("_arrival")
    return (seq if isinstance(seq, int) else 0, str(m.get("time") or ""))


def _counter_over_real_window(m: dict[str, Any]) -> bool:
    return any(c.severity == "critical" and (c.rule == "any increase" or c.full_window is True)
               for c in counters(m)[:COUNTERS_READ])


def _is_hardware(m: dict[str, Any]) -> bool:
    entity = str(m.get("entity", ""))
    if m.get("severity") != "critical" or m.get("status") == "resolved":
        return False
    if m.get("type") in _COUNTER_TYPES and not _counter_over_real_window(m):
        return False
    return entity.startswith(("gpu:", "ib:")) and not is_tenant(m)


def hardware_key(m: dict[str, Any]) -> tuple[str, str] | None:
    """Where a node's own hardware finding is held (by type and entity: its later resolution replaces it);
    None for anything else."""
    entity = str(m.get("entity", ""))
    if not entity.startswith(("gpu:", "ib:")) or is_tenant(m) or not isinstance(m.get("node"), str):
        return None
    return (str(m.get("type")), entity)


def new_facts(job: str, *, members_per_node: int) -> JobFacts:
    """A job's facts, filing as symptoms the types the verdict rules read (``SYMPTOMS``)."""
    return JobFacts(job, symptoms=SYMPTOMS, members_per_node=members_per_node)


def facts_of(messages: list[dict[str, Any]], *, ordered: bool = False
             ) -> tuple[dict[str, JobFacts], dict[str, dict[tuple[str, str], dict[str, Any]]]]:
    """Every job's facts and every node's hardware findings from a list of messages (in arrival order
    where the tracker numbered them, else by time)."""
    jobs: dict[str, JobFacts] = {}
    hardware: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for i, m in enumerate(messages if ordered else sorted(messages, key=_order)):
        if m.get("collector") == NCCL_COLLECTOR:
            d = nccl(m)  # the wire's typed details, else decoded here once (fleet/typed_details.py)
            if d.job:
                f = jobs.get(d.job)
                if f is None:
                    f = jobs[d.job] = new_facts(d.job, members_per_node=1 << 30)
                f.add(m, i, d)
        elif (key := hardware_key(m)) is not None:
            m = with_typed(m)  # a finding's counters decoded once, not per judgement; the caller's dict unchanged
            held = hardware.setdefault(m["node"], {})
            if m.get("status") == "resolved":
                held.pop(key, None)
            elif m.get("severity") == "critical":
                held[key] = m
    return jobs, hardware


def members_of(messages: list[dict[str, Any]], *, ordered: bool = False) -> dict[str, Membership]:
    """job -> its Membership, from every NCCL message's process summary (each node's word about its
    own processes: the member's node is the message's, i.e. its authenticated subject's)."""
    return {job: f.ms for job, f in facts_of(messages, ordered=ordered)[0].items()}


def correlate(messages: list[dict[str, Any]]) -> list[Incident]:
    """Incidents for every job with a symptom, or with a hardware fault on a resource it used."""
    jobs, hardware = facts_of(messages)
    held = {node: list(by.values()) for node, by in hardware.items()}
    out = []
    for job in sorted(jobs):
        f = jobs[job]
        v = fast_verdict(f, held)
        if v is None and f.symptomatic:
            v = slow_verdict(f)
        if v is not None and is_incident(f, v):
            out.append(incident(f, v))
    return out


@dataclass
class _Verdict:
    """Who a verdict names, on whose word, and so what it may decide."""

    culprit: dict[str, str] | None
    confidence: float
    deciding: list[dict[str, Any]]  # the messages (or briefs) that decide it: always shown
    kinds: tuple[str, ...]  # the symptom types shown beside them (a sample of each, counted)
    reason: str
    reporters: set[str] = field(default_factory=set)
    tenant: bool = True  # decided by evidence the tenant controls
    membership_only: bool = False  # rests on who the job's members are (a contested job weakens it)
    culprits: list[dict[str, str]] = field(default_factory=list)
    rule: str = ""  # the VerdictRule that reached it


def _standing(v: _Verdict, contested: bool) -> tuple[float, bool, str]:
    """(confidence, actionable, corroboration) of a verdict by who reported its deciding evidence."""
    if v.culprit is None:
        return v.confidence, False, ""
    nodes = {c["node"] for c in v.culprits} or {v.culprit["node"]}
    if nodes & v.reporters:
        how = "own node"
    elif len(v.reporters - nodes) >= 2:
        how = "independent nodes"
    else:
        how = "single reporter"
    confidence = v.confidence
    if how == "single reporter" or (contested and v.membership_only):
        confidence = min(confidence, ALONE_CONFIDENCE)
    return confidence, not v.tenant and how == "own node" and confidence >= ACTIONABLE_CONFIDENCE, how


def is_incident(f: JobFacts, v: _Verdict) -> bool:
    """Whether a verdict is an incident to open: it names a culprit, rests on deciding evidence (hardware
    faults on too many nodes to name one), or the job is hung or failing. A job that only fell back to
    sockets, everywhere, is each node's own finding (NCCLSocketFallback on its page), not an incident
    listed beside the hung ones (issue 22)."""
    return v.culprit is not None or bool(v.deciding) or any(f.counts.get(k) for k in HANG_SYMPTOMS)


def incident(f: JobFacts, v: _Verdict) -> Incident:
    """The incident record of a verdict: its standing; its evidence, the deciding messages first and
    always (marked ``decisive``, at most DECIDING_MAX), then a sample of each symptom type shown beside
    them (at most EVIDENCE_MAX), with what was counted per type and per node; victims and findings."""
    ms = f.ms
    nodes = sorted(ms.by_node)
    confidence, actionable, how = _standing(v, ms.contested)
    reason = v.reason
    if v.culprit is not None and how == "single reporter":
        reason += f" (only {', '.join(sorted(v.reporters)[:8]) or 'nobody'} says so: shown, not acted on)"
    elif v.culprit is not None and ms.contested and v.membership_only:
        reason += " (the job's membership is contested: shown, not acted on)"
    seen: set[tuple[str, ...]] = set()
    deciding: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    for i, items in enumerate([v.deciding, *(f.samples.get(k, ()) for k in v.kinds)]):
        for m in items:
            key = tuple(str(m.get(k))[:300] for k in ("node", "type", "entity", "time"))  # hostile: unhashable
            if key not in seen:
                seen.add(key)
                (deciding if i == 0 else shown).append(m)
    deciding.sort(key=lambda m: str(m.get("time") or ""))
    shown.sort(key=lambda m: str(m.get("time") or ""))
    deciding, shown = deciding[:DECIDING_MAX], shown[:EVIDENCE_MAX]
    # raw messages (findings, RAS) as briefs; a brief is a copy, so marking it touches no kept sample
    evidence = [{**(brief(m) if "collector" in m else m), "decisive": True} for m in deciding]
    evidence += [brief(m) if "collector" in m else m for m in shown]
    total = len(deciding) + sum(f.counts.get(k, 0) for k in v.kinds)
    total -= sum(1 for m in deciding if m.get("type") in v.kinds)  # a deciding message is also counted by type
    times = [str(m.get("time")) for m in deciding + shown if m.get("time") is not None]
    blamed = {c["node"] for c in v.culprits} or ({v.culprit["node"]} if v.culprit else set())
    by_node = sorted(f.node_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    counts = {"by_type": {k: f.counts[k] for k in v.kinds if f.counts.get(k)},
              "by_node": dict(by_node[:COUNT_NODES_MAX]), "nodes": len(by_node)}
    inc = Incident(job=f.job, culprit=v.culprit, confidence=confidence, evidence=evidence,
                   victims=[n for n in nodes if n not in blamed], nodes=nodes, reason=reason,
                   first_evidence=min(times, default=None), last_evidence=max(times, default=None),
                   evidence_total=max(total, len(evidence)), evidence_counts=counts)
    inc.actionable, inc.corroboration = actionable, how
    inc.reporters = sorted(v.reporters)[:64]
    inc.contested, inc.findings = ms.contested, ms.findings
    inc.culprits = v.culprits or ([v.culprit] if v.culprit else [])
    inc.job_name = f.name()
    return inc


def _hardware(f: JobFacts, hardware: Hardware) -> _Verdict | None:
    """A critical finding on a GPU or NIC port one of the job's ranks used (the node's word about its own)."""
    ms = f.ms
    used: list[tuple[dict[str, Any], Member, str]] = []
    nodes = ([n for n in hardware if n in ms.by_node] if len(hardware) <= len(ms.by_node)
             else [n for n in ms.by_node if n in hardware])
    for node in nodes + [n for n in f.async_ports if n not in hardware]:
        findings = [h for h in hardware.get(node, ()) if _is_hardware(h)] + list(f.async_ports.get(node, {}).values())
        for fi in findings:
            entity = str(fi.get("entity"))
            for mem in ms.by_node.get(node, ()):
                if mem.pci and entity == entities.gpu(mem.pci):
                    used.append((fi, mem, "gpu"))
                elif entity.startswith("ib:") and (entity[3:] in mem.hcas or (
                        entity.count("/") == 0 and any(h.startswith(entity[3:] + "/") for h in mem.hcas))):
                    used.append((fi, mem, "hca_port"))
    return _hardware_verdict(f, used) if used else None


def _socket_node(f: JobFacts, _hardware: Hardware) -> _Verdict | None:
    """One node on sockets while the job's other nodes use IB (each node's word about its own ranks)."""
    ms = f.ms
    socket_nodes = sorted(ms.socket_only)
    if socket_nodes and ms.non_socket and len(socket_nodes) <= len(ms.non_socket):  # the fabric is IB
        if len(socket_nodes) == 1:
            node = socket_nodes[0]
            own = [s for s in f.samples.get("NCCLSocketFallback", ()) if s.get("node") == node]
            return _Verdict({"node": node, "entity": "nccl:transport", "kind": "transport"}, 0.9, own, SYMPTOMS,
                            "NCCL on this node uses sockets while the job's other nodes use IB",
                            reporters={m.reporter for m in ms.by_node.get(node, ())})
        return _Verdict(None, 0.0, [], SYMPTOMS, f"NCCL over sockets on {len(socket_nodes)} nodes")
    return None


def _hung_rank(f: JobFacts, _hardware: Hardware) -> _Verdict | None:
    """Every other rank of the job timed out, this one said nothing (all ranks must be known)."""
    ms = f.ms
    if not f.counts.get("NCCLCollectiveTimeout"):
        return None
    size = ms.size
    if size and len(ms.ranks) == size:
        timed_out = f.timed_out_ranks  # bound ranks only
        if 0 < size - len(timed_out) <= max(1, size // 8):
            silent = sorted(ms.ranks.keys() - timed_out)
            silent_nodes = {ms.ranks[r].node for r in silent}
            if len(silent_nodes) == 1:
                mem = ms.ranks[silent[0]]
                entity = entities.ranks(silent)
                reporters = {ms.ranks[r].reporter for r in timed_out}
                return _Verdict({"node": mem.node, "entity": entity, "kind": "rank", "rank": str(silent[0])},
                                0.85, [], ("NCCLCollectiveTimeout",),
                                f"{len(timed_out)} of {size} ranks timed out; "
                                f"{'rank' if len(silent) == 1 else 'ranks'} {silent} on {mem.node} did not: "
                                "stuck before the collective", reporters=reporters,
                                membership_only=True)
    elif size and len(ms.ranks) < size:
        return _Verdict(None, 0.0, [], SYMPTOMS,
                        f"only {len(ms.ranks)} of {size} ranks are known (a node's agent is missing): no verdict")
    return None


@dataclass(frozen=True)
class VerdictRule:
    """One verdict the correlator can reach: what it reads, whose word it rests on, whether it waits for
    the job's symptoms to settle, and its priority (the first rule, in that order, that says anything
    decides). docs/correlator.md's table of verdicts is this registry (a test keeps the two equal)."""

    name: str
    priority: int
    settles: bool  # False: published at once; True: only once the job's symptoms stopped arriving
    reads: tuple[str, ...]  # the message types it is decided by
    rests_on: str  # whose word it takes
    says: str
    judge: Callable[[JobFacts, Hardware], _Verdict | None]
    # of what it reads, the job's symptoms: what a job's ranks say when it is unwell (a job's facts count,
    # sample and keep them as evidence; one arriving keeps the job's verdict waiting to settle) -- not its
    # membership, not the nodes' own hardware findings
    symptoms: tuple[str, ...] = ()
    hung: bool = True  # its symptoms say the job is hung or failing: an incident even when nobody is named


VERDICT_RULES: tuple[VerdictRule, ...] = tuple(sorted((
    VerdictRule("hardware", 1, False, ("GPUFellOffBus", "GPUFatalXid", "IBPortDown", "the nodes' other critical "
                                       "gpu:/ib: findings", "NCCLIBAsyncEvent"),
                "the hardware's own node (a job's log line naming a port only when nothing else does)",
                "a critical finding on a GPU or NIC port one of the job's ranks used; faults on more than "
                f"{MAX_CULPRIT_NODES} of the job's nodes are the fabric's, nobody named", _hardware),
    # a job on sockets everywhere is each node's own finding, not a hung job (issue 22): hung=False
    VerdictRule("socket_node", 2, False, ("NCCLSocketFallback", "NCCLJobMember"), "each node about its own ranks",
                "one node's NCCL on sockets while the job's other nodes use IB", _socket_node,
                symptoms=("NCCLSocketFallback",), hung=False),
    VerdictRule("crashed_rank", 3, True, ("TorchRankFailed", "NCCLBackendError"),
                "torchrun's failure report and PyTorch's NCCL error from the rank's own node (relayed: the reading "
                "node's word)", "a rank whose process ended on its own while the job ran (a signal, the OOM "
                "killer, its own error); the ranks that failed after it are victims (a rank whose own lines say a peer "
                "failed under it: its exit code alone is the peer's doing)", lambda f, _h: _crashed(f),
                symptoms=("NCCLBackendError", "TorchRankFailed")),
    VerdictRule("ras", 4, True, ("NCCLRASReport",), "NCCL RAS on the reporting nodes, bound to the processes' "
                "own nodes", "the process RAS says died, stopped answering, sent no data or failed",
                lambda f, _h: _ras(f), symptoms=("NCCLRASReport",)),
    VerdictRule("desync", 5, True, ("NCCLCollectiveTimeout", "NCCLJobMember"),
                "each rank's own watchdog line (its OpType at the SeqNum), ranks from membership",
                "the rank(s) that issued another collective at the same SeqNum of a process group than the others "
                "(a desynchronised rank: the others wait in a collective it never issues)", lambda f, _h: _desync(f),
                symptoms=("NCCLCollectiveTimeout",)),
    VerdictRule("behind_rank", 6, True, ("NCCLWatchdogProgress", "TorchFlightRecord"),
                "PyTorch's own numbers from each rank's node", "a rank that never entered the collective the "
                "others wait in", lambda f, _h: _behind(f), symptoms=("NCCLWatchdogProgress", "TorchFlightRecord")),
    VerdictRule("hung_rank", 7, True, ("NCCLCollectiveTimeout", "NCCLJobMember"),
                "the job's membership and every other rank's timeout (independent nodes)",
                "every other rank of the job timed out, this one said nothing", _hung_rank,
                symptoms=("NCCLCollectiveTimeout",)),
    VerdictRule("link", 8, True, ("NCCLIBCompletionError",), "the ranks whose completions failed",
                "the IB peer every completion error names", lambda f, _h: _link(f),
                symptoms=("NCCLIBCompletionError",)),
    # last: a job whose watchdogs abort their communicators closes sockets too; only when nothing else speaks
    VerdictRule("closed_peer", 9, True, ("NCCLSocketError", "NCCLBackendError"),
                "the ranks whose sockets closed, on other nodes", "the one node whose bootstrap address every "
                "socket the job's ranks saw closed under them names (its ranks went away)",
                lambda f, _h: _closed_peer(f), symptoms=("NCCLSocketError",)),
), key=lambda r: r.priority))
# Derived from the registry, never written by hand: the job's symptoms (what its facts file as evidence, what
# keeps its verdict waiting: fleet/incidents.py) and those that say it is hung or failing (``is_incident``). By
# name: an incident's evidence samples are taken type by type in this order (equal times keep it), so it does not
# move when a rule is added or its priority changes
SYMPTOMS: tuple[str, ...] = tuple(sorted({t for r in VERDICT_RULES for t in r.symptoms}))
HANG_SYMPTOMS: tuple[str, ...] = tuple(sorted({t for r in VERDICT_RULES if r.hung for t in r.symptoms}))


def fast_verdict(f: JobFacts, hardware: Hardware) -> _Verdict | None:
    """The verdicts published at once (VERDICT_RULES that do not settle), by priority."""
    for rule in VERDICT_RULES:
        if not rule.settles and (v := rule.judge(f, hardware)) is not None:
            v.rule = rule.name
            return v
    return None


def slow_verdict(f: JobFacts, hardware: Hardware | None = None) -> _Verdict:
    """The verdicts from symptoms, once they settled (VERDICT_RULES that settle), by priority; else no
    culprit."""
    for rule in VERDICT_RULES:
        if rule.settles and (v := rule.judge(f, hardware or {})) is not None:
            v.rule = rule.name
            return v
    return _Verdict(None, 0.0, [], SYMPTOMS, "symptoms, but no resource of the job stands out")


RULES_BY_NAME = {r.name: r for r in VERDICT_RULES}
# what a crash verdict shows beside its deciding messages
CRASH_KINDS: tuple[str, ...] = ("TorchRankFailed", "NCCLBackendError", "NCCLSocketError", "NCCLCollectiveTimeout")


def verdict_rules_table() -> str:
    """docs/correlator.md's table of the registry (tests/test_verdict_rules.py keeps the two equal)."""
    rows = ["| priority | rule | when | reads | rests on | publishes |", "| --- | --- | --- | --- | --- | --- |"]
    for r in VERDICT_RULES:
        reads = ", ".join(f"`{t}`" if t[:1].isupper() else t for t in r.reads)
        when = "once the symptoms settled" if r.settles else "at once"
        rows.append(f"| {r.priority} | `{r.name}` | {r.says} | {reads} | {r.rests_on} | {when} |")
    return "\n".join(rows)


def waits_to_settle(v: _Verdict | None, symptomatic: bool) -> bool:
    """Whether a job's verdict waits for its symptoms to settle before it is published: no verdict yet on
    a job with symptoms (a slow rule may still reach one), a verdict that names nobody (more evidence may
    name someone), or one from a rule that settles (other ranks' timeouts may follow; a hardware finding
    on the events stream may trail the evidence on the jobs stream)."""
    if v is None:
        return symptomatic
    return v.culprit is None or (v.rule in RULES_BY_NAME and RULES_BY_NAME[v.rule].settles)


def _hardware_verdict(f: JobFacts, used: list[tuple[dict[str, Any], Member, str]]) -> _Verdict:
    """The node's own hardware collectors first (a tenant's log line naming a port only when nothing
    else does); NCCL lists every NIC a rank may use, so the rank whose channels use the port comes
    first; faults on more than MAX_CULPRIT_NODES of the job's nodes are the fabric's, not a node's."""
    ms = f.ms
    used.sort(key=lambda t: (is_tenant(t[0]), t[2] == "hca_port" and str(t[0].get("entity"))[3:] not in t[1].nics,
                             _order(t[0]), t[1].claim))
    own = [t for t in used if not is_tenant(t[0])] or used
    tenant = is_tenant(own[0][0])
    firsts: dict[str, tuple[dict[str, Any], Member, str]] = {}
    for t in own:
        firsts.setdefault(t[1].node, t)
    deciding = list({id(fi): fi for fi, _m, _k in used}.values())
    if len(firsts) > MAX_CULPRIT_NODES:
        return _Verdict(None, 0.0, deciding, SYMPTOMS, f"hardware faults on resources of the job on {len(firsts)} "
                                                       f"nodes: {', '.join(sorted(firsts)[:16])}", tenant=tenant)
    culprits = []
    for fi, mem, kind in firsts.values():
        c = {"node": mem.node, "entity": str(fi.get("entity")), "kind": kind}
        rank = ms.rank_of(mem)
        if rank is not None:
            c["rank"] = str(rank)
        culprits.append(c)
    fi, mem, kind = own[0]
    # error counters rising (over a real window) on a job that is not hit yet: a port to watch, not yet
    # a reason to take the node out (a state finding -- down, fell off the bus -- is)
    early_counters = not f.symptomatic and all(t[0].get("type") in _COUNTER_TYPES for t in own)
    confidence = (0.97 if f.symptomatic else 0.8 if early_counters else 0.9) if not tenant else 0.8
    what = "GPU" if kind == "gpu" else "NIC port"
    reason = f"{fi.get('type')} on a {what} rank {ms.rank_of(mem)} used"
    if len(culprits) > 1:
        reason += f"; also on {', '.join(c['node'] for c in culprits[1:])}"
    if tenant:
        reason += " (from the job's own log: no hardware collector of the node confirms it)"
    elif early_counters:
        reason += " (error counters only, the job not hit yet: shown, not acted on)"
    # a log line's reporter is the node that published it (a relayed line: the node that read it); a
    # hardware finding's is its own node
    reporters = {str(fi.get("node")) if is_tenant(fi) else mem.node for fi, mem, _k in firsts.values()}
    return _Verdict(culprits[0], confidence, deciding, SYMPTOMS, reason, reporters=reporters, tenant=tenant,
                    culprits=culprits)


def _crashed(f: JobFacts) -> _Verdict | None:
    """A rank whose process ended on its own while the job ran: torchrun's failure report (killed by a signal,
    by the OOM killer, or exited on an error of its own) or an NCCL error of its own (a CUDA error), filed by
    the process's own node (or relayed by a node that read it in a job-wide file: one reporter's word). The
    ranks that failed because of it (an NCCL remote error, "remote process exited") are victims. Named when
    they are on one node and few (at most size/8); the rank comes from membership, never the report."""
    ms = f.ms
    if not f.failures:
        return None
    on: dict[str, list[tuple[Member, dict[str, Any], str, str]]] = defaultdict(list)
    for key, (b, why, reporter) in f.own_failures():
        mem = ms.member_of(*key)
        if mem is not None:
            on[mem.node].append((mem, b, why, reporter))
    if len(on) != 1 or not ms.size:
        return None  # ranks on several nodes failed on their own: nobody singled out
    if on:
        node, items = next(iter(on.items()))
        if len(items) > max(1, ms.size // 8):
            return None
        ranks = sorted({r for mem, *_ in items if (r := ms.rank_of(mem)) is not None})
        entity = entities.ranks(ranks) if ranks else entities.process(items[0][0].process)
        culprit = {"node": node, "entity": entity, "kind": "rank"}
        if ranks:
            culprit["rank"] = str(ranks[0])
        whys = sorted({why for _m, _b, why, _r in items})
        who = f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks or '?'} on {node}"
        return _Verdict(culprit, 0.9, [b for _m, b, _w, _r in items], CRASH_KINDS,
                        f"{who} ended on its own ({', '.join(whys)}) while the job ran; the others failed after",
                        reporters={r for *_x, r in items}, membership_only=True)
    return None


def _closed_peer(f: JobFacts) -> _Verdict | None:
    """The peers' closed sockets ("Connection closed by remote peer <addr>", an NCCL remote error's last error):
    the one node whose bootstrap address every one of them names, said by another node."""
    ms = f.ms
    claims = ms.oob_claims
    named: set[str] = set()
    reporters: set[str] = set()
    for peer, seen in f.closed_by.items():
        addr = peer.split("<")[0]
        # "Connection closed by remote peer" prints the peer reverse-resolved (NCCL src/misc/socket.cc,
        # ncclSocketToString(..., numericHostForm=0), v2.26.2-1): a name where it resolves, else the address
        owners = claims.get(addr)
        if owners is None and (by_name := ms.node_named(addr)) is not None:
            owners = {by_name}
        if owners is None or len(owners) != 1:
            continue  # an address no member, or two, claims: names nobody
        named |= owners
        reporters |= seen
    if len(named) != 1:
        return None
    node = next(iter(named))
    if not reporters - {node}:
        return None
    return _Verdict({"node": node, "entity": "node", "kind": "peer_gone"}, 0.75,
                    list(f.samples.get("NCCLSocketError", ())), CRASH_KINDS,
                    "every socket the job's ranks saw closed under them leads to this node: its ranks went away",
                    reporters=reporters - {node})


def _ras(f: JobFacts) -> _Verdict | None:
    """RAS names processes (host address and pid, or the rank of a communicator): the ones that died,
    stopped answering, sent no data or failed on their own (not "remote" errors: those are victims).
    Mapped to the job's members by the world communicator's rank, else by pid and address; named
    when they are few (at most size/8) and on one node. A suspect that maps to nobody is ignored; a
    node whose RAS names another node's processes is one reporter: corroborated by a second node's
    RAS, or by the suspect's own node, it names the rank; alone it is shown."""
    if not f.ras:
        return None
    ms = f.ms
    try:
        job_hash = int(f.job, 16)
    except ValueError:
        job_hash = None
    by_pid: dict[int, list[Member]] = defaultdict(list)
    for m in ms.members.values():
        tail = m.process.rsplit(":", 1)[-1]
        if tail.isdigit():
            by_pid[int(tail)].append(m)
    # culprit node -> its suspects and who named them
    named: dict[str, dict[tuple[str, str], Member]] = defaultdict(dict)
    reporters: dict[str, set[str]] = defaultdict(set)
    evidence: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for reports in f.ras.values():
        for s in reports:
            report = nccl(s)
            for sus in report.suspects[:SUSPECTS_READ] if isinstance(report, RASReport) else []:
                if sus.reason not in RAS_CULPRIT_REASONS:
                    continue
                found: Member | None = None
                rank, comm = sus.rank, sus.comm_hash
                try:
                    same_comm = job_hash is not None and comm is not None and len(comm) <= 32 \
                        and int(comm, 16) == job_hash
                except ValueError:
                    same_comm = False
                if rank is not None and same_comm:
                    found = ms.ranks.get(rank)
                pid, host = sus.pid, sus.host
                if found is None and pid is not None:
                    cands = [m for m in by_pid.get(pid, []) if host in (m.oob_ip, m.node, m.process.rsplit(":", 1)[0])]
                    found = cands[0] if len(cands) == 1 else None
                if found is None:
                    continue  # a suspect we cannot place names nobody
                named[found.node][(found.node, found.process)] = found
                reporters[found.node].add(str(s.get("node")))
                if not evidence[found.node] or evidence[found.node][-1] is not s:
                    evidence[found.node].append(s)
    if not named or not ms.size:
        return None
    backed = [n for n in named if n in reporters[n] or len(reporters[n] - {n}) >= 2]
    pick = backed if backed else list(named)
    if len(pick) != 1:
        return None  # RAS points at several nodes: no RAS verdict
    node = pick[0]
    culprits = named[node]
    if len(culprits) > max(1, ms.size // 8):
        return None
    ranked = sorted(culprits.values(), key=lambda m: (ms.rank_of(m) is None, ms.rank_of(m) or 0))
    first = ranked[0]
    ranks = [r for m in ranked if (r := ms.rank_of(m)) is not None]
    entity = entities.ranks(ranks) if ranks else entities.process(first.process)
    culprit = {"node": first.node, "entity": entity, "kind": "rank"}
    if ranks:
        culprit["rank"] = str(ranks[0])
    return _Verdict(culprit, 0.9, evidence[node], ("NCCLCollectiveTimeout",),
                    f"NCCL's RAS names {plural(len(culprits), 'process', 'processes')} on {first.node} that died, "
                    "stopped "
                    f"answering, sent no data or failed", reporters=reporters[node])


def _desync(f: JobFacts) -> _Verdict | None:
    """Ranks whose watchdog timed out in another collective than the others at the same SeqNum of one process
    group (PyTorch numbers each group's collectives; "OpType=BROADCAST" where every other rank says ALLREDUCE):
    the others wait in a collective these never issue. Named when they are few (at most size/8) and on one node,
    the others a majority of the group's timeouts; ranks from membership, the op from each rank's own line."""
    ms = f.ms
    if not ms.size or not f.ops:
        return None
    for pg in sorted(f.ops, key=lambda g: (g != "0", g)):
        for seq, by_op in sorted(f.ops[pg].items()):
            if len(by_op) < 2:
                continue
            ranks = {op: {r for key, _b in held if (r := ms.rank_of_entity(*key)) is not None}
                     for op, held in by_op.items()}
            total = sum(len(rs) for rs in ranks.values())
            major = max(ranks, key=lambda op: (len(ranks[op]), op))
            odd = sorted({r for op, rs in ranks.items() if op != major for r in rs})
            if not odd or len(odd) > max(1, ms.size // 8) or len(ranks[major]) * 2 <= total:
                continue
            nodes = {ms.ranks[r].node for r in odd}
            if len(nodes) != 1:
                continue
            mem = ms.ranks[odd[0]]
            ops = sorted(op for op in ranks if op != major and ranks[op])
            wanted = set(odd)
            deciding = [b for op in ops for key, b in by_op[op] if ms.rank_of_entity(*key) in wanted]
            return _Verdict({"node": mem.node, "entity": entities.ranks(odd), "kind": "rank", "rank": str(odd[0])},
                            0.9, deciding, ("NCCLCollectiveTimeout",),
                            f"desync: {'rank' if len(odd) == 1 else 'ranks'} {odd} issued {', '.join(ops)} as SeqNum "
                            f"{seq} of process group {pg} while {len(ranks[major])} other ranks issued {major}",
                            reporters={ms.ranks[r].reporter for r in odd}, membership_only=True)
    return None


def _behind(f: JobFacts) -> _Verdict | None:
    """The rank(s) that never joined the collective the job waits in: PyTorch's watchdog says where
    each rank's process group failed (SeqNum, "at work") and how far it had enqueued; the collective
    most ranks fail at is the one the job waits in, and a rank that failed earlier, or whose last
    enqueued work is below it (it heard of the timeout but had nothing in flight), never entered it.
    Sequence numbers are per process group: only one group's numbers are compared. Each rank's
    numbers come from its own process (its node's word about itself)."""
    ms = f.ms
    size = ms.size
    at, enq = f.rank_values["at"], f.rank_values["enq"]
    groups = [g for g, ranks in at.items() if ranks]
    if not size or not groups:
        return None
    pg = "0" if "0" in groups else max(groups, key=lambda g: len(at[g]))
    by_value = f.ranks_at["at"][pg]
    waited = max(by_value, key=lambda q: (len(by_value[q]), q))  # the collective most ranks wait in
    below: set[int] = set()
    for kind in ("at", "enq"):
        for q, ranks in f.ranks_at[kind].get(pg, {}).items():
            if q < waited:
                below |= ranks
                if len(below) > max(1, size // 8):
                    return None  # too many: not one rank the others wait for
    behind = sorted(below)
    if not behind or len(at[pg].keys() | enq.get(pg, {}).keys()) * 2 < size:
        return None
    self_reported = f.self_reported_ranks
    rank_of = ms.rank_of_entity
    behind_nodes = {ms.ranks[r].node for r in behind}
    if len(behind_nodes) != 1:
        return None
    mem = ms.ranks[behind[0]]
    entity = entities.ranks(behind)
    own = [r for r in behind if r in self_reported]
    how = (f"{'rank' if len(own) == 1 else 'ranks'} {own} said {'its' if len(own) == 1 else 'their'} last "
           "enqueued work is below it" if own
           else f"{'rank' if len(behind) == 1 else 'ranks'} {behind} failed at an earlier one")
    wanted = set(behind)
    deciding = [b for kind in ("at", "enq") for v, held in sorted(f.low[kind].get(pg, {}).items()) if v < waited
                for key, b in held if rank_of(*key) in wanted]
    # the behind ranks' own numbers decide (their node is a reporter); the others' establish the collective
    return _Verdict({"node": mem.node, "entity": entity, "kind": "rank", "rank": str(behind[0])},
                    0.9 if own else 0.85, deciding, ("NCCLCollectiveTimeout",),
                    f"{len(at[pg])} of {size} ranks failed in collective {waited} of process group {pg}; "
                    f"{how}: {'it' if len(behind) == 1 else 'they'} never joined it", reporters={mem.reporter},
                    membership_only=True)


def _link(f: JobFacts) -> _Verdict | None:
    """Every IB completion error names one peer's bootstrap address (an address two nodes claim
    names nobody); the peer is named by the nodes that saw the errors, so it takes two of them."""
    if not f.peers or f.peers_overflow:
        return None
    if len({n for nodes in f.peers.values() for n in nodes}) < 2:
        return None  # one node's errors: the fault may be at its own end (its port down, its peer healthy)
    claims = f.ms.oob_claims
    peers = {next(iter(claims[ip])) if len(claims.get(ip, ())) == 1 else None for ip in f.peers}
    if len(peers) != 1 or None in peers:
        return None
    peer_node = next(iter(peers))
    assert peer_node is not None
    return _Verdict({"node": peer_node, "entity": "node", "kind": "link"}, 0.7,
                    list(f.samples.get("NCCLIBCompletionError", ())), SYMPTOMS,
                    "every IB completion error names this node as the peer",
                    reporters={n for nodes in f.peers.values() for n in nodes})
