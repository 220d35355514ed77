"""``gpu-node-agent check``: one pass of every collector, no NATS; what a Slurm prolog calls.

Exit status: 0 healthy, 1 warnings only, 2 any critical (conditions firing or events seen; a GPU
count below ``--expected-gpus`` is critical), 66 the host root does not exist, 78 a config error.
What a collector could not look at (no GPU on the PCI bus, NVML not loadable, a missing source) is
listed under ``not_seen`` and does not change the status: a prolog that needs GPUs says how many.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent import config as configmod
from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.framework import is_periodic
from agent.message import Message, to_dict
from agent.registry import collector_classes
from gna_sdk import Checkable, node_status, phase_of, plural
from gna_sdk.hostroot import HostRoot

EXIT_HEALTHY, EXIT_WARNING, EXIT_CRITICAL = 0, 1, 2
MAX_HOSTNAMES = 1024  # names a node's processes print (its hostname, a few hundred pods' at most)


async def run_check(config: configmod.Config) -> dict[str, Any]:
    node = config.agent.node_name()
    host = HostRoot(config.agent.host_root)
    tracker = ConditionTracker(None)
    messages: list[Message] = []
    skipped: list[dict[str, str]] = []

    async def sink(msg: Message) -> bool:
        messages.append(msg)
        return True

    facts = FactStore()
    emitters: list[CollectorEmitter] = []
    # Evidence producers (kernel log) run before the collectors that attach their findings.
    for name, cls in sorted(collector_classes().items(), key=lambda kv: (phase_of(kv[1]), kv[0])):
        settings = config.collectors.get(name) or cls.config_type()
        if not settings.enabled:
            continue
        emitter = CollectorEmitter(node, name, sink, tracker, facts=facts, max_conditions=settings.max_conditions)
        emitters.append(emitter)
        try:
            collector = cls(settings, host, emitter)
            one_pass = collector.check if isinstance(collector, Checkable) else (
                collector.collect if is_periodic(collector) else None)
            if one_pass is None:
                skipped.append({"collector": name, "reason": "long-running only"})
                continue
            await asyncio.wait_for(one_pass(), timeout=settings.timeout)
        except TimeoutError:
            skipped.append({"collector": name, "reason": f"timed out after {settings.timeout}s"})
            continue
        except Exception as exc:
            skipped.append({"collector": name, "reason": f"failed: {exc!r}"})
            continue
    firing = {(m.collector, m.type, m.entity): m for m in messages if m.kind == "condition"}
    conditions = [to_dict(m) for m in firing.values() if (m.collector, m.type, m.entity) in tracker.active]
    events = [to_dict(m) for m in messages if m.kind == "event"]
    status = node_status(conditions + events)
    not_seen = [{"collector": e.collector, "source": src, "reason": why}
                for e in emitters for src, why in sorted(e.blind.items())]
    unparsed = [{"collector": e.collector, "source": src, "count": n, "sample": sample}
                for e in emitters for src, (n, sample) in sorted(e.skipped.items())]
    # the names this node's processes print in their logs (its hostname, its pods'): diagnose files the lines
    # another node relayed from a job-wide file under the snapshot they name (fleet/diagnose.py join_relayed)
    hostnames = sorted(facts.get("nccl_logs.hostnames") or [])[:MAX_HOSTNAMES]
    return {"node": node, "status": status, "conditions": conditions, "events": events,
            "skipped": skipped, "not_seen": not_seen, "unparsed": unparsed, "hostnames": hostnames}


async def check_roots(roots: list[str] | list[Any], base: configmod.Config | None = None) -> list[dict[str, Any]]:
    """One check per host root (node snapshots, simulated fleets), each root naming itself by its
    etc/hostname; ``base`` supplies every other setting."""
    import copy

    reports = []
    for root in roots:
        cfg = copy.deepcopy(base) if base is not None else configmod.parse("", file="<defaults>")
        cfg.agent.host_root = str(root)
        cfg.agent.node = ""
        reports.append(await run_check(cfg))
    return reports


def exit_code(report: dict[str, Any]) -> int:
    return {"healthy": EXIT_HEALTHY, "degraded": EXIT_WARNING, "unhealthy": EXIT_CRITICAL}[report["status"]]


def render_text(report: dict[str, Any]) -> str:
    lines = [f"node {report['node']}: {report['status'].upper()}"]
    for c in report["conditions"]:
        lines.append(f"  [{c['severity']:8}] {c['type']} {c['entity']}: {c['message']}")
    for e in report["events"]:
        lines.append(f"  [{e['severity']:8}] event {e['type']} {e['entity']}: {e['message']}")
    for s in report["skipped"]:
        lines.append(f"  [skipped ] {s['collector']}: {s['reason']}")
    for n in report["not_seen"]:
        lines.append(f"  [not seen] {n['collector']}: {n['source']}: {n['reason']}")
    for u in report["unparsed"]:
        lines.append(f"  [unparsed] {u['collector']}: {u['source']}: {plural(u['count'], 'line')}, "
                     f"e.g. {u['sample']!r}")
    if not report["conditions"] and not report["events"]:
        blind = len(report["not_seen"]) + len(report["skipped"])
        lines.append("  no problems found" + (f" in what could be seen ({blind} not seen or skipped, above)"
                                              if blind else ""))
    return "\n".join(lines)


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=None, separators=(",", ":"))
