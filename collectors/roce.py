"""Lossless-RoCE checks of the infiniband collector's Ethernet ports (not a plugin of its own: the
infiniband collector owns the ports and calls :class:`RoCEChecks` for those whose link_layer is Ethernet;
an InfiniBand port is never judged here).

Per RoCE port, through its netdev (/sys/class/infiniband/<hca>/device/net/<if>):

- ECN at the notification and reaction points for the RoCE priority (``roce.priority``, default 3: the
  RoCE switch priority of NVIDIA's lossless RoCE configuration, Cumulus Linux 5.14 "RDMA over Converged
  Ethernet - RoCE", default configuration "switch priority 3 to traffic class 3 (RoCE)"). Off at either is
  ``RoCEQoSMisconfigured``/``ECNDisabled``. The files come with MLNX_OFED/DOCA drivers only: absent is "not
  seen", never a finding.
- PFC enablement and trust, over DCB netlink (RTM_GETDCB / DCB_CMD_IEEE_GET, collectors/formats/dcb_netlink.py;
  mlx5 exposes them nowhere else). In ``mode = "lossless"`` (NVUE's default RoCE mode; Cumulus Linux 5.14 "RDMA over
  Converged Ethernet - RoCE": "Enable PFC on switch priority 3 (RoCE)" is YES for lossless, NO for lossy) PFC
  off on the RoCE priority is ``PFCDisabled`` (off everywhere) or ``PFCWrongPriority`` (on for others); in
  ``"lossy"`` it is not required. Trust (both modes trust L3, the same table): a physical function whose APP
  table holds no DSCP entry is in PCP trust, ``TrustMismatch`` against ``trust``; in DSCP trust, the RoCE DSCP
  (``dscp``, 26) mapped to another priority is ``DSCPMapMismatch``. Trust is judged on mlx5 physical functions
  only (``device/driver`` mlx5_core, no ``device/physfn``): a VF publishes no DSCP entry whatever its trust, and
  another driver's APP table need not show its trust. A driver without DCB ops (EOPNOTSUPP) is not seen.
- PFC pause counters of the priority (ethtool stats, collectors/formats/roce_qos.py) as rates over a real
  sliding window (collectors/shared/counter_window.py): the share of the window the port was paused (pause
  duration in microseconds / window) above ``pause_fraction_warning`` / ``_critical`` is ``RoCEPauseStorm``.
  No public source gives a threshold for this; the defaults are conservative configuration values
  (docs/operations.md "Lossless RoCE").
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from collectors.formats import dcb_netlink
from collectors.formats.dcb_netlink import DCBReplyError, DCBState
from collectors.formats.roce_qos import (
    COUNTERS_SOURCE,
    ECN_PROTOCOLS,
    ECN_SOURCE,
    FIXTURE_DIR,
    PRIORITIES,
    StatsReader,
    ethtool_stats,
    parse_ecn_enable,
    parse_ethtool_s,
    pause_names,
)
from collectors.shared.counter_window import CounterWindow
from gna_sdk import Emitter, HostPaths
from gna_types.network_details import RoCEPauseStorm, RoCEQoSProblems
from gna_types.node_details import wire
from gna_types.policy import verdict

MAX_NETDEVS = 64  # a hostile tree with thousands of netdevs costs nothing


class RoCEConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = True
    priority: int = 3  # the RoCE traffic priority (PFC/ECN), 0-7
    check_ecn: bool = True
    check_pfc: bool = True  # PFC enablement and trust over DCB netlink
    # "lossless": PFC must be on for the RoCE priority; "lossy" (ECN only, no PFC): it need not be
    mode: Literal["lossless", "lossy"] = "lossless"
    # what the port classifies RoCE by: "dscp" (NVIDIA's RoCE configuration: no VLAN tag needed), "pcp" (a
    # VLAN-tagged fabric), "any" (not judged)
    trust: Literal["dscp", "pcp", "any"] = "dscp"
    # the DSCP the jobs' RoCE traffic carries (NCCL_IB_TC=106 is DSCP 26 << 2 | ECT(0))
    dscp: Annotated[int, msgspec.Meta(ge=0, le=63)] = 26
    pause_window_s: float = 60.0  # "sustained": the paused share over at least this long
    # No public source gives a pause-storm threshold: conservative defaults (docs/operations.md)
    pause_fraction_warning: float = 0.10
    pause_fraction_critical: float = 0.50


@dataclass
class _Port:
    windows: dict[str, CounterWindow] = field(default_factory=dict)


@dataclass
class _Findings:
    """One port's QoS problems of a pass: (reason, sentence) in check order, the sources, the details."""

    ifname: str
    priority: int
    problems: list[tuple[str, str]] = field(default_factory=list)
    citations: set[str] = field(default_factory=set)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, reason: str, text: str, citation: str) -> None:
        self.problems.append((reason, text))
        self.citations.add(citation)


class RoCEChecks:
    def __init__(self, config: RoCEConfig, host: HostPaths, emit: Emitter, reader: StatsReader | None = None,
                 *, thresholds_configured: bool = False) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.prio = min(7, max(0, config.priority))
        # the netdev itself on the real host, the seam's saved answers under a --host-root; tests may inject theirs
        on_host = Path(str(self.host.root)) == Path("/")
        self.reader = reader if reader is not None else ethtool_stats if on_host else self._fixture_stats
        self.dcb_reader: Callable[[str], DCBState] = dcb_netlink.query if on_host else self._fixture_dcb
        self.from_config = thresholds_configured
        self.ports: dict[str, _Port] = {}
        self.facts: dict[str, dict[str, object]] = {}

    def _fixture_stats(self, ifname: str) -> dict[str, int]:
        text = self.host.read_text(f"{FIXTURE_DIR}/{ifname}", limit=1 << 20)
        if text is None:
            raise OSError(f"no {FIXTURE_DIR}/{ifname} under the host root")
        return parse_ethtool_s(text)

    def netdev(self, hca: str, port: int) -> str | None:
        """The netdev of an mlx5 port: the only one under device/net, else the one whose dev_port is port-1."""
        base = f"/sys/class/infiniband/{hca}/device/net"
        try:
            names = sorted(str(p.name) for p in self.host.path(base).iterdir())[:MAX_NETDEVS]
        except OSError:
            return None
        if len(names) == 1:
            return names[0]
        for name in names:
            if (self.host.read_text(f"{base}/{name}/dev_port") or "").strip() == str(port - 1):
                return name
        return None

    async def check(self, hca: str, port: int, entity: str, now: float | None = None) -> None:
        """One RoCE (link_layer Ethernet) port's pass."""
        if not self.config.enabled:
            return
        now = time.monotonic() if now is None else now
        ifname = self.netdev(hca, port)
        if ifname is None:
            self.emit.not_seen(f"/sys/class/infiniband/{hca}/device/net",
                               f"no netdev found for RoCE port {hca}/{port}: ECN and PFC not checked")
            return
        fact: dict[str, object] = {"interface": ifname, "priority": self.prio}
        found = _Findings(ifname=ifname, priority=self.prio)
        if self.config.check_ecn:
            self._ecn(ifname, fact, found)
        if self.config.check_pfc:
            self._dcb(ifname, fact, found)
        await self._report(entity, found)
        await self._pause(ifname, entity, now, fact)
        self.facts[entity] = fact

    async def _report(self, entity: str, found: _Findings) -> None:
        """Every QoS problem of the port as one condition (one type per entity: the first problem is its
        reason, the message names them all). A pass that finds none asserts nothing: the framework resolves
        the condition."""
        if not found.problems:
            return
        reason = found.problems[0][0]
        v = verdict("RoCEQoSMisconfigured", reason)
        d = found.details
        await self.emit.condition(
            "RoCEQoSMisconfigured", firing=True, severity=v.severity, entity=entity, reason=reason,
            message=" ".join(text for _r, text in found.problems),
            details=wire(RoCEQoSProblems(
                interface=found.ifname, priority=found.priority, problems=[r for r, _t in found.problems],
                mode=self.config.mode, expected_trust=self.config.trust, citations=sorted(found.citations), **d)),
            suggested_action=v.action)

    def _ecn(self, ifname: str, fact: dict[str, object], found: _Findings) -> None:
        base = f"/sys/class/net/{ifname}/ecn"
        if not self.host.path(base).is_dir():
            self.emit.not_seen(base, "no per-priority ECN sysfs (MLNX_OFED/DOCA drivers only, not upstream "
                                     "mlx5_core): ECN not checked")
            return
        states: dict[str, dict[int, bool | None]] = {
            proto: {p: parse_ecn_enable(self.host.read_text(f"{base}/{proto}/enable/{p}", limit=64))
                    for p in PRIORITIES} for proto in ECN_PROTOCOLS}
        np_on, rp_on = states["roce_np"][self.prio], states["roce_rp"][self.prio]
        fact["ecn"] = {"roce_np": np_on, "roce_rp": rp_on}
        for proto in ECN_PROTOCOLS:
            if states[proto][self.prio] is None:
                self.emit.unparsed(f"{base}/{proto}/enable/{self.prio}", "unreadable or not 0/1 (a failed query)")
        if np_on is False or rp_on is False:
            off = [proto for proto, on in (("roce_np", np_on), ("roce_rp", rp_on)) if on is False]
            found.add("ECNDisabled", f"ECN is disabled on {ifname} for RoCE priority {self.prio} "
                                     f"({' and '.join(off)}): congestion becomes PFC pauses and AllReduce P99 stalls "
                                     f"without loss.", ECN_SOURCE)
            found.details.update(
                roce_np=np_on, roce_rp=rp_on,
                np_enabled_priorities=[p for p, on in states["roce_np"].items() if on],
                rp_enabled_priorities=[p for p, on in states["roce_rp"].items() if on])

    def _fixture_dcb(self, ifname: str) -> DCBState:
        text = self.host.read_text(f"{dcb_netlink.FIXTURE_DIR}/{ifname}", limit=1 << 18)
        if text is None:
            raise OSError(f"no {dcb_netlink.FIXTURE_DIR}/{ifname} under the host root")
        return dcb_netlink.parse_hex(text, ifname=ifname)

    def _dcb(self, ifname: str, fact: dict[str, object], found: _Findings) -> None:
        source = f"RTM_GETDCB {ifname}"
        try:
            state = self.dcb_reader(ifname)
        except DCBReplyError as exc:
            self.emit.unparsed(source, str(exc)[:200])
            return
        except OSError as exc:
            why = ("the driver has no DCB ops" if exc.errno == errno.EOPNOTSUPP else str(exc)[:200])
            self.emit.not_seen(source, f"DCB netlink query failed ({why}): PFC enablement and trust not checked")
            return
        for kind, n in state.skipped.items():
            self.emit.unparsed(source, f"{n} APP entries dropped ({kind})")
        dscp_map = state.dscp_map
        # trust read from the APP table is mlx5e's convention: judged on an mlx5 physical function only
        judged = self._driver(ifname) == "mlx5_core" and not self.host.path(
            f"/sys/class/net/{ifname}/device/physfn").exists()
        fact["pfc_enabled"] = sorted(state.pfc_enabled) if state.pfc_enabled is not None else None
        fact["trust"] = state.trust if judged else None
        fact["dcbx"] = state.dcbx_modes
        if state.pfc_enabled is None:
            self.emit.not_seen(f"{source} DCB_ATTR_IEEE_PFC", "the driver gave no PFC object: PFC enablement not "
                                                              "checked")
        elif self.config.mode == "lossless" and self.prio not in state.pfc_enabled:
            on = sorted(state.pfc_enabled)
            reason = "PFCWrongPriority" if on else "PFCDisabled"
            where = f"enabled only on priorit{'y' if len(on) == 1 else 'ies'} {', '.join(map(str, on))}" if on \
                else "disabled on every priority"
            found.add(reason, f"PFC is {where} of {ifname}, not on the RoCE priority {self.prio}: RoCE traffic is "
                              f"lossy on a fabric configured lossless (drops become retransmissions and stalls).",
                      dcb_netlink.SOURCE)
            found.details.update(pfc_enabled_priorities=on, pfc_cap=state.pfc_cap)
        want = self.config.trust
        if not judged or want == "any":
            return
        if state.trust != want:
            found.add("TrustMismatch", f"{ifname} classifies by {state.trust.upper()}, not {want.upper()}"
                                       + (" (no DSCP entry in its DCB APP table)" if state.trust == "pcp" else "")
                                       + f": RoCE traffic may not reach priority {self.prio}.", dcb_netlink.SOURCE)
            found.details.update(trust=state.trust)
        elif want == "dscp" and dscp_map.get(self.config.dscp, self.prio) != self.prio:
            got = dscp_map[self.config.dscp]
            found.add("DSCPMapMismatch", f"{ifname} maps DSCP {self.config.dscp} (RoCE) to priority {got}, not to "
                                         f"the RoCE priority {self.prio}.", dcb_netlink.SOURCE)
            found.details.update(trust=state.trust, dscp=self.config.dscp, dscp_priority=got)

    def _driver(self, ifname: str) -> str:
        """The netdev's PCI driver (the basename of ``device/driver``), "" when unbound or unreadable."""
        try:
            return os.path.basename(os.readlink(str(self.host.path(f"/sys/class/net/{ifname}/device/driver"))))
        except OSError:
            return ""

    async def _pause(self, ifname: str, entity: str, now: float, fact: dict[str, object]) -> None:
        try:
            stats = self.reader(ifname)
        except OSError as exc:
            self.emit.not_seen(f"ethtool -S {ifname}", f"SIOCETHTOOL failed ({exc}): PFC pause counters not read")
            return
        names = pause_names(self.prio)
        if not any(n in stats for n in names.values()):
            # counters.rst: "available only if PFC was enabled on priority p" -- a hint, not a verdict
            fact["pfc_counters"] = False
            self.emit.not_seen(f"ethtool -S {ifname} {names['rx_frames']}",
                               f"no pause counters for priority {self.prio} (mlx5 shows them only where PFC is "
                               f"enabled on the priority): pause storms not checked")
            return
        fact["pfc_counters"] = True
        st = self.ports.setdefault(entity, _Port())
        window = self.config.pause_window_s
        rates: dict[str, float] = {}
        fractions: dict[str, tuple[float, bool, float]] = {}  # direction -> (fraction, full, span)
        for role, name in names.items():
            if name not in stats:
                continue
            win = st.windows.setdefault(role, CounterWindow(window))
            win.add(now, stats[name])
            got = win.stats(window)
            if got is None:
                continue
            rates[name] = round(got.per(1.0), 3)
            if role.endswith("_duration_us"):
                # sure share: over a partial window only what is already paused counts against the whole window
                fractions[role[:2]] = (got.sure_per(1.0, window) / 1e6, got.full, got.span)
        fact["pause_rates_per_s"] = rates
        worst = max(fractions.items(), key=lambda kv: kv[1][0], default=None)
        if worst is None:
            return
        direction, (fraction, full, span) = worst
        c = self.config
        reason = ("PauseStormSevere" if fraction > c.pause_fraction_critical else
                  "PauseStorm" if fraction > c.pause_fraction_warning else None)
        if reason is None:
            return
        limit = c.pause_fraction_critical if reason == "PauseStormSevere" else c.pause_fraction_warning
        v = verdict("RoCEPauseStorm", reason)
        who = "the switch paused this port" if direction == "rx" else "this port paused the switch"
        await self.emit.condition(
            "RoCEPauseStorm", firing=True, severity=v.severity, entity=entity, reason=reason,
            message=f"PFC pause storm on {ifname} priority {self.prio}: {who} {fraction:.0%} of the last "
                    f"{span:.0f} s.",
            details=wire(RoCEPauseStorm(
                interface=ifname, priority=self.prio, direction=direction, paused_fraction=round(fraction, 4),
                rates_per_s=rates, window_s=round(span, 3), full_window=full,
                rule=f"paused share > {limit:g} over {window:g} s",
                threshold_from="config" if self.from_config else "default", citation=COUNTERS_SOURCE)),
            suggested_action=v.action)

    def forget(self, present: set[str]) -> None:
        for key in set(self.ports) - present:
            del self.ports[key]
        for key in set(self.facts) - present:
            del self.facts[key]
