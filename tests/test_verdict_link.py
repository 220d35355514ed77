"""Verdict ``link`` (fleet/correlator.py VERDICT_RULES, priority 7, once the symptoms settled): every IB
completion error the job's ranks saw names one peer's bootstrap address, one member's node claims that
address, and the errors come from two nodes or more: that node is named. Errors naming several peers, an address two nodes claim, or one no member
claims name nobody."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import _ip, incident, member, not_by, rule_says, said, verdict

SIZE = 8  # n0-n3, two ranks each


def _job() -> list[dict[str, Any]]:
    return [member(f"n{r // 2}", r, SIZE) for r in range(SIZE)]


def _error(r: int, peer: str) -> dict[str, Any]:
    """NCCL's "NET/IB : Got completion from peer <ip><port> with status=12" (src/transport/net_ib.cc)."""
    return said(f"n{r // 2}", r, SIZE, "NCCLIBCompletionError", "critical", peer=f"{peer}<52044>", hca="mlx5_0",
                status=12, status_text="transport retry counter exceeded")


def test_the_peer_every_completion_error_names_is_named() -> None:
    msgs = [*_job(), _error(0, _ip("n3")), _error(3, _ip("n3"))]
    assert rule_says(verdict(msgs), "link") == {"node": "n3", "entity": "node", "kind": "link"}
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "independent nodes" and inc.confidence == 0.7
    assert "n3" not in inc.victims and not inc.actionable


def test_one_node_s_errors_alone_name_nobody() -> None:
    """Near miss (issue 25): one node's completion errors name its peer, but the fault may be at its own end (its
    port went down: NCCL on it retries against a healthy peer, and the job is torn down before the peer's
    side says anything). The peer is named only when two nodes' errors agree."""
    not_by(verdict([*_job(), _error(0, _ip("n3"))]), "link")
    not_by(verdict([*_job(), _error(0, _ip("n3")), _error(1, _ip("n3"))]), "link")  # ranks 0, 1: both on n0


def test_errors_naming_several_peers_name_nobody() -> None:
    """Near miss: n0 blames n3, n1 blames n2: the fabric, or both; not one node."""
    not_by(verdict([*_job(), _error(0, _ip("n3")), _error(2, _ip("n2"))]), "link")


def test_an_address_two_nodes_claim_names_nobody() -> None:
    """Near miss: a bootstrap address two members' nodes claim (NAT, a hostile claim) is nobody's."""
    twin = member("n9", 7, SIZE, ip=_ip("n3"), pid=4242)
    not_by(verdict([*_job(), twin, _error(0, _ip("n3")), _error(3, _ip("n3"))]), "link")


def test_an_address_no_member_claims_names_nobody() -> None:
    not_by(verdict([*_job(), _error(0, "10.9.9.9"), _error(3, "10.9.9.9")]), "link")
