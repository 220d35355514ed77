"""``NET/IB : No device found`` (src/transport/net_ib.cc): NCCL saw no IB device, sockets follow."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, _f: Fields) -> bool:
    st.ib_no_device = True
    return False


RULE = Rule("ib_no_device", re.compile(r"NET/IB : No device found"), "NCCLSocketFallback", {},
            needles=(b"NET/IB : ",), update=_update)
