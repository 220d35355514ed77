from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors.nvml import NVMLCollector, NVMLConfig
from collectors.shared import nvml_lib as nvml_lib
from gna_sdk import gpu_release
from gna_sdk.hostroot import HostRoot
from tests.conftest import Sink, validate_message
from tests.fake_nvml import FakeGPU, FakeNVML


def _collector(fake: FakeNVML | None, sink: Sink, facts: FactStore | None = None, **cfg: object) -> NVMLCollector:
    em = CollectorEmitter("n", "nvml", sink, ConditionTracker(None), facts=facts or FactStore())
    return NVMLCollector(NVMLConfig(**cfg), HostRoot("/nonexistent"), em, nvml=fake)  # type: ignore[arg-type]


def _gpus(n: int = 4) -> list[FakeGPU]:
    return [FakeGPU(f"00000000:{b}:00.0") for b in ("18", "2A", "3A", "5D")[:n]]


async def test_healthy_gpus_raise_nothing() -> None:
    sink = Sink()
    await _collector(FakeNVML(_gpus()), sink).collect()
    assert sink.messages == []


async def test_every_health_check_fires_with_the_right_entity() -> None:
    gpus = _gpus()
    gpus[0].dbe_volatile = 2
    gpus[1].remapped = (0, 1, 1, 0)
    gpus[1].nvlinks = [1] * 16 + [0, 0]
    gpus[2].pcie = (5, 8, 5, 16)
    gpus[2].clock_reasons = 0x40 | 0x1  # thermal slowdown + GPU idle (ignored)
    gpus[3].remapped = (0, 3, 0, 1)
    gpus[3].mig = (0, 1)
    sink, facts = Sink(), FactStore()
    # clock_event_persist=0: a slowdown reason counts at first sight (persistence: test_straggler_signals.py)
    await _collector(FakeNVML(gpus), sink, facts, clock_event_persist=0.0).collect()
    got = {(m.type, m.entity, m.severity) for m in sink.messages}
    assert got == {
        ("GPUEccUncorrectable", "gpu:0000:18:00.0", "critical"),
        ("GPURowRemapPending", "gpu:0000:2a:00.0", "warning"),
        ("GPUThrottled", "gpu:0000:3a:00.0", "warning"),
        ("GPURowRemapFailure", "gpu:0000:5d:00.0", "critical"),
        ("GPUMIGModePending", "gpu:0000:5d:00.0", "warning"),
    }
    for m in sink.messages:
        validate_message(__import__("agent.message", fromlist=["x"]).to_dict(m))
    throttled = next(m for m in sink.messages if m.type == "GPUThrottled")
    assert throttled.details["reasons"] == ["hw_thermal_slowdown"]
    devices = {d["entity"]: d for d in facts.get("nvml.devices")}
    assert devices["gpu:0000:2a:00.0"]["nvlinks_down"] == [16, 17]  # judged by the topology collector (one place)
    assert len(facts.get("nvml.devices")) == 4


async def test_lost_gpu_and_unsupported_calls() -> None:
    gpus = _gpus(2)
    gpus[1].lost = True
    gpus[0].mig = None  # NOT_SUPPORTED: skipped quietly
    gpus[0].nvlinks = []  # PCIe-only board: no NVLink
    sink = Sink()
    await _collector(FakeNVML(gpus), sink).collect()
    assert [(m.type, m.entity, m.suggested_action) for m in sink.messages] == [("GPULost", "gpu:nvml1", "reboot")]


async def test_absent_nvml_is_quiet(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    why = "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    monkeypatch.setattr(nvml_lib, "_state", {"lib": None, "why": why})
    sink, facts = Sink(), FactStore()
    c = _collector(None, sink, facts)
    for _ in range(3):
        await c.collect()
    assert sink.messages == [] and facts.get("nvml.available") is False
    assert c._said_unsupported


async def test_xid_events_from_event_set_aggregate_and_defer_to_kmsg() -> None:
    fake = FakeNVML(_gpus(2))
    sink, facts = Sink(), FactStore()
    c = _collector(fake, sink, facts, aggregation_window=0.5)
    task = asyncio.create_task(c.run())
    await asyncio.sleep(0.2)
    for _ in range(50):
        fake.inject_xid(1, 95)
    await asyncio.sleep(2.5)
    facts.set("kmsg_xid.active", True)  # the kernel log is read: NVML stops double-reporting
    fake.inject_xid(0, 48)
    await asyncio.sleep(1.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    xids = [(m.entity, m.details["xid"], m.details["count"]) for m in sink.messages if m.type == "GPUXidError"]
    assert xids[0] == ("gpu:0000:2a:00.0", 95, 1)
    assert xids[1][2] == 50 and len(xids) == 2, xids
    assert fake.registered == [0, 1]


def test_real_nvml_absent_here_reports_why(tmp_path: Path) -> None:
    lib, why = nvml_lib.load_nvml()
    if lib is not None:
        pytest.skip("a real NVML is present on this machine")
    assert why


async def test_an_unexpected_nvml_error_is_a_reported_skip_not_a_silent_pass() -> None:
    """#14: _call returned None for every NVML error: an ECC check that failed with NVML_ERROR_UNKNOWN
    looked like a healthy GPU. NOT_SUPPORTED and a link index past the last stay silent."""
    sink = Sink()
    gpus = _gpus(2)
    gpus[1].ecc_error = 999  # NVML_ERROR_UNKNOWN
    gpus[0].nvlinks = [1] * 12  # an A100: links 12..17 answer INVALID_ARGUMENT
    c = _collector(FakeNVML(gpus), sink)
    await c.collect()
    await c.collect()
    assert [m.type for m in sink.messages] == ["StragglerSignals"]  # the periodic vector, no finding
    assert cast(CollectorEmitter, c.emit).blind == {"NVML nvmlDeviceGetTotalEccErrors": "NVMLError (NVML error 999): check skipped (2 times)"}
    assert c.call_errors == {"nvmlDeviceGetTotalEccErrors: NVMLError (999)": 2}


# -- letting go of the GPUs for a reset (gna_sdk.gpu_release) -----------------------------------------------

async def test_released_for_a_reset_no_nvml_call_until_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a GPU reset holds the GPUs released, the collector makes no NVML call (a pass is skipped and
    said so, the Xid wait has freed its event set), NVML is shut down; afterwards it is initialised again,
    the event set taken again and the GPUs get fresh baselines."""
    monkeypatch.setattr(gpu_release, "_holders", {})
    fake = FakeNVML(_gpus(2))
    sink, facts = Sink(), FactStore()
    c = _collector(fake, sink, facts, aggregation_window=0.2)
    c.wakeup = asyncio.Event()
    task = asyncio.create_task(c.run())
    try:
        await c.collect()
        for _ in range(100):
            if fake.lifecycle:
                break
            await asyncio.sleep(0.01)
        assert fake.lifecycle == ["event set created"] and gpu_release.holders() == ["nvml-collector"]
        assert c.gpus
        async with gpu_release.released("the reset of GPU 0000:18:00.0") as released:
            assert released.holders == ["nvml-collector"] and released.failed == {}
            assert fake.lifecycle == ["event set created", "event set freed", "shutdown"]
            await c.collect()  # the periodic pass while released
            assert cast(CollectorEmitter, c.emit).blind["NVML"] == (
                "released for the reset of GPU 0000:18:00.0: no pass until it ends")
            await asyncio.sleep(1.2)  # longer than one Xid wait: nothing asked meanwhile
        assert fake.used_uninitialized == 0
        assert fake.lifecycle[3] == "init" and not c.gpus  # fresh baselines: a reset GPU's counters start again
        assert c.wakeup.is_set()  # a pass is asked for at once
        for _ in range(300):
            if fake.lifecycle.count("event set created") == 2:
                break
            await asyncio.sleep(0.01)
        assert fake.lifecycle[-1] == "event set created"
        await c.collect()
        assert len(c.gpus) == 2
        fake.inject_xid(0, 79)
        for _ in range(300):
            if any(m.type == "GPUXidError" for m in sink.messages):
                break
            await asyncio.sleep(0.01)
        assert [m.details["xid"] for m in sink.messages if m.type == "GPUXidError"] == [79]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gpu_release.holders() == []  # unregistered when run() ends


async def test_released_during_a_pass_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_release, "_holders", {})
    fake = FakeNVML(_gpus(1))
    c = _collector(fake, Sink(), xid_events="off")
    task = asyncio.create_task(c.run())
    await asyncio.sleep(0)
    order: list[str] = []
    real = fake.nvmlDeviceGetCount

    def slow_count() -> int:
        import time
        time.sleep(0.3)  # a pass in flight in its worker thread
        order.append("pass")
        return real()

    monkeypatch.setattr(fake, "nvmlDeviceGetCount", slow_count)
    passing = asyncio.create_task(c.collect())
    await asyncio.sleep(0.05)
    try:
        async with gpu_release.released("reset"):
            order.append("released")
        await passing
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert order == ["pass", "released"] and fake.used_uninitialized == 0


async def test_the_process_nvml_library_is_shut_down_and_loaded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """collectors.shared.nvml_lib: one nvmlShutdown for the process while released, load_nvml answers why
    without initialising, and the next load after the reset initialises again."""
    import pynvml

    calls: list[str] = []
    monkeypatch.setattr(gpu_release, "_holders", {})
    monkeypatch.setattr(nvml_lib, "_state", {})
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    assert nvml_lib.load_nvml() == (pynvml, "")
    assert gpu_release.holders() == ["nvml-library"]
    async with gpu_release.released("the reset of GPU 0000:18:00.0"):
        assert calls == ["init", "shutdown"]
        assert nvml_lib.load_nvml() == (None, "NVML released by this agent: the reset of GPU 0000:18:00.0")
    assert calls == ["init", "shutdown"]  # nothing loads it until somebody asks
    assert nvml_lib.load_nvml() == (pynvml, "") and calls == ["init", "shutdown", "init"]
    assert gpu_release.holders() == ["nvml-library"]  # registered once
