"""An IB work completion with an error (src/transport/net_ib.cc; docs/formats.md): "NET/IB : Got completion
with error %d, opcode %d, ..." (<= 2.9), "... from peer %s with error %d" (2.10-2.19), "with status=%d"
(2.20+), "status=%s(%d)" (2.28.7+); "NET/IB:" from 2.22, "NET/IB/GIN" for GPU-initiated networking.
The peer it names is what the fleet's link verdict counts; status 12/13 (retries exhausted) mean the peer
or the link is gone."""

from __future__ import annotations

import re

from collectors.nccl.bounds import INT_DIGITS
from collectors.nccl.rule import Fields, Heard, Rule, Said
from gna_types.details import IBCompletionError

# ibv_wc_status (rdma-core libibverbs/verbs.h)
IB_STATUS = {12: "IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded: peer gone or link down)",
             13: "IBV_WC_RNR_RETRY_EXC_ERR", 4: "IBV_WC_LOC_PROT_ERR (memory registration; GDR?)",
             10: "IBV_WC_REM_ACCESS_ERR", 5: "IBV_WC_WR_FLUSH_ERR"}
_VENDOR = re.compile(r"vendor[ _]err[= ]?(\d+)")
_HCA = re.compile(r"\bhca (\S+)")


def _extract(msg: str, _raw: str) -> Fields:
    out: Fields = {}
    if vm := _VENDOR.search(msg):
        out["vendor_err"] = vm.group(1)
    if hm := _HCA.search(msg):
        out["hca"] = hm.group(1)
    return out


def _convert(f: Fields) -> None:
    if "err" in f:
        f["status"] = f.pop("err")
    if "vendor_err" in f:
        f["vendor_err"] = int(f["vendor_err"])
    f["status"] = int(f["status"])


def _say(f: Fields, h: Heard) -> Said:
    status = int(f["status"])
    text = f.get("sname") or IB_STATUS.get(status, "")
    typed = IBCompletionError(peer=f.get("peer"), hca=f.get("hca"))
    return Said("NCCLIBCompletionError", f"IBStatus{status}",
                f"NCCL on {h.process} got an IB completion error from {typed.peer or 'a peer'}: status {status}"
                + (f" ({text})" if text else "") + (f" on {typed.hca}" if typed.hca else "") + ".",
                {"peer": typed.peer, "status": status, "status_name": text or None, "vendor_err": f.get("vendor_err"),
                 "hca": typed.hca})


RULE = Rule("ib_completion", re.compile(r"NET/IB(?:/GIN)? ?: Got completion (?:from peer (?P<peer>\S+) )?with "
                                          r"(?:status=(?:(?P<sname>[A-Z_]+)\()?(?P<status>\d+)\)?|error (?P<err>\d+))"),
            "NCCLIBCompletionError",
            # "from peer %s": ncclSocketToString, an address and "<port>" (INET6_ADDRSTRLEN 46 + 8); statuses "%d";
            # the HCA's name (IBV_SYSFS_NAME_MAX 64)
            {"peer": 128, "sname": 64, "status": INT_DIGITS, "err": INT_DIGITS, "vendor_err": INT_DIGITS, "hca": 64},
            needles=(b"NET/IB : ", b"NET/IB: ", b"NET/IB/GIN"), extract=_extract, convert=_convert, say=_say)
