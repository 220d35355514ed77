"""What every command of ``gpu-node-agent`` shares: the parser class, argument types, option groups,
exit codes (sysexits(3)) and turning options into configuration.

Command sets outside the node runtime (``fleet``, ``sim``) add themselves through the
``gpu_node_agent.commands`` entry point group and build on this module, so the node side never
imports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from agent import config as configmod
from agent.natsclient import EX_UNAVAILABLE as EX_UNAVAILABLE  # also: an optional extra is missing

EX_USAGE = 64
EX_NOINPUT = 66
EX_CONFIG = 78

Handler = Callable[[argparse.Namespace], int]
# An entry point of the group: adds its subcommands, each with set_defaults(handler=...).
AddCommands = Callable[["argparse._SubParsersAction[Parser]"], None]

# Modules only some installs carry, and the extra that brings each.
EXTRAS = {"aiohttp": "fleet", "rich": "fleet", "lightkube": "kubernetes",
          "hyperscan": "fast-scan", "re2": "fast-scan"}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def add_nats(p: argparse.ArgumentParser, *, state_dir: bool = True) -> None:
    """The options every central command shares: where NATS is and how long to try reaching it."""
    p.add_argument("--nats", action="append", help="NATS URL (repeatable; default: the config's nats.servers, "
                   "else the embedded server of the agent in --state-dir)")
    p.add_argument("--config", help=f"TOML config for NATS auth/TLS and names (default {configmod.DEFAULT_CONFIG_PATH} "
                   "when it exists)")
    if state_dir:
        p.add_argument("--state-dir", help="an agent's state directory: use its embedded server's URL")
    p.add_argument("--connect-timeout", type=positive_float, help="give up reaching NATS after this many seconds "
                   "and exit 69 (default: the config's nats.connect_timeout, 5)")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists)")
    p.add_argument("--node", help="node name (default: the config's, else the host root's etc/hostname, else "
                   "this machine's hostname)")
    p.add_argument("--host-root", help="directory every host path is resolved under (default /)")


def load_config(args: argparse.Namespace) -> configmod.Config:
    """The config file with the command line's overrides applied."""
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


def nats_config(args: argparse.Namespace) -> configmod.NatsConfig:
    cfg = configmod.load(args.config).agent.nats
    if getattr(args, "connect_timeout", None):
        cfg.connect_timeout = args.connect_timeout
    return cfg


def nats_servers(args: argparse.Namespace) -> list[str]:
    """--nats, else the config's servers, else the embedded server of the agent in --state-dir."""
    if args.nats:
        return list(args.nats)
    cfg = configmod.load(args.config)
    if cfg.agent.nats.servers:
        return list(cfg.agent.nats.servers)
    url_file = Path(getattr(args, "state_dir", None) or cfg.agent.state_dir) / "nats.url"
    if url_file.exists():
        return [url_file.read_text().strip()]
    raise configmod.ConfigError("no NATS URL: pass --nats, configure nats.servers, or --state-dir of an agent "
                                "running an embedded server")


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra to install for a module this install lacks, or None when it is no optional part."""
    return EXTRAS.get((exc.name or "").split(".")[0])
