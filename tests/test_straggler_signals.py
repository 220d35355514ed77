"""Straggler signals (docs/straggler-signals.md): the sliding-window rate math, each per-GPU finding
on its fault in the fake NVML and per-port finding in a simulated sysfs tree, none on a healthy
node, NOT_SUPPORTED and GPU_IS_LOST handling, the published vector and the metric names."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.message import to_dict
from collectors import infiniband as ibmod
from collectors.nvml import NVMLCollector, NVMLConfig, pcie_replay_limit_per_min
from collectors.shared.counter_window import CounterWindow, WindowStats, counter_increase, valid_reading
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.conftest import Sink, validate_message
from tests.fake_nvml import FakeGPU, FakeNVML

DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA = (pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                                                    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                                                    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                                                    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the rate math ------------------------------------------------------------------------

def test_counter_increase_wrap_reset_and_first_sample() -> None:
    assert counter_increase(10, 25, 32) == 15
    assert counter_increase(2**32 - 10, 5, 32) == 15  # a 32-bit replay counter ran past its top
    assert counter_increase(5000, 3, 32) is None  # a driver reload, not 4 billion replays
    assert counter_increase(7, 3, None) is None
    w = CounterWindow(60.0, bits=32)
    assert w.add(0.0, 2**32 - 10) == "first" and w.stats(60.0) is None  # one sample: no rate
    assert w.add(30.0, 5) == "wrap" and w.wraps == 1
    s = w.stats(60.0)
    assert s == WindowStats(15, 30.0, False) and s.per(60.0) == 30.0
    assert w.add(60.0, 2) == "reset" and w.resets == 1 and w.stats(60.0) is None  # a reset is no rate
    assert w.add(90.0, 4) == "increase" and w.stats(60.0) == WindowStats(2, 30.0, False)


def test_window_covers_at_least_the_window_and_says_when_it_does_not() -> None:
    w = CounterWindow(60.0)
    for i in range(6):
        w.add(i * 30.0, i * 10)
    s = w.stats(60.0)
    assert s is not None and s.full and s.span == 60.0 and s.count == 20
    assert w.stats(0.0) == WindowStats(10, 30.0, True)  # window 0: the last interval
    assert len(w) <= 4, "kept only what a 60 s window needs"
    # a partial window fires only on a count already past the whole window's budget
    young = WindowStats(count=4, span=10.0, full=False)
    assert young.per(60.0) == 24.0 and not young.over(5, 60.0)
    assert WindowStats(count=6, span=10.0, full=False).over(5, 60.0)
    assert WindowStats(count=6, span=60.0, full=True).over(5, 60.0)
    assert not WindowStats(count=5, span=60.0, full=True).over(5, 60.0)


@pytest.mark.parametrize("bad", [-1, 2**32, 2**70, "12", 1.5, True, None, float("nan")])
def test_impossible_readings_are_rejected_and_counted(bad: object) -> None:
    w = CounterWindow(60.0, bits=32)
    w.add(0.0, 100)
    assert w.add(30.0, bad) == "rejected" and w.rejected == 1
    assert w.stats(60.0) is None and w.raw == 100
    assert w.add(30.0, 100) == "increase"  # the next good reading continues from the last good one
    assert w.add(30.0, 101) == "rejected", "a clock that did not advance is no interval"


@given(st.lists(st.tuples(st.floats(0.001, 120.0), st.integers(0, 2**32 - 1)), min_size=1, max_size=40),
       st.floats(0.0, 300.0))
def test_rates_are_never_negative_and_a_reset_gives_no_rate(steps: list[tuple[float, int]], window: float) -> None:
    w = CounterWindow(300.0, bits=32)
    t = 0.0
    for dt, raw in steps:
        t += dt
        step = w.add(t, raw)
        s = w.stats(window)
        if step in ("first", "reset"):
            assert s is None
        else:
            assert s is not None and s.count >= 0 and s.span > 0 and s.per(60.0) >= 0
            # full: the span reaches back at least the window (up to float rounding of the cut-off)
            assert s.span >= window - 1e-6 if s.full else s.span <= window + 1e-6


@given(st.lists(st.tuples(st.floats(0.5, 60.0), st.integers(0, 10**6)), min_size=1, max_size=20),
       st.floats(0.5, 60.0), st.integers(0, 10**6), st.integers(0, 10**6), st.floats(0.0, 600.0))
def test_the_rate_is_monotone_in_the_counter_delta(steps: list[tuple[float, int]], dt: float, d1: int, d2: int,
                                                    window: float) -> None:
    lo, hi = sorted((d1, d2))
    results = []
    for d in (lo, hi):
        w = CounterWindow(600.0, bits=64)
        t, raw = 0.0, 0
        for step_dt, inc in steps:
            t, raw = t + step_dt, raw + inc
            w.add(t, raw)
        w.add(t + dt, raw + d)
        s = w.stats(window)
        assert s is not None
        results.append(s)
    assert results[0].span == results[1].span
    assert results[0].count <= results[1].count and results[0].per(60.0) <= results[1].per(60.0)


@given(st.integers(-2**70, 2**70), st.integers(-2**70, 2**70), st.sampled_from([8, 16, 32, 64, None]))
def test_counter_increase_is_never_negative(old: int, new: int, bits: int | None) -> None:
    if not (valid_reading(old, bits) and valid_reading(new, bits)):
        return
    d = counter_increase(old, new, bits)
    assert d is None or d >= 0
    if new >= old:
        assert d == new - old
    if d is not None and bits is not None:
        assert d < 1 << bits


def test_pcie_replay_limit_is_dcgm_s_table() -> None:
    """DcgmHealthWatch::GetExpectedPcieReplayRate (DCGM v4.6.0): ceil(1e-12 x lane Gb/s x 1e9 x 60 x lanes)."""
    assert pcie_replay_limit_per_min(5, 16) == 31  # 1.92/min per lane x 16 = 30.72
    assert pcie_replay_limit_per_min(4, 16) == 16  # 15.36
    assert pcie_replay_limit_per_min(3, 16) == 8  # 7.68
    assert pcie_replay_limit_per_min(2, 16) == 5  # 4.8
    assert pcie_replay_limit_per_min(1, 1) == 1  # 0.15
    assert pcie_replay_limit_per_min(6, 16) == 62  # 61.44
    assert pcie_replay_limit_per_min(7, 16) == 62, "a generation past DCGM's table is capped to Gen6"
    for gen, width in ((0, 16), (5, 0), (None, 16), (5, None), (True, 16), (-1, 4), ("5", 16)):
        assert pcie_replay_limit_per_min(gen, width) is None


@given(st.integers(1, 8), st.integers(1, 32), st.integers(1, 32))
def test_pcie_replay_limit_grows_with_lanes(gen: int, w1: int, w2: int) -> None:
    a, b = pcie_replay_limit_per_min(gen, min(w1, w2)), pcie_replay_limit_per_min(gen, max(w1, w2))
    assert a is not None and b is not None and 1 <= a <= b


# -- NVML: per-GPU findings ---------------------------------------------------------------

class GPUNode:
    """The nvml collector on fake GPUs, driven pass by pass the way the framework does."""

    def __init__(self, gpus: list[FakeGPU], **cfg: Any) -> None:
        self.fake = FakeNVML(gpus)
        self.clock = Clock()
        self.sink = Sink()
        self.tracker = ConditionTracker(None)
        self.em = CollectorEmitter("n", "nvml", self.sink, self.tracker, facts=FactStore())
        self.c = NVMLCollector(NVMLConfig(**cfg), HostRoot("/nonexistent"), self.em, nvml=self.fake,
                               clock=self.clock)

    async def tick(self, dt: float = 30.0) -> None:
        self.clock.t += dt
        self.em.begin_pass()
        await self.c.collect()
        await self.em.resolve_unasserted()

    def firing(self) -> dict[tuple[str, str], str]:
        return {(c.type, c.entity): c.severity for c in self.tracker.active.values()}

    def findings(self) -> list[Any]:
        return [m for m in self.sink.messages if m.type != "StragglerSignals"]

    def metrics(self) -> dict[str, list[Any]]:
        return {f.name: f.samples for f in self.c.prometheus_families()}


def _gpus(n: int = 4) -> list[FakeGPU]:
    return [FakeGPU(f"00000000:{b}:00.0") for b in ("18", "2A", "3A", "5D")[:n]]


async def test_a_healthy_node_raises_nothing_and_publishes_its_vector() -> None:
    node = GPUNode(_gpus())
    for _ in range(12):  # six minutes of 30 s passes
        for g in node.fake.gpus:
            g.pcie_replays += 3  # 6/min: far below Gen5 x16's 31/min
        await node.tick()
    assert node.findings() == [] and node.firing() == {}
    vectors = node.sink.of("StragglerSignals")
    assert len(vectors) == 2, "at the 2nd pass, then after signals_interval (300 s)"
    for m in vectors:
        validate_message(to_dict(m))
    v = vectors[-1].details["gpus"]["0000:18:00.0"]
    assert v["pcie_replay_per_min"] == 6.0 and v["pcie_replay_limit_per_min"] == 31
    assert v["nvlink_crc_flit_per_min"] == 0.0 and v["nvlinks"] == 18
    assert v["thermal_margin_c"] == 30 and v["thermal_margin_source"] == "tlimit" and v["memory_temp_c"] == 50
    assert v["sm_active"] == 0.915 and v["tensor_active"] == 0.4725 and v["dram_active"] == 0.55
    assert v["clock_slowdown_reasons"] == [] and "partial" not in v
    assert vectors[0].details["gpus"]["0000:18:00.0"]["partial"] == ["pcie_replay_per_min", "nvlink_replay_per_min",
                                                                    "nvlink_recovery_per_min",
                                                                    "nvlink_crc_flit_per_min",
                                                                    "nvlink_crc_data_per_min"]
    assert node.em.facts.get("nvml.straggler_signals")["0000:5d:00.0"]["index"] == 3
    assert node.fake.live_samples == 4, "one GPM sample per GPU is kept, the older ones are freed"


async def test_metric_names_are_dcgm_s() -> None:
    node = GPUNode(_gpus(2))
    node.fake.gpus[0].nvlink_errors[(2, DL_CRC_FLIT)] = 7
    node.fake.gpus[0].pcie_replays = 41
    await node.tick()
    await node.tick()
    m = node.metrics()
    for name in ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP_LIMIT",
                 "DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
                 "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gna_nvml_nvlink_error_count", "gna_nvml_straggler_signal",
                 "gna_nvml_counter_resets", "gna_nvml_not_supported", "gna_nvml_impossible_readings"):
        assert name in m, name

    def value(name: str, **labels: str) -> float:
        (s,) = [s for s in m[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        return float(s.value)

    assert value("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", pci_bus_id="0000:18:00.0", gpu="0") == 41
    assert value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", pci_bus_id="0000:18:00.0") == 7
    assert value("gna_nvml_nvlink_error_count", pci_bus_id="0000:18:00.0", link="2", counter="crc_flit") == 7
    assert value("DCGM_FI_PROF_SM_ACTIVE", pci_bus_id="0000:2a:00.0") == pytest.approx(0.915)
    assert value("gna_nvml_straggler_signal", pci_bus_id="0000:2a:00.0", signal="thermal_margin_c") == 30
    from prometheus_client import CollectorRegistry, generate_latest

    class Source:
        def collect(self) -> list[Any]:
            return node.c.prometheus_families()

    reg = CollectorRegistry()
    reg.register(Source())
    text = generate_latest(reg).decode()
    assert 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",pci_bus_id="0000:18:00.0"} 41.0' in text, \
        "the bare DCGM name, as dcgm-exporter exposes it (no _total)"


async def test_pcie_replays_above_dcgm_s_rate_warn_on_that_gpu_only() -> None:
    node = GPUNode(_gpus(), error_hold_down=60.0)
    await node.tick()
    for _ in range(4):
        node.fake.gpus[2].pcie_replays += 20  # 40/min on Gen5 x16: DCGM expects at most 31
        node.fake.gpus[1].pcie_replays += 15  # 30/min: within
        await node.tick()
    assert node.firing() == {("GPUPCIeReplayRate", "gpu:0000:3a:00.0"): "warning"}
    (m,) = node.sink.of("GPUPCIeReplayRate")
    assert m.details["limit_per_min"] == 31 and m.details["rate_per_min"] == 40.0 and m.details["full_window"]
    assert "DcgmHealthWatch.cpp" in m.details["citation"] and m.details["field"] == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    assert m.suggested_action == "inspect_hardware"
    for _ in range(4):  # quiet again: resolves after the hold-down
        await node.tick()
    assert node.firing() == {}


async def test_a_partial_window_fires_only_on_a_count_past_the_whole_budget() -> None:
    node = GPUNode(_gpus(1))
    await node.tick()
    node.fake.gpus[0].pcie_replays = 20  # 40/min over the first 30 s: not yet a minute's budget
    await node.tick()
    assert node.findings() == []
    node.fake.gpus[0].pcie_replays = 52  # 52 within the first minute: past 31 whatever comes next
    await node.tick(dt=10.0)
    assert [m.type for m in node.findings()] == ["GPUPCIeReplayRate"]
    assert node.sink.of("GPUPCIeReplayRate")[0].details["full_window"] is False


async def test_counter_wrap_is_a_rate_and_a_reset_is_none() -> None:
    node = GPUNode(_gpus(1))
    gpu = node.fake.gpus[0]
    gpu.pcie_replays = 2**32 - 10
    await node.tick()
    gpu.pcie_replays = 5  # wrapped: 15 replays
    await node.tick()
    assert node.c.signals["0000:18:00.0"]["pcie_replay_per_min"] == 30.0
    gpu.pcie_replays = 3  # driver reload: back to almost zero
    await node.tick()
    v = node.c.signals["0000:18:00.0"]
    assert v["pcie_replay_per_min"] is None, "a reset gives no rate, never a negative one"
    assert node.findings() == []
    gpu.pcie_replays = 4
    await node.tick()
    assert node.c.signals["0000:18:00.0"]["pcie_replay_per_min"] == 2.0
    resets = [s for s in node.metrics()["gna_nvml_counter_resets"] if s.labels["counter"] == "pcie_replay"]
    assert resets and resets[0].value == 1


@pytest.mark.parametrize("bad", [-5, 2**40, "17", 3.5, None, True])
async def test_impossible_replay_counts_are_skipped_and_counted(bad: object) -> None:
    node = GPUNode(_gpus(1))
    await node.tick()
    node.fake.gpus[0].pcie_replays = bad
    await node.tick()
    await node.tick()
    assert node.findings() == []
    if bad is not None:
        assert node.c.impossible["nvmlDeviceGetPcieReplayCounter"] == 2
        assert node.em.skipped["NVML nvmlDeviceGetPcieReplayCounter 0000:18:00.0"][0] == 2
    node.fake.gpus[0].pcie_replays = 1
    await node.tick()
    assert node.c.signals["0000:18:00.0"]["pcie_replay_per_min"] is not None


async def test_nvlink_errors_follow_dcgm_s_health_watch() -> None:
    node = GPUNode(_gpus(), error_hold_down=0.0)
    await node.tick()
    await node.tick()
    node.fake.gpus[0].nvlink_errors[(3, DL_CRC_FLIT)] = 1  # one CRC error: DCGM warns
    node.fake.gpus[1].nvlink_errors[(0, DL_REPLAY)] = 2  # a replay: DCGM fails the GPU
    node.fake.gpus[2].nvlink_errors[(5, DL_CRC_DATA)] = 100 * 60 + 1  # past 100/s over the minute: DCGM fails it
    node.fake.gpus[3].nvlink_errors[(1, DL_RECOVERY)] = 1
    await node.tick()
    assert node.firing() == {("GPUNVLinkErrors", "gpu:0000:18:00.0"): "warning",
                             ("GPUNVLinkErrors", "gpu:0000:2a:00.0"): "critical",
                             ("GPUNVLinkErrors", "gpu:0000:3a:00.0"): "critical",
                             ("GPUNVLinkErrors", "gpu:0000:5d:00.0"): "critical"}
    crc = next(m for m in node.sink.of("GPUNVLinkErrors") if m.entity == "gpu:0000:18:00.0")
    (c,) = crc.details["counters"]
    assert c["counter"] == "crc_flit" and c["links"] == {"3": 1} and c["count"] == 1
    assert c["field"] == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" and "DCGM WARN" in c["rule"]
    fast = next(m for m in node.sink.of("GPUNVLinkErrors") if m.entity == "gpu:0000:3a:00.0")
    assert "100/s" in fast.details["counters"][0]["rule"]
    assert "DcgmGPUHardwareLimits.h" in fast.details["citation"]
    for _ in range(3):  # no new errors: out of the one-minute window
        await node.tick()
    assert node.firing() == {}


async def test_nvlink_findings_are_held_down_not_flapped() -> None:
    node = GPUNode(_gpus(1), error_hold_down=300.0)
    await node.tick()
    gpu = node.fake.gpus[0]
    for i in range(1, 6):  # a CRC error every 90 s: one condition, not a firing/resolved pair each
        gpu.nvlink_errors[(0, DL_CRC_FLIT)] = i
        await node.tick(dt=45.0)
        await node.tick(dt=45.0)
    assert [m.status for m in node.sink.of("GPUNVLinkErrors")] == ["firing"]
    for _ in range(8):
        await node.tick(dt=45.0)
    assert [m.status for m in node.sink.of("GPUNVLinkErrors")] == ["firing", "resolved"]


async def test_a_slowdown_reason_must_persist_a_minute() -> None:
    node = GPUNode(_gpus(2))
    gpus = node.fake.gpus
    gpus[0].clock_reasons = 0x40  # HW thermal slowdown
    gpus[1].clock_reasons = 0x1 | 0x2 | 0x100 | 0x4  # idle, app clocks, display: settings; sw power cap
    await node.tick()
    await node.tick()
    assert node.firing() == {}, "held 30 s: a transient"
    await node.tick()
    assert node.firing() == {("GPUThrottled", "gpu:0000:18:00.0"): "warning"}
    m = node.sink.of("GPUThrottled")[0]
    assert m.details["reasons"] == ["hw_thermal_slowdown"] and m.details["held_s"] == {"hw_thermal_slowdown": 60.0}
    assert m.details["field"] == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and "DcgmHealthWatch" in m.details["citation"]
    v = node.c.signals["0000:2a:00.0"]
    assert v["clock_slowdown_reasons"] == ["sw_power_cap"], "idle, app clocks and display are not slowdowns"
    assert v["clock_slowdown_held_s"] == {"sw_power_cap": 60.0}, "power capping: in the vector, not a finding"
    gpus[0].clock_reasons = 0x0  # the run is broken: it starts again from zero
    await node.tick()
    gpus[0].clock_reasons = 0x8
    await node.tick()
    await node.tick()
    assert node.firing() == {}
    await node.tick()
    assert node.firing() == {("GPUThrottled", "gpu:0000:18:00.0"): "warning"}


async def test_thermal_margin_findings_and_their_sources() -> None:
    gpus = _gpus()
    gpus[0].margin = -3  # past the H100's -2 slowdown T.Limit: HW slowdown
    gpus[1].margin = 0  # at max operating temperature
    gpus[2].margin = None  # an A100: no T.Limit, absolute thresholds instead
    gpus[2].temp = 90  # >= 89 slowdown threshold
    gpus[3].memory_temp = 95  # >= memory max: SW slowdown
    node = GPUNode(gpus)
    await node.tick()
    assert node.firing() == {("GPUThermalMarginLow", "gpu:0000:18:00.0"): "critical",
                             ("GPUThermalMarginLow", "gpu:0000:2a:00.0"): "warning",
                             ("GPUThermalMarginLow", "gpu:0000:3a:00.0"): "critical",
                             ("GPUThermalMarginLow", "gpu:0000:5d:00.0"): "warning"}
    by = {m.entity: m for m in node.sink.of("GPUThermalMarginLow")}
    assert by["gpu:0000:18:00.0"].reason == "PastHWSlowdownTLimit"
    assert by["gpu:0000:18:00.0"].details["findings"][0]["limit_c"] == -2
    assert "042-gpu-temp-limit-field-monitoring" in by["gpu:0000:18:00.0"].details["findings"][0]["citation"]
    assert by["gpu:0000:2a:00.0"].reason == "TLimitMarginExhausted"
    assert by["gpu:0000:3a:00.0"].reason == "AtHWSlowdownTemp"
    assert by["gpu:0000:3a:00.0"].details["thermal_margin_c"] == -1  # slowdown 89 - 90
    assert by["gpu:0000:5d:00.0"].reason == "MemoryAtSWSlowdownTemp"
    assert node.c.gpus["gpu:0000:3a:00.0"].vector["thermal_margin_source"] == "slowdown_threshold"


async def test_not_supported_is_asked_once_per_gpu_counted_and_quiet() -> None:
    old = FakeGPU("00000000:18:00.0", gpm=None, margin=None, memory_temp=None, slowdown_tlimit=None,
                  unsupported={"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetNvLinkErrorCounter",
                               "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetFieldValues"})
    new = FakeGPU("00000000:2A:00.0")
    node = GPUNode([old, new])
    for _ in range(4):
        await node.tick()
    assert node.findings() == [] and node.em.blind == {}
    counts = node.fake.counts
    # the old GPU: asked once each; the new one: every pass
    assert counts["nvmlDeviceGetPcieReplayCounter"] == 1 + 4
    assert counts["nvmlDeviceGetFieldValues"] == 1 + 4
    assert counts["nvmlDeviceGetMarginTemperature"] == 1 + 4
    assert counts["nvmlDeviceGetNvLinkErrorCounter"] == 4 + 4 * 18 * 4, "one per counter kind, then never again"
    assert counts["nvmlGpmQueryDeviceSupport"] == 2, "GPM support is asked once per GPU"
    unsupported = {s.labels["call"]: s.value for s in node.metrics()["gna_nvml_not_supported"]}
    assert unsupported["nvmlDeviceGetPcieReplayCounter"] == 1
    assert unsupported["nvmlGpmQueryDeviceSupport"] == 1
    assert unsupported["nvmlDeviceGetNvLinkErrorCounter:crc_flit"] == 1
    v = node.c.signals["0000:18:00.0"]
    assert v["pcie_replay_per_min"] is None and "sm_active" not in v
    assert v["thermal_margin_c"] is None and v["gpu_temp_c"] == 45, "no T.Limit and no slowdown threshold"
    assert node.c.signals["0000:2a:00.0"]["sm_active"] == 0.915


async def test_a_lost_gpu_is_reported_its_state_forgotten_and_samples_freed() -> None:
    node = GPUNode(_gpus(2))
    node.fake.gpus[1].pcie_replays = 10**6
    await node.tick()
    await node.tick()
    assert node.fake.live_samples == 2
    node.fake.gpus[1].lost = True
    await node.tick()
    assert node.firing() == {("GPULost", "gpu:nvml1"): "critical"}  # its PCI info is gone with it
    assert "gpu:0000:2a:00.0" not in node.c.gpus and "0000:2a:00.0" not in node.c.signals
    assert node.fake.live_samples == 1, "the lost GPU's GPM sample was freed"
    node.fake.gpus[1].lost = False  # back after a reset, its counter from zero
    node.fake.gpus[1].pcie_replays = 2
    await node.tick()
    await node.tick()
    assert node.c.signals["0000:2a:00.0"]["pcie_replay_per_min"] == 0.0, "a new baseline, no bogus rate"
    assert node.findings()[-1].type == "GPULost" and node.findings()[-1].status == "resolved"


async def test_gpm_failures_never_leak_samples_nor_report_junk() -> None:
    gpus = _gpus(2)
    gpus[0].gpm = {pynvml.NVML_GPM_METRIC_SM_UTIL: float("nan"), pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 250.0}
    node = GPUNode(gpus)
    for _ in range(5):
        await node.tick()
    v = node.c.signals["0000:18:00.0"]
    assert "sm_active" not in v and "dram_active" not in v, "NaN is blank (as DCGM), 250 % impossible"
    assert node.c.impossible["nvmlGpmMetricsGet:dram_active"] == 4
    assert node.fake.live_samples == 2
    assert node.fake.counts["nvmlGpmSampleAlloc"] == 10 and node.fake.counts["nvmlGpmSampleFree"] == 8
    off = GPUNode(_gpus(1), gpm=False)
    await off.tick()
    await off.tick()
    assert off.fake.counts["nvmlGpmSampleAlloc"] == 0 and "sm_active" not in off.c.signals["0000:18:00.0"]


async def test_signals_interval_zero_keeps_the_vector_off_the_bus() -> None:
    node = GPUNode(_gpus(1), signals_interval=0.0)
    for _ in range(3):
        await node.tick()
    assert node.sink.messages == [] and node.c.signals["0000:18:00.0"]["pcie_replay_per_min"] == 0.0


# -- InfiniBand: per-port rates -----------------------------------------------------------

class IBNode:
    def __init__(self, host: SimHost, monkeypatch: pytest.MonkeyPatch, **cfg: Any) -> None:
        self.host = host
        self.clock = Clock()
        monkeypatch.setattr(ibmod, "time", _FrozenTime(self.clock))
        self.sink = Sink()
        self.tracker = ConditionTracker(None)
        self.em = CollectorEmitter("n", "infiniband", self.sink, self.tracker, facts=FactStore())
        self.c = ibmod.InfinibandCollector(ibmod.InfinibandConfig(**cfg), HostRoot(host.root), self.em)

    async def tick(self, dt: float = 10.0) -> None:
        self.clock.t += dt
        self.em.begin_pass()
        await self.c.collect()
        await self.em.resolve_unasserted()

    def firing(self) -> set[tuple[str, str]]:
        return {(c.type, c.entity) for c in self.tracker.active.values()}

    def findings(self) -> list[Any]:
        return [m for m in self.sink.messages if m.type != "StragglerSignals"]


class _FrozenTime:
    """The infiniband module's view of ``time``: monotonic from the test's clock, nothing else changed."""

    def __init__(self, clock: Clock) -> None:
        self.monotonic = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def ib(tmp_path: Path) -> SimHost:
    return SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=2)


async def test_healthy_ports_publish_their_vector_and_raise_nothing(ib: SimHost,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    node = IBNode(ib, monkeypatch)
    await node.tick()
    assert node.c.signals["mlx5_0/1"]["symbol_error_per_h"] is None, "one read: no rate yet"
    for _ in range(7):
        ib.add_counter("mlx5_0", 1, "symbol_error", 1)  # 1 per 10 s over a minute: 360/h... but only briefly
        ib.add_counter("mlx5_0", 1, "port_xmit_wait", 1000)
        await node.tick()
    v = node.c.signals["mlx5_0/1"]
    assert v["symbol_error_per_h"] == 360.0 and "symbol_error_per_h" in v["partial"]
    assert v["partial_counts"]["symbol_error_per_h"] == 7, "the counted increase behind the extrapolated rate"
    assert node.findings() == [], "7 symbol errors in the first minute: under the hour's budget of 120"
    assert v["rate_gbps"] == 400.0 and v["active"] is True and v["port_xmit_wait_per_s"] == 100.0
    (m,) = node.sink.of("StragglerSignals")
    validate_message(to_dict(m))
    assert m.entity == "signals:ib" and sorted(m.details["ports"]) == ["mlx5_0/1", "mlx5_1/1"]
    assert m.details["windows_s"] == {"symbol_error_per_h": 3600.0, "link_error_recovery_per_min": 60.0,
                                      "port_rcv_errors_per_s": 10.0}
    assert m.details["thresholds"]["symbol_error"]["critical_per_hour"] == 120.0
    assert "NVSentinel" in m.details["citation"]
    samples = {(s.labels["device"], s.labels["signal"]): s.value
               for f in node.c.prometheus_families() if f.name == "gna_infiniband_straggler_signal"
               for s in f.samples}
    assert samples[("mlx5_0", "symbol_error_per_h")] == 360.0 and samples[("mlx5_1", "active")] == 1.0


async def test_symbol_errors_over_a_full_hour_use_the_measured_rate(ib: SimHost,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """NVSentinel's symbol_error_fatal: > 120/hour. 2 per minute is exactly 120/h (not over); 3 is 180/h."""
    node = IBNode(ib, monkeypatch, counter_hold_down=60.0)
    await node.tick(dt=60.0)
    for _ in range(70):
        ib.add_counter("mlx5_0", 1, "symbol_error", 2)
        ib.add_counter("mlx5_1", 1, "symbol_error", 3)
        await node.tick(dt=60.0)
    assert node.c.signals["mlx5_0/1"]["symbol_error_per_h"] == 120.0 and "partial" not in node.c.signals["mlx5_0/1"]
    assert ("IBErrorCountersIncreasing", "ib:mlx5_0/1") not in node.firing()
    assert ("IBErrorCountersIncreasing", "ib:mlx5_1/1") in node.firing()
    m = next(m for m in node.sink.of("IBErrorCountersIncreasing") if m.entity == "ib:mlx5_1/1")
    (c,) = m.details["counters"]
    assert c["counter"] == "symbol_error" and c["severity"] == "critical" and c["rule"] == "> 120/hour"
    assert "NVSentinel" in c["citation"] and c["threshold_from"] == "default"
    # the first minute-by-minute window passed 120 before the hour was full: a sure breach, flagged so
    assert c["full_window"] is False and c["last_hour"] > 120


async def test_link_error_recovery_is_judged_per_minute_not_per_interval(ib: SimHost,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """One recovery in a 10 s interval used to read as 6/min (over NVSentinel's 5/min): it is 1 per minute."""
    node = IBNode(ib, monkeypatch)
    for _ in range(8):
        await node.tick()
    ib.add_counter("mlx5_0", 1, "link_error_recovery", 1)
    await node.tick()
    assert node.findings() == []
    assert node.c.signals["mlx5_0/1"]["link_error_recovery_per_min"] == 1.0
    for _ in range(3):
        ib.add_counter("mlx5_1", 1, "link_error_recovery", 2)  # 6 in 30 s, 6 in the last minute
        await node.tick()
    (m,) = node.sink.of("IBErrorCountersIncreasing")
    (c,) = m.details["counters"]
    assert m.entity == "ib:mlx5_1/1" and c["counter"] == "link_error_recovery" and c["rule"] == "> 5/min"
    assert c["last_minute"] == 6 and c["full_window"] is True and m.severity == "warning"


async def test_port_rcv_errors_per_second(ib: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    node = IBNode(ib, monkeypatch)
    await node.tick()
    ib.add_counter("mlx5_0", 1, "port_rcv_errors", 90)  # 9/s: under 10/s
    await node.tick()
    assert node.findings() == [] and node.c.signals["mlx5_0/1"]["port_rcv_errors_per_s"] == 9.0
    ib.add_counter("mlx5_0", 1, "port_rcv_errors", 200)  # 20/s
    await node.tick()
    (m,) = node.sink.of("IBErrorCountersIncreasing")
    assert m.details["counters"][0]["rule"] == "> 10/s" and m.details["counters"][0]["rate_per_s"] == 20.0


async def test_a_reset_port_counter_is_a_new_baseline(ib: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    node = IBNode(ib, monkeypatch)
    ib.set_counter("mlx5_0", 1, "symbol_error", 1000)
    await node.tick()
    ib.set_counter("mlx5_0", 1, "symbol_error", 1010)
    await node.tick()
    ib.set_counter("mlx5_0", 1, "symbol_error", 0)  # perfquery -x -R
    await node.tick()
    v = node.c.signals["mlx5_0/1"]
    assert v["symbol_error_per_h"] is None and v["resets"] == 1 and node.findings() == []
    ib.set_counter("mlx5_0", 1, "symbol_error", 1)
    await node.tick()
    assert node.c.signals["mlx5_0/1"]["symbol_error_per_h"] == 360.0 and node.findings() == []


# -- partial windows: the counted increase, never an extrapolation (#20 deliver 6) ----------

@given(st.integers(0, 10**6), st.floats(0.1, 10_000.0), st.sampled_from([1.0, 60.0, 3600.0]),
       st.floats(0.0, 1000.0))
def test_a_partial_window_is_sure_only_of_its_count(count: int, span: float, window: float, limit: float) -> None:
    full = span >= window
    s = WindowStats(count, span, full)
    sure = s.sure_per(window, window)
    if full:
        assert sure == s.per(window)
    else:
        assert sure == count, "over a partial window: the count itself, whatever the seconds so far"
        assert sure <= s.per(window)
    assert s.over(limit, window) == (sure > limit)  # over() is the same rule, in the same place


async def test_one_symbol_error_after_start_is_a_count_of_one_not_396_per_hour(
        ib: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: a single symbol error in the first ~10 s reads as ~360/h; the vector marks it partial
    and carries the count (1) the fleet compares instead; after a counter reset the same holds again."""
    node = IBNode(ib, monkeypatch)
    await node.tick()
    ib.add_counter("mlx5_0", 1, "symbol_error", 1)
    await node.tick()
    v = node.c.signals["mlx5_0/1"]
    assert v["symbol_error_per_h"] == 360.0 and v["partial_counts"] == {
        "symbol_error_per_h": 1, "link_error_recovery_per_min": 0}, "rcv errors: one 10 s interval is its window"
    assert set(v["partial"]) == set(v["partial_counts"])
    assert node.findings() == []
    for _ in range(7):
        await node.tick()
    v = node.c.signals["mlx5_0/1"]
    assert v["partial"] == ["symbol_error_per_h"] and v["partial_counts"] == {"symbol_error_per_h": 1}
    ib.set_counter("mlx5_0", 1, "symbol_error", 0)  # perfquery -R: a new baseline, no rate
    await node.tick()
    assert node.c.signals["mlx5_0/1"]["symbol_error_per_h"] is None
    ib.add_counter("mlx5_0", 1, "symbol_error", 1)
    await node.tick()
    v = node.c.signals["mlx5_0/1"]
    assert v["symbol_error_per_h"] == 360.0 and v["partial_counts"]["symbol_error_per_h"] == 1
    assert node.findings() == []


async def test_gpu_partial_rates_carry_their_counts_and_drop_them_once_full() -> None:
    node = GPUNode(_gpus(1))
    await node.tick()
    node.fake.gpus[0].pcie_replays = 3
    await node.tick()
    v = node.c.signals["0000:18:00.0"]
    assert v["pcie_replay_per_min"] == 6.0 and v["partial_counts"]["pcie_replay_per_min"] == 3
    assert list(v["partial_counts"]) == v["partial"]
    for _ in range(3):
        await node.tick()
    v = node.c.signals["0000:18:00.0"]
    assert "partial" not in v and "partial_counts" not in v
