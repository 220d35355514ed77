"""#20 deliver 4: every stream and bucket is the admin step's (`gpu-node-agent nats setup`), and every opener
(NatsLink.ensure_stream, NatsLink.kv, open_kv, the budget, the leases, setup itself) refuses one carrying a
republish, sources, a mirror or a subject transform it did not ask for, loudly. Against a real nats-server
(tests/conftest.py `nats_server`): the attack of the issue is reproduced first (a GNA_SIGNALS with a republish
really lands "node B's" event in GNA_EVENTS), then refused."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, RePublish, StreamConfig, StreamSource, SubjectTransform

from agent import config as configmod
from agent.metrics import AgentMetrics
from agent.nats_link import (
    JOBS_STREAM_SUBJECTS,
    STREAM_SUBJECTS,
    NatsLink,
    StreamMissing,
    StreamRefused,
    ensure_stream,
    open_kv,
    stream_configs,
)
from agent.nats_server import NatsServerProcess
from agent.remediation.budget import BudgetUnavailable, FleetBudget
from fleet import leases
from fleet.nats_permissions import Names
from fleet.nats_setup import EX_DATAERR, EX_NOINPUT, EX_OK, exit_code, setup, wanted
from tests.conftest import AGENT_CMD

# onto node B's critical events (what the cordoner acts on): gna.signals.<node>.<collector> ->
# gna.events.gpu-b.<collector>.critical (a republish's destination must use the source's wildcards)
SIGNALS_TO_B = RePublish(src="gna.signals.*.*", dest="gna.events.gpu-b.{{wildcard(2)}}.critical")
B_EVENTS = "gna.events.gpu-b.>"


async def _cli(*argv: str) -> tuple[int, str, str]:
    """`gpu-node-agent ...` as the admin runs it: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(*AGENT_CMD, *argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _cfg() -> configmod.AgentConfig:
    return configmod.parse("", file="<test>").agent


@pytest.fixture
async def nc(nats_server: NatsServerProcess) -> AsyncIterator[Client]:
    c = await nats.connect(nats_server.url)
    yield c
    await c.close()


def _signals(**foreign: Any) -> StreamConfig:
    return StreamConfig(name="GNA_SIGNALS", subjects=["gna.signals.>"], **foreign)


def test_setup_knows_every_name_the_layout_grants() -> None:
    """What setup creates is exactly what fleet/nats_permissions.py Names grants access to (and the code opens)."""
    n = Names()
    assert {w.name for w in wanted(_cfg())} == {
        n.stream, n.jobs_stream, n.signals_stream, n.nodes_bucket, n.budget_bucket, n.incidents_bucket,
        n.stragglers_bucket, n.leases_bucket}


async def test_setup_creates_everything_then_only_verifies(nc: Client) -> None:
    js = nc.jetstream()
    first = await setup(js, wanted(_cfg()))
    assert [(o.kind, o.status) for o in first] == [("stream", "created")] * 3 + [("bucket", "created")] * 5
    assert exit_code(first) == EX_OK
    again = await setup(js, wanted(_cfg()))
    assert {o.status for o in again} == {"verified"} and exit_code(again) == EX_OK
    # created as the code uses them: the agent's own stream settings, the leases' ttl
    info = await js.stream_info("GNA_JOBS")
    assert info.config.subjects == JOBS_STREAM_SUBJECTS and info.config.max_msgs_per_subject == 1024
    assert (await js.stream_info("KV_gna-correlator-leases")).config.max_age == leases.DEFAULT_TTL
    # an operator's tuning is kept, and reported
    await js.update_stream(dataclasses.replace((await js.stream_info("GNA_EVENTS")).config, max_age=3600.0))
    tuned = {o.name: o for o in await setup(js, wanted(_cfg()))}
    assert tuned["GNA_EVENTS"].status == "verified" and "max_age 3600" in tuned["GNA_EVENTS"].detail


async def test_republish_stream_is_the_attack_and_is_refused(nc: Client, nats_server: NatsServerProcess) -> None:
    """The issue's attack: GNA_SIGNALS created first with a republish onto node B's events. It works (B's event
    lands in GNA_EVENTS); ensure_stream, NatsLink.ensure_stream and `nats setup` all refuse that stream."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS))
    await js.add_stream(_signals(republish=SIGNALS_TO_B))
    await js.publish("gna.signals.gpu-a.straggler", b'{"from": "A"}')
    stored: dict[str, int] = {}
    for _ in range(100):
        stored = (await js.stream_info("GNA_EVENTS", subjects_filter=B_EVENTS)).state.subjects or {}
        if stored:
            break
        await asyncio.sleep(0.02)
    assert stored == {"gna.events.gpu-b.straggler.critical": 1}, "the attack was not reproduced"

    want = next(s for s in stream_configs(_cfg().nats) if s.name == "GNA_SIGNALS")
    with pytest.raises(StreamRefused, match=r"stream GNA_SIGNALS .*republish gna\.signals\.\*\.\* -> gna\.events\.gpu-b"):
        await ensure_stream(js, want)
    link = NatsLink(configmod.NatsConfig(servers=[nats_server.url]), [nats_server.url], AgentMetrics(), name="t")
    await link.connect()
    try:
        with pytest.raises(StreamRefused, match="GNA_SIGNALS"):
            await link.ensure_stream()
        assert not link.stream_ready  # the forwarder publishes nothing while it is refused
    finally:
        await link.close()

    rc, out, err = await _cli("nats", "setup", "--nats", nats_server.url)
    assert rc == EX_DATAERR, out + err
    assert "REFUSED" in out and "GNA_SIGNALS" in out and "republish" in out, out
    assert "refused" in err and "Traceback" not in err
    info = await js.stream_info("GNA_SIGNALS")  # setup never changes an existing stream
    assert info.config.republish is not None and info.config.republish.dest == SIGNALS_TO_B.dest


@pytest.mark.parametrize("foreign", ["mirror", "sources", "subject_transform", "extra_subject"])
async def test_other_foreign_stream_settings_are_refused(nc: Client, foreign: str) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="ELSEWHERE", subjects=["elsewhere.>"]))
    if foreign == "mirror":
        cfg = StreamConfig(name="GNA_JOBS", mirror=StreamSource(name="ELSEWHERE"))
    elif foreign == "sources":
        cfg = StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS, sources=[StreamSource(name="ELSEWHERE")])
    elif foreign == "subject_transform":  # rewrites the node token of every stored subject: gna.jobs.<job>.<node>.x
        cfg = StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS, subject_transform=SubjectTransform(
            src="gna.jobs.*.*.*", dest="gna.jobs.{{wildcard(1)}}.gpu-b.{{wildcard(3)}}"))
    else:
        cfg = StreamConfig(name="GNA_JOBS", subjects=[*JOBS_STREAM_SUBJECTS, "$KV.gna-incidents.>"])
    await js.add_stream(cfg)
    want = next(s for s in stream_configs(_cfg().nats) if s.name == "GNA_JOBS")
    words = {"mirror": "mirror of ELSEWHERE", "sources": "sources ELSEWHERE", "subject_transform": "subject_transform",
             "extra_subject": "extra subjects"}[foreign]
    with pytest.raises(StreamRefused, match=f"GNA_JOBS .*{words}"):
        await ensure_stream(js, want)
    outcomes = {o.name: o for o in await setup(js, wanted(_cfg()))}
    assert outcomes["GNA_JOBS"].status == "refused" and words in outcomes["GNA_JOBS"].detail
    assert outcomes["GNA_EVENTS"].status == "created"  # the others are still created
    assert exit_code(list(outcomes.values())) == EX_DATAERR


@pytest.mark.parametrize("foreign", ["republish", "mirror", "sources"])
async def test_foreign_bucket_is_refused_by_every_opener(nc: Client, foreign: str) -> None:
    """A KV bucket (its stream KV_<bucket>) carrying a republish, a mirror or sources is refused by open_kv, by
    the budget (unavailable: no cordon), the leases opener and setup."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="ELSEWHERE", subjects=["elsewhere.>"]))
    for bucket in ("gna-incidents", "gna-budget", leases.LEASES_BUCKET):
        if foreign == "republish":  # every incident write would also land as "node B's" critical event
            await js.create_key_value(KeyValueConfig(bucket=bucket, history=5,
                                                     republish=RePublish(src=">", dest="gna.events.gpu-b.>")))
        else:
            src = StreamSource(name="ELSEWHERE")
            await js.add_stream(StreamConfig(
                name=f"KV_{bucket}", max_msgs_per_subject=5, allow_rollup_hdrs=True,
                **({"mirror": src} if foreign == "mirror" else {"subjects": [f"$KV.{bucket}.>"], "sources": [src]})))
    with pytest.raises(StreamRefused, match=f"bucket gna-incidents .*{foreign}"):
        await open_kv(js, "gna-incidents", create_with=KeyValueConfig(bucket="gna-incidents", history=5))
    with pytest.raises(BudgetUnavailable, match=f"gna-budget .*{foreign}"):
        await FleetBudget(js, max_nodes=5).take("gpu-a", "test")
    with pytest.raises(StreamRefused, match=leases.LEASES_BUCKET):
        await leases.open_bucket(js)
    outcomes = {o.name: o for o in await setup(js, wanted(_cfg()))}
    assert {n: o.status for n, o in outcomes.items() if o.kind == "bucket"} == {
        "gna-nodes": "created", "gna-stragglers": "created", "gna-budget": "refused", "gna-incidents": "refused",
        leases.LEASES_BUCKET: "refused"}


async def test_open_kv_creates_only_when_asked_and_check_creates_nothing(nc: Client,
                                                                         nats_server: NatsServerProcess) -> None:
    js = nc.jetstream()
    with pytest.raises(StreamMissing, match=r"bucket gna-stragglers .*nats setup"):
        await open_kv(js, "gna-stragglers")
    rc, out, _ = await _cli("nats", "setup", "--check", "--nats", nats_server.url)
    assert rc == EX_NOINPUT and out.count("MISSING") == 8, out
    assert [s async for s in _streams(js)] == []  # --check created nothing
    kv = await open_kv(js, "gna-stragglers", create_with=KeyValueConfig(bucket="gna-stragglers", history=5))
    await kv.put("k", b"v")
    assert (await (await open_kv(js, "gna-stragglers")).get("k")).value == b"v"  # then opened, verified
    rc, report, _ = await _cli("nats", "setup", "--nats", nats_server.url)
    assert rc == EX_OK and "verified bucket gna-stragglers" in " ".join(report.split()), report
    assert report.count("created") == 7
    assert (await _cli("nats", "setup", "--check", "--nats", nats_server.url))[0] == EX_OK


async def _streams(js: Any) -> AsyncIterator[str]:
    for name in await js.streams_info():
        yield name.config.name


async def test_the_agent_on_a_bare_server_still_creates_what_is_missing(nats_server: NatsServerProcess) -> None:
    """Dev and test set-ups (no permissions: the demo, a bare nats-server): the link creates the streams and the
    bucket with setup's own settings; a second link verifies them."""
    ncfg = configmod.NatsConfig(servers=[nats_server.url])
    for _ in range(2):
        link = NatsLink(ncfg, [nats_server.url], AgentMetrics(), name="t")
        await link.connect()
        try:
            await link.ensure_stream()
            await (await link.kv()).put("node", json.dumps({"ok": True}).encode())
            assert link.stream_ready
        finally:
            await link.close()
    nc = await nats.connect(nats_server.url)
    try:
        outcomes = await setup(nc.jetstream(), wanted(_cfg()))
        assert {o.name: o.status for o in outcomes if o.status == "verified"} == {
            "GNA_EVENTS": "verified", "GNA_JOBS": "verified", "GNA_SIGNALS": "verified", "gna-nodes": "verified"}
        assert {o.detail for o in outcomes if o.kind == "stream"} == {""}  # exactly setup's settings
    finally:
        await nc.close()


async def test_a_reader_waits_for_a_missing_stream_and_refuses_a_foreign_one(nc: Client) -> None:
    """await_stream (the correlator's and views' opener): waits, without creating, until the admin made the
    stream, then verifies it; a stream carrying a republish is refused at once, never waited on."""
    from agent.nats_link import await_stream

    js = nc.jetstream()
    events, _jobs, signals = stream_configs(_cfg().nats)
    waiting = asyncio.ensure_future(await_stream(js, events, interval=0.05))
    await asyncio.sleep(0.3)
    assert not waiting.done() and await js.streams_info() == []  # it created nothing
    await setup(js, [w for w in wanted(_cfg()) if w.name == "GNA_EVENTS"])
    assert await asyncio.wait_for(waiting, 5) == "verified"
    await js.add_stream(_signals(republish=SIGNALS_TO_B))
    with pytest.raises(StreamRefused, match="GNA_SIGNALS"):
        await asyncio.wait_for(await_stream(js, signals, interval=0.05), 2)
