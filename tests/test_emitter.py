from __future__ import annotations

from pathlib import Path

from agent.emitter import CollectorEmitter, ConditionTracker
from tests.conftest import Sink, validate_message


async def _fire(em: CollectorEmitter, firing: bool, severity: str = "critical") -> None:
    await em.condition("IBPortDown", firing=firing, severity=severity, entity="ib:mlx5_0/1",  # type: ignore[arg-type]
                       reason="StateDown", message="Port mlx5_0/1 is DOWN.")


async def test_condition_publishes_only_on_transitions(tmp_path: Path) -> None:
    sink = Sink()
    em = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(tmp_path / "c.json"))
    for _ in range(5):
        await _fire(em, True)
    for _ in range(5):
        await _fire(em, False)
    await _fire(em, True)
    assert [m.status for m in sink.messages] == ["firing", "resolved", "firing"]
    for m in sink.messages:
        validate_message(__import__("agent.message", fromlist=["to_dict"]).to_dict(m))


async def test_escalation_republishes_but_deescalation_does_not(tmp_path: Path) -> None:
    sink = Sink()
    em = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(None))
    await _fire(em, True, "warning")
    await _fire(em, True, "critical")
    await _fire(em, True, "warning")
    assert [(m.status, m.severity) for m in sink.messages] == [("firing", "warning"), ("firing", "critical")]


async def test_state_survives_restart(tmp_path: Path) -> None:
    sink = Sink()
    state = tmp_path / "c.json"
    em = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(state))
    await _fire(em, True)
    # restart: still firing -> nothing new; then it resolves -> one resolved message
    em2 = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(state))
    await _fire(em2, True)
    assert len(sink.messages) == 1
    await _fire(em2, False)
    assert [m.status for m in sink.messages] == ["firing", "resolved"]
    assert ConditionTracker(state).active == {}


async def test_refused_transition_is_retried(tmp_path: Path) -> None:
    sink = Sink()
    em = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(None))
    sink.accept = False
    await _fire(em, True)
    assert em.refused == 1 and not em.tracker.active
    sink.accept = True
    await _fire(em, True)
    assert [m.status for m in sink.messages] == ["firing"]


async def test_unasserted_conditions_resolve_after_a_pass(tmp_path: Path) -> None:
    sink = Sink()
    em = CollectorEmitter("n1", "infiniband", sink, ConditionTracker(None))
    em.begin_pass()
    await _fire(em, True)
    await em.resolve_unasserted()
    assert len(sink.messages) == 1
    em.begin_pass()  # next pass does not report it
    await em.resolve_unasserted()
    assert [m.status for m in sink.messages] == ["firing", "resolved"]
    assert sink.messages[-1].details["firing_message_id"] == sink.messages[0].id
