"""``comm 0x... rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 1b000 commId 0x... - Init COMPLETE`` (src/init.cc;
docs/formats.md section 8; NVIDIA/nccl v2.18.6-1 L1375, v2.30.7-1 L1936-1946): the process joined a
communicator. Its first line for a communicator is the membership the fleet correlator lives on
(``NCCLJobMember``: which job, rank, GPU and NICs this process is)."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.line import INFO_SHAPE
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


def _tally(st: ProcessState, f: Fields, _n: int) -> None:
    _update(st, f)  # its communicator is known (or the bound reached) since its first line: no change


# The same line again (Rule.repeat): ncclCommInitRank's root form as 2.16-2.30 print it (docs/formats.md section
# 8), "%p" and "0x%llx" within "comm" and "commid"'s bounds, "%lx" within "bus"'s; the split form (parent,
# color, key) is decoded each time.
REPEAT = re.compile(INFO_SHAPE + rb"(?P<key>(?:ncclComm[A-Za-z]{1,40} )?comm 0x[0-9a-f]{1,16} rank 0{1,10} nranks "
                                 rb"0{1,10} cudaDev 0{1,10}(?: nvmlDev 0{1,10})? busId [0-9a-f]{1,16}"
                                 rb"(?: commId 0x[0-9a-f]{1,16})? - Init COMPLETE)")

RULE = Rule("init", re.compile(r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev "
                                 r"(?P<cuda>\d+)(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-f]+))?"
                                 r"(?: commId (?P<commid>0x[0-9a-f]+))?.*Init COMPLETE"),
            "NCCLJobMember",
            # "comm %p" (0x + 16 hex digits), "busId %lx" (int64: 16 hex digits), "commId 0x%llx" (uint64
            # comm->commHash: 0x + at most 16); rank, nranks, cudaDev, nvmlDev "%d"
            {"comm": 18, "commid": 18, "bus": 16, "rank": INT_DIGITS, "nranks": INT_DIGITS, "cuda": INT_DIGITS,
             "nvml": INT_DIGITS},
            guard=re.compile(r"Init COMPLETE"), needles=(b"Init COMPLETE",), update=_update, say=_say,
            news_only=True, repeat=REPEAT, tally=_tally)
