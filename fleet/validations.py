"""What each node last reported about its own validation, for the central cordoner's uncordon.

A node cordoned centrally returns to service only after it validated itself (issue 28: "a node cordoned by
us returns only after validate passes"). The cordoner cannot run a node's checks (its GPUs, its tools), so
the node runs them — once its triggers resolved and no job holds its GPUs (``[validate] after_resolution``,
agent/validate/service.py) or on its schedule — and publishes a ``NodeValidation`` event on its own subject.
The cordoner files the newest report per node here, and the engine's hold-down uncordon asks
:meth:`NodeValidations.validator`: a report counts only when it is the node's own (the subject names the
node: per-node NATS credentials make it authentic; a report naming another node is refused and counted),
started at or after the resolution of the node's triggers (both on the node's clock), at the level the
cordoner requires or a deeper one. Until then the answer is ``waiting``, the cordoner asks the node to
validate (core NATS ``gna.validate.<node>``: a suspect named by a fleet verdict has no condition of its own
whose resolution would start a run) and the uncordon is tried again after another hold-down; a failed or
unavailable report keeps the node out (alerted), as on the node.

Bounded: at most ``max_nodes`` nodes (the least recently reported go first), one small entry each.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from agent.remediation.repair import Validation, Validator
from gna_sdk import plural
from gna_types import validation as vtypes
from gna_types.subjects import encode_token

MAX_NODES = 100_000
MAX_SUMMARY = 500
ASK_INTERVAL = 30.0  # s between two requests to one node (the node itself accepts one a minute by default)
LEVELS = vtypes.LEVELS


@dataclass(frozen=True)
class Reported:
    verdict: str
    level: str
    started: float  # epoch seconds, the node's clock
    summary: str
    forced: bool


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts > 0 else "unknown"


def summarise(report: vtypes.ValidationReport) -> str:
    """One line for an audit: the failed checks, or how many ran."""
    failed = [c.name for c in report.checks if c.status in ("failed", "error")]
    ran = sum(1 for c in report.checks if c.status != "skipped")
    text = (f"failed: {', '.join(failed)}" if failed else f"{plural(ran, 'check')} ran, none failed") + \
        (f" ({report.reason})" if report.reason and report.verdict != "passed" else "")
    return text[:MAX_SUMMARY]


class NodeValidations:
    def __init__(self, max_nodes: int = MAX_NODES, *, ask: Callable[[str], Awaitable[None]] | None = None,
                 ask_interval: float = ASK_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_nodes = max_nodes
        self.latest: OrderedDict[str, Reported] = OrderedDict()
        self.refused: dict[str, int] = {}  # why a report was not filed -> times
        # asks a node to validate itself (the cordoner publishes gna.validate.<node>): a suspect named by a fleet
        # verdict has no condition of its own whose resolution would make it validate
        self.ask = ask
        self.ask_interval = ask_interval
        self.asked: OrderedDict[str, float] = OrderedDict()  # node -> when last asked (monotonic)
        self.ask_failures = 0
        self._clock = clock

    def _refuse(self, why: str) -> str:
        self.refused[why] = self.refused.get(why, 0) + 1
        return why

    def file(self, node: str, details: Any) -> str | None:
        """A ``NodeValidation`` from ``node``'s own subject. None when filed, else why not (counted)."""
        try:
            report = vtypes.decode(details if isinstance(details, dict) else {})
        except (msgspec.ValidationError, TypeError) as exc:
            return self._refuse(f"invalid report: {str(exc)[:200]}")
        if report.node != node:
            return self._refuse("report names another node")
        if not math.isfinite(report.started) or report.started <= 0:
            return self._refuse("no start time")
        old = self.latest.get(node)
        if old is not None and old.started > report.started:
            return self._refuse("older than the node's last report")  # a late redelivery never overrides
        self.latest[node] = Reported(report.verdict, report.level, report.started, summarise(report), report.forced)
        self.latest.move_to_end(node)
        while len(self.latest) > self.max_nodes:
            self.latest.popitem(last=False)
            self.refused["evicted (too many nodes)"] = self.refused.get("evicted (too many nodes)", 0) + 1
        return None

    def judge(self, level: str, node: str, after: float) -> Validation:
        """The uncordon's answer for ``node``: its own report since ``after`` at ``level`` or deeper."""
        got = self.latest.get(node)
        if got is None:
            return Validation("waiting", f"no validation report from {node} yet: the node runs one once its "
                                         "triggers resolved and no job holds its GPUs ([validate] after_resolution)")
        if got.started < after:
            return Validation("waiting", f"the last report from {node} ({got.verdict}, started {_when(got.started)}) "
                                         f"is older than its triggers' resolution ({_when(after)})")
        need = LEVELS.index(level) if level in LEVELS else len(LEVELS) - 1
        if got.level not in LEVELS or LEVELS.index(got.level) < need:
            return Validation("waiting", f"the last report from {node} is at level {got.level}; {level} is required")
        forced = " (forced while processes held GPUs)" if got.forced else ""
        return Validation(got.verdict, f"{node}'s own report, started {_when(got.started)}: {got.summary}{forced}")

    async def _ask(self, node: str) -> str:
        """Ask ``node`` to validate, at most once per ``ask_interval``; what to add to the audit's reason."""
        if self.ask is None or not node:
            return ""
        now = self._clock()
        last = self.asked.get(node)
        if last is not None and now - last < self.ask_interval:
            return ""
        self.asked[node] = now
        self.asked.move_to_end(node)
        while len(self.asked) > self.max_nodes:
            self.asked.popitem(last=False)
        try:
            await self.ask(node)
        except Exception as exc:  # no connection now: the next hold-down asks again
            self.ask_failures += 1
            return f"; asking it to validate failed ({type(exc).__name__})"
        return f"; asked it to validate (gna.validate.{encode_token(node)})"

    def validator(self) -> Validator:
        def validate(level: str, *, node: str = "", after: float = 0.0) -> Awaitable[Validation]:
            async def answer() -> Validation:
                got = self.judge(level, node, after)
                if got.verdict == "waiting" and (asked := await self._ask(node)):
                    return Validation(got.verdict, got.summary + asked)
                return got

            return answer()

        return validate
