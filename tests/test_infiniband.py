from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors import infiniband as ibmod
from collectors.formats.ib_sysfs import (
    PHYS_STATES,
    Rate,
    consistent,
    counter_delta,
    parse_counter,
    parse_enum,
    parse_rate,
    saturated,
)
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.conftest import Clock, Sink
from tests.ttar import extract

# Metric families a real node_exporter 1.5 (Debian) exposes for this tree (names without _total).
NODE_EXPORTER_1_5 = {f"node_infiniband_{n}" for n in (
    "excessive_buffer_overrun_errors", "info", "link_downed", "link_error_recovery", "local_link_integrity_errors",
    "multicast_packets_received", "multicast_packets_transmitted", "physical_state_id",
    "port_constraint_errors_received", "port_constraint_errors_transmitted", "port_data_received_bytes",
    "port_data_transmitted_bytes", "port_discards_transmitted", "port_errors_received", "port_packets_received",
    "port_packets_transmitted", "port_receive_remote_physical_errors", "port_receive_switch_relay_errors",
    "port_transmit_wait", "rate_bytes_per_second", "state_id", "symbol_error", "unicast_packets_received",
    "unicast_packets_transmitted", "vl15_dropped")}
FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "procfs-sys-class-infiniband.ttar"




@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)  # the module the collector reads its clock from
    return c


class Runner:
    """Drives passes the way the framework does (begin, collect, auto-resolve)."""

    def __init__(self, root: Path, state: Path | None = None, **cfg: object) -> None:
        self.sink = Sink()
        self.tracker = ConditionTracker(None)
        self.em = CollectorEmitter("n", "infiniband", self.sink, self.tracker, facts=FactStore(), state_dir=state)
        self.c = ibmod.InfinibandCollector(ibmod.InfinibandConfig(**cfg), HostRoot(root), self.em)  # type: ignore[arg-type]

    async def tick(self, clock: Clock | None = None, dt: float = 10.0) -> None:
        if clock:
            clock.t += dt
        self.em.begin_pass()
        await self.c.collect()
        await self.em.resolve_unasserted()

    def firing(self) -> set[tuple[str, str]]:
        return {(c.type, c.entity) for c in self.tracker.active.values()}

    def findings(self) -> list[object]:
        """Everything but the periodic StragglerSignals vector (docs/straggler-signals.md)."""
        return [m for m in self.sink.messages if m.type != "StragglerSignals"]


# -- value parsers -------------------------------------------------------------------

def test_value_parsers() -> None:
    assert parse_enum("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_enum("7: Phy Test") == (7, "Phy Test")
    assert parse_enum("") is None and parse_enum("ACTIVE") is None and parse_enum("x: y") is None
    assert parse_rate("400 Gb/sec (4X NDR)") == Rate(400.0, 4, "NDR")
    assert parse_rate("2.5 Gb/sec (1X SDR)") == Rate(2.5, 1, "SDR")
    assert parse_rate("10 Gb/sec") == Rate(10.0, None, "")
    assert parse_rate("garbage") is None
    for bad in ("", "N/A (no PMA)", "-1", "12abc", "\n", None):
        assert parse_counter(bad) is None
    assert parse_counter(b"18126345378\n") == 18126345378
    assert consistent((4, "ACTIVE"), PHYS_STATES) is None  # the capture's quirk: not trusted
    assert consistent((5, "LinkUp"), PHYS_STATES) == (5, "LinkUp")
    assert saturated("symbol_error", 65535) and not saturated("symbol_error", 65534)
    assert saturated("local_link_integrity_errors", 15) and saturated("port_xmit_data", 2**32 - 1)


@given(st.text(max_size=60))
def test_parsers_never_crash(text: str) -> None:
    parse_enum(text)
    parse_rate(text)
    v = parse_counter(text)
    assert v is None or v >= 0


@given(st.integers(0, 2**64), st.integers(0, 2**64), st.booleans())
def test_counter_delta_is_never_negative(old: int, new: int, hw: bool) -> None:
    d = counter_delta("x", old, new, hw=hw)
    assert d is None or d >= 0
    if new >= old:
        assert d == new - old


def test_hw_counter_32bit_wrap_and_reset() -> None:
    assert counter_delta("np_cnp_sent", 2**32 - 10, 5, hw=True) == 15
    assert counter_delta("np_cnp_sent", 5000, 10, hw=True) is None  # a reset, not a wrap
    assert counter_delta("symbol_error", 2**32 - 10, 5, hw=False) is None


# -- real captured sysfs tree ----------------------------------------------------------

async def test_procfs_capture_reads_every_port(tmp_path: Path) -> None:
    if not FIXTURE.exists():
        pytest.skip(f"shared fixture not present at {FIXTURE}")
    root = extract(FIXTURE, tmp_path / "root")
    r = Runner(root)
    await r.tick()
    ports = sorted(r.c.ports)
    assert ports == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    mlx5 = r.c.ports[("mlx5_0", 1)].last
    assert mlx5 is not None and mlx5.counters["port_xmit_data"] == 2880761508848
    assert mlx5.hw_counters["local_ack_timeout_err"] == 131
    assert mlx5.rate == Rate(25.0, 1, "EDR")
    # phys_state "4: ACTIVE" disagrees with itself: skipped and counted, never a condition
    assert mlx5.phys_state is None and "phys_state" in mlx5.unreadable
    assert r.sink.messages == []
    assert r.c.unreadable["mlx5_0/1/phys_state"] == 1
    fams = {f.name: f for f in r.c.prometheus_families()}
    ours = {n for n in fams if n.startswith("node_infiniband_")}
    assert ours == NODE_EXPORTER_1_5, ours ^ NODE_EXPORTER_1_5
    tx = fams["node_infiniband_port_data_transmitted_bytes"].samples
    assert any(s.labels == {"device": "mlx5_0", "port": "1"} and s.value == 2880761508848 * 4 for s in tx)


# -- scenarios on an 8-HCA NDR node ---------------------------------------------------

@pytest.fixture
def ndr(tmp_path: Path) -> SimHost:
    return SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8, storage_nic=True)


async def test_healthy_ndr_node_is_quiet(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root, expected_rate_gbps=400, exclude_hcas=["mlx5_8"])
    for _ in range(3):
        for i in range(8):
            ndr.add_counter(f"mlx5_{i}", 1, "port_xmit_data", 10**9)
        await r.tick(clock)
    assert r.findings() == []
    assert len(r.c.ports) == 8  # the storage NIC is excluded
    (vector,) = r.sink.of("StragglerSignals")  # once rates exist (2nd pass), then every signals_interval
    assert vector.severity == "info" and sorted(vector.details["ports"]) == [f"mlx5_{i}/1" for i in range(8)]
    assert vector.details["ports"]["mlx5_0/1"]["symbol_error_per_h"] == 0.0


async def test_port_down_flap_and_hold_down(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root, flap_count=3, flap_window=600, flap_hold_down=900)
    await r.tick(clock)
    for _ in range(3):
        ndr.set_port("mlx5_3", state="1: DOWN", phys_state="2: Polling")
        await r.tick(clock)
        assert ("IBPortDown", "ib:mlx5_3/1") in r.firing()
        ndr.set_port("mlx5_3", state="4: ACTIVE", phys_state="5: LinkUp")
        ndr.add_counter("mlx5_3", 1, "link_downed", 1)
        await r.tick(clock)
    assert ("IBPortFlapping", "ib:mlx5_3/1") in r.firing()
    assert ("IBPortDown", "ib:mlx5_3/1") not in r.firing()
    flap = r.sink.of("IBPortFlapping")[0]
    assert flap.severity == "critical" and flap.details["flaps_in_window"] >= 3
    await r.tick(clock, dt=700)  # flaps left the window but hold-down keeps it firing
    assert ("IBPortFlapping", "ib:mlx5_3/1") in r.firing()
    await r.tick(clock, dt=300)
    assert ("IBPortFlapping", "ib:mlx5_3/1") not in r.firing()


async def test_fast_flaps_between_reads_are_counted_from_link_downed(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root)
    await r.tick(clock)
    ndr.add_counter("mlx5_0", 1, "link_downed", 4)  # four flaps inside one interval, port up at both reads
    await r.tick(clock)
    assert ("IBPortFlapping", "ib:mlx5_0/1") in r.firing()
    inc = r.sink.of("IBErrorCountersIncreasing")[0]
    assert inc.severity == "critical" and inc.details["counters"][0]["counter"] == "link_downed"


async def test_rate_drop_to_200(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root, expected_rate_gbps=400, expected_rate_gbps_per_hca={"mlx5_8": 200})
    await r.tick(clock)
    ndr.set_port("mlx5_6", rate="200 Gb/sec (4X HDR)")
    await r.tick(clock)
    (m,) = r.sink.of("IBPortDegraded")
    assert m.entity == "ib:mlx5_6/1" and m.details["speed"] == "HDR" and m.severity == "warning"


async def test_symbol_errors_rate_and_hourly_budget(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root, counter_hold_down=60)
    await r.tick(clock)
    ndr.add_counter("mlx5_1", 1, "symbol_error", 50)  # 5/s: under the 10/s warning, under 120/h
    await r.tick(clock)
    assert r.sink.of("IBErrorCountersIncreasing") == []
    ndr.add_counter("mlx5_1", 1, "symbol_error", 80)  # 130 in the hour: over the IBTA budget
    await r.tick(clock)
    (m,) = r.sink.of("IBErrorCountersIncreasing")
    assert m.severity == "critical" and m.details["counters"][0]["last_hour"] == 130
    await r.tick(clock, dt=61)
    assert ("IBErrorCountersIncreasing", "ib:mlx5_1/1") not in r.firing()


async def test_saturated_counter_wrap_and_reset(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root)
    await r.tick(clock)
    ndr.set_counter("mlx5_2", 1, "symbol_error", 65535)  # 16-bit all-ones: "at least"
    await r.tick(clock)
    assert ("IBCounterSaturated", "ib:mlx5_2/1") in r.firing()
    assert r.sink.of("IBErrorCountersIncreasing") == [], "no rate from a saturated value"
    ndr.set_counter("mlx5_2", 1, "symbol_error", 0)  # perfquery -R
    await r.tick(clock)
    assert ("IBCounterSaturated", "ib:mlx5_2/1") not in r.firing()
    # a 32-bit hw_counter wraps: a rate, not a reset
    ndr.set_counter("mlx5_2", 1, "np_cnp_sent", 2**32 - 100, hw=True)
    await r.tick(clock)
    ndr.set_counter("mlx5_2", 1, "np_cnp_sent", 50, hw=True)
    await r.tick(clock)
    assert r.c.ports[("mlx5_2", 1)].rates["hw:np_cnp_sent"] == pytest.approx(15.0)
    # a counter going backwards (driver reload) starts a new baseline: no negative rate
    ndr.set_counter("mlx5_2", 1, "port_xmit_data", 10**12)
    await r.tick(clock)
    ndr.set_counter("mlx5_2", 1, "port_xmit_data", 5)
    await r.tick(clock)
    assert all(v >= 0 for v in r.c.ports[("mlx5_2", 1)].rates.values())


async def test_roce_congestion_without_loss(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root)
    await r.tick(clock)
    ndr.add_counter("mlx5_8", 1, "np_ecn_marked_roce_packets", 50_000, hw=True)
    ndr.add_counter("mlx5_8", 1, "rp_cnp_handled", 40_000, hw=True)
    ndr.add_counter("mlx5_8", 1, "port_xmit_wait", 50_000_000)
    await r.tick(clock)
    (m,) = r.sink.of("RoCECongestion")
    assert m.entity == "ib:mlx5_8/1" and set(m.details["over"]) == {"np_ecn_marked_roce_packets", "rp_cnp_handled",
                                                                     "port_xmit_wait"}
    assert m.details["drop_rate_per_s"] == 0


async def test_hca_removed_is_reported_against_seen_and_expected(ndr: SimHost, clock: Clock, tmp_path: Path) -> None:
    r = Runner(ndr.root, tmp_path / "st", expected_hcas=[f"mlx5_{i}" for i in range(8)] + ["mlx5_9"])
    await r.tick(clock)
    assert r.firing() == {("IBDeviceMissing", "ib:mlx5_9")}
    ndr.remove_hca("mlx5_4")
    await r.tick(clock)
    assert ("IBDeviceMissing", "ib:mlx5_4") in r.firing()
    assert ("mlx5_4", 1) not in r.c.ports
    # a restart in the same boot still knows mlx5_4 existed
    r2 = Runner(ndr.root, tmp_path / "st")
    await r2.tick(clock)
    assert ("IBDeviceMissing", "ib:mlx5_4") in r2.firing()


async def test_unreadable_files_are_skipped_counted_and_shown(ndr: SimHost, clock: Clock) -> None:
    r = Runner(ndr.root)
    await r.tick(clock)
    ndr.set_counter("mlx5_0", 1, "symbol_error", "N/A (no PMA)")
    ndr.set_counter("mlx5_0", 1, "port_rcv_errors", "")
    ndr.write("/sys/class/infiniband/mlx5_0/ports/1/state", "garbage\n")
    await r.tick(clock)
    await r.tick(clock)
    assert r.findings() == []
    assert r.c.unreadable["mlx5_0/1/counters/symbol_error"] == 2
    assert r.c.unreadable["mlx5_0/1/state"] == 2
    # a value beyond the counter's width (2^70 in an 8-bit link_downed, #13 D13) is impossible: skipped too
    ndr.set_counter("mlx5_0", 1, "link_downed", str(1 << 70))
    await r.tick(clock)
    assert r.findings() == [] and r.c.unreadable["mlx5_0/1/counters/link_downed"] == 1
    # and shown, not just counted: check lists them with a count, /metrics as gna_source_unparsed_lines
    assert r.em.skipped["/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error"][0] == 3
    assert r.em.skipped["/sys/class/infiniband/mlx5_0/ports/1/state"][0] == 3
