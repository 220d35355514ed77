"""InfiniBand / RoCE: port state, rate, flaps, error and congestion counter rates.

Discovery under <host-root>/sys/class/infiniband/<hca>/ports/<n>/, rescanned on udev
``infiniband`` events and every pass. Counter rates come from deltas between reads, aware of
each counter's width (saturating PMA counters, wrapping 32-bit hw_counters, resets). Metrics are
exported with node_exporter's ``node_infiniband_*`` names so existing dashboards map.

Straggler signals (docs/straggler-signals.md): per port, symbol errors per hour, link error
recoveries per minute and receive errors per second over sliding windows (collectors/shared/counter_window.py)
that survive counter resets and the first sample; published as a ``StragglerSignals`` event every
``signals_interval`` and as ``gna_infiniband_straggler_signal``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec
import structlog
from msgspec import structs

from collectors.formats.ib_sysfs import (
    COUNTER_BITS,
    HW_COUNTERS,
    NODE_EXPORTER_NAMES,
    WORD_BYTES,
    PortSnapshot,
    counter_delta,
    read_port,
)
from collectors.roce import RoCEChecks, RoCEConfig
from collectors.shared.counter_window import CounterWindow, WindowStats
from gna_sdk import CollectorSettings, Emitter, HostPaths, Severity, plural
from gna_sdk.persist import BootScopedSet, boot_id
from gna_sdk.udev import Uevent
from gna_sdk.watch import Watches
from gna_types import entities
from gna_types.network_details import (
    IBCounterFinding,
    IBCounterSaturated,
    IBDeviceMissing,
    IBErrorCountersIncreasing,
    IBPortDegraded,
    IBPortFlapping,
    IBPortState,
    IBStragglerSignals,
    RoCECongestion,
)
from gna_types.node_details import wire

log = structlog.get_logger(__name__)

# All-ones of each legacy counter (saturation); a 64-bit data counter stuck at 2^32-1 counts too.
_SATURATED = {n: (1 << b) - 1 if b < 64 else (1 << 32) - 1 for n, b in COUNTER_BITS.items()}
_HW_KEYS: dict[str, str] = {}


class Threshold(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per counter: any increase critical, and/or rate limits (per second over the last interval,
    per hour over the trailing hour)."""

    any_increase: bool = False
    warning_per_s: float = 0.0
    warning_per_min: float = 0.0
    critical_per_hour: float = 0.0


# NVSentinel's nic-health-monitor defaults, the same counters, values and units as its chart's
# counterDetection.counters (THRESHOLD_SOURCE). NVSentinel measures a velocity over a window as long as
# its unit (1 s, 60 s, 3600 s): here per-second rules use the last interval, per-minute and per-hour
# rules a sliding 60 s / 3600 s window (CounterWindow.over).
THRESHOLD_SOURCE = ("NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/nic-health-monitor/values.yaml "
                    "@07b82dc2 counterDetection.counters")
DEFAULT_THRESHOLDS: dict[str, Threshold] = {
    "link_downed": Threshold(any_increase=True),
    "excessive_buffer_overrun_errors": Threshold(any_increase=True),
    "local_link_integrity_errors": Threshold(any_increase=True),
    "rnr_nak_retry_err": Threshold(any_increase=True),
    "symbol_error": Threshold(warning_per_s=10, critical_per_hour=120),  # > 120/h breaks the IBTA 1e-12 BER
    "link_error_recovery": Threshold(warning_per_min=5),  # "link retraining / micro-flapping"
    "port_rcv_errors": Threshold(warning_per_s=10),
    "port_xmit_discards": Threshold(warning_per_s=100),
    "local_ack_timeout_err": Threshold(warning_per_s=1),
}


# The per-port straggler vector: counter -> (window s, rate unit s, field). The windows are those of the
# counters' published rules, so the fleet compares the very rates the thresholds judge.
SIGNAL_WINDOWS: dict[str, tuple[float, float, str]] = {
    "symbol_error": (3600.0, 3600.0, "symbol_error_per_h"),
    "link_error_recovery": (60.0, 60.0, "link_error_recovery_per_min"),
    # per second over at least 10 s (the default interval: the last interval there; a shorter interval does not
    # make one error a rate of 1/s)
    "port_rcv_errors": (10.0, 1.0, "port_rcv_errors_per_s"),
}
MAX_SIGNAL_PORTS = 128  # a vector stays one small message whatever a hostile sysfs tree holds


def rule_windows(th: Threshold) -> float:
    """How much history a counter's rule needs (0: the last interval only)."""
    return 3600.0 if th.critical_per_hour else 60.0 if th.warning_per_min else 0.0


class CongestionThresholds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    np_cnp_sent_per_s: float = 1000.0
    rp_cnp_handled_per_s: float = 1000.0
    np_ecn_marked_roce_packets_per_s: float = 1000.0
    port_xmit_wait_per_s: float = 1_000_000.0  # ticks with data queued but nothing sent


class InfinibandConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 10.0
    expected_hcas: list[str] = msgspec.field(default_factory=list)
    exclude_hcas: list[str] = msgspec.field(default_factory=list)  # globs, e.g. a storage NIC
    expected_rate_gbps: float = 0.0  # per node; 0: no rate check
    expected_rate_gbps_per_hca: dict[str, float] = msgspec.field(default_factory=dict)
    flap_count: int = 3
    flap_window: float = 600.0
    flap_hold_down: float = 900.0  # IBPortFlapping stays firing this long after the last flap
    counter_hold_down: float = 300.0  # IBErrorCountersIncreasing clears after this long quiet
    thresholds: dict[str, Threshold] = msgspec.field(default_factory=dict)  # merged over the defaults
    congestion: CongestionThresholds = msgspec.field(default_factory=CongestionThresholds)
    udev: bool = True
    signals_interval: float = 300.0  # StragglerSignals event every this many seconds; 0: metrics and facts only
    roce: RoCEConfig = msgspec.field(default_factory=RoCEConfig)  # Ethernet ports' ECN/PFC (collectors/roce.py)


@dataclass
class PortState:
    last: PortSnapshot | None = None
    last_t: float = 0.0
    was_active: bool | None = None
    flaps: deque[float] = field(default_factory=deque)
    last_flap: float = 0.0
    windows: dict[str, CounterWindow] = field(default_factory=dict)  # counter key -> reset-aware sliding window
    offending: dict[str, tuple[float, IBCounterFinding]] = field(default_factory=dict)  # counter -> (last t, info)
    rates: dict[str, float] = field(default_factory=dict)


class InfinibandCollector:
    name: ClassVar[str] = "infiniband"
    config_type: ClassVar[type[InfinibandConfig]] = InfinibandConfig
    phase: ClassVar[int] = 15
    wakeup: asyncio.Event | None = None

    def __init__(self, config: InfinibandConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.thresholds = {**DEFAULT_THRESHOLDS, **config.thresholds}
        self.counters = tuple(sorted(set(COUNTER_BITS)))
        self.hw = tuple(sorted(set(HW_COUNTERS) | {c for c in config.thresholds if c not in COUNTER_BITS}))
        # counter -> seconds of history its rule and its straggler signal need
        self.keep = {name: rule_windows(th) for name, th in self.thresholds.items()}
        for name, (window, _unit, _field) in SIGNAL_WINDOWS.items():
            self.keep[name] = max(self.keep.get(name, 0.0), window)
        self._signals_at: float | None = None
        self.signals: dict[str, dict[str, Any]] = {}  # "hca/port" -> the vector of the last pass
        self.ports: dict[tuple[str, int], PortState] = {}
        self.unreadable: dict[str, int] = {}  # "hca/port/file" -> times skipped
        self._names: dict[str, list[str]] = {}
        self._layout: list[tuple[str, int]] | None = None
        self._info: dict[str, tuple[str, ...]] = {}
        d = RoCEConfig()
        self.roce = RoCEChecks(config.roce, host, emit, thresholds_configured=(
            config.roce.pause_fraction_warning, config.roce.pause_fraction_critical, config.roce.pause_window_s) != (
            d.pause_fraction_warning, d.pause_fraction_critical, d.pause_window_s))
        self.seen = BootScopedSet(emit.state_dir / "seen_hcas.json" if emit.state_dir else None, boot_id(host))

    # -- discovery --------------------------------------------------------------------
    def _excluded(self, hca: str) -> bool:
        return any(fnmatch.fnmatchcase(hca, pat) for pat in self.config.exclude_hcas)

    def _discover(self) -> list[tuple[str, int]]:
        root = self.host.path("/sys/class/infiniband")
        out: list[tuple[str, int]] = []
        try:
            hcas = sorted(p.name for p in root.iterdir())
        except OSError:
            hcas = []
        for hca in hcas:
            if self._excluded(hca):
                continue
            try:
                ports = sorted(int(p.name) for p in (root / hca / "ports").iterdir() if p.name.isdigit())
            except OSError:
                ports = []
            out.extend((hca, p) for p in ports)
        return out

    def _on_uevent(self, ev: Uevent) -> None:
        self._layout = None  # rescan at once
        self._names.clear()
        if self.wakeup:
            self.wakeup.set()

    async def run(self) -> None:
        async with Watches("infiniband") as w:
            if self.config.udev:
                w.udev(self._on_uevent, ("infiniband", "infiniband_verbs", "net"), fallback="periodic rescan")
            await w.hold()

    # -- the pass ---------------------------------------------------------------------
    def _read_all(self) -> list[PortSnapshot]:
        layout = self._discover()
        if layout != self._layout:
            self._names.clear()
            self._layout = layout
            self._info = {hca: tuple((self.host.read_text(f"/sys/class/infiniband/{hca}/{f}") or "").strip()
                                     for f in ("board_id", "fw_ver", "hca_type")) for hca, _ in layout}
        base = str(self.host.path("/sys/class/infiniband"))
        return [read_port(base, hca, port, self.counters, self.hw, self._names) for hca, port in layout]

    async def collect(self) -> None:
        if not self.host.path("/sys/class/infiniband").is_dir():
            self.emit.not_seen("/sys/class/infiniband", "no InfiniBand/RoCE HCA on this node (directory missing)")
        snaps = await asyncio.to_thread(self._read_all)
        now = time.monotonic()
        hcas = {s.hca for s in snaps}
        self.seen.add_all(hcas)
        for hca in sorted((self.seen.items | set(self.config.expected_hcas)) - hcas):
            if self._excluded(hca):
                continue
            await self.emit.condition(
                "IBDeviceMissing", firing=True, severity="critical", entity=entities.ib(hca),
                reason="RemovedOrNotFound" if hca in self.seen.items else "ExpectedNotFound",
                message=f"RDMA device {hca} is missing from /sys/class/infiniband.",
                details=wire(IBDeviceMissing(expected=sorted(self.config.expected_hcas), present=sorted(hcas))),
                suggested_action="cordon")
        present = set()
        for snap in snaps:
            key = (snap.hca, snap.port)
            present.add(key)
            st = self.ports.setdefault(key, PortState())
            for f in snap.unreadable:
                k = f"{snap.hca}/{snap.port}/{f}"
                self.unreadable[k] = self.unreadable.get(k, 0) + 1
                self.emit.unparsed(f"/sys/class/infiniband/{k.replace('/', '/ports/', 1)}",
                                   "unreadable, or not a value of its kind (EINVAL, N/A)")
            await self._port_state(snap, st, now)
            await self._counters(snap, st, now)
            if snap.link_layer == "Ethernet":  # RoCE: lossless-Ethernet checks; an IB port is never judged by them
                await self.roce.check(snap.hca, snap.port, snap.entity, now)
            st.last, st.last_t = snap, now
        for key in set(self.ports) - present:
            del self.ports[key]
        self.roce.forget({s.entity for s in snaps if s.link_layer == "Ethernet"})
        self.emit.facts.set("infiniband.roce", dict(self.roce.facts))
        self.emit.facts.set("infiniband.ports", {
            s.entity: {"active": s.active, "link_layer": s.link_layer, "rate_gbps": s.rate.gbps if s.rate else None}
            for s in snaps})
        await self._publish_signals(snaps, now)

    async def _port_state(self, snap: PortSnapshot, st: PortState, now: float) -> None:
        active = snap.active
        port = IBPortState(state=snap.state[1] if snap.state else None,
                           phys_state=snap.phys_state[1] if snap.phys_state else None,
                           rate=f"{snap.rate.gbps:g} Gb/sec" if snap.rate else None, link_layer=snap.link_layer)
        # A flap is a down->up; link_downed increments catch the ones shorter than the interval.
        downs = 0
        if st.last is not None and "link_downed" in snap.counters and "link_downed" in st.last.counters:
            d = counter_delta("link_downed", st.last.counters["link_downed"], snap.counters["link_downed"], hw=False)
            downs = d or 0
        if st.was_active is False and active:
            downs = max(downs, 1)
        for _ in range(min(downs, 100)):
            st.flaps.append(now)
            st.last_flap = now
        while st.flaps and now - st.flaps[0] > self.config.flap_window:
            st.flaps.popleft()
        st.was_active = active
        if not active and snap.state is not None:
            await self.emit.condition(
                "IBPortDown", firing=True, severity="critical", entity=snap.entity,
                reason="PhysicalLinkDown" if snap.phys_state and snap.phys_state[0] != 5 else "StateNotActive",
                message=f"Port {snap.hca}/{snap.port} is {port.state} ({port.phys_state}).",
                details=wire(port), suggested_action="cordon")
        flapping = len(st.flaps) >= self.config.flap_count
        if flapping or (st.last_flap and now - st.last_flap < self.config.flap_hold_down
                        and self._is_firing("IBPortFlapping", snap.entity)):
            await self.emit.condition(
                "IBPortFlapping", firing=True, severity="critical", entity=snap.entity, reason="LinkFlaps",
                message=f"Port {snap.hca}/{snap.port} went down and came back {plural(len(st.flaps), 'time')} in "
                        f"{self.config.flap_window:g} s.",
                details=wire(IBPortFlapping(**structs.asdict(port), flaps_in_window=len(st.flaps),
                                            window_s=self.config.flap_window, hold_down_s=self.config.flap_hold_down)),
                suggested_action="cordon")
        want = self.config.expected_rate_gbps_per_hca.get(snap.hca, self.config.expected_rate_gbps)
        if want and active and snap.rate and snap.rate.gbps < want:
            await self.emit.condition(
                "IBPortDegraded", firing=True, severity="warning", entity=snap.entity, reason="RateBelowExpected",
                message=f"Port {snap.hca}/{snap.port} runs at {snap.rate.gbps:g} Gb/s "
                        f"({snap.rate.width}X {snap.rate.speed}), expected {want:g} Gb/s.",
                details=wire(IBPortDegraded(**structs.asdict(port), expected_gbps=want, width=snap.rate.width,
                                            speed=snap.rate.speed)),
                suggested_action="inspect_hardware")

    def _is_firing(self, type_: str, entity: str) -> bool:
        return any(t == type_ and e == entity for t, e, _ in self.emit.active_conditions())

    async def _counters(self, snap: PortSnapshot, st: PortState, now: float) -> None:
        prev = st.last
        dt = now - st.last_t if prev else 0.0
        sat: list[str] = []
        for hw, values, olds in ((False, snap.counters, prev.counters if prev else {}),
                                 (True, snap.hw_counters, prev.hw_counters if prev else {})):
            for name, value in values.items():
                key = _HW_KEYS.setdefault(name, "hw:" + name) if hw else name
                if not hw and value == _SATURATED.get(name):
                    sat.append(name)
                    continue  # "at least": no rate from a stuck counter
                old = olds.get(name)
                if old is None or (not hw and old == _SATURATED.get(name)):
                    continue
                delta = counter_delta(name, old, value, hw=hw)
                if delta is None:  # reset or driver reload: new baseline, no negative rate
                    if key in st.windows:
                        st.windows[key].add_increase(now, None)
                    st.rates.pop(key, None)
                    continue
                st.rates[key] = delta / dt if dt > 0 else 0.0
                keep = self.keep.get(name)
                if keep is not None:
                    win = st.windows.get(key)
                    if win is None:
                        win = st.windows[key] = CounterWindow(keep)
                        win.restart(st.last_t)  # baseline: the previous read
                    win.add_increase(now, delta)
                    self._evaluate(name, delta, win, st, now)
        offending = {c: info for c, (t, info) in st.offending.items() if now - t < self.config.counter_hold_down}
        st.offending = {c: v for c, v in st.offending.items() if c in offending}
        if offending:
            worst: Severity = "critical" if any(i.severity == "critical" for i in offending.values()) else "warning"
            names = ", ".join(sorted(offending))
            await self.emit.condition(
                "IBErrorCountersIncreasing", firing=True, severity=worst, entity=snap.entity,
                reason="CountersAboveThreshold",
                message=f"Error counters rising on {snap.hca}/{snap.port}: {names}.",
                details=wire(IBErrorCountersIncreasing(counters=[offending[c] for c in sorted(offending)])),
                suggested_action="cordon" if worst == "critical" else "inspect_hardware")
        if sat:
            await self.emit.condition(
                "IBCounterSaturated", firing=True, severity="warning", entity=snap.entity, reason="CounterAtMaximum",
                message=f"Counters on {snap.hca}/{snap.port} are stuck at their maximum ({', '.join(sat)}): "
                        f"rates cannot be computed until they are reset (perfquery -x -R).",
                details=wire(IBCounterSaturated(counters=sat, bits={c: COUNTER_BITS[c] for c in sat})))
        await self._congestion(snap, st)

    def _evaluate(self, name: str, delta: int, win: CounterWindow, st: PortState, now: float) -> None:
        th = self.thresholds.get(name)
        if th is None or delta <= 0:
            return
        last = win.stats(0.0)
        per_s = last.per(1.0) if last else float(delta)
        info: IBCounterFinding | None = None
        used: WindowStats | None = last
        hour = win.stats(3600.0) if th.critical_per_hour else None
        minute = win.stats(60.0) if th.warning_per_min else None
        if th.any_increase:
            info = IBCounterFinding(counter=name, delta=delta, severity="critical", rule="any increase")
        elif hour is not None and hour.over(th.critical_per_hour, 3600.0):
            info = IBCounterFinding(counter=name, delta=delta, last_hour=hour.count,
                                    rate_per_hour=round(hour.per(3600.0), 3), full_window=hour.full,
                                    severity="critical", rule=f"> {th.critical_per_hour:g}/hour")
            used = hour
        elif th.warning_per_s and per_s > th.warning_per_s:
            info = IBCounterFinding(counter=name, delta=delta, rate_per_s=round(per_s, 3), severity="warning",
                                    rule=f"> {th.warning_per_s:g}/s")
        elif minute is not None and minute.over(th.warning_per_min, 60.0):
            info = IBCounterFinding(counter=name, delta=delta, last_minute=minute.count,
                                    rate_per_min=round(minute.per(60.0), 3), full_window=minute.full,
                                    severity="warning", rule=f"> {th.warning_per_min:g}/min")
            used = minute
        if info is not None:
            info.window_s = round(used.span, 3) if used else 0.0
            configured = name in self.config.thresholds
            info.threshold_from = "config" if configured else "default"
            if not configured:  # for developers; the dashboard does not show a citation (fleet/dashboard.py)
                info.citation = THRESHOLD_SOURCE
            st.offending[name] = (now, info)

    async def _congestion(self, snap: PortSnapshot, st: PortState) -> None:
        c = self.config.congestion
        rates = {
            "np_cnp_sent": (st.rates.get("hw:np_cnp_sent", 0.0), c.np_cnp_sent_per_s),
            "rp_cnp_handled": (st.rates.get("hw:rp_cnp_handled", 0.0), c.rp_cnp_handled_per_s),
            "np_ecn_marked_roce_packets": (st.rates.get("hw:np_ecn_marked_roce_packets", 0.0),
                                           c.np_ecn_marked_roce_packets_per_s),
            "port_xmit_wait": (st.rates.get("port_xmit_wait", 0.0), c.port_xmit_wait_per_s),
        }
        over = {k: round(v, 1) for k, (v, limit) in rates.items() if limit and v > limit}
        if over:
            drops = st.rates.get("port_xmit_discards", 0.0) + st.rates.get("hw:out_of_buffer", 0.0)
            await self.emit.condition(
                "RoCECongestion", firing=True, severity="warning", entity=snap.entity, reason="CongestionSignals",
                message=f"Congestion on {snap.hca}/{snap.port} without loss ({', '.join(sorted(over))} high): "
                        f"check PFC/ECN settings; AllReduce stalls while nothing fails.",
                details=wire(RoCECongestion(rates_per_s={k: round(v, 1) for k, (v, _l) in rates.items()}, over=over,
                                            drop_rate_per_s=round(drops, 3))), suggested_action="inspect_hardware")

    # -- straggler signals (docs/straggler-signals.md) ------------------------------------
    def _port_signals(self, snap: PortSnapshot, st: PortState) -> dict[str, Any]:
        board, _fw, hca_type = self._info.get(snap.hca, ("", "", ""))
        out: dict[str, Any] = {"active": snap.active, "rate_gbps": snap.rate.gbps if snap.rate else None,
                               "link_layer": snap.link_layer or None, "hca_type": hca_type or None,
                               "board_id": board or None}
        partial: dict[str, int] = {}
        for counter, (window, unit, name) in SIGNAL_WINDOWS.items():
            win = st.windows.get(counter)
            stats = win.stats(window) if win is not None else None
            out[name] = round(stats.per(unit), 6) if stats is not None else None
            if stats is not None and not stats.full:
                partial[name] = stats.count
        wait = st.rates.get("port_xmit_wait")
        out["port_xmit_wait_per_s"] = round(wait, 3) if wait is not None else None
        out["resets"] = sum(w.resets for w in st.windows.values())
        if partial:
            # measured over less than the window (the history is younger than it): the rate shown is an
            # extrapolation; the counted increase is what a comparison may use (docs/straggler-signals.md)
            out["partial"] = list(partial)
            out["partial_counts"] = partial
        return out

    async def _publish_signals(self, snaps: list[PortSnapshot], now: float) -> None:
        self.signals = {f"{s.hca}/{s.port}": self._port_signals(s, self.ports[(s.hca, s.port)])
                        for s in snaps[:MAX_SIGNAL_PORTS] if (s.hca, s.port) in self.ports}
        self.emit.facts.set("infiniband.straggler_signals", self.signals)
        measured = any(v[name] is not None for v in self.signals.values() for _w, _u, name in SIGNAL_WINDOWS.values())
        interval = self.config.signals_interval
        if not measured or interval <= 0 or (self._signals_at is not None and now - self._signals_at < interval):
            return
        details = IBStragglerSignals(
            schema=1, ports=self.signals, truncated=max(0, len(snaps) - MAX_SIGNAL_PORTS),
            windows_s={name: window for window, _u, name in SIGNAL_WINDOWS.values()},
            thresholds={c: msgspec.to_builtins(self.thresholds[c]) for c in SIGNAL_WINDOWS if c in self.thresholds},
            citation=THRESHOLD_SOURCE, interval_s=interval)
        if await self.emit.event(
                "StragglerSignals", severity="info", entity="signals:ib", reason="Periodic",
                message=f"Straggler signals of {len(self.signals)} InfiniBand/RoCE ports.", details=wire(details)):
            self._signals_at = now

    # -- Prometheus (node_exporter names where they overlap) ---------------------------
    def prometheus_families(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["device", "port"]
        state = GaugeMetricFamily("node_infiniband_state_id", "State of the InfiniBand port (0-5)", labels=labels)
        phys = GaugeMetricFamily("node_infiniband_physical_state_id", "Physical state of the port (0-7)",
                                 labels=labels)
        rate = GaugeMetricFamily("node_infiniband_rate_bytes_per_second", "Maximum signal transfer rate",
                                 labels=labels)
        fams: dict[str, Any] = {}
        hw = CounterMetricFamily("gna_infiniband_hw_counter", "mlx5 hw_counters (node_exporter 1.5 has none)",
                                 labels=[*labels, "counter"])
        rates = GaugeMetricFamily("gna_infiniband_counter_rate_per_second",
                                  "Counter increase per second over the last interval", labels=[*labels, "counter"])

        def counter(name: str) -> Any:
            if name not in fams:
                fams[name] = CounterMetricFamily(f"node_infiniband_{name}", f"InfiniBand {name}", labels=labels)
            return fams[name]

        info = GaugeMetricFamily("node_infiniband_info", "Non-numeric data from /sys/class/infiniband/<device>",
                                 labels=["device", "board_id", "firmware_version", "hca_type"])
        for hca, (board, fw, hca_type) in sorted(self._info.items()):
            info.add_metric([hca, board, fw, hca_type], 1)
        for (hca, port), st in sorted(self.ports.items()):
            snap = st.last
            if snap is None:
                continue
            lv = [hca, str(port)]
            if snap.state:
                state.add_metric(lv, snap.state[0])
            if snap.phys_state:
                phys.add_metric(lv, snap.phys_state[0])
            if snap.rate:
                rate.add_metric(lv, snap.rate.gbps * 125_000_000)
            for name, value in snap.counters.items():
                metric = NODE_EXPORTER_NAMES.get(name)
                if metric is not None:
                    counter(metric).add_metric(lv, value * WORD_BYTES if metric.endswith("_bytes") else value)
            for name, value in snap.hw_counters.items():
                hw.add_metric([*lv, name], value)
            for key, per_s in st.rates.items():
                rates.add_metric([*lv, key.removeprefix("hw:")], per_s)
        skipped = CounterMetricFamily("gna_infiniband_unreadable_files", "Counter files skipped (EINVAL, N/A...)",
                                      labels=["file"])
        for f, n in sorted(self.unreadable.items()):
            skipped.add_metric([f], n)
        signal = GaugeMetricFamily("gna_infiniband_straggler_signal",
                                   "Per-port straggler signal vector (docs/straggler-signals.md)",
                                   labels=[*labels, "signal"])
        for name, vector in sorted(self.signals.items()):
            dev, _, port_no = name.rpartition("/")
            for key, value in vector.items():
                if isinstance(value, bool | int | float):
                    signal.add_metric([dev, port_no, key], float(value))
        return [info, state, phys, rate, *fams.values(), hw, rates, skipped, signal]
