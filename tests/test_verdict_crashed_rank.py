"""Verdict ``crashed_rank`` (fleet/correlator.py VERDICT_RULES, priority 3, once the symptoms settled): a rank
whose process ended on its own while the job ran -- torchrun's failure report of a signal, an OOM kill or an
error of its own, or an NCCL error of its own (a CUDA error) -- is named on its node, its rank taken from
membership; the ranks that failed after it (an NCCL remote error, a report of a peer's failure) are victims.
Own failures on several nodes, or too many ranks, name nobody; a relayed report is one reporter's word."""

from __future__ import annotations

from typing import Any

import pytest

from fleet import job_facts
from tests.verdict_evidence import incident, member, not_by, rule_says, said, timeout, verdict

SIZE = 16  # n0, n1: eight ranks each


def _job() -> list[dict[str, Any]]:
    return [member(f"n{r // 8}", r, SIZE) for r in range(SIZE)]


def _failed(r: int, reason: str, *, by: str | None = None, **kw: Any) -> dict[str, Any]:
    """torchrun's failure report on rank r's worker (collectors/nccl: ``TorchRankFailed``)."""
    m = said(f"n{r // 8}", r, SIZE, "TorchRankFailed", "warning", rank=r, local_rank=r % 8,
             exitcode=-9 if reason != "PeerFailure" else 1, signal="SIGKILL" if reason != "PeerFailure" else None,
             failed_at="2026-12-05_07:44:26", root_cause=True, **kw)
    m["reason"] = reason
    if by is not None:  # read by another node in a job-wide file
        m["node"], m["details"]["relayed"], m["severity"] = by, True, "info"
    return m


def _oom_killed_11() -> dict[str, Any]:
    """Rank 11 on n1 killed by the OOM killer (its node's kernel log has the kill): the crash of its own."""
    return _failed(11, "OOMKilled", explanation="OOM kill (kernel: Killed process 40003 (python))")


def _remote(r: int) -> dict[str, Any]:
    """PyTorch's DistBackendError on a peer: ncclRemoteError (``NCCLBackendError``, a victim)."""
    m = said(f"n{r // 8}", r, SIZE, "NCCLBackendError", "info", nccl_error="ncclRemoteError", remote=True,
             rank=r)
    m["reason"] = "RemoteError"
    return m


def test_the_rank_killed_on_its_own_is_named_and_the_others_are_victims() -> None:
    msgs = [*_job(), _oom_killed_11(), *(_failed(r, "PeerFailure") for r in range(8)),
            *(_remote(r) for r in (0, 5, 12))]
    assert rule_says(verdict(msgs), "crashed_rank") == {"node": "n1", "entity": "rank:11", "kind": "rank",
                                                         "rank": "11"}
    inc = incident(msgs)
    assert inc is not None and inc.victims == ["n0"] and inc.corroboration == "own node"
    assert not inc.actionable  # the job's own report: shown, never a cordon


def _exit1(r: int, **kw: Any) -> dict[str, Any]:
    """torchrun's report of a worker that exited 1 with no cause printed (``ExitedWithError``): what a worker
    whose collective raised an NCCL remote error (DistBackendError) leaves when its traceback is not read."""
    m = said(f"n{r // 8}", r, SIZE, "TorchRankFailed", "warning", rank=r, local_rank=r % 8, exitcode=1,
             failed_at="2026-12-05_07:44:27", **kw)
    m["reason"] = "ExitedWithError"
    return m


@pytest.mark.parametrize("victim_first", [False, True])
def test_an_exit_code_alone_after_a_peer_failed_is_a_victim_s(victim_first: bool) -> None:
    """tests/layouts' crash under srun: rank 11 OOM-killed on n1; rank 3 on n0 got the NCCL remote error, and
    torchrun reports it exited 1 -- on its own by the report alone, which made own failures on two nodes and
    named nobody (the closed sockets then named n1 as a node). The remote error makes the exit the peer's
    doing, whichever of the two is read first."""
    pair = [_remote(3), _exit1(3)] if victim_first else [_exit1(3), _remote(3)]
    msgs = [*_job(), _oom_killed_11(), *pair]
    assert rule_says(verdict(msgs), "crashed_rank") == {"node": "n1", "entity": "rank:11", "kind": "rank",
                                                         "rank": "11"}


def test_past_the_victims_bound_no_exit_code_alone_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The victims kept per job are bounded (fleet/job_facts.py VICTIMS_MAX): once more ranks than that saw a
    peer fail, a bare exit is taken as one of theirs even when its own remote error was not kept."""
    monkeypatch.setattr(job_facts, "VICTIMS_MAX", 2)
    # rank 3's remote error is the third: past the bound, not kept
    msgs = [*_job(), _oom_killed_11(), _remote(1), _remote(2), _remote(3), _exit1(3)]
    assert rule_says(verdict(msgs), "crashed_rank")["entity"] == "rank:11"


def test_an_exit_with_a_cause_of_its_own_stays_its_own() -> None:
    """Near misses: rank 3's exit with no cause but no peer's failure in its own lines, or with an error of its
    own printed though it also saw a remote error, is a failure of its own: two nodes, nobody named."""
    oom = _oom_killed_11()
    not_by(verdict([*_job(), oom, _exit1(3), _remote(5)]), "crashed_rank")
    not_by(verdict([*_job(), oom, _remote(3), _exit1(3, error="RuntimeError: CUDA error: an illegal memory access "
                                                         "was encountered")]), "crashed_rank")


def test_a_cuda_error_of_its_own_names_the_rank() -> None:
    own = said("n0", 3, SIZE, "NCCLBackendError", "warning", nccl_error="ncclUnhandledCudaError", rank=3)
    own["reason"] = "ncclUnhandledCudaError"
    msgs = [*_job(), own, *(_remote(r) for r in range(8, 16))]
    assert rule_says(verdict(msgs), "crashed_rank")["entity"] == "rank:3"


def test_a_relayed_report_is_one_reporter_s_word() -> None:
    """srun forwarded n1's torchrun output to n0's slurm-<id>.out: n0 relays it; named, shown, not acted on."""
    msgs = [*_job(), _failed(11, "KilledBySignal", by="n0")]
    assert rule_says(verdict(msgs), "crashed_rank")["node"] == "n1"
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "single reporter" and inc.confidence == 0.5


def test_victims_alone_name_nobody() -> None:
    """Near miss: every report says a peer's failure (exit 1, remote error): nobody ended on its own."""
    not_by(verdict([*_job(), *(_failed(r, "PeerFailure") for r in range(SIZE)), *(_remote(r) for r in range(4))]),
           "crashed_rank")


def test_own_failures_on_two_nodes_name_nobody() -> None:
    not_by(verdict([*_job(), _failed(3, "KilledBySignal"), _failed(11, "KilledBySignal")]), "crashed_rank")


def test_a_hung_job_without_a_crash_is_not_this_rule_s() -> None:
    msgs = [*_job(), *(timeout(f"n{r // 8}", r, SIZE, 4211) for r in range(SIZE) if r != 11)]
    v = verdict(msgs)
    assert v is not None and v.rule != "crashed_rank"
