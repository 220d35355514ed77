"""An IB async event under a rank's feet (src/transport/net_ib.cc; docs/formats.md, "IB async events"):
"NET/IB : Got async event : %s" (2.4-2.18), "NET/IB : %s:%d Got async event : %s" (2.21), "NET/IB : %s:%d
async fatal event[ on CQ/QP/SRQ (...)]: %s" (2.24+), "NET/IB : %s:%d Got non-fatal async event: %s(%d)"
(2.28). A port coming back (PORT_ACTIVE, LID/GID change) or one NCCL calls non-fatal is no fault."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.rule import Fields, Heard, Rule, Said
from gna_types.details import IBAsyncEvent

_BENIGN = ("PORT_ACTIVE", "PORT ACTIVE", "LID_CHANGE", "GID_CHANGE")


def _say(f: Fields, h: Heard) -> Said:
    what = f.get("what", "")[:200]
    benign = "non-fatal" in f["kind"] or any(w in what.upper() for w in _BENIGN)
    typed = IBAsyncEvent(hca=f.get("hca"), port=int(f["port"]) if f.get("port") else None)
    port = f"{typed.hca}:{f['port']}" if typed.hca else "an HCA"
    return Said("NCCLIBAsyncEvent", "IBAsyncEventNonFatal" if benign else "IBAsyncEvent",
                f"NCCL on {h.process}: IB async event on {port}: {what}.",
                {"hca": typed.hca, "port": typed.port, "event": what, "fatal": not benign})


RULE = Rule("ib_async", re.compile(r"NET/IB ?: (?:(?P<hca>[\w.-]+):(?P<port>\d+) )?(?P<kind>Got async event|Got "
                                     r"non-fatal async event|async fatal event)[^:]*?: ?(?P<what>.*?)\s*$"),
            "NCCLIBAsyncEvent",
            # the HCA's name (IBV_SYSFS_NAME_MAX 64), "%d" port; the event's name, free text kept bounded
            {"hca": 64, "port": INT_DIGITS, "kind": 32, "what": 512},
            needles=(b"NET/IB : ", b"NET/IB: "), say=_say)
