from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.framework import CollectorRunner
from agent.metrics import AgentMetrics
from gna_sdk import CollectorSettings
from gna_sdk.aio import ALIGN_STEP_S, aligned_delay
from tests.conftest import Sink


class Flaky:
    name: ClassVar[str] = "flaky"
    config_type = CollectorSettings

    def __init__(self, fail_times: int) -> None:
        self.calls = 0
        self.fail_times = fail_times

    async def collect(self) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise RuntimeError(f"boom {self.calls}")


class Hangs:
    name: ClassVar[str] = "hangs"

    def __init__(self) -> None:
        self.calls = 0

    async def collect(self) -> None:
        self.calls += 1
        await asyncio.sleep(3600)


class Ticker:
    name: ClassVar[str] = "ticker"

    def __init__(self) -> None:
        self.calls = 0

    async def collect(self) -> None:
        self.calls += 1


class CrashingLoop:
    name: ClassVar[str] = "crashing_loop"

    def __init__(self) -> None:
        self.starts = 0
        self.started_at: list[float] = []

    async def run(self) -> None:
        self.starts += 1
        self.started_at.append(time.monotonic())
        await asyncio.sleep(0.01)
        raise OSError("netlink went away")


def _runner(collector: Any, sink: Sink, metrics: AgentMetrics, **settings: Any) -> CollectorRunner:
    tracker = ConditionTracker(None)
    s = CollectorSettings(**{"interval": 0.05, "jitter": 0.0, "timeout": 0.1, "restart_backoff_max": 0.4,
                             **settings})
    return CollectorRunner(collector, s, CollectorEmitter("n", collector.name, sink, tracker), metrics,
                           CollectorEmitter("n", "agent", sink, tracker))


async def test_failures_are_isolated_backed_off_and_reported() -> None:
    sink, metrics = Sink(), AgentMetrics()
    flaky, hangs, ticker = Flaky(fail_times=4), Hangs(), Ticker()
    runners = [_runner(c, sink, metrics) for c in (flaky, hangs, ticker)]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    await asyncio.sleep(2.0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # the healthy collector kept its pace despite a hanging and a crashing neighbour
    assert ticker.calls >= 20
    # the hanging one was timed out each pass and backed off (0.05, 0.1, 0.2, 0.4, 0.4...: few calls)
    assert 2 <= hangs.calls <= 10
    # every pass timed out but the one in flight when the runner was cancelled (under load it may be)
    assert hangs.calls - 1 <= metrics.collector_errors.labels("hangs", "timeout")._value.get() <= hangs.calls
    # flaky failed 4 times, then recovered
    assert flaky.calls > 5
    assert metrics.collector_errors.labels("flaky", "exception")._value.get() == 4
    failing = [(m.entity, m.status) for m in sink.messages if m.type == "CollectorFailing"]
    assert ("collector:flaky", "firing") in failing and ("collector:flaky", "resolved") in failing
    assert ("collector:hangs", "firing") in failing and ("collector:hangs", "resolved") not in failing
    assert ("collector:ticker", "firing") not in failing


async def test_long_running_collector_restarts_with_backoff() -> None:
    sink, metrics = Sink(), AgentMetrics()
    c = CrashingLoop()
    r = _runner(c, sink, metrics, restart_backoff_min=0.05, restart_backoff_max=0.4)
    task = asyncio.create_task(r.run())
    deadline = time.monotonic() + 10
    while c.starts < 5 and time.monotonic() < deadline:  # ~0.8 s; longer on a loaded machine, never shorter
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert c.starts >= 5
    # not a hot loop: each restart waits out its backoff (.05 doubling to .4) after the run that failed
    # (which took .01 s): the gaps between starts are at least .06, .11, .21, .41 s, however slow the machine
    gaps = [b - a for a, b in zip(c.started_at, c.started_at[1:], strict=False)]
    assert all(g >= want - 0.005 for g, want in zip(gaps, (0.06, 0.11, 0.21, 0.41), strict=False)), gaps
    assert metrics.collector_restarts.labels("crashing_loop")._value.get() >= 3
    assert any(m.type == "CollectorFailing" and m.status == "firing" for m in sink.messages)


class WatcherThatDies:
    """Housekeeping passes succeed while the watcher crashes, until ``heal`` is set (D6)."""

    name: ClassVar[str] = "watcher"

    def __init__(self) -> None:
        self.heal = False
        self.starts = 0
        self.passes = 0

    async def collect(self) -> None:
        self.passes += 1

    async def run(self) -> None:
        self.starts += 1
        await asyncio.sleep(0.01)
        if not self.heal:
            raise AssertionError("tailer lost its descriptors")
        await asyncio.sleep(3600)


async def test_a_good_housekeeping_pass_never_hides_a_crashing_watcher() -> None:
    sink, metrics = Sink(), AgentMetrics()
    c = WatcherThatDies()
    r = _runner(c, sink, metrics, restart_backoff_min=0.02, restart_backoff_max=0.05)
    r.healthy_after = 0.3
    task = asyncio.create_task(r.run())
    try:
        # ~20 passes and ~10 starts a second; a loaded machine (the suite's other workers) may take longer
        deadline = time.monotonic() + 10.0
        while not (c.passes >= 10 and c.starts >= 5) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert c.passes >= 10 and c.starts >= 5
        failing = [(m.status, m.details.get("part")) for m in sink.messages if m.type == "CollectorFailing"]
        assert failing == [("firing", "run")]  # fired, and the passes did not resolve it
        assert r.failing and metrics.collector_up.labels("watcher")._value.get() == 0
        c.heal = True
        deadline = time.monotonic() + 10.0  # restarted, stayed up longer than healthy_after (~0.35 s)
        while r.failing and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        failing = [m.status for m in sink.messages if m.type == "CollectorFailing"]
        assert failing == ["firing", "resolved"]
        assert not r.failing and metrics.collector_up.labels("watcher")._value.get() == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@given(interval=st.floats(0.001, 7200.0), now=st.floats(0.0, 1e7), phase=st.floats(0.0, 10.0))
def test_an_aligned_delay_stays_near_its_interval_and_on_the_grid(interval: float, now: float, phase: float) -> None:
    """The grid keeps a pass within half an interval (and half a step) of when it was due, never back to back,
    and on a point of the process's grid."""
    d = aligned_delay(interval, now=now, phase=phase)
    step = min(ALIGN_STEP_S, interval)
    assert interval / 2 - 1e-6 <= d <= interval + step / 2 + 1e-6
    k = (now + d - phase) / step
    assert abs(k - round(k)) < 1e-6 * max(1.0, abs(k))


def test_passes_of_different_intervals_and_phases_share_their_wake_ups() -> None:
    """Three collectors (10 s, 10 s, 30 s) and a 10 s heartbeat started at arbitrary moments: after their
    first period every wake-up of the 30 s one is one of the 10 s ones' (one wake-up serves them all)."""
    phase = 3.7
    wakes: dict[str, set[float]] = {}
    for name, start, interval in (("a", 0.3, 10.0), ("b", 6.1, 10.0), ("c", 2.2, 30.0), ("hb", 8.8, 10.0)):
        t, seen = start, set()
        for _ in range(12):
            t += aligned_delay(interval, now=t, phase=phase)
            seen.add(round(t, 6))
        wakes[name] = {w for w in seen if 40 < w < 110}
    assert wakes["a"] == wakes["b"] == wakes["hb"]
    assert wakes["c"] <= wakes["a"]


async def test_an_aligned_collector_keeps_its_interval(monkeypatch: Any) -> None:
    """align = true (the default): passes come every interval, not faster, on the grid."""
    import gna_sdk.aio as aio

    monkeypatch.setattr(aio, "ALIGN_STEP_S", 0.1)
    t = Ticker()
    sink = Sink()
    r = _runner(t, sink, AgentMetrics(), interval=0.1, align=True)
    task = asyncio.create_task(r.run())
    await asyncio.sleep(1.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert 8 <= t.calls <= 12
