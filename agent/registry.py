"""Plugin discovery through entry points: a third party adds a collector or remediation by packaging it."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import structlog

from agent.subjects import check_plugin_name

COLLECTOR_GROUP = "gpu_node_agent.collectors"
REMEDIATION_GROUP = "gpu_node_agent.remediations"

log = structlog.get_logger(__name__)


def _load(group: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
            check_plugin_name(ep.name)
        except Exception as exc:  # a broken third-party plugin must not take the agent down
            log.error("plugin_load_failed", group=group, name=ep.name, value=ep.value, error=repr(exc))
            continue
        if ep.name in found and found[ep.name] is not obj:
            log.warning("plugin_name_conflict", group=group, name=ep.name, kept=repr(found[ep.name]))
            continue
        found[ep.name] = obj
    return found


def collector_classes() -> dict[str, Any]:
    classes = _load(COLLECTOR_GROUP)
    for name, cls in classes.items():
        cls.name = name
    return classes


def remediation_classes() -> dict[str, Any]:
    return _load(REMEDIATION_GROUP)
