from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent import registry
from agent.bus import LocalBus, split_record
from agent.message import Message, make_message
from agent.spool import Spool


def _m(i: int) -> Message:
    return make_message(node="n", collector="test", kind="event", type="T", severity="info", entity=f"e{i}",
                        reason="R", message="m")


async def test_slow_subscriber_never_blocks_publish(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "sp")
    spool.open()
    bus = LocalBus(spool, subscriber_queue=50)
    fast: list[Message] = []
    slow_seen: list[Message] = []

    async def fast_handler(m: Message) -> None:
        fast.append(m)

    async def slow_handler(m: Message) -> None:
        slow_seen.append(m)
        await asyncio.sleep(10)

    bus.subscribe("fast", fast_handler)
    slow = bus.subscribe("slow", slow_handler, maxsize=10)
    bus.start()
    t0 = time.perf_counter()
    for i in range(500):
        assert await bus.publish(_m(i))
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.1)
    assert elapsed < 5, "publishing was held up by a subscriber"
    assert slow.dropped >= 400 and len(slow_seen) == 1
    assert spool.depth == 500, "the durable path got every message regardless"
    assert len(fast) >= 450
    await bus.stop(drain_timeout=0.2)
    rec = spool.read(0, 1)[0]
    subject, msg_id, payload = split_record(rec.payload)
    assert subject == "gna.events.n.test.info" and msg_id.startswith("01") and payload.startswith(b"{")


async def test_failing_subscriber_is_counted_not_fatal() -> None:
    bus = LocalBus(None)

    async def bad(m: Message) -> None:
        raise ValueError("bug in a subscriber")

    sub = bus.subscribe("bad", bad)
    bus.start()
    for i in range(3):
        assert await bus.publish(_m(i))
    await asyncio.sleep(0.05)
    assert sub.errors == 3 and not sub.task.done()  # type: ignore[union-attr]
    await bus.stop()


def _dist(site: Path, name: str, group: str, line: str, module: str, code: str) -> None:
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(code)
    d = site / f"{name}-0.1.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(f"[{group}]\n{line}\n")


def test_third_party_remediation_and_broken_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    _dist(site, "good_rem", registry.REMEDIATION_GROUP, "page_oncall = good_rem:PageOncall", "good_rem",
          "import msgspec\nfrom gna_sdk import Result\n"
          "class Conf(msgspec.Struct):\n    pass\n"
          "class PageOncall:\n    name = 'page_oncall'\n    config_type = Conf\n    needs_budget = False\n"
          "    def __init__(self, config, host): ...\n"
          "    def plan(self, msg, args):\n        return 'page'\n"
          "    async def execute(self, msg, args):\n        return Result('executed', 'paged')\n")
    _dist(site, "broken_col", registry.COLLECTOR_GROUP, "broken = broken_col:Nope", "broken_col",
          "raise ImportError('missing dependency of a third-party plugin')\n")
    _dist(site, "badname_col", registry.COLLECTOR_GROUP, "Bad.Name = good_rem:PageOncall", "unused", "")
    monkeypatch.syspath_prepend(str(site))
    import importlib

    importlib.invalidate_caches()
    rem = registry.remediation_classes()
    assert "page_oncall" in rem
    cols = registry.collector_classes()
    assert "gpu_devices" in cols, "built-ins still load"
    assert "broken" not in cols and "Bad.Name" not in cols


async def test_a_jobs_facts_go_under_the_job_and_its_evidence_under_both(tmp_path: Path) -> None:
    """docs/subjects.md: membership only on gna.jobs.<job>.<node>.member; a job's symptom on the node's
    events and, with the same Msg-Id, on gna.jobs.<job>.<node>.evidence; anything else only on events."""
    sp = Spool(tmp_path / "spool", fsync=False)
    sp.open()
    bus = LocalBus(sp)
    job = {"job": "0x5c1f7e0a9b3d8c00", "host": "gpu-1", "pid": 7}

    def msg(type_: str, severity: str, details: dict[str, object]) -> Message:
        return make_message(node="gpu-1.dc", collector="nccl_logs", kind="event", type=type_, severity=severity,
                            entity="nccl:gpu-1:7", reason="R", message="m", details=details)

    sent = [msg("NCCLJobMember", "info", job), msg("NCCLCollectiveTimeout", "critical", job),
            msg("NCCLWarning", "warning", {"host": "gpu-1"}), msg("NCCLWatchdogProgress", "warning", {**job, "job": 5})]
    for m in sent:
        assert await bus.publish(m)
    got = [split_record(r.payload)[:2] for r in sp.read(0, 100)]
    member, timeout, warning, bad_job = (m.id for m in sent)
    assert got == [("gna.jobs.0x5c1f7e0a9b3d8c00.gpu-1=dc.member", member),
                   ("gna.events.gpu-1=dc.nccl_logs.critical", timeout),
                   ("gna.jobs.0x5c1f7e0a9b3d8c00.gpu-1=dc.evidence", timeout),
                   ("gna.events.gpu-1=dc.nccl_logs.warning", warning),
                   ("gna.events.gpu-1=dc.nccl_logs.warning", bad_job)]  # a job that is not a string: events only
    assert bus.accepted == 4 and bus.refused == bus.copies_refused == 0
    vector = make_message(node="gpu-1.dc", collector="nvml", kind="event", type="StragglerSignals", severity="info",
                          entity="signals:gpu", reason="Periodic", message="m", details={"gpus": {}})
    assert await bus.publish(vector)
    assert split_record(sp.read(0, 100)[-1].payload)[0] == "gna.signals.gpu-1=dc.nvml"  # its own bounded stream
