"""Randomized fleets with training jobs and one injected fault, for the correlator's tests and bench.

Every node is a host-root tree (sim.host.SimHost: sysfs, /dev, /proc, a kernel log) and every rank
writes its own log, ``/var/log/nccl/<host>.<pid>.log`` (NCCL_DEBUG_FILE=%h.%p.log with the
trainer's stderr next to it), in the formats NCCL and PyTorch print (docs/formats.md: the
``NET/IB : Using`` line of net_ib.cc, ``Init COMPLETE`` of init.cc at 2.18 and 2.21+, PyTorch's
watchdog message with and without glog's prefix, net_ib.cc's completion error). Nothing here
knows how the agent parses them: the ground truth is what was injected.

Fault kinds (the culprit an expert names):

* ``ib_port_down``: one HCA port a rank of the job uses goes DOWN; every rank times out, peers log
  completion errors naming the culprit's address -> (node, ``ib:mlx5_k/1``, hca_port);
* ``ib_port_down_early``: the same before any watchdog fired -> named anyway;
* ``gpu_fell_off``: Xid 79 on one GPU of the job; its rank dies silently, the others time out
  -> (node, ``gpu:<pci>``, gpu);
* ``hung_rank``: one rank stops entering collectives with no hardware signal; every other rank
  times out; with PyTorch 2.4+ the hung rank may print only that it heard of the others' timeout,
  with its last enqueued work below theirs -> (node, ``rank:<r>``, rank);
* ``behind_rank``: one rank is stuck in an earlier collective; every rank times out, it at a lower
  SeqNum -> (node, ``rank:<r>``, rank);
* ``socket_node``: one node's ranks run NCCL over sockets while the job's others use IB
  -> (node, ``nccl:transport``, transport);
* ``healthy``: nothing -> no incident.

Noise on any node: Xid 13 (a warning) on a GPU, a DOWN port on the storage NIC no job uses, an
Xid 79 on an idle node no job runs on. A second job with no fault may share the fleet.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.host import SimHost

FAULTS = ("ib_port_down", "ib_port_down_early", "gpu_fell_off", "hung_rank", "behind_rank", "socket_node",
          "healthy")
GPUS = 8
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]  # SimHost.gpu_node's GPU buses, in minor order
INIT_FORMATS = {
    # src/init.cc, v2.18.6-1 L1375
    "2.18": "comm {ptr} rank {r} nranks {n} cudaDev {g} nvmlDev {g} busId {bus} commId {cid} - Init COMPLETE",
    # src/init.cc, v2.21.5-1 L1573 (the same through v2.30.7-1, "%s" = job->funcName)
    "2.21": "ncclCommInitRank comm {ptr} rank {r} nranks {n} cudaDev {g} nvmlDev {g} busId {bus} commId {cid} "
            "- Init COMPLETE",
}
# PyTorch's watchdog by release (docs/formats.md, "PyTorch PG status"; all seen in public logs): the default
# group's log prefix, the line with the group's progress when its watchdog fails, and whether a rank that
# had nothing in flight hears of another's timeout (HeartbeatMonitor's dump signal, 2.4+)
TORCH_FORMATS = {
    "2.3": ("[PG 0 Rank {r}] ", "Timeout at NCCL work: {at}, last enqueued NCCL work: {enq}, last completed NCCL "
            "work: {done}.", False),
    "2.4": ("[PG 0 (default_pg) Rank {r}] ", "Exception (either an error or timeout) detected by watchdog at work: "
            "{at}, last enqueued NCCL work: {enq}, last completed NCCL work: {done}.", True),
    "2.6": ("[PG ID 0 PG GUID 0(default_pg) Rank {r}] ", " failure detected by watchdog at work sequence id: {at} PG "
            "status: last enqueued work: {enq}, last completed work: {done}", True),
}
DUMP_SIGNAL = ("Received a dump signal due to a collective timeout from  rank {src} and we will try our best to dump "
               "the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {done}.This is most likely "
               "caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of "
               "collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. "
               "Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in "
               "the communications library (e.g. NCCL), etc. ")
TRAINER_LINES = ("Epoch {e} step {s} loss {l:.4f} lr 3.0e-04 grad_norm 1.02", "[train] step {s}/100000 {l:.3f} it/s",
                 "Saving checkpoint to /ckpt/step_{s}.pt", "  0%|          | {s}/100000 [00:{e:02d}<?, ?it/s]")


@dataclass
class Job:
    comm_id: str  # the world communicator's commId as NCCL prints it (0x%llx: no leading zeros)
    nodes: list[str]
    size: int  # ranks: GPUS per node
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = {n: i for i, n in enumerate(self.nodes)}

    def rank_of(self, node: str, gpu: int) -> int:
        return self._index[node] * GPUS + gpu


class _Later:
    """A node's host tree not written yet: what generate() does to the node, in order, replayed onto a
    fresh SimHost.gpu_node by build(). A node's tree is ~4 MiB of small files (4,096 nodes: ~17 GB), and
    the agents' checks read each node's tree alone, so a large fleet is written, read and removed a batch
    of nodes at a time (Scenario.messages)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def write(self, host_path: str, text: str) -> None:
        self._ops.append(("write", (host_path, text), {}))

    def set_port(self, hca: str, port: int = 1, **kw: Any) -> None:
        self._ops.append(("set_port", (hca, port), kw))

    def kmsg(self, message: str, **kw: Any) -> None:
        self._ops.append(("kmsg", (message,), kw))

    def build(self) -> SimHost:
        h = SimHost.gpu_node(self.root, gpus=GPUS, hcas=GPUS, storage_nic=True)
        for name, args, kw in self._ops:
            getattr(h, name)(*args, **kw)
        return h


@dataclass
class Scenario:
    seed: int
    fault: str
    roots: dict[str, Path]  # node -> its host root
    jobs: list[Job]
    expected: dict[str, dict[str, str] | None]  # job -> the culprit an expert names (None: no incident)
    noise: list[str] = field(default_factory=list)
    later: dict[str, _Later] = field(default_factory=dict)  # generate(lazy=True): trees not written yet

    async def messages(self, batch: int = 64) -> list[dict[str, Any]]:
        """What every node of the fleet would publish: its one-shot checks' conditions and events. A lazy
        scenario's trees are written ``batch`` nodes at a time, read, and removed."""
        from agent.check import check_roots

        if not self.later:
            return [m for r in await check_roots(list(self.roots.values())) for m in r["conditions"] + r["events"]]
        out: list[dict[str, Any]] = []
        names = list(self.later)
        for i in range(0, len(names), batch):
            part = [self.later[n] for n in names[i:i + batch]]
            try:
                for h in part:
                    h.build()
                out += [m for r in await check_roots([h.root for h in part]) for m in r["conditions"] + r["events"]]
            finally:
                for h in part:
                    shutil.rmtree(h.root, ignore_errors=True)
        return out

    def score(self, incidents: list[dict[str, Any]]) -> dict[str, int]:
        """tp: the expected culprit named; fp: a culprit named that is not the expected one (a victim
        or an innocent blamed, or one for a healthy job); fn: an expected culprit not named."""
        named = {(i["job"], i["culprit"]["node"], i["culprit"]["entity"], i["culprit"]["kind"])
                 for i in incidents if i.get("culprit")}
        want = {(job, c["node"], c["entity"], c["kind"]) for job, c in self.expected.items() if c}
        return {"tp": len(named & want), "fp": len(named - want), "fn": len(want - named)}


def _ip(node_index: int) -> str:
    return f"10.{node_index // 250}.{node_index % 250}.{10 + node_index % 200}"


def generate(workdir: Path, seed: int, *, nodes: int = 8, fault: str | None = None, job_nodes: int | None = None,
             second_job: bool | None = None, noise: bool = True, lazy: bool = False) -> Scenario:
    """A fleet of ``nodes`` under ``workdir`` (one tree per node, named for it). ``lazy``: the trees are
    written only while Scenario.messages reads them, a batch at a time (a fleet too large for the disk)."""
    rng = random.Random(seed)
    fault = fault or rng.choice(FAULTS)
    names = [f"gpu-{seed % 1000:03d}-{i:03d}" for i in range(nodes)]
    roots: dict[str, Path] = {}
    hosts: dict[str, _Later] = {}
    for name in names:
        h = _Later(workdir / name)
        h.write("/etc/hostname", f"{name}\n")
        h.write("/proc/sys/kernel/hostname", f"{name}\n")
        roots[name], hosts[name] = h.root, h
    order = names[:]
    rng.shuffle(order)
    k = job_nodes or rng.randint(1, max(1, nodes - 1 if nodes > 1 else 1))
    k = max(2, min(k, nodes)) if fault in ("socket_node",) and nodes >= 2 else min(k, nodes)
    jobs = [Job(f"0x{rng.getrandbits(64):x}", order[:k], k * GPUS)]
    rest = order[k:]
    if (second_job if second_job is not None else rng.random() < 0.5) and len(rest) >= 1:
        m = rng.randint(1, len(rest))
        jobs.append(Job(f"0x{rng.getrandbits(64):x}", rest[:m], m * GPUS))
        rest = rest[m:]
    idle = rest
    faulty = jobs[0]
    version = rng.choice(sorted(INIT_FORMATS))
    torch = rng.choice(sorted(TORCH_FORMATS))
    heard: set[tuple[str, int]] = set()  # ranks with nothing in flight that print the dump signal
    # what each rank will have written
    timed_out: set[tuple[str, int]] = set()  # (node, gpu) ranks whose watchdog fired
    silent: set[tuple[str, int]] = set()
    socket_node: str | None = None
    behind: set[tuple[str, int]] = set()  # ranks stuck in an earlier collective than the others
    completion_to: str | None = None
    expected: dict[str, dict[str, str] | None] = {j.comm_id: None for j in jobs}
    culprit = rng.choice(faulty.nodes)
    g = rng.randrange(GPUS)
    all_ranks = [(n, x) for n in faulty.nodes for x in range(GPUS)]
    if fault in ("ib_port_down", "ib_port_down_early"):
        hosts[culprit].set_port(f"mlx5_{g}", 1, state="1: DOWN", phys_state="3: Disabled")
        expected[faulty.comm_id] = {"node": culprit, "entity": f"ib:mlx5_{g}/1", "kind": "hca_port"}
        if fault == "ib_port_down":
            timed_out = set(all_ranks)
            completion_to = culprit
    elif fault == "gpu_fell_off":
        pci = f"0000:{BUSES[g]}:00"
        hosts[culprit].kmsg(f"NVRM: Xid (PCI:{pci}): 79, pid={40000 + g}, name=python, GPU has fallen off the bus.",
                            prio=3)
        uuid = f"GPU-{rng.getrandbits(32):08x}-0000-0000-0000-000000000000"
        hosts[culprit].kmsg(f"NVRM: GPU at PCI:{pci}: {uuid}", prio=3)
        hosts[culprit].kmsg("NVRM: GPU Board Serial Number: 1652823054321", prio=3)
        silent = {(culprit, g)}
        timed_out = set(all_ranks) - silent
        expected[faulty.comm_id] = {"node": culprit, "entity": f"gpu:{pci}.0", "kind": "gpu"}
    elif fault == "hung_rank":
        silent = {(culprit, g)}
        timed_out = set(all_ranks) - silent
        r = faulty.rank_of(culprit, g)
        expected[faulty.comm_id] = {"node": culprit, "entity": f"rank:{r}", "kind": "rank"}
        if TORCH_FORMATS[torch][2] and rng.random() < 0.5:
            heard = silent
    elif fault == "behind_rank":
        timed_out = set(all_ranks)
        behind = {(culprit, g)}
        r = faulty.rank_of(culprit, g)
        expected[faulty.comm_id] = {"node": culprit, "entity": f"rank:{r}", "kind": "rank"}
    elif fault == "socket_node" and len(faulty.nodes) >= 2:
        socket_node = culprit
        expected[faulty.comm_id] = {"node": culprit, "entity": "nccl:transport", "kind": "transport"}
    else:
        fault = "healthy"
    noise_done: list[str] = []
    if noise:
        for n in rng.sample(names, k=min(len(names), 2)):
            x = rng.randrange(GPUS)
            hosts[n].kmsg(f"NVRM: Xid (PCI:0000:{BUSES[x]}:00): 13, pid=1234, name=python, Graphics SM Warp "
                          "Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address", prio=4)
            noise_done.append(f"xid13:{n}")
        n = rng.choice(names)
        hosts[n].set_port(f"mlx5_{GPUS}", 1, state="1: DOWN", phys_state="3: Disabled")  # storage NIC, no job's
        noise_done.append(f"storage-nic-down:{n}")
        if idle:
            n = rng.choice(idle)
            hosts[n].kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.", prio=3)
            noise_done.append(f"xid79-idle:{n}")
    ip_of = {n: _ip(i) for i, n in enumerate(names)}
    glog = rng.random() < 0.5
    for job in jobs:
        for n in job.nodes:
            for x in range(GPUS):
                write_rank(hosts[n], rng, job, n, x, version, ip_of,
                           socket=(n == socket_node and job is faulty),
                           timeout=(n, x) in timed_out and job is faulty, behind=(n, x) in behind,
                           completion_peer=ip_of[completion_to] if completion_to and job is faulty
                           and n != completion_to and rng.random() < 0.5 else None,
                           glog=glog, torch=torch,
                           heard_from=faulty.rank_of(*rng.choice(sorted(timed_out)))
                           if (n, x) in heard and job is faulty and timed_out else None)
    if lazy:
        return Scenario(seed, fault, roots, jobs, expected, noise_done, later=hosts)
    for h in hosts.values():
        h.build()
    return Scenario(seed, fault, roots, jobs, expected, noise_done)


def watchdog_timeout(rank: int, seq: int, ran_ms: int) -> str:
    """PyTorch's ProcessGroupNCCL watchdog line for a collective that timed out (2.4+, as in public logs)."""
    return (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            f"NumelIn=262144000, NumelOut=262144000, Timeout(ms)=600000) ran for {ran_ms} milliseconds before "
            "timing out.")


def write_rank(h: SimHost | _Later, rng: random.Random, job: Job, node: str, gpu: int, version: str,
               ip_of: dict[str, str], *, socket: bool, timeout: bool, completion_peer: str | None, glog: bool,
               behind: bool = False, torch: str = "2.6", heard_from: int | None = None) -> None:
    pid = 40000 + gpu
    tid = pid + 17
    rank = job.rank_of(node, gpu)
    pre = f"{node}:{pid}:{tid} [{gpu}] NCCL INFO "
    lines = [TRAINER_LINES[0].format(e=0, s=0, l=rng.uniform(2, 9))]
    if socket:
        lines += [pre + f"NET/Socket : Using [0]eth0:{ip_of[node]}<0>", pre + "Using network Socket"]
    else:
        devs = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(GPUS))
        lines += [pre + f"NET/IB : Using {devs} ; OOB ib0:{ip_of[node]}<0>", pre + "Using network IB"]
    bus = f"{BUSES[gpu]}000"
    lines.append(pre + INIT_FORMATS[version].format(ptr=f"0x{rng.getrandbits(44):x}", r=rank, n=job.size, g=gpu,
                                                    bus=bus, cid=job.comm_id))
    if not socket and len(job.nodes) > 1:
        # src/transport/net.cc 2.18-2.30: "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s" -- the
        # rank's channels go through NCCL device <gpu> of its list, i.e. mlx5_<gpu> (rail-optimised)
        nxt, prv = (rank + GPUS) % job.size, (rank - GPUS) % job.size
        for c in (0, 1):
            lines += [pre + f"Channel {c:02d}/0 : {prv}[{gpu}] -> {rank}[{gpu}] [receive] via NET/IB/{gpu}/GDRDMA",
                      pre + f"Channel {c:02d}/0 : {rank}[{gpu}] -> {nxt}[{gpu}] [send] via NET/IB/{gpu}/GDRDMA"]
    for s in range(1, rng.randint(20, 60)):
        lines.append(rng.choice(TRAINER_LINES).format(e=s % 60, s=s * 10, l=rng.uniform(0.5, 3)))
    if completion_peer:
        lines.append(f"{node}:{pid}:{tid} [{gpu}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
                     f"peer {completion_peer}<{rng.randint(30000, 60000)}> with status=12 opcode=0 len=0 vendor "
                     f"err 129 (Recv) localGid ::ffff:{ip_of[node]} remoteGids::ffff:{completion_peer} hca mlx5_{gpu}")
    if timeout:
        seq = 4211 - 2 if behind else 4211
        # as in public logs of torch 2.4+ (c10 glog prefix, ProcessGroupNCCL.cpp line numbers vary)
        head = f"[rank{rank}]:[E1203 07:44:26.{rng.randint(10**8, 10**9 - 1)} {tid} ProcessGroupNCCL.cpp:655] " \
            if glog else ""
        lines.append(head + watchdog_timeout(rank, seq, 600000 + rng.randint(1, 900)))
        prefix, progress, _ = TORCH_FORMATS[torch]
        if glog:  # ProcessGroupNCCL.cpp's watchdog: logPrefix() + the group's progress
            lines.append(head.replace(":655]", ":2299]") + prefix.format(r=rank)
                         + progress.format(at=seq, enq=seq, done=seq - 1))
    elif heard_from is not None:
        # the hung rank: nothing in flight, so no timeout of its own; it hears of rank heard_from's
        head = f"[rank{rank}]:[E1203 07:44:27.{rng.randint(10**8, 10**9 - 1)} {tid} ProcessGroupNCCL.cpp:1987] " \
            if glog else ""
        done = 4211 - 1
        lines.append(head + TORCH_FORMATS[torch][0].format(r=rank) + DUMP_SIGNAL.format(src=heard_from, enq=done,
                                                                                         done=done))
    h.write(f"/var/log/nccl/{node}.{pid}.log", "\n".join(lines) + "\n")
