"""Verdict ``behind_rank`` (fleet/correlator.py VERDICT_RULES, priority 4, once the symptoms settled): PyTorch's
own numbers from each rank's node say where each rank's process group failed and how far it had enqueued; a
rank below the collective most ranks wait in never entered it and is named. Not when most ranks are "behind"
one rank ahead (a software divergence), when the numbers are implausible, or when the behind ranks are on
several nodes."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import member, not_by, progress, rule_says, timeout, verdict

SIZE = 16  # n0-n3, four ranks each


def _job() -> list[dict[str, Any]]:
    return [member(f"n{r // 4}", r, SIZE) for r in range(SIZE)]


def _waiting(r: int, seq: int = 812) -> list[dict[str, Any]]:
    node = f"n{r // 4}"
    return [timeout(node, r, SIZE, seq), progress(node, r, SIZE, at_seq=seq, last_enqueued=seq)]


def _never_enqueued(r: int, last: int = 811) -> dict[str, Any]:
    """A rank that heard of the others' timeout with nothing in flight (its last enqueued work below it)."""
    return progress(f"n{r // 4}", r, SIZE, at_seq=None, last_enqueued=last, signal_from_rank=3)


def test_the_rank_whose_last_enqueued_work_is_below_the_collective_is_named() -> None:
    msgs = _job() + [m for r in range(SIZE) if r != 9 for m in _waiting(r)] + [_never_enqueued(9)]
    v = verdict(msgs)
    assert rule_says(v, "behind_rank") == {"node": "n2", "entity": "rank:9", "kind": "rank", "rank": "9"}
    assert v is not None and v.confidence == 0.9 and "last enqueued work is below" in v.reason
    assert any(b.get("node") == "n2" for b in v.deciding), "the behind rank's own message decides"


def test_a_rank_that_failed_at_an_earlier_collective_is_named() -> None:
    msgs = _job() + [m for r in range(SIZE) if r != 6 for m in _waiting(r)] + _waiting(6, seq=811)
    assert rule_says(verdict(msgs), "behind_rank")["rank"] == "6"


def test_one_rank_ahead_of_all_others_names_nobody() -> None:
    """Near miss: rank 7 timed out in a collective nobody else enqueued, every other rank heard of it with its
    work completed: fifteen ranks "behind" one is no faulty rank."""
    msgs = _job() + _waiting(7, seq=56119) + [_never_enqueued(r, last=56118) for r in range(SIZE) if r != 7]
    not_by(verdict(msgs), "behind_rank")


def test_implausible_numbers_are_not_evidence() -> None:
    """Near miss: the parser flagged the behind rank's numbers as impossible: they decide nothing."""
    odd = _never_enqueued(9)
    odd["details"]["implausible"] = True
    msgs = _job() + [m for r in range(SIZE) if r != 9 for m in _waiting(r)] + [odd]
    not_by(verdict(msgs), "behind_rank")


def test_behind_ranks_on_two_nodes_name_nobody() -> None:
    """Near miss: ranks 1 (n0) and 9 (n2) both behind: not one node's rank."""
    msgs = _job() + [m for r in range(SIZE) if r not in (1, 9) for m in _waiting(r)]
    msgs += [_never_enqueued(1), _never_enqueued(9)]
    not_by(verdict(msgs), "behind_rank")
