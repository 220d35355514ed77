"""Verdict ``socket_node`` (fleet/correlator.py VERDICT_RULES, priority 2, published at once): one node whose
ranks run NCCL over sockets while the job's other nodes use IB (each node's word about its own ranks) names
that node; sockets everywhere, on several nodes, or on most of the job's nodes name nobody."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import incident, member, not_by, rule_says, said, verdict


def _job(socket_nodes: set[str], nodes: int = 4, per: int = 2) -> list[dict[str, Any]]:
    out = []
    for r in range(nodes * per):
        node = f"n{r // per}"
        sock = node in socket_nodes
        out.append(member(node, r, nodes * per, transport="Socket" if sock else "IB", hcas=[] if sock else None))
        if sock:
            out.append(said(node, r, nodes * per, "NCCLSocketFallback", "critical",
                            summary_kw={"transport": "Socket", "hcas": []}, interface="eth0"))
    return out


def test_one_node_on_sockets_among_ib_nodes_is_named() -> None:
    msgs = _job({"n2"})
    assert rule_says(verdict(msgs), "socket_node") == {"node": "n2", "entity": "nccl:transport", "kind": "transport"}
    inc = incident(msgs)
    assert inc is not None and inc.victims == ["n0", "n1", "n3"] and inc.corroboration == "own node"
    assert not inc.actionable  # the job's own log: a software finding never cordons alone


def test_a_job_on_sockets_everywhere_names_nobody_and_is_no_incident() -> None:
    """Near miss (issue 22): every node on sockets is each node's own finding, not a job's culprit."""
    msgs = _job({"n0", "n1", "n2", "n3"})
    not_by(verdict(msgs), "socket_node")
    assert incident(msgs) is None


def test_several_nodes_on_sockets_name_nobody() -> None:
    """Near miss: two of five nodes on sockets: said, nobody named."""
    v = verdict(_job({"n1", "n3"}, nodes=5))
    not_by(v, "socket_node")
    assert v is not None and v.rule == "socket_node" and "2 nodes" in v.reason


def test_most_nodes_on_sockets_is_the_fabric_not_a_node() -> None:
    """Near miss: the one node on IB among socket nodes is not the odd one out."""
    not_by(verdict(_job({"n0", "n1", "n2"})), "socket_node")


def test_a_node_with_one_rank_on_ib_is_not_on_sockets() -> None:
    """Near miss: a node is on sockets only when all its ranks are."""
    msgs = [m if not (m["node"] == "n2" and m["details"]["world_rank"] == 5) else
            member("n2", 5, 8, transport="IB") for m in _job({"n2"})]
    not_by(verdict(msgs), "socket_node")
