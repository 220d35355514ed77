"""Every host path the agent reads goes through HostRoot, so a fixture tree and a node run the same code.

Files a job controls (a Flight Recorder dump at a path its environment names, anything under
``/proc/<pid>/root``) are opened with :func:`open_untrusted`: one resolution, component by component,
that never follows a symlink and never climbs above the root it was given, then checks on the open
descriptor (a regular file, one link, not too large). There is no "check the path, then open it"
anywhere: whatever a job user swaps in between, the kernel resolves the path once, under the rules.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "HostRoot",
    "UnsafePath",
    "UntrustedFile",
    "open_dir",
    "open_untrusted",
    "split_beneath",
]

# include/uapi/linux/openat2.h (torvalds/linux, v5.6 and every tag since): struct open_how
# {__u64 flags; __u64 mode; __u64 resolve;} and the resolve bits.
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04  # implies RESOLVE_NO_MAGICLINKS
RESOLVE_IN_ROOT: Final = 0x10  # "/" and ".." are scoped inside the dirfd, as under chroot(2)
# __NR_openat2 = 437: include/uapi/asm-generic/unistd.h (v5.6; aarch64 and riscv use the generic
# table) and arch/x86/entry/syscalls/syscall_64.tbl ("437 common openat2"). Elsewhere: the walk.
_NR_OPENAT2: Final[dict[str, int]] = {"x86_64": 437, "aarch64": 437, "arm64": 437, "riscv64": 437}

PATH_MAX: Final = 4096  # include/uapi/linux/limits.h
NAME_MAX: Final = 255

_O_PATH: Final = getattr(os, "O_PATH", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOCTTY: Final = getattr(os, "O_NOCTTY", 0)
_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)


class UnsafePath(OSError):
    """A tenant-controlled path was refused. ``reason`` is a short token for counters: ``symlink``,
    ``escapes_root``, ``not_regular``, ``too_large``, ``hard_linked``, ``bad_name``, ``missing``,
    ``unreadable``."""

    def __init__(self, reason: str, path: str, err: int = errno.EPERM) -> None:
        super().__init__(err, f"{reason}: {path[:300]}")
        self.reason = reason
        self.path = path


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """openat2(2) through libc's syscall(); ``usable`` drops to False for good on ENOSYS (kernel < 5.6)
    or EPERM (a seccomp profile that does not know it): the walk below does the same job then."""

    def __init__(self) -> None:
        self.usable = False
        self._fn: object = None
        nr = _NR_OPENAT2.get(platform.machine())
        if nr is None or not _O_PATH:
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
        except (OSError, AttributeError):
            return
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
        self._fn, self._nr, self.usable = fn, nr, True

    def __call__(self, dir_fd: int, path: str, flags: int) -> int | None:
        """The descriptor, or None when openat2 is not usable here (the caller walks instead)."""
        if not self.usable:
            return None
        how = _OpenHow(flags | _O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)
        ret = int(self._fn(self._nr, dir_fd, os.fsencode(path), ctypes.addressof(how),  # type: ignore[operator]
                           ctypes.sizeof(how)))
        if ret >= 0:
            return ret
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
            self.usable = False
            return None
        raise OSError(err, os.strerror(err), path)


_openat2 = _Openat2()


def split_beneath(path: str) -> list[str]:
    """The components of ``path`` read under a root (absolute or not: both start at the root), ``.``
    and empty ones dropped, ``..`` applied lexically. A ``..`` above the root is refused, not clamped;
    so are NUL bytes, components over NAME_MAX and paths over PATH_MAX (bytes)."""
    if "\0" in path:
        raise UnsafePath("bad_name", path)
    if len(os.fsencode(path)) > PATH_MAX:
        raise UnsafePath("bad_name", path, errno.ENAMETOOLONG)
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise UnsafePath("escapes_root", path, errno.EXDEV)
            out.pop()
            continue
        if len(os.fsencode(part)) > NAME_MAX:
            raise UnsafePath("bad_name", path, errno.ENAMETOOLONG)
        out.append(part)
    return out


def _why(err: OSError, path: str) -> UnsafePath:
    if err.errno == errno.ELOOP:
        return UnsafePath("symlink", path, errno.ELOOP)
    if err.errno == errno.EXDEV:
        return UnsafePath("escapes_root", path, errno.EXDEV)
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return UnsafePath("missing", path, err.errno)
    return UnsafePath("unreadable", path, err.errno or errno.EIO)


def _walk(root_fd: int, parts: list[str], path: str) -> int:
    """The fallback: one ``openat(dir_fd, name, O_PATH|O_NOFOLLOW)`` per component, each checked on
    its descriptor (a directory for all but the last); a symlink anywhere is refused."""
    cur = os.open(".", _O_PATH | _O_DIRECTORY | _O_CLOEXEC, dir_fd=root_fd)
    try:
        for i, name in enumerate(parts):
            try:
                nxt = os.open(name, _O_PATH | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=cur)
            except OSError as e:
                raise _why(e, path) from None
            mode = os.fstat(nxt).st_mode
            if stat.S_ISLNK(mode) or (i < len(parts) - 1 and not stat.S_ISDIR(mode)):
                os.close(nxt)
                raise UnsafePath("symlink" if stat.S_ISLNK(mode) else "missing", path,
                                 errno.ELOOP if stat.S_ISLNK(mode) else errno.ENOTDIR)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def _resolve(root_fd: int, path: str, *, walk: bool = False) -> int:
    """An O_PATH descriptor of ``path`` under ``root_fd``: no symlink followed, nothing above the root."""
    parts = split_beneath(path)
    if not walk:
        try:
            fd = _openat2(root_fd, "/".join(parts) or ".", _O_PATH | _O_NOFOLLOW)
        except OSError as e:
            raise _why(e, path) from None
        if fd is not None:
            return fd
    return _walk(root_fd, parts, path)


def open_dir(path: str | os.PathLike[str]) -> int:
    """An O_PATH directory descriptor of a *trusted* path (the host root, ``/proc/<pid>/root``, whose
    magic link the kernel resolves to the process's own root): the root untrusted paths are read under."""
    return os.open(path, _O_PATH | _O_DIRECTORY | _O_CLOEXEC)


@dataclass
class UntrustedFile:
    """A regular file opened by :func:`open_untrusted`; ``stat`` is its fstat, taken on the open descriptor."""

    fd: int
    stat: os.stat_result
    path: str

    def read(self, limit: int) -> bytes:
        """At most ``limit`` bytes from the start (one more tells the caller it was cut)."""
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            b = os.read(self.fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> UntrustedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reopen(pfd: int, path: str) -> int:
    """O_PATH -> a readable descriptor of the same inode, through the agent's own /proc/self/fd (the
    O_PATH descriptor cannot be swapped; opening by name again could be). O_NONBLOCK|O_NOCTTY: never
    blocks, never takes a terminal; the type was checked before, so no device or FIFO gets here."""
    try:
        return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC)
    except OSError as e:
        raise UnsafePath("unreadable", path, e.errno or errno.EIO) from None


def open_untrusted(root: int | str | os.PathLike[str], path: str, *, max_bytes: int, allow_links: bool = False,
                   walk: bool = False) -> UntrustedFile:
    """Open a tenant-controlled regular file at ``path`` under ``root`` (a directory descriptor or a
    trusted directory path) for reading.

    Resolution: openat2(RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS) where the kernel has it (Linux >= 5.6),
    else an O_NOFOLLOW walk with fd-relative opens (``walk=True`` forces it). Either way a symlink in
    any component, a ``..`` above the root, a non-regular file (FIFO, device, directory), a file over
    ``max_bytes`` or, unless ``allow_links``, one with more than one hard link (a job user's link to a
    file it cannot read) raises :class:`UnsafePath`. The checks are made on the descriptor itself."""
    own = not isinstance(root, int)
    try:
        root_fd = open_dir(root) if not isinstance(root, int) else root
    except OSError as e:
        raise _why(e, str(root)) from None
    try:
        pfd = _resolve(root_fd, path, walk=walk)
    finally:
        if own:
            os.close(root_fd)
    try:
        st = os.fstat(pfd)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath("symlink", path, errno.ELOOP)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath("not_regular", path, errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL)
        if st.st_size > max_bytes:
            raise UnsafePath("too_large", path, errno.EFBIG)
        if st.st_nlink > 1 and not allow_links:
            raise UnsafePath("hard_linked", path, errno.EMLINK)
        fd = _reopen(pfd, path)
    finally:
        os.close(pfd)
    try:
        st2 = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise UnsafePath("unreadable", path, e.errno or errno.EIO) from None
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):  # cannot happen through /proc/self/fd
        os.close(fd)
        raise UnsafePath("unreadable", path, errno.ESTALE)
    return UntrustedFile(fd, st2, path)


class HostRoot:
    def __init__(self, root: str | Path = "/") -> None:
        self._root = Path(root).resolve()

    @property
    def root(self) -> Path:
        return self._root

    def path(self, host_path: str) -> Path:
        """Map an absolute host path ("/sys/class/...") under the root; never escapes it lexically."""
        rel = host_path.lstrip("/")
        return self._root / rel if rel else self._root

    def read_text(self, host_path: str, limit: int = 65536) -> str | None:
        """Small sysfs/procfs file as text, or None when absent/unreadable (callers count the skip)."""
        try:
            with open(self.path(host_path), "rb") as fh:
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return None

    def open_untrusted(self, path: str, *, within: str = "/", max_bytes: int,
                       allow_links: bool = False) -> UntrustedFile:
        """:func:`open_untrusted` of ``path`` under the host path ``within`` (trusted: "/" or
        "/proc/<pid>/root"); a job's paths are read this way, never through :meth:`path`."""
        return open_untrusted(self.path(within), path, max_bytes=max_bytes, allow_links=allow_links)

    def __repr__(self) -> str:
        return f"HostRoot({str(self._root)!r})"
