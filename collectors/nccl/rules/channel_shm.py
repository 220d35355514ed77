"""A channel through host shared memory (src/transport/shm.cc): "via direct shared memory" (2.4-2.12),
"via SHM/%s/%s" (2.13-2.30.4), "via SHM/direct" (2.30.7)."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule
from collectors.nccl.rules.channel_prefix import CHANNEL, CHANNEL_FIELDS


def _update(st: ProcessState, _f: Fields) -> bool:
    st.shm_channels += 1
    return False


RULE = Rule("channel_shm", re.compile(CHANNEL + r"via (?:SHM/(?P<mode>\S+)|direct shared memory)"), "NCCLP2PViaHost",
            {**CHANNEL_FIELDS, "mode": 64}, needles=(b"via SHM/", b"via direct shared memory"), update=_update)
