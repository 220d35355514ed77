"""Minimal asyncio inotify(7) through ctypes: no extra dependency, one fd driven by add_reader."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

DIR_CHANGES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF

_EVENT = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


@dataclass(frozen=True)
class InotifyEvent:
    wd: int
    mask: int
    name: str
    path: str  # the watched path this event belongs to


class Inotify:
    """``add_watch`` paths; ``callback(events)`` runs on the event loop for every batch read."""

    def __init__(self, callback: Callable[[list[InotifyEvent]], None]) -> None:
        fd = _lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        self.callback = callback
        self.watches: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.overflows = 0

    def add_watch(self, path: str, mask: int) -> int:
        wd = _lib().inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        self.watches[wd] = path
        return int(wd)

    def remove_watch(self, wd: int) -> None:
        if self.watches.pop(wd, None) is not None:
            _lib().inotify_rm_watch(self.fd, wd)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._on_readable)

    def _on_readable(self) -> None:
        events: list[InotifyEvent] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                raw = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                pos += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self.overflows += 1
                if mask & IN_IGNORED:
                    self.watches.pop(wd, None)
                events.append(InotifyEvent(wd, mask, os.fsdecode(raw), self.watches.get(wd, "")))
        if events:
            self.callback(events)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.fd)
            self._loop = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
