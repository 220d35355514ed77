"""Issue 23 (4): the node's findings as NVSentinel HealthEvents (agent/nvsentinel_event.py, agent/nvsentinel_sink.py).

NVSentinel's interface (agent/schema/nvsentinel_health_event.proto) is compiled here with grpc_tools.protoc:
every byte the hand-written encoder produces is decoded by the compiled classes, and a real gRPC server
of the compiled service listens on a Unix socket in the test's directory, as platform-connectors does.
The real agent, with [exports.nvsentinel] on, feeds it: a firing condition arrives unhealthy (fatal only
where the agent's policy says cordon), its resolution arrives healthy and clears it, NVSentinel away then
back gets every firing condition again, and a restart of the agent re-asserts what its tracker holds.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import NVSentinelConfig
from agent.emitter import ActiveCondition
from agent.message import make_message, to_dict
from agent.nvsentinel_event import ACTIONS, STORE_ONLY, encode_events, health_event
from agent.nvsentinel_sink import NVSentinelSink
from tests.conftest import ROOT

grpc = pytest.importorskip("grpc", reason="grpcio is the [nvsentinel] extra (in the test extra)")
protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is in the test extra")

PROTO = ROOT / "agent" / "schema" / "nvsentinel_health_event.proto"


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """health_event_pb2 and its _grpc module, compiled from the shipped .proto into a temporary directory."""
    out = tmp_path_factory.mktemp("pb")
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", PROTO.name])
    assert rc == 0, "protoc refused agent/schema/nvsentinel_health_event.proto"
    sys.path.insert(0, str(out))
    try:
        yield (importlib.import_module("nvsentinel_health_event_pb2"),
               importlib.import_module("nvsentinel_health_event_pb2_grpc"))
    finally:
        sys.path.remove(str(out))
        for m in ("nvsentinel_health_event_pb2", "nvsentinel_health_event_pb2_grpc"):
            sys.modules.pop(m, None)


def _msg(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"node": "gpu-001", "collector": "kmsg_xid", "kind": "condition", "type": "GPUFellOffBus",
                            "status": "firing", "severity": "critical", "entity": "gpu:0000:3b:00.0",
                            "reason": "Xid79", "message": "GPU 0000:3b:00.0 has fallen off the bus",
                            "suggested_action": "cordon", "details": {"xid": 79, "nvidia_action": "RESTART_BM"}}
    args.update(kw)
    return to_dict(make_message(**args))


def _decode(pb2: Any, data: bytes) -> Any:
    req = pb2.HealthEvents()
    req.ParseFromString(data)
    return req


def test_a_fatal_condition_decodes_field_by_field(pb: tuple[Any, Any]) -> None:
    pb2, _ = pb
    m = _msg()
    req = _decode(pb2, encode_events([health_event(m)]))
    assert req.version == 1 and len(req.events) == 1
    e = req.events[0]
    assert (e.version, e.agent, e.componentClass, e.checkName) == (1, "gpu-node-agent", "GPU", "GPUFellOffBus")
    assert e.isFatal and not e.isHealthy and e.recommendedAction == pb2.RESTART_BM
    assert list(e.errorCode) == ["79"]
    assert [(x.entityType, x.entityValue) for x in e.entitiesImpacted] == [("PCI", "0000:3b:00.0")]
    assert e.nodeName == "gpu-001" and e.id == m["id"] and e.processingStrategy == pb2.EXECUTE_REMEDIATION
    assert dict(e.metadata)["reason"] == "Xid79" and dict(e.metadata)["suggested_action"] == "cordon"
    assert e.generatedTimestamp.ToJsonString()[:19] == m["time"][:19]
    assert e.message == m["message"]


def test_what_may_quarantine_and_what_is_only_stored(pb: tuple[Any, Any]) -> None:
    pb2, _ = pb
    cases = {
        "resolved": _msg(status="resolved", severity="info", suggested_action="none"),
        "event": _msg(kind="event", status=None, type="GPUXidError", severity="critical"),
        "job": _msg(collector="nccl_logs", type="NCCLSocketFallback", entity="nccl:gpu-001:7", severity="critical",
                    suggested_action="inspect_hardware", details={}),
        "port": _msg(collector="infiniband", type="IBPortDown", entity="ib:mlx5_0/1", details={},
                     suggested_action="cordon"),
        "app xid": _msg(type="GPUXidError", severity="warning", suggested_action="none",
                        details={"xid": 13, "nvidia_action": "RESTART_APP"}),
    }
    ev = {k: _decode(pb2, encode_events([health_event(m)])).events[0] for k, m in cases.items()}
    r = ev["resolved"]
    assert r.isHealthy and not r.isFatal and list(r.errorCode) == [] and r.recommendedAction == pb2.NONE
    assert r.checkName == "GPUFellOffBus" and [x.entityValue for x in r.entitiesImpacted] == ["0000:3b:00.0"]
    assert not ev["event"].isFatal and ev["event"].processingStrategy == pb2.STORE_ONLY  # an event never clears
    assert ev["job"].componentClass == "WORKLOAD" and not ev["job"].isFatal and ev["job"].processingStrategy == 2
    assert ev["port"].componentClass == "NIC" and ev["port"].isFatal
    assert [(x.entityType, x.entityValue) for x in ev["port"].entitiesImpacted] == [("NIC", "mlx5_0"),
                                                                                   ("NIC_PORT", "mlx5_0/1")]
    assert ev["port"].recommendedAction == pb2.CONTACT_SUPPORT
    assert ev["app xid"].recommendedAction == pb2.NONE and not ev["app xid"].isFatal


@settings(max_examples=150, deadline=None)
@given(entity=st.text(max_size=300), message=st.text(max_size=3000), reason=st.text(max_size=300),
       severity=st.sampled_from(["info", "warning", "critical"]),
       action=st.sampled_from(["none", "cordon", "reload_module", "warmup", "reboot", "inspect_hardware",
                               "fix_config"]),
       bucket=st.one_of(st.none(), st.text(max_size=40)), xid=st.one_of(st.none(), st.integers(0, 1 << 40)))
def test_any_message_encodes_to_what_protobuf_decodes(pb: tuple[Any, Any], entity: str, message: str,
                                                      reason: str, severity: str, action: str, bucket: str | None,
                                                      xid: int | None) -> None:
    pb2, _ = pb
    details: dict[str, Any] = {}
    if bucket is not None:
        details["nvidia_action"] = bucket
    if xid is not None:
        details["xid"] = xid
    m = {**_msg(), "entity": entity, "message": message, "reason": reason, "severity": severity,
         "suggested_action": action, "details": details}
    h = health_event(m)
    e = _decode(pb2, encode_events([h, h])).events[1]
    assert e.checkName == "GPUFellOffBus" and e.message == message[:1024]
    assert e.isFatal == (severity == "critical" and action == "cordon")
    assert e.recommendedAction in ACTIONS.values()
    assert [(x.entityType, x.entityValue) for x in e.entitiesImpacted] == h.entities
    assert dict(e.metadata) == h.metadata and list(e.errorCode) == h.error_code


class PlatformConnector:
    """NVSentinel's platform connector as far as a monitor sees it: the compiled service on a Unix socket."""

    def __init__(self, pb: tuple[Any, Any], socket: Path) -> None:
        self.pb2, self.grpc_mod = pb
        self.socket = socket
        self.received: list[Any] = []
        self.server: Any = None

    async def start(self) -> None:
        from google.protobuf import empty_pb2

        outer = self

        class Servicer(self.grpc_mod.PlatformConnectorServicer):  # type: ignore[name-defined,misc]
            async def HealthEventOccurredV1(self, request: Any, context: Any) -> Any:
                outer.received.extend(request.events)
                return empty_pb2.Empty()

        self.server = grpc.aio.server()
        self.grpc_mod.add_PlatformConnectorServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(0)

    def state(self) -> dict[tuple[str, str], bool]:
        """What NVSentinel's fault-quarantine would hold: per (check, entities), healthy or not (the last word)."""
        out: dict[tuple[str, str], bool] = {}
        for e in self.received:
            if e.processingStrategy == self.pb2.STORE_ONLY:
                continue
            out[(e.checkName, ",".join(x.entityValue for x in e.entitiesImpacted))] = e.isHealthy
        return out


@pytest.fixture
async def connector(pb: tuple[Any, Any], tmp_path: Path) -> AsyncIterator[PlatformConnector]:
    pc = PlatformConnector(pb, tmp_path / "nvsentinel.sock")
    await pc.start()
    yield pc
    await pc.stop()


async def _until(cond: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_the_sink_reports_clears_and_reasserts_after_nvsentinel_returns(connector: PlatformConnector,
                                                                              pb: tuple[Any, Any]) -> None:
    cfg = NVSentinelConfig(enabled=True, socket=str(connector.socket), resync_seconds=3600)
    sink = NVSentinelSink(cfg, "gpu-001")
    sink.seed([ActiveCondition(collector="infiniband", type="IBPortDown", entity="ib:mlx5_3/1", severity="critical",
                               since="2026-12-05T10:00:00.000Z", message_id="01J0000000000000000000000A",
                               reason="PortDown", message="mlx5_3 port 1 DOWN", suggested_action="cordon")])
    task = asyncio.create_task(sink.run())
    try:
        await _until(lambda: connector.state() == {("IBPortDown", "mlx5_3,mlx5_3/1"): False})
        fell = make_message(node="gpu-001", collector="kmsg_xid", kind="condition", type="GPUFellOffBus",
                            status="firing", severity="critical", entity="gpu:0000:3b:00.0", reason="Xid79",
                            message="off the bus", suggested_action="cordon")
        await sink.on_message(fell)
        info = make_message(node="gpu-001", collector="kernel_modules", kind="condition", type="ModuleInfo",
                            status="firing", severity="info", entity="module:x", reason="R", message="m")
        await sink.on_message(info)  # below min_severity: not sent
        await _until(lambda: ("GPUFellOffBus", "0000:3b:00.0") in connector.state())
        assert ("ModuleInfo", "x") not in connector.state()
        await connector.stop()  # NVSentinel away: a resolution waits, nothing lost
        await sink.on_message(make_message(node="gpu-001", collector="infiniband", kind="condition",
                                           type="IBPortDown", status="resolved", severity="info",
                                           entity="ib:mlx5_3/1", reason="PortActive", message="back"))
        await _until(lambda: sink.failures >= 1)
        connector.received.clear()
        await connector.start()  # a restarted connector that lost its state
        await _until(lambda: connector.state() == {("IBPortDown", "mlx5_3,mlx5_3/1"): True,
                                                   ("GPUFellOffBus", "0000:3b:00.0"): False}, timeout=30)
        # the connector holds the events before the sink has read its answer: the sink's side, waited for
        await _until(lambda: sink.delivering and not sink.unsent)
        assert ("infiniband", "IBPortDown", "ib:mlx5_3/1") not in sink.conditions
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sink.close()


async def test_events_wait_while_nvsentinel_is_away_and_the_oldest_are_dropped_counted(tmp_path: Path) -> None:
    cfg = NVSentinelConfig(enabled=True, socket=str(tmp_path / "absent.sock"), max_pending_events=3)
    sink = NVSentinelSink(cfg, "gpu-001")
    for i in range(5):
        await sink.on_message(make_message(node="gpu-001", collector="kmsg_xid", kind="event", type="GPUXidError",
                                           severity="warning", entity=f"gpu:0000:{i:02x}:00.0", reason="Xid13",
                                           message="m"))
    assert sink.dropped_events == 2 and [e.entities[0][1] for e in sink.events] == [
        "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
    task = asyncio.create_task(sink.run())
    try:
        await _until(lambda: sink.failures >= 1)
        assert "no such socket" in sink.last_error and len(sink.events) == 3
        assert all(e.processing_strategy == STORE_ONLY for e in sink.events)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_agent_feeds_nvsentinel_and_a_restart_reasserts_its_conditions(
        connector: PlatformConnector, tmp_path: Path) -> None:
    from tests.conftest import agent_config, running_agent

    extra = f'[exports.nvsentinel]\nenabled = true\nsocket = "{connector.socket}"\n'
    cfg = agent_config(tmp_path, servers=["nats://127.0.0.1:1"], extra=extra)
    async with running_agent(cfg) as agent:
        assert agent.nvsentinel is not None
        em = agent.emitter_for("burst")
        await em.condition("GPUFellOffBus", firing=True, severity="critical", entity="gpu:0000:18:00.0",
                           reason="Xid79", message="off the bus", suggested_action="cordon")
        await _until(lambda: connector.state().get(("GPUFellOffBus", "0000:18:00.0")) is False)
    connector.received.clear()
    async with running_agent(cfg):  # restarted: transitions only on the wire, but NVSentinel hears it again
        await _until(lambda: connector.state().get(("GPUFellOffBus", "0000:18:00.0")) is False)
