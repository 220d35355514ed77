"""Live sources a hung job offers: NCCL's RAS thread, and PyTorch's Flight Recorder dumps.

The NCCL log says that a collective timed out; RAS (NCCL 2.24+, docs/ras.md) says which process of
the job stopped answering, died, or is stuck in an earlier operation. When the nccl_logs collector
sees a job hang on this node (a watchdog timeout, PyTorch's progress line), it asks the RAS port
of that process -- its NCCL_RAS_ADDR from /proc/<pid>/environ, localhost:28028 by default -- once
per job per ``cooldown``, and publishes what RAS said as ``NCCLRASReport`` (the suspects, strongest
first) for the fleet correlator. Several jobs of one user share the port (SO_REUSEPORT): an answer
is kept only when it is about the job asked (its commId or the process's pid is in the report).
Only a loopback address or one of this node's own is asked (``ras_address_allowed``); anything else a
job's environment names is refused and counted (``errors["not_local"]``). What RAS answers is the job's
own processes talking: every NCCLRASReport carries ``details.provenance = "tenant"``.

Only in the daemon (``run``): a snapshot (``check``, ``diagnose``) has no live process to ask.
Errors (RAS off, an old NCCL, a refused or slow port) are counted and logged once per reason, never
retried in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from collectors.nccl.bounds import FR_DUMP_MAX_BYTES
from gna_sdk import Emitter, HostPaths, plural
from gna_sdk.hostroot import UnsafePath, UntrustedFile, open_untrusted, split_beneath
from gna_types.policy import verdict

if TYPE_CHECKING:
    from collectors.nccl.ras_protocol import RasReport

# The RAS client and the Flight Recorder reader (~0.5 MiB of code between them) are imported when a hang first
# asks for them: a node whose jobs never hang never holds them.

log = structlog.get_logger(__name__)

ENVIRON_MAX = 1 << 20  # /proc/<pid>/environ larger than this is cut (a job's environment is a few KB)
MAX_SUSPECTS = 16
MAX_PGS = 16  # process groups per Flight Recorder record
# details.provenance on what a job's own processes supplied (a RAS answer on the job's port, a Flight
# Recorder dump the job wrote): the fleet weighs it as tenant evidence (docs/correlator.md, trust model)
PROVENANCE_TENANT = "tenant"


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


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_FIB_LEAF = re.compile(r"^\s*\|-- (\d{1,3}(?:\.\d{1,3}){3})\s*$")
_FIB_LOCAL = re.compile(r"^\s*/32 host LOCAL\s*$")
_INET6 = re.compile(r"^([0-9a-f]{32}) ")


def local_addresses(host: HostPaths) -> frozenset[IPAddress]:
    """The addresses assigned to this node's interfaces, from the host root's /proc/net (the network
    namespace /proc/net shows: the agent's, which is the host's with hostNetwork).

    IPv4: /proc/net/fib_trie, each leaf ``|-- %pI4`` followed by its aliases ``/%zu <scope> <type>``
    (torvalds/linux net/ipv4/fib_trie.c fib_trie_seq_show, v4.x-v6.x): a ``/32 host LOCAL`` alias is an
    address of this host (RTN_LOCAL). IPv6: /proc/net/if_inet6, one assigned address per line as 32 hex
    digits then ifindex, prefix length, scope, flags and the device (net/ipv6/addrconf.c if6_seq_show)."""
    out: set[IPAddress] = set()
    leaf: str | None = None
    for line in (host.read_text("/proc/net/fib_trie", limit=4 << 20) or "").splitlines():
        if m := _FIB_LEAF.match(line):
            leaf = m.group(1)
        elif leaf is not None and _FIB_LOCAL.match(line):
            with contextlib.suppress(ValueError):
                out.add(ipaddress.IPv4Address(leaf))
    for line in (host.read_text("/proc/net/if_inet6", limit=1 << 20) or "").splitlines():
        if m := _INET6.match(line):
            out.add(ipaddress.IPv6Address(bytes.fromhex(m.group(1))))
    return frozenset(out)


def ras_address_allowed(ip_text: str, local: frozenset[IPAddress]) -> str | None:
    """None when the agent may ask RAS at this IP: a loopback address (127.0.0.0/8, ::1) or one of this
    node's own; else the reason it is refused (``not_local``, ``address``). A job's NCCL_RAS_ADDR names the
    address: the agent must not become the job's probe of other hosts, nor carry another host's answer."""
    try:
        ip: IPAddress = ipaddress.ip_address(ip_text.split("%", 1)[0])
    except ValueError:
        return "address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip in local:
        return None
    return "not_local"


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
        from collectors.nccl.ras_protocol import RasError, query_ras, ras_address

        env = await asyncio.to_thread(read_environ, self.host, pid)
        if env is None:
            return self._error("no_environ", f"/proc/{pid}/environ is not readable")
        addr = ras_address(env)
        if addr is None:
            return self._error("disabled", f"NCCL_RAS_ENABLE={env.get('NCCL_RAS_ENABLE')!r} in pid {pid}")
        local = await asyncio.to_thread(local_addresses, self.host)
        try:
            report = await query_ras(addr[0], addr[1], verbose=True, timeout=self.timeout,
                                     allow=lambda ip: ras_address_allowed(ip, local))
        except RasError as exc:
            return self._error(exc.reason, str(exc))
        if not about_job(report, job, pid):
            self.foreign += 1
            return None
        self.reports += 1
        suspects = [s for s in report.suspects() if s.reason != "remote_error"][:MAX_SUSPECTS]
        top = suspects[0] if suspects else None
        text = (f"NCCL RAS for {entity}: {plural(len(suspects), 'suspect')}, first: {top.detail}" if top else
                f"NCCL RAS for {entity}: every process answered, no communicator in error")
        reason = "RASSuspects" if suspects else "RASHealthy"
        v = verdict("NCCLRASReport", reason)
        await self.emit.event(
            "NCCLRASReport", severity=v.severity, entity=entity, reason=reason, suggested_action=v.action,
            message=text[:500],
            details={**where, "ras_address": f"{addr[0]}:{addr[1]}", "ras_format": report.format,
                     "ras_nccl_version": report.nccl_version, "ras_complete": report.complete,
                     "ras_timeouts": report.timeouts, "ras_warnings": len(report.warnings),
                     "provenance": PROVENANCE_TENANT,
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


def process_uids(host: HostPaths, pid: int) -> frozenset[int] | None:
    """The real, effective, saved and filesystem uids of a process (``Uid:`` in /proc/<pid>/status,
    fs/proc/array.c task_state), or None when unreadable. A dump its environment names must be owned by
    one of them: a job user must not make the root agent read a file that user does not own."""
    text = host.read_text(f"/proc/{pid}/status", limit=8192)
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            ids = line[4:].split()
            if ids and all(i.isdigit() and len(i) <= 10 for i in ids):
                return frozenset(int(i) for i in ids)
            return None
    return None


@dataclass(frozen=True)
class Candidate:
    """Where a dump may be: ``path`` as the process sees it, read under the trusted directory ``within``
    (``/proc/<pid>/root``: its mount namespace, or the host root for a snapshot)."""

    within: str
    path: str


@dataclass
class FlightRecords:
    """PyTorch Flight Recorder dumps of a hung job's ranks (collectors/nccl/flight_recorder.py), as
    ``TorchFlightRecord``: per process group, torch's last enqueued / started / completed work and the
    collective this rank waits in. Where the process's environment is readable its own paths are used
    (TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, HOME, XDG_CACHE_HOME; inside its mount
    namespace through /proc/<pid>/root), else every release's default under the host root (a
    snapshot). The job controls these paths and files: each is opened once, component by component,
    with no symlink followed and nothing above its root (gna_sdk.hostroot.open_untrusted), and must be
    a regular file with one link, owned by the process's user when the process is known. Each dump is
    read once (device, inode, size and mtime); refused, unreadable or hostile dumps are counted
    (``errors``, by reason). Records carry ``details.provenance = "tenant"``: the job wrote them."""

    host: HostPaths
    emit: Emitter
    wait: float = 60.0  # the daemon looks this long: torch dumps after the timeout (15 s and more)
    poll: float = 2.0
    max_bytes: int = FR_DUMP_MAX_BYTES
    seen: set[tuple[int, int, int, int]] = field(default_factory=set)
    refused: set[tuple[str, str, str]] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    records: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def candidates(self, pid: int, rank: int | None) -> list[Candidate]:
        """Paths to try, in order. Only lexical work here (no file is looked at: opening is the check);
        a path whose ``..`` leaves its root is dropped."""
        from collectors.nccl.flight_recorder import dump_files

        env = read_environ(self.host, pid) if pid else None
        cwd: str | None = None
        if pid:
            with contextlib.suppress(OSError):
                cwd = os.readlink(self.host.path(f"/proc/{pid}/cwd"))
        envs = [env] if env is not None else [{}, {"HOME": "/root"}]  # a snapshot: where root's job would write
        paths = list(dict.fromkeys(p for e in envs for p in dump_files(e, rank, cwd=cwd)))
        roots = ([f"/proc/{pid}/root"] if pid and env is not None else []) + ["/"]
        out: list[Candidate] = []
        for p in paths:
            try:
                split_beneath(p)
            except UnsafePath as exc:
                self._refuse(Candidate("/", p), exc.reason)
                continue
            out += [Candidate(r, p) for r in roots]
        return out

    def _refuse(self, c: Candidate, reason: str) -> None:
        key = (c.within, c.path, reason)
        if key in self.refused:
            return
        if len(self.refused) > 10000:
            self.refused.clear()
        self.refused.add(key)
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self.emit.unparsed("Flight Recorder dumps", f"{c.within}:{c.path}: refused ({reason})"[:300])

    def _open(self, c: Candidate, uids: frozenset[int] | None) -> UntrustedFile | None:
        try:
            f = open_untrusted(self.host.path(c.within), c.path, max_bytes=self.max_bytes)
        except UnsafePath as exc:
            if exc.reason != "missing":  # most candidates are: torch writes one of them
                self._refuse(c, exc.reason)
            return None
        if uids is not None and f.stat.st_uid not in uids:
            f.close()
            self._refuse(c, "foreign_owner")
            return None
        return f

    async def collect(self, pid: int, rank: int | None, entity: str, where: dict[str, Any]) -> bool:
        """Read this rank's dump if one is there; True when a record was published."""
        from collectors.nccl.flight_recorder import FRDumpError, load_opened, summarize

        cands = await asyncio.to_thread(self.candidates, pid, rank)
        uids = await asyncio.to_thread(process_uids, self.host, pid) if pid else None
        if pid and uids is None and any(c.within != "/" for c in cands):
            uids = frozenset()  # the process's environment was read but its owner is not known: nothing is its
        for c in cands:
            f = await asyncio.to_thread(self._open, c, uids)
            if f is None:
                continue
            with f:
                key = (f.stat.st_dev, f.stat.st_ino, f.stat.st_size, int(f.stat.st_mtime_ns))
                if key in self.seen:
                    continue
                if len(self.seen) > 10000:
                    self.seen.clear()
                self.seen.add(key)
                try:
                    dump = await asyncio.to_thread(load_opened, f, max_bytes=self.max_bytes)
                except FRDumpError as exc:
                    self.errors[exc.reason] = self.errors.get(exc.reason, 0) + 1
                    self.emit.unparsed("Flight Recorder dumps", f"{c.path}: {exc}"[:300])
                    continue
            summary = summarize(dump)
            pgs = dict(list(summary["pgs"].items())[:MAX_PGS])
            stuck = [(k, v["first_not_completed"]) for k, v in pgs.items() if v.get("first_not_completed")]
            who = dump.rank if dump.rank is not None else rank
            waits = (f"process group {stuck[0][0]} waits in {stuck[0][1].get('op')} "
                     f"#{stuck[0][1].get('collective_seq_id')}") if stuck else "nothing pending"
            text = f"PyTorch Flight Recorder of rank {who}: {waits}"
            self.records += 1
            dump_path = c.path if c.within == "/" else f"{c.within}{'' if c.path.startswith('/') else '/'}{c.path}"
            reason = "FlightRecorderDump" if stuck else "FlightRecorderIdle"
            v = verdict("TorchFlightRecord", reason)
            return await self.emit.event(
                "TorchFlightRecord", severity=v.severity, entity=entity, reason=reason, suggested_action=v.action,
                message=text[:500],
                details={**where, "rank": dump.rank if dump.rank is not None else rank,
                         "dump": dump_path[:500], "fr_version": summary["version"], "fr_format": summary["format"],
                         "entries": summary["entries"], "entries_total": summary["entries_total"],
                         "fr_warnings": dump.warnings, "pgs": pgs, "provenance": PROVENANCE_TENANT})
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
