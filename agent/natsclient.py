"""NATS for the command-line tools (events, top, budget, dashboard, cordoner).

A script calling them needs a contract: the first connection is bounded (``connect_timeout``, and
never past ``--duration``), an unreachable server is one line on stderr and exit 69, never a
traceback or a silent hang. Once connected, a long-running command reconnects for ever. The
config's auth and TLS settings apply, so credentials never have to go into a URL.

Liveness (#20): a lost server is reconnected to for ever, but nats-py closes a connection *for good*
-- no reconnect, only its ``closed_cb`` -- when the server answers with ``-ERR`` and hangs up (a
control line longer than ``max_control_line``, e.g. a KV key or subject built from a 5,000-character
job id; an authorization error). A process that stays up then is deaf. Every central service and
long-running command therefore watches its connections (``ConnectionWatch``) and exits
``EX_TEMPFAIL`` (75) when one closed for good while it was not stopping: systemd
(``Restart=always``) or Kubernetes (``restartPolicy: Always``) starts it again with a fresh
connection. 69 stays "could not connect at start"; 75 means "was connected, the connection died".
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from agent.config import NatsConfig
from gna_sdk.aio import within

if TYPE_CHECKING:
    from nats.aio.client import Client

EX_UNAVAILABLE = 69  # sysexits: the service (NATS) is unavailable
EX_TEMPFAIL = 75  # sysexits: temporary failure: a NATS connection closed for good; restart and retry
WATCH_POLL_S = 0.25  # how often a watch also looks at its clients' state (a close whose callback never ran)



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


class ConnectionWatch:
    """Whether this process's NATS connections are still alive: ``closed`` is set (with ``reason``)
    once any tracked client is closed for good while the process is not stopping.

    Wire a client in with ``closed_cb=watch.closed_cb(what)`` at connect time (``connect()`` does it)
    and/or ``watch.track(nc, what)`` after it (a client made elsewhere, e.g. agent.nats_link.NatsLink):
    a tracked client's state is also polled, so a close is noticed even without the callback. Before
    closing its connections on purpose, the process calls ``stop()`` (``run_until_closed_or_stopped``
    does it), so its own close is never taken for a failure.
    """

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.reason = ""
        self.stopping = False
        self.clients: list[tuple[str, Any]] = []

    def track(self, nc: Any, what: str) -> None:
        if all(c is not nc for _w, c in self.clients):
            self.clients.append((what, nc))

    def stop(self) -> None:
        self.stopping = True

    def lost(self, what: str, nc: Any = None) -> None:
        """``what``'s connection is closed for good (ignored once stopping)."""
        if self.stopping or self.closed.is_set():
            return
        err = getattr(nc, "last_error", None) if nc is not None else None
        self.reason = f"the NATS connection of {what} closed for good" + (f": {describe(err)}" if err else "")
        self.closed.set()

    def fail(self, reason: str) -> None:
        """A connection that lives but no longer serves (a consumer that cannot be re-created: see
        fleet/follow.py): the process exits 75 as for a closed one, and its restart resumes."""
        if self.stopping or self.closed.is_set():
            return
        self.reason = reason[:500]
        self.closed.set()

    def closed_cb(self, what: str, client: Callable[[], Any] | None = None) -> Callable[[], Awaitable[None]]:
        """A nats-py ``closed_cb``; ``client`` returns the client (for the server's last error)."""
        async def on_closed() -> None:
            self.lost(what, client() if client is not None else None)

        return on_closed

    def poll(self) -> bool:
        for what, nc in self.clients:
            if getattr(nc, "is_closed", False):
                self.lost(what, nc)
        return self.closed.is_set()

    async def wait(self) -> None:
        """Until a connection closed for good (returns) -- for ever while they live."""
        while not self.poll():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_POLL_S):
                    await self.closed.wait()


_current: ContextVar[ConnectionWatch | None] = ContextVar("gna_connection_watch", default=None)


def watching() -> ConnectionWatch:
    """This task's watch (inherited by the tasks it starts), made on first use: ``connect()`` calls
    without an explicit ``watch`` register with it, so a command sets it up once before it connects."""
    watch = _current.get()
    if watch is None:
        watch = ConnectionWatch()
        _current.set(watch)
    return watch


def say_closed(watch: ConnectionWatch) -> int:
    """The one line on stderr for a connection closed for good; the exit status (EX_TEMPFAIL)."""
    print(f"gpu-node-agent: {watch.reason or 'a NATS connection closed for good'}; exiting {EX_TEMPFAIL} "
          "so that the supervisor restarts it", file=sys.stderr, flush=True)
    return EX_TEMPFAIL


async def run_until_closed_or_stopped(watch: ConnectionWatch, duration: float | None) -> int:
    """What a central service awaits after its start: 0 on SIGTERM/SIGINT or after ``duration`` s;
    ``EX_TEMPFAIL`` (one line on stderr) as soon as a watched connection closed for good. Either way
    the watch is stopping afterwards, so the caller's own close is not a failure; the caller stops
    its service and returns the status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    closed = loop.create_task(watch.wait(), name="nats:watch")
    stopped = loop.create_task(stop.wait(), name="nats:stop")
    try:
        await asyncio.wait({closed, stopped}, timeout=duration, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (closed, stopped):
            t.cancel()
        await asyncio.gather(closed, stopped, return_exceptions=True)
    lost = watch.closed.is_set() and not stop.is_set()
    watch.stop()
    return say_closed(watch) if lost else 0


async def until_closed(command: Coroutine[Any, Any, int], watch: ConnectionWatch, *,
                       settle: float = 0.5, grace: float = 5.0) -> int:
    """Run a command that loops on its own (``top``, ``events --follow``) but stop it when a watched
    connection closes for good: it is cancelled (its ``finally`` blocks run, up to ``grace`` s) and
    the result is ``EX_TEMPFAIL``; otherwise the command's own status.

    A command that closes its own connection as it ends fires the watch too: one that then ends
    within ``settle`` s ended by itself (its status stands). One that fails (raises) while a watched
    connection is closed failed because of it: ``EX_TEMPFAIL`` too, not a traceback."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(command, name="command")
    closed = loop.create_task(watch.wait(), name="nats:watch")
    try:
        await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        lost_first = not task.done()  # the watch fired while the command still ran
        if lost_first:
            await asyncio.wait({task}, timeout=settle)
    finally:
        closed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closed
    if task.done():
        watch.stop()
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, (BrokenPipeError, KeyboardInterrupt)) and (
                lost_first or watch.closed.is_set() or watch.poll()):
            return say_closed(watch)  # it failed because its connection is gone
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait({task}, timeout=grace)
    watch.stop()
    return say_closed(watch)


async def connect(servers: list[str], *, cfg: NatsConfig | None = None, name: str = "gpu-node-agent-cli",
                  timeout: float | None = None, inbox: str = "reader", watch: ConnectionWatch | None = None) -> Client:
    """Connected client, or NatsUnavailable after ``timeout`` (default: the config's connect_timeout).

    ``watch`` (default: this task's ``watching()`` watch when one was set up) learns when the client
    is closed for good."""
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
    watch = watch if watch is not None else _current.get()
    made: list[Any] = []
    if watch is not None:
        opts["closed_cb"] = watch.closed_cb(name, lambda: made[0] if made else None)
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
    made.append(nc)
    if watch is not None:
        watch.track(nc, name)
    return nc
