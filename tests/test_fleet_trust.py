"""Fleet side trust (#13 D4, D5): identity from the subject, unknown enums, times from the wire."""

from __future__ import annotations

import asyncio
import json
import time

import nats

from agent.message import rfc3339
from agent.nats_server import NatsServerProcess
from fleet.state import FleetFeed, FleetState


def _cond(sev: str) -> dict[str, object]:
    return {"collector": "c", "type": "IBPortDown", "entity": "ib:mlx5_0/1", "severity": sev, "reason": "R",
            "message": "m", "since": rfc3339()}


def test_unknown_severity_never_breaks_a_view() -> None:
    st = FleetState()
    st.apply_message({"node": "n1", "type": "IBPortDown", "kind": "condition", "status": "firing",
                      "severity": "apocalyptic", "entity": "ib:mlx5_0/1", "collector": "c", "time": rfc3339()},
                     subject_node="n1")
    st.apply_state({"node": "n2", "time": rfc3339(), "conditions": [_cond("mega")]}, subject_node="n2")
    rows = st.overview(severity="warning")  # used to raise KeyError (500 on /api/overview)
    assert rows == [] and st.node_detail("n1") is not None and len(st.overview()) == 2
    assert st.rejected["unknown_severity"] == 2


def test_a_payload_naming_another_node_is_rejected_and_2099_is_clamped() -> None:
    st = FleetState()
    st.apply_state({"node": "nodea", "time": "2099-01-01T00:00:00Z", "conditions": []}, subject_node="nodeb")
    assert "nodea" not in st.nodes and st.rejected["node_mismatch"] == 1
    st.apply_state({"node": "nodeb", "time": "2099-01-01T00:00:00Z", "heartbeat_interval": 1,
                    "conditions": []}, subject_node="nodeb")
    assert st.nodes["nodeb"].last_seen <= time.time()
    assert st.nodes["nodeb"].stale(time.time() + 10), "a forged future time does not keep a node fresh"


async def test_the_feed_takes_identity_from_the_subject(nats_server: NatsServerProcess) -> None:
    state = FleetState()
    feed = FleetFeed(state, [nats_server.url])
    await feed.start()
    nc = await nats.connect(nats_server.url)
    try:
        spoof = {"node": "nodea", "time": rfc3339(), "heartbeat_interval": 10, "conditions": [_cond("critical")]}
        await nc.publish("gna.heartbeat.nodeb", json.dumps(spoof).encode())
        await nc.publish("gna.heartbeat.nodec", json.dumps({**spoof, "node": "nodec"}).encode())
        await nc.flush()
        for _ in range(100):
            if "nodec" in state.nodes:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
        await feed.stop()
    assert "nodec" in state.nodes and "nodea" not in state.nodes and "nodeb" not in state.nodes
    assert state.rejected["node_mismatch"] == 1


def test_pages_carry_a_strict_csp_that_allows_only_their_own_blocks() -> None:
    """#13 D3: injected markup cannot run even if a page ever put data into innerHTML unescaped; the
    real-browser tests in tests/test_dashboard.py prove the pages' own scripts still run under it."""
    from fleet.dashboard import _page, csp

    for name in ("dashboard.html", "node.html"):
        policy = csp(_page(name))
        assert "script-src 'sha256-" in policy and "'unsafe-inline'" not in policy and "default-src 'none'" in policy
        assert "frame-ancestors 'none'" in policy
