"""Naive blame: what a careful operator's script names from the nodes' messages, without the fleet correlator.

The baseline bench/correlator.py measures the correlator against (issue 27). It reads only what the messages say
(gna_types/: the message vocabulary; the log lines they quote, in PyTorch's and NCCL's public formats) and never
imports fleet/. Per job (an NCCL message's ``details.job``, the world communicator's commId):

1. **Only a symptomatic job is filed**: one with a watchdog timeout (``NCCLCollectiveTimeout``, or a process group's
   progress when its watchdog fired, ``NCCLWatchdogProgress``), an NCCL error (``NCCLIBCompletionError``,
   ``NCCLBackendError``, ``NCCLSocketError``, a critical ``NCCLIBAsyncEvent``) or a crash (``TorchRankFailed``:
   torchrun's / srun's / mpirun's report of a worker that died). A job whose logs show none of these is not
   looked at, whatever its nodes report (an operator's script runs because a job failed).
2. **Only resources the job listed**: its members' GPUs (the ``pci`` of each of its processes, NCCL's busId from
   ``Init COMPLETE``) and the NICs its NCCL said it uses (``hcas``: the ``NET/IB : Using`` list; ``nics``: the
   channels' ``NET/IB/<n>``), per node. A critical finding on one of those (a ``gpu:<pci>`` or ``ib:<hca>/<port>``
   entity on that node, or NCCL's own fatal async event on a listed port) names that resource, kind ``gpu`` or
   ``hca_port``; the job's own NCCL saying a node's ranks run on sockets (a critical ``NCCLSocketFallback``) names
   that node's transport. Noise elsewhere (an idle node, a storage NIC no job listed, a warning-level Xid)
   is not looked at.
3. **A rank, from the watchdog's own words**, when no such finding exists:

   * a crash: a rank whose process died on its own -- torchrun/srun/mpirun report it (SIGKILL, an OOM kill, a
     non-zero exit) and it logged no NCCL error or watchdog timeout first (those are victims of someone else's
     failure, as are SIGABRT after the watchdog's teardown and SIGTERM from the launcher); the earliest such;
   * else the ranks whose last completed SeqNum is lowest, where the ranks' progress lines disagree (PyTorch's
     ``last completed NCCL work: N`` / ``last completed work: N``; a rank that timed out at SeqNum S without a
     progress line completed S-1);
   * else the ranks that never reported a watchdog timeout of their own while the others did (a rank that only
     heard of another's timeout -- PyTorch's "Received a dump signal" -- did not time out itself).

   A rank's node is where its ``NCCLJobMember`` (its NCCL ``Init COMPLETE`` line) was read.

Numbers are parsed from the quoted line first (``details.line``: PyTorch's ProcessGroupNCCL watchdog, as public
logs print it), the message's typed fields (gna_types/details.py) only where the line is not quoted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

TIMEOUT_TYPES = frozenset({"NCCLCollectiveTimeout", "NCCLWatchdogProgress"})
ERROR_TYPES = frozenset({"NCCLIBCompletionError", "NCCLBackendError", "NCCLSocketError", "NCCLIBAsyncEvent"})
CRASH_TYPES = frozenset({"TorchRankFailed"})
# a process that failed because another did: the watchdog's teardown (SIGABRT) or the launcher's (SIGTERM)
VICTIM_SIGNALS = frozenset({"SIGABRT", "SIGTERM", "Aborted", "Terminated"})
VICTIM_EXITCODES = frozenset({-6, -15})

# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, as public logs of torch 2.3 .. 2.7 print it
_WATCHDOG = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(-?\d+)")
_COMPLETED = re.compile(r"last completed (?:NCCL )?work: (-?\d+)", re.IGNORECASE)
_AT_WORK = re.compile(r"(?:Timeout at NCCL work|detected by watchdog at work(?: sequence id)?): (-?\d+)")
_DUMP_SIGNAL = re.compile(r"Received a dump signal due to a collective timeout from\s+rank (-?\d+)")
_C10_RANK = re.compile(r"^\[rank(\d+)\]:")
_NOT_DEFAULT_PG = re.compile(r"\[PG (?:ID )?([1-9]\d*)[ \]]")  # a subgroup's progress: not the world's


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _details(m: dict[str, Any]) -> dict[str, Any]:
    d = m.get("details")
    return d if isinstance(d, dict) else {}


def _when(m: dict[str, Any]) -> str:
    d = _details(m)
    return str(d.get("logged_at") or d.get("failed_at") or m.get("time") or "")


def _rank(m: dict[str, Any], line: str) -> int | None:
    """The world rank of the process that wrote the line: its NCCL world communicator's rank (the same process's
    Init COMPLETE), else c10's ``[rankN]:`` prefix (torchrun's RANK), else the report's own rank."""
    d = _details(m)
    r = _int(d.get("world_rank"))
    if r is not None:
        return r
    c = _C10_RANK.match(line)
    if c:
        return int(c.group(1))
    return _int(d.get("rank"))


def _port_of(entity: str) -> tuple[str, str | None] | None:
    if not entity.startswith("ib:"):
        return None
    hca, _, port = entity[3:].partition("/")
    return (hca, port or None) if hca else None


def _nic_listed(entity: str, listed: set[str]) -> bool:
    p = _port_of(entity)
    if p is None:
        return False
    hca, port = p
    if port is not None:
        return f"{hca}/{port}" in listed
    return any(x.partition("/")[0] == hca for x in listed)


def naive_blame(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One incident per symptomatic job: ``{"job", "culprit", "culprits", "reason"}``, a culprit being
    ``{"node", "entity", "kind"}`` (``culprit`` the first of ``culprits``, None when nothing could be named)."""
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in messages:
        if m.get("collector") != "nccl_logs":
            continue
        job = _details(m).get("job")
        if isinstance(job, str) and job:
            by_job[job].append(m)
    hardware: dict[str, list[dict[str, Any]]] = defaultdict(list)  # node -> its critical gpu:/ib: findings
    for m in messages:
        ent = str(m.get("entity") or "")
        if m.get("severity") == "critical" and m.get("status") != "resolved" and ent.startswith(("gpu:", "ib:")):
            hardware[str(m.get("node"))].append(m)
    incidents = []
    for job, msgs in sorted(by_job.items()):
        symptoms = [m for m in msgs if m.get("type") in TIMEOUT_TYPES | CRASH_TYPES
                    or (m.get("type") in ERROR_TYPES
                        and (m.get("type") != "NCCLIBAsyncEvent" or m.get("severity") == "critical"))]
        if not symptoms:
            continue
        culprits, why = _blame(msgs, hardware)
        incidents.append({"job": job, "culprit": culprits[0] if culprits else None, "culprits": culprits,
                          "reason": why, "symptoms": len(symptoms)})
    return incidents


def _blame(msgs: list[dict[str, Any]], hardware: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, str]], str]:
    # the job's resources, per node, as its own processes listed them
    gpus: dict[str, set[str]] = defaultdict(set)
    nics: dict[str, set[str]] = defaultdict(set)
    rank_node: dict[int, str] = {}
    world_size = 0
    for m in msgs:
        d = _details(m)
        node = str(m.get("node"))
        if isinstance(d.get("pci"), str) and d["pci"]:
            gpus[node].add(d["pci"].lower())
        for key in ("hcas", "nics"):
            for x in d.get(key) or ():
                if isinstance(x, str):
                    nics[node].add(x)
        if m.get("type") == "NCCLJobMember":
            r = _int(d.get("world_rank"))
            if r is not None:
                rank_node.setdefault(r, node)
            world_size = max(world_size, _int(d.get("world_size")) or 0)

    # 2. a critical finding on a resource the job listed (earliest first)
    found: list[tuple[str, dict[str, str]]] = []
    for node in sorted(set(gpus) | set(nics)):
        for h in hardware.get(node, ()):
            ent = str(h.get("entity"))
            if ent.startswith("gpu:") and ent[4:] in gpus[node]:
                found.append((_when(h), {"node": node, "entity": ent, "kind": "gpu"}))
            elif _nic_listed(ent, nics[node]):
                found.append((_when(h), {"node": node, "entity": ent, "kind": "hca_port"}))
    for m in msgs:
        d = _details(m)
        node = str(m.get("node"))
        if m.get("type") == "NCCLIBAsyncEvent" and m.get("severity") == "critical" and d.get("hca"):
            ent = f"ib:{d['hca']}/{d['port']}" if d.get("port") is not None else f"ib:{d['hca']}"
            if _nic_listed(ent, nics[node]):
                found.append((_when(m), {"node": node, "entity": ent, "kind": "hca_port"}))
        elif m.get("type") == "NCCLSocketFallback" and m.get("severity") == "critical":
            found.append((_when(m), {"node": node, "entity": "nccl:transport", "kind": "transport"}))
    if found:
        return _unique(c for _, c in sorted(found, key=lambda x: x[0])), "a critical finding on a resource it listed"

    # 3. ranks, from the watchdog's and the launchers' words
    timed_out: dict[int, int] = {}  # rank -> the SeqNum its own watchdog timed out on
    completed: dict[int, int] = {}  # rank -> its last completed SeqNum, as its progress line said
    victims: set[int] = set()
    failures: list[tuple[str, int, str]] = []  # (when, rank, node) of launchers' failure reports
    for m in msgs:
        d = _details(m)
        line = str(d.get("line") or "")
        typ = m.get("type")
        if typ in ("NCCLCollectiveTimeout", "NCCLWatchdogProgress") and _NOT_DEFAULT_PG.search(line):
            continue  # a subgroup's SeqNums do not compare with the world's
        r = _rank(m, line)
        if r is None:
            continue
        if typ == "NCCLCollectiveTimeout":
            w = _WATCHDOG.search(line)
            seq = int(w.group(2)) if w else _int(d.get("seq_num"))
            if seq is not None:
                timed_out[r] = min(seq, timed_out.get(r, seq))
            victims.add(r)
        elif typ == "NCCLWatchdogProgress":
            c = _COMPLETED.search(line)
            done = int(c.group(1)) if c else _int(d.get("last_completed"))
            if done is not None:
                completed[r] = min(done, completed.get(r, done))
            at = _AT_WORK.search(line)
            if (at or _int(d.get("at_seq")) is not None) and not _DUMP_SIGNAL.search(line):
                victims.add(r)  # its own watchdog fired
                if at and r not in timed_out:
                    timed_out[r] = int(at.group(1))
        elif typ in ERROR_TYPES:
            victims.add(r)  # NCCL failed under it: a peer's process or the network
        elif typ == "TorchRankFailed":
            sig, code = str(d.get("signal") or ""), _int(d.get("exitcode"))
            if sig in VICTIM_SIGNALS or code in VICTIM_EXITCODES:
                victims.add(r)
            else:
                failures.append((_when(m), r, rank_node.get(r, str(m.get("node")))))
    own = sorted((f for f in failures if f[1] not in victims), key=lambda f: f[0])
    if own:
        first = own[0][0]
        return _ranks([(r, n) for w, r, n in own if w == first]), "a rank died on its own before NCCL failed elsewhere"
    for r, seq in timed_out.items():
        completed.setdefault(r, seq - 1)
    if len(set(completed.values())) > 1:
        low = min(completed.values())
        behind = [(r, rank_node[r]) for r, c in completed.items() if c == low and r in rank_node]
        if behind:
            return _ranks(behind), "the rank(s) whose last completed SeqNum is lowest"
    if timed_out:
        everyone = set(rank_node) | set(range(world_size))
        silent = sorted(everyone - set(timed_out))
        placed = [(r, rank_node[r]) for r in silent if r in rank_node]
        if placed and len(silent) < len(timed_out):
            return _ranks(placed), "the rank(s) that never reported a watchdog timeout while the others did"
    return [], "symptoms, and nothing the messages name"


def _unique(cs: Any) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for c in cs:
        if c not in out:
            out.append(c)
    return out


def _ranks(rs: list[tuple[int, str]]) -> list[dict[str, str]]:
    """One culprit per node: ``rank:<r>``, or ``ranks:<r>,<r>`` for several on one node."""
    per: dict[str, list[int]] = defaultdict(list)
    for r, node in rs:
        if r not in per[node]:
            per[node].append(r)
    return [{"node": node, "entity": f"rank:{rr[0]}" if len(rr) == 1 else "ranks:" + ",".join(map(str, sorted(rr))),
             "kind": "rank"} for node, rr in sorted(per.items(), key=lambda kv: min(kv[1]))]
