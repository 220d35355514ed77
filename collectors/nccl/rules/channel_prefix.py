"""The head NCCL's channel (ring) lines share (src/transport/{p2p,shm,net}.cc).

"Ring %02d" in 2.4, "Channel %02d" from 2.7, "/connIndex" on NET lines from 2.12 (never on SHM lines),
brackets busId (2.7-2.18.1) or nvmlDev, none on 2.4's NET lines; PXN adds "(proxyRank)", 2.26+ "(PCI)"
after /GDRDMA.
"""

from __future__ import annotations

from typing import Final

from collectors.nccl.bounds import INT_DIGITS

CHANNEL: Final = (r"(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[^\]]*\])? -> (?P<dst>\d+)"
                  r"(?:\[[^\]]*\])? ")
# "%02d" channel, "%d" ranks
CHANNEL_FIELDS: Final = {"ch": INT_DIGITS, "src": INT_DIGITS, "dst": INT_DIGITS}
