"""Reading /sys/class/infiniband: value parsers (property-tested) and one cheap port snapshot.

Facts (shared field facts section 4): ``state`` is "%d: %s", ``phys_state`` "%u: %s" and may
contain a space ("7: Phy Test": split at the first ':'); ``rate`` "400 Gb/sec (4X NDR)";
legacy PMA error counters keep their native width and saturate at all-ones; ``port_*_data``
counts 4-byte words; several hw_counters are 32-bit and wrap; reads may fail (EINVAL, EACCES)
or say "N/A (no PMA)".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from gna_types import entities

# Native widths of the legacy PMA counters (bits). Data/packet counters are read through the
# 64-bit extended PMA on every HCA the kernel still supports; a 32-bit all-ones still means stuck.
COUNTER_BITS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "port_xmit_wait": 32,
    "port_xmit_data": 64, "port_rcv_data": 64, "port_xmit_packets": 64, "port_rcv_packets": 64,
    "unicast_xmit_packets": 64, "unicast_rcv_packets": 64, "multicast_xmit_packets": 64,
    "multicast_rcv_packets": 64,
}
# hw_counters read by default (mlx5); others in the directory are ignored unless configured.
HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
               "roce_adp_retrans", "roce_slow_restart", "np_ecn_marked_roce_packets", "np_cnp_sent",
               "rp_cnp_handled", "rp_cnp_ignored", "implied_nak_seq_err", "req_cqe_error")
WORD_BYTES = 4  # port_xmit_data / port_rcv_data count 4-byte words

# sysfs counter -> node_exporter 1.5 metric name (without node_infiniband_ and _total), checked
# against a real node_exporter reading the same tree (bench/ib_scrape.py prints the comparison).
NODE_EXPORTER_NAMES = {
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors", "link_downed": "link_downed",
    "link_error_recovery": "link_error_recovery", "local_link_integrity_errors": "local_link_integrity_errors",
    "multicast_rcv_packets": "multicast_packets_received", "multicast_xmit_packets": "multicast_packets_transmitted",
    "port_rcv_constraint_errors": "port_constraint_errors_received",
    "port_xmit_constraint_errors": "port_constraint_errors_transmitted",
    "port_rcv_data": "port_data_received_bytes", "port_xmit_data": "port_data_transmitted_bytes",
    "port_xmit_discards": "port_discards_transmitted", "port_rcv_errors": "port_errors_received",
    "port_rcv_packets": "port_packets_received", "port_xmit_packets": "port_packets_transmitted",
    "port_rcv_remote_physical_errors": "port_receive_remote_physical_errors",
    "port_rcv_switch_relay_errors": "port_receive_switch_relay_errors", "port_xmit_wait": "port_transmit_wait",
    "symbol_error": "symbol_error", "unicast_rcv_packets": "unicast_packets_received",
    "unicast_xmit_packets": "unicast_packets_transmitted", "VL15_dropped": "vl15_dropped",
}

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Za-z0-9]*)\))?")


PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "Phy Test"}


def consistent(value: tuple[int, str] | None, table: dict[int, str]) -> tuple[int, str] | None:
    """The kernel prints number and name from one table; a file where they disagree (seen in a
    capture: phys_state "4: ACTIVE") is not trusted either way."""
    if value is None or value[0] not in table:
        return value
    norm = value[1].replace(" ", "").lower()
    return value if norm == table[value[0]].replace(" ", "").lower() else None


def parse_enum(text: str | None) -> tuple[int, str] | None:
    """'4: ACTIVE' -> (4, 'ACTIVE'); '7: Phy Test' -> (7, 'Phy Test'); None when unparsable."""
    if not text:
        return None
    num, sep, name = text.strip().partition(":")
    if not sep:
        return None
    try:
        return int(num.strip()), name.strip()
    except ValueError:
        return None


@dataclass(frozen=True)
class Rate:
    gbps: float
    width: int | None  # lanes: 1, 2, 4, 8, 12
    speed: str  # SDR DDR QDR FDR10 FDR EDR HDR NDR XDR, "" when not given


def parse_rate(text: str | None) -> Rate | None:
    if not text:
        return None
    m = _RATE.match(text)
    if not m:
        return None
    return Rate(float(m.group(1)), int(m.group(2)) if m.group(2) else None, (m.group(3) or "").upper())


def parse_counter(text: str | bytes | None) -> int | None:
    """A counter file's content -> int; None for empty, 'N/A (no PMA)', garbage, negatives."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if not text or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def saturated(name: str, value: int) -> bool:
    bits = COUNTER_BITS.get(name)
    if bits is None:
        return False
    return value == (1 << bits) - 1 or (bits == 64 and value == (1 << 32) - 1)


def counter_delta(name: str, old: int, new: int, *, hw: bool) -> int | None:
    """Increase since the last read; None when the counter went backwards (reset: new baseline)."""
    if new >= old:
        return new - old
    if hw and (1 << 31) <= old < (1 << 32) and new < (1 << 31):  # a 32-bit hw_counter wrapped
        return new + (1 << 32) - old
    return None


def _read_small(name: str, dir_fd: int | None = None) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, 256)
    except OSError:  # EINVAL/EIO from a PMA that does not answer
        return None
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int | None = None) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None


@dataclass
class PortSnapshot:
    hca: str
    port: int
    state: tuple[int, str] | None
    phys_state: tuple[int, str] | None
    rate: Rate | None
    link_layer: str
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # files that failed to read or parse

    @property
    def entity(self) -> str:
        return entities.ib(self.hca, self.port)

    @property
    def active(self) -> bool:
        """ACTIVE (or ACTIVE_DEFER) with the physical link up; an unreadable phys_state defers to state."""
        return bool(self.state and self.state[0] in (4, 5) and (self.phys_state is None or self.phys_state[0] == 5))


def read_port(hca_dir: str, hca: str, port: int, counters: tuple[str, ...], hw: tuple[str, ...],
              names_cache: dict[str, list[str]]) -> PortSnapshot:
    """One port's state and counters. Each file is opened relative to its directory's descriptor (the port's,
    its counters/, its hw_counters/): the kernel resolves the path to the port once a pass, not once a file
    (~400 files a pass on an 8-HCA node)."""
    base = f"{hca_dir}/{hca}/ports/{port}"
    port_fd = _open_dir(base)
    try:
        def text(name: str) -> str | None:
            raw = _read_small(name, port_fd) if port_fd is not None else None
            return raw.decode("ascii", "replace") if raw is not None else None

        raw_state, raw_phys = parse_enum(text("state")), parse_enum(text("phys_state"))
        snap = PortSnapshot(hca, port, consistent(raw_state, PORT_STATES), consistent(raw_phys, PHYS_STATES),
                            parse_rate(text("rate")), (text("link_layer") or "").strip())
        if snap.state is None:
            snap.unreadable.append("state")
        if snap.phys_state is None:
            snap.unreadable.append("phys_state")
        for sub, wanted, out in (("counters", counters, snap.counters), ("hw_counters", hw, snap.hw_counters)):
            sub_fd = _open_dir(sub, port_fd) if port_fd is not None else None
            try:
                present = names_cache.get(f"{base}/{sub}")
                if present is None:
                    try:
                        present = sorted(set(os.listdir(sub_fd)) & set(wanted)) if sub_fd is not None else []
                    except OSError:
                        present = []
                    names_cache[f"{base}/{sub}"] = present
                for name in present:
                    value = parse_counter(_read_small(name, sub_fd)) if sub_fd is not None else None
                    bits = COUNTER_BITS.get(name, 64) if sub == "counters" else 64
                    if value is None or value >> bits:  # beyond the counter's width: impossible, never a rate
                        snap.unreadable.append(f"{sub}/{name}")
                    else:
                        out[name] = value
            finally:
                if sub_fd is not None:
                    os.close(sub_fd)
        return snap
    finally:
        if port_fd is not None:
            os.close(port_fd)
