"""Issue 27 (4): NCCL's repeated lines are counted, not decoded (collectors/nccl/repeats.py), and nothing the
collector concludes changes: a transport change mid-job is still seen, every state, count, message and sample is
the one decoding every line gives."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors.nccl import plugin as plugin_mod
from collectors.nccl.line import parse_line
from collectors.nccl.matching import Match, match_or_reject
from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
from collectors.nccl.prefilter import REPEATING, candidate_lines, engine
from collectors.nccl.process import ProcessState
from collectors.nccl.repeats import ZEROS, Split
from gna_sdk.hostroot import HostRoot
from tests.conftest import Sink

HOST = "gpu-7"
ENGINES = ["re"] + [e for e in ("re2", "hyperscan", "hyperscan-wheel") if engine(e) is not None]


def _root(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text(f"{HOST}\n")
    (root / "var/log/nccl").mkdir(parents=True)
    for name, text in files.items():
        (root / "var/log/nccl" / name).write_text(text)
    return root


def _collector(root: Path, sink: Sink, facts: FactStore | None = None, **settings: Any) -> NCCLLogsCollector:
    """The collector over ``root``'s NCCL logs on an IB node with NVLink (``settings``: the rest of its config)."""
    em = CollectorEmitter("n", "nccl_logs", sink, ConditionTracker(None), facts=facts or FactStore())
    return NCCLLogsCollector(NCCLLogsConfig(globs=["/var/log/nccl/*.log"], expect_ib="yes", nvlink="yes",
                                            flight_recorder=False, **settings), HostRoot(str(root)), em)


async def _ingest(root: Path, *, repeats: bool = True, chunk: int = 1 << 20, max_line: int = 65536,
                  scanner: str = "auto") -> tuple[NCCLLogsCollector, Sink, int]:
    """The collector over ``root``'s logs; ``repeats=False``: every candidate line decoded (no line counted).
    Also returns how many lines were decoded (parse_line calls)."""
    sink = Sink()
    c = _collector(root, sink, chunk_bytes=chunk, max_line=max_line, scanner=scanner, gdr_available="yes")
    if not repeats:
        def everything(data: bytes, base: int, _hits: list[int], max_line: int, *_a: Any) -> Split:
            return Split(candidate_lines(data, base, max_line=max_line, engine=scanner))
        c.repeats.split = everything  # type: ignore[method-assign]
    decoded = 0
    real = plugin_mod.parse_line

    def counting(*a: Any, **kw: Any) -> Any:
        nonlocal decoded
        decoded += 1
        return real(*a, **kw)

    plugin_mod.parse_line = counting  # type: ignore[assignment]
    try:
        await c.check()
    finally:
        plugin_mod.parse_line = real
    return c, sink, decoded


def _state(st_: ProcessState) -> dict[str, Any]:
    d = dataclasses.asdict(st_)
    d.pop("last_seen")
    d.pop("judged")  # when its conditions were last evaluated: bookkeeping, not a conclusion
    d.pop("tallied")
    return d


def _conclusions(c: NCCLLogsCollector, sink: Sink) -> dict[str, Any]:
    """Everything the collector concluded: messages (less their time-derived id and stamp), process states,
    counts and samples."""
    msgs = [{k: v for k, v in msgspec.structs.asdict(m).items() if k not in ("id", "time")} for m in sink.messages]
    return {"messages": msgs, "procs": {k: _state(v) for k, v in c.procs.items()},
            "order": list(c.procs), "relayed": {k: _state(v) for k, v in c.relayed.items()},
            "matched": c.lines_matched, "rejected": c.rejected, "foreign": c.foreign_lines,
            "unattributed": c.unattributed, "relay_dropped": c.relay_dropped, "skipped": dict(c.emit.skipped),
            "local": sorted(c.file_local), "foreign_files": sorted(c.file_foreign)}


def _channel(pid: int, tail: str, *, ch: int = 0, host: str = HOST, send: bool = True) -> str:
    d = "[send]" if send else "[receive]"
    return f"{host}:{pid}:{pid + 3} [0] NCCL INFO Channel {ch:02d}/0 : 0[0] -> 8[0] {d} via NET/{tail}"


# -- a transport change mid-job is seen -----------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1 << 20, 4096])
async def test_a_transport_change_mid_job_is_still_seen(tmp_path: Path, chunk: int) -> None:
    """Hundreds of IB/GDRDMA channel lines (counted after the first), then a channel via NET/Socket, then IB
    without GDRDMA, then GDRDMA again: the later kinds are new keys, decoded when first seen, and every count is
    the one decoding every line gives -- in one chunk and across chunks."""
    lines = [f"{HOST}:11:12 [0] NCCL INFO Using network IB"]
    lines += [_channel(11, "IB/0/GDRDMA", ch=i % 32, send=i % 2 == 0) for i in range(400)]
    lines += [_channel(11, "Socket/0", ch=3)]
    lines += [_channel(11, "IB/0/GDRDMA", ch=i % 32) for i in range(200)]
    lines += [_channel(11, "IB/1", ch=5), _channel(11, "IB/1", ch=6)]
    lines += [_channel(11, "IB/0/GDRDMA", ch=i % 32) for i in range(200)]
    root = _root(tmp_path, {f"{HOST}.11.log": "\n".join(lines) + "\n"})
    c, sink, decoded = await _ingest(root, chunk=chunk)
    st_ = c.procs[f"{HOST}:11"]
    assert st_.channel_nets == {"IB", "Socket"} and st_.socket_channels == 1 and st_.non_gdr_channels == 2
    assert st_.channel_devs == {0, 1} and st_.direct_devs == {0, 1}
    assert c.lines_matched == len(lines)
    fired = sink.of("NCCLNoGDRDMA")
    assert fired and fired[0].details["channels_without_gdrdma"] >= 1
    assert decoded < 40 if chunk == 1 << 20 else decoded < len(lines) // 4  # counted, not decoded
    c2, sink2, decoded2 = await _ingest(root, chunk=chunk, repeats=False)
    assert decoded2 >= len(lines)
    assert _conclusions(c, sink) == _conclusions(c2, sink2)


async def test_the_last_using_network_wins_whether_counted_or_decoded(tmp_path: Path) -> None:
    """"Using network" sets the transport: a repeat after another value sets it back, in its place."""
    for seq, want in ((["IB", "Socket", "IB"], "IB"), (["IB", "Socket", "IB", "Socket"], "Socket"),
                      (["Socket", "IB", "IB", "IB"], "IB"), (["IB", "IB", "Socket"], "Socket")):
        for chunk in (1 << 20, 64):
            lines = [f"{HOST}:5:6 [0] NCCL INFO Using network {n}" for n in seq]
            lines += [_channel(5, "IB/0/GDRDMA", ch=i) for i in range(3)]
            root = _root(tmp_path / f"{'-'.join(seq)}-{chunk}", {f"{HOST}.5.log": "\n".join(lines) + "\n"})
            c, sink, _ = await _ingest(root, chunk=chunk)
            assert c.procs[f"{HOST}:5"].net == want, (seq, chunk)
            c2, sink2, _ = await _ingest(root, chunk=chunk, repeats=False)
            assert _conclusions(c, sink) == _conclusions(c2, sink2)


# -- counted lines leave exactly the state decoded ones do ------------------------------------------------------

TAILS = ["IB/0/GDRDMA", "IB/3", "IB/2(17)/GDRDMA", "Socket/0", "IBext_v8/7/GDRDMA", "IB/0/GDRDMA(PCI)",
         "IB/1/GDRDMA/Shared", "IB/12345678901/GDRDMA", "IB/0/" + "x" * 70, "IB/0/GDRDMAFailures:"]
ODD = [
    "[1,0]<stdout>:{host}:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",  # launcher
    "[2026-12-01 10:00:00] {host}:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
    "{host}:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 8[1b000] [send] via NET/IB/0/GDRDMA",  # busId hex
    "{host}:{pid}:9 [0] NCCL INFO Channel 00000000000/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",  # past bound
    "{host}:{pid}:12345678 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",  # tid past bound
    "{host}:{pid}:9 [0] transport/net.cc:1 NCCL WARN Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
    "{host}:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\r",
    "{host}:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA NCCL WARN boom",
    "Failures:{pid}:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",  # a marker as host
    "{host}:{pid}:9 [0] NCCL INFO Ring 00 : 0 -> 8 [send] via NET/IB/0",  # 2.4
    "{host}:{pid}:9 [0] NCCL INFO Channel 01/1 : 0[0] -> 8[0] [send] via NET/IB/0(3)/GDRDMA via NET/Socket/0",
    "{host}:{pid}:9 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.1<0>",
    "{host}:{pid}:9 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/RoCE ; OOB eth0:10.0.0.1<0>",
    "{host}:{pid}:9 [0] NCCL INFO NET/IB : No device found.",
    "{host}:{pid}:9 [0] NCCL INFO Using network Socket",
    "{host}:{pid}:9 [0] NCCL INFO Using network IB",
    "{host}:{pid}:9 [0] NCCL INFO ncclCommInitRank comm 0x55d0c8a{k}0 rank {k} nranks 16 cudaDev 0 nvmlDev 0 "
    "busId 18000 commId 0x8b1f2e3d4c5b6a7{k} - Init COMPLETE",
    "{host}:{pid}:9 [0] NCCL INFO comm 0x55d0c8a{k}0 rank {k} nranks 16 cudaDev 0 busId 18000 - Init COMPLETE",
    "{host}:{pid}:9 [0] misc/socket.cc:50 NCCL WARN socketProgressOpt: Connection closed by remote peer",
    "{host}:{pid}:9 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
    "[rank{k}]:[E1203 10:30:00.1 77 ProcessGroupNCCL.cpp:632] [Rank {k}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4712, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
    "milliseconds before timing out.",
    "[rank0]: step 10 | loss 2.3 | tokens/s 412345",
]


def _log(seed: int, n: int) -> str:
    rnd = random.Random(seed)
    hosts = [HOST, HOST, HOST, "gpu-8", "x" * 65]
    out = []
    for _ in range(n):
        host, pid = rnd.choice(hosts), rnd.choice((11, 12, 4_000_000))
        if rnd.random() < 0.6:
            out.append(_channel(pid, rnd.choice(TAILS), ch=rnd.randrange(40), host=host, send=rnd.random() < 0.5))
        else:
            out.append(rnd.choice(ODD).format(host=host, pid=pid, k=rnd.randrange(3)))
    return "\n".join(out) + "\n"


# one seed in the default run (the suite's 10-minute budget), the others with the slow ones (make test-slow)
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in range(1, 4))])
async def test_the_same_conclusions_as_decoding_every_line(tmp_path: Path, seed: int) -> None:
    """Random logs of channel lines (this node's and another's, kinds that change state, lines past their
    bounds, with a launcher's prefix, a WARN, two needles, a marker) and the lines around them, in one file and
    in a job-wide one, in chunks of every size: what counting concludes is what decoding every line does."""
    root = _root(tmp_path, {f"{HOST}.11.log": _log(seed, 1500), "job.log": _log(seed + 100, 600),
                            f"{HOST}.12.log": _log(seed + 200, 300)})
    for chunk in (1 << 20, 997, 150):
        for scanner in ENGINES:
            c, sink, decoded = await _ingest(root, chunk=chunk, scanner=scanner)
            c2, sink2, decoded2 = await _ingest(root, chunk=chunk, scanner=scanner, repeats=False)
            assert _conclusions(c, sink) == _conclusions(c2, sink2), (chunk, scanner)
            assert decoded <= decoded2
            if chunk == 1 << 20:
                assert decoded < decoded2 * 0.8  # lines were counted


async def test_a_short_max_line_and_a_pod_log_decode_every_line(tmp_path: Path) -> None:
    root = _root(tmp_path, {f"{HOST}.11.log": _log(7, 400)})
    c, sink, _ = await _ingest(root, max_line=60)
    c2, sink2, _ = await _ingest(root, max_line=60, repeats=False)
    assert _conclusions(c, sink) == _conclusions(c2, sink2)


async def test_a_process_that_ended_is_tracked_anew(tmp_path: Path) -> None:
    """A (who, key) remembered for a process the collector forgot is not counted onto the old state."""
    text = "\n".join(_channel(11, "IB/0", ch=i) for i in range(50)) + "\n"
    root = _root(tmp_path, {f"{HOST}.11.log": text})
    c, _sink, _ = await _ingest(root)
    old = c.procs.pop(f"{HOST}:11")  # as collect() forgets an ended process
    assert old.non_gdr_channels == 50 and any(c.repeats.known)
    (root / f"var/log/nccl/{HOST}.11.again.log").write_text(text)
    await c.check()
    new = c.procs[f"{HOST}:11"]
    assert new is not old and new.non_gdr_channels == 50 and old.non_gdr_channels == 50


# -- the shapes: every line a rule's repeat matches decodes to that rule, and its key decides the state --------

def _digits(data: bytes, rnd: random.Random) -> bytes:
    """Another line of the same digit shape: each digit replaced at random, but the 0 of "0x" (a literal digit of
    a key: Rule.repeat; its text is the first line's, which was decoded)."""
    return bytes(rnd.choice(b"0123456789") if 48 <= b <= 57 and data[i + 1 : i + 2] != b"x" else b
                 for i, b in enumerate(data))


@pytest.mark.parametrize("rule", REPEATING, ids=lambda r: r.name)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_line_a_repeat_shape_matches_decodes_to_its_rule(rule: Any, data: st.DataObject) -> None:
    assert rule.repeat is not None and rule.tally is not None
    shape = data.draw(st.from_regex(rule.repeat, fullmatch=True))
    seed = data.draw(st.integers(0, 2**32))
    rnd = random.Random(seed)
    line = _digits(shape, rnd)
    m = rule.repeat.fullmatch(line.translate(ZEROS))
    assert m is not None
    x, y = m.end("who"), m.start("key")
    got = match_or_reject(parse_line(0, line))
    assert isinstance(got, Match) and got.rule is rule, (line, got)
    host, _, pid = line[:x].rpartition(b":")
    assert (got.line.level, got.line.host, got.line.pid) == ("INFO", host.decode(), int(pid))
    # another line of the same writer and key (its middle's digits drawn again): the same state after n of them
    other = line[:x] + _digits(line[x:y], rnd) + line[y:]
    got2 = match_or_reject(parse_line(0, other))
    assert isinstance(got2, Match) and got2.rule is rule
    n = rnd.randrange(1, 5)
    a, b = ProcessState("h", 1, "f"), ProcessState("h", 1, "f")
    assert rule.update is not None
    rule.update(a, got.fields)
    rule.update(b, got.fields)
    for _ in range(n):
        assert rule.update(a, got2.fields) is False  # a repeat is no news
    b.tally(rule, got.fields, n)
    assert _state(a) == _state(b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"x via NET/IB/0/GDRDMA", b"Using network IB", b"NCCL WARN y", b"via SHM/",
                                 b"Init COMPLETE", b"NET/IB : Using", b"step 1", b"\n", b"\r\n", b" "]),
                max_size=40))
def test_every_engine_hits_the_candidate_lines(parts: list[bytes]) -> None:
    """prefilter.hits (what repeats.py reads) holds a hit on exactly the lines candidate_lines gives, with any
    engine; a hit's kind is its needle's (a repeating rule's needle: not 0)."""
    from collectors.nccl.prefilter import KIND_BITS, NEEDLE_KIND, hits
    data = b"".join(parts)
    for name in ENGINES:
        starts = sorted({data.rfind(b"\n", 0, (h >> KIND_BITS) - 1) + 1 for h in hits(data, name)})
        assert starts == [off for off, _raw in candidate_lines(data, 0, engine=name)], name
    for name in ("hyperscan", "hyperscan-wheel"):
        if name not in ENGINES:
            continue
        for h in hits(data, name):
            end, kind = h >> KIND_BITS, h & ((1 << KIND_BITS) - 1)
            assert kind == next(NEEDLE_KIND[n] for n in NEEDLE_KIND if data[:end].endswith(n))
    if "hyperscan" in ENGINES and "hyperscan-wheel" in ENGINES:
        assert hits(data, "hyperscan") == hits(data, "hyperscan-wheel"), "the system library's and the wheel's"


def _live(root: Path, *, sink: Sink, facts: FactStore, chunk: int = 4096) -> NCCLLogsCollector:
    """A collector reading ``root``'s logs from their start, chunk by chunk, as ``pump`` reads them live."""
    c = _collector(root, sink, facts, chunk_bytes=chunk)
    c.tailer.state_file = None
    c.tailer.rescan()
    for tf in c.tailer.files.values():
        tf.offset = 0
    return c


def _append(root: Path, name: str, lines: list[str]) -> None:
    with open(root / "var/log/nccl" / name, "a") as fh:
        fh.write("\n".join(lines) + "\n")


async def test_counted_repeats_are_not_judged_again_until_the_node_changes(tmp_path: Path) -> None:
    """A chunk that only counted repeats of lines already applied judges nobody again (the evaluation would
    repeat the last one) -- until a fact it reads changes: GPUDirect RDMA found on the node after the job's
    non-GDR channels were counted fires NCCLNoGDRDMA at the next chunk, though that chunk only counts."""
    facts = FactStore()
    facts.set("kernel.modules", {"gpudirect_available": False})
    sink = Sink()
    lines = [f"{HOST}:11:12 [0] NCCL INFO Using network IB"]
    lines += [_channel(11, "IB/0", ch=i % 32, send=i % 2 == 0) for i in range(600)]  # no /GDRDMA
    root = _root(tmp_path, {f"{HOST}.11.log": "\n".join(lines) + "\n"})
    c = _live(root, sink=sink, facts=facts)
    evaluated = 0
    real = c._evaluate

    async def counting(*a: Any, **kw: Any) -> bool:
        nonlocal evaluated
        evaluated += 1
        return await real(*a, **kw)

    c._evaluate = counting  # type: ignore[method-assign]
    await c.tailer.pump(c._handle)
    assert c.lines_matched == len(lines) and (root / f"var/log/nccl/{HOST}.11.log").stat().st_size > 10 * 4096
    assert evaluated <= 2, evaluated  # the chunks that decoded a line, not the ~10 that only counted
    assert not sink.of("NCCLNoGDRDMA")  # the node has no GPUDirect RDMA: nothing to blame
    facts.set("kernel.modules", {"gpudirect_available": True})
    _append(root, f"{HOST}.11.log", [_channel(11, "IB/0", ch=i % 32) for i in range(40)])
    await c.tailer.pump(c._handle)
    fired = sink.of("NCCLNoGDRDMA")
    assert fired and fired[0].status == "firing" and fired[0].details["channels_without_gdrdma"] > 600


async def test_a_process_environment_found_later_is_judged_at_a_counting_chunk(tmp_path: Path) -> None:
    """NCCL_IB_HCA read from a process's environment (nccl_env's fact) after its lines were counted: the next
    chunk only counts repeats, and the prefix match it reveals (mlx5_1 selects mlx5_10 too) is still judged."""
    facts = FactStore()
    sink = Sink()
    lines = [f"{HOST}:11:12 [0] NCCL INFO Using network IB",
             f"{HOST}:11:12 [0] NCCL INFO NET/IB : Using [0]mlx5_1:1/IB [1]mlx5_10:1/IB ; OOB ib0:10.0.0.1<0>"]
    lines += [_channel(11, f"IB/{i % 2}/GDRDMA", ch=i % 32) for i in range(400)]
    root = _root(tmp_path, {f"{HOST}.11.log": "\n".join(lines) + "\n"})
    c = _live(root, sink=sink, facts=facts)
    await c.tailer.pump(c._handle)
    assert not sink.of("NCCLHCASelection")
    facts.set("nccl_env.ib_hca", {"11": "mlx5_1"})
    _append(root, f"{HOST}.11.log", [_channel(11, "IB/0/GDRDMA", ch=i % 32) for i in range(40)])
    await c.tailer.pump(c._handle)
    fired = sink.of("NCCLHCASelection")
    assert fired and fired[0].reason == "PrefixMatch" and fired[0].details["unintended"] == ["mlx5_10"]


def test_every_fact_the_collector_reads_is_judged_or_said_not_to_be() -> None:
    """A process is judged again when a fact its conditions read changed (plugin._world): every facts key the
    collector reads is NodeFacts' (its values are in the stamp), one of JUDGED_FACTS, or one no condition reads."""
    import ast

    node_facts = {"infiniband.ports", "kernel.modules", "nvml.devices"}  # NodeFacts: rdma, gdr, nvlink
    not_judged = {"kernel.oom_kills"}  # a crash's attribution (events), no condition
    read: set[str] = set()
    for path in Path(plugin_mod.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        stamp = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_world"
                 for n in ast.walk(f)}  # the stamp itself reads JUDGED_FACTS by name
        for node in ast.walk(tree):
            if (id(node) not in stamp and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "facts"):
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path}: a facts key not a literal"
                read.add(node.args[0].value)
    assert read - node_facts - not_judged == set(plugin_mod.JUDGED_FACTS)


async def test_a_chunk_refused_is_judged_when_read_again(tmp_path: Path) -> None:
    """The bus refuses the condition a chunk's first non-GDR channel brings: the chunk is read again, its lines
    now counted repeats of a known key -- and the condition still fires (a refused evaluation is no judgement)."""
    facts = FactStore()
    facts.set("kernel.modules", {"gpudirect_available": True})
    sink = Sink()
    lines = [f"{HOST}:11:12 [0] NCCL INFO Using network IB"]
    lines += [_channel(11, "IB/0/GDRDMA", ch=i % 32) for i in range(100)]
    root = _root(tmp_path, {f"{HOST}.11.log": "\n".join(lines) + "\n"})
    c = _live(root, sink=sink, facts=facts)
    await c.tailer.pump(c._handle)
    _append(root, f"{HOST}.11.log", [_channel(11, "IB/0", ch=i % 32) for i in range(40)])
    sink.accept = False
    await c.tailer.pump(c._handle)  # refused: the chunk stays to be read again
    assert not sink.of("NCCLNoGDRDMA")
    sink.accept = True
    await c.tailer.pump(c._handle)
    assert [m.status for m in sink.of("NCCLNoGDRDMA")] == ["firing"]


_VOCAB = [
    f"{HOST}:11:12 [0] NCCL INFO Using network IB",
    f"{HOST}:11:12 [0] NCCL INFO Using network Socket",
    f"{HOST}:11:12 [0] NCCL INFO NET/IB : Using [0]mlx5_1:1/IB [1]mlx5_10:1/IB ; OOB ib0:10.0.0.1<0>",
    f"{HOST}:11:12 [0] NCCL INFO NET/IB : Using [0]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
    *[_channel(11, tail, ch=ch) for tail in ("IB/0/GDRDMA", "IB/0", "IB/1/GDRDMA", "Socket/0") for ch in (0, 7)],
]
_FACTS: list[tuple[str, Any]] = [
    ("kernel.modules", {"gpudirect_available": True}), ("kernel.modules", {"gpudirect_available": False}),
    ("nccl_env.ib_hca", {"11": "mlx5_1"}), ("nccl_env.ib_hca", {}),
    ("infiniband.ports", {"ib:mlx5_1/1": {"active": True}}), ("infiniband.ports", {}),
]


_ROUND = st.tuples(st.lists(st.sampled_from(_VOCAB), max_size=6), st.sampled_from(_VOCAB), st.integers(0, 150),
                   st.lists(st.sampled_from(_FACTS), max_size=2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_ROUND, min_size=1, max_size=5))
def test_skipping_judgements_says_what_judging_every_chunk_says(
        rounds: list[tuple[list[str], str, int, list[Any]]]) -> None:
    """Rounds of lines (a few, then one line repeated: chunks that only count), the node's facts changed before
    each, read in small chunks: the collector that skips the judgement of processes a chunk only counted for
    (plugin._unchanged) publishes exactly the messages of one that judges every touched process after every
    chunk."""
    import tempfile

    async def run(skip: bool, tmp: Path) -> list[dict[str, Any]]:
        facts, sink = FactStore(), Sink()
        facts.set("kernel.modules", {"gpudirect_available": True})
        root = _root(tmp, {f"{HOST}.11.log": ""})
        c = _live(root, sink=sink, facts=facts, chunk=2048)
        if not skip:
            c._unchanged = lambda *_a: False  # type: ignore[method-assign]
        for lines, repeated, n, changes in rounds:
            for key, value in changes:
                facts.set(key, value)
            if lines or n:
                _append(root, f"{HOST}.11.log", lines + [repeated] * n)
            await c.tailer.pump(c._handle)
        return [{k: v for k, v in msgspec.structs.asdict(m).items() if k not in ("id", "time")}
                for m in sink.messages]

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        assert asyncio.run(run(True, Path(a))) == asyncio.run(run(False, Path(b)))
