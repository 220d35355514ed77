"""NATS for the command-line tools (events, top, budget, dashboard, cordoner).

A script calling them needs a contract: the first connection is bounded (``connect_timeout``, and
never past ``--duration``), an unreachable server is one line on stderr and exit 69, never a
traceback or a silent hang. Once connected, a long-running command reconnects for ever. The
config's auth and TLS settings apply, so credentials never have to go into a URL.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from agent.config import NatsConfig
from gna_sdk.aio import within

if TYPE_CHECKING:
    from nats.aio.client import Client

EX_UNAVAILABLE = 69  # sysexits: the service (NATS) is unavailable


class NatsUnavailable(Exception):
    """The first connection failed within its bound; ``str()`` is the one line shown to the user."""


def redact(url: str) -> str:
    """A URL safe to print: user information (``user:password@``, a token) is replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


async def connect(servers: list[str], *, cfg: NatsConfig | None = None, name: str = "gpu-node-agent-cli",
                  timeout: float | None = None, inbox: str = "reader") -> Client:
    """Connected client, or NatsUnavailable after ``timeout`` (default: the config's connect_timeout)."""
    import nats  # here: `check` and `run` load the CLI without needing this module's NATS client

    from agent.nats_link import connect_options

    cfg = cfg or NatsConfig()
    bound = cfg.connect_timeout if timeout is None else timeout
    errors: list[str] = []
    connected = False

    async def on_error(exc: Exception) -> None:
        # Before the first connection, errors are gathered for the one line; after it, a lost
        # server is worth a line on stderr (the command reconnects on its own).
        if connected:
            print(f"gpu-node-agent: nats: {describe(exc)} (reconnecting)", file=sys.stderr, flush=True)
        else:
            errors.append(describe(exc))

    opts: dict[str, Any] = connect_options(cfg, servers, name, inbox)
    opts["connect_timeout"] = max(0.1, min(float(opts["connect_timeout"]), bound))
    try:
        nc = await within(nats.connect(error_cb=on_error, **opts), bound)
    except Exception as exc:  # TimeoutError, OSError, nats errors, ssl errors: all mean "unreachable"
        # the server's own -ERR ("nats: 'Authorization Violation'") says why; the socket error that
        # follows it as the server hangs up ("Connection reset by peer") does not
        said = [e for e in errors if e.startswith("nats: '")]
        reason = (said or errors or [describe(exc)])[-1]
        where = ", ".join(redact(s) for s in servers)
        raise NatsUnavailable(f"cannot reach NATS at {where} within {bound:g} s: {reason}") from None
    connected = True
    return nc
