"""Verdict ``closed_peer`` (fleet/correlator.py VERDICT_RULES, priority 8, last, once the symptoms settled):
every socket the job's ranks saw closed under them ("Connection closed by remote peer <addr>", or the last
error of an NCCL remote error) names one node's bootstrap address, said by another node: that node's ranks
went away. Addresses of several nodes, an address nobody or two nodes claim, or only the named node's own
word name nobody."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import _ip, incident, member, not_by, rule_says, said, verdict

SIZE = 24  # n0-n2, eight ranks each


def _job() -> list[dict[str, Any]]:
    return [member(f"n{r // 8}", r, SIZE) for r in range(SIZE)]


def _closed(r: int, peer: str) -> dict[str, Any]:
    """NCCL's "socketProgress: Connection closed by remote peer <addr><port>" (src/misc/socket.cc)."""
    m = said(f"n{r // 8}", r, SIZE, "NCCLSocketError", "warning", error="Connection closed by remote peer",
             peer=peer, peer_port=45678)
    m["reason"] = "SocketError"
    return m


def test_the_node_every_closed_socket_names_is_named() -> None:
    msgs = [*_job(), _closed(0, _ip("n2")), _closed(9, _ip("n2"))]
    assert rule_says(verdict(msgs), "closed_peer") == {"node": "n2", "entity": "node", "kind": "peer_gone"}
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "independent nodes" and not inc.actionable


def test_a_peer_named_by_its_resolved_name_is_its_node() -> None:
    """NCCL prints the peer reverse-resolved (ncclSocketToString(..., 0)): "n2.cluster.local<45678>"."""
    msgs = [*_job(), _closed(0, "n2.cluster.local"), _closed(9, "n2")]
    assert rule_says(verdict(msgs), "closed_peer")["node"] == "n2"


def test_sockets_closed_by_several_nodes_name_nobody() -> None:
    not_by(verdict([*_job(), _closed(0, _ip("n2")), _closed(17, _ip("n1"))]), "closed_peer")


def test_an_address_no_member_claims_names_nobody() -> None:
    not_by(verdict([*_job(), _closed(0, "10.9.9.9"), _closed(9, "10.9.9.9")]), "closed_peer")


def test_the_named_node_s_own_word_alone_names_nobody() -> None:
    not_by(verdict([*_job(), _closed(16, _ip("n2"))]), "closed_peer")
