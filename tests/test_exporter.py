"""Issue 23 (4): the fleet's events as CloudEvents 1.0 over HTTP (fleet/cloudevents.py, fleet/exporter.py).

A real nats-server (JetStream, the shipped stream settings) and a real HTTP receiver on loopback (aiohttp)
that can be told to be away, to answer 503, or to refuse given events: every accepted message reaches
the receiver at least once with its own id, what the receiver refuses is given up and counted without
stalling the rest, and what the fleet's boundary refuses (a node speaking for another) is never
exported. The CloudEvent's attributes are checked against the specification's own rules
(cloudevents/spec 1.0.2: required attributes, naming, RFC 3339 time, URI-reference source).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from agent.config import NatsConfig
from agent.message import make_message, to_dict
from agent.nats_link import stream_configs
from agent.nats_server import NatsServerProcess
from fleet.cloudevents import (
    BATCH_CONTENT_TYPE,
    CONTENT_TYPE,
    EXTENSION_NAME,
    check_type_prefix,
    to_cloudevent,
)
from fleet.exporter import CloudEventsExporter, ExportSettings, Outcome, classify, redacted
from fleet.otlp_logs import logs_request
from gna_types.subjects import event_subject

CORE = ("specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data",
        "data_base64")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _spec_valid(ce: dict[str, Any]) -> None:
    """cloudevents/spec cloudevents/spec.md (1.0.2), the rules a receiver's SDK enforces."""
    assert ce["specversion"] == "1.0"
    for a in ("id", "source", "type"):
        assert isinstance(ce[a], str) and ce[a], a
    for name in ce:
        assert name in CORE or EXTENSION_NAME.match(name), f"extension attribute {name!r}"
    assert RFC3339.match(ce["time"]), ce["time"]
    dt.datetime.fromisoformat(ce["time"].replace("Z", "+00:00"))
    assert "subject" not in ce or ce["subject"]
    src = ce["source"]  # a URI-reference: nothing a URI may not hold unescaped
    assert not re.search(r"[\s\"<>\\^`{|}\x00-\x1f\x7f]", src) and urlsplit(src).path == src, src
    for ext in ("severitynumber",):
        assert isinstance(ce[ext], int) and ce[ext] >= 0
    json.dumps(ce)


def _otlp_valid(body: dict[str, Any]) -> Any:
    """Parsed by the compiled classes of opentelemetry-proto (unknown fields refused): the JSON mapping holds."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

    return json_format.ParseDict(body, logs_service_pb2.ExportLogsServiceRequest())


def _attrs(holder: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values()), None) for a in holder.get("attributes", [])}


def _msg(node: str = "gpu-001", **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"collector": "infiniband", "kind": "condition", "type": "IBPortDown", "status": "firing",
                            "severity": "critical", "entity": "ib:mlx5_0/1", "reason": "PortDown",
                            "message": "mlx5_0 port 1 is DOWN", "suggested_action": "cordon"}
    args.update(kw)
    return to_dict(make_message(node=node, **args))


def test_a_message_is_a_valid_cloudevent_with_its_own_id_and_its_subject_node_as_source() -> None:
    m = _msg()
    ce = to_cloudevent(m, type_prefix="com.example.gpu")
    _spec_valid(ce)
    assert ce["id"] == m["id"] and ce["source"] == "/gpu-node-agent/nodes/gpu-001"
    assert ce["type"] == "com.example.gpu.infiniband.IBPortDown" and ce["subject"] == "ib:mlx5_0/1"
    assert (ce["severitytext"], ce["severitynumber"]) == ("ERROR", 17)
    assert (ce["gnakind"], ce["gnastatus"], ce["gnaaction"]) == ("condition", "firing", "cordon")
    assert ce["data"] == m and ce["datacontenttype"] == "application/json"
    ev = to_cloudevent(_msg(kind="event", status=None, severity="info", entity="", suggested_action="none"))
    assert "subject" not in ev and "gnastatus" not in ev and ev["severitynumber"] == 9


@given(node=st.text(min_size=1, max_size=253), entity=st.text(max_size=200),
       severity=st.sampled_from(["info", "warning", "critical"]))
def test_whatever_a_node_or_entity_is_called_the_event_stays_valid(node: str, entity: str, severity: str) -> None:
    m = {**_msg(), "node": node, "entity": entity, "severity": severity}
    _spec_valid(to_cloudevent(m))


@pytest.mark.parametrize("prefix", ["", "gpu", "com..example", "com.example.", "com example.x", "a." * 120 + "b"])
def test_a_type_prefix_that_is_no_reverse_dns_name_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError):
        check_type_prefix(prefix)
    assert check_type_prefix("com.example.gpu-fleet") == "com.example.gpu-fleet"


def test_messages_are_otlp_logs_one_resource_per_node() -> None:
    msgs = [_msg(node="gpu-001"), _msg(node="gpu-002", kind="event", status=None, severity="warning",
                                          details={"xid": 13, "pids": [1, 2], "nested": {"a": None, "b": 1.5}}),
            _msg(node="gpu-001", entity="ib:mlx5_1/1")]
    req = _otlp_valid(logs_request(msgs, type_prefix="com.example.gpu"))
    assert [r.resource.attributes[0].value.string_value for r in req.resource_logs] == ["gpu-001", "gpu-002"]
    first = req.resource_logs[0].scope_logs[0].log_records
    assert len(first) == 2 and first[0].severity_number == 17 and first[0].severity_text == "ERROR"
    assert first[0].event_name == "com.example.gpu.infiniband.IBPortDown"
    assert first[0].body.string_value == msgs[0]["message"]
    assert {a.key: a.value.string_value for a in first[0].attributes}["gna.id"] == msgs[0]["id"]
    t = dt.datetime.fromisoformat(msgs[0]["time"].replace("Z", "+00:00"))
    assert first[0].time_unix_nano == int(t.timestamp() * 1000) * 1_000_000
    ev = req.resource_logs[1].scope_logs[0].log_records[0]
    details = {a.key: a.value for a in ev.attributes}["gna.details"].kvlist_value
    got = {kv.key: kv.value for kv in details.values}
    assert got["xid"].int_value == 13 and [v.int_value for v in got["pids"].array_value.values] == [1, 2]
    assert ev.severity_number == 13


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=30)


@given(details=st.dictionaries(st.text(max_size=10), json_values, max_size=6), message=st.text(max_size=200),
       time=st.text(max_size=30))
def test_any_details_and_any_time_make_a_request_protobuf_accepts(details: dict[str, Any], message: str,
                                                                   time: str) -> None:
    m = {**_msg(), "details": details, "message": message, "time": time}
    req = _otlp_valid(logs_request([m]))
    rec = req.resource_logs[0].scope_logs[0].log_records[0]
    assert rec.body.string_value == message


@pytest.mark.parametrize(("status", "outcome"), [
    (200, Outcome.OK), (None, Outcome.RETRY), (429, Outcome.RETRY), (502, Outcome.RETRY), (503, Outcome.RETRY),
    (504, Outcome.RETRY), (500, Outcome.REFUSED), (400, Outcome.REFUSED), (408, Outcome.REFUSED)])
def test_otlp_answers_are_classified_as_its_specification_says(status: int | None, outcome: str) -> None:
    assert classify(status, "otlp") == outcome


async def test_otlp_export_through_a_failing_receiver_and_a_refused_record(nats_server: NatsServerProcess,
                                                                           receiver: Receiver) -> None:
    nc, js = await _stream(nats_server.url)
    msgs = [_msg(node=f"gpu-{i % 3:03d}", entity=f"ib:mlx5_{i}/1") for i in range(12)]
    receiver.refuse = {msgs[4]["id"]}
    receiver.fail = 3
    await _publish(js, msgs)
    exp = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url, format="otlp", mode="batch",
                                                               batch=6, durable="gna-export-otlp"))
    await exp.start()
    try:
        await _until(lambda: exp.exported + sum(exp.refused.values()) == len(msgs))
        assert exp.refused == {400: 1} and exp.refused_ids == [msgs[4]["id"]] and exp.retries >= 3
        assert sorted(e["id"] for e in receiver.accepted) == sorted(m["id"] for m in msgs if m is not msgs[4])
        assert {e["host"] for e in receiver.accepted} == {"gpu-000", "gpu-001", "gpu-002"}
        assert await _pending(js, "gna-export-otlp") == (0, 0)
    finally:
        await exp.stop()
        await nc.close()


@pytest.mark.parametrize(("status", "outcome"), [
    (200, Outcome.OK), (202, Outcome.OK), (204, Outcome.OK), (None, Outcome.RETRY), (408, Outcome.RETRY),
    (429, Outcome.RETRY), (500, Outcome.RETRY), (503, Outcome.RETRY), (301, Outcome.REFUSED),
    (400, Outcome.REFUSED), (401, Outcome.REFUSED), (413, Outcome.REFUSED), (415, Outcome.REFUSED)])
def test_each_answer_is_classified(status: int | None, outcome: str) -> None:
    assert classify(status) == outcome


def test_a_url_s_credentials_never_reach_a_log() -> None:
    assert redacted("https://user:s3cret@broker.example:8443/ns/default?token=abc") == \
        "https://broker.example:8443/ns/default"
    assert "s3cret" not in redacted("http://:s3cret@[::1]:80/x") and redacted("http://[::1]:80/x") == "http://[::1]:80/x"


class Receiver:
    """An HTTP receiver of CloudEvents on loopback: answers 503 ``fail`` times first, refuses ``refuse`` ids
    (400), and records what it accepted."""

    def __init__(self) -> None:
        self.fail = 0
        self.refuse: set[str] = set()
        self.accepted: list[dict[str, Any]] = []
        self.requests = 0
        self.content_types: set[str] = set()
        self.hang = False
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.hang:
            while self.hang:  # no answer while hung; released (503) when the test lets it go
                await asyncio.sleep(0.05)
            return web.Response(status=503)
        if self.fail > 0:
            self.fail -= 1
            return web.Response(status=503)
        self.content_types.add(request.content_type)
        body = json.loads(await request.read())
        if request.content_type == "application/json":  # OTLP/HTTP JSON: records, each with its gna.id
            _otlp_valid(body)
            events = [{"id": _attrs(r)["gna.id"], "record": r, "host": _attrs(rl["resource"])["host.name"]}
                      for rl in body["resourceLogs"] for sl in rl["scopeLogs"] for r in sl["logRecords"]]
        else:
            events = body if request.content_type == BATCH_CONTENT_TYPE else [body]
            for e in events:
                _spec_valid(e)
        if any(e["id"] in self.refuse for e in events):
            return web.Response(status=400, text="refused")
        self.accepted.extend(events)
        return web.Response(status=202)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/events", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    r.url = f"http://127.0.0.1:{port}/events"
    yield r
    r.hang = False
    await runner.cleanup()


async def _stream(url: str) -> tuple[Any, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for cfg in stream_configs(NatsConfig()):
        await js.add_stream(cfg)
    return nc, js


async def _publish(js: Any, msgs: list[dict[str, Any]], subject_node: str | None = None) -> None:
    for m in msgs:
        await js.publish(event_subject(subject_node or m["node"], m["collector"], m["severity"]),
                         json.dumps(m).encode(), headers={"Nats-Msg-Id": m["id"]})


async def _until(cond: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.05)


async def _pending(js: Any, durable: str = "gna-export-cloudevents") -> tuple[int, int]:
    info = await js.consumer_info("GNA_EVENTS", durable)
    return info.num_pending, info.num_ack_pending


async def test_every_event_arrives_once_with_its_id_through_an_absent_then_failing_receiver(
        nats_server: NatsServerProcess, receiver: Receiver) -> None:
    nc, js = await _stream(nats_server.url)
    msgs = [_msg(node=f"gpu-{i % 7:03d}", entity=f"ib:mlx5_{i % 8}/1") for i in range(120)]
    await _publish(js, msgs)
    receiver.fail = 5  # away first (503), then accepting
    exp = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url, batch=32))
    await exp.start()
    try:
        await _until(lambda: exp.exported == len(msgs))
        assert exp.retries >= 5 and not exp.refused and not exp.rejected
        assert sorted(e["id"] for e in receiver.accepted) == sorted(m["id"] for m in msgs)  # once each
        assert receiver.content_types == {CONTENT_TYPE}
        assert {e["source"] for e in receiver.accepted} == {f"/gpu-node-agent/nodes/gpu-{i:03d}" for i in range(7)}
        await _until(lambda: True)
        assert await _pending(js) == (0, 0)  # every one acknowledged
    finally:
        await exp.stop()
        await nc.close()


async def test_a_refused_event_is_given_up_and_counted_without_stalling_the_others(
        nats_server: NatsServerProcess, receiver: Receiver) -> None:
    nc, js = await _stream(nats_server.url)
    msgs = [_msg(entity=f"ib:mlx5_{i}/1") for i in range(8)]
    receiver.refuse = {msgs[2]["id"], msgs[5]["id"]}
    await _publish(js, msgs)
    for mode in ("single", "batch"):
        exp = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url, mode=mode, batch=8,
                                                                   durable=f"gna-export-{mode}"))
        receiver.accepted.clear()
        await exp.start()
        try:
            await _until(lambda e=exp: e.exported + sum(e.refused.values()) == len(msgs))  # type: ignore[misc]
            assert exp.refused == {400: 2} and sorted(exp.refused_ids) == sorted(receiver.refuse)
            assert sorted(e["id"] for e in receiver.accepted) == sorted(
                m["id"] for m in msgs if m["id"] not in receiver.refuse)
            assert await _pending(js, f"gna-export-{mode}") == (0, 0)  # refused ones terminated, not redelivered
        finally:
            await exp.stop()
    assert BATCH_CONTENT_TYPE in receiver.content_types  # batch mode sent arrays, then split the refused one
    await nc.close()


async def test_a_node_speaking_for_another_is_never_exported(nats_server: NatsServerProcess,
                                                             receiver: Receiver) -> None:
    nc, js = await _stream(nats_server.url)
    lie = _msg(node="gpu-002")  # payload says gpu-002, published on gpu-001's subject
    good = _msg(node="gpu-001")
    await _publish(js, [lie], subject_node="gpu-001")
    await _publish(js, [good])
    exp = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url))
    await exp.start()
    try:
        await _until(lambda: exp.exported == 1 and sum(exp.rejected.values()) == 1)
        assert [e["id"] for e in receiver.accepted] == [good["id"]]
        assert await _pending(js) == (0, 0)
    finally:
        await exp.stop()
        await nc.close()


async def test_a_stopped_exporter_loses_nothing_and_the_next_one_resumes(nats_server: NatsServerProcess,
                                                                         receiver: Receiver) -> None:
    nc, js = await _stream(nats_server.url)
    first = [_msg(entity=f"ib:mlx5_{i}/1") for i in range(10)]
    await _publish(js, first)
    exp = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url, batch=4))
    await exp.start()
    await _until(lambda: exp.exported == 10)
    receiver.hang = True  # the receiver stops answering mid-stream: the exporter is stopped while waiting
    later = [_msg(entity=f"ib:mlx5_{i}/2") for i in range(6)]
    await _publish(js, later)
    await _until(lambda: receiver.requests > 10)
    await exp.stop(timeout=0.5)
    receiver.hang = False
    exp2 = CloudEventsExporter([nats_server.url], ExportSettings(url=receiver.url, batch=4))
    exp2.s.timeout_s = 5.0
    await exp2.start()
    try:
        await _until(lambda: {m["id"] for m in first + later} <= {e["id"] for e in receiver.accepted}, timeout=90)
        await _until(lambda: exp2.exported >= 6)
        assert await _pending(js) == (0, 0)
    finally:
        await exp2.stop()
        await nc.close()


def test_cli_refuses_a_bad_url_prefix_and_an_unreadable_auth_file(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "agent.cli", "export", "cloudevents", "--nats", "nats://127.0.0.1:1"]
    r = subprocess.run([*base, "--url", "ftp://x/"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "--url must be an http" in r.stderr
    r = subprocess.run([*base, "--url", "http://127.0.0.1:1/", "--type-prefix", "nodots"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 64 and "reverse-DNS" in r.stderr
    r = subprocess.run([*base, "--url", "http://127.0.0.1:1/", "--auth-file", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 66 and "--auth-file" in r.stderr
    r = subprocess.run([*base, "--url", "http://127.0.0.1:1/", "--connect-timeout", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 69, r.stderr
