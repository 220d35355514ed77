"""A rank hears of another rank's timeout (PyTorch's HeartbeatMonitor, 2.4+): "Received a dump signal due to
a collective timeout from {this local rank| rank N} and we will try our best to dump the debug info. Last
enqueued NCCL work: %d, last completed NCCL work: %d." A rank that never entered the collective the others
wait in has nothing in flight, never times out, and says where it stands only here."""

from __future__ import annotations

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.rule import Fields, Heard, Rule, Said, compile_rule
from collectors.nccl.rules.pytorch_prefix import (
    PG,
    PG_FIELDS,
    SEQ_BOUND,
    record_progress,
    seq,
    torch_fields,
    torchrun_rank,
)
from gna_types.details import WatchdogProgress


def _say(f: Fields, h: Heard) -> Said:
    typed = WatchdogProgress(rank=f.get("rank"), pg_id=f.get("pg"), last_enqueued=f.get("enq"),
                             last_completed=f.get("done"), signal_from_rank=f.get("src"),
                             implausible=bool(f.get("implausible")))
    pg = f.get("desc") or typed.pg_id or "0"
    heard = f"rank {typed.signal_from_rank}" if typed.signal_from_rank is not None else "this local rank"
    text = (f"{h.process} heard of a collective timeout from {heard}; its own progress in process group {pg}: last "
            f"enqueued work {typed.last_enqueued}, last completed {typed.last_completed}.")
    if typed.implausible:
        text += " (some of PyTorch's numbers are impossible and were dropped)"
    return Said("NCCLWatchdogProgress", "DumpSignal", text,
                {"rank": typed.rank, "pg_id": typed.pg_id, "pg_desc": f.get("desc"), "pg_rank": f.get("pg_rank"),
                 "at_seq": None, "last_enqueued": typed.last_enqueued, "last_completed": typed.last_completed,
                 "signal_from_rank": typed.signal_from_rank, "implausible": typed.implausible})


RULE = Rule("pg_dump_signal", compile_rule(PG + r"Received a dump signal due to a collective timeout from\s+(?:rank "
                                                r"(?P<src>\d+)|(?P<local>this local rank))?.{0,200}?Last enqueued NCCL "
                                                r"work: " + seq("enq") + r", last completed NCCL work: " + seq("done")),
            "NCCLWatchdogProgress", {**PG_FIELDS, "src": INT_DIGITS, "local": 16, "enq": SEQ_BOUND, "done": SEQ_BOUND},
            needles=(b"ast enqueued ",), extract=torchrun_rank, convert=torch_fields, update=record_progress, say=_say,
            hang=True)
