"""Plugin discovery through entry points: a third party adds a collector or remediation by packaging it.

Every class found is checked against the SDK's contract (gna_sdk.collector_contract /
remediation_contract). One that breaks it is kept out and remembered in ``broken``: the config
loader turns it into a configuration error (exit 78) naming the plugin and what it lacks, unless
the config disables it. A plugin that cannot even be imported is logged and left out.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import structlog

from gna_sdk import collector_contract, remediation_contract
from gna_types.subjects import check_plugin_name

COLLECTOR_GROUP = "gpu_node_agent.collectors"
REMEDIATION_GROUP = "gpu_node_agent.remediations"

log = structlog.get_logger(__name__)


def _load(group: str, contract: Callable[[Any], list[str]]) -> tuple[dict[str, Any], dict[str, str]]:
    found: dict[str, Any] = {}
    broken: dict[str, str] = {}
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
        problems = contract(obj)
        if problems:
            broken[ep.name] = f"{ep.value}: {'; '.join(problems)}"
            continue
        found[ep.name] = obj
    return found, broken


def collector_classes() -> dict[str, Any]:
    classes, _ = _load(COLLECTOR_GROUP, collector_contract)
    for name, cls in classes.items():
        cls.name = name
    return classes


def remediation_classes() -> dict[str, Any]:
    return _load(REMEDIATION_GROUP, remediation_contract)[0]


def broken_collectors() -> dict[str, str]:
    """name -> "module:Class: what it lacks" for installed collectors that break the contract."""
    return _load(COLLECTOR_GROUP, collector_contract)[1]


def broken_remediations() -> dict[str, str]:
    return _load(REMEDIATION_GROUP, remediation_contract)[1]
