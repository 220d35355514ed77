"""Collector-facing emitter and the condition state machine.

A condition publishes on transitions only (firing <-> resolved), or when a firing
condition escalates in severity. State persists in the state dir so a restart neither
re-announces a condition that is still firing nor forgets one that resolved meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.facts import FactStore
from agent.message import Message, make_message
from agent.spool import write_atomic
from agent.types import Details, Severity, SuggestedAction

log = structlog.get_logger(__name__)

Sink = Callable[[Message], Awaitable[bool]]
STATE_VERSION = 1


@dataclass
class ActiveCondition:
    collector: str
    type: str
    entity: str
    severity: str
    since: str
    message_id: str
    reason: str
    message: str
    suggested_action: str

    def key(self) -> tuple[str, str, str]:
        return (self.collector, self.type, self.entity)


class ConditionTracker:
    def __init__(self, state_file: Path | None = None) -> None:
        self.state_file = state_file
        self.active: dict[tuple[str, str, str], ActiveCondition] = {}
        self.on_change: Callable[[], None] | None = None
        if state_file is not None:
            self._load()

    def _load(self) -> None:
        assert self.state_file is not None
        try:
            raw = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
            return
        for item in raw.get("active", []):
            try:
                cond = ActiveCondition(**item)
            except TypeError:
                continue
            self.active[cond.key()] = cond

    def _save(self) -> None:
        if self.state_file is not None:
            data = {"version": STATE_VERSION, "active": [vars(c) for c in self.active.values()]}
            write_atomic(self.state_file, json.dumps(data).encode(), fsync=False)
        if self.on_change:
            self.on_change()

    def needs_publish(self, collector: str, type: str, entity: str, firing: bool, severity: str) -> bool:
        cur = self.active.get((collector, type, entity))
        if firing:
            return cur is None or _rank(severity) > _rank(cur.severity)
        return cur is not None

    def record(self, msg: Message) -> None:
        key = (msg.collector, msg.type, msg.entity)
        if msg.status == "firing":
            prev = self.active.get(key)
            self.active[key] = ActiveCondition(
                collector=msg.collector, type=msg.type, entity=msg.entity, severity=msg.severity,
                since=prev.since if prev else msg.time, message_id=msg.id, reason=msg.reason,
                message=msg.message, suggested_action=msg.suggested_action)
        else:
            self.active.pop(key, None)
        self._save()

    def firing_for(self, collector: str) -> list[ActiveCondition]:
        return [c for c in self.active.values() if c.collector == collector]

    def snapshot(self) -> list[dict[str, Any]]:
        return [vars(c).copy() for c in self.active.values()]


def _rank(sev: str) -> int:
    return {"info": 0, "warning": 1, "critical": 2}.get(sev, 0)


class CollectorEmitter:
    """Implements agent.types.Emitter for one collector."""

    def __init__(self, node: str, collector: str, sink: Sink, tracker: ConditionTracker, *,
                 facts: FactStore | None = None, state_dir: Path | None = None) -> None:
        self.node = node
        self.collector = collector
        self.sink = sink
        self.tracker = tracker
        self.facts = facts if facts is not None else FactStore()
        self.state_dir = state_dir  # None in `check`: nothing persists
        self.asserted: set[tuple[str, str]] = set()  # (type, entity) reported firing in this pass
        self.emitted = 0
        self.refused = 0
        self.blind: dict[str, str] = {}  # source -> why it could not be seen (latest pass)
        self.skipped: dict[str, tuple[int, str]] = {}  # source -> (unparsed count, first sample)

    async def _send(self, msg: Message) -> bool:
        ok = await self.sink(msg)
        if ok:
            self.emitted += 1
        else:
            self.refused += 1
        return ok

    async def event(self, type: str, *, severity: Severity, entity: str, reason: str, message: str,
                    details: Details | None = None, suggested_action: SuggestedAction = "none",
                    msg_id: str | None = None) -> bool:
        return await self._send(make_message(
            node=self.node, collector=self.collector, kind="event", type=type, severity=severity,
            entity=entity, reason=reason, message=message, details=dict(details or {}),
            suggested_action=suggested_action, msg_id=msg_id))

    async def condition(self, type: str, *, firing: bool, severity: Severity, entity: str, reason: str,
                        message: str, details: Details | None = None,
                        suggested_action: SuggestedAction = "none") -> bool:
        if firing:
            self.asserted.add((type, entity))
        if not self.tracker.needs_publish(self.collector, type, entity, firing, severity):
            return True
        msg = make_message(
            node=self.node, collector=self.collector, kind="condition", type=type,
            status="firing" if firing else "resolved", severity=severity, entity=entity, reason=reason,
            message=message, details=dict(details or {}), suggested_action=suggested_action)
        # Only a transition the bus accepted changes state: a refused one is retried next pass.
        if await self._send(msg):
            self.tracker.record(msg)
            return True
        return False

    def active_conditions(self) -> list[tuple[str, str, str]]:
        """(type, entity, severity) of this collector's firing conditions, including from before a restart."""
        return [(c.type, c.entity, c.severity) for c in self.tracker.firing_for(self.collector)]

    def unparsed(self, source: str, sample: str) -> None:
        count, first = self.skipped.get(source, (0, ""))
        if not count:
            log.warning("source_unparsed", collector=self.collector, source=source, sample=sample[:200])
        self.skipped[source] = (count + 1, first or sample[:200])

    def not_seen(self, source: str, reason: str) -> None:
        if self.blind.get(source) != reason:
            log.info("source_not_seen", collector=self.collector, source=source, reason=reason)
        self.blind[source] = reason

    def begin_pass(self) -> None:
        self.asserted.clear()

    async def resolve_unasserted(self) -> None:
        """After a successful periodic pass: conditions not reported firing again have cleared."""
        for cond in self.tracker.firing_for(self.collector):
            if (cond.type, cond.entity) in self.asserted:
                continue
            await self.condition(
                cond.type, firing=False, severity=cond.severity,  # type: ignore[arg-type]
                entity=cond.entity, reason="NoLongerObserved",
                message=f"{cond.type} on {cond.entity} is no longer observed.",
                details={"firing_since": cond.since, "firing_message_id": cond.message_id})
