"""Verdict ``hung_rank`` (fleet/correlator.py VERDICT_RULES, priority 5, once the symptoms settled): every
other rank of the job timed out and one rank, on one node, said nothing -- named from the job's membership
and the other nodes' timeouts. Not when a node's agent is missing (the job's ranks are not all known), when
the silent ranks are on several nodes or too many, or when every rank timed out."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import incident, member, not_by, rule_says, timeout, verdict


def _job(size: int = 8, nodes: int = 4) -> list[dict[str, Any]]:
    per = size // nodes
    return [member(f"n{r // per}", r, size) for r in range(size)]


def _timeouts(size: int, silent: set[int], nodes: int = 4) -> list[dict[str, Any]]:
    per = size // nodes
    return [timeout(f"n{r // per}", r, size, 40) for r in range(size) if r not in silent]


def test_the_one_rank_that_did_not_time_out_is_named() -> None:
    msgs = _job() + _timeouts(8, {5})
    assert rule_says(verdict(msgs), "hung_rank") == {"node": "n2", "entity": "rank:5", "kind": "rank", "rank": "5"}
    inc = incident(msgs)  # n2's other rank timed out: its own node is among the reporters
    assert inc is not None and inc.corroboration == "own node" and not inc.actionable
    assert "n2" not in inc.victims and inc.confidence == 0.85


def test_a_rank_alone_on_its_node_is_named_on_the_other_nodes_word() -> None:
    msgs = _job(8, nodes=8) + _timeouts(8, {5}, nodes=8)
    assert rule_says(verdict(msgs), "hung_rank") == {"node": "n5", "entity": "rank:5", "kind": "rank", "rank": "5"}
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "independent nodes" and inc.confidence == 0.85
    assert not inc.actionable  # timeouts are the tenant's log lines


def test_a_node_s_agent_missing_names_nobody() -> None:
    """Near miss: the silent rank's node published nothing (not even membership): the job's ranks are not
    all known, and a rank that merely did not speak is not named."""
    msgs = [m for m in _job() + _timeouts(8, {5}) if m["node"] != "n2"]
    v = verdict(msgs)
    not_by(v, "hung_rank")
    assert v is not None and v.rule == "hung_rank" and "ranks are known" in v.reason


def test_silent_ranks_on_two_nodes_name_nobody() -> None:
    """Near miss: two silent ranks (few enough: 2 of 32) on two nodes: not one node's fault."""
    not_by(verdict(_job(32) + _timeouts(32, {3, 29})), "hung_rank")


def test_too_many_silent_ranks_name_nobody() -> None:
    """Near miss: more than an eighth of the ranks silent (here 2 of 8, one node) is no single hung rank."""
    not_by(verdict(_job() + _timeouts(8, {4, 5})), "hung_rank")


def test_every_rank_timed_out_names_nobody() -> None:
    not_by(verdict(_job() + _timeouts(8, set())), "hung_rank")


def test_a_contested_membership_is_shown_not_acted_on() -> None:
    """Another node claiming a bound rank makes the job contested: the verdict rests on membership alone."""
    msgs = _job() + _timeouts(8, {5}) + [member("evil", 1, 8, pid=4242)]
    culprit = rule_says(verdict(msgs), "hung_rank")
    assert culprit["node"] == "n2"
    inc = incident(msgs)
    assert inc is not None and inc.contested and inc.confidence == 0.5
