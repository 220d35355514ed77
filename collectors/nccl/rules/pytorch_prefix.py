"""What PyTorch's ProcessGroupNCCL lines share: the process-group prefix, torchrun's rank, the numbers.

PyTorch's log prefix (ProcessGroupNCCL createLogPrefix()): "[Rank r] " (2.1-2.2), "[PG p Rank r] " (2.3),
"[PG p (desc) Rank r] " (2.4), "[PG ID p PG GUID g(desc) Rank r] " (2.5+, pytorch/pytorch@cf1380df
torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), "[PG GUID g(desc) Rank r] " (2.14 per-work lines).
r is the rank *in that process group*; desc is "default_pg" for the world group. torchrun's per-rank
prefix ("[rank3]:[E1203 ...]", 2.2+) gives the *global* rank.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from collectors.nccl.bounds import INT_DIGITS, SEQ_MAX, U64_DIGITS
from collectors.nccl.rule import Fields, Said
from gna_types.details import WatchdogProgress

if TYPE_CHECKING:
    from collectors.nccl.process import ProcessState

PG: Final = (r"(?:\[(?:PG (?:ID )?(?P<pg>\d+) ?)?(?:PG GUID (?P<guid>[^\s(\]]{1,40}))?\s*"
             r"(?:\((?P<desc>[^)\]]{0,64})\))?\s*Rank (?P<rank>\d+)\]\s+)?")
# "PG ID %lu", the GUID, the description, the group's rank "%d", torchrun's "[rank%d]:"
PG_FIELDS: Final = {"pg": U64_DIGITS, "guid": 40, "desc": 64, "rank": INT_DIGITS, "torchrun_rank": INT_DIGITS}
_TORCHRUN_RANK = re.compile(r"\[rank(\d+)\]:")


def seq(name: str) -> str:
    """A sequence number as PyTorch prints it ("%ld": -1 for none yet)."""
    return rf"(?P<{name}>-?\d{{1,20}})"


SEQ_BOUND: Final = U64_DIGITS + 1  # a sign and 20 digits
MAX_GROUPS: Final = 32  # process groups remembered per process (process.MAX_COMMS alike)


def torchrun_rank(_msg: str, raw: str) -> Fields:
    tr = _TORCHRUN_RANK.search(raw)
    return {"torchrun_rank": tr.group(1)} if tr is not None else {}


def torch_fields(fields: Fields) -> None:
    """PyTorch's numbers, checked: ``rank`` becomes the world rank where the line says it (torchrun's
    ``[rankN]:``, or the default process group's rank), else None (``pg_rank`` keeps the group's);
    sequence numbers outside [-1, 2**53) or a completed count above the enqueued one become None and
    ``implausible`` is set -- they are not progress."""
    pg_rank = int(fields.pop("rank")) if "rank" in fields else None
    tr = fields.pop("torchrun_rank", None)  # checked against its bound with the other fields
    desc, pg, guid = fields.get("desc"), fields.get("pg"), fields.get("guid")
    # the world group: described "default_pg", else the first group created (ID/GUID 0), else "[Rank r]"
    default_pg = desc == "default_pg" if desc else pg == "0" if pg is not None else guid in (None, "0")
    fields["pg_rank"] = pg_rank
    fields["rank"] = int(tr) if tr is not None else pg_rank if default_pg else None
    bad = False
    for k in ("at", "enq", "done", "src"):
        if k in fields:
            v = int(fields[k])
            ok = -1 <= v < SEQ_MAX
            fields[k] = v if ok else None
            bad |= not ok
    if isinstance(fields.get("enq"), int) and isinstance(fields.get("done"), int) and fields["done"] > fields["enq"]:
        fields["done"] = None  # completed more than it enqueued: one of the two is garbage; keep the enqueued
        bad = True
    if bad:
        fields["implausible"] = True


def record_progress(st: ProcessState, f: Fields) -> bool:
    """PyTorch's last word on a process group's progress (numbers it printed impossible are not kept)."""
    if f.get("implausible"):
        return False
    pg = str(f.get("pg") or "0")
    if pg in st.progress or len(st.progress) < MAX_GROUPS:
        st.progress[pg] = {"enqueued": f.get("enq"), "completed": f.get("done"), "at": f.get("at"),
                           "world_rank": f.get("rank")}
    return False


def progress_said(f: Fields, reason: str, text: str) -> Said:
    """An ``NCCLWatchdogProgress`` message (rules pg_progress and pg_dump_signal): the group's numbers as the
    fleet reads them (gna_types.details.WatchdogProgress), ``text`` with a note when some were impossible."""
    typed = WatchdogProgress(rank=f.get("rank"), pg_id=f.get("pg"), at_seq=f.get("at"), last_enqueued=f.get("enq"),
                             last_completed=f.get("done"), signal_from_rank=f.get("src"),
                             implausible=bool(f.get("implausible")))
    if typed.implausible:
        text += " (some of PyTorch's numbers are impossible and were dropped)"
    return Said("NCCLWatchdogProgress", reason, text,
                {"rank": typed.rank, "pg_id": typed.pg_id, "pg_desc": f.get("desc"), "pg_rank": f.get("pg_rank"),
                 "at_seq": typed.at_seq, "last_enqueued": typed.last_enqueued,
                 "last_completed": typed.last_completed, "signal_from_rank": typed.signal_from_rank,
                 "implausible": typed.implausible})
