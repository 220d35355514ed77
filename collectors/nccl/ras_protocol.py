"""NCCL RAS client: where a job's RAS thread listens, asking it for the job's state, and reading the answer.

NCCL 2.24+ runs a RAS thread in every process (src/ras/, NVIDIA/nccl). It listens for clients on
``NCCL_RAS_ADDR`` (default ``localhost:28028``; ``NCCL_RAS_ENABLE`` other than 1 turns RAS off) and speaks a
line protocol (src/ras/client_support.cc ``rasClientEventLoop``; ``ncclras`` is src/ras/client.cc):

    client: CLIENT PROTOCOL 2        server: SERVER PROTOCOL 2      (2 in every release 2.24.3-2.31)
    client: TIMEOUT <secs>           server: OK | ERROR: Invalid timeout value ...
    client: SET FORMAT json          server: OK  (2.28.7+) | ERROR: Unknown command SET FORMAT json (older)
    client: [VERBOSE ]STATUS         server: the report, then it closes the connection

The report is text (three generations: 2.24-2.25, 2.26-2.28.3, 2.28.7+ with a third decimal on times) or,
from 2.28.7, JSON (2.28.7 and 2.28.9 print invalid JSON when a communicator has missing ranks: no comma after
``nvml_dev``; repaired here). docs/ras.md has the formats with their source lines.

``parse_status_text`` / ``parse_status_json`` never raise: what they cannot read becomes a counted entry of
``RasReport.warnings``. ``query_ras`` raises ``RasError`` (with ``reason``) when there is no usable answer.
``RasReport.suspects()`` names the processes and ranks RAS points at, strongest evidence first.
Stdlib only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gna_sdk import plural
from gna_types.reasons import RAS_SUSPECT_REASONS

# src/ras/ras_internal.h (every tag 2.24.3-1 .. 2.30.7-1 and dev 2.31.0a7)
DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT
CLIENT_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL
LEG_TIMEOUT_S = 5  # RAS_COLLECTIVE_LEG_TIMEOUT_SEC: the server's default per-query wait for its peers
EXTRA_TIMEOUT_S = 5  # RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC: added on top before the server gives up for good

# ncclFuncStr (src/init.cc), the index order of collOpCounts[NCCL_NUM_FUNCTIONS]; JSON uses the same names.
FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
# ncclErrorToString in src/ras/client_support.cc: the words the text report uses, and their ncclResult_t.
ERROR_WORDS: dict[str, int | None] = {
    "Unhandled CUDA error": 1,
    "System error": 2,
    "Internal error": 3,
    "Invalid argument": 4,
    "Invalid usage": 5,
    "Remote process error": 6,
    "NCCL operation in progress": 7,
    "Unexpected error": None,  # anything else, ncclTimeout (8, 2.30+) included
}
ERROR_NAMES: dict[int, str] = {v: k for k, v in ERROR_WORDS.items() if v is not None}
ERROR_NAMES[8] = "Timeout"  # ncclTimeout, new in 2.30; the text report calls it "Unexpected error"
REMOTE_ERROR = 6
IN_PROGRESS = 7
# statusStr: 2.24-2.25 call a rank that answered but did not report the communicator UNKNOWN, 2.26+ NOCOMM.
STATUSES = ("NOCOMM", "UNKNOWN", "INIT", "RUNNING", "FINALIZE", "ABORT")
ERROR_FLAGS = ("INCOMPLETE", "ERROR", "MISMATCH")

_MAX_INT = 2**31 - 1
_MAX_U64 = 2**64 - 1
_MAX_DEV = 1023
_MAX_WARNINGS = 64
_SAMPLE = 100


# --------------------------------------------------------------------------------------------------------------
# NCCL_RAS_ADDR / NCCL_RAS_ENABLE
# --------------------------------------------------------------------------------------------------------------

_C_SPACE = " \t\n\v\f\r"


def _strtol(s: str, base: int) -> tuple[int, int]:
    """C strtol/strtoll: (value, characters consumed); 0 consumed when nothing converts. Unclamped."""
    i, n = 0, len(s)
    while i < n and s[i] in _C_SPACE:
        i += 1
    sign = 1
    if i < n and s[i] in "+-":
        sign = -1 if s[i] == "-" else 1
        i += 1
    if base == 0:
        if s[i : i + 2].lower() == "0x" and i + 2 < n and s[i + 2] in "0123456789abcdefABCDEF":
            base, i = 16, i + 2
        elif i < n and s[i] == "0":
            base = 8
        else:
            base = 10
    digits = "0123456789abcdef"[:base]
    start = i
    while i < n and s[i].lower() in digits:
        i += 1
    if i == start:
        return 0, 0
    return sign * int(s[start:i], base), i


def _nccl_param(env: Mapping[str, str], name: str, default: int) -> int:
    """ncclLoadParam (src/misc/param.cc): ``strtoll(str, NULL, 0)``; unset or empty keeps the default, and
    so does an out-of-range value (ERANGE); trailing junk is ignored ("1abc" is 1, "abc" is 0)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value, _ = _strtol(raw, 0)
    if not -(2**63) <= value < 2**63:
        return default
    return value


def _atoi(s: str) -> int:
    """glibc atoi: (int)strtol(s, NULL, 10), a long clamped to 64 bits then cut to 32."""
    value, _ = _strtol(s, 10)
    value = max(-(2**63), min(2**63 - 1, value))
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _version_tuple(version: str | tuple[int, ...] | None) -> tuple[int, ...] | None:
    if version is None or isinstance(version, tuple):
        return version
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def ras_address(env: Mapping[str, str], *, nccl_version: str | tuple[int, ...] | None = None) -> tuple[str, int] | None:
    """Where the RAS thread of a process with this environment accepts clients, or None when it has none.

    Mirrors NCCL 2.24-2.31: RAS runs only when ``NCCL_RAS_ENABLE`` reads as exactly 1 (src/bootstrap.cc
    ``ncclParamRasEnable() == 1``; default 1). ``NCCL_RAS_ADDR`` (default ``localhost:28028``, set but empty
    means no listener) goes through ``ncclSocketGetAddrFromString`` (src/misc/socket.cc): ``[v6]:port`` or
    ``host:port`` cut at the first ``:`` and ``,`` (parseStringList, src/misc/utils.cc); the port is ``atoi``
    cut to 16 bits, so no port at all is ``htons(-1)`` = 65535 and ``host:`` is port 0 (an ephemeral port
    nobody can know: None) before 2.30.7 and 65535 from 2.30.7 (``nccl_version`` decides; unknown: None).
    A wildcard bind address (0.0.0.0, ::) is returned as the matching loopback address to connect to; a name
    is returned as is (NCCL binds the first address getaddrinfo gives for it). Settings that only
    ``NCCL_CONF_FILE``, ``~/.nccl.conf`` or ``/etc/nccl.conf`` make are not seen: merge them into ``env``
    first (the environment wins there, as in NCCL's setenv(..., 0)).
    """
    if _nccl_param(env, "NCCL_RAS_ENABLE", 1) != 1:
        return None
    addr = env.get("NCCL_RAS_ADDR")
    if addr is None:
        return ("localhost", DEFAULT_PORT)
    if len(addr) <= 1:  # "string is null": no listener
        return None
    if addr[0] == "[":
        close = addr.find("]", 1)
        if close < 0:
            return None
        inner = addr[1:close]
        pct = inner.rfind("%")
        ip_part = inner if pct < 0 else inner[:pct]
        try:
            ipaddress.IPv6Address(ip_part)
        except ValueError:  # inet_pton fails and NCCL binds whatever the stack held
            return None
        port = _atoi(addr[close + 2 :]) & 0xFFFF
        host = inner
    else:
        # both parsers skip entries without a host (",a:1", ":x,a:1") and take the first one left
        entry = next((e for e in addr.split(",") if e.partition(":")[0]), None)
        if entry is None:
            return None  # ":28028": no <host>:<port> pair
        head, sep, rest = entry.partition(":")
        version = _version_tuple(nccl_version)
        if not sep:
            port = 65535  # port -1 in both parsers
        elif rest.split(":", 1)[0] == "":
            if version is None or version < (2, 30, 7):
                return None  # old parser: atoi("") = 0 (or unknown version)
            port = 65535
        else:
            port = _atoi(rest if version is None or version < (2, 30, 7) else rest.split(":", 1)[0]) & 0xFFFF
        if len(head) > 63 or any(c in _C_SPACE for c in head):
            return None  # netIf.prefix is 64 bytes; getaddrinfo rejects blanks
        host = head
    if port == 0:
        return None
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(host.split("%", 1)[0])
        if ip.is_unspecified:  # bound to every address: connect to the loopback one
            host = "127.0.0.1" if ip.version == 4 else "::1"
    return (host, port)


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RasProcess:
    """A job process as RAS names it (job-level INCOMPLETE and DEAD lists)."""

    host: str | None  # the IP RAS prints (inet_ntop of the process's RAS address); None when RAS had none
    pid: int | None
    cuda_devs: tuple[int, ...] = ()
    nvml_devs: tuple[int, ...] = ()  # as cuda_devs unless CUDA_VISIBLE_DEVICES renumbers them


@dataclass(frozen=True, slots=True)
class RasRank:
    """A communicator rank; identity fields are None where RAS printed only the rank number."""

    rank: int
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    dead: bool | None = None  # RAS considers its process dead (JSON ``considered_dead``; text: its DEAD list)


@dataclass(slots=True)
class RasRankGroup:
    """Ranks sharing one value: a status, an operation count of one function, or an error.

    ``count`` is what RAS counted; ``ranks`` are those it listed (text lists a group only when it is an
    outlier: alone, or at most 10 and 25% of the ranks, or under 50% when verbose). JSON lists all.
    """

    what: str  # "status"; a function name ("AllReduce"), "collective" in 2.24-2.25; "init" or "async" errors
    value: str | int  # status word; operation count; error words
    count: int
    ranks: list[RasRank] = field(default_factory=list)
    code: int | None = None  # ncclResult_t of an error group


@dataclass(frozen=True, slots=True)
class RasRankState:
    """One reporting rank as JSON dumps it."""

    rank: RasRank
    init_state: int
    async_error: int
    finalize_called: bool
    destroy_flag: bool
    abort_flag: bool
    collective_counts: tuple[tuple[str, int], ...]

    @property
    def status(self) -> str:
        """The word RAS derives (client_support.cc rasClientRunComms)."""
        if self.abort_flag:
            return "ABORT"
        if self.finalize_called or self.destroy_flag:
            return "FINALIZE"
        return "RUNNING" if self.init_state == 0 else "INIT"


@dataclass(slots=True)
class RasCommGroup:
    """A row of the text summary table: communicators grouped by size, nodes, status and errors."""

    group: int
    comms: int
    nodes: int
    ranks_per_node: str  # "8" or "7-8"
    ranks_per_comm: int
    ranks_in_group: int  # distinct GPUs that reported, over the group's communicators
    status: str
    errors: tuple[str, ...]  # () for OK


@dataclass(slots=True)
class RasComm:
    """One communicator. Text names only those with something to report (``#group-index (hash)``)."""

    comm_hash: str  # 16 lowercase hex digits as the text prints it ("%016lx"; JSON's "0x%lx" padded)
    label: str | None = None  # "#0-0" in text
    group: int | None = None
    secondary_hash: str | None = None  # JSON: "hostHash:pidHash", unique together with comm_hash
    nranks: int | None = None
    ranks_reporting: int | None = None
    status: str | None = None  # the highest status among its ranks (INIT < RUNNING < FINALIZE < ABORT)
    errors: tuple[str, ...] = ()  # of ERROR_FLAGS
    missing_count: int | None = None  # ranks RAS got no answer for (their process did not respond)
    missing: list[RasRank] = field(default_factory=list)  # those RAS listed, each rank < nranks
    not_member: list[RasRank] = field(default_factory=list)  # answered, but not (or no longer) in it: NOCOMM
    init_error_count: int | None = None
    async_error_count: int | None = None
    error_groups: list[RasRankGroup] = field(default_factory=list)
    status_groups: list[RasRankGroup] = field(default_factory=list)
    op_count_groups: list[RasRankGroup] = field(default_factory=list)
    ranks: list[RasRankState] = field(default_factory=list)  # JSON only: every reporting rank


@dataclass(slots=True)
class RasJob:
    """The text report's job summary (JSON has none)."""

    nodes: int | None = None
    processes: int | None = None
    gpus: int | None = None
    processes_per_node: list[tuple[int, int]] = field(default_factory=list)  # (nodes, processes per node)
    gpus_per_process: list[tuple[int, int]] = field(default_factory=list)  # (processes, GPUs per process)
    # "The outlier nodes": RAS 2.24-2.30 prints the first peers' pids there, not the node's (index bug), so
    # only the host is worth reading.
    outlier_nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RasSuspect:
    """A process or rank RAS points at. ``reason``, strongest first: dead, unresponsive, missing, error,
    status, behind, remote_error."""

    reason: str
    detail: str
    host: str | None = None
    pid: int | None = None
    gpus: tuple[int, ...] = ()  # CUDA device numbers as RAS printed them
    comm_hash: str | None = None
    rank: int | None = None
    group_size: int | None = None  # how many ranks share this condition (a lone straggler is 1)


_SUSPECT_ORDER = RAS_SUSPECT_REASONS  # strongest first


@dataclass(slots=True)
class RasReport:
    format: str  # "text" or "json"
    nccl_version: str | None = None
    cuda_compiled: str | None = None
    cuda_runtime: int | None = None
    cuda_driver: int | None = None
    protocol: int | None = None  # the server's RAS client protocol (query_ras only)
    timestamp: str | None = None  # JSON: the server's local time, "%F %T"
    collection_time_s: float | None = None
    timeouts: int = 0  # RAS network timeouts while gathering (the answer may lack data)
    job: RasJob | None = None
    groups: list[RasCommGroup] = field(default_factory=list)
    communicators: list[RasComm] = field(default_factory=list)
    missing_process_count: int = 0  # processes that did not answer (not yet dead)
    missing_processes: list[RasProcess] = field(default_factory=list)
    dead_process_count: int = 0  # processes RAS gave up on (unreachable for 60 s)
    dead_processes: list[RasProcess] = field(default_factory=list)
    complete: bool = False  # the whole report arrived (text: its last section; JSON: a whole document)
    recognised: bool = False  # something in it was RAS output
    warnings: list[str] = field(default_factory=list)  # what could not be read, counted
    notes: list[str] = field(default_factory=list)  # what was read around (e.g. 2.28.7's JSON repaired)

    @property
    def comm_count(self) -> int:
        if self.groups:
            return sum(g.comms for g in self.groups)
        return len(self.communicators)

    @property
    def healthy(self) -> bool:
        """Complete and nothing to report: no missing or dead process, no timeout, every communicator OK."""
        return (
            self.complete
            and not self.warnings
            and self.missing_process_count == 0
            and self.dead_process_count == 0
            and self.timeouts == 0
            and not any(g.errors for g in self.groups)
            and not any(c.errors for c in self.communicators)
        )

    def suspects(self) -> list[RasSuspect]:
        return _suspects(self)

    def pids(self) -> set[int]:
        """Every process id the report names: all of the job's in JSON, only the listed ones in text. Several
        jobs of one user on a node share the RAS port (SO_REUSEPORT), so check the job you asked about is here."""
        out = {p.pid for p in [*self.missing_processes, *self.dead_processes] if p.pid is not None}
        for c in self.communicators:
            ranks = [*c.missing, *c.not_member, *(st.rank for st in c.ranks)]
            ranks += [m for g in [*c.error_groups, *c.status_groups, *c.op_count_groups] for m in g.ranks]
            out.update(m.pid for m in ranks if m.pid is not None)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, str, int, float, bool, None) for JSON."""
        out = _plain(self)
        out["healthy"] = self.healthy
        out["suspects"] = [_plain(s) for s in self.suspects()]
        return out  # type: ignore[no-any-return]


def _plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, list | tuple):
        return [_plain(x) for x in obj]
    return obj


class _Warnings:
    """Counted, bounded warnings: one entry per kind with its count and first sample."""

    def __init__(self) -> None:
        self.kinds: dict[str, list[Any]] = {}
        self.dropped = 0

    def add(self, kind: str, sample: str = "") -> None:
        entry = self.kinds.get(kind)
        if entry is not None:
            entry[0] += 1
        elif len(self.kinds) < _MAX_WARNINGS:
            self.kinds[kind] = [1, sample[:_SAMPLE] + ("..." if len(sample) > _SAMPLE else "")]
        else:
            self.dropped += 1

    def render(self) -> list[str]:
        out = []
        for kind, (count, sample) in self.kinds.items():
            s = kind if count == 1 else f"{kind} (x{count})"
            out.append(f"{s}: {sample!r}" if sample else s)
        if self.dropped:
            out.append(f"{self.dropped} more warnings of other kinds")
        return out


def _num(w: _Warnings, s: str, lo: int, hi: int, what: str) -> int | None:
    try:
        v = int(s)
    except ValueError:
        w.add(f"unreadable {what}", s)
        return None
    if not lo <= v <= hi:
        w.add(f"absurd {what}", s)
        return None
    return v


_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def _host(w: _Warnings, s: str) -> str | None:
    if s in ("", "unknown"):
        return None
    try:
        ipaddress.ip_address(s)
        return s
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(s):
        return s
    w.add("unreadable host", s)
    return None


def _hash16(w: _Warnings, s: str) -> str | None:
    t = s[2:] if s[:2].lower() == "0x" else s
    if not t or len(t) > 16 or not all(c in "0123456789abcdefABCDEF" for c in t):
        w.add("unreadable communicator hash", s)
        return None
    return t.lower().rjust(16, "0")


def _dev_list(w: _Warnings, s: str) -> tuple[int, ...] | None:
    if s == "":
        return ()
    out = []
    for part in s.split(","):
        v = _num(w, part, 0, 63, "GPU number")
        if v is None:
            return None
        out.append(v)
    return tuple(out)


# --------------------------------------------------------------------------------------------------------------
# Text reports (client_support.cc rasClientRunInit / rasClientRunComms / rasClientBreakDownErrors)
# --------------------------------------------------------------------------------------------------------------

_ID = (
    r"(?: -- (?:GPU (?P<gpu>-?\d+)(?: \(NVML (?P<nvml>-?\d+)\))? managed by process (?P<pid>-?\d+)"
    r" on node (?P<host>\S*)|(?P<noinfo>\[process information not found\])))"
)
_T = {
    "version": re.compile(r"NCCL version (?P<v>\S+) compiled with CUDA (?P<cuda>\S+)"),
    "cuda": re.compile(r"CUDA runtime version (?P<rt>-?\d+), driver version (?P<drv>-?\d+)"),
    "comms": re.compile(r"Communicators\.\.\.(?: \((?P<t>\d+(?:\.\d+)?)s\))?"),
    "row": re.compile(
        r"\s*(?P<g>\d+)\s+(?P<n>\d+)\s+(?P<nodes>\d+)\s+(?P<rpn>\d+(?:-\d+)?)\s+(?P<rpc>\d+)\s+(?P<rig>\d+)"
        r"\s+(?P<status>[A-Z]+)\s+(?P<errors>[A-Z,]+)\s*"
    ),
    "comm": re.compile(r"#(?P<g>\d+)-(?P<i>\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<kind>INCOMPLETE|ERROR|MISMATCH)"),
    "outlier_hdr": re.compile(r"The outlier nodes?:"),
    "outlier": re.compile(r"  Node (?P<host>\S*) running process(?:es)? (?P<pids>[-\d,]*)"),
    "procs_missing": re.compile(r"  Missing communicator data from (?P<n>\d+) job process(?:es)?"),
    "procs_dead": re.compile(
        r"  (?P<n>\d+) job process(?:es are| is) considered dead \(unreachable via the RAS network\)"
    ),
    "process": re.compile(
        r"  Process (?P<pid>-?\d+) on node (?P<host>\S*) managing GPUs? (?P<gpus>[\d,]*)"
        r"(?: \(NVML (?P<nvml>[\d,]*)\))?"
    ),
    "noinfo_procs": re.compile(r"  \[could not find information on (?P<n>\d+) process(?:es)?\]"),
    "ranks_missing": re.compile(r"  Missing communicator data from (?P<n>\d+) ranks?"),
    "rank_list": re.compile(r"  The (?P<which>missing|unknown) ranks?: (?P<list>[\d,]*)"),
    "init_errors": re.compile(r"  Initialization errors? on (?P<n>\d+) ranks?"),
    "async_errors": re.compile(r"  Asynchronous errors? on (?P<n>\d+) ranks?"),
    "n_reported": re.compile(r"  (?P<n>\d+) ranks reported (?P<err>.+)"),
    "diff_status": re.compile(r"  Communicator ranks have different status"),
    "diff_ops": re.compile(r"  Communicator ranks have different (?P<func>\w+) operation counts"),
    "n_status": re.compile(r"  (?P<n>\d+) ranks have status (?P<s>[A-Z]+)"),
    "n_launched": re.compile(r"  (?P<n>\d+) ranks have launched up to operation (?P<c>-?\d+)"),
    "n_none": re.compile(r"  (?P<n>\d+) ranks have not launched any operations"),
    "timeouts": re.compile(r"  Encountered (?P<n>\d+) communication timeouts? while gathering communicator data"),
    # one rank, with its identity ("Rank 3 -- GPU 3 managed by process 12 on node 10.0.0.1")
    "r_reported": re.compile(r"  Rank (?P<r>-?\d+) reported (?P<err>.+?)" + _ID),
    "r_status": re.compile(r"  Rank (?P<r>-?\d+) has status (?P<s>[A-Z]+)" + _ID),
    "r_launched": re.compile(r"  Rank (?P<r>-?\d+) has launched up to operation (?P<c>-?\d+)" + _ID),
    "r_none": re.compile(r"  Rank (?P<r>-?\d+) has not launched any operations" + _ID),
    "r_member": re.compile(r"  Rank (?P<r>-?\d+)" + _ID),
    "r_status_bare": re.compile(r"  Rank (?P<list>[\d,]+) has status (?P<s>[A-Z]+)"),  # 2.24-2.25 UNKNOWN rank
    "server_error": re.compile(r"ERROR: (?P<msg>.*)"),
}
# Lines of the job summary's tables, whitespace squeezed: header lines, and the second line that says what
# the numbers below mean (layouts: client_support.cc rasClientRunInit).
_JOB_HEADS = {
    "Nodes Processes GPUs Processes GPUs",
    "Nodes Processes GPUs",
    "Nodes Processes",
    "Processes GPUs",
}
_JOB_MODES = {
    "(total) per node per process (total) (total)": ("all", 5),
    "per node per process": ("ppn", 3),
    "(total) (total) (total)": ("totals", 3),
    "per node": ("ppn", 2),
    "per process": ("gpp", 2),
}
_TABLE_HEAD = re.compile(r"Group\s+Comms\s+Nodes\s+Ranks\s+Ranks\s+Ranks\s+Status\s+Errors")
_TABLE_HEAD2 = re.compile(r"#\s+in group\s+per comm\s+per node\s+per comm\s+in group")
_RANK_LIST_MAX = 1023  # lineBuf[1024] in client_support.cc: longer rank lists are cut off


class _TextParser:
    def __init__(self) -> None:
        self.r = RasReport(format="text")
        self.w = _Warnings()
        self.section = "preamble"  # preamble, job, comms, errors, warnings
        self.job_mode: tuple[str, int] | None = None
        self.block: str | None = None  # job_incomplete, dead, timeout, incomplete, error, mismatch
        self.sub: str | None = None  # init / async / status / ops:<func>
        self.comm: RasComm | None = None
        self.grp: RasRankGroup | None = None
        self.by_label: dict[tuple[str, str], RasComm] = {}
        self.underline_ok = False

    # -- helpers ---------------------------------------------------------------------------------------------
    def unknown(self, line: str) -> None:
        if self.block in ("incomplete", "error", "mismatch") and self.comm is None:
            self.w.add("line under an unreadable communicator header", line)
        else:
            self.w.add(f"unrecognised line in {self.section}", line)
        if not line.startswith("  "):  # every line of a block is indented: whatever this is, the block is over
            self.block = self.sub = None
            self.comm = self.grp = None

    def header(self, line: str) -> bool:
        """A ``#g-i (hash) KIND`` line opens a communicator's block; one that cannot be read opens a block
        whose lines are skipped (counted), so they are never credited to the communicator before it."""
        if not line.startswith("#"):
            return False
        m = _T["comm"].fullmatch(line)
        if m is None:
            self.w.add("unreadable communicator header", line)
            self.block, self.sub, self.comm, self.grp = "mismatch", None, None, None
            return True
        self.comm = self.comm_for(m)
        self.block, self.sub, self.grp = m.group("kind").lower(), None, None
        return True

    def rank_of(self, m: re.Match[str], r: str | None = None) -> RasRank | None:
        rank = _num(self.w, r if r is not None else m.group("r"), 0, _MAX_INT, "rank")
        if rank is None:
            return None
        c = self.comm
        if c is not None and c.nranks is not None and rank >= c.nranks:
            self.w.add("rank beyond the communicator's size", m.group(0).strip())
            return None
        if m.groupdict().get("noinfo") or m.groupdict().get("gpu") is None:
            return RasRank(rank)
        gpu = _num(self.w, m.group("gpu"), 0, _MAX_DEV, "GPU number")
        nvml = gpu if m.group("nvml") is None else _num(self.w, m.group("nvml"), 0, _MAX_DEV, "GPU number")
        pid = _num(self.w, m.group("pid"), 1, _MAX_INT, "pid")
        return RasRank(rank, _host(self.w, m.group("host")), pid, gpu, nvml)

    def new_group(self, what: str, value: str | int, count: int | None, code: int | None = None) -> None:
        self.grp = None
        if self.comm is None or count is None:
            return
        self.grp = RasRankGroup(what, value, count, code=code)
        if what == "status":
            self.comm.status_groups.append(self.grp)
        elif what in ("init", "async"):
            self.comm.error_groups.append(self.grp)
        else:
            self.comm.op_count_groups.append(self.grp)

    def add_member(self, rank: RasRank | None, line: str) -> None:
        if rank is None:
            return
        if self.grp is None:
            self.w.add(f"rank line outside a group in {self.section}", line)
            return
        if len(self.grp.ranks) >= self.grp.count:
            self.w.add("more ranks listed than counted", line)
            return
        self.grp.ranks.append(rank)

    def comm_for(self, m: re.Match[str]) -> RasComm | None:
        g = _num(self.w, m.group("g"), 0, _MAX_INT, "group number")
        i = _num(self.w, m.group("i"), 0, _MAX_INT, "communicator number")
        h = _hash16(self.w, m.group("hash"))
        if g is None or i is None or h is None:
            return None
        label = f"#{g}-{i}"
        c = self.by_label.get((label, h))
        if c is None:
            if len(self.by_label) >= 1_000_000:
                return None
            c = RasComm(comm_hash=h, label=label, group=g)
            row = self.r.groups[g] if g < len(self.r.groups) and self.r.groups[g].group == g else None
            if row is None:
                self.w.add("communicator of a group the table does not have", m.group(0))
            else:
                c.nranks, c.status, c.errors = row.ranks_per_comm, row.status, row.errors
                if i >= row.comms:
                    self.w.add("communicator number beyond its group", m.group(0))
            self.by_label[(label, h)] = c
            self.r.communicators.append(c)
        kind = m.group("kind")
        if kind not in c.errors:
            c.errors = tuple(e for e in ERROR_FLAGS if e in c.errors or e == kind)
        return c

    # -- the line dispatcher -------------------------------------------------------------------------------
    def feed(self, line: str) -> None:
        stripped = line.strip()
        if not stripped:
            return
        if set(stripped) == {"="}:
            if not self.underline_ok:
                self.unknown(line)
            self.underline_ok = False
            return
        self.underline_ok = False
        t = _T
        # section headers, valid anywhere
        if stripped == "Job summary" and line == stripped:
            self.section, self.underline_ok, self.r.recognised = "job", True, True
            self.r.job = self.r.job or RasJob()
            return
        m = t["comms"].fullmatch(line)
        if m:
            self.section, self.underline_ok, self.r.recognised = "comms", True, True
            if m.group("t"):
                self.r.collection_time_s = float(m.group("t")) if len(m.group("t")) < 20 else None
            return
        if line in ("Errors", "Warnings"):
            self.section, self.underline_ok, self.r.recognised = line.lower(), True, True
            self.block = self.sub = None
            self.comm = self.grp = None
            if line == "Warnings":
                self.r.complete = True
            return
        m = t["server_error"].fullmatch(line)
        if m:
            self.w.add("the server answered with an error", m.group("msg"))
            return
        getattr(self, "in_" + self.section)(line, stripped)

    def in_preamble(self, line: str, stripped: str) -> None:
        m = _T["version"].fullmatch(line)
        if m:
            self.r.nccl_version, self.r.cuda_compiled, self.r.recognised = m.group("v"), m.group("cuda"), True
            return
        m = _T["cuda"].fullmatch(line)
        if m:
            self.r.cuda_runtime = _num(self.w, m.group("rt"), -1, _MAX_INT, "CUDA version")
            self.r.cuda_driver = _num(self.w, m.group("drv"), -1, _MAX_INT, "CUDA version")
            self.r.recognised = True
            return
        self.unknown(line)

    def in_job(self, line: str, stripped: str) -> None:
        job = self.r.job
        assert job is not None
        squeezed = " ".join(stripped.split())
        if squeezed in _JOB_HEADS:
            self.job_mode = None
            return
        if squeezed in _JOB_MODES:
            self.job_mode = _JOB_MODES[squeezed]
            return
        if _T["outlier_hdr"].fullmatch(line):
            self.job_mode = None
            return
        m = _T["outlier"].fullmatch(line)
        if m:
            host = _host(self.w, m.group("host"))
            if host is not None and len(job.outlier_nodes) < 100_000:
                job.outlier_nodes.append(host)
            return
        parts = stripped.split()
        if self.job_mode is not None and len(parts) == self.job_mode[1] and all(p.isdigit() for p in parts):
            nums = [_num(self.w, p, 0, _MAX_INT, "job summary number") for p in parts]
            if any(n is None for n in nums):
                return
            vals = [n for n in nums if n is not None]
            mode = self.job_mode[0]
            if mode == "all":
                job.nodes, job.processes, job.gpus = vals[0], vals[3], vals[4]
                job.processes_per_node.append((vals[0], vals[1]))
                job.gpus_per_process.append((vals[3], vals[2]))
            elif mode == "totals":
                job.nodes, job.processes, job.gpus = vals
            elif mode == "ppn":
                job.processes_per_node.append((vals[0], vals[1]))
                if len(vals) == 3:
                    job.gpus_per_process.append((vals[0] * vals[1], vals[2]))
            else:
                job.gpus_per_process.append((vals[0], vals[1]))
            return
        self.unknown(line)

    def in_comms(self, line: str, stripped: str) -> None:
        if _TABLE_HEAD.fullmatch(stripped) or _TABLE_HEAD2.fullmatch(stripped):
            return
        if stripped == "No communicator data collected!":
            return
        m = _T["row"].fullmatch(line)
        if m:
            w = self.w
            nums = [_num(w, m.group(k), 0, _MAX_INT, "summary table number") for k in ("g", "n", "nodes", "rpc", "rig")]
            g, n, nodes, rpc, rig = nums
            if g is None or n is None or nodes is None or rpc is None or rig is None:
                return
            if g != len(self.r.groups):
                w.add("summary table rows out of order", line)
                return
            status = m.group("status")
            if status not in STATUSES:
                w.add("unknown communicator status", status)
            errs = tuple(e for e in m.group("errors").split(",") if e != "OK")
            if any(e not in ERROR_FLAGS for e in errs):
                w.add("unknown communicator error flag", m.group("errors"))
            if rpc == 0:
                w.add("absurd communicator size", line)
                return
            self.r.groups.append(RasCommGroup(g, n, nodes, m.group("rpn"), rpc, rig, status, errs))
            return
        self.unknown(line)

    def in_errors(self, line: str, stripped: str) -> None:
        t, w, r = _T, self.w, self.r
        if line in ("INCOMPLETE", "DEAD"):
            self.block = "job_incomplete" if line == "INCOMPLETE" else "dead"
            self.comm = self.grp = None
            return
        if self.header(line):
            return
        if self.block in ("job_incomplete", "dead"):
            m = t["procs_missing" if self.block == "job_incomplete" else "procs_dead"].fullmatch(line)
            if m:
                n = _num(w, m.group("n"), 0, _MAX_INT, "process count")
                if n is not None:
                    if self.block == "dead":
                        r.dead_process_count = n
                    else:
                        r.missing_process_count = n
                return
            m = t["process"].fullmatch(line)
            if m:
                p = self.process(m)
                target = r.dead_processes if self.block == "dead" else r.missing_processes
                count = r.dead_process_count if self.block == "dead" else r.missing_process_count
                if p is not None:
                    if len(target) < count:
                        target.append(p)
                    else:
                        w.add("more processes listed than counted", line)
                return
            if t["noinfo_procs"].fullmatch(line):
                return
        elif self.block == "incomplete" and self.comm is not None:
            c = self.comm
            m = t["ranks_missing"].fullmatch(line)
            if m:
                c.missing_count = _num(w, m.group("n"), 0, c.nranks or _MAX_INT, "missing rank count")
                return
            m = t["rank_list"].fullmatch(line)
            if m and m.group("which") == "missing":
                for rank in self.rank_list(m):
                    self.add_missing(c, RasRank(rank), line)
                return
            m = t["r_member"].fullmatch(line)
            if m:
                self.add_missing(c, self.rank_of(m), line)
                return
        elif self.block == "error" and self.comm is not None:
            c = self.comm
            for kind in ("init", "async"):
                m = t[kind + "_errors"].fullmatch(line)
                if m:
                    n = _num(w, m.group("n"), 0, c.nranks or _MAX_INT, "error rank count")
                    if kind == "init":
                        c.init_error_count = n
                    else:
                        c.async_error_count = n
                    self.sub, self.grp = kind, None
                    return
            if self.sub is not None:
                m = t["n_reported"].fullmatch(line)
                if m:
                    err = m.group("err")
                    self.new_group(self.sub, err, _num(w, m.group("n"), 2, _MAX_INT, "rank count"), self.code(err))
                    return
                m = t["r_reported"].fullmatch(line)
                if m:
                    err = m.group("err")
                    self.new_group(self.sub, err, 1, self.code(err))
                    self.add_member(self.rank_of(m), line)
                    return
                m = t["r_member"].fullmatch(line)
                if m:
                    self.add_member(self.rank_of(m), line)
                    return
        self.unknown(line)

    def in_warnings(self, line: str, stripped: str) -> None:
        t, w = _T, self.w
        if line == "TIMEOUT":
            self.block, self.comm, self.grp = "timeout", None, None
            return
        if self.header(line):
            return
        if self.block == "timeout":
            m = t["timeouts"].fullmatch(line)
            if m:
                self.r.timeouts = _num(w, m.group("n"), 0, _MAX_INT, "timeout count") or 0
                return
        elif self.block == "mismatch" and self.comm is not None:
            c = self.comm
            if t["diff_status"].fullmatch(line):
                self.sub, self.grp = "status", None
                return
            m = t["diff_ops"].fullmatch(line)
            if m:
                func = m.group("func")
                if func not in FUNCTIONS and func != "collective":
                    w.add("unknown collective function", func)
                self.sub, self.grp = "ops:" + func, None
                return
            if self.sub == "status":
                m = t["n_status"].fullmatch(line)
                if m:
                    n = _num(w, m.group("n"), 2, _MAX_INT, "rank count")
                    self.new_group("status", self.status(m.group("s")), n)
                    return
                m = t["r_status"].fullmatch(line)
                if m:
                    self.new_group("status", self.status(m.group("s")), 1)
                    self.add_status_rank(c, self.rank_of(m), line)
                    return
                m = t["r_status_bare"].fullmatch(line)
                if m:
                    ranks = self.rank_list(m)
                    self.new_group("status", self.status(m.group("s")), max(1, len(ranks)))
                    for rank in ranks:
                        self.add_status_rank(c, RasRank(rank), line)
                    return
                m = t["rank_list"].fullmatch(line)
                if m and m.group("which") == "unknown":
                    for rank in self.rank_list(m):
                        self.add_status_rank(c, RasRank(rank), line)
                    return
                m = t["r_member"].fullmatch(line)
                if m:
                    self.add_status_rank(c, self.rank_of(m), line)
                    return
            elif self.sub is not None:
                func = self.sub[4:]
                m = t["n_launched"].fullmatch(line)
                if m:
                    cnt = _num(w, m.group("c"), 0, _MAX_U64, "operation count")
                    n = _num(w, m.group("n"), 2, _MAX_INT, "rank count")
                    self.new_group(func, cnt if cnt is not None else -1, n)
                    return
                m = t["n_none"].fullmatch(line)
                if m:
                    self.new_group(func, 0, _num(w, m.group("n"), 2, _MAX_INT, "rank count"))
                    return
                m = t["r_launched"].fullmatch(line) or t["r_none"].fullmatch(line)
                if m:
                    cnt = _num(w, m.group("c"), 0, _MAX_U64, "operation count") if "c" in m.groupdict() else 0
                    self.new_group(func, cnt if cnt is not None else -1, 1)
                    self.add_member(self.rank_of(m), line)
                    return
                m = t["r_member"].fullmatch(line)
                if m:
                    self.add_member(self.rank_of(m), line)
                    return
        self.unknown(line)

    # -- pieces ----------------------------------------------------------------------------------------------
    def process(self, m: re.Match[str]) -> RasProcess | None:
        pid = _num(self.w, m.group("pid"), 1, _MAX_INT, "pid")
        cuda = _dev_list(self.w, m.group("gpus"))
        nvml = cuda if m.group("nvml") is None else _dev_list(self.w, m.group("nvml"))
        if cuda is None or nvml is None:
            return None
        return RasProcess(_host(self.w, m.group("host")), pid, cuda, nvml)

    def rank_list(self, m: re.Match[str]) -> list[int]:
        text = m.group("list")
        parts = [p for p in text.split(",") if p]
        if len(text) >= _RANK_LIST_MAX and parts:
            self.w.add("rank list cut off by RAS (1023 characters); the last number dropped", text[-20:])
            parts = parts[:-1]
        out = []
        for p in parts:
            v = _num(self.w, p, 0, _MAX_INT, "rank")
            if v is None:
                continue
            if self.comm is not None and self.comm.nranks is not None and v >= self.comm.nranks:
                self.w.add("rank beyond the communicator's size", m.group(0).strip())
                continue
            out.append(v)
        return out

    def add_missing(self, c: RasComm, rank: RasRank | None, line: str) -> None:
        if rank is None:
            return
        if any(x.rank == rank.rank for x in c.missing):
            self.w.add("missing rank listed twice", line)
            return
        limit = c.missing_count if c.missing_count is not None else c.nranks
        if limit is not None and len(c.missing) >= limit:
            self.w.add("more missing ranks listed than counted", line)
            return
        c.missing.append(rank)

    def add_status_rank(self, c: RasComm, rank: RasRank | None, line: str) -> None:
        self.add_member(rank, line)
        g = self.grp
        if (rank is not None and g is not None and g.value in ("NOCOMM", "UNKNOWN") and rank in g.ranks
                and not any(x.rank == rank.rank for x in c.not_member)):
            c.not_member.append(rank)

    def status(self, s: str) -> str:
        if s not in STATUSES:
            self.w.add("unknown rank status", s)
        return s

    def code(self, err: str) -> int | None:
        if err not in ERROR_WORDS:
            self.w.add("unknown NCCL error words", err)
        return ERROR_WORDS.get(err)

    def finish(self) -> RasReport:
        r = self.r
        if r.recognised and not r.complete:
            self.w.add("the report ends early (no Warnings section)")
        dead = {(p.host, p.pid) for p in r.dead_processes}
        for c in r.communicators:
            if c.missing_count is not None and len(c.missing) > c.missing_count:
                self.w.add("more missing ranks listed than counted", c.label or c.comm_hash)
            # ranks that reported = all - those whose process did not answer - those that answered without it
            # (NOCOMM, 2.26+). 2.24-2.25 count every absent rank both as missing and as UNKNOWN: no double count.
            if c.nranks is not None and not ("INCOMPLETE" in c.errors and c.missing_count is None):
                unknown = sum(g.count for g in c.status_groups if g.value == "UNKNOWN")
                nocomm = sum(g.count for g in c.status_groups if g.value == "NOCOMM")
                gone = max(c.missing_count or 0, unknown) + nocomm
                c.ranks_reporting = c.nranks - gone if gone <= c.nranks else None
            if dead:
                c.missing = [
                    RasRank(x.rank, x.host, x.pid, x.cuda_dev, x.nvml_dev, True) if (x.host, x.pid) in dead else x
                    for x in c.missing
                ]
        r.warnings = self.w.render()
        return r


def parse_status_text(text: str | bytes) -> RasReport:
    """Read the text answer to STATUS / VERBOSE STATUS of any NCCL 2.24-2.31. Never raises."""
    p = _TextParser()
    try:
        if isinstance(text, bytes | bytearray):
            if b"\0" in text:
                p.w.add("binary data (NUL bytes)")
            text = bytes(text).decode("utf-8", "replace")
        for raw in text.split("\n"):
            p.feed(raw.rstrip("\r"))
    except Exception as e:  # a parser bug must not take the collector down; say so instead
        p.w.add("internal parser error", f"{type(e).__name__}: {e}")
        p.r.complete = False
    return p.finish()


# --------------------------------------------------------------------------------------------------------------
# JSON reports (client_support.cc jsonWrite*, rasDumpCommsToJSON; 2.28.7+)
# --------------------------------------------------------------------------------------------------------------

# 2.28.7 and 2.28.9 write '"nvml_dev": %d\n' without the comma before a missing rank's "status" (fixed 2.29).
_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d+)(\s*"status": \{\s*"unresponsive")')


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _JsonReader:
    def __init__(self, w: _Warnings) -> None:
        self.w = w

    def num(self, d: Mapping[str, Any], key: str, lo: int, hi: int, where: str) -> int | None:
        v = d.get(key)
        if v is None:
            self.w.add(f"missing {key} in {where}")
            return None
        if type(v) is not int:
            self.w.add(f"{key} is not an integer in {where}", repr(v))
            return None
        if not lo <= v <= hi:
            self.w.add(f"absurd {key} in {where}", repr(v))
            return None
        return v

    def flag(self, d: Mapping[str, Any], key: str, where: str) -> bool | None:
        v = d.get(key)
        if type(v) is not bool:
            self.w.add(f"{key} is not true/false in {where}", repr(v))
            return None
        return v

    def text(self, d: Mapping[str, Any], key: str, where: str, limit: int = 256) -> str | None:
        v = d.get(key)
        if not isinstance(v, str) or len(v) > limit:
            self.w.add(f"{key} is not a string in {where}", repr(v)[:_SAMPLE])
            return None
        return v

    def identity(self, d: Mapping[str, Any], where: str, nranks: int | None) -> RasRank | None:
        rank = self.num(d, "rank", 0, _MAX_INT, where)
        if rank is None:
            return None
        if nranks is not None and rank >= nranks:
            self.w.add(f"rank beyond the communicator's size in {where}", repr(rank))
            return None
        host_s = self.text(d, "host", where)
        pid = self.num(d, "pid", -1, _MAX_INT, where)
        cuda = self.num(d, "cuda_dev", -1, _MAX_DEV, where)
        nvml = self.num(d, "nvml_dev", -1, _MAX_DEV, where)
        return RasRank(
            rank,
            _host(self.w, host_s) if host_s is not None else None,
            pid if pid not in (None, -1, 0) else None,
            cuda if cuda != -1 else None,
            nvml if nvml != -1 else None,
        )


def parse_status_json(data: str | bytes) -> RasReport:
    """Read the JSON answer (``SET FORMAT json``, NCCL 2.28.7+). Never raises."""
    r = RasReport(format="json")
    w = _Warnings()
    try:
        _parse_json_into(r, w, data)
    except Exception as e:  # a parser bug must not take the collector down
        w.add("internal parser error", f"{type(e).__name__}: {e}")
        r.complete = False
    r.warnings = w.render()
    return r


def _parse_json_into(r: RasReport, w: _Warnings, data: str | bytes) -> None:
    text = bytes(data).decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        fixed = _MISSING_COMMA.sub(r"\1,\2", text)
        doc = None
        if fixed != text:
            with contextlib.suppress(ValueError, RecursionError):
                doc = json.loads(fixed, parse_constant=_reject_constant)
                r.notes.append("repaired the comma NCCL 2.28.7-2.28.9 omit after a missing rank's nvml_dev")
        if doc is None:
            w.add("not valid JSON", str(e))
            return
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        w.add("JSON is not a RAS status document", text[:_SAMPLE])
        return
    rd = _JsonReader(w)
    r.recognised = True
    r.nccl_version = rd.text(doc, "nccl_version", "the header", 64)
    r.cuda_runtime = rd.num(doc, "cuda_runtime_version", -1, _MAX_INT, "the header")
    r.cuda_driver = rd.num(doc, "cuda_driver_version", -1, _MAX_INT, "the header")
    r.timestamp = rd.text(doc, "timestamp", "the header", 64)
    count = rd.num(doc, "communicators_count", 0, _MAX_INT, "the header")
    comms = doc["communicators"]
    if count is not None and count != len(comms):
        w.add("communicators_count differs from the communicators listed", f"{count} vs {len(comms)}")
    for i, cd in enumerate(comms):
        where = f"communicator {i}"
        if not isinstance(cd, dict):
            w.add("communicator is not an object", repr(cd)[:_SAMPLE])
            continue
        c = _json_comm(rd, cd, where)
        if c is not None:
            r.communicators.append(c)
    ras = doc.get("ras")
    if isinstance(ras, dict):
        t = ras.get("collection_time_sec")
        if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= 1e6:
            r.collection_time_s = float(t)
        else:
            w.add("unreadable collection_time_sec", repr(t))
        r.timeouts = rd.num(ras, "timeouts_count", 0, _MAX_INT, "ras") or 0
        r.complete = True
    else:
        w.add("no ras object (the document is cut short or not RAS's)")
    # job-level views the text report has and JSON does not: processes behind unresponsive or dead ranks
    seen: set[tuple[str | None, int | None]] = set()
    for c in r.communicators:
        for m in c.missing:
            key = (m.host, m.pid)
            if key in seen or (m.host is None and m.pid is None):
                continue
            seen.add(key)
            devs = (m.cuda_dev,) if m.cuda_dev is not None else ()
            nvml = (m.nvml_dev,) if m.nvml_dev is not None else ()
            proc = RasProcess(m.host, m.pid, devs, nvml)
            if m.dead:
                r.dead_processes.append(proc)
            else:
                r.missing_processes.append(proc)
    r.dead_process_count = len(r.dead_processes)
    r.missing_process_count = len(r.missing_processes)


def _json_comm(rd: _JsonReader, cd: Mapping[str, Any], where: str) -> RasComm | None:
    w = rd.w
    h = rd.text(cd, "hash", where, 20)
    h16 = _hash16(w, h) if h is not None else None
    if h16 is None:
        return None
    c = RasComm(comm_hash=h16)
    sec = rd.text(cd, "secondary_hash", where, 40)
    c.secondary_hash = sec
    c.nranks = rd.num(cd, "size", 1, _MAX_INT, where)
    c.ranks_reporting = rd.num(cd, "ranks_count", 0, c.nranks or _MAX_INT, where)
    missing_total = rd.num(cd, "missing_ranks_count", 0, c.nranks or _MAX_INT, where)
    ranks = cd.get("ranks")
    missing = cd.get("missing_ranks")
    if not isinstance(ranks, list) or not isinstance(missing, list):
        w.add(f"ranks or missing_ranks is not a list in {where}")
        ranks = ranks if isinstance(ranks, list) else []
        missing = missing if isinstance(missing, list) else []
    seen: set[int] = set()
    for rdct in ranks:
        if not isinstance(rdct, dict):
            w.add(f"rank is not an object in {where}", repr(rdct)[:_SAMPLE])
            continue
        ident = rd.identity(rdct, where, c.nranks)
        st = rdct.get("status")
        cc = rdct.get("collective_counts")
        if ident is None or not isinstance(st, dict) or not isinstance(cc, dict):
            if ident is not None:
                w.add(f"rank without status or collective_counts in {where}")
            continue
        if ident.rank in seen:
            w.add(f"rank listed twice in {where}", repr(ident.rank))
            continue
        seen.add(ident.rank)
        init = rd.num(st, "init_state", 0, 255, where)
        asyn = rd.num(st, "async_error", 0, 255, where)
        fin, des, abo = (rd.flag(st, k, where) for k in ("finalize_called", "destroy_flag", "abort_flag"))
        counts = []
        for k, v in list(cc.items())[:64]:
            if type(v) is int and 0 <= v <= _MAX_U64 and len(k) <= 64:
                counts.append((k, v))
            else:
                w.add(f"unreadable collective count in {where}", f"{k}={v!r}"[:_SAMPLE])
        c.ranks.append(
            RasRankState(ident, init or 0, asyn or 0, bool(fin), bool(des), bool(abo), tuple(counts))
        )
    for mdct in missing:
        if not isinstance(mdct, dict):
            w.add(f"missing rank is not an object in {where}", repr(mdct)[:_SAMPLE])
            continue
        ident = rd.identity(mdct, where, c.nranks)
        st = mdct.get("status")
        if ident is None:
            continue
        if ident.rank in seen:
            w.add(f"rank both reporting and missing in {where}", repr(ident.rank))
            continue
        seen.add(ident.rank)
        unresp = dead = None
        if isinstance(st, dict):
            unresp = rd.flag(st, "unresponsive", where)
            dead = rd.flag(st, "considered_dead", where)
        else:
            w.add(f"missing rank without status in {where}")
        rank = RasRank(ident.rank, ident.host, ident.pid, ident.cuda_dev, ident.nvml_dev, dead)
        if unresp is False:
            c.not_member.append(rank)
        else:
            c.missing.append(rank)
    if c.ranks_reporting is not None and c.ranks_reporting != len(c.ranks):
        w.add(f"ranks_count differs from the ranks listed in {where}")
    if missing_total is not None and missing_total != len(c.missing) + len(c.not_member):
        w.add(f"missing_ranks_count differs from the missing ranks listed in {where}")
    c.missing_count = len(c.missing)
    _analyse(c)
    return c


def _analyse(c: RasComm) -> None:
    """What the text report would say about a JSON communicator (client_support.cc rasClientRunComms)."""
    order = {"NOCOMM": 0, "INIT": 1, "RUNNING": 2, "FINALIZE": 3, "ABORT": 4}
    statuses: dict[str, list[RasRank]] = {}
    for st in c.ranks:
        statuses.setdefault(st.status, []).append(st.rank)
    if c.not_member:
        statuses.setdefault("NOCOMM", []).extend(c.not_member)
    if statuses:
        c.status = max(statuses, key=lambda s: order[s])
    errors = set()
    if c.missing:
        errors.add("INCOMPLETE")
    if len(statuses) > 1:
        errors.add("MISMATCH")
        for s, members in sorted(statuses.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            c.status_groups.append(RasRankGroup("status", s, len(members), list(members)))
    funcs: list[str] = []
    for st in c.ranks:
        for k, _ in st.collective_counts:
            if k not in funcs:
                funcs.append(k)
    for f in funcs:
        by: dict[int, list[RasRank]] = {}
        for st in c.ranks:
            v = dict(st.collective_counts).get(f)
            if v is not None:
                by.setdefault(v, []).append(st.rank)
        if len(by) > 1:
            errors.add("MISMATCH")
            for v, members in sorted(by.items(), key=lambda kv: (-len(kv[1]), -kv[0])):
                c.op_count_groups.append(RasRankGroup(f, v, len(members), list(members)))
    for kind, attr in (("init", "init_state"), ("async", "async_error")):
        by_err: dict[int, list[RasRank]] = {}
        for st in c.ranks:
            code = getattr(st, attr)
            if code not in (0, IN_PROGRESS):
                by_err.setdefault(code, []).append(st.rank)
        total = sum(len(v) for v in by_err.values())
        if kind == "init":
            c.init_error_count = total
        else:
            c.async_error_count = total
        for code, members in sorted(by_err.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            errors.add("ERROR")
            name = ERROR_NAMES.get(code, "Unexpected error")
            c.error_groups.append(RasRankGroup(kind, name, len(members), list(members), code))
    c.errors = tuple(e for e in ERROR_FLAGS if e in errors)


def parse_status(data: str | bytes) -> RasReport:
    """Either format, told apart by the first character ('{' is JSON)."""
    head = data[:64].lstrip()
    if isinstance(head, bytes | bytearray):
        return parse_status_json(data) if head[:1] == b"{" else parse_status_text(data)
    return parse_status_json(data) if head[:1] == "{" else parse_status_text(data)


# --------------------------------------------------------------------------------------------------------------
# Who RAS points at
# --------------------------------------------------------------------------------------------------------------


def _gpus(r: RasRank) -> tuple[int, ...]:
    return (r.cuda_dev,) if r.cuda_dev is not None else ()


def _who(host: str | None, pid: int | None, gpus: Iterable[int]) -> str:
    g = ",".join(str(x) for x in gpus)
    parts = [f"process {pid}" if pid is not None else "a process", f"on {host}" if host else ""]
    if g:
        parts.append(f"(GPU {g})")
    return " ".join(p for p in parts if p)


def _suspects(r: RasReport) -> list[RasSuspect]:
    out: list[RasSuspect] = []
    named: set[tuple[str, str | None, int | None]] = set()  # (reason class, host, pid) already given

    def add(s: RasSuspect) -> None:
        out.append(s)
        if s.pid is not None:
            named.add(("process", s.host, s.pid))

    for p in r.dead_processes:
        add(RasSuspect("dead", f"{_who(p.host, p.pid, p.cuda_devs)} is considered dead by RAS (unreachable)",
                       p.host, p.pid, p.cuda_devs))
    for p in r.missing_processes:
        add(RasSuspect("unresponsive", f"{_who(p.host, p.pid, p.cuda_devs)} did not answer RAS",
                       p.host, p.pid, p.cuda_devs))
    for c in r.communicators:
        for m in c.missing:
            if m.pid is not None and ("process", m.host, m.pid) in named:
                reason = "dead" if m.dead else "unresponsive"
                out.append(RasSuspect(reason, f"rank {m.rank} of {c.comm_hash}: its process did not answer",
                                      m.host, m.pid, _gpus(m), c.comm_hash, m.rank, c.missing_count))
                continue
            reason = "dead" if m.dead else "missing"
            why = f"rank {m.rank} of {c.comm_hash} sent no data ({_who(m.host, m.pid, _gpus(m))})"
            out.append(RasSuspect(reason, why, m.host, m.pid, _gpus(m), c.comm_hash, m.rank, c.missing_count))
    for c in r.communicators:
        for g in c.error_groups:
            reason = "remote_error" if g.code == REMOTE_ERROR else "error"
            kind = "initialisation" if g.what == "init" else "asynchronous"
            for m in g.ranks:
                out.append(RasSuspect(reason, f"rank {m.rank} of {c.comm_hash} reported {kind} error {g.value!s}",
                                      m.host, m.pid, _gpus(m), c.comm_hash, m.rank, g.count))
            if not g.ranks:
                out.append(RasSuspect(reason, f"{plural(g.count, 'rank')} of {c.comm_hash} reported {kind} error "
                                      f"{g.value!s}"
                                      " (RAS did not list them)", comm_hash=c.comm_hash, group_size=g.count))
        for g in c.status_groups:
            if len(c.status_groups) > 1 and g.value in ("INIT", "ABORT") and g.count < (c.nranks or 0):
                for m in g.ranks:
                    out.append(RasSuspect("status", f"rank {m.rank} of {c.comm_hash} is in {g.value} while others"
                                          " are not", m.host, m.pid, _gpus(m), c.comm_hash, m.rank, g.count))
        by_func: dict[str, list[RasRankGroup]] = {}
        for g in c.op_count_groups:
            by_func.setdefault(g.what, []).append(g)
        for func, groups in by_func.items():
            low = min(groups, key=lambda g: g.value if isinstance(g.value, int) else -1)
            ranks = list(low.ranks) or _complement(c, groups, low)
            what = f"{func} operation"
            launched = plural(low.value, what) if isinstance(low.value, int) else f"{low.value} {what}s"
            for m in ranks:
                out.append(RasSuspect("behind", f"rank {m.rank} of {c.comm_hash} has launched {launched},"
                                      " fewer than other ranks", m.host, m.pid, _gpus(m), c.comm_hash, m.rank,
                                      low.count))
            if not ranks:
                out.append(RasSuspect("behind", f"{plural(low.count, 'rank')} of {c.comm_hash} "
                                      f"{'has' if low.count == 1 else 'have'} launched {launched}, fewer than "
                                      "other ranks (RAS did not list them)",
                                      comm_hash=c.comm_hash, group_size=low.count))
    out.sort(key=lambda s: _SUSPECT_ORDER.index(s.reason))
    return out


def _complement(c: RasComm, groups: list[RasRankGroup], low: RasRankGroup) -> list[RasRank]:
    """The ranks of an unlisted group, when every other group of the same function was listed in full."""
    if c.nranks is None or any(len(g.ranks) != g.count for g in groups if g is not low):
        return []
    taken = {m.rank for g in groups for m in g.ranks} | {m.rank for m in c.missing} | {m.rank for m in c.not_member}
    rest = [RasRank(i) for i in range(c.nranks) if i not in taken]
    return rest if len(rest) == low.count else []


def stalled(earlier: RasReport, later: RasReport) -> list[str]:
    """Communicators whose operation counts disagree and did not move between two reports: RAS's docs call
    a mismatch that persists across queries a stuck communicator (a moving one is just ranks racing)."""

    def sig(c: RasComm) -> frozenset[tuple[str, int | str, int]]:
        return frozenset((g.what, g.value, g.count) for g in c.op_count_groups)

    before = {c.comm_hash: sig(c) for c in earlier.communicators if c.op_count_groups}
    return [c.comm_hash for c in later.communicators if c.op_count_groups and before.get(c.comm_hash) == sig(c)]


# --------------------------------------------------------------------------------------------------------------
# The query
# --------------------------------------------------------------------------------------------------------------


class RasError(Exception):
    """No usable answer. ``reason``: address, refused, unreachable, timeout, closed, protocol, oversize,
    garbage. ``partial`` holds what a text answer had said before the time ran out, when anything."""

    def __init__(self, reason: str, message: str, *, partial: RasReport | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.partial = partial


_LINE_LIMIT = 4096  # a reply line of the handshake; the real ones are under 100 bytes
_CHUNK = 65536
_THREAD_PARSE = 128 * 1024  # answers larger than this are parsed off the event loop (~15 ms of parsing)


async def _resolve(host: str, port: int, loopback_only: bool,
                   allow: Callable[[str], str | None] | None = None) -> list[str]:
    if not host or len(host) > 255 or any(c in _C_SPACE for c in host):
        raise RasError("address", f"not a host: {host!r}")
    try:
        ips = [str(ipaddress.ip_address(host))]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise RasError("address", f"cannot resolve {host!r}: {e}") from None
        ips = []
        for info in infos:
            ip = str(info[4][0])
            if ip not in ips:
                ips.append(ip)
    if allow is not None:  # the caller's own rule (RasAsker: loopback or this node's addresses)
        verdicts = [(ip, allow(ip)) for ip in ips]
        ok = [ip for ip, why in verdicts if why is None]
        if not ok:
            raise RasError(next(why for _, why in verdicts if why is not None) if verdicts else "address",
                           f"{host} ({', '.join(ips)[:200]}) is not an address the agent may ask")
        return ok
    if loopback_only:
        ok = []
        for ip in ips:
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback:
                    ok.append(ip)
        if not ok:
            raise RasError("address", f"{host} is not a loopback address (pass loopback_only=False for a job's"
                           " own NCCL_RAS_ADDR)")
        ips = ok
    return ips


async def _connect(ips: list[str], port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    refused: list[str] = []
    other: list[str] = []
    for ip in ips:  # like ncclras: every address the name has, in order
        try:
            return await asyncio.open_connection(ip, port, limit=_LINE_LIMIT)
        except ConnectionRefusedError:
            refused.append(ip)
        except OSError as e:
            other.append(f"{ip}: {e.strerror or e}")
    where = ", ".join(f"{ip}:{port}" for ip in ips)
    if refused and not other:
        raise RasError("refused", f"nothing listens on {where} (RAS disabled by NCCL_RAS_ENABLE, NCCL older than"
                       " 2.24, another NCCL_RAS_ADDR, no communicator initialised yet, or the job is gone)")
    raise RasError("unreachable", f"cannot connect to {where}: {'; '.join(other + [r + ': refused' for r in refused])}")


async def _read_line(reader: asyncio.StreamReader, stage: str) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            raise RasError("closed", f"the server closed the connection during {stage}") from None
        raise RasError("protocol", f"half a line during {stage}: {e.partial[:80]!r}") from None
    except asyncio.LimitOverrunError:
        raise RasError("protocol", f"an overlong line during {stage} (over {_LINE_LIMIT} bytes)") from None
    except ConnectionError as e:
        raise RasError("closed", f"the server dropped the connection during {stage} ({e.strerror or e})") from None
    if b"\0" in raw:
        raise RasError("protocol", f"binary data during {stage}: {raw[:80]!r}")
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def _leg_timeout(timeout: float) -> int:
    return max(1, min(LEG_TIMEOUT_S, int(timeout // 2)))


async def query_ras(
    host: str,
    port: int,
    *,
    verbose: bool = True,
    prefer_json: bool = True,
    timeout: float = 5.0,
    max_bytes: int = 4 << 20,
    collective_timeout: int | None = None,
    loopback_only: bool = True,
    allow: Callable[[str], str | None] | None = None,
    sock: socket.socket | None = None,
) -> RasReport:
    """Ask a RAS thread for the job's status, as ``ncclras [-v] [-f json] -t N`` does.

    Handshake: ``CLIENT PROTOCOL 2`` (the reply must start with ``SERVER PROTOCOL``; another version is
    noted and the query goes on, as ncclras does), ``TIMEOUT N`` (``OK``), then ``SET FORMAT json`` when
    ``prefer_json`` and the server's protocol is 2 or later (``OK`` from 2.28.7; older servers answer
    ``ERROR: Unknown command`` and the answer is text), then ``[VERBOSE ]STATUS``; the answer is read until
    the server closes, ``max_bytes`` at most. The whole exchange, parsing included, ends within ``timeout``
    seconds (large answers are parsed in a thread). ``collective_timeout`` is the N of ``TIMEOUT N``: how long
    the server waits for its peers (default: half of ``timeout``, 1-5 s; the server may add up to 5 s more
    before it gives up, so a ``timeout`` of 12+ s lets it always answer). ``loopback_only`` refuses any address
    that is not loopback; a job's own NCCL_RAS_ADDR may need False. ``allow``, when given, replaces that rule: it
    gets each resolved IP and returns None to allow it or the RasError reason to refuse it with. ``sock``: a
    socket already connected to the RAS port (e.g. made inside a pod's network namespace); host and port then
    only name it in messages.
    """
    if sock is None and not 1 <= port <= 65535:
        raise RasError("address", f"port {port} is out of range")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError("timeout must be a positive number of seconds")
    if max_bytes < 1024:
        raise ValueError("max_bytes must be at least 1024")
    leg = _leg_timeout(timeout) if collective_timeout is None else collective_timeout
    if leg < 1:
        raise ValueError("collective_timeout must be at least 1 (TIMEOUT 0 lets the server wait forever)")
    stage = "connecting"
    fmt = "text"
    proto: int | None = None
    notes: list[str] = []
    received = bytearray()
    writer: asyncio.StreamWriter | None = None
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            if sock is not None:
                reader, writer = await asyncio.open_connection(sock=sock, limit=_LINE_LIMIT)
            else:
                ips = await _resolve(host, port, loopback_only, allow)
                reader, writer = await _connect(ips, port)
            stage = "the protocol handshake"
            writer.write(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n".encode())
            line = await _read_line(reader, stage)
            if not line.upper().startswith("SERVER PROTOCOL "):
                raise RasError("protocol", f"not a RAS server: {line[:80]!r}")
            value, used = _strtol(line[len("SERVER PROTOCOL ") :], 10)
            if used == 0:
                raise RasError("protocol", f"unreadable protocol version: {line[:80]!r}")
            proto = value
            if proto != CLIENT_PROTOCOL:
                notes.append(f"server speaks RAS protocol {proto}, this client {CLIENT_PROTOCOL}; went on as ncclras")
            stage = "TIMEOUT"
            writer.write(f"TIMEOUT {leg}\n".encode())
            line = await _read_line(reader, stage)
            if line.upper() != "OK":
                raise RasError("protocol", f"TIMEOUT {leg} refused: {line[:80]!r}")
            if prefer_json and proto >= CLIENT_PROTOCOL:
                stage = "SET FORMAT"
                writer.write(b"SET FORMAT json\n")
                line = await _read_line(reader, stage)
                if line.upper() == "OK":
                    fmt = "json"
                elif line.upper().startswith("ERROR: UNKNOWN COMMAND"):
                    notes.append("server predates JSON output (NCCL < 2.28.7): text report")
                else:
                    raise RasError("protocol", f"unexpected answer to SET FORMAT: {line[:80]!r}")
            stage = "the status report"
            writer.write(b"VERBOSE STATUS\n" if verbose else b"STATUS\n")
            while True:
                try:
                    chunk = await reader.read(_CHUNK)
                except ConnectionError as e:  # a reset ends the report as a close does; what came is read
                    notes.append(f"the server reset the connection after {len(received)} bytes ({e.strerror or e})")
                    break
                if not chunk:
                    break
                received += chunk
                if len(received) > max_bytes:
                    raise RasError("oversize", f"the report exceeds {max_bytes} bytes")
            writer.transport.abort()
            writer = None
            stage = "parsing"
            payload = bytes(received)
            parse = parse_status_json if fmt == "json" else parse_status_text
            if len(payload) > _THREAD_PARSE:
                report = await asyncio.to_thread(parse, payload)
            else:
                report = parse(payload)
    except TimeoutError as e:
        if not deadline.expired():  # the socket's own ETIMEDOUT, not our deadline
            raise RasError("unreachable", f"{host}:{port} timed out during {stage}: {e}") from None
        partial = None
        if received and len(received) <= _THREAD_PARSE:
            partial = (parse_status_json if fmt == "json" else parse_status_text)(bytes(received))
            partial.protocol = proto
            if not partial.recognised:
                partial = None
        raise RasError("timeout", f"no complete answer from {host}:{port} within {timeout:g} s (during {stage};"
                       f" {len(received)} bytes of report)", partial=partial) from None
    except OSError as e:  # anything else the socket says (resets are handled where they can happen)
        raise RasError("closed", f"{host}:{port} failed during {stage}: {e.strerror or e}") from None
    finally:
        if writer is not None:
            writer.transport.abort()
    if not received:
        raise RasError("closed", "the server closed the connection without a report")
    if not report.recognised:
        raise RasError("garbage", f"not a RAS report: {bytes(received[:80])!r}")
    report.protocol = proto
    report.notes[:0] = notes
    return report
