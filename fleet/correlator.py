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
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

EVIDENCE_MAX = 24  # evidence items kept per incident (the rest counted)

_OOB_IP = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)")


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

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "culprit": self.culprit, "confidence": round(self.confidence, 2),
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


def _is_hardware(m: dict[str, Any]) -> bool:
    entity = str(m.get("entity", ""))
    if m.get("severity") != "critical" or m.get("status") == "resolved":
        return False
    return entity.startswith(("gpu:", "ib:")) and m.get("collector") != "nccl_logs"


def members_of(messages: list[dict[str, Any]]) -> dict[str, dict[tuple[str, str], Member]]:
    """job -> (node, process) -> Member, from every NCCL message's process summary."""
    jobs: dict[str, dict[tuple[str, str], Member]] = defaultdict(dict)
    for m in messages:
        if m.get("collector") != "nccl_logs":
            continue
        d = _details(m)
        job = d.get("job")
        node = m.get("node")
        if not isinstance(job, str) or not job or not isinstance(node, str):
            continue
        proc = f"{d.get('host')}:{d.get('pid')}"
        mem = jobs[job].get((node, proc))
        if mem is None:
            mem = jobs[job][(node, proc)] = Member(node, proc, job, _int(d.get("world_rank")),
                                                   _int(d.get("world_size")), None)
        if mem.rank is None:
            mem.rank = _int(d.get("world_rank"))
        if mem.size is None:
            mem.size = _int(d.get("world_size"))
        if isinstance(d.get("pci"), str) and mem.pci is None:
            mem.pci = d["pci"]
        if isinstance(d.get("hcas"), list):
            mem.hcas |= {h for h in d["hcas"][:64] if isinstance(h, str)}
        if isinstance(d.get("nics"), list):
            mem.nics |= {h for h in d["nics"][:64] if isinstance(h, str)}
        if isinstance(d.get("transport"), str):
            mem.transport = d["transport"]
        mem.oob_ip = mem.oob_ip or _oob_ip(d.get("oob"))
    return jobs


def correlate(messages: list[dict[str, Any]]) -> list[Incident]:
    """Incidents for every job with a symptom, or with a hardware fault on a resource it used."""
    messages = sorted(messages, key=lambda m: str(m.get("time") or ""))
    jobs = members_of(messages)
    hardware: dict[str, list[dict[str, Any]]] = defaultdict(list)  # node -> critical findings
    for m in messages:
        if _is_hardware(m) and isinstance(m.get("node"), str):
            hardware[m["node"]].append(m)
        elif (m.get("type") == "NCCLIBAsyncEvent" and m.get("severity") == "critical" and isinstance(m.get("node"), str)
              and isinstance(_details(m).get("hca"), str) and _int(_details(m).get("port")) is not None):
            # NCCL saw the port fail under a rank's feet: the same evidence as the port's own condition
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
    incidents = [inc for job, members in sorted(jobs.items())
                 if (inc := _judge(job, members, symptoms.get(job, []), hardware)) is not None]
    return incidents


def _judge(job: str, members: dict[tuple[str, str], Member], symptoms: list[dict[str, Any]],
           hardware: dict[str, list[dict[str, Any]]]) -> Incident | None:
    nodes = sorted({mem.node for mem in members.values()})
    # 1. a critical finding on a GPU or NIC port one of the job's ranks used
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
    timeouts = [s for s in symptoms if s.get("type") == "NCCLCollectiveTimeout"]
    # NCCL lists every NIC a rank may use; the rank whose channels use the port is the one it hit
    used.sort(key=lambda t: t[2] == "hca_port" and str(t[0].get("entity"))[3:] not in t[1].nics)
    if used:
        culprit_nodes = {mem.node for _f, mem, _k in used}
        f, mem, kind = used[0]  # the earliest (messages are in time order)
        if len(culprit_nodes) == 1:
            confidence = 0.97 if symptoms else 0.9  # before any watchdog fired: the fault is there, the job not yet hit
            culprit = {"node": mem.node, "entity": str(f.get("entity")), "kind": kind}
            if mem.rank is not None:
                culprit["rank"] = str(mem.rank)
            return _incident(job, culprit, confidence, [f for f, _m, _k in used] + symptoms, nodes,
                             f"{f.get('type')} on a {'GPU' if kind == 'gpu' else 'NIC port'} rank {mem.rank} used")
        return _incident(job, None, 0.0, [f for f, _m, _k in used] + symptoms, nodes,
                         f"hardware faults on resources of the job on {len(culprit_nodes)} nodes: "
                         f"{', '.join(sorted(culprit_nodes))}")
    # 2. one node on sockets while the job's other nodes use IB
    by_node: dict[str, set[str]] = defaultdict(set)
    for mem in members.values():
        if mem.transport:
            by_node[mem.node].add(mem.transport)
    socket_nodes = sorted(n for n, t in by_node.items() if t == {"Socket"})
    ib_nodes = [n for n, t in by_node.items() if any(x != "Socket" for x in t)]
    if socket_nodes and ib_nodes and len(socket_nodes) <= len(ib_nodes):  # the fabric is IB: sockets are the odd one
        if len(socket_nodes) == 1:
            node = socket_nodes[0]
            return _incident(job, {"node": node, "entity": "nccl:transport", "kind": "transport"}, 0.9,
                             [s for s in symptoms if s.get("node") == node] + symptoms, nodes,
                             "NCCL on this node uses sockets while the job's other nodes use IB")
        return _incident(job, None, 0.0, symptoms, nodes, f"NCCL over sockets on {len(socket_nodes)} nodes")
    if not symptoms:
        return None
    # 3. the process NCCL's RAS says died, stopped answering, sent no data or failed
    if (inc := _ras(job, members, symptoms, nodes)) is not None:
        return inc
    # 4. a rank that never entered the collective the others wait in, by PyTorch's own numbers
    if (inc := _behind(job, members, symptoms, nodes)) is not None:
        return inc
    # 5. a hung rank: every other rank of the job timed out, this one said nothing
    if timeouts:
        ranks = {mem.rank: mem for mem in members.values() if mem.rank is not None}
        size = max((mem.size or 0 for mem in members.values()), default=0)
        index = _rank_index(members)
        timed_out = {_rank_of(s, index) for s in timeouts}
        silent = sorted(r for r in ranks if r not in timed_out)
        if size and len(ranks) == size and silent:
            silent_nodes = {ranks[r].node for r in silent}
            if len(silent_nodes) == 1 and len(silent) <= max(1, size // 8):
                mem = ranks[silent[0]]
                entity = f"rank:{silent[0]}" if len(silent) == 1 else "ranks:" + ",".join(map(str, silent))
                return _incident(job, {"node": mem.node, "entity": entity, "kind": "rank", "rank": str(silent[0])},
                                 0.85, timeouts, nodes,
                                 f"{len(timed_out & set(ranks))} of {size} ranks timed out; rank(s) {silent} on "
                                 f"{mem.node} did not: stuck before the collective")
        elif size and len(ranks) < size:
            return _incident(job, None, 0.0, symptoms, nodes,
                             f"only {len(ranks)} of {size} ranks are known (a node's agent is missing): no verdict")
    # 6. every IB completion error points at one peer
    ip_node = {mem.oob_ip: mem.node for mem in members.values() if mem.oob_ip}
    peers = {ip_node.get(str(_details(s).get("peer", "")).split("<")[0])
             for s in symptoms if s.get("type") == "NCCLIBCompletionError" and _details(s).get("peer")}
    if len(peers) == 1 and None not in peers:
        peer_node = next(iter(peers))
        assert peer_node is not None
        return _incident(job, {"node": peer_node, "entity": "node", "kind": "link"}, 0.7, symptoms, nodes,
                         "every IB completion error names this node as the peer")
    return _incident(job, None, 0.0, symptoms, nodes, "symptoms, but no resource of the job stands out")


RAS_CULPRIT_REASONS = ("dead", "unresponsive", "missing", "error")  # collectors/nccl_ras.py RasSuspect.reason


def _ras(job: str, members: dict[tuple[str, str], Member], symptoms: list[dict[str, Any]],
         nodes: list[str]) -> Incident | None:
    """RAS names processes (host address and pid, or the rank of a communicator): the ones that died,
    stopped answering, sent no data or failed on their own (not "remote" errors: those are victims).
    Mapped to the job's members by the world communicator's rank, else by pid and address; named
    when they are few (at most size/8) and on one node."""
    try:
        job_hash = int(job, 16)
    except ValueError:
        job_hash = None
    by_rank = {mem.rank: mem for mem in members.values() if mem.rank is not None}
    by_pid: dict[int, list[Member]] = defaultdict(list)
    for m in members.values():
        pid = _int(int(m.process.rsplit(":", 1)[-1])) if m.process.rsplit(":", 1)[-1].isdigit() else None
        if pid is not None:
            by_pid[pid].append(m)
    size = max((mem.size or 0 for mem in members.values()), default=0)
    culprits: dict[tuple[str, str], Member] = {}
    evidence = []
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
                same_comm = job_hash is not None and isinstance(comm, str) and int(comm, 16) == job_hash
            except ValueError:
                same_comm = False
            if rank is not None and same_comm:
                found = by_rank.get(rank)
            pid, host = _int(sus.get("pid")), sus.get("host")
            if found is None and pid is not None:
                cands = [m for m in by_pid.get(pid, []) if host in (m.oob_ip, m.node, m.process.rsplit(":", 1)[0])]
                found = cands[0] if len(cands) == 1 else None
            if found is None:
                return None  # a suspect we cannot place: no verdict rather than a wrong one
            culprits[(found.node, found.process)] = found
        evidence.append(s)
    if not culprits or not size or len(culprits) > max(1, size // 8) or len({m.node for m in culprits.values()}) != 1:
        return None
    ranked = sorted(culprits.values(), key=lambda m: (m.rank is None, m.rank or 0))
    first = ranked[0]
    ranks = [m.rank for m in ranked if m.rank is not None]
    entity = (f"rank:{ranks[0]}" if len(ranks) == 1 else "ranks:" + ",".join(map(str, ranks))) if ranks \
        else f"process:{first.process}"
    culprit = {"node": first.node, "entity": entity, "kind": "rank"}
    if ranks:
        culprit["rank"] = str(ranks[0])
    return _incident(job, culprit, 0.9, evidence + [s for s in symptoms if s.get("type") == "NCCLCollectiveTimeout"],
                     nodes, f"NCCL's RAS names {len(culprits)} process(es) on {first.node} that died, stopped "
                            f"answering, sent no data or failed")


def _rank_index(members: dict[tuple[str, str], Member]) -> dict[tuple[str, str], int]:
    """(node, entity "nccl:host:pid") -> the process's world rank."""
    return {(mem.node, f"nccl:{mem.process}"): mem.rank for mem in members.values() if mem.rank is not None}


def _rank_of(s: dict[str, Any], index: dict[tuple[str, str], int]) -> int | None:
    """The world rank of the process a symptom came from: its membership (the process's world
    communicator rank) first, PyTorch's rank second (a subgroup's rank is not a world rank)."""
    r = index.get((str(s.get("node")), str(s.get("entity", ""))))
    return r if r is not None else _int(_details(s).get("rank"))


def _flight_record(s: dict[str, Any], d: dict[str, Any], index: dict[tuple[str, str], int], ranks: dict[int, Member],
                   at: dict[str, dict[int, int]], enq: dict[str, dict[int, int]], self_reported: set[int]) -> None:
    """A rank's Flight Recorder dump, per process group: the collective it waits in (its first one not
    completed) and the newest collective it enqueued; with nothing pending and the newest below the
    collective the others wait in, it never entered it (the rank the others wait for)."""
    r = _rank_of(s, index)
    pgs = d.get("pgs")
    if r is None or r not in ranks or not isinstance(pgs, dict):
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


def _behind(job: str, members: dict[tuple[str, str], Member], symptoms: list[dict[str, Any]],
            nodes: list[str]) -> Incident | None:
    """The rank(s) that never joined the collective the job waits in: PyTorch's watchdog says where
    each rank's process group failed (SeqNum, "at work") and how far it had enqueued; the collective
    most ranks fail at is the one the job waits in, and a rank that failed earlier, or whose last
    enqueued work is below it (it heard of the timeout but had nothing in flight), never entered it.
    Sequence numbers are per process group: only one group's numbers are compared."""
    ranks = {mem.rank: mem for mem in members.values() if mem.rank is not None}
    size = max((mem.size or 0 for mem in members.values()), default=0)
    index = _rank_index(members)
    at: dict[str, dict[int, int]] = defaultdict(dict)  # group -> rank -> the work its watchdog failed at
    enq: dict[str, dict[int, int]] = defaultdict(dict)  # group -> rank -> its last enqueued work
    self_reported: set[int] = set()
    # PyTorch 2.5-2.13 print a timeout as "[Rank r]" whatever its group: where a progress line (which
    # names the group) came from a rank, its timeout lines' sequence numbers are not compared
    with_progress = {_rank_of(s, index) for s in symptoms if (s.get("type") == "NCCLWatchdogProgress"
                     and _int(_details(s).get("at_seq")) is not None) or s.get("type") == "TorchFlightRecord"}
    for s in symptoms:
        d = _details(s)
        if s.get("type") == "TorchFlightRecord":
            _flight_record(s, d, index, ranks, at, enq, self_reported)
            continue
        if s.get("type") not in ("NCCLCollectiveTimeout", "NCCLWatchdogProgress") or d.get("implausible"):
            continue
        r = _rank_of(s, index)
        if r is None or r not in ranks:
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
    return _incident(job, {"node": mem.node, "entity": entity, "kind": "rank", "rank": str(behind[0])},
                     0.9 if own else 0.85, evidence, nodes,
                     f"{len(at[pg])} rank(s) of {size} failed in collective {waited} of process group {pg}; {how}: "
                     f"they never joined it")


def _incident(job: str, culprit: dict[str, str] | None, confidence: float, evidence: list[dict[str, Any]],
              nodes: list[str], reason: str) -> Incident:
    seen: set[tuple[str, ...]] = set()
    items: list[dict[str, Any]] = []
    for m in evidence:
        key = tuple(str(m.get(k))[:300] for k in ("node", "type", "entity", "time"))  # hostile values: unhashable
        if key not in seen:
            seen.add(key)
            items.append(m)
    items.sort(key=lambda m: str(m.get("time") or ""))
    victims = [n for n in nodes if culprit is None or n != culprit["node"]]
    return Incident(job=job, culprit=culprit, confidence=confidence, evidence=[_brief(m) for m in items[:EVIDENCE_MAX]],
                    victims=victims, nodes=nodes, reason=reason,
                    first_evidence=str(items[0].get("time")) if items else None, evidence_total=len(items))
