"""NATS connection: auth/TLS options, reconnect forever, JetStream stream and KV bucket set-up.

Secrets (passwords, tokens, seeds) are never logged: only which auth method is in use.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import nats
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue

from agent.config import NatsConfig
from agent.metrics import AgentMetrics
from agent.natsclient import redact
from agent.subjects import ACTIONS_PREFIX, EVENTS_PREFIX, JOBS_PREFIX, SIGNALS_PREFIX
from gna_sdk.retry import Backoff

log = structlog.get_logger(__name__)

STREAM_SUBJECTS = [f"{EVENTS_PREFIX}.>", f"{ACTIONS_PREFIX}.>"]
JOBS_STREAM_SUBJECTS = [f"{JOBS_PREFIX}.>"]
SIGNALS_STREAM_SUBJECTS = [f"{SIGNALS_PREFIX}.>"]


def auth_method(cfg: NatsConfig) -> str:
    for name, value in (("creds", cfg.creds), ("nkey", cfg.nkey_seed), ("token", cfg.token),
                        ("user_password", cfg.user)):
        if value:
            return name
    return "none"


def connect_options(cfg: NatsConfig, servers: list[str], name: str, inbox: str = "reader") -> dict[str, Any]:
    """``inbox``: whose private reply inbox (``_INBOX_<inbox>``: a node's subject token or a central role),
    so NATS permissions can let each user read only its own replies (docs/nats-security.md)."""
    opts: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "inbox_prefix": cfg.inbox_prefix or f"_INBOX_{inbox}",
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,  # forever
        "reconnect_time_wait": 1,
        "connect_timeout": cfg.connect_timeout,
        "ping_interval": 10,
        "max_outstanding_pings": 3,
    }
    if cfg.tls_ca or cfg.tls_cert or any(s.startswith("tls://") for s in servers):
        ctx = ssl.create_default_context(cafile=cfg.tls_ca or None)
        if cfg.tls_cert:
            ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key or None)
        opts["tls"] = ctx
    if cfg.creds:
        opts["user_credentials"] = cfg.creds
    elif cfg.nkey_seed:
        opts["nkeys_seed"] = cfg.nkey_seed
    if cfg.token:
        opts["token"] = cfg.token
    if cfg.user:
        opts["user"] = cfg.user
        opts["password"] = cfg.password
    return opts


class NatsLink:
    def __init__(self, cfg: NatsConfig, servers: list[str], metrics: AgentMetrics, *, name: str,
                 inbox: str = "reader") -> None:
        self.cfg = cfg
        self.inbox = inbox
        self.servers = servers
        self.metrics = metrics
        self.name = name
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.stream_ready = False
        self.connected = asyncio.Event()
        self._kv: KeyValue | None = None

    async def _on_error(self, exc: Exception) -> None:
        log.warning("nats_error", error=repr(exc))

    async def _on_disconnected(self) -> None:
        self.connected.clear()
        self.metrics.nats_connected.set(0)
        log.warning("nats_disconnected")

    async def _on_reconnected(self) -> None:
        self.connected.set()
        self.metrics.nats_connected.set(1)
        self.stream_ready = False  # the server may be a new one: verify again
        url = self.nc.connected_url if self.nc else None
        log.info("nats_reconnected", server=url.netloc.rsplit("@", 1)[-1] if url else "")  # never the user info

    async def connect(self) -> None:
        """Connect, retrying with backoff until it works (the agent starts before NATS does)."""
        backoff = Backoff(0.5, 10.0)
        opts = connect_options(self.cfg, self.servers, self.name, self.inbox)
        log.info("nats_connecting", servers=[redact(s) for s in self.servers], auth=auth_method(self.cfg),
                 tls="tls" in opts)
        while True:
            try:
                self.nc = await nats.connect(
                    error_cb=self._on_error, disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected, **opts)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next()
                log.warning("nats_connect_failed", error=repr(exc), retry_in=delay)
                await asyncio.sleep(delay)
        self.js = self.nc.jetstream(timeout=self.cfg.publish_timeout,
                                    publish_async_max_pending=max(self.cfg.publish_window * 2, 64))
        self.connected.set()
        self.metrics.nats_connected.set(1)
        log.info("nats_connected")

    async def ensure_stream(self) -> None:
        if self.stream_ready:
            return
        assert self.js is not None
        want = StreamConfig(
            name=self.cfg.stream, subjects=STREAM_SUBJECTS, storage=StorageType.FILE,
            duplicate_window=self.cfg.duplicate_window, max_age=self.cfg.stream_max_age,
            max_bytes=self.cfg.stream_max_bytes, num_replicas=self.cfg.stream_replicas,
            discard=DiscardPolicy.OLD)
        jobs = StreamConfig(
            name=self.cfg.jobs_stream, subjects=JOBS_STREAM_SUBJECTS, storage=StorageType.FILE,
            duplicate_window=self.cfg.duplicate_window, max_age=self.cfg.jobs_stream_max_age,
            max_msgs_per_subject=self.cfg.jobs_max_per_subject, num_replicas=self.cfg.stream_replicas,
            discard=DiscardPolicy.OLD)
        signals = StreamConfig(
            name=self.cfg.signals_stream, subjects=SIGNALS_STREAM_SUBJECTS, storage=StorageType.FILE,
            duplicate_window=self.cfg.duplicate_window, max_age=self.cfg.signals_stream_max_age,
            max_msgs_per_subject=self.cfg.signals_max_per_subject, num_replicas=self.cfg.stream_replicas,
            discard=DiscardPolicy.OLD)
        for config in (want, jobs, signals):
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                # Exists with other settings (an operator tuned it): accept it if it covers our subjects.
                info = await self.js.stream_info(str(config.name))
                missing = [s for s in config.subjects or [] if s not in (info.config.subjects or [])]
                if missing:
                    raise RuntimeError(f"stream {config.name} exists without subjects {missing}") from None
                log.info("stream_verified", stream=config.name)
        self.stream_ready = True

    async def kv(self) -> KeyValue:
        assert self.js is not None
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.cfg.kv_bucket)
            except (NotFoundError, BadRequestError):
                self._kv = await self.js.create_key_value(bucket=self.cfg.kv_bucket, history=1,
                                                          replicas=self.cfg.stream_replicas)
        return self._kv

    async def close(self) -> None:
        if self.nc and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), 2)
            except Exception:
                await self.nc.close()
