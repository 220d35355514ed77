from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.spool import HEADER, Spool, decode_frames, encode_frame


def _spool(path: Path, **kw: object) -> Spool:
    s = Spool(path, **kw)  # type: ignore[arg-type]
    s.open()
    return s


async def test_append_read_ack_and_reopen(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=1 << 20)
    seqs = [await s.append("info", f"m{i}".encode()) for i in range(300)]
    assert seqs == list(range(1, 301))
    assert s.depth == 300
    recs = s.read(0, 100)
    assert [r.payload for r in recs] == [f"m{i}".encode() for i in range(100)]
    s.ack(recs[-1].seq, len(recs))
    assert s.depth == 200
    assert len(list((tmp_path / "sp").glob("*.seg"))) > 1
    s.close()
    s2 = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=1 << 20)
    assert s2.acked_seq == 100 and s2.depth == 200 and s2.last_seq == 300
    recs = s2.read(s2.acked_seq, 1000)
    assert [r.seq for r in recs] == list(range(101, 301))
    s2.ack(300, 200)
    assert s2.depth == 0
    # fully acknowledged closed segments are gone
    await s2.append("info", b"x")
    assert s2.size_bytes < 4096 * 2


async def test_torn_tail_is_truncated_on_recovery(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp")
    for i in range(10):
        await s.append("warning", b"payload-%d" % i)
    s.close()
    seg = next((tmp_path / "sp").glob("*.seg"))
    with open(seg, "ab") as fh:  # a frame cut in half by a crash
        fh.write(encode_frame(11, 1, b"half-written")[:9])
    s2 = _spool(tmp_path / "sp")
    assert s2.last_seq == 10 and s2.depth == 10
    assert await s2.append("warning", b"next") == 11
    assert [r.payload for r in s2.read(9, 10)] == [b"payload-9", b"next"]


@given(st.binary(max_size=2048))
def test_decode_frames_never_crashes_on_garbage(data: bytes) -> None:
    records, good = decode_frames(data)
    assert 0 <= good <= len(data)
    assert sum(HEADER.size + len(r.payload) for r in records) == good


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(payloads=st.lists(st.binary(max_size=64), min_size=1, max_size=20), cut=st.integers(0, 4000),
       flip=st.integers(0, 4000))
def test_recovery_keeps_every_intact_frame(tmp_path_factory: pytest.TempPathFactory, payloads: list[bytes],
                                           cut: int, flip: int) -> None:
    """A torn tail is cut; a flipped byte costs only the frame it hit (#13 D10), never the ones after it."""
    d = tmp_path_factory.mktemp("sp")
    frames = [encode_frame(i + 1, 0, p) for i, p in enumerate(payloads)]
    data = b"".join(frames)
    corrupted = bytearray(data[: cut % (len(data) + 1)])
    hit = -1
    if corrupted:
        pos = flip % len(corrupted)
        corrupted[pos] ^= 0xFF
        hit = next(i for i in range(len(frames)) if pos < sum(len(f) for f in frames[: i + 1]))
    (d / f"{1:020d}.seg").write_bytes(bytes(corrupted))
    s = _spool(d)
    recs = s.read(0, 1000)
    whole = [i for i in range(len(frames)) if sum(len(f) for f in frames[: i + 1]) <= len(corrupted)]
    assert [(r.seq, r.payload) for r in recs] == [(i + 1, payloads[i]) for i in whole if i != hit]
    s.close()


async def test_drop_oldest_info_first_keeps_warnings_and_criticals(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=16384)
    crit = []
    for i in range(600):
        sev = "critical" if i % 10 == 0 else "info"
        seq = await s.append(sev, b"%s-%04d" % (sev.encode(), i) + b"x" * 40)
        if sev == "critical":
            assert seq is not None
            crit.append(seq)
    assert s.size_bytes <= 16384
    assert s.dropped[0] > 0 and s.dropped[2] == 0
    kept = {r.seq for r in s.read(0, 10000)}
    assert set(crit) <= kept, "no critical message may be dropped while info ones exist"
    assert s.depth == len(kept)
    assert s.unannounced_drops()[0] == s.dropped[0]
    s.close()
    s2 = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=16384)
    assert s2.dropped == s.dropped, "drop counts survive a restart (for the announcement)"


async def test_drop_oldest_info_first_then_oldest_segment_when_only_criticals(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=12288)
    for i in range(400):
        assert await s.append("critical", b"c%04d" % i + b"y" * 40) is not None
    assert s.dropped[2] > 0
    recs = s.read(0, 10000)
    assert recs[-1].seq == 400, "the newest critical is kept"
    assert [r.seq for r in recs] == sorted(r.seq for r in recs)
    # info arriving at a full spool of criticals never pushes a critical out
    crit_dropped = s.dropped[2]
    results = [await s.append("info", b"i" * 40) for _ in range(400)]
    assert None in results and s.dropped[0] > 0
    assert s.dropped[2] == crit_dropped


async def test_drop_newest_refuses(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=8192, policy="drop_newest")
    results = [await s.append("critical", b"z" * 100) for _ in range(200)]
    assert results[0] == 1 and results[-1] is None
    assert s.dropped[2] == results.count(None)


async def test_in_flight_records_are_never_dropped(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp", segment_bytes=4096, max_bytes=8192, policy="drop_oldest")
    for _ in range(60):
        await s.append("warning", b"w" * 80)
    inflight = s.read(0, 20)
    for _ in range(200):
        await s.append("warning", b"v" * 80)
    again = s.read(0, 20)
    assert [r.seq for r in again[:1]] == [inflight[0].seq], "the reader's in-flight window survived"


async def test_group_commit_concurrent_appends(tmp_path: Path) -> None:
    s = _spool(tmp_path / "sp")
    seqs = await asyncio.gather(*(s.append("info", b"%d" % i) for i in range(2000)))
    assert sorted(seqs) == list(range(1, 2001))  # type: ignore[type-var]


WRITER = textwrap.dedent("""
    import asyncio, sys
    from agent.spool import Spool
    async def main():
        s = Spool(sys.argv[1]); s.open()
        i = 0
        while True:
            seq = await s.append("warning", b"rec-%d" % i)
            print(seq, flush=True)   # reported only after fsync: "accepted"
            i += 1
    asyncio.run(main())
""")


def test_sigkill_loses_nothing_accepted(tmp_path: Path) -> None:
    d = tmp_path / "sp"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    accepted = []
    for line in proc.stdout:
        accepted.append(int(line))
        if len(accepted) >= 400:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    s = _spool(d)
    on_disk = {r.seq for r in s.read(0, 100000)}
    assert set(accepted) <= on_disk
    assert s.last_seq >= max(accepted)


@pytest.mark.parametrize("state", [
    '{"version": 1, "acked_seq": "12", "dropped": [0, 0, 0], "announced": [0, 0, 0]}',
    '{"version": 1, "acked_seq": 3, "dropped": "lots", "announced": [0, 0, 0]}',
    '{"version": 1, "acked_seq": -5}',
    '{"version": 1, "acked_seq": true, "announced": [1, 2]}',
    "[1, 2, 3]",
    "{not json",
])
async def test_a_bad_state_file_is_set_aside_never_a_crash_loop(tmp_path: Path, state: str) -> None:
    """#13 D14: a wrong-typed field in state.json used to crash every start."""
    d = tmp_path / "spool"
    sp = Spool(d, fsync=False)
    sp.open()
    await sp.append("warning", b"kept")
    sp.close()
    (d / "state.json").write_text(state)
    sp2 = Spool(d, fsync=False)
    sp2.open()  # no exception
    assert sp2.acked_seq == 0 and [r.payload for r in sp2.read(0, 10)] == [b"kept"]
    assert list(d.glob("state.json.bad-*")), "the bad file is kept for the operator"
    sp2.close()
