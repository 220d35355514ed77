"""``NET/Socket : Using [0]eth0:10.0.0.5<0> ...`` (src/transport/net_socket.cc): the interfaces NCCL's socket
transport uses."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.socket_ifs = f["ifs"]
    return False


RULE = Rule("socket_using", re.compile(r"NET/Socket : Using (?P<ifs>.+?)\s*$"), "NCCLSocketFallback",
            {"ifs": 1024}, needles=(b"NET/Socket : Using",), update=_update)
