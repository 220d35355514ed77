"""#20 deliver 2, node side: every field a rule of collectors/nccl/rules/ takes from a line is bounded at the parser. A
job user's line with a 5,000-digit commId, pid or job id is rejected and counted, never cut into another id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl.line import PREFIX_MAX, parse_line
from collectors.nccl.matching import REJECTED_SOURCE, Match, Rejected, match_line, match_or_reject
from collectors.nccl.process import ProcessState
from collectors.nccl.rules import RULES_BY_NAME
from sim.host import SimHost

INIT = ("{host}:{pid}:{pid} [{dev}] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev 0 "
        "nvmlDev 0 busId {bus} commId {commid} - Init COMPLETE")
GOOD = {"host": "gpu-a", "pid": "4007", "dev": "0", "comm": "0x55d0c0ffee00", "rank": "7", "nranks": "32",
        "bus": "18000", "commid": "0x5b1e0c3f9a7d2e41"}


def _init(**kw: str) -> Match | Rejected | None:
    return match_or_reject(parse_line(0, INIT.format(**{**GOOD, **kw}).encode()))


def test_the_longest_values_nccl_prints_pass_and_one_more_character_is_rejected() -> None:
    m = _init(commid="0x" + "f" * 16, comm="0x" + "f" * 16, bus="f" * 16, host="h" * 64, pid="4194304")
    assert isinstance(m, Match) and m.fields["commid"] == "0xffffffffffffffff" and m.line.host == "h" * 64
    for kw, (rule, field, limit) in {
        "commid": ("init", "commid", 18), "comm": ("init", "comm", 18), "bus": ("init", "bus", 16),
        "rank": ("init", "rank", 10), "nranks": ("init", "nranks", 10),
    }.items():
        value = "0x" + "1" * 17 if kw in ("commid", "comm") else "1" * (limit + 1)
        r = _init(**{kw: value})
        assert isinstance(r, Rejected) and (r.rule, r.field, r.limit) == (rule, field, limit), (kw, r)
        assert r.length == len(value)
    for kw, limit in (("host", 64), ("pid", 7), ("dev", 11)):
        r = _init(**{kw: "9" * (limit + 1)})
        assert isinstance(r, Rejected) and (r.rule, r.field, r.limit) == ("prefix", kw, limit), (kw, r)
        assert match_line(r.line) is None


def test_the_issue_s_lines_are_rejected_without_raising() -> None:
    """A 5,000-digit commId used to become a 5,002-character job id (and a KV key longer than the server's
    control line); a 5,000-digit pid or SeqNum raised ValueError out of int() (CPython's 4,300-digit cap)."""
    assert isinstance(_init(commid="0x" + "a" * 5000), Rejected)
    assert isinstance(_init(pid="1" * 5000), Rejected)
    dog = ("[rank{r}]:[E1203 07:44:26 77 ProcessGroupNCCL.cpp:655] [PG ID {pg} PG GUID 0(default_pg) Rank 3] Watchdog "
           "caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, NumelOut=1, "
           "Timeout(ms)={t}) ran for {ran} milliseconds before timing out.")
    ok = {"r": "3", "pg": "0", "seq": "9", "op": "ALLREDUCE", "t": "600000", "ran": "600042"}
    m = match_or_reject(parse_line(0, dog.format(**ok).encode()))
    assert isinstance(m, Match) and m.fields["rank"] == 3
    for k in ok:
        bad = {**ok, k: ("A" if k == "op" else "1") * 5000}
        r = match_or_reject(parse_line(0, dog.format(**bad).encode()))
        assert isinstance(r, Rejected) and r.rule == "watchdog", k
    completion = "gpu-a:1:1 [0] transport/net_ib.cc:1 NCCL WARN NET/IB : Got completion from peer {p} with status={s} vendor_err {v} hca {h}"
    for p, s_, v, h in (("x" * 129, "12", "1", "mlx5_0"), ("10.0.0.1<1>", "1" * 11, "1", "mlx5_0"),
                        ("10.0.0.1<1>", "12", "1" * 5000, "mlx5_0"), ("10.0.0.1<1>", "12", "1", "m" * 65)):
        r = match_or_reject(parse_line(0, completion.format(p=p, s=s_, v=v, h=h).encode()))
        assert isinstance(r, Rejected) and r.rule == "ib_completion"


# -- any line: every field the parser hands on is within its bound ---------------------------------------

def _bounded(value: Any, limit: int) -> bool:
    if isinstance(value, str):
        return len(value) <= limit
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return len(str(abs(value))) <= limit
    return True


_PIECES = st.sampled_from([
    INIT, "NCCL INFO Using network ", "NET/IB : Using ", "; OOB ", "NET/Socket : Using ", "Channel 00/0 : 0[0] -> 1[1] ",
    "[send] via NET/IB/0", "(3)/GDRDMA", "via SHM/direct/direct", "NCCL_IB_HCA set to ", "NCCL_IB_DISABLE set by "
    "environment to ", "NET/IB : Got completion from peer ", " with status=", "vendor_err ", "hca ",
    "NET/IB : mlx5_0:1 async fatal event: ", "Connection closed by remote peer ", "[PG ID 1 PG GUID 1(tp) Rank 3] ",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=", ", OpType=", "Timeout(ms)=", ") ran for ",
    " milliseconds", "failure detected by watchdog at work sequence id: ", " PG status: last enqueued work: ",
    ", last completed work: ", "Received a dump signal due to a collective timeout from rank ", "Last enqueued NCCL "
    "work: ", ", last completed NCCL work: ", "[rank", "]:", "gpu-a:", ":1 ", "[0] ", "NCCL WARN ", "NCCL INFO ",
    "NET/IB : GPU Direct RDMA Disabled for HCA ", " '", "NCCL version 2.21.5", "comm 0x", " rank ", " nranks ",
    " cudaDev ", " busId ", " commId 0x", " - Init COMPLETE", "[2026-01-02 03:04:05] ",
])
_VALUES = st.one_of(st.text(min_size=0, max_size=40), st.integers(0, 10**40).map(str),
                    st.integers(1, 6000).map(lambda n: "1" * n), st.integers(1, 6000).map(lambda n: "f" * n),
                    st.sampled_from(["mlx5_0", "ib0:10.0.0.5<0>", "ALLREDUCE", "0x1f", "\u202e", " ", "\n"]))
LINES = st.lists(st.one_of(_PIECES.map(lambda p: p.format(**GOOD) if "{" in p else p), _VALUES),
                 min_size=1, max_size=14).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None)
@given(LINES)
def test_no_field_of_any_line_exceeds_its_bound(raw: bytes) -> None:
    line = parse_line(0, raw)
    if line.over is None:
        assert len(line.host) <= PREFIX_MAX["host"] and 0 <= line.pid < 10 ** PREFIX_MAX["pid"]
        assert len(line.src) <= PREFIX_MAX["src"] and len(line.func) <= PREFIX_MAX["func"]
        assert len(line.ts) <= PREFIX_MAX["ts"] and len(str(line.dev)) <= PREFIX_MAX["dev"]
    m = match_or_reject(line)
    if isinstance(m, Rejected):
        assert m.length > m.limit and match_line(line) is None
        return
    if m is None:
        return
    for k, v in m.fields.items():
        limit = m.rule.fields.get(k, 256)
        assert _bounded(v, limit), (k, v)
    st_ = ProcessState(line.host, line.pid, "/var/log/nccl/x.log")
    st_.apply(m)
    summary = st_.summary()
    assert all(len(c) <= RULES_BY_NAME["init"].fields["commid"] for c in summary["comm_ids"])
    assert summary["job"] is None or len(summary["job"]) <= RULES_BY_NAME["init"].fields["commid"]
    assert len(st_.entity) <= len("nccl::") + PREFIX_MAX["host"] + PREFIX_MAX["pid"]


async def test_the_collector_counts_rejected_lines_with_a_sample_and_publishes_nothing_from_them(
        tmp_path: Path) -> None:
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.write("/proc/sys/kernel/hostname", "gpu-a\n")
    lines = [INIT.format(**{**GOOD, "commid": "0x" + "a" * 5000}), INIT.format(**{**GOOD, "pid": "1" * 5000}),
             INIT.format(**GOOD),
             "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" + "9" * 5000
             + ", OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600042 milliseconds"]
    host.write("/var/log/nccl/gpu-a.4007.log", "\n".join(lines) + "\n")
    # a job's file name is no %h.%p past the bounds: its lines get a short, distinct owner
    host.write("/var/log/nccl/" + "h" * 200 + ".4008.log",
               lines[-1].replace("9" * 5000, "9").replace("[Rank 0]", "[Rank 5]") + "\n")  # a rank nobody holds
    sink = Sink()
    em = CollectorEmitter("gpu-a", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    # own_hosts: a file whose name is no %h.%p stands for its writer (else its line is evidence for nobody)
    c = NCCLLogsCollector(NCCLLogsConfig(flight_recorder=False, own_hosts=["*"]), HostRoot(host.root), em)
    await c.check()
    assert c.rejected == {"init.commid": 1, "prefix.pid": 1, "watchdog.seq": 1}
    count, sample = em.skipped[REJECTED_SOURCE]
    assert count == 3 and "commid is 5002 characters (at most 18)" in sample
    (member,) = sink.of("NCCLJobMember")
    assert member.details["job"] == GOOD["commid"] and member.details["comm_id"] == GOOD["commid"]
    timeouts = sink.of("NCCLCollectiveTimeout")
    assert [len(t.entity) for t in timeouts] == [len("nccl:file-") + 16 + 2]
    assert all(len(str(v)) <= 2000 for m in sink.messages for v in m.details.values() if isinstance(v, str))


def test_a_hostile_64k_line_costs_linear_time() -> None:
    """A job user's single line (the tailer cuts at 64 KiB) repeating a rule's head without its tail: the
    prefix search and the lazy rules were quadratic (a run of 65,536 digits: about two minutes of CPU on the
    event loop; ``NET/IB : Using`` repeated: 19 s). Each now takes a fraction of a second."""
    import time

    n = 65536
    heads = [b"1", b"a", b"<", b"[0] ", b"[0] a:1 (", b"NET/IB : Using ", b"NET/IB : Using ; OOB  ",
             b"comm 0x1 rank 0 nranks 1 cudaDev 0 ", b"Using network ", b"NCCL_A set by environment to ",
             b"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=A) ran for x ",
             b"[PG ID 1 PG GUID 1(tp) Rank 3] ", b"NET/IB : mlx5_0:1 async fatal event"]
    for head in heads:
        line = (head * (n // len(head) + 1))[:n]
        t = time.perf_counter()
        match_or_reject(parse_line(0, line))
        assert time.perf_counter() - t < 2.0, head
