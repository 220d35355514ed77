"""``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ... ; OOB ib0:10.0.0.5<0>`` (src/transport/net_ib.cc):
the IB devices NCCL listed, in NCCL's own numbering (channel lines' NET/IB/<n> index it), and the
bootstrap interface."""

from __future__ import annotations

import re

from collectors.nccl.line import INFO_SHAPE
from collectors.nccl.process import ProcessState, parse_ib_devices
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.ib_devices = parse_ib_devices(f["devs"])
    st.oob = f.get("oob") or ""
    return False


def _tally(st: ProcessState, f: Fields, _n: int) -> None:
    _update(st, f)


# Printed once per process, or per communicator (Rule.repeat): "NET/IB : Using%s %s; OOB %s:%s" with each device
# " [%d]%s:%d/%s" (net_ib.cc, 2.4-2.28; docs/formats.md section 2), 32 devices at most (within "devs"' bound),
# their names word characters, dots and dashes (no "; OOB", no "Using network": no rule before it matches);
# the merged-NIC "[0]={...}" form (2.19-2.22) and 2.30's rail ids are decoded each time.
REPEAT = re.compile(INFO_SHAPE + rb"(?P<key>NET/IB : Using(?: \[0{1,10}\][\w.-]{1,64}:0{1,10}/(?:IB|RoCE)(?:/SHARP)?)"
                                 rb"{0,32} (?:\[RO\])?; OOB [!-~]{1,128})")

RULE = Rule("ib_using", re.compile(r"NET/IB : Using (?P<devs>.*?)\s*(?P<ro>\[RO\])?\s*; OOB (?P<oob>\S+)"),
            "NCCLHCASelection",
            # 32 NICs of 30-odd bytes fit in 4 KiB; "[RO]" (relaxed ordering); "ib0:10.0.0.5<0>"
            {"devs": 4096, "ro": 8, "oob": 128},
            guard=re.compile(r"; OOB \S"), needles=(b"NET/IB : ",), update=_update, repeat=REPEAT, tally=_tally,
            last_wins=True)
