"""Lossless RoCE checks (collectors/roce.py, collectors/formats/roce_qos.py) on simulated trees laid out like
mlx5's sysfs: ECN per priority, PFC not seen, pause-storm rates over a real window; IB ports never judged."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors import infiniband as ibmod
from collectors.formats import roce_qos
from collectors.formats.roce_qos import (
    ETH_GSTRING_LEN,
    decode_gstats,
    decode_gstrings,
    pair_stats,
    parse_ecn_enable,
    parse_ethtool_s,
)
from collectors.roce import RoCEConfig
from gna_sdk.hostroot import HostRoot
from gna_types.policy import verdict
from sim.host import SimHost
from tests.conftest import Clock, Sink

ROCE = "mlx5_1"
IB = "mlx5_0"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


DEFAULT_DSCP2PRIO = {d: d >> 3 for d in range(64)}  # mlx5's default dscp2prio (mlnx_qos -i, trust dscp)


def node(root: Path, *, ecn: bool | None = True, dcb: bool = True) -> tuple[SimHost, str, str]:
    """One IB ConnectX-7 (mlx5_0) and one RoCE ConnectX-7 (mlx5_1); the RoCE netdev's ECN files when ``ecn``
    is not None (MLNX_OFED), its ethtool stats at the test seam with PFC counters for priority 3, and (``dcb``)
    its DCB netlink reply: PFC on priority 3, DSCP trust with the default map (DSCP 26 -> 3)."""
    h = SimHost(root)
    bridge = h.add_host_bridge("0000:10")
    h.add_nic(bridge, "0000:11:00.0", IB)
    h.add_nic(bridge, "0000:12:00.0", ROCE, link_layer="Ethernet")
    ib_if, roce_if = "ibp17s0", "enp18s0np0"
    if ecn is not None:
        h.set_roce_ecn(roce_if, enabled=ecn)
        h.set_roce_ecn(ib_if, enabled=False)  # an IB port's netdev is never judged, whatever it holds
    pause(h, roce_if, 0, 0)
    if dcb:
        h.set_dcb(roce_if, pfc={3}, dscp2prio=DEFAULT_DSCP2PRIO)
    return h, ib_if, roce_if


def pause(h: SimHost, ifname: str, frames: int, duration_us: int, *, direction: str = "rx") -> None:
    other = "tx" if direction == "rx" else "rx"
    h.set_ethtool_stats(ifname, {
        f"{direction}_prio3_pause": frames, f"{direction}_prio3_pause_duration": duration_us,
        f"{other}_prio3_pause": 0, f"{other}_prio3_pause_duration": 0, "rx_bytes": 12345})


class Runner:
    def __init__(self, root: Path, **cfg: object) -> None:
        self.sink = Sink()
        self.tracker = ConditionTracker(None)
        self.em = CollectorEmitter("n", "infiniband", self.sink, self.tracker, facts=FactStore())
        self.c = ibmod.InfinibandCollector(ibmod.InfinibandConfig(**cfg), HostRoot(root), self.em)  # type: ignore[arg-type]

    async def tick(self, clock: Clock, dt: float = 10.0) -> None:
        clock.t += dt
        self.em.begin_pass()
        await self.c.collect()
        await self.em.resolve_unasserted()

    def firing(self) -> dict[tuple[str, str], Any]:
        return {(c.type, c.entity): c for c in self.tracker.active.values()}

    def of(self, type_: str) -> list[Any]:
        return [m for m in self.sink.messages if m.type == type_]


# -- the healthy node ----------------------------------------------------------------------------------

async def test_healthy_roce_port_stays_clean(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    r = Runner(tmp_path)
    frames = dur = 0
    for _ in range(12):
        frames += 50
        dur += 200_000  # 0.2 s paused per 10 s: 2 %
        pause(h, roce_if, frames, dur)
        await r.tick(clock)
    assert not [k for k in r.firing() if k[0].startswith("RoCE")]
    fact = r.em.facts.get("infiniband.roce")
    assert list(fact) == [f"ib:{ROCE}/1"]  # the IB port is not there
    assert fact[f"ib:{ROCE}/1"]["ecn"] == {"roce_np": True, "roce_rp": True}
    assert fact[f"ib:{ROCE}/1"]["pause_rates_per_s"]["rx_prio3_pause"] == pytest.approx(5.0)
    assert (fact[f"ib:{ROCE}/1"]["pfc_enabled"], fact[f"ib:{ROCE}/1"]["trust"]) == ([3], "dscp")
    assert fact[f"ib:{ROCE}/1"]["dcbx"] == ["host", "ieee"]
    assert not r.em.blind and not r.em.skipped


# -- ECN -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("np", "rp", "off"), [("0", "1", "roce_np"), ("1", "0", "roce_rp"), ("0", "0", "and")])
async def test_ecn_disabled_on_roce_priority(tmp_path: Path, clock: Clock, np: str, rp: str, off: str) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_roce_ecn(roce_if, np={3: np}, rp={3: rp})
    r = Runner(tmp_path)
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    v = verdict("RoCEQoSMisconfigured", "ECNDisabled")
    assert (m.entity, m.reason, m.severity, m.suggested_action) == (f"ib:{ROCE}/1", "ECNDisabled", "warning",
                                                                    "fix_config") == (m.entity, m.reason, v.severity,
                                                                                      v.action)
    assert off in m.message and roce_if in m.message
    assert m.details["priority"] == 3 and 3 not in (m.details["np_enabled_priorities"] if np == "0" else [])
    # fixed: the condition resolves
    h.set_roce_ecn(roce_if)
    await r.tick(clock)
    assert ("RoCEQoSMisconfigured", f"ib:{ROCE}/1") not in r.firing()


async def test_ecn_priority_is_configurable(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_roce_ecn(roce_if, np={3: "0"}, rp={3: "0"})  # priority 3 off, 5 on
    r = Runner(tmp_path, roce=RoCEConfig(priority=5, check_pfc=False))
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured")


async def test_ecn_absent_or_unreadable_is_not_a_finding(tmp_path: Path, clock: Clock) -> None:
    _h, _ib_if, roce_if = node(tmp_path, ecn=None)  # upstream mlx5_core: no ecn/ directory
    r = Runner(tmp_path)
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured")
    assert f"/sys/class/net/{roce_if}/ecn" in r.em.blind
    h2, _i, roce2 = node(tmp_path / "b")
    h2.set_roce_ecn(roce2, np={3: ""}, rp={3: "garbage"})  # a failed firmware query prints nothing
    r2 = Runner(tmp_path / "b")
    await r2.tick(clock)
    assert not r2.of("RoCEQoSMisconfigured")
    assert any(src.endswith("roce_np/enable/3") for src in r2.em.skipped)


# -- PFC enablement and trust (DCB netlink) -----------------------------------------------------------------

@pytest.mark.parametrize(("pfc", "reason"), [(set(), "PFCDisabled"), ({4}, "PFCWrongPriority"),
                                             ({0, 4}, "PFCWrongPriority")])
async def test_pfc_off_on_roce_priority(tmp_path: Path, clock: Clock, pfc: set[int], reason: str) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc=pfc, dscp2prio=DEFAULT_DSCP2PRIO)
    r = Runner(tmp_path)
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    v = verdict("RoCEQoSMisconfigured", reason)
    assert (m.entity, m.reason, m.severity, m.suggested_action) == (f"ib:{ROCE}/1", reason, v.severity, v.action)
    assert m.suggested_action != "cordon"
    assert m.details["problems"] == [reason] and m.details["pfc_enabled_priorities"] == sorted(pfc)
    assert roce_if in m.message and "priority 3" in m.message
    # fixed: the condition resolves
    h.set_dcb(roce_if, pfc={3}, dscp2prio=DEFAULT_DSCP2PRIO)
    await r.tick(clock)
    assert ("RoCEQoSMisconfigured", f"ib:{ROCE}/1") not in r.firing()


async def test_lossy_mode_does_not_require_pfc(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc=set(), dscp2prio=DEFAULT_DSCP2PRIO)
    r = Runner(tmp_path, roce=RoCEConfig(mode="lossy"))
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured")
    assert r.em.facts.get("infiniband.roce")[f"ib:{ROCE}/1"]["pfc_enabled"] == []


async def test_pcp_trust_where_dscp_expected(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc={3}, dscp2prio=None)  # mlx5e publishes no DSCP entry in PCP trust
    r = Runner(tmp_path)
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    assert (m.reason, m.details["trust"], m.details["expected_trust"]) == ("TrustMismatch", "pcp", "dscp")
    # a VLAN-tagged fabric says so; "any" does not judge trust
    for trust in ("pcp", "any"):
        r2 = Runner(tmp_path, roce=RoCEConfig(trust=trust))  # type: ignore[arg-type]
        await r2.tick(clock)
        assert not r2.of("RoCEQoSMisconfigured"), trust


async def test_dscp_trust_where_pcp_expected(tmp_path: Path, clock: Clock) -> None:
    node(tmp_path)
    r = Runner(tmp_path, roce=RoCEConfig(trust="pcp"))
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    assert (m.reason, m.details["trust"]) == ("TrustMismatch", "dscp")


async def test_vf_trust_is_not_judged(tmp_path: Path, clock: Clock) -> None:
    """A VF is not the vport group manager: mlx5e publishes no DSCP entry for it whatever the trust."""
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc={3}, dscp2prio=None)
    h.write(f"/sys/class/net/{roce_if}/device/physfn/vendor", "0x15b3\n")
    r = Runner(tmp_path)
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured")
    assert r.em.facts.get("infiniband.roce")[f"ib:{ROCE}/1"]["trust"] is None


async def test_trust_of_another_driver_is_not_judged(tmp_path: Path, clock: Clock) -> None:
    """The APP table shows the trust state by mlx5e's convention only: a RoCE port of another driver (or one
    whose driver link cannot be read) keeps its PFC check, not a trust verdict."""
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc={3}, dscp2prio=None)
    function = h.p(f"/sys/class/net/{roce_if}/device").resolve().relative_to(h.p("/").resolve())
    h.bind_driver(f"/{function.as_posix()}", "bnxt_en")
    r = Runner(tmp_path)
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured")
    assert r.em.facts.get("infiniband.roce")[f"ib:{ROCE}/1"]["trust"] is None
    h.set_dcb(roce_if, pfc=set(), dscp2prio=None)
    await r.tick(clock)
    assert [m.reason for m in r.of("RoCEQoSMisconfigured")] == ["PFCDisabled"]


async def test_roce_dscp_mapped_elsewhere(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc={3}, dscp2prio={**DEFAULT_DSCP2PRIO, 26: 0})
    r = Runner(tmp_path)
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    assert (m.reason, m.details["dscp"], m.details["dscp_priority"]) == ("DSCPMapMismatch", 26, 0)
    r2 = Runner(tmp_path, roce=RoCEConfig(dscp=24))  # 24 -> 3: the configured DSCP is mapped right
    await r2.tick(clock)
    assert not r2.of("RoCEQoSMisconfigured")


async def test_every_problem_in_one_condition(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_roce_ecn(roce_if, np={3: "0"})
    h.set_dcb(roce_if, pfc=set(), dscp2prio=None)
    r = Runner(tmp_path)
    await r.tick(clock)
    (m,) = r.of("RoCEQoSMisconfigured")
    assert m.reason == "ECNDisabled" and m.details["problems"] == ["ECNDisabled", "PFCDisabled", "TrustMismatch"]
    assert "ECN" in m.message and "PFC" in m.message and "PCP" in m.message
    assert len(m.details["citations"]) == 2


async def test_dcb_not_seen_or_unparsed(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path, dcb=False)
    r = Runner(tmp_path)
    await r.tick(clock)  # no reply at the seam: the query failed
    assert f"RTM_GETDCB {roce_if}" in r.em.blind and not r.of("RoCEQoSMisconfigured")
    h.write(f"/.sim/dcb-ieee/{roce_if}", "zz not hex\n")
    await r.tick(clock)
    assert f"RTM_GETDCB {roce_if}" in r.em.skipped and not r.of("RoCEQoSMisconfigured")
    h.set_dcb(roce_if, pfc=None, dscp2prio=DEFAULT_DSCP2PRIO)  # a driver without ieee_getpfc: unknown, not off
    await r.tick(clock)
    assert f"RTM_GETDCB {roce_if} DCB_ATTR_IEEE_PFC" in r.em.blind and not r.of("RoCEQoSMisconfigured")
    r.c.roce.dcb_reader = lambda _if: (_ for _ in ()).throw(OSError(95, "Operation not supported"))
    await r.tick(clock)
    assert "no DCB ops" in r.em.blind[f"RTM_GETDCB {roce_if}"]


async def test_check_pfc_off(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_dcb(roce_if, pfc=set(), dscp2prio=None)
    r = Runner(tmp_path, roce=RoCEConfig(check_pfc=False))
    await r.tick(clock)
    assert not r.of("RoCEQoSMisconfigured") and "pfc_enabled" not in r.em.facts.get("infiniband.roce")[
        f"ib:{ROCE}/1"]


async def test_ib_port_never_judged(tmp_path: Path, clock: Clock) -> None:
    h, ib_if, _roce_if = node(tmp_path)
    h.set_ethtool_stats(ib_if, {"rx_prio3_pause": 0, "rx_prio3_pause_duration": 0})
    r = Runner(tmp_path)
    dur = 0
    for _ in range(8):
        dur += 9_000_000
        h.set_ethtool_stats(ib_if, {"rx_prio3_pause": dur, "rx_prio3_pause_duration": dur})
        await r.tick(clock)
    assert not [m for m in r.sink.messages if m.type.startswith("RoCE") and m.entity == f"ib:{IB}/1"]
    assert not any(ib_if in src for src in r.em.blind)


# -- pause storms ------------------------------------------------------------------------------------------

async def test_pause_storm_over_a_real_window(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    r = Runner(tmp_path)
    await r.tick(clock)  # baseline
    frames = dur = 0
    fired_at = None
    for i in range(1, 10):
        frames += 100_000
        dur += 3_000_000  # paused 3 s of every 10 s: 30 %
        pause(h, roce_if, frames, dur)
        await r.tick(clock)
        if fired_at is None and ("RoCEPauseStorm", f"ib:{ROCE}/1") in r.firing():
            fired_at = i
    # a partial window only counts what is already paused against the whole 60 s: over 10 % needs more than
    # 6 s paused (pass 3), never an extrapolation of the first 10 s
    assert fired_at == 3
    m = r.of("RoCEPauseStorm")[0]
    v = verdict("RoCEPauseStorm", "PauseStorm")
    assert (m.reason, m.severity, m.suggested_action) == ("PauseStorm", v.severity, v.action)
    assert m.suggested_action != "cordon"
    assert m.details["direction"] == "rx" and m.details["threshold_from"] == "default"
    assert m.details["paused_fraction"] == pytest.approx(0.15) and m.details["full_window"] is False  # 9 s of 60
    assert r.em.facts.get("infiniband.roce")[f"ib:{ROCE}/1"]["pause_rates_per_s"]["rx_prio3_pause_duration"] == \
        pytest.approx(300_000)  # µs per s over the full window: 30 %
    # the storm ends: the window drains and the condition resolves
    for _ in range(8):
        await r.tick(clock)
    assert ("RoCEPauseStorm", f"ib:{ROCE}/1") not in r.firing()


async def test_severe_pause_storm_is_critical_never_cordon(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    r = Runner(tmp_path)
    await r.tick(clock)
    dur = 0
    for _ in range(7):
        dur += 8_000_000  # 80 % of the time paused
        pause(h, roce_if, dur // 100, dur, direction="tx")
        await r.tick(clock)
    c = r.firing()[("RoCEPauseStorm", f"ib:{ROCE}/1")]
    v = verdict("RoCEPauseStorm", "PauseStormSevere")
    assert (c.reason, c.severity, v.severity, v.action) == ("PauseStormSevere", "critical", "critical",
                                                            "inspect_hardware")
    assert r.of("RoCEPauseStorm")[-1].details["direction"] == "tx"


async def test_first_read_and_reset_give_no_rate(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    pause(h, roce_if, 10**9, 10**12)  # a huge counter at start: only a baseline
    r = Runner(tmp_path)
    await r.tick(clock)
    pause(h, roce_if, 5, 5)  # driver reload: a reset, not a negative or enormous rate
    await r.tick(clock)
    await r.tick(clock)
    assert not r.of("RoCEPauseStorm")


async def test_no_pause_counters_is_not_seen(tmp_path: Path, clock: Clock) -> None:
    h, _ib_if, roce_if = node(tmp_path)
    h.set_ethtool_stats(roce_if, {"rx_bytes": 1})  # counters.rst: only where PFC is enabled on the priority
    r = Runner(tmp_path)
    await r.tick(clock)
    assert any("rx_prio3_pause" in src for src in r.em.blind)
    assert r.em.facts.get("infiniband.roce")[f"ib:{ROCE}/1"]["pfc_counters"] is False
    (tmp_path / ".sim" / "ethtool-S" / roce_if).unlink()  # the ioctl fails
    await r.tick(clock)
    assert any(src == f"ethtool -S {roce_if}" for src in r.em.blind)


async def test_injected_reader(tmp_path: Path, clock: Clock) -> None:
    """Tests and snapshots may feed recorded counters instead of the fixture file."""
    node(tmp_path)
    r = Runner(tmp_path)
    seq = iter([0, 6_000_000, 12_000_000, 18_000_000])
    r.c.roce.reader = lambda _if: {"rx_prio3_pause": 1, "rx_prio3_pause_duration": next(seq)}
    for _ in range(4):
        await r.tick(clock)
    c = r.firing()[("RoCEPauseStorm", f"ib:{ROCE}/1")]  # 18 s paused: 30 % of the 60 s window, sure already
    assert c.reason == "PauseStorm" and r.of("RoCEPauseStorm")[-1].details["full_window"] is False


# -- the formats -----------------------------------------------------------------------------------------

def test_parse_ecn_enable() -> None:
    assert [parse_ecn_enable(t) for t in ("1\n", "0\n", "", None, "2", " 1 ")] == [True, False, None, None, None,
                                                                                    True]


def test_parse_ethtool_s() -> None:
    text = "NIC statistics:\n     rx_prio3_pause: 12\n     tx_prio3_pause_duration: 99\n  bad line\n  x: -1\n"
    assert parse_ethtool_s(text) == {"rx_prio3_pause": 12, "tx_prio3_pause_duration": 99}
    assert parse_ethtool_s(f"  big: {1 << 64}\n") == {}


def test_ioctl_buffers_round_trip() -> None:
    """What the kernel writes into struct ethtool_gstrings / ethtool_stats data (include/uapi/linux/ethtool.h)."""
    names = ["rx_prio3_pause", "tx_prio3_pause_duration"]
    raw = b"".join(n.encode().ljust(ETH_GSTRING_LEN, b"\0") for n in names)
    vals = struct.pack("=2Q", 7, 1 << 63)
    assert pair_stats(decode_gstrings(raw, 2), decode_gstats(vals, 2)) == {names[0]: 7, names[1]: 1 << 63}
    assert pair_stats(decode_gstrings(raw, 2), decode_gstats(vals, 1)) == {}  # the set changed between calls
    assert decode_gstrings(raw, 10**9) == names and decode_gstats(vals, -1) == []


def test_real_ioctl_refuses_bad_names() -> None:
    for bad in ("", "x" * 16, "a/b"):
        with pytest.raises(OSError):
            roce_qos.ethtool_stats(bad)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=400))
def test_parse_ethtool_s_never_raises(text: str) -> None:
    out = parse_ethtool_s(text, limit=16)
    assert len(out) <= 16 and all(0 <= v < 1 << 64 for v in out.values())


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=-5, max_value=1 << 40))
def test_decoders_never_raise(buf: bytes, n: int) -> None:
    names = decode_gstrings(buf, n)
    values = decode_gstats(buf, n)
    assert len(names) <= len(buf) // ETH_GSTRING_LEN and len(values) <= len(buf) // 8
    assert all(0 <= v < 1 << 64 for v in values)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=20)))
def test_parse_ecn_never_raises(text: str | None) -> None:
    assert parse_ecn_enable(text) in (True, False, None)
