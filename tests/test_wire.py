"""The central boundary (#13 deliver 2): every message decoded against its schema with identity from
the subject; anything else is refused with a reason and a sample, never raised into a view."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.emitter import ConditionTracker
from agent.message import encode, make_message, to_dict
from agent.nodestate import HEARTBEAT_MAX_BYTES, bounded
from fleet.state import FleetFeed, FleetState
from fleet.wire import Rejected, decode_action, decode_event, decode_state
from gna_types.subjects import encode_token, event_subject, heartbeat_subject

NODE = "gpu-07.example.com"


def _event(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(node=NODE, collector="kmsg_xid", kind="condition", type="GPUFellOffBus",
                                status="firing", severity="critical", entity="gpu:0000:18:00.0", reason="Xid79",
                                message="fell off the bus")
    base.update(kw)
    return to_dict(make_message(**base))


def _subject(d: dict[str, Any]) -> str:
    return event_subject(d["node"], d["collector"], d["severity"])


def test_a_valid_event_passes_unchanged() -> None:
    d = _event()
    assert decode_event(_subject(d), json.dumps(d).encode()) == d


@pytest.mark.parametrize(("mutate", "subject", "reason"), [
    (lambda d: {**d, "node": "gpu-01"}, None, "node_mismatch"),
    (lambda d: {**d, "severity": "warning"}, None, "subject_mismatch"),
    (lambda d: {**d, "entity": ["a"]}, None, "schema"),
    (lambda d: {**d, "severity": "apocalyptic"}, "gna.events.{n}.kmsg_xid.apocalyptic", "schema"),
    (lambda d: {**d, "status": None}, None, "schema"),
    (lambda d: {**d, "type": "<img src=x onerror=alert(1)>"}, None, "schema"),
    (lambda d: {k: v for k, v in d.items() if k != "id"}, None, "schema"),
    (lambda d: d, "gna.events.{n}.kmsg_xid", "bad_subject"),
    (lambda d: d, "gna.events.a b.kmsg_xid.critical", "bad_subject"),
    (lambda d: d, "gna.events._ZZ.kmsg_xid.critical", "bad_subject"),
])
def test_refusals_name_their_reason(mutate: Any, subject: str | None, reason: str) -> None:
    d = mutate(_event())
    subj = (subject or _subject(_event())).replace("{n}", encode_token(NODE))
    with pytest.raises(Rejected) as err:
        decode_event(subj, json.dumps(d).encode())
    assert err.value.reason == reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
    st.sampled_from(["node", "collector", "kind", "type", "status", "severity", "entity", "reason", "message",
                     "id", "time", "details", "schema_version"]),
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.lists(st.integers(), max_size=2))),
    st.sampled_from([event_subject(NODE, "kmsg_xid", "critical"), "gna.events.x.y", "gna.events",
                     heartbeat_subject(NODE)]))
def test_any_bytes_are_accepted_well_formed_or_refused(data: bytes, subject: str) -> None:
    """Invariant: decode_event only ever returns a schema-valid message of the subject's node, collector
    and severity, or raises Rejected; it never raises anything else."""
    try:
        d = decode_event(subject, data)
    except Rejected as exc:
        assert exc.reason in {"bad_subject", "not_json", "schema", "node_mismatch", "subject_mismatch"}
        return
    assert subject == event_subject(d["node"], d["collector"], d["severity"]) and d["node"] == NODE
    assert all(isinstance(d[k], str) for k in ("id", "time", "type", "entity", "reason", "message"))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["node", "time", "heartbeat_interval", "conditions", "conditions_complete",
                                        "agent_version"]),
                       st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=10)
                       | st.lists(st.none() | st.text(max_size=5) | st.dictionaries(
                           st.sampled_from(["type", "entity", "severity"]), st.integers() | st.text(max_size=5)),
                           max_size=3)))
@example(doc={"conditions": [{}]})  # a condition without a type: once crashed the overview (KeyError)
def test_any_state_document_is_usable_or_refused(doc: dict[str, Any]) -> None:
    fs = FleetState()
    feed = FleetFeed(fs, [])
    ok = feed.accept(heartbeat_subject(NODE), json.dumps({"node": NODE, **doc}).encode())
    # refused: counted; accepted: at most a field it carried was counted and left out (a condition's
    # unknown severity shows as none), never the document silently
    assert ok or fs.rejections.total() > 0
    assert ok or set(fs.rejections.counts) - {"unknown_severity"}
    assert not ok or set(fs.rejections.counts) <= {"unknown_severity"}
    if ok:  # whatever it carried, the views work on it
        fs.overview()
        fs.node_detail(NODE)
        fs.take_dirty()


def test_actions_and_states_are_checked_too() -> None:
    audit = {"schema_version": 1, "id": "a1", "time": "2026-12-02T10:00:00Z", "node": NODE, "remediation": "slurm",
             "rule": None, "action": "apply", "decision": "dry_run", "reason": "would drain", "dry_run": True,
             "trigger": {}, "args": {}, "result": None, "error": None}
    subj = f"gna.actions.{encode_token(NODE)}.slurm"
    assert decode_action(subj, json.dumps(audit).encode())["node"] == NODE
    for bad, reason in [({**audit, "node": "other"}, "node_mismatch"), ({**audit, "decision": "yolo"}, "schema"),
                        ({**audit, "remediation": "kubernetes"}, "subject_mismatch"),
                        ({**audit, "dry_run": "no"}, "schema")]:
        with pytest.raises(Rejected) as err:
            decode_action(subj, json.dumps(bad).encode())
        assert err.value.reason == reason
    for bad_state in [b"[]", b'{"node": "other"}', b'{"node": "%s", "conditions": "x"}' % NODE.encode(),
                      b'{"node": "%s", "heartbeat_interval": -1}' % NODE.encode(),
                      b'{"node": "%s", "conditions": [{"type": 5}]}' % NODE.encode()]:
        with pytest.raises(Rejected):
            decode_state(NODE, bad_state)


def test_the_feed_counts_every_refusal_with_a_sample() -> None:
    fs = FleetState()
    feed = FleetFeed(fs, [])
    good = _event()
    assert feed.accept(_subject(good), encode(make_message(**{k: good[k] for k in (
        "node", "collector", "kind", "type", "status", "severity", "entity", "reason", "message")})))
    assert not feed.accept(_subject(good), b"<script>alert(1)</script>")
    assert not feed.accept(heartbeat_subject(NODE), b'{"node": "someone-else"}')
    assert not feed.accept("gna.bogus.x", b"{}")
    assert fs.rejected == {"not_json": 1, "node_mismatch": 1, "bad_subject": 1}
    assert fs.rejections.samples["not_json"]["data"] == "<script>alert(1)</script>"
    assert NODE in fs.nodes and len(fs.nodes[NODE].conditions) == 1


def test_a_heartbeat_never_exceeds_its_bound_and_the_fleet_keeps_what_it_left_out() -> None:
    tracker = ConditionTracker(None)
    conds = []
    for i in range(3000):
        m = make_message(node=NODE, collector="nccl_logs", kind="condition", type="NCCLSocketFallback",
                         status="firing", severity="critical" if i % 100 == 0 else "warning",
                         entity=f"nccl:host{i}:{i}", reason="SocketTransport", message="x" * 2000)
        tracker.record(m)
        conds.append(to_dict(m))
    doc = {"schema_version": 1, "node": NODE, "time": "2026-12-02T10:00:00Z", "heartbeat_interval": 10.0}
    body = bounded(doc, tracker.snapshot(), HEARTBEAT_MAX_BYTES)
    assert len(body) <= HEARTBEAT_MAX_BYTES
    hb = json.loads(body)
    assert hb["conditions_total"] == 3000 and hb["conditions_complete"] is False
    assert 0 < len(hb["conditions"]) < 3000
    assert all(c["severity"] == "critical" for c in hb["conditions"][:30])  # the worst first
    fs = FleetState()
    feed = FleetFeed(fs, [])
    for c in conds[:5]:  # the fleet already knew these from the event stream
        assert feed.accept(_subject(c), json.dumps(c).encode())
    assert feed.accept(heartbeat_subject(NODE), body)
    nv = fs.nodes[NODE]
    assert all(f"nccl_logs|NCCLSocketFallback|{c['entity']}" in nv.conditions for c in conds[:5])
    assert fs.row(nv, 0)["active"] == 3000
    # a complete heartbeat is the truth again: what it does not carry has resolved
    small = bounded(doc, tracker.snapshot()[:2], HEARTBEAT_MAX_BYTES)
    assert feed.accept(heartbeat_subject(NODE), small)
    assert len(nv.conditions) == 2 and fs.row(nv, 0)["active"] == 2
