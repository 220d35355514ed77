"""Build the remediation plugins named in config from the entry-point registry."""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from agent.hostroot import HostRoot
from agent.registry import remediation_classes
from remediations.policy import RemediationsConfig, effective_rules

log = structlog.get_logger(__name__)


class PluginConfigError(ValueError):
    pass


def load_plugins(cfg: RemediationsConfig, host: HostRoot, *, only: set[str] | None = None) -> dict[str, Any]:
    """Plugins used by a rule (or configured); one whose executable is missing is left out, logged."""
    classes = remediation_classes()
    wanted = {r.action for r in effective_rules(cfg)} | set(cfg.plugins)
    if only is not None:
        wanted &= only
    out: dict[str, Any] = {}
    for name in sorted(wanted):
        cls = classes.get(name)
        if cls is None:
            log.warning("remediation_plugin_missing", plugin=name)
            continue
        settings = {k: v for k, v in cfg.plugins.get(name, {}).items() if k != "dry_run"}
        try:
            conf = msgspec.convert(settings, cls.config_type, strict=True)
        except msgspec.ValidationError as exc:
            raise PluginConfigError(f"remediations.plugins.{name}: {exc}") from None
        try:
            out[name] = cls(conf, host)
        except Exception as exc:  # e.g. scontrol not installed on a Kubernetes node
            log.warning("remediation_plugin_unavailable", plugin=name, error=str(exc))
    return out
