"""Hand-built evidence for the per-verdict tests (tests/test_verdict_<rule>.py): messages in the shape a node
publishes them (agent/message.py ``Message``: what ``check --format json`` prints and the wire carries), and
the registry's verdict for one job.

Every judgement is made twice, on the dicts as built (the offline path: ``correlate``, ``diagnose`` of host
roots) and on the same messages through the fleet's boundary (fleet/wire.py ``decode_job``/``decode_event``
with their typed details kept, as the incident service takes them), and both must agree: a verdict never
depends on which path a message took."""

from __future__ import annotations

import itertools
from typing import Any

from fleet.correlator import VERDICT_RULES, Incident, _Verdict, correlate, facts_of, fast_verdict, slow_verdict
from fleet.wire import as_received

JOB = "0x00000000000000a5"  # NCCL's commId as the node prints it
T0 = "2026-12-03T07:00:00.000Z"
_ids = itertools.count(1)


def message(node: str, collector: str, type_: str, entity: str, severity: str, details: dict[str, Any], *,
            kind: str = "event", status: str | None = None, time: str = T0) -> dict[str, Any]:
    m: dict[str, Any] = {"schema_version": 1, "id": f"{next(_ids):026d}", "time": time, "node": node,
                         "collector": collector, "kind": kind, "type": type_, "severity": severity, "entity": entity,
                         "reason": type_, "message": f"{type_} on {entity}", "details": details,
                         "suggested_action": "none"}
    if status is not None:
        m["status"] = status
    return m


def summary(node: str, rank: int, size: int, *, pid: int | None = None, ip: str | None = None,
            hcas: list[str] | None = None, nics: list[str] | None = None, transport: str = "IB",
            gpu: int | None = None) -> dict[str, Any]:
    """A process's summary as every NCCL message carries it (collectors/nccl: the process's state); a rank's
    GPU and NIC are those of its local index (8 ranks a node: GPU g uses rail mlx5_g)."""
    local = rank % 8 if gpu is None else gpu
    return {"job": JOB, "host": node, "pid": 1000 + rank if pid is None else pid, "world_rank": rank,
            "world_size": size, "pci": f"0000:{0x18 + local:02x}:00.0",
            "hcas": hcas if hcas is not None else [f"mlx5_{local}/1"],
            **({"nics": nics} if nics is not None else {}),
            "transport": transport, "oob": f"ib0:{ip or _ip(node)}<0>"}


def _ip(node: str) -> str:
    return f"10.0.0.{sum(node.encode()) % 250 + 1}"


def entity_of(node: str, rank: int, pid: int | None = None) -> str:
    return f"nccl:{node}:{1000 + rank if pid is None else pid}"


def member(node: str, rank: int, size: int, **kw: Any) -> dict[str, Any]:
    """``NCCLJobMember``: the process joined the job's world communicator (its node's word about itself)."""
    d = summary(node, rank, size, **kw)
    return message(node, "nccl_logs", "NCCLJobMember", entity_of(node, rank, d["pid"]), "info",
                   {**d, "comm_id": JOB, "rank": rank, "size": size})


def said(node: str, world_rank: int, size: int, type_: str, severity: str, *, time: str = T0,
         summary_kw: Any = None, **details: Any) -> dict[str, Any]:
    """One of the process's NCCL/PyTorch messages (a symptom or a finding), its summary included."""
    d = summary(node, world_rank, size, **(summary_kw or {}))
    return message(node, "nccl_logs", type_, entity_of(node, world_rank, d["pid"]), severity, {**d, **details},
                   time=time)


def timeout(node: str, rank: int, size: int, seq: int, *, time: str = T0) -> dict[str, Any]:
    """PyTorch's watchdog gave up on collective ``seq`` (collectors/nccl/rules/watchdog.py)."""
    return said(node, rank, size, "NCCLCollectiveTimeout", "critical", time=time, seq_num=seq, op_type="ALLREDUCE",
                rank=rank, pg_id="0", pg_desc="default_pg", timeout_ms=600000, ran_for_ms=600123)


def progress(node: str, rank: int, size: int, *, at_seq: int | None, last_enqueued: int,
             signal_from_rank: int | None = None, time: str = T0) -> dict[str, Any]:
    """PyTorch's progress of process group 0 (collectors/nccl/rules/pg_progress.py, pg_dump_signal.py)."""
    return said(node, rank, size, "NCCLWatchdogProgress", "warning", time=time, rank=rank, pg_id="0",
                pg_desc="default_pg", at_seq=at_seq, last_enqueued=last_enqueued,
                last_completed=last_enqueued if at_seq is None else at_seq - 1, signal_from_rank=signal_from_rank,
                implausible=False)


def finding(node: str, collector: str, type_: str, entity: str, *, severity: str = "critical",
            status: str = "firing", time: str = T0, **details: Any) -> dict[str, Any]:
    """A node's own collector's condition (infiniband, nvml, kmsg_xid, ...)."""
    return message(node, collector, type_, entity, severity, details, kind="condition", status=status, time=time)


def through_wire(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the incident service takes them: each published on its subject and decoded at the
    fleet's boundary, its typed details kept (a message the boundary refuses raises ``Rejected``)."""
    return [as_received(m) for m in msgs]


def _one(msgs: list[dict[str, Any]]) -> _Verdict | None:
    jobs, hardware = facts_of(msgs)
    held = {node: list(by.values()) for node, by in hardware.items()}
    assert set(jobs) <= {JOB}, sorted(jobs)
    f = jobs.get(JOB)
    if f is None:
        return None
    v = fast_verdict(f, held)
    if v is None and f.symptomatic:
        v = slow_verdict(f, held)
    return v


def verdict(msgs: list[dict[str, Any]]) -> _Verdict | None:
    """The registry's verdict on the job (the first rule by priority that says anything), the same on the
    dicts as built and through the wire."""
    v = _one(msgs)
    w = _one(through_wire(msgs))
    assert (v and (v.rule, v.culprit, v.culprits, v.reason, v.confidence)) == \
        (w and (w.rule, w.culprit, w.culprits, w.reason, w.confidence)), "the wire's typed details decided otherwise"
    return v


def incident(msgs: list[dict[str, Any]]) -> Incident | None:
    """The job's incident as ``correlate`` publishes it (standing: confidence, corroboration, actionable)."""
    got = [i for i in correlate(msgs) if i.job == JOB]
    return got[0] if got else None


def rule_says(v: _Verdict | None, rule: str) -> dict[str, str]:
    """The culprit of a verdict that ``rule`` reached and that names one (else the test fails)."""
    assert rule in {r.name for r in VERDICT_RULES}
    assert v is not None, f"no verdict, {rule} expected"
    assert v.rule == rule, (v.rule, v.reason)
    assert v.culprit is not None, v.reason
    return v.culprit


def not_by(v: _Verdict | None, rule: str) -> None:
    """The near miss: ``rule`` named nobody (another rule may have spoken, or none; a verdict of ``rule``
    naming nobody is allowed: it says why nobody is named)."""
    assert v is None or v.rule != rule or v.culprit is None, (v.rule, v.culprit, v.reason)
