"""PyTorch's heartbeat monitor finds the rank's own watchdog thread stuck (ProcessGroupNCCL.cpp
``heartbeatMonitor()``, 2.2-2.5; ``HeartbeatMonitor::runLoop()``, 2.6+): the watchdog stopped bumping its
heartbeat for TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, so it no longer even checks its collectives -- the rank
hangs (usually in a CUDA or NCCL call, or on the GIL) and is about to be terminated.

Formats, read in stored copies of torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the 2.3-era
``heartbeatMonitor()`` with ``createLogPrefix()`` "[PG uid Rank r] "; the 2.7-era
``ProcessGroupNCCL::HeartbeatMonitor::runLoop``) and in public logs of each release:

- 2.2-2.5, LOG(ERROR): ``logPrefix() "Heartbeat monitor timed out! Process will be terminated after dumping
  debug info. workMetaList_.size()=" N``; its fatal exit 10 minutes later, ``logPrefix() logPrefix()
  "ProcessGroupNCCL's watchdog got stuck for " S " seconds without making progress in monitoring enqueued
  collectives. ..."`` (torch 2.3: sglang#1691, LlamaFactory#6953);
- 2.6+, LOG(ERROR): ``logPrefix() "ProcessGroupNCCL's watchdog got stuck for " S " seconds without making
  progress ..."``; the exit names the reason: "Terminating the process ..., due to ProcessGroupNCCL watchdog
  hang." (not read: the stuck line before it says the same).

The message is an ``NCCLCollectiveTimeout`` with its own reason ``HeartbeatTimeout``, not a new type: the
fleet files that type as a hang symptom of the job (fleet/correlator.py VERDICT_RULES ``hung_rank``) and
marks the rank as one that spoke (fleet/job_facts.py ``_watchdog``: ``timed_out``), so a job whose ranks'
watchdogs are stuck is a hung job whose silent rank can still be named; there is no SeqNum, so it gives
the fleet no sequence number to compare (``seq_num`` stays None).
"""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS, U64_DIGITS
from collectors.nccl.rule import Fields, Heard, Rule, Said
from collectors.nccl.rules.pytorch_prefix import PG, PG_FIELDS, torch_fields, torchrun_rank
from gna_types.details import CollectiveTimeout


def _say(f: Fields, h: Heard) -> Said:
    typed = CollectiveTimeout(rank=f.get("rank"), pg_id=f.get("pg"))
    if f.get("stuck") is not None:
        what = f"its watchdog was stuck for {f['stuck']} s"
    else:
        what = f"its watchdog stopped (heartbeat monitor timed out, {f.get('pending', '?')} collectives in its list)"
    return Said("NCCLCollectiveTimeout", "HeartbeatTimeout",
                f"{h.process}: {what}; the rank hangs and PyTorch will terminate it.",
                {"seq_num": None, "op_type": None, "rank": typed.rank, "pg_id": typed.pg_id,
                 "pg_desc": f.get("desc"), "pg_rank": f.get("pg_rank"),
                 "heartbeat_timeout_s": int(f["stuck"]) if f.get("stuck") is not None else None,
                 "pending_works": int(f["pending"]) if f.get("pending") is not None else None})


# the 2.2-2.5 exit repeats logPrefix() (terminateProcess(logPrefix() + exitMsg)): the second one is skipped
_PATTERN = (PG + r"(?:Heartbeat monitor timed out! Process will be terminated after dumping debug info\. "
                 r"workMetaList_\.size\(\)=(?P<pending>\d+)"
                 r"|(?:\[[^\]]{0,160}\]\s+)?ProcessGroupNCCL's watchdog got stuck for (?P<stuck>\d+) seconds)")
RULE = Rule("heartbeat", re.compile(_PATTERN),
            "NCCLCollectiveTimeout",
            # "workMetaList_.size()=%zu", "%d seconds" (heartbeatTimeoutInSec_, an int)
            {**PG_FIELDS, "pending": U64_DIGITS, "stuck": INT_DIGITS},
            guard=re.compile(r"Heartbeat monitor timed out!|watchdog got stuck for \d"),
            needles=(b"Heartbeat monitor timed out", b"watchdog got stuck for "),
            extract=torchrun_rank, convert=torch_fields, say=_say, hang=True,
            # a terminal's wrap splits the long line anywhere (om-ai-lab/VLM-R1#257: "ProcessGroupNCCL'" / "s watchdog")
            wrap=re.compile(r"Heartbeat monitor timed out|watchdog got stuck for "))
