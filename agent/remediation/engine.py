"""The remediation engine: rules -> decisions -> (maybe) actions, every decision audited.

Decisions: ``executed``, ``dry_run``, ``skipped`` (cooldown, backoff, max attempts, budget, already
done, fail-safe without NATS) and ``failed`` (with the error). Each is an audit record on
``gna.actions.<node>.<remediation>`` and a log line: nothing acts silently. Cordons take a slot
from the fleet budget first; uncordon happens only after every trigger resolved for a hold-down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.message import message_time, rfc3339
from agent.remediation.budget import BudgetUnavailable, FleetBudget
from agent.remediation.policy import RemediationsConfig, Rule, effective_rules
from agent.remediation.repair import Observer, Repairs, Validator
from gna_sdk import Result, Uncordons
from gna_sdk.ids import new_id
from gna_sdk.retry import delay_after
from gna_types.host_details import RemediationBudgetExhausted, RemediationNodeKeptOut
from gna_types.node_details import wire

log = structlog.get_logger(__name__)

AuditSink = Callable[[dict[str, Any]], Awaitable[None]]
AlertSink = Callable[[str, str, dict[str, Any]], Awaitable[None]]  # (type, message, details)
BudgetGetter = Callable[[], FleetBudget | None]
ACTION_SCHEMA_VERSION = 1


@dataclass
class Attempts:
    last_done: float = 0.0  # executed or dry-run
    last_dry_run: bool = False  # last_done was a dry run: nothing acted, the cooldown shows what would happen
    failures: int = 0
    last_failure: float = 0.0


@dataclass
class NodeTriggers:
    active: set[tuple[str, str]] = field(default_factory=set)  # (type, entity) that caused the cordon
    cordoned_by_us: bool = False
    uncordon_task: asyncio.Task[None] | None = None


class Engine:
    def __init__(self, cfg: RemediationsConfig, plugins: dict[str, Any], *, audit: AuditSink,
                 alert: AlertSink | None = None, budget: BudgetGetter | None = None,
                 clock: Callable[[], float] = time.monotonic, unavailable: dict[str, str] | None = None,
                 spare: Callable[[dict[str, Any]], str | None] | None = None, validator: Validator | None = None,
                 repair_state: Path | None = None, boot_id: Callable[[], str] = lambda: "",
                 observe: Observer | None = None) -> None:
        self.cfg = cfg
        self.rules = effective_rules(cfg)
        self.plugins = plugins
        self.unavailable = unavailable or {}  # plugin -> why it could not be built (said in each audit)
        self.audit_sink = audit
        self.alert = alert
        self.budget = budget
        self.clock = clock
        # why a node must not be cordoned for this message (a victim of an open incident), or None
        self.spare = spare
        self.attempts: dict[tuple[str, str, str], Attempts] = {}
        self.triggers: dict[str, NodeTriggers] = {}
        self.decisions: list[dict[str, Any]] = []  # recent, for tests and `status`
        self._lock = asyncio.Lock()
        self._budget_alerted = False
        self.validator = validator
        # after a cordon: drain, repair, validate, uncordon (agent/remediation/repair.py)
        self.repairs = Repairs(self, cfg.repair, validator=validator, state_path=repair_state, boot_id=boot_id,
                               observe=observe)

    @property
    def budget_exhausted(self) -> bool:
        """A cordon was refused for the spent fleet budget, and none has been granted since."""
        return self._budget_alerted

    def would_take_budget(self, msg: dict[str, Any]) -> bool:
        """A rule matches ``msg`` whose plugin cordons or drains (needs a fleet budget slot)."""
        for rule in self.rules:
            plugin = self.plugins.get(rule.action)
            if plugin is not None and plugin.needs_budget and rule.match.matches(msg):
                return True
        return False

    def dry_run(self, plugin: str) -> bool:
        """Dry-run unless enforcing globally, and a plugin may stay in dry-run on its own."""
        setting = self.cfg.plugins.get(plugin, {}).get("dry_run")
        return (not self.cfg.enforce) or setting is True

    async def _audit(self, msg: dict[str, Any], rule: Rule | None, plugin: str, decision: str, reason: str, *,
                     args: dict[str, Any] | None = None, result: Result | None = None, error: str = "",
                     action: str = "apply") -> dict[str, Any]:
        record = {
            "schema_version": ACTION_SCHEMA_VERSION, "id": new_id(), "time": rfc3339(), "node": msg.get("node", ""),
            "remediation": plugin, "rule": rule.name if rule else None, "action": action, "decision": decision,
            "reason": reason, "dry_run": decision == "dry_run",
            "trigger": {k: msg.get(k) for k in ("id", "type", "entity", "status", "severity", "collector")},
            "args": args or {}, "result": {"outcome": result.outcome, "detail": result.detail, **result.data}
            if result else None, "error": error or None,
        }
        self.decisions.append(record)
        del self.decisions[:-1000]
        log.info("remediation_decision", node=record["node"], remediation=plugin, rule=record["rule"],
                 decision=decision, reason=reason, trigger=msg.get("type"), entity=msg.get("entity"))
        await self.audit_sink(record)
        return record

    async def handle(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        """One message from the bus (or the fleet stream for the central cordoner)."""
        out: list[dict[str, Any]] = []
        async with self._lock:
            if msg.get("kind") == "condition" and msg.get("status") == "resolved":
                await self._resolved(msg)
            for rule in self.rules:
                if rule.match.matches(msg):
                    out.append(await self._apply(rule, msg))
        return out

    async def _apply(self, rule: Rule, msg: dict[str, Any]) -> dict[str, Any]:
        name = rule.action
        plugin = self.plugins.get(name)
        if plugin is None:
            why = self.unavailable.get(name) or f"no remediation plugin {name!r} is installed"
            return await self._audit(msg, rule, name, "failed", f"cannot apply rule {rule.name!r}: {why}")
        node = msg.get("node", "")
        key = (rule.name, node, msg.get("entity", ""))
        att = self.attempts.setdefault(key, Attempts())
        now = self.clock()
        args = {**rule.args}
        dry = self.dry_run(name)
        # A dry run starts the cooldown too, so the audits show that a repeat would be suppressed; but it
        # says so, and it never holds back a real action (enforcing turned on by a reload): nothing acted.
        if att.last_done and now - att.last_done < rule.cooldown and (dry or not att.last_dry_run):
            ago, window = f"{now - att.last_done:.0f}s ago", f"cooldown {rule.cooldown:g}s"
            why = f"would have acted {ago} (dry run; {window})" if att.last_dry_run else f"acted {ago} ({window})"
            return await self._audit(msg, rule, name, "skipped", f"cooldown: {why}", args=args)
        if att.failures >= rule.max_attempts:
            return await self._audit(msg, rule, name, "skipped", f"max attempts ({rule.max_attempts}) reached",
                                     args=args)
        if att.failures and now - att.last_failure < delay_after(att.failures, rule.backoff):
            return await self._audit(msg, rule, name, "skipped", "backing off after a failure", args=args)
        if plugin.needs_budget and self.spare is not None and (spared := self.spare(msg)):
            return await self._audit(msg, rule, name, "skipped", spared, args=args)
        if not plugin.needs_budget and not dry and (busy := self.repairs.busy(node)):
            return await self._audit(msg, rule, name, "skipped", f"{busy}: one action at a time on a node",
                                     args=args)
        try:
            plan = plugin.plan(msg, args)
        except ValueError as exc:  # a value outside the plugin's allowlist
            return await self._audit(msg, rule, name, "failed", "refused by the plugin", args=args, error=str(exc))
        if dry:
            att.last_done, att.last_dry_run = now, True
            self._track(msg, name, plugin)
            then = f", {self.repairs.plan(msg)}" if plugin.needs_budget and self.repairs.would_run(msg) else ""
            return await self._audit(msg, rule, name, "dry_run", f"would {plan}{then}", args=args)
        if plugin.needs_budget:
            verdict = await self._take_budget(msg, rule, name, args)
            if verdict is not None:
                return verdict
        try:
            result: Result = await plugin.execute(msg, args)
        except Exception as exc:
            att.failures += 1
            att.last_failure = now
            return await self._audit(msg, rule, name, "failed", f"{plan} failed", args=args, error=repr(exc))
        if result.outcome == "failed":
            att.failures += 1
            att.last_failure = now
            return await self._audit(msg, rule, name, "failed", f"{plan} failed", args=args, result=result,
                                     error=result.detail)
        att.last_done, att.last_dry_run, att.failures = now, False, 0
        cordoned = result.outcome == "executed" and plugin.needs_budget
        self._track(msg, name, plugin, cordoned=cordoned)
        decision = "executed" if result.outcome == "executed" else "skipped"
        reason = plan if result.outcome == "executed" else f"already done: {result.detail}"
        record = await self._audit(msg, rule, name, decision, reason, args=args, result=result)
        if cordoned:
            self.repairs.begin(name, msg)
        return record

    async def _take_budget(self, msg: dict[str, Any], rule: Rule, name: str,
                           args: dict[str, Any]) -> dict[str, Any] | None:
        budget = self.budget() if self.budget else None
        if budget is None:
            return await self._audit(msg, rule, name, "skipped", "fleet budget unavailable (NATS unreachable): "
                                     "not cordoning (fail safe)", args=args)
        try:
            slot = await budget.take(msg.get("node", ""), msg.get("type", ""))
        except BudgetUnavailable as exc:
            return await self._audit(msg, rule, name, "skipped", "fleet budget unavailable: not cordoning (fail safe)",
                                     args=args, error=str(exc))
        if slot.granted:
            self._budget_alerted = False
            return None
        if self.alert and not self._budget_alerted:
            self._budget_alerted = True
            await self.alert("RemediationBudgetExhausted",
                             f"The fleet cordon budget is spent ({slot.used}/{slot.limit} in the window): "
                             f"{msg.get('node')} was not cordoned for {msg.get('type')}.",
                             wire(RemediationBudgetExhausted(used=slot.used, limit=slot.limit,
                                                             node=_str_or_none(msg.get("node")),
                                                             trigger=_str_or_none(msg.get("type")))))
        return await self._audit(msg, rule, name, "skipped", f"fleet budget exhausted ({slot.used}/{slot.limit})",
                                 args=args)

    # -- uncordon after every trigger resolved ------------------------------------------
    def _track(self, msg: dict[str, Any], name: str, plugin: Any, *, cordoned: bool = False) -> None:
        if not plugin.needs_budget:
            return
        t = self.triggers.setdefault(f"{name}|{msg.get('node', '')}", NodeTriggers())
        t.active.add((msg.get("type", ""), msg.get("entity", "")))
        t.cordoned_by_us = t.cordoned_by_us or cordoned
        if t.uncordon_task:
            t.uncordon_task.cancel()
            t.uncordon_task = None

    async def _resolved(self, msg: dict[str, Any]) -> None:
        for key, t in self.triggers.items():
            name, node = key.split("|", 1)
            if node != msg.get("node", "") or (msg.get("type"), msg.get("entity")) not in t.active:
                continue
            t.active.discard((msg.get("type", ""), msg.get("entity", "")))
            if self.repairs.holds(node):
                continue  # the repair episode validates and uncordons (or keeps the node out)
            if not t.active and t.uncordon_task is None:
                t.uncordon_task = asyncio.get_running_loop().create_task(self._uncordon_later(name, node, msg))

    async def _uncordon_later(self, name: str, node: str, msg: dict[str, Any]) -> None:
        await asyncio.sleep(self.cfg.uncordon_hold_down)
        async with self._lock:
            t = self.triggers.get(f"{name}|{node}")
            if t is None or t.active or self.repairs.holds(node):
                return
            t.uncordon_task = None
            if self.dry_run(name) or not t.cordoned_by_us:
                await self._audit(msg, None, name, "dry_run" if self.dry_run(name) else "skipped",
                                  "would uncordon: every trigger resolved" if self.dry_run(name) else
                                  "not uncordoning: this agent did not cordon it", action="uncordon")
                return
        why = "every trigger resolved for the hold-down"
        if self.cfg.validate_before_uncordon:
            if self.validator is None:
                await self._audit(msg, None, name, "skipped", "not uncordoning: validation is required "
                                  "(validate_before_uncordon) and no validator is wired", action="uncordon")
                return
            result = await self.validator(self.cfg.repair.validate_level, node=node, after=message_time(msg))
            decision = {"passed": "executed", "busy": "skipped", "waiting": "skipped"}.get(result.verdict, "failed")
            await self._audit(msg, None, "validate", decision,
                              f"validation ({self.cfg.repair.validate_level}) {result.verdict}: {result.summary}",
                              action="validate")
            if result.verdict in ("busy", "waiting"):
                # a job still holds the GPUs, or (central) the node has not reported a run since its
                # triggers resolved: try again after another hold-down
                async with self._lock:
                    t = self.triggers.get(f"{name}|{node}")
                    if t is not None and not t.active and t.uncordon_task is None:
                        t.uncordon_task = asyncio.get_running_loop().create_task(
                            self._uncordon_later(name, node, msg))
                return
            if result.verdict != "passed":
                await self.alert_kept_out(msg, f"every trigger resolved but validation {result.verdict}: "
                                               f"{result.summary}")
                return
            why += " and validation passed"
        await self.uncordon_now(name, node, msg, why)

    async def uncordon_now(self, name: str, node: str, msg: dict[str, Any], why: str, *,
                           episode: bool = False) -> bool:
        """Uncordon a node this agent cordoned (audited, its budget slot released); True when it is back.
        ``episode``: a repair episode owns the node — its state file says this agent cordoned it, also
        across a restart (the plugin checks its own marker on the node again)."""
        async with self._lock:
            t = self.triggers.get(f"{name}|{node}")
            if t is None and episode:
                t = self.triggers[f"{name}|{node}"] = NodeTriggers(cordoned_by_us=True)
            plugin = self.plugins.get(name)
            if t is None or not t.cordoned_by_us:
                await self._audit(msg, None, name, "skipped", "not uncordoning: this agent did not cordon it",
                                  action="uncordon")
                return False
            if self.dry_run(name):
                await self._audit(msg, None, name, "dry_run", f"would uncordon: {why}", action="uncordon")
                return False
            if not isinstance(plugin, Uncordons):
                await self._audit(msg, None, name, "skipped", f"the {name} plugin cannot uncordon: undo it by hand",
                                  action="uncordon")
                return False
            try:
                result = await plugin.uncordon(msg)
            except Exception as exc:
                await self._audit(msg, None, name, "failed", "uncordon failed", error=repr(exc), action="uncordon")
                return False
            if result.outcome == "failed":
                await self._audit(msg, None, name, "failed", "uncordon failed", result=result, error=result.detail,
                                  action="uncordon")
                return False
            if self.budget and (budget := self.budget()) is not None:
                try:
                    await budget.release(node)
                except Exception as exc:
                    log.warning("budget_release_failed", node=node, error=repr(exc))
            if t.uncordon_task is not None:
                t.uncordon_task.cancel()
            del self.triggers[f"{name}|{node}"]
            await self._audit(msg, None, name, "executed" if result.outcome == "executed" else "skipped",
                              f"uncordoned: {why}" if result.outcome == "executed"
                              else f"not uncordoned: {result.detail}", result=result, action="uncordon")
            return True

    async def close(self) -> None:
        """Stop the running repair episodes (their state file keeps where each one was)."""
        await self.repairs.close()

    async def audit_repair(self, msg: dict[str, Any], plugin: str, decision: str, reason: str, *,
                           result: Result | None = None, error: str = "", action: str = "repair") -> None:
        """A repair episode's step, validation or marking, audited like every other decision."""
        await self._audit(msg, None, plugin, decision, reason, result=result, error=error, action=action)

    async def alert_kept_out(self, msg: dict[str, Any], why: str) -> None:
        node = _str_or_none(msg.get("node"))
        ep = self.repairs.episodes.get(node or "")
        log.warning("remediation_node_kept_out", node=node, why=why)
        if self.alert:
            await self.alert("RemediationNodeKeptOut", f"{node} stays out of service: {why}",
                             wire(RemediationNodeKeptOut(
                                 node=node, trigger=_str_or_none(msg.get("type")),
                                 entity=_str_or_none(msg.get("entity")), why=why[:500],
                                 ladder=(ep.ladder if ep else "")[:128],
                                 steps=[s[:64] for s in (ep.done_steps if ep else [])][:32])))


def _str_or_none(v: object) -> str | None:
    return v if isinstance(v, str) else None
