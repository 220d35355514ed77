"""The time a training log line states, as RFC 3339 UTC: separate from when the agent read the line.

A post-mortem timeline orders lines by when they were written; the agent may read a line seconds or, after
a restart, hours later. :func:`stated_time` takes the line's own time from, best first:

1. the container runtime's record time (the caller has it: a CRI or json-file pod log record), RFC 3339
   with its zone;
2. a prefix with an explicit zone: ``kubectl logs --timestamps`` (the kubelet writes
   ``types.RFC3339NanoFixed``, "2006-01-02T15:04:05.000000000Z07:00", before the line:
   kubernetes/kubernetes pkg/kubelet/kuberuntime/logs/logs.go ``timeFormatOut``), rsyslog's RFC 3339
   stamp, ``journalctl -o short-iso`` ("%Y-%m-%dT%H:%M:%S%z", systemd src/shared/logs-show.c) -- a zone
   written out beats a stamp in local time, whose zone the agent can only assume;
3. NCCL's own "[%Y-%m-%d %H:%M:%S] " (2.26+: the caller passes what line.py split off);
4. the innermost local-time prefix the line starts with (an application's own stamp is inside whatever a
   collector put before it):

   - c10's (PyTorch's C++ logging built without glog, USE_GLOG's default; c10/util/Logging.cpp
     ``MessageLogger::MessageLogger``): ``[rank<r>]:`` when the global rank is known, then
     ``"[" <severity FEWIV> (tm_mon + 1) * 100 + tm_mday " " HH ":" MM ":" SS "." setw(9) ns " "
     file ":" line "] "`` -- the month is not zero-padded ("[E105 ..." on 5 January) and the nine digits
     are CLOCK_MONOTONIC's tv_nsec, not the wall clock's fraction: they are dropped (a bracketed stamp
     with another number of digits keeps its fraction);
   - glog's (google/glog v0.7.1 src/logging.cc ``LogMessage::Init``): ``<IWEF>[yyyy]mmdd
     hh:mm:ss.uuuuuu threadid file:line] `` (the year with ``--log_year_in_prefix``, the default since
     0.6; microseconds of the wall clock);
   - Meta NCCLX's folly header (meta-pytorch/torchcomms comms/utils/logger/LoggingFormat.cc
     ``NcclLogFormatter::formatMessage``, ``"{}{:%m%d %H:%M:%S}.{:06d} ..."`` of a system_clock time): glog's
     shape, local time, when built with {fmt} before 10.0; from 10.0 {fmt} prints ``%S`` with the time's
     sub-seconds and formats a system_clock time in UTC (fmtlib/fmt PR #3115 and PR #3230, release 10.0.0;
     fmtlib/fmt#3520 shows both), so the stamp reads ``hh:mm:ss.nnnnnnnnn.uuuuuu`` (seen in
     meta-pytorch/torchcomms#231: "I0211 21:18:23.655698629.655698" beside glog's local "13:18" lines):
     that doubled fraction is UTC, its nanoseconds kept;
   - PyTorch's Python logs (torch/_logging/_internal.py ``TorchLogsFormatter``): ``[rank<r>]:`` when the
     process group is up, then ``<level letter>%m%d %H:%M:%S.<microseconds> pid path:line] ``;
   - Python logging's default ``asctime``, "%Y-%m-%d %H:%M:%S,<msecs>" (CPython Lib/logging/__init__.py
     ``Formatter.default_time_format`` / ``default_msec_format``, local time through
     ``converter = time.localtime``), bracketed as torch 2.1's ``DEFAULT_FORMATTER``
     "[%(asctime)s] %(name)s: [%(levelname)s] %(message)s" printed it (torch/_logging/_internal.py);
   - BSD syslog's "Mmm dd hh:mm:ss" (RFC 3164 4.1.2) and ``journalctl``'s "%b %d %H:%M:%S" (systemd
     src/shared/logs-show.c), with their "host tag[pid]: ".

Before, between and after those a launcher's tags are stepped over: torchrun's ``[rank3]:`` /
``[default0]:``, mpirun's ``[1,0]<stderr>:``, pdsh's and ``srun --label``'s ``node-3: ``.

Local times are the node's (``tz``: :func:`node_zone`; None is UTC). A month and day without a year
(c10, glog without the year, syslog) take the latest year that does not put the line more than a day
after ``now``: a "Dec 31" line read on 1 January is last year's.

Bounded: only the first :data:`HEAD` characters are looked at, every pattern is anchored where the
previous prefix ended and bounded in width, at most :data:`MAX_PREFIXES` prefixes are stepped over. Never
raises: a line that states no time (or an impossible one) gives "".
"""

from __future__ import annotations

import io
import os
import re
import stat
import struct
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Final

from gna_sdk.rootpath import resolve_in_root

__all__ = ["HEAD", "MAX_PREFIXES", "node_zone", "stated_time"]

HEAD: Final = 512  # characters of a line looked at: prefixes are short, a line may be 64 KiB
MAX_PREFIXES: Final = 8  # launcher tags and stamps stepped over before giving up
FRACTION_DIGITS: Final = 9  # nanoseconds: the runtime's precision; more digits are cut
ZONE_FILE_MAX: Final = 1 << 20  # a TZif file is a few KiB (tzfile(5)); anything larger is not one
LINK_HOPS: Final = 16  # symlinks followed resolving <root>/etc/localtime (Linux follows 40)

_DT: Final = (r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[Tt ](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
              r"(?:[.,](?P<f>\d{1,18}))?")
_ZONE: Final = r"(?P<z>[Zz]|[+-]\d{2}:?\d{2})"
# "host tag[pid]: " after a syslog or journal stamp
_SYSLOG_TAIL: Final = r"(?: [\w.-]{1,64} [^\s:\[\]]{1,64}(?:\[\d{1,10}\])?:(?=\s))?"
# a date-time, bracketed ("[...]": NCCL, torch 2.1's asctime) or followed by a space (kubectl, Python's
# default asctime, rsyslog, journalctl -o short-iso), with or without a zone
_ISO: Final = re.compile(rf"(?P<open>\[)?{_DT}{_ZONE}?(?(open)\]|(?=\s|$){_SYSLOG_TAIL})", re.ASCII)
# c10 "[E1205 12:34:56.123456789 ", glog "E20261205 12:34:56.123456 " or "E1205 ...", TorchLogsFormatter
# "W1205 12:34:56.123000 "
_GLOG: Final = re.compile(r"(?P<open>\[)?[FEWIVC](?P<date>\d{8}|\d{3,4}) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
                          r"(?:\.(?P<f>\d{1,9}))?(?:\.(?P<fmt10>\d{6}))?(?=\s)", re.ASCII)
_MONTHS: Final = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
_SYSLOG: Final = re.compile(r"(?:<\d{1,3}>)?(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
                            r"(?P<d>[ \d]\d) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?"
                            rf"(?=\s){_SYSLOG_TAIL}", re.ASCII)
_LAUNCHER: Final = re.compile(
    r"\[[\w.-]{1,40}\]:"  # torchrun's "[rank3]:", "[default0]:"
    r"|\[\d{1,7},\d{1,7}\]<std(?:out|err)>:"  # mpirun --tag-output
    r"|[\w.-]{1,64}: "  # pdsh "node-3: ", srun --label "3: "
    r"|\s{1,16}", re.ASCII)
_RFC3339: Final = re.compile(rf"{_DT}{_ZONE}", re.ASCII)
_LOCAL: Final = re.compile(_DT, re.ASCII)  # ASCII everywhere: "\d" is not U+0660, a zero int() would take


def stated_time(line_text: str, *, nccl_ts: str = "", runtime: str = "", now: datetime,
                tz: tzinfo | None = None) -> str:
    """The time ``line_text`` states, RFC 3339 UTC ("2026-12-05T11:34:56.123Z", the source's fraction
    kept, at most nanoseconds), or "" when it states none. ``runtime``: the container runtime's record
    time (RFC 3339, any zone), "" when the line did not come from one; ``nccl_ts``: NCCL's
    "YYYY-MM-DD HH:MM:SS[.frac]" (line.py ``Line.ts``); ``now``: when it was read (the year of a stamp
    without one); ``tz``: the node's zone for local stamps, None for UTC."""
    try:
        return _stated(line_text, nccl_ts, runtime, now, tz)
    except (ValueError, OverflowError, TypeError, AttributeError, OSError, KeyError, IndexError):
        return ""  # a zone's own error, a caller's ``now`` that is no datetime: never the line's fault


def _stated(text: str, nccl_ts: str, runtime: str, now: datetime, tz: tzinfo | None) -> str:
    if runtime and (m := _RFC3339.fullmatch(runtime.strip()[:64])) is not None and (got := _dated(m, UTC)):
        return got
    zone = tz if tz is not None else UTC
    now_utc = now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)
    zoned, local = _prefixes(text[:HEAD] if isinstance(text, str) else "", zone, now_utc)
    if zoned:
        return zoned
    if nccl_ts and (m := _LOCAL.fullmatch(nccl_ts.strip()[:64])) is not None and (got := _dated(m, zone)):
        return got
    return local


def _prefixes(head: str, zone: tzinfo, now_utc: datetime) -> tuple[str, str]:
    """(innermost zoned stamp, innermost local stamp) among the prefixes ``head`` starts with."""
    zoned = local = ""
    pos = 0
    for _ in range(MAX_PREFIXES):
        if (m := _ISO.match(head, pos)) is not None:
            if m["z"] is not None:
                zoned = _dated(m, zone) or zoned
            else:
                local = _dated(m, zone) or local
        elif (m := _GLOG.match(head, pos)) is not None:
            date = m["date"]
            frac = "" if m["open"] and len(m["f"] or "") == 9 else m["f"] or ""  # c10: CLOCK_MONOTONIC's ns
            if m["fmt10"] is not None and not m["open"] and len(date) == 4:  # NCCLX through {fmt} 10+: UTC
                zoned = _yearless(int(date) // 100, int(date) % 100, m, m["f"] or "", UTC, now_utc) or zoned
            elif len(date) == 8:  # glog's --log_year_in_prefix
                local = _utc(int(date[:4]), int(date[4:6]), int(date[6:]), _clock(m), frac, zone) or local
            else:
                local = _yearless(int(date) // 100, int(date) % 100, m, frac, zone, now_utc) or local
        elif (m := _SYSLOG.match(head, pos)) is not None:
            local = _yearless(_MONTHS[m["mon"]], int(m["d"]), m, m["f"] or "", zone, now_utc) or local
        elif (m := _LAUNCHER.match(head, pos)) is None:
            break
        if m.end() <= pos:
            break
        pos = m.end()
    return zoned, local


def _clock(m: re.Match[str]) -> tuple[int, int, int]:
    return int(m["h"]), int(m["mi"]), int(m["s"])


def _dated(m: re.Match[str], zone: tzinfo) -> str:
    """A full date-time match in UTC: its own zone when it has one (``z``), else ``zone``."""
    z = m.groupdict().get("z")
    if z is not None and z not in "Zz":
        digits = z[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:])
        if hours > 23 or minutes > 59:
            return ""
        zone = timezone(timedelta(hours=hours, minutes=minutes) * (-1 if z[0] == "-" else 1))
    elif z is not None:
        zone = UTC
    return _utc(int(m["y"]), int(m["mo"]), int(m["d"]), _clock(m), m["f"] or "", zone)


def _utc(year: int, month: int, day: int, clock: tuple[int, int, int], frac: str, zone: tzinfo) -> str:
    """RFC 3339 UTC of a wall time in ``zone``; the fraction as written (its digits, cut to nanoseconds:
    offsets are whole seconds, so converting never touches it); "" for a time that cannot be."""
    t = _instant(year, month, day, clock, zone)
    return "" if t is None else _rfc3339(t, frac)


def _instant(year: int, month: int, day: int, clock: tuple[int, int, int], zone: tzinfo) -> datetime | None:
    h, mi, s = clock
    if h > 23 or mi > 59 or s > 59:  # a leap second's :60 is not kept
        return None
    try:
        return datetime(year, month, day, h, mi, s, tzinfo=zone).astimezone(UTC)
    except (ValueError, OverflowError):  # 31 February, month 0; year 1 west of UTC
        return None


def _rfc3339(t: datetime, frac: str) -> str:
    frac = "." + frac[:FRACTION_DIGITS] if frac else ""
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}{frac}Z"


def _yearless(month: int, day: int, m: re.Match[str], frac: str, zone: tzinfo, now_utc: datetime) -> str:
    """A month and day without a year: the latest year that puts it at most a day after ``now``."""
    latest = now_utc + timedelta(days=1)
    year = now_utc.astimezone(zone).year + 1
    for y in range(year, year - 9, -1):  # 29 February: back to the last leap year
        t = _instant(y, month, day, _clock(m), zone)
        if t is not None and t <= latest:
            return _rfc3339(t, frac)
    return ""


def node_zone(root_path: str | os.PathLike[str]) -> tzinfo | None:
    """The node's zone from ``<root>/etc/localtime`` (a TZif file, tzfile(5)), its symlinks resolved
    under the root (``/etc/localtime -> /usr/share/zoneinfo/Europe/Berlin`` is the host's file, not the
    agent container's); None when it is missing, not a regular file, not a zone, or larger than
    :data:`ZONE_FILE_MAX` -- glibc then uses UTC, as callers do with None.

    It is the zone of the host's own processes (a Slurm job's). A container's processes stamp in the
    image's zone or their ``TZ`` (mostly UTC), which the host cannot tell: their pod logs carry the
    runtime's zoned record time, used first; a file such a process writes to a host path does not."""
    try:
        root = Path(root_path)
        path = _in_root(root, "etc/localtime")
        if path is None:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > ZONE_FILE_MAX:
                return None
            data = os.read(fd, ZONE_FILE_MAX + 1)
        finally:
            os.close(fd)
        if len(data) > ZONE_FILE_MAX:
            return None
        rel = path.relative_to(root).as_posix()
        key = rel.split("zoneinfo/", 1)[1] if "zoneinfo/" in rel else "localtime"
        # imported here, when a line is first read: zoneinfo's import asks sysconfig for its search path
        # (Lib/zoneinfo/_tzpath.py reset_tzpath, CPython 3.11), which loads the interpreter's whole build
        # configuration (_sysconfigdata_*, ~1 MiB resident) -- that an idle node need not hold
        from zoneinfo import ZoneInfo

        return ZoneInfo.from_file(io.BytesIO(data), key=key)
    except (OSError, ValueError, UnicodeError, RuntimeError, struct.error, IndexError, KeyError):
        return None  # zoneinfo's own parser: ValueError for a bad magic, struct.error for a cut file


def _in_root(root: Path, rel: str) -> Path | None:
    """``rel`` under ``root`` with each symlink resolved as the host would (gna_sdk/rootpath.py); None past
    :data:`LINK_HOPS` links or when it does not exist."""
    try:
        path = resolve_in_root(root, rel, max_links=LINK_HOPS)
    except OSError:
        return None
    return path if path.exists() else None
