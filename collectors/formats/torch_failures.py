"""How a crashed PyTorch rank shows in training logs, read without policy: torchrun's failure report, PyTorch's
NCCL error text, the kernel's OOM-kill lines. Pure and dependency-free; every field bounded; property-tested
(tests/test_torch_failures.py, on real captures in tests/fixtures/torch_failures/).

torchrun's failure report (pytorch/pytorch torch/distributed/elastic/multiprocessing/errors/__init__.py,
``ChildFailedError.format_msg`` / ``_format_failure`` with ``_MSG_FORMAT_TEMPLATE`` and ``_FAILURE_FORMAT_TEMPLATE``;
read at v2.5.0, commit 32f585d9346e316e554c8d9bf7548af9f62141fc, and at v2.13.0, commit
cf30153c4c131c8164ee7798e5022d810682e2cb). torchrun raises ``ChildFailedError`` and Python prints it last::

    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-12-06_04:21:58
      host      : gpu-node-07
      rank      : 0 (local_rank: 0)
      exitcode  : -15 (pid: 25451)  (SIGTERM)
      error_file: <N/A>
      traceback : Signal 15 (SIGTERM) received by PID 25451
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-06_04:22:04
      host      : gpu-node-07
      rank      : 1 (local_rank: 1)
      exitcode  : 1 (pid: 25802)
      error_file: /tmp/torchelastic_lad49a9o/<run>/attempt_0/1/error.json
      traceback : Traceback (most recent call last):
        File "train.py", line 24, in main
          raise RuntimeError("...")
      RuntimeError: ...
    ============================================================

The borders are ``min(max(len(title), widest line), 60)`` wide. ``Failures:`` lists ``  <NO_OTHER_FAILURES>``
when the root cause is the only one. ``time`` is the error file's timestamp, else the time the agent saw the exit
(``datetime.fromtimestamp(ts).isoformat(sep="_")``, local time); ``host`` is the agent's ``socket.getfqdn()``;
``error_file`` is ``<N/A>`` without an error file (the worker's entry point had no ``@record``, or a signal killed
it); ``traceback`` is the error file's ``py_callstack`` with each newline followed by two spaces, else
``Signal N (NAME) received by PID P`` for a negative exit code, else a pointer to the docs. Versions differ in the
exitcode line: up to v2.10 (and v2.5.0) ``exitcode  : -9 (pid: 123)``; since pytorch/pytorch#175254 (Feb 2026, in
v2.13.0) the signal's name follows, after two spaces (``exitcode  : -9 (pid: 123)  (SIGKILL)``), and an exit code
that is no signal leaves one trailing space. Since pytorch/pytorch#160908 the workers the agent stopped with
SIGTERM are listed under ``Failures:`` too (their ``traceback`` is their own, if they got to raise first).

PyTorch's NCCL errors (pytorch/pytorch torch/csrc/distributed/c10d/NCCLUtils.hpp, ``C10D_NCCL_CHECK`` and its
siblings, and NCCLUtils.cpp ``ncclGetErrorWithVersion`` / ``getNcclErrorDetailStr``; ProcessGroupNCCL.cpp
``checkForNCCLErrorsInternal``; v2.5.0 and v2.13.0)::

    NCCL error in: <__FILE__>:<__LINE__>, <ncclGetErrorString(result)>, NCCL version <X.Y.Z>
    <ncclXxxError>: <PyTorch's reading of the code>
    Last error:
    <NCCL's last WARN, as ncclGetLastError returns it>

raised as ``torch.distributed.DistBackendError`` (a RuntimeError; plain RuntimeError before torch 2.1), and
``NCCL error: <string>, NCCL version <X.Y.Z>`` (no "in: file:line") for an asynchronous error the watchdog found.
``NCCL version`` is ``Unknown NCCL version`` when ncclGetVersion fails. The "Last error" part exists only where
PyTorch was built with ``ENABLE_NCCL_GET_LAST_ERROR`` (NCCL >= 2.13); an empty last error reads ``Last error:
Unknown NCCL Error`` on one line. When ``init_process_group`` has run, PyTorch's excepthook
(torch/distributed/distributed_c10d.py, ``_distributed_excepthook``) prefixes every line of the uncaught exception's
printout with ``[rank<N>]: ``; torchrun's ``--tee`` prefixes each worker line with ``[<role><local_rank>]:``
(``[default0]:``) or with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (torch/distributed/elastic/multiprocessing/
tail_log.py). NCCL's ``ncclGetErrorString`` strings come from NVIDIA/nccl src/init.cc (v2.7.8-1, v2.21.5-1 commit
ab2b89c4c339bd7f816fbc114a4b05d386b66290, v2.30.7-1 commit 73cf112295c33aee2b895f329f592f2a9b4b0f97), the peer
WARNs from src/misc/socket.cc (``socketProgress: Connection closed by remote peer %s``; ``Net : ...`` before
v2.18; ``... Call to recv from %s failed : %s``) and the IB transport (``NET/IB : Got completion from peer %s with
...``), the address as ``ncclSocketToString`` prints it: ``<host or IP><<port>>``.

The kernel's OOM killer (torvalds/linux mm/oom_kill.c ``dump_oom_victim`` and ``__oom_kill_process``, with
mm/memcontrol.c ``mem_cgroup_print_oom_context`` and kernel/cgroup/cpuset.c ``cpuset_print_current_mems_allowed``;
read at v6.12.118)::

    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/x,task_memcg=/x,
        task=python,pid=29187,uid=0
    Memory cgroup out of memory: Killed process 29187 (python) total-vm:1235680kB, anon-rss:260848kB,
        file-rss:12728kB, shmem-rss:66020kB, UID:0 pgtables:944kB oom_score_adj:0

(one line each, wrapped here). The message before "Killed process" is ``Out of memory``, ``Out of memory
(oom_kill_allocating_task)`` or ``Memory cgroup out of memory`` (kernels before 5.x print no message there and no
``UID:``).

Every reader here takes lines as text, with whatever a log pipeline put in front of them (a CRI or ``kubectl
--timestamps`` timestamp, ``srun --label``'s ``0: ``, a ``host: `` from pdsh, journald's header): the formats'
own keys are looked for anywhere in the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

MAX_LINE = 16384  # a longer line is read in its first MAX_LINE characters
MAX_SCRIPT = 1024
MAX_HOST = 255
MAX_TIME = 32
MAX_ERROR_FILE = 4096
MAX_EXCEPTION = 512
MAX_SIGNAL = 16
MAX_PREFIX = 256  # a longer prefix before the report's text is not learned (its lines are still read by keys)
MAX_BLOCK_LINES = 4096  # a report not closed within this many lines is dropped
MAX_ENTRIES = 256  # failures in one report (one per local worker: a node has a handful)
MAX_NCCL_FOLLOW = 8  # lines after "NCCL error" that may still belong to it
MAX_NCCL_TEXT = 512
MAX_PEER = 300
MAX_COMM = 64
MAX_CGROUP = 1024

NOT_AVAILABLE = "<N/A>"

# Linux's signal numbers (asm-generic/signal.h; x86 and arm64 alike), named as Python's signal.Signals names them,
# which is what ProcessFailure.signal_name() prints.
_SIGNALS = {
    1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
    9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
    16: "SIGSTKFLT", 17: "SIGCHLD", 18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU",
    23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO",
    30: "SIGPWR", 31: "SIGSYS", 34: "SIGRTMIN", 64: "SIGRTMAX",
}


def signal_name(signum: int) -> str:
    """Linux's name for a signal number ("" when it has none here)."""
    return _SIGNALS.get(signum, "")


# -- torchrun's failure report ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RankFailure:
    """One ``[idx]:`` entry of a torchrun failure report.

    ``signal`` is the signal's name: from the exitcode line (torch >= 2.13), else from ``Signal N (NAME)`` in the
    traceback, else Linux's name for a negative exit code; "" for a plain exit. ``error_file`` is "" for
    ``<N/A>``. ``exception`` is the first line of the exception the worker raised, as its error file recorded it
    (``RuntimeError: ...``, ``torch.distributed.DistBackendError: NCCL error in: ...``); "" when none was printed.
    ``nccl`` is that exception read as an NCCL error (with the lines after it: kind, peer), its ``rank`` this
    entry's; None when it is none.
    """

    script: str
    root_cause: bool
    index: int
    rank: int
    local_rank: int
    host: str
    exitcode: int
    pid: int
    signal: str
    error_file: str
    time: str
    exception: str
    nccl: NcclError | None = None


# Structural lines: the report's own text starts at its column 0, so a marker preceded by two spaces is a line of
# an indented traceback, not the report's.
_BORDER = re.compile(r"(?<!  )(?<!=)={20,}\s*$")
_SECTION = re.compile(r"(?<!  )(?<!-)-{20,}\s*$")
_TITLE = re.compile(r"(?<!  ) FAILED\s*$")
_FAILURES = re.compile(r"(?<!  )Failures:\s*$")
_ROOT = re.compile(r"(?<!  )Root Cause \(first observed failure\):\s*$")
_ENTRY = re.compile(r"(?<!  )(?<![\w\]])\[(\d{1,6})\]:\s*$")
# The entry's keys, found anywhere in a line.
_KEY = re.compile(r"  (time      |host      |rank      |exitcode  |error_file|traceback ): ")
_TIME_VALUE = re.compile(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d(?:\.\d{1,6})?")
_RANK_VALUE = re.compile(r"(-?\d{1,9}) \(local_rank: (-?\d{1,9})\)")
_EXIT_VALUE = re.compile(r"(-?\d{1,10}) \(pid: (\d{1,10})\)(?: {1,2}\((SIG[A-Z0-9+_-]{1,12})\))?")
_SIGNAL_MSG = re.compile(r"Signal (\d{1,3}) \(([A-Z0-9+_<>/-]{1,16})\) received by PID (\d{1,10})")
_TRACEBACK_HEAD = "Traceback (most recent call last):"
_NO_TRACEBACK = "To enable traceback see:"
_CHAIN_HEADS = ("During handling of the above exception", "The above exception was the direct cause")
_DIGITS = re.compile(r"\d+")


def _prefix_pattern(prefix: str) -> re.Pattern[str] | None:
    """A pattern for the same prefix on a later line, digits free to change (timestamps, counters)."""
    if not prefix:
        return None
    parts = _DIGITS.split(prefix)
    return re.compile(r"\d+".join(re.escape(p) for p in parts))


class _Malformed(Exception):
    pass


@dataclass(slots=True)
class _Entry:
    index: int
    root: bool
    time: str = ""
    host: str = ""
    rank: int | None = None
    local_rank: int = -1
    exitcode: int | None = None
    pid: int = -1
    signal: str = ""
    error_file: str = ""
    exception: str = ""
    # traceback state
    in_traceback: bool = False
    tb_prefix: re.Pattern[str] | None = None
    tb_prefix_text: str = ""
    after_frame: bool = False
    exc_follow: list[str] = field(default_factory=list)  # the exception's next lines, kept for an NCCL error only
    collect: bool = False


_IDLE, _TITLE_NEXT, _SECTION_NEXT, _FAILURES_NEXT, _IN_FAILURES, _ROOT_NEXT, _IN_ROOT = range(7)


class FailureReportReader:
    """Reads torchrun failure reports out of a stream of lines, one line at a time.

    ``feed(line)`` returns the entries of the report that line completed (at its closing border), in the
    report's order (the other failures, then the root cause), and an empty tuple otherwise. A report that breaks
    the format (a key with a value out of bounds, an entry without its rank or exitcode line, markers out of
    order, more than ``max_entries`` entries) is dropped whole and counted in ``malformed``; one still open after
    ``max_block_lines`` lines is dropped and counted in ``abandoned``, as is one left open by ``finish()``. The
    reader holds at most one open report: ``max_entries`` bounded entries, nothing of the tracebacks but their
    exception line (and, for an NCCL error, the few lines after it). Keys are found behind any prefix; the
    exception line only behind a prefix of at most ``MAX_PREFIX`` characters that stays the same from line to
    line but for its digits (it is told from the traceback's other lines by its indentation after the prefix).
    """

    def __init__(self, *, max_block_lines: int = MAX_BLOCK_LINES, max_entries: int = MAX_ENTRIES) -> None:
        self.max_block_lines = max_block_lines
        self.max_entries = max_entries
        self.reports = 0
        self.malformed = 0
        self.abandoned = 0
        self._reset()

    def _reset(self) -> None:
        self._state = _IDLE
        self._lines = 0
        self._prefix: str | None = ""  # what stands before the report's text; None: too long to learn
        self._script = ""
        self._failures: list[RankFailure] = []
        self._entry: _Entry | None = None

    @property
    def open_lines(self) -> int:
        """Lines read into the report now open (0 when none is)."""
        return self._lines

    @property
    def open_entries(self) -> int:
        """Entries held for the report now open."""
        return len(self._failures) + (self._entry is not None)

    def finish(self) -> None:
        """The stream ended: a report still open is dropped (counted in ``abandoned``; a border line alone, with
        no title after it yet, is no report)."""
        if self._state not in (_IDLE, _TITLE_NEXT):
            self.abandoned += 1
        self._reset()

    def feed(self, line: str) -> tuple[RankFailure, ...]:
        line = line[:MAX_LINE].rstrip("\r\n")
        if self._state == _IDLE:
            self._start(line)
            return ()
        self._lines += 1
        if self._lines > self.max_block_lines:
            self.abandoned += 1
            self._reset()
            self._start(line)
            return ()
        try:
            return self._step(line)
        except _Malformed:
            self.malformed += 1
            self._reset()
            self._start(line)
            return ()

    def _start(self, line: str) -> None:
        if "====================" not in line:
            return
        m = _BORDER.search(line)
        if m is None:
            return
        self._reset()
        self._state = _TITLE_NEXT
        self._lines = 1
        self._prefix = line[: m.start()] if m.start() <= MAX_PREFIX else None

    def _step(self, line: str) -> tuple[RankFailure, ...]:
        state = self._state
        if state == _TITLE_NEXT:
            m = _TITLE.search(line)
            if m is None:  # a banner of "=" that opens no report
                self._reset()
                self._start(line)
                return ()
            head = line[: m.start()]
            pattern = _prefix_pattern(self._prefix) if self._prefix else None
            pm = pattern.match(head) if pattern is not None else None
            if self._prefix == "":
                script = head
            elif pm is not None:
                script = head[pm.end():]
            else:  # another prefix, or one too long: the name is its last word
                script = head.rsplit(None, 1)[-1] if head.strip() else ""
            if not script or len(script) > MAX_SCRIPT or script != script.strip():
                raise _Malformed
            self._script = script
            self._state = _SECTION_NEXT
            return ()
        if state == _SECTION_NEXT:
            if _SECTION.search(line) is None:
                raise _Malformed
            self._state = _FAILURES_NEXT
            return ()
        if state == _FAILURES_NEXT:
            if _FAILURES.search(line) is None:
                raise _Malformed
            self._state = _IN_FAILURES
            return ()
        if state == _ROOT_NEXT:
            if _ROOT.search(line) is None:
                raise _Malformed
            self._state = _IN_ROOT
            return ()
        # _IN_FAILURES or _IN_ROOT
        m = _ENTRY.search(line)
        if m is not None:
            self._close_entry()
            if state == _IN_ROOT and any(f.root_cause for f in self._failures):
                raise _Malformed  # one root cause per report
            if len(self._failures) >= self.max_entries:
                raise _Malformed
            self._entry = _Entry(index=int(m.group(1)), root=state == _IN_ROOT)
            return ()
        if _SECTION.search(line) is not None:
            if state != _IN_FAILURES:
                raise _Malformed
            self._close_entry()
            self._state = _ROOT_NEXT
            return ()
        if _BORDER.search(line) is not None:
            if state != _IN_ROOT:
                raise _Malformed
            self._close_entry()
            return self._emit()
        entry = self._entry
        if entry is None:
            return ()  # "  <NO_OTHER_FAILURES>", or a stray line between entries
        if entry.in_traceback:
            self._traceback_line(entry, line)
            return ()
        k = _KEY.search(line)
        if k is not None:
            self._key(entry, k.group(1).rstrip(), line[k.end():].rstrip(), line[: k.start()])
        return ()

    def _key(self, entry: _Entry, key: str, value: str, prefix: str) -> None:
        if key == "time":
            if _TIME_VALUE.fullmatch(value) is None:
                raise _Malformed
            entry.time = value
        elif key == "host":
            if not value or len(value) > MAX_HOST or any(c.isspace() for c in value):
                raise _Malformed
            entry.host = value
        elif key == "rank":
            m = _RANK_VALUE.fullmatch(value)
            if m is None:
                raise _Malformed
            entry.rank, entry.local_rank = int(m.group(1)), int(m.group(2))
        elif key == "exitcode":
            m = _EXIT_VALUE.fullmatch(value)
            if m is None:
                raise _Malformed
            entry.exitcode, entry.pid = int(m.group(1)), int(m.group(2))
            if m.group(3):
                entry.signal = m.group(3)
        elif key == "error_file":
            if not value or len(value) > MAX_ERROR_FILE:
                raise _Malformed
            entry.error_file = "" if value == NOT_AVAILABLE else value
        else:  # traceback: the message's first line; a Python traceback goes on, indented two more
            sig = _SIGNAL_MSG.fullmatch(value)
            if sig is not None:
                if not entry.signal:
                    named = sig.group(2)
                    entry.signal = signal_name(int(sig.group(1))) or (named if named.startswith("SIG") else "")
                return
            if value.startswith(_NO_TRACEBACK):
                return
            if value != _TRACEBACK_HEAD:
                entry.exception = value[:MAX_EXCEPTION]  # an error file's message without a callstack
                entry.collect = "NCCL error" in entry.exception
            entry.in_traceback = True
            if len(prefix) <= MAX_PREFIX:
                entry.tb_prefix_text = prefix
                entry.tb_prefix = _prefix_pattern(prefix)

    @staticmethod
    def _traceback_line(entry: _Entry, line: str) -> None:
        # The report indents the callstack by two: frames ("  File ...") sit at four, their code deeper, the
        # exception's lines at two. The entry's own prefix (learned on its traceback line) is taken off first.
        if entry.tb_prefix_text and line.startswith(entry.tb_prefix_text):
            rel = line[len(entry.tb_prefix_text):]
        elif entry.tb_prefix is not None:
            m = entry.tb_prefix.match(line)
            if m is None:
                return  # not this report's line (another stream interleaved)
            rel = line[m.end():]
        else:
            rel = line
        if not rel.startswith("  "):
            return
        text = rel[2:]
        if not text.strip():
            return
        if text[0].isspace():
            entry.after_frame = True
            entry.collect = False
            return
        if entry.after_frame:
            if not text.startswith(_TRACEBACK_HEAD) and not text.startswith(_CHAIN_HEADS):
                entry.exception = text.rstrip()[:MAX_EXCEPTION]  # the last exception of a chain wins
                entry.exc_follow = []
                entry.collect = "NCCL error" in entry.exception
            entry.after_frame = False
        elif entry.collect and len(entry.exc_follow) < MAX_NCCL_FOLLOW:
            entry.exc_follow.append(text.rstrip()[:MAX_NCCL_TEXT])

    def _close_entry(self) -> None:
        entry = self._entry
        self._entry = None
        if entry is None:
            return
        if entry.rank is None or entry.exitcode is None:
            raise _Malformed
        sig = entry.signal
        if not sig and entry.exitcode < 0:
            sig = signal_name(-entry.exitcode)
        nccl = parse_nccl_error([entry.exception, *entry.exc_follow]) if "NCCL error" in entry.exception else None
        self._failures.append(RankFailure(
            script=self._script, root_cause=entry.root, index=entry.index, rank=entry.rank,
            local_rank=entry.local_rank, host=entry.host, exitcode=entry.exitcode, pid=entry.pid,
            signal=sig[:MAX_SIGNAL], error_file=entry.error_file, time=entry.time, exception=entry.exception,
            nccl=replace(nccl, rank=entry.rank) if nccl is not None else None))

    def _emit(self) -> tuple[RankFailure, ...]:
        failures = tuple(self._failures)
        self._reset()
        if not any(f.root_cause for f in failures):
            self.malformed += 1
            return ()
        self.reports += 1
        return failures


def iter_rank_failures(lines: Iterable[str], reader: FailureReportReader | None = None) -> Iterator[RankFailure]:
    """Every entry of every complete failure report in ``lines``."""
    reader = reader if reader is not None else FailureReportReader()
    for line in lines:
        yield from reader.feed(line)
    reader.finish()


# -- PyTorch's NCCL errors ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NcclError:
    """An NCCL error as PyTorch raised it.

    ``kind`` is the ncclResult_t's name (``ncclRemoteError``, ``ncclSystemError``, ...; "" for an unknown code).
    ``remote_exited`` is NCCL's own "remote process exited or there was a network error" (ncclRemoteError).
    ``where`` is ``file:line`` of the check that raised it ("" for the watchdog's asynchronous form).
    ``peer`` is the address a "Last error" WARN names (``host<port>``): ``peer_event`` says which WARN:
    ``closed`` (Connection closed by remote peer), ``recv_failed`` (Call to recv from ... failed) or
    ``ib_completion`` (NET/IB: Got completion from peer ... with error). ``rank`` comes from a ``[rankN]:`` or
    ``Rank N]`` prefix on the line, when there is one.
    """

    exception: str
    where: str
    kind: str
    remote_exited: bool
    nccl_version: str
    detail: str
    last_error: str
    peer: str
    peer_event: str
    rank: int | None


# ncclGetErrorString's strings, old (v2.7.8-1: no parentheses) and new (v2.21.5-1, v2.30.7-1), by their start.
_NCCL_RESULT_STRINGS = (
    ("unhandled cuda error", "ncclUnhandledCudaError"),
    ("unhandled system error", "ncclSystemError"),
    ("internal error", "ncclInternalError"),
    ("invalid argument", "ncclInvalidArgument"),
    ("invalid usage", "ncclInvalidUsage"),
    ("remote process exited or there was a network error", "ncclRemoteError"),
    ("NCCL operation in progress", "ncclInProgress"),
    ("timeout", "ncclTimeout"),
)
NCCL_KINDS = frozenset(kind for _, kind in _NCCL_RESULT_STRINGS)

_NCCL_ERROR = re.compile(
    r"(?:(?P<exc>(?:[A-Za-z_]\w{0,63}\.){0,8}[A-Za-z_]\w{0,63}(?:Error|Exception)): )?"
    r"NCCL error(?: in: (?P<where>[^\s,]{1,512}?:\d{1,7}),|:) (?P<desc>[^,\n]{1,128}), "
    r"NCCL version (?P<ver>Unknown NCCL version|\d{1,3}\.\d{1,3}\.\d{1,5}[\w.+-]{0,32})"
)
_NCCL_DETAIL = re.compile(
    r"(?P<kind>nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|RemoteError"
    r"|InProgress|Timeout)): |Unknown NCCL error!"
)
_LAST_ERROR = re.compile(r"Last error:(?P<rest>.*)$")
_RANK_PREFIX = re.compile(r"\[rank(\d{1,7})\]:|\bRank (\d{1,7})\]")
_ADDR = r"(?P<addr>[^\s<>]{1,253}<\d{1,5}>)"
_PEERS = (
    (re.compile(r"Connection closed by remote peer " + _ADDR), "closed"),
    (re.compile(r"Call to recv from " + _ADDR + r" failed"), "recv_failed"),
    (re.compile(r"Got completion from peer " + _ADDR + r" with"), "ib_completion"),
)


def _kind_of(desc: str) -> str:
    for text, kind in _NCCL_RESULT_STRINGS:
        if desc.startswith(text):
            return kind
    return ""


def _rank_of(prefix: str) -> int | None:
    m = _RANK_PREFIX.search(prefix)
    if m is None:
        return None
    return int(m.group(1) or m.group(2))


def parse_nccl_error(lines: Sequence[str]) -> NcclError | None:
    """The NCCL error that ``lines[0]`` starts, read with the lines after it that belong to it.

    ``lines[0]`` is a line with PyTorch's ``NCCL error in: <file>:<line>, <string>, NCCL version <v>`` (or the
    watchdog's ``NCCL error: <string>, NCCL version <v>``), with whatever stands before it (``[rank3]: ``,
    ``torch.distributed.DistBackendError: ``); None when it has none. The lines after it (up to
    ``MAX_NCCL_FOLLOW``) are read while they continue it: PyTorch's ``ncclXxxError: ...`` reading, ``Last error:``
    and the WARN on the next line. They carry the first line's prefix (or one that differs from it in digits only:
    timestamps), or none (a multi-line message logged once has its log header on its first line only).
    """
    return _read_nccl(lines)[0]


def _read_nccl(lines: Sequence[str]) -> tuple[NcclError | None, int, bool]:
    """(error, lines read into it after the first, whether it is over: no later line can belong to it)."""
    if not lines:
        return None, 0, True
    first = lines[0][:MAX_LINE]
    m = _NCCL_ERROR.search(first) if "NCCL error" in first else None
    if m is None:
        return None, 0, True
    start = m.start("exc") if m.group("exc") else m.start()
    prefix = first[:start] if start <= MAX_PREFIX else ""
    kind = _kind_of(m.group("desc").strip())
    ver = m.group("ver")
    detail = last_error = ""
    pattern = _prefix_pattern(prefix)
    want_last = over = False
    used = 0
    for raw in lines[1 : 1 + MAX_NCCL_FOLLOW]:
        line = raw[:MAX_LINE].rstrip("\r\n")
        pm = pattern.match(line) if pattern is not None else None
        # the first line's prefix, or none: a multi-line message logged once (the watchdog's LOG(ERROR)) carries
        # its log header on the first line only
        text = line[pm.end():] if pm is not None else line
        if want_last:
            last_error = text.strip()[:MAX_NCCL_TEXT]
            used += 1
            over = True
            break
        d = _NCCL_DETAIL.match(text.lstrip())
        if d is not None and not detail:
            detail = text.strip()[:MAX_NCCL_TEXT]
            kind = kind or d.group("kind") or ""
            used += 1
            continue
        le = _LAST_ERROR.match(text.lstrip())
        if le is not None:
            used += 1
            rest = le.group("rest").strip()
            if rest:  # "Last error: Unknown NCCL Error"
                last_error = rest[:MAX_NCCL_TEXT]
                over = True
                break
            want_last = True
            continue
        over = True
        break
    else:
        over = over or used >= MAX_NCCL_FOLLOW
    peer = peer_event = ""
    for rx, event in _PEERS:
        pm2 = rx.search(last_error)
        if pm2 is not None:
            peer, peer_event = pm2.group("addr")[:MAX_PEER], event
            break
    err = NcclError(
        exception=(m.group("exc") or "")[:MAX_NCCL_TEXT],
        where=(m.group("where") or "")[:MAX_NCCL_TEXT],
        kind=kind,
        remote_exited=kind == "ncclRemoteError",
        nccl_version="" if ver.startswith("Unknown") else ver,
        detail=detail,
        last_error=last_error,
        peer=peer,
        peer_event=peer_event,
        rank=_rank_of(prefix),
    )
    return err, used, over


class NcclErrorReader:
    """``parse_nccl_error`` over a stream of lines. ``feed(line)`` returns the errors that line completed: an
    error is complete when its "Last error" WARN arrived or a line that does not continue it did (that line is
    then read afresh: it may start the next error). ``finish()`` returns the one still open. Holds at most
    ``MAX_NCCL_FOLLOW + 1`` lines of at most ``MAX_LINE`` characters."""

    def __init__(self) -> None:
        self._window: list[str] = []

    @property
    def open(self) -> bool:
        """An error begun and not complete yet (its next lines may continue it)."""
        return bool(self._window)

    def feed(self, line: str) -> tuple[NcclError, ...]:
        line = line[:MAX_LINE]
        if not self._window:
            if "NCCL error" in line and _NCCL_ERROR.search(line) is not None:
                self._window.append(line)
            return ()
        self._window.append(line)
        err, used, over = _read_nccl(self._window)
        if not over and len(self._window) <= MAX_NCCL_FOLLOW:
            return ()
        rest = self._window[1 + used:]
        self._window = []
        out: tuple[NcclError, ...] = (err,) if err is not None else ()
        for later in rest:  # at most the one line that ended it
            out += self.feed(later)
        return out

    def finish(self) -> NcclError | None:
        err = _read_nccl(self._window)[0] if self._window else None
        self._window = []
        return err


# -- the kernel's OOM killer --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OomKill:
    """A process the kernel's OOM killer chose.

    ``form`` is ``killed`` for the "Killed process" line (which gives ``anon_rss_kb``) or ``summary`` for the
    ``oom-kill:`` line (which gives ``constraint`` and the victim's ``task_memcg``: its cgroup, the way to the
    pod or Slurm job it ran in). ``memcg`` is a memory cgroup's limit (not the machine) running out. ``uid`` is None
    where the line has none (kernels before 5.x on the kill line).
    """

    form: str
    pid: int
    comm: str
    uid: int | None
    memcg: bool
    constraint: str
    task_memcg: str
    anon_rss_kb: int | None


_OOM_KILLED = re.compile(
    r"(?:(?P<msg>Out of memory(?: \(oom_kill_allocating_task\))?|Memory cgroup out of memory): )?"
    r"Killed process (?P<pid>\d{1,10}) \((?P<comm>[^\n]{0,64}?)\) total-vm:\d{1,20}kB, "
    r"anon-rss:(?P<anon>\d{1,20})kB(?P<rest>[^\n]{0,512})"
)
_OOM_UID = re.compile(r", UID:(\d{1,10})\b")
_OOM_SUMMARY = re.compile(
    r"oom-kill:constraint=(?P<constraint>CONSTRAINT_[A-Z_]{1,24}),nodemask=(?P<rest>[^\n]{0,4096}?),"
    r"task=(?P<comm>[^\n]{0,64}?),pid=(?P<pid>\d{1,10}),uid=(?P<uid>\d{1,10})\s*$"
)
_OOM_TASK_MEMCG = re.compile(r",task_memcg=(?P<cg>[^\n]*)$")


def parse_oom_kill(line: str) -> OomKill | None:
    """The OOM killer's victim from one kernel log line (either form, any prefix before it); None otherwise."""
    line = line[:MAX_LINE].rstrip("\r\n")
    if "Killed process " in line:
        m = _OOM_KILLED.search(line)
        if m is None:
            return None
        uid = _OOM_UID.search(m.group("rest"))
        return OomKill(form="killed", pid=int(m.group("pid")), comm=m.group("comm"),
                       uid=int(uid.group(1)) if uid else None,
                       memcg=m.group("msg") == "Memory cgroup out of memory", constraint="", task_memcg="",
                       anon_rss_kb=int(m.group("anon")))
    if "oom-kill:constraint=" in line:
        s = _OOM_SUMMARY.search(line)
        if s is None:
            return None
        cg = _OOM_TASK_MEMCG.search(s.group("rest"))
        return OomKill(form="summary", pid=int(s.group("pid")), comm=s.group("comm"), uid=int(s.group("uid")),
                       memcg=s.group("constraint") == "CONSTRAINT_MEMCG", constraint=s.group("constraint"),
                       task_memcg=cg.group("cg")[:MAX_CGROUP] if cg else "", anon_rss_kb=None)
    return None


@dataclass(frozen=True)
class CudaError:
    """A rank's own CUDA failure as PyTorch raised it: ``CUDA error: <cudaGetErrorString>`` (c10/cuda's
    C10_CUDA_CHECK, c10_cuda_check_implementation, with get_cuda_check_suffix's "CUDA kernel errors might be
    asynchronously reported ..." after it; raised as RuntimeError, as torch.AcceleratorError since torch 2.8) or
    the caching allocator's ``CUDA out of memory. Tried to allocate ...`` (torch.OutOfMemoryError,
    torch.cuda.OutOfMemoryError before 2.5). ``rank`` from a ``[rankN]:`` prefix, when there is one."""

    exception: str  # "RuntimeError", "torch.AcceleratorError", "torch.OutOfMemoryError"
    text: str  # "CUDA error: an illegal memory access was encountered"
    out_of_memory: bool
    rank: int | None


_CUDA_ERROR = re.compile(r"(?:\[rank(?P<rank>\d{1,7})\]:\s*)?(?P<exc>(?:[A-Za-z_][\w]{0,40}\.){0,3}"
                         r"(?:RuntimeError|AcceleratorError|OutOfMemoryError)): "
                         r"(?P<text>CUDA error: [^\n]{1,300}|CUDA out of memory\.[^\n]{0,300})")


def parse_cuda_error(line: str) -> CudaError | None:
    """A rank's CUDA error or GPU out-of-memory exception line (any prefix before it); None otherwise."""
    line = line[:MAX_LINE]
    if "CUDA error: " not in line and "CUDA out of memory" not in line:
        return None
    m = _CUDA_ERROR.search(line)
    if m is None:
        return None
    text = m["text"].rstrip()
    return CudaError(m["exc"], text, text.startswith("CUDA out of memory"),
                     int(m["rank"]) if m["rank"] is not None else None)
