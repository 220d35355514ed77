"""NCCL Inspector dump files: per-rank, per-communicator collective and P2P performance (docs/nccl-inspector.md).

The Inspector is NCCL's profiler plugin (NVIDIA/nccl ``ext-profiler/inspector`` in 2.28.3-2.29.3,
``plugins/profiler/inspector`` from 2.29.7). A job loads it with ``NCCL_PROFILER_PLUGIN`` and
``NCCL_INSPECTOR_ENABLE=1``; its dump thread (``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS``)
appends one JSON object per completed operation and line to ``<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log``
(inspector.cc ``inspectorStateDumpJSON``). Each line repeats the communicator header and the process
metadata; ``coll_perf`` or (2.30.3+) ``p2p_perf`` carries the operation (inspector_json.cc).

This module is both halves of the node side:

- :func:`parse_line` turns one line, exactly as json.cc prints it, into an :class:`InspectorRecord`,
  or a :class:`Skip` with a reason (bad JSON, a wrong type, a number no writer can mean, a size the
  Inspector wrapped past 2**63 for a datatype it does not know, a line past the length cap).
  Nothing raises on any input.
- :func:`summarize` reduces records to a compact, bounded summary per (communicator, rank): the
  median bus bandwidth per operation and power-of-two size bucket over the last window, with counts.
- :class:`NCCLInspectorCollector` tails the dump files (gna_sdk.tailer: rotation, truncation and
  restarts handled there) and publishes one ``NCCLInspectorSummary`` info event per process every
  ``interval``. The comparison across ranks is the fleet's (fleet/inspector_compare.py).
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import structlog

from gna_sdk import CollectorSettings, Emitter, HostPaths, plural
from gna_sdk.hostroot import HostRoot
from gna_sdk.tailer import TailedFile, Tailer
from gna_types import entities
from gna_types.network_details import NCCLInspectorSummary
from gna_types.node_details import wire
from gna_types.policy import verdict

log = structlog.get_logger(__name__)

SUMMARY_SCHEMA = 1
# The only inspector_output_format_version any tag writes (2.28.3-1 .. 2.30.7-1), although 2.30.3
# added header.comm_name and p2p_perf lines without changing it: the keys present say more than it.
KNOWN_FORMAT = "v4.0"
MAX_CHANNELS = 64  # inspector.h MAX_CHANNELS: kernel_events has at most one entry per channel
TIMING_COMPARABLE = "kernel_gpu"  # GPU globaltimer from kernel start to stop; the other sources are CPU clocks

# Bounds past which a number is no measurement: counted as a skip, never summarised.
MAX_RANKS = 1 << 24
MAX_PID = 1 << 22  # Linux PID_MAX_LIMIT
MAX_MSG_BYTES = 1 << 50  # 1 PiB in one operation
WRAPPED_MSG_BYTES = 1 << 63  # a negative size printed with %lu: see _check
MAX_EXEC_US = 7 * 86400 * 10**6
MAX_BW_GBS = 1e6  # 1 PB/s: no link comes within three orders of magnitude
MAX_TS_US = 1 << 62
_COMM_ID = re.compile(r"0x[0-9a-f]{1,16}")
_OP_NAME = re.compile(r"[A-Za-z0-9_]{1,32}")
# json.cc jsonDouble prints any double with "%lf": an infinity comes out as a bare inf/-inf token,
# which no JSON parser accepts. Quote it so the field, not the whole line, is judged (non_finite).
_BARE_INF = re.compile(rb"(?<=[:,\[])(-?inf)(?=[,}\]])")


# -- the wire format, as inspector_json.cc / json.cc write it ------------------------------------

class _Header(msgspec.Struct):
    id: str
    rank: int
    n_ranks: int
    nnodes: int
    comm_name: str | None = None  # 2.30.3+; "unknown" when the communicator has none


class _Meta(msgspec.Struct):
    dump_timestamp_us: int
    hostname: str
    pid: int
    inspector_output_format_version: str | None = None
    git_rev: str | None = None
    rec_mechanism: str | None = None


class _KernelTs(msgspec.Struct):
    channel_id: int
    kernel_start_ts: int
    kernel_stop_ts: int
    kernel_record_ts: int


class _KernelSn(msgspec.Struct):
    channel_id: int
    kernel_start_sn: int
    kernel_stop_sn: int
    kernel_record_sn: int


_Kernels = Annotated[list[_KernelTs], msgspec.Meta(max_length=MAX_CHANNELS)]
_KernelSns = Annotated[list[_KernelSn], msgspec.Meta(max_length=MAX_CHANNELS)]


class _CollTraceSn(msgspec.Struct):
    coll_start_sn: int
    coll_stop_sn: int
    kernel_events: _KernelSns


class _CollTraceTs(msgspec.Struct):
    coll_start_ts: int
    coll_stop_ts: int
    kernel_events: _Kernels


class _P2pTraceSn(msgspec.Struct):
    p2p_start_sn: int
    p2p_stop_sn: int
    kernel_events: _KernelSns


class _P2pTraceTs(msgspec.Struct):
    p2p_start_ts: int
    p2p_stop_ts: int
    kernel_events: _Kernels


class _CollPerf(msgspec.Struct):
    coll: str
    coll_sn: int
    coll_msg_size_bytes: int
    coll_exec_time_us: int
    coll_algobw_gbs: float | str  # str: jsonDouble writes NaN as the string "nan"
    coll_busbw_gbs: float | str
    coll_timing_source: str | None = None
    event_trace_sn: _CollTraceSn | None = None  # NCCL_INSPECTOR_DUMP_VERBOSE=1
    event_trace_ts: _CollTraceTs | None = None


class _P2pPerf(msgspec.Struct):
    p2p: str
    p2p_sn: int
    p2p_peer: int
    p2p_msg_size_bytes: int
    p2p_exec_time_us: int
    p2p_algobw_gbs: float | str
    p2p_busbw_gbs: float | str
    p2p_timing_source: str | None = None
    event_trace_sn: _P2pTraceSn | None = None
    event_trace_ts: _P2pTraceTs | None = None


class _Line(msgspec.Struct):
    header: _Header
    metadata: _Meta
    coll_perf: _CollPerf | None = None
    p2p_perf: _P2pPerf | None = None


_DECODER = msgspec.json.Decoder(_Line)


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    """One completed operation of one rank, as the Inspector wrote it (units in the field names)."""

    kind: Literal["coll", "p2p"]
    comm_id: str  # header.id: "0x%lx" of the commHash NCCL passes the plugin, cut to 14 hex digits (comm_job)
    comm_name: str | None
    rank: int
    nranks: int
    nnodes: int
    hostname: str  # gethostname(), as the Inspector prints it
    pid: int
    dump_ts_us: int  # when the dump thread wrote the line (wall clock, µs): the window is measured on it
    op: str  # AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv, ...
    sn: int  # coll_sn: NCCL's per-communicator, per-function sequence number; p2p_sn: the plugin's own
    msg_bytes: int
    exec_us: int
    algbw_gbs: float
    busbw_gbs: float
    timing: str | None  # kernel_gpu, kernel_cpu, collective_cpu (None before a version wrote it)
    peer: int | None = None  # p2p only: the other rank of the communicator
    format_version: str | None = None
    git_rev: str | None = None
    rec_mechanism: str | None = None
    start_ts_us: int | None = None  # verbose only: event_trace_ts coll/p2p start and stop (CPU clock)
    stop_ts_us: int | None = None
    kernel_start_ts_us: int | None = None  # verbose only: earliest kernel_start_ts over the channels
    channels: int | None = None  # verbose only: len(kernel_events)

    @property
    def short_host(self) -> str:
        """NCCL's log prefix and the agent's ``nccl:<host>:<pid>`` entities cut the hostname at the first dot."""
        return self.hostname.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class Skip:
    reason: str  # too_long, not_utf8, bad_json, bad_field, no_perf, impossible, non_finite, wrapped_size
    detail: str = ""


def comm_job(comm_id: str) -> str | None:
    """The communicator id exactly as NCCL's ``Init COMPLETE`` line prints it (``commId 0x%llx``), when
    the Inspector's id provably is all of it.

    Both print the same 64-bit commHash (init.cc: ``comm->commHash = commIdHash``; profiler.cc passes
    ``comm->commHash`` to the plugin's init), but the Inspector formats it into a 17-byte buffer
    (inspector.cc ``inspectorCommGetHashStr``: ``snprintf(hashStr, NCCL_COMM_HASH_LENGTH, "0x%lx")``,
    inspector.h ``NCCL_COMM_HASH_LENGTH = 17``): "0x" and at most 14 hex digits. A hash of 15 or 16
    digits (255 in 256 of them) loses its last digits, so a 14-digit id is only a prefix of NCCL's;
    the fleet matches it as one (``job_prefix``). Fewer digits cannot have been cut.
    """
    return comm_id if len(comm_id) <= 2 + 13 else None


def _number(v: float | str) -> float | None:
    """A finite float, or None for what jsonDouble writes for NaN ("nan") and for quoted infinities."""
    if isinstance(v, str):
        return None
    return v if math.isfinite(v) else None


def _intern(s: str) -> str:
    return sys.intern(s) if len(s) <= 256 else s


def _intern_opt(s: str | None) -> str | None:
    return None if s is None else _intern(s)


def _bad_text(s: str, limit: int) -> bool:
    return not s or len(s) > limit or any(ord(c) < 0x20 for c in s)


def _check(line: _Line) -> Skip | InspectorRecord:
    h, m = line.header, line.metadata
    if (line.coll_perf is None) == (line.p2p_perf is None):
        return Skip("no_perf", "neither or both of coll_perf and p2p_perf")
    if not _COMM_ID.fullmatch(h.id):
        return Skip("impossible", f"header.id {h.id[:40]!r} is not 0x%lx")
    if not (1 <= h.n_ranks <= MAX_RANKS and 0 <= h.rank < h.n_ranks and 1 <= h.nnodes <= h.n_ranks):
        return Skip("impossible", f"rank {h.rank} n_ranks {h.n_ranks} nnodes {h.nnodes}")
    if _bad_text(m.hostname, 255) or not (0 < m.pid <= MAX_PID) or not (0 < m.dump_timestamp_us < MAX_TS_US):
        return Skip("impossible", f"hostname/pid/dump_timestamp_us {m.hostname[:40]!r} {m.pid} {m.dump_timestamp_us}")
    if h.comm_name and _bad_text(h.comm_name, 4096):  # "" is not written (it is "unknown"), and harmless
        return Skip("impossible", "comm_name with control characters")
    peer: int | None = None
    if line.coll_perf is not None:
        c = line.coll_perf
        kind: Literal["coll", "p2p"] = "coll"
        op, sn, size, exec_us, timing = c.coll, c.coll_sn, c.coll_msg_size_bytes, c.coll_exec_time_us, \
            c.coll_timing_source
        algbw, busbw = _number(c.coll_algobw_gbs), _number(c.coll_busbw_gbs)
        ts = c.event_trace_ts
        start, stop = (ts.coll_start_ts, ts.coll_stop_ts) if ts else (None, None)
        kernels = ts.kernel_events if ts else None
    else:
        p = line.p2p_perf
        assert p is not None
        kind = "p2p"
        op, sn, size, exec_us, timing = p.p2p, p.p2p_sn, p.p2p_msg_size_bytes, p.p2p_exec_time_us, \
            p.p2p_timing_source
        algbw, busbw = _number(p.p2p_algobw_gbs), _number(p.p2p_busbw_gbs)
        pts = p.event_trace_ts
        start, stop = (pts.p2p_start_ts, pts.p2p_stop_ts) if pts else (None, None)
        kernels = pts.kernel_events if pts else None
        peer = p.p2p_peer
        if not 0 <= peer < h.n_ranks:
            return Skip("impossible", f"p2p_peer {peer} of {h.n_ranks} ranks")
    if not _OP_NAME.fullmatch(op) or (timing is not None and not _OP_NAME.fullmatch(timing)):
        return Skip("impossible", f"operation {op[:40]!r} timing {str(timing)[:40]!r}")
    if size >= WRAPPED_MSG_BYTES and size < 1 << 64:
        # inspector_plugin.cc: msgSizeBytes = ncclTypeSize(inspectorStringToDatatype(datatype)) * count. NCCL's
        # ncclDatatypeToString has no ncclUint8 case ("Unknown"), ncclTypeSize() of an unknown type is -1, and
        # -1 * count in size_t is 2**64 - count: every uint8/bool operation. Its bandwidths are garbage too.
        return Skip("wrapped_size", f"{op} size {size} (2**64 - {2**64 - size}: a datatype the Inspector lacks)")
    if not (0 <= size <= MAX_MSG_BYTES and 0 <= exec_us <= MAX_EXEC_US and 0 <= sn < 1 << 64):
        return Skip("impossible", f"{op} size {size} exec_time_us {exec_us} sn {sn}")
    if algbw is None or busbw is None:
        return Skip("non_finite", f"{op} algobw {algbw} busbw {busbw}")
    # busbw = algbw * factor with factor <= 2(n-1)/n < 2 (inspectorComputeOpBw); %lf rounds to 1e-6
    if not (0 <= algbw <= MAX_BW_GBS and 0 <= busbw <= 2 * algbw + 2e-6):
        return Skip("impossible", f"{op} algobw {algbw} busbw {busbw}")
    if exec_us == 0 and (algbw or busbw):
        return Skip("impossible", f"{op} bandwidth {algbw} with exec_time_us 0 (the writer prints 0)")
    kstart = None
    if kernels is not None:
        stamps = [k.kernel_start_ts for k in kernels] + [start or 0, stop or 0]
        if any(not 0 <= v < MAX_TS_US for v in stamps):
            return Skip("impossible", "event_trace_ts out of range")
        kstart = min((k.kernel_start_ts for k in kernels), default=None)
    # every line repeats the same few strings: one shared copy each (a record held is ~1/3 the size)
    return InspectorRecord(
        kind=kind, comm_id=_intern(h.id), comm_name=_intern_opt(h.comm_name), rank=h.rank, nranks=h.n_ranks,
        nnodes=h.nnodes, hostname=_intern(m.hostname), pid=m.pid, dump_ts_us=m.dump_timestamp_us, op=_intern(op),
        sn=sn, msg_bytes=size, exec_us=exec_us, algbw_gbs=algbw, busbw_gbs=busbw, timing=_intern_opt(timing),
        peer=peer, format_version=_intern_opt(m.inspector_output_format_version), git_rev=_intern_opt(m.git_rev),
        rec_mechanism=_intern_opt(m.rec_mechanism),
        start_ts_us=start, stop_ts_us=stop, kernel_start_ts_us=kstart,
        channels=len(kernels) if kernels is not None else None)


def parse_line(raw: bytes, *, max_line: int = 32768) -> InspectorRecord | Skip:
    """One dump line (without its newline) as a record, or why not. Never raises."""
    if len(raw) > max_line:
        return Skip("too_long", f"{len(raw)} bytes")
    raw = raw.strip(b" \t\r")
    try:
        raw.decode("utf-8")  # json.cc copies only whole UTF-8 sequences (utf8copy); anything else is not its
    except UnicodeDecodeError:
        return Skip("not_utf8")
    if b"inf" in raw:
        raw = _BARE_INF.sub(rb'"\1"', raw)
    try:
        line = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        return Skip("bad_field", str(exc)[:160])
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        return Skip("bad_json", str(exc)[:160])
    return _check(line)


@dataclass
class ParseResult:
    records: list[InspectorRecord] = field(default_factory=list)
    skips: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # reason -> the first skipped line (cut)
    consumed: int = 0  # bytes up to and including the last newline: a half line after it waits


def parse_lines(data: bytes, *, max_line: int = 32768) -> ParseResult:
    """Every complete line of ``data``; a trailing line without its newline is left (``consumed``)."""
    out = ParseResult()
    end = data.rfind(b"\n")
    if end < 0:
        return out
    out.consumed = end + 1
    for raw in data[:end].split(b"\n"):
        if not raw.strip():
            continue
        got = parse_line(raw, max_line=max_line)
        if isinstance(got, Skip):
            out.skips[got.reason] += 1
            out.samples.setdefault(got.reason, raw[:200].decode("utf-8", "replace"))
        else:
            out.records.append(got)
    return out


# -- the summary ----------------------------------------------------------------------------------

def size_bucket(size: int) -> int:
    """The power-of-two bucket's lower bound: [2**k, 2**(k+1)); 0 for an empty message."""
    return 1 << (size.bit_length() - 1) if size > 0 else 0


def bucket_label(lo: int) -> str:
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if lo >= 1 << shift:
            return f"{lo >> shift}{unit}"
    return f"{lo}B"


def _quantile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (inclusive): q=0.5 is the median."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _op_key(r: InspectorRecord) -> tuple[str, str, int, int]:
    return r.kind, r.op, size_bucket(r.msg_bytes), -1 if r.peer is None else r.peer


def summarize(records: Iterable[InspectorRecord], *, window_s: float | None = None, max_comms: int = 16,
              max_ops: int = 24) -> dict[str, Any]:
    """Per (communicator, rank): per operation and size bucket (and peer for P2P) the median bus and
    algorithm bandwidth and execution time over the records of the last ``window_s`` seconds (measured
    back from the newest record's dump time), with counts.

    Only GPU-timed (``kernel_gpu``) records with a non-zero time go into the medians (``n``): a CPU-timed
    one includes launch and queueing, a zero time means "under 1 µs" and its bandwidth is printed as 0.
    The others are counted (``cpu_timed``, ``untimed``). Bounded: the ``max_comms`` (communicator, rank)
    pairs with the most records, per pair the ``max_ops`` busiest keys; the rest are counted as truncated.
    Invariant: per pair, ``records`` = sum of each op's ``records`` + ``records_truncated``.
    """
    recs = list(records)
    newest = max((r.dump_ts_us for r in recs), default=0)
    if window_s is not None:
        floor = newest - int(window_s * 1e6)
        recs = [r for r in recs if r.dump_ts_us >= floor]
    groups: dict[tuple[str, int], list[InspectorRecord]] = {}
    for r in recs:
        groups.setdefault((r.comm_id, r.rank), []).append(r)
    order = sorted(groups, key=lambda k: (-len(groups[k]), k))
    comms = []
    for key in order[:max_comms]:
        comms.append(_summarize_comm(groups[key], max_ops))
    return {"schema": SUMMARY_SCHEMA, "window_s": window_s, "records": len(recs),
            "first_us": min((r.dump_ts_us for r in recs), default=None),
            "last_us": max((r.dump_ts_us for r in recs), default=None),
            "comms": comms, "comms_truncated": max(0, len(order) - max_comms),
            "records_truncated": sum(len(groups[k]) for k in order[max_comms:])}


def _summarize_comm(recs: list[InspectorRecord], max_ops: int) -> dict[str, Any]:
    last = max(recs, key=lambda r: r.dump_ts_us)
    by_op: dict[tuple[str, str, int, int], list[InspectorRecord]] = {}
    for r in recs:
        by_op.setdefault(_op_key(r), []).append(r)
    keys = sorted(by_op, key=lambda k: (-len(by_op[k]), k))
    ops = []
    for key in keys[:max_ops]:
        kind, op, lo, peer = key
        group = by_op[key]
        timed = [r for r in group if r.timing == TIMING_COMPARABLE and r.exec_us > 0]
        entry: dict[str, Any] = {"kind": kind, "op": op, "bucket": bucket_label(lo), "size_lo": lo,
                                 "size_hi": lo * 2 if lo else 1, "peer": None if peer < 0 else peer,
                                 "records": len(group), "n": len(timed),
                                 "untimed": sum(1 for r in group if r.exec_us == 0),
                                 "cpu_timed": sum(1 for r in group if r.exec_us > 0 and r.timing != TIMING_COMPARABLE),
                                 "busbw_gbs": None, "busbw_p25_gbs": None, "busbw_p75_gbs": None,
                                 "algbw_gbs": None, "exec_us": None}
        if timed:
            bus = sorted(r.busbw_gbs for r in timed)
            entry.update(busbw_gbs=round(_quantile(bus, 0.5), 3), busbw_p25_gbs=round(_quantile(bus, 0.25), 3),
                         busbw_p75_gbs=round(_quantile(bus, 0.75), 3),
                         algbw_gbs=round(_quantile(sorted(r.algbw_gbs for r in timed), 0.5), 3),
                         exec_us=round(_quantile(sorted(float(r.exec_us) for r in timed), 0.5), 1))
        ops.append(entry)
    name = last.comm_name[:128] if last.comm_name else None
    return {"comm_id": last.comm_id, "job": comm_job(last.comm_id), "job_prefix": last.comm_id, "comm_name": name,
            "rank": last.rank, "nranks": last.nranks, "nnodes": last.nnodes, "hostname": last.hostname,
            "pid": last.pid, "records": len(recs),
            "first_us": min(r.dump_ts_us for r in recs), "last_us": last.dump_ts_us,
            "ops": ops, "ops_truncated": max(0, len(keys) - max_ops),
            "records_truncated": sum(len(by_op[k]) for k in keys[max_ops:])}


# -- the collector ----------------------------------------------------------------------------------

class NCCLInspectorConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 60.0  # one NCCLInspectorSummary per process with new records, this often
    timeout: float = 120.0  # `check` reads whole files
    # The Inspector's own default directory is relative to the job's working directory
    # (nccl-inspector-<SLURM_JOBID> or nccl-inspector-unknown-jobid): jobs set NCCL_INSPECTOR_DUMP_DIR here.
    globs: list[str] = msgspec.field(default_factory=lambda: [
        "/var/log/nccl-inspector/*-pid*.log", "/var/log/nccl-inspector/*/*-pid*.log"])
    window: Annotated[float, msgspec.Meta(gt=0)] = 300.0  # the summary's medians cover this many seconds
    max_comms: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16  # (communicator, rank) pairs per event
    max_ops: Annotated[int, msgspec.Meta(ge=1, le=256)] = 24  # operation/size/peer keys per pair
    # memory per process: the newest samples_per_key records of at most keys_per_process keys
    samples_per_key: Annotated[int, msgspec.Meta(ge=1, le=100000)] = 64
    keys_per_process: Annotated[int, msgspec.Meta(ge=1, le=100000)] = 128
    max_processes: Annotated[int, msgspec.Meta(ge=1)] = 32  # 8192 records held per process are ~3.3 MB
    quiet_after: Annotated[float, msgspec.Meta(gt=0)] = 900.0  # a process without records this long is forgotten
    max_line: Annotated[int, msgspec.Meta(ge=1024)] = 32768  # a verbose line with 64 channels is ~13 KB
    chunk_bytes: Annotated[int, msgspec.Meta(ge=65536)] = 1 << 20
    rescan_interval: float = 30.0  # inotify sees the top directory; per-job subdirectories by rescan
    max_open_files: Annotated[int, msgspec.Meta(ge=1)] = 256
    idle_close: Annotated[float, msgspec.Meta(ge=0)] = 300.0


@dataclass
class _Process:
    host: str  # short hostname, as in nccl_logs' entities
    pid: int
    hostname: str
    file: str
    samples: dict[tuple[str, int, str, str, int, int], deque[InspectorRecord]] = field(default_factory=dict)
    new: int = 0  # records since the last summary
    total: int = 0
    dropped_keys: int = 0  # records of keys beyond keys_per_process
    last_seen: float = 0.0
    versions: Counter[str] = field(default_factory=Counter)

    @property
    def entity(self) -> str:
        return entities.nccl_process(self.host, self.pid)


class NCCLInspectorCollector:
    name: ClassVar[str] = "nccl_inspector"
    config_type: ClassVar[type[NCCLInspectorConfig]] = NCCLInspectorConfig

    def __init__(self, config: NCCLInspectorConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        state = emit.state_dir / "nccl_inspector_checkpoints.json" if emit.state_dir else None
        # no max_line for the tailer: parse_line counts an over-long line itself (too_long), whole
        self.tailer = Tailer(host if isinstance(host, HostRoot) else HostRoot(host.root), config.globs, state,
                             chunk_bytes=config.chunk_bytes, rescan_interval=config.rescan_interval,
                             max_open=config.max_open_files, idle_close=config.idle_close)
        self.procs: dict[tuple[str, int], _Process] = {}
        self.skips: dict[str, Counter[str]] = {}  # tailed file (host path) -> reason -> count
        self.records = 0

    # -- reading --------------------------------------------------------------------------
    async def _handle(self, tf: TailedFile, data: bytes, base: int) -> bool:
        """A chunk of complete lines: records into their process's bounded samples. Never refuses (an
        info summary is derived state; nothing here needs the exactly-once of an event)."""
        # ~20 µs a line (a 1 MiB chunk is ~45 ms): off the event loop, which other collectors share
        got = await asyncio.to_thread(parse_lines, data, max_line=self.config.max_line)
        if got.skips:
            file_skips = self.skips.setdefault(tf.path, Counter())
            for reason, n in got.skips.items():
                file_skips[reason] += n
                for _ in range(n):  # the emitter counts per call and keeps the first sample
                    self.emit.unparsed(f"NCCL Inspector lines: {reason}", f"{tf.path}: {got.samples[reason]}")
        now = time.monotonic()
        for r in got.records:
            key = (r.short_host, r.pid)
            proc = self.procs.get(key)
            if proc is None:
                if len(self.procs) >= self.config.max_processes:
                    self.skips.setdefault(tf.path, Counter())["too_many_processes"] += 1
                    continue
                proc = self.procs[key] = _Process(r.short_host, r.pid, r.hostname, tf.path)
            skey = (r.comm_id, r.rank, *_op_key(r))
            dq = proc.samples.get(skey)
            if dq is None:
                if len(proc.samples) >= self.config.keys_per_process:
                    proc.dropped_keys += 1
                    continue
                dq = proc.samples[skey] = deque(maxlen=self.config.samples_per_key)
            dq.append(r)
            proc.new += 1
            proc.total += 1
            proc.last_seen = now
            proc.file = tf.path
            if len(proc.versions) < 8 or r.format_version in proc.versions:
                proc.versions[r.format_version or "none"] += 1
        self.records += len(got.records)
        return True

    # -- publishing -------------------------------------------------------------------------
    def summary_of(self, proc: _Process) -> dict[str, Any]:
        recs = [r for dq in proc.samples.values() for r in dq]
        summary = summarize(recs, window_s=self.config.window, max_comms=self.config.max_comms,
                            max_ops=self.config.max_ops)
        comms = summary["comms"]
        world = max(comms, key=lambda c: (c["nranks"], c["records"]), default=None)
        return {**summary, "host": proc.host, "hostname": proc.hostname, "pid": proc.pid, "file": proc.file,
                "interval_s": self.config.interval, "job": world["job"] if world else None,
                "job_prefix": world["job_prefix"] if world else None,
                "world_rank": world["rank"] if world else None, "world_size": world["nranks"] if world else None,
                "records_total": proc.total, "keys_dropped": proc.dropped_keys,
                "format_versions": dict(proc.versions), "skipped": dict(self.skips.get(proc.file, {}))}

    async def _publish(self, proc: _Process) -> bool:
        details = self.summary_of(proc)
        n_ops = sum(c["records"] for c in details["comms"])
        v = verdict("NCCLInspectorSummary", "Periodic")
        ok = await self.emit.event(
            "NCCLInspectorSummary", severity=v.severity, entity=proc.entity, reason="Periodic",
            suggested_action=v.action,
            message=f"NCCL Inspector: {plural(n_ops, 'operation')} of "
                    f"{plural(len(details['comms']), 'communicator rank')} in "
                    f"{proc.host}:{proc.pid} over the last {self.config.window:g} s.",
            details=wire(NCCLInspectorSummary(**details)))
        if ok:
            proc.new = 0
        return ok

    async def collect(self) -> None:
        """Every ``interval``: a summary per process with new records; processes quiet for ``quiet_after``
        are forgotten (their last summary stands)."""
        now = time.monotonic()
        for key, proc in list(self.procs.items()):
            if proc.new:
                await self._publish(proc)
            elif now - proc.last_seen > self.config.quiet_after:
                del self.procs[key]
        live = {t.path for t in self.tailer.files.values()} | {p.file for p in self.procs.values()}
        self.skips = {path: c for path, c in self.skips.items() if path in live}  # bounded by the files read

    async def run(self) -> None:
        await self.tailer.run(self._handle)

    async def check(self) -> None:
        await self.tailer.read_all_once(self._handle)
        if not self.tailer.files:
            self.emit.not_seen(", ".join(self.config.globs), "no NCCL Inspector dump file matches "
                                                              "(jobs set NCCL_INSPECTOR_DUMP_DIR)")
        for proc in self.procs.values():
            await self._publish(proc)
