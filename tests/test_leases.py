"""fleet/leases.py against a real nats-server: what an election does to a lease is not a loss; another
replica's claim is; a dead replica's partition moves after two ticks without its alive key, or sooner, once
its beats stop while the survivor hears its own."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.nats_server import NatsServerProcess
from fleet.leases import BEACON_MAX_BYTES, BEACON_MISSED, Leases, alive_key, beacon_subject, lease_key, open_bucket


def _record(events: list[tuple[str, int]], what: str) -> Callable[[int], Awaitable[None]]:
    async def on(p: int) -> None:
        events.append((what, p))
    return on


async def _leases(kv: object, partition: int, events: list[tuple[str, int]], partitions: int = 2,
                  **kw: object) -> Leases:
    return Leases(kv, partitions=partitions, partition=partition, holder=f"h{partition}", ttl=60.0,
                  on_gain=_record(events, "gain"), on_loss=_record(events, "loss"), **kw)  # type: ignore[arg-type]


async def test_an_elections_lost_answer_or_expiry_keeps_the_lease_another_claim_loses_it(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await open_bucket(nc.jetstream(), ttl=60.0)
        events: list[tuple[str, int]] = []
        a = await _leases(kv, 0, events, takeover=False)
        await a.tick()
        assert events == [("gain", 0)] and 0 in a.held
        # a renewal the server stored whose answer never came back: the revision we hold is stale
        await kv.put(lease_key(0), json.dumps({"holder": "h0", "partition": 0}).encode())
        await a.tick()
        assert events == [("gain", 0)] and 0 in a.held and a.reclaimed == 1
        # the entry expired while the bucket was away (nobody renewed it for a TTL), nobody claimed it
        await kv.delete(lease_key(0))
        await a.tick()
        assert events == [("gain", 0)] and 0 in a.held and a.reclaimed == 2
        await a.tick()  # and renews normally from there
        assert a.reclaimed == 2
        # another replica holds it now: lost
        await kv.put(lease_key(0), json.dumps({"holder": "someone-else", "partition": 0}).encode())
        await a.tick()
        assert events[-1] == ("loss", 0) and 0 not in a.held
    finally:
        await nc.close()


async def test_a_partition_seen_alive_moves_after_two_ticks_without_its_alive_key(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await open_bucket(nc.jetstream(), ttl=60.0)
        ev0: list[tuple[str, int]] = []
        ev1: list[tuple[str, int]] = []
        a, b = await _leases(kv, 0, ev0), await _leases(kv, 1, ev1)
        await a.tick()
        await b.tick()
        await a.tick()  # A sees B alive
        assert ev0 == [("gain", 0)] and ev1 == [("gain", 1)]
        # B dies: its keys vanish as the TTL would make them
        await kv.delete(alive_key(1))
        await kv.delete(lease_key(1))
        await a.tick()
        assert 1 not in a.held, "one tick without the key is not a death (an election, a slow restart)"
        await a.tick()
        assert 1 in a.held and ev0[-1] == ("gain", 1) and a.takeovers == 1
        # B is back: A hands the partition back on its next tick, B claims it on its own
        await b.tick()
        await a.tick()
        assert 1 not in a.held and ev0[-1] == ("loss", 1)
        await b.tick()
        assert 1 in b.held
    finally:
        await nc.close()


async def _until(cond: Any, timeout: float) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_replica_whose_beats_stop_loses_its_partition_before_its_entry_expires(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """Beats on core NATS: B dies (no goodbye); its lease entry would live 60 s, A takes it within a few beats.
    A replica that hears nothing of itself (no_echo: as if cut off) decides nothing, however long B is silent."""
    conns = [await nats.connect(nats_server.url) for _ in range(2)]
    deaf = await nats.connect(nats_server.url, no_echo=True)
    tasks: dict[str, asyncio.Task[None]] = {}
    try:
        kv = await open_bucket(conns[0].jetstream(), ttl=60.0)
        ev0: list[tuple[str, int]] = []
        ev1: list[tuple[str, int]] = []
        evd: list[tuple[str, int]] = []
        a = await _leases(kv, 0, ev0, 3, nc=conns[0], beat_s=0.05)
        b = await _leases(kv, 1, ev1, 3, nc=conns[1], beat_s=0.05)
        c = await _leases(kv, 2, evd, 3, nc=deaf, beat_s=0.05)  # a third replica that cannot hear itself
        for name, x in (("a", a), ("b", b), ("c", c)):
            tasks[name] = asyncio.create_task(x.run())
        assert await _until(lambda: 1 in b.held and 0 in a.held and 1 in a._heard and 1 in c._heard, 5)
        tasks.pop("b").cancel()  # B dies: its tasks stop, nothing handed back, its entry stays for 60 s
        t0 = time.monotonic()
        assert await _until(lambda: 1 in a.held, 5), a.silent()
        took = time.monotonic() - t0
        assert a.beat_takeovers == 1 and ev0[-1] == ("gain", 1)
        assert took < 2.0, f"{took:.2f} s: the beats, not the entry's 60 s TTL, should have moved it"
        await a.tick()  # B's alive key lives on (60 s): no hand-back to a replica whose beats stopped
        assert 1 in a.held and ("loss", 1) not in ev0 and a.beat_takeovers == 1
        await asyncio.sleep(0.5)
        assert 1 in c._heard and c.silent() == {} and c.held.keys() == {2} and evd == [("gain", 2)], \
            "a replica that does not hear its own beats takes nothing"
        # hostile beats: oversized, not JSON, another partition's subject, a bad holder: counted, never heard
        big = json.dumps({"holder": "h1", "partition": 1, "pad": "x" * BEACON_MAX_BYTES}).encode()
        bad = [(beacon_subject(1), big), (beacon_subject(1), b"\xff{"),
               (beacon_subject(0), json.dumps({"holder": "h1", "partition": 1}).encode()),
               (beacon_subject(1), json.dumps({"holder": "", "partition": 1}).encode()),
               (beacon_subject(7), json.dumps({"holder": "h7", "partition": 7}).encode()),
               (beacon_subject(1), json.dumps({"holder": "h1", "partition": True}).encode())]
        before = a.beats_rejected
        for subject, data in bad:
            await conns[1].publish(subject, data)
        await conns[1].flush()
        assert await _until(lambda: a.beats_rejected - before == len(bad), 5), a.beats_rejected - before
        await asyncio.sleep(0.2)
        assert a.beats_rejected - before == len(bad) and set(a._heard) == {1, 2} and a._heard[1][1] == "h1"
        # B restarts (a new holder, beating): A hands the partition back on its next tick, B claims it on its own
        b2 = Leases(kv, partitions=3, partition=1, holder="h1-again", ttl=60.0, on_gain=_record(ev1, "gain"),
                    on_loss=_record(ev1, "loss"), nc=conns[1], beat_s=0.05)
        tasks["b2"] = asyncio.create_task(b2.run())
        assert await _until(lambda: a._heard[1][1] == "h1-again", 5)
        await a.tick()
        assert 1 not in a.held and ev0[-1] == ("loss", 1)
        await b2.tick()  # its next tick (every 20 s at this TTL)
        assert 1 in b2.held
    finally:
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for nc in (*conns, deaf):
            await nc.close()


def test_silence_while_we_were_cut_off_is_not_a_death(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own beats stopped coming back (our server died, we reconnected): the others' beats missed meanwhile
    say nothing about them; only silence over an unbroken run of ours does."""
    import fleet.leases as leases_mod

    now = [100.0]
    monkeypatch.setattr(leases_mod.time, "monotonic", lambda: now[0])
    x = Leases(object(), partitions=2, partition=0, holder="h0", ttl=3.0, on_gain=_record([], "gain"),
               on_loss=_record([], "loss"), beat_s=0.5)  # dead after BEACON_MISSED beats of ours without theirs

    def beat(p: int) -> None:
        x._on_beat(beacon_subject(p), json.dumps({"holder": f"h{p}", "partition": p}).encode())

    for _ in range(4):  # both beat
        beat(0)
        beat(1)
        now[0] += 0.5
    beat(0)
    now[0] += 3.0  # cut off: nothing heard for 3 s, ours included
    assert x.silent() == {}
    beat(0)  # back: our first beat again
    assert x.silent() == {}, "their silence while we heard nothing is not theirs"
    for _ in range(2):
        now[0] += 0.5
        beat(1)
        beat(0)
    assert x.silent() == {}
    for _ in range(BEACON_MISSED):  # they stop; we go on
        now[0] += 0.5
        beat(0)
    assert x.silent() == {}, "silent for exactly the window: not yet"
    now[0] += 0.5
    beat(0)
    assert x.silent() == {1: "h1"}
    beat(1)
    assert x.silent() == {}


class _Electing:
    """A replica's view of the leases bucket while its leader is being elected: no request is answered."""

    def __init__(self, kv: Any, slow: float = 0.0) -> None:
        self.kv, self.electing, self.slow = kv, False, slow  # slow: s before a request gives up

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.kv, name)
        if not callable(attr):
            return attr

        async def call(*a: Any, **kw: Any) -> Any:
            if self.electing:
                await asyncio.sleep(self.slow)
                raise TimeoutError("nats: timeout")
            return await attr(*a, **kw)
        return call


async def test_while_the_bucket_elects_the_lowest_live_replica_judges_a_dead_ones_partition(
        tmp_path: Path, nats_server: NatsServerProcess) -> None:
    """B dies while the leases bucket cannot answer: A (the lowest live partition) judges B's partition
    provisionally, C does not; once the bucket answers A takes the lease (gained once, not twice). A replica
    of B beating again gets a provisional partition back at once."""
    conns = [await nats.connect(nats_server.url) for _ in range(3)]
    tasks: dict[str, asyncio.Task[None]] = {}
    try:
        real = await open_bucket(conns[0].jetstream(), ttl=60.0)
        views = [_Electing(real, slow=0.3) for _ in range(3)]  # each request: six beats before it gives up
        ev: list[list[tuple[str, int]]] = [[], [], []]
        xs = [await _leases(views[i], i, ev[i], 3, nc=conns[i], beat_s=0.05) for i in range(3)]
        a, _, c = xs
        for i, x in enumerate(xs):
            tasks[str(i)] = asyncio.create_task(x.run())
        assert await _until(lambda: all(i in x.held for i, x in enumerate(xs))
                            and all(len(x._heard) == 2 for x in xs), 5)
        for v in views:
            v.electing = True
        tasks.pop("1").cancel()  # B dies with the bucket's leader
        assert await _until(lambda: 1 in a.provisional, 5), (a.silent(), a.provisional)
        assert ev[0][-1] == ("gain", 1) and a.provisional_takeovers == 1 and 1 not in a.held
        await asyncio.sleep(1.0)  # requests to the bucket keep timing out; the beats go on, A keeps judging it
        assert 1 in a.provisional and ev[0][-1] == ("gain", 1)
        assert not c.provisional and ("gain", 1) not in ev[2], "only the lowest live replica judges it"
        for v in views:
            v.electing = False  # the bucket has its leader: A's beats take the lease from the dead holder
        assert await _until(lambda: 1 in a.held, 5)
        assert not a.provisional and ev[0].count(("gain", 1)) == 1 and ("loss", 1) not in ev[0]
        assert a.beat_takeovers == 1 and not c.held.keys() - {2}
        # B's replica returns, beating, while A holds its lease: handed back on A's next tick
        b2 = await _leases(views[1], 1, ev[1], 3, nc=conns[1], beat_s=0.05)
        b2.holder = "h1-again"
        tasks["b2"] = asyncio.create_task(b2.run())
        assert await _until(lambda: a._heard[1][1] == "h1-again", 5)
        await a.tick()
        assert 1 not in a.held and ev[0][-1] == ("loss", 1)
        # and a provisional partition goes back the moment its replica beats: B2 dies, the bucket elects, A
        # judges provisionally; B3 beats; A lets go without asking the bucket
        await b2.tick()
        tasks.pop("b2").cancel()
        for v in views:
            v.electing = True
        assert await _until(lambda: 1 in a.provisional, 5)
        b3 = await _leases(views[1], 1, ev[1], 3, nc=conns[1], beat_s=0.05)
        b3.holder = "h1-third"
        tasks["b3"] = asyncio.create_task(b3.run())
        assert await _until(lambda: 1 not in a.provisional, 5)
        assert ev[0][-1] == ("loss", 1) and 1 not in a.held
        assert a.provisional_takeovers == 2
    finally:
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for nc in conns:
            await nc.close()
