"""Which rank of a communicator holds the others back, from the NCCL Inspector's per-rank summaries.

The node agents publish ``NCCLInspectorSummary`` (collectors/nccl_inspector.py): per (communicator,
rank), per operation and power-of-two size bucket (and peer, for P2P), the median bus bandwidth of the
GPU-timed operations of the last window. This module compares the ranks of one communicator
(docs/nccl-inspector.md, "What the numbers can and cannot say").

What a rank's number measures. The Inspector's time is ``max over channels (kernel stop - kernel
start)`` on the GPU's globaltimer (inspector.cc ``calculateMaxKernelExecTimeUsecs``). A rank's NCCL
kernel starts when its stream reaches the collective, then waits inside the kernel until its peers
send. In a ring or tree collective every rank's kernel ends at about the same time, so

    exec_time(rank) = T_collective + (arrival of the last rank - arrival of this rank)

``T_collective`` is shared by all ranks and is set by the slowest link or GPU in the ring. Hence:

- A slow link or a slow GPU *inside* a ring all-reduce lowers every rank's bus bandwidth alike: the
  Inspector's per-rank numbers cannot single out that rank. What can be seen is the communicator as
  a whole against communicators of the same shape (:func:`slow_communicators`: a node's NVLink
  all-reduce against the other nodes' tensor-parallel groups).
- The rank that *arrives last* (slow compute, host stalls, a throttled GPU before the collective) has
  the shortest kernel and the *highest* bus bandwidth; its peers, which waited, all show lower ones.
  That rank is the straggler of a synchronous job, and :func:`slow_ranks` names it (``late_arrival``).
  A single rank *below* its peers is the opposite: it arrived first and waited longest (less work, a
  faster device); it is nobody's straggler and is not named.
- Point-to-point is different: a Send's and a Recv's time belong to one pair of ranks. A slow path
  from ``a`` to ``b`` shows on both sides (a's Send to b *and* b's Recv from a are slow against the
  other pairs); a late ``b`` makes a's Send slow but b's Recv fast, a late ``a`` the reverse. Only a
  pair slow on both sides is named (``slow_p2p_link``); a rank common to two slow pairs is the rank.

The rule for "well below/above its peers" (each rank against the median of the *other* ranks, so it
cannot pull its own reference): a relative gap of at least ``gap`` (25%: peers' median at most 75%
of a late rank's, or a slow pair at most 75% of the others'), *and* a robust z-score
``|x - median| / max(1.4826 * MAD, noise_floor * median)`` of at least ``k`` (3.5, Iglewicz and
Hoaglin's cut for the modified z-score). The median and MAD ignore up to half the ranks being odd,
where a mean and standard deviation are dragged by the very straggler they should expose; the gap
keeps a statistically clear but operationally meaningless difference (a 3% spread with a tiny MAD)
from naming anyone; the noise floor (5% of the median) keeps identical peers (MAD 0) from making any
difference infinite (the default gap already implies z >= 6.7 against that floor: the floor binds only
for a gap under k * noise_floor = 17.5%). A value counts only from ``min_samples`` (20) operations, a
key only with ``min_ranks`` (3) ranks or pairs, and a key where more than ``max_share`` (a third) of the ranks
stand out is a bimodal communicator (two nodes, two kinds of links), not one straggler: no one is
named from it. Ranks that disagree only by noise never pass both tests.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

from gna_sdk import plural

_COMM_ID = re.compile(r"0x[0-9a-f]{1,16}")
MAX_SUMMARIES = 65536  # a communicator of 64k ranks; beyond, the rest is ignored
MAX_OPS = 256


@dataclass(frozen=True)
class Rules:
    gap: float = 0.25
    k: float = 3.5
    noise_floor: float = 0.05
    min_samples: int = 20
    min_ranks: int = 3
    max_share: float = 1 / 3


DEFAULT_RULES = Rules()


@dataclass(frozen=True)
class _Op:
    kind: str
    op: str
    size_lo: int
    bucket: str
    peer: int | None
    n: int
    busbw: float


@dataclass
class _Rank:
    comm_id: str
    rank: int
    nranks: int | None
    nnodes: int | None
    hostname: str | None
    pid: int | None
    node: str | None
    job_prefix: str | None
    last_us: int
    ops: list[_Op]

    def where(self) -> dict[str, Any]:
        return {"rank": self.rank, "hostname": self.hostname, "pid": self.pid, "node": self.node}


def _int(v: Any, lo: int = 0, hi: int = 1 << 63) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi else None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and 0 <= f < 1e9 else None


def _text(v: Any, limit: int = 256) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _rank_of(s: Any) -> _Rank | None:
    """One per-(communicator, rank) summary as NCCLInspectorSummary's ``details.comms[]`` carries it,
    checked field by field: anything malformed is left out, never trusted."""
    if not isinstance(s, dict):
        return None
    comm_id, rank = s.get("comm_id"), _int(s.get("rank"), 0, 1 << 24)
    if not isinstance(comm_id, str) or not _COMM_ID.fullmatch(comm_id) or rank is None:
        return None
    ops = []
    raw_ops = s.get("ops")
    for o in raw_ops[:MAX_OPS] if isinstance(raw_ops, list) else []:
        if not isinstance(o, dict):
            continue
        kind, op, size_lo, n, bus = o.get("kind"), o.get("op"), _int(o.get("size_lo")), _int(o.get("n")), \
            _num(o.get("busbw_gbs"))
        peer = o.get("peer")
        if kind not in ("coll", "p2p") or not isinstance(op, str) or size_lo is None or n is None or bus is None:
            continue
        if kind == "p2p" and _int(peer, 0, 1 << 24) is None:
            continue
        ops.append(_Op(kind, op[:32], size_lo, _text(o.get("bucket"), 16) or str(size_lo),
                       peer if kind == "p2p" else None, n, bus))
    return _Rank(comm_id, rank, _int(s.get("nranks"), 1, 1 << 24), _int(s.get("nnodes"), 1, 1 << 24),
                 _text(s.get("hostname")), _int(s.get("pid"), 1, 1 << 22), _text(s.get("node")),
                 _text(s.get("job_prefix"), 18) or comm_id, _int(s.get("last_us")) or 0, ops)


def _by_comm(summaries: Any) -> dict[str, dict[int, _Rank]]:
    out: dict[str, dict[int, _Rank]] = {}
    for s in summaries[:MAX_SUMMARIES] if isinstance(summaries, list) else []:
        r = _rank_of(s)
        if r is None:
            continue
        ranks = out.setdefault(r.comm_id, {})
        old = ranks.get(r.rank)
        if old is None or r.last_us >= old.last_us:  # the newest summary of a rank stands
            ranks[r.rank] = r
    return out


@dataclass(frozen=True)
class _Outlier:
    key: Any
    value: float
    peers_median: float
    peers: int
    z: float


def _outliers(values: dict[Any, float], side: str, rules: Rules) -> list[_Outlier]:
    """Members of ``values`` far above (``side="high"``) or below (``"low"``) the others: both the relative
    gap and the robust z-score, against the median and MAD of the *other* members."""
    if len(values) < rules.min_ranks:
        return []
    hits = []
    for key, v in values.items():
        peers = [p for k2, p in values.items() if k2 != key]
        med = statistics.median(peers)
        if med <= 0 and side == "low":
            continue
        mad = statistics.median(abs(p - med) for p in peers)
        scale = max(1.4826 * mad, rules.noise_floor * med, 1e-9)
        if side == "high":
            ok = med <= (1 - rules.gap) * v and (v - med) / scale >= rules.k
        else:
            ok = v <= (1 - rules.gap) * med and (med - v) / scale >= rules.k
        if ok:
            hits.append(_Outlier(key, v, med, len(peers), abs(v - med) / scale))
    if len(hits) > rules.max_share * len(values):
        return []  # a third or more stand out: two populations, not one straggler
    return hits


def _late_arrivals(comm_id: str, ranks: dict[int, _Rank], rules: Rules) -> list[dict[str, Any]]:
    keys: dict[tuple[str, int, str], dict[int, float]] = {}
    samples: dict[tuple[tuple[str, int, str], int], int] = {}
    for r in ranks.values():
        for o in r.ops:
            if o.kind == "coll" and o.n >= rules.min_samples and o.busbw > 0:
                keys.setdefault((o.op, o.size_lo, o.bucket), {})[r.rank] = o.busbw
                samples[((o.op, o.size_lo, o.bucket), r.rank)] = o.n
    evidence: dict[int, list[dict[str, Any]]] = {}
    judged: dict[int, int] = {}
    for key, values in sorted(keys.items()):
        if len(values) < rules.min_ranks:
            continue
        for rank in values:
            judged[rank] = judged.get(rank, 0) + 1
        for hit in _outliers(values, "high", rules):
            evidence.setdefault(hit.key, []).append({
                "op": key[0], "bucket": key[2], "size_lo": key[1], "busbw_gbs": round(hit.value, 3),
                "peers_busbw_gbs": round(hit.peers_median, 3), "peers": hit.peers,
                "samples": samples[(key, hit.key)], "z": round(hit.z, 1),
                # its peers' kernels ran value/median times as long as its own: the share they spent waiting
                "peers_waiting_pct": round(100 * (1 - hit.peers_median / hit.value), 1)})
    out = []
    for rank, ev in sorted(evidence.items()):
        r = ranks[rank]
        worst = max(ev, key=lambda e: e["peers_waiting_pct"])
        out.append({
            "kind": "late_arrival", "comm_id": comm_id, "job_prefix": r.job_prefix, "rank": rank, "ranks": [rank],
            **r.where(), "evidence": ev, "keys_flagged": len(ev), "keys_judged": judged.get(rank, 0),
            "message": f"Rank {rank} of communicator {comm_id}"
                       + (f" ({r.hostname}:{r.pid})" if r.hostname else "")
                       + f" reaches its collectives last: its {worst['op']} ({worst['bucket']}) kernels are the "
                         f"shortest, its {plural(worst['peers'], 'peer')} "
                         f"{'spends' if worst['peers'] == 1 else 'spend'} about {worst['peers_waiting_pct']:g}% of "
                         f"theirs waiting for it."})
    return out


def _slow_links(comm_id: str, ranks: dict[int, _Rank], rules: Rules) -> list[dict[str, Any]]:
    # (bucket) -> {(src, dst): busbw} as the sender saw it, and as the receiver saw it
    sends: dict[tuple[int, str], dict[tuple[int, int], float]] = {}
    recvs: dict[tuple[int, str], dict[tuple[int, int], float]] = {}
    for r in ranks.values():
        for o in r.ops:
            if o.kind != "p2p" or o.peer is None or o.n < rules.min_samples or o.peer == r.rank:
                continue
            if o.op == "Send":
                sends.setdefault((o.size_lo, o.bucket), {})[(r.rank, o.peer)] = o.busbw
            elif o.op == "Recv":
                recvs.setdefault((o.size_lo, o.bucket), {})[(o.peer, r.rank)] = o.busbw
    pairs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for key in sorted(set(sends) & set(recvs)):
        s_low = {h.key: h for h in _outliers(sends[key], "low", rules)}
        r_low = {h.key: h for h in _outliers(recvs[key], "low", rules)}
        for pair in sorted(set(s_low) & set(r_low)):  # slow on both sides: the path, not an arrival
            s, rv = s_low[pair], r_low[pair]
            pairs.setdefault(pair, []).append({
                "bucket": key[1], "size_lo": key[0], "send_busbw_gbs": round(s.value, 3),
                "others_send_busbw_gbs": round(s.peers_median, 3), "recv_busbw_gbs": round(rv.value, 3),
                "others_recv_busbw_gbs": round(rv.peers_median, 3), "pairs": min(s.peers, rv.peers) + 1})
    endpoints: dict[int, list[tuple[int, int]]] = {}
    for pair in pairs:
        for rank in pair:
            endpoints.setdefault(rank, []).append(pair)
    out: list[dict[str, Any]] = []
    done: set[tuple[int, int]] = set()
    for rank, its in sorted(endpoints.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(its) < 2 or all(p in done for p in its):
            continue
        done.update(its)  # the endpoint common to several slow pairs: its NIC, link or GPU
        out.append(_link_finding(comm_id, ranks, rank, its, pairs, ranks.get(rank)))
    for pair in sorted(p for p in pairs if p not in done):
        out.append(_link_finding(comm_id, ranks, None, [pair], pairs, None))
    return out


def _link_finding(comm_id: str, ranks: dict[int, _Rank], rank: int | None, its: list[tuple[int, int]],
                  pairs: dict[tuple[int, int], list[dict[str, Any]]], r: _Rank | None) -> dict[str, Any]:
    involved = sorted({x for p in its for x in p})
    ev = [{"src": a, "dst": b, **e} for (a, b) in sorted(its) for e in pairs[(a, b)]]
    some = next((ranks[x] for x in involved if x in ranks), None)
    where = r.where() if r else {"rank": None, "hostname": None, "pid": None, "node": None}
    text = (f"Rank {rank} of communicator {comm_id} is the common end of {len(its)} slow point-to-point paths "
            f"({', '.join(f'{a}->{b}' for a, b in sorted(its))})" if rank is not None else
            f"The point-to-point path {its[0][0]}->{its[0][1]} of communicator {comm_id} is slow on both ends")
    first = ev[0]
    text += (f": {first['send_busbw_gbs']:g} GB/s sent and {first['recv_busbw_gbs']:g} GB/s received against the "
             f"other pairs' {first['others_send_busbw_gbs']:g}/{first['others_recv_busbw_gbs']:g} GB/s "
             f"({first['bucket']}).")
    return {"kind": "slow_p2p_link", "comm_id": comm_id, "job_prefix": some.job_prefix if some else comm_id,
            **where, "rank": rank, "ranks": involved, "evidence": ev, "message": text,
            "hosts": sorted({ranks[x].hostname or "?" for x in involved if x in ranks})}


def slow_ranks(summaries: list[dict[str, Any]], *, rules: Rules = DEFAULT_RULES) -> list[dict[str, Any]]:
    """The ranks of a communicator that hold their peers back, from their per-rank summaries
    (NCCLInspectorSummary ``details.comms[]`` entries, one per rank; several communicators are judged
    each on its own). Each finding: ``kind`` (``late_arrival`` or ``slow_p2p_link``), ``comm_id``,
    ``rank`` (None when a slow path cannot be pinned on one end), ``ranks``, ``hostname``/``pid``/``node``
    of the named rank, ``evidence`` (per key: its value, its peers' median, counts) and ``message``.
    Empty when the ranks differ only by noise, or when the numbers cannot tell (see the module doc)."""
    out: list[dict[str, Any]] = []
    for comm_id, ranks in sorted(_by_comm(summaries).items()):
        out += _late_arrivals(comm_id, ranks, rules)
        out += _slow_links(comm_id, ranks, rules)
    return out


def slow_communicators(summaries: list[dict[str, Any]], *, rules: Rules = DEFAULT_RULES) -> list[dict[str, Any]]:
    """Communicators slower than the others of the same shape (operation, size bucket, ranks, nodes): the
    one thing per-rank numbers show of a slow link or GPU inside a ring (every rank of it is slow alike).
    A communicator's value is the median of its ranks' medians. Typical use: the tensor-parallel groups of
    a job, one per node over NVLink, where a node with degraded NVLinks stands out. ``late_arrival_in_comm``
    says its own ranks arrived unevenly, which lowers its numbers without any slow link."""
    comms = _by_comm(summaries)
    shapes: dict[tuple[str, int, str, int | None, int | None], dict[str, float]] = {}
    counts: dict[tuple[Any, str], int] = {}
    for comm_id, ranks in comms.items():
        per_key: dict[tuple[str, int, str], list[float]] = {}
        shape = max(((r.nranks, r.nnodes) for r in ranks.values()), key=lambda t: (t[0] or 0, t[1] or 0))
        for r in ranks.values():
            for o in r.ops:
                if o.kind == "coll" and o.n >= rules.min_samples and o.busbw > 0:
                    per_key.setdefault((o.op, o.size_lo, o.bucket), []).append(o.busbw)
        for (op, lo, bucket), vals in per_key.items():
            key = (op, lo, bucket, shape[0], shape[1])
            shapes.setdefault(key, {})[comm_id] = statistics.median(vals)
            counts[(key, comm_id)] = len(vals)
    evidence: dict[str, list[dict[str, Any]]] = {}
    for key, values in sorted(shapes.items(), key=lambda kv: str(kv[0])):
        for hit in _outliers(values, "low", rules):
            evidence.setdefault(hit.key, []).append({
                "op": key[0], "bucket": key[2], "size_lo": key[1], "nranks": key[3], "nnodes": key[4],
                "busbw_gbs": round(hit.value, 3), "others_busbw_gbs": round(hit.peers_median, 3),
                "communicators": hit.peers + 1, "ranks_reporting": counts[(key, hit.key)], "z": round(hit.z, 1)})
    out = []
    for comm_id, ev in sorted(evidence.items()):
        ranks = comms[comm_id]
        some = next(iter(ranks.values()))
        hosts = sorted({r.hostname or "?" for r in ranks.values()})
        late = bool(_late_arrivals(comm_id, ranks, rules))
        first = ev[0]
        out.append({"kind": "slow_communicator", "comm_id": comm_id, "job_prefix": some.job_prefix, "hosts": hosts,
                    "nodes": sorted({r.node for r in ranks.values() if r.node}), "evidence": ev,
                    "late_arrival_in_comm": late,
                    "message": f"Communicator {comm_id} on {', '.join(hosts[:8])} runs {first['op']} "
                               f"({first['bucket']}) at {first['busbw_gbs']:g} GB/s where "
                               f"{first['communicators'] - 1} others of its shape reach {first['others_busbw_gbs']:g}"
                               + (" (its ranks also arrive unevenly)." if late else ".")})
    return out


def comm_summaries(messages: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The per-rank summaries of each communicator from NCCLInspectorSummary messages (the newest message
    per node and process), each with its ``node``: the input of :func:`slow_ranks` per communicator."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("type") != "NCCLInspectorSummary" or not isinstance(m.get("details"), dict):
            continue
        node, entity = m.get("node"), m.get("entity")
        if not isinstance(node, str) or not isinstance(entity, str):
            continue
        old = latest.get((node, entity))
        if old is None or str(m.get("time") or "") >= str(old.get("time") or ""):
            latest[(node, entity)] = m
    out: dict[str, list[dict[str, Any]]] = {}
    for (node, _entity), m in sorted(latest.items()):
        comms = m["details"].get("comms")
        for c in comms[:256] if isinstance(comms, list) else []:
            if isinstance(c, dict) and isinstance(c.get("comm_id"), str):
                out.setdefault(c["comm_id"], []).append({**c, "node": node})
    return out


def resolve_job(job_prefix: str, jobs: list[str]) -> str | None:
    """The job (``Init COMPLETE``'s ``commId``, NCCLJobMember ``details.job``) an Inspector communicator id
    belongs to: the Inspector prints at most 14 hex digits of the same hash (collectors/nccl_inspector.py
    ``comm_job``), so NCCL's id starts with it. None when no job or more than one matches."""
    if not isinstance(job_prefix, str) or not _COMM_ID.fullmatch(job_prefix):
        return None
    hits = {j for j in jobs if isinstance(j, str) and j.startswith(job_prefix)
            and (len(job_prefix) == 16 or j == job_prefix)}
    return hits.pop() if len(hits) == 1 else None
