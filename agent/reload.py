"""SIGHUP: the configuration read again and applied in place where it can be, said where it cannot.

What can change in place: the collectors (stopped and started again with their new settings), the host
root, the shutdown timeout, logging and the remediation rules and plugins (whose cooldowns, attempts and
cordons carry over: agent/remediation/wiring.py). What cannot (``RESTART_ONLY``) keeps its running value,
visibly: a log line, the sd_notify status and /healthz say a restart is needed and why. A file that does
not parse is refused whole and the previous configuration runs on.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from agent import config as configmod
from agent.sdnotify import Notifier
from gna_sdk.hostroot import HostRoot

log = structlog.get_logger(__name__)

# What SIGHUP can change in place, and why the rest needs a restart (said, never silently kept).
RESTART_ONLY = {
    "node": "the node's identity: its subjects, KV key and spool are bound to it",
    "state_dir": "the spool, checkpoints and condition state live there",
    "nats": "the NATS connection and its credentials are set up once",
    "embedded_nats": "the embedded nats-server is started once",
    "spool": "the spool is open with its limits and policy",
    "bus": "the local bus and its subscribers are built once",
    "metrics": "the /metrics listener is bound once",
    "exports": "the exports' sinks subscribe to the bus once",
}
APPLIED_IN_PLACE = ("host_root", "shutdown_timeout", "log", "remediations")


class Reloadable(Protocol):
    """What a reload reads and changes of the daemon (agent/daemon.py ``Agent``)."""

    config: configmod.Config
    config_path: str | None
    overrides: dict[str, Any]
    cfg: configmod.AgentConfig
    host: HostRoot
    notifier: Notifier
    restart_needed: dict[str, str]
    remediation: Any  # agent/remediation/wiring.py RemediationWiring

    async def stop_collectors(self, timeout: float = ...) -> None: ...

    def start_collectors(self) -> None: ...


async def reload_config(agent: Reloadable) -> None:
    agent.notifier.reloading()
    try:
        new = configmod.load(agent.config_path)
    except configmod.ConfigError as exc:
        log.error("config_reload_rejected", error=str(exc))
        agent.notifier.ready("reload rejected; running the previous config")
        return
    for key, value in agent.overrides.items():
        setattr(new.agent, key, value)
    old = agent.cfg
    kept = {k: why for k, why in RESTART_ONLY.items() if getattr(new.agent, k) != getattr(old, k)}
    for k in kept:  # the running value stays, visibly (log, sd_notify status, /healthz)
        setattr(new.agent, k, getattr(old, k))
    applied = [k for k in APPLIED_IN_PLACE if getattr(new.agent, k) != getattr(old, k)]
    await agent.stop_collectors()
    agent.cfg = new.agent
    agent.config = configmod.Config(agent=new.agent, collectors=new.collectors, source=new.source)
    agent.host = HostRoot(new.agent.host_root)
    if new.agent.log != old.log:
        from agent.logsetup import configure

        configure(new.agent.log.level, new.agent.log.format)
    if new.agent.remediations != old.remediations:
        agent.remediation.restart(agent)
    agent.start_collectors()
    agent.restart_needed = kept
    if kept:
        log.warning("config_reload_needs_restart", sections=sorted(kept), reasons=kept, applied=applied,
                    hint="these keep their running values until gpu-node-agent restarts")
        agent.notifier.ready(f"reloaded; restart needed for {', '.join(sorted(kept))}")
    else:
        agent.notifier.ready("reloaded")
    log.info("config_reloaded", source=new.source, applied=[*applied, "collectors"])
