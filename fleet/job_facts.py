"""A job's facts, kept as its messages arrive: who its members are and what each process said.

fleet/correlator.py judges a job from these facts, never from a window of raw messages (issue 21):
a job of 4,096 nodes (32,768 ranks) is one ``Member`` and one ``Proc`` per process, whatever
how many lines each process printed, and a message updates them in O(1) amortised:

* ``Membership``: each process's claim (world rank and size, GPU, NICs, transport, bootstrap
  address) and the ranks bound to them. A rank is bound to the first process that claims it, in
  arrival order; the job's size is the one claimed by the most nodes; a conflicting claim is a
  finding (the trust model, docs/correlator.md "Who may say what"). Bindings are rebuilt only
  when the majority size changes (the job's first size claim, or an attack), never per message.
* ``Proc``: per process, what its watchdog said (timed out; per process group the lowest
  collective sequence number it failed at and the lowest last-enqueued work; whether it reported
  progress lines, which name their group), reduced to numbers as the messages arrive.
* evidence: a bounded sample per message type (the first ``SAMPLES_PER_TYPE``) with exact counts,
  and the messages that may decide a verdict kept apart so they are never crowded out: per
  process group the messages of the lowest sequence numbers (a rank behind the others is among
  them), the RAS reports per reporting node, NCCL's own port failures per node.

Everything a reporter can grow is bounded: processes per node (the tracker's share), NICs per
member, findings, distinct peers, sequence values; what was refused is counted.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator
from typing import Any

import msgspec

from fleet.heap import TrackedDict
from fleet.typed_details import nccl
from gna_types import entities
from gna_types.details import (
    BackendError,
    CollectiveTimeout,
    FlightRecord,
    IBAsyncEvent,
    IBCompletionError,
    ProcessSummary,
    RankFailure,
    SocketError,
    WatchdogProgress,
)
from gna_types.policy import verdict

SAMPLES_PER_TYPE = 8  # evidence messages kept per type and job (the rest counted)
FINDINGS_MAX = 32  # conflicting claims kept per job (the rest counted)
NICS_MAX = 64  # NICs kept per member (NCCL lists at most a node's HCAs)
LOW_VALUES = 16  # distinct lowest sequence numbers kept with their messages, per process group
BRIEFS_PER_VALUE = 8  # messages kept per such number
PGS_MAX = 32  # process groups kept per process (a rank joins a few communicators)
RAS_PER_NODE = 2  # RAS reports kept per reporting node: the newest say what RAS thinks now
PEERS_MAX = 256  # distinct peer addresses of IB completion errors kept per job
ASYNC_PER_NODE = 16  # ports NCCL saw fail, per node
FAILURES_MAX = 256  # processes kept whose failure was their own (a crashed rank is one of them)
VICTIMS_MAX = 4096  # processes kept whose own lines say a peer failed under them
OPS_PER_SEQ = 8  # distinct collectives (OpType) kept per process group and sequence number
KEYS_PER_OP = 4096  # processes kept per such collective (the minority is what is read)
MEMBERS_PER_NODE = 64  # processes a node may claim in one job (an HGX node runs 8 ranks)
RELAYED_PER_REPORTER = 4096  # other nodes' processes one node may relay in one job (its job-wide file)
HOSTS_MAX = 65536  # NCCL hostnames mapped to the nodes that claim them, per job

# types whose evidence the tenant controls: its processes' log lines, its RAS port's answers, its dumps
# (collectors/nccl_logs.py publishes every one of them, collector "nccl_logs")
TENANT_COLLECTORS = frozenset({"nccl_logs"})

_OOB_IP = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _oob_ip(oob: str | None) -> str | None:
    if oob is None:
        return None
    # "ib0:10.0.0.5<0>" -> 10.0.0.5
    m = _OOB_IP.search(oob.split(":", 1)[1] if ":" in oob and "." in oob else oob)
    return m.group(1) if m else None


def is_tenant(m: dict[str, Any]) -> bool:
    """Evidence the job's own processes (its user) control: log lines, RAS answers, dumps."""
    return m.get("collector") in TENANT_COLLECTORS


def _intern(v: str) -> str:
    # node names, PCI addresses, NIC and transport names repeat across a job's members: one copy each
    return sys.intern(v) if len(v) <= 256 else v


_SETS: dict[frozenset[str], frozenset[str]] = {}


def _shared(s: frozenset[str]) -> frozenset[str]:
    """One copy of each NIC set (a node's eight ranks list the same NICs)."""
    if len(_SETS) > 65536:
        _SETS.clear()
    return _SETS.setdefault(s, s)


_NIC_SETS: dict[tuple[Any, ...], frozenset[str]] = {}


def _nic_set(listed: list[str]) -> frozenset[str]:
    """The NICs a member lists (typed: names of at most 64 characters), as one shared set (a node's ranks list
    the same ones, message after message)."""
    key = tuple(listed[:NICS_MAX])
    got = _NIC_SETS.get(key)
    if got is None:
        got = _shared(frozenset(_intern(h) for h in key))
        if len(_NIC_SETS) > 65536:
            _NIC_SETS.clear()
        _NIC_SETS[key] = got
    return got


def brief(m: dict[str, Any], about: str | None = None) -> dict[str, Any]:
    """What an incident shows of a message (bounded: the wire bounds each field, the message is cut): its
    details as they came, displayed, never decided on. ``about``: the node a relayed message is filed under
    (the reporter shown as ``relayed_by``)."""
    d = m.get("details")
    d = d if isinstance(d, dict) else {}
    relayed = about is not None and about != m.get("node")
    out = {"node": about if relayed else m.get("node"), **({"relayed_by": m.get("node")} if relayed else {}),
           "type": m.get("type"), "entity": m.get("entity"), "severity": m.get("severity"),
           "time": m.get("time"), "message": str(m.get("message", ""))[:300]}
    for k in ("rank", "seq_num", "op_type", "peer", "pci"):
        if d.get(k) is not None:
            out[k] = d[k]
    if isinstance(d.get("logged_at"), str):
        out["logged_at"] = d["logged_at"][:64]  # when its source logged it (the kernel log's own time)
    return out


def _lowest_slot(by_value: dict[int, Any], v: int, make: Callable[[], Any]) -> Any:
    """The slot for ``v`` in a dict keeping only the LOW_VALUES lowest keys (made when new, a higher one dropped
    for it); None when ``v`` is above all of them and there is no room."""
    held = by_value.get(v)
    if held is None:
        if len(by_value) >= LOW_VALUES:
            top = max(by_value)
            if v > top:
                return None
            del by_value[top]
        held = by_value[v] = make()
    return held


class Member(msgspec.Struct, gc=False, eq=False, repr_omit_defaults=True):
    """One process of a job as its own node claims it.

    Never tracked by CPython's cycle collector (``gc=False``: it holds only strings, numbers and
    shared frozensets, so it can be in no cycle): a 32,768-rank job's members would otherwise be
    traversed by every full collection, a stall of the correlator's loop that grows with the fleet
    (issue 21, docs/benchmarks.md). ``eq=False``: members compare and hash by identity."""

    node: str
    process: str  # host:pid
    order: int  # when its first message arrived
    claim: int  # when its rank claim arrived: bindings go in this order
    rank: int | None = None
    size: int | None = None
    pci: str | None = None
    hcas: frozenset[str] = frozenset()  # "mlx5_0/1": every NIC NCCL listed
    nics: frozenset[str] = frozenset()  # the ones its channel lines use (empty: not known)
    transport: str | None = None
    oob_ip: str | None = None
    # the node that relayed it (another node's process, read there in a job-wide file): that node's word, not
    # this one's; None once the process's own node claims it
    via: str | None = None

    @property
    def reporter(self) -> str:
        """Whose word the member rests on."""
        return self.via or self.node


class Membership:
    """A job's members as their own nodes claim them, and the ranks bound to them.

    A rank is bound to the first member that claims it with the job's size (the size claimed by the
    most nodes); another node's claim of a bound rank, or of another size, is a finding and makes
    the job contested. Ranks are only ever taken from here, never from a symptom's payload."""

    def __init__(self, *, members_per_node: int = MEMBERS_PER_NODE) -> None:
        # not an exact dict: frozen once, not walked by each collection (fleet/heap.py TrackedDict)
        self.members: dict[tuple[str, str], Member] = TrackedDict()
        self.by_node: dict[str, list[Member]] = {}
        self.ranks: dict[int, Member] = {}
        self.size = 0
        self.members_per_node = members_per_node
        self.refused = 0  # claims of a process beyond its node's share
        self._size_nodes: dict[int, set[str]] = {}
        self._size_first: dict[int, int] = {}
        self._rank_findings: list[dict[str, Any]] = []
        self._rank_findings_total = 0
        # node -> the transports its members use; the nodes on sockets only, and those with another
        self.transports: dict[str, frozenset[str]] = {}
        self.socket_only: set[str] = set()
        self.non_socket: set[str] = set()
        self.oob_claims: dict[str, set[str]] = {}  # bootstrap address -> the nodes claiming it
        self.hosts: dict[str, str] = {}  # NCCL hostname -> the node whose own processes print it
        self.own_count: dict[str, int] = {}  # node -> the processes it claims itself
        self.relayed_count: dict[str, int] = {}  # reporter -> the other nodes' processes it relays
        self.generation = 0  # bumped when every binding was rebuilt: what was derived from them is stale

    # -- the trust model's view ---------------------------------------------------------------
    @property
    def findings_total(self) -> int:
        return self._rank_findings_total + sum(len(n) for s, n in self._size_nodes.items() if s != self.size)

    @property
    def contested(self) -> bool:
        return self.findings_total > 0

    @property
    def findings(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for other in sorted(set(self._size_nodes) - {self.size}):
            for node in sorted(self._size_nodes[other]):
                if len(out) >= FINDINGS_MAX:
                    return out
                out.append({"kind": "size_conflict", "node": node, "claimed": other, "size": self.size})
        return out + self._rank_findings[:FINDINGS_MAX - len(out)]

    def rank_of(self, mem: Member | None) -> int | None:
        """The rank bound to this member, or None (no claim, or another member holds it)."""
        if mem is None or mem.rank is None:
            return None
        return mem.rank if self.ranks.get(mem.rank) is mem else None

    def member_of(self, node: str, entity: str) -> Member | None:
        """A symptom's process (entity ``nccl:<host>:<pid>``) as a member of the job, if it is one: the same
        record as ``members[(node, "<host>:<pid>")]`` (no second index: issue 21's bytes per rank)."""
        return self.members.get((node, entity[5:])) if entity.startswith("nccl:") else None

    def rank_of_entity(self, node: str, entity: str) -> int | None:
        """The world rank of a symptom's process: the rank its own node bound to it by membership."""
        return self.rank_of(self.member_of(node, entity))

    # -- updates ------------------------------------------------------------------------------
    def node_of_host(self, host: str) -> str:
        """The node whose own processes print this NCCL hostname (its agent said so), else the name itself:
        where a relayed process is filed."""
        return self.hosts.get(host, host)

    def node_named(self, name: str) -> str | None:
        """The node a host name names (NCCL's reverse-resolved peer, "gpu-b.cluster.local"): the node whose own
        processes print its short form, else the one node whose name's short form it is; None for an address
        or a name no member's node answers to."""
        if not any(c.isalpha() for c in name):
            return None  # an address: the bootstrap claims decide
        short = name.split(".")[0]
        if short in self.hosts:
            return self.hosts[short]
        named = [n for n in self.by_node if n.split(".")[0] == short]
        return named[0] if len(named) == 1 else None

    def claim(self, node: str, d: ProcessSummary, order: int, *, via: str | None = None) -> Member | None:
        """One message's process summary: its node's word about its own process, or (``via``) a node's word
        about another node's process it read in a job-wide file; None: refused."""
        proc = f"{d.host}:{d.pid}"[:600]
        key = (node, proc)
        mem = self.members.get(key)
        if via is None and d.host and d.host not in self.hosts and len(self.hosts) < HOSTS_MAX:
            self.hosts[_intern(d.host)] = _intern(node)
        if mem is None:
            share = self.relayed_count if via is not None else self.own_count
            who = via if via is not None else node
            if share.get(who, 0) >= (RELAYED_PER_REPORTER if via is not None else self.members_per_node):
                self.refused += 1  # the node's known processes stand
                return None
            share[who] = share.get(who, 0) + 1
            node = _intern(node)
            mem = self.members[key] = Member(node, proc, order, order, via=_intern(via) if via else None)
            self.by_node.setdefault(node, []).append(mem)
        elif via is None and mem.via is not None:
            mem.via = None  # its own node claims it now: its word
            self.own_count[node] = self.own_count.get(node, 0) + 1
            if mem.rank is not None and self.ranks.get(mem.rank) is not mem:
                self._bind(mem)
        rebind = bind = False
        size = d.world_size
        if mem.size is None and size is not None:
            mem.size = size
            nodes = self._size_nodes.setdefault(size, set())
            self._size_first.setdefault(size, order)
            nodes.add(node)
            # the majority's own count only grows when a node claims it: no need to look again
            if size != self.size and (self._majority() != self.size or mem.rank is not None):
                rebind = True
            bind = True
        rank = d.world_rank
        if mem.rank is None and rank is not None:
            mem.rank, mem.claim, bind = rank, order, True
        pci = d.pci
        if mem.pci is None and pci is not None:
            mem.pci = _intern(pci)
        for attr, listed in (("hcas", d.hcas), ("nics", d.nics)):
            if listed:
                have: frozenset[str] = getattr(mem, attr)
                new = _nic_set(listed)
                if not have:
                    setattr(mem, attr, new)
                elif not new <= have and len(have) < NICS_MAX:
                    setattr(mem, attr, _shared(frozenset(list(have | new)[:NICS_MAX])))
        transport = d.transport
        if transport is not None and transport != mem.transport:
            was, mem.transport = mem.transport, _intern(transport[:64])
            if was is not None or mem.transport not in self.transports.get(mem.node, ()):
                self._transports_of(mem.node)
        if mem.oob_ip is None and (ip := _oob_ip(d.oob)) is not None:
            mem.oob_ip = ip
            claims = self.oob_claims.get(ip)
            if claims is None and len(self.oob_claims) < 65536:
                claims = self.oob_claims[ip] = set()
            if claims is not None and len(claims) < 8:
                claims.add(mem.node)
        if rebind:
            self._rebind()
        elif bind:
            self._bind(mem)
        return mem

    def _majority(self) -> int:
        """The size most nodes claim; among equals the first claimed."""
        if not self._size_nodes:
            return 0
        return max(self._size_nodes, key=lambda n: (len(self._size_nodes[n]), -self._size_first[n]))

    def _finding(self, **what: Any) -> None:
        self._rank_findings_total += 1
        if len(self._rank_findings) < FINDINGS_MAX:
            self._rank_findings.append(what)

    def _bind(self, mem: Member) -> None:
        if mem.rank is None or (mem.size is not None and mem.size != self.size):
            return
        if not 0 <= mem.rank < max(self.size, 1):
            self._finding(kind="rank_out_of_range", node=mem.node, rank=mem.rank, size=self.size)
            return
        holder = self.ranks.get(mem.rank)
        if holder is None:
            self.ranks[mem.rank] = mem
        elif holder is not mem and holder.process == mem.process and (holder.via is None) != (mem.via is None):
            if holder.via is not None:  # a relayed claim gives way to the process's own node
                self.ranks[mem.rank] = mem
        elif holder is not mem and holder.node != mem.node:
            # one node's processes may restart; another node's claim is a conflict
            self._finding(kind="rank_conflict", node=mem.node, rank=mem.rank, holder=holder.node)

    def _rebind(self) -> None:
        """The majority size changed: every claim bound again, in the order the claims arrived."""
        self.size = self._majority()
        self.generation += 1
        self.ranks = {}
        self._rank_findings, self._rank_findings_total = [], 0
        for mem in sorted((m for m in self.members.values() if m.rank is not None), key=lambda m: m.claim):
            self._bind(mem)

    def _transports_of(self, node: str) -> None:
        t = frozenset(m.transport for m in self.by_node.get(node, ()) if m.transport)
        self.transports[node] = t
        (self.socket_only.add if t == {"Socket"} else self.socket_only.discard)(node)
        (self.non_socket.add if any(x != "Socket" for x in t) else self.non_socket.discard)(node)


class Proc(msgspec.Struct, gc=False, eq=False):
    """What one process's watchdog said, reduced to numbers (PyTorch's ProcessGroupNCCL lines,
    collectors/nccl_parse.py; Flight Recorder dumps, collectors/flight_recorder.py).

    Untracked by the cycle collector like ``Member``: its dicts map group names to numbers only."""

    timed_out: bool = False
    at: dict[str, int] | None = None  # process group -> the lowest collective it failed at
    enq: dict[str, int] | None = None  # process group -> its lowest last-enqueued work
    # a timeout line without its group (PyTorch 2.5-2.13 print "[Rank r]" whatever the group): counted
    # as group "0" unless the process printed progress lines, which name the group
    at_nopg: int | None = None
    enq_nopg: int | None = None
    progress: bool = False  # a progress line with its collective, or a Flight Recorder dump
    self_reported: bool = False  # said its last enqueued work, with nothing in flight

    def lower(self, attr: str, pg: str, v: int) -> bool:
        d: dict[str, int] | None = getattr(self, attr)
        if d is None:
            d = {}
            setattr(self, attr, d)
        old = d.get(pg)
        if old is not None and old <= v:
            return False
        if old is None and len(d) >= PGS_MAX:
            return False
        d[pg] = v
        return True


class JobFacts:
    """Everything the correlator knows about one job, updated message by message. ``symptoms``: the message
    types that are the job's symptoms (counted, sampled, kept as evidence): the ones the correlator's verdict
    rules read (fleet/correlator.py ``SYMPTOMS``, derived from its registry)."""

    def __init__(self, job: str, *, symptoms: Collection[str], members_per_node: int = MEMBERS_PER_NODE) -> None:
        self.job = job
        self.symptoms = frozenset(symptoms)
        self.ms = Membership(members_per_node=members_per_node)
        self.procs: dict[tuple[str, str], Proc] = TrackedDict()  # (node, entity) -> its watchdog's numbers
        self.samples: dict[str, list[dict[str, Any]]] = {}  # type -> the first SAMPLES_PER_TYPE briefs
        self.counts: dict[str, int] = {}  # type -> messages counted
        self.node_counts: dict[str, int] = {}  # node -> its symptom messages counted (one entry per job node)
        # kind ("at"/"enq") -> process group -> sequence number -> (process, brief) of the lowest numbers
        self.low: dict[str, dict[str, dict[int, list[tuple[tuple[str, str], dict[str, Any]]]]]] = {"at": {}, "enq": {}}
        self.ras: dict[str, deque[dict[str, Any]]] = {}  # reporting node -> its newest RAS reports
        self.peers: dict[str, set[str]] = {}  # peer address of IB completion errors -> nodes that saw them
        self.peers_overflow = False
        self.async_ports: dict[str, dict[str, dict[str, Any]]] = {}  # node -> "ib:hca/port" -> NCCL's line
        # crashed ranks (issue 25): (node, entity) -> (brief, reason, reporter) of a process that ended or failed
        # on its own (torchrun's failure report by signal, OOM kill or its own error; an NCCL error of its own);
        # the peers' closed sockets: the other end's address -> the nodes whose ranks saw it go
        self.failures: dict[tuple[str, str], tuple[dict[str, Any], str, str]] = {}
        self.closed_by: dict[str, set[str]] = {}
        # processes whose own lines say a peer failed under them (an NCCL remote error, a socket the peer closed,
        # a report of a peer's failure), and those whose failure report gives no cause of its own (an exit code,
        # no signal, no error): such a failure of a victim is the peer's doing, whichever was read first
        self.victims: set[tuple[str, str]] = set()
        self.victims_overflow = False
        self.bare_exits: set[tuple[str, str]] = set()
        # desync (issue 26): process group -> SeqNum -> the collective (OpType) each timed-out process says it
        # was in at that number -> (process, brief); the LOW_VALUES lowest numbers per group
        self.ops: dict[str, dict[int, dict[str, list[tuple[tuple[str, str], dict[str, Any]]]]]] = {}
        self.symptomatic = False
        # Derived per bound rank, kept as each process's numbers or binding change (never recomputed per
        # judgement; rebuilt when the bindings are): kind ("at"/"enq") -> group -> rank -> its number, and
        # -> group -> number -> the ranks at it (the collective most ranks wait in is the largest set)
        self.rank_values: dict[str, dict[str, dict[int, int]]] = {"at": {}, "enq": {}}
        self.ranks_at: dict[str, dict[str, dict[int, set[int]]]] = {"at": {}, "enq": {}}
        self.timed_out_ranks: set[int] = set()
        self.self_reported_ranks: set[int] = set()
        self._generation = 0
        self.names: dict[str, str] = {}  # node -> the job's name as that node's lookup gave it (display only)

    def add(self, m: dict[str, Any], order: int, d: ProcessSummary | None = None) -> bool:
        """One of the job's NCCL messages (collector nccl_logs, details.job this job), with its typed details
        where the caller has them (fleet/typed_details.py ``nccl``); False: refused."""
        reporter = m.get("node")
        if not isinstance(reporter, str):
            return False
        if d is None:
            d = nccl(m)
        node = reporter
        if d.relayed:  # another node's process: filed under that node, on the reporter's word
            if not d.host:
                return False
            node = self.ms.node_of_host(d.host)
        mem = self.ms.claim(node, d, order, via=reporter if d.relayed else None)
        if mem is None:
            return False
        key = (node, str(m.get("entity", ""))[:600])
        if d.job_name is not None and self.names.get(node) != d.job_name:
            self.names[node] = sys.intern(d.job_name)
        self._file(m, d, node, key, reporter)
        if key in self.procs or self._generation != self.ms.generation:
            self._derive(key)  # its numbers, or its binding, may have changed
        own = (mem.node, f"nccl:{mem.process}")
        if own != key and own in self.procs:
            self._derive(own)  # the process's binding came with a message filed under another entity
        return True

    def name(self) -> str | None:
        """The job's name as operators know it: the one most of its nodes give (each node's lookup is its own
        word; a node naming the job otherwise is outvoted, and a name changes no verdict)."""
        if not self.names:
            return None
        votes = Counter(self.names.values())
        return min(votes, key=lambda n: (-votes[n], n))

    def _file(self, m: dict[str, Any], d: ProcessSummary, node: str, key: tuple[str, str], reporter: str) -> None:
        type_ = m.get("type")
        if isinstance(d, IBAsyncEvent):
            # a relayed line is graded info by its reader: graded here as the policy grades it
            critical = m.get("severity") == "critical" or (
                d.relayed and verdict(str(type_), str(m.get("reason"))).severity == "critical")
            if critical and d.hca is not None and d.port is not None:
                # NCCL saw the port fail under a rank's feet: the same entity as the port's own condition, but a
                # log line (the tenant's word): it names the port, it does not decide a cordon alone
                entity = entities.ib(d.hca, d.port)
                ports = self.async_ports.setdefault(node, {})
                if entity in ports or len(ports) < ASYNC_PER_NODE:
                    ports[entity] = {**m, "entity": entity}
            return
        if type_ not in self.symptoms or m.get("status") == "resolved":
            return
        assert isinstance(type_, str)
        self.symptomatic = True
        self.counts[type_] = self.counts.get(type_, 0) + 1
        self.node_counts[node] = self.node_counts.get(node, 0) + 1
        b: dict[str, Any] | None = None
        sample = self.samples.setdefault(type_, [])
        if len(sample) < SAMPLES_PER_TYPE:
            b = brief(m, node)
            sample.append(b)
        if type_ == "NCCLRASReport":
            self.ras.setdefault(node, deque(maxlen=RAS_PER_NODE)).append(m)
        elif isinstance(d, IBCompletionError):
            peer = d.peer
            if peer:
                ip = peer.split("<")[0][:64]
                seen = self.peers.get(ip)
                if seen is None:
                    if len(self.peers) >= PEERS_MAX:
                        self.peers_overflow = True  # errors point at too many peers: no single one
                        return
                    seen = self.peers[ip] = set()
                if len(seen) < 64:
                    seen.add(reporter)  # who saw the errors: the reporter, whoever's process it relays
        elif isinstance(d, RankFailure | BackendError):
            reason = str(m.get("reason"))
            if reason in ("PeerFailure", "RemoteError"):  # a victim of another's failure
                self._victim(key)
                if isinstance(d, BackendError) and d.peer:
                    self._closed(d.peer, reporter)
                return
            if key in self.failures or len(self.failures) < FAILURES_MAX:
                if key not in self.failures and isinstance(d, RankFailure) and reason == "ExitedWithError" \
                        and d.signal is None and not d.error:
                    self.bare_exits.add(key)  # torchrun's exit code alone (a DistBackendError exits 1 as well)
                self.failures.setdefault(key, (b or brief(m, node), reason, reporter))
        elif isinstance(d, SocketError):
            if d.peer:
                self._victim(key)
                self._closed(d.peer, reporter)
        elif isinstance(d, CollectiveTimeout | WatchdogProgress | FlightRecord):
            self._watchdog(key, d, m, b)
        return

    def _victim(self, key: tuple[str, str]) -> None:
        if key not in self.victims:
            if len(self.victims) >= VICTIMS_MAX:
                self.victims_overflow = True  # then no exit code alone is taken as a failure of its own
                return
            self.victims.add(key)

    def own_failures(self) -> Iterator[tuple[tuple[str, str], tuple[dict[str, Any], str, str]]]:
        """The failures that were the process's own: not an exit code alone of a process whose own lines say a
        peer failed under it (PyTorch raises the NCCL remote error and the worker exits 1: torchrun reports
        that exit with no cause, the rank's NCCL error or socket names the peer). Past VICTIMS_MAX victims no
        exit code alone counts (when that many of the job's ranks saw a peer fail, such an exit most likely is one)."""
        for key, f in self.failures.items():
            if key in self.bare_exits and (key in self.victims or self.victims_overflow):
                continue
            yield key, f

    def _closed(self, peer: str, reporter: str) -> None:
        """A rank's socket to ``peer`` (an address as NCCL printed it) closed under it."""
        seen = self.closed_by.get(peer[:64])
        if seen is None:
            if len(self.closed_by) >= PEERS_MAX:
                return
            seen = self.closed_by[peer[:64]] = set()
        if len(seen) < 64:
            seen.add(reporter)

    def _derive(self, key: tuple[str, str]) -> None:
        """What one process's numbers say about its bound rank (a no-op until both are known)."""
        if self._generation != self.ms.generation:
            self._rederive()
            return
        p = self.procs.get(key)
        if p is None:
            return
        r = self.ms.rank_of_entity(*key)
        if r is None:
            return
        if p.timed_out:
            self.timed_out_ranks.add(r)
        if p.self_reported:
            self.self_reported_ranks.add(r)
        for kind, by_pg, nopg in (("at", p.at, p.at_nopg), ("enq", p.enq, p.enq_nopg)):
            eff = dict(by_pg) if by_pg else {}
            if nopg is not None and not p.progress:  # where a progress line named the group, not compared
                eff["0"] = min(nopg, eff.get("0", nopg))
            values = self.rank_values[kind]
            if "0" not in eff and r in values.get("0", {}):
                self._set(kind, "0", r, None)
            for pg, v in eff.items():
                self._set(kind, pg, r, v)

    def _set(self, kind: str, pg: str, r: int, v: int | None) -> None:
        values = self.rank_values[kind].get(pg)
        if values is None:
            if v is None or len(self.rank_values[kind]) >= PGS_MAX:
                return
            values = self.rank_values[kind][pg] = {}
            self.ranks_at[kind][pg] = {}
        old = values.get(r)
        if old == v:
            return
        at = self.ranks_at[kind][pg]
        if old is not None:
            held = at[old]
            held.discard(r)
            if not held:
                del at[old]
        if v is None:
            del values[r]
            return
        values[r] = v
        at.setdefault(v, set()).add(r)

    def _rederive(self) -> None:
        """The bindings were rebuilt (the majority size changed): every rank's numbers derived again."""
        self._generation = self.ms.generation
        self.rank_values, self.ranks_at = {"at": {}, "enq": {}}, {"at": {}, "enq": {}}
        self.timed_out_ranks, self.self_reported_ranks = set(), set()
        for key in self.procs:
            self._derive(key)

    def _proc(self, key: tuple[str, str]) -> Proc:
        p = self.procs.get(key)
        if p is None:
            p = self.procs[key] = Proc()
        return p

    def _low(self, kind: str, pg: str, v: int, key: tuple[str, str], m: dict[str, Any],
             b: dict[str, Any] | None) -> None:
        """Keep the message with one of the LOW_VALUES lowest numbers of its group: a rank behind the
        others is among them, whatever how many ranks report the number they all wait in."""
        held = _lowest_slot(self.low[kind].setdefault(pg, {}), v, list)
        if held is not None and len(held) < BRIEFS_PER_VALUE:
            held.append((key, b or brief(m)))

    def _watchdog(self, key: tuple[str, str], d: CollectiveTimeout | WatchdogProgress | FlightRecord,
                  m: dict[str, Any], b: dict[str, Any] | None) -> None:
        p = self._proc(key)
        if isinstance(d, FlightRecord):
            # a rank's Flight Recorder dump, per process group: the collective it waits in (its first one
            # not completed) and the newest collective it enqueued (each group's record as the node wrote it,
            # collectors/nccl/flight_recorder.py: its values checked here)
            pgs = d.pgs
            if pgs is None:
                return
            p.progress = True
            for pg, v in list(pgs.items())[:PGS_MAX]:
                if not isinstance(v, dict):
                    continue
                pending = v.get("first_not_completed")
                seq = _int(pending.get("collective_seq_id")) if isinstance(pending, dict) else None
                newest = _int(v.get("entries_last_enqueued"))
                if seq is not None and seq >= 0 and p.lower("at", str(pg), seq):
                    self._low("at", str(pg), seq, key, m, b)
                if newest is not None:
                    if p.lower("enq", str(pg), newest):
                        self._low("enq", str(pg), newest, key, m, b)
                    if seq is None:
                        p.self_reported = True
            return
        timeout = isinstance(d, CollectiveTimeout)
        if timeout:
            p.timed_out = True  # it timed out, whatever its numbers are worth
        if d.implausible:
            return
        if timeout and isinstance(d, CollectiveTimeout) and d.op_type and d.seq_num is not None:
            self._op(str(d.pg_id or "0")[:64], d.seq_num, d.op_type, key, b or brief(m))
        seq = d.seq_num if isinstance(d, CollectiveTimeout) else d.at_seq
        if isinstance(d, WatchdogProgress) and seq is None and d.signal_from_rank is None:
            return  # "from this local rank": its own watchdog, not a rank that heard of another's
        if not timeout and seq is not None:
            p.progress = True
        e = d.last_enqueued
        if timeout and d.pg_id is None:
            if seq is not None and seq >= 0 and (p.at_nopg is None or seq < p.at_nopg):
                p.at_nopg = seq
                self._low("at", "0", seq, key, m, b)
            if e is not None and (p.enq_nopg is None or e < p.enq_nopg):
                p.enq_nopg = e
                self._low("enq", "0", e, key, m, b)
            return
        pg = (d.pg_id or "0")[:64]
        if seq is not None and seq >= 0 and p.lower("at", pg, seq):
            self._low("at", pg, seq, key, m, b)
        if e is not None:
            if p.lower("enq", pg, e):
                self._low("enq", pg, e, key, m, b)
            if not timeout and seq is None:  # heard of the timeout, nothing in flight
                p.self_reported = True

    def _op(self, pg: str, seq: int, op: str, key: tuple[str, str], b: dict[str, Any]) -> None:
        """The collective a process's timeout names at a sequence number (bounded: groups, numbers, ops)."""
        by_seq = self.ops.get(pg)
        if by_seq is None:
            if len(self.ops) >= PGS_MAX:
                return
            by_seq = self.ops[pg] = {}
        by_op = _lowest_slot(by_seq, seq, dict)
        if by_op is None:
            return
        held = by_op.get(op)
        if held is None:
            if len(by_op) >= OPS_PER_SEQ:
                return
            held = by_op[op] = []
        if len(held) < KEYS_PER_OP and all(k != key for k, _b in held[-8:]):
            held.append((key, b))

    def weight(self) -> int:
        """Objects held, roughly (the tracker's per-replica budget counts processes)."""
        return len(self.ms.members) + len(self.procs)
