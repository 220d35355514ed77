"""The plugin SDK of gpu-node-agent: the whole surface a collector or a remediation may use.

A plugin (built in or from a third-party package through entry points) imports this package and
its own modules, nothing else of the agent. Every capability the runtime looks for is declared
here as a Protocol; :func:`collector_contract` and :func:`remediation_contract` say precisely what
a class lacks, and the agent refuses such a plugin as a configuration error (exit 78) naming the
plugin and the member.

Collector (``gpu_node_agent.collectors`` entry point)::

    name: ClassVar[str]                      # set from the entry point name
    config_type: ClassVar[type[CollectorSettings]]
    def __init__(self, config, host: HostPaths, emit: Emitter) -> None
    async def collect(self) -> None          # Periodic: one pass, every `interval`
    async def run(self) -> None              # LongRunning: until cancelled (a watcher); either or both

  optional: ``check`` (Checkable: `gpu-node-agent check` calls it instead of collect),
  ``phase`` (Phased: lower runs first in `check`), ``auto_resolve = False`` (ResolvesItself: the
  collector resolves its own conditions), ``prometheus_families`` (ExportsMetrics), and
  ``wakeup`` (Wakeable: an asyncio.Event the framework assigns before run(); setting it asks for a
  periodic pass now).

Remediation (``gpu_node_agent.remediations`` entry point)::

    name: ClassVar[str]
    config_type: ClassVar[type]              # a msgspec.Struct: its [remediations.plugins.<name>] section
    needs_budget: ClassVar[bool]             # True: takes a fleet budget slot (cordon/drain); runs centrally
    def __init__(self, config, host: HostPaths) -> None   # raise to say "cannot run here" (binary missing)
    def plan(self, msg, args) -> str         # what it would do (audited in dry-run)
    async def execute(self, msg, args) -> Result

  optional: ``uncordon`` (Uncordons: async, undoes a cordon when its condition resolves).
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Protocol, runtime_checkable

import msgspec

from gna_types.policy import SEVERITIES as SEVERITIES
from gna_types.policy import SUGGESTED_ACTIONS as SUGGESTED_ACTIONS
from gna_types.policy import Severity as Severity
from gna_types.policy import SuggestedAction as SuggestedAction

Kind = Literal["event", "condition"]
Status = Literal["firing", "resolved"]
Details = Mapping[str, Any]


def severity_rank(severity: Any) -> int:
    """The one severity order: info 1 < warning 2 < critical 3; anything else (none, unknown) 0."""
    try:
        return SEVERITIES.index(severity) + 1
    except ValueError:
        return 0


def node_status(messages: Any) -> str:
    """A node's status from its messages' severities (``check``'s exit and ``diagnose``): any critical is
    unhealthy, any warning degraded, else healthy."""
    rank = max((severity_rank(m.get("severity")) for m in messages), default=0)
    return {3: "unhealthy", 2: "degraded"}.get(rank, "healthy")


def worst(*severities: Any) -> Severity:
    """The most severe of known severities (info when none is known)."""
    best = max(severities, key=severity_rank, default="info")
    return SEVERITIES[severity_rank(best) - 1] if severity_rank(best) else "info"


class CollectorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Keys every collector section accepts; a collector's ``config_type`` subclasses this."""

    enabled: bool = True
    interval: float = 30.0
    jitter: float = 0.1  # fraction of interval, randomised per run to de-synchronise a fleet (align = false)
    # true: periodic passes land on the process's grid (gna_sdk.aio.aligned_delay) with the heartbeat and the
    # other collectors, one wake-up for all; jitter then only offsets the first pass
    align: bool = True
    timeout: float = 10.0
    restart_backoff_min: float = 1.0  # first delay after a failure; doubles up to the max
    restart_backoff_max: float = 60.0
    max_conditions: Annotated[int, msgspec.Meta(ge=1)] = 64  # beyond: folded into one aggregate per type

    def __post_init__(self) -> None:
        # here, not as field constraints: a collector's config_type redeclares interval with its own default
        if not self.interval > 0 or not self.timeout > 0:
            raise ValueError("interval and timeout must be > 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction of the interval: 0 to 1")
        if not (self.restart_backoff_min > 0 and self.restart_backoff_max > 0):
            raise ValueError("restart_backoff_min and restart_backoff_max must be > 0")  # 0: a restart loop


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
        ``msg_id`` (a derived id) makes a re-sent event after a crash a duplicate."""
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


# -- shared helpers ----------------------------------------------------------------------------

def plural(n: int, word: str, many: str = "") -> str:
    """A count and its noun as a message says it: "1 line", "0 lines", "3 lines"; ``many`` when
    adding "s" is wrong ("1 process", "2 processes"). Every count in a message goes through this."""
    return f"{n} {word if n == 1 else many or word + 's'}"


@dataclass
class Window:
    first: float
    count: int = 1
    first_usec: int = 0  # kernel time (uptime) of the first and last record: the true span
    last_usec: int = 0

    def span(self) -> str:
        """What a summary says about time: the records' own span when they carry one."""
        seconds = (self.last_usec - self.first_usec) / 1e6
        if seconds <= 0:
            return "in one burst"
        return f"over {seconds:.0f} s" if seconds < 120 else f"over {seconds / 60:.1f} min"


class Aggregator:
    """First occurrence per key now; later ones in the window are counted and summarised (``due``):
    a storm of identical kernel messages is one event at once and one summary per window."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.open: dict[tuple[Any, ...], Window] = {}

    def add(self, key: tuple[Any, ...], now: float, usec: int = 0) -> bool:
        w = self.open.get(key)
        if w is None:
            self.open[key] = Window(first=now, first_usec=usec, last_usec=usec)
            return True
        w.count += 1
        w.last_usec = max(w.last_usec, usec)
        return False

    def due(self, now: float, *, flush_all: bool = False) -> list[tuple[tuple[Any, ...], Window]]:
        out = []
        for key, w in list(self.open.items()):
            if flush_all or now - w.first >= self.window:
                del self.open[key]
                if w.count > 1:
                    out.append((key, w))
        return out


# -- collectors --------------------------------------------------------------------------------

@runtime_checkable
class Collector(Protocol):
    name: ClassVar[str]
    config_type: ClassVar[type[CollectorSettings]]

    def __init__(self, config: Any, host: HostPaths, emit: Emitter) -> None: ...


@runtime_checkable
class Periodic(Protocol):
    async def collect(self) -> None:
        """One pass: the framework calls it every ``interval`` (with jitter, a timeout, backoff)."""


@runtime_checkable
class LongRunning(Protocol):
    async def run(self) -> None:
        """Until cancelled (netlink, inotify, a log tail); restarted with backoff when it fails."""


@runtime_checkable
class Checkable(Protocol):
    async def check(self) -> None:
        """`gpu-node-agent check`: one pass over everything (e.g. whole log files), nothing persisted."""


@runtime_checkable
class Phased(Protocol):
    phase: ClassVar[int]  # evidence producers (kernel log: 10) run before the collectors that read it


@runtime_checkable
class ResolvesItself(Protocol):
    auto_resolve: ClassVar[bool]  # False: conditions not re-reported in a pass are left to the collector


@runtime_checkable
class ExportsMetrics(Protocol):
    def prometheus_families(self) -> list[Any]:
        """prometheus_client metric families from the last pass, served on the agent's /metrics."""
        ...


@runtime_checkable
class ReportsTopology(Protocol):
    """A collector class that prints the node's GPU/NIC matrix (``gpu-node-agent topo``)."""

    @staticmethod
    def report(host_root: Any, *, use_nvml: bool = True, pcie_only: bool = False,
               nvml: Any = None) -> tuple[dict[str, Any], list[str]]:
        """(the report, notes for stderr) for a host root."""
        ...

    @staticmethod
    def render_text(report: Any) -> str:
        """The report as ``nvidia-smi topo -m`` prints it."""
        ...


@runtime_checkable
class Wakeable(Protocol):
    wakeup: Any  # asyncio.Event, assigned by the framework before run(); set it to get a pass now


DEFAULT_PHASE = 50


def phase_of(collector: Any) -> int:
    return int(collector.phase) if isinstance(collector, Phased) else DEFAULT_PHASE


def auto_resolves(collector: Any) -> bool:
    return bool(collector.auto_resolve) if isinstance(collector, ResolvesItself) else True


# -- remediations ------------------------------------------------------------------------------

Outcome = Literal["executed", "already_done", "failed"]


@dataclass
class Result:
    """The outcome of one remediation attempt (audited as is)."""

    outcome: Outcome
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


# Commands are argv lists resolved once at start-up (config path, else PATH); nothing from a log line
# or a message reaches a command line except values checked against an allowlist.
class CommandError(Exception):
    pass


def resolve_executable(name: str, configured: str = "") -> str:
    path = configured or shutil.which(name)
    if not path:
        raise CommandError(f"{name} not found (set its path in the remediation config)")
    return path


async def run_command(argv: list[str], *, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run a fixed argv (never a shell); returns (rc, stdout, stderr) with output capped."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CommandError(f"{argv[0]} timed out after {timeout:g}s") from None
    except asyncio.CancelledError:  # the caller gave up (a shutdown): the child must not outlive it
        if proc.returncode is None:
            proc.kill()
            await asyncio.shield(proc.wait())
        raise
    return proc.returncode or 0, out.decode("utf-8", "replace")[:4000], err.decode("utf-8", "replace")[:4000]


@runtime_checkable
class Remediation(Protocol):
    name: ClassVar[str]
    config_type: ClassVar[type[Any]]
    needs_budget: ClassVar[bool]

    def __init__(self, config: Any, host: HostPaths) -> None: ...

    def plan(self, msg: Mapping[str, Any], args: Mapping[str, Any]) -> str: ...

    async def execute(self, msg: Mapping[str, Any], args: Mapping[str, Any]) -> Result: ...


@runtime_checkable
class Uncordons(Protocol):
    async def uncordon(self, msg: Mapping[str, Any]) -> Result:
        """Undo this plugin's cordon when the condition that caused it resolves."""
        ...


# -- contracts ---------------------------------------------------------------------------------

def _positional(fn: Any) -> int | None:
    """How many positional parameters (after self) ``fn`` accepts; None for *args."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _method(cls: type, name: str, *, is_async: bool, args: int, optional: bool = False) -> list[str]:
    fn = inspect.getattr_static(cls, name, None)
    if fn is None:
        return [] if optional else [f"missing {name}()"]
    if isinstance(fn, staticmethod | classmethod) or not callable(fn):
        return [f"{name} must be a method"]
    if is_async != inspect.iscoroutinefunction(fn):
        return [f"{name}() must be {'async def' if is_async else 'a plain def (not async)'}"]
    n = _positional(fn)
    if n is not None and n < args:
        return [f"{name}() must accept {args} argument{'s' * (args != 1)} (takes {n})"]
    try:
        required_kw = [p.name for p in inspect.signature(fn).parameters.values()
                       if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    except (TypeError, ValueError):
        required_kw = []
    if required_kw:  # the runtime calls it with positional arguments only
        return [f"{name}() has required keyword-only argument(s) {', '.join(required_kw)}"]
    return []


def _class_attr(cls: type, name: str, kind: type | tuple[type, ...], what: str) -> list[str]:
    if not hasattr(cls, name):
        return [f"missing class attribute {name} ({what})"]
    value = getattr(cls, name)
    if kind is type:
        return [] if isinstance(value, type) else [f"{name} must be a class ({what})"]
    return [] if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else \
        [f"{name} must be {what}"]


def collector_contract(cls: Any) -> list[str]:
    """What ``cls`` lacks to be a collector ([] when it is one)."""
    if not isinstance(cls, type):
        return [f"entry point names {cls!r}, not a class"]
    problems = _class_attr(cls, "config_type", type, "a CollectorSettings subclass")
    if not problems and not issubclass(getattr(cls, "config_type"), CollectorSettings):  # noqa: B009
        problems.append("config_type must subclass gna_sdk.CollectorSettings")
    init_args = _positional(inspect.getattr_static(cls, "__init__"))
    if init_args is not None and init_args < 3:
        problems.append(f"__init__ must accept (config, host, emit) (takes {init_args})")
    has_collect = inspect.getattr_static(cls, "collect", None) is not None
    has_run = inspect.getattr_static(cls, "run", None) is not None
    if not (has_collect or has_run):
        problems.append("missing collect() or run(): a collector needs one (or both)")
    problems += _method(cls, "collect", is_async=True, args=0, optional=True)
    problems += _method(cls, "run", is_async=True, args=0, optional=True)
    problems += _method(cls, "check", is_async=True, args=0, optional=True)
    problems += _method(cls, "prometheus_families", is_async=False, args=0, optional=True)
    if hasattr(cls, "phase"):
        problems += _class_attr(cls, "phase", int, "an int")
    if hasattr(cls, "auto_resolve"):
        problems += _class_attr(cls, "auto_resolve", bool, "a bool")
    return problems


def remediation_contract(cls: Any) -> list[str]:
    """What ``cls`` lacks to be a remediation ([] when it is one)."""
    if not isinstance(cls, type):
        return [f"entry point names {cls!r}, not a class"]
    problems = _class_attr(cls, "config_type", type, "a msgspec.Struct for its config section")
    if not problems and not issubclass(getattr(cls, "config_type"), msgspec.Struct):  # noqa: B009
        problems.append("config_type must be a msgspec.Struct")
    problems += _class_attr(cls, "needs_budget", bool, "a bool")
    init_args = _positional(inspect.getattr_static(cls, "__init__"))
    if init_args is not None and init_args < 2:
        problems.append(f"__init__ must accept (config, host) (takes {init_args})")
    problems += _method(cls, "plan", is_async=False, args=2)
    problems += _method(cls, "execute", is_async=True, args=2)
    problems += _method(cls, "uncordon", is_async=True, args=1, optional=True)
    return problems
