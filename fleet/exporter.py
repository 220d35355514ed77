"""`gpu-node-agent export cloudevents|otlp`: the fleet's events and conditions, as CloudEvents or OTLP logs
over HTTP.

A source -> transform -> sink pipeline with its checkpoint after the sink's acknowledgement (as Vector
does): a durable JetStream pull consumer on the events stream (``gna.events.>``; the jobs' membership and
the straggler vectors stay inside), each message decoded at the fleet's boundary (fleet/wire.py: the node
is its subject's, every field bounded; a refused one is terminated and counted, never exported), mapped
to a CloudEvent (fleet/cloudevents.py) or an OTLP log record (fleet/otlp_logs.py; always batched) and
POSTed; a message is acknowledged only after the receiver answered 2xx. At least once: a receiver that
dedupes on the message id (CloudEvents' ``source`` + ``id``, OTLP's ``gna.id``) sees each message once.

The receiver's answers (HTTP status, or none):

- 2xx: acknowledged (the consumer moves on);
- no answer (a timeout, a refused connection) and, for CloudEvents, 408, 429, 5xx; for OTLP, 429, 502,
  503, 504 (its specification's retryable statuses): retried with a doubling backoff (0.5 s to 30 s) and
  the messages kept in progress (``+WPI``), never redelivered to another fetch meanwhile; nothing is
  dropped however long the receiver is away;
- any other status (400, 413, 415, ...): that receiver refuses that content and would refuse it again.
  In batch mode the batch is split and re-sent one event at a time, so only what is refused is given up:
  terminated (``+TERM``), counted per status and logged with its id. A refusal never stalls the stream.

Several exporter processes may share the durable consumer (each takes what it fetches). Stopping
(SIGTERM) finishes the request in flight (bounded); what was fetched and not finished is handed back at
once (``-NAK``), and anything a killed process held is redelivered after the consumer's ack wait (60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from agent.config import NatsConfig
from fleet.cloudevents import (
    BATCH_CONTENT_TYPE,
    CONTENT_TYPE,
    DEFAULT_SOURCE_PREFIX,
    DEFAULT_TYPE_PREFIX,
    to_cloudevent,
)
from fleet.otlp_logs import CONTENT_TYPE as OTLP_CONTENT_TYPE
from fleet.otlp_logs import RETRY_STATUSES as OTLP_RETRY
from fleet.otlp_logs import logs_request
from fleet.wire import Rejected, decode_event
from gna_types.subjects import EVENTS_PREFIX, EXPORT_DURABLE

log = structlog.get_logger(__name__)

DURABLE = EXPORT_DURABLE  # fleet/nats_permissions.py Names.export_durable
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
ACK_WAIT_S = 60.0  # the server redelivers an unacknowledged message after this (kept in progress while retrying)
RETRY_STATUSES = frozenset({408, 429})  # and every 5xx
MAX_REFUSED_SAMPLES = 20
STATS_INTERVAL_S = 30.0  # s between `export_stats` lines
MAX_ANSWER = 64 * 1024  # bytes of a receiver's answer read before the connection is released


def redacted(url: str) -> str:
    """``url`` without its user and password (a token in the URL must not reach a log)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
        host = u.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{u.port}" if u.port else "")
        return urlunsplit((u.scheme, netloc, u.path, "", ""))
    except ValueError:
        return "<unparsable URL>"


@dataclass
class ExportSettings:
    url: str
    mode: str = "single"  # "single": one structured event a request; "batch": a JSON array a request
    batch: int = 64  # messages fetched (and, in batch mode, sent) at once
    concurrency: int = 8  # requests in flight at once in single mode
    timeout_s: float = 10.0  # one request
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization (read from a file by the CLI)
    source_prefix: str = DEFAULT_SOURCE_PREFIX
    type_prefix: str = DEFAULT_TYPE_PREFIX
    durable: str = DURABLE
    deliver_new: bool = False  # a new consumer starts at new messages (True) or at the stream's first (False)
    subject: str = f"{EVENTS_PREFIX}.>"
    format: str = "cloudevents"  # or "otlp": OTLP/HTTP JSON logs (fleet/otlp_logs.py), always batched


class Outcome:
    OK, RETRY, REFUSED = "ok", "retry", "refused"


def classify(status: int | None, fmt: str = "cloudevents") -> str:
    """A receiver's answer: None is no answer (a timeout, a refused connection). OTLP says which
    statuses are retried (429, 502, 503, 504; fleet/otlp_logs.py); for CloudEvents, 408, 429 and 5xx."""
    if status is None:
        return Outcome.RETRY
    if 200 <= status < 300:
        return Outcome.OK
    if fmt == "otlp":
        return Outcome.RETRY if status in OTLP_RETRY else Outcome.REFUSED
    return Outcome.RETRY if status in RETRY_STATUSES or status >= 500 else Outcome.REFUSED


class Codec:
    """How one format writes a request: of one message, or of several; and its event's id."""

    def __init__(self, s: ExportSettings) -> None:
        self.s = s
        self.batched = s.format == "otlp" or s.mode == "batch"

    def item(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.s.format == "otlp":
            return msg  # records are built per request (grouped by node)
        return to_cloudevent(msg, source_prefix=self.s.source_prefix, type_prefix=self.s.type_prefix)

    def one(self, item: dict[str, Any]) -> tuple[bytes, str]:
        return self.many([item]) if self.s.format == "otlp" else (_json(item), CONTENT_TYPE)

    def many(self, items: list[dict[str, Any]]) -> tuple[bytes, str]:
        if self.s.format == "otlp":
            return _json(logs_request(items, type_prefix=self.s.type_prefix)), OTLP_CONTENT_TYPE
        return _json(items), BATCH_CONTENT_TYPE


def _json(v: Any) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


class HttpSink:
    """POSTs CloudEvents (structured mode, or batched) with aiohttp (the `cloudevents` extra)."""

    def __init__(self, s: ExportSettings) -> None:
        import aiohttp  # the extra: a missing one is said by the CLI before anything connects

        self.s = s
        self.where = redacted(s.url)  # what logs say: never the URL's user or password
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.timeout_s),
                                              headers=s.headers)

    async def post(self, body: bytes, content_type: str) -> int | None:
        try:
            async with self._session.post(self.s.url, data=body, headers={"Content-Type": content_type},
                                          allow_redirects=False) as resp:
                await resp.content.read(MAX_ANSWER)  # what it says is not used: read a bounded part, close
                return resp.status
        except Exception as exc:  # a timeout, a refused connection, aiohttp.ClientError: no answer
            log.info("export_no_answer", url=self.where, error=type(exc).__name__)
            return None

    async def close(self) -> None:
        await self._session.close()


class CloudEventsExporter:
    def __init__(self, servers: list[str], settings: ExportSettings, *, nats_cfg: NatsConfig | None = None,
                 sink: Any = None) -> None:
        self.servers = servers
        self.s = settings
        self.nats_cfg = nats_cfg or NatsConfig()
        self.sink = sink
        self.nc: Any = None
        self.exported = 0
        self.retries = 0
        self.refused: Counter[int] = Counter()
        self.refused_ids: list[str] = []
        self.rejected: Counter[str] = Counter()  # refused at the fleet's boundary (fleet/wire.py)
        self.stopping = asyncio.Event()
        self.codec = Codec(settings)
        self._own_sink = False
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._held: dict[int, Any] = {}  # fetched, neither acknowledged nor terminated: id(msg) -> msg

    def stats(self) -> dict[str, Any]:
        return {"exported": self.exported, "retries": self.retries, "refused": dict(self.refused),
                "rejected": dict(self.rejected)}

    async def _subscribe(self) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        from agent.nats_link import ensure_stream, stream_configs

        js = self.nc.jetstream()
        await ensure_stream(js, stream_configs(self.nats_cfg)[0], create=False)
        return await js.pull_subscribe(
            self.s.subject, durable=self.s.durable, stream=self.nats_cfg.stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S,
                                  deliver_policy=DeliverPolicy.NEW if self.s.deliver_new else DeliverPolicy.ALL,
                                  max_ack_pending=max(4 * self.s.batch, 256)))

    async def start(self) -> None:
        """Connected, the consumer made, the loop running; raises what connecting raises (the CLI says it)."""
        from agent.natsclient import connect

        self.nc = await connect(self.servers, cfg=self.nats_cfg, name=f"gpu-node-agent-export/{self.s.durable}",
                                inbox="exporter")
        if self.sink is None:
            self.sink, self._own_sink = HttpSink(self.s), True
        self._sub = await self._subscribe()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="export:cloudevents")

    async def _loop(self) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        last_stats = time.monotonic()
        while not self.stopping.is_set():
            try:
                msgs = await self._sub.fetch(batch=self.s.batch, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                msgs = []
            except Exception as exc:  # reconnecting, no leader: the durable consumer waits for us
                log.info("export_fetch_retry", error=repr(exc)[:200])
                await asyncio.sleep(1.0)
                msgs = []
            if msgs:
                self._held.update((id(m), m) for m in msgs)
                await self.handle(msgs)
            if time.monotonic() - last_stats > STATS_INTERVAL_S:
                log.info("export_stats", **self.stats())
                last_stats = time.monotonic()

    async def stop(self, timeout: float = 15.0) -> None:
        """The request in flight finishes (bounded); what was not acknowledged is redelivered later."""
        self.stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except (TimeoutError, Exception):
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        # what this process fetched but did not finish goes back now, not after the consumer's ack wait
        held, self._held = list(self._held.values()), {}
        for m in held:
            await _quiet(m.nak())
        if self._own_sink and self.sink is not None:
            await self.sink.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        log.info("export_stopped", **self.stats())

    async def handle(self, msgs: list[Any]) -> None:
        """One fetched batch: decoded, sent until every message is acknowledged or refused."""
        codec = self.codec
        events: list[tuple[Any, dict[str, Any]]] = []
        for m in msgs:
            try:
                msg = decode_event(m.subject, m.data)
            except Rejected as exc:
                self.rejected[exc.reason] += 1
                log.warning("export_rejected", reason=exc.reason, subject=m.subject[:200], detail=str(exc)[:200])
                self._held.pop(id(m), None)
                await _quiet(m.term())
                continue
            events.append((m, codec.item(msg)))
        if not events:
            return
        if codec.batched:
            body, content_type = codec.many([ce for _m, ce in events])
            outcome, _status = await self._until_answered(body, content_type, [m for m, _ in events])
            if outcome == Outcome.OK:
                await self._ack(events)
                return
            # refused as a whole: one at a time, so only the events the receiver refuses are given up
        sem = asyncio.Semaphore(1 if codec.batched else self.s.concurrency)

        async def one(m: Any, ce: dict[str, Any]) -> None:
            async with sem:
                body, content_type = codec.one(ce)
                outcome, status = await self._until_answered(body, content_type, [m])
                if outcome == Outcome.OK:
                    await self._ack([(m, ce)])
                else:
                    await self._refuse(m, ce, status or 0)

        await asyncio.gather(*(one(m, ce) for m, ce in events))

    async def _until_answered(self, body: bytes, content_type: str, held: list[Any]) -> tuple[str, int | None]:
        """POST until the receiver accepts or refuses (never gives up on one that is away)."""
        delay = BACKOFF_MIN_S
        last_progress = time.monotonic()
        while True:
            status = await self.sink.post(body, content_type)
            outcome = classify(status, self.s.format)
            if outcome != Outcome.RETRY:
                return outcome, status
            self.retries += 1
            log.info("export_retry", status=status, in_s=round(delay, 2), events=len(held))
            if time.monotonic() - last_progress > ACK_WAIT_S / 3:  # still ours: not redelivered meanwhile
                for m in held:
                    await _quiet(m.in_progress())
                last_progress = time.monotonic()
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def _ack(self, events: list[tuple[Any, dict[str, Any]]]) -> None:
        for m, _ce in events:
            self._held.pop(id(m), None)
            await _quiet(m.ack())
        self.exported += len(events)

    async def _refuse(self, m: Any, ce: dict[str, Any], status: int) -> None:
        self.refused[status] += 1
        if len(self.refused_ids) < MAX_REFUSED_SAMPLES:
            self.refused_ids.append(str(ce["id"]))
        log.warning("export_refused", status=status, id=ce["id"], type=ce["type"],
                    source=ce.get("source") or ce.get("node"))
        self._held.pop(id(m), None)
        await _quiet(m.term())


async def _quiet(aw: Any) -> None:
    """An ack, term or progress on a connection that may be reconnecting: the server redelivers what
    it did not hear (at least once), so a failure here is not an error."""
    with contextlib.suppress(Exception):
        await aw
