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
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EVIDENCE_MAX = 24  # evidence items kept per incident (the rest counted)
ALONE_CONFIDENCE = 0.5  # one node's word about another, or a contested job: shown, never cordon-worthy
ACTIONABLE_CONFIDENCE = 0.85  # fleet/cordoner.py CULPRIT_MIN_CONFIDENCE: what a cordon may rest on
MAX_CULPRIT_NODES = 2  # hardware faults on more of the job's nodes than this: fabric-wide, nobody named
FINDINGS_MAX = 32  # conflicting claims kept per job (the rest counted)

_OOB_IP = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)")
# types whose evidence the tenant controls: its processes' log lines, its RAS port's answers, its dumps
# (collectors/nccl_logs.py publishes every one of them, collector "nccl_logs")
TENANT_COLLECTORS = frozenset({"nccl_logs"})
# a counter-rate finding is hardware evidence only once its rule fired over a real window (issue 20:
# one symbol error extrapolated from ~10 s is not 396/h); collectors/infiniband.py _evaluate
_COUNTER_TYPES = frozenset({"IBErrorCountersIncreasing"})


@dataclass
class Member:
    node: str
    process: str  # host:pid
    job: str
    rank: int | None
    size: int | None
    pci: str | None
    hcas: set[str] = field(default_factory=set)  # "mlx5_0/1": every NIC NCCL listed
    nics: set[str] = field(default_factory=set)  # the ones its channel lines use (empty: not known)
    transport: str | None = None
    oob_ip: str | None = None
    order: int = 0  # when its first claim arrived (the tracker's arrival number, else the time order)


@dataclass
class Membership:
    """A job's members as their own nodes claim them, and the ranks bound to them.

    A rank is bound to the first member that claims it with the job's size (the size claimed by the
    most nodes); another node's claim of a bound rank, or of another size, is a finding and makes
    the job contested. Ranks are only ever taken from here, never from a symptom's payload."""

    members: dict[tuple[str, str], Member] = field(default_factory=dict)
    ranks: dict[int, Member] = field(default_factory=dict)
    size: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    findings_total: int = 0

    @property
    def contested(self) -> bool:
        return self.findings_total > 0

    def rank_of(self, mem: Member | None) -> int | None:
        """The rank bound to this member, or None (no claim, or another member holds it)."""
        if mem is None or mem.rank is None:
            return None
        return mem.rank if self.ranks.get(mem.rank) is mem else None

    def finding(self, **what: Any) -> None:
        self.findings_total += 1
        if len(self.findings) < FINDINGS_MAX:
            self.findings.append(what)


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
    evidence_total: int = 0
    actionable: bool = False  # a cordon may rest on it: hardware evidence from the culprit's own node
    corroboration: str = ""  # "own node", "independent nodes", "single reporter"
    reporters: list[str] = field(default_factory=list)  # the nodes whose evidence decided it
    contested: bool = False
    findings: list[dict[str, Any]] = field(default_factory=list)
    culprits: list[dict[str, str]] = field(default_factory=list)  # every culprit (hardware on up to 2 nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "culprit": self.culprit, "culprits": self.culprits or
                ([self.culprit] if self.culprit else []), "confidence": round(self.confidence, 2),
                "actionable": self.actionable, "corroboration": self.corroboration, "reporters": self.reporters,
                "contested": self.contested, "findings": self.findings,
                "reason": self.reason, "evidence": self.evidence, "evidence_total": self.evidence_total,
                "victims": self.victims, "nodes": self.nodes, "first_evidence": self.first_evidence}


def _details(m: dict[str, Any]) -> dict[str, Any]:
    d = m.get("details")
    return d if isinstance(d, dict) else {}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _oob_ip(oob: Any) -> str | None:
    if not isinstance(oob, str):
        return None
    # "ib0:10.0.0.5<0>" -> 10.0.0.5
    m = _OOB_IP.search(oob.split(":", 1)[1] if ":" in oob and "." in oob else oob)
    return m.group(1) if m else None


def _brief(m: dict[str, Any]) -> dict[str, Any]:
    d = _details(m)
    out = {"node": m.get("node"), "type": m.get("type"), "entity": m.get("entity"), "severity": m.get("severity"),
           "time": m.get("time"), "message": str(m.get("message", ""))[:300]}
    for k in ("rank", "seq_num", "op_type", "peer", "pci"):
        if d.get(k) is not None:
            out[k] = d[k]
    return out


def _order(m: dict[str, Any]) -> tuple[int, str]:
    """Arrival order where the tracker numbered it (a reporter chooses its message's ``time``), else time."""
    seq = m.get("_arrival")
    return (seq if isinstance(seq, int) else 0, str(m.get("time") or ""))


def is_tenant(m: dict[str, Any]) -> bool:
    """Evidence the job's own processes (its user) control: log lines, RAS answers, dumps."""
    return m.get("collector") in TENANT_COLLECTORS


def _counter_over_real_window(m: dict[str, Any]) -> bool:
    counters = _details(m).get("counters")
    return isinstance(counters, list) and any(
        isinstance(c, dict) and c.get("severity") == "critical"
        and (c.get("rule") == "any increase" or c.get("full_window") is True) for c in counters[:32])


def _is_hardware(m: dict[str, Any]) -> bool:
    entity = str(m.get("entity", ""))
    if m.get("severity") != "critical" or m.get("status") == "resolved":
        return False
    if m.get("type") in _COUNTER_TYPES and not _counter_over_real_window(m):
        return False
    return entity.startswith(("gpu:", "ib:")) and not is_tenant(m)


def members_of(messages: list[dict[str, Any]], *, ordered: bool = False) -> dict[str, Membership]:
    """job -> its Membership, from every NCCL message's process summary (each node's word about its
    own processes: the member's node is the message's, i.e. its authenticated subject's)."""
    raw: dict[str, dict[tuple[str, str], Member]] = defaultdict(dict)
    sizes: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)  # every size a member claimed
    for i, m in enumerate(messages if ordered else sorted(messages, key=_order)):
        if m.get("collector") != "nccl_logs":
            continue
        d = _details(m)
        job = d.get("job")
        node = m.get("node")
        if not isinstance(job, str) or not job or not isinstance(node, str):
            continue
        proc = f"{d.get('host')}:{d.get('pid')}"
        mem = raw[job].get((node, proc))
        if mem is None:
            mem = raw[job][(node, proc)] = Member(node, proc, job, _int(d.get("world_rank")),
                                                  _int(d.get("world_size")), None, order=i)
        if mem.rank is None:
            mem.rank = _int(d.get("world_rank"))
        if mem.size is None:
            mem.size = _int(d.get("world_size"))
        if mem.size is not None:
            sizes[job][(node, proc)] = mem.size
        if isinstance(d.get("pci"), str) and mem.pci is None:
            mem.pci = d["pci"]
        if isinstance(d.get("hcas"), list):
            mem.hcas |= {h for h in d["hcas"][:64] if isinstance(h, str)}
        if isinstance(d.get("nics"), list):
            mem.nics |= {h for h in d["nics"][:64] if isinstance(h, str)}
        if isinstance(d.get("transport"), str):
            mem.transport = d["transport"]
        mem.oob_ip = mem.oob_ip or _oob_ip(d.get("oob"))
    return {job: _bind(members) for job, members in raw.items()}


def _bind(members: dict[tuple[str, str], Member]) -> Membership:
    out = Membership(members=members)
    nodes_by_size: dict[int, set[str]] = defaultdict(set)
    first_by_size: dict[int, int] = {}
    for mem in members.values():
        if mem.size is not None:
            nodes_by_size[mem.size].add(mem.node)
            first_by_size[mem.size] = min(first_by_size.get(mem.size, mem.order), mem.order)
    if nodes_by_size:  # the size most nodes claim; among equals the first claimed
        out.size = max(nodes_by_size, key=lambda n: (len(nodes_by_size[n]), -first_by_size[n]))
        for other in sorted(set(nodes_by_size) - {out.size}):
            for node in sorted(nodes_by_size[other]):
                out.finding(kind="size_conflict", node=node, claimed=other, size=out.size)
    for mem in sorted(members.values(), key=lambda m: m.order):
        if mem.rank is None or (mem.size is not None and mem.size != out.size):
            continue
        if not 0 <= mem.rank < max(out.size, 1):
            out.finding(kind="rank_out_of_range", node=mem.node, rank=mem.rank, size=out.size)
            continue
        holder = out.ranks.get(mem.rank)
        if holder is None:
            out.ranks[mem.rank] = mem
        elif holder.node != mem.node:  # one node's processes may restart; another node's claim is a conflict
            out.finding(kind="rank_conflict", node=mem.node, rank=mem.rank, holder=holder.node)
    return out


def correlate(messages: list[dict[str, Any]]) -> list[Incident]:
    """Incidents for every job with a symptom, or with a hardware fault on a resource it used."""
    messages = sorted(messages, key=_order)
    jobs = members_of(messages, ordered=True)
    hardware: dict[str, list[dict[str, Any]]] = defaultdict(list)  # node -> critical findings
    for m in messages:
        if _is_hardware(m) and isinstance(m.get("node"), str):
            hardware[m["node"]].append(m)
        elif (m.get("type") == "NCCLIBAsyncEvent" and m.get("severity") == "critical" and isinstance(m.get("node"), str)
              and isinstance(_details(m).get("hca"), str) and _int(_details(m).get("port")) is not None):
            # NCCL saw the port fail under a rank's feet: the same entity as the port's own condition, but
            # a log line (the tenant's word): it names the port, it does not decide a cordon alone
            d = _details(m)
            hardware[m["node"]].append({**m, "entity": f"ib:{d['hca']}/{d['port']}"})
    symptoms: dict[str, list[dict[str, Any]]] = defaultdict(list)  # job -> its NCCL symptoms
    for m in messages:
        if m.get("collector") == "nccl_logs" and m.get("type") in (
                "NCCLCollectiveTimeout", "NCCLIBCompletionError", "NCCLSocketFallback", "NCCLWatchdogProgress",
                "NCCLRASReport", "TorchFlightRecord") \
                and m.get("status") != "resolved":
            job = _details(m).get("job")
            if isinstance(job, str) and job in jobs:
                symptoms[job].append(m)
    incidents = [inc for job, ms in sorted(jobs.items())
                 if (inc := _judge(job, ms, symptoms.get(job, []), hardware)) is not None]
    return incidents


@dataclass
class _Verdict:
    """Who a verdict names, on whose word, and so what it may decide."""

    culprit: dict[str, str] | None
    confidence: float
    evidence: list[dict[str, Any]]
    reason: str
    reporters: set[str] = field(default_factory=set)
    tenant: bool = True  # decided by evidence the tenant controls
    membership_only: bool = False  # rests on who the job's members are (a contested job weakens it)
    culprits: list[dict[str, str]] = field(default_factory=list)


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


def _judge(job: str, ms: Membership, symptoms: list[dict[str, Any]],
           hardware: dict[str, list[dict[str, Any]]]) -> Incident | None:
    v = _verdict(job, ms, symptoms, hardware)
    if v is None:
        return None
    nodes = sorted({mem.node for mem in ms.members.values()})
    confidence, actionable, how = _standing(v, ms.contested)
    reason = v.reason
    if v.culprit is not None and how == "single reporter":
        reason += f" (only {', '.join(sorted(v.reporters)) or 'nobody'} says so: shown, not acted on)"
    elif v.culprit is not None and ms.contested and v.membership_only:
        reason += " (the job's membership is contested: shown, not acted on)"
    inc = _incident(job, v.culprit, confidence, v.evidence, nodes, reason,
                    culprit_nodes={c["node"] for c in v.culprits})
    inc.actionable, inc.corroboration = actionable, how
    inc.reporters = sorted(v.reporters)[:64]
    inc.contested, inc.findings = ms.contested, list(ms.findings)
    inc.culprits = v.culprits or ([v.culprit] if v.culprit else [])
    return inc


def _verdict(job: str, ms: Membership, symptoms: list[dict[str, Any]],
             hardware: dict[str, list[dict[str, Any]]]) -> _Verdict | None:
    members = ms.members
    # 1. a critical finding on a GPU or NIC port one of the job's ranks used (the node's word about its own)
    used: list[tuple[dict[str, Any], Member, str]] = []
    for mem in members.values():
        for f in hardware.get(mem.node, []):
            entity = str(f.get("entity"))
            if mem.pci and entity == f"gpu:{mem.pci}":
                used.append((f, mem, "gpu"))
            elif entity.startswith("ib:") and (entity[3:] in mem.hcas or
                                               (entity.count("/") == 0 and any(h.startswith(entity[3:] + "/")
                                                                               for h in mem.hcas))):
                used.append((f, mem, "hca_port"))
    if used:
        return _hardware_verdict(ms, used, symptoms)
    # 2. one node on sockets while the job's other nodes use IB (each node's word about its own ranks)
    by_node: dict[str, set[str]] = defaultdict(set)
    for mem in members.values():
        if mem.transport:
            by_node[mem.node].add(mem.transport)
    socket_nodes = sorted(n for n, t in by_node.items() if t == {"Socket"})
    ib_nodes = [n for n, t in by_node.items() if any(x != "Socket" for x in t)]
    if socket_nodes and ib_nodes and len(socket_nodes) <= len(ib_nodes):  # the fabric is IB: sockets are the odd one
        if len(socket_nodes) == 1:
            node = socket_nodes[0]
            return _Verdict({"node": node, "entity": "nccl:transport", "kind": "transport"}, 0.9,
                            [s for s in symptoms if s.get("node") == node] + symptoms,
                            "NCCL on this node uses sockets while the job's other nodes use IB", reporters={node})
        return _Verdict(None, 0.0, symptoms, f"NCCL over sockets on {len(socket_nodes)} nodes")
    if not symptoms:
        return None
    # 3. the process NCCL's RAS says died, stopped answering, sent no data or failed
    if (v := _ras(job, ms, symptoms)) is not None:
        return v
    # 4. a rank that never entered the collective the others wait in, by PyTorch's own numbers
    if (v := _behind(ms, symptoms)) is not None:
        return v
    # 5. a hung rank: every other rank of the job timed out, this one said nothing
    timeouts = [s for s in symptoms if s.get("type") == "NCCLCollectiveTimeout"]
    if timeouts:
        index = _rank_index(ms)
        size = ms.size
        timed_out = {r for s in timeouts if (r := _rank_of(s, index)) is not None}
        silent = sorted(r for r in ms.ranks if r not in timed_out)
        if size and len(ms.ranks) == size and silent:
            silent_nodes = {ms.ranks[r].node for r in silent}
            if len(silent_nodes) == 1 and len(silent) <= max(1, size // 8):
                mem = ms.ranks[silent[0]]
                entity = f"rank:{silent[0]}" if len(silent) == 1 else "ranks:" + ",".join(map(str, silent))
                reporters = {ms.ranks[r].node for r in timed_out}
                return _Verdict({"node": mem.node, "entity": entity, "kind": "rank", "rank": str(silent[0])},
                                0.85, timeouts,
                                f"{len(timed_out)} of {size} ranks timed out; rank(s) {silent} on "
                                f"{mem.node} did not: stuck before the collective", reporters=reporters,
                                membership_only=True)
        elif size and len(ms.ranks) < size:
            return _Verdict(None, 0.0, symptoms,
                            f"only {len(ms.ranks)} of {size} ranks are known (a node's agent is missing): no verdict")
    # 6. the IB completion errors point at one peer
    return _link(ms, symptoms) or _Verdict(None, 0.0, symptoms, "symptoms, but no resource of the job stands out")


def _hardware_verdict(ms: Membership, used: list[tuple[dict[str, Any], Member, str]],
                      symptoms: list[dict[str, Any]]) -> _Verdict:
    """The node's own hardware collectors first (a tenant's log line naming a port only when nothing
    else does); NCCL lists every NIC a rank may use, so the rank whose channels use the port comes
    first; faults on more than MAX_CULPRIT_NODES of the job's nodes are the fabric's, not a node's."""
    used.sort(key=lambda t: (is_tenant(t[0]), t[2] == "hca_port" and str(t[0].get("entity"))[3:] not in t[1].nics,
                             _order(t[0])))
    own = [t for t in used if not is_tenant(t[0])] or used
    tenant = is_tenant(own[0][0])
    firsts: dict[str, tuple[dict[str, Any], Member, str]] = {}
    for t in own:
        firsts.setdefault(t[1].node, t)
    evidence = [f for f, _m, _k in used] + symptoms
    if len(firsts) > MAX_CULPRIT_NODES:
        return _Verdict(None, 0.0, evidence, f"hardware faults on resources of the job on {len(firsts)} nodes: "
                                             f"{', '.join(sorted(firsts))}", tenant=tenant)
    culprits = []
    for f, mem, kind in firsts.values():
        c = {"node": mem.node, "entity": str(f.get("entity")), "kind": kind}
        rank = ms.rank_of(mem)
        if rank is not None:
            c["rank"] = str(rank)
        culprits.append(c)
    f, mem, kind = own[0]
    # error counters rising (over a real window) on a job that is not hit yet: a port to watch, not yet
    # a reason to take the node out (a state finding -- down, fell off the bus -- is)
    early_counters = not symptoms and all(t[0].get("type") in _COUNTER_TYPES for t in own)
    confidence = (0.97 if symptoms else 0.8 if early_counters else 0.9) if not tenant else 0.8
    what = "GPU" if kind == "gpu" else "NIC port"
    reason = f"{f.get('type')} on a {what} rank {ms.rank_of(mem)} used"
    if len(culprits) > 1:
        reason += f"; also on {', '.join(c['node'] for c in culprits[1:])}"
    if tenant:
        reason += " (from the job's own log: no hardware collector of the node confirms it)"
    elif early_counters:
        reason += " (error counters only, the job not hit yet: shown, not acted on)"
    return _Verdict(culprits[0], confidence, evidence, reason, reporters=set(firsts), tenant=tenant,
                    culprits=culprits)


RAS_CULPRIT_REASONS = ("dead", "unresponsive", "missing", "error")  # collectors/nccl_ras.py RasSuspect.reason


def _ras(job: str, ms: Membership, symptoms: list[dict[str, Any]]) -> _Verdict | None:
    """RAS names processes (host address and pid, or the rank of a communicator): the ones that died,
    stopped answering, sent no data or failed on their own (not "remote" errors: those are victims).
    Mapped to the job's members by the world communicator's rank, else by pid and address; named
    when they are few (at most size/8) and on one node. A suspect that maps to nobody is ignored; a
    node whose RAS names another node's processes is one reporter: corroborated by a second node's
    RAS, or by the suspect's own node, it names the rank; alone it is shown."""
    try:
        job_hash = int(job, 16)
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
    for s in symptoms:
        if s.get("type") != "NCCLRASReport":
            continue
        suspects = _details(s).get("suspects")
        for sus in suspects[:64] if isinstance(suspects, list) else []:
            if not isinstance(sus, dict) or sus.get("reason") not in RAS_CULPRIT_REASONS:
                continue
            found: Member | None = None
            rank, comm = _int(sus.get("rank")), sus.get("comm_hash")
            try:
                same_comm = job_hash is not None and isinstance(comm, str) and len(comm) <= 32 \
                    and int(comm, 16) == job_hash
            except ValueError:
                same_comm = False
            if rank is not None and same_comm:
                found = ms.ranks.get(rank)
            pid, host = _int(sus.get("pid")), sus.get("host")
            if found is None and pid is not None:
                cands = [m for m in by_pid.get(pid, []) if host in (m.oob_ip, m.node, m.process.rsplit(":", 1)[0])]
                found = cands[0] if len(cands) == 1 else None
            if found is None:
                continue  # a suspect we cannot place names nobody
            named[found.node][(found.node, found.process)] = found
            reporters[found.node].add(str(s.get("node")))
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
    entity = (f"rank:{ranks[0]}" if len(ranks) == 1 else "ranks:" + ",".join(map(str, ranks))) if ranks \
        else f"process:{first.process}"
    culprit = {"node": first.node, "entity": entity, "kind": "rank"}
    if ranks:
        culprit["rank"] = str(ranks[0])
    return _Verdict(culprit, 0.9, evidence[node] + [s for s in symptoms if s.get("type") == "NCCLCollectiveTimeout"],
                    f"NCCL's RAS names {len(culprits)} process(es) on {first.node} that died, stopped "
                    f"answering, sent no data or failed", reporters=reporters[node])


def _rank_index(ms: Membership) -> dict[tuple[str, str], int]:
    """(node, entity "nccl:host:pid") -> the world rank bound to that process."""
    return {(mem.node, f"nccl:{mem.process}"): r for mem in ms.members.values() if (r := ms.rank_of(mem)) is not None}


def _rank_of(s: dict[str, Any], index: dict[tuple[str, str], int]) -> int | None:
    """The world rank of the process a symptom came from: the rank its own node bound to that process
    by membership, never a rank the payload names (a process without membership has no rank)."""
    return index.get((str(s.get("node")), str(s.get("entity", ""))))


def _flight_record(r: int, d: dict[str, Any], at: dict[str, dict[int, int]], enq: dict[str, dict[int, int]],
                   self_reported: set[int]) -> None:
    """A rank's Flight Recorder dump, per process group: the collective it waits in (its first one not
    completed) and the newest collective it enqueued; with nothing pending and the newest below the
    collective the others wait in, it never entered it (the rank the others wait for)."""
    pgs = d.get("pgs")
    if not isinstance(pgs, dict):
        return
    for pg, v in list(pgs.items())[:32]:
        if not isinstance(v, dict):
            continue
        pending = v.get("first_not_completed")
        seq = _int(pending.get("collective_seq_id")) if isinstance(pending, dict) else None
        newest = _int(v.get("entries_last_enqueued"))
        if seq is not None and seq >= 0:
            at[str(pg)][r] = min(seq, at[str(pg)].get(r, seq))
        if newest is not None:
            enq[str(pg)][r] = min(newest, enq[str(pg)].get(r, newest))
            if seq is None:
                self_reported.add(r)


def _behind(ms: Membership, symptoms: list[dict[str, Any]]) -> _Verdict | None:
    """The rank(s) that never joined the collective the job waits in: PyTorch's watchdog says where
    each rank's process group failed (SeqNum, "at work") and how far it had enqueued; the collective
    most ranks fail at is the one the job waits in, and a rank that failed earlier, or whose last
    enqueued work is below it (it heard of the timeout but had nothing in flight), never entered it.
    Sequence numbers are per process group: only one group's numbers are compared. Each rank's
    numbers come from its own process (its node's word about itself)."""
    ranks = ms.ranks
    size = ms.size
    index = _rank_index(ms)
    at: dict[str, dict[int, int]] = defaultdict(dict)  # group -> rank -> the work its watchdog failed at
    enq: dict[str, dict[int, int]] = defaultdict(dict)  # group -> rank -> its last enqueued work
    self_reported: set[int] = set()
    # PyTorch 2.5-2.13 print a timeout as "[Rank r]" whatever its group: where a progress line (which
    # names the group) came from a rank, its timeout lines' sequence numbers are not compared
    with_progress = {_rank_of(s, index) for s in symptoms if (s.get("type") == "NCCLWatchdogProgress"
                     and _int(_details(s).get("at_seq")) is not None) or s.get("type") == "TorchFlightRecord"}
    for s in symptoms:
        d = _details(s)
        r = _rank_of(s, index)
        if r is None or r not in ranks:
            continue
        if s.get("type") == "TorchFlightRecord":
            _flight_record(r, d, at, enq, self_reported)
            continue
        if s.get("type") not in ("NCCLCollectiveTimeout", "NCCLWatchdogProgress") or d.get("implausible"):
            continue
        timeout = s.get("type") == "NCCLCollectiveTimeout"
        if timeout and d.get("pg_id") is None and r in with_progress:
            continue
        if not timeout and _int(d.get("at_seq")) is None and _int(d.get("signal_from_rank")) is None:
            continue  # "from this local rank": its own watchdog, not a rank that heard of another's
        pg = str(d.get("pg_id") or "0")
        seq = _int(d.get("seq_num")) if timeout else _int(d.get("at_seq"))
        if seq is not None and seq >= 0:
            at[pg][r] = min(seq, at[pg].get(r, seq))
        e = _int(d.get("last_enqueued"))
        if e is not None:
            enq[pg][r] = min(e, enq[pg].get(r, e))
            if s.get("type") == "NCCLWatchdogProgress" and seq is None:  # heard of the timeout, nothing in flight
                self_reported.add(r)
    groups = [g for g in at if at[g]]
    if not groups or not size:
        return None
    pg = "0" if "0" in groups else max(groups, key=lambda g: len(at[g]))
    counts: dict[int, int] = defaultdict(int)
    for q in at[pg].values():
        counts[q] += 1
    waited = max(counts, key=lambda q: (counts[q], q))  # the collective most ranks wait in
    heard = set(at[pg]) | set(enq[pg])
    behind = sorted({r for r, q in at[pg].items() if q < waited} | {r for r, e in enq[pg].items() if e < waited})
    if not behind or len(heard) * 2 < size or len(behind) > max(1, size // 8):
        return None
    behind_nodes = {ranks[r].node for r in behind}
    if len(behind_nodes) != 1:
        return None
    mem = ranks[behind[0]]
    entity = f"rank:{behind[0]}" if len(behind) == 1 else "ranks:" + ",".join(map(str, behind))
    own = [r for r in behind if r in self_reported]
    how = (f"rank(s) {own} said their last enqueued work is below it" if own
           else f"rank(s) {behind} failed at an earlier one")
    evidence = [s for s in symptoms if _rank_of(s, index) in behind] + \
        [s for s in symptoms if s.get("type") == "NCCLCollectiveTimeout"]
    # the behind ranks' own numbers decide (their node is a reporter); the others' establish the collective
    return _Verdict({"node": mem.node, "entity": entity, "kind": "rank", "rank": str(behind[0])},
                    0.9 if own else 0.85, evidence,
                    f"{len(at[pg])} rank(s) of {size} failed in collective {waited} of process group {pg}; {how}: "
                    f"they never joined it", reporters={mem.node}, membership_only=True)


def _link(ms: Membership, symptoms: list[dict[str, Any]]) -> _Verdict | None:
    """Every IB completion error names one peer's bootstrap address (an address two nodes claim
    names nobody); the peer is named by the nodes that saw the errors, so it takes two of them."""
    claims: dict[str, set[str]] = defaultdict(set)
    for mem in ms.members.values():
        if mem.oob_ip:
            claims[mem.oob_ip].add(mem.node)
    ip_node = {ip: next(iter(nodes)) for ip, nodes in claims.items() if len(nodes) == 1}
    errors = [s for s in symptoms if s.get("type") == "NCCLIBCompletionError" and _details(s).get("peer")]
    peers = {ip_node.get(str(_details(s).get("peer", "")).split("<")[0]) for s in errors}
    if len(peers) != 1 or None in peers:
        return None
    peer_node = next(iter(peers))
    assert peer_node is not None
    return _Verdict({"node": peer_node, "entity": "node", "kind": "link"}, 0.7, symptoms,
                    "every IB completion error names this node as the peer",
                    reporters={str(s.get("node")) for s in errors})


def _incident(job: str, culprit: dict[str, str] | None, confidence: float, evidence: Iterable[dict[str, Any]],
              nodes: list[str], reason: str, culprit_nodes: set[str] | None = None) -> Incident:
    seen: set[tuple[str, ...]] = set()
    items: list[dict[str, Any]] = []
    for m in evidence:
        key = tuple(str(m.get(k))[:300] for k in ("node", "type", "entity", "time"))  # hostile values: unhashable
        if key not in seen:
            seen.add(key)
            items.append(m)
    items.sort(key=lambda m: str(m.get("time") or ""))
    blamed = culprit_nodes or ({culprit["node"]} if culprit else set())
    victims = [n for n in nodes if n not in blamed]
    return Incident(job=job, culprit=culprit, confidence=confidence, evidence=[_brief(m) for m in items[:EVIDENCE_MAX]],
                    victims=victims, nodes=nodes, reason=reason,
                    first_evidence=str(items[0].get("time")) if items else None, evidence_total=len(items))
