"""Command line: run, check, events, config check, demo. Exit codes follow sysexits(3)."""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["run"]:
    # The daemon never renders rich output, but structlog imports rich whenever it is installed
    # (it is, for `top`): blocking it keeps ~5 MiB out of every node agent's RSS.
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any, NoReturn

from agent import __version__
from agent import config as configmod
from agent.natsclient import EX_UNAVAILABLE, NatsUnavailable

EX_USAGE = 64
EX_NOINPUT = 66
EX_CONFIG = 78


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _add_nats(p: argparse.ArgumentParser, *, state_dir: bool = True) -> None:
    """The options every central command shares: where NATS is and how long to try reaching it."""
    p.add_argument("--nats", action="append", help="NATS URL (repeatable; default: the config's nats.servers, "
                   "else the embedded server of the agent in --state-dir)")
    p.add_argument("--config", help=f"TOML config for NATS auth/TLS and names (default {configmod.DEFAULT_CONFIG_PATH} "
                   "when it exists)")
    if state_dir:
        p.add_argument("--state-dir", help="an agent's state directory: use its embedded server's URL")
    p.add_argument("--connect-timeout", type=_positive_float, help="give up reaching NATS after this many seconds "
                   "and exit 69 (default: the config's nats.connect_timeout, 5)")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists)")
    p.add_argument("--node", help="node name (default: the config's, else the host root's etc/hostname, else "
                   "this machine's hostname)")
    p.add_argument("--host-root", help="directory every host path is resolved under (default /)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpu-node-agent", description="GPU data-plane node agent")
    parser.add_argument("--version", action="version", version=f"gpu-node-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run the daemon")
    _add_common(run)
    run.add_argument("--nats", action="append", help="NATS URL (repeatable); none: embedded nats-server")
    run.add_argument("--state-dir", help="spool, checkpoints, condition state, embedded NATS store")
    run.add_argument("--metrics-listen", help="HOST:PORT for /metrics and /healthz ('' disables)")
    run.add_argument("--duration", type=_positive_float, help="stop by itself after this many seconds")
    run.add_argument("--enforce", action="store_true", help="act (default: remediation is dry-run, audited only)")

    check = sub.add_parser("check", help="one pass of every collector, no NATS; exit 0/1/2",
                           description="One pass of every collector, no NATS: for Slurm prologs and init "
                           "containers. Exit 0 healthy, 1 warnings only, 2 anything critical (a GPU count below "
                           "--expected-gpus included), 66 the host root does not exist, 78 a config error. "
                           "What could not be looked at is listed as 'not seen' and does not change the exit code.")
    _add_common(check)
    check.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    check.add_argument("--expected-gpus", type=_positive_int, help="GPUs this node must have: fewer on the PCI bus "
                       "or in /dev is critical (overrides collectors.gpu_devices.expected_count)")

    ev = sub.add_parser("events", help="print fleet messages as JSON lines (history, or follow)",
                        description="Print the fleet's messages from the event stream, one JSON object a line. "
                        "Default: every stored message that matches, oldest first, then exit. --follow: then keep "
                        "printing new ones. --new: only new ones. Exit 0; 69 NATS unreachable; 78 config error.")
    _add_nats(ev)
    ev.add_argument("--node", help="only messages from this node")
    ev.add_argument("--collector", help="only messages from this collector (e.g. infiniband)")
    ev.add_argument("--severity", choices=["info", "warning", "critical"], help="only messages of this severity")
    mode = ev.add_mutually_exclusive_group()
    mode.add_argument("-f", "--follow", action="store_true", help="after the history, print new messages as they "
                      "arrive (until --count, --duration, a signal, or stdout's reader exits)")
    mode.add_argument("--new", action="store_true", help="skip the history: only messages from now on (follows)")
    mode.add_argument("--all", action="store_true", help="the whole history, then exit (the default; kept for "
                      "scripts)")
    ev.add_argument("--count", type=_positive_int, help="exit after exactly this many messages")
    ev.add_argument("--duration", type=_positive_float, help="exit after this many seconds, whatever happened")

    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    cc = cfg_sub.add_parser("check", help="validate a config file: exit 0 valid, 78 invalid")
    cc.add_argument("file", help="the TOML file to validate")

    budget = sub.add_parser("budget", help="the fleet-wide cordon budget")
    budget_sub = budget.add_subparsers(dest="budget_command", required=True, parser_class=_Parser)
    for verb, text in (("status", "print the budget (JSON): slots used, limit, window"),
                       ("reset", "free every slot, then print the budget")):
        b = budget_sub.add_parser(verb, help=text)
        _add_nats(b)

    warm = sub.add_parser("warmup", help="warm a JuiceFS mount's configured dataset paths now")
    warm.add_argument("--mount", required=True, help="the JuiceFS mount point, as in the config")
    warm.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists)")
    warm.add_argument("--host-root", help="directory every host path is resolved under (default /)")

    cord = sub.add_parser("cordoner", help="central cordoner: fleet messages -> remediation with cluster credentials")
    _add_nats(cord, state_dir=False)
    cord.add_argument("--enforce", action="store_true", help="act (default: dry-run, every decision audited)")
    cord.add_argument("--duration", type=_positive_float, help="stop by itself after this many seconds")

    dash = sub.add_parser("dashboard", help="central fleet dashboard (web, live over SSE)")
    _add_nats(dash)
    dash.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (port 0: any free port)")
    dash.add_argument("--history-hours", type=_positive_float, default=6.0,
                      help="how much of the stream's history to load at start (default 6)")
    dash.add_argument("--duration", type=_positive_float, help="stop by itself after this many seconds")
    dash.add_argument("--ready-file", help="write the URL here once listening")

    top = sub.add_parser("top", help="the fleet overview in the terminal")
    _add_nats(top)
    top.add_argument("--once", action="store_true", help="print one snapshot and exit (for scripts and pipes)")
    top.add_argument("--duration", type=_positive_float, help="stop by itself after this many seconds")
    top.add_argument("--search", default="", help="only nodes whose name contains this text")
    top.add_argument("--width", type=_positive_int, help="columns to render (default: the terminal's width; "
                     "piped: as wide as the content, nothing cut)")
    top.add_argument("--limit", type=_positive_int, default=40, help="rows to show, worst first (default 40)")

    demo = sub.add_parser("demo", help="agent + embedded NATS on a simulated GPU node, with scripted faults")
    demo.add_argument("--duration", type=_positive_float, default=30.0,
                      help="end the demo after this many seconds (default 30)")
    demo.add_argument("--workdir", help="keep the simulated nodes, state and logs here (default: a temporary "
                                        "directory, removed at the end)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    demo.add_argument("--nodes", type=int, default=8, help="simulated nodes, each a real agent process")
    demo.add_argument("--port", type=int, default=8080, help="dashboard port (0: any free port)")
    return parser


def _load_config(args: argparse.Namespace) -> configmod.Config:
    cfg = configmod.load(getattr(args, "config", None))
    a = cfg.agent
    if getattr(args, "node", None):
        a.node = args.node
    if getattr(args, "host_root", None):
        a.host_root = args.host_root
    if getattr(args, "state_dir", None):
        a.state_dir = args.state_dir
    if getattr(args, "nats", None):
        a.nats.servers = list(args.nats)
    if getattr(args, "metrics_listen", None) is not None:
        a.metrics.listen = args.metrics_listen
    if getattr(args, "enforce", False):
        a.remediations.enforce = True
    return cfg


def _nats_config(args: argparse.Namespace) -> configmod.NatsConfig:
    cfg = configmod.load(args.config).agent.nats
    if getattr(args, "connect_timeout", None):
        cfg.connect_timeout = args.connect_timeout
    return cfg


def cmd_budget(args: argparse.Namespace) -> int:
    from agent.natsclient import connect
    from remediations.budget import BudgetUnavailable, FleetBudget

    servers = _events_servers(args)
    cfg = configmod.load(args.config).agent
    ncfg = _nats_config(args)

    async def go() -> dict[str, Any]:
        nc = await connect(servers, cfg=ncfg, name="gpu-node-agent-budget", inbox="admin")
        try:
            b = cfg.remediations.budget
            budget = FleetBudget(nc.jetstream(), bucket=b.bucket, nodes_bucket=cfg.nats.kv_bucket,
                                 max_nodes=b.max_nodes, max_percent=b.max_percent, window=b.window)
            if args.budget_command == "reset":
                await budget.reset()
            return await budget.status()
        finally:
            await nc.close()

    try:
        print(json.dumps(asyncio.run(go()), indent=2))
    except BudgetUnavailable as exc:
        print(f"gpu-node-agent: the budget is unavailable: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    from agent.hostroot import HostRoot
    from remediations.loader import load_plugins

    cfg = _load_config(args).agent
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


def cmd_cordoner(args: argparse.Namespace) -> int:
    from agent.logsetup import configure
    from remediations.cordoner import run_cordoner

    cfg = configmod.load(args.config).agent
    if args.enforce:
        cfg.remediations.enforce = True
    configure(cfg.log.level, cfg.log.format)
    if args.connect_timeout:
        cfg.nats.connect_timeout = args.connect_timeout
    servers = list(args.nats or cfg.nats.servers)
    if not servers:
        raise configmod.ConfigError("the cordoner needs --nats or nats.servers")
    return asyncio.run(run_cordoner(cfg, servers, args.duration))


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("node", "host_root", "state_dir"):
        if getattr(args, key, None):
            out[key] = getattr(args, key)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load_config(args)
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

    cfg = _load_config(args)
    if (rc := _missing_host_root(cfg)) is not None:
        return rc
    if args.expected_gpus:
        gpu = cfg.collectors.get("gpu_devices")
        if gpu is None:
            from collectors.gpu_devices import GPUDevicesCollector

            gpu = cfg.collectors["gpu_devices"] = GPUDevicesCollector.config_type()
        gpu.expected_count = args.expected_gpus
    configure("error", cfg.agent.log.format)
    report = asyncio.run(run_check(cfg))
    print(render_json(report) if args.format == "json" else render_text(report))
    return exit_code(report)


def _events_servers(args: argparse.Namespace) -> list[str]:
    if args.nats:
        return list(args.nats)
    cfg = configmod.load(args.config)
    if cfg.agent.nats.servers:
        return list(cfg.agent.nats.servers)
    url_file = Path(args.state_dir or cfg.agent.state_dir) / "nats.url"
    if url_file.exists():
        return [url_file.read_text().strip()]
    raise configmod.ConfigError("no NATS URL: pass --nats, configure nats.servers, or --state-dir of an agent "
                                "running an embedded server")


def cmd_events(args: argparse.Namespace) -> int:
    import signal

    from agent.events import EventsQuery, quiet_broken_pipe, run_events
    from agent.logsetup import configure

    configure("error", "auto")  # stdout is the messages only; the skip summary goes to stderr

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    servers = _events_servers(args)
    q = EventsQuery(node=args.node, collector=args.collector, severity=args.severity, follow=args.follow,
                    new_only=args.new, count=args.count, duration=args.duration)
    signal.signal(signal.SIGTERM, interrupted)  # a pipeline's SIGTERM ends it like Ctrl-C: exit 0
    try:
        return asyncio.run(run_events(servers, q, _nats_config(args)))
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        quiet_broken_pipe()
        return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.file)
    print(f"{args.file}: valid ({len(cfg.collectors)} collectors)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from agent.demo import run_demo

    return run_demo(duration=args.duration, workdir=args.workdir, nodes=args.nodes, port=args.port,
                    keep=args.keep)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from agent.dashboard import serve
    from agent.logsetup import configure

    configure("info", "auto")
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        print(f"gpu-node-agent: --listen wants HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return EX_USAGE
    return asyncio.run(serve(_events_servers(args), host or "127.0.0.1", int(port), duration=args.duration,
                             ready_file=args.ready_file, history_s=args.history_hours * 3600,
                             nats_cfg=_nats_config(args)))


def cmd_top(args: argparse.Namespace) -> int:
    from agent.logsetup import configure
    from agent.top import run_top

    configure("error", "auto")
    return asyncio.run(run_top(_events_servers(args), once=args.once, duration=args.duration, q=args.search,
                               width=args.width, limit=args.limit, nats_cfg=_nats_config(args)))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"run": cmd_run, "check": cmd_check, "events": cmd_events, "demo": cmd_demo, "budget": cmd_budget,
                "warmup": cmd_warmup, "cordoner": cmd_cordoner, "dashboard": cmd_dashboard, "top": cmd_top}
    try:
        if args.command == "config":
            return cmd_config_check(args)
        return handlers[args.command](args)
    except configmod.ConfigError as exc:
        print(f"gpu-node-agent: configuration error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except NatsUnavailable as exc:
        print(f"gpu-node-agent: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE


if __name__ == "__main__":
    raise SystemExit(main())
