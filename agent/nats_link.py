"""NATS connection: auth/TLS options, reconnect forever, JetStream streams and KV buckets: created or verified.

Secrets (passwords, tokens, seeds) are never logged: only which auth method is in use.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import nats
import structlog
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, StorageType, StreamConfig, StreamInfo, SubjectTransform
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from agent.config import NatsConfig
from agent.metrics import AgentMetrics
from agent.natsclient import NatsUnavailable, describe, redact
from gna_sdk.retry import Backoff
from gna_types.subjects import ACTIONS_PREFIX, EVENTS_PREFIX, JOBS_PREFIX, JOBS_TRANSFORM, SIGNALS_PREFIX

log = structlog.get_logger(__name__)

STREAM_SUBJECTS = [f"{EVENTS_PREFIX}.>", f"{ACTIONS_PREFIX}.>"]
JOBS_STREAM_SUBJECTS = [f"{JOBS_PREFIX}.>"]
# every job subject stored with its bucket first (gna_types/subjects.py JOBS_TRANSFORM): partitioned readers
JOBS_STREAM_TRANSFORM = SubjectTransform(src=JOBS_TRANSFORM[0], dest=JOBS_TRANSFORM[1])
SIGNALS_STREAM_SUBJECTS = [f"{SIGNALS_PREFIX}.>"]
CREATE_RETRY_S = 60.0  # a refused creation is asked for again only after this long (each one is a server violation)


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


class StreamRefused(NatsUnavailable):
    """A stream or bucket exists carrying settings this code did not ask for: never used (docs/nats-security.md).
    A NatsUnavailable: a command that meets one says why on one line and exits 69 (agent/cli.py main)."""


class StreamMissing(NatsUnavailable):
    """A stream or bucket does not exist and this connection did not (or may not) create it (exit 69 as well:
    a central service's supervisor starts it again, and it works once the admin ran `nats setup`)."""


# StreamConfig fields (nats-py, .venv/lib/python3.11/site-packages/nats/js/api.py, class StreamConfig; the server's
# JSON of the same names: https://docs.nats.io/nats-concepts/jetstream/streams#configuration) that move or make
# messages on subjects the publisher's own permissions never allowed: ``republish`` re-publishes every stored message
# on another subject (a stream listening there stores it: node A's signal becomes "node B's" event), ``mirror``
# and ``sources`` fill the stream from elsewhere, ``subject_transform`` rewrites the stored subject,
# ``allow_msg_schedules`` lets a publisher schedule a message onto another subject of the stream, and
# ``allow_rollup_hdrs`` lets one publisher's ``Nats-Rollup: all`` purge everyone's history. Present on an existing
# stream but not in what the code asked for: the stream is refused, loudly.
FOREIGN_SETTINGS = ("republish", "mirror", "sources", "subject_transform", "allow_msg_schedules", "allow_rollup_hdrs")


def _describe(field: str, value: Any) -> str:
    if field == "republish":
        return f"republish {getattr(value, 'src', None) or '>'} -> {getattr(value, 'dest', None)}"
    if field == "mirror":
        return f"mirror of {getattr(value, 'name', '?')}"
    if field == "sources":
        return "sources " + ", ".join(str(getattr(v, "name", "?")) for v in value)
    if field == "subject_transform":
        return f"subject_transform {getattr(value, 'src', None)} -> {getattr(value, 'dest', None)}"
    return f"{field} enabled"


def foreign_settings(have: StreamConfig, want: StreamConfig) -> list[str]:
    """What ``have`` (an existing stream's config) carries that ``want`` did not ask for, in words; [] when none."""
    out = [_describe(f, getattr(have, f, None)) for f in FOREIGN_SETTINGS
           if getattr(have, f, None) and not getattr(want, f, None)]
    if want.subject_transform is not None and have.subject_transform is not None and (
            (have.subject_transform.src, have.subject_transform.dest)
            != (want.subject_transform.src, want.subject_transform.dest)):
        out.append(_describe("subject_transform", have.subject_transform))  # ours is one exact rewrite
    if want.subject_transform is not None and have.subject_transform is None:
        out.append(MISSING_TRANSFORM)
    wanted = want.subjects or []
    subjects = have.subjects or []
    if extra := [s for s in subjects if s not in wanted]:
        out.append(f"extra subjects {extra}")
    if missing := [s for s in wanted if s not in subjects]:
        out.append(f"without subjects {missing}")
    return out


# the jobs stream's bucket transform (gna_types/subjects.py JOBS_TRANSFORM) absent: a stream made before issue 21's
# partitioned reading; ``ensure_stream`` adds it in place where this connection may update the stream
MISSING_TRANSFORM = "without its subject_transform (the jobs' partition buckets)"


def verify_stream(info: StreamInfo, want: StreamConfig, *, what: str = "") -> None:
    """Raise ``StreamRefused`` naming the stream and each foreign setting when ``info`` is not the stream ``want``
    describes (operator tuning such as ``max_age``, ``max_bytes`` or replicas is accepted)."""
    found = foreign_settings(info.config, want)
    if found == [MISSING_TRANSFORM]:
        raise StreamRefused(f"{what or f'stream {want.name}'} exists {MISSING_TRANSFORM}: an admin runs "
                            "`gpu-node-agent nats setup`, which adds it in place (docs/subjects.md)")
    if found:
        raise StreamRefused(f"{what or f'stream {want.name}'} exists with settings gna did not ask for: "
                            f"{'; '.join(found)}; "
                            "an admin must inspect it (nats stream info), delete it and run `gpu-node-agent nats "
                            "setup` (docs/nats-security.md)")


def stream_configs(cfg: NatsConfig) -> list[StreamConfig]:
    """The three streams, as `gpu-node-agent nats setup` and ``NatsLink.ensure_stream`` create them."""
    return [
        StreamConfig(name=cfg.stream, subjects=STREAM_SUBJECTS, storage=StorageType.FILE,
                     duplicate_window=cfg.duplicate_window, max_age=cfg.stream_max_age,
                     max_bytes=cfg.stream_max_bytes, num_replicas=cfg.stream_replicas, discard=DiscardPolicy.OLD),
        StreamConfig(name=cfg.jobs_stream, subjects=JOBS_STREAM_SUBJECTS, storage=StorageType.FILE,
                     duplicate_window=cfg.duplicate_window, max_age=cfg.jobs_stream_max_age,
                     max_msgs_per_subject=cfg.jobs_max_per_subject, num_replicas=cfg.stream_replicas,
                     discard=DiscardPolicy.OLD,
                     subject_transform=JOBS_STREAM_TRANSFORM),
        StreamConfig(name=cfg.signals_stream, subjects=SIGNALS_STREAM_SUBJECTS, storage=StorageType.FILE,
                     duplicate_window=cfg.duplicate_window, max_age=cfg.signals_stream_max_age,
                     max_msgs_per_subject=cfg.signals_max_per_subject, num_replicas=cfg.stream_replicas,
                     discard=DiscardPolicy.OLD),
    ]


def _not_created(what: str, why: str = "") -> StreamMissing:
    return StreamMissing(f"{what} does not exist{why}: an admin creates every stream and bucket with "
                         "`gpu-node-agent nats setup` (docs/nats-security.md)")


def _no_answer(stream: str) -> str:
    # a request the server's permissions refuse gets no reply at all, only a timeout (and a server log line)
    return f" and this connection may not create it (no answer to $JS.API.STREAM.CREATE.{stream})"


SUBJECTS_OVERLAP = 10065  # nats-server's JSStreamSubjectOverlapErr (server/errors.json): another stream holds them


async def _info_after_refusal(js: JetStreamContext, name: str, exc: APIError) -> StreamInfo:
    """The server refused a creation: the stream exists now (raced), or it cannot be created: its subjects overlap
    another stream's, which then captures what was meant for it (refused), or the settings do not fit the server
    (replicas beyond the cluster's size...: missing, with the server's reason)."""
    try:
        return await js.stream_info(name)
    except NotFoundError:
        why = exc.description or repr(exc)
        if exc.err_code == SUBJECTS_OVERLAP:
            raise StreamRefused(f"stream {name} cannot be created: {why}: another stream holds its subjects; an admin "
                                "must inspect the account's streams (nats stream ls; docs/nats-security.md)") from None
        raise StreamMissing(f"stream {name} does not exist and the server refused to create it: {why}") from None


async def _add_transform(js: JetStreamContext, info: StreamInfo, want: StreamConfig) -> StreamInfo:
    """A stream made before its transform was asked for gets it in place (nothing else of the operator's settings
    changes; messages stored before keep their subjects and are not read by partitioned readers). Refused or
    unanswered (a node's permissions do not allow updates): the stream as it was, refused by the caller."""
    cfg = info.config
    cfg.subject_transform = want.subject_transform
    try:
        updated = await js.update_stream(cfg)
    except (APIError, TimeoutError, NoRespondersError) as exc:
        log.warning("stream_transform_not_added", stream=str(want.name), error=repr(exc)[:300])
        return info
    log.info("stream_transform_added", stream=str(want.name))
    return updated


async def ensure_stream(js: JetStreamContext, want: StreamConfig, *, create: bool = True) -> str:
    """``want`` exists and is verified: "verified" (it existed) or "created" (``create`` and this connection may).

    ``StreamRefused``: it exists with a foreign setting. ``StreamMissing``: it does not exist and ``create`` is off,
    or the server gave no answer to the creation (a permission refusal is silent: no reply, a timeout)."""
    name = str(want.name)
    try:
        info = await js.stream_info(name)
        if create and foreign_settings(info.config, want) == [MISSING_TRANSFORM]:
            info = await _add_transform(js, info, want)
        verify_stream(info, want)
        return "verified"
    except NotFoundError:
        if not create:
            raise _not_created(f"stream {name}") from None
    try:
        info = await js.add_stream(want)
    except APIError as exc:  # BadRequestError (400), or ServerError (500: the overlap, from older servers)
        # created meanwhile by someone else (another replica, the admin): verify that one like any other
        verify_stream(await _info_after_refusal(js, name, exc), want)
        return "verified"
    except (TimeoutError, NoRespondersError):
        raise _not_created(f"stream {name}", _no_answer(name)) from None
    verify_stream(info, want)
    return "created"


async def await_stream(js: JetStreamContext, want: StreamConfig, *, create: bool = False,
                       interval: float = 2.0) -> str:
    """``ensure_stream`` until it exists: for a reader of a stream (the correlator, the views) that starts before
    the admin step or the first agent made it. A missing stream is logged once, loudly, then waited for; a
    refused one (``StreamRefused``) is raised at once: nothing is read from a stream carrying foreign settings."""
    said = False
    while True:
        try:
            return await ensure_stream(js, want, create=create)
        except StreamMissing as exc:
            if not said:
                log.error("stream_missing", stream=want.name, error=str(exc), waiting=True)
                said = True
        await asyncio.sleep(interval)


def kv_stream_config(bucket: str) -> StreamConfig:
    """What a KV bucket's backing stream must look like (nats-py ``create_key_value``, js/client.py: subjects
    ``$KV.<bucket>.>``, rollups on: a KV purge is a rollup of one key; nothing else)."""
    return StreamConfig(name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_rollup_hdrs=True)


async def open_kv(js: JetStreamContext, bucket: str, *, create_with: KeyValueConfig | None = None) -> KeyValue:
    """The bucket after its backing stream ``KV_<bucket>`` was verified (``verify_stream``); created from
    ``create_with`` when missing and given (and this connection may), else ``StreamMissing``."""
    want = kv_stream_config(bucket)
    try:
        info = await js.stream_info(str(want.name))
    except NotFoundError:
        if create_with is None:
            raise _not_created(f"bucket {bucket} (stream {want.name})") from None
        try:
            await js.create_key_value(create_with)
            info = await js.stream_info(str(want.name))
        except APIError as exc:  # created meanwhile: verified below like any other
            info = await _info_after_refusal(js, str(want.name), exc)
        except (TimeoutError, NoRespondersError):
            raise _not_created(f"bucket {bucket} (stream {want.name})", _no_answer(str(want.name))) from None
    verify_stream(info, want, what=f"bucket {bucket} (stream {want.name})")
    if info.config.max_msgs_per_subject < 1:  # nats-py's own check in key_value(): not a KV bucket
        raise StreamRefused(f"bucket {bucket}: stream {want.name} keeps no history per key: not a KV bucket")
    # the object js.key_value() returns, without asking for the stream info a second time (nats/js/kv.py)
    return KeyValue(name=bucket, stream=str(want.name), pre=f"$KV.{bucket}.", js=js,
                    direct=bool(info.config.allow_direct))


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
        # when the server last refused to create a missing stream or bucket (no permission: nodes under the
        # shipped layout; or no answer in time): for CREATE_RETRY_S a missing one is reported without asking again
        self._create_refused: float | None = None
        # why the last attempt failed, for a one-line "cannot reach" (the cordoner's start): the server's own
        # -ERR ("nats: 'Authorization Violation'") is kept over the socket error that follows it
        self.last_error = ""

    def _note(self, exc: BaseException) -> None:
        text = describe(exc)
        if text.startswith("nats: '") or not self.last_error.startswith("nats: '"):
            self.last_error = text

    @property
    def may_create(self) -> bool:
        refused = self._create_refused
        return refused is None or time.monotonic() - refused >= CREATE_RETRY_S

    def _refused(self) -> None:
        if self.may_create:
            self._create_refused = time.monotonic()

    async def _on_error(self, exc: Exception) -> None:
        self._note(exc)
        log.warning("nats_error", error=repr(exc))

    async def _on_disconnected(self) -> None:
        self.connected.clear()
        self.metrics.nats_connected.set(0)
        log.warning("nats_disconnected")

    async def _on_reconnected(self) -> None:
        self.connected.set()
        self.metrics.nats_connected.set(1)
        self.stream_ready = False  # the server may be a new one: verify again
        self._create_refused = None
        self._kv = None  # and open (verify) the bucket again
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
                self._note(exc)
                delay = backoff.next()
                log.warning("nats_connect_failed", error=repr(exc), retry_in=delay)
                await asyncio.sleep(delay)
        self.js = self.nc.jetstream(timeout=self.cfg.publish_timeout,
                                    publish_async_max_pending=max(self.cfg.publish_window * 2, 64))
        self.connected.set()
        self.metrics.nats_connected.set(1)
        log.info("nats_connected")

    async def ensure_stream(self) -> None:
        """Every stream this agent publishes to exists and carries nothing it did not ask for.

        An existing stream is always verified (``verify_stream``); a missing one is created only where this
        connection may (a bare dev/test server, the demo). Under the shipped layout nodes may not: the admin
        creates every stream (``gpu-node-agent nats setup``) and a missing one raises ``StreamMissing`` after a
        loud log line, the forwarder retries with backoff and the spool keeps the events meanwhile."""
        if self.stream_ready:
            return
        assert self.js is not None
        for want in stream_configs(self.cfg):
            await self._ensure(want)
        self.stream_ready = True

    async def _ensure(self, want: StreamConfig) -> None:
        assert self.js is not None
        try:
            await ensure_stream(self.js, want, create=self.may_create)
        except StreamMissing as exc:
            self._refused()
            log.error("stream_missing", stream=want.name, error=str(exc))
            raise
        except StreamRefused as exc:
            log.error("stream_refused", stream=want.name, error=str(exc))
            raise

    async def kv(self) -> KeyValue:
        """The nodes bucket, verified (``open_kv``); created only where this connection may."""
        assert self.js is not None
        if self._kv is None:
            create = KeyValueConfig(bucket=self.cfg.kv_bucket, history=1, replicas=self.cfg.stream_replicas)
            try:
                self._kv = await open_kv(self.js, self.cfg.kv_bucket, create_with=create if self.may_create else None)
            except StreamMissing as exc:
                self._refused()
                log.error("bucket_missing", bucket=self.cfg.kv_bucket, error=str(exc))
                raise
            except StreamRefused as exc:
                log.error("bucket_refused", bucket=self.cfg.kv_bucket, error=str(exc))
                raise
        return self._kv

    async def close(self) -> None:
        if self.nc and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), 2)
            except Exception:
                await self.nc.close()
