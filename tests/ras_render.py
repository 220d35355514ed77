"""What a NCCL RAS thread would print for a given job state: the format strings and the grouping/outlier logic of
NVIDIA/nccl src/ras/client_support.cc, re-expressed in Python for the corpus (tests/corpus/ras/) and round trips.

Generations (``gen``): 24 = 2.24.3-2.25.1 (one collective counter, "UNKNOWN", "The missing ranks: ..."),
26 = 2.26.2-2.28.3 (per-function counters, "NOCOMM", missing ranks with their identity, " (%.2fs)"),
28 = 2.28.7+ (" (%.3fs)"; JSON from here on; 2.28.7-2.28.9 JSON lacks a comma after a missing rank's nvml_dev).
Each function names the source function it follows. This renders; it does not run NCCL.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # ncclFuncStr, src/init.cc
ERR_WORDS = {1: "Unhandled CUDA error", 2: "System error", 3: "Internal error", 4: "Invalid argument",
             5: "Invalid usage", 6: "Remote process error", 7: "NCCL operation in progress"}
# rasACStatus bits and statusStr (2.24: index 0 is UNKNOWN, 2.26+: NOCOMM)
NOCOMM, INIT, RUNNING, FINALIZE, ABORT = 1, 2, 4, 8, 16
ERROR_STR = ["OK", "MISMATCH", "ERROR", "ERROR,MISMATCH", "INCOMPLETE", "INCOMPLETE,MISMATCH", "INCOMPLETE,ERROR",
             "INCOMPLETE,ERROR,MISMATCH"]
MISMATCH, ERROR, INCOMPLETE = 1, 2, 4


@dataclass
class Peer:
    host: str  # IP address of the process's RAS socket
    pid: int
    cuda: tuple[int, ...]
    nvml: tuple[int, ...] | None = None  # None: as cuda
    port: int = 40000  # orders peers of one host (rasPeers is sorted by address, port included)

    @property
    def nvml_devs(self) -> tuple[int, ...]:
        return self.cuda if self.nvml is None else self.nvml


@dataclass
class Rank:
    rank: int
    peer: int  # index into Job.peers
    cuda: int
    nvml: int | None = None
    init: int = 0
    async_err: int = 0
    finalize: bool = False
    destroy: bool = False
    abort: bool = False
    counts: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    nocomm: bool = False  # its process answered RAS but does not (or no longer) report this communicator

    @property
    def nvml_dev(self) -> int:
        return self.cuda if self.nvml is None else self.nvml

    @property
    def status(self) -> int:
        if self.abort:
            return ABORT
        if self.finalize or self.destroy:
            return FINALIZE
        return RUNNING if self.init == 0 else INIT


@dataclass
class Comm:
    hash: int
    ranks: list[Rank]  # all of them, 0..n-1
    host_hash: int = 0x1111
    pid_hash: int = 0x2222


@dataclass
class Job:
    peers: list[Peer]  # sorted by address (host, then port)
    comms: list[Comm]
    unresponsive: set[int] = field(default_factory=set)  # peers that did not answer this query (not yet dead)
    dead: set[int] = field(default_factory=set)
    timeouts: int = 0
    seconds: float = 0.0
    nccl: str = "2.26.6"
    cuda: str = "12.8"
    runtime: int = 0  # 0: as cuda says (cudaRuntimeGetVersion: 1000 * major + 10 * minor)
    driver: int = 0
    timestamp: str = "2026-03-01 12:00:00"

    def __post_init__(self) -> None:
        major, minor = (int(x) for x in self.cuda.split(".")[:2])
        self.runtime = self.runtime or 1000 * major + 10 * minor
        self.driver = self.driver or self.runtime


def _outlier(count: int, verbose: bool, total: int = -1) -> bool:
    """rasCountIsOutlier."""
    if count == 1:
        return True
    if verbose:
        return count < total * 0.5 if total != -1 else True
    return count <= 10 and (total == -1 or count <= total * 0.25)


def _ip_key(host: str) -> tuple[int, bytes]:
    a = ipaddress.ip_address(host)
    return (a.version, a.packed)


def _devs(cuda: tuple[int, ...], nvml: tuple[int, ...]) -> str:
    """rasGpuDevsToString."""
    s = ",".join(str(d) for d in sorted(cuda))
    if sorted(cuda) != sorted(nvml):
        s += " (NVML " + ",".join(str(d) for d in sorted(nvml)) + ")"
    return s


def _gpu(r: Rank) -> str:
    """rasGpuToString / rasCommRankGpuToString."""
    return f"{r.cuda}" + (f" (NVML {r.nvml_dev})" if r.nvml_dev != r.cuda else "")


def _ident(job: Job, r: Rank) -> str:
    p = job.peers[r.peer]
    return f"GPU {_gpu(r)} managed by process {p.pid} on node {p.host}"


def _process_line(p: Peer) -> str:
    return f"  Process {p.pid} on node {p.host} managing GPU{'s' if len(p.cuda) > 1 else ''} {_devs(p.cuda, p.nvml_devs)}\n"


def _responded(job: Job, r: Rank) -> bool:
    return r.peer not in job.unresponsive and r.peer not in job.dead


def _reporting(job: Job, c: Comm) -> list[Rank]:
    return [r for r in c.ranks if _responded(job, r) and not r.nocomm]


def _absent(job: Job, c: Comm) -> list[Rank]:
    return [r for r in c.ranks if not _responded(job, r) or r.nocomm]


def render_job_summary(job: Job, verbose: bool) -> str:
    """rasClientRunInit after the version lines."""
    peers = job.peers
    out = ["Job summary\n===========\n\n"]
    nodes: list[list[int]] = []
    for i, p in enumerate(peers):
        if nodes and peers[nodes[-1][0]].host == p.host:
            nodes[-1].append(i)
        else:
            nodes.append([i])
    total_gpus = sum(len(p.cuda) for p in peers)
    gpus_global = {len(p.cuda) for p in peers}
    gpus_node_ok = all(len({len(peers[i].cuda) for i in n}) == 1 for n in nodes)
    ppn = {len(n) for n in nodes}
    if gpus_node_ok and len(gpus_global) == 1 and len(ppn) == 1:
        out.append("  Nodes  Processes         GPUs  Processes     GPUs\n"
                   "(total)   per node  per process    (total)  (total)\n"
                   f"{len(nodes):7d}  {len(nodes[0]):9d}  {len(peers[0].cuda):11d}  {len(peers):9d}  {total_gpus:7d}\n")
        return "".join(out)
    # aux peers sorted by (processes on its node, host, pid): rasAuxPeersValueCompare
    value = {i: len(n) for n in nodes for i in n}
    aux = sorted(range(len(peers)), key=lambda i: (value[i], _ip_key(peers[i].host), peers[i].pid))
    vcs: list[list[int]] = []  # [value, count, firstIdx]
    i = 0
    while i < len(aux):
        v = value[aux[i]]
        if vcs and vcs[-1][0] == v:
            vcs[-1][1] += 1
        else:
            vcs.append([v, 1, i])
        i += v
    vcs.sort(key=lambda vc: (-vc[1], -vc[0]))
    if gpus_node_ok and len(gpus_global) == 1:
        out.append("  Nodes  Processes         GPUs\n          per node  per process\n")
        for v, n, _ in vcs:
            out.append(f"{n:7d}  {v:9d}  {len(peers[0].cuda):11d}\n")
    else:
        out.append("  Nodes  Processes\n          per node\n")
        for v, n, _ in vcs:
            out.append(f"{n:7d}  {v:9d}\n")
        gcount: dict[int, int] = {}
        for p in peers:
            gcount[len(p.cuda)] = gcount.get(len(p.cuda), 0) + 1
        out.append("\n         Processes         GPUs\n                    per process\n")
        for g, n in sorted(gcount.items(), key=lambda kv: (-kv[1], -kv[0])):
            out.append(f"         {n:9d}  {g:11d}\n")
    out.append("\n  Nodes  Processes         GPUs\n(total)    (total)      (total)\n"
               f"{len(nodes):7d}  {len(peers):9d}  {total_gpus:11d}\n")
    if gpus_node_ok and len(gpus_global) == 1:
        for v, n, first in vcs[1:]:
            if _outlier(n, verbose, len(nodes)):
                out.append(f"\nThe outlier node{'s' if n > 1 else ''}:\n")
                for idx in range(first, first + n * v, v):
                    pids = ",".join(str(peers[aux[j]].pid) for j in range(v))  # sic: aux[j], not aux[idx+j]
                    out.append(f"  Node {peers[aux[idx]].host} running process{'es' if v > 1 else ''} {pids}\n")
    return "".join(out)


@dataclass
class _Aux:
    comm: Comm
    status: int = 0
    errors: int = 0
    nodes: int = 0
    rpn_min: int = 0
    rpn_max: int = 0
    incomplete: int = 0  # nIncompleteRanks (2.26+)


def _aux(job: Job, c: Comm, gen: int) -> _Aux:
    a = _Aux(c)
    rep = _reporting(job, c)
    absent = _absent(job, c)
    peers_missing = bool(job.unresponsive) or bool(job.dead)
    if absent:
        if gen == 24:
            if peers_missing:
                a.errors |= INCOMPLETE
            else:
                a.errors |= MISMATCH
                a.status |= NOCOMM
        elif not peers_missing:
            a.errors |= MISMATCH
            a.status |= NOCOMM
        else:
            for r in absent:
                if _responded(job, r):
                    a.errors |= MISMATCH
                    a.status |= NOCOMM
                else:
                    a.errors |= INCOMPLETE
                    a.incomplete += 1
    by_peer = sorted(rep, key=lambda r: (r.peer, r.rank))
    per_node: dict[str, int] = {}
    for r in by_peer:
        per_node[job.peers[r.peer].host] = per_node.get(job.peers[r.peer].host, 0) + 1
        a.status |= r.status
        if r.init not in (0, 7) or r.async_err not in (0, 7):
            a.errors |= ERROR
    a.nodes = len(per_node)
    a.rpn_min = min(per_node.values()) if per_node else 64
    a.rpn_max = max(per_node.values()) if per_node else 0
    counts = {(sum(r.counts) if gen == 24 else r.counts) for r in by_peer}
    if len(counts) > 1:
        a.errors |= MISMATCH
    if bin(a.status).count("1") > 1:
        a.errors |= MISMATCH
    return a


def _top(status: int) -> int:
    return status.bit_length() - 1 if status else -1


def _status_word(bit_index: int, gen: int) -> str:
    return (["UNKNOWN" if gen == 24 else "NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT"])[bit_index]


def render_text(job: Job, *, gen: int, verbose: bool = False) -> str:
    """The whole text answer to [VERBOSE ]STATUS (rasClientRunInit + rasClientRunComms)."""
    out = [f"NCCL version {job.nccl} compiled with CUDA {job.cuda}\n",
           f"CUDA runtime version {job.runtime}, driver version {job.driver}\n\n",
           render_job_summary(job, verbose), "\nCommunicators..."]
    out.append(f" ({job.seconds:.2f}s)\n=============\n\n" if gen < 28 else f" ({job.seconds:.3f}s)\n=============\n\n")
    auxes = [_aux(job, c, gen) for c in job.comms]
    # rasAuxCommsCompareRev: size desc, nodes desc, top status desc, errors desc, reporting ranks asc
    auxes.sort(key=lambda a: (-len(a.comm.ranks), -a.nodes, -_top(a.status), -a.errors, len(_reporting(job, a.comm))))
    groups: list[list[_Aux]] = []
    for a in auxes:
        head = groups[-1][0] if groups else None
        if head and (len(head.comm.ranks), head.nodes, _top(head.status), head.errors) == (
                len(a.comm.ranks), a.nodes, _top(a.status), a.errors):
            groups[-1].append(a)
        else:
            groups.append([a])
    if gen == 24 or job.comms:
        out.append("Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
                   "    #  in group  per comm  per node  per comm  in group\n")
    if not job.comms:
        out.append("No communicator data collected!\n")
    for gi, g in enumerate(groups):
        lo = min(a.rpn_min for a in g)
        hi = max(a.rpn_max for a in g)
        rpn = f"{lo}" if lo == hi else f"{lo}-{hi}"
        gpus = {(r.peer, r.nvml_dev) for a in g for r in _reporting(job, a.comm)}
        out.append(f"{gi:5d}  {len(g):8d}  {g[0].nodes:8d}  {rpn:>8s}  {len(g[0].comm.ranks):8d}  {len(gpus):8d}  "
                   f"{_status_word(_top(g[0].status), gen):>8s}  {ERROR_STR[g[0].errors]:>6s}\n")
    out.append("\nErrors\n======\n\n")
    missing_peers = sorted(job.unresponsive - job.dead)
    if missing_peers:
        n = len(missing_peers)
        out.append(f"INCOMPLETE\n  Missing communicator data from {n} job process{'es' if n > 1 else ''}\n")
        if _outlier(n, verbose):
            for i in sorted(missing_peers, key=lambda i: (_ip_key(job.peers[i].host), job.peers[i].pid)):
                out.append(_process_line(job.peers[i]))
        out.append("\n")
    if job.dead:
        n = len(job.dead)
        out.append(f"DEAD\n  {n} job process{'es are' if n > 1 else ' is'} considered dead (unreachable via the RAS"
                   " network)\n")
        if _outlier(n, verbose):
            for i in sorted(job.dead, key=lambda i: (_ip_key(job.peers[i].host), job.peers[i].pid)):
                out.append(_process_line(job.peers[i]))
        out.append("\n")
    for gi, g in enumerate(groups):
        for ci, a in enumerate(g):
            c = a.comm
            label = f"#{gi}-{ci} ({c.hash:016x})"
            if a.errors & INCOMPLETE:
                absent = _absent(job, c)
                if gen == 24:
                    n = len(absent)
                    out.append(f"{label} INCOMPLETE\n  Missing communicator data from {n} rank{'s' if n > 1 else ''}\n")
                    if _outlier(n, verbose):
                        ranks = ",".join(str(r.rank) for r in absent)[:1023]
                        out.append(f"  The missing rank{'s' if n > 1 else ''}: {ranks}\n")
                else:
                    n = a.incomplete
                    out.append(f"{label} INCOMPLETE\n  Missing communicator data from {n} rank{'s' if n > 1 else ''}\n")
                    if _outlier(n, verbose):
                        for r in absent:
                            if not _responded(job, r):
                                out.append(f"  Rank {r.rank} -- {_ident(job, r)}\n")
                out.append("\n")
            if a.errors & ERROR:
                out.append(f"{label} ERROR\n")
                rep = _reporting(job, c)
                for kind, attr in (("Initialization", "init"), ("Asynchronous", "async_err")):
                    errs = [r for r in rep if getattr(r, attr) not in (0, 7)]
                    if errs:
                        n = len(errs)
                        s = "s" if n > 1 else ""
                        out.append(f"  {kind} error{s} on {n} rank{s}\n")
                        out.append(_break_down(job, rep, attr, verbose))
                out.append("\n")
    out.append("Warnings\n========\n\n")
    if job.timeouts:
        t = job.timeouts
        out.append(f"TIMEOUT\n  Encountered {t} communication timeout{'s' if t > 1 else ''} while gathering communicator"
                   " data\n\n")
    for gi, g in enumerate(groups):
        for ci, a in enumerate(g):
            if a.errors & MISMATCH:
                out.append(_mismatch(job, a, f"#{gi}-{ci} ({a.comm.hash:016x})", gen, verbose))
    return "".join(out)


def _break_down(job: Job, rep: list[Rank], attr: str, verbose: bool) -> str:
    """rasClientBreakDownErrors: the most frequent error first; codes 1-6 only (ncclTimeout never listed)."""
    out = []
    counts = {code: sum(1 for r in rep if getattr(r, attr) == code) for code in range(1, 7)}
    while True:
        best, n = 0, 0
        for code in range(1, 7):
            if n < counts[code]:
                best, n = code, counts[code]
        if best == 0:
            break
        if n > 1:
            out.append(f"  {n} ranks reported {ERR_WORDS[best]}\n")
        if _outlier(n, verbose):
            for r in rep:
                if getattr(r, attr) == best:
                    if n > 1:
                        out.append(f"  Rank {r.rank} -- {_ident(job, r)}\n")
                    else:
                        out.append(f"  Rank {r.rank} reported {ERR_WORDS[best]} -- {_ident(job, r)}\n")
        counts[best] = 0
    return "".join(out)


def _mismatch(job: Job, a: _Aux, label: str, gen: int, verbose: bool) -> str:
    c = a.comm
    n_total = len(c.ranks)
    rep = _reporting(job, c)
    out = [f"{label} MISMATCH\n"]
    if bin(a.status).count("1") > 1:
        out.append("  Communicator ranks have different status\n")
        vals: list[tuple[int, list[Rank] | None]] = []  # (bit index, ranks or None for the fake entry)
        for bit in sorted({r.status for r in rep}):
            vals.append((bit.bit_length() - 1, sorted((r for r in rep if r.status == bit), key=lambda r: r.rank)))
        absent = _absent(job, c)
        fake = [r for r in absent if _responded(job, r)] if gen > 24 else absent
        if fake:
            vals.append((0, None))
        counted = [(v, rs, len(rs) if rs is not None else len(fake)) for v, rs in vals]
        counted.sort(key=lambda t: (-t[2], -t[0]))
        for v, rs, n in counted:
            word = _status_word(v, gen)
            if n > 1:
                out.append(f"  {n} ranks have status {word}\n")
            if not _outlier(n, verbose, n_total):
                continue
            if rs is not None:
                for r in rs:
                    out.append(f"  Rank {r.rank} -- {_ident(job, r)}\n" if n > 1 else
                               f"  Rank {r.rank} has status {word} -- {_ident(job, r)}\n")
            elif gen == 24:
                ranks = ",".join(str(r.rank) for r in fake)[:1023]
                out.append(f"  The unknown ranks: {ranks}\n" if n > 1 else f"  Rank {ranks} has status {word}\n")
            else:
                for r in fake:
                    out.append(f"  Rank {r.rank} -- {_ident(job, r)}\n" if n > 1 else
                               f"  Rank {r.rank} has status {word} -- {_ident(job, r)}\n")
    funcs: list[tuple[str, int | None]] = [("collective", None)] if gen == 24 else [(f, i) for i, f in enumerate(FUNCS)]
    for name, idx in funcs:
        def value(r: Rank, idx: int | None = idx) -> int:
            return sum(r.counts) if idx is None else r.counts[idx]
        if len({value(r) for r in rep}) <= 1:
            continue
        out.append(f"  Communicator ranks have different {name} operation counts\n")
        groups = sorted({value(r) for r in rep})
        counted2 = [(v, sorted((r for r in rep if value(r) == v), key=lambda r: r.rank)) for v in groups]
        counted2.sort(key=lambda t: (-len(t[1]), -t[0]))
        for v, rs in counted2:
            n = len(rs)
            if n > 1:
                out.append(f"  {n} ranks have launched up to operation {v}\n" if v > 0 or gen == 24 else
                           f"  {n} ranks have not launched any operations\n")
            if not _outlier(n, verbose, n_total):
                continue
            for r in rs:
                if n > 1:
                    out.append(f"  Rank {r.rank} -- {_ident(job, r)}\n")
                elif v > 0 or gen == 24:
                    out.append(f"  Rank {r.rank} has launched up to operation {v} -- {_ident(job, r)}\n")
                else:
                    out.append(f"  Rank {r.rank} has not launched any operations -- {_ident(job, r)}\n")
        if gen > 24:
            out.append("\n")
    if gen == 24:
        out.append("\n")
    return "".join(out)


def render_json(job: Job, *, comma_bug: bool | None = None) -> str:
    """rasDumpCommsToJSON with jsonWriteHeader/StartCommunicator/WriteRankData/WriteMissingRank/WriteFooter.
    ``comma_bug`` (default: when job.nccl is 2.28.x) drops the comma after a missing rank's nvml_dev."""
    if comma_bug is None:
        comma_bug = job.nccl.startswith("2.28.")
    o = ["{\n", f'  "nccl_version": "{job.nccl}",\n', f'  "cuda_runtime_version": {job.runtime},\n',
         f'  "cuda_driver_version": {job.driver},\n', f'  "timestamp": "{job.timestamp}",\n',
         f'  "communicators_count": {len(job.comms)},\n', '  "communicators": [\n']
    for ci, c in enumerate(job.comms):
        rep = _reporting(job, c)
        absent = _absent(job, c)
        if ci:
            o.append(",\n")
        o += ["    {\n", f'      "hash": "0x{c.hash:x}",\n',
              f'      "secondary_hash": "0x{c.host_hash:x}:0x{c.pid_hash:x}",\n', f'      "size": {len(c.ranks)},\n',
              f'      "ranks_count": {len(rep)},\n', f'      "missing_ranks_count": {len(absent)},\n',
              '      "ranks": [\n']
        for ri, r in enumerate(rep):
            p = job.peers[r.peer]
            if ri:
                o.append(",\n")
            o += ["        {\n", f'          "rank": {r.rank},\n', f'          "host": "{p.host}",\n',
                  f'          "pid": {p.pid},\n', f'          "cuda_dev": {r.cuda},\n',
                  f'          "nvml_dev": {r.nvml_dev},\n', '          "status": {\n',
                  f'            "init_state": {r.init},\n', f'            "async_error": {r.async_err},\n',
                  f'            "finalize_called": {str(r.finalize).lower()},\n',
                  f'            "destroy_flag": {str(r.destroy).lower()},\n',
                  f'            "abort_flag": {str(r.abort).lower()}\n', "          },\n",
                  '          "collective_counts": {\n']
            for fi, f in enumerate(FUNCS):
                o.append(f'            "{f}": {r.counts[fi]}' + ("," if fi < len(FUNCS) - 1 else "") + "\n")
            o += ["          }\n", "        }"]
        o += ["\n      ],\n", '      "missing_ranks": [\n']
        for mi, r in enumerate(absent):
            p = job.peers[r.peer]
            if mi:
                o.append(",\n")
            o += ["        {\n", f'          "rank": {r.rank},\n', f'          "host": "{p.host}",\n',
                  f'          "pid": {p.pid},\n', f'          "cuda_dev": {r.cuda},\n',
                  f'          "nvml_dev": {r.nvml_dev}' + ("\n" if comma_bug else ",\n"), '          "status": {\n',
                  f'            "unresponsive": {str(not _responded(job, r)).lower()},\n',
                  f'            "considered_dead": {str(r.peer in job.dead).lower()}\n', "          }\n", "        }"]
        o += ["\n      ]\n", "    }"]
    o += ["\n  ],\n", '  "ras": {\n', f'    "collection_time_sec": {job.seconds:.3f},\n',
          f'    "timeouts_count": {job.timeouts}\n', "  }\n", "}\n"]
    return "".join(o)


def hgx_job(nodes: int, *, gpus: int = 8, base: str = "10.0.0.", pid0: int = 4000) -> list[Peer]:
    """One process per GPU, ``gpus`` per node: the usual torchrun layout."""
    return [Peer(f"{base}{10 + n}", pid0 + 100 * n + g, (g,), port=40000 + g) for n in range(nodes) for g in range(gpus)]


def world(peers: list[Peer], comm_hash: int, **rank_kw: object) -> Comm:
    """A communicator with a rank per process, rank i on peer i."""
    return Comm(comm_hash, [Rank(i, i, p.cuda[0], **rank_kw) for i, p in enumerate(peers)])  # type: ignore[arg-type]
