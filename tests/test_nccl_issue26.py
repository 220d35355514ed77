"""Issue 26: PyTorch's heartbeat monitor (rules/heartbeat.py), lines a terminal wrapped in two
(matching.match_wrapped), and Meta's NCCLX lines behind their glog header (line.py)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl.line import PREFIX_MAX, parse_line
from collectors.nccl.matching import Match, match_or_reject, match_wrapped, wraps
from collectors.nccl.rule import Heard
from collectors.nccl.rules import RULES_BY_NAME
from gna_types.policy import verdict

# torch 2.3 (sgl-project/sglang#1691), 2.6+ (modelscope/ms-swift#7992): each rank's own watchdog stuck
HB_23 = (b"[rank0]:[E1019 01:04:03.356947152 ProcessGroupNCCL.cpp:1413] [PG 3 Rank 0] Heartbeat monitor timed out! "
         b"Process will be terminated after dumping debug info. workMetaList_.size()=121")
HB_23_EXIT = (b"[rank6]:[F1019 01:14:03.358291284 ProcessGroupNCCL.cpp:1224] [PG 3 Rank 6] [PG 3 Rank 6] ProcessGroupNCCL"
              b"'s watchdog got stuck for 600 seconds without making progress in monitoring enqueued collectives.")
HB_26 = (b"18:11:06.680 [rank4]:[E205 18:11:06.375750231 ProcessGroupNCCL.cpp:1870] [PG ID 12 PG GUID 99(EXPERT_MODEL_"
         b"PARALLEL_GROUP) Rank 4] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
         b"monitoring enqueued collectives.")
# PyTorch 2.3's progress line (tests/corpus/nccl/33-...) and the same line as a terminal wraps it
PROGRESS = (b"[rank1]:[E ProcessGroupNCCL.cpp:1540] [PG 1 Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 8, "
            b"last completed NCCL work: 6.")


def _match(raw: bytes) -> Match:
    m = match_or_reject(parse_line(0, raw))
    assert isinstance(m, Match), raw
    return m


def test_the_heartbeat_monitor_s_lines_each_release() -> None:
    m = _match(HB_23)
    assert m.rule.name == "heartbeat" and m.fields["pending"] == "121" and m.fields["rank"] == 0
    m = _match(HB_23_EXIT)
    assert m.rule.name == "heartbeat" and m.fields["stuck"] == "600" and m.fields["rank"] == 6
    m = _match(HB_26)
    assert m.rule.name == "heartbeat" and m.fields["stuck"] == "480" and m.fields["pg_rank"] == 4
    assert m.fields["rank"] == 4  # torchrun's [rank4]: the group is not the world's
    assert verdict("NCCLCollectiveTimeout", "HeartbeatTimeout").severity == "critical"
    for raw in (HB_23, HB_23_EXIT, HB_26):
        m = _match(raw)
        assert m.rule.say is not None
        said = m.rule.say(m.fields, _heard())
        assert said is not None and (said.type, said.reason) == ("NCCLCollectiveTimeout", "HeartbeatTimeout")
        assert said.details["seq_num"] is None


def _heard() -> Heard:
    return Heard("h:1", "", {}, False)


def _wrap(line: bytes, at: int) -> bytes:
    return line[:at] + b"\n" + line[at:]


def _joined(data: bytes) -> Match | None:
    """What the plugin does with each candidate no rule matched (plugin._handle)."""
    start = 0
    for part in data.split(b"\n"):
        end = start + len(part)
        line = parse_line(start, part)
        if match_or_reject(line) is None and wraps(line):
            w = match_wrapped(data, start, end, 65536, lambda at, b: parse_line(at, b))
            if w is not None:
                return w[0]
        start = end + 1
    return None


def test_a_progress_line_wrapped_anywhere_is_found_again() -> None:
    for at in range(1, len(PROGRESS)):
        data = b"noise before\n" + _wrap(PROGRESS, at) + b"\nnoise after\n"
        parts = [match_or_reject(parse_line(0, p)) for p in data.split(b"\n")]
        if any(isinstance(p, Match) and p.rule.name == "pg_progress" for p in parts):
            continue  # the wrap fell where the line still matches (a trailing "." cut off)
        m = _joined(data)
        assert m is not None and m.rule.name == "pg_progress", at
        assert (m.fields["at"], m.fields["enq"], m.fields["done"]) == (7, 8, 6), at
        assert m.line.offset == len(b"noise before\n")  # the first part's place


def test_a_join_is_bounded_and_only_a_wrapping_rule_s() -> None:
    head = PROGRESS[:60]
    assert _joined(head + b"\n" + b"x" * 70000 + b"\n") is None  # past max_line: no join
    # a WARN line after a wrapping rule's head is not read as anything through the join
    assert _joined(head + b"\nh:1:1 [0] NCCL WARN oops\n") is None
    data = b"\n".join([head] * 3)
    t = time.perf_counter()
    assert _joined(data) is None
    assert time.perf_counter() - t < 0.5


def test_nccl_x_lines_behind_their_glog_header() -> None:
    # meta-pytorch/torchcomms comms/utils/logger/LoggingFormat.cc (6d361cbb): the formatter's own example header
    m = _match(b"W0414 11:46:56.369712 4115466 Logger.cc:25] devvm2605:4115466:4115466 [-1][main] NCCL WARN "
               b"socketProgress: Connection closed by remote peer 10.0.0.2<35000>")
    assert (m.line.host, m.line.pid, m.line.dev, m.line.level) == ("devvm2605", 4115466, -1, "WARN")
    assert m.rule.name == "socket_error"
    m = _match(b"I0414 11:46:56.369712 4115466 init.cc:25] devvm2605:4115466:4115470 [3][main] NCCL INFO Using network IB")
    assert m.rule.name == "network" and m.line.level == "INFO" and m.line.dev == 3
    # folly's ERR level is NCCL's error channel: a WARN
    line = parse_line(0, b"E0414 11:46:56.369712 4115466 x.cc:1] h:1:2 [0][ncclx-main] NCCL ERROR CUDA failure")
    assert line.level == "WARN" and line.msg == "CUDA failure" and not line.unread
    # the header with an NCCL part that cannot be read: counted (Line.unread), not dropped unseen
    line = parse_line(0, b"I0414 11:46:56.369712 4115466 x.cc:1] h:1:2 [0][" + b"t" * 80 + b"] NCCL INFO x")
    assert line.unread and line.level == ""
    assert not parse_line(0, b"h:1:2 [0] NCCL INFO x").unread
    # the same through {fmt} 10+ (meta-pytorch/torchcomms#231: sub-seconds of %S, then the microseconds)
    line = parse_line(0, b"I0211 21:18:23.655698629.655698 1718364 showVersion:653] h:1:2 [0][" + b"t" * 80
                      + b"] NCCL INFO x")
    assert line.unread and line.level == ""


_PIECES = st.sampled_from([
    "[rank3]:", "[PG 3 Rank 0] ", "[PG ID 0 PG GUID 0(default_pg) Rank 3] ", "Heartbeat monitor timed out! Process "
    "will be terminated after dumping debug info. workMetaList_.size()=", "ProcessGroupNCCL's watchdog got stuck for ",
    " seconds", "W0414 11:46:56.369712 4115466 Logger.cc:25] ", "devvm:1:2 ", "[-1]", "[main]", " NCCL WARN ",
    " NCCL ERROR ", "Timeout at NCCL work: ", ", last enqueued NCCL work: ", ", last completed NCCL work: ", "\n",
])
_VALUES = st.one_of(st.text(max_size=30), st.integers(0, 10**30).map(str), st.integers(1, 3000).map(lambda n: "9" * n))
LINES = st.lists(st.one_of(_PIECES, _VALUES), min_size=1, max_size=12).map(
    lambda ps: "".join(ps).encode("utf-8", "surrogatepass"))


@settings(max_examples=200, deadline=None)
@given(LINES)
def test_never_raises_and_every_field_stays_bounded(data: bytes) -> None:
    for raw in data.split(b"\n"):
        line = parse_line(0, raw)
        assert len(line.host) <= PREFIX_MAX["host"]
        m = match_or_reject(line)
        if isinstance(m, Match):
            for k, v in m.fields.items():
                assert not isinstance(v, str) or len(v) <= m.rule.fields.get(k, 256), (k, v)
    w = _joined(data)
    if w is not None:
        assert w.rule.wrap is not None and len(w.line.raw) <= 65536


def test_a_hostile_64k_line_costs_linear_time() -> None:
    n = 65536
    heads = [b"Heartbeat monitor timed out!", b"[PG 3 Rank 0] ProcessGroupNCCL's watchdog got stuck for 1",
             b"[x] ProcessGroupNCCL's watchdog got stuck for ", b"W0414 11:46:56.369712 1 a.cc:1] h:1:2 [0][",
             b"I0414 11:46:56.369712 ", b"[0][main] NCCL", b"Timeout at NCCL work: 1, "]
    for head in heads:
        line = (head * (n // len(head) + 1))[:n]
        t = time.perf_counter()
        parsed = parse_line(0, line)
        match_or_reject(parsed)
        data = line + b"\n" + line
        if wraps(parsed):
            match_wrapped(data, 0, n, n, lambda at, b: parse_line(at, b))
        assert time.perf_counter() - t < 2.0, head
    assert RULES_BY_NAME["heartbeat"].wrap is not None and RULES_BY_NAME["pg_progress"].wrap is not None
