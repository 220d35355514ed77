"""Verdict ``desync`` (fleet/correlator.py VERDICT_RULES, priority 5, once the symptoms settled): every rank of a
process group times out at the same SeqNum, one (or a few on one node) in another collective than the rest --
"OpType=BROADCAST" where the others say ALLREDUCE (PyTorch's watchdog line, each rank's own word): the others
wait in a collective it never issues. Near misses: all in the same op (a hang, not a desync), odd ranks on two
nodes, a group split in halves."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import incident, member, not_by, rule_says, said, verdict

SIZE = 16  # n0, n1: eight ranks each


def _job() -> list[dict[str, Any]]:
    return [member(f"n{r // 8}", r, SIZE) for r in range(SIZE)]


def _timeout(r: int, op: str, seq: int = 4211, pg: str = "0") -> dict[str, Any]:
    """PyTorch's "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4211, OpType=<op>, ...)"."""
    return said(f"n{r // 8}", r, SIZE, "NCCLCollectiveTimeout", "critical", seq_num=seq, op_type=op, rank=r,
                pg_id=pg, pg_desc="default_pg", timeout_ms=600000, ran_for_ms=600123)


def test_the_rank_in_another_collective_is_named() -> None:
    msgs = [*_job(), *(_timeout(r, "BROADCAST" if r == 11 else "ALLREDUCE") for r in range(SIZE))]
    assert rule_says(verdict(msgs), "desync") == {"node": "n1", "entity": "rank:11", "kind": "rank", "rank": "11"}
    inc = incident(msgs)
    assert inc is not None and "desync" in inc.reason and "BROADCAST" in inc.reason and not inc.actionable


def test_all_in_the_same_collective_is_no_desync() -> None:
    not_by(verdict([*_job(), *(_timeout(r, "ALLREDUCE") for r in range(SIZE))]), "desync")


def test_odd_ranks_on_two_nodes_name_nobody() -> None:
    msgs = [*_job(), *(_timeout(r, "BROADCAST" if r in (3, 11) else "ALLREDUCE") for r in range(SIZE))]
    not_by(verdict(msgs), "desync")


def test_a_group_split_in_halves_names_nobody() -> None:
    msgs = [*_job(), *(_timeout(r, "BROADCAST" if r < 8 else "ALLREDUCE") for r in range(SIZE))]
    not_by(verdict(msgs), "desync")


def test_other_groups_and_numbers_are_not_compared() -> None:
    """The odd op at another SeqNum, or in another process group, is no desync of this one."""
    msgs = [*_job(), *(_timeout(r, "ALLREDUCE") for r in range(SIZE) if r != 11), _timeout(11, "BROADCAST", seq=4210)]
    not_by(verdict(msgs), "desync")
    msgs = [*_job(), *(_timeout(r, "ALLREDUCE") for r in range(SIZE) if r != 11), _timeout(11, "BROADCAST", pg="3")]
    not_by(verdict(msgs), "desync")
