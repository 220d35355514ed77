"""``comm 0x... rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 1b000 commId 0x... - Init COMPLETE`` (src/init.cc;
docs/formats.md section 8; NVIDIA/nccl v2.18.6-1 L1375, v2.30.7-1 L1936-1946): the process joined a
communicator. Its first line for a communicator is the membership the fleet correlator lives on
(``NCCLJobMember``: which job, rank, GPU and NICs this process is)."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.process import MAX_COMMS, ProcessState
from collectors.nccl.rule import Fields, Heard, Rule, Said
from gna_types.details import JobMember
from gna_types.entities import pci_from_nccl


def _update(st: ProcessState, f: Fields) -> bool:
    key = f.get("commid") or f["comm"]
    if key in st.comms or len(st.comms) >= MAX_COMMS:  # bounded: a job that splits without end
        return False
    st.comms[key] = {"rank": int(f["rank"]), "nranks": int(f["nranks"]), "bus_id": f["bus"], "comm": f["comm"]}
    return True


def _say(f: Fields, h: Heard) -> Said | None:
    if not h.news:
        return None  # a communicator already known (or one past the bound): the plugin does not ask
    comm = f.get("commid") or f["comm"]
    member = JobMember(comm_id=comm, rank=int(f["rank"]), size=int(f["nranks"]), pci=pci_from_nccl(f.get("bus")))
    pci = h.where.get("pci")
    return Said("NCCLJobMember", "CommInit",
                f"{h.process} joined communicator {comm} as rank {f['rank']} of {f['nranks']}"
                + (f" on GPU {pci}" if pci else "") + ".",
                {"comm_id": member.comm_id, "rank": member.rank, "size": member.size, "cuda_dev": int(f["cuda"]),
                 "pci": member.pci})


RULE = Rule("init", re.compile(r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev "
                                 r"(?P<cuda>\d+)(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-f]+))?"
                                 r"(?: commId (?P<commid>0x[0-9a-f]+))?.*Init COMPLETE"),
            "NCCLJobMember",
            # "comm %p" (0x + 16 hex digits), "busId %lx" (int64: 16 hex digits), "commId 0x%llx" (uint64
            # comm->commHash: 0x + at most 16); rank, nranks, cudaDev, nvmlDev "%d"
            {"comm": 18, "commid": 18, "bus": 16, "rank": INT_DIGITS, "nranks": INT_DIGITS, "cuda": INT_DIGITS,
             "nvml": INT_DIGITS},
            guard=re.compile(r"Init COMPLETE"), needles=(b"Init COMPLETE",), update=_update, say=_say,
            news_only=True)
