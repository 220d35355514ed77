"""Parsers for /dev/kmsg records and the NVIDIA lines in them. Pure functions; property-tested.

Record: ``prio,seq,usec,flags[,...];message`` then optional continuation lines starting with a
space (`` SUBSYSTEM=pci``). Non-printable bytes arrive escaped as ``\\xNN``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from gna_types.entities import normal_pci

MAX_MESSAGE = 4096


@dataclass(frozen=True)
class KmsgRecord:
    prio: int
    seq: int
    usec: int
    flags: str
    message: str
    props: dict[str, str] = field(default_factory=dict)

    @property
    def level(self) -> int:
        return self.prio & 7


_ESC = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(raw: bytes) -> str:
    if b"\\x" in raw:
        raw = _ESC.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return raw[:MAX_MESSAGE].decode("utf-8", "replace")


def parse_record(raw: bytes) -> KmsgRecord | None:
    """One record as read(2) returns it from /dev/kmsg; None when it is not one."""
    header, sep, rest = raw.partition(b";")
    if not sep:
        return None
    fields = header.split(b",")
    if len(fields) < 3:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if prio < 0 or seq < 0 or usec < 0:
        return None
    flags = fields[3].decode("ascii", "replace") if len(fields) > 3 else ""
    lines = rest.rstrip(b"\n").split(b"\n")
    props: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(b" ") and b"=" in line:
            k, _, v = line[1:].partition(b"=")
            props[k.decode("ascii", "replace")] = v.decode("utf-8", "replace")
    return KmsgRecord(prio, seq, usec, flags, _unescape(lines[0]), props)


# Renderings of the kernel log that reach a kmsg source instead of records: a pasted or
# redirected `dmesg` ("[  123.456789] msg", "<6>[ 123.4] msg" with -r), `dmesg -T`
# ("[Mon Dec  2 10:00:00 2026] msg"), and journalctl -k / syslog ("Dec 02 10:00:00 host kernel:
# msg", an ISO timestamp with --output=short-iso, optionally followed by the dmesg uptime).
_DMESG = re.compile(rb"^(?:<(?P<prio>\d{1,3})>)?\[\s*(?P<sec>\d{1,10})\.(?P<frac>\d{1,9})\]\s?(?P<msg>.*)$", re.S)
_DMESG_T = re.compile(rb"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
                      rb"\s?(?P<msg>.*)$", re.S)
_SYSLOG = re.compile(rb"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d\S*) \S+ kernel: "
                     rb"(?:\[\s*(?P<sec>\d{1,10})\.(?P<frac>\d{1,9})\] ?)?(?P<msg>.*)$", re.S)
# Bare NVIDIA lines with no prefix at all, as often pasted ("NVRM: Xid (PCI:0000:44:00): 79, ..."): only the
# driver's own tags, so a file of other text is still recognised as unusable.
_BARE = re.compile(rb"^(?P<msg>(?:NVRM: |nvidia(?:-nvswitch\d*|-peermem|_peermem|-modeset|-uvm)?: ?|nv_peer_mem: ).*)$",
                   re.S)
# `dmesg -H` / --time-format reltime (util-linux sys-utils/dmesg.c at 01a424f502cf87f4cbd1c88bb10714b9f87154d4,
# print_record DMESG_TIMEFTM_RELTIME): "[  %+8.06f] " the time since the previous line, "[%b%e %H:%M] " at each new
# minute; no uptime, so usec stays 0 (the record cannot be dated).
_DMESG_DELTA = re.compile(rb"^\[(?:\s*\+\s{0,9}\d{1,10}\.\d{1,9}|[A-Z][a-z]{2}\s?\d{1,2} \d\d:\d\d)\]\s?(?P<msg>.*)$",
                          re.S)
TEXT_FORMS = (("dmesg", _DMESG), ("dmesg -T", _DMESG_T), ("syslog", _SYSLOG), ("dmesg -H", _DMESG_DELTA),
              ("bare NVIDIA line", _BARE))


def parse_text_line(raw: bytes) -> tuple[str, KmsgRecord] | None:
    """(form, record) for one line of a known text rendering; None otherwise. The record's seq is
    -1 (the caller numbers text lines); usec is the uptime when the line carries one, else 0."""
    line = raw.rstrip(b"\r\n")
    for form, rx in TEXT_FORMS:
        m = rx.match(line)
        if m is None:
            continue
        groups = m.groupdict()
        usec = 0
        if groups.get("sec") is not None:
            usec = int(groups["sec"]) * 1_000_000 + int((groups["frac"] + b"000000")[:6])
        prio = int(groups["prio"]) if groups.get("prio") is not None else 6
        return form, KmsgRecord(prio, -1, usec, "", _unescape(m["msg"]))
    return None


def iter_text_records(data: bytes) -> Iterator[tuple[KmsgRecord | None, int]]:
    """Records from a regular-file/FIFO rendering of /dev/kmsg (one per line, continuations
    indented). Yields (record or None for a malformed line, end offset of the record). A trailing
    line without its newline is left for the next read."""
    pos = 0
    n = len(data)
    while pos < n:
        end = data.find(b"\n", pos)
        if end < 0:
            return
        stop = end + 1
        while stop < n and data[stop : stop + 1] == b" ":
            nxt = data.find(b"\n", stop)
            if nxt < 0:
                return  # continuation cut in half: wait for the rest
            stop = nxt + 1
        yield parse_record(data[pos:stop]), stop
        pos = stop


# -- NVIDIA findings ------------------------------------------------------------------------

@dataclass(frozen=True)
class Xid:
    bus_id: str  # normalised to dddd:bb:dd.f
    code: int
    pid: int | None
    process: str
    mig: str
    text: str


@dataclass(frozen=True)
class FellOffBus:
    bus_id: str
    text: str


@dataclass(frozen=True)
class SXid:
    switch: str
    bus_id: str
    code: int
    fatal: bool
    text: str


@dataclass(frozen=True)
class ModuleError:
    module: str
    kind: str  # version_mismatch | unknown_symbol | insert_failed
    symbol: str
    text: str


@dataclass(frozen=True)
class PeermemError:
    function: str
    kind: str  # invalid_context | registration_failed | p2p_error
    text: str


@dataclass(frozen=True)
class GspEvent:
    """NVRM's own words about GSP-RM failing, with or without an Xid line."""
    kind: str  # heartbeat | memsys | timeout | unresponsive | rate_limited
    instance: int | None  # RM's GPU instance ("NVRM: GPU6 <function>: ..."), None where the line has none
    bus_id: str  # normalised dddd:bb:dd.f where the line names the GPU's PCI address, else ""
    text: str


@dataclass(frozen=True)
class AerLine:
    """One line of the kernel's PCIe AER service (drivers/pci/pcie/aer.c, err.c) about a device."""
    driver: str  # the printing device's driver as dev_printk names it ("nvidia", "pcieport"; "pci": none bound)
    device: str  # normalised dddd:bb:dd.f of the printing device
    kind: str  # received | bus_error | cant_recover | recovery_failed | recovery_successful
    severity: str  # correctable | nonfatal | fatal | "" (the line carries none)
    source: str  # "received" lines: the error source's address when printed as one, else ""
    text: str


Finding = Xid | FellOffBus | SXid | ModuleError | PeermemError | GspEvent | AerLine

XID_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)([^)]*)\): (\d+),\s*(.*)")
_PID = re.compile(r"pid='?(<unknown>|\d+)'?,\s*name=([^,]*),\s*(.*)")
FELL_ONE = re.compile(r"NVRM: GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): GPU has fallen off the bus")
FELL_HEAD = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
FELL_TAIL = re.compile(r"fallen off the bus and is not responding")
# any other NVRM wording that names a GPU and says it fell off the bus (older closed drivers)
FELL_ANY = re.compile(r"NVRM: .*?(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b"
                      r".*fallen off the bus")
SXID_RE = re.compile(r"(nvidia-nvswitch\d*): SXid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)")
# nv_peer_mem: the pre-R470 GPUDirect RDMA module from Mellanox/nv_peer_memory (Mellanox/nv_peer_memory#8)
_MODULE = r"(nvidia[-_]\w+|nv_peer_mem)"
VERSION_RE = re.compile(_MODULE + r": disagrees about version of symbol (\S+)")
UNKNOWN_RE = re.compile(_MODULE + r": Unknown symbol (\S+)")
INSERT_RE = re.compile(r"could not insert '" + _MODULE + r"': (.*)")
# open-gpu-kernel-modules kernel-open/nvidia-peermem/nvidia-peermem.c, peer_err():
# "nvidia-peermem %s:%d " FMT (515-545), "nvidia-peermem %s:%d ERROR " FMT (535.129.03+, 550+, 560+).
# The line number differs between builds: match the function and the text.
PEERMEM_RE = re.compile(r"nvidia-peermem (\w+):\d+ (?:ERROR )?(.*)")


# GSP-RM (NVIDIA/open-gpu-kernel-modules, read at tags 580.95.05, 595.44.02 and 595.45.04). NV_PRINTF prints
# "NVRM: " then, on recent drivers, "GPU<instance> " and the function name (as in the issues' logs, e.g.
# NVIDIA/open-gpu-kernel-modules#1230 on 595.71.05: "NVRM: GPU6 _kgspLogRpcTimeout: ...").
#   src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c _kgspIsHeartbeatTimedOut: "Heartbeat timed out, currentTimeMs %u ..."
#   kernel_gsp.c _kgspRpcRecvPoll (595.44.02): "GSP RM heartbeat timed out" / "LibOS heartbeat timed out"
#   src/nvidia/src/kernel/gpu/mmu/kern_gmmu.c kgmmuCheckMemSubsysError_IMPL: "Memory Subsystem Error detected. ..."
#   kernel_gsp.c _kgspLogRpcTimeout (595) / _kgspLogXid119 (550-580): "*** GSP Timeout ***" (80 columns)
#   kernel_gsp.c _kgspClassifyGspTimeout (595): "=== GSP core unresponsive ===", "=== GSP-RM unresponsive ==="
#   kernel_gsp.c _kgspRpcIncrementTimeoutCountAndRateLimitPrints (portDbgPrintf): "NVRM: Rate limiting GSP RPC
#     error prints for GPU at PCI:%04x:%02x:%02x (printing 1 of every %d).  The GPU likely needs to be reset."
_GSP_INSTANCE = re.compile(r"NVRM: GPU(\d{1,4}) ")
_GSP_FORMS = (
    ("heartbeat", re.compile(r"\bHeartbeat timed out, currentTimeMs \d|\b(?:GSP RM|LibOS) heartbeat timed out\b")),
    ("memsys", re.compile(r"\bMemory Subsystem Error detected\.")),
    ("timeout", re.compile(r"\*{8,} GSP Timeout \*{8,}")),
    ("unresponsive", re.compile(r"={8,} GSP(?: core|-RM) unresponsive ={8,}")),
    ("rate_limited", re.compile(r"Rate limiting GSP RPC error prints for GPU at PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:"
                                r"[0-9a-fA-F]{2})\b.{0,80}needs to be reset")),
)
# An Xid 119/120 line names both: "Xid (PCI:0000:9b:00): 119, ... RPC response from GPU4 GSP!" (kernel_gsp.c)
XID_GSP_INSTANCE = re.compile(r"\bfrom GPU(\d{1,4}) GSP\b")

# PCIe AER (torvalds/linux drivers/pci/pcie/aer.c at 02a06f5f1a6aa2e12b2046b51ed3462c2c340037 and err.c at
# 01daacfb9035e5b86d43a01f11a0614648f306c1, and the renderings in public logs of v5-v6 kernels). dev_printk prints
# "<driver> <device>: " then, under dev_fmt "AER: " (aer.c; err.c since v5.x), the message:
#   aer_print_port_info: "%s%s error received: %04x:%02x:%02x.%d" (older: "... error received: id=%04x"; v6.16+:
#     "%s%s error message received from %s") with aer_error_severity_string "Uncorrectable (Non-Fatal)",
#     "Uncorrectable (Fatal)", "Correctable" (before v6.x "Uncorrected (Non-Fatal)", "Uncorrected (Fatal)",
#     "Corrected"), "Multiple " before it for several
#   aer_print_error: "PCIe Bus Error: severity=%s, type=%s, (%s)"
#   err.c report_error_detected: "can't recover (no error_detected callback)" (older "Can't recover ...",
#     v4.x "device has no AER-aware driver") -- nvidia registers no pci_error_handlers, so a GPU always prints it
#   err.c pcie_do_recovery on the port: "device recovery failed" / "device recovery successful"
_AER_DEV = re.compile(r"(?:^|\] |: )([A-Za-z0-9_.-]{1,32}) ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
                      r"(?:AER: )?(.{0,600})")
_AER_SEVERITY = r"(Corrected|Correctable|Uncorrected \(Non-Fatal\)|Uncorrectable \(Non-Fatal\)|" \
                r"Uncorrected \(Fatal\)|Uncorrectable \(Fatal\))"
_AER_RECEIVED = re.compile(r"(?:Multiple )?" + _AER_SEVERITY + r" error (?:received: |message received from )"
                           r"(?:id=)?([0-9a-fA-F:.]{1,16})?")
_AER_BUS_ERROR = re.compile(r"PCIe Bus Error: severity=" + _AER_SEVERITY)
_AER_CANT = re.compile(r"[Cc]an't recover \(no error_detected callback\)|device has no AER-aware driver")
_AER_RECOVERY = re.compile(r"[Dd]evice recovery (failed|successful)")
_BDF_FULL = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def _aer_severity(word: str) -> str:
    return "correctable" if word.startswith("Correct") else "fatal" if "(Fatal)" in word else "nonfatal"


def parse_gsp(message: str) -> GspEvent | None:
    """NVRM's GSP failure lines (above); None for any other line."""
    if "GSP" not in message and "eartbeat" not in message and "Memory Subsystem" not in message:
        return None
    for kind, rx in _GSP_FORMS:
        m = rx.search(message)
        if m is None:
            continue
        inst = _GSP_INSTANCE.search(message)
        bus = normal_pci(m.group(1)) if kind == "rate_limited" else ""
        return GspEvent(kind, int(inst.group(1)) if inst else None, bus, message[:500])
    return None


def parse_aer(message: str) -> AerLine | None:
    """The kernel's AER lines about one device (above); None for any other line."""
    if "AER" not in message and "PCIe Bus Error" not in message and "recover" not in message \
            and "AER-aware" not in message:
        return None
    m = _AER_DEV.search(message)
    if m is None:
        return None
    driver, device, rest = m.group(1), normal_pci(m.group(2)), m.group(3)
    if r := _AER_RECEIVED.match(rest):
        src = r.group(2) or ""
        source = normal_pci(src) if _BDF_FULL.fullmatch(src) else ""
        return AerLine(driver, device, "received", _aer_severity(r.group(1)), source, message[:500])
    if r := _AER_BUS_ERROR.match(rest):
        return AerLine(driver, device, "bus_error", _aer_severity(r.group(1)), "", message[:500])
    if _AER_CANT.match(rest):
        return AerLine(driver, device, "cant_recover", "", "", message[:500])
    if r := _AER_RECOVERY.match(rest):
        return AerLine(driver, device, f"recovery_{r.group(1)}", "", "", message[:500])
    return None


def module_name(name: str) -> str:
    return name.replace("-", "_")


class NvidiaLineParser:
    """Stateful only for the three-record "fallen off the bus" form."""

    def __init__(self) -> None:
        self._pending_gpu: str | None = None
        self._pending_age = 0

    def feed(self, message: str) -> Finding | None:
        if self._pending_gpu is not None:
            self._pending_age += 1
            if FELL_TAIL.search(message):
                bus, self._pending_gpu = self._pending_gpu, None
                return FellOffBus(bus, message)
            if self._pending_age > 3:
                self._pending_gpu = None
        if "NVRM" in message:
            if m := XID_RE.search(message):
                bus, mig, code, rest = m.groups()
                pid: int | None = None
                process = ""
                if pm := _PID.match(rest):
                    pid = int(pm.group(1)) if pm.group(1).isdigit() else None
                    process, rest = pm.group(2).strip(), pm.group(3)
                return Xid(normal_pci(bus), int(code), pid, process, mig.strip(), rest.strip()[:500])
            if m := FELL_ONE.search(message):
                return FellOffBus(normal_pci(m.group(1)), message)
            if m := FELL_HEAD.search(message):
                if FELL_TAIL.search(message):
                    return FellOffBus(normal_pci(m.group(1)), message)
                self._pending_gpu, self._pending_age = normal_pci(m.group(1)), 0
            elif m := FELL_ANY.search(message):
                return FellOffBus(normal_pci(m.group(1)), message)
            else:
                return parse_gsp(message)
            return None
        if "SXid" in message and (m := SXID_RE.search(message)):
            sw, bus, code, rest = m.groups()
            return SXid(sw, normal_pci(bus), int(code), rest.lower().startswith("fatal"), rest[:500])
        if "nvidia-peermem " in message and (m := PEERMEM_RE.search(message)):
            func, text = m.group(1), m.group(2).strip()
            kind = ("invalid_context" if "invalid context" in text or "invalid nv_mem_context" in text
                    else "registration_failed" if "error while registering" in text else "p2p_error")
            return PeermemError(func, kind, message[:500])
        if aer := parse_aer(message):
            return aer
        if "nvidia" in message or "nv_peer_mem" in message:
            if m := VERSION_RE.search(message):
                return ModuleError(module_name(m.group(1)), "version_mismatch", m.group(2), message[:500])
            if m := UNKNOWN_RE.search(message):
                return ModuleError(module_name(m.group(1)), "unknown_symbol", m.group(2), message[:500])
            if m := INSERT_RE.search(message):
                return ModuleError(module_name(m.group(1)), "insert_failed", "", message[:500])
        return None
