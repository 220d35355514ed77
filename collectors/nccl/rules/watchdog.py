"""PyTorch's watchdog gives up on a collective (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): "[PG ...
Rank r] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%lu, OpType=%s, ..., Timeout(ms)=%ld)
ran for %ld milliseconds before timing out." The job hangs here."""

from __future__ import annotations

import re

from collectors.nccl.bounds import U64_DIGITS
from collectors.nccl.rule import Fields, Heard, Rule, Said
from collectors.nccl.rules.pytorch_prefix import PG, PG_FIELDS, torch_fields, torchrun_rank
from gna_types.details import CollectiveTimeout


def _say(f: Fields, h: Heard) -> Said:
    typed = CollectiveTimeout(seq_num=int(f["seq"]), rank=f.get("rank"), pg_id=f.get("pg"))
    return Said("NCCLCollectiveTimeout", "WatchdogTimeout",
                f"A {f['op']} (SeqNum {f['seq']}) timed out after {int(f['ran']) / 1000:.0f} s in {h.process}: one "
                f"rank is stuck or far behind.",
                {"seq_num": typed.seq_num, "op_type": f["op"], "rank": typed.rank, "pg_id": typed.pg_id,
                 "pg_desc": f.get("desc"), "pg_rank": f.get("pg_rank"),
                 "timeout_ms": int(f["timeout"]) if "timeout" in f else None, "ran_for_ms": int(f["ran"])})


_PATTERN = (PG + r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
            r"(?:.*?Timeout\(ms\)=(?P<timeout>\d+))?.*?\) ran for (?P<ran>\d+) milliseconds")
RULE = Rule("watchdog", re.compile(_PATTERN),
            "NCCLCollectiveTimeout",
            # "SeqNum=%lu", "OpType=%s" (opTypeToString: ALLREDUCE, ...), "Timeout(ms)=%ld", "ran for %ld"
            {**PG_FIELDS, "seq": U64_DIGITS, "op": 64, "timeout": U64_DIGITS, "ran": U64_DIGITS},
            guard=re.compile(r"\) ran for \d+ milliseconds"), needles=(b"Watchdog caught",),
            extract=torchrun_rank, convert=torch_fields, say=_say, hang=True)
