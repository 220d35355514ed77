"""PyTorch Flight Recorder (FR) dumps: find them, read them without trusting them, summarise them.

ProcessGroupNCCL (and, from torch 2.8, every backend through ``c10d::FlightRecorder``) keeps a ring
of its last collectives per process and, when its watchdog gives up, writes it to
``<prefix><global rank>`` through ``c10d::DebugInfoWriter``. The bytes are ``torch::jit::Pickler``
output (protocol 2, no type tags) of a dict; ``_dump_fr_trace_json`` / the ``dump_nccl_trace_json``
control-plane handler give the same data as JSON. docs/flight_recorder.md has the format per torch
release, with the source each field was read from.

The files are untrusted: anyone who can write to /tmp or the job's cache can leave one there.
Nothing here calls a general unpickler on them:

1. every opcode is checked first (``pickletools.genops``, which builds no objects): only the ones
   torch's pickler and Python's own protocol 2-5 dicts/lists/strings use are allowed, memo indices
   must be dense, and GLOBAL may name only the ``torch.jit._pickle`` list helpers;
2. only then does ``pickle.Unpickler`` run, with a ``find_class`` that maps those helpers to the
   local checked copies below and refuses everything else, and no persistent loads.

Step 1 is not optional: a 9-byte pickle whose LONG_BINPUT names memo slot 2**28 makes CPython's
unpickler allocate and clear a 2 GiB memo table before it reads the next opcode.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from collectors.nccl.bounds import FR_DUMP_MAX_BYTES
from gna_sdk.hostroot import UnsafePath, UntrustedFile, open_untrusted

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "FRDump",
    "FRDumpError",
    "FREntry",
    "FRFrame",
    "PGInfo",
    "PGStatus",
    "behind_ranks",
    "buffer_size",
    "dump_files",
    "dump_prefixes",
    "load_dump",
    "load_file",
    "load_opened",
    "load_untrusted",
    "rank_from_path",
    "summarize",
]

DEFAULT_MAX_BYTES: Final = FR_DUMP_MAX_BYTES
# torch's default ring is 2000 entries (2.11+); users raise it (100000 is seen in the wild). The
# newest entries are the ones a hang diagnosis needs, so the oldest are dropped past the cap.
DEFAULT_MAX_ENTRIES: Final = 4096
MAX_STR: Final = 512  # one name, path, dtype or thread name
MAX_FRAMES: Final = 32  # per entry; torch lists the innermost (the collective call) first
MAX_TENSORS: Final = 64  # input or output tensors per entry
MAX_DIMS: Final = 16  # dims per tensor (torch's max is 64, real collectives use a few)
MAX_PGS: Final = 4096  # process groups (pg_config / pg_status entries)
MAX_PG_RANKS: Final = 1 << 16  # ranks kept per process group; `size` still counts them all
_INT64_MAX: Final = (1 << 63) - 1
_MAX_PICKLE_DEPTH: Final = 64  # MARK nesting; torch's dumps nest five deep

State = Literal["scheduled", "started", "completed"]
_STATES: Final[frozenset[str]] = frozenset({"scheduled", "started", "completed"})


class FRDumpError(ValueError):
    """Not a Flight Recorder dump (or one this reader refuses); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FRFrame:
    name: str
    filename: str
    line: int | None


@dataclass(frozen=True)
class FREntry:
    """One collective (or p2p op) in the ring, in the order torch recorded it."""

    profiling_name: str  # "nccl:all_reduce", "gloo:broadcast", ...
    state: State
    collective_seq_id: int  # "seq_id" in torch 2.2
    p2p_seq_id: int | None
    op_id: int | None
    record_id: int | None
    pg_id: int | None
    pg_name: str | None  # process_group[0]: the group's name ("0", "1", a hash...)
    pg_desc: str | None  # process_group[1]: "default_pg", "tp", "undefined"...
    is_p2p: bool | None
    retired: bool | None  # no longer watched by the PG; retired but not completed = timed out (NCCL)
    time_created_ns: int | None
    time_discovered_started_ns: int | None
    time_discovered_completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    input_sizes: tuple[tuple[int, ...], ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    thread_name: str | None = None
    frames: tuple[FRFrame, ...] = ()

    @property
    def backend(self) -> str:
        return self.profiling_name.partition(":")[0] if ":" in self.profiling_name else ""

    @property
    def done(self) -> bool:
        """Finished, as far as the dump can tell.

        NCCL entries carry CUDA events, so ``state`` says it; a retired entry that is not
        ``completed`` timed out. Gloo records no events (FlightRecorder<c10::Event> with null
        start/end), so its ``state`` stays ``scheduled`` for ever and only ``retired`` marks a
        finished op (seen in torch 2.13's own gloo dumps, tests/corpus/flight_recorder/).
        """
        if self.state == "completed":
            return True
        return self.backend == "gloo" and self.state == "scheduled" and self.retired is True


@dataclass(frozen=True)
class PGInfo:
    """One ``pg_config`` item: keyed by the group's name, not its numeric id."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None  # None: the "ranks" string was not a list of ranks
    size: int | None


@dataclass(frozen=True)
class PGStatus:
    """``pg_status[pg_id]``: the PG's own work sequence numbers (torch >= 2.6).

    None where torch had -1 (nothing yet; ``last_started`` stays -1 without
    TORCH_NCCL_ENABLE_TIMING, since a work has no start event then). These count every work of
    the group, p2p included, so they need not equal the entries' ``collective_seq_id``.
    """

    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


@dataclass(frozen=True)
class FRDump:
    format: Literal["pickle", "json"]
    version: str | None  # "2.1" ... "2.10"; None for torch 2.2's bare list of entries
    rank: int | None  # the global rank: from the file name (torch does not store it)
    comm_lib_version: str | None  # "nccl_version" (2.8) / "comm_lib_version" (2.10+)
    pgs: Mapping[str, PGInfo] = field(default_factory=dict)
    pg_status: Mapping[str, PGStatus] = field(default_factory=dict)
    entries: tuple[FREntry, ...] = ()
    entries_total: int = 0  # as many as the dump held
    entries_dropped: int = 0  # oldest ones over the cap
    warnings: int = 0  # malformed entries or fields skipped


# --- the restricted unpickler -------------------------------------------------------------------

def _checked_list(kind: type, data: object) -> list[Any]:
    if not isinstance(data, list) or not all(isinstance(x, kind) and (kind is bool or not isinstance(x, bool))
                                             for x in data):
        raise FRDumpError(f"torch.jit._pickle helper given a {type(data).__name__}, not a list of {kind.__name__}")
    return data


def _build_intlist(data: object) -> list[Any]:
    return _checked_list(int, data)


def _build_doublelist(data: object) -> list[Any]:
    return _checked_list(float, data)


def _build_boollist(data: object) -> list[Any]:
    return _checked_list(bool, data)


def _restore_type_tag(value: object, type_str: object) -> object:
    if not isinstance(value, list | dict) or not isinstance(type_str, str) or len(type_str) > MAX_STR:
        raise FRDumpError("torch.jit._pickle.restore_type_tag given something other than (list|dict, type string)")
    return value


# torch/csrc/jit/serialization/pickler.cpp emits these globals (specialised lists; type tags only
# when tag_aggregates_with_types, which FR's pickle_str turns off). None appears in a 2.2-2.13
# dump, but a dump re-pickled by torch.save-like tools may carry them; they are pure functions.
# build_tensorlist / build_tensor_from_id / _rebuild_tensor* are left out: FR holds no tensors.
_ALLOWED_GLOBALS: Final[dict[tuple[str, str], Callable[..., object]]] = {
    ("torch.jit._pickle", "build_intlist"): _build_intlist,
    ("torch.jit._pickle", "build_doublelist"): _build_doublelist,
    ("torch.jit._pickle", "build_boollist"): _build_boollist,
    ("torch.jit._pickle", "restore_type_tag"): _restore_type_tag,
}

# What torch::jit::Pickler writes for FR (seen in the corpus: PROTO, EMPTY_DICT/LIST, MARK,
# SETITEMS, APPENDS, BINUNICODE, BINPUT/BINGET, BININT*, LONG1, NONE, NEWTRUE/FALSE, TUPLE2, STOP)
# plus what CPython's pickler uses for the same values at protocols 2-5. Everything that builds
# an object from a class (REDUCE excepted, whose callable can only come from GLOBAL above),
# persistent ids, extension codes, byte strings and out-of-band buffers are refused.
_ALLOWED_OPS: Final[frozenset[str]] = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "APPEND", "APPENDS", "SETITEM", "SETITEMS",
    "BINPUT", "LONG_BINPUT", "MEMOIZE", "BINGET", "LONG_BINGET",
    "GLOBAL", "REDUCE",
})


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _prescan(data: bytes) -> None:
    import pickletools  # its opcode tables (0.2 MiB) only on a node that has a dump to read

    memo = 0
    depth = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name not in _ALLOWED_OPS:
                raise FRDumpError(f"pickle opcode {name} is not used by torch's Flight Recorder")
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                if (module, attr) not in _ALLOWED_GLOBALS:
                    raise FRDumpError(f"pickle asks for global {_clip(module)}.{_clip(attr)}")
            elif name in ("BINPUT", "LONG_BINPUT"):
                # Picklers number memo slots 0, 1, 2...; anything sparse is an allocation attack.
                if not isinstance(arg, int) or arg > memo:
                    raise FRDumpError("pickle memo index out of sequence")
                memo += arg == memo
            elif name == "MEMOIZE":
                memo += 1
            elif name in ("BINGET", "LONG_BINGET") and (not isinstance(arg, int) or arg >= memo):
                raise FRDumpError("pickle reads a memo slot it never filled")
            elif name == "MARK":
                depth += 1
                if depth > _MAX_PICKLE_DEPTH:
                    raise FRDumpError("pickle nests deeper than any Flight Recorder dump")
            elif name in ("APPENDS", "SETITEMS", "TUPLE", "POP_MARK"):
                depth = max(0, depth - 1)
    except FRDumpError:
        raise
    except Exception as e:  # genops: truncated data, bad opcode byte, lengths past the end
        raise FRDumpError(f"not a complete pickle: {_clip(str(e))}") from None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        fn = _ALLOWED_GLOBALS.get((module, name))
        if fn is None:
            raise FRDumpError(f"pickle asks for global {_clip(module)}.{_clip(name)}")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        raise FRDumpError("pickle uses persistent ids")


def _unpickle(data: bytes) -> Any:
    _prescan(data)
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except FRDumpError:
        raise
    except Exception as e:
        raise FRDumpError(f"pickle does not load: {type(e).__name__}: {_clip(str(e))}") from None


# --- field readers --------------------------------------------------------------------------------

class _Counter:
    def __init__(self) -> None:
        self.n = 0


def _str(v: object, n: int = MAX_STR) -> str | None:
    return v[:n] if isinstance(v, str) else None


def _int(v: object, lo: int = 0, hi: int = _INT64_MAX, *, text: bool = False) -> int | None:
    """An int in [lo, hi]; JSON's pg_status holds them as decimal strings (text=True)."""
    if text and isinstance(v, str) and re.fullmatch(r"-?\d{1,20}", v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        return None
    return v


def _seq(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT64_MAX else None


def _sizes(v: object, bad: _Counter) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, list | tuple):
        if v is not None:
            bad.n += 1
        return ()
    out: list[tuple[int, ...]] = []
    for t in v[:MAX_TENSORS]:
        if not isinstance(t, list | tuple):
            bad.n += 1
            return ()
        dims = [_int(d) for d in t[:MAX_DIMS]]
        if any(d is None for d in dims):
            bad.n += 1
            return ()
        out.append(tuple(d for d in dims if d is not None))
    return tuple(out)


def _strs(v: object, bad: _Counter) -> tuple[str, ...]:
    if not isinstance(v, list | tuple):
        if v is not None:
            bad.n += 1
        return ()
    out = [_str(x, 64) for x in v[:MAX_TENSORS]]
    if any(x is None for x in out):
        bad.n += 1
        return ()
    return tuple(x for x in out if x is not None)


def _frames(v: object, bad: _Counter) -> tuple[FRFrame, ...]:
    if not isinstance(v, list | tuple):
        if v is not None:
            bad.n += 1
        return ()
    out: list[FRFrame] = []
    for f in v[:MAX_FRAMES]:
        if not isinstance(f, dict):
            bad.n += 1
            return tuple(out)
        name, filename = _str(f.get("name")), _str(f.get("filename"))
        if name is None or filename is None:
            bad.n += 1
            return tuple(out)
        out.append(FRFrame(name, filename, _int(f.get("line"), 0, 1 << 31)))
    return tuple(out)


def _opt_ns(d: Mapping[Any, Any], key: str, bad: _Counter, *, json_zero: bool) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    n = _int(v)
    if n is None:
        bad.n += 1
        return None
    # dump_json writes 0 for "not yet" where the pickle has None (FlightRecorderDetail.hpp)
    return None if json_zero and n == 0 else n


def _entry(d: object, json_form: bool, bad: _Counter) -> FREntry | None:
    """One entry, or None (counted) when a field that identifies it is missing or impossible."""
    if not isinstance(d, dict):
        return None
    name = _str(d.get("profiling_name"), 128)
    state = d.get("state")
    seq = _seq(d.get("collective_seq_id", d.get("seq_id")))
    if name is None or not isinstance(state, str) or state not in _STATES or seq is None:
        return None
    pg = d.get("process_group")
    pg_name = pg_desc = None
    if isinstance(pg, list | tuple) and len(pg) == 2:
        pg_name, pg_desc = _str(pg[0]), _str(pg[1])
    elif pg is not None:
        bad.n += 1
    created = _int(d.get("time_created_ns"))
    if created is None and "time_created_us" in d:  # torch 2.2 stored microseconds
        us = _int(d.get("time_created_us"), 0, _INT64_MAX // 1000)
        created = None if us is None else us * 1000
    duration = d.get("duration_ms")
    dur = (float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool)
           and math.isfinite(duration) and duration >= 0 else None)
    if duration is not None and dur is None:
        bad.n += 1

    def flag(key: str) -> bool | None:
        v = d.get(key)
        return v if isinstance(v, bool) else None

    return FREntry(
        profiling_name=name,
        state=cast(State, state),  # checked against _STATES above
        collective_seq_id=seq,
        p2p_seq_id=_seq(d.get("p2p_seq_id")),
        op_id=_seq(d.get("op_id")),
        record_id=_seq(d.get("record_id")),
        pg_id=_seq(d.get("pg_id")),
        pg_name=pg_name,
        pg_desc=pg_desc,
        is_p2p=flag("is_p2p"),
        retired=flag("retired"),
        time_created_ns=created,
        time_discovered_started_ns=_opt_ns(d, "time_discovered_started_ns", bad, json_zero=json_form),
        time_discovered_completed_ns=_opt_ns(d, "time_discovered_completed_ns", bad, json_zero=json_form),
        duration_ms=dur,
        timeout_ms=_int(d.get("timeout_ms")),
        input_sizes=_sizes(d.get("input_sizes"), bad),
        output_sizes=_sizes(d.get("output_sizes"), bad),
        input_dtypes=_strs(d.get("input_dtypes"), bad),
        output_dtypes=_strs(d.get("output_dtypes"), bad),
        thread_name=_str(d.get("thread_name"), 64),
        frames=_frames(d.get("frames"), bad),
    )


_RANKS = re.compile(r"\[(\d{1,10}(?:, \d{1,10})*)?\]")


def _pg_config(v: object, bad: _Counter) -> dict[str, PGInfo]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        bad.n += 1
        return {}
    out: dict[str, PGInfo] = {}
    for key, info in list(v.items())[:MAX_PGS]:
        if not isinstance(key, str) or not isinstance(info, dict):
            bad.n += 1
            continue
        ranks_s = info.get("ranks")
        ranks: tuple[int, ...] | None = None
        size: int | None = None
        # ranks_str(): fmt::format("[{}]", fmt::join(ranks, ", ")) in TraceUtils.h
        if isinstance(ranks_s, str) and _RANKS.fullmatch(ranks_s):
            body = ranks_s[1:-1]
            size = body.count(",") + 1 if body else 0
            ranks = tuple(int(x) for x in body.split(", ", MAX_PG_RANKS)[:MAX_PG_RANKS]) if body else ()
        elif ranks_s is not None:
            bad.n += 1
        out[key[:MAX_STR]] = PGInfo(_str(info.get("name")) or "", _str(info.get("desc")) or "", ranks, size)
    if len(v) > MAX_PGS:
        bad.n += 1
    return out


def _pg_status(v: object, json_form: bool, bad: _Counter) -> dict[str, PGStatus]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        bad.n += 1
        return {}
    out: dict[str, PGStatus] = {}
    for key, st in list(v.items())[:MAX_PGS]:
        if not isinstance(key, str) or not re.fullmatch(r"\d{1,20}", key) or not isinstance(st, dict):
            bad.n += 1
            continue
        vals = [_int(st.get(k), -1, text=json_form) for k in
                ("last_enqueued_collective", "last_started_collective", "last_completed_collective")]
        if any(x is None for x in vals):
            bad.n += 1
            continue
        enq, started, done = (None if x == -1 else x for x in vals)
        # Nothing starts or completes before the same PG enqueued it: such a status is invented.
        if (enq is None and (started is not None or done is not None)) or (
                enq is not None and ((started or 0) > enq or (done or 0) > enq)):
            bad.n += 1
            continue
        # The watchdog asks isStarted() before isCompleted() on each pass (ProcessGroupNCCL.cpp
        # watchdogHandler), so a work that both starts and ends between the two queries is
        # completed with last_started one behind; completed implies started.
        if started is not None and done is not None and done > started:
            started = done
        out[key] = PGStatus(enq, started, done)
    if len(v) > MAX_PGS:
        bad.n += 1
    return out


# --- public API -----------------------------------------------------------------------------------

def load_dump(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES,
              rank: int | None = None) -> FRDump:
    """Parse one FR dump (pickle or JSON). Raises FRDumpError for anything else."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FRDumpError("not bytes")
    data = bytes(data)
    if len(data) > max_bytes:
        raise FRDumpError(f"{len(data)} bytes is over the {max_bytes}-byte limit")
    if not data:
        raise FRDumpError("empty file")
    fmt: Literal["pickle", "json"]
    if data[0] == 0x80:
        if len(data) < 2 or not 2 <= data[1] <= 5:
            raise FRDumpError("pickle protocol is not 2-5 (torch writes 2)")
        fmt, top = "pickle", _unpickle(data)
    elif data.lstrip()[:1] == b"{":
        fmt = "json"
        try:
            top = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise FRDumpError(f"not valid JSON: {_clip(str(e))}") from None
    else:
        raise FRDumpError("neither a pickle (torch's start with 0x80 0x02) nor a JSON object")

    bad = _Counter()
    if isinstance(top, list) and fmt == "pickle":
        # torch 2.2 (TraceUtils.h NCCLTraceBuffer::dump): the pickle is the list of entries itself
        version: str | None = None
        raw_entries: object = top
        doc: dict[Any, Any] = {}
    elif isinstance(top, dict):
        doc = top
        version = _str(doc.get("version"), 16)
        if version is None or not re.fullmatch(r"\d{1,3}\.\d{1,3}", version):
            raise FRDumpError("no version string: not a Flight Recorder dump")
        if "entries" not in doc and "pg_config" not in doc:
            raise FRDumpError("neither entries nor pg_config: not a Flight Recorder dump")
        raw_entries = doc.get("entries", [])  # dump_json leaves "entries" out when there are none
    else:
        raise FRDumpError(f"top level is a {type(top).__name__}, not a Flight Recorder dump")

    if not isinstance(raw_entries, list):
        raise FRDumpError("entries is not a list")
    total = len(raw_entries)
    kept = raw_entries[-max_entries:] if max_entries > 0 else []
    entries: list[FREntry] = []
    for d in kept:
        parsed = _entry(d, fmt == "json", bad)
        if parsed is None:
            bad.n += 1
        else:
            entries.append(parsed)
    clv = doc.get("comm_lib_version", doc.get("nccl_version"))
    return FRDump(
        format=fmt,
        version=version,
        rank=rank if rank is not None and rank >= 0 else None,
        comm_lib_version=_str(clv, 64),
        pgs=_pg_config(doc.get("pg_config"), bad),
        pg_status=_pg_status(doc.get("pg_status"), fmt == "json", bad),
        entries=tuple(entries),
        entries_total=total,
        entries_dropped=total - len(kept),
        warnings=bad.n,
    )


_RANK_SUFFIX = re.compile(r"(\d{1,9})(?:\.json)?$")


def rank_from_path(path: str) -> int | None:
    """The global rank DebugInfoWriter appended to the prefix (the analyzer reads it the same way)."""
    m = _RANK_SUFFIX.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def load_opened(f: UntrustedFile, *, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES,
                rank: int | None = None) -> FRDump:
    """Parse a dump already opened by gna_sdk.hostroot.open_untrusted (a regular file, checked on its
    descriptor); never more than max_bytes is read."""
    try:
        data = f.read(max_bytes + 1)
    except OSError as e:
        raise FRDumpError(f"cannot read: {e.strerror}") from None
    return load_dump(data, max_bytes=max_bytes, max_entries=max_entries,
                     rank=rank if rank is not None else rank_from_path(f.path))


def load_untrusted(root: str | os.PathLike[str], path: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                   max_entries: int = DEFAULT_MAX_ENTRIES) -> FRDump:
    """Read the dump at ``path`` under the directory ``root`` as a job left it: opened component by
    component with no symlink followed and nothing above ``root`` (gna_sdk.hostroot.open_untrusted); a
    regular file only (TORCH_NCCL_DEBUG_INFO_PIPE_FILE's ``<prefix><rank>.pipe`` is a FIFO beside the
    dumps: opening it would block), with one link, never more than max_bytes."""
    try:
        f = open_untrusted(root, path, max_bytes=max_bytes)
    except UnsafePath as e:
        raise FRDumpError(_REFUSED.get(e.reason, f"cannot open: {e.reason}")) from None
    with f:
        return load_opened(f, max_bytes=max_bytes, max_entries=max_entries)


_REFUSED: Final[dict[str, str]] = {
    "not_regular": "not a regular file", "too_large": "over the size limit", "symlink": "cannot open: a symlink",
    "escapes_root": "cannot open: the path leaves its root", "hard_linked": "cannot open: more than one hard link",
    "missing": "cannot open: no such file", "unreadable": "cannot open: unreadable",
    "bad_name": "cannot open: bad name",
}


def load_file(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES) -> FRDump:
    """A dump file named by whoever calls (its directory is trusted, the file itself is not): see
    load_untrusted."""
    full = os.path.abspath(path)
    return load_untrusted(os.path.dirname(full), os.path.basename(full), max_bytes=max_bytes,
                          max_entries=max_entries)


def _truthy(v: str | None) -> bool:
    # getCvarBool (c10d Utils.hpp): y/yes/1/t/true, any case
    return v is not None and v.lower() in ("y", "yes", "1", "t", "true")


def dump_prefixes(env: Mapping[str, str]) -> list[str]:
    """Every prefix a process with this environment may dump to, newest torch first.

    torch appends the global rank. The process's torch version is unknown here, so each rule
    from 2.2 to 2.13 contributes (docs/flight_recorder.md, "Where the dumps go"):
    TORCH_FR_DUMP_TEMP_FILE (2.8+) wins over TORCH_NCCL_DEBUG_INFO_TEMP_FILE (all); unset, the
    default is ``${XDG_CACHE_HOME:-$HOME/.cache}/torch/comm_lib_trace_rank_`` (2.11+),
    ``$HOME/.cache/torch/comm_lib_trace_rank_`` (2.9-2.10), ``$HOME/.cache/torch/nccl_trace_rank_``
    (2.7-2.8), ``/tmp/nccl_trace_rank_`` (2.2-2.6), with HOME read as /tmp when unset.
    Relative values are relative to the process's working directory.
    """
    out: list[str] = []

    def add(p: str) -> None:
        if p not in out:
            out.append(p)

    fr, nccl = env.get("TORCH_FR_DUMP_TEMP_FILE"), env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    home = env.get("HOME", "/tmp")
    if fr is not None:
        add(fr)
    if nccl is not None:
        add(nccl)
    if fr is None and nccl is None:
        add(os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "torch", "comm_lib_trace_rank_"))
        add(os.path.join(home, ".cache", "torch", "comm_lib_trace_rank_"))
    if nccl is None:
        # torch <= 2.7 never reads TORCH_FR_DUMP_TEMP_FILE: its defaults apply whatever that says
        add(os.path.join(home, ".cache", "torch", "nccl_trace_rank_"))
        add("/tmp/nccl_trace_rank_")
    return out


def dump_files(env: Mapping[str, str], rank_hint: int | None = None, *, cwd: str | None = None) -> list[str]:
    """Paths where a process with this environment writes its FR dump, most likely first.

    The rank is rank_hint, else the environment's RANK (torchrun, the launchers); with neither
    the list is empty (use dump_prefixes and match ``<prefix><digits>``). With
    TORCH_FR_DUMP_DYNAMIC_FILE_NAME (2.10+) torch writes to TORCH_FR_DUMP_TEMP_FILE *as read at
    dump time*, without the rank; /proc/<pid>/environ shows the value at start only.
    """
    rank = rank_hint
    if rank is None:
        r = env.get("RANK", "")
        rank = int(r) if r.isdigit() and len(r) <= 9 else None
    out: list[str] = []
    fr = env.get("TORCH_FR_DUMP_TEMP_FILE")
    if fr and _truthy(env.get("TORCH_FR_DUMP_DYNAMIC_FILE_NAME")):
        out.append(fr)
    if rank is not None and rank >= 0:
        out += [p + str(rank) for p in dump_prefixes(env)]
    if cwd is not None:
        out = [p if os.path.isabs(p) else os.path.join(cwd, p) for p in out]
    return list(dict.fromkeys(out))


def buffer_size(env: Mapping[str, str]) -> int | None:
    """The ring size this environment asks for (TORCH_FR_BUFFER_SIZE over TORCH_NCCL_TRACE_BUFFER_SIZE);
    None when unset: then torch's default applies, 0 (nothing recorded) up to 2.10, 2000 from 2.11."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        v = env.get(name)
        if v is not None:
            try:
                return int(v.strip())
            except ValueError:
                return None
    return None


def _entry_view(e: FREntry) -> dict[str, Any]:
    return {"collective_seq_id": e.collective_seq_id, "p2p_seq_id": e.p2p_seq_id, "op_id": e.op_id,
            "op": e.profiling_name, "state": e.state, "is_p2p": e.is_p2p, "record_id": e.record_id,
            "time_created_ns": e.time_created_ns, "timeout_ms": e.timeout_ms}


def summarize(dump: FRDump) -> dict[str, Any]:
    """Per process group: torch's own status (pg_status) and what the entries show.

    ``first_not_completed`` is the oldest entry of the group that is not ``done`` (the collective
    this rank waits in); ``entries_last_enqueued`` / ``entries_last_completed`` are the highest
    ``collective_seq_id`` among the group's collective entries and among those done. Compare
    ranks on the entry numbers: pg_status counts p2p work too (see PGStatus).
    """
    by_pg: dict[str, list[FREntry]] = {}
    names: dict[str, tuple[str | None, str | None]] = {}
    for e in dump.entries:
        key = str(e.pg_id) if e.pg_id is not None else (e.pg_name or "?")
        by_pg.setdefault(key, []).append(e)
        names.setdefault(key, (e.pg_name, e.pg_desc))
    pgs: dict[str, Any] = {}
    def order(k: str) -> tuple[bool, int, str]:
        return (not k.isdigit(), int(k) if k.isdigit() else 0, k)

    for key in sorted(set(by_pg) | set(dump.pg_status), key=order):
        es = by_pg.get(key, [])
        colls = [e for e in es if not e.is_p2p]
        name, desc = names.get(key, (None, None))
        info = dump.pgs.get(name) if name is not None else None
        st = dump.pg_status.get(key)
        pending = [e for e in es if not e.done]
        pgs[key] = {
            "name": name,
            "desc": desc if desc is not None else (info.desc if info else None),
            "ranks": list(info.ranks) if info and info.ranks is not None else None,
            "size": info.size if info else None,
            "last_enqueued": st.last_enqueued if st else None,
            "last_started": st.last_started if st else None,
            "last_completed": st.last_completed if st else None,
            "entries_last_enqueued": max((e.collective_seq_id for e in colls), default=None),
            "entries_last_completed": max((e.collective_seq_id for e in colls if e.done), default=None),
            "pending": len(pending),
            "first_not_completed": _entry_view(pending[0]) if pending else None,
        }
    return {"format": dump.format, "version": dump.version, "rank": dump.rank, "entries": len(dump.entries),
            "entries_total": dump.entries_total, "entries_dropped": dump.entries_dropped,
            "warnings": dump.warnings, "pgs": pgs}


def behind_ranks(dumps: Iterable[FRDump]) -> dict[str, dict[str, Any]]:
    """Across the ranks' dumps: per PG, the newest collective any rank enqueued and the ranks that
    never enqueued it (the ones the others wait for). Only PGs where some rank is behind are listed.
    Dumps without a rank are ignored: a rank is what this answers with."""
    seen: dict[str, dict[int, int]] = {}
    for d in dumps:
        if d.rank is None:
            continue
        for key, pg in summarize(d)["pgs"].items():
            last = pg["entries_last_enqueued"]
            if last is not None:
                seen.setdefault(key, {})[d.rank] = last
    out: dict[str, dict[str, Any]] = {}
    for key, per_rank in seen.items():
        top = max(per_rank.values())
        behind = sorted(r for r, s in per_rank.items() if s < top)
        if behind:
            out[key] = {"collective_seq_id": top, "behind": behind,
                        "last_enqueued": {str(r): per_rank[r] for r in sorted(per_rank)}}
    return out
