"""Live sources a hung job offers: NCCL's RAS thread, and PyTorch's Flight Recorder dumps.

The NCCL log says that a collective timed out; RAS (NCCL 2.24+, docs/ras.md) says which process of
the job stopped answering, died, or is stuck in an earlier operation. When the nccl_logs collector
sees a job hang on this node (a watchdog timeout, PyTorch's progress line), it asks the RAS port
of that process -- its NCCL_RAS_ADDR from /proc/<pid>/environ, localhost:28028 by default -- once
per job per ``cooldown``, and publishes what RAS said as ``NCCLRASReport`` (the suspects, strongest
first) for the fleet correlator. Several jobs of one user share the port (SO_REUSEPORT): an answer
is kept only when it is about the job asked (its commId or the process's pid is in the report).

Only in the daemon (``run``): a snapshot (``check``, ``diagnose``) has no live process to ask.
Errors (RAS off, an old NCCL, a refused or slow port) are counted and logged once per reason, never
retried in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from collectors.flight_recorder import FRDumpError, dump_files, load_file, summarize
from collectors.nccl_ras import RasError, RasReport, query_ras, ras_address
from gna_sdk import Emitter, HostPaths

log = structlog.get_logger(__name__)

ENVIRON_MAX = 1 << 20  # /proc/<pid>/environ larger than this is cut (a job's environment is a few KB)
MAX_SUSPECTS = 16
MAX_PGS = 16  # process groups per Flight Recorder record


def read_environ(host: HostPaths, pid: int) -> dict[str, str] | None:
    """A process's environment from the host root's /proc, or None when it is gone or unreadable."""
    try:
        with open(host.path(f"/proc/{pid}/environ"), "rb") as fh:
            data = fh.read(ENVIRON_MAX)
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def about_job(report: RasReport, job: str | None, pid: int) -> bool:
    """The report is about this job: its commId among the communicators (compared as integers: RAS pads
    to 16 hex digits, NCCL's log does not), or this process among the pids it names."""
    if job:
        try:
            want = int(job, 16)
        except ValueError:
            want = None
        if want is not None and any(_hex(c.comm_hash) == want for c in report.communicators):
            return True
    return pid in report.pids()


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


@dataclass
class RasAsker:
    host: HostPaths
    emit: Emitter
    timeout: float = 12.0  # RAS waits up to its TIMEOUT + 5 s for slow peers (docs/ras.md)
    cooldown: float = 300.0
    enabled: bool = True
    asked: dict[str, float] = field(default_factory=dict)  # job (or process) -> when it was last asked
    errors: dict[str, int] = field(default_factory=dict)  # RasError reason -> count
    reports: int = 0
    foreign: int = 0  # answers about another job on the shared port
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def on_hang(self, job: str | None, pid: int, entity: str, where: dict[str, Any]) -> None:
        """A job hangs in this process: ask its RAS port (in the background, once per job per cooldown)."""
        key = job or f"pid:{pid}"
        now = time.monotonic()
        if not self.enabled or not pid or now - self.asked.get(key, -1e18) < self.cooldown:
            return
        self.asked[key] = now
        if len(self.asked) > 10000:
            self.asked = {k: t for k, t in self.asked.items() if now - t < self.cooldown}
        task = asyncio.get_running_loop().create_task(self._ask(job, pid, entity, where), name=f"ras:{key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _error(self, reason: str, detail: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self.errors[reason] == 1:  # once per reason: a fleet of old NCCL versions must not flood the log
            log.info("nccl_ras_unavailable", reason=reason, detail=detail[:300])

    async def _ask(self, job: str | None, pid: int, entity: str, where: dict[str, Any]) -> None:
        env = await asyncio.to_thread(read_environ, self.host, pid)
        if env is None:
            return self._error("no_environ", f"/proc/{pid}/environ is not readable")
        addr = ras_address(env)
        if addr is None:
            return self._error("disabled", f"NCCL_RAS_ENABLE={env.get('NCCL_RAS_ENABLE')!r} in pid {pid}")
        try:
            report = await query_ras(addr[0], addr[1], verbose=True, timeout=self.timeout)
        except RasError as exc:
            return self._error(exc.reason, str(exc))
        if not about_job(report, job, pid):
            self.foreign += 1
            return None
        self.reports += 1
        suspects = [s for s in report.suspects() if s.reason != "remote_error"][:MAX_SUSPECTS]
        top = suspects[0] if suspects else None
        text = (f"NCCL RAS for {entity}: {len(suspects)} suspect(s), first: {top.detail}" if top else
                f"NCCL RAS for {entity}: every process answered, no communicator in error")
        await self.emit.event(
            "NCCLRASReport", severity="warning" if suspects else "info", entity=entity,
            reason="RASSuspects" if suspects else "RASHealthy", message=text[:500],
            details={**where, "ras_address": f"{addr[0]}:{addr[1]}", "ras_format": report.format,
                     "ras_nccl_version": report.nccl_version, "ras_complete": report.complete,
                     "ras_timeouts": report.timeouts, "ras_warnings": len(report.warnings),
                     "missing_processes": report.missing_process_count, "dead_processes": report.dead_process_count,
                     "suspects": [{"reason": s.reason, "detail": s.detail[:300], "host": s.host, "pid": s.pid,
                                   "gpus": list(s.gpus)[:16], "comm_hash": s.comm_hash, "rank": s.rank,
                                   "group_size": s.group_size} for s in suspects]})
        return None

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)


def contained(host: HostPaths, host_path: str) -> Path | None:
    """``host_path`` under the host root, or None when it would leave it: ``..`` is resolved first
    (lexically), and the real path after symlinks must still be inside the root (a job's environment
    names these paths: it must not make the agent read outside the node it watches)."""
    norm = posixpath.normpath("/" + host_path)
    full = host.path(norm)
    root = os.path.realpath(host.path("/"))
    real = os.path.realpath(full)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        return None
    return Path(full)


@dataclass
class FlightRecords:
    """PyTorch Flight Recorder dumps of a hung job's ranks (collectors/flight_recorder.py), as
    ``TorchFlightRecord``: per process group, torch's last enqueued / started / completed work and the
    collective this rank waits in. Where the process's environment is readable its own paths are used
    (TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, HOME, XDG_CACHE_HOME; inside its mount
    namespace through /proc/<pid>/root), else every release's default under the host root (a
    snapshot). Each dump is read once (path, size and mtime); unreadable or hostile dumps are counted."""

    host: HostPaths
    emit: Emitter
    wait: float = 60.0  # the daemon looks this long: torch dumps after the timeout (15 s and more)
    poll: float = 2.0
    seen: set[tuple[str, int, int]] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    records: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def candidates(self, pid: int, rank: int | None) -> list[Path]:
        env = read_environ(self.host, pid) if pid else None
        cwd: str | None = None
        if pid:
            with contextlib.suppress(OSError):
                cwd = os.readlink(self.host.path(f"/proc/{pid}/cwd"))
        envs = [env] if env is not None else [{}, {"HOME": "/root"}]  # a snapshot: where root's job would write
        paths = list(dict.fromkeys(p for e in envs for p in dump_files(e, rank, cwd=cwd)))
        out: list[Path] = []
        for p in paths:
            for hp in ([f"/proc/{pid}/root{p}"] if pid and env is not None else []) + [p]:
                full = contained(self.host, hp)
                if full is not None and full.is_file() and full not in out:
                    out.append(full)
        return out

    async def collect(self, pid: int, rank: int | None, entity: str, where: dict[str, Any]) -> bool:
        """Read this rank's dump if one is there; True when a record was published."""
        for path in await asyncio.to_thread(self.candidates, pid, rank):
            try:
                st = path.stat()
            except OSError:
                continue
            key = (str(path), st.st_size, int(st.st_mtime_ns))
            if key in self.seen:
                continue
            self.seen.add(key)
            try:
                dump = await asyncio.to_thread(load_file, str(path))
            except FRDumpError as exc:
                self.errors[exc.reason] = self.errors.get(exc.reason, 0) + 1
                self.emit.unparsed("Flight Recorder dumps", f"{path}: {exc}"[:300])
                continue
            summary = summarize(dump)
            pgs = dict(list(summary["pgs"].items())[:MAX_PGS])
            stuck = [(k, v["first_not_completed"]) for k, v in pgs.items() if v.get("first_not_completed")]
            who = dump.rank if dump.rank is not None else rank
            waits = (f"process group {stuck[0][0]} waits in {stuck[0][1].get('op')} "
                     f"#{stuck[0][1].get('collective_seq_id')}") if stuck else "nothing pending"
            text = f"PyTorch Flight Recorder of rank {who}: {waits}"
            self.records += 1
            return await self.emit.event(
                "TorchFlightRecord", severity="warning" if stuck else "info", entity=entity,
                reason="FlightRecorderDump", message=text[:500],
                details={**where, "rank": dump.rank if dump.rank is not None else rank,
                         "dump": str(path)[:500], "fr_version": summary["version"], "fr_format": summary["format"],
                         "entries": summary["entries"], "entries_total": summary["entries_total"],
                         "fr_warnings": dump.warnings, "pgs": pgs})
        return False

    def on_hang(self, pid: int, rank: int | None, entity: str, where: dict[str, Any]) -> None:
        """The daemon: torch writes the dump after its timeout; look for it for a while, in the background."""
        async def look() -> None:
            deadline = time.monotonic() + self.wait
            while time.monotonic() < deadline:
                if await self.collect(pid, rank, entity, where):
                    return
                await asyncio.sleep(self.poll)

        task = asyncio.get_running_loop().create_task(look(), name=f"fr:{entity}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
