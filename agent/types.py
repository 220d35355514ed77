"""Contracts shared by the runtime, collectors and remediations.

Plugins depend on this module only: the Protocols here are the whole plugin surface.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

Severity = Literal["info", "warning", "critical"]
Kind = Literal["event", "condition"]
Status = Literal["firing", "resolved"]
SuggestedAction = Literal[
    "none", "cordon", "reload_module", "warmup", "reboot", "inspect_hardware", "fix_config"
]
Details = Mapping[str, Any]

SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
SUGGESTED_ACTIONS: tuple[SuggestedAction, ...] = (
    "none", "cordon", "reload_module", "warmup", "reboot", "inspect_hardware", "fix_config",
)


class HostPaths(Protocol):
    """Resolves absolute host paths ("/sys/...") under the configured host root."""

    @property
    def root(self) -> Any: ...

    def path(self, host_path: str) -> Any: ...

    def read_text(self, host_path: str, limit: int = 65536) -> str | None: ...


class Facts(Protocol):
    def set(self, key: str, value: Any) -> None: ...

    def get(self, key: str, default: Any = None, *, max_age: float | None = None) -> Any: ...


class Emitter(Protocol):
    """What a collector uses to report. Bound to one collector (its name is filled in).

    ``facts`` is shared by all collectors of the agent; ``state_dir`` is the collector's own
    directory for checkpoints (None in ``check``, where nothing persists).
    """

    @property
    def facts(self) -> Facts: ...

    @property
    def state_dir(self) -> Any: ...

    async def event(
        self,
        type: str,
        *,
        severity: Severity,
        entity: str,
        reason: str,
        message: str,
        details: Details | None = None,
        suggested_action: SuggestedAction = "none",
        msg_id: str | None = None,
    ) -> bool:
        """True once the message is accepted (durable); False if the spool policy refused it.
        ``msg_id`` (agent.ids.derived_id) makes a re-sent event after a crash a duplicate."""
        ...

    async def condition(
        self,
        type: str,
        *,
        firing: bool,
        severity: Severity,
        entity: str,
        reason: str,
        message: str,
        details: Details | None = None,
        suggested_action: SuggestedAction = "none",
    ) -> bool:
        """Report a condition's current state; only transitions are published. False: refused."""
        ...

    def active_conditions(self) -> list[tuple[str, str, str]]:
        """(type, entity, severity) of this collector's firing conditions (persisted across restarts)."""
        ...

    def unparsed(self, source: str, sample: str) -> None:
        """Count one line/record of ``source`` that could not be parsed (kept: the first sample).
        Shown by ``check`` (count and sample) and in ``/metrics``; never silently dropped."""
        ...

    def not_seen(self, source: str, reason: str) -> None:
        """Say that this pass could not look at ``source`` (a missing path, a library that does not
        load, no device of the kind on this node). ``check`` lists these, so "healthy" never stands
        for "saw nothing"; the daemon logs each once."""
        ...


@runtime_checkable
class Collector(Protocol):
    """A watched thing. Implement ``collect`` (periodic), ``run`` (long-running), or both.

    ``collect`` is one pass: the framework calls it at ``interval``; ``check`` calls it once.
    ``run`` runs until cancelled; when a collector has both, the framework runs ``run`` and
    ``check`` still uses ``collect``.
    """

    name: ClassVar[str]
    config_type: ClassVar[type[Any]]

    def __init__(self, config: Any, host: HostPaths, emit: Emitter) -> None: ...


class Remediation(Protocol):
    """A plugin that acts on a message (see remediations/)."""

    name: ClassVar[str]

    async def execute(self, message: Mapping[str, Any], args: Mapping[str, Any], *, dry_run: bool) -> str: ...
