"""Issue 25 (2): another node's lines relayed by the node that read them in a job-wide file (srun's forwarded
output on the batch host, a launcher's aggregated log). The fleet files them under the host that wrote them,
on the reader's word: shown, and corroborated by that host's own agent or hardware before anything is decided."""

from __future__ import annotations

from typing import Any

from fleet.correlator import facts_of
from fleet.job_facts import Membership
from gna_types.details import ProcessSummary
from tests.verdict_evidence import JOB, finding, incident, member, rule_says, timeout, verdict

SIZE = 16  # n0, n1: eight ranks each


def relayed(m: dict[str, Any], by: str) -> dict[str, Any]:
    """The message as the node ``by`` publishes it after reading it in a job-wide file."""
    return {**m, "node": by, "severity": "info", "details": {**m["details"], "relayed": True}}


def _job(relay_n1: bool) -> list[dict[str, Any]]:
    out = [member("n0", r, SIZE) for r in range(8)]
    return out + [relayed(member("n1", r, SIZE), "n0") if relay_n1 else member("n1", r, SIZE) for r in range(8, 16)]


def _hung(relay_n1: bool) -> list[dict[str, Any]]:
    """rank 11 on n1 hung; n1's other ranks' timeouts relayed by n0 (slurm-<id>.out on n0 only)."""
    t = [timeout(f"n{r // 8}", r, SIZE, 4211) for r in range(SIZE) if r != 11]
    return [*_job(relay_n1), *(relayed(m, "n0") if relay_n1 and m["node"] == "n1" else m for m in t)]


def test_relayed_processes_are_filed_under_their_host_and_complete_the_job() -> None:
    jobs, _ = facts_of(_hung(relay_n1=True))
    ms = jobs[JOB].ms
    assert len(ms.ranks) == SIZE and set(ms.by_node) == {"n0", "n1"} and not ms.contested
    assert {m.reporter for m in ms.by_node["n1"]} == {"n0"}


def test_a_verdict_on_the_reader_s_word_alone_is_shown_not_acted_on() -> None:
    msgs = _hung(relay_n1=True)
    assert rule_says(verdict(msgs), "hung_rank") == {"node": "n1", "entity": "rank:11", "kind": "rank",
                                                      "rank": "11"}
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "single reporter" and inc.confidence <= 0.5
    assert not inc.actionable


def test_the_host_s_own_claims_replace_the_relayed_ones_without_a_conflict() -> None:
    msgs = [*_hung(relay_n1=True), *(member("n1", r, SIZE) for r in range(8, 16))]
    jobs, _ = facts_of(msgs)
    ms = jobs[JOB].ms
    assert not ms.contested and {ms.ranks[r].via for r in range(8, 16)} == {None}


def test_the_host_s_own_hardware_corroborates_a_relayed_membership() -> None:
    """An Xid 79 on n1's GPU (n1's own kernel log): n1's ranks known only through n0's relay still used it."""
    msgs = [*_job(relay_n1=True), finding("n1", "kmsg_xid", "GPUFellOffBus", "gpu:0000:1b:00.0", text="Xid 79")]
    culprit = rule_says(verdict(msgs), "hardware")
    assert culprit["node"] == "n1" and culprit["entity"] == "gpu:0000:1b:00.0"
    inc = incident(msgs)
    assert inc is not None and inc.corroboration == "own node" and inc.actionable


def test_a_node_cannot_crowd_out_another_node_s_own_processes() -> None:
    """A reader relaying 64 made-up processes of n1 does not take n1's share of the job."""
    ms = Membership(members_per_node=64)
    for pid in range(64):
        ms.claim("n1", ProcessSummary(job=JOB, host="n1", pid=5000 + pid, relayed=True), pid, via="n0")
    mem = ms.claim("n1", ProcessSummary(job=JOB, host="n1", pid=1011, world_rank=11, world_size=SIZE), 100)
    assert mem is not None and mem.via is None and ms.refused == 0
