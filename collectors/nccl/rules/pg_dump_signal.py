"""A rank hears of another rank's timeout (PyTorch's HeartbeatMonitor, 2.4+): "Received a dump signal due to
a collective timeout from {this local rank| rank N} and we will try our best to dump the debug info. Last
enqueued NCCL work: %d, last completed NCCL work: %d." A rank that never entered the collective the others
wait in has nothing in flight, never times out, and says where it stands only here."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
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
    heard = f"rank {f['src']}" if f.get("src") is not None else "this local rank"
    return progress_said(f, "DumpSignal", f"{h.process} heard of a collective timeout from {heard}; its own progress "
                         f"in process group {pg}: last enqueued work {f.get('enq')}, last completed {f.get('done')}.")


RULE = Rule("pg_dump_signal", re.compile(PG + r"Received a dump signal due to a collective timeout from\s+(?:rank "
                                                r"(?P<src>\d+)|(?P<local>this local rank))?.{0,200}?Last enqueued NCCL "
                                                r"work: " + seq("enq") + r", last completed NCCL work: " + seq("done")),
            "NCCLWatchdogProgress", {**PG_FIELDS, "src": INT_DIGITS, "local": 16, "enq": SEQ_BOUND, "done": SEQ_BOUND},
            needles=(b"ast enqueued ",), extract=torchrun_rank, convert=torch_fields, update=record_progress, say=_say,
            hang=True)
