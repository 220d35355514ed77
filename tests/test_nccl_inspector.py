"""NCCL Inspector: the dump-line parser on NCCL's own output, hostile input, the per-rank summary, the
collector on a simulated host, and the fleet's comparison of ranks (docs/nccl-inspector.md).

The corpus (tests/corpus/nccl_inspector, README there) was written by NCCL's json.cc driven through the
Inspector's own call sequences; manifest.json is what the generator wrote into each file.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl_inspector import (
    MAX_BW_GBS,
    InspectorRecord,
    NCCLInspectorCollector,
    NCCLInspectorConfig,
    Skip,
    comm_job,
    parse_line,
    parse_lines,
    size_bucket,
    summarize,
)
from fleet.inspector_compare import (
    comm_summaries,
    resolve_job,
    slow_communicators,
    slow_ranks,
)
from sim.host import SimHost

CORPUS = Path(__file__).parent / "corpus" / "nccl_inspector"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


# -- a renderer of json.cc's output, for generated lines ------------------------------------------

def _jstr(s: str) -> str:
    """json.cc sanitizeJson: quotes " \\ / tab newline; any other control character fails the write."""
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("/", "\\/").replace("\t", "\\t").replace("\n", "\\n")
    return f'"{out}"'


def render(*, comm_id: str, rank: int, nranks: int, nnodes: int, host: str, pid: int, ts: int, op: str, sn: int,
           size: int, exec_us: int, algbw: float, busbw: float, timing: str = "kernel_gpu", peer: int | None = None,
           comm_name: str | None = "unknown") -> bytes:
    """One line as inspector_json.cc v2.30.7-1 writes it (keys in its order, %d/%lu ints, %lf doubles)."""
    name = f'"comm_name":{_jstr(comm_name)},' if comm_name is not None else ""
    head = (f'{{"header":{{"id":"{comm_id}",{name}"rank":{rank},"n_ranks":{nranks},"nnodes":{nnodes}}},'
            f'"metadata":{{"inspector_output_format_version":"v4.0","git_rev":"v2.30.7-1",'
            f'"rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":{ts},"hostname":{_jstr(host)},'
            f'"pid":{pid}}},')
    if peer is None:
        perf = (f'"coll_perf":{{"coll":"{op}","coll_sn":{sn},"coll_msg_size_bytes":{size},"coll_exec_time_us":'
                f'{exec_us},"coll_timing_source":"{timing}","coll_algobw_gbs":{algbw:f},"coll_busbw_gbs":{busbw:f}}}}}')
    else:
        perf = (f'"p2p_perf":{{"p2p":"{op}","p2p_sn":{sn},"p2p_peer":{peer},"p2p_msg_size_bytes":{size},'
                f'"p2p_exec_time_us":{exec_us},"p2p_timing_source":"{timing}","p2p_algobw_gbs":{algbw:f},'
                f'"p2p_busbw_gbs":{busbw:f}}}}}')
    return (head + perf).encode()


def bandwidths(op: str, size: int, exec_us: int, nranks: int, p2p: bool = False) -> tuple[float, float]:
    """inspector.cc v2.30.7-1 inspectorComputeOpBw (l.1450-1492)."""
    if p2p or op in ("Reduce", "Broadcast", "SendRecv", "Send", "Recv"):
        traffic, factor = float(size), 1.0
    elif op == "AllReduce":
        traffic, factor = float(size), 2 * (nranks - 1) / nranks
    elif op in ("ReduceScatter", "AllGather", "AllGatherV"):
        traffic, factor = float(size * nranks), (nranks - 1) / nranks
    else:
        traffic, factor = 0.0, 0.0
    t = exec_us / 1e6
    algbw = traffic / 1e9 / t if t else 0.0
    return algbw, algbw * factor


def record(comm_id: str, rank: int, nranks: int, op: str, size: int, exec_us: int, ts: int, *, peer: int | None = None,
           host: str = "gpu-x", pid: int = 100, nnodes: int = 1, timing: str = "kernel_gpu") -> InspectorRecord:
    algbw, busbw = bandwidths(op, size, exec_us, nranks, peer is not None)
    return InspectorRecord(kind="p2p" if peer is not None else "coll", comm_id=comm_id, comm_name=None, rank=rank,
                           nranks=nranks, nnodes=nnodes, hostname=host, pid=pid, dump_ts_us=ts, op=op, sn=ts,
                           msg_bytes=size, exec_us=exec_us, algbw_gbs=algbw, busbw_gbs=busbw, timing=timing, peer=peer)


GOOD = render(comm_id="0x7f8c496ae9f661", rank=2, nranks=8, nnodes=1, host="h", pid=9, ts=1748030377748202,
              op="AllReduce", sn=1407, size=17179869184, exec_us=61974, algbw=277.210914, busbw=485.119099)


# -- the corpus ---------------------------------------------------------------------------------

def test_the_manifest_names_every_corpus_file() -> None:
    assert sorted(MANIFEST) == sorted(p.name for p in CORPUS.glob("*.log"))


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_every_corpus_file_parses_as_written(name: str) -> None:
    want = MANIFEST[name]
    got = parse_lines((CORPUS / name).read_bytes())
    assert len(got.records) == want["records"], (name, got.skips, got.samples)
    assert dict(got.skips) == want["skips"], got.samples
    for r in got.records:
        assert math.isfinite(r.busbw_gbs) and 0 <= r.busbw_gbs <= 2 * r.algbw_gbs + 2e-6
        # the file is <hostname>-pid<pid>.log (inspector.cc inspectorStateDumpJSON): the lines say the same
        assert name == f"{r.hostname}-pid{r.pid}.log"
        algbw, busbw = bandwidths(r.op, r.msg_bytes, r.exec_us, r.nranks, r.kind == "p2p")
        assert abs(r.algbw_gbs - algbw) <= 1e-6 + 1e-9 * algbw and abs(r.busbw_gbs - busbw) <= 1e-6 + 1e-9 * busbw


def test_corpus_fields_of_2_30_7() -> None:
    recs = parse_lines((CORPUS / "gpu-a-pid4242.log").read_bytes()).records
    pp = [r for r in recs if r.kind == "p2p"]
    # the generator's 0x1b2c3d4e5f607182, cut to 14 hex digits by the Inspector's 17-byte buffer
    assert {r.comm_id for r in pp} == {"0x1b2c3d4e5f6071"}
    assert {r.comm_name for r in pp} == {"pp/stage-1"}  # written "pp\/stage-1"
    assert {(r.op, r.peer) for r in pp} == {("Send", 2), ("Recv", 0)}
    dp = [r for r in recs if r.kind == "coll"]
    assert {r.comm_name for r in dp} == {"unknown"}  # the Inspector's word for "no name"
    assert {r.timing for r in dp} == {"kernel_gpu", "kernel_cpu", "collective_cpu"}
    assert [r.sn for r in dp if r.op == "AllReduce"][:3] == [1, 2, 3]
    assert all(r.format_version == "v4.0" and r.rec_mechanism == "nccl_profiler_interface" for r in recs)
    assert [r.start_ts_us for r in recs] == [None] * len(recs)  # not verbose


def test_corpus_verbose_lines_and_a_qualified_hostname() -> None:
    recs = parse_lines((CORPUS / "gpu-b.cluster.local-pid7.log").read_bytes()).records
    assert {r.short_host for r in recs} == {"gpu-b"}  # as NCCL's log prefix and nccl_logs' entities
    rs = [r for r in recs if r.op == "ReduceScatter"]
    assert len(rs) == 5 and {r.channels for r in rs} == {4}
    for r in rs:
        assert r.start_ts_us is not None and r.kernel_start_ts_us is not None and r.stop_ts_us is not None
        assert r.start_ts_us < r.kernel_start_ts_us
    assert {(r.op, r.peer, r.channels) for r in recs if r.kind == "p2p"} == {("Send", 5, 2)}


def test_corpus_2_28_has_no_comm_name_and_is_sampled() -> None:
    recs = parse_lines((CORPUS / "gpu-c-pid31337.log").read_bytes()).records
    assert {r.comm_name for r in recs} == {None} and {r.kind for r in recs} == {"coll"}
    ar = [r.sn for r in recs if r.op == "AllReduce"]
    assert all(b - a > 1 for a, b in itertools.pairwise(ar))  # one collective per dump, the rest not written


def test_corpus_writer_anomalies() -> None:
    got = parse_lines((CORPUS / "gpu-d-pid555.log").read_bytes())
    assert {r.op for r in got.records} == {"AllReduce"}  # the uint8 AllGathers: size 2**64 - count, skipped
    assert "2**64 - 4194304" in parse_line((CORPUS / "gpu-d-pid555.log").read_bytes().splitlines()[1]).detail  # type: ignore[union-attr]
    got = parse_lines((CORPUS / "gpu-e-pid900.log").read_bytes())
    assert '"comm_name":,' in got.samples["bad_json"]
    assert {comm_job(r.comm_id) for r in got.records} == {"0xabc123"}  # short enough to be whole


def test_summary_of_the_corpus() -> None:
    recs = parse_lines((CORPUS / "gpu-a-pid4242.log").read_bytes()).records
    s = summarize(recs, window_s=3600)
    assert s["records"] == 123 and s["comms_truncated"] == 0
    by = {(c["comm_id"], o["op"], o["bucket"], o["peer"]): o for c in s["comms"] for o in c["ops"]}
    ar = by[("0x7f8c496ae9f661", "AllReduce", "64MiB", None)]
    assert (ar["records"], ar["n"], ar["cpu_timed"], ar["untimed"]) == (42, 40, 2, 0)
    small = by[("0x7f8c496ae9f661", "AllReduce", "8KiB", None)]
    assert (small["n"], small["untimed"], small["busbw_gbs"]) == (0, 1, None)
    assert by[("0x1b2c3d4e5f6071", "Send", "16MiB", 2)]["n"] == 20
    dp = next(c for c in s["comms"] if c["comm_id"] == "0x7f8c496ae9f661")
    # 14 hex digits may be a cut hash: no job claimed, the prefix for the fleet to match
    assert (dp["job"], dp["job_prefix"], dp["rank"], dp["nranks"], dp["nnodes"]) == (None, "0x7f8c496ae9f661", 2, 16, 2)
    # the window is measured back from the newest record: 20 dumps one second apart, 5 s keep 5-6 of them
    short = summarize(recs, window_s=5)
    assert 20 < short["records"] < 40


def test_the_inspector_id_is_a_prefix_of_nccls_commid() -> None:
    h = 0x1B2C3D4E5F607182
    inspector = (f"0x{h:x}")[:16]  # snprintf(hashStr, 17, "0x%lx")
    assert comm_job(inspector) is None and resolve_job(inspector, [f"0x{h:x}", "0x77"]) == f"0x{h:x}"
    assert comm_job("0xabc") == "0xabc" and resolve_job("0xabc", ["0xabcdef", "0xabc"]) == "0xabc"
    assert resolve_job("0x1b2c3d4e5f6071", ["0x1b2c3d4e5f607182", "0x1b2c3d4e5f607199"]) is None  # ambiguous
    assert resolve_job("junk", ["junk"]) is None


# -- hostile input ------------------------------------------------------------------------------

def _mutate(line: bytes, old: bytes, new: bytes) -> bytes:
    assert old in line
    return line.replace(old, new, 1)


@pytest.mark.parametrize(("line", "reason"), [
    (b"", "bad_json"),
    (b"garbage", "bad_json"),
    (b"\xff\xfe\x00junk", "not_utf8"),
    (b"[]", "bad_field"),
    (b'{"x":' + b"[" * 16000 + b"]" * 16000 + b"}", "bad_json"),  # deeper than the decoder recurses
    (GOOD[: len(GOOD) // 2], "bad_json"),
    (GOOD + GOOD, "bad_json"),  # two records on one line: a writer that died mid-line, another appended
    (_mutate(GOOD, b'"rank":2', b'"rank":true'), "bad_field"),
    (_mutate(GOOD, b'"rank":2', b'"rank":8'), "impossible"),
    (_mutate(GOOD, b'"rank":2', b'"rank":-1'), "impossible"),
    (_mutate(GOOD, b'"nnodes":1', b'"nnodes":9'), "impossible"),
    (_mutate(GOOD, b'"pid":9', b'"pid":0'), "impossible"),
    (_mutate(GOOD, b'"id":"0x7f8c496ae9f661"', b'"id":"7f8c"'), "impossible"),
    (_mutate(GOOD, b'"hostname":"h"', b'"hostname":"h\\u0001"'), "impossible"),
    (_mutate(GOOD, b'"coll":"AllReduce"', b'"coll":"All Reduce; rm -rf"'), "impossible"),
    (_mutate(GOOD, b"277.210914", b"-1.000000"), "impossible"),
    (_mutate(GOOD, b"485.119099", b"999.000000"), "impossible"),  # busbw > 2 * algbw: no factor does that
    (_mutate(GOOD, b"277.210914", b"1e300"), "impossible"),
    (_mutate(GOOD, b"277.210914", b"inf"), "non_finite"),  # what %lf prints for an infinity
    (_mutate(GOOD, b"485.119099", b"-inf"), "non_finite"),
    (_mutate(GOOD, b"485.119099", b'"nan"'), "non_finite"),  # what jsonDouble prints for NaN
    (_mutate(GOOD, b'"coll_exec_time_us":61974', b'"coll_exec_time_us":0'), "impossible"),
    (_mutate(GOOD, b"17179869184", b"18446744073705357312"), "wrapped_size"),
    (_mutate(GOOD, b"17179869184", b"18446744073709551616"), "impossible"),  # past uint64: not a %lu
    (_mutate(GOOD, b"17179869184", b"9007199254740992"), "impossible"),
    (_mutate(GOOD, b'"coll_perf"', b'"other_perf"'), "no_perf"),
    (_mutate(GOOD, b'"coll_perf":{', b'"p2p_perf":{"p2p":"Send","p2p_sn":1,"p2p_peer":0,"p2p_msg_size_bytes":1,'
                                     b'"p2p_exec_time_us":1,"p2p_algobw_gbs":0,"p2p_busbw_gbs":0},"coll_perf":{'),
     "no_perf"),  # both: no writer puts two operations in one object
])
def test_hostile_lines_are_counted_skips(line: bytes, reason: str) -> None:
    got = parse_line(line)
    assert isinstance(got, Skip) and got.reason == reason, got


def test_the_good_line_and_its_every_prefix() -> None:
    r = parse_line(GOOD)
    assert isinstance(r, InspectorRecord)
    assert (r.comm_id, r.rank, r.nranks, r.op, r.msg_bytes, r.exec_us, r.busbw_gbs) == (
        "0x7f8c496ae9f661", 2, 8, "AllReduce", 17179869184, 61974, 485.119099)
    for cut in range(len(GOOD)):  # a line cut anywhere (a writer killed mid-line) is never a record
        assert isinstance(parse_line(GOOD[:cut]), Skip)


def test_bounded_lines_and_half_lines() -> None:
    long = _mutate(GOOD, b'"hostname":"h"', b'"hostname":"h","pad":"' + b"x" * 40000 + b'"')
    assert parse_line(long) == Skip("too_long", f"{len(long)} bytes")
    assert isinstance(parse_line(long, max_line=1 << 20), InspectorRecord)  # unknown keys are ignored
    data = GOOD + b"\n\n" + b"junk\n" + GOOD[:100]
    got = parse_lines(data)
    assert (len(got.records), dict(got.skips), got.consumed) == (1, {"bad_json": 1}, len(data) - 100)
    assert parse_lines(GOOD).consumed == 0  # no newline yet: the whole line waits


def test_a_verbose_line_with_too_many_channels_is_refused() -> None:
    kernels = ",".join(f'{{"channel_id":{i},"kernel_start_ts":1,"kernel_stop_ts":2,"kernel_record_ts":2}}'
                       for i in range(65))
    line = GOOD.replace(b"485.119099}}", b'485.119099,"event_trace_ts":{"coll_start_ts":1,"coll_stop_ts":2,'
                                          b'"kernel_events":[' + kernels.encode() + b"]}}}")
    got = parse_line(line)
    assert isinstance(got, Skip) and got.reason == "bad_field"  # inspector.h MAX_CHANNELS 64


@given(st.binary(max_size=2000))
def test_any_bytes_are_a_record_or_a_skip(data: bytes) -> None:
    got = parse_lines(data)
    assert len(got.records) + sum(got.skips.values()) <= data.count(b"\n")
    assert all(r.busbw_gbs >= 0 and math.isfinite(r.busbw_gbs) for r in got.records)


_NAMES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), max_size=40)  # no controls, no surrogates


@st.composite
def written_lines(draw: Any) -> tuple[bytes, dict[str, Any]]:
    nranks = draw(st.integers(1, 4096))
    p2p = draw(st.booleans()) and nranks > 1
    op = draw(st.sampled_from(["Send", "Recv"] if p2p else
                              ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AllGatherV"]))
    size = draw(st.integers(0, 1 << 40))
    exec_us = draw(st.integers(0, 10**9))
    algbw, busbw = bandwidths(op, size, exec_us, nranks, p2p)
    f = {"comm_id": f"0x{draw(st.integers(0, 2**64 - 1)):x}"[:16], "rank": draw(st.integers(0, nranks - 1)),
         "nranks": nranks, "nnodes": draw(st.integers(1, nranks)), "host": draw(_NAMES.filter(bool)),
         "pid": draw(st.integers(1, 1 << 22)), "ts": draw(st.integers(1, 1 << 61)), "op": op,
         "sn": draw(st.integers(0, 2**64 - 1)), "size": size, "exec_us": exec_us, "algbw": algbw, "busbw": busbw,
         "timing": draw(st.sampled_from(["kernel_gpu", "kernel_cpu", "collective_cpu"])),
         "peer": draw(st.integers(0, nranks - 1)) if p2p else None, "comm_name": draw(st.none() | _NAMES)}
    return render(**f), f


@given(written_lines())
def test_what_the_writer_can_write_round_trips(case: tuple[bytes, dict[str, Any]]) -> None:
    line, f = case
    got = parse_line(line)
    algbw, busbw = float(f"{f['algbw']:f}"), float(f"{f['busbw']:f}")  # %lf: six decimals
    if algbw > MAX_BW_GBS or (f["exec_us"] == 0 and algbw):
        assert isinstance(got, Skip) and got.reason == "impossible"
        return
    assert isinstance(got, InspectorRecord), got
    assert (got.comm_id, got.rank, got.nranks, got.nnodes, got.hostname, got.pid, got.dump_ts_us, got.op, got.sn,
            got.msg_bytes, got.exec_us, got.timing, got.peer, got.comm_name) == (
        f["comm_id"], f["rank"], f["nranks"], f["nnodes"], f["host"], f["pid"], f["ts"], f["op"], f["sn"],
        f["size"], f["exec_us"], f["timing"], f["peer"], f["comm_name"])
    assert (got.algbw_gbs, got.busbw_gbs) == (algbw, busbw)
    assert got.busbw_gbs >= 0 and math.isfinite(got.busbw_gbs)


_RECORDS = st.lists(st.builds(
    lambda comm, rank, op, size, exec_us, ts, timing, peer: record(
        f"0x{comm:x}", rank, 8, op, size, exec_us, ts, peer=peer if op in ("Send", "Recv") else None, timing=timing),
    st.integers(1, 6), st.integers(0, 7), st.sampled_from(["AllReduce", "AllGather", "Send", "Recv"]),
    st.integers(0, 1 << 34), st.integers(0, 10**6), st.integers(1, 10**9),
    st.sampled_from(["kernel_gpu", "kernel_cpu", None]), st.integers(0, 7)), max_size=300)


@settings(max_examples=60)
@given(_RECORDS, st.none() | st.floats(0.001, 2000), st.integers(1, 5), st.integers(1, 6))
def test_summary_invariants(recs: list[InspectorRecord], window: float | None, max_comms: int, max_ops: int) -> None:
    s = summarize(recs, window_s=window, max_comms=max_comms, max_ops=max_ops)
    newest = max((r.dump_ts_us for r in recs), default=0)
    in_window = [r for r in recs if window is None or r.dump_ts_us >= newest - int(window * 1e6)]
    assert s["records"] == len(in_window)
    assert sum(c["records"] for c in s["comms"]) + s["records_truncated"] == len(in_window)
    assert len(s["comms"]) <= max_comms and s["comms_truncated"] + len(s["comms"]) == len(
        {(r.comm_id, r.rank) for r in in_window})
    for c in s["comms"]:
        assert len(c["ops"]) <= max_ops
        assert sum(o["records"] for o in c["ops"]) + c["records_truncated"] == c["records"]
        for o in c["ops"]:
            assert o["n"] + o["untimed"] + o["cpu_timed"] == o["records"]
            assert o["size_lo"] == size_bucket(o["size_lo"]) and o["size_hi"] > o["size_lo"]
            if o["n"]:
                vals = (o["busbw_p25_gbs"], o["busbw_gbs"], o["busbw_p75_gbs"], o["algbw_gbs"], o["exec_us"])
                assert all(math.isfinite(v) and v >= 0 for v in vals)
                assert o["busbw_p25_gbs"] <= o["busbw_gbs"] <= o["busbw_p75_gbs"]
            else:
                assert o["busbw_gbs"] is None
    json.dumps(s, allow_nan=False)  # publishable as is


# -- the collector ------------------------------------------------------------------------------

def _collector(host: SimHost, **cfg: Any) -> tuple[NCCLInspectorCollector, Any, Any]:
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    sink = Sink()
    em = CollectorEmitter("gpu-a", "nccl_inspector", sink, ConditionTracker(None), facts=FactStore(),
                          state_dir=cfg.pop("state_dir", None))
    return NCCLInspectorCollector(NCCLInspectorConfig(**cfg), HostRoot(host.root), em), sink, em


def test_the_collector_keeps_the_sdk_contract() -> None:
    import msgspec

    from gna_sdk import collector_contract

    assert collector_contract(NCCLInspectorCollector) == []
    cfg = msgspec.convert({"globs": ["/x/*.log"], "window": 60}, NCCLInspectorConfig)
    assert (cfg.globs, cfg.window, cfg.interval) == (["/x/*.log"], 60, 60.0)
    for bad in ({"window": 0}, {"max_comms": 0}, {"unknown_key": 1}, {"max_line": 10}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, NCCLInspectorConfig)


async def test_check_on_a_simulated_host(tmp_path: Path) -> None:
    from agent.message import to_dict
    from tests.conftest import validate_message

    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    job_dir = host.p("/var/log/nccl-inspector/77")  # NCCL_INSPECTOR_DUMP_DIR=/var/log/nccl-inspector/$SLURM_JOB_ID
    job_dir.mkdir(parents=True)
    for name in MANIFEST:
        shutil.copy(CORPUS / name, job_dir / name)
    (job_dir / "gpu-z-pid1.log").write_bytes(b"\x00\x01 not json\n" * 3)
    (job_dir / "nccl_inspector_metrics_GPU-uuid.prom").write_text("nccl_bus_bandwidth_gbs{} 1\n")  # not JSON mode
    c, sink, em = _collector(host)
    await c.check()
    events = {m.entity: m for m in sink.of("NCCLInspectorSummary")}
    assert sorted(events) == ["nccl:gpu-a:4242", "nccl:gpu-b:7", "nccl:gpu-c:31337", "nccl:gpu-d:555",
                              "nccl:gpu-e:900"]
    for m in events.values():
        validate_message(json.loads(json.dumps(to_dict(m))))
        assert (m.severity, m.reason, m.kind) == ("info", "Periodic", "event")
        assert len(json.dumps(m.details)) < 64 * 1024
    a = events["nccl:gpu-a:4242"].details
    assert a["file"] == "/var/log/nccl-inspector/77/gpu-a-pid4242.log"
    assert (a["job"], a["job_prefix"], a["world_rank"], a["world_size"]) == (None, "0x7f8c496ae9f661", 2, 16)
    assert {c["comm_id"] for c in a["comms"]} == {"0x7f8c496ae9f661", "0x1b2c3d4e5f6071"}
    assert a["format_versions"] == {"v4.0": 123}
    e = events["nccl:gpu-e:900"].details
    assert (e["job"], e["skipped"]) == ("0xabc123", {"bad_json": 1})
    assert events["nccl:gpu-d:555"].details["skipped"] == {"wrapped_size": 3}
    assert em.skipped["NCCL Inspector lines: bad_json"][0] == 4  # gpu-e's broken line and gpu-z's three
    assert em.skipped["NCCL Inspector lines: wrapped_size"][0] == 3
    assert not em.blind


async def test_check_says_when_there_is_nothing_to_read(tmp_path: Path) -> None:
    c, sink, em = _collector(SimHost.gpu_node(tmp_path / "h", gpus=1))
    await c.check()
    assert sink.messages == [] and "NCCL_INSPECTOR_DUMP_DIR" in next(iter(em.blind.values()))


async def test_the_daemon_tails_dumps_and_publishes_each_interval(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    d = host.p("/var/log/nccl-inspector")
    d.mkdir(parents=True)
    c, sink, _em = _collector(host, state_dir=tmp_path / "state", rescan_interval=0.1, interval=1.0)
    (tmp_path / "state").mkdir()
    log = d / "gpu-a-pid4242.log"
    line = render(comm_id="0xabc", rank=0, nranks=2, nnodes=1, host="gpu-a", pid=4242, ts=10**15, op="AllReduce",
                  sn=1, size=1 << 20, exec_us=100, algbw=10.48576, busbw=10.48576)
    log.write_bytes(line + b"\n" + line[:50])  # the dump thread's buffer flushed mid-line
    task = asyncio.get_running_loop().create_task(c.run())
    try:
        for _ in range(100):
            if c.records == 1:
                break
            await asyncio.sleep(0.05)
        assert c.records == 1
        await c.collect()
        with open(log, "ab") as fh:
            fh.write(line[50:] + b"\n")
        for _ in range(100):
            if c.records == 2:
                break
            await asyncio.sleep(0.05)
        await c.collect()
        await c.collect()  # nothing new: no summary
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    got = [m.details for m in sink.of("NCCLInspectorSummary")]
    assert [d["records"] for d in got] == [1, 2] and got[1]["job"] == "0xabc"
    assert sum(c.skips.get("/var/log/nccl-inspector/gpu-a-pid4242.log", {}).values()) == 0  # the half line waited


async def test_memory_is_bounded_per_process(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    d = host.p("/var/log/nccl-inspector")
    d.mkdir(parents=True)
    lines = [render(comm_id=f"0x{k % 40:x}", rank=0, nranks=2, nnodes=1, host="gpu-a", pid=1, ts=10**15 + i,
                    op="AllReduce", sn=i, size=1 << 20, exec_us=100, algbw=10.48576, busbw=10.48576)
             for i, k in enumerate(range(2000))]
    (d / "gpu-a-pid1.log").write_bytes(b"\n".join(lines) + b"\n")
    c, sink, _em = _collector(host, samples_per_key=8, keys_per_process=16, max_comms=4)
    await c.check()
    (proc,) = c.procs.values()
    assert len(proc.samples) == 16 and all(len(q) <= 8 for q in proc.samples.values())
    assert proc.dropped_keys == 2000 - sum(1 for i in range(2000) if i % 40 < 16)
    (m,) = sink.of("NCCLInspectorSummary")
    assert len(m.details["comms"]) == 4 and m.details["comms_truncated"] == 12


# -- the fleet's comparison -----------------------------------------------------------------------

def _ring(nranks: int, *, steps: int = 60, late: dict[int, float] | None = None, link_us: float = 1000.0,
          noise: float = 0.03, early: dict[int, float] | None = None, comm: str = "0x5b1e0c3f9a7d2e",
          seed: int = 1, op: str = "AllReduce", size: int = 64 << 20) -> list[dict[str, Any]]:
    """The summaries of every rank of a ring all-reduce, from records made the way the Inspector measures:
    each rank's kernel runs from its own start until the collective ends (the last arrival + the ring time),
    so exec_time(rank) = link_us + (last arrival - its arrival), with measurement noise."""
    rnd = random.Random(seed)
    per_rank: dict[int, list[InspectorRecord]] = {r: [] for r in range(nranks)}
    for step in range(steps):
        arrive = {r: rnd.uniform(0, 50) + (late or {}).get(r, 0.0) - (early or {}).get(r, 0.0) for r in range(nranks)}
        last = max(arrive.values())
        for r in range(nranks):
            exec_us = int((link_us + last - arrive[r]) * (1 + rnd.uniform(-noise, noise)))
            per_rank[r].append(record(comm, r, nranks, op, size, exec_us, 10**15 + step * 10**6, host=f"gpu-{r // 8}",
                                      pid=1000 + r, nnodes=max(1, nranks // 8)))
    return [summarize(recs, window_s=600)["comms"][0] for recs in per_rank.values()]


def test_the_rank_everyone_waits_for_is_named() -> None:
    found = slow_ranks(_ring(16, late={11: 600.0}))
    assert [(f["kind"], f["rank"], f["pid"]) for f in found] == [("late_arrival", 11, 1011)], found
    ev = found[0]["evidence"][0]
    # its kernels run ~1000 µs, its peers' ~1600 µs: they spend about 3/8 of theirs waiting
    assert ev["op"] == "AllReduce" and ev["bucket"] == "64MiB" and 30 < ev["peers_waiting_pct"] < 45
    assert "reaches its collectives last" in found[0]["message"]


def test_noise_alone_names_nobody() -> None:
    for seed in range(20):
        assert slow_ranks(_ring(16, noise=0.10, seed=seed)) == []  # ±10% per operation, random arrival order
        assert slow_ranks(_ring(5, noise=0.10, seed=seed)) == []


def test_a_small_lateness_is_below_the_gap() -> None:
    """Late by a quarter of the collective with almost no noise: statistically clear (z far past 3.5), but its
    peers wait only ~20% of their kernel time; the 25% gap keeps it unnamed. Twice as late, it is named."""
    assert slow_ranks(_ring(16, late={3: 250.0}, noise=0.01)) == []
    assert [f["rank"] for f in slow_ranks(_ring(16, late={3: 500.0}, noise=0.01))] == [3]


def _flat(values: dict[int, float], *, n: int = 50, comm: str = "0xc0") -> list[dict[str, Any]]:
    """Per-rank summaries with the given median bus bandwidth of one AllReduce bucket."""
    return [{"comm_id": comm, "rank": r, "nranks": len(values), "pid": 100 + r, "hostname": f"h{r}", "ops": [
        {"kind": "coll", "op": "AllReduce", "bucket": "64MiB", "size_lo": 64 << 20, "peer": None, "n": n,
         "busbw_gbs": v}]} for r, v in values.items()]


def test_widely_spread_peers_hide_a_high_value() -> None:
    """Peers spread from 50 to 150 GB/s (a mixed communicator, a noisy fabric): 200 passes the 25% gap
    against their median of 100, but not the MAD test (z about 2.7): nobody is named. With tight peers the
    same 200 is named."""
    spread = {r: 50.0 + 100.0 * r / 14 for r in range(15)}
    assert slow_ranks(_flat({**spread, 15: 200.0})) == []
    assert [f["rank"] for f in slow_ranks(_flat({**{r: 100.0 + r * 0.1 for r in range(15)}, 15: 200.0}))] == [15]


def test_the_noise_floor_and_min_ranks_guard_looser_rules() -> None:
    """With the defaults the 25% gap already implies z >= 6.7 against the 5% floor, and a third is never
    less than one rank of two; an operator who loosens the gap or the share still gets both guards."""
    from fleet.inspector_compare import Rules

    loose = Rules(gap=0.05)
    tight = {r: 100.0 + r * 0.01 for r in range(15)}  # MAD 0.04 GB/s
    assert slow_ranks(_flat({**tight, 15: 110.0}), rules=loose) == []  # 10% over identical peers: z 2 on the floor
    assert [f["rank"] for f in slow_ranks(_flat({**tight, 15: 125.0}), rules=loose)] == [15]
    assert slow_ranks(_flat({0: 100.0, 1: 300.0}), rules=Rules(max_share=1.0)) == []  # two ranks: no peers' median


def test_two_populations_are_not_one_straggler() -> None:
    """Six of sixteen ranks (a node and a half) late alike: more than a third stand out, nobody is named;
    five of sixteen are."""
    assert slow_ranks(_flat({r: 160.0 if r < 6 else 100.0 + r * 0.1 for r in range(16)})) == []
    assert len(slow_ranks(_flat({r: 160.0 if r < 5 else 100.0 + r * 0.1 for r in range(16)}))) == 5


def test_the_rank_that_waits_longest_is_nobody_s_straggler() -> None:
    """One rank arrives first (less work, a faster device) and spends longest in the kernel: the lowest bus
    bandwidth of the communicator, and the one rank that slows nobody down."""
    summaries = _ring(16, early={4: 800.0})
    r4 = next(s for s in summaries if s["rank"] == 4)["ops"][0]["busbw_gbs"]
    assert r4 < 0.7 * min(s["ops"][0]["busbw_gbs"] for s in summaries if s["rank"] != 4)
    assert slow_ranks(summaries) == []


def test_a_slow_link_inside_a_ring_shows_only_against_other_communicators() -> None:
    """A degraded NVLink on node 5 slows its whole tensor-parallel ring: every rank of it alike, so no rank
    stands out within it, but the communicator stands out against the other nodes' identical ones."""
    tp: list[dict[str, Any]] = []
    for node in range(8):
        comm = f"0x{0xa0 + node:x}"
        summaries = _ring(8, comm=comm, seed=node, link_us=1600.0 if node == 5 else 1000.0)
        for s in summaries:
            s["hostname"] = f"gpu-{node}"
        assert slow_ranks(summaries) == []
        tp += summaries
    found = slow_communicators(tp)
    assert [(f["comm_id"], f["hosts"], f["late_arrival_in_comm"]) for f in found] == [("0xa5", ["gpu-5"], False)]
    assert slow_communicators([s for s in tp if s["comm_id"] != "0xa5"]) == []


def _pipeline(nranks: int, *, slow: frozenset[tuple[int, int]] = frozenset(), late_recv: frozenset[int] = frozenset(),
              seed: int = 0, steps: int = 40) -> list[dict[str, Any]]:
    """Stage i sends to stage i+1 (and receives from i-1): each transfer is timed on both ends; a slow path
    slows both ends, a receiver that posts late makes only the sender's kernel wait."""
    rnd = random.Random(seed)
    per_rank: dict[int, list[InspectorRecord]] = {r: [] for r in range(nranks)}
    for step in range(steps):
        for a in range(nranks - 1):
            b = a + 1
            t = 700.0 * (1.6 if (a, b) in slow else 1.0)
            wait = 900.0 if b in late_recv else 0.0
            ts = 10**15 + step * 10**6
            send = int((t + wait) * (1 + rnd.uniform(-0.04, 0.04)))
            recv = int(t * (1 + rnd.uniform(-0.04, 0.04)))
            per_rank[a].append(record("0x77", a, nranks, "Send", 16 << 20, send, ts, peer=b, pid=a + 1))
            per_rank[b].append(record("0x77", b, nranks, "Recv", 16 << 20, recv, ts, peer=a, pid=b + 1))
    return [summarize(recs)["comms"][0] for recs in per_rank.values()]


def test_a_slow_point_to_point_path_is_seen_from_both_ends() -> None:
    found = slow_ranks(_pipeline(8, slow=frozenset({(3, 4)})))
    assert [(f["kind"], f["rank"], f["ranks"]) for f in found] == [("slow_p2p_link", None, [3, 4])], found
    assert found[0]["evidence"][0]["src"] == 3 and found[0]["evidence"][0]["dst"] == 4


def test_the_rank_common_to_two_slow_paths_is_named() -> None:
    found = slow_ranks(_pipeline(8, slow=frozenset({(3, 4), (4, 5)})))
    assert [(f["kind"], f["rank"], f["ranks"]) for f in found] == [("slow_p2p_link", 4, [3, 4, 5])], found


def test_a_late_receiver_is_no_slow_path() -> None:
    """Rank 4 posts its receive late: rank 3's Send waits (slow), rank 4's Recv is quick. One end only."""
    summaries = _pipeline(8, late_recv=frozenset({4}))
    send3 = next(o for s in summaries if s["rank"] == 3 for o in s["ops"] if o["op"] == "Send")
    assert send3["busbw_gbs"] < 0.6 * next(o for s in summaries if s["rank"] == 2 for o in s["ops"]
                                           if o["op"] == "Send")["busbw_gbs"]
    assert slow_ranks(summaries) == []
    for seed in range(10):
        assert slow_ranks(_pipeline(8, seed=seed)) == []


def test_too_few_samples_or_ranks_are_not_judged() -> None:
    assert slow_ranks(_ring(16, late={11: 600.0}, steps=10)) == []  # 10 < min_samples per rank
    assert slow_ranks(_ring(2, late={1: 600.0})) == []  # two ranks: no peers' median to stand out from


def test_summaries_from_messages_and_the_newest_per_process() -> None:
    ring = _ring(4, late={2: 700.0})
    msgs = [{"type": "NCCLInspectorSummary", "node": f"n{s['rank']}", "entity": f"nccl:h:{s['pid']}",
             "time": "2026-01-01T00:00:02Z", "details": {"comms": [s]}} for s in ring]
    stale = {**ring[2], "ops": []}
    msgs.append({"type": "NCCLInspectorSummary", "node": "n2", "entity": f"nccl:h:{ring[2]['pid']}",
                 "time": "2026-01-01T00:00:01Z", "details": {"comms": [stale]}})
    msgs.append({"type": "StragglerSignals", "node": "n9", "entity": "x", "details": {"comms": [stale]}})
    by_comm = comm_summaries(msgs)
    assert list(by_comm) == ["0x5b1e0c3f9a7d2e"] and len(by_comm["0x5b1e0c3f9a7d2e"]) == 4
    found = slow_ranks(by_comm["0x5b1e0c3f9a7d2e"])
    assert [(f["rank"], f["node"]) for f in found] == [(2, "n2")]


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                            st.sampled_from(["comm_id", "rank", "ops", "kind", "op", "size_lo", "n", "busbw_gbs",
                                             "peer", "bucket", "nranks", "x"]), inner, max_size=6), max_leaves=30)


@given(st.lists(_JSONISH, max_size=6))
def test_the_comparison_survives_any_input(summaries: list[Any]) -> None:
    slow_ranks(summaries)
    slow_communicators(summaries)
    comm_summaries(summaries)


@settings(max_examples=30)
@given(st.floats(0.01, 100.0), st.integers(0, 10))
def test_findings_do_not_depend_on_the_unit(scale: float, seed: int) -> None:
    ring = _ring(12, late={5: 500.0 + 50 * seed}, seed=seed)
    scaled = [{**s, "ops": [{**o, "busbw_gbs": o["busbw_gbs"] * scale} for o in s["ops"]]} for s in ring]
    assert [f["rank"] for f in slow_ranks(ring)] == [f["rank"] for f in slow_ranks(scaled)] == [5]


def test_the_fleet_straggler_watch_names_the_late_rank_from_inspector_summaries() -> None:
    """fleet/stragglers.py: NCCLInspectorSummary messages (on gna.signals.<node>.nccl_inspector) feed the
    correlator's straggler watch; the rank the others wait for becomes a straggler record on its node."""
    from fleet.stragglers import StragglerWatch

    ring = _ring(16, late={11: 600.0})
    watch = StragglerWatch()
    for s in ring:
        watch.add({"type": "NCCLInspectorSummary", "collector": "nccl_inspector", "node": f"gpu-{s['rank'] // 8}",
                   "entity": f"nccl:gpu-{s['rank'] // 8}:{s['pid']}", "time": "2026-01-01T00:00:02Z",
                   "details": {"comms": [s]}})
    (rec,) = watch.evaluate(1.0)
    assert (rec["node"], rec["entity"], rec["kind"], rec["status"]) == ("gpu-1", "nccl:gpu-1:1011", "rank", "open")
    assert rec["signals"][0]["signal"] == "late_arrival"
    assert watch.evaluate(2.0) == []  # no change, no record
