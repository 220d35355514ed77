"""The tailer through every kind of rotation, with a writer running concurrently."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gna_sdk.hostroot import HostRoot
from gna_sdk.tailer import TailedFile, Tailer


class Recorder:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.refuse = False

    async def __call__(self, tf: TailedFile, data: bytes, base: int) -> bool:
        if self.refuse:
            return False
        self.lines.extend(data.splitlines())
        return True

    def seqs(self) -> list[int]:
        return [int(x.split(b"seq=")[1]) for x in self.lines if b"seq=" in x]


def _tailer(root: Path, state: Path | None = None, **kw: object) -> Tailer:
    return Tailer(HostRoot(root), ["/var/log/nccl/*.log"], state, rescan_interval=0.1, linger=0.3,
                  debounce=0.01, **kw)  # type: ignore[arg-type]


def _logdir(root: Path) -> Path:
    d = root / "var/log/nccl"
    d.mkdir(parents=True, exist_ok=True)
    return d


async def _run_until(t: Tailer, rec: Recorder, done: object, timeout: float = 20) -> None:
    task = asyncio.create_task(t.run(rec))
    deadline = time.monotonic() + timeout
    try:
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"timed out with {len(rec.lines)} lines"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Writer(threading.Thread):
    """Appends numbered lines; ``rotate(i)`` is called every ``every`` lines."""

    def __init__(self, path: Path, n: int, every: int, rotate: object) -> None:
        super().__init__(daemon=True)
        self.path, self.n, self.every, self.rotate = path, n, every, rotate

    def run(self) -> None:
        fh = open(self.path, "ab", buffering=0)  # noqa: SIM115
        for i in range(self.n):
            fh.write(b"host:1:1 [0] NCCL INFO line seq=%d\n" % i)
            if i % self.every == self.every - 1:
                fh = self.rotate(fh, i)  # type: ignore[operator]
            if i % 50 == 0:
                time.sleep(0.002)
        fh.close()


async def test_rename_and_create_rotation_loses_nothing(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    log = d / "job.log"

    def rotate(fh: object, i: int) -> object:
        fh.close()  # type: ignore[attr-defined]
        os.rename(log, d / f"job.log.{i}")  # no longer matches the glob: drained through the open fd
        return open(log, "ab", buffering=0)

    log.touch()
    rec = Recorder()
    w = Writer(log, 3000, 500, rotate)
    t = _tailer(tmp_path)
    w.start()
    await _run_until(t, rec, lambda: len(rec.lines) >= 3000 and not w.is_alive())
    assert sorted(rec.seqs()) == list(range(3000)), "every line exactly once"
    assert t.stats["files_opened"] >= 6


async def test_copytruncate(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    log = d / "job.log"
    log.write_bytes(b"".join(b"host:1:1 [0] NCCL INFO seq=%d\n" % i for i in range(100)))
    rec = Recorder()
    t = _tailer(tmp_path)
    task = asyncio.create_task(t.run(rec))
    while len(rec.lines) < 100:
        await asyncio.sleep(0.01)
    shutil.copy(log, d / "job.log.1")
    with open(log, "r+b") as fh:
        fh.truncate(0)
    with open(log, "ab") as fh:
        fh.write(b"".join(b"host:1:1 [0] NCCL INFO seq=%d\n" % i for i in range(100, 150)))
    deadline = time.monotonic() + 10
    while len(rec.lines) < 150 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.seqs() == list(range(150))
    assert t.stats["truncations"] >= 1


async def test_deleted_file_is_drained_and_symlink_swap(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    a, b = d / "a.data", d / "b.data"
    a.write_bytes(b"x seq=0\n")
    (d / "current.log").symlink_to("a.data")
    rec = Recorder()
    t = _tailer(tmp_path)
    task = asyncio.create_task(t.run(rec))
    while len(rec.lines) < 1:
        await asyncio.sleep(0.01)
    with open(a, "ab") as fh:  # written, then the link moves and the file is deleted before we read
        fh.write(b"x seq=1\n")
    b.write_bytes(b"x seq=2\n")
    tmp_link = d / ".current.tmp"
    tmp_link.symlink_to("b.data")
    os.replace(tmp_link, d / "current.log")
    a.unlink()
    deadline = time.monotonic() + 10
    while len(rec.lines) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.6)  # past the linger: the drained, deleted file is closed
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert sorted(rec.seqs()) == [0, 1, 2]
    assert t.stats["files_closed"] >= 1


async def test_half_line_waits_long_line_is_cut_and_runaway_bytes_are_skipped(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    log = d / "x.log"
    log.write_bytes(b"first seq=0\nsecond half")
    t = _tailer(tmp_path, chunk_bytes=1 << 20, max_line=1000)
    t.rescan()
    rec = Recorder()
    await t.pump(rec)
    assert rec.lines == [b"first seq=0"]
    with open(log, "ab") as fh:
        fh.write(b" of it seq=1\n" + b"L" * 5000 + b" seq=2\n")
        fh.write(b"\xff\xfe binary \x00 seq=3\n")
        fh.write(b"N" * (10 * 1024 * 1024))  # 10 MB and no newline
        fh.write(b"\nafter seq=4\n")
    await t.pump(rec)
    assert rec.lines[1] == b"second half of it seq=1"
    assert len(rec.lines[2]) == 1000 and t.stats["lines_cut"] == 1
    assert b"binary" in rec.lines[3]
    assert rec.lines[-1] == b"after seq=4"
    assert t.stats["bytes_skipped"] >= 9 * 1024 * 1024


async def test_refusal_keeps_the_offset_and_shrink_and_missing_dir(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    log = d / "x.log"
    log.write_bytes(b"a seq=0\nb seq=1\n")
    t = _tailer(tmp_path)
    t.rescan()
    rec = Recorder()
    rec.refuse = True
    await t.pump(rec)
    assert next(iter(t.files.values())).offset == 0, "not accepted: not advanced"
    rec.refuse = False
    await t.pump(rec)
    assert rec.seqs() == [0, 1]
    log.write_bytes(b"c seq=2\n")  # rewritten shorter (same inode)
    await t.pump(rec)
    assert rec.seqs() == [0, 1, 2]
    shutil.rmtree(d)
    t.rescan()  # no crash; nothing matches
    await t.pump(rec)
    d.mkdir(parents=True)
    (d / "new.log").write_bytes(b"n seq=3\n")
    t.rescan()
    await t.pump(rec)
    assert rec.seqs() == [0, 1, 2, 3]


async def test_checkpoint_resumes_exactly(tmp_path: Path) -> None:
    d = _logdir(tmp_path)
    log = d / "x.log"
    log.write_bytes(b"".join(b"l seq=%d\n" % i for i in range(10)))
    state = tmp_path / "ckpt.json"
    t = _tailer(tmp_path, state)
    t.load()
    t.rescan()
    rec = Recorder()
    await t.pump(rec)
    with open(log, "ab") as fh:
        fh.write(b"".join(b"l seq=%d\n" % i for i in range(10, 15)))
    t2 = _tailer(tmp_path, state)  # a restart
    t2.load()
    t2.rescan()
    rec2 = Recorder()
    await t2.pump(rec2)
    assert rec.seqs() == list(range(10)) and rec2.seqs() == list(range(10, 15))
    # a different file that reuses the inode number (fingerprint differs) starts at 0
    log.unlink()
    (d / "y.log").write_bytes(b"other content seq=99\n")
    t3 = _tailer(tmp_path, state)
    t3.load()
    t3.rescan()
    rec3 = Recorder()
    await t3.pump(rec3)
    assert rec3.seqs() == [99]


def test_checkpoint_is_versioned_and_atomic(tmp_path: Path) -> None:
    import json

    d = _logdir(tmp_path)
    (d / "x.log").write_bytes(b"l seq=0\n")
    state = tmp_path / "ckpt.json"
    t = _tailer(tmp_path, state)
    t.rescan()
    asyncio.run(t.pump(Recorder()))
    data = json.loads(state.read_text())
    assert data["version"] == 1 and data["files"][0]["offset"] == 8
    assert not list(tmp_path.glob(".ckpt.json.tmp"))
    state.write_text('{"version": 99, "files": []}')  # a future format: ignored, not misread
    t2 = _tailer(tmp_path, state)
    t2.load()
    assert t2._restored == {}


@pytest.mark.parametrize("garbage", [b"", b"not json", b'{"version": 1, "files": "x"}'])
def test_corrupt_checkpoint_is_ignored(tmp_path: Path, garbage: bytes) -> None:
    state = tmp_path / "ckpt.json"
    state.write_bytes(garbage)
    t = _tailer(tmp_path, state)
    t.load()
    assert t._restored == {}


async def test_symlinks_are_followed_only_inside_the_configured_roots(tmp_path: Path) -> None:
    """#13 D15: a link in the (job-writable) log dir to a file elsewhere is never read."""
    root = tmp_path / "root"
    d = _logdir(root)
    secret = root / "etc" / "shadow"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"root:$6$secret:19000:0:99999:7:::\n")
    (d / "evil.log").symlink_to(secret)
    (d / "real.log").write_bytes(b"host:1:1 [0] NCCL INFO fine\n")
    (d / "alias.log").symlink_to(d / "real.log")  # inside the root: still followed
    t = _tailer(root)
    t.rescan()
    (only,) = t.files.values()  # real.log and its alias are one file (one inode)
    assert only.path in ("/var/log/nccl/real.log", "/var/log/nccl/alias.log")
    assert t.stats["outside_roots"] == 1
    assert all("shadow" not in tf.path for tf in t.files.values())


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_descriptors_are_bounded_and_parked_files_are_reopened_on_growth(tmp_path: Path) -> None:
    """D7: 300 job logs under a cap of 16 descriptors; every line of every file still arrives,
    including lines appended to a parked file later, and nothing is read twice."""
    d = _logdir(tmp_path)
    for i in range(300):
        (d / f"job{i}.log").write_bytes(b"host:1:1 [0] NCCL INFO file=%d seq=0\n" % i)
    t = _tailer(tmp_path, tmp_path / "state.json", max_open=16, idle_close=3600)
    rec = Recorder()
    before = _fds()
    peak = 0

    def all_first() -> bool:
        nonlocal peak
        peak = max(peak, _fds() - before)
        return len(rec.lines) == 300 and t.open_files <= 16

    task = asyncio.create_task(t.run(rec))
    try:
        deadline = time.monotonic() + 20
        while not all_first():
            assert time.monotonic() < deadline, (len(rec.lines), t.open_files)
            await asyncio.sleep(0.02)
        assert t.stats["files_parked"] >= 284
        # append to files that are certainly parked now: inotify wakes a rescan that reopens them
        parked = [tf for tf in t.files.values() if tf.fd is None]
        assert len(parked) >= 284
        for tf in parked[:40]:
            with open(tmp_path / tf.path.lstrip("/"), "ab") as fh:
                fh.write(b"host:1:1 [0] NCCL INFO later seq=1\n")
        deadline = time.monotonic() + 20
        while len(rec.lines) < 340:
            assert time.monotonic() < deadline, len(rec.lines)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(rec.lines) == 340 and len(set(rec.lines)) == 300 + 1  # 300 first lines, 40 identical "later"
    assert t.stats["files_reopened"] >= 40
    # 300 files were read with at most a handful more descriptors than the cap (a read in flight)
    assert peak <= 16 + 8, peak
    assert _fds() <= before + 1  # run() ended: nothing left open


async def test_a_consumer_exception_restarts_from_the_checkpoint(tmp_path: Path) -> None:
    """D6: run() ends with the consumer's exception; the next run() (the supervisor's restart) reopens
    every file from its offset, so nothing is lost and nothing read twice."""
    d = _logdir(tmp_path)
    (d / "a.log").write_bytes(b"".join(b"host:1:1 [0] NCCL INFO x seq=%d\n" % i for i in range(5)))
    t = _tailer(tmp_path, None)  # no checkpoint file: the offsets kept in memory must be enough
    rec = Recorder()
    boom = {"armed": True}

    async def handler(tf: TailedFile, data: bytes, base: int) -> bool:
        if boom["armed"] and b"seq=7" in data:
            boom["armed"] = False
            raise RuntimeError("consumer bug")
        return await rec(tf, data, base)

    task = asyncio.create_task(t.run(handler))
    deadline = time.monotonic() + 10
    while len(rec.lines) < 5:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    with open(d / "a.log", "ab") as fh:
        fh.write(b"".join(b"host:1:1 [0] NCCL INFO x seq=%d\n" % i for i in range(5, 10)))
    with pytest.raises(RuntimeError, match="consumer bug"):
        await asyncio.wait_for(task, 10)
    assert not t.files and t.stats["runs_ended"] == 1  # descriptors closed, entries not kept half-dead
    await _run_until(t, rec, lambda: len(rec.lines) == 10)
    assert rec.seqs() == list(range(10))


def test_checkpoint_entries_of_the_wrong_type_are_counted_and_ignored(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"version": 1, "files": [{"dev": "1", "ino": 2, "path": "/x", "offset": 0, "fp": "", '
                     '"fp_len": 0}, {"dev": 1, "ino": 2, "path": "/x", "offset": -5, "fp": "", "fp_len": 0}, '
                     '{"dev": 1, "ino": 3, "path": "/x", "offset": 5, "fp": "ab", "fp_len": 2, '
                     '"pending": {"from": "0"}}, [], {"dev": 1, "ino": 4, "path": "/y", "offset": 9, "fp": "ab", '
                     '"fp_len": 2, "pending": {"from": 0, "ms": 1}}]}')
    t = _tailer(tmp_path, state)
    t.load()
    assert list(t._restored) == ["1:4"] and t.stats["bad_checkpoints"] == 4


async def test_a_link_swapped_after_the_scan_looked_is_refused_on_what_was_opened(tmp_path: Path,
                                                                                 monkeypatch: Any) -> None:
    """Issue 20 deliver 5: the scan checks a link's target, then opens it by name; a job that swaps the
    link to a file outside the roots in between must not get that file read. The check is made on the
    opened descriptor (/proc/self/fd), and a FIFO swapped in never blocks the open."""
    root = tmp_path / "root"
    d = _logdir(root)
    secret = root / "etc" / "shadow"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"root:$6$secret:19000:0:99999:7:::\n")
    (d / "real.log").write_bytes(b"host:1:1 [0] NCCL INFO fine\n")
    (d / "sub").mkdir()
    (d / "sub" / "other").write_bytes(b"host:2:2 [0] NCCL INFO fine\n")
    (d / "swap.log").symlink_to(d / "sub" / "other")  # inside the root when the scan looks
    t = _tailer(root)
    swapped = {k: v for k, v in t._matches().items() if v[0].endswith("real.log")}

    def swap_then_match() -> dict[tuple[int, int], tuple[str, int]]:
        (d / "swap.log").unlink()
        (d / "swap.log").symlink_to(secret)  # after the scan checked it, before the open
        st = os.stat(d / "swap.log")
        return {**swapped, (st.st_dev, st.st_ino): (str(d / "swap.log"), st.st_size)}

    monkeypatch.setattr(t, "_matches", swap_then_match)
    t.rescan()
    assert [f.path for f in t.files.values()] == ["/var/log/nccl/real.log"]
    assert t.stats["outside_roots"] == 1
    os.mkfifo(d / "fifo.log")
    st = os.stat(d / "fifo.log")
    assert t._open(st.st_dev, st.st_ino, str(d / "fifo.log")) is None  # not a regular file: refused at once


class Holding(Recorder):
    """Takes each chunk but its last ``hold`` lines (a consumer waiting for a record's end), ``calls`` times; runs
    ``during(n)`` while it has the n-th chunk (the reading thread's read-ahead of the next one is in flight)."""

    def __init__(self, hold: int = 0, refuse_at: int = -1, during: Any = None) -> None:
        super().__init__()
        self.hold, self.refuse_at, self.during, self.n = hold, refuse_at, during, 0
        self.chunks: list[tuple[int, int]] = []

    async def __call__(self, tf: TailedFile, data: bytes, base: int) -> bool:
        self.n += 1
        if self.during is not None:
            self.during(self.n)
        await asyncio.sleep(0)  # the read-ahead's thread runs meanwhile
        if self.n == self.refuse_at:
            return False
        self.chunks.append((base, len(data)))
        lines = data.splitlines(keepends=True)
        if self.hold and len(lines) > self.hold and len(data) > 4096:
            keep = lines[: -self.hold]
            tf.unfinished = len(data) - sum(map(len, keep))
            lines = keep
        self.lines.extend(x.rstrip(b"\n") for x in lines)
        return True


def _numbered(path: Path, n: int, width: int = 0) -> None:
    path.write_bytes(b"".join(b"host:1:1 [0] NCCL INFO %s seq=%d\n" % (b"x" * ((i * 7919) % (width + 1)), i)
                              for i in range(n)))


@pytest.mark.parametrize("hold", [0, 3])
async def test_read_ahead_gives_every_line_once_in_order(tmp_path: Path, hold: int) -> None:
    """Chunks read ahead while the consumer has the one before are used only where the consumer took all of it;
    a consumer that holds a tail, or refuses a chunk, gets the same lines, each once, in order."""
    log = _logdir(tmp_path) / "x.log"
    _numbered(log, 20000, width=90)
    for refuse_at in (-1, 5):
        t = _tailer(tmp_path, chunk_bytes=8192)
        t.rescan()
        rec = Holding(hold=hold, refuse_at=refuse_at)
        while await t.pump(rec) or rec.n == refuse_at:
            pass
        with open(log, "ab") as fh:  # a held tail is read again, with what follows, once the file grows
            fh.write(b"host:1:1 [0] NCCL INFO end seq=20000\n")
        while await t.pump(rec):
            pass
        assert rec.seqs() == list(range(20001)), (hold, refuse_at)
        with open(log, "r+b") as fh:
            fh.truncate(log.stat().st_size - len(b"host:1:1 [0] NCCL INFO end seq=20000\n"))
        offsets = [b for b, _ in rec.chunks]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


async def test_a_truncation_while_the_consumer_works_is_seen(tmp_path: Path) -> None:
    """copytruncate while a chunk is being judged (its next one read ahead, or about to be): the rest of the old
    content is not taken for the new file's, and the new file is read from its start."""
    log = _logdir(tmp_path) / "x.log"
    _numbered(log, 5000)

    def truncate(n: int) -> None:
        if n == 3:
            with open(log, "r+b") as fh:
                fh.truncate(0)
                fh.write(b"new seq=100000\n")

    t = _tailer(tmp_path, chunk_bytes=4096)
    t.rescan()
    rec = Holding(during=truncate)
    await t.pump(rec)
    await t.pump(rec)
    seqs = rec.seqs()
    assert seqs[-1] == 100000 and t.stats["truncations"] == 1
    old = seqs[:-1]
    assert old == list(range(len(old))), "the old content in order, each line once"
    assert len(old) < 5000


async def test_no_read_is_left_running_when_the_consumer_fails(tmp_path: Path) -> None:
    log = _logdir(tmp_path) / "x.log"
    _numbered(log, 5000)
    t = _tailer(tmp_path, chunk_bytes=4096)
    t.rescan()

    async def boom(tf: TailedFile, data: bytes, base: int) -> bool:
        raise RuntimeError("consumer bug")

    with pytest.raises(RuntimeError):
        await t.pump(boom)
    assert threading.active_count() >= 1
    tf = next(iter(t.files.values()))
    assert tf.offset == 0, "nothing accepted"
    rec = Recorder()
    await t.pump(rec)
    assert rec.seqs() == list(range(5000))
