"""A channel's NET connection (src/transport/net.cc): ``Channel 02/0 : 3[3] -> 11[3] [send] via
NET/IB/3/GDRDMA``; "(proxyRank)" after the device is a PXN send, out through another GPU's NIC (net.cc
sendSetup, 2.12+). Which NIC each channel uses (NET/IB/<n>) is the rank's real NIC, GDRDMA or not."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.line import INFO_SHAPE
from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields, Rule
from collectors.nccl.rules.channel_prefix import CHANNEL, CHANNEL_FIELDS


def _tally(st: ProcessState, f: Fields, n: int) -> None:
    """``n`` lines of one connection kind: reads only net, dev, proxy and flags (the part ``REPEAT`` keys on)."""
    st.channel_nets.add(f["net"])
    if f["net"] == "Socket":
        st.socket_channels += n
    elif f["net"].startswith("IB") and "/GDRDMA" not in f.get("flags", ""):  # IB, IBext, IBext_v8
        st.non_gdr_channels += n
    if f["net"] != "Socket" and len(st.channel_devs) < 64:
        st.channel_devs.add(int(f["dev"]))
        if "proxy" not in f:
            st.direct_devs.add(int(f["dev"]))


def _update(st: ProcessState, f: Fields) -> bool:
    _tally(st, f, 1)
    return False


# The line as NCCL prints it, digits read as 0 (Rule.repeat): its prefix (line.INFO_SHAPE: the writer, "host:pid"),
# then the connection's channel, ranks and direction, which vary from line to line and which _tally never reads,
# then "/<net>/<dev>[(<proxy>)]<flags>" (the key: all _tally reads). Every part within the fields' bounds below,
# printable ASCII, so every line it matches decodes to this rule: no rule before it can match its text.
REPEAT = re.compile(INFO_SHAPE + rb"(?:Channel|Ring) 0{1,10}(?:/0{1,10})? : 0{1,10}(?:\[0{1,10}\])? -> 0{1,10}"
                                 rb"(?:\[0{1,10}\])? \[(?:send|receive)\] via NET"
                                 rb"(?P<key>/\w{1,64}/0{1,10}(?![0-9])(?:\(0{1,10}\))?[!-~]{0,64})")

RULE = Rule("channel_net", re.compile(CHANNEL + r"\[(?P<dir>send|receive)\] via NET/(?P<net>\w+)/(?P<dev>\d+)"
                                                  r"(?:\((?P<proxy>\d+)\))?(?P<flags>\S*)"),
            "NCCLNoGDRDMA",
            {**CHANNEL_FIELDS, "dir": 8, "net": 64, "dev": INT_DIGITS, "proxy": INT_DIGITS, "flags": 64},
            needles=(b"via NET/",), update=_update, repeat=REPEAT, tally=_tally)
