"""A channel's NET connection (src/transport/net.cc): ``Channel 02/0 : 3[3] -> 11[3] [send] via
NET/IB/3/GDRDMA``; "(proxyRank)" after the device is a PXN send, out through another GPU's NIC (net.cc
sendSetup, 2.12+). Which NIC each channel uses (NET/IB/<n>) is the rank's real NIC, GDRDMA or not."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule
from collectors.nccl.rules.channel_prefix import CHANNEL, CHANNEL_FIELDS


def _update(st: ProcessState, f: Fields) -> bool:
    st.channel_nets.add(f["net"])
    if f["net"] == "Socket":
        st.socket_channels += 1
    elif f["net"].startswith("IB") and "/GDRDMA" not in f.get("flags", ""):  # IB, IBext, IBext_v8
        st.non_gdr_channels += 1
    if f["net"] != "Socket" and len(st.channel_devs) < 64:
        st.channel_devs.add(int(f["dev"]))
        if "proxy" not in f:
            st.direct_devs.add(int(f["dev"]))
    return False


RULE = Rule("channel_net", re.compile(CHANNEL + r"\[(?P<dir>send|receive)\] via NET/(?P<net>\w+)/(?P<dev>\d+)"
                                                  r"(?:\((?P<proxy>\d+)\))?(?P<flags>\S*)"),
            "NCCLNoGDRDMA",
            {**CHANNEL_FIELDS, "dir": 8, "net": 64, "dev": INT_DIGITS, "proxy": INT_DIGITS, "flags": 64},
            needles=(b"via NET/",), update=_update)
