"""NCCL and training logs: what NCCL chose (and silently fell back to), IB errors and timeouts.

Tails ``globs`` under the host root (default /var/log/nccl/*.log, where jobs point
NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log). Per process (host:pid) it tracks the communicators
(Init COMPLETE lines), the network chosen, the IB devices selected and the channel transports,
and raises NCCLSocketFallback, NCCLNoGDRDMA, NCCLP2PViaHost and NCCLHCASelection; IB completion
errors, socket errors, PyTorch watchdog timeouts and other WARN lines are events.

Exactly once: before the events of a chunk are emitted the chunk is recorded as pending in the
checkpoint with a timestamp; event ids are derived from it (gna_sdk.ids.derived_id), so a chunk
re-read after a crash re-sends the same ids and the NATS duplicate window drops them.

Whose lines: the writer's, never the reader's (collectors/nccl/writers.py). NCCL prefixes each line with
the writing process's hostname and pid; a line without the prefix (PyTorch's, torchrun's) belongs to the
process of its file whose rank it names (torchrun's "[rankN]:", srun --label's task id), the file's only
process, its pod (a container log), or the file's %h.%p. A line is judged here only when its writer is one of
this node's processes (the node's hostname, a pod of this node, a containerised process found in /proc by
its namespace pid and HOSTNAME, or ``own_hosts``). Other nodes' lines (another node's --output file on a
shared /home) are counted and never judged here; in a job-wide file that also holds this node's lines
(srun's forwarded output on the batch host, a launcher's aggregated log) what the fleet reads of them is
relayed as this node's word about that host (``relayed`` in the details; graded info here). A line no writer
can be told for is evidence for nobody (counted). Processes whose pid cannot be checked here expire when
their log goes quiet or is deleted; the per-collector condition cap bounds what they can raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import glob
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, cast

import msgspec
import structlog

from collectors.formats.ib_sysfs import parse_enum
from collectors.formats.launcher_exits import LauncherExit
from collectors.formats.pcie_tree import Finding, Topology, read_topology
from collectors.formats.torch_failures import CudaError, NcclError
from collectors.formats.torch_failures import RankFailure as RankFailureReport
from collectors.nccl import container_logs
from collectors.nccl.container_logs import Format, pod_of_path
from collectors.nccl.crash_evidence import MARKERS as CRASH_MARKERS
from collectors.nccl.crash_evidence import (
    CrashReader,
    exit_reason,
    failure_reason,
    oom_explanation,
    oom_of,
    report_time,
)
from collectors.nccl.hang_evidence import FlightRecords, RasAsker, read_environ
from collectors.nccl.hca_names import exact_hca_value, hca_prefix_surprises
from collectors.nccl.job_identity import JobName, JobNames
from collectors.nccl.line import PREFIX_MAX, parse_line
from collectors.nccl.log_time import node_zone
from collectors.nccl.matching import (
    REJECTED_SOURCE,
    UNREAD_SOURCE,
    Match,
    Rejected,
    match_or_reject,
    match_wrapped,
    wraps,
)
from collectors.nccl.prefilter import PREFILTER, REPEATING, best_engine, candidate_lines, hits
from collectors.nccl.process import ProcessState, pci_of
from collectors.nccl.rank_paths import (
    Unjudged,
    far_nic_finding,
    nearest_nic_names,
    parse_nccl_version,
    rank_gdr_finding,
)
from collectors.nccl.repeats import Repeats, Split
from collectors.nccl.rule import Fields, Heard, Rule, Said
from collectors.nccl.rules import WARNING_RULE
from collectors.nccl.writers import Writers, short_host
from gna_sdk import CollectorSettings, Emitter, HostPaths
from gna_sdk.hostroot import HostRoot
from gna_sdk.ids import derived_id
from gna_sdk.tailer import TailedFile, Tailer
from gna_types import entities
from gna_types.details import MAX_RANKS, BackendError, ProcessSummary
from gna_types.details import RankFailure as TorchRankFailure
from gna_types.policy import RELAYED, verdict

log = structlog.get_logger(__name__)

_HOST_PID_NAME = re.compile(r"(?P<host>[^/.]+)\.(?P<pid>\d+)\.[^/]*$")  # NCCL_DEBUG_FILE=%h.%p.log
# a pod's UID in /proc/<pid>/cgroup: cgroupfs ".../kubepods/burstable/pod<uid>/<container>", systemd's driver
# ".../kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope" (kubelet cm/cgroup_manager_linux.go)
_CGROUP_POD = re.compile(r"kubepods[^\n]*?[/-]pod([0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12})")
POD_LOGS = "/var/log/pods"
MAX_OUTPUTS = 256  # Slurm output files followed (two per job on the node at most)
MAX_RELAYED = 4096  # other nodes' processes tracked from job-wide files (a 512-node job's ranks)
# what the fleet correlator reads of another node's process (fleet/job_facts.py): its membership, its
# watchdog's numbers, the errors naming peers and ports; never its warnings or conditions
RELAYED_TYPES = frozenset({"NCCLJobMember", "NCCLCollectiveTimeout", "NCCLWatchdogProgress",
                           "NCCLIBCompletionError", "NCCLIBAsyncEvent", "NCCLSocketError"})  # and crash reports
_SUMMARY_FIELDS = frozenset(ProcessSummary.__struct_fields__)


def _typed_fields(typed: ProcessSummary) -> dict[str, Any]:
    """The fields a crash message's typed details set beyond the process summary (which is added apart)."""
    return {k: v for k, v in msgspec.structs.asdict(typed).items() if v is not None and k not in _SUMMARY_FIELDS}
_LABEL = re.compile(r"^\s{0,7}(\d{1,7}): ")  # srun --label: "%*d: " (slurm src/common/write_labelled_message.c)
_NUMBERS = re.compile(r"(?<![0-9])[0-9]{1,12}(?![0-9])")

Tri = Literal["auto", "yes", "no"]


class NCCLLogsConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 30.0  # housekeeping: ended processes, quiet logs
    timeout: float = 120.0  # `check` reads whole files
    globs: list[str] = msgspec.field(default_factory=lambda: ["/var/log/nccl/*.log"])
    # Kubernetes container logs (a training pod's stderr: PyTorch's watchdog, NCCL's lines without
    # NCCL_DEBUG_FILE): auto = read when /var/log/pods exists on the node
    pod_logs: Tri = "auto"
    pod_log_globs: list[str] = msgspec.field(default_factory=lambda: [f"{POD_LOGS}/*/*/*.log"])
    # Jobs named as operators name them (collectors/nccl/job_identity.py): a pod's training job from the API
    # server (auto: in a pod with a service account, or with `kubeconfig`), a Slurm job from scontrol (auto:
    # when scontrol is on PATH)
    kube_api: Tri = "auto"
    kubeconfig: str = ""
    slurm: Tri = "auto"
    lookup_timeout: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    quiet_resolve: float = 3600.0  # a job's conditions resolve when its log is quiet this long
    expect_ib: Tri = "auto"  # auto: the node has ACTIVE IB/RoCE ports
    gdr_available: Tri = "auto"  # auto: kernel_modules' verdict (peermem/DMA-BUF/GDR files)
    nvlink: Tri = "auto"  # auto: NVML sees NVLinks
    storage_hcas: list[str] = msgspec.field(default_factory=list)  # must never carry NCCL traffic
    # other names (globs) this node's processes print besides the node's hostname and its pods' (a host
    # whose NCCL hostname differs from the kernel's); ["*"]: every line is this node's (a log copied here
    # to be checked). Lines of any other name are another node's (collectors/nccl/writers.py)
    own_hosts: list[str] = msgspec.field(default_factory=list)
    warning_window: float = 60.0  # NCCLWarning: first per (process, text) at once, then one summary
    chunk_bytes: int = 1 << 20
    max_line: int = 65536
    # Byte prefilter engine: auto = Hyperscan (x86_64; the system's libhs.so.5 where installed, else the wheel's:
    # libhs.py) > RE2 > Python re; all find the same lines.
    scanner: Literal["auto", "hyperscan", "re2", "re"] = "auto"
    rescan_interval: float = 30.0  # inotify finds new files at once; the rescan is the fallback
    # descriptors held: beyond this, files read to their end are parked (closed, reopened on growth)
    max_open_files: Annotated[int, msgspec.Meta(ge=1)] = 256
    idle_close: Annotated[float, msgspec.Meta(ge=0)] = 300.0  # a read, quiet file gives back its descriptor
    # NCCL RAS (collectors/nccl/hang_evidence.py, docs/ras.md): ask a hung job's RAS port, in the daemon only
    ras: bool = True
    ras_timeout: Annotated[float, msgspec.Meta(gt=0, le=120)] = 12.0
    ras_cooldown: Annotated[float, msgspec.Meta(ge=0)] = 300.0  # one question per job in this long
    # PyTorch Flight Recorder dumps of a hung rank (collectors/nccl/flight_recorder.py): looked for this long
    flight_recorder: bool = True
    flight_recorder_wait: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 60.0


# The facts the conditions read besides NodeFacts' (each process's NCCL_* environment, nccl_env.py): a process
# is judged again when one of them changed (_unchanged). tests/test_nccl_repeats.py holds every facts read here to
# this list, NodeFacts' or the few no condition reads.
JUDGED_FACTS = ("nccl_env.ib_hca", "nccl_env.gdr_level", "nccl_env.net_choice")

_UNREAD = object()  # the node's zone not read yet (NCCLLogsCollector.zone)


class NodeFacts:
    """The node's facts the conditions read (ACTIVE RDMA ports, GPUDirect, NVLink), each read at most once for
    all the processes one chunk touched."""

    def __init__(self, collector: NCCLLogsCollector) -> None:
        self._c = collector

    @functools.cached_property
    def rdma(self) -> list[str]:
        return self._c._active_rdma_ports()

    @functools.cached_property
    def gdr(self) -> bool:
        return self._c._gdr_available()

    @functools.cached_property
    def nvlink(self) -> bool:
        return self._c._nvlink()


class Summary:
    """A process's summary, made on first use (an evaluation that fires nothing never needs it)."""

    __slots__ = ("_made", "_make")

    def __init__(self, make: Callable[[], dict[str, Any]]) -> None:
        self._make: Callable[[], dict[str, Any]] | None = make
        self._made: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any]:
        if self._make is not None:
            self._made, self._make = self._make(), None
        return self._made


class NCCLLogsCollector:
    name: ClassVar[str] = "nccl_logs"
    config_type: ClassVar[type[NCCLLogsConfig]] = NCCLLogsConfig
    phase: ClassVar[int] = 40  # after infiniband / kernel_modules / nvml: their facts are used
    auto_resolve: ClassVar[bool] = False

    def __init__(self, config: NCCLLogsConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        state = emit.state_dir / "nccl_checkpoints.json" if emit.state_dir else None
        globs = list(config.globs)
        rotated: list[str] = []
        if self._tri(config.pod_logs, host.path(POD_LOGS).is_dir()):
            globs += [g for g in config.pod_log_globs if g not in globs]
            # the kubelet's rotation (pkg/kubelet/logs/container_log_manager.go: timestampFormat
            # "20060102-150405", compressSuffix ".gz", tmpSuffix ".tmp"): "0.log" renamed to "0.log.<time>",
            # older generations gzipped; read only to finish a file this agent was reading when it stopped (a
            # ".gz.tmp" in progress matches no checkpoint: never read)
            rotated = [f"{g}.*" for g in config.pod_log_globs]
        self.tailer = Tailer(host if isinstance(host, HostRoot) else HostRoot(host.root), globs, state,
                             chunk_bytes=config.chunk_bytes, rescan_interval=config.rescan_interval,
                             max_open=config.max_open_files, idle_close=config.idle_close, rotated=rotated)
        self.engine = config.scanner  # "auto": resolved on the first chunk (nothing loads on an idle node)
        self.procs: dict[str, ProcessState] = {}
        # (proc, text) -> [first, count, sample, {file key: offset of the last line counted}]
        self.warn_windows: dict[tuple[str, str], list[Any]] = {}
        self.lines_matched = 0
        self.repeats = Repeats()  # NCCL's repeated lines, counted rather than decoded (collectors/nccl/repeats.py)
        # the name this node's own processes print (the kernel's, else the root's /etc/hostname, else the
        # agent's node name), cut at the first dot as NCCL cuts it
        self.node_host = short_host(host.read_text("/proc/sys/kernel/hostname", limit=512)
                                    or host.read_text("/etc/hostname", limit=512) or str(getattr(emit, "node", "")))
        self._zone: dt.tzinfo | object | None = _UNREAD  # (zone: read when a line first needs it)
        self.writers = Writers(host, self.node_host, own_hosts=config.own_hosts, refresh=config.interval)
        self.file_local: set[str] = set()  # tailed file keys holding lines of this node's processes
        self.file_foreign: set[str] = set()  # ... and lines of other nodes' processes
        self.relayed: dict[str, ProcessState] = {}  # other nodes' processes in job-wide files (_relay)
        self.relay_dropped = 0  # their lines beyond MAX_RELAYED processes
        self.foreign_lines = 0  # lines other nodes' processes wrote (relayed or only counted)
        self.unattributed = 0  # lines no writer can be told for: evidence for nobody
        self.rejected: dict[str, int] = {}  # "<rule>.<field>" -> lines rejected for a field past its bound
        self.ras = RasAsker(host, emit, timeout=config.ras_timeout, cooldown=config.ras_cooldown,
                            enabled=False)  # on in run(): a snapshot has no live process to ask
        self.flight = FlightRecords(host, emit, wait=config.flight_recorder_wait)
        self.live = False  # run(): sources are asked as hangs appear; check(): once, at the end
        self.hung: dict[str, tuple[int, int | None, str, dict[str, Any]]] = {}  # process -> what to look up
        self.topo: tuple[float, Topology] | None = None  # the node's PCIe tree, re-read every `interval`
        self.formats: dict[str, Format] = {}  # tailed file key -> its record format (container logs: cri, docker)
        self.jobs = JobNames(kube=None, scontrol="scontrol" if self._tri(config.slurm, bool(shutil.which("scontrol")))
                             else None, timeout=config.lookup_timeout)
        self._kube_tried = False
        self._outputs: dict[str, float] = {}  # a Slurm job's output file -> when to look again (inf: followed)
        # container logs: partial runs joined, runs cut at their bound, candidate records not in their format
        self.container_stats = {"joined": 0, "cut": 0, "bad_records": 0}
        self._ooms_seen: set[tuple[Any, ...]] = set()  # the kernel's OOM kills already told
        self.crash_readers: dict[str, CrashReader] = {}  # tailed file key -> its torchrun report / NCCL error reader

    # -- node facts ---------------------------------------------------------------------
    @property
    def zone(self) -> dt.tzinfo | None:
        """The node's /etc/localtime: the zone of the stamps its processes print (log_time.node_zone), read when
        a line first needs it (an idle node never loads zoneinfo)."""
        if self._zone is _UNREAD:
            self._zone = node_zone(self.host.root)
        return cast("dt.tzinfo | None", self._zone)

    def _active_rdma_ports(self) -> list[str]:
        ports = self.emit.facts.get("infiniband.ports")
        if ports is not None:
            return sorted(e for e, p in ports.items() if p.get("active"))
        out = []
        root = self.host.path("/sys/class/infiniband")
        with contextlib.suppress(OSError):
            for hca in root.iterdir():
                for port in (hca / "ports").iterdir():
                    st = parse_enum(self.host.read_text(f"/sys/class/infiniband/{hca.name}/ports/{port.name}/state"))
                    if st and st[0] in (4, 5):
                        out.append(entities.ib(hca.name, port.name))
        return sorted(out)

    def _tri(self, value: Tri, auto: bool) -> bool:
        return value == "yes" or (value == "auto" and auto)

    def _gdr_available(self) -> bool:
        km = self.emit.facts.get("kernel.modules")
        auto = bool(km.get("gpudirect_available")) if km else any(
            self.host.path(p).exists() for p in ("/sys/kernel/mm/memory_peers/nv_mem/version",
                                                 "/sys/module/nvidia_peermem/version"))
        return self._tri(self.config.gdr_available, auto)

    def _nvlink(self) -> bool:
        devs = self.emit.facts.get("nvml.devices") or []
        return self._tri(self.config.nvlink, any(d.get("nvlinks") for d in devs))

    # -- chunks ---------------------------------------------------------------------------
    def _local_writer(self, who: bytes) -> bool:
        """Whether "host:pid" (a repeated line's writer: repeats.py) is one of this node's processes."""
        host, _, pid = who.decode("ascii").rpartition(":")
        return self.writers.local(host, int(pid))

    def _current(self, st: ProcessState) -> bool:
        """Whether ``st`` is still the state tracked for its process (not ended and forgotten since)."""
        return self.procs.get(st.key) is st

    def _format(self, tf: TailedFile, data: bytes) -> Format:
        fmt = self.formats.get(tf.key)
        if fmt is None:
            nl = data.find(b"\n")
            fmt = self.formats[tf.key] = container_logs.sniff(data[: nl if nl >= 0 else len(data)][:4096])
        return fmt

    async def _handle(self, tf: TailedFile, data: bytes, base: int) -> bool:
        logged: dict[int, str] = {}
        read_at = dt.datetime.now(dt.UTC)  # a stamp without a year is of the latest year not after this
        fmt = self._format(tf, data)
        pod = pod_of_path(tf.path)
        split: Split | None = None
        if fmt == "plain" and pod is None:
            # NCCL's repeated lines (a channel per connection) counted, not decoded: collectors/nccl/repeats.py
            split = self.repeats.split(data, base, hits(data, best_engine() if self.engine == "auto" else self.engine),
                                       self.config.max_line, self._local_writer, self._current)
            candidates = split.candidates
        else:
            candidates = candidate_lines(data, base, max_line=self.config.max_line, engine=self.engine)
        if fmt != "plain":  # a container log: records to lines, partial ones joined, the runtime's header off
            got = container_logs.lines(
                fmt, data, base, candidates, final=not self.live,
                full=len(data) >= self.config.chunk_bytes - self.config.max_line,
                keep=lambda b: PREFILTER.search(b) is not None, max_join=self.config.chunk_bytes)
            tf.unfinished = got.unfinished
            self.container_stats["joined"] += got.joined
            self.container_stats["cut"] += got.cut
            self.container_stats["bad_records"] += got.bad
            candidates = [(off, content[: self.config.max_line]) for off, content, _t in got.lines]
            logged = {off: t for off, _c, t in got.lines if t}

        def decode(offset: int, raw: bytes) -> tuple[Match | None, int]:
            """The line's match (None: none, or rejected and counted), and the end in data of the line a wrapped
            line's join consumed (-1: no join)."""
            joined = -1
            parsed = parse_line(offset, raw, logged.get(offset, ""), now=read_at, tz=self.zone)
            m = match_or_reject(parsed)
            if m is None and fmt == "plain" and len(raw) < self.config.max_line and wraps(parsed):
                # a line a terminal wrapped in two: joined once with a neighbour (matching.match_wrapped)
                w = match_wrapped(data, offset - base, offset - base + len(raw), self.config.max_line,
                                  lambda at, b: parse_line(base + at, b, now=read_at, tz=self.zone))
                if w is not None:
                    m, joined = w[0], w[2]
            if parsed.unread:  # NCCLX's glog header, its NCCL part unreadable: counted, never dropped unseen
                self.emit.unparsed(UNREAD_SOURCE, f"{tf.path}:{offset}: {parsed.raw[:200]}")
            if isinstance(m, Rejected):
                # a field longer than NCCL/PyTorch print (a 5,000-digit commId): no id is cut out of it
                key = f"{m.rule}.{m.field}"
                self.rejected[key] = self.rejected.get(key, 0) + 1
                self.emit.unparsed(REJECTED_SOURCE, f"{tf.path}:{offset}: {m.rule} {m.field} is {m.length} "
                                                    f"characters (at most {m.limit}): {m.line.raw[:120]}")
                return None, joined
            return m, joined

        def line_at(offset: int) -> bytes:
            start = offset - base
            end = data.find(b"\n", start)
            return data[start : end if end >= 0 else len(data)]

        matches: list[tuple[int, Match]] = []  # (the candidate's offset, its match), in the order of the file
        firsts = split.firsts if split is not None else {}
        decoded: dict[int, Match] = {}  # the first lines of repeats (repeats.Split.firsts): what they decoded to
        spans: list[tuple[int, int]] = []  # (after, before): the lines wrapped lines' joins consumed
        joined_to = -1  # (issue 26) the end in data of the last wrapped line joined: its second part is read
        for offset, raw in candidates:
            if offset - base < joined_to:
                continue
            m, joined = decode(offset, raw)
            if joined >= 0:
                joined_to = joined
                spans.append((offset, base + joined))
            if m is not None:
                matches.append((offset, m))
                if offset in firsts:
                    decoded[offset] = m
        # the first line of each repeat decoded to its rule (always, for the lines Rule.repeat matches): its later
        # lines in the chunk are tallied with it; else they are decoded like any line, in their place
        heads: dict[int, tuple[Match, int, bytes, list[int]]] = {}
        if split is not None:
            if spans:
                split.drop(spans)
            late: list[int] = []
            for off, (ri, key, offs) in firsts.items():
                m = decoded.get(off)
                if m is not None and m.rule is REPEATING[ri] and m.line.host:
                    heads[off] = (m, ri, key, offs)
                else:
                    late += offs
            if late:
                for off in late:
                    m, _joined = decode(off, line_at(off))
                    if m is not None:
                        matches.append((off, m))
                matches.sort(key=lambda om: om[0])
        counted = 0 if split is None else (sum(len(rep.counted) for rep in split.known)
                                           + sum(len(head[3]) for head in heads.values()))
        self.lines_matched += len(matches) + counted
        now = time.monotonic()
        touched: dict[str, ProcessState] = {}
        first_at: dict[str, int] = {}  # touched process -> the offset of its first line in the chunk
        last_of: dict[tuple[str, str], int] = {}  # (process, Rule.last_wins rule) -> the offset of its last line
        events: list[tuple[Match, ProcessState, bool]] = []
        if tf.key not in self.file_local and (
                any(m.line.host and self.writers.local(m.line.host, m.line.pid) for _o, m in matches)
                or (split is not None and any(rep.counted for rep in split.known))):  # (counted: this node's)
            self.file_local.add(tf.key)  # before its lines are judged: a job-wide file's other hosts are relayed

        def judge(at: int, m: Match) -> ProcessState | None:
            """The match applied to its writer's state (None: not a process of this node's)."""
            line = m.line
            writer = (line.host, line.pid) if line.host else self._owner(tf.path, m.fields.get("rank"), line.raw,
                                                                          tf.key)
            if writer is None:
                self.unattributed += 1
                self.emit.unparsed(f"{tf.path}: lines no writer can be told for (evidence for nobody)", line.raw[:200])
                return None
            host, pid = writer
            if not self.writers.local(host, pid):
                self.foreign_lines += 1
                self.file_foreign.add(tf.key)
                if self._relayable(tf):  # a job-wide file written here: relayed as this node's word about that host
                    relayed = self._relay(m, host, pid, tf.path, now)
                    if relayed is not None:
                        events.append(relayed)
                    return None
                self.emit.unparsed(f"{tf.path}: lines other nodes' processes wrote (their agents judge them)",
                                   line.raw[:200])
                return None
            self.file_local.add(tf.key)
            key = f"{host}:{pid}"
            st = self.procs.get(key)
            if st is None:
                st = self.procs[key] = ProcessState(host, pid, tf.path)
                self._place(st)
            if pod is not None and st.pod is None:  # its own lines in a pod's container log: that pod's
                st.pod, st.container, st.pod_uid = f"{pod.namespace}/{pod.pod}", pod.container, pod.uid
                if self._kube() is not None:
                    self.jobs.want_pod(pod.namespace, pod.pod, pod.uid)
            st.last_seen = now
            news = st.apply(m)  # the rule's change to the process (a communicator joined: news)
            touched[key] = st
            first_at.setdefault(key, at)
            if m.rule.last_wins:
                last_of[key, m.rule.name] = at
            if (m.rule.say is not None and (news or not m.rule.news_only)) or line.level == "WARN":
                events.append((m, st, news))
            return st

        confirmed: list[tuple[ProcessState, tuple[Match, int, bytes, list[int]]]] = []
        for at, m in matches:
            st = judge(at, m)
            if heads and (head := heads.get(at)) is not None and head[0] is m:
                del heads[at]
                if st is not None:
                    confirmed.append((st, head))
                else:  # its writer is not this node's after all (a refresh in between): its lines decoded, judged
                    for off in head[3]:
                        again, _joined = decode(off, line_at(off))
                        if again is not None:
                            judge(off, again)
        # the processes whose state a line of this chunk may have changed: a decoded line, or counted ones that wrote
        # new state (ProcessState.tally: a Rule.last_wins rule's other fields); the other repeats only grew counts past
        # zero and re-added what their first line added, which no condition reads otherwise (_unchanged)
        changed = set(touched)
        if split is not None:
            # the counted repeats: their state at once (ProcessState.tally: a rule's counts; a Rule.last_wins rule's
            # state only when its last line in the chunk is a counted one); a process's place among the touched is
            # where its first line was
            groups = [(rep.st, REPEATING[rep.rule], rep.fields, rep.counted) for rep in split.known if rep.counted]
            for st, (m, ri, key, offs) in confirmed:
                self.repeats.remember(ri, key, m.fields, st)
                if offs:
                    groups.append((st, m.rule, m.fields, offs))
            last: dict[tuple[str, str], tuple[int, ProcessState, Rule, Fields, int]] = {}
            for st, rule, fields, offs in groups:
                st.last_seen = now
                touched.setdefault(st.key, st)
                first_at[st.key] = min(first_at.get(st.key, offs[0]), offs[0])
                if not rule.last_wins:
                    st.tally(rule, fields, len(offs))
                elif offs[-1] > last_of.get((st.key, rule.name), -1) and offs[-1] > last.get(
                        (st.key, rule.name), (-1,))[0]:
                    last[st.key, rule.name] = (offs[-1], st, rule, fields, len(offs))
            for _at, st, rule, fields, n in last.values():
                if st.tally(rule, fields, n):
                    changed.add(st.key)
            if len(touched) > 1:
                touched = dict(sorted(touched.items(), key=lambda kv: first_at[kv[0]]))
        for name in changed:  # judged again before anything counts as judged (a chunk refused is read again: counted)
            touched[name].judged = None
        crashes = self._crashes(tf, data, base, fmt, candidates)
        if not events and not touched and not crashes:
            return True
        if tf.pending is None or tf.pending.get("from") != base:
            tf.pending = {"from": base, "ms": int(time.time() * 1000)}
            self.tailer.save()  # the ids below are now reproducible
        ms = int(tf.pending["ms"])
        k = 0  # the index of each message in its chunk: part of its reproducible id
        for m, st, news in events:
            where = self._where(st, m, tf)
            said = m.rule.say(m.fields, Heard(st.key, m.line.msg, where, news)) if m.rule.say is not None else None
            if said is None:
                if m.line.level != "WARN":
                    continue  # nothing new to say (a communicator already known)
                # a WARN a state rule also reads (no libibverbs): still shown as one
                m = Match(WARNING_RULE, m.line, {})
                said = WARNING_RULE.say(m.fields, Heard(st.key, m.line.msg, where, news)) if WARNING_RULE.say else None
                assert said is not None
            if not await self._event(m, st, said, where, tf, ms, k):
                return False
            k += 1
        for st, said, where in crashes:
            msg_id = derived_id(ms, k, tf.key, tf.fp, int(where["offset"]), said.type)
            if not await self._publish(st, said, {**where, **said.details}, msg_id):
                return False
            k += 1
        node = NodeFacts(self)  # the node's facts, read once for the chunk's processes
        world = self._world(node)  # (as they were before any evaluation waited: a later change is judged next chunk)
        for st in touched.values():
            if st.key not in changed and self._unchanged(st, world, now):
                continue
            if not await self._evaluate(st, node):
                return False
            st.judged = (now, world)
        return True

    def _world(self, node: NodeFacts) -> tuple[Any, ...]:
        """What an evaluation reads besides the process's state: the node's ports, GPUDirect and NVLink (the facts
        NodeFacts reads, or sysfs) and the other facts the conditions read (JUDGED_FACTS), compared by value."""
        return (tuple(node.rdma), node.gdr, node.nvlink, *(self.emit.facts.get(k) for k in JUDGED_FACTS))

    def _unchanged(self, st: ProcessState, world: tuple[Any, ...], now: float) -> bool:
        """Whether judging ``st`` again could only repeat its last evaluation: it went through, with the node as it
        is now (``world``), less than ``interval`` ago (the PCIe tree is read again after that, and anything that
        depends on time is looked at again), and this chunk only counted repeats of lines already applied to it.
        Conditions fire on transitions only: an evaluation over the same facts publishes nothing."""
        return st.judged is not None and now - st.judged[0] < self.config.interval and st.judged[1] == world

    def _relayable(self, tf: TailedFile) -> bool:
        """Whether other hosts' lines in this file are relayed: a job-wide file written on this node -- one holding
        lines of this node's processes too, or this node's pod's container log (a launcher pod's) -- and not on a
        network filesystem (every node mounting it would relay the same lines: collectors/nccl/writers.py)."""
        if tf.key not in self.file_local and pod_of_path(tf.path) is None:
            return False
        return not self.writers.shared(tf.path)

    def _relay(self, m: Match, host: str, pid: int, path: str, now: float
               ) -> tuple[Match, ProcessState, bool] | None:
        """Another node's line in a job-wide file this node's processes also write (srun's forwarded output, a
        launcher's aggregated log): its process is tracked apart (never judged here: no condition, no RAS
        question), and what the fleet reads of it (RELAYED_TYPES) is published as this node's word about that
        host. Bounded: MAX_RELAYED processes, the rest counted."""
        key = f"{host}:{pid}"
        st = self.relayed.get(key)
        if st is None:
            if len(self.relayed) >= MAX_RELAYED:
                self.relay_dropped += 1
                return None
            st = self.relayed[key] = ProcessState(host, pid, path, relayed=True)
        st.last_seen = now
        news = st.apply(m)
        if m.rule.say is None or m.rule.type not in RELAYED_TYPES or (m.rule.news_only and not news):
            return None
        return m, st, news

    def _summary(self, st: ProcessState) -> dict[str, Any]:
        """The process summary, with its job as operators name it once a lookup answered."""
        summary = st.summary()
        job = self._job(st)
        if job is not None:
            summary["job_name"] = job.name
            summary["job_kind"] = job.kind
            if job.owner:
                summary["job_owner"] = job.owner
        return summary

    def _job(self, st: ProcessState) -> JobName | None:
        """The process's job as a lookup answered (None: not yet, or none); a Slurm job's output files followed."""
        job = self.jobs.get(f"pod:{st.pod_uid}") if st.pod_uid else None
        if job is None and st.slurm_job:
            job = self.jobs.get(f"slurm:{st.slurm_job}")
            if job is not None and job.outputs:
                self._follow_outputs(job)
        return job

    def _follow_outputs(self, job: JobName) -> None:
        """A Slurm job running here prints where scontrol says (StdOut/StdErr): those files are read too, if
        they are the job user's own regular files -- a path the job chose is never a way to make this agent read
        someone else's file (a link swapped in later is refused by the tailer: its roots are the files'
        directories; a hard link to another's file is the kernel's to refuse, fs.protected_hardlinks). A file not
        there yet is looked for again every ``interval``."""
        now = time.monotonic()
        for path in job.outputs:
            if self._outputs.get(path, 0.0) > now or (path not in self._outputs and len(self._outputs) >= MAX_OUTPUTS):
                continue
            files = glob.glob(str(self.host.path(path)))[:64] if "*" in path else [str(self.host.path(path))]
            owned = mine = False
            for f in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(f)
                    mine = True
                    owned |= stat.S_ISREG(st.st_mode) and job.uid is not None and st.st_uid == job.uid
            if owned:
                self._outputs[path] = float("inf")
                if path not in self.tailer.globs:
                    self.tailer.globs.append(path)
                    self.tailer.wake()
            else:
                self._outputs[path] = now + self.config.interval
                if mine:  # there, but not the user's own regular file
                    self.jobs.errors["output_not_the_users"] = self.jobs.errors.get("output_not_the_users", 0) + 1

    def _kube(self) -> Any:
        """The API client for pod lookups, made on first need (lightkube; None without it or a cluster)."""
        if self._kube_tried:
            return self.jobs.kube
        self._kube_tried = True
        token = os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")
        if not self._tri(self.config.kube_api, token or bool(self.config.kubeconfig)):
            return None
        try:
            from lightkube import AsyncClient
            from lightkube.config.kubeconfig import KubeConfig

            cfg = KubeConfig.from_file(self.config.kubeconfig) if self.config.kubeconfig \
                else KubeConfig.from_service_account()
            self.jobs.kube = AsyncClient(config=cfg, field_manager="gpu-node-agent")
        except Exception as exc:  # no lightkube, no cluster config: pods keep their commId
            why = f"client_{type(exc).__name__}"
            self.jobs.errors[why] = self.jobs.errors.get(why, 0) + 1
        return self.jobs.kube

    def _place(self, st: ProcessState) -> None:
        """The pod a process of this node runs in, from its /proc/<pid>/cgroup (read once, when first seen):
        ties its NCCL_DEBUG_FILE lines to the PyTorch lines of its pod's container log."""
        if not self._checkable(st):
            return
        text = self.host.read_text(f"/proc/{st.pid}/cgroup") or ""
        m = _CGROUP_POD.search(text[:65536])
        if m is not None:
            st.pod_uid = m.group(1).replace("_", "-")
        job = (read_environ(self.host, st.pid) or {}).get("SLURM_JOB_ID", "")
        if job:
            st.slurm_job = job[:24]
            self.jobs.want_slurm(st.slurm_job)

    def _owner(self, path: str, rank: Any, raw: str, file_key: str = "") -> tuple[str, int] | None:
        """The NCCL process a line without NCCL's prefix (PyTorch's watchdog) belongs to: in a file
        where NCCL printed to stdout next to the trainer's stderr (kubectl logs, a launcher's per-rank
        file), the process of this file whose rank PyTorch names, or the file's only process; in a pod's
        container log whose NCCL lines went to NCCL_DEBUG_FILE, the same among the pod's processes (their
        cgroup names the pod); else the file's %h.%p (NCCL_DEBUG_FILE)."""
        here = [st for st in self.procs.values() if st.file == path and st.comms]
        if not isinstance(rank, int) and (label := _LABEL.match(raw)) is not None:
            rank = int(label.group(1))  # srun --label's task id: the rank where torch takes SLURM_PROCID
        if file_key in self.file_foreign:
            # a file holding other nodes' lines (a job-wide file, another node's file on a shared filesystem):
            # a line without NCCL's prefix is the one of its processes whose rank it names, else nobody's
            others = [st for st in self.relayed.values() if st.file == path and st.comms]
            named = [st for st in here + others if isinstance(rank, int) and st.world_rank() == rank]
            return (named[0].host, named[0].pid) if len(named) == 1 else None
        pod = pod_of_path(path)
        if not here and pod is not None:
            # the pod's processes: NCCL names them by the pod's hostname (its name, cut at 63 characters and at
            # the first dot: kubelet GeneratePodHostNameAndDomain, NCCL getHostName), or on hostPID/hostNetwork
            # pods by this node's, their cgroup naming the pod
            # (an Indexed Job's or JobSet's pod has the hostname "<job>-<index>" and the name "<job>-<index>-<x>")
            name = pod.pod[:63].rstrip("-.").split(".")[0]
            mine = [st for st in self.procs.values() if st.comms and st.pod_uid in (None, pod.uid)]
            here = ([st for st in mine if st.pod_uid == pod.uid or st.host == name]
                    or [st for st in mine if st.host and name.startswith(st.host + "-")])
        job = None
        if not here and (job := self._slurm_job_of(path)) is not None:
            # a Slurm job's output file (slurm-<id>.out, --output=...%j...): the job's processes on this node
            here = [st for st in self.procs.values() if st.comms and (st.slurm_job or "").split("_")[0] == job]
        if isinstance(rank, int):
            named = [st for st in here if st.world_rank() == rank]
            if len(named) == 1:
                return named[0].host, named[0].pid
            if job is not None and here and not named:
                return None  # a rank of the job that runs on another node: its agent judges it
        if len(here) == 1 and job is None:
            return here[0].host, here[0].pid
        if job is not None:
            return None  # a Slurm job's file: a line that names no rank of this node is evidence for nobody here
        if not here and pod is None and isinstance(rank, int):
            # a console no NCCL line of which is in it (torchrun's output tee'd to a file, NCCL's own lines in
            # NCCL_DEBUG_FILE): the one process of this node holding that world rank -- while every rank the
            # file names is one of this node's (a rank held elsewhere, or by two of this node's jobs, and the
            # file is evidence for nobody: another node's file on a shared filesystem)
            holders = [st for st in self.procs.values() if st.comms and st.world_rank() == rank]
            if len(holders) == 1 and file_key not in self.file_foreign:
                return holders[0].host, holders[0].pid
            if "*" not in self.config.own_hosts:  # (every line this node's: the file's name stands for it)
                if not holders:
                    self.file_foreign.add(file_key)
                return None
        named_file = self._from_name(path)
        if named_file is None and pod is not None:
            return pod.pod[:63].rstrip("-.").split(".")[0], 0  # the pod's own line: its log is this node's
        if named_file is None and "*" in self.config.own_hosts:
            return self._file_as_host(path), 0  # a log copied here to be checked: every line this node's
        return named_file

    def _slurm_job_of(self, path: str) -> str | None:
        """The Slurm job (of a process on this node) whose id the file's name carries, if exactly one."""
        jobs = {st.slurm_job.split("_")[0] for st in self.procs.values() if st.slurm_job}
        if not jobs:
            return None
        named = set(_NUMBERS.findall(Path(path).name)) & jobs
        return next(iter(named)) if len(named) == 1 else None

    @staticmethod
    def _from_name(path: str) -> tuple[str, int] | None:
        """Lines without NCCL's prefix (PyTorch's watchdog) belong to the file's %h.%p (NCCL_DEBUG_FILE), if
        its name is one: a host over PREFIX_MAX["host"] or a pid over its digits is not a %h.%p."""
        m = _HOST_PID_NAME.search(path)
        if m and len(m["host"]) <= PREFIX_MAX["host"] and len(m["pid"]) <= PREFIX_MAX["pid"]:
            return m["host"], int(m["pid"])
        return None

    @staticmethod
    def _file_as_host(path: str) -> str:
        """A file's name standing for its writer (a name over the host bound replaced by a digest of it: an
        entity stays short and distinct)."""
        name = Path(path).name
        if len(name) > PREFIX_MAX["host"]:
            name = "file-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return name

    def _where(self, st: ProcessState, m: Match, tf: TailedFile) -> dict[str, Any]:
        """What every message of a process carries: its summary (the fields the fleet lives on) and the
        line's place."""
        line = m.line
        return {**self._summary(st), "file": tf.path, "offset": line.offset, "line": line.raw[:2000],
                "source": line.src or None, "function": line.func or None, "nccl_time": line.ts or None,
                # when the line says it was written (its runtime's record, NCCL's, PyTorch's or glog's stamp, in
                # UTC): timelines use it; the message's own time is when this agent read it
                **({"logged_at": line.stated} if line.stated else {})}

    async def _event(self, m: Match, st: ProcessState, said: Said, where: dict[str, Any], tf: TailedFile, ms: int,
                     k: int) -> bool:
        """A rule's message, graded by the policy table (gna_types.policy), with a reproducible id."""
        f, line = m.fields, m.line
        msg_id = derived_id(ms, k, tf.key, tf.fp, line.offset, m.rule.type)
        if st.relayed:
            return await self._publish(st, said, {**where, **said.details}, msg_id)
        if m.rule.hang:
            # the job hangs here: NCCL's RAS says who stopped, PyTorch's Flight Recorder where each rank waits
            pid = st.pid if self._checkable(st) else 0
            rank = f["rank"] if isinstance(f.get("rank"), int) else where.get("world_rank")
            if self.live:
                if pid:
                    self.ras.on_hang(where.get("job"), pid, st.entity, where)
                if self.config.flight_recorder:
                    self.flight.on_hang(pid, rank, st.entity, where)
            elif self.config.flight_recorder and len(self.hung) < 4096:
                self.hung[st.key] = (pid, rank, st.entity, where)
        if m.rule.repeats:
            # first per (process, text) at once, the rest counted into one summary
            text = line.msg[:300]
            win = self.warn_windows.get((st.key, text))
            if win is not None and time.monotonic() - win[0] < self.config.warning_window:
                counted: dict[str, int] = win[3]
                if line.offset <= counted.get(tf.key, -1):
                    return True  # a chunk re-read after a refusal: this line was already sent or counted
                counted[tf.key] = line.offset
                win[1] += 1
                return True
        v = verdict(said.type, said.reason)
        accepted = await self.emit.event(
            said.type, severity=v.severity, entity=st.entity, reason=said.reason, message=said.message,
            details={**where, **said.details}, suggested_action=v.action, msg_id=msg_id)
        if m.rule.repeats and accepted:  # a refused first occurrence (spool full) is retried, never a repeat
            self.warn_windows[(st.key, line.msg[:300])] = [time.monotonic(), 1, where, {tf.key: line.offset}]
        return accepted

    async def _publish(self, st: ProcessState, said: Said, details: dict[str, Any], msg_id: str) -> bool:
        """A message about one process, graded by the policy table; another node's line (relayed) is shown as this
        node's word about it, graded info here (the finding is that node's; the fleet grades it as the policy
        does, fleet/job_facts.py)."""
        if st.relayed:
            return await self.emit.event(
                said.type, severity=RELAYED.severity, entity=st.entity, reason=said.reason,
                message=f"relayed from a job-wide file ({st.host} wrote it): {said.message}",
                details=details, suggested_action=RELAYED.action, msg_id=msg_id)
        v = verdict(said.type, said.reason)
        return await self.emit.event(said.type, severity=v.severity, entity=st.entity, reason=said.reason,
                                     message=said.message, details=details, suggested_action=v.action, msg_id=msg_id)

    # -- crashed ranks ----------------------------------------------------------------------
    def _crashes(self, tf: TailedFile, data: bytes, base: int, fmt: Format, candidates: list[tuple[int, bytes]]
                 ) -> list[tuple[ProcessState, Said, dict[str, Any]]]:
        """torchrun's failure reports and PyTorch's NCCL errors the chunk completed, each with the process it is
        about and its message (collectors/nccl/crash_evidence.py). A docker json-file log's records are escaped
        JSON: not read for them."""
        if fmt == "docker":
            return []
        reader = self.crash_readers.get(tf.key)
        # the markers are prefilter needles: only the chunk's few candidate lines are looked at for them
        if not (reader is not None and reader.open) and not any(
                mark in raw for _off, raw in candidates for mark in CRASH_MARKERS):
            return []
        if reader is None:
            if len(self.crash_readers) >= MAX_OUTPUTS * 4:
                self.crash_readers.clear()  # files long gone; a report open across this is dropped
            reader = self.crash_readers[tf.key] = CrashReader()
        out = []
        for found in reader.read(data, base):
            got = (self._failure(found.failure, found.offset, tf) if found.failure is not None else
                   self._backend_error(found.error, found.offset, tf) if found.error is not None else
                   self._launcher_exit(found.exit, found.offset, tf) if found.exit is not None else
                   self._cuda_error(found.cuda, found.offset, tf) if found.cuda is not None else None)
            if got is not None:
                out.append(got)
        return out

    def _about(self, host: str, pid: int, rank: int | None, tf: TailedFile, what: str
               ) -> tuple[ProcessState, bool] | None:
        """The process a crash report or error is about, and whether it is this node's: a known process (by pid,
        else the only one of that host with that world rank), else one made for the message (its job unknown).
        Another node's, in a file that is not job-wide: counted, None."""
        local = self.writers.local(host, pid)
        if not local and not self._relayable(tf):
            self.foreign_lines += 1
            self.emit.unparsed(f"{tf.path}: {what} of other nodes' processes (their agents judge them)", host)
            return None
        pool = self.procs if local else self.relayed
        st = pool.get(f"{host}:{pid}")
        if st is None and rank is not None:
            held = [p for p in pool.values() if p.host == host and p.world_rank() == rank]
            st = held[0] if len(held) == 1 else None
        return (st or ProcessState(host, pid, tf.path, relayed=not local)), local

    def _crash_where(self, st: ProcessState, tf: TailedFile, offset: int, line: str) -> dict[str, Any]:
        """What a crash message carries besides its own fields: the process summary and the line's place."""
        return {**self._summary(st), "file": tf.path, "offset": offset, "line": line[:2000]}

    def _failure(self, f: RankFailureReport, offset: int, tf: TailedFile
                 ) -> tuple[ProcessState, Said, dict[str, Any]] | None:
        """One entry of torchrun's failure report: the worker's rank, how it ended, and why (the OOM killer in
        this node's kernel log, by its pid or its pod's or Slurm job's cgroup)."""
        host = short_host(f.host)
        about = self._about(host, f.pid, f.rank, tf, "torchrun failure reports") if host else None
        if about is None:
            self.unattributed += not host
            return None
        st, local = about
        oom = None
        if local and f.signal == "SIGKILL":
            uid = st.pod_uid or ""
            oom = oom_of(self.emit.facts.get("kernel.oom_kills") or [],
                         [f.pid, self.writers.host_pid(host, f.pid) or 0],
                         [uid, uid.replace("-", "_"), f"job_{st.slurm_job}" if st.slurm_job else ""])
        reason, why = failure_reason(f, oom, aborted_after_failure=st.collective_failed)
        st.ended_told |= reason == "OOMKilled"
        typed = TorchRankFailure(rank=f.rank if 0 <= f.rank < MAX_RANKS else None,
                                 local_rank=f.local_rank if 0 <= f.local_rank < MAX_RANKS else None,
                                 exitcode=f.exitcode if -255 <= f.exitcode <= 255 else None,
                                 signal=f.signal[:16] or None, failed_at=f.time[:64] or None, root_cause=f.root_cause,
                                 error=f.exception[:512] or None, explanation=why[:512])
        said = Said("TorchRankFailed", reason, f"torchrun: rank {f.rank} on {host} (pid {f.pid}) ended: {why}.",
                    _typed_fields(typed))
        when = report_time(f.time, self.zone)
        line = f"{f.script} FAILED: rank {f.rank} exitcode {f.exitcode} (pid {f.pid}) on {f.host}"
        return st, said, {**self._crash_where(st, tf, offset, line), **({"logged_at": when} if when else {})}

    def _launcher_exit(self, x: LauncherExit, offset: int, tf: TailedFile
                       ) -> tuple[ProcessState, Said, dict[str, Any]] | None:
        """A launcher's word (srun on the batch host, mpirun in a launcher pod) on a process that ended on a node it
        names: this node's word about that node (relayed) unless the node is this one. Its job is the file's."""
        host = short_host(x.host)
        if not host and x.rank is not None:  # mpirun's first non-zero exit names a rank, not its node
            held = [st for st in (*self.procs.values(), *self.relayed.values())
                    if st.file == tf.path and st.world_rank() == x.rank]
            host = held[0].host if len(held) == 1 else ""
        about = self._about(host, x.pid, x.rank, tf, "launcher exit lines") if host else None
        if about is None:
            self.unattributed += not host
            return None
        st, _local = about
        reason, why = exit_reason(x, aborted_after_failure=st.collective_failed)
        typed = TorchRankFailure(rank=x.rank if x.rank is not None and x.rank < MAX_RANKS else None,
                                 exitcode=x.exitcode, signal=x.signal[:16] or None, explanation=why[:512])
        said = Said("TorchRankFailed", reason, f"{why}.",
                    _typed_fields(typed))
        where = self._crash_where(st, tf, offset, why)
        if where.get("job") is None and (job := self._file_job(tf.path)) is not None:
            where["job"] = job  # the process is not known by its NCCL lines: the job the file's processes run
        return st, said, where

    async def _oom_killed(self) -> None:
        """This node's kernel log says the OOM killer ended one of this node's NCCL processes (its pid, or the pid
        its container's namespace gave it): the rank ended there, whatever its log says (a rank killed outright
        prints nothing; srun without torchrun reports nothing). Once per kill (kmsg_xid's kernel.oom_kills)."""
        kills = self.emit.facts.get("kernel.oom_kills") or []
        for kill in kills:
            key = (kill.get("pid"), kill.get("logged_at"), kill.get("comm"))
            if key in self._ooms_seen or not isinstance(kill.get("pid"), int):
                continue
            mine = [st for st in self.procs.values() if st.comms and kill["pid"] == (
                st.pid if st.host == self.node_host else self.writers.host_pid(st.host, st.pid))]
            if len(mine) != 1:
                continue  # no NCCL process of this node (yet): looked at again with the next kills
            self._ooms_seen.add(key)
            st = mine[0]
            if st.ended_told:
                continue  # its launcher's report said it, with the OOM kill
            why = oom_explanation(kill)
            typed = TorchRankFailure(rank=st.world_rank(), signal="SIGKILL", explanation=why)
            said = Said("TorchRankFailed", "OOMKilled", f"{st.key} (rank {st.world_rank()}) ended: {why}.",
                        _typed_fields(typed))
            when = kill.get("logged_at")
            details = {**self._summary(st), **said.details, "source": "kernel log",
                       "line": f"Killed process {kill['pid']} ({str(kill.get('comm'))[:64]})",
                       **({"logged_at": when} if isinstance(when, str) else {})}
            try:
                ms = int(dt.datetime.fromisoformat(str(when)).timestamp() * 1000)
            except ValueError:
                ms = int(time.time() * 1000)
            msg_id = derived_id(ms, 0, "oom", str(kill["pid"]), str(when))
            await self._publish(st, said, details, msg_id)

    def _file_job(self, path: str) -> str | None:
        """The one job (the world communicator) a launcher's file is about: the one its processes run, else the
        one this node's processes of the Slurm job its name carries run, else the one this node runs; None when
        that is not one."""
        everyone = (*self.procs.values(), *self.relayed.values())
        slurm = self._slurm_job_of(path)
        for pool in ([st for st in everyone if st.file == path],
                     [st for st in self.procs.values() if slurm and (st.slurm_job or "").split("_")[0] == slurm],
                     list(self.procs.values())):
            jobs = {st.summary().get("job") for st in pool if st.comms} - {None}
            if jobs:
                return str(next(iter(jobs))) if len(jobs) == 1 else None
        return None

    def _ranked(self, tf: TailedFile, rank: int | None, what: str) -> tuple[ProcessState, bool] | None:
        """The process an exception line is about: the one of its file whose world rank its ``[rankN]:`` prefix
        names (else the file's process), as ``_about`` takes it; a line no writer can be told for is counted."""
        writer = self._owner(tf.path, rank, "", tf.key)
        if writer is None:
            self.unattributed += 1
            return None
        return self._about(writer[0], writer[1], rank, tf, what)

    def _cuda_error(self, c: CudaError, offset: int, tf: TailedFile
                    ) -> tuple[ProcessState, Said, dict[str, Any]] | None:
        """A rank's own CUDA error or GPU out-of-memory (PyTorch's exception, its ``[rankN]:`` prefix naming the
        rank): the rank failed on its own (a hardware cause on its GPU is the node's own finding, and the fleet's
        hardware verdict comes first)."""
        about = self._ranked(tf, c.rank, "CUDA errors")
        if about is None:
            return None
        st, _local = about
        why = f"{'GPU out of memory' if c.out_of_memory else 'a CUDA error of its own'}: {c.text[:300]}"
        typed = TorchRankFailure(rank=st.world_rank(), error=f"{c.exception}: {c.text}"[:512], explanation=why[:512])
        said = Said("TorchRankFailed", "ExitedWithError", f"{st.key} (rank {st.world_rank()}) failed: {why}.",
                    _typed_fields(typed))
        return st, said, self._crash_where(st, tf, offset, c.text)

    def _backend_error(self, e: NcclError, offset: int, tf: TailedFile
                       ) -> tuple[ProcessState, Said, dict[str, Any]] | None:
        """PyTorch's NCCL error on a rank (its ``[rankN]:`` prefix, else the file's process): the NCCL result, a
        peer its last error names."""
        about = self._ranked(tf, e.rank, "NCCL errors")
        if about is None:
            return None
        st, _local = about
        remote = e.kind == "ncclRemoteError" or e.remote_exited
        st.collective_failed |= remote
        peer, _, port = e.peer.partition("<")
        typed = BackendError(nccl_error=e.kind[:40] or None, remote=remote, nccl_version=e.nccl_version[:40] or None,
                             rank=e.rank if e.rank is not None and 0 <= e.rank < MAX_RANKS else None,
                             peer=peer[:253] or None,
                             peer_port=int(port[:-1]) if port[:-1].isdigit() and int(port[:-1]) <= 65535 else None)
        said = Said("NCCLBackendError", "RemoteError" if remote else (e.kind[:40] or "NCCLError"),
                    f"NCCL error on {st.key}: {e.kind or 'unknown'}" + (f" (last error: {e.last_error[:200]})"
                                                                          if e.last_error else "") + ".",
                    _typed_fields(typed))
        return st, said, self._crash_where(st, tf, offset, e.exception)

    async def _flush_warnings(self, *, everything: bool = False) -> None:
        now = time.monotonic()
        for key, (first, count, where, _counted) in list(self.warn_windows.items()):
            if not everything and now - first < self.config.warning_window:
                continue
            del self.warn_windows[key]
            if count > 1:
                v = verdict("NCCLWarning", "NCCLWarnRepeated")
                await self.emit.event(
                    "NCCLWarning", severity=v.severity, entity=f"nccl:{key[0]}", reason="NCCLWarnRepeated",
                    suggested_action=v.action, message=f"NCCL WARN repeated {count} times in {key[0]}: {key[1][:200]}",
                    details={**where, "count": count, "window_s": self.config.warning_window, "aggregated": True})

    async def _firing(self, st: ProcessState, type_: str, reason: str, *, message: str,
                      details: dict[str, Any]) -> bool:
        """A condition over the process's state, graded by the policy table (gna_types.policy)."""
        v = verdict(type_, reason)
        return await self.emit.condition(type_, firing=True, severity=v.severity, entity=st.entity, reason=reason,
                                         message=message, details=details, suggested_action=v.action)

    async def _evaluate(self, st: ProcessState, node: NodeFacts | None = None) -> bool:
        """The conditions over the process's state. ``node``: the node's facts, shared by the processes of one
        chunk (each read once)."""
        node = NodeFacts(self) if node is None else node
        ok = True
        self._job(st)  # (its outputs followed once the lookup answers)
        base = Summary(lambda: self._summary(st))  # made only for a condition that fires
        rdma = node.rdma
        transport = st.transport()
        if transport == "Socket" or (transport is None and st.ib_no_device):
            ok &= await self._socket_fallback(st, base, rdma)
        if (st.non_gdr_channels or st.gdr_disabled) and transport != "Socket" and node.gdr:
            ok &= await self._firing(
                st, "NCCLNoGDRDMA", "GDRNotUsed",
                message=f"NCCL in {st.key} moves IB traffic through host memory (no GPUDirect RDMA) although "
                        f"the node supports it.",
                details={**base(), "channels_without_gdrdma": st.non_gdr_channels,
                         "gdr_disabled_hcas": sorted(st.gdr_disabled)})
        if st.shm_channels and node.nvlink:
            ok &= await self._firing(
                st, "NCCLP2PViaHost", "SHMOnNVLinkNode",
                message=f"NCCL in {st.key} sends GPU-to-GPU traffic through host shared memory on an NVLink node "
                        f"({st.shm_channels} channels): P2P is disabled or blocked.",
                details={**base(), "shm_channels": st.shm_channels})
        selected = [d["name"] for d in st.ib_devices]
        env = st.env_hca or (self.emit.facts.get("nccl_env.ib_hca") or {}).get(str(st.pid), "")
        surprises = hca_prefix_surprises(env, selected)
        storage = sorted(set(selected) & set(self.config.storage_hcas))
        if surprises or storage:
            ok &= await self._firing(
                st, "NCCLHCASelection", "PrefixMatch" if surprises else "StorageNIC",
                message=f"NCCL in {st.key} selected {', '.join(surprises + storage)}"
                        + (f": NCCL_IB_HCA={env} is a prefix match (set it to "
                           f"'{exact_hca_value(env, selected)}' to select only the HCAs it names)"
                           if surprises else
                           ": a storage NIC excluded by config") + ".",
                details={**base(), "selected": selected, "nccl_ib_hca": env or None, "unintended": surprises,
                         "storage_nics": storage})
        ok &= await self._topology_checks(st, base, env, rdma)
        return ok

    async def _topology_checks(self, st: ProcessState, base: Summary, env_hca: str, rdma: list[str]) -> bool:
        """The rank's GPU and NICs against this node's PCIe tree (docs/topology.md, "NCCL ranks and the tree"):
        NCCLFarNIC when its own channels use a NIC farther than the GPU's nearest one, NCCLGDRLevel when
        NCCL_NET_GDR_LEVEL (its environ as written, else its log's echo) turns GPUDirect RDMA off for that pair
        or is a form NCCL misreads. A log here is taken as this node's job, like every check above. ``rdma``: the
        node's ACTIVE RDMA ports, as _evaluate read them."""
        gpus = {g for c in st.comms.values() if (g := pci_of(c.get("bus_id")))}
        used = st.direct_nics()
        facts = self.emit.facts.get("nccl_env.gdr_level") or {}
        level = (facts.get(str(st.pid)) if self._checkable(st) else None) or st.env.get("NCCL_NET_GDR_LEVEL")
        if len(gpus) != 1 or (used is None and level is None) or st.transport() == "Socket":
            return True  # no rank yet, one process driving several GPUs, nothing to judge, or no NIC in use
        gpu = next(iter(gpus))
        now = time.monotonic()
        if self.topo is None or now - self.topo[0] > self.config.interval:
            self.topo = (now, await asyncio.to_thread(read_topology, self.host))
        topo = self.topo[1]
        active = {e.split(":", 1)[-1].rsplit("/", 1)[0] for e in rdma}
        ok = True
        found: list[Finding] = []
        checked = far_nic_finding(topo, gpu, used or [], listed=[d["name"] for d in st.ib_devices], active=active,
                                  hca_filter=env_hca or None, exclude=self.config.storage_hcas,
                                  version=parse_nccl_version(st.version))
        if isinstance(checked, Unjudged):
            self.emit.not_seen("PCIe topology (NCCL ranks' NICs)",
                               f"{checked.why}: NCCLFarNIC and NCCLGDRLevel are not judged")
            return True
        if checked is not None and used:
            found.append(checked)
        if level is not None:
            nics = used or nearest_nic_names(topo, gpu, self.config.storage_hcas)
            gdr = rank_gdr_finding(topo, gpu, nics, level, st.version or None)
            if gdr is not None:
                found.append(gdr)
        for f in found:
            ok &= await self.emit.condition(
                f.type, firing=True, severity=f.severity, entity=st.entity, reason=f.reason,
                message=f"NCCL in {st.key} (ranks {st.ranks() or '?'}): {f.message}",
                details={**base(), **f.details, "nccl_version": st.version or None},
                suggested_action=f.suggested_action)
        return ok

    def _job_choice(self, st: ProcessState) -> tuple[str, str] | None:
        """(variable, value) when the job itself chose sockets: echoed in its log (NCCL prints integer
        params as "NCCL_IB_DISABLE set by environment to 1.") or read from /proc/<pid>/environ."""
        env = {**(self.emit.facts.get("nccl_env.net_choice") or {}).get(str(st.pid), {}), **st.env}
        if env.get("NCCL_IB_DISABLE", "").strip() not in ("", "0"):
            return "NCCL_IB_DISABLE", env["NCCL_IB_DISABLE"]
        if env.get("NCCL_NET", "").strip().lower() == "socket":
            return "NCCL_NET", env["NCCL_NET"]
        return None

    async def _socket_fallback(self, st: ProcessState, base: Summary, rdma: list[str]) -> bool:
        """Severity by who is at fault. The job's setting or its container (no IB device visible to it)
        is a fix_config warning naming the job; only a node whose ports are up and whose NCCL saw IB
        devices yet still fell back is critical, and even then it wants inspection, not a cordon."""
        ib_node = self._tri(self.config.expect_ib, bool(rdma))
        choice = self._job_choice(st)
        job = f"NCCL in {st.key} (ranks {st.ranks() or '?'})"
        if not ib_node:
            reason = "NoRDMAOnNode"
            message = f"{job} uses TCP sockets; this node has no ACTIVE IB/RoCE port."
        elif choice is not None:
            reason = "SocketChosenByJob"
            message = (f"{job} uses TCP sockets because the job sets {choice[0]}={choice[1]} although {len(rdma)} "
                       f"IB/RoCE ports are ACTIVE: remove the setting.")
        elif st.ib_no_device:
            reason = "NoIBDeviceInJob"
            message = (f"{job} uses TCP sockets: NCCL "
                       + ("could not open libibverbs" if st.no_verbs else "found no IB device")
                       + f" although {len(rdma)} IB/RoCE ports are ACTIVE on the node; the job's container or "
                         f"namespace does not see the HCAs (rdma-core in the image, RDMA device plugin, "
                         f"/dev/infiniband, NCCL_IB_HCA).")
        else:
            reason = "SocketTransport"
            message = f"{job} uses TCP sockets although {len(rdma)} IB/RoCE ports are ACTIVE."
        v = verdict("NCCLSocketFallback", reason)
        return await self.emit.condition(
            "NCCLSocketFallback", firing=True, severity=v.severity, entity=st.entity, reason=reason, message=message,
            details={**base(), "net": st.transport(), "socket_ifs": st.socket_ifs or None,
                     "ib_no_device": st.ib_no_device, "socket_channels": st.socket_channels,
                     "job_setting": dict([choice]) if choice else None, "active_rdma_ports": rdma},
            suggested_action=v.action)

    # -- lifecycle ------------------------------------------------------------------------
    def _checkable(self, st: ProcessState) -> bool:
        """Its pid means something in this host's /proc (not another host's, not a pod's we cannot see)."""
        return bool(st.pid) and not (st.host and self.node_host and st.host != self.node_host)

    def _alive(self, st: ProcessState) -> bool:
        if not self._checkable(st):
            return True  # not ours to judge by pid: the quiet timeout (or its log's deletion) decides
        return bool(self.host.path(f"/proc/{st.pid}").exists())

    async def collect(self) -> None:
        """Housekeeping: a job's conditions resolve when it ends or its log goes quiet (or, for a process
        this host cannot check by pid, its log is deleted)."""
        await self._flush_warnings()
        await self._oom_killed()
        if self.tailer.files:  # forget files the tailer let go (between two run()s it holds none)
            self.file_local &= set(self.tailer.files)
            self.file_foreign &= set(self.tailer.files)
        now = time.monotonic()
        for key, st in list(self.relayed.items()):  # another node's: its own agent says when it ended
            if now - st.last_seen > self.config.quiet_resolve or not self.host.path(st.file).exists():
                del self.relayed[key]
        for key, st in list(self.procs.items()):
            quiet = now - st.last_seen > self.config.quiet_resolve
            gone = not self._checkable(st) and bool(st.file) and not self.host.path(st.file).exists()
            if self._alive(st) and not quiet and not gone:
                continue
            why = "log went quiet" if quiet else "log was deleted" if gone else "ended"
            summary = self._summary(st)
            if self.live and not quiet and isinstance(summary.get("job"), str):
                # a job fact for the fleet correlator: an incident resolves when the job's processes are
                # gone, never on silence (a hung rank is quiet until its watchdog fires); a quiet log is
                # no proof the process ended
                reason = "LogGone" if gone else "ProcessEnded"
                v = verdict("NCCLProcessEnded", reason)
                await self.emit.event(
                    "NCCLProcessEnded", severity=v.severity, entity=st.entity, reason=reason,
                    suggested_action=v.action, message=f"{st.key} of job {summary['job']} {why}.", details=summary)
            for type_, entity, severity in self.emit.active_conditions():
                if entity == st.entity:
                    await self.emit.condition(type_, firing=False, severity=severity,  # type: ignore[arg-type]
                                              entity=entity,
                                              reason="LogQuiet" if quiet else "LogGone" if gone else "ProcessEnded",
                                              message=f"{type_} for {st.key} cleared: the process {why}.")
            del self.procs[key]
        self.repeats.prune(self._current)  # their repeated lines' keys with them

    async def run(self) -> None:
        self.ras.enabled = self.config.ras
        self.live = True
        try:
            await self.tailer.run(self._handle)
        finally:
            await self.ras.close()
            await self.flight.close()
            if self.jobs.kube is not None:
                with contextlib.suppress(Exception):
                    await self.jobs.kube.close()

    async def check(self) -> None:
        await self.tailer.read_all_once(self._handle)
        await self._oom_killed()
        self.emit.facts.set("nccl_logs.hostnames", sorted(self.writers.names()))
        for pid, rank, entity, where in list(self.hung.values()):  # dumps already written (a snapshot)
            await self.flight.collect(pid, rank, entity, where)
        if not self.tailer.files:
            self.emit.not_seen(", ".join(self.config.globs), "no NCCL log file matches")
        await self._flush_warnings(everything=True)
