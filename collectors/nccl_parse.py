"""NCCL and PyTorch log lines: one rule table, a bytes prefilter, and per-process state.

Line shapes (NCCL src/debug.cc): ``host:pid:tid [cudaDev] NCCL INFO msg``;
``host:pid:tid [cudaDev] file.cc:LINE NCCL WARN msg``; since 2.26 WARN lines usually start with
``[YYYY-MM-DD HH:MM:SS] ``; since 2.30 ``file.cc:LINE (function) NCCL WARN``. ``host`` is the
hostname cut at its first dot. PyTorch's watchdog has its own prefix; its text is matched anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gna_sdk import Severity
from gna_types import entities
from gna_types.entities import pci_from_nccl

# NCCL's own prefix, found anywhere in the line: whatever stands before it is a launcher's or a
# collector's ("node-3: ", "[1,0]<stdout>:", kubectl --timestamps' RFC 3339 time, syslog, tqdm's
# carriage-return junk). Parts may be redacted when a log is pasted: the host ("<cluster_name>"), the pid
# ("<pid>", "xxx"), or the whole "host:pid:tid " (only "[0] " left; NVIDIA/nccl#1612).
# Linear time on any line (a job writes them; one 64 KiB line used to cost minutes of CPU): a plain host
# starts only where a run of host characters starts (the lookbehind; the leftmost match always starts
# there anyway), redactions, the source and the function are bounded in the pattern. A host, pid or
# tid longer than PREFIX_MAX still matches and is rejected by parse_line, never cut.
PREFIX = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,18})?)\] )?"
    r"(?:(?P<host><[^>\s]{1,64}>|(?<![^\s:\[\]<>])[^\s:\[\]<>]+):(?P<pid>\d+|<[^>\s]{0,16}>|[xX*#?.]{1,16}):"
    r"(?P<tid>\d+|<[^>\s]{0,16}>|[xX*#?.]{1,16}) )?"
    r"\[(?P<dev>-?\d+)\] "
    r"(?:(?P<src>[^\s]{1,256}:\d{1,10})(?: \((?P<func>[^)]{0,256})\))? )?NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT) "
    r"(?P<msg>.*)$")


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    type: str  # message type it feeds (a condition or an event)
    severity: Severity
    fields: tuple[str, ...]
    warn_only: bool = False
    nccl_only: bool = False  # only on a line with NCCL's own prefix (a bare printf of the same text is not)
    # searched first (linear): without it the rule cannot match, and with it the rule's first start that
    # gets past its head succeeds -- a lazy ".*?" tried from every repeat of the head is quadratic
    guard: re.Pattern[str] | None = None
    # byte strings one of which every line the rule matches contains: the prefilter (a line with none is
    # never decoded) and bench/nccl_ingest.py's grep pattern are built from them, so a rule brings its own
    # (tests/test_nccl_formats.py: every golden line a rule matches holds one of its needles)
    needles: tuple[bytes, ...] = ()


def _r(p: str) -> re.Pattern[str]:
    return re.compile(p)


# The whole vocabulary. Strings checked against NCCL's sources 2.18-2.30 (tests/golden/).
# Channel/Ring lines (src/transport/{p2p,shm,net}.cc): "Ring %02d" in 2.4, "Channel %02d" from 2.7,
# "/connIndex" on NET lines from 2.12 (never on SHM lines), brackets busId (2.7-2.18.1) or nvmlDev,
# none on 2.4's NET lines; PXN adds "(proxyRank)", 2.26+ "(PCI)" after /GDRDMA.
_CHAN = r"(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[^\]]*\])? -> (?P<dst>\d+)(?:\[[^\]]*\])? "

# PyTorch's log prefix (ProcessGroupNCCL createLogPrefix()): "[Rank r] " (2.1-2.2), "[PG p Rank r] " (2.3), "[PG p
# (desc) Rank r] " (2.4), "[PG ID p PG GUID g(desc) Rank r] " (2.5+, pytorch/pytorch@cf1380df
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), "[PG GUID g(desc) Rank r] " (2.14 per-work lines).
# r is the rank *in that process group*; desc is "default_pg" for the world group.
_PG = (r"(?:\[(?:PG (?:ID )?(?P<pg>\d+) ?)?(?:PG GUID (?P<guid>[^\s(\]]{1,40}))?\s*(?:\((?P<desc>[^)\]]{0,64})\))?"
       r"\s*Rank (?P<rank>\d+)\]\s+)?")
# torchrun's per-rank prefix ("[rank3]:[E1203 ...]", 2.2+): the *global* rank
_TORCHRUN_RANK = re.compile(r"\[rank(\d+)\]:")


def _seq(name: str) -> str:
    return rf"(?P<{name}>-?\d{{1,20}})"


RULES: tuple[Rule, ...] = (
    Rule("network", _r(r"\bUsing network (?P<net>\S[^\n]*?)\s*$"), "NCCLSocketFallback", "critical", ("net",),
         needles=(b"Using network ",)),
    Rule("ib_no_device", _r(r"NET/IB : No device found"), "NCCLSocketFallback", "critical", (),
         needles=(b"NET/IB : ",)),
    # src/misc/ibvwrap.cc: "Failed to open libibverbs.so[.1]" (a WARN in 2.4, INFO in 2.20): no verbs in the
    # job's container, so no IB device either (NVIDIA/nccl#367, #1817)
    Rule("ib_no_verbs", _r(r"Failed to open libibverbs"), "NCCLSocketFallback", "critical", (),
         needles=(b"Failed to open libibverbs",)),
    Rule("ib_using", _r(r"NET/IB : Using (?P<devs>.*?)\s*(?P<ro>\[RO\])?\s*; OOB (?P<oob>\S+)"), "NCCLHCASelection",
         "warning", ("devs", "oob"), guard=_r(r"; OOB \S"), needles=(b"NET/IB : ",)),
    Rule("socket_using", _r(r"NET/Socket : Using (?P<ifs>.+?)\s*$"), "NCCLSocketFallback", "critical", ("ifs",),
         needles=(b"NET/Socket : Using",)),
    # 2.4: "... Disabled for GPU %d[%d] / HCA %d '%s' (no module or not supported by GPU)"; 2.7-2.12:
    # "NET/IB : GPU Direct RDMA Disabled for HCA %d '%s' (no module)"; 2.13+: "NET/%s : GPU Direct RDMA %s
    # for HCA %d '%s'"; the Mellanox plugin: "GPU Direct RDMA (nvidia-peermem) enabled for HCA %d '%s".
    Rule("gdr", _r(r"NET/\w+ : GPU Direct RDMA (?:\((?P<how>[\w-]+)\) )?(?P<state>[Ee]nabled|[Dd]isabled) for "
                   r"(?:GPU \S+ / )?HCA (?P<hca>[0-9a-f]+)(?: '(?P<name>[^'\s]+)'?)?"),
         "NCCLNoGDRDMA", "warning", ("state", "hca", "name"), needles=(b"GPU Direct RDMA",)),
    # "(proxyRank)" after the device: a PXN send, out through another GPU's NIC (net.cc sendSetup, 2.12+)
    Rule("channel_net", _r(_CHAN + r"\[(?P<dir>send|receive)\] via NET/(?P<net>\w+)/(?P<dev>\d+)"
                                   r"(?:\((?P<proxy>\d+)\))?(?P<flags>\S*)"),
         "NCCLNoGDRDMA", "warning", ("ch", "src", "dst", "dir", "net", "dev", "proxy", "flags"),
         needles=(b"via NET/",)),
    # "via direct shared memory" (2.4-2.12), "via SHM/%s/%s" (2.13-2.30.4), "via SHM/direct" (2.30.7)
    Rule("channel_shm", _r(_CHAN + r"via (?:SHM/(?P<mode>\S+)|direct shared memory)"), "NCCLP2PViaHost", "warning",
         ("ch", "src", "dst", "mode"), needles=(b"via SHM/", b"via direct shared memory")),
    # init.cc showVersion (2.4 init.cu): INFO(NCCL_ALL, "%s", VERSION_STRING), "NCCL version 2.21.5+cuda12.4"
    Rule("version", _r(r"^NCCL version (?P<version>[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![0-9])[^\s]{0,40})"), "",
         "info", ("version",), nccl_only=True, needles=(b"NCCL INFO NCCL version ",)),
    Rule("init", _r(r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
                    r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-f]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
                    r".*Init COMPLETE"), "NCCLJobMember", "info", ("comm", "rank", "nranks", "bus", "commid"),
         guard=_r(r"Init COMPLETE"), needles=(b"Init COMPLETE",)),
    # net_ib.cc, 2.7.3+: INFO(NCCL_NET|NCCL_ENV, "NCCL_IB_HCA set to %s") — shown by default from 2.17
    Rule("env_hca", _r(r"\bNCCL_IB_HCA set to (?P<value>\S+)"), "NCCLHCASelection", "warning", ("value",),
         needles=(b"NCCL_IB_HCA set",)),
    # param.h/param.cc: "%s set by environment to %lu." (integer NCCL_PARAMs such as NCCL_IB_DISABLE);
    # net.cc/plugin: "NCCL_NET_PLUGIN set by environment to %s"
    Rule("env_param", _r(r"\b(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>[^\s]+?)\.?\s*$"), "",
         "info", ("name", "value"), needles=(b"set by environment to",)),
    # net_ib.cc: "NET/IB : Got completion with error %d, opcode %d, ..." (<= 2.9), "... from peer %s with error
    # %d" (2.10-2.19), "with status=%d" (2.20+), "status=%s(%d)" (2.28.7+); "NET/IB:" from 2.22
    Rule("ib_completion", _r(r"NET/IB(?:/GIN)? ?: Got completion (?:from peer (?P<peer>\S+) )?with "
                             r"(?:status=(?:(?P<sname>[A-Z_]+)\()?(?P<status>\d+)\)?|error (?P<err>\d+))"),
         "NCCLIBCompletionError", "critical", ("peer", "status", "sname", "vendor_err", "hca"),
         needles=(b"NET/IB : ", b"NET/IB: ", b"NET/IB/GIN")),
    # net_ib.cc (docs/formats.md, "IB async events"): "NET/IB : Got async event : %s" (2.4-2.18), "NET/IB :
    # %s:%d Got async event : %s" (2.21), "NET/IB : %s:%d async fatal event[ on CQ/QP/SRQ (...)]: %s" (2.24+),
    # "NET/IB : %s:%d Got non-fatal async event: %s(%d)" (2.28); the port that failed under a rank's feet
    Rule("ib_async", _r(r"NET/IB ?: (?:(?P<hca>[\w.-]+):(?P<port>\d+) )?(?P<kind>Got async event|Got non-fatal async "
                        r"event|async fatal event)[^:]*?: ?(?P<what>.*?)\s*$"),
         "NCCLIBAsyncEvent", "critical", ("hca", "port", "kind", "what"), needles=(b"NET/IB : ", b"NET/IB: ")),
    Rule("socket_error", _r(r"(?P<what>Connection closed by remote peer|Connection reset by peer|Call to recv from "
                            r"\S+ failed|Connect to \S+ failed|connect to \S+ failed|exceeded retries)"),
         "NCCLSocketError", "warning", ("what",), warn_only=True, needles=(b"NCCL WARN",)),
    Rule("watchdog", _r(_PG + r"Watchdog caught collective operation timeout: "
                        r"WorkNCCL\(SeqNum=(?P<seq>\d+), "
                        r"OpType=(?P<op>\w+)(?:.*?Timeout\(ms\)=(?P<timeout>\d+))?.*?\) ran for (?P<ran>\d+) "
                        r"milliseconds"), "NCCLCollectiveTimeout", "critical", ("rank", "seq", "op", "timeout", "ran"),
         guard=_r(r"\) ran for \d+ milliseconds"), needles=(b"Watchdog caught",)),
    # The process group's progress when its watchdog gives up (docs/formats.md, "PyTorch PG status"):
    # "Timeout at NCCL work: %d, last enqueued NCCL work: %d, last completed NCCL work: %d." (2.2-2.5),
    # "Exception (either an error or timeout) detected by watchdog at work: %d, last enqueued ..." (2.4-2.5),
    # " failure detected by watchdog at work sequence id: %d PG status: last enqueued work: %d, last
    # completed work: %d" (2.6+)
    Rule("pg_progress", _r(_PG + r"(?P<what>Timeout at NCCL work|Exception (?:\(either an error or timeout\) )?"
                           r"detected by watchdog at work|failure detected by watchdog at work sequence id): "
                           + _seq("at") + r",? (?:PG status: )?last enqueued (?:NCCL )?work: " + _seq("enq")
                           + r", last completed (?:NCCL )?work: " + _seq("done")),
         "NCCLWatchdogProgress", "warning", ("pg", "rank", "at", "enq", "done"), needles=(b"ast enqueued ",)),
    # A rank hears of another rank's timeout (HeartbeatMonitor, 2.4+): "Received a dump signal due to a
    # collective timeout from {this local rank| rank N} and we will try our best to dump the debug info. Last
    # enqueued NCCL work: %d, last completed NCCL work: %d." A rank that never entered the collective the
    # others wait in has nothing in flight, never times out, and says where it stands only here.
    Rule("pg_dump_signal", _r(_PG + r"Received a dump signal due to a collective timeout from\s+(?:rank "
                              r"(?P<src>\d+)|(?P<local>this local rank))?.{0,200}?Last enqueued NCCL work: "
                              + _seq("enq") + r", last completed NCCL work: " + _seq("done")),
         "NCCLWatchdogProgress", "warning", ("pg", "rank", "src", "enq", "done"), needles=(b"ast enqueued ",)),
    # glog INFO every 30 s (kWorkStatusUpdatePeriodMs): progress for the process summary, never an event
    Rule("pg_periodic", _r(_PG + r"NCCL Work update periodically: last enqueued NCCL work: " + _seq("enq")
                           + r", last completed NCCL work: " + _seq("done")),
         "", "info", ("pg", "rank", "enq", "done"), needles=(b"ast enqueued ",)),
)
RULES_BY_NAME = {r.name: r for r in RULES}

# Byte needles: only lines containing one of these are decoded. Channel lines over P2P/SHM-free
# paths (the numerous intra-node ones) never pass; every NET channel line does: which NIC each
# channel uses (NET/IB/<n>) is the rank's real NIC, GDRDMA or not (a few hundred lines per job start).
WARN_NEEDLE = b"NCCL WARN"  # any WARN line is an NCCLWarning (WARNING_RULE), whatever rule it also matches
_NEEDLES = tuple(dict.fromkeys([n for r in RULES for n in r.needles] + [WARN_NEEDLE]))
PREFILTER = re.compile(b"|".join(re.escape(n) for n in _NEEDLES))


def grep_pattern() -> str:
    """The prefilter's needles as one POSIX extended regular expression (bench/nccl_ingest.py's ``grep -cE``)."""
    return "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", n.decode()) for n in _NEEDLES)


def _hyperscan() -> Any:
    """Hyperscan's SIMD literal matcher (x86_64): grep-class speed. None where it is not installed."""
    try:
        import hyperscan
    except ImportError:
        return None
    exprs = [re.escape(n) for n in _NEEDLES]
    db = hyperscan.Database()
    db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=[0] * len(exprs))
    return db


def _re2() -> Any:
    """google-re2's DFA over the alternation: ~4x Python's backtracking re on this input."""
    try:
        import re2
    except ImportError:
        return None
    return re2.compile(b"|".join(re.escape(n) for n in _NEEDLES))


_ENGINES: dict[str, Any] = {}


def engine(name: str) -> Any:
    """The compiled scanner, built on first use: an idle node with no NCCL logs never loads it."""
    if name not in _ENGINES:
        _ENGINES[name] = _hyperscan() if name == "hyperscan" else _re2() if name == "re2" else PREFILTER
    return _ENGINES[name]


def best_engine() -> str:
    for name in ("hyperscan", "re2"):
        if engine(name) is not None:
            return name
    return "re"


def _match_ends(data: bytes, name: str) -> list[int]:
    """Offsets just past each needle match, in order (an engine that is not installed falls back)."""
    if name == "hyperscan" and (hs := engine("hyperscan")) is not None:
        ends: list[int] = []
        hs.scan(data, match_event_handler=lambda _id, _frm, to, _fl, _ctx: ends.append(to))
        return sorted(ends)
    scanner = engine("re2") if name in ("hyperscan", "re2") else None
    return [m.end() for m in (scanner or PREFILTER).finditer(data)]

_IB_DEV = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)/(IB|RoCE)(/SHARP)?")
_VENDOR = re.compile(r"vendor[ _]err[= ]?(\d+)")
_HCA = re.compile(r"\bhca (\S+)")


# -- bounds: the longest value each field can have when NCCL or PyTorch printed the line ----------------
# A job's user writes these logs. A field past its bound is no NCCL output: the whole line is rejected
# and counted (nccl_logs: Emitter.unparsed, source REJECTED_SOURCE, with a sample), never cut to a
# shorter value that could be another valid id. Decimal numbers are bounded before int() (CPython
# refuses past 4,300 digits; a 5,000-digit pid used to raise out of parse_line).
_INT_DIGITS = 10  # C int, "%d": INT_MAX 2147483647
_U64_DIGITS = 20  # uint64/size_t, "%lu": 18446744073709551615
PREFIX_MAX: dict[str, int] = {
    # NCCL src/debug.cc (ncclDebugInit): getHostName(hostname, 1024, '.') -- the host name cut at its
    # first dot; the kernel's nodename is at most 64 bytes (__NEW_UTS_LEN, include/uapi/linux/utsname.h)
    "host": 64,
    "pid": 7, "tid": 7,  # PID_MAX_LIMIT 4194304 (include/linux/threads.h); a redaction ("<pid>", "xxx") alike
    "dev": 11,  # "[%d]" cudaDev
    "ts": 40,  # "[%Y-%m-%d %H:%M:%S]" (2.26+), a fraction when a collector added one
    "src": 256, "func": 256,  # "%s:%d" of __FILE__/__LINE__; "(%s)" of __func__ (2.30+)
}  # parse_line checks these unrolled (a test keeps the two equal)
FIELD_MAX: dict[str, int] = {
    # src/init.cc Init COMPLETE (docs/formats.md section 8; NVIDIA/nccl v2.18.6-1 L1375, v2.30.7-1
    # L1936-1946): "comm %p" (a 64-bit pointer: 0x + 16 hex digits), "busId %lx" (int64 comm->busId: 16
    # hex digits), "commId 0x%llx" (uint64 comm->commHash: 0x + at most 16 hex digits); rank, nranks,
    # cudaDev, nvmlDev "%d".
    "comm": 18, "commid": 18, "bus": 16,
    "rank": _INT_DIGITS, "nranks": _INT_DIGITS, "cuda": _INT_DIGITS, "nvml": _INT_DIGITS,
    # channel lines (src/transport/net.cc, p2p.cc, shm.cc): "%02d" channel, "%d" ranks, NET/<name>/<dev>
    "ch": _INT_DIGITS, "src": _INT_DIGITS, "dst": _INT_DIGITS, "dev": _INT_DIGITS, "proxy": _INT_DIGITS,
    "net": 64, "flags": 64, "mode": 64, "dir": 8,
    # net_ib.cc: HCA names (ibv_get_device_name: IBV_SYSFS_NAME_MAX 64), "HCA %d", "port %d", statuses "%d"
    "hca": 64, "name": 64, "port": _INT_DIGITS, "status": _INT_DIGITS, "err": _INT_DIGITS, "sname": 64,
    "vendor_err": _INT_DIGITS, "how": 32, "state": 16, "kind": 32,
    # "from peer %s": ncclSocketToString, an address and "<port>" (INET6_ADDRSTRLEN 46 + 8)
    "peer": 128,
    # lists NCCL prints in one line: "NET/IB : Using [0]mlx5_0:1/IB ... ; OOB ib0:10.0.0.5<0>" (32 NICs
    # of 30-odd bytes fit in 4 KiB), "NET/Socket : Using [0]eth0:10.0.0.5<0> ...", the OOB interface
    "devs": 4096, "ifs": 1024, "oob": 128, "ro": 8,
    # environment echoes: "%s set by environment to %s", "NCCL_IB_HCA set to %s"
    "value": 1024,
    "version": 64,
    # free text (an async event's name, a socket error): kept for the message only, still bounded
    "what": 512,
    # ProcessGroupNCCL (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): "PG ID %lu", "SeqNum=%lu",
    # "OpType=%s" (opTypeToString: ALLREDUCE, ...), "Timeout(ms)=%ld", "ran for %ld milliseconds"
    "pg": _U64_DIGITS, "guid": 40, "desc": 64, "seq": _U64_DIGITS, "op": 64, "timeout": _U64_DIGITS,
    "ran": _U64_DIGITS, "at": _U64_DIGITS + 1, "enq": _U64_DIGITS + 1, "done": _U64_DIGITS + 1, "local": 16,
    "torchrun_rank": _INT_DIGITS,  # torchrun's "[rank%d]:" prefix
}
DEFAULT_FIELD_MAX = 256  # a field a future rule adds without a bound of its own
REJECTED_SOURCE = "NCCL lines with a field longer than NCCL or PyTorch print (rejected)"


@dataclass(frozen=True)
class Line:
    offset: int  # byte offset in its file
    host: str
    pid: int
    dev: int
    level: str  # INFO, WARN, ... or "" for a non-NCCL line (PyTorch)
    ts: str
    src: str
    func: str
    msg: str
    raw: str
    over: tuple[str, int, int] | None = None  # (field, length, limit): a prefix field past its bound


@dataclass(frozen=True)
class Match:
    rule: Rule
    line: Line
    fields: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    """A line whose ``field`` is ``length`` characters where NCCL/PyTorch print at most ``limit``."""

    line: Line
    rule: str  # the rule that matched, or "prefix"
    field: str
    length: int
    limit: int


def candidate_lines(data: bytes, base: int, *, max_line: int = 65536,
                    engine: str = "auto") -> list[tuple[int, bytes]]:
    """(offset, line) for lines with a needle; a byte scan in C, no decoding of the rest.
    A line longer than ``max_line`` is cut there (its start is what the rules read)."""
    out: list[tuple[int, bytes]] = []
    last_start = -1
    for end_of_match in _match_ends(data, best_engine() if engine == "auto" else engine):
        start = data.rfind(b"\n", 0, end_of_match - 1) + 1  # the match's last byte may be the newline
        if start == last_start:
            continue
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        out.append((base + start, data[start : min(end, start + max_line)]))
        last_start = start
    return out


def parse_line(offset: int, raw: bytes) -> Line:
    """NCCL's prefix split off. A prefix field past PREFIX_MAX sets ``over`` (match_or_reject rejects the
    line) and is not converted: the line's host, pid and device are then empty."""
    text = raw.decode("utf-8", "replace").rstrip("\r")
    text = text.rsplit("\r", 1)[-1]  # a progress bar's carriage returns: the terminal shows the last part
    m = PREFIX.search(text)
    if m is None:
        return Line(offset, "", 0, -1, "", "", "", "", text, text)
    ts, host, pid_s, tid, dev, src, func = m.group("ts", "host", "pid", "tid", "dev", "src", "func")
    if (len(host or "") > 64 or len(pid_s or "") > 7 or len(tid or "") > 7 or len(dev) > 11
            or len(ts or "") > 40 or len(src or "") > 256 or len(func or "") > 256):  # PREFIX_MAX, unrolled
        for name, limit in PREFIX_MAX.items():
            value = m[name]
            if value is not None and len(value) > limit:
                return Line(offset, "", 0, -1, m["level"], "", "", "", m["msg"], text,
                            over=(name, len(value), limit))
    pid = int(pid_s) if pid_s and pid_s.isdigit() else 0  # redacted: one process per host
    return Line(offset, host or "", pid, int(dev), m["level"], ts or "", src or "", func or "", m["msg"], text)


def _min_limit(rule: Rule) -> int:
    """The tightest bound among a rule's fields (and the extras match_or_reject adds): a line whose longest
    value is within it needs no field-by-field check (the hot path of a channel line)."""
    names = [*rule.pattern.groupindex, "vendor_err", "hca", "torchrun_rank"]
    return min(FIELD_MAX.get(n, DEFAULT_FIELD_MAX) for n in names)


def _over(fields: dict[str, Any]) -> tuple[str, int, int] | None:
    for k, v in fields.items():
        limit = FIELD_MAX.get(k, DEFAULT_FIELD_MAX)
        if isinstance(v, str) and len(v) > limit:
            return k, len(v), limit
    return None


def match_or_reject(line: Line) -> Match | Rejected | None:
    """The first rule that matches; WARN lines no rule explains become NCCLWarning; a line with a field
    past its bound (PREFIX_MAX, FIELD_MAX) is Rejected whatever rule it would feed."""
    if line.over is not None:
        return Rejected(line, "prefix", *line.over)
    msg = line.msg
    for rule in RULES:
        if (rule.warn_only and line.level != "WARN") or (rule.nccl_only and not line.level):
            continue
        if rule.guard is not None and rule.guard.search(msg) is None:
            continue
        m = rule.pattern.search(msg)
        if m is None:
            continue
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        if rule.name == "ib_completion":
            if vm := _VENDOR.search(msg):
                fields["vendor_err"] = vm.group(1)
            if hm := _HCA.search(msg):
                fields["hca"] = hm.group(1)
        elif rule.name == "watchdog" or rule.name.startswith("pg_"):
            tr = _TORCHRUN_RANK.search(line.raw)
            if tr is not None:
                fields["torchrun_rank"] = tr.group(1)
        if (fields and max(map(len, fields.values())) > _MIN_LIMIT[rule.name]
                and (over := _over(fields)) is not None):
            return Rejected(line, rule.name, *over)
        if rule.name == "ib_completion":
            if "err" in fields:
                fields["status"] = fields.pop("err")
            if "vendor_err" in fields:
                fields["vendor_err"] = int(fields["vendor_err"])
            fields["status"] = int(fields["status"])
        elif rule.name == "watchdog" or rule.name.startswith("pg_"):
            _torch_fields(fields)
        return Match(rule, line, fields)
    if line.level == "WARN":
        return Match(WARNING_RULE, line, {})
    return None


def match_line(line: Line) -> Match | None:
    """match_or_reject without the rejections (they are None here: count them with match_or_reject)."""
    m = match_or_reject(line)
    return m if isinstance(m, Match) else None


WARNING_RULE = Rule("warn", _r(r"."), "NCCLWarning", "warning", (), needles=(WARN_NEEDLE,))
_MIN_LIMIT = {r.name: _min_limit(r) for r in RULES}
SEQ_MAX = 1 << 53  # a sequence number past this is uninitialised memory (seen in public logs), not progress


def _torch_fields(fields: dict[str, Any]) -> None:
    """PyTorch's numbers, checked: ``rank`` becomes the world rank where the line says it (torchrun's
    ``[rankN]:``, or the default process group's rank), else None (``pg_rank`` keeps the group's);
    sequence numbers outside [-1, 2**53) or a completed count above the enqueued one become None and
    ``implausible`` is set -- they are not progress."""
    pg_rank = int(fields.pop("rank")) if "rank" in fields else None
    tr = fields.pop("torchrun_rank", None)  # checked against its bound with the other fields
    desc, pg, guid = fields.get("desc"), fields.get("pg"), fields.get("guid")
    # the world group: described "default_pg", else the first group created (ID/GUID 0), else "[Rank r]"
    default_pg = desc == "default_pg" if desc else pg == "0" if pg is not None else guid in (None, "0")
    fields["pg_rank"] = pg_rank
    fields["rank"] = int(tr) if tr is not None else pg_rank if default_pg else None
    bad = False
    for k in ("at", "enq", "done", "src"):
        if k in fields:
            v = int(fields[k])
            ok = -1 <= v < SEQ_MAX
            fields[k] = v if ok else None
            bad |= not ok
    if isinstance(fields.get("enq"), int) and isinstance(fields.get("done"), int) and fields["done"] > fields["enq"]:
        fields["done"] = None  # completed more than it enqueued: one of the two is garbage; keep the enqueued
        bad = True
    if bad:
        fields["implausible"] = True


def parse_ib_devices(devs: str) -> list[dict[str, Any]]:
    return [{"index": int(i), "name": n, "port": int(p), "link": ll, "sharp": bool(sh)}
            for i, n, p, ll, sh in _IB_DEV.findall(devs)]


def hca_prefix_surprises(value: str, selected: list[str]) -> list[str]:
    """HCAs NCCL picked that an NCCL_IB_HCA value without '=' did not mean.

    ``mlx5_1`` is a prefix: it also selects mlx5_10..mlx5_19. ``=mlx5_1`` is exact; ``^`` excludes.
    """
    if not value or value.startswith(("=", "^")):
        return []
    wanted = [e.split(":")[0] for e in value.split(",") if e]
    return sorted({s for s in selected for w in wanted if s.startswith(w) and s != w and s not in wanted})


def natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def exact_hca_value(value: str, present: list[str]) -> str:
    """The NCCL_IB_HCA value that selects exactly what ``value`` meant, for advice.

    NCCL matches each entry as a prefix unless the value starts with ``=``. An entry that names a
    present HCA means that HCA (``mlx5_1``, not mlx5_10..19); an entry that names none is a bare
    prefix (``mlx5``) and means what it selects now, listed one by one: ``=mlx5`` would select
    nothing at all. Ports (``:1``) are kept; ``=``/``^`` values are returned as they are.
    """
    if not value or value.startswith(("=", "^")):
        return value
    out: list[str] = []
    for entry in value.split(","):
        name, _, port = entry.strip().partition(":")
        if not name:
            continue
        names = [name] if name in present else sorted((h for h in present if h.startswith(name)), key=natural_key)
        for n in names or [name]:
            item = f"{n}:{port}" if port else n
            if item not in out:
                out.append(item)
    return "=" + ",".join(out)


MAX_COMMS = 32  # communicators remembered per process (world, its splits; more are counted, not kept)


@dataclass
class ProcessState:
    host: str
    pid: int
    file: str
    comms: dict[str, dict[str, Any]] = field(default_factory=dict)
    net: str | None = None
    ib_no_device: bool = False
    no_verbs: bool = False
    ib_devices: list[dict[str, Any]] = field(default_factory=list)
    oob: str = ""  # NCCL's bootstrap interface and address ("ib0:10.0.0.5<0>")
    socket_ifs: str = ""
    gdr_disabled: set[str] = field(default_factory=set)
    non_gdr_channels: int = 0
    shm_channels: int = 0
    socket_channels: int = 0
    channel_nets: set[str] = field(default_factory=set)  # NET/<name> on channel/ring lines
    # NET/IB/<n> on channel lines: n indexes NCCL's own device list ("NET/IB : Using [0]mlx5_0:1/IB ..."),
    # not the mlx5_<n> number -- the NICs this process's channels really use
    channel_devs: set[int] = field(default_factory=set)
    direct_devs: set[int] = field(default_factory=set)  # the same without PXN sends: NICs of this rank's own GPU
    version: str = ""  # "2.21.5+cuda12.4" from "NCCL version ..."
    env_hca: str = ""
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* echoed by "set by environment to"
    # process group -> PyTorch's last word on its progress: {"enqueued", "completed", "at", "world_rank"}
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_seen: float = 0.0
    lines: int = 0

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}"

    @property
    def entity(self) -> str:
        return entities.nccl_process(self.host, self.pid)

    def transport(self) -> str | None:
        """The inter-node transport NCCL says it uses: "Using network X" (2.6+), else the channel or
        ring lines' NET/<name> (2.4/2.5 print no "Using network"); None before either appeared."""
        if self.net:
            return self.net
        if self.channel_nets:
            ib = sorted(n for n in self.channel_nets if n != "Socket")
            return ib[0] if ib else "Socket"
        return None

    def ranks(self) -> list[int]:
        return sorted({c["rank"] for c in self.comms.values()})

    def apply(self, m: Match) -> None:
        f = m.fields
        name = m.rule.name
        if name == "network":
            self.net = f["net"]
        elif name == "ib_no_device":
            self.ib_no_device = True
        elif name == "ib_no_verbs":
            self.ib_no_device = self.no_verbs = True
        elif name == "ib_using":
            self.ib_devices = parse_ib_devices(f["devs"])
            self.oob = f.get("oob") or ""
        elif name == "socket_using":
            self.socket_ifs = f["ifs"]
        elif name == "gdr" and f["state"].lower() == "disabled":
            self.gdr_disabled.add(f.get("name") or f"hca{f['hca']}")
        elif name == "channel_net":
            self.channel_nets.add(f["net"])
            if f["net"] == "Socket":
                self.socket_channels += 1
            elif f["net"].startswith("IB") and "/GDRDMA" not in f.get("flags", ""):  # IB, IBext, IBext_v8
                self.non_gdr_channels += 1
            if f["net"] != "Socket" and len(self.channel_devs) < 64:
                self.channel_devs.add(int(f["dev"]))
                if "proxy" not in f:
                    self.direct_devs.add(int(f["dev"]))
        elif name == "channel_shm":
            self.shm_channels += 1
        elif name == "init":
            key = f.get("commid") or f["comm"]
            if key in self.comms or len(self.comms) < MAX_COMMS:  # bounded: a job that splits without end
                self.comms[key] = {"rank": int(f["rank"]), "nranks": int(f["nranks"]), "bus_id": f["bus"],
                                   "comm": f["comm"]}
        elif name == "version":
            self.version = f["version"]
        elif name == "env_hca":
            self.env_hca = f["value"]
        elif name == "env_param":
            self.env[f["name"]] = f["value"]
        elif name.startswith("pg_") and not f.get("implausible"):
            pg = str(f.get("pg") or "0")
            if pg in self.progress or len(self.progress) < MAX_COMMS:
                self.progress[pg] = {"enqueued": f.get("enq"), "completed": f.get("done"), "at": f.get("at"),
                                     "world_rank": f.get("rank")}

    def summary(self) -> dict[str, Any]:
        first = next(iter(self.comms.values()), {})
        world: tuple[str | None, dict[str, Any]] = max(self.comms.items(), key=lambda kv: kv[1]["nranks"],
                                                       default=(None, {}))
        return {"host": self.host, "pid": self.pid, "file": self.file, "ranks": self.ranks(),
                "nranks": first.get("nranks"), "bus_id": first.get("bus_id"),
                "pci": pci_from_nccl(first.get("bus_id")),
                "comm_ids": sorted(self.comms)[:8], "job": world[0], "world_rank": world[1].get("rank"),
                "world_size": world[1].get("nranks"), "transport": self.transport(),
                "hcas": sorted({f"{d['name']}/{d['port']}" for d in self.ib_devices})[:16], "oob": self.oob or None,
                "progress": self.progress.get("0"), "nics": self.nics_used()}

    def nics_used(self) -> list[str] | None:
        """"mlx5_3/1" for each NCCL device index a channel line named (None before any did, or when an
        index is not in NCCL's list: a plugin's numbering we cannot map)."""
        by_index = {d["index"]: f"{d['name']}/{d['port']}" for d in self.ib_devices}
        if not self.channel_devs or not all(i in by_index for i in self.channel_devs):
            return None
        if sorted(by_index) != list(range(len(by_index))):  # a merged-NIC list (2.19-2.22): see direct_nics
            return None
        return sorted({by_index[i] for i in self.channel_devs})

    def direct_nics(self) -> list[str] | None:
        """RDMA device names of the NCCL devices this rank's own channels use (PXN sends left out: they leave
        through the proxy GPU's NIC). None before any channel line, or when NCCL's list cannot be read index
        for index: 2.19-2.22 print a merged NIC as "[d]={[i] a:1/IB, [j] b:1/IB}" and number the rest by
        physical device while channels count merged ones (net_ib.cc ncclIbInit, v2.21.5-1), so only a list
        numbered 0..n-1 without gaps maps, and every index a channel names must be in it."""
        by_index = {d["index"]: d["name"] for d in self.ib_devices}
        if not self.direct_devs or sorted(by_index) != list(range(len(by_index))):
            return None
        if not all(i in by_index for i in self.direct_devs):
            return None
        return sorted({by_index[i] for i in self.direct_devs}, key=natural_key)
