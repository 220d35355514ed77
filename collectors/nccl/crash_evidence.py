"""A crashed rank in a training log: torchrun's failure reports, PyTorch's NCCL errors, a launcher's word on a
process that ended (srun's task exits, mpirun's "noticed"), read out of a chunk.

The formats and their parsers are collectors/formats/torch_failures.py (torchrun's ChildFailedError report,
PyTorch's "NCCL error in: ..." exception, the kernel's OOM-kill lines) and collectors/formats/launcher_exits.py.
The first two span several lines, most of which
carry no needle of the NCCL rules' prefilter, and both are rare: a chunk is read line by line only when it holds
one of their markers (a byte search, in C), or while a report or an error begun in an earlier chunk is still
open. ``failure_reason`` says how a reported failure ended, by who is at fault (gna_types.policy grades it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from collectors.formats.launcher_exits import STOPPING, LauncherExit, MpirunFirstExit, parse_launcher_exit
from collectors.formats.torch_failures import (
    CudaError,
    FailureReportReader,
    NcclError,
    NcclErrorReader,
    RankFailure,
    parse_cuda_error,
)

# torchrun's report: the exception line before it (ChildFailedError), its sections; PyTorch's exception
# (no newline in a marker: the bench's grep -E pattern is built from them)
MARKERS = (b"ChildFailedError", b"Failures:", b"Root Cause (first observed failure)", b"NCCL error",
           b"noticed that process rank", b"srun: error: ", b"CUDA error: ", b"CUDA out of memory",
           b"The first process to do so was:")
# the victims' way out: torchrun stops the other workers with SIGTERM (elastic's ``_close``), a scheduler's
# cancel sends it too
STOPPED_BY_AGENT = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
# a peer gone under a rank's collective, as gloo's and NCCL's exceptions say it
_PEER_GONE = ("Connection reset by peer", "Connection closed by", "remote process exited", "ncclRemoteError")


@dataclass(frozen=True)
class Found:
    offset: int  # the line that completed it
    failure: RankFailure | None = None
    error: NcclError | None = None
    exit: LauncherExit | None = None
    cuda: CudaError | None = None


class CrashReader:
    """One file's readers: a report or an error begun in one chunk is finished in the next."""

    def __init__(self) -> None:
        self.reports = FailureReportReader()
        self.errors = NcclErrorReader()
        self.mpirun = MpirunFirstExit()

    @property
    def open(self) -> bool:
        """A report or an error begun and not complete: the next chunk's lines continue it."""
        return bool(self.reports.open_lines or self.errors.open or self.mpirun.open)

    def read(self, data: bytes, base: int) -> list[Found]:
        """Every report, error and launcher line the chunk completes (the caller knows it holds a marker, or that
        one is open)."""
        out: list[Found] = []
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end
            line = data[pos:min(end, pos + 65536)].decode("utf-8", "replace")
            offset = base + pos
            out.extend(Found(offset, failure=f) for f in self.reports.feed(line))
            out.extend(Found(offset, error=e) for e in self.errors.feed(line))
            if ("noticed that process rank" in line or "srun: error: " in line) and (
                    x := parse_launcher_exit(line)) is not None:
                out.append(Found(offset, exit=x))
            if (first := self.mpirun.feed(line)) is not None:
                out.append(Found(offset, exit=first))
            if (c := parse_cuda_error(line)) is not None:
                out.append(Found(offset, cuda=c))
            pos = end + 1
        return out


ABORT_AFTER_FAILURE = ("aborted after its collective timed out or NCCL failed under it (PyTorch's watchdog tears "
                       "the process down): a victim")


def failure_reason(f: RankFailure, oom: Mapping[str, Any] | None, *, aborted_after_failure: bool = False
                   ) -> tuple[str, str]:
    """(reason, explanation) of a reported failure: ``OOMKilled`` (killed, and the node's kernel log has the OOM
    kill: ``oom``), ``KilledBySignal``, ``PeerFailure`` (stopped by torchrun or a scheduler, aborted by PyTorch's
    watchdog after the process's collective failed -- ``aborted_after_failure`` -- or failed because a peer went
    away) or ``ExitedWithError`` (an error of its own)."""
    if f.signal and f.signal in STOPPED_BY_AGENT:
        return "PeerFailure", f"stopped with {f.signal} (its agent or scheduler ended the job)"
    if f.signal == "SIGABRT" and aborted_after_failure:
        return "PeerFailure", ABORT_AFTER_FAILURE
    if f.signal:
        if oom is not None and f.signal == "SIGKILL":
            return "OOMKilled", oom_explanation(oom)
        return "KilledBySignal", f"killed by {f.signal}"
    text = " ".join(x for x in (f.exception, f.nccl.exception if f.nccl else "", f.nccl.last_error if f.nccl else "")
                    if x)
    if (f.nccl is not None and (f.nccl.remote_exited or f.nccl.kind == "ncclRemoteError" or f.nccl.peer)) or any(
            p in text for p in _PEER_GONE):
        return "PeerFailure", f"exit code {f.exitcode} after a peer went away: {text[:200]}"
    return "ExitedWithError", f"exit code {f.exitcode}" + (f": {f.exception[:300]}" if f.exception else "")


def oom_explanation(oom: Mapping[str, Any]) -> str:
    """An OOM kill of the kernel log (kmsg_xid's kernel.oom_kills) as a crash's explanation."""
    memcg = ", its cgroup over its limit" if oom.get("memcg") else ""
    return f"the kernel's OOM killer ended it (Killed process {oom.get('pid')} ({str(oom.get('comm'))[:64]}){memcg})"


def oom_of(kills: Iterable[Mapping[str, Any]], pids: Iterable[int], cgroups: Iterable[str]) -> Mapping[str, Any] | None:
    """The OOM kill (the kernel log's, newest first) of one of these pids, or whose victim's cgroup names one of
    ``cgroups`` (a pod's UID, "job_<id>" of a Slurm job); None if none does."""
    want = {p for p in pids if p > 0}
    marks = [c for c in cgroups if c]
    for k in reversed(list(kills)):
        if k.get("pid") in want or any(c in str(k.get("task_memcg") or "") for c in marks):
            found: Mapping[str, Any] = k
            return found
    return None


def report_time(value: str, tz: dt.tzinfo | None) -> str:
    """torchrun's ``time`` field (``datetime.fromtimestamp(ts).isoformat(sep="_")``: the node's local time) as
    RFC 3339 UTC ("" when it is not one)."""
    try:
        t = dt.datetime.fromisoformat(value[:40].replace("_", "T", 1))
    except ValueError:
        return ""
    if t.tzinfo is None:
        t = t.replace(tzinfo=tz or dt.UTC)
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def exit_reason(x: LauncherExit, *, aborted_after_failure: bool = False) -> tuple[str, str]:
    """(reason, explanation) of a launcher's word on a process: srun's Out Of Memory (the step's cgroup OOM
    killer) is ``OOMKilled``; mpirun's "noticed ... exited on signal" names the first process that died
    (``KilledBySignal``); srun's exit codes, and its kills and terminations (srun ending the other tasks, a
    cancel), say nothing of who broke first (``PeerFailure``); another signal (a segfault, an abort) is
    ``KilledBySignal``."""
    where = f"{x.tool}: {'task' if x.tasks and x.tasks.isdigit() else 'tasks'} {x.tasks} on {x.host}" if x.tasks \
        else f"{x.tool}: rank {x.rank} on {x.host}"
    if x.oom:
        return "OOMKilled", f"{where}: Out Of Memory (the job step's memory limit)"
    if aborted_after_failure and x.signal == "Aborted":
        return "PeerFailure", f"{where}: {x.what}, {ABORT_AFTER_FAILURE}"
    if x.tool != "srun" and x.exitcode is not None:
        return "ExitedWithError", f"{where}: {x.what}"
    if x.tool != "srun":
        return "KilledBySignal", f"{where} exited on {x.what}, the first process {x.tool} saw end"
    if x.exitcode is not None or x.signal in STOPPING:
        return "PeerFailure", f"{where}: {x.what}"
    return "KilledBySignal", f"{where}: {x.what}"
