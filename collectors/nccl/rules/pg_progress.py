"""A process group's progress when its watchdog gives up (docs/formats.md, "PyTorch PG status"):
"Timeout at NCCL work: %d, last enqueued NCCL work: %d, last completed NCCL work: %d." (2.2-2.5),
"Exception (either an error or timeout) detected by watchdog at work: %d, last enqueued ..." (2.4-2.5),
" failure detected by watchdog at work sequence id: %d PG status: last enqueued work: %d, last completed
work: %d" (2.6+)."""

from __future__ import annotations

import re

from collectors.nccl.rule import Fields, Heard, Rule, Said
from collectors.nccl.rules.pytorch_prefix import (
    PG,
    PG_FIELDS,
    SEQ_BOUND,
    progress_said,
    record_progress,
    seq,
    torch_fields,
    torchrun_rank,
)


def _say(f: Fields, h: Heard) -> Said:
    pg = f.get("desc") or f.get("pg") or "0"
    return progress_said(f, "WatchdogProgress", f"{h.process}: process group {pg} failed at work {f.get('at')}; last "
                         f"enqueued work {f.get('enq')}, last completed {f.get('done')}.")


_PATTERN = (PG + r"(?P<what>Timeout at NCCL work|Exception (?:\(either an error or timeout\) )?detected by watchdog "
                 r"at work|failure detected by watchdog at work sequence id): " + seq("at")
            + r",? (?:PG status: )?last enqueued (?:NCCL )?work: " + seq("enq") + r", last completed (?:NCCL )?work: "
            + seq("done"))
RULE = Rule("pg_progress", re.compile(_PATTERN),
            "NCCLWatchdogProgress", {**PG_FIELDS, "what": 512, "at": SEQ_BOUND, "enq": SEQ_BOUND, "done": SEQ_BOUND},
            # the head's needles too: a line wrapped after its head still reaches the join (matching.match_wrapped)
            needles=(b"ast enqueued ", b"Timeout at NCCL work: ", b"detected by watchdog at work"),
            extract=torchrun_rank, convert=torch_fields, update=record_progress, say=_say, hang=True,
            # a terminal or launcher wraps the long line anywhere: the head with no tail, or the tail alone
            wrap=re.compile(r"Timeout at NCCL work: |detected by watchdog at work|ast enqueued "))
