"""fleet/leases.py against a real nats-server: what an election does to a lease is not a loss; another
replica's claim is; a dead replica's partition moves after two ticks without its alive key."""

from __future__ import annotations

import json
from pathlib import Path

import nats

from agent.nats_server import NatsServerProcess
from fleet.leases import Leases, alive_key, lease_key, open_bucket


async def _leases(kv: object, partition: int, events: list[tuple[str, int]], **kw: object) -> Leases:
    async def gain(p: int) -> None:
        events.append(("gain", p))

    async def loss(p: int) -> None:
        events.append(("loss", p))

    return Leases(kv, partitions=2, partition=partition, holder=f"h{partition}", ttl=60.0, on_gain=gain,
                  on_loss=loss, **kw)  # type: ignore[arg-type]


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
