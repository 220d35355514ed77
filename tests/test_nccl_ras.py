"""collectors/nccl/ras_protocol.py: NCCL_RAS_ADDR/ENABLE as NCCL reads them, the RAS reports of every generation (the
corpus in tests/corpus/ras/, rendered from NCCL's format strings by tests/ras_render.py), hostile input, and the
query against a loopback fake of the RAS client socket (tests/fake_ras.py) in every way it can go wrong."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.nccl.ras_protocol import (
    RasComm,
    RasError,
    RasReport,
    parse_status,
    parse_status_json,
    parse_status_text,
    query_ras,
    ras_address,
    stalled,
)
from tests.fake_ras import FakeRas
from tests.ras_corpus import CASES, CORPUS, Case, expect_json
from tests.ras_render import Comm, Job, Peer, Rank, render_json, render_text

# --------------------------------------------------------------------------------------------------------------
# ras_address
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "on"), [
    (None, True), ("", True), ("1", True), ("0", False), ("2", False), ("-1", False), ("abc", False),
    ("1abc", True), ("0x1", True), ("01", True), ("010", False), (" 1", True), ("\t1", True), ("  ", False),
    ("99999999999999999999", True), ("-99999999999999999999", True), ("+1", True), ("1.9", True), ("0x", False),
])
def test_ras_enable_reads_like_strtoll_base_0(value: str | None, on: bool) -> None:
    env = {} if value is None else {"NCCL_RAS_ENABLE": value}
    assert (ras_address(env) is not None) is on


@pytest.mark.parametrize(("addr", "want"), [
    ("127.0.0.1:12345", ("127.0.0.1", 12345)),
    ("localhost:28028", ("localhost", 28028)),
    ("[::1]:28029", ("::1", 28029)),
    ("[fe80::1%eth0]:28028", ("fe80::1%eth0", 28028)),
    ("0.0.0.0:28028", ("127.0.0.1", 28028)),
    ("[::]:5000", ("::1", 5000)),
    ("10.1.2.3:28028", ("10.1.2.3", 28028)),
    ("node1:28028,node2:1", ("node1", 28028)),
    (",node2:1", ("node2", 1)),
    (":x,node2:1", ("node2", 1)),
    ("[0:0::0]:7", ("::1", 7)),
    ("localhost", ("localhost", 65535)),  # port -1 -> htons(-1)
    ("h:70000", ("h", 70000 & 0xFFFF)),
    ("h:-1", ("h", 65535)),
    ("h:28028junk", ("h", 28028)),
    ("h:1:2", ("h", 1)),
    ("", None),  # set but empty: no listener
    ("x", None),
    (":28028", None),
    ("h:0", None),  # ephemeral port: nobody can know it
    ("h:abc", None),
    ("h:", None),  # atoi("") = 0 before 2.30.7; version unknown
    ("[::1", None),
    ("[zz::1]:28028", None),
    ("[::1]", None),
    ("a b:28028", None),
    ("h" * 64 + ":28028", None),
])
def test_ras_addr_reads_like_ncclSocketGetAddrFromString(addr: str, want: tuple[str, int] | None) -> None:
    assert ras_address({"NCCL_RAS_ADDR": addr}) == want


def test_ras_addr_empty_port_depends_on_the_version() -> None:
    env = {"NCCL_RAS_ADDR": "h:"}
    assert ras_address(env, nccl_version="2.30.4") is None
    assert ras_address(env, nccl_version="2.30.7") == ("h", 65535)  # strsep parser: -1
    assert ras_address(env, nccl_version=(2, 31, 0)) == ("h", 65535)


def test_ras_addr_default_and_disabled() -> None:
    assert ras_address({}) == ("localhost", 28028)
    assert ras_address({"NCCL_RAS_ENABLE": "0", "NCCL_RAS_ADDR": "127.0.0.1:1"}) is None


@given(st.dictionaries(st.sampled_from(["NCCL_RAS_ADDR", "NCCL_RAS_ENABLE", "X"]), st.text(max_size=80)),
       st.one_of(st.none(), st.text(max_size=10)))
def test_ras_address_never_raises(env: dict[str, str], version: str | None) -> None:
    got = ras_address(env, nccl_version=version)
    assert got is None or (isinstance(got[0], str) and got[0] and 1 <= got[1] <= 65535)


# --------------------------------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------------------------------

TRANSCRIPTS = sorted(p for p in CORPUS.iterdir() if p.suffix in (".txt", ".json") and ".expect" not in p.name)


def test_corpus_files_are_what_the_renderer_prints() -> None:
    assert {c.path for c in CASES} == set(TRANSCRIPTS)
    for case in CASES:
        assert case.path.read_text() == case.render(), f"{case.path.name}: run python -m tests.ras_corpus"
        exp = CORPUS / f"{case.name}.{case.fmt}.expect.json"
        assert exp.read_text() == expect_json(case), exp.name


def test_corpus_readme_cites_every_file() -> None:
    readme = (CORPUS / "README.md").read_text()
    for p in TRANSCRIPTS:
        assert p.name in readme, p.name
    for tag in ("v2.24.3-1", "v2.26.6-1", "v2.28.7-1", "v2.29.7-1", "v2.30.7-1", "client_support.cc"):
        assert tag in readme


def _hex(h: Any) -> str:
    return h if isinstance(h, str) else f"{h:016x}"


def _rank_tuple(r: Any, n: int) -> list[Any]:
    return [r.rank, r.host, r.pid, r.cuda_dev, r.dead][:n]


def check_expectations(report: RasReport, exp: dict[str, Any]) -> None:
    for key in ("nccl_version", "healthy", "complete", "comm_count", "timeouts", "collection_time_s"):
        if key in exp:
            assert getattr(report, key) == exp[key], key
    assert report.warnings == exp.get("warnings", []), report.warnings
    if "notes" in exp:
        assert len(report.notes) == exp["notes"], report.notes
    if "job" in exp:
        assert report.job is not None
        assert [report.job.nodes, report.job.processes, report.job.gpus] == exp["job"]
    if "job_ppn" in exp:
        assert report.job is not None and [list(x) for x in report.job.processes_per_node] == exp["job_ppn"]
    if "job_gpp" in exp:
        assert report.job is not None and [list(x) for x in report.job.gpus_per_process] == exp["job_gpp"]
    if "outlier_nodes" in exp:
        assert report.job is not None and report.job.outlier_nodes == exp["outlier_nodes"]
    if "groups" in exp:
        got = [[g.comms, g.ranks_per_comm, g.status, list(g.errors)] for g in report.groups]
        assert got == exp["groups"]
    for key in ("missing_processes", "dead_processes"):
        if key in exp:
            assert [[p.host, p.pid, list(p.cuda_devs)] for p in getattr(report, key)] == exp[key], key
    if "comms" in exp:
        by_hash = {c.comm_hash: c for c in report.communicators}
        if not exp["comms"]:
            assert not report.communicators or report.format == "json"
        for h, ce in exp["comms"].items():
            c = by_hash[_hex(h)]
            check_comm(c, ce)
    if "suspects" in exp:
        got = [[s.reason, s.comm_hash, s.rank, s.host, s.pid] for s in report.suspects()]
        want = [[r, None if h is None else _hex(h), rk, host, pid] for r, h, rk, host, pid in exp["suspects"]]
        assert got[: len(want)] == want, got[:6]
        if not want:
            assert got == []


def check_comm(c: RasComm, ce: dict[str, Any]) -> None:
    for key in ("label", "nranks", "status", "missing_count", "init_error_count", "async_error_count",
                "ranks_reporting"):
        if key in ce:
            assert getattr(c, key) == ce[key], (c.comm_hash, key)
    if "errors" in ce:
        assert list(c.errors) == ce["errors"], c.comm_hash
    for key in ("missing", "not_member"):
        if key in ce:
            got = [_rank_tuple(r, len(e)) for r, e in zip(getattr(c, key), ce[key], strict=False)]
            assert len(getattr(c, key)) == len(ce[key]) and got == ce[key], (c.comm_hash, key, getattr(c, key))
    if "error_groups" in ce:
        got = [[g.what, g.value, g.code, g.count, [r.rank for r in g.ranks]] for g in c.error_groups]
        assert got == ce["error_groups"], c.comm_hash
    if "status_groups" in ce:
        got = [[g.value, g.count, [r.rank for r in g.ranks]] for g in c.status_groups]
        want = ce["status_groups"]
        assert [[v, n] for v, n, _ in got] == [[v, n] for v, n, _ in want], c.comm_hash
        for (_, _, gr), (_, _, wr) in zip(got, want, strict=True):
            assert gr == wr or (wr == [] and c.ranks), (c.comm_hash, gr, wr)
    if "ops" in ce:
        for func, groups in ce["ops"].items():
            got = [[g.value, g.count, [r.rank for r in g.ranks]] for g in c.op_count_groups if g.what == func]
            assert [[v, n] for v, n, _ in got] == [[v, n] for v, n, _ in groups], (c.comm_hash, func)
            for (_, _, gr), (_, _, wr) in zip(got, groups, strict=True):
                assert wr is None or gr == wr or (wr == [] and c.ranks), (c.comm_hash, func, gr, wr)


@pytest.mark.parametrize("case", CASES, ids=[c.path.name for c in CASES])
def test_corpus_transcript_reads_as_expected(case: Case) -> None:
    data = case.path.read_bytes()
    report = parse_status(data)
    assert report.format == case.fmt
    assert report.recognised and report.complete
    check_expectations(report, case.expect)
    # the two readers agree with the auto-detection, and str/bytes read alike
    again = (parse_status_json if case.fmt == "json" else parse_status_text)(data.decode())
    assert again.to_dict() == report.to_dict()
    json.dumps(report.to_dict())  # plain data


def test_json_and_text_of_one_state_name_the_same_culprits() -> None:
    text = parse_status((CORPUS / "v2.28.9-missing-rank.txt").read_text())
    js = parse_status((CORPUS / "v2.28.9-missing-rank.json").read_text())
    assert js.notes and "2.28.7-2.28.9" in js.notes[0]
    for a, b in ((text, js),):
        ma = {(c.comm_hash, m.rank, m.host, m.pid) for c in a.communicators for m in c.missing}
        mb = {(c.comm_hash, m.rank, m.host, m.pid) for c in b.communicators for m in c.missing}
        assert ma == mb
        assert a.missing_processes == b.missing_processes


def test_the_2_28_json_is_really_invalid_and_2_29_is_not() -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads((CORPUS / "v2.28.9-missing-rank.json").read_text())
    json.loads((CORPUS / "v2.29.7-mixed.json").read_text())


def test_text_lists_only_outliers_but_json_lists_everyone() -> None:
    r = parse_status((CORPUS / "v2.27.7-straggler.txt").read_text())
    w = r.communicators[0]
    ar = [g for g in w.op_count_groups if g.what == "AllReduce"]
    assert [(g.value, g.count, len(g.ranks)) for g in ar] == [(1200, 31, 0), (1199, 1, 1)]
    behind = [s for s in r.suspects() if s.reason == "behind"]
    assert [(s.rank, s.host, s.pid, s.gpus, s.group_size) for s in behind][-1] == (9, "10.10.1.11", 4101, (1,), 1)


def test_unlisted_majority_is_named_by_complement() -> None:
    """2 ranks ahead are listed, the 30 behind are not (NVIDIA/nccl#1911): they are every other rank."""
    peers = [Peer(f"10.0.0.{n}", 100 * n + g, (g,), port=40000 + g) for n in range(1, 5) for g in range(8)]
    comm = Comm(0xFA93DAEA854B060B, [Rank(i, i, peers[i].cuda[0], counts=(0, 0, 641 if i in (12, 13) else 640, 0, 0))
                                     for i in range(32)])
    r = parse_status_text(render_text(Job(peers, [comm], nccl="2.26.2"), gen=26))
    behind = [s for s in r.suspects() if s.reason == "behind"]
    assert sorted(s.rank for s in behind if s.rank is not None) == [i for i in range(32) if i not in (12, 13)]
    assert {s.group_size for s in behind} == {30}


def test_rank_list_cut_at_1023_characters_by_2_24() -> None:
    peers = [Peer(f"10.0.{n // 200}.{n % 200 + 1}", 1000 + n, (0,)) for n in range(600)]
    comm = Comm(0x1234, [Rank(i, i, 0) for i in range(600)])
    job = Job(peers, [comm], unresponsive=set(range(100, 399)), nccl="2.24.3")
    text = render_text(job, gen=24, verbose=True)
    line = next(x for x in text.splitlines() if x.startswith("  The missing ranks: "))
    assert len(line) == len("  The missing ranks: ") + 1023  # RAS itself cut it
    r = parse_status_text(text)
    c = r.communicators[0]
    assert c.missing_count == 299
    assert len(c.missing) < 299 and all(100 <= m.rank < 399 for m in c.missing)
    assert any("cut off" in w for w in r.warnings)


def test_stalled_sees_counts_that_did_not_move() -> None:
    a = parse_status((CORPUS / "v2.27.7-straggler.txt").read_text())
    b = parse_status((CORPUS / "v2.27.7-straggler.txt").read_text())
    assert stalled(a, b) == ["5b1e0c3f9a7d2e41"]
    moved = (CORPUS / "v2.27.7-straggler.txt").read_text().replace("1199", "1200").replace("1200 --", "1201 --")
    assert stalled(a, parse_status(moved)) == []
    assert stalled(a, parse_status((CORPUS / "v2.24.3-healthy.txt").read_text())) == []


# --------------------------------------------------------------------------------------------------------------
# Hostile and broken input
# --------------------------------------------------------------------------------------------------------------


def _invariants(r: RasReport) -> None:
    assert isinstance(r.warnings, list) and len(r.warnings) <= 65
    for c in r.communicators:
        assert len(c.comm_hash) == 16
        for m in [*c.missing, *c.not_member]:
            assert m.rank >= 0
            if c.nranks is not None:
                assert m.rank < c.nranks
        for g in [*c.status_groups, *c.op_count_groups, *c.error_groups]:
            assert len(g.ranks) <= g.count
            for m in g.ranks:
                assert c.nranks is None or 0 <= m.rank < c.nranks
    for s in r.suspects():
        assert s.reason in ("dead", "unresponsive", "missing", "error", "status", "behind", "remote_error")
    json.dumps(r.to_dict())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_text_parser_never_raises_on_any_text(text: str) -> None:
    r = parse_status_text(text)
    _invariants(r)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_parsers_never_raise_on_any_bytes(data: bytes) -> None:
    _invariants(parse_status_text(data))
    _invariants(parse_status_json(data))
    _invariants(parse_status(data))


_CORPUS_LINES = sorted({ln for p in TRANSCRIPTS if p.suffix == ".txt" for ln in p.read_text().splitlines()})


def _mutate(line: str, rnd: random.Random) -> str:
    choice = rnd.randrange(6)
    if choice == 0:  # absurd numbers
        return "".join(rnd.choice(["99999999999999999999999", "-1", "0", "4294967296"]) if ch.isdigit() and
                       rnd.random() < 0.3 else ch for ch in line)
    if choice == 1:
        return line[: rnd.randrange(len(line) + 1)]  # half lines
    if choice == 2:
        return line.replace(" ", "  ", 1)
    if choice == 3:
        return line + rnd.choice(["\0", "\x1b[31m", "é", "\ufffd", " -- "])
    return line


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_CORPUS_LINES), max_size=120), st.randoms(use_true_random=False))
def test_text_parser_survives_shuffled_and_damaged_corpus_lines(lines: list[str], rnd: random.Random) -> None:
    text = "\n".join(_mutate(x, rnd) for x in lines)
    _invariants(parse_status_text(text))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([p for p in TRANSCRIPTS if p.suffix == ".txt"]), st.integers(0, 10_000))
def test_text_cut_anywhere_is_read_up_to_the_cut(path: Path, cut: int) -> None:
    text = path.read_text()
    cut = min(cut, len(text))
    r = parse_status_text(text[:cut])
    _invariants(r)
    if r.complete:
        assert "Warnings\n" in text[:cut + 1]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_json_parser_never_raises_on_any_json(value: Any) -> None:
    _invariants(parse_status_json(json.dumps(value)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([p for p in TRANSCRIPTS if p.suffix == ".json"]), st.data())
def test_json_parser_survives_damaged_documents(path: Path, data: st.DataObject) -> None:
    doc = json.loads(path.read_text().replace('"nvml_dev": 5\n', '"nvml_dev": 5,\n'))
    keys: list[list[Any]] = []

    def walk(x: Any, at: list[Any]) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                keys.append([*at, k])
                walk(v, [*at, k])
        elif isinstance(x, list):
            for i, v in enumerate(x):
                keys.append([*at, i])
                walk(v, [*at, i])

    walk(doc, [])
    for _ in range(data.draw(st.integers(1, 5))):
        at = data.draw(st.sampled_from(keys))
        parent = doc
        try:
            for k in at[:-1]:
                parent = parent[k]
            parent[at[-1]] = data.draw(_json_values)
        except (KeyError, IndexError, TypeError):
            continue
    _invariants(parse_status_json(json.dumps(doc)))


def test_absurd_and_binary_input_is_counted_not_fatal() -> None:
    text = (CORPUS / "v2.26.6-missing-rank.txt").read_text()
    r = parse_status_text(text.replace("Rank 21 --", "Rank 99999999999999999999999 --") + "\n\0\0\0\x7fELF\n")
    assert r.recognised and any("absurd rank" in w for w in r.warnings)
    assert [m.rank for m in r.communicators[0].missing] == []  # the one line was unreadable, the rest is read
    assert {c.comm_hash for c in r.communicators} == {c.comm_hash for c in parse_status_text(text).communicators}
    # a communicator header that cannot be read: its lines are not credited to the one before it
    r = parse_status_text(text.replace("(5b1e0c3f9a7d2e41)", "(zz)"))
    assert "5b1e0c3f9a7d2e41" not in {c.comm_hash for c in r.communicators}
    assert any("unreadable communicator header" in w for w in r.warnings)
    assert any("line under an unreadable communicator header (x2)" in w for w in r.warnings)
    for c in r.communicators:
        assert all(m.rank < (c.nranks or 0) for m in c.missing)
    big = parse_status_json("[" * 200_000 + "]" * 200_000)
    assert not big.recognised and big.warnings
    huge_int = parse_status_json('{"communicators": [], "communicators_count": ' + "9" * 5000 + "}")
    assert any("not valid JSON" in w for w in huge_int.warnings)
    assert parse_status_json('{"communicators": [], "ras": {"collection_time_sec": NaN}}').warnings


def test_warnings_are_counted_and_bounded() -> None:
    r = parse_status_text("garbage line\n" * 1000 + "".join(f"other{i}\n" for i in range(10)))
    assert r.warnings[0].startswith("unrecognised line in preamble (x1010)")
    r = parse_status_json('{"communicators": [' + ",".join(f'{{"hash": "{i}"}}' for i in range(500)) + "]}")
    assert len(r.warnings) <= 65


# --------------------------------------------------------------------------------------------------------------
# Round trips: random job states through the renderer and back
# --------------------------------------------------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    n_nodes = draw(st.integers(1, 3))
    gpn = draw(st.integers(1, 4))
    peers = [Peer(f"10.9.{n}.1", 500 + 10 * n + g, (g,), port=40000 + g) for n in range(n_nodes) for g in range(gpn)]
    comms = []
    for ci in range(draw(st.integers(0, 3))):
        members = draw(st.lists(st.sampled_from(range(len(peers))), min_size=1, max_size=len(peers), unique=True))
        ranks = []
        for i, p in enumerate(members):
            ranks.append(Rank(i, p, peers[p].cuda[0],
                              init=draw(st.sampled_from([0, 0, 0, 7, 3])),
                              async_err=draw(st.sampled_from([0, 0, 0, 2, 6, 7])),
                              finalize=draw(st.booleans()) and draw(st.booleans()),
                              abort=draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans()),
                              counts=tuple(draw(st.sampled_from([0, 5, 6])) for _ in range(5)),  # type: ignore[arg-type]
                              nocomm=draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())))
        comms.append(Comm(0xABC0000000000000 + ci * 0x1111, ranks))
    bad = draw(st.lists(st.sampled_from(range(len(peers))), max_size=2, unique=True))
    dead = set(bad[:1]) if draw(st.booleans()) else set()
    job = Job(peers, comms, unresponsive=set(bad) - dead, dead=dead, timeouts=draw(st.integers(0, 2)), nccl="2.29.7")
    # a communicator nobody reports on prints nothing sensible in any NCCL; keep one reporting rank
    for c in comms:
        if all(r.nocomm or r.peer in bad for r in c.ranks):
            c.ranks[0].nocomm = False
            job.unresponsive.discard(c.ranks[0].peer)
            job.dead.discard(c.ranks[0].peer)
    return job


def _truth(job: Job, c: Comm) -> dict[str, Any]:
    gone = job.unresponsive | job.dead
    return {
        "missing": {r.rank: (job.peers[r.peer].host, job.peers[r.peer].pid, r.cuda, r.peer in job.dead)
                    for r in c.ranks if r.peer in gone},
        "not_member": {r.rank for r in c.ranks if r.peer not in gone and r.nocomm},
        "reporting": [r for r in c.ranks if r.peer not in gone and not r.nocomm],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.booleans())
def test_json_round_trip_is_exact(job: Job, comma_bug: bool) -> None:
    r = parse_status_json(render_json(job, comma_bug=comma_bug))
    assert r.complete and r.recognised and r.warnings == []
    assert len(r.communicators) == len(job.comms)
    for c, jc in zip(r.communicators, job.comms, strict=True):
        t = _truth(job, jc)
        assert c.comm_hash == f"{jc.hash:016x}" and c.nranks == len(jc.ranks)
        assert {m.rank: (m.host, m.pid, m.cuda_dev, m.dead) for m in c.missing} == t["missing"]
        assert {m.rank for m in c.not_member} == t["not_member"]
        assert c.ranks_reporting == len(t["reporting"])
        errs = {(g.what, g.code): sorted(m.rank for m in g.ranks) for g in c.error_groups}
        want: dict[tuple[str, int], list[int]] = {}
        for rk in t["reporting"]:
            if rk.init not in (0, 7):
                want.setdefault(("init", rk.init), []).append(rk.rank)
            if rk.async_err not in (0, 7):
                want.setdefault(("async", rk.async_err), []).append(rk.rank)
        assert errs == want
        for fi, func in enumerate(("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")):
            got = {g.value: sorted(m.rank for m in g.ranks) for g in c.op_count_groups if g.what == func}
            vals: dict[int, list[int]] = {}
            for rk in t["reporting"]:
                vals.setdefault(rk.counts[fi], []).append(rk.rank)
            assert got == (vals if len(vals) > 1 else {})
    _invariants(r)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.sampled_from([24, 26, 28]), st.booleans())
def test_text_round_trip_agrees_with_the_state(job: Job, gen: int, verbose: bool) -> None:
    r = parse_status_text(render_text(job, gen=gen, verbose=verbose))
    assert r.complete and r.recognised and r.warnings == [], r.warnings
    assert r.comm_count == len(job.comms)
    assert r.timeouts == job.timeouts
    assert r.dead_process_count == len(job.dead)
    assert r.missing_process_count == len(job.unresponsive - job.dead)
    assert {(p.host, p.pid) for p in r.dead_processes} <= {(job.peers[i].host, job.peers[i].pid) for i in job.dead}
    by_hash = {f"{c.hash:016x}": c for c in job.comms}
    for c in r.communicators:
        jc = by_hash[c.comm_hash]
        t = _truth(job, jc)
        assert c.nranks == len(jc.ranks)
        assert c.ranks_reporting == len(t["reporting"])
        if gen == 24:
            assert {m.rank for m in c.missing} <= set(t["missing"]) | t["not_member"]
        else:
            for m in c.missing:
                host, pid, cuda, dead = t["missing"][m.rank]
                assert (m.host, m.pid, m.cuda_dev) == (host, pid, cuda)
                assert bool(m.dead) == dead
            if c.missing_count is not None:
                assert c.missing_count == len(t["missing"])
        for g in c.error_groups:
            attr = "init" if g.what == "init" else "async_err"
            assert {getattr(rk, attr) for rk in t["reporting"] if rk.rank in {m.rank for m in g.ranks}} <= {g.code}
        for g in c.op_count_groups:
            if gen > 24:
                fi = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce").index(g.what)
                members = [rk for rk in t["reporting"] if rk.counts[fi] == g.value]
                assert g.count == len(members)
                assert {m.rank for m in g.ranks} <= {rk.rank for rk in members}
    _invariants(r)


# --------------------------------------------------------------------------------------------------------------
# The query
# --------------------------------------------------------------------------------------------------------------

TEXT_228 = (CORPUS / "v2.28.9-missing-rank.txt").read_text()
JSON_228 = (CORPUS / "v2.28.9-missing-rank.json").read_text()
TEXT_226 = (CORPUS / "v2.26.6-missing-rank.txt").read_text()


async def test_query_prefers_json_when_the_server_has_it() -> None:
    async with FakeRas(TEXT_228, json=JSON_228) as srv:
        r = await query_ras(srv.host, srv.port)
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 2", "SET FORMAT json", "VERBOSE STATUS"]
    assert r.format == "json" and r.protocol == 2 and r.complete
    assert [m.rank for m in r.communicators[0].missing] == [21]


async def test_query_falls_back_to_text_on_a_server_before_2_28_7() -> None:
    async with FakeRas(TEXT_226) as srv:
        r = await query_ras(srv.host, srv.port, verbose=False, timeout=12)
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]
    assert r.format == "text" and r.nccl_version == "2.26.6" and r.complete
    assert any("predates JSON" in n for n in r.notes)


async def test_query_text_only_when_asked_and_the_leg_timeout_can_be_set() -> None:
    async with FakeRas(TEXT_228, json=JSON_228) as srv:
        r = await query_ras(srv.host, srv.port, prefer_json=False, collective_timeout=3)
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 3", "VERBOSE STATUS"]
    assert r.format == "text" and r.missing_process_count == 1


async def test_query_other_protocol_versions() -> None:
    async with FakeRas(TEXT_228, json=JSON_228, protocol=3) as srv:
        r = await query_ras(srv.host, srv.port)
    assert r.protocol == 3 and r.format == "json" and any("protocol 3" in n for n in r.notes)
    async with FakeRas(TEXT_228, json=JSON_228, protocol=1) as srv:
        r = await query_ras(srv.host, srv.port)
    assert "SET FORMAT json" not in srv.commands and r.format == "text"


async def test_query_localhost_tries_every_address_it_has() -> None:
    async with FakeRas(TEXT_228) as srv:
        r = await query_ras("localhost", srv.port)
    assert r.complete


async def test_query_ipv6_loopback() -> None:
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
        s.close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    async with FakeRas(TEXT_228, host="::1") as srv:
        r = await query_ras("::1", srv.port)
    assert r.complete


async def test_query_over_a_socket_the_caller_connected() -> None:
    async with FakeRas(TEXT_228, json=JSON_228) as srv:
        s = socket.create_connection((srv.host, srv.port))
        s.setblocking(False)
        r = await query_ras("pod-netns", 28028, sock=s)
    assert r.format == "json" and 4205 in r.pids()


def test_pids_lists_whom_the_report_names() -> None:
    js = parse_status((CORPUS / "v2.29.7-mixed.json").read_text())
    assert len(js.pids()) == 32  # JSON names every process
    text = parse_status((CORPUS / "v2.27.7-straggler.txt").read_text())
    assert text.pids() == {4306, 4307, 4101}  # text only the ranks it lists


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


async def test_query_refused() -> None:
    with pytest.raises(RasError) as ei:
        await query_ras("127.0.0.1", _free_port())
    assert ei.value.reason == "refused" and "NCCL_RAS" in str(ei.value)


@pytest.mark.parametrize(("host", "port"), [("10.255.255.1", 28028), ("127.0.0.1", 0), ("127.0.0.1", 70000),
                                            ("", 28028), ("a b", 28028)])
async def test_query_refuses_addresses_it_should_not_touch(host: str, port: int) -> None:
    with pytest.raises(RasError) as ei:
        await query_ras(host, port, timeout=1)
    assert ei.value.reason == "address"


@pytest.mark.parametrize(("mode", "reason"), [
    ("silent", "timeout"),
    ("close_on_connect", "closed"),
    ("junk_greeting", "protocol"),
    ("half_greeting", "protocol"),
    ("endless_line", "protocol"),
    ("junk_report", "garbage"),
    ("huge", "oversize"),
    ("bad_timeout", "protocol"),
    ("odd_format_reply", "protocol"),
    ("no_close", "timeout"),
])
async def test_query_misbehaving_server(mode: str, reason: str) -> None:
    async with FakeRas(TEXT_228, json=JSON_228, mode=mode) as srv:
        t0 = time.monotonic()
        with pytest.raises(RasError) as ei:
            await query_ras(srv.host, srv.port, timeout=1.0)
        elapsed = time.monotonic() - t0
    assert ei.value.reason == reason, ei.value
    assert elapsed < 1.6, elapsed
    assert str(ei.value).startswith(reason + ": ")


async def test_query_report_cut_short_is_a_report_that_says_so() -> None:
    async with FakeRas(TEXT_228, mode="close_mid_report") as srv:
        r = await query_ras(srv.host, srv.port)
    assert r.recognised and not r.complete
    assert any("ends early" in w for w in r.warnings)


async def test_query_json_cut_short_is_garbage() -> None:
    async with FakeRas(TEXT_228, json=JSON_228, mode="close_mid_report") as srv:
        with pytest.raises(RasError) as ei:
            await query_ras(srv.host, srv.port)
    assert ei.value.reason == "garbage"


async def test_query_timeout_keeps_what_arrived() -> None:
    async with FakeRas(TEXT_228, mode="stall_mid_report") as srv:
        with pytest.raises(RasError) as ei:
            await query_ras(srv.host, srv.port, timeout=0.8)
    assert ei.value.reason == "timeout"
    assert ei.value.partial is not None and ei.value.partial.nccl_version == "2.28.9"
    assert not ei.value.partial.complete


async def test_query_no_close_json_partial_is_the_whole_document() -> None:
    async with FakeRas(TEXT_228, json=JSON_228, mode="no_close") as srv:
        with pytest.raises(RasError) as ei:
            await query_ras(srv.host, srv.port, timeout=0.8)
    assert ei.value.partial is not None and ei.value.partial.complete


async def test_query_slow_trickle_within_the_time_is_fine_and_beyond_is_a_timeout() -> None:
    small = "\n".join(TEXT_228.splitlines()[:12]) + "\n"
    async with FakeRas(small, mode="trickle") as srv:
        r = await query_ras(srv.host, srv.port, timeout=10)
    assert r.nccl_version == "2.28.9"
    async with FakeRas(TEXT_228, mode="trickle") as srv:
        with pytest.raises(RasError) as ei:
            await query_ras(srv.host, srv.port, timeout=0.5)
    assert ei.value.reason == "timeout"


async def test_query_cancellation_propagates_and_closes_the_connection() -> None:
    async with FakeRas(TEXT_228, mode="silent") as srv:
        task = asyncio.create_task(query_ras(srv.host, srv.port, timeout=30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(srv.closed_by_client.wait(), 2)


async def test_query_does_not_block_the_loop_on_a_big_report() -> None:
    block = "".join(f"  Rank {i} -- GPU 1 managed by process {5000 + i} on node 10.0.0.1\n" for i in range(1, 300))
    base = (CORPUS / "v2.27.7-straggler.txt").read_text()
    head, _, _ = base.partition("Warnings\n")
    body = head + "Warnings\n========\n\n" + ("#0-0 (5b1e0c3f9a7d2e41) MISMATCH\n  Communicator ranks have different"
                                                " status\n  299 ranks have status INIT\n" + block) * 150
    assert 2 << 20 < len(body) < 4 << 20
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with FakeRas(body, chunk=65536) as srv:
        tick = asyncio.create_task(ticker())
        r = await query_ras(srv.host, srv.port, timeout=20)
        stop.set()
        await tick
    assert r.recognised and r.warnings  # rank lines beyond counts and size are counted, not fatal
    assert max(gaps) < 0.3, max(gaps)  # parsing 3 MB inline blocks ~0.35 s here


async def test_query_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        await query_ras("127.0.0.1", 1, timeout=0)
    with pytest.raises(ValueError):
        await query_ras("127.0.0.1", 1, max_bytes=10)
    with pytest.raises(ValueError):
        await query_ras("127.0.0.1", 1, collective_timeout=0)
