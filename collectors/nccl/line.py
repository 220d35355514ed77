"""One log line with NCCL's prefix split off (or none: PyTorch's own lines), every prefix field bounded.

Line shapes (NCCL src/debug.cc): ``host:pid:tid [cudaDev] NCCL INFO msg``;
``host:pid:tid [cudaDev] file.cc:LINE NCCL WARN msg``; since 2.26 WARN lines usually start with
``[YYYY-MM-DD HH:MM:SS] ``; since 2.30 ``file.cc:LINE (function) NCCL WARN``. ``host`` is the
hostname cut at its first dot. PyTorch's watchdog has its own prefix; its text is matched anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo

from collectors.nccl.log_time import stated_time

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
    r"\[(?P<dev>-?\d+)\](?:\[(?P<thread>[^\]]{0,64})\])? "
    r"(?:(?P<src>[^\s]{1,256}:\d{1,10})(?: \((?P<func>[^)]{0,256})\))? )?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT|ERROR|CRITICAL|FATAL|VERBOSE) "
    r"(?P<msg>.*)$")
# Meta's NCCLX logs through folly (meta-pytorch/torchcomms comms/utils/logger/LoggingFormat.cc
# NcclLogFormatter::formatMessage, commit 6d361cbb): a glog header, then NCCL's own fields with the thread's
# name after the device, and folly's level name -- "W0414 11:46:56.369712 4115466 Logger.cc:25]
# devvm2605:4115466:4115466 [-1][main] NCCL WARN msg" (header "{}{:%m%d %H:%M:%S}.{:06d} {:5d} {}:{}]
# {}:{}:{} [{}][{}] {} {} ", getGlogLevelName: VERBOSE, INFO, WARN, ERROR, CRITICAL, FATAL; built with {fmt} 10+
# the stamp is "hh:mm:ss.<ns>.<us>", collectors/nccl/log_time.py, as in meta-pytorch/torchcomms#231). The glog part
# stands before NCCL's prefix like any launcher's; ``[thread]`` is the optional group after ``[dev]``. Its
# error levels are NCCL's WARN (NCCL's own error channel: what the WARN rules and NCCLWarning read), VERBOSE
# its TRACE.
_NCCLX_LEVEL = {"ERROR": "WARN", "CRITICAL": "WARN", "FATAL": "WARN", "VERBOSE": "TRACE"}
# The same header where the NCCL part after it cannot be read (another formatter prefix than "NCCL", a thread
# name past its bound, a device that is no number): such a line is NCCLX's and is counted as unread, never
# silently dropped (``Line.unread``). Bounded pieces, linear on any line.
NCCLX_HEADER = re.compile(r"[IWEFCV]\d{4} \d{2}:\d{2}:\d{2}\.\d{6,9}(?:\.\d{6})? {0,8}\d{1,10} "
                          r"[^\s\]]{1,256}:\d{1,10}\] [^\s:\[\]<>]{1,64}:\d{1,10}:\d{1,10} \[")

# NCCL's own prefix on an INFO line with nothing before it, as a repeated line's digit shape reads it
# (collectors/nccl/repeats.py: every digit 0): "host:pid:tid [cudaDev] NCCL INFO ", the host ASCII word characters,
# dots and dashes only, every part within PREFIX_MAX; the group ``who`` is "host:pid". PREFIX splits every line
# this matches the same way (host, pid, tid, dev; no timestamp, thread, source or function).
INFO_SHAPE = rb"(?P<who>[\w.-]{1,64}:0{1,7}):0{1,7} \[0{1,11}\] NCCL INFO "

PREFIX_MAX: dict[str, int] = {
    # NCCL src/debug.cc (ncclDebugInit): getHostName(hostname, 1024, '.') -- the host name cut at its
    # first dot; the kernel's nodename is at most 64 bytes (__NEW_UTS_LEN, include/uapi/linux/utsname.h)
    "host": 64,
    "pid": 7, "tid": 7,  # PID_MAX_LIMIT 4194304 (include/linux/threads.h); a redaction ("<pid>", "xxx") alike
    "dev": 11,  # "[%d]" cudaDev
    "ts": 40,  # "[%Y-%m-%d %H:%M:%S]" (2.26+), a fraction when a collector added one
    "src": 256, "func": 256,  # "%s:%d" of __FILE__/__LINE__; "(%s)" of __func__ (2.30+)
    "thread": 64,  # NCCLX's "[%s]" thread name (folly's; pthread names are at most 15 bytes)
}  # parse_line checks these unrolled (a test keeps the two equal)


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
    logged: str = ""  # when the container runtime logged it (a pod log's record time), else ""
    stated: str = ""  # the time the line states, RFC 3339 UTC (log_time.stated_time), else ""
    unread: bool = False  # NCCLX's glog header with an NCCL part that cannot be read (counted, not matched)


def parse_line(offset: int, raw: bytes, logged: str = "", *, now: datetime | None = None,
               tz: tzinfo | None = None) -> Line:
    """NCCL's prefix split off. A prefix field past PREFIX_MAX sets ``over`` (match_or_reject rejects the
    line) and is not converted: the line's host, pid and device are then empty. With ``now`` (when the
    line was read) ``stated`` is the time the line states (collectors/nccl/log_time.py: the runtime's
    ``logged`` first, local stamps in the node's zone ``tz``); without it ``stated`` stays ""."""
    text = raw.decode("utf-8", "replace").rstrip("\r")
    text = text.rsplit("\r", 1)[-1]  # a progress bar's carriage returns: the terminal shows the last part
    m = PREFIX.search(text)
    if m is None:
        return Line(offset, "", 0, -1, "", "", "", "", text, text, logged=logged,
                    stated=_stated(text, "", logged, now, tz), unread=NCCLX_HEADER.search(text) is not None)
    ts, host, pid_s, tid, dev, src, func = m.group("ts", "host", "pid", "tid", "dev", "src", "func")
    if (len(host or "") > 64 or len(pid_s or "") > 7 or len(tid or "") > 7 or len(dev) > 11
            or len(ts or "") > 40 or len(src or "") > 256 or len(func or "") > 256
            or len(m["thread"] or "") > 64):  # PREFIX_MAX, unrolled
        for name, limit in PREFIX_MAX.items():
            value = m[name]
            if value is not None and len(value) > limit:
                return Line(offset, "", 0, -1, m["level"], "", "", "", m["msg"], text,
                            over=(name, len(value), limit), logged=logged,
                            stated=_stated(text, "", logged, now, tz))
    pid = int(pid_s) if pid_s and pid_s.isdigit() else 0  # redacted: one process per host
    level = _NCCLX_LEVEL.get(m["level"], m["level"])
    return Line(offset, host or "", pid, int(dev), level, ts or "", src or "", func or "", m["msg"], text,
                logged=logged, stated=_stated(text, ts or "", logged, now, tz))


def _stated(text: str, ts: str, logged: str, now: datetime | None, tz: tzinfo | None) -> str:
    return "" if now is None else stated_time(text, nccl_ts=ts, runtime=logged, now=now, tz=tz)
