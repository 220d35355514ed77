"""Build the remediation plugins named in config from the entry-point registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from agent.registry import remediation_classes
from agent.remediation.policy import RemediationsConfig, effective_rules
from gna_sdk.hostroot import HostRoot

log = structlog.get_logger(__name__)


class PluginConfigError(ValueError):
    pass


@dataclass
class Plugins:
    """The plugins the rules need: those that could be built, and why each other one could not."""

    available: dict[str, Any] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # name -> what is really missing


def load_plugins(cfg: RemediationsConfig, host: HostRoot, *, only: set[str] | None = None) -> Plugins:
    """Plugins used by a rule (or configured); one that cannot be built is left out with its reason."""
    classes = remediation_classes()
    wanted = {r.action for r in effective_rules(cfg)} | set(cfg.plugins)
    if only is not None:
        wanted &= only
    out = Plugins()
    for name in sorted(wanted):
        cls = classes.get(name)
        if cls is None:
            out.unavailable[name] = (f"no remediation plugin {name!r} is installed "
                                     "(no gpu_node_agent.remediations entry point of that name)")
            log.warning("remediation_plugin_missing", plugin=name)
            continue
        settings = {k: v for k, v in cfg.plugins.get(name, {}).items() if k != "dry_run"}
        try:
            conf = msgspec.convert(settings, cls.config_type, strict=True)
        except msgspec.ValidationError as exc:
            raise PluginConfigError(f"remediations.plugins.{name}: {exc}") from None
        try:
            out.available[name] = cls(conf, host)
        except Exception as exc:  # e.g. scontrol not installed on a Kubernetes node
            out.unavailable[name] = f"the {name} plugin is installed but cannot run here: {exc}"
            log.warning("remediation_plugin_unavailable", plugin=name, error=str(exc))
    return out
