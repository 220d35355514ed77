"""fleet/follow.py: a stream followed through its own servers' failures, resumed by sequence, never by time.

Real nats-servers (one, and a routed 3-node JetStream cluster with an R3 stream): killed with SIGKILL
and started again on the same port and store, while messages keep arriving. Every message published
after a loss must reach the follower exactly once, in order.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy, StreamConfig

from agent.nats_server import NatsCluster, NatsServerProcess
from fleet.follow import Follower, sequence_at

STREAM = "T_FOLLOW"


class Seen:
    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []

    def __call__(self, subject: str, data: bytes) -> None:
        self.items.append((subject, data))

    def numbers(self) -> list[int]:
        return [int(d) for _s, d in self.items]


async def _until(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


async def _publish(js: Any, first: int, n: int, subject: str = "t.a", timeout: float = 30.0) -> None:
    """n numbered messages; each retried until the stream has it (a cluster is electing)."""
    for i in range(first, first + n):
        t0 = time.monotonic()
        while True:
            try:
                await js.publish(subject, str(i).encode(), headers={"Nats-Msg-Id": f"{subject}:{i}"}, timeout=2.0)
                break
            except Exception:
                if time.monotonic() - t0 > timeout:
                    raise
                await asyncio.sleep(0.2)


async def _connect(urls: list[str]) -> Any:
    return await nats.connect(urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2)


async def test_sequence_at_finds_the_first_message_on_the_subject_at_or_after_a_time(tmp_path: Path,
                                                                                   nats_server: NatsServerProcess) -> None:
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        assert await sequence_at(js, STREAM, "t.>", time.time() - 60) == 1  # empty: the next sequence
        for i in range(20):  # 1..20, a and b interleaved
            await js.publish("t.a" if i % 2 == 0 else "t.b", str(i).encode())
        await asyncio.sleep(0.3)
        cut = time.time()
        await asyncio.sleep(0.3)
        for i in range(20, 30):  # 21..30
            await js.publish("t.b", str(i).encode())
        assert await sequence_at(js, STREAM, "t.>", cut) == 21
        assert await sequence_at(js, STREAM, "t.a", time.time() - 60) == 1
        # a start from which the filtered consumer delivers exactly what was stored since: any sequence
        # after the last earlier message on the subject and at or before the first later one
        assert await sequence_at(js, STREAM, "t.b", time.time() - 60) in (1, 2)
        assert 20 <= await sequence_at(js, STREAM, "t.a", cut) <= 31  # t.a's last is 19; none since
        assert await sequence_at(js, STREAM, "t.>", time.time() + 60) == 31
    finally:
        await nc.close()


async def test_a_follower_resumes_by_sequence_after_its_server_is_killed(tmp_path: Path,
                                                                        nats_server: NatsServerProcess) -> None:
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    seen = Seen()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
    await _publish(js, 0, 30)
    f = Follower(js, STREAM, "t.>", seen, since=time.time() - 3600, check_s=0.5)
    task = asyncio.ensure_future(f.run())
    try:
        await _until(lambda: len(seen.items) == 30, 10, "the history")
        for round_ in range(2):
            nats_server.stop(kill=True)
            await asyncio.sleep(0.5)
            nats_server.start()
            await _publish(js, 30 + 20 * round_, 20)
            await _until(lambda r=round_: len(seen.items) >= 50 + 20 * r, 20, f"the messages after kill {round_ + 1}")
        await asyncio.sleep(1.0)
        assert seen.numbers() == list(range(70)), "every message once, in order"
        info = await f._sub.consumer_info()
        # what the bug needs never exists: a consumer by start sequence with no start time
        assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
        assert info.config.opt_start_time is None
        assert f.stats()["handed"] == 70
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()


async def test_a_replay_stops_at_its_sequence_and_an_empty_window_ends_at_once(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        # an empty stream: a replay up to its last sequence (0) has nothing to read and is done. It returned
        # without saying so, and the correlator's signals replay (fleet/incident_service.py _replay) asked
        # again at once, forever: a core burnt by a replica that regained partition 0 (the cluster bench)
        nothing = Follower(js, STREAM, "t.a", Seen(), since=time.time() - 3600, until=0, check_s=0.3)
        await asyncio.wait_for(nothing.run(), 5)
        assert nothing.done.is_set() and nothing.handed == 0
        await _publish(js, 0, 10, "t.a")
        await _publish(js, 10, 5, "t.b")  # the replay's end is a message it does not read
        last = (await js.stream_info(STREAM)).state.last_seq
        seen = Seen()
        f = Follower(js, STREAM, "t.a", seen, since=time.time() - 3600, until=last, check_s=0.3)
        await asyncio.wait_for(f.run(), 10)
        assert f.done.is_set() and seen.numbers() == list(range(10))
        empty = Follower(js, STREAM, "t.a", Seen(), since=time.time() + 60, until=last, check_s=0.3)
        await asyncio.wait_for(empty.run(), 5)
        assert empty.done.is_set() and empty.handed == 0
    finally:
        await nc.close()


async def test_a_follower_is_current_only_once_it_handed_on_what_the_stream_held(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """``current()``: what the correlator asks before judging (its hardware findings read). Filter subjects too:
    a follower of some subjects is current though the stream's last message is one it does not follow."""
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        await _publish(js, 0, 20, "t.a")
        seen = Seen()
        f = Follower(js, STREAM, "t.>", seen, since=time.time() - 3600, check_s=0.3, filters=["t.a", "t.c"])
        assert not await f.current()  # not subscribed, the stream holds 20 it has not handed on
        task = asyncio.ensure_future(f.run())
        try:
            await _until(lambda: len(seen.items) == 20, 10, "the history handed on")
            assert await f.current()
            stored = f.last_stored  # when the server stored the last message handed on (its clock: this host's)
            assert time.time() - 30 < stored <= time.time() + 1
            await _publish(js, 20, 5, "t.b")  # the stream's last messages: not followed
            await _publish(js, 25, 3, "t.c")
            await _until(lambda: len(seen.items) == 23, 10, "t.c handed on")
            assert f.last_stored >= stored  # a stream is stored in order
            await _publish(js, 28, 2, "t.b")
            assert await f.current() and seen.numbers() == [*range(20), 25, 26, 27]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await nc.close()


async def test_a_follower_that_cannot_resume_says_so_and_ends(tmp_path: Path,
                                                            nats_server: NatsServerProcess) -> None:
    """The stream is gone (deleted by an admin): no consumer can be made; after fail_s the follower calls
    on_fail (the services exit 75) and raises, it does not sit there deaf."""
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        failed: list[str] = []
        f = Follower(js, STREAM, "t.>", Seen(), check_s=0.2, fail_s=1.0, on_fail=failed.append)
        task = asyncio.ensure_future(f.run())
        await asyncio.wait_for(f.ready.wait(), 5)
        await js.delete_stream(STREAM)
        with pytest.raises(Exception):  # noqa: B017 - whatever the server answered, it is raised
            await asyncio.wait_for(task, 10)
        assert len(failed) == 1 and "no consumer" in failed[0] and f.failures > 0
    finally:
        await nc.close()


@pytest.mark.slow  # the service-level test (tests/test_cluster_failover.py) runs this in the default suite
async def test_a_follower_survives_each_server_of_a_cluster_killed_in_turn(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "cluster", size=3)
    cluster.start()
    nc = None
    task = None
    try:
        nc = await _connect(cluster.urls)
        js = nc.jetstream(timeout=5)
        t0 = time.monotonic()
        while True:  # the cluster elects its meta leader first
            try:
                await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"], num_replicas=3))
                break
            except Exception:
                if time.monotonic() - t0 > 30:
                    raise
                await asyncio.sleep(0.5)
        seen = Seen()
        f = Follower(js, STREAM, "t.>", seen, since=time.time() - 3600, check_s=0.5)
        task = asyncio.ensure_future(f.run())
        await _publish(js, 0, 20)
        await _until(lambda: len(seen.items) == 20, 20, "before any loss")
        n = 20
        for i, server in enumerate(cluster.servers):
            server.stop(kill=True)
            await _publish(js, n, 20)  # while one server of three is gone
            n += 20
            await _until(lambda n=n: len(seen.items) >= n, 40, f"with server {i} killed")
            server.start()
            await _publish(js, n, 10)  # and after it is back
            n += 10
            await _until(lambda n=n: len(seen.items) >= n, 40, f"after server {i} came back")
        await asyncio.sleep(1.0)
        assert seen.numbers() == list(range(n)), "every message once, in order"
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if nc is not None:
            await nc.close()
        cluster.stop(kill=True)


class _Info:
    def __init__(self) -> None:
        self.state = type("S", (), {"first_seq": 1, "last_seq": 0, "messages": 0})()


class _SilentJS:
    """A stream whose consumers' server never answers CONSUMER.INFO (it died with them), the stream's
    own info still answered by its new leader: the state after a server kill."""

    def __init__(self, answer_after: int) -> None:
        self.subs = 0
        self.answer_after = answer_after

    async def stream_info(self, _stream: str) -> Any:
        return _Info()

    async def subscribe(self, *_a: Any, **_k: Any) -> Any:
        self.subs += 1
        silent = self.subs <= self.answer_after

        class Sub:
            pending_msgs = 0  # nats-py's Subscription: messages received, not yet handed to the callback

            async def consumer_info(self) -> Any:
                if silent:
                    await asyncio.sleep(3600)  # nats-py would wait its 5 s, then raise
                return type("I", (), {"delivered": None, "num_pending": 0})()

            async def unsubscribe(self) -> None:
                return None

        return Sub()


async def test_a_consumer_nobody_answers_for_is_replaced_within_the_check_period() -> None:
    """Issue 21: a fault whose consumer sat on a killed server was named 5-7 s after its decisive message
    (nats-py's 5 s request timeout, then a retry pause); the check is bounded by its own period."""
    js = _SilentJS(answer_after=2)
    f = Follower(js, STREAM, "t.>", Seen(), start=1, check_s=0.2)
    task = asyncio.create_task(f.run())
    try:
        t0 = time.monotonic()
        await _until(lambda: js.subs >= 3, 3.0, "two silent consumers replaced")
        assert time.monotonic() - t0 < 1.5  # two checks of 0.2 s each, and their answers' 0.2 s bounds
        assert f.unanswered == 2 and f.resubscribes == 2 and f.failures == 0
        await asyncio.sleep(0.6)
        assert js.subs == 3  # the answering one is kept
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _BusyJS(_SilentJS):
    """A consumer whose server is too busy to answer CONSUMER.INFO in time while it keeps delivering (a fleet
    start on 2 shared cores): one message every 50 ms through the follower's callback."""

    def __init__(self) -> None:
        super().__init__(answer_after=10**6)
        self.tasks: list[asyncio.Task[None]] = []

    async def subscribe(self, *_a: Any, cb: Any = None, **_k: Any) -> Any:
        sub = await super().subscribe()
        first = self.subs * 10_000

        async def feed() -> None:
            for seq in range(first, first + 10_000):
                md = type("MD", (), {"sequence": type("S", (), {"stream": seq})(),
                                     "timestamp": type("T", (), {"timestamp": lambda self: time.time()})()})()
                await cb(type("M", (), {"metadata": md, "subject": "t.a", "data": str(seq).encode()})())
                await asyncio.sleep(0.05)

        self.tasks.append(asyncio.create_task(feed()))
        return sub


async def test_a_consumer_that_keeps_delivering_is_kept_though_its_server_is_slow_to_answer() -> None:
    """A fleet start: CONSUMER.INFO unanswered within the check period while messages keep coming is no dead
    consumer (replacing it re-delivered what it was sending, bench/incidents_scale.py fleet start:
    follower_resubscribing x3); counted as unanswered, kept."""
    js = _BusyJS()
    f = Follower(js, STREAM, "t.>", Seen(), start=1, check_s=0.2)
    task = asyncio.create_task(f.run())
    try:
        await _until(lambda: f.unanswered >= 3, 3.0, "three unanswered checks")
        assert js.subs == 1 and f.resubscribes == 0 and f.handed > 10
    finally:
        task.cancel()
        for t in js.tasks:
            t.cancel()
        await asyncio.gather(task, *js.tasks, return_exceptions=True)



async def test_an_idle_consumer_shows_life_through_nats_pys_heartbeat_flag(tmp_path: Path,
                                                                          nats_server: NatsServerProcess) -> None:
    """``Follower._server_alive`` reads nats-py's own activity flag (set by each idle heartbeat): on the installed
    nats-py an idle follower's consumer shows life, and stops showing it once its server is gone. Fails when a
    nats-py upgrade renames the flag (the follower would then replace a busy server's idle consumer again)."""
    nc = await _connect([nats_server.url])
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        f = Follower(js, STREAM, "t.a", Seen(), start=1, check_s=5.0)
        task = asyncio.create_task(f.run())
        await _until(lambda: f._sub is not None, 5.0, "subscribed")
        await asyncio.sleep(2.5)  # past nats-py's activity check (2 heartbeats): only heartbeats keep it set
        # the check clears the flag every 2 s and the next heartbeat (every 1 s) sets it again: it shows life
        # within one heartbeat interval of any moment
        await _until(f._server_alive, 1.5, "a heartbeat sets the flag")
        assert f.handed == 0
        nats_server.stop(kill=True)
        await _until(lambda: not f._server_alive(), 6.0, "no heartbeat, no life")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await nc.close()


async def test_a_filtered_follower_is_caught_up_when_its_consumer_has_nothing_pending(
        nats_server: NatsServerProcess) -> None:
    """The stream's last message is on a subject this follower does not ask for, so the stream's last sequence
    is never handed on: the delivery that leaves nothing pending for its consumer says it is caught up, at once
    (not at the next check, ``check_s`` later: a partition taken over was judged that much later)."""
    nc = await _connect([nats_server.url])
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        await _publish(js, 0, 50)
        await _publish(js, 1000, 1, subject="t.b")  # the stream's last message: another subject
        seen = Seen()
        f = Follower(js, STREAM, "t.>", seen, filters=["t.a"], start=1, check_s=30.0)
        task = asyncio.create_task(f.run())
        try:
            t0 = time.monotonic()
            await asyncio.wait_for(f.caught_up.wait(), 5.0)
            assert seen.numbers() == list(range(50)) and time.monotonic() - t0 < 5.0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await nc.close()


async def test_a_follower_asks_again_at_once_after_an_unanswered_request(nats_server: NatsServerProcess) -> None:
    """A consumer create that timed out has waited its request timeout already: the next one goes at once, not
    after the pause a refused request gets (a taken-over partition was read 1 s later for it)."""
    nc = await _connect([nats_server.url])
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["t.>"]))
        await _publish(js, 0, 3)

        class Unanswered:
            def __init__(self) -> None:
                self.calls: list[float] = []

            async def subscribe(self, *a: Any, **kw: Any) -> Any:
                self.calls.append(time.monotonic())
                if len(self.calls) == 1:
                    raise TimeoutError("nats: timeout")
                return await js.subscribe(*a, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(js, name)

        flaky = Unanswered()
        seen = Seen()
        f = Follower(flaky, STREAM, "t.a", seen, start=1, check_s=1.0)
        task = asyncio.create_task(f.run())
        try:
            await _until(lambda: len(seen.items) == 3, 5, "the three messages")
            assert f.failures == 1 and len(flaky.calls) == 2
            assert flaky.calls[1] - flaky.calls[0] < 0.5, flaky.calls
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await nc.close()
