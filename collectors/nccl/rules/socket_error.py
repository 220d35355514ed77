"""A socket failing under NCCL (src/misc/socket.cc, WARN lines only): "Connection closed by remote peer",
"Connection reset by peer", "Call to recv from <addr> failed", "Connect to <addr> failed", "... exceeded
retries". The address is ncclSocketToString's "<host><<port>>" (NCCL 2.12-2.30: "Net : Connection closed by
remote peer %s", "socketProgress: Connection closed by remote peer %s", "Net : Call to recv from %s failed :
%s"): the peer is kept (host or address, and port), the rank that went away is at that end."""

from __future__ import annotations

import re

from collectors.nccl.rule import Fields, Heard, Rule, Said
from gna_types.details import SocketError

# ncclSocketToString: "%s<%s>" of getnameinfo's host (a name, or an IPv4/IPv6 address) and port
_PEER = re.compile(r"(?:remote peer|recv from|[Cc]onnect to) (?P<peer>[^\s<>]{1,253})<(?P<peer_port>\d{1,5})>")


def _extract(msg: str, _raw: str) -> Fields:
    m = _PEER.search(msg)
    return {"peer": m["peer"], "peer_port": m["peer_port"]} if m else {}


def _say(f: Fields, h: Heard) -> Said:
    typed = SocketError(peer=f.get("peer"), peer_port=int(f["peer_port"]) if f.get("peer_port") else None)
    where = f" ({typed.peer}<{typed.peer_port}>)" if typed.peer else ""
    return Said("NCCLSocketError", "SocketError", f"NCCL on {h.process}: {f['what']}{where}.",
                {"error": f["what"], "peer": typed.peer, "peer_port": typed.peer_port})


RULE = Rule("socket_error", re.compile(r"(?P<what>Connection closed by remote peer|Connection reset by peer|Call to "
                                         r"recv from \S+ failed|Connect to \S+ failed|connect to \S+ failed|exceeded "
                                         r"retries)"),
            "NCCLSocketError",
            # free text kept bounded; a DNS name (RFC 1035: 253), a port "%d" of 16 bits
            {"what": 512, "peer": 253, "peer_port": 5}, warn_only=True, needles=(b"NCCL WARN",),
            extract=_extract, say=_say)
