"""``NCCL version 2.21.5+cuda12.4`` (src/init.cc showVersion; 2.4 init.cu): INFO(NCCL_ALL, "%s",
VERSION_STRING). Only with NCCL's own prefix: a bare printf of the same text is not NCCL's."""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    st.version = f["version"]
    return False


RULE = Rule("version",
            re.compile(r"^NCCL version (?P<version>[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![0-9])[^\s]{0,40})"),
            "", {"version": 64}, nccl_only=True, needles=(b"NCCL INFO NCCL version ",), update=_update)
