"""Hyperscan from the system's shared library (Debian and Ubuntu ``libhyperscan5``, EPEL ``hyperscan``), through
ctypes: the prefilter's literal matcher at the speed this CPU allows.

Why not only the python-hyperscan wheel: the distributions build Hyperscan with its fat runtime (a copy of the
matcher per instruction set, the CPU's best picked when the library loads; ``hs_database_info`` reads
"Features: AVX512VBMI" on an AMD EPYC here), the wheel (hyperscan 0.9.1 on PyPI) for baseline x86-64
("Features:" empty). On the prefilter's 30 literals over a training log the library scans about 2.5x faster
(bench/nccl_ingest.py, docs/benchmarks.md). Where the library is missing or will not load, the wheel serves.

The API is Hyperscan 5.4's (intel/hyperscan v5.4.0, src/hs_compile.h: ``hs_compile_multi``,
``hs_free_compile_error``, ``hs_compile_error_t {char *message; int expression;}``, ``HS_MODE_BLOCK`` 1;
src/hs_runtime.h: ``hs_alloc_scratch``, ``hs_clone_scratch``, ``hs_free_scratch``, ``hs_scan(db, data, unsigned
int length, unsigned int flags, scratch, match_event_handler, void *context)``, the handler ``int (unsigned int
id, unsigned long long from, unsigned long long to, unsigned int flags, void *context)``, non-zero stops the scan;
src/hs_common.h: ``hs_database_info``, ``hs_free_database``, ``HS_SUCCESS`` 0). A scratch space serves one scan at
a time: one per thread, cloned from the first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Sequence

HS_SUCCESS = 0
HS_MODE_BLOCK = 1
_SONAMES = ("libhs.so.5",)  # the 5.x ABI: Debian/Ubuntu libhyperscan5, EPEL hyperscan (vectorscan keeps it)

# id, from, to, flags, context -> non-zero to stop
_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_uint,
                            ctypes.c_void_p)


class _CompileError(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char_p), ("expression", ctypes.c_int)]


def _free(ptr: ctypes.c_void_p) -> None:
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.free(ptr)


class HsError(Exception):
    """A call into the library failed (its hs_error_t code, or the compiler's message)."""


def _load() -> ctypes.CDLL | None:
    for name in (*_SONAMES, ctypes.util.find_library("hs")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)  # CDLL: every call lets go of the GIL
        except OSError:
            continue
        p, pp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        lib.hs_compile_multi.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_uint),
                                         ctypes.POINTER(ctypes.c_uint), ctypes.c_uint, ctypes.c_uint, p, pp,
                                         ctypes.POINTER(ctypes.POINTER(_CompileError))]
        lib.hs_free_compile_error.argtypes = [ctypes.POINTER(_CompileError)]
        lib.hs_alloc_scratch.argtypes = [p, pp]
        lib.hs_clone_scratch.argtypes = [p, pp]
        lib.hs_free_scratch.argtypes = [p]
        lib.hs_free_database.argtypes = [p]
        lib.hs_database_info.argtypes = [p, pp]
        lib.hs_scan.argtypes = [p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, p, _HANDLER, p]
        for fn in (lib.hs_compile_multi, lib.hs_free_compile_error, lib.hs_alloc_scratch, lib.hs_clone_scratch,
                   lib.hs_free_scratch, lib.hs_free_database, lib.hs_database_info, lib.hs_scan):
            fn.restype = ctypes.c_int
        return lib
    return None


class SystemHyperscan:
    """Literals compiled once into a block-mode database, scanned from any thread (a scratch space each)."""

    def __init__(self, lib: ctypes.CDLL, patterns: Sequence[bytes], ids: Sequence[int]) -> None:
        self._lib = lib
        n = len(patterns)
        db = ctypes.c_void_p()
        err = ctypes.POINTER(_CompileError)()
        rc = lib.hs_compile_multi((ctypes.c_char_p * n)(*patterns), (ctypes.c_uint * n)(*([0] * n)),
                                  (ctypes.c_uint * n)(*ids), n, HS_MODE_BLOCK, None, ctypes.byref(db),
                                  ctypes.byref(err))
        if rc != HS_SUCCESS:
            message = err.contents.message.decode(errors="replace") if err else f"error {rc}"
            if err:
                lib.hs_free_compile_error(err)
            raise HsError(f"hs_compile_multi: {message}")
        self._db = db
        first = ctypes.c_void_p()
        rc = lib.hs_alloc_scratch(db, ctypes.byref(first))
        if rc != HS_SUCCESS:
            lib.hs_free_database(db)
            raise HsError(f"hs_alloc_scratch: error {rc}")
        self._first = first  # cloned for each thread; never scanned with (a clone is one thread's)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._scratches: list[ctypes.c_void_p] = []

    def info(self) -> str:
        """The library's words for the database: version, the instruction set its matcher uses, the mode."""
        out = ctypes.c_void_p()
        if self._lib.hs_database_info(self._db, ctypes.byref(out)) != HS_SUCCESS or not out.value:
            return ""
        try:
            return "system libhs, " + ctypes.string_at(out.value).decode(errors="replace")
        finally:
            _free(out)  # the library's default allocator is malloc (hs_common.h, hs_set_misc_allocator)

    def _scratch(self) -> ctypes.c_void_p:
        scratch: ctypes.c_void_p | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = ctypes.c_void_p()
            rc = self._lib.hs_clone_scratch(self._first, ctypes.byref(scratch))
            if rc != HS_SUCCESS:
                raise HsError(f"hs_clone_scratch: error {rc}")
            with self._lock:
                self._scratches.append(scratch)
            self._local.scratch = scratch
        return scratch

    def hits(self, data: bytes, shift: int) -> list[int]:
        """Every match in ``data`` as ``to << shift | id`` (``to``: just past it), ascending: Hyperscan reports
        them in the order of their ends, overlapping ones too (ties sorted here)."""
        if len(data) >= 1 << 32:
            raise HsError("hs_scan: a block of 4 GiB or more")  # its length is an unsigned int
        out: list[int] = []
        add = out.append

        def handler(id_: int, _from: int, to: int, _flags: int, _ctx: int | None) -> int:
            add(to << shift | id_)
            return 0

        rc = self._lib.hs_scan(self._db, data, len(data), 0, self._scratch(), _HANDLER(handler), None)
        if rc != HS_SUCCESS:
            raise HsError(f"hs_scan: error {rc}")
        out.sort()  # in order but for ties: a linear pass
        return out


def compile_literals(patterns: Sequence[bytes], ids: Sequence[int]) -> SystemHyperscan | None:
    """The system library's database for ``patterns`` (regular expressions, here escaped literals), or None where
    the library is missing or refuses them (the caller falls back to the wheel)."""
    lib = _load()
    if lib is None:
        return None
    try:
        return SystemHyperscan(lib, patterns, ids)
    except HsError:
        return None
