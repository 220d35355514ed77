"""Durable on-disk spool between the local bus and NATS.

A message is *accepted* once its frame is written and fsync'd; it leaves the spool only
after JetStream acknowledged it (``ack``). Segments are append-only files named by their
first sequence number; a frame is ``<u32 len><u32 crc32><u64 seq><u8 severity>payload``.
Recovery truncates a torn tail (a frame never fsync'd was never accepted).

When full, the policy decides (docs/spool.md):
- ``drop_oldest_info_first``: compact info-level records out of the oldest segments; if
  none are left, refuse a new info record, else drop the oldest segment.
- ``drop_newest``: refuse the new record.
- ``drop_oldest``: drop the oldest segment.
Records already handed to the forwarder (in flight) are never dropped. Every drop is
counted per severity and persisted, so the forwarder can announce it after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gna_sdk.aio import wait_event
from gna_sdk.statefile import read_state, write_atomic, write_state

log = structlog.get_logger(__name__)

HEADER = struct.Struct("<IIQB")


def _valid_state(raw: dict[str, Any]) -> bool:
    def count(v: Any) -> bool:
        return type(v) is int and v >= 0

    def triple(v: Any) -> bool:
        return isinstance(v, list) and len(v) == 3 and all(count(x) for x in v)

    return count(raw.get("acked_seq", 0)) and triple(raw.get("dropped", [0, 0, 0])) and \
        triple(raw.get("announced", [0, 0, 0]))


MAX_FRAME_PAYLOAD = 16 * 1024 * 1024
SEVERITY_CODES = {"info": 0, "warning": 1, "critical": 2}
SEVERITY_NAMES = {v: k for k, v in SEVERITY_CODES.items()}
STATE_VERSION = 1


class SpoolError(Exception):
    pass


@dataclass
class Segment:
    first_seq: int
    path: Path
    size: int = 0
    count: int = 0
    last_seq: int = 0
    per_severity: list[int] = field(default_factory=lambda: [0, 0, 0])
    generation: int = 0


@dataclass(frozen=True)
class Record:
    seq: int
    severity: int
    payload: bytes


def _crc(seq: int, severity: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<QB", seq, severity)))


def encode_frame(seq: int, severity: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), _crc(seq, severity, payload), seq, severity) + payload


def decode_frames(data: bytes) -> tuple[list[Record], int]:
    """Parse frames from ``data``; returns the good records and the length of the valid prefix."""
    out: list[Record] = []
    pos = 0
    n = len(data)
    while pos + HEADER.size <= n:
        length, crc, seq, sev = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if length > MAX_FRAME_PAYLOAD or end > n or sev > 2:
            break
        payload = data[pos + HEADER.size : end]
        if _crc(seq, sev, payload) != crc:
            break
        out.append(Record(seq, sev, bytes(payload)))
        pos = end
    return out, pos


def next_valid_frame(data: bytes, start: int, after_seq: int) -> int | None:
    """Offset of the first intact frame at or after ``start`` whose seq follows ``after_seq``: where
    reading resumes past a damaged frame. None when only a torn tail (or garbage) remains."""
    n = len(data)
    for pos in range(start, n - HEADER.size + 1):
        length, crc, seq, sev = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if sev > 2 or length > MAX_FRAME_PAYLOAD or end > n or seq <= after_seq:
            continue
        if _crc(seq, sev, data[pos + HEADER.size : end]) == crc:
            return pos
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



class Spool:
    def __init__(self, directory: str | Path, *, max_bytes: int = 256 << 20, segment_bytes: int = 4 << 20,
                 policy: str = "drop_oldest_info_first", fsync: bool = True) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.policy = policy
        self.fsync = fsync
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._active_fd: int | None = None
        self._next_seq = 1
        self._acked = 0
        self._reserved = 0  # highest seq handed to the reader since the last rewind
        self._depth = 0
        self._bytes = 0
        self.dropped = [0, 0, 0]  # per severity, cumulative, persisted
        self.announced = [0, 0, 0]
        self.write_errors = 0  # since start (metrics, the health text)
        self.failing = False  # the last batch failed: cleared by the next good one
        # damage found at open: segments, bytes skipped, records lost (seq gaps); announced once
        self.corruption = {"segments": 0, "bytes": 0, "records": 0}
        self._pending: list[tuple[int, bytes, asyncio.Future[int | None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._new_data = asyncio.Event()
        self._rotate_requested = False
        self._read_hint: tuple[int, int, int, int] | None = None  # (first_seq, generation, offset, last_seq)
        self.on_drop: Callable[[int, int], None] | None = None  # (severity, count)

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = self._load_state()
        self._acked = state.get("acked_seq", 0)
        self.dropped = list(state.get("dropped", [0, 0, 0]))
        self.announced = list(state.get("announced", [0, 0, 0]))
        for tmp in self.dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        last_seq = self._acked
        for path in sorted(self.dir.glob("*.seg")):
            seg = self._recover_segment(path)
            if seg is None:
                continue
            if seg.count and seg.last_seq <= self._acked:
                path.unlink(missing_ok=True)
                continue
            self._segments.append(seg)
            last_seq = max(last_seq, seg.last_seq, seg.first_seq - 1)
        self._next_seq = last_seq + 1
        self._bytes = sum(s.size for s in self._segments)
        self._reserved = self._acked
        self._open_active()

    def _recover_segment(self, path: Path) -> Segment | None:
        try:
            first = int(path.stem)
        except ValueError:
            return None
        data = path.read_bytes()
        records, good = decode_frames(data)
        if good < len(data):
            # A damaged frame mid-segment (a flipped byte) must not take every later record with it:
            # resume at the next intact frame, count what was skipped, and rewrite the segment whole.
            skipped = 0
            while good < len(data):
                nxt = next_valid_frame(data, good + 1, records[-1].seq if records else first - 1)
                if nxt is None:
                    break  # a torn tail: what a crash mid-write leaves
                skipped += nxt - good
                more, used = decode_frames(data[nxt:])
                records += more
                good = nxt + used
            if skipped:
                lost = sum(b.seq - a.seq - 1 for a, b in itertools.pairwise(records) if b.seq > a.seq + 1)
                self.corruption["segments"] += 1
                self.corruption["bytes"] += skipped
                self.corruption["records"] += lost
                write_atomic(path, b"".join(encode_frame(r.seq, r.severity, r.payload) for r in records))
                good = path.stat().st_size
            else:
                with open(path, "r+b") as fh:
                    fh.truncate(good)
                    os.fsync(fh.fileno())
        seg = Segment(first_seq=first, path=path, size=good)
        for r in records:
            seg.count += 1
            seg.last_seq = r.seq
            seg.per_severity[r.severity] += 1
            if r.seq > self._acked:
                self._depth += 1
        return seg

    def _load_state(self) -> dict[str, Any]:
        # re-sent records after a set-aside are duplicates the stream's Msg-Id window drops
        return read_state(self.dir / "state.json", version=STATE_VERSION, valid=_valid_state, what="spool pointer",
                          hint="the acknowledged pointer restarts at 0; NATS drops the duplicates")

    def _save_state(self) -> None:
        # The pointer may lag by a batch after a crash: re-sent records are dropped by the
        # stream's Msg-Id duplicate window, so no fsync is needed here.
        write_state(self.dir / "state.json", {"acked_seq": self._acked, "dropped": self.dropped,
                                              "announced": self.announced}, version=STATE_VERSION)

    def _open_active(self) -> None:
        if not self._segments or self._segments[-1].size >= self.segment_bytes:
            seg = Segment(first_seq=self._next_seq, path=self.dir / f"{self._next_seq:020d}.seg")
            seg.last_seq = self._next_seq - 1
            self._segments.append(seg)
        active = self._segments[-1]
        self._active_fd = os.open(active.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if self.fsync:
            _fsync_dir(self.dir)

    def close(self) -> None:
        with self._lock:
            if self._active_fd is not None:
                os.close(self._active_fd)
                self._active_fd = None

    # -- stats -----------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self._depth

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def acked_seq(self) -> int:
        return self._acked

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def unannounced_drops(self) -> list[int]:
        return [d - a for d, a in zip(self.dropped, self.announced, strict=True)]

    def mark_announced(self, counts: list[int]) -> None:
        with self._lock:
            self.announced = [a + c for a, c in zip(self.announced, counts, strict=True)]
            self._save_state()

    # -- append ----------------------------------------------------------------------
    async def append(self, severity: str, payload: bytes) -> int | None:
        """Durably append; returns the sequence number, or None when the policy dropped it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        self._pending.append((SEVERITY_CODES[severity], payload, fut))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_loop())
        return await fut

    async def _write_loop(self) -> None:
        # Group commit: everything queued while one fsync runs goes into the next.
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                seqs = await asyncio.to_thread(self._write_batch, [(s, p) for s, p, _ in batch])
            except Exception as exc:
                self.write_errors += 1
                self.failing = True
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(SpoolError(f"spool write failed: {exc}"))
                continue
            self.failing = False
            for (_, _, fut), seq in zip(batch, seqs, strict=True):
                if not fut.done():
                    fut.set_result(seq)
            self._new_data.set()

    def _write_batch(self, items: list[tuple[int, bytes]]) -> list[int | None]:
        out: list[int | None] = []
        dirty = False
        with self._lock:
            if self._rotate_requested:
                self._rotate_requested = False
                active = self._segments[-1]
                if active.count and active.last_seq <= self._acked:
                    self._rotate()
                    self._remove_segment(self._segments[0])
            for sev, payload in items:
                if len(payload) > MAX_FRAME_PAYLOAD:
                    raise SpoolError(f"record of {len(payload)} bytes exceeds {MAX_FRAME_PAYLOAD}")
                size = HEADER.size + len(payload)
                if not self._make_room(size, sev):
                    self._count_drop(sev, 1)
                    out.append(None)
                    continue
                active = self._segments[-1]
                if active.size and active.size + size > self.segment_bytes:
                    self._rotate()
                    active = self._segments[-1]
                seq = self._next_seq
                frame = encode_frame(seq, sev, payload)
                assert self._active_fd is not None
                self._write_all(self._active_fd, frame, active.size)
                self._next_seq += 1
                active.size += size
                active.count += 1
                active.last_seq = seq
                active.per_severity[sev] += 1
                self._bytes += size
                self._depth += 1
                dirty = True
                out.append(seq)
            fd = self._active_fd
        # Only this (writer) thread closes or rotates the active fd, so the flush can run
        # without the lock; the reader may see a record before it is durable, which is harmless.
        if dirty and self.fsync and fd is not None:
            os.fdatasync(fd)
        return out

    @staticmethod
    def _write_all(fd: int, frame: bytes, size_before: int) -> None:
        """Write a whole frame or nothing: a full disk (ENOSPC) must not leave half a frame behind,
        or recovery would cut every later record at it."""
        view = memoryview(frame)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size_before)
            raise

    def _rotate(self) -> None:
        if self._active_fd is not None:
            if self.fsync:
                os.fdatasync(self._active_fd)
            os.close(self._active_fd)
            self._active_fd = None
        seg = Segment(first_seq=self._next_seq, path=self.dir / f"{self._next_seq:020d}.seg")
        seg.last_seq = self._next_seq - 1
        self._segments.append(seg)
        self._active_fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if self.fsync:
            _fsync_dir(self.dir)

    # -- overflow policy -------------------------------------------------------------
    def _count_drop(self, sev: int, n: int) -> None:
        self.dropped[sev] += n
        if self.on_drop:
            self.on_drop(sev, n)

    def _candidates(self) -> list[Segment]:
        """Closed segments none of whose records is in flight."""
        return [s for s in self._segments[:-1] if s.first_seq > self._reserved and s.count]

    def _make_room(self, size: int, sev: int) -> bool:
        dropped_any = False
        while self._bytes + size > self.max_bytes:
            if self.policy == "drop_newest":
                return False
            if not self._candidates() and self._segments[-1].count and self._segments[-1].first_seq > self._reserved:
                self._rotate()  # let the active segment become droppable
            if self.policy == "drop_oldest_info_first":
                if self._compact_info():
                    dropped_any = True
                    continue
                if sev == 0:
                    return False
            if self._drop_oldest():
                dropped_any = True
                continue
            return False
        if dropped_any:
            self._save_state()
        return True

    def _compact_info(self) -> bool:
        for seg in self._candidates():
            if not seg.per_severity[0]:
                continue
            records, _ = decode_frames(seg.path.read_bytes())
            keep = [r for r in records if r.severity != 0]
            removed = len(records) - len(keep)
            if keep:
                data = b"".join(encode_frame(r.seq, r.severity, r.payload) for r in keep)
                write_atomic(seg.path, data, fsync=self.fsync)
                self._bytes += len(data) - seg.size
                seg.size = len(data)
                seg.count = len(keep)
                seg.per_severity[0] = 0
                seg.generation += 1
            else:
                self._remove_segment(seg)
            self._depth -= removed
            self._count_drop(0, removed)
            return True
        return False

    def _drop_oldest(self) -> bool:
        cands = self._candidates()
        if not cands:
            return False
        seg = cands[0]
        for sev, n in enumerate(seg.per_severity):
            if n:
                self._count_drop(sev, n)
        self._depth -= seg.count
        self._remove_segment(seg)
        return True

    def _remove_segment(self, seg: Segment) -> None:
        self._segments.remove(seg)
        self._bytes -= seg.size
        seg.path.unlink(missing_ok=True)

    # -- read / ack (the forwarder) --------------------------------------------------
    def read(self, after_seq: int, limit: int) -> list[Record]:
        """Up to ``limit`` records with seq > after_seq, in order. Thread-safe."""
        out: list[Record] = []
        with self._lock:
            segs = [(s.first_seq, s.generation, s.path, s.size, s.last_seq) for s in self._segments
                    if s.last_seq > after_seq and s.count]
            hint = self._read_hint
        cursor = after_seq
        for first, gen, path, size, _last in segs:
            if len(out) >= limit:
                break
            start = 0
            if hint and hint[0] == first and hint[1] == gen and hint[3] == cursor:
                start = hint[2]
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(size - start)
            except FileNotFoundError:
                continue  # dropped by policy meanwhile
            pos = 0
            while pos + HEADER.size <= len(data) and len(out) < limit:
                length, _crc_v, seq, sev = HEADER.unpack_from(data, pos)
                end = pos + HEADER.size + length
                if end > len(data) or sev > 2:
                    break
                if seq > cursor:
                    if _crc(seq, sev, data[pos + HEADER.size : end]) != _crc_v:
                        break  # raced with a compaction rewrite: re-read from scratch next time
                    out.append(Record(seq, sev, data[pos + HEADER.size : end]))
                    cursor = seq
                pos = end
            hint = (first, gen, start + pos, cursor)
        with self._lock:
            self._read_hint = hint
            if out:
                self._reserved = max(self._reserved, out[-1].seq)
        return out

    def rewind(self) -> None:
        """The forwarder gave back what it had in flight (publish failed): droppable again."""
        with self._lock:
            self._reserved = self._acked

    def ack(self, seq: int, count: int) -> None:
        """Everything up to ``seq`` (``count`` records past the previous ack) is stored upstream."""
        with self._lock:
            if seq <= self._acked:
                return
            self._acked = seq
            self._depth = max(0, self._depth - count)
            while len(self._segments) > 1 and self._segments[0].last_seq <= seq:
                self._remove_segment(self._segments[0])
            active = self._segments[-1]
            if active.count and active.last_seq <= seq and active.size >= self.segment_bytes // 4:
                self._rotate_requested = True  # the writer thread owns the active fd
            self._save_state()

    async def wait_new(self, after_seq: int, timeout: float) -> None:
        if self.last_seq > after_seq:
            return
        self._new_data.clear()
        if self.last_seq > after_seq:
            return
        await wait_event(self._new_data, timeout)

    async def flush(self) -> None:
        """Wait until every queued append is on disk."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
