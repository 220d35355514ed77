"""Verdict ``ras`` (fleet/correlator.py VERDICT_RULES, priority 3, once the symptoms settled): NCCL's RAS, asked
by a hung job's nodes (collectors/nccl/hang_evidence.py, ``NCCLRASReport``), names the processes that died,
stopped answering, sent no data or failed; placed on the job's members by the world communicator's rank
(else pid and address) and on one node, they are named. A remote error (a victim), a suspect no member
matches, suspects on several nodes name nobody; one node's word about another is shown below the cordon."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.correlator import facts_of, slow_verdict
from fleet.wire import Rejected
from tests.verdict_evidence import JOB, incident, member, not_by, rule_says, said, through_wire, timeout, verdict

SIZE = 16  # n0-n3, four ranks each

DEAD = {"reason": "dead", "host": "10.0.0.161", "pid": 1009, "rank": 9, "comm_hash": JOB[2:]}  # n2's rank 9
REMOTE = {"reason": "remote_error", "host": "10.0.0.159", "pid": 1001, "rank": 1, "comm_hash": JOB[2:]}


def _hung(silent: frozenset[int] = frozenset({9})) -> list[dict[str, Any]]:
    return [member(f"n{r // 4}", r, SIZE) for r in range(SIZE)] + [
        timeout(f"n{r // 4}", r, SIZE, 40) for r in range(SIZE) if r not in silent]


def _ras(by: int, *suspects: dict[str, Any]) -> dict[str, Any]:
    return said(f"n{by // 4}", by, SIZE, "NCCLRASReport", "critical", suspects=list(suspects))


def test_the_process_ras_says_died_is_named_on_its_own_node_s_word() -> None:
    msgs = [*_hung(), _ras(8, DEAD)]  # n2's own RAS answer
    assert rule_says(verdict(msgs), "ras") == {"node": "n2", "entity": "rank:9", "kind": "rank", "rank": "9"}
    inc = incident(msgs)
    assert inc is not None and inc.confidence == 0.9 and inc.corroboration == "own node"
    assert not inc.actionable  # RAS answers are the tenant's


def test_a_suspect_is_placed_by_pid_and_address_without_its_rank() -> None:
    msgs = [*_hung(), _ras(8, {**DEAD, "rank": None, "comm_hash": None})]
    assert rule_says(verdict(msgs), "ras")["rank"] == "9"


def test_one_node_s_word_about_another_is_shown_not_acted_on() -> None:
    msgs = [*_hung(), _ras(0, DEAD)]
    assert rule_says(verdict(msgs), "ras")["node"] == "n2"
    inc = incident(msgs)
    assert inc is not None and inc.confidence == 0.5 and inc.corroboration == "single reporter"


def test_a_remote_error_is_a_victim_not_a_culprit() -> None:
    """Near miss: RAS only says rank 1 saw a remote error: the silent rank is found by its timeouts instead."""
    v = verdict([*_hung(), _ras(0, REMOTE)])
    not_by(v, "ras")
    assert v is not None and v.rule == "hung_rank"


def test_a_suspect_no_member_matches_names_nobody() -> None:
    not_by(verdict([*_hung(), _ras(8, {**DEAD, "rank": None, "comm_hash": "00000000000000ff", "pid": 12345})]),
           "ras")


def test_suspects_on_two_nodes_name_nobody() -> None:
    """Near miss: each node's own RAS names one of its processes dead: not one node."""
    other = {"reason": "dead", "host": "10.0.0.159", "pid": 1001, "rank": 1, "comm_hash": JOB[2:]}
    not_by(verdict([*_hung(frozenset({1, 9})), _ras(8, DEAD), _ras(0, other)]), "ras")


def test_a_suspect_of_the_wrong_type_is_refused_at_the_boundary_and_names_nobody_offline() -> None:
    """The boundary: a report whose suspect's reason is not text is refused on the wire (schema, counted); a
    snapshot's copy of it (offline, never through the wire) names nobody by it."""
    bad = _ras(8, {**DEAD, "reason": 7})
    with pytest.raises(Rejected) as exc:
        through_wire([bad])
    assert exc.value.reason == "schema"
    jobs, _hardware = facts_of([*_hung(), bad])
    v = slow_verdict(jobs[JOB])
    not_by(v, "ras")
    assert v.rule == "hung_rank"  # the timeouts still find the silent rank
