"""Issue 22: an incident keeps the evidence that decided it, says what it counted, is listed by what an
operator can act on, and a job that merely fell back to sockets is not an incident."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fleet.correlator import DECIDING_MAX, EVIDENCE_MAX
from fleet.incidents import IncidentTracker
from fleet.state import FleetState, decode_incident
from sim.scenarios import generate


async def _ib_port_down(tmp: Path, nodes: int = 6) -> tuple[Any, list[dict[str, Any]]]:
    sc = generate(tmp, seed=5, nodes=nodes, fault="ib_port_down", job_nodes=nodes, second_job=False)
    return sc, await sc.messages()


async def test_the_deciding_finding_is_kept_first_whatever_how_many_victims_timed_out(tmp_path: Path) -> None:
    """The live run of the issue: 'evidence 24 of 56' and none of the 24 the IBPortDown that decided
    it. Here every victim's timeout arrives (and is dated) before the port's own finding."""
    sc, msgs = await _ib_port_down(tmp_path)
    hardware = [m for m in msgs if m["severity"] == "critical" and str(m["entity"]).startswith("ib:")]
    assert hardware
    symptoms = [m for m in msgs if m not in hardware]
    late = "2099-01-01T00:00:00Z"  # the finding is the newest item: a time-ordered cut would drop it first
    t = IncidentTracker(settle=0)
    touched: set[str] = set()
    for m in symptoms + [{**h, "time": late} for h in hardware]:
        touched |= t.add(m, now=100.0)
    recs = t.judge(touched, now=100.0)
    rec = recs[-1]
    want = sc.expected[sc.jobs[0].comm_id]
    assert rec["status"] == "open" and {k: rec["culprit"][k] for k in want} == want
    timeouts = sum(1 for m in symptoms if m["type"] == "NCCLCollectiveTimeout")
    assert timeouts > EVIDENCE_MAX // 2
    decisive = [e for e in rec["evidence"] if e.get("decisive")]
    assert decisive and all(e["entity"] == rec["culprit"]["entity"] for e in decisive)
    assert rec["evidence"][:len(decisive)] == decisive  # first, before any sample
    assert len(rec["evidence"]) <= DECIDING_MAX + EVIDENCE_MAX
    assert rec["evidence_total"] >= timeouts
    counts = rec["evidence_counts"]
    assert counts["by_type"]["NCCLCollectiveTimeout"] == timeouts
    assert sum(counts["by_node"].values()) == sum(counts["by_type"].values())  # 6 nodes: every one named
    assert rec["last_evidence"] == late and rec["first_evidence"] < late
    assert rec["opened"] == 100.0
    # the views' decoder keeps all of it
    view = decode_incident(rec)
    assert [e.get("decisive", False) for e in view["evidence"]] == [e.get("decisive", False) for e in rec["evidence"]]
    assert view["evidence_counts"] == counts and view["opened"] == 100.0


def test_counts_per_node_sum_to_the_symptoms_counted() -> None:
    t = IncidentTracker(settle=0)
    job = "0xabc"
    touched: set[str] = set()
    for n in range(20):
        node = f"n{n:02d}"
        for r in range(2):
            base = {"node": node, "collector": "nccl_logs", "entity": f"nccl:{node}:{100 + r}", "kind": "event",
                    "time": f"2026-12-05T08:00:{n:02d}Z", "status": "firing", "id": f"{node}-{r}",
                    "details": {"job": job, "host": node, "pid": 100 + r, "world_rank": 2 * n + r, "world_size": 40}}
            touched |= t.add({**base, "type": "NCCLJobMember", "severity": "info", "id": f"m-{node}-{r}"}, now=1.0)
            if n != 7:  # rank 14 and 15's node is silent: the hung one
                touched |= t.add({**base, "type": "NCCLCollectiveTimeout", "severity": "critical",
                                  "details": {**base["details"], "seq_num": 9}}, now=1.0)
    (rec,) = t.judge(touched, now=5.0)
    assert rec["culprit"]["node"] == "n07"
    c = rec["evidence_counts"]
    assert c["by_type"] == {"NCCLCollectiveTimeout": 38} and c["nodes"] == 19
    assert len(c["by_node"]) == 16 and all(v == 2 for v in c["by_node"].values())
    assert rec["evidence_total"] == 38 and len(rec["evidence"]) <= EVIDENCE_MAX


async def test_a_job_that_only_fell_back_to_sockets_is_not_an_incident_until_it_hangs(tmp_path: Path) -> None:
    t = IncidentTracker(settle=0)
    job = "0xdef"
    touched: set[str] = set()

    def msg(node: str, type_: str, severity: str, rank: int, **extra: Any) -> dict[str, Any]:
        return {"node": node, "collector": "nccl_logs", "entity": f"nccl:{node}:1", "kind": "event", "type": type_,
                "severity": severity, "time": "2026-12-05T08:00:00Z", "status": "firing",
                "id": f"{node}-{type_}-{rank}", "details": {"job": job, "host": node, "pid": 1, "world_rank": rank,
                                                           "world_size": 4, "transport": "Socket", **extra}}

    for i in range(4):
        touched |= t.add(msg(f"s{i}", "NCCLJobMember", "info", i), now=1.0)
        touched |= t.add(msg(f"s{i}", "NCCLSocketFallback", "warning", i), now=1.0)
    assert t.judge(touched, now=10.0) == []  # every node on sockets: each node's finding, not an incident
    # then three ranks time out and one does not: a hung job, an incident
    for i in range(3):
        touched |= t.add(msg(f"s{i}", "NCCLCollectiveTimeout", "critical", i, seq_num=3), now=11.0)
    (rec,) = t.judge(touched, now=20.0)
    assert rec["status"] == "open" and rec["culprit"]["node"] == "s3"


def _record(job: str, *, confidence: float, culprit: str | None, updated: float,
            actionable: bool = False, status: str = "open") -> dict[str, Any]:
    c = {"node": culprit, "entity": "ib:mlx5_0/1", "kind": "hca_port"} if culprit else None
    return {"job": job, "status": status, "culprit": c, "confidence": confidence, "actionable": actionable,
            "victims": ["v1"], "nodes": ["v1"] + ([culprit] if culprit else []), "reason": "r", "evidence": [],
            "evidence_total": 0, "updated": updated, "opened": updated - 5}


def test_views_list_a_named_culprit_above_a_newer_job_with_none() -> None:
    state = FleetState()
    now = time.time() - 100
    for rec in (_record("named", confidence=0.97, culprit="gpu-007", updated=now, actionable=True),
                _record("shown", confidence=0.9, culprit="gpu-008", updated=now + 1),
                _record("nothing", confidence=0.0, culprit=None, updated=now + 50),
                _record("old", confidence=0.97, culprit="gpu-009", updated=now + 60, status="resolved")):
        assert state.apply_incident(rec, key=rec["job"])
    assert [r["job"] for r in state.incidents()] == ["named", "shown", "nothing", "old"]
    assert [r["job"] for r in state.incidents(status="open")] == ["named", "shown", "nothing"]
    # the culprit's node page names its incident; a victim's says which job's hang it suffers
    assert state.node_incidents("gpu-007") == [
        {"job": "named", "job_name": None, "role": "culprit", "entity": "ib:mlx5_0/1", "confidence": 0.97,
         "actionable": True, "reason": "r", "opened": now - 5, "updated": now}]
    assert [(i["job"], i["role"]) for i in state.node_incidents("v1")] == [
        ("named", "victim"), ("shown", "victim"), ("nothing", "victim")]
    assert state.node_incidents("gpu-009") == []  # its incident resolved
