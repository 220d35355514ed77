"""Multi-node training-job failure snapshots, in the log layouts real clusters use.

    .venv/bin/python tests/layouts/generate.py --layout shared-fs --fault hang --nodes 4 --seed 7 OUTDIR

writes, for one seeded scenario:

* ``OUTDIR/roots/<node>/``: one host root per node, laid out like the node's own ``/`` (``etc/hostname``,
  ``var/log/kern.log``, ``sys/class/infiniband/...``, and the job's logs wherever the layout puts them);
* ``OUTDIR/config.toml``: what an operator writes after reading docs/operations.md ("Training logs: where the
  agent reads them") and docs/correlator.md ("Offline"): the kernel log capture's path, the log globs;
* ``OUTDIR/expected.json``: ``{"culprit_node", "culprit_entity_kind", "healthy", ...}``.

Independent of the product: written from the formats' own sources, never from the code under test
(collectors/, fleet/, sim/). The same (layout, fault, nodes, gpus_per_node, seed) gives the same bytes.

Layouts (``LAYOUTS``):

* ``node-local``: the control. NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log on each node, torchrun's console
  (stdout+stderr of its 8 workers) tee'd to /var/log/training/<job>-<host>.log on each node.
* ``shared-fs``: ``srun --ntasks-per-node=8 --output=/home/<user>/logs/%x-%t.out python train.py``: one file
  per rank (task), /home on NFS, so EVERY node's snapshot holds EVERY rank's file (and the batch script's
  slurm-<id>.out from the NFS submit directory).
* ``slurm-job`` / ``slurm-job-label``: ``srun --ntasks-per-node=1 [--label] torchrun ...`` in an sbatch script:
  the job's one output file, slurm-<id>.out, holds every node's torchrun output as srun forwards it, and it
  exists only on the batch host (the job's first node): in slurmd's spool or a node-local submit directory.
* ``pods-split``: a Kubeflow PyTorchJob, one pod per node; each node holds only its own pods' CRI logs
  under /var/log/pods/<ns>_<pod>_<uid>/pytorch/0.log (plus unrelated system pods).
* ``pods-launcher``: an MPIJob (mpi-operator v2): the launcher pod (on one node) runs mpirun, whose console
  carries every rank's stdout/stderr; the worker pods' own logs hold only sshd's lines.

Faults (``FAULTS``): ``hang`` (one rank stops entering collectives: every other rank's watchdog times out, it
does not), ``crash`` (one rank's process dies: host/cgroup OOM kill, or a CUDA error), ``ib-port-down`` (one
node's HCA port DOWN in sysfs + NCCL's IB WARNs), ``xid79`` (one node's GPU fell off the bus: kernel log),
``healthy`` (no incident).

Formats, each rendered from its source (repository, path, tag); line numbers in ``file.cc:NNN`` prefixes are
those of the cited tag or, for PyTorch, of public logs of that release:

* NCCL (NVIDIA/nccl, v2.21.5-1 for the torch 2.5.1 profile, v2.26.2-1 for torch 2.7.1):
  src/debug.cc ``ncclDebugLog`` (``"%s:%d:%d "`` host:pid:tid, ``"[%d] NCCL INFO "``,
  ``"[%d] %s:%d NCCL WARN "`` after a leading ``"\\n"``; 2.26.2 adds the WARN-only ``"[%F %T] "`` stamp;
  the hostname is cut at the first '.'; NCCL_DEBUG_FILE's %h/%p expansion);
  src/init.cc (``showVersion`` printf of ``"NCCL version 2.21.5+cuda12.4"``; ``"ncclCommInitRank comm %p rank %d
  nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init START|COMPLETE"`` 2.21.5 L1544/L1573, 2.26.2
  ``"%s comm %p ..."`` L1401/L1429; ``"comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL
  %d"``; ``"Trees%s"``; ``"P2P Chunksize set to %d"``; ``"%d coll channels, ..."``; ``"Connected all rings"``
  (2.26.2: ``", use ring PXN %d GDR %d"``); ``"comm %p rank %d nranks %d cudaDev %d busId %lx - Abort
  COMPLETE"``); src/graph/rings.cc ``dumpLine``; src/bootstrap.cc ``"Bootstrap : Using%s"``;
  src/misc/socket.cc ``"NCCL_SOCKET_IFNAME set by environment to %s"``, ``ncclSocketToString`` (``"%s<%s>"``),
  ``"socketProgress: Connection closed by remote peer %s"`` (2.21.5 L50, 2.26.2 L71, host name form);
  src/net.cc (2.21.5) / src/plugin/plugin_open.cc (2.26.2) plugin lines; src/transport/net_ib.cc
  ``"NET/IB : Using%s %s; OOB %s:%s"``, ``"NET/IB : %s:%d Got async event : %s"`` (2.21.5 L101) /
  ``"NET/IB : %s:%d Got async error event: %s"`` (2.26.2 L179), ``"NET/IB : Got completion from peer %s with
  status=%d opcode=%d len=%d vendor err %d (%s)"`` (2.21.5 L1909) / ``"NET/IB: Got completion from peer %s with
  status=%d opcode=%d len=%u vendor err %u (%s)%s%s%s%s hca %s"`` (2.26.2 L2358); src/transport/net.cc and
  p2p.cc channel lines; src/include/checks.h and src/proxy.cc error trail (``"%s:%d -> %d"``,
  ``"... [Progress Thread]"``). ``ibv_event_type_str(IBV_EVENT_PORT_ERR)`` = "port error"
  (linux-rdma/rdma-core libibverbs/enum_strs.c).
* PyTorch: c10/util/Logging.cpp ``MessageLogger`` (``"[rank%d]:"`` when RANK is set, then
  ``"[E<mon*100+day> HH:MM:SS.<9-digit CLOCK_MONOTONIC ns> file:line] "``);
  torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (``"[Rank %d] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=.., OpType=.., NumelIn=.., NumelOut=.., Timeout(ms)=..) ran for .. milliseconds before timing
  out."``, the PG prefix ``"[PG ID 0 PG GUID 0(default_pg) Rank %d] "``, 2.5's ``"Exception (either an error or
  timeout) detected by watchdog at work: .."``, 2.6+'s ``" failure detected by watchdog at work sequence id: ..
  PG status: last enqueued work: .., last completed work: .."``, ``"Received a dump signal due to a collective
  timeout from  rank N ..."``, the teardown lines) -- line numbers and full texts as in public logs of torch
  2.5.x (ROCm/ROCm#4021) and 2.6/2.7 (a published post-mortem, code-index document 68430319905);
  torch/csrc/distributed/c10d/NCCLUtils.{hpp,cpp} (``"NCCL error: remote process exited or there was a network
  error, NCCL version X"``, ``"\\nLast error:\\n"``); torch/distributed/elastic/multiprocessing/errors/__init__.py
  (``ChildFailedError`` block: ``_MSG_FORMAT_TEMPLATE``, ``_FAILURE_FORMAT_TEMPLATE``, width min(.., 60), host =
  ``socket.getfqdn()``, ``"Signal 9 (SIGKILL) received by PID %d"``); torchrun's own log lines
  (``"E1205 10:22:01.123000 4321 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9)
  local_rank: 5 (pid: 12345) of binary: ..."``, ``"Sending process %d closing signal SIGTERM"``).
* Slurm (SchedMD/slurm, slurm-25-05-4-1): src/common/write_labelled_message.c ``_build_label``
  (``"%*d: "``, width from src/api/step_io.c ``_wid``); src/srun/launch.c ``_task_finish`` (``"%s: %s %s:
  %s%s"`` -> ``srun: error: gpu-a18: task 13: Killed``, ``"Exited with exit code %d"``, ``"Out Of Memory"``);
  src/api/step_launch.c ``"Job step aborted: Waiting up to %d seconds for job step to finish."``;
  src/slurmd/slurmstepd/req.c ``"*** %s ON %s CANCELLED AT %s ***"``;
  src/plugins/task/cgroup/task_cgroup_memory.c ``"Detected %lu oom_kill event%s in %ps. Some of the step tasks
  have been OOM Killed."``; ``--output`` patterns %x (job name), %t (task id), %j (job id).
* Kubernetes: pkg/kubelet/kuberuntime/helpers.go (``/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log``);
  the CRI record ``"<RFC3339Nano> <stream> <P|F> <line>"`` as containerd writes it
  (containerd/containerd internal/cri/io/logger.go: ``time.RFC3339Nano``, trailing zeros dropped);
  generateName suffixes from k8s.io/apimachinery/pkg/util/rand (5 of ``"bcdfghjklmnpqrstvwxz2456789"``).
* Open MPI 4.1 (open-mpi/ompi v4.1.x, help-errmgr-base.txt / help-orterun.txt, observed in public logs):
  ``"mpirun noticed that process rank %d with PID %d on node %s exited on signal %d (%s)."``, the
  "Primary job  terminated normally" block, ``--tag-output`` ``"[1,%d]<stdout>:"``.
* Linux (torvalds/linux): mm/oom_kill.c ``__oom_kill_process`` (``"%s: Killed process %d (%s) total-vm:%lukB,
  anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd"``), ``dump_header``
  (``"%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, oom_score_adj=%hd"``), ``dump_oom_summary``
  (``"oom-kill:constraint=..,nodemask=..,cpuset=..,mems_allowed=..,[global_oom|oom_memcg=..],task_memcg=..,
  task=..,pid=..,uid=.."``); drivers/infiniband/core/sysfs.c (``state`` ``"%d: %s"`` with
  ib_port_state_to_str, ``phys_state`` ``"%u: %s"``, ``rate`` ``"%d%s Gb/sec (%d%s%s)"``, ``link_layer``).
* NVIDIA open-gpu-kernel-modules (550.127.05 / 570.133.20): src/nvidia/src/kernel/gpu/rc/kernel_rc.c
  (``"NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s"``; 570+: no pid/name for a channel-less Xid),
  ``_krcLogUuidOnce`` (``"NVRM: GPU at PCI:..: GPU-<uuid>"``, board serial), osinit.c ``osHandleGpuLost``
  (``"NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus."``). The kernel log is captured as a node
  keeps it: rsyslog's /var/log/kern.log, classic (``"Dec  5 10:12:01 host kernel: [ 1234.567890] ..."``) or
  Ubuntu 24.04's RFC 3339 rendering; /dev/kmsg is a character device, not a file a snapshot holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LAYOUTS = ("node-local", "shared-fs", "slurm-job", "slurm-job-label", "pods-split", "pods-launcher")
FAULTS = ("hang", "crash", "ib-port-down", "xid79", "healthy")
ENTITY_KIND = {"hang": "rank", "crash": "rank", "ib-port-down": "hca_port", "xid79": "gpu", "healthy": None}

# ---------------------------------------------------------------------------------------------------------------
# Profiles: a PyTorch release and the NCCL it ships with (torch 2.5.1 pins nvidia-nccl-cu12 2.21.5, torch 2.7.1
# pins 2.26.2). ``wd`` etc. are the ProcessGroupNCCL.cpp line numbers in public logs of that release.


@dataclass(frozen=True)
class Profile:
    name: str
    torch: str
    nccl: str
    cuda: str
    warn_ts: bool  # NCCL >= 2.26: WARN lines start with "[%F %T] "
    init_fn: str  # the literal (2.21.5) or job->funcName (2.26.2) before " comm %p"
    rings_line: str
    socket_loc: str
    completion_loc: str
    async_loc: str
    async_fmt: str
    completion_2x: bool  # 2.22+: "NET/IB: Got completion ... hca %s"
    pyver: str
    wd: int  # "Watchdog caught collective operation timeout" line
    status: int  # the PG status line after it
    dump_signal: int  # "Received a dump signal ..." (0: not printed by this release)
    teardown: tuple[int, int]
    terminated: int  # "Process group watchdog thread terminated with exception"
    check_timeout: int  # "Exception raised from checkTimeout at ...:N"
    check_errors: int  # "Exception raised from checkForNCCLErrorsInternal at ...:N"
    async_exc: int  # "raised the following async exception"
    barrier: int  # the "using GPU N to perform barrier" warning
    barrier_text: str
    api_fail: int  # torchrun api.py "failed (exitcode: ..."
    api_sigterm: int  # torchrun api.py "Sending process ... closing signal SIGTERM"
    run_py: int  # torchrun run.py banner line
    launcher_line: int  # launcher/api.py raise ChildFailedError
    src_prefix: str  # __FILE__ prefix in "Exception raised from ... at <prefix>torch/csrc/..."


P25 = Profile(
    name="torch2.5.1+nccl2.21.5", torch="2.5.1", nccl="2.21.5", cuda="12.4", warn_ts=False,
    init_fn="ncclCommInitRank", rings_line="Connected all rings", socket_loc="misc/socket.cc:50",
    completion_loc="transport/net_ib.cc:1909", async_loc="transport/net_ib.cc:101",
    async_fmt="NET/IB : {dev}:{port} Got async event : {what}", completion_2x=False, pyver="3.10",
    wd=616, status=1785, dump_signal=0, teardown=(630, 636), terminated=1595, check_timeout=618,
    check_errors=1723, async_exc=542, barrier=4115,
    barrier_text=("using GPU {gpu} to perform barrier as devices used by this process are currently unknown. This can "
                  "potentially cause a hang if this rank to GPU mapping is incorrect.Specify device_ids in barrier() "
                  "to force use of a particular device,or call init_process_group() with a device_id."),
    api_fail=869, api_sigterm=897, run_py=793, launcher_line=260, src_prefix="../",
)
P27 = Profile(
    name="torch2.7.1+nccl2.26.2", torch="2.7.1", nccl="2.26.2", cuda="12.2", warn_ts=True,
    init_fn="ncclCommInitRankConfig", rings_line="Connected all rings, use ring PXN 0 GDR 1",
    socket_loc="misc/socket.cc:71", completion_loc="transport/net_ib.cc:2358", async_loc="transport/net_ib.cc:179",
    async_fmt="NET/IB : {dev}:{port} Got async error event: {what}", completion_2x=True, pyver="3.12",
    wd=683, status=2241, dump_signal=1858, teardown=(744, 758), terminated=2057, check_timeout=685,
    check_errors=2075, async_exc=2004, barrier=4561,
    barrier_text=("using GPU {gpu} to perform barrier as devices used by this process are currently unknown. This can "
                  "potentially cause a hang if this rank to GPU mapping is incorrect. Specify device_ids in barrier() "
                  "to force use of a particular device, or call init_process_group() with a device_id."),
    api_fail=914, api_sigterm=941, run_py=766, launcher_line=270, src_prefix="/pytorch/",
)

# HGX/DGX H100 GPU PCI buses (cudaDev order) and the rail NIC each GPU uses.
BOARDS = {
    "dgx-h100": ["1b", "43", "52", "61", "9d", "c3", "d1", "df"],
    "hgx-h100": ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"],
}
NIC_BUS = {
    "dgx-h100": ["19", "40", "4f", "5e", "9b", "c0", "ce", "dc"],
    "hgx-h100": ["17", "29", "39", "5c", "99", "aa", "b9", "da"],
}
K8S_ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
USERS = ["alice", "bwang", "dkim", "mrossi", "pnair", "svc-train"]
JOB_NAMES = ["llama3-8b-pt", "llama3-70b-sft", "mixtral-8x7b-ft", "gpt-neox-20b", "dit-xl-video", "mamba2-2p7b"]


# ---------------------------------------------------------------------------------------------------------------
# Time rendering


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def rfc3339nano(t: float) -> str:
    """Go's time.RFC3339Nano in UTC: fractional seconds without trailing zeros (containerd's CRI stamps)."""
    d = _dt(t)
    ns = round((t - int(t)) * 1e9) % 1_000_000_000
    frac = f"{ns:09d}".rstrip("0")
    return d.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def glog_stamp(t: float, sev: str, mono_ns: int) -> str:
    """c10's MessageLogger: "[E1205 10:12:01.123456789 " (month*100+day unpadded, ns from CLOCK_MONOTONIC)."""
    d = _dt(t)
    return f"{sev}{d.month * 100 + d.day} {d.strftime('%H:%M:%S')}.{mono_ns % 1_000_000_000:09d}"


def pylog_stamp(t: float, sev: str) -> str:
    """torch.distributed's logging (2.4+): "E1205 10:22:01.123000" (milliseconds, microsecond field)."""
    d = _dt(t)
    return f"{sev}{d.strftime('%m%d %H:%M:%S')}.{int((t % 1) * 1000):03d}000"


# ---------------------------------------------------------------------------------------------------------------
# The world


@dataclass
class Node:
    index: int
    host: str  # etc/hostname
    short: str
    fqdn: str
    ip: str
    boot: float
    launcher_pid: int  # torchrun's pid as its own log prints it
    pod: str = ""  # the pod's name (its log directory)
    pod_host: str = ""  # the pod's hostname (what NCCL prints)
    pod_fqdn: str = ""  # socket.getfqdn() in the pod (torchrun's "host")
    container: str = ""
    pod_uid: str = ""
    pod_ip: str = ""
    kern: list[tuple[float, str]] = field(default_factory=list)
    launcher: list[tuple[float, str, str]] = field(default_factory=list)  # torchrun console lines
    port_down: str = ""  # "mlx5_3" when that HCA's port 1 is DOWN


@dataclass
class Rank:
    rank: int
    node: Node
    local: int
    pid: int  # as the process sees itself (a container's pid namespace in pods)
    host_pid: int  # as the kernel log names it
    nccl_host: str
    comm: str
    bus: str  # "0000:1b:00.0"
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (time, "out"|"err", text)
    nccl: list[tuple[float, str]] = field(default_factory=list)  # NCCL's lines (stdout, or NCCL_DEBUG_FILE)
    mono: int = 0

    @property
    def nccl_busid(self) -> str:
        # NCCL's busIdToInt64 (src/misc/utils.cc): the hex digits of "0000:1b:00.0" read as one number
        return format(int(self.bus.replace(":", "").replace(".", ""), 16), "x")

    @property
    def pci_short(self) -> str:  # Xid's "%04x:%02x:%02x"
        return self.bus.rsplit(".", 1)[0]


@dataclass
class World:
    rng: random.Random
    layout: str
    fault: str
    profile: Profile
    nodes: list[Node]
    ranks: list[Rank]
    gpus: int
    user: str
    job_name: str
    job_id: int
    comm_id: str
    t0: float
    namespace: str = ""
    k8s_job: str = ""
    jobwide: list[tuple[float, str, str]] = field(default_factory=list)  # srun / mpirun console lines
    culprit: dict[str, Any] = field(default_factory=dict)
    rank_prefix: bool = True  # c10's "[rankN]:" (RANK set in the process' environment)
    tee_prefix: bool = False  # torchrun --tee 3: "[default<local>]:" before each worker line
    torchrun: bool = True
    mpi_tag: bool = False
    style: str = "hf"
    timeout_ms: int = 600000
    seq: int = 0
    op: tuple[str, int, int] = ("ALLREDUCE", 0, 0)
    nccl_file: bool = False  # NCCL_DEBUG_FILE set (node-local layout)
    split: list[dict[str, Any]] = field(default_factory=list)  # per node: a tensor-parallel communicator
    ib_hca_env: bool = True
    python: str = "/usr/bin/python3"
    site: str = "/usr/local/lib/python3.10/dist-packages"
    driver: str = "550.127.05"
    kern_style: str = "classic"
    submit_dir: str = ""
    batch_file: str = ""  # the job-wide slurm-<id>.out path inside the first node's root
    kill_on_bad_exit: bool = True
    oom_kind: str = "memcg"

    def by_node(self, n: Node) -> list[Rank]:
        return [r for r in self.ranks if r.node is n]

    @property
    def world(self) -> int:
        return len(self.ranks)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big")


def _hex(rng: random.Random, digits: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(digits))


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(K8S_ALNUM) for _ in range(n))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def build_world(layout: str, fault: str, nodes: int, gpus: int, seed: int) -> World:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: one of {', '.join(FAULTS)}")
    if not 2 <= nodes <= 64 or not 1 <= gpus <= 8:
        raise ValueError("nodes 2..64, gpus_per_node 1..8")
    rng = random.Random(_seed(layout, fault, nodes, gpus, seed))
    profile = rng.choice([P25, P27])
    board = rng.choice(sorted(BOARDS))
    k8s = layout.startswith("pods")
    # node names: a Slurm cluster's, or a Kubernetes cluster's (on-prem names, or EKS' ip-... FQDNs)
    if k8s and rng.random() < 0.4:
        base = [10, rng.randrange(0, 255), rng.randrange(0, 255)]
        octets = rng.sample(range(10, 250), nodes)
        hosts = [f"ip-{base[0]}-{base[1]}-{base[2]}-{o}.ec2.internal" for o in octets]
        ips = [f"{base[0]}.{base[1]}.{base[2]}.{o}" for o in octets]
    else:
        prefix = rng.choice(["gpu-a", "gpu-b", "hgx-c", "dgx-h100-", "gpu-node-"])
        width = 3 if prefix.endswith("-") and prefix != "gpu-a" else 2
        start = rng.randrange(1, 90)
        step = rng.choice([1, 1, 1, 2])
        nums = [start + i * step for i in range(nodes)]
        if rng.random() < 0.3:  # not always contiguous: the scheduler's pick
            pool = sorted(rng.sample(range(1, 200), nodes))
            nums = pool
        hosts = [f"{prefix}{n:0{width}d}" for n in nums]
        net = rng.randrange(0, 64)
        ips = [f"10.{net}.{n // 250}.{n % 250 + 2}" for n in nums]
    domain = rng.choice(["cluster.local", "hpc.internal", "ib.dc2.example.net"])
    t0 = datetime(2026, 12, 5, rng.randrange(0, 20), rng.randrange(0, 60), rng.randrange(0, 60), tzinfo=UTC).timestamp()
    t0 += rng.random()
    node_objs: list[Node] = []
    for i, (h, ip) in enumerate(zip(hosts, ips, strict=True)):
        short = h.split(".")[0]
        fqdn = h if "." in h else f"{h}.{domain}"
        node_objs.append(Node(index=i, host=h, short=short, fqdn=fqdn, ip=ip,
                              boot=t0 - rng.uniform(2, 40) * 86400, launcher_pid=rng.randrange(3000, 400000)))
    user = rng.choice(USERS)
    job_name = rng.choice(JOB_NAMES)
    w = World(rng=rng, layout=layout, fault=fault, profile=profile, nodes=node_objs, ranks=[], gpus=gpus,
              user=user, job_name=job_name, job_id=rng.randrange(1_000_000, 9_999_999),
              comm_id="0x" + format(rng.getrandbits(64) | 1 << 63, "x"), t0=t0)
    w.python = "/usr/bin/python3" if profile is P25 else "/opt/venv/bin/python"
    w.site = (f"/usr/local/lib/python{profile.pyver}/dist-packages" if profile is P25
              else f"/opt/venv/lib/python{profile.pyver}/site-packages")
    w.driver = rng.choice(["550.127.05", "535.216.03"]) if profile is P25 else rng.choice(["570.133.20", "575.57.08"])
    w.kern_style = rng.choice(["classic", "rfc3339"])
    w.style = rng.choice(["hf", "megatron"])
    w.timeout_ms = rng.choice([600000, 600000, 1800000])
    w.torchrun = layout not in ("shared-fs", "pods-launcher")
    w.rank_prefix = True if w.torchrun else rng.random() < 0.6
    w.tee_prefix = w.torchrun and layout != "node-local" and rng.random() < 0.35
    w.mpi_tag = layout == "pods-launcher" and rng.random() < 0.5
    w.nccl_file = layout == "node-local"
    w.ib_hca_env = rng.random() < 0.6
    w.kill_on_bad_exit = rng.random() < 0.5
    if k8s:
        w.namespace = rng.choice(["team-llm", "research", "training", "ml-platform"])
        w.k8s_job = f"{job_name}-{rng.choice(['r1', 'r2', 'v3', 'exp7', '0412'])}"
        pod_net = rng.randrange(0, 255)
        jobset = layout == "pods-split" and rng.random() < 0.5
        for i, n in enumerate(node_objs):
            if jobset:
                # Kubeflow Trainer v2: TrainJob -> JobSet, replicated job "node": the pod's hostname is
                # <jobset>-node-0-<i>, its name carries the Job controller's generateName suffix
                n.pod_host = f"{w.k8s_job}-node-0-{i}"
                n.pod = f"{n.pod_host}-{_suffix(rng)}"
                n.pod_fqdn = f"{n.pod_host}.{w.k8s_job}.{w.namespace}.svc.cluster.local"
                n.container = "node"
            elif layout == "pods-split":  # Kubeflow training-operator PyTorchJob: <job>-master-0, <job>-worker-<i>
                n.pod = f"{w.k8s_job}-master-0" if i == 0 else f"{w.k8s_job}-worker-{i - 1}"
                n.container = "pytorch"
            else:  # mpi-operator v2 MPIJob workers
                n.pod = f"{w.k8s_job}-worker-{i}"
                n.container = "worker"
            n.pod_host = n.pod_host or n.pod
            n.pod_fqdn = n.pod_fqdn or n.pod
            n.pod_uid = _uuid(rng)
            n.pod_ip = f"10.244.{pod_net}.{rng.randrange(2, 250)}"
            n.launcher_pid = 1 if rng.random() < 0.5 else rng.randrange(7, 40)
    buses = BOARDS[board]
    for n in node_objs:
        base_pid = n.launcher_pid + rng.randrange(8, 60) if not k8s else n.launcher_pid + rng.randrange(20, 90)
        host_base = rng.randrange(100000, 3_000_000)
        pid = base_pid
        for lr in range(gpus):
            r = len(w.ranks)
            pid += 1 + (rng.randrange(0, 2) if lr else 0)  # torchrun forks its workers one after another
            w.ranks.append(Rank(rank=r, node=n, local=lr, pid=pid, host_pid=(host_base + pid - base_pid) if k8s else pid,
                                nccl_host=(n.pod_host if k8s else n.short),
                                comm="0x" + rng.choice(["55", "56"]) + _hex(rng, 9) + "0",
                                bus=f"0000:{buses[lr]}:00.0", mono=rng.getrandbits(40)))
    # the collective the job fails in
    kind = rng.choice(["ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"])
    numel = rng.choice([16777216, 33554432, 67108864, 131072000, 262144000])
    W = w.world
    if kind == "ALLREDUCE":
        w.op = (kind, numel, numel)
    elif kind == "_ALLGATHER_BASE":
        w.op = (kind, numel // W, numel // W * W)
    else:
        w.op = (kind, numel // W * W, numel // W)
    w.seq = rng.randrange(2000, 600000)
    if rng.random() < 0.5:
        w.split = [{"color": rng.getrandbits(31), "id": "0x" + format(rng.getrandbits(64) | 1 << 63, "x"),
                    "comms": ["0x" + rng.choice(["55", "56"]) + _hex(rng, 9) + "0" for _ in range(gpus)]}
                   for _ in node_objs]
    w.culprit = _pick_culprit(w)
    return w


def _pick_culprit(w: World) -> dict[str, Any]:
    rng = w.rng
    if w.fault == "healthy":
        return {}
    node = rng.choice(w.nodes)
    local = rng.randrange(w.gpus)
    r = w.by_node(node)[local]
    c: dict[str, Any] = {"node": node.host, "rank": r.rank, "local_rank": local, "gpu": r.bus}
    if w.fault == "ib-port-down":
        c["hca"] = f"mlx5_{local}"
        c["port"] = 1
        node.port_down = c["hca"]
    if w.fault == "crash":
        c["how"] = rng.choice(["oom", "oom", "cuda"])
    return c


# ---------------------------------------------------------------------------------------------------------------
# What each process prints


def nccl_info(w: World, r: Rank, t: float, tid: int, msg: str) -> None:
    r.nccl.append((t, f"{r.nccl_host}:{r.pid}:{tid} [{r.local}] NCCL INFO {msg}"))


def nccl_warn(w: World, r: Rank, t: float, tid: int, loc: str, msg: str) -> None:
    stamp = _dt(t).strftime("[%Y-%m-%d %H:%M:%S] ") if w.profile.warn_ts else ""
    r.nccl.append((t, ""))  # WARN's buffer starts with "\n" (src/debug.cc)
    r.nccl.append((t, f"{stamp}{r.nccl_host}:{r.pid}:{tid} [{r.local}] {loc} NCCL WARN {msg}"))


def c10(w: World, r: Rank, t: float, sev: str, line: int, msg: str, file: str = "ProcessGroupNCCL.cpp") -> None:
    r.mono += int(w.rng.uniform(0.2, 40) * 1e6)
    prefix = f"[rank{r.rank}]:" if w.rank_prefix else ""
    r.lines.append((t, "err", f"{prefix}[{glog_stamp(t, sev, r.mono)} {file}:{line}] {msg}"))


def err(r: Rank, t: float, text: str) -> None:
    for ln in text.split("\n"):
        r.lines.append((t, "err", ln))


def out(r: Rank, t: float, text: str) -> None:
    for ln in text.split("\n"):
        r.lines.append((t, "out", ln))


def work(w: World) -> str:
    op, nin, nout = w.op
    return f"WorkNCCL(SeqNum={w.seq}, OpType={op}, NumelIn={nin}, NumelOut={nout}, Timeout(ms)={w.timeout_ms})"


def pg(r: Rank) -> str:
    return f"[PG ID 0 PG GUID 0(default_pg) Rank {r.rank}]"


def frames(w: World, rng: random.Random, fn: str) -> str:
    lib = f"{w.site}/torch/lib"
    base = rng.randrange(0x7F0000000000, 0x7FFFF0000000)
    fr = [
        f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x{base + 0x96:x} in {lib}/libc10.so)",
        f"frame #1: {fn} + 0x{rng.randrange(0x80, 0x400):x} (0x{base + 0x1A2B3C0:x} in {lib}/libtorch_cuda.so)",
        f"frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x{rng.randrange(0x200, 0x900):x} "
        f"(0x{base + 0x1A3C000:x} in {lib}/libtorch_cuda.so)",
        f"frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x{rng.randrange(0x80, 0x200):x} "
        f"(0x{base + 0x1A3D100:x} in {lib}/libtorch_cuda.so)",
        f"frame #4: <unknown function> + 0xdc253 (0x{base + 0x5DC253:x} in /lib/x86_64-linux-gnu/libstdc++.so.6)",
        f"frame #5: <unknown function> + 0x94ac3 (0x{base + 0x694AC3:x} in /lib/x86_64-linux-gnu/libc.so.6)",
        f"frame #6: <unknown function> + 0x126850 (0x{base + 0x726850:x} in /lib/x86_64-linux-gnu/libc.so.6)",
    ]
    return "\n".join(fr) + "\n"


def nccl_init(w: World, r: Rank, t: float) -> float:
    """The INFO lines of one rank's world communicator (NCCL_DEBUG=INFO, default subsystems INIT|ENV)."""
    rng = w.rng
    p = w.profile
    n = r.node
    tid = r.pid
    drv = {"550": 12040, "535": 12020, "570": 12080, "575": 12090}[w.driver[:3]]
    nccl_info(w, r, t, tid, f"cudaDriverVersion {drv}")
    if p is P25 and r.rank == 0:
        # 2.21.5 showVersion(): rank 0 only, printf to stdout, and an INFO line when NCCL_DEBUG_FILE is a file
        r.lines.append((t, "out", f"NCCL version {p.nccl}+cuda{p.cuda}"))
        if w.nccl_file:
            nccl_info(w, r, t, tid, f"NCCL version {p.nccl}+cuda{p.cuda}")
    elif p is P27:  # 2.26.2: every rank at INFO (src/init.cc L530, L1653)
        nccl_info(w, r, t, tid, f"NCCL version {p.nccl}+cuda{p.cuda}")
    ifname = "ib0" if not n.pod else "eth0"
    addr = n.pod_ip or n.ip
    nccl_info(w, r, t, tid, f"NCCL_SOCKET_IFNAME set by environment to {ifname}")
    nccl_info(w, r, t, tid, f"Bootstrap : Using {ifname}:{addr}<0>")
    t += rng.uniform(0.05, 0.3)
    tid2 = r.pid + rng.randrange(60, 140)
    if p is P25:
        nccl_info(w, r, t, tid2, "NET/Plugin: No plugin found (libnccl-net.so)")
        nccl_info(w, r, t, tid2, "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object "
                                 "file: No such file or directory : when loading libnccl-net.so")
        nccl_info(w, r, t, tid2, "NET/Plugin: Using internal network plugin.")
    else:
        nccl_info(w, r, t, tid2, "NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.")
    if w.ib_hca_env:
        nccl_info(w, r, t, tid2, "NCCL_IB_HCA set to " + ",".join(f"mlx5_{i}" for i in range(w.gpus)))
    devs = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(w.gpus))
    nccl_info(w, r, t, tid2, f"NET/IB : Using {devs} [RO]; OOB {ifname}:{addr}<0>")
    nccl_info(w, r, t, tid2, "Using non-device net plugin version 0")
    nccl_info(w, r, t, tid2, "Using network IB")
    t += rng.uniform(0.2, 1.5)
    W, N = w.world, len(w.nodes)
    init = f"{p.init_fn} comm {r.comm} rank {r.rank} nranks {W} cudaDev {r.local} nvmlDev {r.local} busId {r.nccl_busid}"
    nccl_info(w, r, t, tid, f"{init} commId {w.comm_id} - Init START")
    half = "ffffffff,00000000,ffffffff" if r.local < w.gpus // 2 else "00000000,ffffffff,00000000,ffffffff"
    nccl_info(w, r, t, tid, f"Setting affinity for GPU {r.local} to {half}")
    nccl_info(w, r, t, tid, f"NVLS multicast support is available on dev {r.local}")
    nccl_info(w, r, t, tid, f"comm {r.comm} rank {r.rank} nRanks {W} nNodes {N} localRanks {w.gpus} "
                            f"localRank {r.local} MNNVL 0")
    nch = 2 * w.gpus
    if r.rank == 0:
        for c in range(min(nch, 4)):
            # dumpLine (src/graph/rings.cc): the prefix cut to 15 characters, " %3d" per rank from its strlen, the
            # 115-character buffer's spaces kept
            vals = "".join(f" {(x + c) % W:3d}" for x in range(min(W, 20)))
            nccl_info(w, r, t, tid, f"{f'Channel {c:02d}/{nch:02d} :'[:15]} {vals}".ljust(115))
    lo = r.rank - r.local
    up = lo + (r.local + 1) % w.gpus
    down = lo + (r.local - 1) % w.gpus
    trees = " ".join(f"[{c}] {up}/-1/-1->{r.rank}->{down}" for c in range(min(nch, 4)))
    nccl_info(w, r, t, tid, f"Trees {trees}")
    nccl_info(w, r, t, tid, "P2P Chunksize set to 524288")
    tidp = r.pid + rng.randrange(150, 260)
    t += rng.uniform(0.1, 0.6)
    nxt = w.ranks[(r.rank + w.gpus) % W]
    prv = w.ranks[(r.rank - w.gpus) % W]
    peer_local = w.ranks[lo + (r.local + 1) % w.gpus]
    for c in (r.local, r.local + w.gpus):
        nccl_info(w, r, t, tidp, f"Channel {c:02d}/0 : {r.rank}[{r.local}] -> {peer_local.rank}[{peer_local.local}] "
                                 f"via P2P/CUMEM/read")
        nccl_info(w, r, t, tidp, f"Channel {c:02d}/0 : {r.rank}[{r.local}] -> {nxt.rank}[{nxt.local}] [send] via "
                                 f"NET/IB/{r.local}/GDRDMA")
        nccl_info(w, r, t, tidp, f"Channel {c:02d}/0 : {prv.rank}[{prv.local}] -> {r.rank}[{r.local}] [receive] via "
                                 f"NET/IB/{r.local}/GDRDMA")
    t += rng.uniform(0.05, 0.4)
    nccl_info(w, r, t, tid, p.rings_line)
    nccl_info(w, r, t, tid, "Connected all trees")
    nccl_info(w, r, t, tid, f"{nch} coll channels, {nch} collnet channels, 16 nvls channels, 32 p2p channels, "
                            "32 p2p channels per peer")
    nccl_info(w, r, t, tid, f"{init} commId {w.comm_id} - Init COMPLETE")
    if w.split:
        # a node-local group (tensor parallel) split off the world communicator: ncclCommSplit's own lines
        t += rng.uniform(0.5, 3)
        g = w.split[r.node.index]
        head = (f"ncclCommSplit comm {g['comms'][r.local]} rank {r.local} nranks {w.gpus} cudaDev {r.local} nvmlDev "
                f"{r.local} busId {r.nccl_busid} parent {r.comm}")
        if p is P25:  # src/init.cc v2.21.5-1 L1541 / L1570
            nccl_info(w, r, t, tid, f"{head} color {g['color']} key {r.local} commId {g['id']} - Init START")
        else:  # v2.26.2-1 L1388 / L1424
            nccl_info(w, r, t, tid, f"{head} splitCount 1 color {g['color']} key {r.local}- Init START")
        nccl_info(w, r, t, tid, f"comm {g['comms'][r.local]} rank {r.local} nRanks {w.gpus} nNodes 1 localRanks "
                                f"{w.gpus} localRank {r.local} MNNVL 0")
        nxt_l = (r.local + 1) % w.gpus
        nccl_info(w, r, t, tidp, f"Channel 00/0 : {r.local}[{r.local}] -> {nxt_l}[{nxt_l}] via P2P/CUMEM/read")
        if p is P25:
            nccl_info(w, r, t, tid, f"{head} color {g['color']} key {r.local} commId {g['id']} - Init COMPLETE")
        else:
            nccl_info(w, r, t, tid, f"{head} splitCount 1 color {g['color']} key {r.local} - Init COMPLETE")
    return t


# ---------------------------------------------------------------------------------------------------------------
# Trainer output (ordinary noise: loss lines, tqdm)


def tqdm_bar(i: int, total: int, elapsed: float, rate: float) -> str:
    pct = int(100 * i / total)
    filled = int(10 * i / total)
    frac = int(8 * (10 * i / total - filled))
    bar = "█" * filled + (" ▏▎▍▌▋▊▉"[frac] if filled < 10 else "") + " " * max(0, 9 - filled)
    rem = (total - i) * rate

    def hms(s: float) -> str:
        s = int(s)
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"

    return f"{pct:3d}%|{bar[:10]}| {i}/{total} [{hms(elapsed)}<{hms(rem)}, {rate:5.2f}s/it]"


def trainer_output(w: World, t_start: float, t_end: float, step_s: float) -> None:
    """Loss lines (HF Trainer on rank 0 with tqdm; or Megatron's iteration line on the last rank)."""
    rng = w.rng
    total = rng.choice([20000, 50000, 120000])
    k0 = rng.randrange(0, 5000)
    steps = int((t_end - t_start) / step_s)
    loss = rng.uniform(1.8, 3.2)
    every = rng.choice([1, 5, 10]) if w.style == "megatron" else rng.choice([5, 10, 20])
    logger = w.ranks[-1] if w.style == "megatron" else w.ranks[0]
    tq: list[str] = []
    for s in range(1, steps + 1):
        t = t_start + s * step_s + rng.uniform(-0.05, 0.05)
        k = k0 + s
        loss = max(0.6, loss - rng.uniform(0, 0.004) + rng.uniform(-0.02, 0.02))
        if w.style == "hf":
            tq.append(tqdm_bar(k, total, k * step_s, step_s + rng.uniform(-0.02, 0.02)))
            if s % every == 0:
                err(logger, t, "\r".join(tq))
                tq = []
                out(logger, t, f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.2, 1.4):.4f}, 'learning_rate': "
                               f"{3e-4 * (1 - k / total):.3e}, 'epoch': {k / total * 3:.2f}}}")
        elif s % every == 0:
            out(logger, t, f" [{_dt(t).strftime('%Y-%m-%d %H:%M:%S')}] iteration {k:>8}/{total:>8} | consumed samples:"
                           f" {k * 1024:>12} | elapsed time per iteration (ms): {step_s * 1000 + rng.uniform(-30, 30):.1f}"
                           f" | learning rate: {3e-4 * (1 - k / total):.6E} | global batch size:  1024 | lm loss: "
                           f"{loss:.6E} | loss scale: 1.0 | grad norm: {rng.uniform(0.2, 1.4):.3f} | number of skipped"
                           " iterations:   0 | number of nan iterations:   0 |")
        if s % 500 == 0:  # a checkpoint now and then, on every rank
            for r in w.ranks:
                if r.local == 0 or w.style == "hf":
                    out(r, t + 0.5, f"[{_dt(t).strftime('%Y-%m-%d %H:%M:%S,%f')[:-3]}] INFO: saving checkpoint at "
                                    f"iteration {k} to /checkpoints/{w.job_name}/iter_{k:07d}")
    if tq:
        err(logger, t_end, "\r".join(tq))


def startup_output(w: World, r: Rank, t: float) -> None:
    if r.local == 0 or w.rng.random() < 0.3:
        out(r, t, f"[{_dt(t).strftime('%Y-%m-%d %H:%M:%S,%f')[:-3]}] INFO: building {w.job_name} model, world size "
                  f"{w.world}, data parallel size {w.world}")
    c10(w, r, t + w.rng.uniform(0.5, 3), "W", w.profile.barrier,
        f"[PG ID 0 PG GUID 0 Rank {r.rank}]  " + w.profile.barrier_text.format(gpu=r.local))


# ---------------------------------------------------------------------------------------------------------------
# Failures, as each process reports them


def watchdog_timeout(w: World, r: Rank, t: float, enqueued: int) -> float:
    """A rank whose watchdog fires on work ``w.seq``; returns when the process aborts (SIGABRT)."""
    rng = w.rng
    p = w.profile
    ran = w.timeout_ms + rng.randrange(3, 140)
    text = f"[Rank {r.rank}] Watchdog caught collective operation timeout: {work(w)} ran for {ran} milliseconds before timing out."
    c10(w, r, t, "E", p.wd, text)
    if p is P25:
        c10(w, r, t + 0.0003, "E", p.status, f"{pg(r)} Exception (either an error or timeout) detected by watchdog at "
                                             f"work: {w.seq}, last enqueued NCCL work: {enqueued}, last completed NCCL "
                                             f"work: {w.seq - 1}.")
        t_abort = t + rng.uniform(0.001, 0.05)
        c10(w, r, t_abort, "E", 1834, f"{pg(r)} Timeout at NCCL work: {w.seq}, last enqueued NCCL work: {enqueued}, "
                                      f"last completed NCCL work: {w.seq - 1}.")
    else:
        c10(w, r, t + 0.0013, "E", p.status, f"{pg(r)}  failure detected by watchdog at work sequence id: {w.seq} PG "
                                             f"status: last enqueued work: {enqueued}, last completed work: {w.seq - 1}")
        c10(w, r, t + 0.0014, "E", 730, "Stack trace of the failed collective not found, potentially because "
                                        "FlightRecorder is disabled. You can enable it by setting "
                                        "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
        t_abort = t + 60 + rng.uniform(0.0, 0.4)
    c10(w, r, t_abort, "E", p.teardown[0], f"[Rank {r.rank}] Some NCCL operations have failed or timed out. Due to the "
                                           "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                                           "corrupted/incomplete data.")
    c10(w, r, t_abort, "E", p.teardown[1], f"[Rank {r.rank}] To avoid data inconsistency, we are taking the entire "
                                           "process down.")
    exc = (f"{pg(r)} Process group watchdog thread terminated with exception: {text}\n"
           f"Exception raised from checkTimeout at {p.src_prefix}torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
           f"{p.check_timeout} (most recent call first):\n"
           + frames(w, rng, "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
                            "std::ratio<1l, 1000l> > >)"))
    c10(w, r, t_abort, "E", p.terminated, exc.split("\n", 1)[0])
    err(r, t_abort, exc.split("\n", 1)[1].rstrip("\n"))
    err(r, t_abort, "terminate called after throwing an instance of 'c10::DistBackendError'")
    err(r, t_abort, "  what():  " + exc.rstrip("\n"))
    return t_abort


def remote_error(w: World, r: Rank, t: float, last_error: str, enqueued: int) -> tuple[float, int]:
    """NCCL returned ncclRemoteError under this rank: PyTorch's watchdog takes the process down."""
    rng = w.rng
    p = w.profile
    msg = (f"NCCL error: remote process exited or there was a network error, NCCL version {p.nccl}\n"
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
           f"Last error:\n{last_error}")
    c10(w, r, t, "E", p.async_exc, f"[Rank {r.rank}] Collective {work(w)} raised the following async exception: "
                                   + msg.split("\n", 1)[0])
    err(r, t, msg.split("\n", 1)[1])
    if rng.random() < 0.4:
        # the main thread's blocking call surfaces it first: a Python traceback, exit status 1
        # (NCCLUtils.hpp:317 in torch 2.5 builds, NCCLUtils.cpp:77 in 2.7, as public logs show)
        where = "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317" if p is P25 else \
            "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77"
        pre = f"[rank{r.rank}]: " if w.rank_prefix else ""
        op = {"ALLREDUCE": ("all_reduce", "allreduce([tensor], opts)"),
              "_ALLGATHER_BASE": ("all_gather_into_tensor", "_allgather_base(output_tensor, input_tensor, opts)"),
              "_REDUCE_SCATTER_BASE": ("reduce_scatter_tensor", "_reduce_scatter_base(output, input, opts)")}[w.op[0]]
        tb = ["Traceback (most recent call last):",
              f'  File "/workspace/{w.job_name}/train.py", line {rng.randrange(300, 700)}, in <module>', "    main()",
              f'  File "/workspace/{w.job_name}/train.py", line {rng.randrange(200, 300)}, in main',
              "    loss = train_step(model, batch)",
              f'  File "{w.site}/torch/distributed/c10d_logger.py", line 83, in wrapper', "    return func(*args, **kwargs)",
              f'  File "{w.site}/torch/distributed/distributed_c10d.py", line {rng.randrange(2500, 4300)}, in {op[0]}',
              f"    work = group.{op[1]}",
              f"torch.distributed.DistBackendError: NCCL error in: {where}, remote process exited or there was a network "
              f"error, NCCL version {p.nccl}", *msg.split("\n")[1:]]
        t_exit = t + rng.uniform(0.01, 0.3)
        for ln in tb:
            err(r, t_exit, pre + ln)
        return t_exit, 1
    if p is P25:
        c10(w, r, t + 0.0002, "E", p.status, f"{pg(r)} Exception (either an error or timeout) detected by watchdog at "
                                             f"work: {w.seq}, last enqueued NCCL work: {enqueued}, last completed NCCL "
                                             f"work: {w.seq - 1}.")
    else:
        c10(w, r, t + 0.0002, "E", p.status, f"{pg(r)}  failure detected by watchdog at work sequence id: {w.seq} PG "
                                             f"status: last enqueued work: {enqueued}, last completed work: {w.seq - 1}")
    t_abort = t + rng.uniform(0.01, 0.5)
    nccl_info(w, r, t_abort, r.pid + rng.randrange(300, 400),
              f"comm {r.comm} rank {r.rank} nranks {w.world} cudaDev {r.local} busId {r.nccl_busid} - Abort COMPLETE")
    c10(w, r, t_abort, "E", p.teardown[0], f"[Rank {r.rank}] Some NCCL operations have failed or timed out. Due to the "
                                           "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                                           "corrupted/incomplete data.")
    c10(w, r, t_abort, "E", p.teardown[1], f"[Rank {r.rank}] To avoid data inconsistency, we are taking the entire "
                                           "process down.")
    exc = (f"{pg(r)} Process group watchdog thread terminated with exception: {msg}\n"
           f"Exception raised from checkForNCCLErrorsInternal at {p.src_prefix}torch/csrc/distributed/c10d/"
           f"ProcessGroupNCCL.cpp:{p.check_errors} (most recent call first):\n"
           + frames(w, rng, "c10d::ProcessGroupNCCL::checkForNCCLErrorsInternal(std::shared_ptr<c10d::NCCLComm>&)"))
    c10(w, r, t_abort, "E", p.terminated, exc.split("\n", 1)[0])
    err(r, t_abort, exc.split("\n", 1)[1].rstrip("\n"))
    err(r, t_abort, "terminate called after throwing an instance of 'c10::DistBackendError'")
    err(r, t_abort, "  what():  " + exc.rstrip("\n"))
    return t_abort, -6


def cuda_error(w: World, r: Rank, t: float, what: str, in_watchdog: bool) -> float:
    """A CUDA error: raised in the main thread (a Python traceback, exit 1) or seen by the watchdog (abort)."""
    rng = w.rng
    p = w.profile
    hint = ("CUDA kernel errors might be asynchronously reported at any other API call, so the stacktrace below might "
            "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` "
            "to enable device-side assertions.\n")
    if in_watchdog:
        exc = (f"{pg(r)} Process group watchdog thread terminated with exception: CUDA error: {what}\n{hint}\n"
               "Exception raised from c10_cuda_check_implementation at "
               f"{p.src_prefix}c10/cuda/CUDAException.cpp:43 (most recent call first):\n"
               + frames(w, rng, "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"))
        c10(w, r, t, "E", p.terminated, exc.split("\n", 1)[0])
        err(r, t, exc.split("\n", 1)[1].rstrip("\n"))
        err(r, t, "terminate called after throwing an instance of 'c10::DistBackendError'")
        err(r, t, "  what():  " + exc.rstrip("\n"))
        return t
    pre = f"[rank{r.rank}]: " if w.rank_prefix else ""
    tb = [
        "Traceback (most recent call last):",
        f'  File "/workspace/{w.job_name}/train.py", line {rng.randrange(300, 700)}, in <module>',
        "    main()",
        f'  File "/workspace/{w.job_name}/train.py", line {rng.randrange(200, 300)}, in main',
        "    loss.backward()",
        f'  File "{w.site}/torch/_tensor.py", line 626, in backward',
        "    torch.autograd.backward(",
        f'  File "{w.site}/torch/autograd/__init__.py", line 347, in backward',
        "    _engine_run_backward(",
        f'  File "{w.site}/torch/autograd/graph.py", line 823, in _engine_run_backward',
        "    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        f"RuntimeError: CUDA error: {what}",
        *hint.rstrip("\n").split("\n"),
        "",
    ]
    for ln in tb:
        err(r, t, pre + ln)
    return t


# ---------------------------------------------------------------------------------------------------------------
# torchrun (the elastic agent) on each node


def torchrun_start(w: World, n: Node, t: float) -> None:
    p = w.profile
    src = "site-packages/torch/distributed/run.py" if p is P27 else "torch/distributed/run.py"
    st = pylog_stamp(t, "W")
    n.launcher.append((t, "err", f"{st} {n.launcher_pid} {src}:{p.run_py}] "))
    n.launcher.append((t, "err", f"{st} {n.launcher_pid} {src}:{p.run_py}] *****************************************"))
    n.launcher.append((t, "err", f"{st} {n.launcher_pid} {src}:{p.run_py}] Setting OMP_NUM_THREADS environment "
                                 "variable for each process to be 1 in default, to avoid your system being overloaded, "
                                 "please further tune the variable for optimal performance in your application as "
                                 "needed. "))
    n.launcher.append((t, "err", f"{st} {n.launcher_pid} {src}:{p.run_py}] *****************************************"))


def child_failed(w: World, n: Node, t: float, failures: list[tuple[Rank, float, int]],
                 terminated: list[Rank]) -> None:
    """torchrun's report: SIGTERM to the survivors, "failed (exitcode ..)", the ChildFailedError block."""
    rng = w.rng
    p = w.profile
    api = "torch/distributed/elastic/multiprocessing/api.py"
    for r in terminated:
        n.launcher.append((t, "err", f"{pylog_stamp(t, 'W')} {n.launcher_pid} {api}:{p.api_sigterm}] Sending process "
                                     f"{r.pid} closing signal SIGTERM"))
    root = min(failures, key=lambda f: f[1])
    t2 = t + rng.uniform(0.2, 1.5)
    n.launcher.append((t2, "err", f"{pylog_stamp(t2, 'E')} {n.launcher_pid} {api}:{p.api_fail}] failed (exitcode: "
                                  f"{root[2]}) local_rank: {root[0].local} (pid: {root[0].pid}) of binary: {w.python}"))
    bindir = w.python.rsplit("/", 1)[0]
    tb = ["Traceback (most recent call last):", f'  File "{bindir}/torchrun", line 8, in <module>', "    sys.exit(main())"]
    if p is P27:
        tb.append("             ^^^^^^")
    tb += [f'  File "{w.site}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
           "    return f(*args, **kwargs)",
           f'  File "{w.site}/torch/distributed/run.py", line 919, in main', "    run(args)",
           f'  File "{w.site}/torch/distributed/run.py", line 910, in run', "    elastic_launch(",
           f'  File "{w.site}/torch/distributed/launcher/api.py", line 138, in __call__',
           "    return launch_agent(self._config, self._entrypoint, list(args))",
           f'  File "{w.site}/torch/distributed/launcher/api.py", line {p.launcher_line}, in launch_agent',
           "    raise ChildFailedError(",
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    host = n.pod_fqdn if n.pod else n.fqdn
    title = f"{w.job_name}/train.py FAILED" if w.rng.random() < 0.5 else "train.py FAILED"

    def fmt(idx: int, r: Rank, tf: float, code: int) -> list[str]:
        msg = (f"Signal {-code} ({ {9: 'SIGKILL', 6: 'SIGABRT', 15: 'SIGTERM', 11: 'SIGSEGV'}[-code]}) received by PID "
               f"{r.pid}" if code < 0 else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
        return [f"[{idx}]:", f"  time      : {_dt(int(tf)).strftime('%Y-%m-%d_%H:%M:%S')}", f"  host      : {host}",
                f"  rank      : {r.rank} (local_rank: {r.local})", f"  exitcode  : {code} (pid: {r.pid})",
                "  error_file: <N/A>", f"  traceback : {msg}"]

    blocks = [(f, fmt(i, *f)) for i, f in enumerate(failures)]
    width = min(max([len(title)] + [len(x) for _, b in blocks for x in b]), 60)
    others = [x for f, b in blocks if f is not root for x in b] or ["  <NO_OTHER_FAILURES>"]
    rootb = next(b for f, b in blocks if f is root)
    tb += ["=" * width, title, "-" * width, "Failures:", *others, "-" * width,
           "Root Cause (first observed failure):", *rootb, "=" * width]
    for ln in tb:
        n.launcher.append((t2, "err", ln))


# ---------------------------------------------------------------------------------------------------------------
# The kernel log


def kern(w: World, n: Node, t: float, text: str) -> None:
    for ln in text.split("\n"):
        n.kern.append((t, ln))


def kernel_boot_noise(w: World, n: Node) -> None:
    rng = w.rng
    nb = NIC_BUS["dgx-h100" if w.ranks[0].bus.split(":")[1] == "1b" else "hgx-h100"]
    b = n.boot
    kern(w, n, b + 3.1, "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) (x86_64-linux-gnu-gcc-12 (Ubuntu "
                        "12.3.0-1ubuntu1~22.04) 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #49~22.04.1-Ubuntu SMP "
                        "PREEMPT_DYNAMIC Wed Nov  6 17:42:15 UTC 2")
    for i, bus in enumerate(nb):
        kern(w, n, b + 9 + i * 0.4, f"mlx5_core 0000:{bus}:00.0: firmware version: 28.39.1002")
        kern(w, n, b + 9.2 + i * 0.4, f"mlx5_core 0000:{bus}:00.0: Rate limit: 127 rates are supported, range: "
                                      "0Mbps to 195312Mbps")
    open_ = "Open " if w.driver[:3] in ("570", "575") else ""
    kern(w, n, b + 14.2, f"NVRM: loading NVIDIA UNIX {open_}x86_64 Kernel Module  {w.driver}  Release Build  "
                         f"(dvs-builder@U16-I3-B03-4-3)  Tue Oct  8 03:44:36 UTC 2024")
    kern(w, n, b + 15.0, "nvidia-nvswitch0: open (major=508)")
    kern(w, n, b + 22.5, "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready")
    for _ in range(rng.randrange(2, 6)):
        kern(w, n, b + rng.uniform(3600, 86400), f"audit: type=1400 audit({b + 5000:.3f}:{rng.randrange(100, 999)}): "
                                                 'apparmor="STATUS" operation="profile_replace" info="same as current '
                                                 'profile, skipping" profile="unconfined" name="nvidia_modprobe" '
                                                 f"pid={rng.randrange(1000, 90000)} comm=\"apparmor_parser\"")


def render_kern(w: World, n: Node) -> str:
    out_ = []
    for t, text in sorted(n.kern, key=lambda x: x[0]):
        up = t - n.boot
        d = _dt(t)
        if w.kern_style == "classic":
            stamp = d.strftime("%b ") + f"{d.day:2d}" + d.strftime(" %H:%M:%S")
            out_.append(f"{stamp} {n.short} kernel: [{up:12.6f}] {text}")
        else:
            out_.append(f"{d.strftime('%Y-%m-%dT%H:%M:%S')}.{d.microsecond:06d}+00:00 {n.short} kernel: {text}")
    return "\n".join(out_) + "\n"


def oom_kill(w: World, r: Rank, t: float) -> None:
    rng = w.rng
    n = r.node
    comm = rng.choice(["python3", "pt_main_thread"]) if w.python.endswith("python3") else "pt_main_thread"
    if n.pod:
        slice_ = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{n.pod_uid.replace('-', '_')}.slice"
        task_memcg = f"{slice_}/cri-containerd-{_hex(rng, 64)}.scope"
        memcg = slice_
    elif w.layout.startswith("slurm") or w.layout == "shared-fs":
        memcg = f"/system.slice/slurmstepd.scope/job_{w.job_id}"  # Slurm's cgroup/v2 hierarchy
        task_memcg = f"{memcg}/step_0/user/task_{r.rank if w.layout == 'shared-fs' else 0}"
    else:
        memcg = ""
        task_memcg = f"/user.slice/user-{1000 + USERS.index(w.user)}.slice/session-{rng.randrange(2, 90)}.scope"
    uid = 1000 + USERS.index(w.user)
    anon = rng.randrange(180_000_000, 260_000_000)
    kern(w, n, t, f"{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, "
                  "oom_score_adj=0")
    kern(w, n, t, f"CPU: {rng.randrange(0, 192)} PID: {r.host_pid} Comm: {comm} Tainted: P           OE      "
                  "6.8.0-49-generic #49~22.04.1-Ubuntu")
    kern(w, n, t, "Hardware name: NVIDIA DGXH100/DGXH100, BIOS 1.5.1 07/05/2024")
    if memcg:
        kern(w, n, t, f"memory: usage {anon + 8_000_000}kB, limit {anon + 8_000_000}kB, failcnt {rng.randrange(1, 900)}")
        constraint = f"CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg={memcg}"
        head = "Memory cgroup out of memory"
    else:
        constraint = "CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom"
        head = "Out of memory"
    kern(w, n, t, f"oom-kill:constraint={constraint},task_memcg={task_memcg},task={comm},pid={r.host_pid},uid={uid}")
    kern(w, n, t, f"{head}: Killed process {r.host_pid} ({comm}) total-vm:{anon * 2 + rng.randrange(1, 10**7)}kB, "
                  f"anon-rss:{anon}kB, file-rss:{rng.randrange(100000, 900000)}kB, shmem-rss:"
                  f"{rng.randrange(1, 16) * 524288}kB, UID:{uid} pgtables:{anon // 480}kB oom_score_adj:0")


def xid(w: World, r: Rank, t: float, code: int, msg: str, with_pid: bool) -> None:
    n = r.node
    new = w.driver[:3] in ("570", "575")
    if not any("GPU at PCI:" + r.pci_short in x for _, x in n.kern):
        kern(w, n, t, f"NVRM: GPU at PCI:{r.pci_short}: GPU-{_uuid(w.rng)}")
        kern(w, n, t, f"NVRM: GPU Board Serial Number: 165{w.rng.randrange(10**9, 10**10)}")
    if with_pid:
        kern(w, n, t, f"NVRM: Xid (PCI:{r.pci_short}): {code}, pid={r.host_pid}, name=python3, {msg}")
    elif new:
        kern(w, n, t, f"NVRM: Xid (PCI:{r.pci_short}): {code}, {msg}")
    else:
        kern(w, n, t, f"NVRM: Xid (PCI:{r.pci_short}): {code}, pid='<unknown>', name=<unknown>, {msg}")


# ---------------------------------------------------------------------------------------------------------------
# The scenario's timeline


def simulate(w: World) -> None:
    rng = w.rng
    for n in w.nodes:
        kernel_boot_noise(w, n)
    t_launch = w.t0
    if w.torchrun:
        for n in w.nodes:
            torchrun_start(w, n, t_launch + rng.uniform(0, 2))
    for r in w.ranks:
        startup_output(w, r, t_launch + rng.uniform(8, 25))
    t_init = t_launch + rng.uniform(40, 90)
    t_done = t_init
    for r in w.ranks:
        t_done = max(t_done, nccl_init(w, r, t_init + rng.uniform(0, 1.5)))
    step_s = rng.uniform(0.9, 3.2)
    t_train = t_done + rng.uniform(5, 20)
    t_fault = t_train + rng.uniform(300, 2400)
    trainer_output(w, t_train, t_fault, step_s)
    {"hang": fault_hang, "crash": fault_crash, "ib-port-down": fault_ib, "xid79": fault_xid79,
     "healthy": fault_none}[w.fault](w, t_fault)


def _victims_timeout(w: World, t_fault: float, skip: set[int]) -> dict[int, float]:
    """Every rank not in ``skip`` times out on w.seq; returns rank -> abort time."""
    rng = w.rng
    aborts = {}
    t_fire = t_fault + w.timeout_ms / 1000
    for r in w.ranks:
        if r.rank in skip:
            continue
        aborts[r.rank] = watchdog_timeout(w, r, t_fire + rng.uniform(0, 0.25), w.seq + rng.choice([0, 0, 1, 2]))
    return aborts


def _finish(w: World, failed: dict[int, tuple[float, int]], killed_first: dict[int, float] | None = None) -> None:
    """The launchers' side: torchrun per node, or srun / mpirun for the job. ``failed``: rank -> (time, exitcode)."""
    rng = w.rng
    if w.torchrun:
        for n in w.nodes:
            mine = sorted(((w.ranks[k], t, c) for k, (t, c) in failed.items() if w.ranks[k].node is n),
                          key=lambda x: x[1])
            if not mine:
                continue
            t_first = mine[0][1]
            # torchrun's monitor notices within its interval; those that failed by then are listed, others killed
            t_seen = t_first + rng.uniform(0.1, 0.9)
            listed = [m for m in mine if m[1] <= t_seen + 0.05]
            gone = {m[0].rank for m in listed}
            terminated = [r for r in w.by_node(n) if r.rank not in gone]
            child_failed(w, n, t_seen, listed, terminated)
            if w.layout.startswith("slurm"):  # srun sees its task (this node's torchrun) exit 1
                w.jobwide.append((t_seen + rng.uniform(1.5, 4), "err",
                                  f"srun: error: {n.short}: task {n.index}: Exited with exit code 1"))
        return
    if not failed:
        return
    first_rank, (t_first, code) = min(failed.items(), key=lambda kv: kv[1][0])
    r0 = w.ranks[first_rank]
    if w.layout == "shared-fs":
        sig = {-9: "Killed", -6: "Aborted (core dumped)", -11: "Segmentation fault (core dumped)"}
        t = t_first + rng.uniform(0.5, 3)
        if code == -9 and w.culprit.get("how") == "oom":
            w.jobwide.append((t - 0.2, "err", f"slurmstepd: error: Detected 1 oom_kill event in StepId={w.job_id}.0. "
                                              "Some of the step tasks have been OOM Killed."))
            w.jobwide.append((t, "err", f"srun: error: {r0.node.short}: task {first_rank}: Out Of Memory"))
        else:
            desc = sig.get(code, f"Exited with exit code {code}")
            w.jobwide.append((t, "err", f"srun: error: {r0.node.short}: task {first_rank}: {desc}"))
        if w.kill_on_bad_exit:
            w.jobwide.append((t + 0.01, "err", "srun: Job step aborted: Waiting up to 32 seconds for job step to "
                                               "finish."))
            for n in w.nodes:
                stamp = _dt(t + 0.02).strftime("%Y-%m-%dT%H:%M:%S")
                w.jobwide.append((t + 0.02 + n.index * 0.001, "err", f"slurmstepd: error: *** STEP {w.job_id}.0 ON "
                                                                     f"{n.short} CANCELLED AT {stamp} ***"))
            others = [n for n in w.nodes]
            for n in others:
                tasks = [r.rank for r in w.by_node(n) if r.rank != first_rank]
                if tasks:
                    w.jobwide.append((t + 1.1, "err", f"srun: error: {n.short}: task{'s' if len(tasks) > 1 else ''} "
                                                      f"{_ranges(tasks)}: Killed"))
        else:
            by_node: dict[int, list[tuple[int, int]]] = {}
            for k, (_tt, c) in sorted(failed.items()):
                if k != first_rank:
                    by_node.setdefault(w.ranks[k].node.index, []).append((k, c))
            for ni, items in sorted(by_node.items()):
                ts = max(failed[k][0] for k, _ in items) + rng.uniform(0.2, 2)
                for c in sorted({c for _, c in items}):
                    ks = [k for k, cc in items if cc == c]
                    desc = sig.get(c, f"Exited with exit code {c}")
                    w.jobwide.append((ts, "err", f"srun: error: {w.nodes[ni].short}: task{'s' if len(ks) > 1 else ''}"
                                                 f" {_ranges(ks)}: {desc}"))
        return
    if w.layout == "pods-launcher":
        name = {-9: "Killed", -6: "Aborted", -11: "Segmentation fault"}
        t = t_first + rng.uniform(0.3, 2)
        bar = "-" * 74
        if code < 0:
            lines = [bar, "Primary job  terminated normally, but 1 process returned",
                     "a non-zero exit code. Per user-direction, the job has been aborted.", bar, bar,
                     f"mpirun noticed that process rank {first_rank} with PID 0 on node {r0.node.pod_host} exited on signal "
                     f"{-code} ({name[code]}).", bar]
        else:
            lines = [bar, "Primary job  terminated normally, but 1 process returned",
                     "a non-zero exit code. Per user-direction, the job has been aborted.", bar, bar,
                     "mpirun detected that one or more processes exited with non-zero status, thus causing",
                     "the job to be terminated. The first process to do so was:", "",
                     f"  Process name: [[{rng.randrange(10000, 65000)},1],{first_rank}]", f"  Exit code:    {code}",
                     bar]
        for ln in lines:
            w.jobwide.append((t, "err", ln))


def _ranges(ks: list[int]) -> str:
    ks = sorted(ks)
    out_, start, prev = [], ks[0], ks[0]
    for k in [*ks[1:], None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        out_.append(f"{start}-{prev}" if prev != start else f"{start}")
        if k is not None:
            start = prev = k
    return ",".join(out_)


def _cut_after(w: World, cutoff: dict[int, float]) -> None:
    """A process killed at ``cutoff[rank]`` prints nothing after it (its lines are dropped)."""
    for r in w.ranks:
        if r.rank in cutoff:
            c = cutoff[r.rank]
            r.lines = [x for x in r.lines if x[0] <= c]
            r.nccl = [x for x in r.nccl if x[0] <= c]


def _mpi_cut(w: World, failed: dict[int, tuple[float, int]]) -> dict[int, tuple[float, int]]:
    """mpirun tears the whole job down at the first process' death: nobody prints after that."""
    if w.layout != "pods-launcher" or not failed:
        return failed
    t_first = min(t for t, _ in failed.values())
    cut = t_first + 0.4
    _cut_after(w, {r.rank: cut for r in w.ranks})
    return {k: v for k, v in failed.items() if v[0] <= cut}


def fault_none(w: World, t_fault: float) -> None:
    rng = w.rng
    # the snapshot is taken mid-run: a few more loss lines, nothing wrong
    trainer_output(w, t_fault, t_fault + rng.uniform(30, 120), rng.uniform(0.9, 3.2))


def fault_hang(w: World, t_fault: float) -> None:
    rng = w.rng
    c = w.ranks[w.culprit["rank"]]
    aborts = _victims_timeout(w, t_fault, {c.rank})
    if w.profile.dump_signal:
        first = min(aborts, key=lambda k: aborts[k])
        t_sig = t_fault + w.timeout_ms / 1000 + rng.uniform(0.5, 1.2)
        c10(w, c, t_sig, "E", 1794, f"{pg(c)} Observed flight recorder dump signal from another rank via TCPStore.")
        c10(w, c, t_sig, "E", w.profile.dump_signal,
            f"{pg(c)} Received a dump signal due to a collective timeout from  rank {first} and we will try our best to "
            f"dump the debug info. Last enqueued NCCL work: {w.seq - 1}, last completed NCCL work: {w.seq - 1}.This is "
            "most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of "
            "collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. "
            "Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the "
            "communications library (e.g. NCCL), etc. ")
    failed = {k: (t, -6) for k, t in aborts.items()}
    if not w.torchrun and w.layout == "shared-fs" and w.kill_on_bad_exit:
        t_first = min(failed.values())[0]
        _cut_after(w, {r.rank: t_first + 1.5 for r in w.ranks})
        failed = {k: v for k, v in failed.items() if v[0] <= t_first + 1.5}
    failed = _mpi_cut(w, failed)
    if w.torchrun:  # torchrun on the culprit's node kills it with the others
        t_kill = min(t for k, (t, _) in failed.items() if w.ranks[k].node is c.node) + 0.5
        _cut_after(w, {r.rank: t_kill for r in w.by_node(c.node) if r.rank not in failed})
    _finish(w, failed)


def fault_crash(w: World, t_fault: float) -> None:
    rng = w.rng
    c = w.ranks[w.culprit["rank"]]
    how = w.culprit["how"]
    if how == "oom":
        oom_kill(w, c, t_fault)
        code = -9
    else:
        cuda_error(w, c, t_fault, "an illegal memory access was encountered", in_watchdog=False)
        xid(w, c, t_fault - 0.02, 31, "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_3 faulted "
                                      f"@ 0x7f{_hex(rng, 2)}_{_hex(rng, 8)}. Fault is of type FAULT_PDE "
                                      "ACCESS_TYPE_VIRT_READ", with_pid=True)
        code = 1
    failed: dict[int, tuple[float, int]] = {c.rank: (t_fault, code)}
    _cut_after(w, {c.rank: t_fault})
    # the crashed node's launcher takes its other ranks down within a second (torchrun SIGTERM, srun/mpirun kill)
    t_node_gone = t_fault + rng.uniform(0.3, 1.5)
    # ncclSocketToString(..., numericHostForm=0): getnameinfo's reverse lookup -- the name DNS or /etc/hosts gives,
    # or the address when there is none (pod IPs)
    peer_host = c.node.pod_ip if c.node.pod else rng.choice([c.node.fqdn, c.node.short, c.node.ip])
    # ranks on the nodes that exchange data with the crashed node's ranks see their sockets close
    near = {(c.node.index + 1) % len(w.nodes), (c.node.index - 1) % len(w.nodes)} - {c.node.index}
    # torchrun takes the crashed rank's neighbours down at once; under srun/mpirun they live on until they fail
    skip = {r.rank for r in w.by_node(c.node)} if w.torchrun else {c.rank}
    for ni in sorted(near):
        for r in w.by_node(w.nodes[ni]):
            if r.local == c.local or rng.random() < 0.25:
                t_err = t_node_gone + rng.uniform(0.01, 2.0)
                msg = f"socketProgress: Connection closed by remote peer {peer_host}<{rng.randrange(30000, 61000)}>"
                tid = r.pid + rng.randrange(100, 300)
                nccl_warn(w, r, t_err, tid, w.profile.socket_loc, msg)
                # the NCCLCHECK trail (src/include/checks.h): ncclSocketRecv, then the proxy's receive of a response
                nccl_info(w, r, t_err, tid, f"misc/socket.cc:{789 if w.profile is P25 else 843} -> 6")
                nccl_info(w, r, t_err, tid, f"proxy.cc:{1211 if w.profile is P25 else 1283} -> 6")
                failed[r.rank] = remote_error(w, r, t_err + rng.uniform(0.05, 1.0), msg, w.seq + rng.choice([0, 1]))
                skip.add(r.rank)
    if w.torchrun:
        # ranks of a node whose torchrun already failed are killed, not timed out
        dead_nodes = {w.ranks[k].node.index for k in failed}
        skip |= {r.rank for r in w.ranks if r.node.index in dead_nodes}
    aborts = _victims_timeout(w, t_fault, skip)
    failed.update({k: (t, -6) for k, t in aborts.items()})
    if w.torchrun:
        cut = {}
        for n in w.nodes:
            mine = [failed[r.rank][0] for r in w.by_node(n) if r.rank in failed]
            if mine:
                for r in w.by_node(n):
                    if r.rank not in failed:
                        cut[r.rank] = min(mine) + 0.5
        _cut_after(w, cut)
    elif w.layout == "shared-fs" and w.kill_on_bad_exit:
        _cut_after(w, {r.rank: t_fault + 3 for r in w.ranks if r.rank != c.rank})
        failed = {k: v for k, v in failed.items() if v[0] <= t_fault + 3}
    failed = _mpi_cut(w, failed)
    _finish(w, failed)


def fault_ib(w: World, t_fault: float) -> None:
    rng = w.rng
    c = w.ranks[w.culprit["rank"]]
    hca = w.culprit["hca"]
    p = w.profile
    tid = c.pid + rng.randrange(20, 60)
    nccl_warn(w, c, t_fault, tid, p.async_loc, p.async_fmt.format(dev=hca, port=1, what="port error"))
    if rng.random() < 0.5:
        nic = NIC_BUS["dgx-h100" if w.ranks[0].bus.split(":")[1] == "1b" else "hgx-h100"][c.local]
        kern(w, c.node, t_fault - 0.01, f"mlx5_core 0000:{nic}:00.0: Port module event: module {c.local}, Cable "
                                        "unplugged")
    nxt = w.ranks[(c.rank + w.gpus) % w.world]
    prv = w.ranks[(c.rank - w.gpus) % w.world]
    failed: dict[int, tuple[float, int]] = {}

    def completion(r: Rank, peer: Node, t: float, status: int, kind: str) -> str:
        addr = f"{peer.pod_ip or peer.ip}<{rng.randrange(30000, 61000)}>"
        if p.completion_2x:
            msg = (f"NET/IB: Got completion from peer {addr} with status={status} opcode=0 len=0 vendor err "
                   f"{129 if status == 12 else 244} ({kind}) hca mlx5_{r.local}")
        else:
            msg = (f"NET/IB : Got completion from peer {addr} with status={status} opcode=0 len=0 vendor err "
                   f"{129 if status == 12 else 244} ({kind})")
        tid = r.pid + rng.randrange(150, 260)
        nccl_warn(w, r, t, tid, p.completion_loc, msg)
        # ncclIbTest's caller in the proxy's progress (src/transport/net.cc recv/send progress, src/proxy.cc)
        recv = kind == "Recv"
        nccl_info(w, r, t, tid, f"transport/net.cc:{(1302 if recv else 1137) if p is P25 else (1384 if recv else 1215)} -> 6")
        nccl_info(w, r, t, tid, f"proxy.cc:{878 if p is P25 else 929} -> 6 [Progress Thread]")
        return msg

    t_err = t_fault + rng.uniform(7, 20)  # NCCL_IB_TIMEOUT's retries run out
    last = completion(c, nxt.node, t_err, 12, "Send")
    failed[c.rank] = remote_error(w, c, t_err + rng.uniform(0.05, 0.5), last, w.seq)
    for peer in {nxt.rank: nxt, prv.rank: prv}.values():
        if peer.node is c.node:
            continue
        te = t_err + rng.uniform(0.0, 1.5)
        last = completion(peer, c.node, te, 12, rng.choice(["Recv", "Send"]))
        failed[peer.rank] = remote_error(w, peer, te + rng.uniform(0.05, 0.5), last, w.seq)
    skip = set(failed)
    if w.torchrun:
        dead_nodes = {w.ranks[k].node.index for k in failed}
        skip |= {r.rank for r in w.ranks if r.node.index in dead_nodes}
    aborts = _victims_timeout(w, t_fault, skip)
    failed.update({k: (t, -6) for k, t in aborts.items()})
    _after_failures(w, failed)


def fault_xid79(w: World, t_fault: float) -> None:
    rng = w.rng
    c = w.ranks[w.culprit["rank"]]
    xid(w, c, t_fault, 79, "GPU has fallen off the bus.", with_pid=False)
    kern(w, c.node, t_fault, f"NVRM: GPU {c.bus}: GPU has fallen off the bus.")
    t_err = t_fault + rng.uniform(0.5, 5)
    cuda_error(w, c, t_err, "unspecified launch failure", in_watchdog=True)
    failed = {c.rank: (t_err, -6)}
    skip = set(failed)
    if w.torchrun:
        skip |= {r.rank for r in w.by_node(c.node)}
    aborts = _victims_timeout(w, t_fault, skip)
    failed.update({k: (t, -6) for k, t in aborts.items()})
    _after_failures(w, failed)


def _after_failures(w: World, failed: dict[int, tuple[float, int]]) -> None:
    if w.torchrun:
        cut = {}
        for n in w.nodes:
            mine = [failed[r.rank][0] for r in w.by_node(n) if r.rank in failed]
            if mine:
                for r in w.by_node(n):
                    if r.rank not in failed:
                        cut[r.rank] = min(mine) + 0.5
        _cut_after(w, cut)
    elif w.layout == "shared-fs" and w.kill_on_bad_exit:
        first = min(t for t, _ in failed.values())
        _cut_after(w, {r.rank: first + 1.5 for r in w.ranks})
        failed = {k: v for k, v in failed.items() if v[0] <= first + 1.5}
    failed = _mpi_cut(w, failed)
    _finish(w, failed)


# ---------------------------------------------------------------------------------------------------------------
# Layouts: where the lines land


def _stream(r: Rank, with_nccl: bool) -> list[tuple[float, str, str]]:
    """A process' console: its stdout/stderr lines, plus NCCL's (stdout) unless NCCL_DEBUG_FILE takes them."""
    items = list(r.lines)
    if with_nccl:
        items += [(t, "out", ln) for t, ln in r.nccl]
    return sorted(items, key=lambda x: x[0])


def _worker_console(w: World, n: Node) -> list[tuple[float, str, str]]:
    """What torchrun's console shows on a node: its workers' lines (``[default<l>]:`` with --tee 3) and its own."""
    items: list[tuple[float, str, str]] = list(n.launcher)
    for r in w.by_node(n):
        pre = f"[default{r.local}]:" if w.tee_prefix else ""
        items += [(t, s, pre + ln) for t, s, ln in _stream(r, not w.nccl_file)]
    return sorted(items, key=lambda x: x[0])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _lines(items: list[tuple[float, str, str]]) -> str:
    return "".join(ln + "\n" for _, _, ln in items)


def _cri(items: list[tuple[float, str, str]], rng: random.Random) -> str:
    """CRI records as the runtime stamps them on arrival: never earlier than the record before."""
    out_ = []
    last = 0.0
    for t, s, ln in items:
        last = max(last + 0.000001, t + rng.uniform(0.00001, 0.0009))
        stamp = rfc3339nano(last)
        out_.append(f"{stamp} {'stdout' if s == 'out' else 'stderr'} F {ln}\n")
    return "".join(out_)


def write_layout(w: World, roots: dict[str, Path]) -> str:
    """Places every line where the layout puts it; returns the globs the operator's config lists."""
    rng = w.rng
    lay = w.layout
    if lay == "node-local":
        for n in w.nodes:
            root = roots[n.host]
            for r in w.by_node(n):
                _write(root / f"var/log/nccl/{r.nccl_host}.{r.pid}.log", "".join(ln + "\n" for _, ln in r.nccl))
            _write(root / f"var/log/training/{w.job_name}-{n.short}.log", _lines(_worker_console(w, n)))
        return '["/var/log/nccl/*.log", "/var/log/training/*.log"]'
    if lay == "shared-fs":
        files = {f"home/{w.user}/logs/{w.job_name}-{r.rank}.out": _lines(_stream(r, True)) for r in w.ranks}
        t_sub = w.t0 - rng.uniform(30, 600)
        head = [(t_sub, "out", f"Job {w.job_id} on {','.join(n.short for n in w.nodes)}"),
                (t_sub + 1, "out", f"MASTER_ADDR={w.nodes[0].short} MASTER_PORT=29500 WORLD_SIZE={w.world}")]
        files[f"home/{w.user}/{w.job_name}/slurm-{w.job_id}.out"] = _lines(sorted(head + w.jobwide))
        for n in w.nodes:  # /home is NFS: the same files on every node
            for rel, text in files.items():
                _write(roots[n.host] / rel, text)
        return '["/var/log/nccl/*.log", "/home/*/logs/*.out"]'
    if lay in ("slurm-job", "slurm-job-label"):
        label = lay == "slurm-job-label"
        width = len(str(len(w.nodes) - 1))  # src/api/step_io.c _wid(num_tasks)
        items: list[tuple[float, str, str]] = [(w.t0 - 2, "out", f"Starting {w.job_name} on {len(w.nodes)} nodes")]
        for n in w.nodes:
            pre = f"{n.index:{width}d}: " if label else ""
            items += [(t, s, pre + ln) for t, s, ln in _worker_console(w, n)]
        items += w.jobwide
        first = w.nodes[0]
        if rng.random() < 0.5:
            rel = f"var/spool/slurm/job{w.job_id}/slurm-{w.job_id}.out"
        else:
            rel = f"raid/{w.user}/runs/{w.job_name}/slurm-{w.job_id}.out"
        w.batch_file = rel
        _write(roots[first.host] / rel, _lines(sorted(items, key=lambda x: x[0])))
        return '["/var/log/nccl/*.log", "/var/spool/slurm/job*/slurm-*.out", "/raid/*/runs/*/slurm-*.out"]'
    if lay == "pods-split":
        for n in w.nodes:
            d = f"var/log/pods/{w.namespace}_{n.pod}_{n.pod_uid}/{n.container}/0.log"
            _write(roots[n.host] / d, _cri(_worker_console(w, n), rng))
            _system_pods(w, n, roots[n.host])
        return '["/var/log/nccl/*.log"]'
    if lay == "pods-launcher":
        host_node = w.nodes[0] if rng.random() < 0.6 else rng.choice(w.nodes)
        launcher = f"{w.k8s_job}-launcher-{_suffix(rng)}"
        items = []
        for r in w.ranks:
            for t, s, ln in _stream(r, True):
                tag = f"[1,{r.rank}]<{'stdout' if s == 'out' else 'stderr'}>:" if w.mpi_tag else ""
                items.append((t, s, tag + ln))
        items += w.jobwide
        items.sort(key=lambda x: x[0])
        uid = _uuid(rng)
        _write(roots[host_node.host] / f"var/log/pods/{w.namespace}_{launcher}_{uid}/launcher/0.log", _cri(items, rng))
        for n in w.nodes:
            sshd = [(w.t0 - 40, "err", "Server listening on 0.0.0.0 port 22."),
                    (w.t0 - 40, "err", "Server listening on :: port 22.")]
            _write(roots[n.host] / f"var/log/pods/{w.namespace}_{n.pod}_{n.pod_uid}/{n.container}/0.log", _cri(sshd, rng))
            _system_pods(w, n, roots[n.host])
        return '["/var/log/nccl/*.log"]'
    raise AssertionError(lay)


def _system_pods(w: World, n: Node, root: Path) -> None:
    rng = w.rng
    t = w.t0 - rng.uniform(3600, 86400)
    kp = f"kube-proxy-{_suffix(rng)}"
    lines = [(t, "err", f"I{_dt(t).strftime('%m%d %H:%M:%S')}.{rng.randrange(10**6):06d}       1 server_linux.go:66 "
                        '"Using iptables proxy"'),
             (t + 0.1, "err", f"I{_dt(t).strftime('%m%d %H:%M:%S')}.{rng.randrange(10**6):06d}       1 "
                              'server.go:677 "Version info" version="v1.31.4"')]
    _write(root / f"var/log/pods/kube-system_{kp}_{_uuid(rng)}/kube-proxy/0.log", _cri(lines, rng))
    dc = f"nvidia-dcgm-exporter-{_suffix(rng)}"
    lines = [(t + 5, "err", f'time="{_dt(t + 5).strftime("%Y-%m-%dT%H:%M:%SZ")}" level=info msg="Starting dcgm-exporter" '
                            'Version=3.3.9-3.6.1'),
             (t + 6, "err", f'time="{_dt(t + 6).strftime("%Y-%m-%dT%H:%M:%SZ")}" level=info msg="Pipeline starting"'),
             (t + 7, "err", f'time="{_dt(t + 7).strftime("%Y-%m-%dT%H:%M:%SZ")}" level=info msg="Starting webserver"')]
    _write(root / f"var/log/pods/gpu-operator_{dc}_{_uuid(rng)}/nvidia-dcgm-exporter/0.log", _cri(lines, rng))


def write_sysfs(w: World, n: Node, root: Path) -> None:
    """/sys/class/infiniband/<hca>/ports/1 as drivers/infiniband/core/sysfs.c renders it."""
    rng = w.rng
    for i in range(w.gpus + 1):
        hca = f"mlx5_{i}"
        base = root / "sys/class/infiniband" / hca
        storage = i == w.gpus  # the storage NIC: RoCE on the Ethernet fabric
        _write(base / "fw_ver", "28.39.1002\n" if not storage else "22.41.1000\n")
        _write(base / "hca_type", "MT4129\n" if not storage else "MT4125\n")
        _write(base / "node_guid", ":".join(_hex(rng, 4) for _ in range(4)) + "\n")
        port = base / "ports/1"
        down = n.port_down == hca
        _write(port / "state", "1: DOWN\n" if down else "4: ACTIVE\n")
        _write(port / "phys_state", "2: Polling\n" if down else "5: LinkUp\n")
        if storage:
            _write(port / "rate", "200 Gb/sec (4X HDR)\n")
            _write(port / "link_layer", "Ethernet\n")
        else:
            _write(port / "rate", "10 Gb/sec (4X SDR)\n" if down else "400 Gb/sec (4X NDR)\n")
            _write(port / "link_layer", "InfiniBand\n")
        counters = {
            "symbol_error": 0, "port_rcv_errors": 0, "link_error_recovery": 0,
            "link_downed": (1 if down else 0) + rng.choice([0, 0, 0, 1]), "port_xmit_discards": rng.choice([0, 0, 3]),
            "local_link_integrity_errors": 0, "excessive_buffer_overrun_errors": 0, "port_rcv_remote_physical_errors": 0,
            "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "VL15_dropped": 0,
            "port_xmit_wait": rng.randrange(10**6, 10**9), "port_rcv_data": rng.randrange(10**12, 10**14),
            "port_xmit_data": rng.randrange(10**12, 10**14), "port_rcv_packets": rng.randrange(10**10, 10**12),
            "port_xmit_packets": rng.randrange(10**10, 10**12),
        }
        for k, v in counters.items():
            _write(port / "counters" / k, f"{v}\n")


def write_config(w: World, globs: str) -> str:
    return (
        "# Written for a post-mortem over copied node snapshots (docs/correlator.md, \"Offline\"; docs/operations.md,\n"
        "# \"Training logs: where the agent reads them\"). The kernel log is the node's rsyslog capture: a snapshot\n"
        "# holds no /dev/kmsg.\n"
        "[collectors.kmsg_xid]\n"
        'path = "/var/log/kern.log"\n'
        "\n"
        "[collectors.nccl_logs]\n"
        f"globs = {globs}\n"
        'pod_logs = "auto"\n'
    )


def generate(outdir: Path, layout: str, fault: str, nodes: int = 4, gpus_per_node: int = 8, seed: int = 0) -> dict[str, Any]:
    """Writes one scenario under ``outdir``; returns expected.json's content (plus ``roots`` and ``config``)."""
    w = build_world(layout, fault, nodes, gpus_per_node, seed)
    simulate(w)
    outdir = Path(outdir)
    roots = {n.host: outdir / "roots" / n.host for n in w.nodes}
    for n in w.nodes:
        root = roots[n.host]
        _write(root / "etc/hostname", n.host + "\n")
        _write(root / "var/log/kern.log", render_kern(w, n))
        write_sysfs(w, n, root)
    globs = write_layout(w, roots)
    config = outdir / "config.toml"
    _write(config, write_config(w, globs))
    expected: dict[str, Any] = {
        "layout": layout, "fault": fault, "seed": seed, "nodes": [n.host for n in w.nodes], "gpus_per_node": gpus_per_node,
        "healthy": fault == "healthy",
        "culprit_node": w.culprit.get("node"),
        "culprit_entity_kind": ENTITY_KIND[fault],
        "culprit": w.culprit,
        "job": {"comm_id": w.comm_id, "slurm_job_id": w.job_id if layout.startswith(("slurm", "shared")) else None,
                "k8s": f"{w.namespace}/{w.k8s_job}" if w.k8s_job else None, "name": w.job_name,
                "world_size": w.world, "seq": w.seq},
        # who prints which host name: NCCL's "host:" prefix and torchrun's host (node names, or pod names)
        "hosts": {**{r.nccl_host: r.node.host for r in w.ranks}, **{n.short: n.host for n in w.nodes},
                  **{n.fqdn: n.host for n in w.nodes}, **{n.pod: n.host for n in w.nodes if n.pod}, **{n.pod_host: n.host for n in w.nodes if n.pod},
                  **{n.pod_fqdn: n.host for n in w.nodes if n.pod}},
        "ranks": {str(r.rank): r.node.host for r in w.ranks},
        "profile": w.profile.name,
        "variant": {"rank_prefix": w.rank_prefix, "tee_prefix": w.tee_prefix, "mpi_tag": w.mpi_tag,
                    "kern_style": w.kern_style, "driver": w.driver, "trainer": w.style,
                    "kill_on_bad_exit": w.kill_on_bad_exit, "batch_file": w.batch_file},
    }
    _write(outdir / "expected.json", json.dumps(expected, indent=1) + "\n")
    expected["roots"] = [str(roots[n.host]) for n in w.nodes]
    expected["config"] = str(config)
    return expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=LAYOUTS, required=True)
    ap.add_argument("--fault", choices=FAULTS, required=True)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("outdir", type=Path)
    a = ap.parse_args(argv)
    exp = generate(a.outdir, a.layout, a.fault, a.nodes, a.gpus_per_node, a.seed)
    print(json.dumps({k: exp[k] for k in ("culprit_node", "culprit_entity_kind", "healthy", "culprit")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
