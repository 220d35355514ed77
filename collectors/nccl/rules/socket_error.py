"""A socket failing under NCCL (src/misc/socket.cc, WARN lines only): "Connection closed by remote peer",
"Connection reset by peer", "Call to recv from <addr> failed", "Connect to <addr> failed", "... exceeded
retries"."""

from __future__ import annotations

from collectors.nccl.rule import Fields, Heard, Rule, Said, compile_rule


def _say(f: Fields, h: Heard) -> Said:
    return Said("NCCLSocketError", "SocketError", f"NCCL on {h.process}: {f['what']}.", {"error": f["what"]})


RULE = Rule("socket_error", compile_rule(r"(?P<what>Connection closed by remote peer|Connection reset by peer|Call to "
                                         r"recv from \S+ failed|Connect to \S+ failed|connect to \S+ failed|exceeded "
                                         r"retries)"),
            "NCCLSocketError", {"what": 512}, warn_only=True, needles=(b"NCCL WARN",), say=_say)
