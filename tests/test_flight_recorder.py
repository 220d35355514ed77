"""PyTorch Flight Recorder dumps: real ones from torch 2.13 (tests/corpus/flight_recorder/), the older
layouts shaped from each release's serialisation code, and hostile files."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import pickle
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.nccl import flight_recorder as fr
from collectors.nccl.flight_recorder import FRDump, FRDumpError, load_dump, load_file, summarize

CORPUS = Path(__file__).resolve().parent / "corpus" / "flight_recorder"
DUMPS = sorted(p for p in CORPUS.iterdir() if "_rank_" in p.name)


def check_invariants(d: FRDump, max_entries: int = fr.DEFAULT_MAX_ENTRIES) -> None:
    assert len(d.entries) <= max_entries
    assert d.entries_dropped >= 0 and len(d.entries) <= d.entries_total - d.entries_dropped <= max_entries
    assert d.warnings >= 0
    assert len(d.pgs) <= fr.MAX_PGS and len(d.pg_status) <= fr.MAX_PGS
    for st_ in d.pg_status.values():
        enq, started, done = st_.last_enqueued, st_.last_started, st_.last_completed
        for v in (enq, started, done):
            assert v is None or v >= 0
        if done is not None and started is not None:
            assert done <= started
        if started is not None:
            assert enq is not None and started <= enq
        if done is not None:
            assert enq is not None and done <= enq
    for info in d.pgs.values():
        assert info.ranks is None or len(info.ranks) <= fr.MAX_PG_RANKS
        assert len(info.name) <= fr.MAX_STR and len(info.desc) <= fr.MAX_STR
    for e in d.entries:
        assert e.state in ("scheduled", "started", "completed")
        assert e.collective_seq_id >= 0 and len(e.profiling_name) <= 128
        assert len(e.frames) <= fr.MAX_FRAMES and len(e.input_sizes) <= fr.MAX_TENSORS
        assert all(len(t) <= fr.MAX_DIMS for t in e.input_sizes + e.output_sizes)
        assert e.duration_ms is None or (math.isfinite(e.duration_ms) and e.duration_ms >= 0)
    json.dumps(summarize(d))  # the summary is plain data a message can carry


def load_or_refuse(data: bytes, **kw: Any) -> FRDump | None:
    try:
        d = load_dump(data, **kw)
    except FRDumpError as e:
        assert e.reason
        return None
    check_invariants(d, kw.get("max_entries", fr.DEFAULT_MAX_ENTRIES))
    return d


# --- the real dumps -----------------------------------------------------------------------------

def test_corpus_is_what_make_dumps_says() -> None:
    meta = json.loads((CORPUS / "generated_with.json").read_text())
    assert meta["torch"] == "2.13.0+cpu"
    names = {p.name for p in DUMPS}
    assert names == {f"{s}_rank_{r}{x}" for s in ("hang", "wrap") for r in (0, 1) for x in ("", ".json")}
    for p in DUMPS:
        assert p.stat().st_size < 8192, "corpus dumps stay small"


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: p.name)
def test_every_corpus_dump_loads(path: Path) -> None:
    d = load_file(str(path))
    check_invariants(d)
    assert d.format == ("json" if path.suffix == ".json" else "pickle")
    assert d.version == "2.10"  # FlightRecorder.hpp version_val in 2.9-2.14
    assert d.rank == int(path.name.split("_")[-1].split(".")[0])
    assert d.warnings == 0 and d.entries_dropped == 0
    assert d.comm_lib_version == ""  # gloo records no library version
    first = d.entries[0]
    assert first.profiling_name.startswith("gloo:") and first.pg_desc == "default_pg" and first.pg_name == "0"
    assert first.input_dtypes == ("Float",) and first.thread_name == "python"
    assert first.timeout_ms in (60000,) and first.time_created_ns and first.time_created_ns > 10**18
    assert first.time_discovered_started_ns is None  # JSON's 0 and the pickle's None mean the same


def test_pickle_and_json_of_one_rank_agree() -> None:
    for stem in ("hang_rank_0", "hang_rank_1", "wrap_rank_0", "wrap_rank_1"):
        p, j = load_file(str(CORPUS / stem)), load_file(str(CORPUS / f"{stem}.json"))
        sp, sj = summarize(p), summarize(j)
        assert sp.pop("format") == "pickle" and sj.pop("format") == "json"
        assert sp == sj
        assert [e.__dict__ | {"frames": ()} for e in p.entries] == [e.__dict__ for e in j.entries]


def test_stack_traces_are_read_innermost_first() -> None:
    d = load_file(str(CORPUS / "hang_rank_0"))
    frames = d.entries[0].frames
    assert frames, "dumpDebuggingInfo includes stack traces"
    assert any(f.filename.endswith("make_dumps.py") and f.name == "hang" for f in frames)
    assert [e.frames for e in load_file(str(CORPUS / "wrap_rank_0")).entries] == [()] * 4


def test_hung_rank_and_behind_rank_are_visible() -> None:
    r0, r1 = load_file(str(CORPUS / "hang_rank_0")), load_file(str(CORPUS / "hang_rank_1"))
    s0, s1 = summarize(r0)["pgs"], summarize(r1)["pgs"]
    # rank 0 waits in its 6th default-PG collective, an all_reduce of 8 floats
    stuck = s0["0"]["first_not_completed"]
    assert stuck["collective_seq_id"] == 6 and stuck["op"] == "gloo:all_reduce" and stuck["state"] == "scheduled"
    assert s0["0"]["pending"] == 1 and s0["0"]["entries_last_completed"] == 5
    assert r0.entries[-1].input_sizes == ((8,),) and r0.entries[-1].retired is False
    # rank 1 never enqueued it: it is the rank behind
    assert s1["0"]["first_not_completed"] is None and s1["0"]["entries_last_enqueued"] == 5
    # torch's own counters say the same (they also count the send/recv, which gloo does not record)
    assert (s0["0"]["last_enqueued"], s0["0"]["last_completed"]) == (7, 6)
    assert (s1["0"]["last_enqueued"], s1["0"]["last_completed"]) == (6, 6)
    assert s0["0"]["last_started"] is None  # -1: no start events
    assert s0["1"] == s1["1"] and s0["1"]["desc"] == "tp" and s0["1"]["pending"] == 0
    assert fr.behind_ranks([r0, r1]) == {"0": {"collective_seq_id": 6, "behind": [1],
                                               "last_enqueued": {"0": 6, "1": 5}}}
    assert fr.behind_ranks([load_file(str(CORPUS / "wrap_rank_0")), load_file(str(CORPUS / "wrap_rank_1"))]) == {}


def test_wrapped_ring_keeps_the_newest_entries() -> None:
    d = load_file(str(CORPUS / "wrap_rank_1"))
    assert [e.record_id for e in d.entries] == [6, 7, 8, 9]
    assert [e.collective_seq_id for e in d.entries] == [7, 8, 9, 10]
    assert all(e.done and e.input_sizes == ((2, 3),) for e in d.entries)
    s = summarize(d)["pgs"]["0"]
    assert s["last_enqueued"] == s["last_completed"] == 10 and s["first_not_completed"] is None


def test_entry_cap_keeps_the_newest() -> None:
    d = load_dump((CORPUS / "wrap_rank_0").read_bytes(), max_entries=2)
    assert [e.collective_seq_id for e in d.entries] == [9, 10]
    assert (d.entries_total, d.entries_dropped) == (4, 2)


# --- the layouts of older releases, from their serialisation code ----------------------------------
# Real dumps of these need a CUDA build (FR was ProcessGroupNCCL-only before 2.8); these dicts
# follow each tag's dump() field by field (docs/flight_recorder.md) and go through CPython's
# protocol-2 pickler, whose opcodes for dicts/lists/str/int/bool/None/tuples are torch's.

def _nccl_entry(seq: int, state: str, **extra: Any) -> dict[str, Any]:
    e = {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
         "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1_700_000_000_000_000_000 + seq,
         "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
         "state": state, "time_discovered_started_ns": None,
         "time_discovered_completed_ns": 1_700_000_000_000_100_000 + seq if state == "completed" else None,
         "retired": state == "completed", "is_p2p": False,
         "frames": [{"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2501}]}
    e.update(extra)
    return e


def test_torch_2_2_bare_list() -> None:
    # TraceUtils.h@v2.2.0 NCCLTraceBuffer::dump(): pickle_str(entries), keys seq_id / time_created_us
    entries = [{"pg_id": 0, "seq_id": s, "profiling_name": "nccl:all_reduce", "time_created_us": 1_700_000_000_000_000 + s,
                "input_sizes": [[4]], "output_sizes": [[4]], "state": st_, "retired": st_ == "completed",
                "frames": []} for s, st_ in ((1, "completed"), (2, "started"))]
    d = load_dump(pickle.dumps(entries, protocol=2))
    assert d.version is None and d.pg_status == {} and d.pgs == {}
    assert d.entries[1].time_created_ns == (1_700_000_000_000_000_000 + 2000)
    s = summarize(d)["pgs"]["0"]
    assert s["first_not_completed"]["collective_seq_id"] == 2 and s["first_not_completed"]["state"] == "started"
    assert s["entries_last_completed"] == 1 and s["last_enqueued"] is None


def test_torch_2_4_without_pg_status() -> None:
    # TraceUtils.h@v2.4.0: version "2.1", pg_config, entries; no pg_status, no timeout_ms
    doc = {"version": "2.1", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
           "entries": [_nccl_entry(1, "completed"), _nccl_entry(2, "scheduled")]}
    d = load_dump(pickle.dumps(doc, protocol=2))
    assert d.pgs["0"].ranks == (0, 1, 2, 3) and d.pgs["0"].size == 4
    s = summarize(d)["pgs"]["0"]
    assert s["ranks"] == [0, 1, 2, 3] and s["first_not_completed"]["collective_seq_id"] == 2
    assert d.entries[0].frames[0].line == 2501 and d.entries[0].timeout_ms is None


def test_torch_2_6_and_2_8_fields() -> None:
    # FlightRecorder.cpp (2.6, "2.4"): pg_status, timeout_ms; FlightRecorderDetail.hpp@v2.8.0 ("2.9"):
    # nccl_version, thread_name/thread_id; NCCL "retired but not completed" = timed out
    doc = {"version": "2.9", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
           "nccl_version": "2.26.2", "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": 2,
                                                           "last_completed_collective": 2}},
           "entries": [_nccl_entry(1, "completed", timeout_ms=600000, duration_ms=0.25, thread_name="pt_main"),
                       _nccl_entry(2, "completed"), _nccl_entry(3, "scheduled", retired=True)],
           "nccl_comm_state": {"abc": {"status": "ok"}}}
    d = load_dump(pickle.dumps(doc, protocol=2), rank=5)
    assert d.comm_lib_version == "2.26.2" and d.rank == 5 and d.warnings == 0
    assert d.entries[0].duration_ms == 0.25 and d.entries[0].thread_name == "pt_main"
    assert not d.entries[2].done, "a retired NCCL entry that never completed timed out"
    s = summarize(d)["pgs"]["0"]
    assert (s["last_enqueued"], s["last_started"], s["last_completed"]) == (3, 2, 2)
    assert s["first_not_completed"]["collective_seq_id"] == 3


def test_newer_python_protocols_also_load() -> None:
    doc = json.loads((CORPUS / "hang_rank_0.json").read_bytes())
    for proto in (3, 4, 5):
        d = load_dump(pickle.dumps(doc, protocol=proto))
        assert summarize(d)["pgs"]["0"]["first_not_completed"]["collective_seq_id"] == 6


# --- hostile files -------------------------------------------------------------------------------

class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.cmd,))


class _Eval:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (eval, ("__import__('os').system('true')",))


@pytest.mark.parametrize("proto", [2, 4, 5])
def test_malicious_reduce_is_refused_without_running(tmp_path: Path, proto: int) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_System(f"touch {marker}")]}, protocol=proto)
    with pytest.raises(FRDumpError) as ei:
        load_dump(payload)
    assert "posix.system" in ei.value.reason or "STACK_GLOBAL" in ei.value.reason
    # the second layer alone refuses too: find_class, not only the opcode scan
    if proto == 2:
        with pytest.raises(FRDumpError, match=r"global posix\.system"):
            fr._Unpickler(io.BytesIO(payload)).load()
    assert not marker.exists()
    with pytest.raises(FRDumpError, match=r"__builtin__\.eval"):  # protocol 2 writes Python 2's module name
        load_dump(pickle.dumps(_Eval(), protocol=2))
    with pytest.raises(FRDumpError, match=r"global builtins\.eval"):
        load_dump(_global_call("builtins", "eval", _ustr("__import__('os').system('touch " + str(marker) + "')") + b"\x85"))
    assert not marker.exists()


def _global_call(module: str, name: str, args: bytes) -> bytes:
    # {"version": "2.10", "entries": [ GLOBAL(module.name)(*args) ]}
    head = b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries]("
    return head + b"c" + module.encode() + b"\n" + name.encode() + b"\n" + args + b"Reu."


def _ustr(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def test_torch_helpers_run_only_with_the_arguments_torch_gives_them() -> None:
    good = load_dump(_global_call("torch.jit._pickle", "build_intlist", b"](K\x01K\x02e\x85"))
    assert good.entries == () and good.warnings == 1  # [1, 2] is no entry: counted, skipped
    tag = load_dump(_global_call("torch.jit._pickle", "restore_type_tag", b"}" + _ustr("Dict[str, Any]") + b"\x86"))
    assert tag.warnings == 1
    odd = [
        _global_call("torch.jit._pickle", "build_intlist", _ustr("rm -rf /") + b"\x85"),  # a string
        _global_call("torch.jit._pickle", "build_intlist", b"](K\x01e](K\x02e\x86"),  # two lists
        _global_call("torch.jit._pickle", "build_intlist", b")"),  # no argument
        _global_call("torch.jit._pickle", "build_boollist", b"](K\x01e\x85"),  # ints for bools
        _global_call("torch.jit._pickle", "restore_type_tag", _ustr("x") + _ustr("y") + b"\x86"),
        _global_call("torch.jit._pickle", "build_intlist", b"N"),  # args not a tuple
    ]
    for data in odd:
        with pytest.raises(FRDumpError):
            load_dump(data)
    for module, name in (("torch.jit._pickle", "build_tensorlist"), ("torch._utils", "_rebuild_tensor_v2"),
                         ("torch.jit._pickle", "build_tensor_from_id"), ("subprocess", "Popen"),
                         ("torch.jit._pickle", "build_intlist\nc")):
        with pytest.raises(FRDumpError):
            load_dump(_global_call(module, name, b"](e\x85"))


@pytest.mark.parametrize("data,why", [
    (b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 28) + b".", "memo index"),  # 2 GiB memo table in CPython
    (b"\x80\x02Nh\x05.", "memo slot"),
    (b"\x80\x02U\x03abc.", "SHORT_BINSTRING"),
    (b"\x80\x02C\x03abc.", "SHORT_BINBYTES"),
    (b"\x80\x02K\x01Q.", "BINPERSID"),
    (b"\x80\x02\x82\x01.", "EXT1"),
    (b"\x80\x02}b.", "BUILD"),
    (b"\x80\x06N.", "protocol"),
    (b"\x80\x02" + b"(" * 100 + b"N" + b"t" * 100 + b".", "deeper"),
    (b"(lp0\n.", "neither"),  # protocol 0: torch never writes it
])
def test_hostile_opcodes_are_refused_before_unpickling(data: bytes, why: str) -> None:
    t = time.monotonic()
    with pytest.raises(FRDumpError, match=why):
        load_dump(data)
    assert time.monotonic() - t < 1.0


def test_large_claims_are_refused_without_allocating(tmp_path: Path) -> None:
    for data in (b"\x80\x02X" + struct.pack("<I", 100 << 20) + b"abc.",  # a 100 MB string in 10 bytes
                 b"\x80\x02\x8a\xff" + b"\x01" * 10 + b".",  # LONG1 claiming 255 bytes
                 b"\x80\x04\x95" + struct.pack("<Q", 100 << 20) + b"N."):  # a 100 MB frame
        with pytest.raises(FRDumpError):
            load_dump(data)
    with pytest.raises(FRDumpError, match="over the"):
        load_dump(b"{" + b" " * 1024 + b"}", max_bytes=1024)
    big = tmp_path / "nccl_trace_rank_0"
    with big.open("wb") as f:
        f.truncate(100 << 20)  # sparse: the size alone must refuse it
    t = time.monotonic()
    with pytest.raises(FRDumpError, match="over the"):
        load_file(str(big))
    assert time.monotonic() - t < 1.0
    many = pickle.dumps({"version": "2.10", "entries": [_nccl_entry(i, "completed") for i in range(1, 5001)]},
                        protocol=2)
    d = load_dump(many, max_entries=100)
    assert len(d.entries) == 100 and d.entries_total == 5000 and d.entries[0].collective_seq_id == 4901


def test_truncated_dumps_are_refused() -> None:
    for path in DUMPS:
        data = path.read_bytes()
        for n in range(0, len(data), 7):
            with pytest.raises(FRDumpError):
                load_dump(data[:n])


def test_json_variants() -> None:
    base = json.loads((CORPUS / "hang_rank_1.json").read_bytes())
    assert load_dump(b"\n  " + json.dumps(base).encode()).rank is None
    no_entries = {k: v for k, v in base.items() if k != "entries"}  # dump_json omits an empty list
    d = load_dump(json.dumps(no_entries).encode())
    assert d.entries == () and d.pg_status["0"].last_completed == 6
    for bad in (b"[]", b'{"a": 1}', b'{"version": 2.1, "entries": []}', b'{"version": "x", "entries": []}',
                b"{" * 100000, b'{"version": "2.10", "entries": {}}',
                json.dumps({"version": "2.10", "entries": [], "x": "\ud800"}).encode()[:-3]):
        with pytest.raises(FRDumpError):
            load_dump(bad)
    inf = load_dump(b'{"version": "2.10", "entries": [1e999999]}')  # an FR frame: its junk entry is counted
    assert inf.entries == () and inf.warnings == 1
    odd = dict(base, pg_status={"0": {"last_enqueued_collective": "5", "last_started_collective": "-1",
                                      "last_completed_collective": "9"},  # completes what it never enqueued
                                "x": {}, "1": {"last_enqueued_collective": "abc"},
                                "2": {"last_enqueued_collective": "4", "last_started_collective": "2",
                                      "last_completed_collective": "3"}})  # started lags (watchdog race)
    d = load_dump(json.dumps(odd).encode())
    assert set(d.pg_status) == {"2"} and d.warnings == 3
    assert d.pg_status["2"] == fr.PGStatus(4, 3, 3)


def test_malformed_entries_are_counted_and_skipped() -> None:
    good = _nccl_entry(1, "completed")
    bad_entries: list[Any] = [
        1, None, "x", {}, dict(good, state="finished"), dict(good, collective_seq_id=-1),
        dict(good, collective_seq_id=True), dict(good, profiling_name=7), {k: v for k, v in good.items() if k != "state"},
    ]
    doc = {"version": "2.10", "entries": [*bad_entries, good,
                                          dict(good, input_sizes="[1]", duration_ms=float("nan"), frames=[1])],
           "pg_config": {"0": {"name": "0", "desc": "d", "ranks": "0,1"}, 1: {}}}
    d = load_dump(pickle.dumps(doc, protocol=2))
    assert len(d.entries) == 2 and d.entries[1].input_sizes == () and d.entries[1].duration_ms is None
    assert d.pgs["0"].ranks is None
    assert d.warnings == len(bad_entries) + 3 + 2


def test_load_file_reads_only_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl_trace_rank_0.pipe"
    os.mkfifo(fifo)  # TORCH_NCCL_DEBUG_INFO_PIPE_FILE's trigger, beside the dumps: must not block
    with pytest.raises(FRDumpError, match="regular file"):
        load_file(str(fifo))
    with pytest.raises(FRDumpError, match="regular file"):
        load_file(str(tmp_path))
    link = tmp_path / "nccl_trace_rank_1"
    link.symlink_to(CORPUS / "hang_rank_1")
    with pytest.raises(FRDumpError, match="cannot open"):
        load_file(str(link))
    with pytest.raises(FRDumpError, match="cannot open"):
        load_file(str(tmp_path / "absent_rank_3"))
    assert fr.rank_from_path("/x/comm_lib_trace_rank_12") == 12 and fr.rank_from_path("/x/trace.json") is None


# --- where dumps go ------------------------------------------------------------------------------

def test_dump_locations_follow_each_release() -> None:
    assert fr.dump_files({"HOME": "/home/u", "RANK": "3"}) == [
        "/home/u/.cache/torch/comm_lib_trace_rank_3",  # 2.9+
        "/home/u/.cache/torch/nccl_trace_rank_3",  # 2.7-2.8
        "/tmp/nccl_trace_rank_3"]  # 2.2-2.6
    assert fr.dump_files({"XDG_CACHE_HOME": "/c"}, 0)[:2] == [
        "/c/torch/comm_lib_trace_rank_0", "/tmp/.cache/torch/comm_lib_trace_rank_0"]  # HOME unset: /tmp
    assert fr.dump_files({"TORCH_FR_DUMP_TEMP_FILE": "/d/fr_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/old_"}, 1) == [
        "/d/fr_1", "/d/old_1"]
    assert fr.dump_files({"TORCH_FR_DUMP_TEMP_FILE": "/d/fr_", "HOME": "/h"}, 1) == [
        "/d/fr_1", "/h/.cache/torch/nccl_trace_rank_1", "/tmp/nccl_trace_rank_1"]  # <= 2.7 ignore TORCH_FR_*
    assert fr.dump_files({"TORCH_FR_DUMP_TEMP_FILE": "/d/x.pkl", "TORCH_FR_DUMP_DYNAMIC_FILE_NAME": "True"}) == [
        "/d/x.pkl"]
    assert fr.dump_files({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "dumps/r"}, 2, cwd="/job") == ["/job/dumps/r2"]
    assert fr.dump_files({"RANK": "x"}) == [] and fr.dump_files({}) == []
    assert fr.buffer_size({"TORCH_FR_BUFFER_SIZE": "20", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 20
    assert fr.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}) == 2000 and fr.buffer_size({}) is None


# --- properties ----------------------------------------------------------------------------------

def _corpus_bytes() -> Iterator[bytes]:
    for p in DUMPS:
        yield p.read_bytes()


CORPUS_BYTES = list(_corpus_bytes())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape(data: bytes) -> None:
    load_or_refuse(data)
    load_or_refuse(b"\x80\x02" + data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(CORPUS_BYTES))), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                                                          min_size=1, max_size=8), st.integers(1, 8))
def test_mutated_dumps_never_escape(i: int, flips: list[tuple[int, int]], cap: int) -> None:
    data = bytearray(CORPUS_BYTES[i])
    for pos, val in flips:
        data[pos % len(data)] = val
    load_or_refuse(bytes(data), max_entries=cap)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True),
                    st.text(max_size=20))
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=12)
_seqv = st.one_of(st.integers(-3, 12), st.text(max_size=3), st.none())
_fr_entry = st.fixed_dictionaries({
    "profiling_name": st.one_of(st.text(max_size=200), _scalar), "state": st.sampled_from(["scheduled", "started",
                                                                                          "completed", "x", 1]),
    "collective_seq_id": _seqv, "pg_id": _seqv, "process_group": st.one_of(st.tuples(st.text(), st.text()), _value),
    "is_p2p": st.one_of(st.booleans(), _scalar), "retired": st.booleans(),
    "input_sizes": st.one_of(st.lists(st.lists(st.integers(-1, 5), max_size=20), max_size=70), _value),
    "frames": st.one_of(st.lists(st.fixed_dictionaries({"name": st.text(), "filename": st.text(),
                                                        "line": _scalar}), max_size=40), _value),
    "duration_ms": _scalar, "time_discovered_completed_ns": _scalar,
})
_status = st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), st.fixed_dictionaries({
    "last_enqueued_collective": _seqv, "last_started_collective": _seqv, "last_completed_collective": _seqv}),
    max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.lists(_fr_entry, max_size=12), _status, st.dictionaries(st.text(max_size=4), _value, max_size=3),
       st.booleans(), st.integers(1, 6))
def test_shaped_dumps_keep_their_invariants(entries: list[dict[str, Any]], status: dict[Any, Any],
                                            config: dict[str, Any], as_json: bool, cap: int) -> None:
    doc = {"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries}
    if as_json:
        try:
            data = json.dumps(doc, allow_nan=True).encode()
        except (TypeError, ValueError):
            return
    else:
        data = pickle.dumps(doc, protocol=2)
    d = load_or_refuse(data, max_entries=cap)
    assert d is not None  # the frame is an FR dump: only fields may be skipped
    assert d.entries_total == len(entries) and d.entries_dropped == max(0, len(entries) - cap)
    for key, pg in summarize(d)["pgs"].items():
        f = pg["first_not_completed"]
        assert (f is None) == (pg["pending"] == 0)
        if f is not None:  # it is the oldest entry of its group that is not done (entries without a record_id
            # may share (record_id, seq): found by its group and its place, not by those two)
            first = next(e for e in d.entries if not e.done
                         and (str(e.pg_id) if e.pg_id is not None else (e.pg_name or "?")) == key)
            assert (first.record_id, first.collective_seq_id, first.profiling_name) == (
                f["record_id"], f["collective_seq_id"], f["op"])


# --- torch itself ----------------------------------------------------------------------------------

def _torch_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed in this interpreter (the project venv has none; make_dumps.py documents the venv)"
    import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch build has no gloo backend"
    return None


@pytest.mark.timeout(300)
@pytest.mark.skipif(_torch_reason() is not None, reason=_torch_reason() or "")
def test_torch_regenerates_the_corpus(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(CORPUS / "make_dumps.py"), str(tmp_path)], check=True, timeout=280)
    for stem in ("hang_rank_0", "hang_rank_1", "wrap_rank_0", "wrap_rank_1"):
        fresh, kept = summarize(load_file(str(tmp_path / stem))), summarize(load_file(str(CORPUS / stem)))
        for s in (fresh, kept):
            for pg in s["pgs"].values():
                if pg["first_not_completed"]:
                    pg["first_not_completed"]["time_created_ns"] = 0
        assert fresh == kept
