"""``Using network <name>`` (src/init.cc, 2.6+): the inter-node transport NCCL chose."""

from __future__ import annotations

import re

from collectors.nccl.line import INFO_SHAPE
from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.net = f["net"]
    return False


def _tally(st: ProcessState, f: Fields, _n: int) -> None:
    _update(st, f)


# Printed for each communicator (Rule.repeat): "Using network IB" as NCCL prints it, the name printable ASCII
# within its bound (the first rule: nothing before it).
REPEAT = re.compile(INFO_SHAPE + rb"(?P<key>Using network [!-~]{1,64})")

RULE = Rule("network", re.compile(r"\bUsing network (?P<net>\S[^\n]*?)\s*$"), "NCCLSocketFallback",
            {"net": 64}, needles=(b"Using network ",), update=_update, repeat=REPEAT, tally=_tally,
            last_wins=True)
