"""Bounded cardinality (#13 D8): per-collector condition caps with an aggregate, a heartbeat that
fits max_payload, NCCL lines of other hosts attributed, not judged as this node's."""

from __future__ import annotations

import json
from pathlib import Path

from agent.emitter import CollectorEmitter, ConditionTracker, overflow_entity
from tests.conftest import Sink


def _emitter(sink: Sink, tracker: ConditionTracker, cap: int = 5) -> CollectorEmitter:
    return CollectorEmitter("n1", "nccl_logs", sink, tracker, max_conditions=cap)


async def _fire(em: CollectorEmitter, entity: str, severity: str = "warning") -> bool:
    return await em.condition("NCCLSocketFallback", firing=True, severity=severity,  # type: ignore[arg-type]
                              entity=entity, reason="SocketTransport", message=f"{entity} uses sockets")


async def _clear(em: CollectorEmitter, entity: str) -> bool:
    return await em.condition("NCCLSocketFallback", firing=False, severity="warning", entity=entity,
                              reason="ProcessEnded", message="gone")


async def test_conditions_beyond_the_cap_fold_into_one_aggregate(tmp_path: Path) -> None:
    sink, tracker = Sink(), ConditionTracker(tmp_path / "conditions.json")
    em = _emitter(sink, tracker)
    for i in range(4000):
        assert await _fire(em, f"nccl:evil-{i}:{i}", "critical" if i == 3999 else "warning")
    published = [m for m in sink.messages if m.kind == "condition"]
    # 5 individual, the aggregate once, then once more when a folded one escalated to critical
    assert [m.entity for m in published[:5]] == [f"nccl:evil-{i}:{i}" for i in range(5)]
    agg = [m for m in published if m.entity == overflow_entity("nccl_logs")]
    assert [(m.status, m.severity) for m in agg] == [("firing", "warning"), ("firing", "critical")]
    assert agg[-1].details["aggregated"] == 3995 and agg[-1].details["cap"] == 5
    assert len(tracker.active) == 6 and tracker.overflow_counts() == {"nccl_logs": 3995}
    assert len(em.active_conditions()) == 4000  # the collector still sees (and can resolve) each one
    # the folded state survives a restart
    again = ConditionTracker(tmp_path / "conditions.json")
    assert again.overflow_counts() == {"nccl_logs": 3995} and len(again.active) == 6
    # resolving: the aggregate resolves with the last folded one, the individual ones as usual
    for i in range(5, 4000):
        await _clear(em, f"nccl:evil-{i}:{i}")
    agg = [m for m in sink.messages if m.entity == overflow_entity("nccl_logs")]
    assert agg[-1].status == "resolved" and len(agg) == 3
    assert len(tracker.active) == 5 and not tracker.overflow_counts()
    assert len(sink.messages) == 5 + 3  # no message per folded transition


async def test_a_periodic_pass_resolves_folded_conditions_it_no_longer_sees(tmp_path: Path) -> None:
    sink, tracker = Sink(), ConditionTracker(None)
    em = _emitter(sink, tracker, cap=2)
    em.begin_pass()
    for i in range(6):
        await _fire(em, f"ib:mlx5_{i}/1")
    await em.resolve_unasserted()
    assert tracker.overflow_counts() == {"nccl_logs": 4}
    em.begin_pass()
    await _fire(em, "ib:mlx5_0/1")
    await _fire(em, "ib:mlx5_5/1")  # still folded: keeps the aggregate
    await em.resolve_unasserted()
    assert tracker.overflow_counts() == {"nccl_logs": 1}
    assert {c.entity for c in tracker.active.values()} == {"ib:mlx5_0/1", overflow_entity("nccl_logs")}
    em.begin_pass()
    await em.resolve_unasserted()
    assert not tracker.active and not tracker.overflow_counts()


def test_a_damaged_condition_state_is_ignored_entry_by_entry(tmp_path: Path) -> None:
    good = {"collector": "c", "type": "T", "entity": "e", "severity": "warning", "since": "t", "message_id": "m",
            "reason": "r", "message": "x", "suggested_action": "none"}
    state = tmp_path / "conditions.json"
    state.write_text(json.dumps({"version": 1, "active": [good, {**good, "entity": 5}, {**good, "extra": "1"}, "x",
                                                          {"collector": "c"}],
                                 "overflow": [["c", "T", {"e2": "warning"}], ["c", "T", {"e3": 7}], "bad"]}))
    t = ConditionTracker(state)
    assert list(t.active) == [("c", "T", "e")] and t.overflow == {("c", "T"): {"e2": "warning"}}
    assert t.bad_entries == 6
    state.write_text('{"version": 1, "active": {"not": "a list"}, "overflow": 3}')
    assert not ConditionTracker(state).active
