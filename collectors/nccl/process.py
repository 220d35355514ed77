"""What one NCCL process said so far: its communicators, transport, NICs, settings and PyTorch's progress.

Each rule's ``update`` (rules/*.py) writes its part; the plugin judges conditions over the whole
(``transport``, ``nics_used``, ``direct_nics``) and every message carries ``summary()``, the fields the
fleet correlator lives on (gna_types.details.ProcessSummary).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collectors.nccl.hca_names import natural_key
from gna_types import entities
from gna_types.entities import pci_from_nccl

# a GPU's PCI address from NCCL's busId (pure; a process's is asked for at every chunk that touches it)
pci_of = functools.lru_cache(maxsize=1024)(pci_from_nccl)

if TYPE_CHECKING:
    from collectors.nccl.matching import Match
    from collectors.nccl.rule import Rule

_IB_DEV = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)/(IB|RoCE)(/SHARP)?")


def parse_ib_devices(devs: str) -> list[dict[str, Any]]:
    """NCCL's device list ("[0]mlx5_0:1/IB [1]mlx5_1:1/RoCE/SHARP"): index, name, port, link layer."""
    return [{"index": int(i), "name": n, "port": int(p), "link": ll, "sharp": bool(sh)}
            for i, n, p, ll, sh in _IB_DEV.findall(devs)]


MAX_COMMS = 32  # communicators remembered per process (world, its splits; more are counted, not kept)


@dataclass
class ProcessState:
    host: str
    pid: int
    file: str
    comms: dict[str, dict[str, Any]] = field(default_factory=dict)
    net: str | None = None
    ib_no_device: bool = False
    no_verbs: bool = False
    ib_devices: list[dict[str, Any]] = field(default_factory=list)
    oob: str = ""  # NCCL's bootstrap interface and address ("ib0:10.0.0.5<0>")
    socket_ifs: str = ""
    gdr_disabled: set[str] = field(default_factory=set)
    non_gdr_channels: int = 0
    shm_channels: int = 0
    socket_channels: int = 0
    channel_nets: set[str] = field(default_factory=set)  # NET/<name> on channel/ring lines
    # NET/IB/<n> on channel lines: n indexes NCCL's own device list ("NET/IB : Using [0]mlx5_0:1/IB ..."),
    # not the mlx5_<n> number -- the NICs this process's channels really use
    channel_devs: set[int] = field(default_factory=set)
    direct_devs: set[int] = field(default_factory=set)  # the same without PXN sends: NICs of this rank's own GPU
    version: str = ""  # "2.21.5+cuda12.4" from "NCCL version ..."
    env_hca: str = ""
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* echoed by "set by environment to"
    # process group -> PyTorch's last word on its progress: {"enqueued", "completed", "at", "world_rank"}
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_seen: float = 0.0
    lines: int = 0
    # the pod it runs in: its container log's path, or its /proc/<pid>/cgroup (the pod's UID only)
    pod: str | None = None  # "namespace/name"
    container: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None  # SLURM_JOB_ID in its environment
    relayed: bool = False  # another node's process, read here in a job-wide file (collectors/nccl/writers.py)
    # its watchdog timed out, or NCCL failed under it for a peer: an abort that follows is PyTorch's own
    # (TORCH_NCCL_ASYNC_ERROR_HANDLING tears the process down: SIGABRT), a victim's end
    collective_failed: bool = False
    ended_told: bool = False  # a TorchRankFailed about it was published (the kernel's OOM kill need not be)
    # its conditions' last evaluation that went through: (monotonic time, what the node looked like then) --
    # a chunk that only counted repeats of lines already applied need not judge it again (plugin._evaluate)
    judged: tuple[float, tuple[Any, ...]] | None = None
    # each Rule.last_wins rule's fields its counted lines last wrote (a repeated key's fields are one dict: identity
    # says the state is already theirs); a decoded line of the rule forgets them
    tallied: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}"

    @property
    def entity(self) -> str:
        return entities.nccl_process(self.host, self.pid)

    def transport(self) -> str | None:
        """The inter-node transport NCCL says it uses: "Using network X" (2.6+), else the channel or
        ring lines' NET/<name> (2.4/2.5 print no "Using network"); None before either appeared."""
        if self.net:
            return self.net
        if self.channel_nets:
            ib = sorted(n for n in self.channel_nets if n != "Socket")
            return ib[0] if ib else "Socket"
        return None

    def ranks(self) -> list[int]:
        return sorted({c["rank"] for c in self.comms.values()})

    def world_rank(self) -> int | None:
        """Its rank in its largest communicator (the job's world; a tensor-parallel split's rank is another
        number): the rank PyTorch's "[rankN]:" and the default group's "[Rank N]" name."""
        world = max(self.comms.values(), key=lambda c: c["nranks"], default=None)
        return world["rank"] if world is not None else None

    def apply(self, m: Match) -> bool:
        """The line's change to this process's state, as its rule declares it (a hang symptom marks its
        collective failed); True: news worth a message (a communicator joined)."""
        self.collective_failed |= m.rule.hang
        if m.rule.last_wins:
            self.tallied.pop(m.rule.name, None)
        return m.rule.update(self, m.fields) if m.rule.update is not None else False

    def tally(self, rule: Rule, fields: dict[str, Any], n: int) -> bool:
        """``n`` lines of a rule that only tallies its repeats (Rule.tally), all of them decoding to ``fields``
        for what the tally reads: the state ``apply`` would leave after each of them. False: only counts grew (the
        repeats of a line already applied re-add what it added) or a Rule.last_wins rule wrote the fields it
        last wrote -- nothing a condition reads beyond counts already past zero changed."""
        self.collective_failed |= rule.hang
        if rule.tally is not None:
            rule.tally(self, fields, n)
        if not rule.last_wins or self.tallied.get(rule.name) is fields:
            return False
        self.tallied[rule.name] = fields
        return True

    def summary(self) -> dict[str, Any]:
        first = next(iter(self.comms.values()), {})
        world: tuple[str | None, dict[str, Any]] = max(self.comms.items(), key=lambda kv: kv[1]["nranks"],
                                                       default=(None, {}))
        return {"host": self.host, "pid": self.pid, "file": self.file, "ranks": self.ranks(),
                "nranks": first.get("nranks"), "bus_id": first.get("bus_id"),
                "pci": pci_of(first.get("bus_id")),
                "comm_ids": sorted(self.comms)[:8], "job": world[0], "world_rank": world[1].get("rank"),
                "world_size": world[1].get("nranks"), "transport": self.transport(),
                "hcas": sorted({f"{d['name']}/{d['port']}" for d in self.ib_devices})[:16], "oob": self.oob or None,
                "progress": self.progress.get("0"), "nics": self.nics_used(),
                **({"pod": self.pod, "container": self.container, "pod_uid": self.pod_uid} if self.pod_uid else {}),
                **({"relayed": True} if self.relayed else {})}

    def nics_used(self) -> list[str] | None:
        """"mlx5_3/1" for each NCCL device index a channel line named (None before any did, or when an
        index is not in NCCL's list: a plugin's numbering we cannot map)."""
        by_index = {d["index"]: f"{d['name']}/{d['port']}" for d in self.ib_devices}
        if not self.channel_devs or not all(i in by_index for i in self.channel_devs):
            return None
        if sorted(by_index) != list(range(len(by_index))):  # a merged-NIC list (2.19-2.22): see direct_nics
            return None
        return sorted({by_index[i] for i in self.channel_devs})

    def direct_nics(self) -> list[str] | None:
        """RDMA device names of the NCCL devices this rank's own channels use (PXN sends left out: they leave
        through the proxy GPU's NIC). None before any channel line, or when NCCL's list cannot be read index
        for index: 2.19-2.22 print a merged NIC as "[d]={[i] a:1/IB, [j] b:1/IB}" and number the rest by
        physical device while channels count merged ones (net_ib.cc ncclIbInit, v2.21.5-1), so only a list
        numbered 0..n-1 without gaps maps, and every index a channel names must be in it."""
        by_index = {d["index"]: d["name"] for d in self.ib_devices}
        if not self.direct_devs or sorted(by_index) != list(range(len(by_index))):
            return None
        if not all(i in by_index for i in self.direct_devs):
            return None
        return sorted({by_index[i] for i in self.direct_devs}, key=natural_key)
