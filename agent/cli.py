"""Command line of the node side: run, check, config check, warmup. Exit codes follow sysexits(3).

The central commands (events, top, dashboard, cordoner, budget) and the demo are added by the
``fleet`` and ``sim`` packages through the ``gpu_node_agent.commands`` entry point group, so the node
runtime never imports them.
"""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["run"]:
    # The daemon never renders rich output, but structlog imports rich whenever it is installed
    # (a node install does not carry it; one with the [fleet] extra does): ~5 MiB of RSS.
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
    # Nor greenlet (a test dependency's, playwright's): structlog's deprecated threadlocal module imports it
    # when present (structlog/_greenlets.py) and falls back to threading.local without it: ~1 MiB of RSS.
    sys.modules.setdefault("greenlet", None)  # type: ignore[arg-type]

import argparse
import asyncio
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from agent import __version__
from agent import config as configmod
from agent.cliargs import (
    EX_CONFIG,
    EX_NOINPUT,
    EX_UNAVAILABLE,
    Parser,
    add_common,
    load_config,
    missing_extra,
    positive_float,
    positive_int,
)
from agent.natsclient import NatsUnavailable
from agent.shutdown import EX_SOFTWARE
from agent.topo_cmd import add_command as add_topo_command
from agent.validate.cli import add_command as add_validate_command
from gna_sdk import plural

COMMANDS_GROUP = "gpu_node_agent.commands"


NODE_COMMANDS = {"run", "check", "config", "warmup", "topo", "validate"}


def build_parser(*, with_commands: bool = True) -> argparse.ArgumentParser:
    """Every command; ``with_commands=False``: the node's own only (the daemon never imports fleet/sim)."""
    parser = Parser(
        prog="gpu-node-agent",
        description="GPU data-plane node agent: the daemon that watches a GPU node's data plane (GPU devices, "
        "kernel modules, Xid, InfiniBand, NCCL, JuiceFS) and publishes what it finds on NATS JetStream, its one-shot "
        "check, and the fleet's central tools. Each command's --help says what it does, the default of every option "
        "and its exit codes (sysexits(3)).",
        exit_codes={0: "--help, --version; a command exits with the codes its own --help lists"})
    parser.add_argument("--version", action="version", version=f"gpu-node-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser(
        "run", help="run the daemon",
        description="Run the node agent: every enabled collector on its own schedule, their messages through the "
        "durable spool to NATS JetStream (without --nats or the config's nats.servers: an embedded nats-server in "
        "the state directory), /metrics and /healthz, and the remediation rules, which only audit what they would "
        "do unless --enforce (or the config's remediations.enforce). SIGHUP reloads the config; SIGTERM or SIGINT "
        "stops it within the config's shutdown_timeout.",
        exit_codes={0: "stopped by SIGTERM/SIGINT or after --duration",
                    EX_NOINPUT: "the host root does not exist or is not a directory",
                    EX_SOFTWARE: "stopped only by abandoning tasks that ignored their cancellation, or at the hard "
                                 "shutdown deadline (every thread's stack is on stderr)",
                    EX_CONFIG: "a configuration error (file, line, key, the closest valid key): nothing started"})
    add_common(run)
    run.add_argument("--nats", action="append", help="NATS URL (repeatable; default: the config's nats.servers, "
                     "else an embedded nats-server in the state directory)")
    run.add_argument("--state-dir", help="spool, checkpoints, condition state, embedded NATS store (default: the "
                     "config's state_dir, /var/lib/gpu-node-agent)")
    run.add_argument("--metrics-listen", help="HOST:PORT for /metrics and /healthz, '' disables (default: the "
                     "config's metrics.listen, 127.0.0.1:9465)")
    run.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                     "run until SIGTERM/SIGINT)")
    run.add_argument("--enforce", action="store_true", help="act (default: remediation is dry-run, audited only)")

    check = sub.add_parser(
        "check", help="one pass of every collector, no NATS; exit 0/1/2",
        description="One pass of every collector, no NATS: for Slurm prologs and init containers. Prints what is "
        "firing (text or JSON) and what could not be looked at ('not seen': no GPU on the PCI bus, NVML not "
        "loadable, a missing source), which never changes the exit code.",
        exit_codes={0: "healthy", 1: "warnings only",
                    2: "something critical: a firing critical condition or event, fewer GPUs than --expected-gpus "
                       "included",
                    EX_NOINPUT: "the host root does not exist or is not a directory (the prolog itself is wrong)",
                    EX_CONFIG: "a configuration error"})
    add_common(check)
    check.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    check.add_argument("--expected-gpus", type=positive_int, help="GPUs this node must have: fewer on the PCI bus "
                       "or in /dev is critical (default: the config's collectors.gpu_devices.expected_count; 0 "
                       "there: what the PCI bus shows)")

    cfg = sub.add_parser(
        "config", help="configuration tools",
        description="Configuration tools: 'config check FILE' validates a config file as the daemon would load it.",
        exit_codes={0: "config check: the file is valid", EX_CONFIG: "config check: the file is invalid or cannot be "
                    "read"})
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=Parser)
    cc = cfg_sub.add_parser(
        "check", help="validate a config file: exit 0 valid, 78 invalid",
        description="Validate a config file as the daemon loads it: every key, each collector's and remediation "
        "plugin's section, the values, and every remediation rule's action against the installed remediation "
        "plugins. The first mistake is printed with the file, the line, the key and the closest valid name.",
        exit_codes={0: "valid (the number of collectors is printed)",
                    EX_CONFIG: "invalid, or the file cannot be read (the reason on stderr)"})
    cc.add_argument("file", help="the TOML file to validate")

    warm = sub.add_parser(
        "warmup", help="warm a JuiceFS mount's configured dataset paths now",
        description="Warm a JuiceFS mount's dataset paths now, with the juicefs_warmup remediation plugin and its "
        "settings in the config (remediations.plugins.juicefs_warmup): prints the plan, then the outcome. It acts "
        "whatever the config's dry-run settings say; the daemon's default policy warms a cold cache by itself.",
        exit_codes={0: "the warmup ran (with the plugin's background = true: started)",
                    1: "the warmup failed (juicefs warmup's exit status and stderr are printed)",
                    EX_UNAVAILABLE: "the juicefs_warmup plugin cannot run here (the reason on stderr)",
                    EX_CONFIG: "a configuration error, or the config names no dataset paths for --mount"})
    warm.add_argument("--mount", required=True, help="the JuiceFS mount point, as in the config")
    warm.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists)")
    warm.add_argument("--host-root", help="directory every host path is resolved under (default /)")

    run.set_defaults(handler=cmd_run)
    check.set_defaults(handler=cmd_check)
    cc.set_defaults(handler=cmd_config_check)
    warm.set_defaults(handler=cmd_warmup)
    add_topo_command(sub)
    add_validate_command(sub)
    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name) if with_commands else ():
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken command set must not take run/check with it
            print(f"gpu-node-agent: commands {ep.name!r} ({ep.value}) not available: {exc!r}", file=sys.stderr)
    return parser


def cmd_warmup(args: argparse.Namespace) -> int:
    from agent.remediation.loader import load_plugins
    from gna_sdk.hostroot import HostRoot

    cfg = load_config(args).agent
    loaded = load_plugins(cfg.remediations, HostRoot(cfg.host_root), only={"juicefs_warmup"})
    plugin = loaded.available.get("juicefs_warmup")
    if plugin is None:
        why = loaded.unavailable.get("juicefs_warmup", "it is not configured")
        print(f"gpu-node-agent: cannot warm up: {why}", file=sys.stderr)
        return EX_UNAVAILABLE
    msg = {"node": cfg.node_name(), "entity": f"juicefs:{args.mount}", "type": "ManualWarmup"}
    try:
        print(plugin.plan(msg, {"mount": args.mount}))
    except ValueError as exc:
        print(f"gpu-node-agent: {exc}", file=sys.stderr)
        return EX_CONFIG
    result = asyncio.run(plugin.execute(msg, {"mount": args.mount}))
    print(f"{result.outcome}: {result.detail}")
    return 0 if result.outcome != "failed" else 1


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("node", "host_root", "state_dir"):
        if getattr(args, key, None):
            out[key] = getattr(args, key)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    if (rc := _missing_host_root(cfg)) is not None:
        return rc
    if not any(s.startswith(("ws://", "wss://")) for s in cfg.agent.nats.servers):
        # nats-py imports aiohttp (installed for the dashboard) only for WebSocket URLs: ~6 MiB of RSS
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]
    from agent.daemon import Agent
    from agent.logsetup import configure
    from agent.shutdown import STOP_GRACE_S, ShutdownGuard

    configure(cfg.agent.log.level, cfg.agent.log.format)
    guard = ShutdownGuard(cfg.agent.shutdown_timeout + STOP_GRACE_S)
    agent = Agent(cfg, config_path=args.config, overrides=_overrides(args), guard=guard)
    runner = asyncio.Runner()
    rc = runner.run(agent.run(duration=args.duration))
    if agent.abandoned:
        # asyncio's own clean-up would await the abandoned tasks again, for ever: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    runner.close()  # still under the guard: a hang here also ends at the hard deadline
    guard.disarm()
    return rc


def _missing_host_root(cfg: configmod.Config) -> int | None:
    """A typo in --host-root must not pass every node as healthy: exit 66 with the path."""
    root = Path(cfg.agent.host_root)
    if root.is_dir():
        return None
    print(f"gpu-node-agent: host root {str(root)!r} does not exist or is not a directory", file=sys.stderr)
    return EX_NOINPUT


def cmd_check(args: argparse.Namespace) -> int:
    from agent.check import exit_code, render_json, render_text, run_check
    from agent.logsetup import configure

    cfg = load_config(args)
    if (rc := _missing_host_root(cfg)) is not None:
        return rc
    if args.expected_gpus:
        gpu = cfg.collectors.get("gpu_devices")
        if gpu is None:  # disabled in the config: --expected-gpus asks for it anyway
            from agent.registry import collector_classes

            cls = collector_classes().get("gpu_devices")
            if cls is None:
                raise configmod.ConfigError("--expected-gpus needs the gpu_devices collector, which is not installed")
            gpu = cfg.collectors["gpu_devices"] = cls.config_type()
        gpu.expected_count = args.expected_gpus
    configure("error", cfg.agent.log.format)
    report = asyncio.run(run_check(cfg))
    print(render_json(report) if args.format == "json" else render_text(report))
    return exit_code(report)


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.file)
    print(f"{args.file}: valid ({plural(len(cfg.collectors), 'collector')})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A node command given first needs no other command's parser (the daemon never imports fleet/sim); anything
    # else (no command, an option first, --help, a typo) gets them all, so a usage line lists every command.
    args = build_parser(with_commands=not argv or argv[0] not in NODE_COMMANDS).parse_args(argv)
    try:
        return int(args.handler(args))
    except configmod.ConfigError as exc:
        print(f"gpu-node-agent: configuration error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except NatsUnavailable as exc:
        print(f"gpu-node-agent: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except ModuleNotFoundError as exc:
        if (extra := missing_extra(exc)) is None:
            raise
        print(f"gpu-node-agent {args.command}: needs the [{extra}] extra (module {exc.name!r} is not installed): "
              f"pip install 'gpu-node-agent[{extra}]'", file=sys.stderr)
        return EX_UNAVAILABLE


if __name__ == "__main__":
    raise SystemExit(main())
