"""Agent configuration: TOML, validated strictly.

A typo is an error that names the key, the file, the line and the closest valid key.
Collector sections are validated by each collector's own ``config_type``.
"""

from __future__ import annotations

import difflib
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from agent.remediation.policy import RemediationsConfig
from gna_types.subjects import EVENTS_STREAM, JOBS_STREAM, NODES_BUCKET, SIGNALS_STREAM

DEFAULT_CONFIG_PATH = Path("/etc/gpu-node-agent/config.toml")


class ConfigError(Exception):
    """Invalid configuration (exit code 78, EX_CONFIG)."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file, self.line, self.key = file, line, key
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(where + message)


class NatsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    servers: list[str] = msgspec.field(default_factory=list)  # empty: embedded nats-server
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    creds: str = ""
    nkey_seed: str = ""
    user: str = ""
    password: str = ""
    token: str = ""
    # replies (PubAcks, API answers, push-consumer deliveries) arrive on <inbox_prefix>.<random>;
    # "": _INBOX_<node token> for an agent, _INBOX_<role> for central tools, so NATS permissions
    # can let each user read only its own (docs/nats-security.md)
    inbox_prefix: str = ""
    connect_timeout: float = 5.0
    stream: str = EVENTS_STREAM
    stream_replicas: int = 1
    stream_max_age: float = 7 * 86400.0
    stream_max_bytes: int = -1
    duplicate_window: float = 600.0
    jobs_stream: str = JOBS_STREAM  # gna.jobs.>: jobs' membership and evidence (docs/subjects.md)
    jobs_stream_max_age: float = 2 * 86400.0
    jobs_max_per_subject: int = 1024  # per gna.jobs.<job>.<node>.<kind>: a job's facts stay bounded
    signals_stream: str = SIGNALS_STREAM  # gna.signals.>: straggler vectors, the latest few per node and collector
    signals_max_per_subject: int = 12
    signals_stream_max_age: float = 86400.0
    kv_bucket: str = NODES_BUCKET
    heartbeat_interval: float = 10.0
    publish_window: int = 1024
    publish_timeout: float = 5.0


class EmbeddedNatsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port, written to <state_dir>/nats.url


class SpoolConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_bytes: int = 256 * 1024 * 1024
    segment_bytes: int = 4 * 1024 * 1024
    policy: Literal["drop_oldest_info_first", "drop_newest", "drop_oldest"] = "drop_oldest_info_first"
    fsync: bool = True


class BusConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    subscriber_queue: int = 10000


class MetricsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:9465"  # "" disables /metrics and /healthz


class LogConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class NVSentinelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """[exports.nvsentinel]: feed NVSentinel's platform connector on this node (docs/exports.md)."""

    enabled: bool = False
    socket: str = "/var/run/nvsentinel.sock"  # platform-connectors' --socket (gRPC over a Unix socket)
    min_severity: Literal["info", "warning", "critical"] = "warning"
    resync_seconds: float = 300.0  # firing conditions re-sent this often (NVSentinel restarted, state lost)
    timeout_seconds: float = 5.0  # one RPC
    max_pending_events: int = 1000  # events (not conditions) kept while NVSentinel is away; the oldest dropped


class ExportsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    nvsentinel: NVSentinelConfig = msgspec.field(default_factory=NVSentinelConfig)


class ValidateTools(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """[validate.tools]: each active check's executable; "" finds it on PATH (docs/validate.md)."""

    all_reduce_perf: str = ""  # nccl-tests
    nvbandwidth: str = ""
    dcgmi: str = ""
    ib_write_bw: str = ""  # perftest, built with CUDA (--use_cuda)


class ValidateTimeouts(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """[validate.timeouts]: seconds each check may run before it is killed (and fails)."""

    passive: float = 120.0
    nccl_allreduce: float = 300.0
    nvbandwidth: float = 600.0
    dcgm_diag: float = 1800.0  # -r 2 takes minutes, -r 3 ~30 min on 8 GPUs
    ib_write_bw: float = 120.0


class ValidateThresholds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """[validate.thresholds]: overrides of the SKU table (agent/validate/thresholds.py); unset: the table's."""

    nccl_allreduce_busbw: float | None = None  # GB/s, busbw at the largest size
    nccl_allreduce_bytes: str = ""  # message size, all_reduce_perf's -e syntax ("16G")
    h2d: float | None = None  # GB/s per GPU, nvbandwidth host_to_device_memcpy_ce
    d2h: float | None = None  # GB/s per GPU, device_to_host_memcpy_ce
    p2p: float | None = None  # GB/s per GPU pair, device_to_device_memcpy_read_ce
    ib_gdr: float | None = None  # Gb/s per HCA, ib_write_bw --use_cuda loopback


class ValidateConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """[validate]: ``gpu-node-agent validate`` and the post-repair validation (docs/validate.md)."""

    sku: str = "auto"  # a row of the SKU table ("nd_h100_v5"), or "auto": detected from the GPUs' model and count
    tools: ValidateTools = msgspec.field(default_factory=ValidateTools)
    timeouts: ValidateTimeouts = msgspec.field(default_factory=ValidateTimeouts)
    thresholds: ValidateThresholds = msgspec.field(default_factory=ValidateThresholds)
    schedule_interval: float = 0.0  # seconds between scheduled runs while no job holds the GPUs; 0: never
    schedule_level: Literal["quick", "standard", "full"] = "quick"
    # once every critical condition of this node resolved and no job holds its GPUs: one run, published, so a
    # central cordoner can uncordon on it (fleet/validations.py). Not when this agent cordons itself (its own
    # engine validates before it uncordons).
    after_resolution: bool = True
    after_resolution_level: Literal["quick", "standard", "full"] = "standard"
    after_resolution_settle: float = 30.0  # s after the resolution: other triggers resolve or fire again first
    after_resolution_retry: float = 60.0  # s between tries while a job holds the GPUs
    # the central cordoner's request to validate (gna.validate.<node>, e.g. a suspect named by a fleet verdict,
    # which no condition of this node resolves): at most one accepted per interval, run like after_resolution
    request_min_interval: float = 60.0
    full_dcgm_level: int = 3  # dcgmi diag -r for --level full (4: the hours-long extended run)
    ib_port_base: int = 18515  # ib_write_bw's TCP port for the first HCA's loopback, +1 per further HCA
    server_start_delay: float = 1.0  # seconds between starting an ib_write_bw server and its client
    max_output_bytes: int = 4 << 20  # of each tool's stdout/stderr kept (the rest is read and dropped)


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node: str = ""
    host_root: str = "/"
    state_dir: str = "/var/lib/gpu-node-agent"
    shutdown_timeout: float = 5.0
    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    embedded_nats: EmbeddedNatsConfig = msgspec.field(default_factory=EmbeddedNatsConfig)
    spool: SpoolConfig = msgspec.field(default_factory=SpoolConfig)
    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    collectors: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    remediations: RemediationsConfig = msgspec.field(default_factory=RemediationsConfig)
    exports: ExportsConfig = msgspec.field(default_factory=ExportsConfig)
    validate: ValidateConfig = msgspec.field(default_factory=ValidateConfig)

    def node_name(self) -> str:
        """The configured name; else, under a host root, that host's own ``/etc/hostname`` (a check
        of a mounted node, or a container with the node at /host, names that node and not the
        machine it runs on); else this machine's hostname."""
        if self.node:
            return self.node
        if Path(self.host_root) != Path("/"):
            from gna_sdk.hostroot import HostRoot

            text = HostRoot(self.host_root).read_text("/etc/hostname", limit=512) or ""
            first = text.strip().split("\n", 1)[0].strip()
            if _HOSTNAME.fullmatch(first):
                return first
        return socket.gethostname()


@dataclass
class Config:
    """A validated config: the agent's sections plus each collector's parsed section."""

    agent: AgentConfig
    collectors: dict[str, Any]
    source: str


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")  # RFC 1123, at most 253
_SECTION = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")
_KEY = re.compile(r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_.-]+)\s*=")


def _find_line(text: str, path: list[str]) -> int | None:
    """Line of ``path`` (e.g. ["collectors", "gpu_devices", "intervl"]) in the TOML text."""
    table: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if m := _SECTION.match(line):
            table = [p.strip().strip("\"'") for p in m.group(1).split(".")]
            if table == path:
                return n
            continue
        if m := _KEY.match(line):
            key = [p.strip().strip("\"'") for p in m.group(1).split(".")]
            if table + key == path:
                return n
    return None


def _fields(struct_type: type[Any]) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(struct_type)}


def _struct_of(ftype: Any) -> type[Any] | None:
    """The Struct a field holds directly, or in a list (``list[Rule]``); None otherwise."""
    if isinstance(ftype, type) and issubclass(ftype, msgspec.Struct):
        return ftype
    args = getattr(ftype, "__args__", ())
    if getattr(ftype, "__origin__", None) is list and args and isinstance(args[0], type) \
            and issubclass(args[0], msgspec.Struct):
        return args[0]
    return None


def _unknown_keys(data: dict[str, Any], struct_type: type[Any], path: list[str],
                  out: list[tuple[list[str], list[str]]]) -> None:
    fields = _fields(struct_type)
    for key, value in data.items():
        if key not in fields:
            out.append(([*path, key], list(fields)))
            continue
        inner = _struct_of(fields[key])
        if inner is None:
            continue
        if isinstance(value, dict):
            _unknown_keys(value, inner, [*path, key], out)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _unknown_keys(item, inner, [*path, key], out)


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def _convert(data: Any, struct_type: type[Any], path: list[str], file: str, text: str) -> Any:
    unknown: list[tuple[list[str], list[str]]] = []
    if isinstance(data, dict):
        _unknown_keys(data, struct_type, path, unknown)
    if unknown:
        kpath, valid = unknown[0]
        dotted = ".".join(kpath)
        raise ConfigError(f"unknown key {dotted!r}{_suggest(kpath[-1], valid)}",
                          file=file, line=_find_line(text, kpath), key=dotted)
    try:
        return msgspec.convert(data, struct_type, strict=True)
    except msgspec.ValidationError as exc:
        # msgspec says "... - at `$.nats.port`": map that back to a line.
        detail = str(exc)
        loc = re.search(r"at `\$\.?([^`]*)`", detail)
        sub = [p for p in re.split(r"\.|\[|\]", loc.group(1)) if p] if loc else []
        kpath = [*path, *sub]
        raise ConfigError(f"invalid value: {detail.split(' - at ')[0]} (key {'.'.join(kpath)!r})",
                          file=file, line=_find_line(text, kpath) if kpath else None,
                          key=".".join(kpath)) from None


def parse(text: str, *, file: str = "<config>", collector_types: dict[str, type[Any]] | None = None) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=file) from None
    agent: AgentConfig = _convert(data, AgentConfig, [], file, text)
    collectors: dict[str, Any] = {}
    disabled_broken: set[str] = set()
    if collector_types is None:
        from agent.registry import broken_collectors, collector_classes

        collector_types = {name: cls.config_type for name, cls in collector_classes().items()}
        for name, why in broken_collectors().items():
            section = data.get("collectors", {}).get(name, {}) if isinstance(data.get("collectors"), dict) else {}
            if isinstance(section, dict) and section.get("enabled") is False:
                disabled_broken.add(name)  # disabled: the operator knows
                continue
            raise ConfigError(f"collector plugin {name!r} breaks the plugin contract ({why}); fix or uninstall it, "
                              f"or disable it with [collectors.{name}] enabled = false",
                              file=file, line=_find_line(text, ["collectors", name]), key=f"collectors.{name}")
    for name, section in agent.collectors.items():
        if name in disabled_broken:
            continue
        if name not in collector_types:
            raise ConfigError(f"unknown collector {name!r}{_suggest(name, list(collector_types))}",
                              file=file, line=_find_line(text, ["collectors", name]), key=f"collectors.{name}")
        if not isinstance(section, dict):
            raise ConfigError(f"collectors.{name} must be a table", file=file, key=f"collectors.{name}")
        collectors[name] = _convert(section, collector_types[name], ["collectors", name], file, text)
    for name, ctype in collector_types.items():
        collectors.setdefault(name, ctype())
    _check_plugin_sections(agent, file, text)
    cfg = Config(agent=agent, collectors=collectors, source=file)
    _check_values(cfg, file, text)
    return cfg


def _check_plugin_sections(agent: AgentConfig, file: str, text: str) -> None:
    from agent.registry import broken_remediations, remediation_classes
    from agent.remediation.policy import effective_rules

    classes = remediation_classes()
    broken = broken_remediations()
    used = {r.action for r in effective_rules(agent.remediations)} | set(agent.remediations.plugins)
    for name in sorted(used & set(broken)):
        raise ConfigError(f"remediation plugin {name!r} breaks the plugin contract ({broken[name]}); fix or "
                          f"uninstall it, or stop using it", file=file,
                          line=_find_line(text, ["remediations", "plugins", name]), key=f"remediations.plugins.{name}")
    _check_actions(agent, set(classes) | set(broken), file, text)
    for name, section in agent.remediations.plugins.items():
        cls = classes.get(name)
        path = ["remediations", "plugins", name]
        if cls is None:
            raise ConfigError(f"unknown remediation plugin {name!r}{_suggest(name, list(classes))}", file=file,
                              line=_find_line(text, path), key=".".join(path))
        dry = section.get("dry_run")
        if dry is not None and not isinstance(dry, bool):
            raise ConfigError(f"{'.'.join(path)}.dry_run must be true or false", file=file,
                              line=_find_line(text, [*path, "dry_run"]), key=".".join([*path, "dry_run"]))
        _convert({k: v for k, v in section.items() if k != "dry_run"}, cls.config_type, path, file, text)


def _check_actions(agent: AgentConfig, installed: set[str], file: str, text: str) -> None:
    """Every rule's action names an installed remediation plugin, or is "cordon" (the plugin named by
    ``cordon_with``): a typo is an error at its line with the closest name, not a rule that fails at run time."""
    from agent.remediation.policy import default_rules

    rem = agent.remediations
    choices = sorted(installed)

    def unknown(what: str, name: str, key: str, line: int | None, *, cordon: bool) -> ConfigError:
        valid = [*choices, "cordon"] if cordon else choices
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        listed = ", ".join(choices) or "none"
        hint = (f"; did you mean {close[0]!r}?" if close else
                f"; installed remediation plugins: {listed}" + (' (or "cordon")' if cordon else ""))
        return ConfigError(f"{what}: no installed remediation plugin (entry point group gpu_node_agent.remediations) "
                           f"has that name{hint}", file=file, line=line, key=key)

    rules = (default_rules() if rem.default_policy else []) + list(rem.rules)
    if rem.cordon_with not in installed and any(r.action == "cordon" for r in rules):
        raise unknown(f"unknown remediation plugin {rem.cordon_with!r} in remediations.cordon_with", rem.cordon_with,
                      "remediations.cordon_with", _find_line(text, ["remediations", "cordon_with"]), cordon=False)
    for i, rule in enumerate(rem.rules):
        if rule.action != "cordon" and rule.action not in installed:
            raise unknown(f"unknown action {rule.action!r} in rule {rule.name!r} (remediations.rules[{i}])",
                          rule.action, "remediations.rules.action", _rule_action_line(text, i, rule.action),
                          cordon=True)
    if rem.default_policy:
        for rule in default_rules():
            if rule.action != "cordon" and rule.action not in installed:
                raise unknown(f"unknown action {rule.action!r} in the default policy's rule {rule.name!r} "
                              "(default_policy = true)", rule.action, "remediations.default_policy",
                              _find_line(text, ["remediations", "default_policy"]), cordon=True)


def _rule_action_line(text: str, index: int, action: str) -> int | None:
    """Line of the ``action`` of the ``index``-th ``[[remediations.rules]]``; for rules written inline, the
    first line that sets ``action`` to this value."""
    seen = -1
    table: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if m := _SECTION.match(line):
            table = [p.strip().strip("\"'") for p in m.group(1).split(".")]
            if table == ["remediations", "rules"] and line.lstrip().startswith("[["):
                seen += 1
            continue
        if seen == index and table == ["remediations", "rules"] and (m := _KEY.match(line)) \
                and m.group(1).strip("\"'") == "action":
            return n
    pattern = re.compile(r"(^|[\s{,])[\"']?action[\"']?\s*=\s*[\"']" + re.escape(action) + r"[\"']")
    return next((n for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)), None)


def _check_values(config: Config, file: str, text: str) -> None:
    cfg = config.agent

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{key}: {msg}", file=file, line=_find_line(text, key.split(".")), key=key)

    if cfg.spool.segment_bytes < 4096:
        fail("spool.segment_bytes", "must be at least 4096")
    if cfg.spool.max_bytes < 2 * cfg.spool.segment_bytes:
        fail("spool.max_bytes", "must be at least twice spool.segment_bytes")
    if cfg.nats.publish_window < 1:
        fail("nats.publish_window", "must be >= 1")
    if cfg.nats.heartbeat_interval <= 0:
        fail("nats.heartbeat_interval", "must be > 0")
    for name, cc in config.collectors.items():
        if cc.interval <= 0:
            fail(f"collectors.{name}.interval", "must be > 0")
        if not 0 <= cc.jitter < 1:
            fail(f"collectors.{name}.jitter", "must be in [0, 1)")
        if cc.timeout <= 0:
            fail(f"collectors.{name}.timeout", "must be > 0")
    nv = cfg.exports.nvsentinel
    if nv.resync_seconds <= 0:
        fail("exports.nvsentinel.resync_seconds", "must be > 0")
    if nv.timeout_seconds <= 0:
        fail("exports.nvsentinel.timeout_seconds", "must be > 0")
    if nv.max_pending_events < 1:
        fail("exports.nvsentinel.max_pending_events", "must be >= 1")
    if nv.enabled and not nv.socket.startswith("/"):
        fail("exports.nvsentinel.socket", f"must be an absolute path, got {nv.socket[:80]!r}")
    va = cfg.validate
    if va.sku != "auto":
        from agent.validate.thresholds import SKU_KEYS

        if va.sku not in SKU_KEYS:
            raise ConfigError(f"validate.sku: unknown SKU {va.sku!r}{_suggest(va.sku, ['auto', *SKU_KEYS])}",
                              file=file, line=_find_line(text, ["validate", "sku"]), key="validate.sku")
    for name in msgspec.structs.asdict(va.timeouts):
        if not getattr(va.timeouts, name) > 0:
            fail(f"validate.timeouts.{name}", "must be > 0")
    for name, value in msgspec.structs.asdict(va.thresholds).items():
        if isinstance(value, float) and not value >= 0:
            fail(f"validate.thresholds.{name}", "must be >= 0")
    if va.thresholds.nccl_allreduce_bytes and not re.fullmatch(r"\d{1,15}[KMG]?", va.thresholds.nccl_allreduce_bytes):
        fail("validate.thresholds.nccl_allreduce_bytes", "expected a size like 16G, 512M or 1048576")
    if va.schedule_interval < 0:
        fail("validate.schedule_interval", "must be >= 0 (0: no schedule)")
    if not va.after_resolution_settle >= 0:
        fail("validate.after_resolution_settle", "must be >= 0")
    if not va.after_resolution_retry > 0:
        fail("validate.after_resolution_retry", "must be > 0")
    if not va.request_min_interval >= 0:
        fail("validate.request_min_interval", "must be >= 0")
    if va.full_dcgm_level not in (1, 2, 3, 4):
        fail("validate.full_dcgm_level", "must be 1, 2, 3 or 4 (dcgmi diag -r)")
    if not 1024 <= va.ib_port_base <= 65535 - 64:
        fail("validate.ib_port_base", "must be in 1024..65471")
    if not 0 <= va.server_start_delay <= 60:
        fail("validate.server_start_delay", "must be in [0, 60]")
    if va.max_output_bytes < 4096:
        fail("validate.max_output_bytes", "must be at least 4096")
    for name, path in msgspec.structs.asdict(va.tools).items():
        if path and not path.startswith("/"):
            fail(f"validate.tools.{name}", f"must be an absolute path, got {path[:80]!r}")
    if cfg.metrics.listen and not re.fullmatch(r"[^:]+:\d+|\[[0-9a-fA-F:]+\]:\d+", cfg.metrics.listen):
        fail("metrics.listen", f"expected HOST:PORT, got {cfg.metrics.listen!r}")


def load(path: str | Path | None, *, collector_types: dict[str, type[Any]] | None = None) -> Config:
    """Load a config file; ``None`` means the default path if it exists, else built-in defaults."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.exists():
            return parse("", file="<defaults>", collector_types=collector_types)
        path = DEFAULT_CONFIG_PATH
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {exc}", file=str(p)) from None
    return parse(text, file=str(p), collector_types=collector_types)
