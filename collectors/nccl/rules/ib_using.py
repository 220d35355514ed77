"""``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ... ; OOB ib0:10.0.0.5<0>`` (src/transport/net_ib.cc):
the IB devices NCCL listed, in NCCL's own numbering (channel lines' NET/IB/<n> index it), and the
bootstrap interface."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState, parse_ib_devices
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.ib_devices = parse_ib_devices(f["devs"])
    st.oob = f.get("oob") or ""
    return False


RULE = Rule("ib_using", re.compile(r"NET/IB : Using (?P<devs>.*?)\s*(?P<ro>\[RO\])?\s*; OOB (?P<oob>\S+)"),
            "NCCLHCASelection",
            # 32 NICs of 30-odd bytes fit in 4 KiB; "[RO]" (relaxed ordering); "ib0:10.0.0.5<0>"
            {"devs": 4096, "ro": 8, "oob": 128},
            guard=re.compile(r"; OOB \S"), needles=(b"NET/IB : ",), update=_update)
