"""Fleet-wide cordon budget (circuit breaker) in a JetStream KV bucket, taken with compare-and-set.

At most ``max_nodes`` nodes, or ``max_percent`` of the fleet (nodes heartbeating in gna-nodes),
may be cordoned by the agents within ``window`` seconds. When a slot is refused the breaker trips
and stays tripped until the window drains or ``gpu-node-agent budget reset``. Without NATS no slot
can be taken: the caller must not cordon (fail safe).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from agent.nats_link import StreamMissing, StreamRefused, open_kv
from gna_sdk.retry import Backoff
from gna_types.subjects import BUDGET_BUCKET, NODES_BUCKET

if TYPE_CHECKING:
    from agent.config import AgentConfig

KEY = "cordons"


@dataclass
class SlotDecision:
    granted: bool
    reason: str
    used: int
    limit: int
    tripped: bool


class BudgetUnavailable(Exception):
    pass


def _cas_conflict(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, KeyWrongLastSequenceError) or "wrong last sequence" in text or "10071" in text


class FleetBudget:
    def __init__(self, js: Any, *, bucket: str = BUDGET_BUCKET, nodes_bucket: str = NODES_BUCKET, max_nodes: int = 5,
                 max_percent: float = 0.0, window: float = 3600.0, stale_after: float = 60.0,
                 replicas: int = 1) -> None:
        self.js = js
        self.bucket_name = bucket
        self.nodes_bucket = nodes_bucket
        self.max_nodes = max_nodes
        self.max_percent = max_percent
        self.window = window
        self.stale_after = stale_after
        self.replicas = replicas
        self._kv: Any = None
        self._fleet: tuple[float, int] = (0.0, 0)

    @classmethod
    def for_agent(cls, js: Any, cfg: AgentConfig) -> FleetBudget:
        """The budget as a configuration describes it: one place, so the node agents, the cordoner and
        `budget status` always agree on the buckets, limits and replicas."""
        b = cfg.remediations.budget
        return cls(js, bucket=b.bucket, nodes_bucket=cfg.nats.kv_bucket, max_nodes=b.max_nodes,
                   max_percent=b.max_percent, window=b.window, replicas=cfg.nats.stream_replicas)

    def bucket_config(self) -> KeyValueConfig:
        """The budget bucket as `gpu-node-agent nats setup` creates it (and an unrestricted connection, if missing)."""
        return KeyValueConfig(bucket=self.bucket_name, history=5, replicas=self.replicas)

    async def kv(self) -> Any:
        """The bucket, its backing stream verified (agent.nats_link.open_kv): a foreign republish, mirror or
        sources on it makes the budget unavailable (fail safe: no cordon), never used."""
        if self._kv is None:
            try:
                self._kv = await open_kv(self.js, self.bucket_name, create_with=self.bucket_config())
            except (StreamMissing, StreamRefused) as exc:
                raise BudgetUnavailable(str(exc)) from None
        return self._kv

    async def fleet_size(self) -> int:
        ts, n = self._fleet
        if time.monotonic() - ts < 30:
            return n
        try:
            nodes = await open_kv(self.js, self.nodes_bucket)  # verified, never created here
            keys = await nodes.keys()
        except Exception:
            keys = []
        self._fleet = (time.monotonic(), len(keys))
        return len(keys)

    async def limit(self) -> int:
        limits = [self.max_nodes] if self.max_nodes > 0 else []
        if self.max_percent > 0:
            limits.append(max(1, math.floor(await self.fleet_size() * self.max_percent / 100)))
        return min(limits) if limits else 0

    async def _read(self) -> tuple[dict[str, Any], int | None]:
        kv = await self.kv()
        try:
            entry = await kv.get(KEY)
        except KeyNotFoundError:
            return {"version": 1, "entries": [], "tripped": False}, None
        try:
            state = json.loads(entry.value or b"{}")
        except ValueError:
            state = {}
        state.setdefault("entries", [])
        state.setdefault("tripped", False)
        return state, entry.revision

    def _prune(self, state: dict[str, Any], now: float) -> None:
        state["entries"] = [e for e in state["entries"] if now - float(e.get("time", 0)) < self.window]

    async def take(self, node: str, reason: str, *, attempts: int = 50) -> SlotDecision:
        """Compare-and-set loop: concurrent agents can never overshoot the limit."""
        try:
            limit = await self.limit()
            backoff = Backoff(0.002, 0.05, jitter=True)  # contention clears in milliseconds
            for _attempt in range(attempts):
                now = time.time()
                state, rev = await self._read()
                self._prune(state, now)
                used = len(state["entries"])
                if any(e.get("node") == node for e in state["entries"]):
                    return SlotDecision(True, "node already holds a slot", used, limit, bool(state["tripped"]))
                if state["tripped"] and used < limit:
                    state["tripped"] = False  # drained
                if used >= limit or state["tripped"]:
                    if state["tripped"]:  # already recorded: a denial needs no write (and adds no contention)
                        return SlotDecision(False, "budget exhausted", used, limit, True)
                    state["tripped"] = True
                    granted = False
                else:
                    state["entries"].append({"node": node, "time": now, "reason": reason})
                    granted = True
                body = json.dumps(state).encode()
                kv = await self.kv()
                try:
                    if rev is None:
                        await kv.create(KEY, body)
                    else:
                        await kv.update(KEY, body, last=rev)
                except Exception as exc:
                    if _cas_conflict(exc):  # another agent wrote first: read again, backing off with jitter
                        await asyncio.sleep(backoff.next())
                        continue
                    raise
                return SlotDecision(granted, "granted" if granted else "budget exhausted",
                                    len(state["entries"]), limit, bool(state["tripped"]))
            return SlotDecision(False, "contention: could not take a slot", -1, limit, False)
        except (BudgetUnavailable, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise BudgetUnavailable(repr(exc)) from exc

    async def release(self, node: str) -> None:
        for _ in range(50):
            state, rev = await self._read()
            state["entries"] = [e for e in state["entries"] if e.get("node") != node]
            kv = await self.kv()
            if rev is None:
                return
            try:
                await kv.update(KEY, json.dumps(state).encode(), last=rev)
                return
            except Exception as exc:
                if not _cas_conflict(exc):
                    raise
                await asyncio.sleep(0.005)

    async def status(self) -> dict[str, Any]:
        state, rev = await self._read()
        self._prune(state, time.time())
        return {"limit": await self.limit(), "used": len(state["entries"]), "tripped": state["tripped"],
                "window_s": self.window, "entries": state["entries"], "revision": rev,
                "fleet_size": await self.fleet_size()}

    async def reset(self) -> None:
        kv = await self.kv()
        await kv.put(KEY, json.dumps({"version": 1, "entries": [], "tripped": False}).encode())
