"""Collector-facing emitter and the condition state machine.

A condition publishes on transitions only (firing <-> resolved), or when a firing
condition escalates in severity. State persists in the state dir so a restart neither
re-announces a condition that is still firing nor forgets one that resolved meanwhile.

Cardinality is bounded: beyond ``max_conditions`` individual conditions per collector, new
entities of a type are folded into one aggregate condition of that type (entity
``overflow:<collector>``) that names how many and which; it resolves when the last of them does.
A log that names 4,000 processes raises a handful of conditions, not 4,000.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.facts import FactStore
from agent.message import Message, make_message
from gna_sdk import Details, Severity, SuggestedAction, plural, severity_rank
from gna_sdk.statefile import write_state
from gna_types.host_details import ConditionCleared, ConditionsAggregated
from gna_types.node_details import wire

log = structlog.get_logger(__name__)

Sink = Callable[[Message], Awaitable[bool]]
STATE_VERSION = 1
DEFAULT_MAX_CONDITIONS = 64
OVERFLOW_PREFIX = "overflow:"


def overflow_entity(collector: str) -> str:
    return f"{OVERFLOW_PREFIX}{collector}"


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
        # (collector, type) -> {entity: severity} folded into that type's aggregate condition
        self.overflow: dict[tuple[str, str], dict[str, str]] = {}
        self.bad_entries = 0
        self._last_save = 0.0
        self._dirty = False
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
        for item in raw.get("active", []) if isinstance(raw.get("active"), list) else []:
            # every field a str: a hand-edited or damaged entry is dropped (counted), never a crash at start
            if not (isinstance(item, dict) and set(item) == _FIELDS and all(isinstance(v, str) for v in item.values())):
                self.bad_entries += 1
                continue
            cond = ActiveCondition(**item)
            self.active[cond.key()] = cond
        for item in raw.get("overflow", []) if isinstance(raw.get("overflow"), list) else []:
            if not (isinstance(item, list) and len(item) == 3 and all(isinstance(v, str) for v in item[:2])
                    and isinstance(item[2], dict) and all(isinstance(v, str) for v in item[2].values())):
                self.bad_entries += 1
                continue
            self.overflow[(item[0], item[1])] = dict(item[2])
        if self.bad_entries:
            log.warning("condition_state_entries_ignored", file=str(self.state_file), count=self.bad_entries)

    def save_soon(self) -> None:
        """Folded entries change in bursts (a log naming 4,000 processes): at most one write a second;
        the aggregate's own transitions save at once through record()."""
        now = time.monotonic()
        if now - self._last_save >= 1.0:
            self._save()
        else:
            self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._save()

    def _save(self) -> None:
        self._last_save, self._dirty = time.monotonic(), False
        if self.state_file is not None:
            write_state(self.state_file, {"active": [vars(c) for c in self.active.values()],
                                          "overflow": [[c, t, ents] for (c, t), ents in self.overflow.items() if ents]},
                        version=STATE_VERSION)
        if self.on_change:
            self.on_change()

    def needs_publish(self, collector: str, type: str, entity: str, firing: bool, severity: str) -> bool:
        cur = self.active.get((collector, type, entity))
        if firing:
            return cur is None or severity_rank(severity) > severity_rank(cur.severity)
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

    def individual_count(self, collector: str) -> int:
        return sum(1 for c in self.active.values() if c.collector == collector
                   and not c.entity.startswith(OVERFLOW_PREFIX))

    def overflow_counts(self) -> dict[str, int]:
        """collector -> conditions folded into aggregates now (the heartbeat carries it)."""
        out: dict[str, int] = {}
        for (collector, _type), ents in self.overflow.items():
            if ents:
                out[collector] = out.get(collector, 0) + len(ents)
        return out

    def snapshot(self) -> list[dict[str, Any]]:
        return [vars(c).copy() for c in self.active.values()]


_FIELDS = set(ActiveCondition.__dataclass_fields__)


class CollectorEmitter:
    """Implements gna_sdk.Emitter for one collector."""

    def __init__(self, node: str, collector: str, sink: Sink, tracker: ConditionTracker, *,
                 facts: FactStore | None = None, state_dir: Path | None = None,
                 max_conditions: int = DEFAULT_MAX_CONDITIONS) -> None:
        self.node = node
        self.collector = collector
        self.sink = sink
        self.tracker = tracker
        self.facts = facts if facts is not None else FactStore()
        self.state_dir = state_dir  # None in `check`: nothing persists
        self.max_conditions = max_conditions
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
        folded = self.tracker.overflow.get((self.collector, type), {})
        if entity in folded or (firing and (self.collector, type, entity) not in self.tracker.active
                                and self.tracker.individual_count(self.collector) >= self.max_conditions):
            return await self._fold(type, entity, firing, severity, message, suggested_action)
        return await self._transition(type, firing=firing, severity=severity, entity=entity, reason=reason,
                                      message=message, details=details, suggested_action=suggested_action)

    async def _fold(self, type: str, entity: str, firing: bool, severity: Severity, message: str,
                    suggested_action: SuggestedAction) -> bool:
        """A condition beyond the cap joins (or leaves) its type's aggregate."""
        folded = self.tracker.overflow.setdefault((self.collector, type), {})
        agg = overflow_entity(self.collector)
        if firing:
            changed = entity not in folded or severity_rank(severity) > severity_rank(folded[entity])
            folded[entity] = max(severity, folded.get(entity, severity), key=severity_rank)
            self.asserted.add((type, agg))
        else:
            changed = folded.pop(entity, None) is not None
        if changed:
            self.tracker.save_soon()
        if not folded:
            self.tracker.overflow.pop((self.collector, type), None)
            return await self._transition(type, firing=False, severity=severity, entity=agg, reason="Recovered",
                                          message=f"All {type} conditions beyond the cap have cleared.")
        if not firing:
            return True  # the aggregate never de-escalates (transitions only); it resolves with the last
        worst: Severity = folded[entity]  # type: ignore[assignment]
        if not self.tracker.needs_publish(self.collector, type, agg, True, worst):
            return True  # already firing at this severity or worse
        sample = sorted(folded)[:10]
        return await self._transition(
            type, firing=True, severity=worst, entity=agg, reason="Aggregated",
            message=f"{plural(len(folded), f'more {type} condition')} beyond the cap of {self.max_conditions} for "
                    f"{self.collector} (e.g. {', '.join(sample[:3])}): {message[:200]}",
            details=wire(ConditionsAggregated(aggregated=len(folded), cap=self.max_conditions, entities_sample=sample)),
            suggested_action=suggested_action)

    async def _transition(self, type: str, *, firing: bool, severity: Severity, entity: str, reason: str,
                          message: str, details: Details | None = None,
                          suggested_action: SuggestedAction = "none") -> bool:
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
        """(type, entity, severity) of this collector's firing conditions, including from before a restart
        and those folded into an aggregate (resolving one of them works the same)."""
        out = [(c.type, c.entity, c.severity) for c in self.tracker.firing_for(self.collector)
               if not c.entity.startswith(OVERFLOW_PREFIX)]
        for (collector, type_), ents in self.tracker.overflow.items():
            if collector == self.collector:
                out.extend((type_, e, sev) for e, sev in ents.items())
        return out

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
        for (collector, type_), folded in list(self.tracker.overflow.items()):
            if collector != self.collector:
                continue
            for entity, severity in list(folded.items()):  # the aggregate resolves with the last of them
                if (type_, entity) not in self.asserted:
                    await self.condition(type_, firing=False, severity=severity,  # type: ignore[arg-type]
                                         entity=entity, reason="NoLongerObserved", message="")
        for cond in self.tracker.firing_for(self.collector):
            if (cond.type, cond.entity) in self.asserted:
                continue
            if cond.entity == overflow_entity(self.collector) and self.tracker.overflow.get(
                    (self.collector, cond.type)):
                continue  # an aggregate that still folds something
            await self.condition(
                cond.type, firing=False, severity=cond.severity,  # type: ignore[arg-type]
                entity=cond.entity, reason="NoLongerObserved",
                message=f"{cond.type} on {cond.entity} is no longer observed.",
                details=wire(ConditionCleared(firing_since=cond.since, firing_message_id=cond.message_id)))
