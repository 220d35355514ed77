"""#16 deliver 4: the fleet names the one GPU or link of a job that is worse than its peers, before any timeout.

Fleets come from sim/stragglers.py: every node's StragglerSignals vectors (the shape collectors/nvml.py
and collectors/infiniband.py publish, docs/straggler-signals.md) and its jobs' membership, with
healthy noise everywhere and one degraded device.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.nats_server import NatsServerProcess
from fleet.stragglers import MIN_PEERS, detect, devices_of
from sim.stragglers import FAULTS, generate


@pytest.mark.parametrize("fault", FAULTS)
def test_each_degradation_is_named_and_nothing_else(fault: str) -> None:
    for seed in range(3):
        sc = generate(seed, nodes=64, fault=fault)
        found = detect(sc.messages)
        assert sc.score(found) == {"tp": len(sc.expected), "fp": 0, "fn": 0}, (fault, seed, found)
        for rec in found:
            assert rec["signals"] and 0.8 <= rec["confidence"] <= 1.0 and rec["jobs"]


def test_randomized_fleets_precision_and_recall() -> None:
    total = {"tp": 0, "fp": 0, "fn": 0}
    for seed in range(500, 560):
        sc = generate(seed, nodes=64 + seed % 3 * 32)
        for k, v in sc.score(detect(sc.messages)).items():
            total[k] += v
    assert total["tp"] / max(1, total["tp"] + total["fp"]) >= 0.99, total
    assert total["tp"] / max(1, total["tp"] + total["fn"]) >= 0.9, total


def _vectors(sc_messages: list[dict[str, Any]], collector: str) -> list[dict[str, Any]]:
    key = "gpus" if collector == "nvml" else "ports"
    return [v for m in sc_messages if m["type"] == "StragglerSignals" and m["collector"] == collector
            for v in m["details"][key].values()]


def test_a_fleet_wide_condition_names_nobody() -> None:
    """A third of the GPUs retrying their PCIe links (a bad riser batch, a BIOS setting) is not one
    straggler: standing out on more than one device in eight names nobody for that signal."""
    sc = generate(7, nodes=64, fault="healthy")
    for i, v in enumerate(_vectors(sc.messages, "nvml")):
        if i % 3 == 0:
            v["pcie_replay_per_min"] = 12.0
    assert detect(sc.messages) == []


def test_a_device_no_job_uses_is_nobodys_straggler() -> None:
    """The storage NIC (no rank's channels use it) and an idle node's GPUs are never named."""
    sc = generate(11, nodes=64, fault="healthy")
    members = {m["node"] for m in sc.messages if m["type"] == "NCCLJobMember"}
    idle = next(m["node"] for m in sc.messages if m["type"] == "StragglerSignals" and m["node"] not in members)
    for m in sc.messages:
        if m["type"] != "StragglerSignals":
            continue
        if m["collector"] == "infiniband":
            m["details"]["ports"]["mlx5_8/1"]["symbol_error_per_h"] = 900.0  # storage NIC
        elif m["node"] == idle:
            next(iter(m["details"]["gpus"].values()))["pcie_width"] = 4
    assert detect(sc.messages) == []


def test_past_a_published_limit_is_named_whatever_the_peers() -> None:
    sc = generate(13, nodes=64, fault="healthy")
    member = next(m for m in sc.messages if m["type"] == "NCCLJobMember")
    vec = next(m for m in sc.messages if m["type"] == "StragglerSignals" and m["collector"] == "nvml"
               and m["node"] == member["node"])["details"]["gpus"][member["details"]["pci"]]
    vec["nvlink_replay_per_min"] = 2.0  # DCGM: replay errors are failures
    (rec,) = detect(sc.messages)
    assert (rec["node"], rec["entity"], rec["confidence"]) == (member["node"], f"gpu:{member['details']['pci']}", 0.95)
    assert "published limit" in rec["signals"][0]["reason"]


def test_unmeasured_values_are_skipped_not_zero() -> None:
    sc = generate(17, nodes=64, fault="thermal")
    for v in _vectors(sc.messages, "nvml"):
        v["pcie_replay_per_min"] = None
    assert sc.score(detect(sc.messages)) == {"tp": 1, "fp": 0, "fn": 0}


def test_a_small_job_borrows_its_class_peers() -> None:
    """A job on fewer than MIN_PEERS devices of a class is compared with the class fleet-wide."""
    sc = generate(19, nodes=64, fault="pcie_downtrain")
    (node, entity) = next(iter(sc.expected))
    job = next(m["details"]["job"] for m in sc.messages if m["type"] == "NCCLJobMember" and m["node"] == node
               and f"gpu:{m['details']['pci']}" == entity)
    kept = [m for m in sc.messages if not (m["type"] == "NCCLJobMember" and m["details"]["job"] == job
                                           and (m["node"] != node or f"gpu:{m['details']['pci']}" != entity))]
    assert len([d for d in devices_of(kept) if job in d.jobs]) < MIN_PEERS
    found = detect(kept)
    assert {(f["node"], f["entity"]) for f in found} >= sc.expected
    assert any(s["scope"].startswith("class ") for f in found for s in f["signals"])


_num = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20),
                 st.text(max_size=3), st.booleans())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "node": st.one_of(st.sampled_from(["a", "b"]), _num), "collector": st.sampled_from(["nvml", "infiniband", "x"]),
    "type": st.sampled_from(["StragglerSignals", "NCCLJobMember"]), "time": st.one_of(st.text(max_size=4), st.none()),
    "details": st.one_of(_num, st.fixed_dictionaries({
        "job": st.one_of(st.just("0x1"), _num), "pci": st.one_of(st.just("0000:18:00.0"), _num),
        "nics": st.one_of(st.just(["mlx5_0/1"]), _num),
        "gpus": st.one_of(_num, st.dictionaries(st.sampled_from(["0000:18:00.0", "x"]),
                                                st.dictionaries(st.sampled_from(["pcie_replay_per_min", "name",
                                                                                 "thermal_margin_c", "pcie_width",
                                                                                 "clock_slowdown_held_s"]), _num),
                                                max_size=2)),
        "ports": st.one_of(_num, st.dictionaries(st.sampled_from(["mlx5_0/1"]),
                                                 st.dictionaries(st.sampled_from(["symbol_error_per_h", "rate_gbps"]),
                                                                 _num), max_size=1))}))}),
    max_size=40))
def test_any_input_names_only_devices_a_job_uses(messages: list[dict[str, Any]]) -> None:
    before = copy.deepcopy(messages)
    found = detect(messages)
    used = {(d.node, d.entity) for d in devices_of(messages) if d.jobs}
    for rec in found:
        assert (rec["node"], rec["entity"]) in used and rec["jobs"]
        assert 0.0 < rec["confidence"] <= 1.0
        json.dumps(rec, allow_nan=False)
    assert json.dumps(messages, default=str) == json.dumps(before, default=str)  # the input is not changed


async def test_live_the_correlator_publishes_the_straggler_and_resolves_it(nats_server: NatsServerProcess) -> None:
    """Through a real nats-server: the nodes' vectors on gna.signals.<node>.<collector> and membership on
    gna.jobs (agent/subjects.py subjects_for); the correlator publishes the straggler's record in KV
    gna-stragglers and on gna.stragglers.<node>, and resolves it when the device's next vector is healthy."""
    import asyncio

    import nats
    from nats.js.api import StreamConfig

    from agent.nats_link import JOBS_STREAM_SUBJECTS, SIGNALS_STREAM_SUBJECTS, STREAM_SUBJECTS
    from agent.subjects import subjects_for
    from fleet.incidents import IncidentService
    from fleet.stragglers import STRAGGLERS_BUCKET

    sc = generate(23, nodes=64, fault="ib_symbol_errors")
    (node, entity), = sc.expected
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    for name, subjects in (("GNA_EVENTS", STREAM_SUBJECTS), ("GNA_JOBS", JOBS_STREAM_SUBJECTS),
                           ("GNA_SIGNALS", SIGNALS_STREAM_SUBJECTS)):
        await js.add_stream(StreamConfig(name=name, subjects=subjects))
    got: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_record(msg: Any) -> None:
        await got.put(json.loads(msg.data))

    await nc.subscribe("gna.stragglers.>", cb=on_record)
    svc = IncidentService([nats_server.url], debounce=0.02, straggler_interval=0.2)
    await svc.start()

    async def publish(msgs: list[dict[str, Any]]) -> None:
        for i, m in enumerate(msgs):
            m = {"schema_version": 1, "id": f"01M8XR{i:020d}", "status": None, "reason": "R", "message": "m",
                 "suggested_action": "none", **m}
            for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
                await js.publish(subject, json.dumps(m).encode())

    try:
        await publish(sc.messages)
        rec = await asyncio.wait_for(got.get(), 15)
        assert (rec["node"], rec["entity"], rec["status"]) == (node, entity, "open"), rec
        kv = await js.key_value(STRAGGLERS_BUCKET)
        keys = await kv.keys()
        assert len(keys) == 1
        healed = next(m for m in sc.messages if m["type"] == "StragglerSignals" and m["node"] == node
                      and m["collector"] == "infiniband")
        healed["details"]["ports"][entity[3:]]["symbol_error_per_h"] = 0.0
        healed["time"] = "2026-12-03T08:05:00.000Z"
        await publish([healed])
        again = await asyncio.wait_for(got.get(), 15)
        assert (again["node"], again["entity"], again["status"]) == (node, entity, "resolved")
        assert not svc.rejections.counts, svc.rejections.counts
    finally:
        await svc.stop()
        await nc.close()
