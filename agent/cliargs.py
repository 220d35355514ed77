"""What every command of ``gpu-node-agent`` shares: the parser class, argument types, option groups,
exit codes (sysexits(3)) and turning options into configuration.

Command sets outside the node runtime (``fleet``, ``sim``) add themselves through the
``gpu_node_agent.commands`` entry point group and build on this module, so the node side never
imports them.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

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
          "hyperscan": "fast-scan", "re2": "fast-scan", "grpc": "nvsentinel"}


USAGE_ERROR = "usage error: an unknown option or command, a missing or bad value"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with two changes: each line of a description or epilog is wrapped on its own (an
    "exit codes:" list stays a list, its rows indented under their text), and an option with a default
    value says it, "(default: X)", unless its help already says its default."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks: list[tuple[str, str, str]] = []  # (first line's indent, the others', the text)
        for line in text.strip("\n").splitlines():
            row = re.match(r"(\s+)(\d+\s+)?", line)  # "  64  usage error": the text hangs under itself
            if row:
                blocks.append((line[:row.end()], " " * row.end() if row.group(2) else row.group(1), line[row.end():]))
            elif line.strip() and blocks and blocks[-1][0] == "" and blocks[-1][2]:
                blocks[-1] = ("", "", f"{blocks[-1][2]} {line}")  # a hard-wrapped paragraph is one paragraph
            else:
                blocks.append(("", "", line))
        return "\n".join(textwrap.fill(" ".join(body.split()), width, initial_indent=indent + first,
                                        subsequent_indent=indent + rest, break_on_hyphens=False) if body.strip()
                         else "" for first, rest, body in blocks)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)  # a path or option stays whole

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)
                and not action.required and "default" not in text):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Every parser of the CLI. ``exit_codes`` ({code: meaning}) becomes the help's "exit codes:" section, 64
    (a usage error) added; an unknown option is the error of the (sub)command it was given to, with that
    command's usage, not the top level's."""

    def __init__(self, *args: Any, exit_codes: dict[int, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        if exit_codes is not None:
            codes = {EX_USAGE: USAGE_ERROR, **exit_codes}
            width = max(len(str(c)) for c in codes)
            rows = "\n".join(f"  {c:<{width}}  {codes[c]}" for c in sorted(codes))
            kwargs["epilog"] = "\n\n".join(filter(None, [kwargs.get("epilog"), f"exit codes:\n{rows}"]))
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # a subcommand's parser gets every argument after its name: none is left for another
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

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


def add_nats(p: argparse.ArgumentParser, *, state_dir: bool = True, nats_default: str | None = None) -> None:
    """The options every central command shares: where NATS is and how long to try reaching it.
    ``state_dir``: the command takes --state-dir (nats_servers() reads the agent's nats.url there);
    ``nats_default``: what --nats defaults to, where the command does not use nats_servers()."""
    where = "--state-dir" if state_dir else "the config's state_dir"
    default = nats_default or f"the config's nats.servers, else the embedded server of the agent in {where}"
    p.add_argument("--nats", action="append", help=f"NATS URL (repeatable; default: {default})")
    p.add_argument("--config", help=f"TOML config for NATS auth/TLS and names (default {configmod.DEFAULT_CONFIG_PATH} "
                   "when it exists)")
    if state_dir:
        p.add_argument("--state-dir", help="an agent's state directory: use its embedded server's URL (default: the "
                       "config's state_dir)")
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
