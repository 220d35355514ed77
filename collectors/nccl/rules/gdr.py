"""GPUDirect RDMA per HCA (src/transport/net_ib.cc).

2.4: "... Disabled for GPU %d[%d] / HCA %d '%s' (no module or not supported by GPU)"; 2.7-2.12:
"NET/IB : GPU Direct RDMA Disabled for HCA %d '%s' (no module)"; 2.13+: "NET/%s : GPU Direct RDMA %s
for HCA %d '%s'"; the Mellanox plugin: "GPU Direct RDMA (nvidia-peermem) enabled for HCA %d '%s".
"""

from __future__ import annotations

import re

from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule


def _update(st: ProcessState, f: Fields) -> bool:
    if f["state"].lower() == "disabled":
        st.gdr_disabled.add(f.get("name") or f"hca{f['hca']}")
    return False


RULE = Rule("gdr", re.compile(r"NET/\w+ : GPU Direct RDMA (?:\((?P<how>[\w-]+)\) )?(?P<state>[Ee]nabled|[Dd]isabled) "
                                r"for (?:GPU \S+ / )?HCA (?P<hca>[0-9a-f]+)(?: '(?P<name>[^'\s]+)'?)?"),
            "NCCLNoGDRDMA",
            # "HCA %d" held to an HCA name's bound like every "hca"; ibv_get_device_name (IBV_SYSFS_NAME_MAX 64)
            {"how": 32, "state": 16, "hca": 64, "name": 64},
            needles=(b"GPU Direct RDMA",), update=_update)
