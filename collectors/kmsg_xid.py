"""The kernel log: Xid, fallen-off-the-bus, NVSwitch SXid, NVIDIA module load errors, GSP-RM failures without an Xid
and PCIe AER on a GPU's link from /dev/kmsg.

Reads <host-root>/dev/kmsg for real (a character device on a node: one record per read(2),
poll(2)-able; on a fixture a regular file or FIFO in the same text form). The last sequence
number persists per boot, so a restart neither re-reports nor misses; the first start looks back
``lookback_seconds``. Storms are aggregated per (GPU, Xid) per window: the first line is
published at once, the rest as one summary per window with a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import errno
import os
import stat
import time
from typing import Any, ClassVar

import structlog

from collectors.formats.kmsg_records import (
    XID_GSP_INSTANCE,
    AerLine,
    FellOffBus,
    GspEvent,
    KmsgRecord,
    ModuleError,
    NvidiaLineParser,
    PeermemError,
    SXid,
    Xid,
    iter_text_records,
    parse_record,
    parse_text_line,
)
from collectors.formats.pcie_tree import Topology, read_topology
from collectors.formats.torch_failures import parse_oom_kill
from collectors.formats.xid_catalog import classify, emit_sxid, emit_xid
from gna_sdk import Aggregator, CollectorSettings, Emitter, HostPaths
from gna_sdk.aio import aligned_delay, wait_event
from gna_sdk.inotify import IN_MODIFY, Inotify
from gna_sdk.persist import boot_id
from gna_sdk.statefile import is_int, read_state, write_state
from gna_types import entities
from gna_types.detail_fields import UNSET
from gna_types.gpu_details import (
    GPUFatalXid,
    GPUFellOffBus,
    GPUGSPTimeout,
    GPUPCIeAERError,
    WindowSummary,
    XidEvidence,
)
from gna_types.host_details import KernelLogUnparsable, KernelModuleLoadError, NvidiaPeermemError
from gna_types.node_details import wire
from gna_types.policy import verdict

log = structlog.get_logger(__name__)

READ_SIZE = 16384
STATE_VERSION = 1
_PEERMEM_REASON = {"invalid_context": "KnownHarmless", "registration_failed": "RegistrationFailed",
                   "p2p_error": "P2PError"}
_PEERMEM_MEANING = {
    # NVIDIA, via Mellanox/nv_peer_memory#120: a diagnostic of a mitigation, not a fault; R560+ drivers no
    # longer print it (shared field facts).
    "invalid_context": "'detected invalid context, skipping further processing' is a known harmless diagnostic "
                       "(NVIDIA, Mellanox/nv_peer_memory#120); R560+ drivers no longer print it.",
    "registration_failed": "the module could not register with the RDMA stack: GPUDirect RDMA is unavailable.",
    "p2p_error": "a GPU memory pin/map for GPUDirect RDMA failed.",
}
UNUSABLE_AFTER = 20  # unreadable lines, with no record at all, before the source is called unusable
MODULE_ERRORS_KEPT = 20
# GSP: the reason of each kind (gna_types/policy.py rows), worst first
_GSP_REASON = {"timeout": "GSPTimeout", "unresponsive": "GSPTimeout", "rate_limited": "GSPTimeout",
               "memsys": "MemorySubsystemError", "heartbeat": "HeartbeatTimedOut"}
_GSP_RANK = ("GSPTimeout", "MemorySubsystemError", "HeartbeatTimedOut")
REBOOT_CLEARED = ("GPUFatalXid", "GPUFellOffBus", "GPUGSPTimeout", "GPUPCIeAERError")
OOM_KILLS_KEPT = 64


class KmsgXidConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    path: str = "/dev/kmsg"
    lookback_seconds: float = 600.0
    aggregation_window: float = 10.0
    fatal_xid_clear_after: float = 0.0  # 0: GPUFatalXid stays until the node reboots
    poll_interval: float = 1.0  # fixture files only; the device is poll(2)-driven
    timeout: float = 60.0  # `check` may read a full ring buffer


def _valid_state(d: dict[str, Any]) -> bool:
    fatal = d.get("fatal") or {}
    return (isinstance(d.get("boot_id"), str) and (d.get("seq") is None or is_int(d.get("seq")))
            and isinstance(fatal, dict)
            and all(isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("codes"), list)
                    and all(is_int(c) for c in v["codes"]) and isinstance(v.get("last"), int | float)
                    and not isinstance(v.get("last"), bool) for k, v in fatal.items()))


class KmsgXidCollector:
    name: ClassVar[str] = "kmsg_xid"
    config_type: ClassVar[type[KmsgXidConfig]] = KmsgXidConfig
    phase: ClassVar[int] = 10  # evidence for kernel_modules
    auto_resolve: ClassVar[bool] = False

    def __init__(self, config: KmsgXidConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.parser = NvidiaLineParser()
        self.agg = Aggregator(config.aggregation_window)
        self.boot_id = boot_id(host)
        self.last_seq: int | None = None  # highest seq handled in this process
        self.checkpoint: int | None = None  # highest seq whose findings were all accepted
        self._blocked = False
        self.fatal: dict[str, dict[str, Any]] = {}  # bus -> {"codes": [...], "last": ts}
        self.module_errors: dict[str, list[dict[str, Any]]] = {}
        self.oom_kills: list[dict[str, Any]] = []  # the newest OOM_KILLS_KEPT victims (a fact for nccl_logs)
        self.records = 0
        self.malformed = 0
        self.malformed_sample = ""
        self.text_forms: dict[str, int] = {}  # dmesg/syslog renderings read from a text source
        self._text_seq = 0  # text lines carry no sequence number: their position in the file is one
        self.lost = 0
        self._min_usec = 0
        self._timers_needed = asyncio.Event()
        self._btime: int | None = None  # the boot's wall time (/proc/stat btime): records' times from it
        self._logged_at: dict[str, str] = {}  # the record being handled: {"logged_at": its wall time}
        self._gsp: dict[str, dict[str, Any]] = {}  # entity -> {"kinds": [...], "reason", "text"} this boot
        self._gsp_buses: dict[int, str] = {}  # RM's GPU instance -> bus, learnt from Xid lines naming both
        self._aer: dict[str, dict[str, Any]] = {}  # entity -> {"kinds": [...], "reason", "severity"} this boot
        self._aer_named: list[tuple[int, str]] = []  # (record number, GPU) of recent "can't recover" lines
        self._topology: Topology | None = None

    # -- state ------------------------------------------------------------------------
    def _state_file(self) -> Any:
        return self.emit.state_dir / "kmsg.json" if self.emit.state_dir else None

    def _load_state(self) -> dict[str, Any]:
        path = self._state_file()
        if path is None:
            return {}
        return read_state(path, version=STATE_VERSION, valid=_valid_state, what="kernel log position",
                          hint="reading this boot's kernel log from its start again (event ids are stable)")

    def _save_state(self) -> None:
        path = self._state_file()
        if path is None:
            return
        write_state(path, {"boot_id": self.boot_id, "seq": self.checkpoint, "fatal": self.fatal}, version=STATE_VERSION)

    async def _start_of_boot(self) -> None:
        state = self._load_state()
        if state.get("boot_id") == self.boot_id and self.boot_id:
            self.last_seq = self.checkpoint = state.get("seq")
            self.fatal = state.get("fatal") or {}
            return
        # A new boot (or first start): GPUs are re-initialised, so reboot-class conditions clear.
        for type_, entity, severity in self.emit.active_conditions():
            if type_ in REBOOT_CLEARED:
                await self.emit.condition(type_, firing=False, severity=severity,  # type: ignore[arg-type]
                                          entity=entity, reason="Rebooted",
                                          message=f"{type_} on {entity} cleared: the node rebooted.")
        self._look_back()

    def _boot_time(self) -> int | None:
        """/proc/stat's ``btime`` (proc(5): boot time, in seconds since the Epoch), once per boot."""
        if self._btime is None:
            for line in (self.host.read_text("/proc/stat", limit=1 << 20) or "").splitlines():
                if line.startswith("btime "):
                    with contextlib.suppress(ValueError):
                        self._btime = int(line.split()[1])
                    break
        return self._btime

    def _when(self, usec: int) -> dict[str, str]:
        """A record's own time as a detail: its uptime stamp (usec) plus the boot's wall time, so
        evidence says when the kernel logged it, not when it was read (issue 22)."""
        btime = self._boot_time()
        if usec <= 0 or btime is None:
            return {}
        at = dt.datetime.fromtimestamp(btime + usec / 1e6, dt.UTC)
        return {"logged_at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")}

    def _look_back(self) -> None:
        """Records older than ``lookback_seconds`` are read past, not judged (the first start of a boot,
        and every ``check``): an Xid from hours ago is history, not the node's state now."""
        uptime = (self.host.read_text("/proc/uptime") or "").split()
        if uptime:
            with contextlib.suppress(ValueError):
                self._min_usec = max(0, int((float(uptime[0]) - self.config.lookback_seconds) * 1e6))

    # -- handling ---------------------------------------------------------------------
    async def handle(self, rec: KmsgRecord, now: float) -> bool:
        """Findings of one record; False if an emit was refused (the checkpoint stays before it)."""
        self.records += 1
        finding = self.parser.feed(rec.message)
        if finding is None:
            if "Killed process " in rec.message or "oom-kill:" in rec.message:
                self._oom(rec)
            return True
        self._logged_at = self._when(rec.usec)
        self._timers_needed.set()
        ok = True
        if isinstance(finding, Xid):
            if (inst := XID_GSP_INSTANCE.search(finding.text)) and len(self._gsp_buses) < 1024:
                self._gsp_buses[int(inst.group(1))] = finding.bus_id
            ok = await self._xid(finding, now, rec.usec)
        elif isinstance(finding, GspEvent):
            ok = await self._gsp_event(finding)
        elif isinstance(finding, AerLine):
            ok = await self._aer_line(finding)
        elif isinstance(finding, FellOffBus):
            ok = await self._fell_off(finding.bus_id, finding.text)
        elif isinstance(finding, PeermemError):
            if self.agg.add(("peermem", finding.kind, ""), now, rec.usec):
                harmless = finding.kind == "invalid_context"
                v = verdict("NvidiaPeermemError", _PEERMEM_REASON[finding.kind])
                ok = await self.emit.event(
                    "NvidiaPeermemError", severity=v.severity, entity="module:nvidia_peermem",
                    suggested_action=v.action,
                    reason=_PEERMEM_REASON[finding.kind],
                    message=f"nvidia-peermem ({finding.function}): {_PEERMEM_MEANING[finding.kind]}",
                    details=wire(NvidiaPeermemError(
                        function=finding.function, kind=finding.kind, text=finding.text, count=1, harmless=harmless,
                        fixed_in="R560" if harmless else UNSET, logged_at=self._logged_at.get("logged_at", UNSET))))
        elif isinstance(finding, SXid):
            if self.agg.add(("sxid", finding.bus_id, finding.code, finding.fatal), now, rec.usec):
                ok = await emit_sxid(self.emit, finding.bus_id, finding.code, fatal=finding.fatal,
                                     switch=finding.switch, text=finding.text,
                                     logged_at=self._logged_at.get("logged_at", UNSET))
        elif isinstance(finding, ModuleError):
            errs = self.module_errors.setdefault(finding.module, [])
            errs.append({"kind": finding.kind, "symbol": finding.symbol, "text": finding.text, "seq": rec.seq})
            del errs[:-MODULE_ERRORS_KEPT]
            self.emit.facts.set("kernel.module_errors", self.module_errors)
            if self.agg.add(("module", finding.module, finding.kind), now, rec.usec):
                ok = await self.emit.event(
                    "KernelModuleLoadError", severity="warning", entity=f"module:{finding.module}",
                    reason=finding.kind.title().replace("_", ""),
                    message=f"Kernel module {finding.module} failed to load: {finding.text[:200]}",
                    details=wire(KernelModuleLoadError(
                        module=finding.module, kind=finding.kind, symbol=finding.symbol, text=finding.text, count=1,
                        logged_at=self._logged_at.get("logged_at", UNSET))))
        return ok

    def _oom(self, rec: KmsgRecord) -> None:
        """The OOM killer's victim (mm/oom_kill.c; collectors/formats/torch_failures.py parse_oom_kill), kept as a
        fact: the NCCL collector explains a rank that died of SIGKILL by it (its pid, or its pod's or Slurm job's
        cgroup). Not a finding of its own here: an OOM kill is a process's memory, not the node's health."""
        kill = parse_oom_kill(rec.message)
        if kill is None:
            return
        self.oom_kills.append({"pid": kill.pid, "comm": kill.comm, "task_memcg": kill.task_memcg,
                               "memcg": kill.memcg, **self._when(rec.usec)})
        del self.oom_kills[:-OOM_KILLS_KEPT]
        self.emit.facts.set("kernel.oom_kills", list(self.oom_kills))

    async def _xid(self, x: Xid, now: float, usec: int = 0) -> bool:
        info = classify(x.code, x.text)
        ok = True
        if self.agg.add(("xid", x.bus_id, info), now, usec):
            ok = await emit_xid(self.emit, info, x.bus_id, source="kmsg", process=x.process, pid=x.pid,
                                evidence=XidEvidence(pid=x.pid, process=x.process or None, mig=x.mig or None,
                                                     text=x.text, logged_at=self._logged_at.get("logged_at", UNSET)))
        if info.fatal:
            entry = self.fatal.setdefault(x.bus_id, {"codes": [], "last": now})
            entry["last"] = now
            if x.code not in entry["codes"]:
                entry["codes"] = sorted([*entry["codes"], x.code])
            ok = await self.emit.condition(
                "GPUFatalXid", firing=True, severity="critical", entity=entities.gpu(x.bus_id), reason=f"Xid{x.code}",
                message=f"GPU {x.bus_id} hit Xid {x.code} ({info.name}): it needs "
                        f"{'a node reboot' if info.action == 'reboot' else 'a reset'} before it can be trusted.",
                details=wire(GPUFatalXid(xids=entry["codes"], nvidia_action=info.nvidia_action,
                                         logged_at=self._logged_at.get("logged_at", UNSET))),
                suggested_action=info.action) and ok
        if x.code == 79:
            ok = await self._fell_off(x.bus_id, x.text) and ok
        return ok

    # -- GSP-RM and PCIe AER without an Xid (issue 26) --------------------------------------
    def _tree(self) -> Topology:
        if self._topology is None:
            self._topology = read_topology(self.host)
        return self._topology

    def _gsp_entity(self, ev: GspEvent) -> tuple[str, str]:
        """The GPU a GSP line is about and how it was found. RM numbers GPUs by attach order ("GPU6"), which on a
        node whose GPUs are opened in device-minor order (nvidia-persistenced) is the PCI order NVML enumerates;
        an Xid 119/120 line earlier in the log that names both is preferred."""
        if ev.bus_id:
            return entities.gpu(ev.bus_id), "line"
        if ev.instance is None:
            return "", "unresolved"
        if ev.instance in self._gsp_buses:
            return entities.gpu(self._gsp_buses[ev.instance]), "log"
        gpus = self._tree().gpus
        if ev.instance < len(gpus):
            return entities.gpu(gpus[ev.instance]), "pci_order"
        return f"gpu:GPU{ev.instance}", "unresolved"

    async def _gsp_event(self, ev: GspEvent) -> bool:
        entity, found = self._gsp_entity(ev)
        if not entity:
            return True
        reason = _GSP_REASON[ev.kind]
        seen = self._gsp.get(entity)
        if seen is None:
            if len(self._gsp) >= 64:
                return True
            seen = self._gsp[entity] = {"kinds": [], "reason": reason, "text": ev.text}
        new_kind = ev.kind not in seen["kinds"]
        if new_kind:
            seen["kinds"] = [*seen["kinds"], ev.kind]
        worse = _GSP_RANK.index(reason) < _GSP_RANK.index(seen["reason"])
        if worse:
            seen["reason"], seen["text"] = reason, ev.text
        if not (new_kind or worse) and len(seen["kinds"]) > 1:
            return True  # nothing new to say: the condition already holds it
        v = verdict("GPUGSPTimeout", seen["reason"])
        inst = ev.instance if ev.instance is not None and ev.instance <= 1023 else None
        what = {"GSPTimeout": "GSP-RM stopped answering the driver (GSP timeout)",
                "MemorySubsystemError": "the driver found its memory subsystem stuck during a GSP timeout",
                "HeartbeatTimedOut": "GSP-RM missed its heartbeat"}[seen["reason"]]
        return await self.emit.condition(
            "GPUGSPTimeout", firing=True, severity=v.severity, entity=entity, reason=seen["reason"],
            message=f"GPU {entity.removeprefix('gpu:')}: {what}, without an Xid line.", suggested_action=v.action,
            details=wire(GPUGSPTimeout(kinds=seen["kinds"], gpu_instance=inst, gpu_from=found, text=seen["text"],
                                       logged_at=self._logged_at.get("logged_at", UNSET))))

    def _gpus_below(self, port: str) -> list[str] | None:
        """GPUs at or below ``port`` in the host root's PCIe tree; None where the tree does not know it."""
        tree = self._tree()
        if port not in tree.nodes:
            return None
        return [g for g in tree.gpus if port in tree.nodes[g].chain]

    async def _aer_line(self, a: AerLine) -> bool:
        """A GPU's own line ("nvidia <bdf>: AER: can't recover") names it; a port's line names the GPUs below it in
        the PCIe tree, else (a port the tree does not know) the port itself. A correctable or non-fatal error is
        the kernel's to handle and says nothing here; its recovery failing does."""
        self._aer_named = [(n, g) for n, g in self._aer_named if self.records - n <= 64]
        if a.kind == "cant_recover":
            if a.driver != "nvidia":
                return True
            self._aer_named.append((self.records, a.device))
            return await self._aer_finding([a.device], "RecoveryFailed", a)
        if a.kind == "recovery_failed":
            below = self._gpus_below(a.device)
            if below is None:
                named = sorted({g for _n, g in self._aer_named})
                return await self._aer_finding(named or [a.device], "RecoveryFailed", a, port=not named)
            return await self._aer_finding(below, "RecoveryFailed", a)
        if a.severity != "fatal" or a.kind not in ("received", "bus_error"):
            return True
        if a.driver == "nvidia":
            return await self._aer_finding([a.device], "UncorrectableFatal", a)
        dev = a.source if a.kind == "received" and a.source and a.source != "0000:00:00.0" else a.device
        below = self._gpus_below(dev)
        return await self._aer_finding(below or [], "UncorrectableFatal", a)

    async def _aer_finding(self, devices: list[str], reason: str, a: AerLine, *, port: bool = False) -> bool:
        ok = True
        for dev in devices[:64]:
            entity = f"pci:{dev}" if port else entities.gpu(dev)
            seen = self._aer.get(entity)
            if seen is None:
                if len(self._aer) >= 64:
                    continue
                seen = self._aer[entity] = {"kinds": [], "reason": reason, "severity": None}
            if a.severity in ("fatal", "nonfatal"):
                seen["severity"] = a.severity
            new_kind = a.kind not in seen["kinds"]
            if new_kind:
                seen["kinds"] = [*seen["kinds"], a.kind]
            worse = reason == "RecoveryFailed" and seen["reason"] != reason
            if worse:
                seen["reason"] = reason
            if not (new_kind or worse) and len(seen["kinds"]) > 1:
                continue
            v = verdict("GPUPCIeAERError", seen["reason"])
            what = (f"the kernel could not recover its PCIe link ({a.kind.replace('_', ' ')} on {a.device}); it stays "
                    f"disconnected until a reboot" if seen["reason"] == "RecoveryFailed"
                    else f"an uncorrectable fatal PCIe error (reported by {a.device})")
            label = f"PCIe port {dev} (no GPU known below it)" if port else f"GPU {dev}"
            ok = await self.emit.condition(
                "GPUPCIeAERError", firing=True, severity=v.severity, entity=entity, reason=seen["reason"],
                message=f"{label}: {what}.", suggested_action=v.action,
                details=wire(GPUPCIeAERError(kinds=seen["kinds"], severity=seen["severity"], reported_by=a.device,
                                             text=a.text, logged_at=self._logged_at.get("logged_at", UNSET)))) and ok
        return ok

    async def _fell_off(self, bus: str, text: str) -> bool:
        return await self.emit.condition(
            "GPUFellOffBus", firing=True, severity="critical", entity=entities.gpu(bus), reason="FallenOffTheBus",
            message=f"GPU {bus} has fallen off the bus and is not responding; the node needs a reboot.",
            details=wire(GPUFellOffBus(text=text[:500], logged_at=self._logged_at.get("logged_at", UNSET))),
            suggested_action="reboot")

    async def flush(self, now: float, *, flush_all: bool = False) -> None:
        for key, w in self.agg.due(now, flush_all=flush_all):
            kind = key[0]
            extra = WindowSummary(count=w.count, window_s=self.config.aggregation_window, aggregated=True,
                                  first_seen=w.first, span_s=round((w.last_usec - w.first_usec) / 1e6, 3))
            if kind == "xid":
                _, bus, info = key
                await emit_xid(self.emit, info, bus, source="kmsg", count=w.count, span=w.span(), window=extra)
            elif kind == "sxid":
                _, bus, code, fatal = key
                await emit_sxid(self.emit, bus, code, fatal=fatal, count=w.count, span=w.span(), window=extra)
            elif kind == "peermem":
                _, what, _ = key
                await self.emit.event("NvidiaPeermemError",
                                      severity=verdict("NvidiaPeermemError", _PEERMEM_REASON[what]).severity,
                                      entity="module:nvidia_peermem", reason=_PEERMEM_REASON[what],
                                      message=f"nvidia-peermem error ({what}) repeated {w.count} times {w.span()}.",
                                      details=wire(NvidiaPeermemError(
                                          kind=what, count=extra.count, window_s=extra.window_s,
                                          aggregated=extra.aggregated, first_seen=extra.first_seen,
                                          span_s=extra.span_s)))
            elif kind == "module":
                _, module, what = key
                await self.emit.event("KernelModuleLoadError", severity="warning", entity=f"module:{module}",
                                      reason=what.title().replace("_", ""),
                                      message=f"Kernel module {module} load error repeated {w.count} times {w.span()}.",
                                      details=wire(KernelModuleLoadError(
                                          module=module, kind=what, count=extra.count, window_s=extra.window_s,
                                          aggregated=extra.aggregated, first_seen=extra.first_seen,
                                          span_s=extra.span_s)))
        if self.config.fatal_xid_clear_after > 0:
            for bus, entry in list(self.fatal.items()):
                if now - entry["last"] >= self.config.fatal_xid_clear_after:
                    del self.fatal[bus]
                    await self.emit.condition(
                        "GPUFatalXid", firing=False, severity="critical", entity=entities.gpu(bus),
                        reason="QuietPeriodElapsed",
                        message=f"No fatal Xid on GPU {bus} for {self.config.fatal_xid_clear_after:g} s.")
                    self._save_state()

    async def process(self, records: list[KmsgRecord]) -> None:
        now = time.time()
        for rec in records:
            if self.last_seq is not None and rec.seq <= self.last_seq:
                continue  # seen before a restart
            self.last_seq = rec.seq
            # a text rendering without a time (usec 0) cannot be dated: judged, not read past
            ok = await self.handle(rec, now) if rec.usec >= self._min_usec or rec.usec == 0 else True
            # After a refused emit (spool full) the checkpoint stays put: a restart re-reads from
            # there rather than skipping what was never accepted.
            self._blocked = self._blocked or not ok
            if not self._blocked:
                self.checkpoint = rec.seq
        if records:
            self._save_state()

    # -- reading ----------------------------------------------------------------------
    def _malformed(self, raw: bytes) -> None:
        self.malformed += 1
        self.emit.unparsed(self.config.path, raw[:200].decode("utf-8", "replace").rstrip())

    async def _judge_source(self) -> None:
        """A source that yields no record at all but many unreadable lines is not a quiet kernel
        log: it is the wrong thing (a file in another format), and every Xid in it is missed."""
        unusable = self.malformed >= UNUSABLE_AFTER and self.records == 0 and not self.text_forms
        entity = f"kmsg:{self.config.path}"
        if unusable or any(t == "KernelLogUnparsable" for t, _e, _s in self.emit.active_conditions()):
            v = verdict("KernelLogUnparsable", "NotKmsgFormat")
            await self.emit.condition(
                "KernelLogUnparsable", firing=unusable, severity=v.severity, entity=entity,
                reason="NotKmsgFormat",
                message=f"{self.config.path}: {self.malformed} lines, none a kernel log record or a known dmesg/"
                        f"syslog rendering; Xid and other kernel findings cannot be seen.",
                details=wire(KernelLogUnparsable(malformed=self.malformed, records=self.records)),
                suggested_action=v.action)

    def _read_device(self, fd: int) -> list[KmsgRecord]:
        out: list[KmsgRecord] = []
        while True:
            try:
                raw = os.read(fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read them: count and go on
                    self.lost += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than our buffer: skip it
                    self._malformed(b"<a record larger than the read buffer>")
                    continue
                raise
            if not raw:
                break
            rec = parse_record(raw)
            if rec is None:
                self._malformed(raw)
            else:
                out.append(rec)
            if len(out) >= 4096:
                break  # yield to the loop during a storm; the fd stays readable
        return out

    def _read_text(self, fh: Any, buf: bytearray) -> list[KmsgRecord]:
        chunk = fh.read(1 << 20)
        if chunk:
            buf.extend(chunk)
        out: list[KmsgRecord] = []
        consumed = 0
        data = bytes(buf)
        for rec, end in iter_text_records(data):
            raw, consumed = data[consumed:end], end
            if rec is None and (text := parse_text_line(raw)) is not None:
                form, rec = text
                self.text_forms[form] = self.text_forms.get(form, 0) + 1
                self._text_seq += 1
                rec = dataclasses.replace(rec, seq=self._text_seq)
            if rec is None:
                self._malformed(raw)
            else:
                out.append(rec)
        del buf[:consumed]
        if len(buf) > 1 << 20:  # a "line" that never ends: drop it
            self._malformed(bytes(buf[:200]))
            buf.clear()
        return out

    async def run(self) -> None:
        await self._start_of_boot()
        path = self.host.path(self.config.path)
        said = False
        while True:
            try:
                st = os.stat(path)
                break
            except OSError as exc:  # a container without /dev/kmsg: say so once, keep looking
                if not said:
                    log.warning("kmsg_unavailable", path=str(path), error=str(exc))
                    said = True
                await asyncio.sleep(30)
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        flusher = loop.create_task(self._flush_loop())
        watcher: Inotify | None = None
        self.emit.facts.set("kmsg_xid.active", True)  # NVML then leaves Xids to the kernel log
        try:
            if stat.S_ISCHR(st.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                loop.add_reader(fd, ready.set)
                try:
                    while True:
                        await ready.wait()
                        ready.clear()
                        while records := self._read_device(fd):
                            await self.process(records)
                finally:
                    loop.remove_reader(fd)
                    os.close(fd)
            else:
                try:
                    watcher = Inotify(lambda _events: ready.set())
                    watcher.add_watch(str(path), IN_MODIFY)
                    watcher.start()
                except OSError:
                    watcher = None
                buf = bytearray()
                fh = open(path, "rb", buffering=0)  # noqa: SIM115 - held for the collector's life
                try:
                    while True:
                        if os.fstat(fh.fileno()).st_size < fh.tell():
                            fh.seek(0)  # truncated fixture file
                            buf.clear()
                        while records := self._read_text(fh, buf):
                            await self.process(records)
                        await self._judge_source()
                        # inotify says when the file grows; without it, poll
                        wait = self.config.poll_interval if watcher is None else max(30.0, self.config.poll_interval)
                        await wait_event(ready, wait if watcher is None else aligned_delay(wait))
                        ready.clear()
                finally:
                    fh.close()
        finally:
            self.emit.facts.set("kmsg_xid.active", False)
            flusher.cancel()
            if watcher:
                watcher.close()

    async def _flush_loop(self) -> None:
        # Sleeps until something needs a timer: an open aggregation window or a fatal-Xid clear.
        while True:
            if not self.agg.open and not (self.config.fatal_xid_clear_after > 0 and self.fatal):
                self._timers_needed.clear()
                await self._timers_needed.wait()
            await asyncio.sleep(min(1.0, self.config.aggregation_window))
            await self.flush(time.time())

    async def check(self) -> None:
        """One pass over the ring buffer's last ``lookback_seconds`` (``gpu-node-agent check``)."""
        self._look_back()
        path = self.host.path(self.config.path)
        try:
            st = os.stat(path)
        except OSError as exc:
            self.emit.not_seen(self.config.path, f"cannot read the kernel log: {exc.strerror or exc}")
            return
        if stat.S_ISCHR(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                while records := self._read_device(fd):
                    await self.process(records)
            finally:
                os.close(fd)
        else:
            with open(path, "rb") as fh:
                buf = bytearray()
                while records := self._read_text(fh, buf):
                    await self.process(records)
        await self._judge_source()
        await self.flush(time.time(), flush_all=True)
