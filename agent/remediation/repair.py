"""From cordon to back in service: drain, repair step by step, validate, and only then uncordon.

After the engine cordons a node (agent/remediation/engine.py), one *episode* runs for it, when the
trigger's ladder has a plugin to act with (the drain or a step configured in ``[remediations.plugins]``)
or the node is a suspect; otherwise the engine's hold-down path (every trigger resolved, then a
validation that passed) brings it back:

    drain (the ``drain_with`` plugin) -> validate -> passed: uncordon
      -> step 1 -> settle -> validate -> passed: uncordon
                                      -> failed: step 2 -> ... -> no step left: kept out

The steps come from the first ladder (agent/remediation/policy.py) whose match takes the trigger:
a GPU fault tries ``gpu_reset``, then ``reboot_request``, then a ``breakfix`` hand-off, as NVSentinel's
fault-remediation escalates RESET_GPU -> RESTART_BM -> a ticket. A culprit named from software evidence
alone (the correlator's verdict, no hardware finding) is a *suspect*. Every episode validates before its
first step: that waits while a job still holds the GPUs (nothing is repaired under a job, however long it
runs), and a fault that has cleared needs no repair.

Safety, beyond the engine's own (dry-run, budget, cooldowns, audits):
- one episode per node, its steps one at a time; a rule's plugin on a node under repair waits its turn
  (the engine skips it, said in the audit);
- a node this agent did not cordon is never drained, repaired or uncordoned by an episode;
- a **repeat offender** — a node, or a GPU, whose repair episodes within ``repeat_window`` reach
  ``repeat_max`` — is not repaired again: it stays cordoned, is marked for replacement (the cordon
  plugin's ``mark_for_replacement`` when it has one), handed off (``breakfix``), and reported. An
  operator puts it back by uncordoning it by hand (the cordon plugins uncordon only their own marks, so
  the agent never does): the next cordon of that node starts a fresh count;
- an episode survives a restart (the state file ``remediation-repairs.json``): a reboot it requested
  is seen by the boot id changing, then the node is validated; no reboot within ``reboot_wait`` and the
  step failed.

Time to repair (cordon -> uncordon) and time between incidents (episode start -> the node's previous
episode start) are observed through ``observe`` (the agent's Prometheus histograms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from agent.remediation.policy import Ladder, RepairConfig, ladder_for
from gna_sdk import Result
from gna_sdk.statefile import read_state, write_state

if TYPE_CHECKING:
    from agent.remediation.engine import Engine

log = structlog.get_logger(__name__)

STATE_VERSION = 1
MAX_HISTORY = 1000  # episodes kept (the oldest go first); repeat counting only needs the window's
TRIGGER_KEYS = ("id", "node", "type", "entity", "status", "severity", "collector", "message", "reason")


@dataclass(frozen=True)
class Validation:
    verdict: str  # passed | failed | busy | unavailable | waiting (no run of the node's to judge by yet)
    summary: str


class Validator(Protocol):
    """level -> the node's verdict. On the node it runs ``validate`` now; centrally (fleet/validations.py) it
    answers from the last report ``node`` published about itself, counting only a run started at or after
    ``after`` (epoch seconds on the node's clock: its triggers' resolution)."""

    def __call__(self, level: str, *, node: str = "", after: float = 0.0) -> Awaitable[Validation]: ...


Observer = Callable[[str, float], None]  # ("time_to_repair" | "time_between_incidents", seconds)


@dataclass
class Episode:
    node: str
    cordon: str  # the plugin that cordoned (its uncordon ends the episode)
    trigger: dict[str, Any]
    ladder: str
    steps: list[str]
    suspect: bool
    started: float  # wall clock
    next_step: int = 0
    state: str = "draining"  # draining | validating | repairing | awaiting_reboot | kept_out | done
    reboot_boot_id: str = ""
    reboot_requested: float = 0.0
    done_steps: list[str] = field(default_factory=list)
    why: str = ""

    def doc(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _episode(doc: dict[str, Any]) -> Episode | None:
    try:
        ep = Episode(**{k: doc[k] for k in Episode.__dataclass_fields__ if k in doc})
    except TypeError:
        return None
    ok = (isinstance(ep.node, str) and isinstance(ep.steps, list) and all(isinstance(s, str) for s in ep.steps)
          and isinstance(ep.next_step, int) and isinstance(ep.trigger, dict) and isinstance(ep.started, (int, float)))
    return ep if ok else None


class Repairs:
    def __init__(self, engine: Engine, cfg: RepairConfig, *, validator: Validator | None,
                 state_path: Path | None = None, boot_id: Callable[[], str] = lambda: "",
                 wall: Callable[[], float] = time.time, observe: Observer | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.validator = validator
        self.state_path = state_path
        self.boot_id = boot_id
        self.wall = wall
        self.observe = observe
        self.episodes: dict[str, Episode] = {}
        self.history: list[dict[str, Any]] = []  # {node, entity, type, started, ended, outcome}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._load()

    # -- state ---------------------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_path is None:
            return
        doc = read_state(self.state_path, version=STATE_VERSION, what="repair episodes",
                         valid=lambda d: isinstance(d.get("episodes"), list) and isinstance(d.get("history"), list))
        for raw in doc.get("episodes", []):
            ep = _episode(raw) if isinstance(raw, dict) else None
            if ep is not None:
                self.episodes[ep.node] = ep
        self.history = [h for h in doc.get("history", []) if isinstance(h, dict)][-MAX_HISTORY:]

    def _save(self) -> None:
        if self.state_path is None:
            return
        write_state(self.state_path, {"episodes": [e.doc() for e in self.episodes.values()],
                                      "history": self.history[-MAX_HISTORY:]}, version=STATE_VERSION)

    def resume(self) -> None:
        """Start the episodes a previous run left (after a reboot this agent requested, among others)."""
        for node, ep in self.episodes.items():
            if ep.state not in ("kept_out", "done") and node not in self.tasks:
                self._spawn(ep)

    # -- what the engine asks ------------------------------------------------------------------
    def busy(self, node: str) -> str | None:
        """Why another action must wait on this node (an episode is running), or None."""
        ep = self.episodes.get(node)
        if ep is None or ep.state in ("kept_out", "done"):
            return None
        return f"a repair is in progress on this node ({ep.state}, ladder {ep.ladder})"

    def holds(self, node: str) -> bool:
        """An episode owns this node's way back (no hold-down uncordon): running, or kept out."""
        ep = self.episodes.get(node)
        return ep is not None and ep.state != "done"

    def would_run(self, msg: dict[str, Any]) -> bool:
        """A cordon for ``msg`` would start an episode (see ``begin``)."""
        ladder = ladder_for(self.cfg, msg)
        return self.cfg.enabled and (ladder.suspect or any(
            s in self.engine.plugins for s in (self.cfg.drain_with, *ladder.steps)))

    def plan(self, msg: dict[str, Any]) -> str:
        ladder = ladder_for(self.cfg, msg)
        parts = []
        if self.cfg.drain_with:
            parts.append(f"drain with {self.cfg.drain_with}")
        parts.append(f"validate ({self.cfg.validate_level})")
        for step in ladder.steps:
            parts.append(f"{step}, validate")
        return (f"then ({'suspect, ' if ladder.suspect else ''}ladder {ladder.name}): " + " -> ".join(parts)
                + "; uncordon at the first validation that passes, else keep the node out")

    def repeats(self, node: str, entity: str) -> tuple[int, int]:
        """Episodes of this node, and of this entity (a GPU) on it, within the window (this one not included)."""
        mine = [h for h in self.history if h.get("node") == node]
        # an operator who put a kept-out node back (see begin) vouched for it: count from then on
        since = max([self.wall() - self.cfg.repeat_window, *(float(h["released"]) for h in mine if "released" in h)])
        recent = [h for h in mine if float(h.get("started", 0)) >= since]
        return len(recent), sum(1 for h in recent if entity and h.get("entity") == entity)

    def begin(self, cordon: str, msg: dict[str, Any]) -> None:
        """The engine cordoned the node for ``msg`` (called under the engine's lock)."""
        node = str(msg.get("node", ""))
        if not self.cfg.enabled:
            return
        if (old := self.episodes.get(node)) is not None and old.state == "kept_out":
            # The cordon plugin cordoned anew, so the node was back in service: an operator released it.
            self._finish(old, "released")
        elif old is not None and old.state != "done":
            return  # one episode per node: a second trigger joins the running one
        ladder: Ladder = ladder_for(self.cfg, msg)
        if not self.would_run(msg):
            # Nothing configured to drain or repair with: no episode (it could only keep the node out); the
            # engine's hold-down path uncordons once every trigger resolved and a validation passed.
            return
        entity = str(msg.get("entity", ""))
        trigger = {k: msg.get(k) for k in TRIGGER_KEYS if msg.get(k) is not None}
        ep = Episode(node=node, cordon=cordon, trigger=trigger, ladder=ladder.name, steps=list(ladder.steps),
                     suspect=ladder.suspect, started=self.wall())
        previous = [float(h["started"]) for h in self.history if h.get("node") == node and "started" in h]
        if previous and self.observe:
            self.observe("time_between_incidents", max(0.0, ep.started - max(previous)))
        by_node, by_entity = self.repeats(node, entity)
        self.history.append({"node": node, "entity": entity, "type": msg.get("type"), "started": ep.started,
                             "ladder": ladder.name, "outcome": "running"})
        self.episodes[node] = ep
        if max(by_node, by_entity) >= self.cfg.repeat_max:
            what = f"the GPU {entity}" if by_entity >= self.cfg.repeat_max else "the node"
            count = by_entity if by_entity >= self.cfg.repeat_max else by_node
            ep.state = "kept_out"
            ep.why = (f"repeat offender: {what} needed {count + 1} repairs within "
                      f"{self.cfg.repeat_window / 86400:g} days (limit {self.cfg.repeat_max})")
        self._save()
        self._spawn(ep)

    def _spawn(self, ep: Episode) -> None:
        task = asyncio.get_running_loop().create_task(self._run(ep))
        self.tasks[ep.node] = task
        def forget(_task: asyncio.Task[None], node: str = ep.node) -> None:
            if self.tasks.get(node) is _task:
                del self.tasks[node]

        task.add_done_callback(forget)

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    # -- the episode -----------------------------------------------------------------------------
    async def _run(self, ep: Episode) -> None:
        try:
            await self._episode(ep)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an episode must never die silently: the node stays out, said loudly
            log.exception("repair_episode_failed", node=ep.node)
            await self._keep_out(ep, f"the repair episode failed: {exc!r}")

    async def _episode(self, ep: Episode) -> None:
        if ep.state == "kept_out":
            await self._keep_out(ep, ep.why)
            return
        if ep.state == "draining":
            if not await self._drain(ep):
                return
            ep.state = "validating"  # first: it waits for the GPUs to be free, and a cleared fault needs nothing
            self._save()
        if ep.state == "awaiting_reboot":
            if await self._await_reboot(ep) == "done":
                return
        elif ep.state == "validating":
            if await self._validated(ep):
                return
            ep.state = "repairing"
            self._save()
        while ep.next_step < len(ep.steps):
            step = ep.steps[ep.next_step]
            ep.next_step += 1
            outcome = await self._step(ep, step)
            self._save()
            if outcome == "awaiting_reboot":
                if await self._await_reboot(ep) == "done":
                    return
                continue
            if outcome != "executed":
                continue  # not installed, dry run, refused or failed: the next step
            if step == "breakfix":
                await self._keep_out(ep, "handed off for repair (breakfix): back only through validation "
                                         "by an operator")
                return
            await asyncio.sleep(self.cfg.settle)
            if await self._validated(ep):
                return
        await self._keep_out(ep, f"no repair step left ({', '.join(ep.done_steps) or 'none ran'}) "
                                 "and the node does not validate")

    async def _drain(self, ep: Episode) -> bool:
        name = self.cfg.drain_with
        if not name:
            return True
        for attempt in range(self.cfg.validate_retries + 1):
            outcome = await self._step(ep, name, counts=False)
            if outcome in ("executed", "already_done", "skipped", "dry_run"):
                return True  # a drain plugin not installed or in dry run: the cordon alone keeps jobs away
            if attempt < self.cfg.validate_retries:
                await asyncio.sleep(self.cfg.validate_retry_delay)
        await self._keep_out(ep, f"the node could not be drained ({name} failed "
                                 f"{self.cfg.validate_retries + 1} times)")
        return False

    async def _step(self, ep: Episode, name: str, *, counts: bool = True) -> str:
        """One plugin, audited like any rule's action; the outcome: executed, already_done, skipped, dry_run,
        failed or awaiting_reboot."""
        eng = self.engine
        msg = {**ep.trigger, "node": ep.node}
        plugin = eng.plugins.get(name)
        if plugin is None:
            why = eng.unavailable.get(name) or f"no remediation plugin {name!r} is installed"
            await eng.audit_repair(msg, name, "skipped", f"repair step skipped: {why}")
            return "skipped"
        try:
            plan = plugin.plan(msg, {})
        except ValueError as exc:
            await eng.audit_repair(msg, name, "failed", "refused by the plugin", error=str(exc))
            return "failed"
        if eng.dry_run(name):
            await eng.audit_repair(msg, name, "dry_run", f"would {plan}")
            return "dry_run"
        boot = self.boot_id() if name == "reboot_request" else ""
        try:
            result: Result = await plugin.execute(msg, {})
        except Exception as exc:
            await eng.audit_repair(msg, name, "failed", f"{plan} failed", error=repr(exc))
            return "failed"
        if result.outcome == "failed":
            await eng.audit_repair(msg, name, "failed", f"{plan} failed", result=result, error=result.detail)
            return "failed"
        if counts:
            ep.done_steps.append(name)
        await eng.audit_repair(msg, name, "executed" if result.outcome == "executed" else "skipped",
                               plan if result.outcome == "executed" else f"already done: {result.detail}",
                               result=result)
        if name == "reboot_request":
            ep.state, ep.reboot_boot_id, ep.reboot_requested = "awaiting_reboot", boot, self.wall()
            return "awaiting_reboot"
        return "executed" if result.outcome == "executed" else "already_done"

    async def _await_reboot(self, ep: Episode) -> str:
        """After a reboot request: "done" when the node rebooted and validated (the episode is over),
        "next" when it did not reboot in time or does not validate (the caller tries the next step)."""
        while ep.reboot_boot_id and self.boot_id() == ep.reboot_boot_id:
            left = ep.reboot_requested + self.cfg.reboot_wait - self.wall()
            if left <= 0:
                await self.engine.audit_repair({**ep.trigger, "node": ep.node}, "reboot_request", "failed",
                                               f"no reboot within {self.cfg.reboot_wait:g}s of the request")
                ep.state = "repairing"
                self._save()
                return "next"
            await asyncio.sleep(min(left, 30.0))
        if not ep.reboot_boot_id:  # the boot id cannot be read: a reboot cannot be seen, give it its time
            await asyncio.sleep(self.cfg.reboot_wait)
        ep.state = "validating"
        self._save()
        if await self._validated(ep):
            return "done"
        ep.state = "repairing"
        self._save()
        return "next"

    async def _validated(self, ep: Episode) -> bool:
        """Validate (waiting while a job holds the GPUs); on a pass the node is uncordoned: True."""
        msg = {**ep.trigger, "node": ep.node}
        if self.validator is None:
            await self.engine.audit_repair(msg, "validate", "failed", "no validator is wired: the node stays out",
                                           action="validate")
            return False
        attempt = 0
        while (result := await self.validator(self.cfg.validate_level)).verdict == "busy":
            # A job still holds the GPUs: nothing is repaired or judged under it, however long it runs
            # (a Slurm DRAIN lets the running job finish). Said once after validate_retries tries.
            attempt += 1
            if attempt == self.cfg.validate_retries + 1:
                await self.engine.audit_repair(msg, "validate", "skipped", "waiting for the GPUs: "
                                               f"{result.summary} (validating again every "
                                               f"{self.cfg.validate_retry_delay:g}s)", action="validate")
            await asyncio.sleep(self.cfg.validate_retry_delay)
        decision = "executed" if result.verdict == "passed" else "failed"
        await self.engine.audit_repair(msg, "validate", decision,
                                       f"validation ({self.cfg.validate_level}) {result.verdict}: {result.summary}",
                                       action="validate")
        if result.verdict != "passed":
            return False
        for attempt in range(3):
            if await self.engine.uncordon_now(ep.cordon, ep.node, msg, "validation passed", episode=True):
                self._finish(ep, "repaired")
                if self.observe:
                    self.observe("time_to_repair", max(0.0, self.wall() - ep.started))
                return True
            if attempt < 2:
                await asyncio.sleep(self.cfg.validate_retry_delay)
        await self._keep_out(ep, "the node validated but could not be uncordoned (see the uncordon audits)")
        return True

    async def _keep_out(self, ep: Episode, why: str) -> None:
        ep.state, ep.why = "kept_out", why
        self._finish(ep, "kept_out", keep=True)
        msg = {**ep.trigger, "node": ep.node}
        eng = self.engine
        cordon = eng.plugins.get(ep.cordon)
        if cordon is not None and hasattr(cordon, "mark_for_replacement") and not eng.dry_run(ep.cordon):
            try:
                result = await cordon.mark_for_replacement(msg, why)
                await eng.audit_repair(msg, ep.cordon, "executed" if result.outcome != "failed" else "failed",
                                       f"marked for replacement: {why}", result=result, action="mark_for_replacement")
            except Exception as exc:
                await eng.audit_repair(msg, ep.cordon, "failed", "marking for replacement failed", error=repr(exc),
                                       action="mark_for_replacement")
        if "breakfix" not in ep.done_steps and "breakfix" in eng.plugins:
            await self._step(ep, "breakfix")
        await eng.alert_kept_out(msg, why)

    def _finish(self, ep: Episode, outcome: str, *, keep: bool = False) -> None:
        for h in reversed(self.history):
            if h.get("node") == ep.node and h.get("started") == ep.started:
                if outcome != "released":  # a kept-out episode's end stays when (and why) it was kept out
                    h["outcome"], h["ended"], h["steps"] = outcome, self.wall(), list(ep.done_steps)
                else:
                    h["released"] = self.wall()
                break
        if keep:
            self.episodes[ep.node] = ep
        else:
            ep.state = "done"
            self.episodes.pop(ep.node, None)
        self._save()

    def release(self, node: str) -> bool:
        """An operator's word: forget a kept-out episode (the node was replaced or repaired by hand)."""
        ep = self.episodes.pop(node, None)
        self._save()
        return ep is not None
