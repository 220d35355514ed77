"""What a job's launcher prints when one of its processes ended badly: srun's task exit lines, mpirun's "noticed".

Both are printed by the launcher on the node it runs on (the batch host, an MPIJob's launcher pod) about a process
on another node, and both name that node:

* srun (SchedMD/slurm src/srun/launch.c ``_task_finish``, slurm-25-05, commit 284c3b95f0): through ``error()``, so
  ``srun: error: <hosts>: <task|tasks> <ids>: <what>`` where ``what`` is ``Out Of Memory`` (the step's cgroup OOM
  killer, SIG_OOM), ``Exited with exit code <n>``, or ``strsignal()`` of the signal with `` (core dumped)``
  (``Killed``, ``Segmentation fault``, ``Aborted``, ...). ``hosts`` is a hostlist (``gpu-b``, ``gpu-[a,c]``) and
  ``ids`` task ids (``11``, ``0-7``): with srun launching one task per rank the id is the rank; with srun launching
  torchrun once per node it is the node's index, so the task id is shown, never taken for a rank. A signal is
  printed only while the step is not being cancelled (a cancel's kills are verbose only).
* Open MPI's mpirun/mpiexec (``orterun``, ``prterun``): ``<tool> noticed that process rank <r> with PID <pid> on node
  <host> exited on signal <n> (<strsignal>).`` (help text "proc-aborted-signal"; as public logs show it from
  Open MPI 1.x to 5.x, PID 0 where the launcher did not learn it). mpirun reports the first process that died
  this way and then ends the others: the rank it names is where the job broke. A process that exited non-zero
  first is told over several lines (help text "non-zero-status"): ``mpirun detected that one or more processes
  exited with non-zero status, thus causing`` / ``the job to be terminated. The first process to do so was:`` /
  ``  Process name: [[<jobfam>,<job>],<rank>]`` / ``  Exit code:    <n>`` -- the rank, no node
  (``MpirunFirstExit`` reads it line by line).

Pure, bounded, never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SRUN = re.compile(r"srun: error: (?P<hosts>[A-Za-z0-9._\-\[\],]{1,253}): tasks? (?P<tasks>[0-9,\-]{1,64}): "
                   r"(?P<what>Out Of Memory|Exited with exit code (?P<code>\d{1,3})|[A-Z][A-Za-z -]{1,40}?)"
                   r"(?P<core> \(core dumped\))?\s*$")
_MPIRUN = re.compile(r"(?P<tool>mpirun|mpiexec|orterun|prterun) noticed that process rank (?P<rank>\d{1,7}) with PID "
                     r"(?P<pid>\d{1,10}) on node (?P<host>[A-Za-z0-9._\-]{1,253}) exited on signal (?P<sig>\d{1,3}) "
                     r"\((?P<name>[A-Za-z ]{1,40})\)")
# strsignal() of the signals a launcher's cancel or a stop sends: the others' end, not where it broke
STOPPING = frozenset({"Killed", "Terminated", "Interrupt", "Hangup"})


@dataclass(frozen=True)
class LauncherExit:
    """One process (or one srun task list) a launcher saw end badly, on ``host``."""

    tool: str  # "srun", "mpirun", ...
    host: str  # the node it ran on, as the launcher names it ("" for an srun hostlist of several)
    rank: int | None  # mpirun's MPI rank; None for srun (a task id is not a rank in general)
    tasks: str  # srun's task ids ("11", "0-7"); "" for mpirun
    pid: int  # 0 where unknown
    what: str  # "Out Of Memory", "Exited with exit code 1", "Killed", "Segmentation fault", ...
    oom: bool
    signal: str  # strsignal's text for a signal ("Killed"); "" otherwise
    exitcode: int | None


def parse_launcher_exit(line: str) -> LauncherExit | None:
    """The launcher's word on a process that ended badly, from one line (any prefix before it); None otherwise."""
    line = line[:4096].rstrip("\r\n")
    if "noticed that process rank" in line:
        m = _MPIRUN.search(line)
        if m is None:
            return None
        return LauncherExit(m["tool"], m["host"], int(m["rank"]), "", int(m["pid"]) if len(m["pid"]) <= 7 else 0,
                            f"signal {m['sig']} ({m['name']})", False, m["name"], None)
    if "srun: error: " in line:
        m = _SRUN.search(line)
        if m is None:
            return None
        hosts = m["hosts"]
        host = "" if any(c in hosts for c in "[],") else hosts
        what = m["what"] + (m["core"] or "")
        oom = m["what"] == "Out Of Memory"
        code = int(m["code"]) if m["code"] else None
        signal = "" if oom or code is not None else m["what"]
        return LauncherExit("srun", host, None, m["tasks"], 0, what, oom, signal, code)
    return None


_FIRST = "The first process to do so was:"
_PROC_NAME = re.compile(r"Process name: \[\[\d{1,10},\d{1,10}\],(?P<rank>\d{1,7})\]")
_EXIT_CODE = re.compile(r"Exit code: +(?P<code>\d{1,3})\b")


class MpirunFirstExit:
    """mpirun's "The first process to do so was:" block, line by line: the rank and exit code of the process that
    exited non-zero first (its node is not printed: ``host`` is ""). A block not complete within 8 lines is
    dropped."""

    def __init__(self) -> None:
        self._left = 0
        self._rank: int | None = None

    @property
    def open(self) -> bool:
        return bool(self._left)

    def feed(self, line: str) -> LauncherExit | None:
        if _FIRST in line:
            self._left, self._rank = 8, None
            return None
        if not self._left:
            return None
        self._left -= 1
        if self._rank is None and (m := _PROC_NAME.search(line[:4096])) is not None:
            self._rank = int(m["rank"])
        elif self._rank is not None and (m := _EXIT_CODE.search(line[:4096])) is not None:
            self._left = 0
            code = int(m["code"])
            return LauncherExit("mpirun", "", self._rank, "", 0, f"exit code {code}, the first process to exit "
                                "non-zero", False, "", code)
        return None
