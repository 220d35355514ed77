"""``NCCL_IB_HCA set to <value>`` (src/transport/net_ib.cc, 2.7.3+: INFO(NCCL_NET|NCCL_ENV, ...) -- shown by
default from 2.17): the job's HCA selection as NCCL read it."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.env_hca = f["value"]
    return False


RULE = Rule("env_hca", re.compile(r"\bNCCL_IB_HCA set to (?P<value>\S+)"), "NCCLHCASelection", {"value": 1024},
            needles=(b"NCCL_IB_HCA set",), update=_update)
