"""A process group's progress when its watchdog gives up (docs/formats.md, "PyTorch PG status"):
"Timeout at NCCL work: %d, last enqueued NCCL work: %d, last completed NCCL work: %d." (2.2-2.5),
"Exception (either an error or timeout) detected by watchdog at work: %d, last enqueued ..." (2.4-2.5),
" failure detected by watchdog at work sequence id: %d PG status: last enqueued work: %d, last completed
work: %d" (2.6+)."""

from __future__ import annotations

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
    typed = WatchdogProgress(rank=f.get("rank"), pg_id=f.get("pg"), at_seq=f.get("at"), last_enqueued=f.get("enq"),
                             last_completed=f.get("done"), implausible=bool(f.get("implausible")))
    pg = f.get("desc") or typed.pg_id or "0"
    text = (f"{h.process}: process group {pg} failed at work {typed.at_seq}; last enqueued work {typed.last_enqueued}, "
            f"last completed {typed.last_completed}.")
    if typed.implausible:
        text += " (some of PyTorch's numbers are impossible and were dropped)"
    return Said("NCCLWatchdogProgress", "WatchdogProgress", text,
                {"rank": typed.rank, "pg_id": typed.pg_id, "pg_desc": f.get("desc"), "pg_rank": f.get("pg_rank"),
                 "at_seq": typed.at_seq, "last_enqueued": typed.last_enqueued, "last_completed": typed.last_completed,
                 "signal_from_rank": None, "implausible": typed.implausible})


_PATTERN = (PG + r"(?P<what>Timeout at NCCL work|Exception (?:\(either an error or timeout\) )?detected by watchdog "
                 r"at work|failure detected by watchdog at work sequence id): " + seq("at")
            + r",? (?:PG status: )?last enqueued (?:NCCL )?work: " + seq("enq") + r", last completed (?:NCCL )?work: "
            + seq("done"))
RULE = Rule("pg_progress", compile_rule(_PATTERN),
            "NCCLWatchdogProgress", {**PG_FIELDS, "what": 512, "at": SEQ_BOUND, "enq": SEQ_BOUND, "done": SEQ_BOUND},
            needles=(b"ast enqueued ",), extract=torchrun_rank, convert=torch_fields, update=record_progress, say=_say,
            hang=True)
