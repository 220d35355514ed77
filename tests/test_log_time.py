"""The time a training log line states (collectors/nccl/log_time.py), apart from when the agent read it.

Each format is given as its source prints it: c10's ``MessageLogger`` (pytorch c10/util/Logging.cpp: rank
prefix, unpadded month*100+day, CLOCK_MONOTONIC nanoseconds), glog's ``LogMessage::Init`` (google/glog
v0.7.1 src/logging.cc), torch's ``TorchLogsFormatter`` and torch 2.1's ``DEFAULT_FORMATTER``
(torch/_logging/_internal.py), CPython's default ``asctime`` (Lib/logging/__init__.py), the kubelet's
``--timestamps`` (RFC3339NanoFixed), rsyslog, ``journalctl`` (systemd src/shared/logs-show.c) and BSD
syslog (RFC 3164). The fleet's views order by that time: fleet/diagnose.py, fleet/timeline.py.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl.line import parse_line
from collectors.nccl.log_time import HEAD, node_zone, stated_time
from fleet import diagnose, timeline

NOW = datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC)  # when the agent read the lines
RFC3339_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")


def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip(f"no tzdata for {name} on this machine")


def _tzif(name: str) -> bytes:
    for base in zoneinfo.TZPATH:
        p = Path(base, name)
        if p.is_file():
            return p.read_bytes()
    pytest.skip(f"no TZif file for {name} on this machine")


FORMATS = [
    # c10 (PyTorch wheels, no glog): "[rank%d]:" + "[" sev (mon+1)*100+mday " %02d:%02d:%02d." setw(9) ns
    # " " file ":" line "] " -- the nine digits are CLOCK_MONOTONIC's, not the wall clock's: dropped
    ("c10", "[rank0]:[E1205 12:34:56.123456789 ProcessGroupNCCL.cpp:1234] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
            "Watchdog caught collective operation timeout", {}, "2026-12-05T11:34:56Z"),
    ("c10, January: the month unpadded", "[W105 08:00:00.000012345 socket.cpp:752] [c10d] The client socket "
                                         "has failed to connect", {}, "2026-01-05T07:00:00Z"),
    ("c10 as the golden corpus has it", "[rank3]:[E1203 10:30:00.100000 77 ProcessGroupNCCL.cpp:632] [Rank 3] "
                                        "Watchdog caught collective operation timeout", {}, "2026-12-03T09:30:00.100000Z"),
    # glog: <IWEF>yyyymmdd hh:mm:ss.uuuuuu setw(5) threadid file:line] (year: --log_year_in_prefix, default)
    ("glog", "E20261205 12:34:56.789012  1234 ProcessGroupNCCL.cpp:1234] NCCL error", {},
     "2026-12-05T11:34:56.789012Z"),
    ("glog without the year", "I1205 12:34:56.789012  1234 logging.cc:42] hello", {}, "2026-12-05T11:34:56.789012Z"),
    # TorchLogsFormatter: rankprefix, level letter, "%m%d %H:%M:%S", ".%06d" of msecs*1000, pid, path:line]
    ("TorchLogsFormatter", "[rank0]:W1205 12:34:56.789000 4242 torch/distributed/run.py:793] Setting "
                           "OMP_NUM_THREADS", {}, "2026-12-05T11:34:56.789000Z"),
    # torch 2.1 DEFAULT_FORMATTER "[%(asctime)s] %(name)s: [%(levelname)s] %(message)s"
    ("torch 2.1 asctime", "[2026-12-05 12:34:56,123] torch.distributed.elastic.agent.server.api: [WARNING] "
                          "Received Signals.SIGTERM death signal", {}, "2026-12-05T11:34:56.123Z"),
    ("Python's default asctime", "2026-12-05 12:34:56,123 - train - INFO - step 10", {}, "2026-12-05T11:34:56.123Z"),
    # NCCL 2.26+ "[%Y-%m-%d %H:%M:%S] " (line.py splits it off as Line.ts)
    ("NCCL", "[2026-12-05 12:34:56] gpu-0001:4242:4300 [3] transport/net_ib.cc:2317 NCCL WARN NET/IB: Got "
             "completion", {"nccl_ts": "2026-12-05 12:34:56"}, "2026-12-05T11:34:56Z"),
    ("NCCL's stamp given, anywhere in the line", "node-3: gpu-0001:4242:4300 [3] NCCL WARN x",
     {"nccl_ts": "2026-12-05 12:34:56.250"}, "2026-12-05T11:34:56.250Z"),
    # kubectl logs --timestamps: the kubelet's RFC3339NanoFixed before the line; an explicit zone beats local
    ("kubectl --timestamps", "2026-12-05T11:34:56.123456789Z [rank0]:[E1205 12:34:55.000000001 "
                             "ProcessGroupNCCL.cpp:1234] x", {}, "2026-12-05T11:34:56.123456789Z"),
    ("rsyslog RFC 3339", "2026-12-05T12:34:56.123456+01:00 gpu-0001 python[4242]: step 10", {},
     "2026-12-05T11:34:56.123456Z"),
    ("journalctl -o short-iso", "2026-12-05T12:34:56+0100 gpu-0001 python[4242]: step 10", {},
     "2026-12-05T11:34:56Z"),
    ("BSD syslog", "Dec  5 12:34:56 gpu-0001 python[4242]: step 10", {}, "2026-12-05T11:34:56Z"),
    ("journalctl short", "Dec 05 12:34:56 gpu-0001 python[4242]: step 10", {}, "2026-12-05T11:34:56Z"),
    ("the application's own stamp inside syslog's", "Dec  5 12:34:59 gpu-0001 python[4242]: [rank0]:[E1205 "
                                                    "12:34:56.123456789 ProcessGroupNCCL.cpp:1234] x", {},
     "2026-12-05T11:34:56Z"),
    ("launchers' tags stepped over", "node-3: [1,0]<stderr>:[rank1]:[E1205 12:34:56.000000001 a.cpp:1] x", {},
     "2026-12-05T11:34:56Z"),
    # the container runtime's record time first, whatever the line says
    ("CRI record time", "[rank0]:[E1205 12:34:50.1 ProcessGroupNCCL.cpp:1] x",
     {"runtime": "2026-12-05T11:34:56.100000000Z"}, "2026-12-05T11:34:56.100000000Z"),
    ("json-file time with an offset", "x", {"runtime": "2026-12-05T12:34:56.1+01:00"}, "2026-12-05T11:34:56.1Z"),
    ("a runtime time that is none", "I1205 12:34:56.789012 1 a.cc:1] x", {"runtime": "yesterday"},
     "2026-12-05T11:34:56.789012Z"),
    ("no stamp", "gpu-0001:4242:4300 [3] NCCL INFO comm 0x55d0c8a0 rank 3 nranks 16 - Init COMPLETE", {}, ""),
    ("a time in the message is not the line's", "[Rank 3] Watchdog: last enqueued at 2026-12-05T10:00:00Z", {}, ""),
    ("an impossible date", "[2026-02-31 12:00:00] x", {}, ""),
    ("a leap second", "2026-12-31T23:59:60Z x", {}, ""),
    ("digits that are not ASCII", "Jan 01 00:00:00.\u0660 [2026-12-05 12:34:5\u0666] x", {}, ""),
]


@pytest.mark.parametrize(("what", "line", "kw", "want"), FORMATS, ids=[f[0] for f in FORMATS])
def test_each_format_as_its_source_prints_it(what: str, line: str, kw: dict[str, str], want: str) -> None:
    assert stated_time(line, now=NOW, tz=_zone("Europe/Berlin"), **kw) == want, what


def test_a_year_is_the_latest_that_is_not_more_than_a_day_ahead() -> None:
    new_year = datetime(2027, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert stated_time("[E1231 23:59:59.000000001 a.cpp:1] x", now=new_year) == "2026-12-31T23:59:59Z"
    assert stated_time("Dec 31 23:59:59 gpu-0001 python[1]: x", now=new_year) == "2026-12-31T23:59:59Z"
    assert stated_time("I0101 00:00:10.000000 1 a.cc:1] x", now=new_year) == "2027-01-01T00:00:10.000000Z"
    # a line a little ahead of the reader's clock (skew) stays in the reader's year's turn
    assert stated_time("Jan  1 00:00:10 h p[1]: x", now=datetime(2026, 12, 31, 23, 59, 50, tzinfo=UTC)) \
        == "2027-01-01T00:00:10Z"
    # 29 February: the last leap year not ahead
    assert stated_time("[I229 12:00:00.000000001 a:1] x", now=datetime(2027, 3, 1, tzinfo=UTC)) \
        == "2024-02-29T12:00:00Z"
    # the turn of the year is the node's: 23:30 on 31 December in Berlin is 22:30 UTC
    berlin = _zone("Europe/Berlin")
    assert stated_time("Dec 31 23:30:00 h p[1]: x", now=datetime(2026, 12, 31, 23, 15, tzinfo=UTC), tz=berlin) \
        == "2026-12-31T22:30:00Z"
    assert stated_time("Jan  1 00:30:00 h p[1]: x", now=datetime(2026, 12, 31, 23, 45, tzinfo=UTC), tz=berlin) \
        == "2026-12-31T23:30:00Z"
    naive = datetime(2027, 1, 1, 0, 0, 30)  # a naive ``now`` is UTC
    assert stated_time("Dec 31 23:59:59 h p[1]: x", now=naive) == "2026-12-31T23:59:59Z"


def test_local_stamps_convert_with_the_node_s_zone() -> None:
    line = "[2026-07-01 12:00:00] gpu-0001:1:2 [0] NCCL WARN x"
    assert stated_time(line, nccl_ts="2026-07-01 12:00:00", now=NOW, tz=_zone("Europe/Berlin")) \
        == "2026-07-01T10:00:00Z"  # summer time
    assert stated_time(line, nccl_ts="2026-07-01 12:00:00", now=NOW, tz=_zone("America/New_York")) \
        == "2026-07-01T16:00:00Z"
    assert stated_time(line, nccl_ts="2026-07-01 12:00:00", now=NOW, tz=None) == "2026-07-01T12:00:00Z"
    assert stated_time(line, nccl_ts="2026-07-01 12:00:00", now=NOW, tz=timezone(timedelta(hours=5, minutes=30))) \
        == "2026-07-01T06:30:00Z"
    # a zone in the line is its own, whatever the node's
    assert stated_time("2026-07-01T12:00:00-04:00 x", now=NOW, tz=_zone("Europe/Berlin")) == "2026-07-01T16:00:00Z"


def test_ncclx_through_fmt_10_states_utc_beside_glog_s_local_lines() -> None:
    """meta-pytorch/torchcomms#231 (tests/corpus/nccl/47-...): in one run, glog's own lines say 13:18 (the
    node's Pacific time) and NCCLX's folly header, formatted by {fmt} 10+, "21:18:23.655698629.655698" (UTC,
    sub-seconds of %S then the formatter's microseconds). Read in the node's zone, the two are the same
    instant 30 microseconds apart; a one-fraction NCCLX stamp ({fmt} before 10) stays local like glog's."""
    case = Path(__file__).parent / "corpus" / "nccl" / "47-ncclx-glog-header-fmt10-init" / "input.log"
    lines = case.read_bytes().splitlines()
    glog = next(raw for raw in lines if b"CUDART_VERSION" in raw)
    ncclx = next(raw for raw in lines if b"NCCL INFO NCCL version" in raw)
    now, la = datetime(2026, 2, 12, 0, 0, tzinfo=UTC), _zone("America/Los_Angeles")
    assert parse_line(0, glog, now=now, tz=la).stated == "2026-02-11T21:18:23.655668Z"
    assert parse_line(0, ncclx, now=now, tz=la).stated == "2026-02-11T21:18:23.655698629Z"
    old_fmt = ncclx.replace(b"21:18:23.655698629.655698", b"13:18:23.655698")
    assert parse_line(0, old_fmt, now=now, tz=la).stated == "2026-02-11T21:18:23.655698Z"
    line = parse_line(0, ncclx)
    assert (line.host, line.pid, line.dev, line.level) == ("devvm5553", 1718364, 0, "INFO")


def test_node_zone_reads_the_host_s_localtime_under_its_root(tmp_path: Path) -> None:
    berlin = _tzif("Europe/Berlin")
    root = tmp_path / "host"
    zdir = root / "usr/share/zoneinfo/Fake"
    zdir.mkdir(parents=True)
    (zdir / "Zone").write_bytes(berlin)  # only under the host root: the agent's own / has no Fake/Zone
    (root / "etc").mkdir()
    os.symlink("/usr/share/zoneinfo/Fake/Zone", root / "etc/localtime")  # absolute: re-rooted
    z = node_zone(root)
    assert z is not None and str(z) == "Fake/Zone"
    assert datetime(2026, 7, 1, 12, tzinfo=z).utcoffset() == timedelta(hours=2)
    assert stated_time("Dec  5 12:34:56 h p[1]: x", now=NOW, tz=z) == "2026-12-05T11:34:56Z"

    (root / "etc/localtime").unlink()
    os.symlink("../../../../usr/share/zoneinfo/Fake/Zone", root / "etc/localtime")  # ".." stops at the root
    assert str(node_zone(root)) == "Fake/Zone"
    (root / "etc/localtime").unlink()
    (root / "etc/localtime").write_bytes(berlin)  # a copy, as some images have it
    assert str(node_zone(str(root))) == "localtime"

    assert node_zone(tmp_path / "nowhere") is None
    (root / "etc/localtime").write_bytes(b"not a zone file\n")
    assert node_zone(root) is None
    (root / "etc/localtime").write_bytes(berlin[:30])  # cut
    assert node_zone(root) is None
    (root / "etc/localtime").unlink()
    os.mkfifo(root / "etc/localtime")  # never blocks on a FIFO
    assert node_zone(root) is None
    (root / "etc/localtime").unlink()
    os.symlink("localtime", root / "etc/localtime")  # a loop
    assert node_zone(root) is None
    (root / "etc/localtime").unlink()
    (root / "etc/localtime").mkdir()
    assert node_zone(root) is None
    os.rmdir(root / "etc/localtime")
    with open(root / "etc/localtime", "wb") as fh:  # larger than any zone file (sparse)
        fh.truncate((1 << 20) + 1)
    assert node_zone(root) is None


def test_parse_line_fills_stated_only_when_asked() -> None:
    raw = b"[2026-12-05 12:34:56] gpu-0001:4242:4300 [3] transport/net_ib.cc:2317 NCCL WARN NET/IB: x"
    assert parse_line(7, raw).stated == ""  # today's behaviour, unchanged
    line = parse_line(7, raw, now=NOW, tz=_zone("Europe/Berlin"))
    assert (line.ts, line.stated, line.host, line.offset) == ("2026-12-05 12:34:56", "2026-12-05T11:34:56Z",
                                                             "gpu-0001", 7)
    pod = parse_line(0, b"[rank3]:[E1203 10:30:00.100000 77 ProcessGroupNCCL.cpp:632] x",
                     "2026-12-03T10:30:00.100000000Z", now=NOW)
    assert (pod.logged, pod.stated) == ("2026-12-03T10:30:00.100000000Z", "2026-12-03T10:30:00.100000000Z")
    over = parse_line(0, b"[E1205 12:34:56.123456789 a:1] " + b"h" * 70 + b":1:2 [0] NCCL WARN x", now=NOW)
    assert over.over is not None and over.stated == "2026-12-05T12:34:56Z"


# -- never raises, always well-formed, bounded ---------------------------------------------------------

def _well_formed(got: str) -> bool:
    if got == "":
        return True
    if RFC3339_UTC.fullmatch(got) is None:
        return False
    dt.datetime.fromisoformat(got)
    return True


STAMPISH = st.one_of(
    st.from_regex(r"\A\[?[FEWIVC]\d{3,8} \d\d:\d\d:\d\d(\.\d{1,9})? .{0,20}\Z"),
    st.from_regex(r"\A\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d([.,]\d{1,20})?([Zz]|[+-]\d\d:?\d\d)?\]? .{0,20}\Z"),
    st.from_regex(r"\A(<\d{1,3}>)?(Jan|Feb|Dec) [ \d]\d \d\d:\d\d:\d\d(\.\d{1,9})? \w{1,8} \w{1,8}(\[\d+\])?: .{0,9}\Z"),
    st.from_regex(r"\A((\[rank\d{1,3}\]:|\[\d,\d\]<stderr>:|[\w.-]{1,8}: | {1,20}){0,12}).{0,40}\Z"),
    st.text(max_size=300),
)


@settings(max_examples=200, deadline=None)
@given(STAMPISH, st.text(max_size=40), st.text(max_size=40),
       st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)),
       st.sampled_from([None, UTC, timezone(timedelta(hours=-12)), timezone(timedelta(hours=14))]))
def test_any_text_gives_nothing_or_a_valid_utc_time(line: str, nccl_ts: str, runtime: str, now: datetime,
                                                    tz: dt.tzinfo | None) -> None:
    got = stated_time(line, nccl_ts=nccl_ts, runtime=runtime, now=now, tz=tz)
    assert _well_formed(got), got


@settings(max_examples=100, deadline=None)
@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2999, 12, 31), timezones=st.just(UTC)),
       st.integers(-14 * 60, 14 * 60), st.from_regex(r"\A[0-9]{0,9}\Z"))
def test_an_explicit_zone_is_the_same_instant(t: datetime, minutes: int, frac: str) -> None:
    t = t.replace(microsecond=0)
    local = t.astimezone(timezone(timedelta(minutes=minutes)))
    sign, off = ("-" if minutes < 0 else "+"), abs(minutes)
    stamp = f"{local:%Y-%m-%dT%H:%M:%S}{'.' + frac if frac else ''}{sign}{off // 60:02d}:{off % 60:02d}"
    want = f"{t:%Y-%m-%dT%H:%M:%S}{'.' + frac if frac else ''}Z"
    assert stated_time(f"{stamp} x", now=NOW) == want
    assert stated_time("x", runtime=stamp, now=NOW) == want


ADVERSARIAL = ["[" * 65536, "1" * 65536, " " * 65536, "[rank0]:" * 8192, "a: " * 21845, "Dec  5 12:34:56 " * 4096,
               "2026-12-05 12:34:56," + "1" * 65000, "[2026-12-05 12:34:56" * 3276, "E1205 12:34:56." + "9" * 65000,
               "\r" * 65536, "\x00" * 65536, "node-3: " * 8192 + "[E1205 12:34:56.000000001 a:1] x"]


def test_bounded_work_on_64_kib_lines() -> None:
    start = time.perf_counter()
    for line in ADVERSARIAL:
        t0 = time.perf_counter()
        got = stated_time(line, nccl_ts=line, runtime=line, now=NOW, tz=None)
        assert _well_formed(got)
        parse_line(0, line.encode(), now=NOW)
        assert time.perf_counter() - t0 < 0.5, line[:40]
    assert time.perf_counter() - start < 1.0
    assert HEAD <= 1024, "only a line's head is looked at"


async def test_the_collector_reads_the_node_s_zone_when_a_line_needs_it(tmp_path: Path) -> None:
    """The NCCL collector reads /etc/localtime under the host root only when a line first needs it (an idle
    node never loads zoneinfo: tests/test_install_extras.py), and a PyTorch stamp without a zone is then read
    in the node's: 12:34:56 in Berlin in December is 11:34:56 UTC."""
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("gpu-7\n")
    (root / "etc/localtime").write_bytes(_tzif("Europe/Berlin"))
    (root / "var/log/nccl").mkdir(parents=True)
    (root / "var/log/nccl/gpu-7.11.log").write_text(
        "gpu-7:11:12 [0] NCCL INFO comm 0x5 rank 0 nranks 2 cudaDev 0 busId 18000 commId 0x77 - Init COMPLETE\n"
        "[rank0]:[E1205 12:34:56.100000 11 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=4, "
        "NumelOut=4, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.\n")
    sink = Sink()
    c = NCCLLogsCollector(NCCLLogsConfig(globs=["/var/log/nccl/*.log"], flight_recorder=False), HostRoot(str(root)),
                          CollectorEmitter("n", "nccl_logs", sink, ConditionTracker(None), facts=FactStore()))
    assert c._zone is not None and not isinstance(c._zone, dt.tzinfo)  # not read at start
    await c.check()
    assert str(c.zone) == "localtime"
    timeouts = sink.of("NCCLCollectiveTimeout")
    assert timeouts and re.fullmatch(r"\d{4}-12-05T11:34:56\.1(0*)Z", timeouts[0].details["logged_at"]), timeouts


# -- the fleet's views order by the stated time -------------------------------------------------------

def test_diagnose_orders_evidence_by_the_stated_time_and_says_which() -> None:
    ev = [{"node": "n1", "type": "NCCLCollectiveTimeout", "entity": "nccl:n1:1", "time": "2026-12-05T12:00:09Z",
           "logged_at": "2026-12-05T11:34:56.100000000Z", "decisive": True},
          {"node": "n2", "type": "GPUFellOffBus", "entity": "gpu:0000:18:00.0", "time": "2026-12-05T11:30:00.5Z"},
          {"node": "n3", "type": "NCCLWatchdogProgress", "entity": "nccl:n3:2", "time": "2026-12-05T11:40:00Z",
           "logged_at": "2026-12-05T11:20:00Z"},
          {"node": "n4", "type": "IBPortDown", "entity": "ib:mlx5_0/1", "time": None}]
    inc = {"job": "0x5", "culprit": {"node": "n2", "entity": "gpu:0000:18:00.0", "kind": "gpu"}, "confidence": 0.9,
           "reason": "r", "victims": ["n1"], "evidence": ev, "evidence_total": 4}
    out = diagnose.render_text([{"node": "n1", "status": "healthy", "conditions": [], "events": []}], [inc])
    shown = [ln.strip() for ln in out.split("  evidence: ", 1)[1].splitlines()[1:]]
    assert shown == ["2026-12-05T11:20:00Z n3 NCCLWatchdogProgress nccl:n3:2",
                     "(read 2026-12-05T11:30:00.5Z) n2 GPUFellOffBus gpu:0000:18:00.0",
                     "2026-12-05T11:34:56.100000000Z n1 NCCLCollectiveTimeout nccl:n1:1  <- decided it",
                     "(read None) n4 IBPortDown ib:mlx5_0/1"], shown


def test_timeline_starts_a_span_at_its_stated_time_and_says_which() -> None:
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
    rows = [timeline.Row("NCCLCollectiveTimeout nccl:n1:1",
                         [[now - 60, None, "critical", "2026-12-05T11:50:00Z"],  # read a minute ago, logged at 11:50
                          [now - 3000, now - 2900, "warning"]]),
            timeline.Row("IBPortDown ib:a/1", [[now - 30, None, "critical", float("nan")]])]
    svg = timeline.render(rows, now=now, max_s=6 * 3600, width=900)
    spans = re.findall(r'<rect class="span"[^>]*data-start="([\d.]+)" data-start-is="(\w+)"[^>]*><title>([^<]*)',
                       svg)
    assert [(float(s), src) for s, src, _ in spans] == [(now - 3000, "read"), (now - 600, "logged"),
                                                         (now - 30, "read")]
    assert "from 2026-12-05 11:50:00Z still firing (10 min); start: the time its source logged" in spans[1][2]
    assert spans[0][2].endswith("; start: when the node read it")
