"""The remediation engine wired into the node agent: its plugins, the fleet budget over NATS, audits on
the bus, budget alerts as the agent's own events, and (per-node mode, enforced) the correlator's incidents
so that a victim of an open incident is never cordoned.

A reload (agent/reload.py) builds a new engine from the new rules and plugins; the cooldowns, attempts
and cordons already made carry over, so a reload never lets an action repeat early or forget a cordon it
must undo. The bus subscription is made once; a reload swaps the engine behind it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import structlog

from agent import config as configmod
from agent.bus import LocalBus
from agent.message import Message, to_dict
from agent.metrics import AgentMetrics
from agent.nats_link import NatsLink
from agent.remediation.incidents import IncidentView
from agent.validate.service import ValidationService
from gna_sdk import Emitter
from gna_sdk.hostroot import HostRoot
from gna_sdk.persist import boot_id
from gna_types.subjects import action_subject

log = structlog.get_logger(__name__)

AGENT_COLLECTOR = "agent"
# the agent's own remediation alerts: type -> (entity, reason)
ALERTS = {"RemediationBudgetExhausted": ("fleet:budget", "BudgetExhausted"),
          "RemediationNodeKeptOut": ("remediation:repair", "KeptOut")}


class RemediationHost(Protocol):
    """What the wiring takes from the daemon (agent/daemon.py ``Agent``)."""

    cfg: configmod.AgentConfig
    host: HostRoot
    node: str
    bus: LocalBus | None
    link: NatsLink | None
    metrics: AgentMetrics
    state_dir: Path
    validation: ValidationService

    def emitter_for(self, collector: str, max_conditions: int = ...) -> Emitter: ...


class RemediationWiring:
    def __init__(self) -> None:
        self.engine: Any = None  # agent.remediation.engine.Engine once started
        self.incident_view = IncidentView()
        self.watching_incidents = False

    def cordons_itself(self) -> bool:
        """This node really cordons itself (per-node mode, enforced): it must follow the correlator's
        incidents so it never cordons as a victim; in dry-run nothing is cordoned and no bucket access is
        needed."""
        return self.engine is not None and any(p.needs_budget and not self.engine.dry_run(name)
                                               for name, p in self.engine.plugins.items())

    async def watch_incidents(self, link: NatsLink) -> None:
        """Run as a task; the caller sets ``watching_incidents`` when it creates it (before any message)."""
        await link.connected.wait()
        assert link.js is not None
        await self.incident_view.watch(link.js)

    def decide_own_culprit(self, node: str) -> None:
        """Per-node mode: an incident naming this node its culprit is decided here (cordon, then the repair
        episode: a software-only verdict makes the node a suspect, validated at once)."""

        async def handle(trigger: dict[str, Any]) -> None:
            if self.engine is not None:
                await self.engine.handle(trigger)

        self.incident_view.own_culprit = (node, handle)

    def restart(self, agent: RemediationHost) -> None:
        old = self.engine
        self.start(agent, resume=False)
        if old is not None and self.engine is not None:
            self.engine.attempts = old.attempts
            self.engine.triggers = old.triggers
            # the running repair episodes go on under the new rules (their tasks keep their state)
            old.repairs.engine, old.repairs.cfg = self.engine, self.engine.cfg.repair
            old.repairs.validator = self.engine.validator
            self.engine.repairs = old.repairs

    def owns_a_node(self) -> bool:
        """A repair episode owns this node (a scheduled validation waits: the episode validates)."""
        return self.engine is not None and any(self.engine.repairs.holds(n) for n in self.engine.repairs.episodes)

    @staticmethod
    def validator(agent: RemediationHost) -> Any:
        """``validate`` at a level through the daemon's service (one NodeValidation event per run)."""

        async def validate(level: str, *, node: str = "", after: float = 0.0) -> Any:
            # on the node: a run now (started after any trigger resolved, whatever ``after`` says)
            from agent.remediation.repair import Validation
            from agent.validate.service import summary

            report = await agent.validation.run(level, trigger="repair")
            return Validation(report.verdict, summary(report))

        return validate

    def start(self, agent: RemediationHost, *, resume: bool = True) -> None:
        from agent.remediation.budget import FleetBudget
        from agent.remediation.engine import Engine
        from agent.remediation.loader import load_plugins

        rcfg = agent.cfg.remediations
        loaded = load_plugins(rcfg, agent.host)
        plugins = loaded.available
        budget_obj: list[FleetBudget] = []

        def budget() -> FleetBudget | None:
            if agent.link is None or agent.link.js is None or not agent.link.connected.is_set():
                return None  # no NATS: no slot, no cordon (fail safe)
            if not budget_obj:
                budget_obj.append(FleetBudget.for_agent(agent.link.js, agent.cfg))
            return budget_obj[0]

        async def audit(record: dict[str, Any]) -> None:
            assert agent.bus is not None
            agent.metrics.remediation_decisions.labels(record["remediation"], record["action"],
                                                       record["decision"]).inc()
            sev = "warning" if record["decision"] in ("executed", "failed") else "info"
            await agent.bus.publish_record(action_subject(agent.node, record["remediation"]), record["id"],
                                           json.dumps(record, separators=(",", ":")).encode(), sev)

        async def alert(type_: str, message: str, details: dict[str, Any]) -> None:
            entity, reason = ALERTS.get(type_, ("remediation", type_))
            await agent.emitter_for(AGENT_COLLECTOR).event(type_, severity="critical", entity=entity,
                                                           reason=reason, message=message, details=details)

        def observe(what: str, seconds: float) -> None:
            hist = {"time_to_repair": agent.metrics.time_to_repair,
                    "time_between_incidents": agent.metrics.time_between_incidents}.get(what)
            if hist is not None:
                hist.observe(seconds)

        self.engine = Engine(rcfg, plugins, audit=audit, alert=alert, budget=budget, unavailable=loaded.unavailable,
                             spare=self.incident_view.spare, validator=self.validator(agent),
                             repair_state=agent.state_dir / "remediation-repairs.json",
                             boot_id=lambda: boot_id(agent.host), observe=observe)

        async def on_message(msg: Message) -> None:
            assert self.engine is not None
            d = to_dict(msg)
            # per-node mode: a job's first NCCL symptom that would cordon waits for the correlator's verdict,
            # and a victim of an open incident is spared (agent/remediation/incidents.py)
            await self.incident_view.await_verdict(d, self.watching_incidents and self.engine.would_take_budget(d))
            await self.engine.handle(d)

        assert agent.bus is not None
        if not any(sub.name == "remediation" for sub in agent.bus.subscriptions):  # a reload swaps the engine only
            agent.bus.subscribe("remediation", on_message)
        if resume:
            self.engine.repairs.resume()  # episodes a previous run left (a reboot it requested, among others)
        log.info("remediation_ready", plugins=sorted(plugins), unavailable=loaded.unavailable, enforce=rcfg.enforce,
                 rules=[r.name for r in self.engine.rules])
