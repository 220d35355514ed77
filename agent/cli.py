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
from agent.topo_cmd import add_command as add_topo_command
from gna_sdk import plural

COMMANDS_GROUP = "gpu_node_agent.commands"


NODE_COMMANDS = {"run", "check", "config", "warmup", "topo"}


def build_parser(*, with_commands: bool = True) -> argparse.ArgumentParser:
    """Every command; ``with_commands=False``: the node's own only (the daemon never imports fleet/sim)."""
    parser = Parser(prog="gpu-node-agent", description="GPU data-plane node agent")
    parser.add_argument("--version", action="version", version=f"gpu-node-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="run the daemon")
    add_common(run)
    run.add_argument("--nats", action="append", help="NATS URL (repeatable); none: embedded nats-server")
    run.add_argument("--state-dir", help="spool, checkpoints, condition state, embedded NATS store")
    run.add_argument("--metrics-listen", help="HOST:PORT for /metrics and /healthz ('' disables)")
    run.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds")
    run.add_argument("--enforce", action="store_true", help="act (default: remediation is dry-run, audited only)")

    check = sub.add_parser("check", help="one pass of every collector, no NATS; exit 0/1/2",
                           description="One pass of every collector, no NATS: for Slurm prologs and init "
                           "containers. Exit 0 healthy, 1 warnings only, 2 anything critical (a GPU count below "
                           "--expected-gpus included), 66 the host root does not exist, 78 a config error. "
                           "What could not be looked at is listed as 'not seen' and does not change the exit code.")
    add_common(check)
    check.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    check.add_argument("--expected-gpus", type=positive_int, help="GPUs this node must have: fewer on the PCI bus "
                       "or in /dev is critical (overrides collectors.gpu_devices.expected_count)")

    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=Parser)
    cc = cfg_sub.add_parser("check", help="validate a config file: exit 0 valid, 78 invalid")
    cc.add_argument("file", help="the TOML file to validate")

    warm = sub.add_parser("warmup", help="warm a JuiceFS mount's configured dataset paths now")
    warm.add_argument("--mount", required=True, help="the JuiceFS mount point, as in the config")
    warm.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists)")
    warm.add_argument("--host-root", help="directory every host path is resolved under (default /)")

    run.set_defaults(handler=cmd_run)
    check.set_defaults(handler=cmd_check)
    cc.set_defaults(handler=cmd_config_check)
    warm.set_defaults(handler=cmd_warmup)
    add_topo_command(sub)
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
    first = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(with_commands=first not in NODE_COMMANDS).parse_args(argv)
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
