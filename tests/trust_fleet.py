"""Honest jobs and hostile reporters, built from the documented message formats (#20 deliver 7).

Shapes come from docs/messages.md, docs/correlator.md, docs/ras.md and agent/schema/message.schema.json
only -- never from the correlator's code -- so a scenario is not shaped by what it tests. Every message
is built with ``agent.message.make_message`` (a schema-valid document) and published where an agent
publishes it (``gna_types.subjects.subjects_for``).

A job is ``per_node`` ranks on each of its nodes, in order: node ``nodes[i]`` hosts world ranks
``i * per_node .. i * per_node + per_node - 1``; local rank ``l`` runs as pid ``40000 + l`` on GPU
``PCIS[l]`` and uses NIC port ``HCAS[l]``. A node's bootstrap address is derived from its name.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from agent.message import make_message, to_dict
from gna_types.subjects import subjects_for

PCIS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
HCAS = [f"mlx5_{i}/1" for i in range(8)]
SEQ = 4211  # the collective the honest ranks time out in


def ip_of(node: str) -> str:
    h = zlib.crc32(node.encode())
    return f"10.{(h >> 16) & 0xFF}.{(h >> 8) & 0xFF}.{(h & 0xFF) or 1}"


def bus_id(pci: str) -> str:
    """NCCL's busId: the address' hex digits as %lx (0000:18:00.0 -> 18000)."""
    return format(int(pci.replace(":", "").replace(".", ""), 16), "x")


def message(node: str, type_: str, *, collector: str, severity: str, entity: str, kind: str = "event",
            status: str | None = None, reason: str = "R", text: str = "m", details: dict[str, Any] | None = None,
            action: str = "none") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector=collector, kind=kind, type=type_,  # type: ignore[arg-type]
                                severity=severity, entity=entity, reason=reason, message=text,  # type: ignore[arg-type]
                                status=status, details=details or {}, suggested_action=action))  # type: ignore[arg-type]


def hardware(node: str, type_: str, entity: str, *, severity: str = "critical", status: str | None = "firing",
             collector: str | None = None) -> dict[str, Any]:
    """A node's finding about its own GPU or NIC port (GPUFellOffBus, IBPortDown, GPUXidError, ...)."""
    if collector is None:
        collector = "infiniband" if entity.startswith("ib:") else "kmsg_xid"
    kind = "condition" if status is not None else "event"
    details: dict[str, Any] = {}
    if type_ == "GPUXidError":
        details = {"xid": 79, "name": "GPU has fallen off the bus", "count": 1, "source": "kmsg"}
    elif type_ == "IBPortDown":
        details = {"state": "DOWN", "phys_state": "Disabled", "rate": "400 Gb/sec", "link_layer": "InfiniBand"}
    return message(node, type_, collector=collector, severity=severity, entity=entity, kind=kind, status=status,
                   details=details, action="reboot" if type_ == "GPUFellOffBus" else "none")


def gpu_fell_off(node: str, pci: str = PCIS[0]) -> dict[str, Any]:
    return hardware(node, "GPUFellOffBus", f"gpu:{pci}")


def ib_port_down(node: str, port: str = HCAS[0]) -> dict[str, Any]:
    return hardware(node, "IBPortDown", f"ib:{port}")


def publications(m: dict[str, Any]) -> list[str]:
    """Every subject the node's agent publishes ``m`` on."""
    return subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"])


def comm_hash(job: str) -> str:
    """How NCCL's RAS prints a commId: 16 hex digits, zero-padded."""
    return job[2:].rjust(16, "0") if job.startswith("0x") else job


@dataclass
class Job:
    job: str
    nodes: list[str]
    per_node: int = 8

    @property
    def size(self) -> int:
        return self.per_node * len(self.nodes)

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // self.per_node]

    def ranks_of(self, node: str) -> list[int]:
        i = self.nodes.index(node)
        return list(range(i * self.per_node, (i + 1) * self.per_node))

    def pci_of(self, rank: int) -> str:
        return PCIS[rank % self.per_node]

    def port_of(self, rank: int) -> str:
        return HCAS[rank % self.per_node]

    def summary(self, rank: int, node: str | None = None, pid: int | None = None) -> dict[str, Any]:
        """The process summary every NCCL message of a rank's process carries (docs/messages.md)."""
        node = node or self.node_of(rank)
        local = rank % self.per_node
        pid = 40000 + local if pid is None else pid
        pci = PCIS[local]
        return {"host": node, "pid": pid, "file": f"/var/log/nccl/{node}.{pid}.log", "ranks": [rank],
                "nranks": self.size, "bus_id": bus_id(pci), "pci": pci, "comm_ids": [self.job], "job": self.job,
                "world_rank": rank, "world_size": self.size, "transport": "IB", "hcas": list(HCAS),
                "oob": f"ib0:{ip_of(node)}<0>", "progress": None, "nics": [HCAS[local]]}

    def nccl(self, r: int, type_: str, severity: str, /, *, node: str | None = None, pid: int | None = None,
             reason: str = "R", text: str = "m", **extra: Any) -> dict[str, Any]:
        """A message of world rank ``r``'s process (``node``/``pid`` override where it runs); ``extra`` goes
        into the details, over the process summary."""
        s = self.summary(r, node, pid)
        return message(s["host"], type_, collector="nccl_logs", severity=severity,
                       entity=f"nccl:{s['host']}:{s['pid']}", reason=reason, text=text, details={**s, **extra})

    def member(self, rank: int, /, **override: Any) -> dict[str, Any]:
        local = rank % self.per_node
        fields = {"comm_id": self.job, "rank": rank, "size": self.size, "cuda_dev": local, **override}
        return self.nccl(rank, "NCCLJobMember", "info", reason="CommInit",
                         text=f"joined communicator {self.job} as rank {rank}", **fields)

    def members(self, node: str | None = None) -> list[dict[str, Any]]:
        ranks = self.ranks_of(node) if node else range(self.size)
        return [self.member(r) for r in ranks]

    def timeout(self, rank: int, /, seq: int = SEQ, **override: Any) -> dict[str, Any]:
        fields = {"seq_num": seq, "op_type": "ALLREDUCE", "rank": rank, "pg_id": "0", "pg_desc": "default_pg",
                  "pg_rank": rank, "timeout_ms": 600000, "ran_for_ms": 600468, **override}
        return self.nccl(rank, "NCCLCollectiveTimeout", "critical", reason="WatchdogTimeout",
                         text=f"A ALLREDUCE (SeqNum {seq}) timed out after 600 s", **fields)

    def timeouts(self, but: frozenset[int] | set[int] = frozenset()) -> list[dict[str, Any]]:
        return [self.timeout(r) for r in range(self.size) if r not in but]

    def progress(self, rank: int, /, **fields: Any) -> dict[str, Any]:
        return self.nccl(rank, "NCCLWatchdogProgress", "warning", reason="ProcessGroupStatus",
                         **{"pg_id": "0", "rank": rank, **fields})

    def ras_report(self, rank: int, suspects: list[dict[str, Any]]) -> dict[str, Any]:
        return self.nccl(rank, "NCCLRASReport", "warning", reason="RASSuspects", suspects=suspects,
                         missing_processes=[], dead_processes=[], ras_nccl_version="2.28.7", ras_format="text")

    def ras_suspect(self, rank: int, reason: str = "dead") -> dict[str, Any]:
        """RAS naming ``rank`` (on whichever node hosts it) as a suspect."""
        node = self.node_of(rank)
        return {"reason": reason, "detail": f"rank {rank} of {comm_hash(self.job)}: its process did not answer",
                "host": ip_of(node), "pid": 40000 + rank % self.per_node, "gpus": [rank % self.per_node],
                "rank": rank, "comm_hash": comm_hash(self.job)}

    def completion_error(self, rank: int, peer_node: str) -> dict[str, Any]:
        return self.nccl(rank, "NCCLIBCompletionError", "critical", reason="IBStatus12",
                         peer=f"{ip_of(peer_node)}<57900>", status=12,
                         status_name="IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded: peer gone or link down)",
                         vendor_err=129, hca=self.port_of(rank).split("/")[0])
