"""PyTorch's progress every 30 s (glog INFO, kWorkStatusUpdatePeriodMs): "NCCL Work update periodically: last
enqueued NCCL work: %d, last completed NCCL work: %d" -- the process summary's progress, never a message."""

from __future__ import annotations

import re

from collectors.nccl.rule import Rule
from collectors.nccl.rules.pytorch_prefix import (
                                        PG,
                                        PG_FIELDS,
                                        SEQ_BOUND,
                                        record_progress,
                                        seq,
                                        torch_fields,
                                        torchrun_rank,
)

RULE = Rule("pg_periodic", re.compile(PG + r"NCCL Work update periodically: last enqueued NCCL work: " + seq("enq")
                                        + r", last completed NCCL work: " + seq("done")),
            "", {**PG_FIELDS, "enq": SEQ_BOUND, "done": SEQ_BOUND},
            needles=(b"ast enqueued ",), extract=torchrun_rank, convert=torch_fields, update=record_progress)
