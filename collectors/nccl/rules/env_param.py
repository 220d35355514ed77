"""``<NCCL_NAME> set by environment to <value>.`` (src/misc/param.cc: "%s set by environment to %lu." for
integer NCCL_PARAMs such as NCCL_IB_DISABLE; net.cc/plugin: "NCCL_NET_PLUGIN set by environment to %s"):
the job's own settings, which decide whose fault a fallback is."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.env[f["name"]] = f["value"]
    return False


RULE = Rule("env_param", re.compile(r"\b(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>[^\s]+?)\.?\s*$"),
            "", {"name": 64, "value": 1024}, needles=(b"set by environment to",), update=_update)
