"""``Using network <name>`` (src/init.cc, 2.6+): the inter-node transport NCCL chose."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.net = f["net"]
    return False


RULE = Rule("network", re.compile(r"\bUsing network (?P<net>\S[^\n]*?)\s*$"), "NCCLSocketFallback",
            {"net": 64}, needles=(b"Using network ",), update=_update)
