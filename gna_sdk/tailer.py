"""Follow log files through rotation without loss: Vector / Fluent Bit style.

A file is identified by (device, inode) plus a fingerprint of its first bytes, never by path.
Files are found by globs under the host root (inotify on their directories, plus a periodic
rescan) and read through an open descriptor, so a file that is renamed (rename+create rotation),
deleted or replaced behind a symlink is drained to its end. A file that shrinks (copytruncate)
or whose first bytes change starts over. Offsets only advance when the consumer says the lines
were accepted; checkpoints are written atomically (write, then rename) with a version field.

Bounded descriptors: a file read to its end and idle for ``idle_close`` seconds (or the least
recently active ones beyond ``max_open``) is parked: its descriptor closed, its entry and offset
kept; the next rescan (inotify wakes one on any write in the directory) reopens it when its size
moved, checking inode and fingerprint. A run() that ends (a consumer's exception) forgets its
descriptors and keeps the offsets, so the next run() reopens every file from its checkpoint.

Hostile input: a line cut in half at EOF waits for its end; with ``max_line`` set, a longer
line is cut (counted; consumers that only decode a few lines cap those instead); a run of
bytes with no newline for a whole chunk is skipped to the next newline
(counted); binary is passed through as bytes (the consumer decodes only what it matches).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import gzip
import hashlib
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gna_sdk.aio import aligned_delay, wait_event
from gna_sdk.hostroot import HostRoot
from gna_sdk.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    Inotify,
    InotifyEvent,
)
from gna_sdk.statefile import write_state

log = structlog.get_logger(__name__)

CHECKPOINT_VERSION = 1
_ENTRY_TYPES = {"dev": int, "ino": int, "path": str, "offset": int, "fp": str, "fp_len": int}


def _valid_entry(f: Any) -> dict[str, Any] | None:
    """A checkpoint entry with the types it must have (a hand-edited or damaged file is not trusted)."""
    if not isinstance(f, dict):
        return None
    for k, t in _ENTRY_TYPES.items():
        v = f.get(k)
        if not isinstance(v, t) or isinstance(v, bool) or (isinstance(v, int) and v < 0):
            return None
    if not isinstance(f.get("first_seen_ms", 0), int) or not isinstance(f.get("pending"), dict | None):
        return None
    pending = f.get("pending")
    if pending is not None and not all(isinstance(pending.get(k), int) for k in ("from", "ms")):
        return None
    return dict(f)
DIR_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE_SELF | \
    IN_MOVE_SELF

# handler(file, data, base_offset) -> True when everything derived from data was accepted.
Handler = Callable[["TailedFile", bytes, int], Awaitable[bool]]


@dataclass
class Chunk:
    """Whole lines read from ``offset``; ``end``: where the next read starts (past a skipped newline-less run)."""
    offset: int
    data: bytes
    end: int
    full: bool  # the read filled a whole chunk: more is likely there
    skipped: int = 0  # bytes of a run without a newline skipped
    cut: int = 0  # lines longer than max_line cut there


@dataclass
class TailedFile:
    dev: int
    ino: int
    path: str  # host path it was last seen at (for messages; identity is dev/ino/fingerprint)
    offset: int = 0
    fp: str = ""
    fp_len: int = 0
    first_seen_ms: int = 0
    pending: dict[str, Any] | None = None  # consumer's in-flight batch (see nccl_logs)
    fd: int | None = None
    last_data: float = 0.0  # monotonic time of the last read or (re)open
    gone_since: float | None = None  # no glob path leads to it any more
    oversize_lines: int = 0
    skipped_bytes: int = 0
    # bytes at the end of the last chunk the consumer could not use yet (a record its writer continues in
    # the next one, e.g. a container runtime's partial line): read again, with what follows, once the file
    # grows past held_size
    unfinished: int = 0
    held_size: int = -1

    @property
    def key(self) -> str:
        return f"{self.dev}:{self.ino}"

    def to_json(self) -> dict[str, Any]:
        return {"dev": self.dev, "ino": self.ino, "path": self.path, "offset": self.offset, "fp": self.fp,
                "fp_len": self.fp_len, "first_seen_ms": self.first_seen_ms, "pending": self.pending}


def _gunzip(path: str, limit: int) -> bytes:
    """A compressed generation's content, at most ``limit`` bytes (a gzip bomb is cut, not expanded)."""
    with gzip.open(path, "rb") as fh:
        return fh.read(limit)


def fingerprint(fd: int, nbytes: int) -> tuple[str, int]:
    head = os.pread(fd, nbytes, 0)
    return hashlib.blake2b(head, digest_size=12).hexdigest(), len(head)


class Tailer:
    def __init__(self, host: HostRoot, globs: list[str], state_file: Path | None, *, chunk_bytes: int = 1 << 20,
                 max_line: int = 0, fp_bytes: int = 256, rescan_interval: float = 10.0,
                 linger: float = 5.0, debounce: float = 0.05, max_open: int = 256,
                 idle_close: float = 300.0, rotated: list[str] | None = None, gz_max: int = 256 << 20) -> None:
        self.host = host
        self.globs = globs
        self.state_file = state_file
        self.chunk_bytes = chunk_bytes
        self.max_line = max_line
        self.fp_bytes = fp_bytes
        self.rescan_interval = rescan_interval
        self.linger = linger
        self.debounce = debounce
        self.max_open = max_open
        self.idle_close = idle_close
        self.files: dict[str, TailedFile] = {}
        # globs of rotated generations (the kubelet's "0.log.<time>" and "0.log.<time>.gz"): only a generation
        # this tailer was reading when it stopped is read, from where it stopped -- the uncompressed one by its
        # inode, a compressed one by the fingerprint of its first bytes; any other generation is old news
        self.rotated = list(rotated or [])
        self.gz_max = gz_max
        self._gz: dict[str, str] = {}  # checkpoint key -> the .gz generation that holds its unread rest
        self._restored: dict[str, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._watch: Inotify | None = None
        self._deferred = 0  # files found but not opened: the descriptor cap was reached
        self._watched_dirs: dict[str, int] = {}
        self.stats = {"lines_cut": 0, "bytes_skipped": 0, "truncations": 0, "rotations": 0, "files_opened": 0,
                      "files_closed": 0, "read_errors": 0, "outside_roots": 0, "files_parked": 0,
                      "files_reopened": 0, "runs_ended": 0, "bad_checkpoints": 0, "rotated_resumed": 0,
                      "gz_resumed": 0, "gz_errors": 0}

    def wake(self) -> None:
        """Rescan at once (a consumer added a glob)."""
        self._wake.set()

    # -- checkpoints ------------------------------------------------------------------
    def load(self) -> None:
        if self.state_file is None:
            return
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("version") == CHECKPOINT_VERSION and isinstance(data.get("files"), list):
            saved = {}
            for f in data["files"]:
                entry = _valid_entry(f)
                if entry is None:
                    self.stats["bad_checkpoints"] += 1
                    continue
                saved[f"{entry['dev']}:{entry['ino']}"] = entry
            # what this process still remembers (a run() that ended) is at least as new as the file
            self._restored = {**saved, **self._restored}

    def save(self) -> None:
        if self.state_file is None:
            return
        write_state(self.state_file, {"files": [f.to_json() for f in self.files.values()]}, version=CHECKPOINT_VERSION)

    # -- discovery --------------------------------------------------------------------
    def _roots(self) -> list[str]:
        """The real directories the globs name (their non-magic prefix): a symlink may point only inside."""
        out = []
        for pattern in self.globs:
            d = str(self.host.path(pattern))
            while glob.has_magic(d):
                d = os.path.dirname(d)
            out.append(os.path.realpath(d))
        return out

    def _matches(self) -> dict[tuple[int, int], tuple[str, int]]:
        found: dict[tuple[int, int], tuple[str, int]] = {}
        roots = self._roots()
        for pattern in self.globs:
            for path in glob.glob(str(self.host.path(pattern))):
                real = os.path.realpath(path)
                if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
                    # a link in a job-writable log dir to /etc/shadow or another job's file: not ours to read
                    self.stats["outside_roots"] += 1
                    if self.stats["outside_roots"] == 1:
                        log.warning("tail_symlink_outside_roots", path=self._host_path(path), roots=self.globs)
                    continue
                try:
                    st = os.stat(path)  # follows symlinks: a swapped link is a new file
                except OSError:
                    continue
                if os.path.isfile(path):
                    found.setdefault((st.st_dev, st.st_ino), (path, st.st_size))
        return found

    def _host_path(self, real: str) -> str:
        root = str(self.host.root)
        return "/" + os.path.relpath(real, root) if real.startswith(root) else real

    def _inside_roots(self, fd: int) -> bool:
        """Where the descriptor really is (the kernel's own path of the opened file, /proc/self/fd): a
        link a job swapped to a file outside the globs' directories after _matches() looked is refused
        here, on what was opened, not on a path checked before (issue 20: never check, then open)."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        if any(real == r or real.startswith(r.rstrip("/") + "/") for r in self._roots()):
            return True
        self.stats["outside_roots"] += 1
        log.warning("tail_opened_outside_roots", path=real[:300], roots=self.globs)
        return False

    def _open(self, dev: int, ino: int, path: str) -> TailedFile | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO swapped in never blocks
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (dev, ino) or not stat.S_ISREG(st.st_mode) or not self._inside_roots(fd):
            os.close(fd)  # replaced between stat and open, or not where the globs point
            return None
        tf = TailedFile(dev, ino, self._host_path(path), fd=fd, first_seen_ms=int(time.time() * 1000))
        tf.fp, tf.fp_len = fingerprint(fd, self.fp_bytes)
        tf.last_data = time.monotonic()
        saved = self._restored.pop(tf.key, None)
        if saved and saved.get("fp_len", 0) <= tf.fp_len:
            head_fp = fingerprint(fd, saved["fp_len"])[0] if saved["fp_len"] != tf.fp_len else tf.fp
            if head_fp == saved.get("fp") and saved.get("offset", 0) <= st.st_size:
                tf.offset = int(saved["offset"])
                tf.first_seen_ms = int(saved.get("first_seen_ms") or tf.first_seen_ms)
                tf.pending = saved.get("pending")
        self.stats["files_opened"] += 1
        return tf

    def rescan(self) -> None:
        now = time.monotonic()
        matches = self._matches()
        room = self.max_open - self.open_files
        self._deferred = 0
        for (dev, ino), (path, size) in matches.items():
            key = f"{dev}:{ino}"
            tf = self.files.get(key)
            if tf is None:
                if room <= 0:
                    self._deferred += 1  # opened once others are read to their end and parked
                    continue
                tf = self._open(dev, ino, path)
                if tf is not None:
                    self.files[key] = tf
                    room -= 1
            else:
                if tf.fd is None and size != tf.offset:
                    if room <= 0:
                        self._deferred += 1
                    else:
                        self._reopen(tf, path)
                        room -= tf.fd is not None
                if tf.path != self._host_path(path):
                    self.stats["rotations"] += 1
                    tf.path = self._host_path(path)
                tf.gone_since = None
        for tf in list(self.files.values()):
            if (tf.dev, tf.ino) in matches:
                continue
            if tf.gone_since is None:
                tf.gone_since = now
        if self.rotated and self._restored:
            self._resume_rotated(room)
        self._watch_dirs()

    def _resume_rotated(self, room: int) -> None:
        """Checkpointed files that were rotated while this process was down: drained from where it stopped."""
        for pattern in self.rotated:
            for path in glob.glob(str(self.host.path(pattern))):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                key = f"{st.st_dev}:{st.st_ino}"
                if key in self._restored and not path.endswith(".gz") and room > 0 and key not in self.files:
                    tf = self._open(st.st_dev, st.st_ino, path)
                    if tf is not None:
                        self.files[key] = tf
                        tf.gone_since = time.monotonic()  # no live glob names it: closed once drained
                        self.stats["rotated_resumed"] += 1
                        room -= 1
                elif path.endswith(".gz") and path not in self._gz.values():
                    owner = self._gz_owner(path)
                    if owner is not None:
                        self._gz[owner] = path

    def _gz_owner(self, path: str) -> str | None:
        """The checkpoint entry whose file this compressed generation is (its first bytes' fingerprint)."""
        orphans = {k: e for k, e in self._restored.items() if k not in self.files and k not in self._gz}
        if not orphans:
            return None
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(max(e["fp_len"] for e in orphans.values()))
        except (OSError, EOFError, gzip.BadGzipFile):
            self.stats["gz_errors"] += 1
            return None
        for k, e in orphans.items():
            if len(head) >= e["fp_len"] and hashlib.blake2b(head[: e["fp_len"]], digest_size=12).hexdigest() == e["fp"]:
                return k
        return None

    async def _pump_gz(self, handler: Handler) -> bool:
        """Each compressed generation that holds a checkpointed file's unread rest, read once, in chunks of
        whole lines, under the file's own identity (its messages' ids are the ones it would have had)."""
        moved = False
        for key, path in list(self._gz.items()):
            entry = self._restored.get(key)
            if entry is None:
                del self._gz[key]
                continue
            try:
                data = await asyncio.to_thread(_gunzip, path, self.gz_max)
            except (OSError, EOFError, gzip.BadGzipFile):
                self.stats["gz_errors"] += 1
                del self._gz[key]
                continue
            tf = TailedFile(int(entry["dev"]), int(entry["ino"]), self._host_path(path), offset=int(entry["offset"]),
                            fp=entry["fp"], fp_len=int(entry["fp_len"]), pending=entry.get("pending"))
            while tf.offset < len(data):
                chunk = data[tf.offset : tf.offset + self.chunk_bytes]
                end = chunk.rfind(b"\n")
                chunk = chunk[: end + 1] if end >= 0 else chunk  # the last line may lack its newline
                tf.unfinished = 0
                if not await handler(tf, chunk, tf.offset):
                    entry.update(offset=tf.offset, pending=tf.pending)
                    return moved  # refused: again from here on the next pump
                held = min(tf.unfinished, len(chunk))
                # a tail the consumer holds for more data: none will come to a compressed generation, so it is
                # read again with what follows, or, at the very end, left (a run its writer never ended)
                tf.offset += len(chunk) - held if held < len(chunk) else len(chunk)
                tf.pending = None
                moved = True
            del self._gz[key]
            del self._restored[key]
            self.stats["gz_resumed"] += 1
        return moved

    def _reopen(self, tf: TailedFile, path: str) -> None:
        """A parked file moved: open it again if it is still the same file (inode and first bytes)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (tf.dev, tf.ino) and self._inside_roots(fd)
            if same and tf.fp_len and fingerprint(fd, tf.fp_len)[0] != tf.fp:
                tf.offset, tf.pending = 0, None  # rewritten in place while parked: starts over
        except OSError:
            same = False
        if not same:
            os.close(fd)
            return
        tf.fd = fd
        tf.last_data = time.monotonic()
        self.stats["files_reopened"] += 1

    def _park_idle(self) -> int:
        """Close descriptors of files read to their end: idle ones, then the least recently active
        beyond ``max_open``. Files still being read keep theirs (the cap can be exceeded by them)."""
        now = time.monotonic()
        idle: list[TailedFile] = []
        for tf in self.files.values():
            if tf.fd is None or tf.pending is not None or tf.gone_since is not None:
                continue
            try:
                caught_up = os.fstat(tf.fd).st_size == tf.offset
            except OSError:
                caught_up = False
            if caught_up:
                idle.append(tf)
        idle.sort(key=lambda t: t.last_data)
        # files waiting for a descriptor need room below the cap
        excess = self.open_files - self.max_open + min(self._deferred, self.max_open)
        parked = 0
        for tf in idle:
            if excess <= 0 and now - tf.last_data < self.idle_close:
                break
            assert tf.fd is not None
            os.close(tf.fd)
            tf.fd = None
            excess -= 1
            parked += 1
        self.stats["files_parked"] += parked
        return parked

    @property
    def open_files(self) -> int:
        return sum(1 for t in self.files.values() if t.fd is not None)

    def _watch_dirs(self) -> None:
        if self._watch is None:
            return
        for pattern in self.globs:
            d = str(self.host.path(pattern))
            while glob.has_magic(d):
                d = os.path.dirname(d)
            if d not in self._watched_dirs and os.path.isdir(d):
                try:
                    self._watched_dirs[d] = self._watch.add_watch(d, DIR_MASK)
                except OSError as exc:
                    log.warning("tail_watch_failed", dir=d, error=str(exc))

    def _on_inotify(self, events: list[InotifyEvent]) -> None:
        for ev in events:
            if ev.mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                self._watched_dirs = {d: w for d, w in self._watched_dirs.items() if w != ev.wd}
        self._wake.set()

    # -- reading ----------------------------------------------------------------------
    def read_chunk(self, tf: TailedFile) -> Chunk | None:
        """Complete lines from tf.offset (a truncated view when a line is too long), or None. In a reading thread,
        while the loop waits for it (it checks and updates tf: truncation, fingerprint).

        The chunk's data ends at a newline; its ``end`` may be past ``offset + len(data)`` when an over-long run
        of bytes was skipped.
        """
        if tf.fd is None:  # parked: rescan reopens it when it grows
            return None
        try:
            st = os.fstat(tf.fd)
        except OSError:
            self.stats["read_errors"] += 1
            return None
        if st.st_size < tf.offset:  # copytruncate (or the writer truncated it)
            self.stats["truncations"] += 1
            tf.offset = 0
            tf.pending = None
        if tf.offset == 0 or tf.fp_len < self.fp_bytes:
            fp, n = fingerprint(tf.fd, self.fp_bytes)
            if n >= tf.fp_len and tf.fp_len and fingerprint(tf.fd, tf.fp_len)[0] != tf.fp and tf.offset:
                tf.offset, tf.pending = 0, None  # same inode, different content
            tf.fp, tf.fp_len = fp, n
        if st.st_size == tf.offset or st.st_size == tf.held_size:
            return None  # nothing new (or only the unfinished tail the consumer already saw)
        got = self._read_at(tf.fd, tf.offset)
        if got is None:
            self.stats["read_errors"] += 1
        return got if got is not self._NOTHING else None

    _NOTHING = Chunk(-1, b"", -1, False)  # _read_at: no complete line yet

    def _read_at(self, fd: int, offset: int) -> Chunk | None:
        """The whole lines from ``offset`` (None: a read error; _NOTHING: a line cut in half at EOF). Touches no
        TailedFile (a read-ahead runs while the consumer has the file's last chunk): what it cut or skipped is
        counted in the Chunk, and counted by the loop when it is used."""
        try:
            data = os.pread(fd, self.chunk_bytes, offset)
        except OSError:
            return None
        if not data:
            return self._NOTHING
        full = len(data) == self.chunk_bytes
        end = data.rfind(b"\n")
        if end < 0:
            if not full:
                return self._NOTHING
            # no newline in a whole chunk: skip it (counted), keep going
            return Chunk(offset, b"", offset + len(data), full, skipped=len(data))
        if end + 1 < len(data):
            data = data[: end + 1]
        chunk = Chunk(offset, data, offset + len(data), full)
        if self.max_line and len(data) > self.max_line and b"\n" in data:
            chunk.data, chunk.cut = self._cut_long_lines(data)
        return chunk

    def _cut_long_lines(self, data: bytes) -> tuple[bytes, int]:
        out = []
        start = 0
        cap = self.max_line
        cut = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            if nl - start > cap:
                out.append(data[start : start + cap] + b"\n")
                cut += 1
            else:
                out.append(data[start : nl + 1])
            start = nl + 1
        return b"".join(out), cut

    def _close_finished(self) -> None:
        now = time.monotonic()
        for key, tf in list(self.files.items()):
            if tf.gone_since is None or now - tf.gone_since < self.linger:
                continue
            try:
                size = os.fstat(tf.fd).st_size if tf.fd is not None else 0
            except OSError:
                size = 0
            stale = now - max(tf.last_data, tf.gone_since) > 60  # a writer that died mid-line
            if (tf.offset >= size and tf.pending is None) or stale:
                if tf.fd is not None:
                    os.close(tf.fd)
                del self.files[key]
                self.stats["files_closed"] += 1

    async def pump(self, handler: Handler) -> bool:
        """Read every file until nothing is left or the consumer refuses; True if any data moved.

        While the consumer has a full chunk, the next one is read in a reading thread (the kernel's copy from the
        page cache, without the GIL, overlaps the consumer's work): it is used when the consumer took the whole
        chunk and the read found whole lines there; else it is dropped and read again the usual way (read_chunk:
        truncation and the fingerprint checked). A file truncated since is past its end there: nothing read."""
        moved = await self._pump_gz(handler) if self._gz else False
        for tf in list(self.files.values()):
            ahead: asyncio.Future[Chunk | None] | None = None
            try:
                while True:
                    got = None
                    if ahead is not None:
                        got = await ahead
                        ahead = None
                        if got is not None and (got is self._NOTHING or got.offset != tf.offset):
                            got = None
                    if got is None:
                        got = await asyncio.to_thread(self.read_chunk, tf)
                        if got is None:
                            break
                    self._count(tf, got)
                    if got.full and tf.fp_len >= self.fp_bytes and tf.fd is not None:
                        # submitted now (a task would start only when the handler first waits)
                        ahead = asyncio.get_running_loop().run_in_executor(None, self._read_at, tf.fd, got.end)
                    tf.unfinished = 0
                    ok = await handler(tf, got.data, tf.offset) if got.data else True
                    if not ok:
                        return moved  # retry later from the same offset
                    held = min(tf.unfinished, len(got.data))
                    tf.unfinished = 0
                    new_offset = got.end
                    if held:  # the consumer left the chunk's tail for later: from there once the file grows
                        tf.held_size = tf.offset + len(got.data)
                        new_offset = tf.offset + len(got.data) - held
                    else:
                        tf.held_size = -1
                    progressed = new_offset != tf.offset
                    tf.offset = new_offset
                    tf.pending = None
                    tf.last_data = time.monotonic()
                    moved = True
                    self.save()
                    if not progressed:
                        break  # all of it held: wait for the file to grow
            finally:
                if ahead is not None:  # never left reading a descriptor the caller may close
                    with contextlib.suppress(Exception):
                        await asyncio.shield(ahead)
        return moved

    def _count(self, tf: TailedFile, got: Chunk) -> None:
        if got.skipped:
            self.stats["bytes_skipped"] += got.skipped
            tf.skipped_bytes += got.skipped
        if got.cut:
            self.stats["lines_cut"] += got.cut
            tf.oversize_lines += got.cut

    async def run(self, handler: Handler) -> None:
        self.load()
        try:
            self._watch = Inotify(self._on_inotify)
            self._watch.start()
        except OSError as exc:
            log.warning("tail_inotify_unavailable", error=str(exc), fallback="periodic rescan")
            self._watch = None
        next_scan = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= next_scan or self._wake.is_set():
                    self.rescan()
                    # on the process's grid, with the collectors' passes and the heartbeat (gna_sdk.aio)
                    next_scan = now + aligned_delay(self.rescan_interval, now)
                self._wake.clear()
                await self.pump(handler)
                self._close_finished()
                if self._park_idle() and self._deferred:
                    self._wake.set()  # room was made: open the next files now, not at the next rescan
                await wait_event(self._wake, max(0.0, next_scan - time.monotonic()))
                await asyncio.sleep(self.debounce)  # batch a burst of appends into one read
        finally:
            if self._watch:
                self._watch.close()
                self._watch = None
                self._watched_dirs.clear()
            self._forget()

    def _forget(self) -> None:
        """Close every descriptor and keep only offsets: the next run() starts from them, as after a
        restart of the process (an entry without its descriptor would never be read again)."""
        for key, tf in self.files.items():
            if tf.fd is not None:
                os.close(tf.fd)
                tf.fd = None
            self._restored[key] = tf.to_json()
        self.files.clear()
        self.stats["runs_ended"] += 1

    async def read_all_once(self, handler: Handler) -> None:
        """Every matched file from its beginning, no checkpoint (``check``)."""
        self.state_file = None
        self.rescan()
        for tf in self.files.values():
            tf.offset = 0
            tf.pending = None
        await self.pump(handler)
        for tf in self.files.values():
            if tf.fd is not None:
                os.close(tf.fd)
                tf.fd = None
