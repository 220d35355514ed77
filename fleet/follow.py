"""Following a stream through its own cluster's failures: ordered consumers resumed by sequence.

Every central service that reads a stream (the correlator's replicas, the dashboard's feed) follows it
with a ``Follower``: an ordered push consumer that starts at a stream *sequence*, never at a start time.
nats-py (2.16) re-creates an ordered consumer after a gap or a missed heartbeat by copying the original
request and setting a start sequence on it; a request that also carried ``opt_start_time`` is refused by
the server ("deliver by start sequence, but optional start time is also set"; the same bug was fixed in
nats.go #1341 and nats.net #424), and the error only reaches the connection's error callback: the
subscription is silently deaf. So a start time is resolved to a sequence once, here (a binary search
over ``STREAM.MSG.GET`` with ``next_by_subj``), and the consumer is created by sequence only.

Even by sequence, a re-creation can fail (the stream has no leader during an election) and nats-py does
not retry it until its heartbeat check fires again. The follower therefore watches its consumer
(``CONSUMER.INFO`` every ``check_s``, answered within ``check_s``): a consumer the server no longer
knows, one nobody answers for while it delivers nothing, or one with messages pending that delivers
nothing, is replaced by a new one starting after the last sequence handed on. Messages are handed on
at most once each, in stream order (a sequence at or below the last one is a duplicate of a reset and is
dropped, counted). A follower that cannot get a consumer for ``fail_s`` calls ``on_fail`` (the services exit
75: their supervisor restarts them, and a restart resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import structlog

from gna_sdk.aio import wait_event

log = structlog.get_logger(__name__)

CHECK_S = 1.0  # s between the checks of a follower's consumer
FAIL_S = 60.0  # s without a working consumer before the process gives up (exit 75, restarted)
SLICE_S = 0.005  # s of message handling before the follower lets the event loop serve the others
RETRY_AFTER_TIMEOUT_S = 0.05  # s before a follower asks again after an unanswered request (it waited already)
IDLE_HEARTBEAT_S = 0.5  # the server's heartbeat on an idle consumer (nats-py resets after two missed)


async def sequence_at(js: Any, stream: str, subject: str, since: float) -> int:
    """A start sequence from which a consumer of ``stream`` filtered on ``subject`` delivers exactly the
    messages stored at or after ``since`` (epoch s): after the last earlier message on the subject, at
    or before the first later one (the next sequence to be stored when there is none). O(log n) gets."""
    from nats.js.errors import NotFoundError

    info = await js.stream_info(stream)
    lo, hi = max(1, int(info.state.first_seq)), int(info.state.last_seq) + 1
    if info.state.messages == 0:
        return hi
    at = dt.datetime.fromtimestamp(since, dt.UTC)
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            m = await js.get_msg(stream, seq=mid, subject=subject, next=True)
        except NotFoundError:  # nothing on the subject from mid on
            hi = mid
            continue
        if m.seq is None or m.time is None:
            raise RuntimeError(f"{stream}: a message get without its sequence or time")
        if m.time >= at:
            hi = mid
        else:
            lo = int(m.seq) + 1
    return lo


class Follower:
    """One subject of one stream, handed to ``on_msg(subject, data)`` in order, at most once each.

    ``start``: the first sequence, or None to begin at ``since`` (epoch s; None: only new messages).
    ``until``: a replay: stop once the stream's sequence ``until`` is reached (``done`` is set).
    """

    def __init__(self, js: Any, stream: str, subject: str, on_msg: Callable[[str, bytes], object], *,
                 since: float | None = None, start: int | None = None, until: int | None = None,
                 name: str = "", check_s: float = CHECK_S, fail_s: float = FAIL_S,
                 on_fail: Callable[[str], None] | None = None, filters: list[str] | None = None) -> None:
        self.js, self.stream, self.subject, self.on_msg = js, stream, subject, on_msg
        # ``filters``: the consumer asks the server for these subjects only (each within ``subject``, which
        # the start time is resolved over); None: ``subject``
        self.filters = filters
        self.since, self.until = since, until
        self.next_seq = start  # the next sequence to ask for
        self.name = name or f"{stream}:{subject}"
        self.check_s, self.fail_s = check_s, fail_s
        self.on_fail = on_fail
        self.last = 0  # the last stream sequence handed on
        # when the stream stored it (epoch s, by the clock of the stream's leader): a stream is stored in
        # order, so everything it stored before this has been handed on
        self.last_stored = 0.0
        self.handed = 0
        self.duplicates = 0
        self.resubscribes = 0
        self.failures = 0
        self.unanswered = 0  # checks of the consumer nobody answered in time (replaced unless it still delivers)
        self._checked = 0  # ``last`` at the previous check
        self.why = ""  # why the last check found the consumer not serving
        self.pending = 0  # messages its consumer had not delivered yet, at the last check (fleet/metrics.py)
        self.buffered_max = 0  # the most messages nats-py held received but not yet handed on, since start
        self.done = asyncio.Event()
        self.ready = asyncio.Event()  # subscribed at least once
        # what the stream held when the follower began has been handed on (a service judges only then:
        # a verdict from half its history would be published and then corrected)
        self.caught_up = asyncio.Event()
        self.mark: int | None = None
        self._sub: Any = None
        self._slice = time.monotonic()

    def _deliver(self, m: Any) -> None:
        try:
            md = m.metadata  # nats-py parses the reply subject's sequences and stored time anyway
            seq = md.sequence.stream
        except Exception:  # not a JetStream delivery (a status message nats-py let through)
            return
        if seq <= self.last:
            self.duplicates += 1
            return
        self.last = seq
        self.last_stored = md.timestamp.timestamp()
        self.handed += 1
        if self._sub is not None and (queued := self._sub.pending_msgs) > self.buffered_max:
            self.buffered_max = queued
        self.on_msg(m.subject, m.data)
        # the delivery says how many of the consumer's messages the server still holds for it (the ack subject's
        # last token, nats-py Msg.Metadata.num_pending): none left is caught up, at once -- a filtered consumer
        # never meets the stream's last sequence, and waiting for the next check cost up to ``check_s`` (a
        # partition taken over was judged ~1 s after its history was in, bench/incidents_scale.py --mode cluster)
        if (self.mark is not None and seq >= self.mark) or md.num_pending == 0:
            self.caught_up.set()
        if self.until is not None and seq >= self.until:
            self.done.set()

    async def _subscribe(self) -> None:
        from nats.js.api import ConsumerConfig, DeliverPolicy

        if self.next_seq is None:
            self.next_seq = (await sequence_at(self.js, self.stream, self.subject, self.since)
                             if self.since is not None else (await self.js.stream_info(self.stream)).state.last_seq + 1)
        start = max(self.next_seq, self.last + 1)
        if self.mark is None:
            self.mark = int((await self.js.stream_info(self.stream)).state.last_seq)
            if self.mark < start:
                self.caught_up.set()
        if self.until is not None and start > self.until:
            self.done.set()  # a replay with nothing left to read
            return

        async def cb(m: Any) -> None:
            self._deliver(m)
            # nats-py's delivery task takes the next message without yielding while its queue holds
            # any (nats/aio/subscription.py _wait_for_msgs): a backlog of 100,000 would hold the loop
            # for a minute, the judge loop and every other follower behind it. A slice, then a yield.
            now = time.monotonic()
            if now - self._slice > SLICE_S:
                await asyncio.sleep(0)
                self._slice = time.monotonic()

        filters = self.filters or [self.subject]
        self._sub = await self.js.subscribe(
            filters[0], stream=self.stream, cb=cb, ordered_consumer=True, idle_heartbeat=IDLE_HEARTBEAT_S,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
                                  filter_subjects=filters if len(filters) > 1 else None))
        self.ready.set()
        if not self.caught_up.is_set():
            # a filtered consumer may never see the stream's last sequence: whether anything is pending, at once
            with contextlib.suppress(Exception):
                info = await asyncio.wait_for(self._sub.consumer_info(), timeout=self.check_s)
                if not info.num_pending and (info.delivered is None or not info.delivered.consumer_seq):
                    self.caught_up.set()

    async def target(self, timeout: float = 1.0) -> int | None:
        """The stream sequence this follower must have handed on to hold everything its stream held a moment
        ago: what its consumer delivered when nothing is pending (at most one message in flight), else the
        stream's last sequence. None when neither answers within ``timeout`` (a consumer on a server that
        died, a stream without a leader and no consumer to ask). Taken once and waited for: under steady
        traffic a follower a little behind never meets a fresh mark each time."""
        try:
            if self._sub is not None:
                with contextlib.suppress(TimeoutError):
                    info = await asyncio.wait_for(self._sub.consumer_info(), timeout)
                    if not info.num_pending:
                        d = info.delivered
                        return (d.stream_seq or 0) if d is not None else 0
            return int((await asyncio.wait_for(self.js.stream_info(self.stream), timeout)).state.last_seq)
        except Exception:  # no leader, no answer: not known
            return None

    @property
    def recovering(self) -> bool:
        """Between losing a consumer and having its replacement (``js.subscribe`` can wait out an election
        for its whole timeout, showing no other sign of life meanwhile)."""
        return self.ready.is_set() and self._sub is None and not self.done.is_set()

    async def drained(self, timeout: float = 1.0) -> bool:
        """Whether its consumer says nothing is pending beyond what was handed on: how a follower of some
        subjects is current though the stream's last message is one it does not follow (that mark is
        never reached)."""
        if self._sub is None:
            return False
        try:
            info = await asyncio.wait_for(self._sub.consumer_info(), timeout)
        except Exception:  # no answer: not known
            return False
        d = info.delivered
        return not info.num_pending and ((d.stream_seq or 0) if d is not None else 0) <= self.last

    async def reached(self, mark: int, settle: float = 0.25) -> bool:
        """Whether ``mark`` has been handed on, waiting up to ``settle`` s for it."""
        t0 = time.monotonic()
        while self.last < mark and time.monotonic() - t0 < settle:
            await asyncio.sleep(0.01)
        return self.last >= mark

    async def current(self, timeout: float = 1.0, settle: float = 0.25) -> bool:
        """Whether everything the stream held a moment ago (on this follower's subjects) has been handed on."""
        mark = await self.target(timeout)
        return (mark is not None and await self.reached(mark, settle)) or await self.drained(timeout)

    async def _drop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _server_alive(self) -> bool:
        """nats-py's own sign of life of this consumer: the core subscription's JetStream state (``_jsi``) has
        ``_active`` set on every message and idle heartbeat (nats/aio/client.py ``_process_msg``,
        ``check_for_sequence_mismatch``) and its ``activity_check`` clears it every two heartbeat intervals,
        resetting an ordered consumer that stayed silent (nats-py 2.16 nats/js/client.py). An idle consumer on
        a server too busy to answer
        CONSUMER.INFO in time still sends its heartbeats: it is not replaced for that. False when the
        attribute is missing (another nats-py): then an unanswered check replaces it, as before."""
        core = getattr(self._sub, "_sub", None)  # js.subscribe's PushSubscription wraps the core subscription
        jsi = getattr(core, "_jsi", None)
        return getattr(jsi, "_active", None) is True

    async def _healthy(self, seen: tuple[int, int, int] | None) -> tuple[bool, tuple[int, int, int] | None]:
        """Whether the consumer still serves us, by asking the server about it (``self.why``: why not)."""
        from nats.js.errors import NotFoundError

        try:
            # bounded by the check's own period: nats-py waits 5 s for an answer by default, and a
            # consumer whose server died answers nothing (measured: faults on a killed server's
            # consumer named 5-7 s after their decisive message, bench/incidents_scale.py --mode cluster)
            info = await asyncio.wait_for(self._sub.consumer_info(), timeout=self.check_s)
        except NotFoundError:
            self.why = "consumer not found"
            return False, None  # the server lost it (a restart, a failed re-creation)
        except TimeoutError:
            self.unanswered += 1
            self.why = (f"CONSUMER.INFO unanswered within {self.check_s:g} s, nothing handed on since the last check "
                        "and no heartbeat")
            # nobody answers for it: a new one, on a server that is there -- unless it is still delivering.
            # On a busy server (a fleet start on 2 shared cores) CONSUMER.INFO can take longer than a check
            # period while the consumer serves us; replacing it then only re-delivers what it was sending.
            moved, self._checked = self.last > self._checked, self.last
            if moved or self._server_alive():
                return True, seen
            return False, None
        self._checked = self.last
        d = info.delivered
        delivered, cseq = (d.stream_seq or 0, d.consumer_seq or 0) if d is not None else (0, 0)
        pending = self.pending = info.num_pending or 0
        now = (delivered, self.last, pending)
        if pending == 0 and (cseq == 0 or delivered <= self.last):
            self.caught_up.set()
        if self.until is not None and (self.last >= self.until or (
                pending == 0 and (cseq == 0 or delivered <= self.last or now == seen))):
            self.done.set()  # a replay: everything up to ``until`` (or all there is) was handed on
        stuck = seen is not None and pending > 0 and now == seen  # pending, and nothing moved
        self.why = f"{pending} pending, nothing delivered since the last check (delivered {delivered})" if stuck else ""
        return not stuck, now

    async def run(self) -> None:
        """Until cancelled (or, for a replay, until ``until`` is reached): subscribed, watched, resumed."""
        failing_since: float | None = None
        seen: tuple[int, int, int] | None = None
        try:
            while not self.done.is_set():
                try:
                    if self._sub is None:
                        if self.until is not None and self.last >= self.until:
                            self.done.set()  # a replay with nothing (left) to read: done, and says so
                            break
                        await self._subscribe()
                        seen = None
                    if await wait_event(self.done, self.check_s):
                        break
                    ok, seen = await self._healthy(seen)
                    if not ok:
                        log.warning("follower_resubscribing", follower=self.name, after=self.last, why=self.why)
                        self.resubscribes += 1
                        await self._drop()
                    failing_since = None
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # no leader, server away, a timeout: try again, for a while
                    self.failures += 1
                    now = time.monotonic()
                    failing_since = failing_since or now
                    log.info("follower_retry", follower=self.name, error=repr(exc)[:300])
                    if now - failing_since > self.fail_s:
                        if self.on_fail is not None:
                            self.on_fail(f"{self.name}: no consumer for {self.fail_s:.0f} s ({repr(exc)[:200]})")
                        raise
                    await self._drop()
                    # a request that timed out has waited already: ask again at once (traced: a taken-over
                    # partition's consumer create, sent while the killed server was still a peer the server
                    # could place it on, timed out after 2 s and the partition was read 1 s after that)
                    await asyncio.sleep(RETRY_AFTER_TIMEOUT_S if isinstance(exc, TimeoutError)
                                        else min(self.check_s, 1.0))
        finally:
            await self._drop()

    def stats(self) -> dict[str, int]:
        return {"last": self.last, "handed": self.handed, "duplicates": self.duplicates,
                "resubscribes": self.resubscribes, "failures": self.failures, "unanswered": self.unanswered,
                "buffered_max": self.buffered_max}
