"""``Failed to open libibverbs.so[.1]`` (src/misc/ibvwrap.cc; a WARN in 2.4, INFO in 2.20): no verbs in the
job's container, so no IB device either (NVIDIA/nccl#367, #1817)."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, _f: Fields) -> bool:
    st.ib_no_device = st.no_verbs = True
    return False


RULE = Rule("ib_no_verbs", re.compile(r"Failed to open libibverbs"), "NCCLSocketFallback", {},
            needles=(b"Failed to open libibverbs",), update=_update)
