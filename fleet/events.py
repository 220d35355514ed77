"""`gpu-node-agent events`: the fleet's messages from the GNA_EVENTS stream, one JSON object a line.

Modes (a script can rely on them):

- history (default): every stored message that matches the filters, oldest first, then exit 0;
- ``--follow``: the history, then new messages as they arrive;
- ``--new``: only messages that arrive from now on (implies follow).

A follower stops at ``--count`` messages, at ``--duration`` seconds, on SIGINT/SIGTERM, or when the
reader of its standard output goes away (``events -f | head`` returns even on a quiet fleet).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
import time
from dataclasses import dataclass
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from agent.config import NatsConfig
from agent.nats_link import StreamMissing, ensure_stream, stream_configs
from agent.natsclient import connect
from fleet.wire import Rejected, Rejections, decode_event
from gna_sdk import plural
from gna_types.subjects import events_filter

FETCH_WAIT_S = 0.5  # how long one fetch waits for new messages: the follower's reaction time


@dataclass
class EventsQuery:
    node: str | None = None
    job: str | None = None  # only messages about this job: its commId (details.job) or its name (details.job_name)
    collector: str | None = None
    severity: str | None = None
    follow: bool = False
    new_only: bool = False
    count: int | None = None
    duration: float | None = None


def stdout_reader_gone(fd: int) -> bool:
    """True once the read end of a pipe on ``fd`` is closed (POLLERR), without writing to it."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))


class _Done(Exception):
    pass


class _Printer:
    def __init__(self, count: int | None, job: str | None = None) -> None:
        self.count = count
        self.job = job
        self.printed = 0
        self.rejections = Rejections(who="events")

    def summary(self) -> None:
        if self.rejections.total():
            reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.rejections.counts.items()))
            n = self.rejections.total()
            print(f"gpu-node-agent: skipped {plural(n, 'message')} that failed validation ({reasons})",
                  file=sys.stderr)

    def write(self, subject: str, data: bytes) -> None:
        if self.count is not None and self.printed >= self.count:
            raise _Done
        try:
            msg = decode_event(subject, data)
        except Rejected as exc:
            # stdout carries only valid messages (a pipe into jq or a script); a spoofed or damaged one
            # is counted and summarised on stderr, and its bytes (terminal escapes) never printed raw
            self.rejections.record(exc.reason, subject, data, str(exc))
            return
        details = msg.get("details") or {}
        if self.job is not None and self.job not in (details.get("job"), details.get("job_name")):
            return
        sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
        sys.stdout.flush()
        self.printed += 1
        if self.count is not None and self.printed >= self.count:
            raise _Done


async def run_events(servers: list[str], q: EventsQuery, cfg: NatsConfig) -> int:
    start = time.monotonic()
    deadline = None if q.duration is None else start + q.duration

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    timeout = cfg.connect_timeout if deadline is None else min(cfg.connect_timeout, left() or 0.0)
    nc = await connect(servers, cfg=cfg, name="gpu-node-agent-events", timeout=timeout)
    out = _Printer(q.count, q.job)
    try:
        await _stream(nc, q, cfg, out, left)
    except _Done:
        pass
    finally:
        out.summary()
        await nc.close()
    return 0


async def _stream(nc: Any, q: EventsQuery, cfg: NatsConfig, out: _Printer, left: Any) -> None:
    js = nc.jetstream()
    follow = q.follow or q.new_only
    subject = events_filter(q.node, q.collector, q.severity)
    policy = DeliverPolicy.NEW if q.new_only else DeliverPolicy.ALL
    config = ConsumerConfig(deliver_policy=policy, ack_policy=AckPolicy.NONE, inactive_threshold=30.0)
    said_waiting = False
    while True:
        try:
            await ensure_stream(js, stream_configs(cfg)[0], create=False)  # StreamRefused: foreign settings
            sub = await js.pull_subscribe(subject, durable=None, stream=cfg.stream, config=config)
            break
        except (NotFoundError, StreamMissing):
            if not follow:
                print(f"gpu-node-agent: no stream {cfg.stream} yet: no agent has published to this NATS",
                      file=sys.stderr)
                return
            if not said_waiting:
                print(f"gpu-node-agent: waiting for stream {cfg.stream} (no agent has published yet)",
                      file=sys.stderr, flush=True)
                said_waiting = True
            if not await _pause(1.0, left):
                return
    pending = (await sub.consumer_info()).num_pending
    while True:
        if not follow and pending == 0:
            return  # the end of the history
        if stdout_reader_gone(sys.stdout.fileno()):
            return
        wait = FETCH_WAIT_S if (remaining := left()) is None else min(FETCH_WAIT_S, remaining)
        if wait <= 0:
            return
        try:
            msgs = await sub.fetch(batch=256, timeout=wait)
        except (nats.errors.TimeoutError, TimeoutError):
            if not follow:
                pending = (await sub.consumer_info()).num_pending
            continue
        for m in msgs:
            out.write(m.subject, m.data)
            pending = m.metadata.num_pending


async def _pause(seconds: float, left: Any) -> bool:
    remaining = left()
    if remaining is not None and remaining <= 0:
        return False
    await asyncio.sleep(seconds if remaining is None else min(seconds, remaining))
    return True


def quiet_broken_pipe() -> None:
    """stdout's reader left: point fd 1 at /dev/null so the interpreter's final flush stays silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
