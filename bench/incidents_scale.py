"""The live correlator at fleet scale: jobs of 128-4,096 nodes, hundreds of jobs, a 3-node cluster.

    .venv/bin/python bench/incidents_scale.py --mode one-job [--sizes 128,512,1024,2048,4096] [--trials 3]
    .venv/bin/python bench/incidents_scale.py --mode many-jobs [--jobs 500] [--fleet-nodes 18000] [--fleet-start]
    .venv/bin/python bench/incidents_scale.py --mode cluster [--nodes 16]
    .venv/bin/python bench/incidents_scale.py --mode replicas [--replicas 1,3] [--jobs 100] [--fleet-nodes 2000]

What bench/incidents_live.py does for one job of 128 nodes, at the sizes a fleet has: a real nats-server
(agent/nats_server.py) and a real correlator process (fleet/incident_service.py, started the way
`gpu-node-agent correlator` starts it, but with ``stats_interval`` short so its ``correlator_stats``
lines, read from its stderr, show what it digested and how long its event loop was held). The messages
come from sim/scenarios.py: simulated host trees read by the agents' own one-shot checks, published on
the node's own subjects (gna_types/subjects.py) by one publisher per node, as the fleet's agents would.

Generating a scenario writes a tree of small files a node (~4 MiB on tmpfs) and reads it back with the
agent's checks: on a 2-core VM, 0.06-0.5 s a node to write on its disk (it varies with the disk), 0.05 on
tmpfs, and 0.08 s a node to read either way (4,096 nodes: 9.5-11 min on tmpfs with two workers at once,
longer on a disk). The trees are written, read and removed 64 nodes at a time (sim/scenarios.py ``lazy``; a 4,096-node
fleet's trees at once took ~21 GB): TMPDIR=/dev/shm or --gen-dir /dev/shm keeps them in memory. So each
scenario (one per size and fault kind) is generated once, its
messages kept (gzip JSON lines), and every trial replays the same messages
into a fresh nats-server and a fresh correlator (a correlator files a message id once: the same
messages into the same correlator would be no trial). --gen-workers N generates N at a time (before
any measured phase); --cache DIR keeps the messages across runs (keyed by the scenario and a hash of
the code that produces them: sim/, collectors/, agent/).

Modes:

* one-job: one job on ``--sizes`` nodes (8 ranks a node), every fault kind, ``--trials`` each. The job's
  membership is published first and digested (the correlator's stats count every message its
  followers handed it: accepted + rejected + skipped), then the evidence, every node at once.
* many-jobs: ``--jobs`` jobs of 8-128 nodes (seeded; ``--fleet-nodes`` in all), healthy but for
  ``--faults`` of them. Steady state: every membership published and digested, the fleet's noise,
  then the faults one after another (``--fault-gap``). ``--fleet-start``: every membership at once
  (the faulty jobs' first), the faults injected while the flood is half published.
* replicas: the many-jobs fleet, healthy, its membership and traffic published once to 1, then 3 (``--replicas``)
  partitioned replicas on a fresh nats-server each time: what each replica was handed, its CPU and RSS, and the
  busiest replica's ratio to the first count (partitions split reading at the server: issue 21).
* cluster: a 3-node cluster (R3 streams), three replicas ``--partitions 3 --partition i``; jobs of
  ``--nodes`` nodes, every job's membership published (and digested) first, each fault then only its
  evidence (so a replica that took a partition over, or lost and regained its lease, must have rebuilt
  the job from the streams; socket_node is left out: its fault is in the membership). A fault per
  partition; then the replica holding a job's partition SIGKILLed with one nats-server, a fault of
  that partition (failover); both back, another fault; then each nats-server killed in turn, faults
  while it is down and after it is back. Every record in the gna-incidents KV is read back:
  duplicates are two versions with the same status, culprit, victims and evidence count. A timeline
  of the bench's actions and the replicas' lease and replay log lines follows.

Measured per fault: from the first evidence message published to the first open incident naming the
culprit's node (what a cordon acts on); the same after the decisive message (``decisive``: the
hardware finding, the last watchdog timeout of a hung rank, the Socket membership of a socket node);
right (no other node ever blamed, and the exact entity named within ``--timeout``); withdrawn (a
culprit replaced by "no culprit" within 5 s). Per correlator: CPU seconds (utime+stime) per phase,
peak RSS (VmHWM), the longest loop stall its stats lines report (``loop_stall_max_ms``: since it
started; ``loop_stall_window_ms``: over the measured phases; ``loop_stall_cpu_max_ms``: how much of a
stall was at most its own CPU, the rest being the thread waiting for a core), memory per rank held (VmHWM growth over
the ranks its stats hold). The result goes to bench/results/incidents_scale.jsonl through bench/record.py
(its figures; the whole summary as ``raw``; the commit, the machine, the fingerprint of the code measured;
--no-record: printed only).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import datetime
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats
import record as results
from procstat import cpu_seconds, status_mib

from agent.config import NatsConfig
from agent.logsetup import configure
from agent.nats_link import stream_configs
from agent.nats_server import NatsCluster, NatsServerProcess
from fleet.incident_service import incident_versions
from fleet.incidents import INCIDENTS_BUCKET, owner
from fleet.leases import LEASES_BUCKET
from gna_types.subjects import EVENTS_PREFIX, JOBS_PREFIX, SIGNALS_PREFIX, encode_token, subjects_for
from sim.scenarios import generate

REPO = Path(__file__).resolve().parent.parent
KINDS = ("ib_port_down_early", "gpu_fell_off", "hung_rank", "socket_node", "ib_port_down")
HARDWARE_KINDS = ("ib_port_down", "ib_port_down_early", "gpu_fell_off")
WITHDRAW_S = 5.0  # s: a culprit replaced by "no culprit" within this long was withdrawn
PARTITIONS = 3
# what the cluster mode shows on its timeline of a replica's log (lease_tick_failed: counted only)
# everything this run started, stopped at its end whatever happened (a nats-server runs in a session of
# its own: a SIGTERM to this bench does not reach it)
STARTED: list[Any] = []
# nats-server's log: "[pid] 2026/12/08 00:12:12.689201 [INF] JetStream cluster new metadata leader: s-1/c" or
# "... Self is new JetStream cluster metadata leader" (server/jetstream_cluster.go, processLeaderChange)
META_LINE = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[INF\] "
                       r"(?:JetStream cluster new metadata leader: ([^/\s]+)|(Self) is new JetStream cluster metadata)")
TIMELINE = ("lease_lost", "lease_taken_over", "lease_provisional", "lease_provisional_handed_back",
            "lease_provisional_given_up", "partition_ready", "judging_without_current_findings", "replay_failed",
            "incidents_follower_failed", "incidents_caught_up", "incident_publish_retry")

# The correlator as `gpu-node-agent correlator` runs it (fleet/cli.py cmd_correlator), with the stats
# line every few seconds (the CLI has no flag for it) and JSON logs on stderr.
WRAPPER = """
import asyncio, json, sys
from agent.config import NatsConfig
from agent.logsetup import configure
from agent.natsclient import run_until_closed_or_stopped, watching
from fleet.incident_service import IncidentService
from gna_sdk.aio import within

a = json.loads(sys.argv[1])
configure("info", "json")
if a.get("trace_steps_ms"):
    from bench.step_trace import install, time_calls
    install(a["trace_steps_ms"])
    time_calls(a["trace_steps_ms"] / 2, *a["trace_calls"])


async def go():
    watch = watching()
    cfg = NatsConfig(stream_replicas=a["replicas"])
    svc = IncidentService(a["servers"], nats_cfg=cfg, partitions=a["partitions"], partition=a["partition"],
                          stats_interval=a["stats_interval"], freeze_heap=a["freeze_heap"])
    await within(svc.start(), cfg.connect_timeout + 1)
    rc = await run_until_closed_or_stopped(watch, None)
    await svc.stop()
    return rc


sys.exit(asyncio.run(go()))
"""


# ---------------------------------------------------------------------------------------------- scenarios

def code_fingerprint() -> str:
    """What the messages depend on: the simulator, the collectors, the agent's checks and message code."""
    h = hashlib.sha1()
    for top in ("sim", "collectors", "agent"):
        for p in sorted((REPO / top).rglob("*.py")):
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build_scenario(spec: dict[str, Any]) -> dict[str, Any]:
    """One scenario generated, its messages written to spec["out"] (gzip JSON lines). The host trees are
    written, read and removed 64 nodes at a time (sim/scenarios.py ``lazy``: a 4,096-node fleet's trees
    all at once took ~21 GB), so "checks read" includes writing them. Runs in a worker process (or in this
    one, before any event loop)."""
    configure("error", "json")  # the checks' notes about what a simulated host lacks (NVML...) are not news
    with tempfile.TemporaryDirectory(prefix="gna-scale-", dir=spec.get("gen_dir")) as tmp:
        t0 = time.monotonic()
        sc = generate(Path(tmp) / "fleet", seed=spec["seed"], nodes=spec["nodes"], fault=spec["kind"],
                      job_nodes=spec["nodes"], second_job=False, lazy=True)
        t1 = time.monotonic()
        msgs = asyncio.run(sc.messages())
        t2 = time.monotonic()
    job = sc.jobs[0]
    with gzip.open(spec["out"], "wt", compresslevel=1) as f:
        for m in msgs:
            f.write(json.dumps(m, separators=(",", ":")) + "\n")
    return {"seed": spec["seed"], "kind": spec["kind"], "nodes": spec["nodes"], "job": job.comm_id,
            "ranks": job.size, "want": sc.expected[job.comm_id], "messages": len(msgs), "out": spec["out"],
            "gen_s": round(t1 - t0, 2), "collect_s": round(t2 - t1, 2), "cached": False}


def build_all(specs: list[dict[str, Any]], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Every scenario of ``specs``: from the cache, or generated (``--gen-workers`` at a time)."""
    out: list[dict[str, Any] | None] = [None] * len(specs)
    todo: list[tuple[int, dict[str, Any]]] = []
    cache = Path(args.cache) if args.cache else None
    fp = code_fingerprint() if cache else ""
    for i, s in enumerate(specs):
        key = f"{s['kind']}-{s['nodes']}n-s{s['seed']}-{fp}"
        s = {**s, "out": str(work / f"{key}.jsonl.gz"), "gen_dir": args.gen_dir}
        if cache is not None and (cache / f"{key}.json").is_file() and (cache / f"{key}.jsonl.gz").is_file():
            meta = json.loads((cache / f"{key}.json").read_text())
            out[i] = {**meta, "out": str(cache / f"{key}.jsonl.gz"), "cached": True}
        else:
            todo.append((i, {**s, "key": key}))

    def done(i: int, meta: dict[str, Any], key: str) -> None:
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copy(meta["out"], cache / f"{key}.jsonl.gz")
            (cache / f"{key}.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "out"}))
        out[i] = meta
        print(f"  scenario {meta['kind']:18} {meta['nodes']:5} nodes seed {meta['seed']}: {meta['messages']} "
              f"messages, generated in {meta['gen_s']:.1f} s, checks read in {meta['collect_s']:.1f} s", flush=True)

    if todo and args.gen_workers > 1:
        with concurrent.futures.ProcessPoolExecutor(args.gen_workers) as pool:
            futs = {pool.submit(build_scenario, s): (i, s["key"]) for i, s in todo}
            for fut in concurrent.futures.as_completed(futs):
                i, key = futs[fut]
                done(i, fut.result(), key)
    else:
        for i, s in todo:
            done(i, build_scenario(s), s["key"])
    return [m for m in out if m is not None]


def load_messages(meta: dict[str, Any]) -> list[dict[str, Any]]:
    with gzip.open(meta["out"], "rt") as f:
        return [json.loads(line) for line in f]


class Prepared:
    """A scenario's messages encoded once (the timed phases publish, they do not serialize)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.job: str = meta["job"]
        self.want: dict[str, str] | None = meta["want"]
        msgs = load_messages(meta)
        self.members = [m for m in msgs if m["type"] == "NCCLJobMember"]
        self.evidence = sorted((m for m in msgs if m["type"] != "NCCLJobMember"), key=lambda m: m["time"])
        self.member_wire = by_node(self.members)
        self.evidence_wire = by_node(self.evidence)
        # socket_node: the fault is in the membership itself (the node's NCCLJobMember messages say
        # transport Socket); its latencies run from that membership message (see decisive)
        self.in_membership = meta["kind"] == "socket_node"
        self.decisive_ids, self.decisive_last = decisive(meta["kind"], self.want, self.members, self.evidence,
                                                         self.job)
        self.members = self.evidence = []  # the encoded copies are what is published (a fleet's worth is GBs)

    def read(self, which: str) -> int:
        """How many of these messages one correlator holding every partition is handed (the events stream
        whole, a job's NCCL copies there skipped unread; the jobs stream's membership and evidence)."""
        wire = self.member_wire if which == "members" else self.evidence_wire
        return sum(read_count(subs) for ms in wire.values() for _mid, subs, _data in ms)


def read_count(subjects: list[str]) -> int:
    return sum(1 for s in subjects if s.startswith((EVENTS_PREFIX + ".", SIGNALS_PREFIX + ".", JOBS_PREFIX + ".")))


def by_node(msgs: Iterable[dict[str, Any]]) -> dict[str, list[tuple[str, list[str], bytes]]]:
    out: dict[str, list[tuple[str, list[str], bytes]]] = {}
    for m in msgs:
        subs = subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"])
        out.setdefault(m["node"], []).append((m["id"], subs, json.dumps(m).encode()))
    return out


def decisive(kind: str, want: dict[str, str] | None, members: list[dict[str, Any]], evidence: list[dict[str, Any]],
             job: str) -> tuple[set[str], bool]:
    """The message after which the culprit can be named, as (ids, last): the time of the decisive message
    is the latest publish of those ids when ``last``, else the earliest.

    * ib_port_down, ib_port_down_early, gpu_fell_off: the hardware finding itself: a message of the
      culprit's node, severity critical, not from nccl_logs, on the culprit's entity (a port or GPU; the
      storage NIC's DOWN port the simulator adds as noise may be on the same node and decides nothing);
      the earliest such (an Xid 79 comes as GPUXidError, GPUFatalXid and GPUFellOffBus);
    * hung_rank (and behind_rank): the last watchdog timeout (NCCLCollectiveTimeout) of the job: the hung
      rank is the one that never times out, known only once every other rank did;
    * socket_node: the culprit node's first membership message (NCCLJobMember) saying transport Socket:
      the others' say IB, and that is the fault; for this kind "first evidence" is that message too (the
      node's NCCLSocketFallback conditions come later, with the evidence).

    Every time is taken when the publish was acknowledged (the message is in the stream).
    """
    if want is None:
        return set(), False
    if kind in HARDWARE_KINDS:
        hw = [m for m in evidence if m["node"] == want["node"] and m["severity"] == "critical"
              and m["collector"] != "nccl_logs"]
        exact = [m for m in hw if m.get("entity") == want.get("entity")]
        return {m["id"] for m in (exact or hw)}, False
    if kind in ("hung_rank", "behind_rank"):
        return {m["id"] for m in evidence if m["type"] == "NCCLCollectiveTimeout"
                and (m.get("details") or {}).get("job") == job}, True
    if kind == "socket_node":
        return {m["id"] for m in members if m["node"] == want["node"]
                and (m.get("details") or {}).get("transport") == "Socket"}, False
    return set(), False


# ---------------------------------------------------------------------------------------------- NATS side

async def retry(what: str, make: Any, timeout: float = 60.0) -> Any:
    t0 = time.monotonic()
    while True:
        try:
            return await make()
        except Exception as exc:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{what}: not within {timeout} s: {exc!r}") from exc
            await asyncio.sleep(0.3)


class Publisher:
    """Publishes prepared messages, one coroutine per node (as every agent publishes its own); a publish
    that failed (no ack in time) is retried, for up to 60 s; in a cluster with a Nats-Msg-Id (the stream
    drops the copy of one that was stored but whose ack was lost in an election)."""

    def __init__(self, js: Any, *, dedupe: bool) -> None:
        self.js = js
        self.dedupe = dedupe
        self.published = 0
        self.retries = 0

    async def one(self, mid: str, subjects: list[str], data: bytes) -> None:
        for s in subjects:
            t0 = time.monotonic()
            while True:
                try:
                    if self.dedupe:
                        await self.js.publish(s, data, headers={"Nats-Msg-Id": f"{mid}:{s}"}, timeout=2.0)
                    else:
                        await self.js.publish(s, data)
                    break
                except Exception:
                    self.retries += 1
                    if time.monotonic() - t0 > 60:
                        raise
                    await asyncio.sleep(0.2)
        self.published += 1

    async def nodes(self, wire: dict[str, list[tuple[str, list[str], bytes]]], *,
                    stamps: dict[str, float] | None = None, watch: set[str] | frozenset[str] = frozenset()) -> None:
        async def node(ms: list[tuple[str, list[str], bytes]]) -> None:
            for mid, subs, data in ms:
                await self.one(mid, subs, data)
                if stamps is not None and mid in watch:
                    stamps[mid] = time.monotonic()  # acked: in the stream, the correlator may have it

        await asyncio.gather(*(node(ms) for ms in wire.values()))


class Incidents:
    """Every record on gna.incidents.>, per job, with when it arrived (monotonic)."""

    def __init__(self) -> None:
        self.by_job: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.total = 0
        self.changed = asyncio.Event()

    async def subscribe(self, nc: Any) -> None:
        async def on_incident(msg: Any) -> None:
            rec = json.loads(msg.data)
            self.add(rec)

        await nc.subscribe("gna.incidents.>", cb=on_incident)

    def add(self, rec: dict[str, Any], t: float | None = None) -> None:
        recs = self.by_job.setdefault(str(rec.get("job")), [])
        if any(r == rec for _t, r in recs):
            return  # the same record twice (heard, and read back from the KV)
        recs.append((time.monotonic() if t is None else t, rec))
        self.total += 1
        self.changed.set()

    def of(self, job: str) -> list[tuple[float, dict[str, Any]]]:
        return self.by_job.get(job, [])


def verdict(recs: list[tuple[float, dict[str, Any]]], want: dict[str, str] | None) -> dict[str, Any]:
    """What a fault's records say: first naming of the culprit's node, of the exact entity, a wrong blame,
    a withdrawal."""
    named = exact = wrong = None
    withdrawn = False
    last_culprit: float | None = None
    for t, r in sorted(recs, key=lambda x: x[0]):
        c = r.get("culprit")
        if c and r.get("status") == "open":
            if want is None or c.get("node") != want["node"]:
                wrong = wrong or f"blamed {c.get('node')} {c.get('entity')} ({c.get('kind')})"
            else:
                named = named if named is not None else t
                if exact is None and all(c.get(k) == v for k, v in want.items()):
                    exact = t
            last_culprit = t
        elif not c and last_culprit is not None and t - last_culprit <= WITHDRAW_S:
            withdrawn = True
    right = wrong is None and (exact is not None if want is not None else True)
    if wrong is None and want is not None and exact is None:
        wrong = "the exact entity never named" if named is not None else "no incident"
    return {"named_t": named, "exact_t": exact, "right": right, "why": None if right else wrong,
            "withdrawn": withdrawn, "records": len(recs)}


# ---------------------------------------------------------------------------------------------- the correlator

class Correlator:
    """One correlator process; its stderr read line by line: the stats lines, the incidents it wrote,
    and every warning or error it logged (counted by event)."""

    freeze_heap = True  # as the CLI runs it (fleet/heap.py); --no-freeze-heap: CPython's collections as they come
    trace_steps_ms = 0.0  # --trace-steps: log every loop step longer than this (bench/step_trace.py)
    trace_calls: tuple[str, ...] = ()  # --trace-call: functions timed inside the steps

    def __init__(self, servers: list[str], cwd: Path, *, stats_interval: float, partitions: int = 1,
                 partition: int = 0, replicas: int = 1, name: str = "correlator") -> None:
        self.cfg = {"servers": servers, "partitions": partitions, "partition": partition, "replicas": replicas,
                    "stats_interval": stats_interval, "freeze_heap": self.freeze_heap,
                    "trace_steps_ms": self.trace_steps_ms, "trace_calls": self.trace_calls}
        self.cwd = cwd
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self.stats: list[tuple[float, dict[str, Any]]] = []
        self.logged_incidents = 0
        self.problems: dict[str, int] = {}
        self.samples: dict[str, str] = {}
        self.other: list[str] = []  # lines that are not JSON (a traceback)
        self.timeline: list[tuple[float, str]] = []  # (monotonic, what) for the events TIMELINE lists
        self.slow_steps: list[dict[str, Any]] = []  # --trace-steps: the step tracer's lines
        self._reader: asyncio.Task[None] | None = None
        self.new_stats = asyncio.Event()
        self.killed = False
        self.cpu0 = 0.0  # CPU seconds when it was up (set by whoever waited for it)
        self.final: tuple[float, float] | None = None  # (CPU s, VmHWM MiB) just before it was stopped or killed

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRAPPER, json.dumps(self.cfg), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(self.cwd), limit=1 << 24,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self._reader = asyncio.get_running_loop().create_task(self._read())
        STARTED.append(self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                rec = json.loads(line)
            except ValueError:
                self.other = [*self.other[-40:], line]
                continue
            if not isinstance(rec, dict):
                continue
            ev = str(rec.get("event"))
            if ev == "correlator_stats":
                self.stats.append((time.monotonic(), rec))
                self.new_stats.set()
            elif ev == "incident":
                self.logged_incidents += 1
            elif ev in ("slow_step", "slow_call", "slow_gc"):
                if len(self.slow_steps) < 100_000:
                    self.slow_steps.append(rec)
                continue
            if rec.get("level") in ("warning", "error", "critical"):
                self.problems[ev] = self.problems.get(ev, 0) + 1
                self.samples.setdefault(ev, line[:400])
            if ev in TIMELINE and len(self.timeline) < 500:
                detail = {k: v for k, v in rec.items() if k not in ("event", "level", "timestamp")}
                self.timeline.append((time.monotonic(), f"{ev} {json.dumps(detail, default=str)[:160]}"))

    def last(self) -> dict[str, Any]:
        return self.stats[-1][1] if self.stats else {}

    async def stats_after(self, t: float, timeout: float) -> dict[str, Any] | None:
        """The first stats line logged after monotonic time ``t``."""
        got = await self.until(lambda _rec: True, timeout, since=t)
        return got[1] if got is not None else None

    async def until(self, pred: Any, timeout: float, since: float = 0.0) -> tuple[float, dict[str, Any]] | None:
        """The first stats line after ``since`` for which ``pred`` holds, with when it arrived."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for ts, rec in self.stats[seen:]:
                if ts > since and pred(rec):
                    return ts, rec
            seen = len(self.stats)
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                return None
            self.new_stats.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.new_stats.wait(), min(left, 0.5))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def cpu(self) -> float:
        if self.alive():
            with contextlib.suppress(OSError):
                return cpu_seconds(self.pid)
        return self.final[0] if self.final else float("nan")

    def hwm(self) -> float:
        if self.alive():
            with contextlib.suppress(OSError):
                return status_mib(self.pid, "VmHWM")
        return self.final[1] if self.final else float("nan")

    def _keep(self) -> None:
        if self.alive() and self.final is None:
            self.final = (self.cpu(), self.hwm())

    def stall_max(self, since: float = 0.0) -> tuple[float, float]:
        """(max loop_stall_max_ms: since the process started; max loop_stall_window_ms after ``since``)."""
        total = max((float(r.get("loop_stall_max_ms") or 0) for _t, r in self.stats), default=0.0)
        window = max((float(r.get("loop_stall_window_ms") or 0) for t, r in self.stats if t > since), default=0.0)
        return total, window

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self._keep()
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        return self.proc.returncode

    async def kill(self) -> None:
        """A replica's death: SIGKILL, no lease handed back."""
        assert self.proc is not None
        self.killed = True
        self._keep()
        self.proc.kill()
        await self.proc.wait()

    def problems_text(self) -> str:
        if not self.problems and not self.other:
            return ""
        out = ", ".join(f"{k} x{v} (first: {self.samples.get(k, '')[:240]})" for k, v in sorted(self.problems.items()))
        if self.other:
            out += f"; {len(self.other)} non-JSON lines, last: {self.other[-1][:200]}"
        return out


def digested(base: int, n: int) -> Any:
    """A stats line saying the correlator took in ``n`` messages more than ``base`` (see count)."""
    return lambda r: count(r) >= base + n


def count(r: dict[str, Any]) -> int:
    """Messages the correlator's followers handed it: accepted, rejected, or skipped unread (a replica
    skips another partition's job messages)."""
    return sum(int(r.get(k) or 0) for k in ("accepted", "rejected", "skipped"))


async def quiet(exc: Exception) -> None:
    """nats-py prints every error of a connection without an error callback."""


async def single_server(work: Path, name: str, args: argparse.Namespace) -> tuple[Any, Any, Any, Correlator]:
    """A fresh nats-server with the shipped streams, a fresh correlator, a connection: (server, nc, js, corr)."""
    server = NatsServerProcess(work / name)
    STARTED.append(server)
    server.start()
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, error_cb=quiet)
    js = nc.jetstream(timeout=10)
    for cfg in stream_configs(NatsConfig()):
        await js.add_stream(cfg)
    corr = Correlator([server.url], work, stats_interval=args.stats_interval)
    await corr.start()
    if await corr.until(lambda r: bool(r.get("judging")), 60) is None:
        raise RuntimeError(f"the correlator did not start judging within 60 s: {corr.problems_text()}")
    return server, nc, js, corr


def ms(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.0f}"


def secs(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def med_max(vals: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(vals), max(vals)) if vals else (None, None)


# ---------------------------------------------------------------------------------------------- fault watch

async def fault_outcome(inc: Incidents, p: Prepared, t0: float, t_decisive: float | None, until: float,
                        *, kv: Any = None, linger: float = WITHDRAW_S) -> dict[str, Any]:
    """Waits until the culprit's exact entity was named and ``linger`` s passed after the first naming (or
    ``until``), then judges the job's records (a caller that lingers less judges them again later: see
    rejudge). With ``kv``, the gna-incidents KV is polled too (a record published while this connection
    was reconnecting is in the KV)."""
    token = encode_token(p.job)
    last_kv: bytes | None = None
    last_poll = 0.0
    while True:
        v = verdict(inc.of(p.job), p.want)
        now = time.monotonic()
        if p.want is not None and v["exact_t"] is not None and now >= (v["named_t"] or now) + linger:
            break
        if now >= until:
            break
        if kv is not None and now - last_poll > 0.25:
            last_poll = now
            with contextlib.suppress(Exception):
                e = await kv.get(token)
                if e is not None and e.value and e.value != last_kv:
                    last_kv = e.value
                    inc.add(json.loads(e.value))
        inc.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(inc.changed.wait(), 0.25)
    v = verdict(inc.of(p.job), p.want)
    return {"job": p.job, "kind": p.meta["kind"], "nodes": p.meta["nodes"], "ranks": p.meta["ranks"],
            "right": v["right"], "why": v["why"], "withdrawn": v["withdrawn"], "records": v["records"],
            "history": history(inc, p.job, t0),
            "first_evidence_s": None if v["named_t"] is None else v["named_t"] - t0,
            "exact_s": None if v["exact_t"] is None else v["exact_t"] - t0,
            "after_decisive_s": None if v["named_t"] is None or t_decisive is None else v["named_t"] - t_decisive}


async def publish_fault(pub: Publisher, p: Prepared, stamps: dict[str, float]) -> tuple[float, float | None]:
    """The job's evidence, every node at once: (when the first was published, when the decisive one was).
    ``stamps``: the ack times of decisive messages published before (the membership's, for socket_node)."""
    t0 = time.monotonic()
    await pub.nodes(p.evidence_wire, stamps=stamps, watch=p.decisive_ids)
    mine = [stamps[i] for i in p.decisive_ids if i in stamps]
    if not mine:
        return t0, None
    t_dec = max(mine) if p.decisive_last else min(mine)
    return (t_dec if p.in_membership else t0), t_dec


def rejudge(r: dict[str, Any], inc: Incidents, p: Prepared, t0: float, t_decisive: float | None,
            deadline: float) -> None:
    """A fault judged again from every record its job got by now: a culprit named only after the fault's
    wait was over is not right (``late``), whatever its latency."""
    v = verdict(inc.of(p.job), p.want)
    late = v["named_t"] is not None and v["named_t"] > deadline
    r.update({"right": v["right"] and not late, "withdrawn": v["withdrawn"], "records": v["records"], "late": late,
              "history": history(inc, p.job, t0),
              "why": f"named only {v['named_t'] - t0:.1f} s after its first evidence" if late and v["right"]
              else v["why"],
              "first_evidence_s": None if v["named_t"] is None else v["named_t"] - t0,
              "exact_s": None if v["exact_t"] is None else v["exact_t"] - t0,
              "after_decisive_s": None if v["named_t"] is None or t_decisive is None else v["named_t"] - t_decisive})


def history(inc: Incidents, job: str, t0: float) -> list[list[Any]]:
    """The job's records in short: [s after t0, status, culprit's node and entity or None, evidence_total]."""
    out = []
    for t, r in sorted(inc.of(job), key=lambda x: x[0])[:20]:
        c = r.get("culprit")
        out.append([round(t - t0, 3), r.get("status"), f"{c.get('node')} {c.get('entity')}" if c else None,
                    r.get("evidence_total")])
    return out


def fault_line(prefix: str, r: dict[str, Any]) -> str:
    res = "right" if r["right"] else f"WRONG ({r['why']})"
    line = (f"{prefix}{r['kind']:18} {r['nodes']:5} nodes / {r['ranks']:6} ranks: first evidence -> culprit's node "
            f"{ms(r['first_evidence_s']):>6} ms, after decisive {ms(r['after_decisive_s']):>6} ms, exact entity "
            f"{ms(r['exact_s']):>6} ms; {res}{', WITHDRAWN' if r['withdrawn'] else ''}; {r['records']} records")
    if (not r["right"] or r["withdrawn"]) and r.get("history"):
        line += f"\n      records (s after the first evidence, status, culprit, evidence): {r['history']}"
    return line


# ---------------------------------------------------------------------------------------------- one-job

async def one_job_trial(work: Path, p: Prepared, i: int, args: argparse.Namespace) -> dict[str, Any]:
    server, nc, js, corr = await single_server(work, f"nats-{i}", args)
    try:
        inc = Incidents()
        await inc.subscribe(nc)
        pub = Publisher(js, dedupe=False)
        base = count(corr.last())
        cpu0, hwm0 = corr.cpu(), corr.hwm()
        nats_cpu0 = cpu_seconds(server.proc.pid) if server.proc else 0.0
        n_members = p.read("members")
        stamps: dict[str, float] = {}
        tm = time.monotonic()
        await pub.nodes(p.member_wire, stamps=stamps, watch=p.decisive_ids)
        members_pub_s = time.monotonic() - tm
        got = await corr.until(digested(base, n_members), args.digest_max, since=tm)
        digest_s = None if got is None else got[0] - tm
        cpu1 = corr.cpu()
        base = count(corr.last())
        early = sum(1 for _t, r in inc.of(p.job) if r.get("culprit"))  # named from membership alone
        t0, t_dec = await publish_fault(pub, p, stamps)
        pub_s = time.monotonic() - t0
        r = await fault_outcome(inc, p, t0, t_dec, time.monotonic() + args.timeout)
        n_ev = p.read("evidence")
        t_end = time.monotonic()
        await corr.stats_after(t_end, args.stats_interval + 5)
        got = next(((t, s) for t, s in corr.stats if t > t0 and count(s) >= base + n_ev), None)
        last = corr.last()
        stall_total, stall_window = corr.stall_max(since=tm)
        hwm = corr.hwm()
        ranks = int(last.get("members") or 0)
        r.update({
            "members_published_s": members_pub_s, "digest_members_s": digest_s, "evidence_published_s": pub_s,
            "digest_evidence_s": None if got is None else got[0] - t0, "early_culprit_records": early,
            "cpu_members_s": cpu1 - cpu0, "cpu_evidence_s": corr.cpu() - cpu1,
            "nats_cpu_s": (cpu_seconds(server.proc.pid) if server.proc else 0.0) - nats_cpu0,
            **held(last, hwm, hwm0, ranks, stall_total, stall_window),
            "publish_pending": last.get("publish_pending"), "correlator_problems": corr.problems_text()})
        return r
    finally:
        await shut(nc, corr, server, "    ")
        shutil.rmtree(work / f"nats-{i}", ignore_errors=True)


async def shut(nc: Any, corr: Any, server: Any, indent: str) -> None:
    """A trial's connection, correlator and nats-server stopped (a correlator's failure said)."""
    await nc.close()
    rc = await corr.stop()
    if rc not in (0, None):
        print(f"{indent}the correlator exited {rc}: {corr.problems_text()}", flush=True)
    server.stop()


def held(last: dict[str, Any], hwm: float, hwm0: float, ranks: int, stall_total: Any,
         stall_window: Any) -> dict[str, Any]:
    """What a correlator held and did, from its last stats line and its VmHWM (one-job and many-jobs)."""
    return {"hwm_mib": hwm, "hwm_delta_mib": hwm - hwm0, "ranks_held": ranks,
            "processes_held": last.get("processes_held"),
            "kib_per_rank": (hwm - hwm0) * 1024 / ranks if ranks else None,
            "stall_max_ms": stall_total, "stall_window_ms": stall_window,
            # of the longest stall, at most this much was the correlator's own CPU (the rest: waiting for a core)
            "stall_cpu_max_ms": last.get("loop_stall_cpu_max_ms"),
            # CPython's longest cyclic collection in the correlator, and how many full ones (gc.callbacks)
            "gc_max_ms": last.get("gc_max_ms"), "gc_full": last.get("gc_full"),
            # fleet/heap.py: how often the state was frozen out of full collections, the longest such pass
            "gc_freezes": last.get("gc_freezes"), "gc_freeze_ms_max": last.get("gc_freeze_ms_max"),
            "gc_frozen": last.get("gc_frozen"),
            "published": last.get("published"), "publish_same": last.get("publish_same"),
            "publish_retries": last.get("publish_retries"), "rejected": last.get("rejected"),
            "refused": last.get("refused"), "dropped_jobs": last.get("dropped_jobs")}


def one_job_specs(args: argparse.Namespace, size: int, si: int) -> list[dict[str, Any]]:
    # node names are gpu-<seed % 1000>-<i>: a seed of its own per (size, kind)
    return [{"seed": args.seed + 10 * si + ki, "nodes": size, "kind": kind} for ki, kind in enumerate(args.kinds)]


def summarize(rows: list[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in groups.items():
        lat = [r["first_evidence_s"] for r in rs if r["right"] and r["first_evidence_s"] is not None]
        dec = [r["after_decisive_s"] for r in rs if r["right"] and r["after_decisive_s"] is not None]
        (m1, x1), (m2, x2) = med_max(lat), med_max(dec)

        def mx(f: str, rs: list[dict[str, Any]] = rs) -> float | None:
            vals = [r[f] for r in rs if isinstance(r.get(f), (int, float)) and not math.isnan(r[f])]
            return max(vals) if vals else None

        out.append({"group": k, "right": sum(r["right"] for r in rs), "total": len(rs),
                    "withdrawn": sum(r["withdrawn"] for r in rs),
                    "median_first_evidence_s": m1, "max_first_evidence_s": x1,
                    "median_after_decisive_s": m2, "max_after_decisive_s": x2,
                    "max_digest_members_s": mx("digest_members_s"), "max_cpu_members_s": mx("cpu_members_s"),
                    "max_cpu_evidence_s": mx("cpu_evidence_s"), "peak_rss_mib": mx("hwm_mib"),
                    "max_stall_ms": mx("stall_max_ms"), "max_stall_window_ms": mx("stall_window_ms"),
                    "kib_per_rank": mx("kib_per_rank")})
    return out


def print_table(title: str, summary: list[dict[str, Any]], *, resources: bool = True) -> None:
    """``resources``: the correlator's columns too (one-job: one correlator per trial; the other modes
    print theirs for the whole run)."""
    print(f"\n{title}")
    print(f"{'':28} {'right':>7} {'wdrawn':>6} {'med/max first ev ms':>20} {'med/max after dec ms':>21}"
          + (f" {'digest s':>8} {'cpu mem s':>9} {'cpu ev s':>8} {'RSS MiB':>8} {'stall ms':>9} {'KiB/rank':>8}"
             if resources else ""))
    for s in summary:
        print(f"{s['group']!s:28} {s['right']:>3}/{s['total']:<3} {s['withdrawn']:>6} "
              f"{ms(s['median_first_evidence_s']):>9} /{ms(s['max_first_evidence_s']):>8}  "
              f"{ms(s['median_after_decisive_s']):>10} /{ms(s['max_after_decisive_s']):>8}"
              + (f"  {secs(s['max_digest_members_s']):>8} {secs(s['max_cpu_members_s']):>9} "
                 f"{secs(s['max_cpu_evidence_s']):>8} {secs(s['peak_rss_mib']):>8} "
                 f"{secs(s['max_stall_ms']):>9} {secs(s['kib_per_rank']):>8}" if resources else ""))


def run_one_job(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    gen: list[dict[str, Any]] = []
    for si, size in enumerate(args.sizes):
        print(f"\n{size} nodes ({size * 8} ranks): scenarios", flush=True)
        metas = build_all(one_job_specs(args, size, si), args, work)
        gen += [{k: m[k] for k in ("kind", "nodes", "messages", "gen_s", "collect_s", "cached")} for m in metas]

        async def trials(metas: list[dict[str, Any]] = metas, size: int = size) -> None:
            prepared = [Prepared(m) for m in metas]
            for t in range(args.trials):
                for p in prepared:
                    r = await one_job_trial(work, p, len(rows), args)
                    r["trial"] = t
                    rows.append(r)
                    print(fault_line(f"  trial {t} ", r) + f"; members digested in {secs(r['digest_members_s'])} s"
                          f", CPU {secs(r['cpu_members_s'])}+{secs(r['cpu_evidence_s'])} s, RSS "
                          f"{secs(r['hwm_mib'])} MiB, stall {secs(r['stall_max_ms'])} ms"
                          + (f"; logged: {r['correlator_problems']}" if r["correlator_problems"] else ""),
                          flush=True)

        asyncio.run(trials())
        for m in metas:
            if not m["cached"]:
                Path(m["out"]).unlink(missing_ok=True)
    summary = summarize(rows, lambda r: f"{r['nodes']} nodes {r['kind']}")
    summary += summarize(rows, lambda r: f"{r['nodes']} nodes, all kinds")
    print_table("one job; first evidence on NATS -> incident naming the culprit's node (medians and maxima "
                "over the right trials; the rest: maxima)", summary)
    return {"summary": summary, "trials": rows, "scenarios": gen}


# ---------------------------------------------------------------------------------------------- many-jobs

def job_sizes(args: argparse.Namespace) -> list[int]:
    """--jobs sizes, log-uniform in [--job-min, --job-max], scaled to --fleet-nodes in all (seeded)."""
    rng = random.Random(args.seed)
    raw = [math.exp(rng.uniform(math.log(args.job_min), math.log(args.job_max))) for _ in range(args.jobs)]
    f = args.fleet_nodes / sum(raw)
    return [max(args.job_min_clamp, min(args.job_max, round(x * f))) for x in raw]


def many_specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed + 1)
    sizes = job_sizes(args)
    faulty = set(rng.sample(range(len(sizes)), k=min(args.faults, len(sizes))))
    kinds = iter(args.kinds * (args.faults // len(args.kinds) + 1))
    # seed % 1000 names the nodes (gpu-<seed % 1000>-<i>): one residue per job keeps every job on nodes of its own
    return [{"seed": args.seed * 1000 + i, "nodes": n, "kind": next(kinds) if i in faulty else "healthy"}
            for i, n in enumerate(sizes)]


async def many_jobs_async(args: argparse.Namespace, work: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    prepared = [Prepared(m) for m in metas]
    faults = [p for p in prepared if p.want is not None]
    healthy = [p for p in prepared if p.want is None]
    server, nc, js, corr = await single_server(work, "nats", args)
    try:
        inc = Incidents()
        await inc.subscribe(nc)
        pub = Publisher(js, dedupe=False)
        n_members = sum(p.read("members") for p in prepared)
        n_noise = sum(p.read("evidence") for p in healthy)
        base = count(corr.last())
        cpu0, hwm0 = corr.cpu(), corr.hwm()
        results: list[dict[str, Any]] = []
        fault_tasks: list[asyncio.Task[dict[str, Any]]] = []

        stamps: dict[str, float] = {}
        watch = {i for p in faults for i in p.decisive_ids}

        async def one_fault(p: Prepared) -> dict[str, Any]:
            t0, t_dec = await publish_fault(pub, p, stamps)
            return await fault_outcome(inc, p, t0, t_dec, time.monotonic() + args.timeout)

        tm = time.monotonic()
        all_members: dict[str, list[tuple[str, list[str], bytes]]] = {}
        for p in faults + healthy:  # the faulty jobs' first: their membership is in before their faults
            for node, m in p.member_wire.items():
                all_members.setdefault(node, []).extend(m)
        noise: dict[str, list[tuple[str, list[str], bytes]]] = {}
        for p in healthy:
            for node, m in p.evidence_wire.items():
                noise.setdefault(node, []).extend(m)
        if not args.fleet_start:
            await pub.nodes(all_members, stamps=stamps, watch=watch)
            members_pub_s = time.monotonic() - tm
            got = await corr.until(digested(base, n_members), args.digest_max, since=tm)
            digest_s = None if got is None else got[0] - tm
            await pub.nodes(noise)
            got2 = await corr.until(digested(base, n_members + n_noise), args.digest_max, since=tm)
            noise_s = None if got2 is None else got2[0] - tm
            cpu1, hwm1 = corr.cpu(), corr.hwm()
            print(f"  steady state: {len(prepared)} jobs, {n_members} members published in {members_pub_s:.1f} s, "
                  f"digested in {secs(digest_s)} s; {n_noise} noise messages, all digested {secs(noise_s)} s "
                  f"after the first member; CPU {cpu1 - cpu0:.1f} s, RSS {hwm1:.0f} MiB", flush=True)
            tf = time.monotonic()
            for p in faults:
                fault_tasks.append(asyncio.get_running_loop().create_task(one_fault(p)))
                await asyncio.sleep(args.fault_gap)
        else:
            flood_total = sum(len(ms) for ms in all_members.values()) + sum(len(ms) for ms in noise.values())

            async def flood() -> None:
                await pub.nodes(all_members, stamps=stamps, watch=watch)
                await pub.nodes(noise)

            cpu1 = float("nan")  # membership and faults together: one phase
            ft = asyncio.get_running_loop().create_task(flood())
            while pub.published < flood_total * args.inject_at and not ft.done():
                await asyncio.sleep(0.01)
            tf = time.monotonic()
            print(f"  fleet start: {pub.published}/{flood_total} of the flood published after {tf - tm:.1f} s: "
                  f"{len(faults)} faults injected", flush=True)
            fault_tasks = [asyncio.get_running_loop().create_task(one_fault(p)) for p in faults]
            await ft
            members_pub_s = time.monotonic() - tm
            n_fault_ev = sum(p.read("evidence") for p in faults)
            got = await corr.until(digested(base, n_members + n_noise + n_fault_ev), args.digest_max, since=tm)
            digest_s = noise_s = None if got is None else got[0] - tm
            print(f"  the flood ({n_members} members, {n_noise} noise, {n_fault_ev} faults' evidence) published in "
                  f"{members_pub_s:.1f} s, digested {secs(digest_s)} s after its start", flush=True)
        for fut in asyncio.as_completed(fault_tasks):
            r = await fut
            results.append(r)
            print(fault_line("  fault ", r), flush=True)
        await asyncio.sleep(WITHDRAW_S)  # late records of the healthy jobs
        t_end = time.monotonic()
        await corr.stats_after(t_end, args.stats_interval + 5)
        fp = {p.job: verdict(inc.of(p.job), None)["why"] for p in healthy if verdict(inc.of(p.job), None)["why"]}
        last = corr.last()
        stall_total, stall_window = corr.stall_max(since=tm)
        hwm = corr.hwm()
        ranks = int(last.get("members") or 0)
        fleet = {"jobs": len(prepared), "nodes": sum(p.meta["nodes"] for p in prepared),
                 "ranks": sum(p.meta["ranks"] for p in prepared), "members_published": n_members,
                 "members_published_s": members_pub_s, "digest_members_s": digest_s, "digest_all_s": noise_s,
                 "cpu_members_s": cpu1 - cpu0, "cpu_faults_s": corr.cpu() - cpu1, "cpu_total_s": corr.cpu() - cpu0,
                 **held(last, hwm, hwm0, ranks, stall_total, stall_window), "jobs_held": last.get("jobs"),
                 "faults_since_s": t_end - tf,
                 "healthy_blamed": len(fp), "healthy_blamed_sample": dict(list(fp.items())[:5]),
                 "correlator_problems": corr.problems_text(), "incident_records": inc.total}
        return {"fleet": fleet, "faults": results}
    finally:
        await shut(nc, corr, server, "  ")


def run_many_jobs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    specs = many_specs(args)
    print(f"\n{len(specs)} jobs, {sum(s['nodes'] for s in specs)} nodes: scenarios", flush=True)
    metas = build_all(specs, args, work)
    gen = {"scenarios": len(metas), "gen_s": round(sum(m["gen_s"] for m in metas), 1),
           "collect_s": round(sum(m["collect_s"] for m in metas), 1), "cached": sum(m["cached"] for m in metas)}
    out = asyncio.run(many_jobs_async(args, work, metas))
    f, rows = out["fleet"], out["faults"]
    summary = summarize(rows, lambda r: r["kind"]) + summarize(rows, lambda r: "all faults")
    print_table(f"{f['jobs']} jobs on {f['nodes']} nodes ({f['ranks']} ranks), "
                f"{'fleet start' if args.fleet_start else 'steady state'}; faults (latency: first evidence -> "
                f"incident naming the culprit's node)", summary, resources=False)
    print(f"membership: {f['members_published']} members published in {secs(f['members_published_s'])} s, digested "
          f"in {secs(f['digest_members_s'])} s (stats every {args.stats_interval:g} s); correlator CPU "
          f"{secs(f['cpu_total_s'])} s (membership {secs(f['cpu_members_s'])} s, the rest {secs(f['cpu_faults_s'])} s)"
          f", peak RSS "
          f"{secs(f['hwm_mib'])} MiB ({secs(f['kib_per_rank'])} KiB a rank over {f['ranks_held']} ranks held), "
          f"max loop stall {secs(f['stall_max_ms'])} ms (measured phases: {secs(f['stall_window_ms'])} ms; "
          f"the correlator's own CPU in a stall at most {secs(f['stall_cpu_max_ms'])} ms; its longest garbage "
          f"collection {secs(f['gc_max_ms'])} ms, {f['gc_full']} full ones; the state frozen {f['gc_freezes']} times, "
          f"the longest collect-and-freeze {secs(f['gc_freeze_ms_max'])} ms, {f['gc_frozen']} objects frozen); "
          f"healthy jobs blamed: {f['healthy_blamed']}"
          + (f"; logged: {f['correlator_problems']}" if f["correlator_problems"] else ""))
    for m in metas:
        if not m["cached"]:
            Path(m["out"]).unlink(missing_ok=True)
    return {"summary": summary, "fleet": f, "faults": rows, "generation": gen}


# ---------------------------------------------------------------------------------------------- replicas

async def replicas_async(args: argparse.Namespace, work: Path, metas: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The same fleet's membership and healthy traffic digested by ``n`` partitioned replicas on one fresh
    nats-server: what each replica was handed (the server splits the jobs stream by bucket), its CPU and RSS."""
    prepared = [Prepared(m) for m in metas]
    server = NatsServerProcess(work / f"nats-r{n}")
    STARTED.append(server)
    server.start()
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, error_cb=quiet)
    js = nc.jetstream(timeout=10)
    for cfg in stream_configs(NatsConfig()):
        await js.add_stream(cfg)
    corrs = [Correlator([server.url], work, stats_interval=args.stats_interval, partitions=n, partition=q,
                        name=f"replica {q}") for q in range(n)]
    try:
        for c in corrs:
            await c.start()
        for q, c in enumerate(corrs):
            if await c.until(lambda r, q=q: bool(r.get("judging")) and q in (r.get("owned") or []), 60) is None:
                raise RuntimeError(f"replica {q} did not hold its partition within 60 s: {c.problems_text()}")
        cpu0 = [c.cpu() for c in corrs]
        base = [count(c.last()) for c in corrs]
        pub = Publisher(js, dedupe=False)
        wire: dict[str, list[tuple[str, list[str], bytes]]] = {}
        for p in prepared:
            for part in (p.member_wire, p.evidence_wire):
                for node, m in part.items():
                    wire.setdefault(node, []).extend(m)
        tm = time.monotonic()
        await pub.nodes(wire)
        published_s = time.monotonic() - tm
        # digested: every replica's count unchanged over two stats lines after the last publish
        seen: list[int] = [-1] * n
        deadline = time.monotonic() + args.digest_max
        while time.monotonic() < deadline:
            await asyncio.sleep(2 * args.stats_interval + 0.5)
            now = [count(c.last()) for c in corrs]
            if now == seen:
                break
            seen = now
        digest_s = time.monotonic() - tm - 2 * args.stats_interval - 0.5
        rows = []
        for q, c in enumerate(corrs):
            last = c.last()
            rows.append({"replica": q, "handed": count(last) - base[q], "accepted": last.get("accepted"),
                         "skipped": last.get("skipped"), "rejected": last.get("rejected"),
                         "jobs": last.get("jobs"), "members": last.get("members"),
                         "cpu_s": round(c.cpu() - cpu0[q], 2), "hwm_mib": round(c.hwm(), 1),
                         "stall_max_ms": last.get("loop_stall_max_ms")})
        return {"replicas": n, "published": pub.published, "published_s": round(published_s, 1),
                "digest_s": round(digest_s, 1), "rows": rows}
    finally:
        await nc.close()
        for c in corrs:
            await c.stop()
        server.stop()


def run_replicas(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    specs = many_specs(args)
    specs = [{**s, "kind": "healthy"} for s in specs]
    print(f"\n{len(specs)} healthy jobs, {sum(s['nodes'] for s in specs)} nodes: scenarios", flush=True)
    metas = build_all(specs, args, work)
    runs = []
    for n in args.replicas:
        r = asyncio.run(replicas_async(args, work, metas, n))
        runs.append(r)
        print(f"  {n} replica(s): {r['published']} messages published in {r['published_s']} s, digested "
              f"{r['digest_s']} s after the first", flush=True)
        for row in r["rows"]:
            print(f"    replica {row['replica']}: handed {row['handed']} (accepted {row['accepted']}, skipped "
                  f"{row['skipped']}), jobs {row['jobs']}, members {row['members']}, CPU {row['cpu_s']} s, "
                  f"RSS {row['hwm_mib']} MiB, longest stall {row['stall_max_ms']} ms", flush=True)
    base = runs[0]
    b_handed = max(x["handed"] for x in base["rows"])
    b_cpu = max(x["cpu_s"] for x in base["rows"])
    b_hwm = max(x["hwm_mib"] for x in base["rows"])
    print(f"\nper replica, against {base['replicas']} replica(s) in this invocation (the busiest replica; partition 0 "
          f"also reads every job's membership for the straggler watch):")
    print("| replicas | handed (max) | ratio | CPU s (max) | ratio | RSS MiB (max) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        h = max(x["handed"] for x in r["rows"])
        c = max(x["cpu_s"] for x in r["rows"])
        m = max(x["hwm_mib"] for x in r["rows"])
        print(f"| {r['replicas']} | {h} | {h / b_handed:.2f} | {c:.1f} | {c / b_cpu:.2f} | {m:.0f} | {m / b_hwm:.2f} |")
    for m in metas:
        if not m["cached"]:
            Path(m["out"]).unlink(missing_ok=True)
    return {"runs": runs}


# ---------------------------------------------------------------------------------------------- cluster

def cluster_plan(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """(phase, partition or None: any) for every fault the cluster mode publishes, in order."""
    v = args.victim
    plan: list[tuple[str, int | None]] = [("baseline", p) for p in range(PARTITIONS)]
    plan += [("replica+server killed", v), ("both back", v)]
    for i in range(3):
        plan += [(f"server {i} down", p) for p in range(PARTITIONS)]
        plan += [(f"server {i} back", (i + 1) % PARTITIONS)]
    return plan


def cluster_scenarios(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Scenarios until every partition has the faults the plan needs (a job's partition is its commId's
    hash: known once generated)."""
    need = [0] * PARTITIONS
    for _ph, p in cluster_plan(args):
        need[p if p is not None else 0] += 1
    have: list[list[dict[str, Any]]] = [[] for _ in range(PARTITIONS)]
    seed = args.seed
    batch = max(1, args.gen_workers)
    # not socket_node: its fault is in the membership, and every job's membership is published before any loss
    kinds = [k for k in args.kinds if k != "socket_node"] or ["ib_port_down"]
    while any(len(have[p]) < need[p] for p in range(PARTITIONS)):
        specs = [{"seed": seed + i, "nodes": args.nodes, "kind": kinds[(seed + i) % len(kinds)]}
                 for i in range(batch)]
        seed += batch
        if seed - args.seed > 1000:
            raise RuntimeError("no scenarios for every partition within 1,000 seeds")
        for m in build_all(specs, args, work):
            p = owner(m["job"], PARTITIONS)
            if len(have[p]) < need[p]:
                have[p].append(m)
            elif not m["cached"]:
                Path(m["out"]).unlink(missing_ok=True)
    return [m for ms in have for m in ms]


async def kv_versions(js: Any, job: str) -> list[dict[str, Any]]:
    """Every record the gna-incidents KV holds for the job (its history: one entry per write)."""
    try:
        return await incident_versions(js, job)
    except Exception:
        return []


def duplicates(versions: list[dict[str, Any]]) -> int:
    keys = [(v.get("status"), json.dumps(v.get("culprit"), sort_keys=True), tuple(v.get("victims") or ()),
             v.get("evidence_total")) for v in versions]
    return len(keys) - len(set(keys))


async def cluster_async(args: argparse.Namespace, work: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    pool: dict[int, list[Prepared]] = {p: [] for p in range(PARTITIONS)}
    for m in metas:
        pool[owner(m["job"], PARTITIONS)].append(Prepared(m))
    cluster = NatsCluster(work / "cluster", size=3)
    STARTED.extend(cluster.servers)
    cluster.start()
    replicas: dict[int, Correlator] = {}
    retired: list[Correlator] = []
    nc = None
    rows: list[dict[str, Any]] = []
    events: list[tuple[float, str]] = []
    t_start = time.monotonic()

    def event(what: str) -> None:
        events.append((time.monotonic(), f"bench: {what}"))
        print(f"  {what}", flush=True)

    client_errors: list[str] = []

    async def on_error(exc: Exception) -> None:  # this bench's own connection (nats-py prints them otherwise)
        client_errors.append(repr(exc)[:200])

    try:
        nc = await nats.connect(cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2,
                                error_cb=on_error)
        js = nc.jetstream(timeout=5)
        for cfg in stream_configs(NatsConfig(stream_replicas=3)):
            await retry(f"stream {cfg.name}", lambda c=cfg: js.add_stream(c))
        inc = Incidents()
        await inc.subscribe(nc)
        pub = Publisher(js, dedupe=True)

        def replica(p: int, gen: int) -> Correlator:
            return Correlator(cluster.urls, work, stats_interval=args.stats_interval, partitions=PARTITIONS,
                              partition=p, replicas=3, name=f"replica {p}" + (f" (restart {gen})" if gen else ""))

        for p in range(PARTITIONS):
            replicas[p] = replica(p, 0)
            await replicas[p].start()
        for p, c in replicas.items():
            if await c.until(lambda r, p=p: bool(r.get("judging")) and p in (r.get("owned") or []), 60) is None:
                raise RuntimeError(f"replica {p} did not hold its partition within 60 s: {c.problems_text()}")
        # every job runs before its fault: all the jobs' membership first, digested by its own replica (the
        # server hands a replica only its partitions' jobs; partition 0's holder every job's membership, for the
        # straggler watch), so a replica that takes a partition over, or loses and regains its lease, has to
        # rebuild the job from the stream's history
        n_members = sum(pj.read("members") for ps in pool.values() for pj in ps)
        own = {q: n_members if q == 0 else sum(pj.read("members") for ps in pool.values() for pj in ps
                                              if owner(pj.job, PARTITIONS) == q) for q in replicas}
        base = {q: count(c.last()) for q, c in replicas.items()}
        tm = time.monotonic()
        member_stamps: dict[str, dict[str, float]] = {}
        for ps in pool.values():
            for pj in ps:
                member_stamps[pj.job] = {}
                await pub.nodes(pj.member_wire, stamps=member_stamps[pj.job], watch=pj.decisive_ids)
        for q, c in replicas.items():
            if await c.until(digested(base[q], own[q]), args.digest_max, since=tm) is None:
                last = c.last()
                print(f"  replica {q} did not digest the {n_members} members within {args.digest_max:g} s: accepted "
                      f"{last.get('accepted')} (before: {base[q]}), rejected {last.get('rejected')}, followers "
                      f"{last.get('followers')}", flush=True)
        event(f"{sum(len(ps) for ps in pool.values())} jobs' membership ({n_members} messages) published and digested "
              f"in {time.monotonic() - tm:.1f} s")
        for c in replicas.values():
            c.cpu0 = c.cpu()
        kv: Any = None  # the gna-incidents KV: created with the first incident, looked up when needed
        by_job: dict[str, tuple[Prepared, float, float | None, float]] = {}  # job: (fault, t0, decisive, deadline)

        async def fault(phase: str, part: int, note: float | None = None) -> dict[str, Any]:
            nonlocal kv
            p = pool[part].pop(0)
            if kv is None:
                with contextlib.suppress(Exception):
                    kv = await js.key_value(INCIDENTS_BUCKET)
            retries0, tp = pub.retries, time.monotonic()
            t0, t_dec = await publish_fault(pub, p, member_stamps[p.job])
            published_s = time.monotonic() - tp
            # the next phase starts as soon as the culprit is named: withdrawals are looked for at the end
            deadline = time.monotonic() + args.timeout
            r = await fault_outcome(inc, p, t0, t_dec, deadline, kv=kv, linger=0.0)
            by_job[p.job] = (p, t0, t_dec, deadline)
            r.update({"phase": phase, "partition": part, "since_kill_s": None if note is None else
                      (r["first_evidence_s"] + t0 - note if r["first_evidence_s"] is not None else None),
                      "published_s": published_s, "publish_retries": pub.retries - retries0})
            rows.append(r)
            extra = f", {secs(r['since_kill_s'])} s after the kill" if r["since_kill_s"] is not None else ""
            extra += f"; its messages published in {published_s:.2f} s ({r['publish_retries']} publishes retried)"
            print(fault_line(f"  {phase:22} p{part} ", r) + extra, flush=True)
            return r

        def meta_leader() -> str | None:
            """The JetStream meta leader (it creates every consumer), as the servers' own logs last named it:
            ``JetStream cluster new metadata leader: <server>/<cluster>`` on the others, ``Self is new
            JetStream cluster metadata leader`` on itself (nats-server server/jetstream_cluster.go). No
            account but the system account can ask for it."""
            best: tuple[str, str | None] = ("", None)
            for srv in cluster.servers:
                with contextlib.suppress(OSError):
                    for line in (srv.store_dir / "nats-server.log").read_text(errors="replace").splitlines():
                        if "metadata leader" not in line or not (m := META_LINE.match(line)):
                            continue
                        name = m.group(2) or (srv.name if m.group(3) else None)
                        if m.group(1) >= best[0]:
                            best = (m.group(1), name)
            return best[1]

        async def led_by(i: int) -> list[str]:
            """The streams and buckets whose leader is server ``i``, and ``meta`` when it leads JetStream's meta
            group (a leader's death costs its raft group an election: 4-9 s in nats-server's server/raft.go,
            during which nothing is stored, answered or, for the meta group, created)."""
            out = ["meta"] if meta_leader() == cluster.servers[i].name else []
            for name in (*(c.name for c in stream_configs(NatsConfig(stream_replicas=3))),
                         f"KV_{INCIDENTS_BUCKET}", f"KV_{LEASES_BUCKET}"):
                with contextlib.suppress(Exception):
                    info = await js.stream_info(name)
                    if info.cluster is not None and info.cluster.leader == cluster.servers[i].name:
                        out.append(name)
            return out

        for _ph, part in cluster_plan(args)[:PARTITIONS]:
            await fault("baseline", part if part is not None else 0)
        await asyncio.sleep(2.5)  # the survivors have seen every replica alive since
        v = args.victim
        holder = next((q for q, c in replicas.items() if v in (c.last().get("owned") or [])), v)
        if args.kill_server == "leases-only":  # its leader must not be the meta leader (only that is kept)
            for _ in range(10):
                lead = [i for i in range(3) if f"KV_{LEASES_BUCKET}" in await led_by(i)]
                if lead and cluster.servers[lead[0]].name != meta_leader():
                    break
                with contextlib.suppress(Exception):
                    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.KV_{LEASES_BUCKET}", b"", timeout=5)
                await asyncio.sleep(1.0)
        if args.kill_server in ("leases", "leases-only"):  # the worst case for a takeover: the bucket elects too
            leaders = [i for i in range(3) if f"KV_{LEASES_BUCKET}" in await led_by(i)]
            srv = leaders[0] if leaders else 0
        elif args.kill_server == "none":  # a server that does not lead the meta group (it cannot be stepped down)
            srv = next((i for i in range(3) if cluster.servers[i].name != meta_leader()), 0)
        else:
            srv = int(args.kill_server)
        if args.kill_server in ("leases-only", "none"):
            # the correlator's own failover, apart from the elections a leader's death costs: every other
            # stream and bucket the server leads is handed to another server first (a leader stepdown)
            keep = {f"KV_{LEASES_BUCKET}", "meta"} if args.kill_server == "leases-only" else {"meta"}
            for _ in range(10):
                extra = [n for n in await led_by(srv) if n not in keep]
                if not extra:
                    break
                for n in extra:
                    with contextlib.suppress(Exception):
                        await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{n}", b"", timeout=5)
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)  # consumers moved with their leaders: the followers settle first
        led = await led_by(srv)
        t_kill = time.monotonic()
        await replicas[holder].kill()
        retired.append(replicas.pop(holder))
        cluster.servers[srv].stop(kill=True)
        event(f"replica holding partition {v} (replica {holder}) SIGKILLed with nats-server {srv} (it led: "
              f"{', '.join(led) or 'nothing'})")
        r = await fault("replica+server killed", v, t_kill)
        r["killed_led"] = led
        failover_s = r["since_kill_s"]
        takeover = [(q, c.last().get("owned")) for q, c in replicas.items()]
        cluster.servers[srv].start()
        replicas[holder] = replica(holder, 1)
        t_back = time.monotonic()
        await replicas[holder].start()
        got = await replicas[holder].until(lambda r: holder in (r.get("owned") or []), 60)
        regain_s = None if got is None else got[0] - t_back
        replicas[holder].cpu0 = replicas[holder].cpu()
        event(f"nats-server {srv} and replica {holder} back: partition {holder} held again after "
              f"{secs(regain_s)} s (partitions held while it was gone: {takeover})")
        await fault("both back", v)
        for i in range(3):
            led = await led_by(i)
            cluster.servers[i].stop(kill=True)
            event(f"nats-server {i} SIGKILLed (it led: {', '.join(led) or 'nothing'})")
            for part in range(PARTITIONS):
                (await fault(f"server {i} down", part))["killed_led"] = led
            cluster.servers[i].start()
            event(f"nats-server {i} started again")
            await fault(f"server {i} back", (i + 1) % PARTITIONS)
        await asyncio.sleep(WITHDRAW_S)
        dups = {}
        for r in rows:
            rejudge(r, inc, *by_job[r["job"]])
            vs = await kv_versions(js, r["job"])
            r["kv_versions"] = len(vs)
            r["kv_duplicates"] = duplicates(vs)
            if not r["right"] or r["withdrawn"]:
                r["kv_history"] = [(x.get("status"), (x.get("culprit") or {}).get("entity"), x.get("evidence_total"),
                                    x.get("reason")) for x in vs]
            if r["kv_duplicates"]:
                dups[r["job"]] = [(x.get("status"), (x.get("culprit") or {}).get("entity"), x.get("evidence_total"))
                                  for x in vs]
        per_replica = []
        for c in [*retired, *replicas.values()]:
            stall_total, _ = c.stall_max()
            last = c.last()
            per_replica.append({
                "replica": c.name, "killed": c.killed, "alive": c.alive(),
                "cpu_s": c.cpu() - c.cpu0, "hwm_mib": c.hwm(), "stall_max_ms": stall_total,
                "published": last.get("published"), "publish_same": last.get("publish_same"),
                "publish_retries": last.get("publish_retries"), "publish_pending": last.get("publish_pending"),
                "superseded": last.get("superseded"), "replays": last.get("replays"), "owned": last.get("owned"),
                "problems": c.problems_text()})
            events += [(t, f"{c.name}: {what}") for t, what in c.timeline]
        timeline = [f"t+{t - t_start:6.1f} s {what}" for t, what in sorted(events)]
        return {"faults": rows, "failover_s": failover_s, "regain_s": regain_s, "timeline": timeline,
                "duplicates": dups, "replicas": per_replica, "publisher_retries": pub.retries,
                "client_errors": len(client_errors)}
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        for c in replicas.values():
            await c.stop()
        cluster.stop(kill=True)


def run_cluster(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    print(f"\ncluster: 3 nats-servers, R3 streams, {PARTITIONS} replicas; jobs of {args.nodes} nodes: scenarios",
          flush=True)
    metas = cluster_scenarios(args, work)
    out = asyncio.run(cluster_async(args, work, metas))
    rows = out["faults"]
    summary = summarize(rows, lambda r: r["phase"]) + summarize(rows, lambda r: "all faults")
    print_table("cluster: faults by phase (latency: first evidence -> incident naming the culprit's node)", summary,
                resources=False)
    print(f"failover (replica + server SIGKILLed -> the partition's next incident): {secs(out['failover_s'])} s after "
          f"the kill; the restarted replica held its partition again after {secs(out['regain_s'])} s")
    n_dup = sum(r.get("kv_duplicates", 0) for r in rows)
    print(f"gna-incidents KV: {sum(r.get('kv_versions', 0) for r in rows)} versions over {len(rows)} jobs, "
          f"{n_dup} duplicates" + (f": {out['duplicates']}" if n_dup else ""))
    for rep in out["replicas"]:
        print(f"  {rep['replica']:22} {'killed' if rep['killed'] else 'alive' if rep['alive'] else 'EXITED'}: CPU "
              f"{secs(rep['cpu_s'])} s, RSS {secs(rep['hwm_mib'])} MiB, stall {secs(rep['stall_max_ms'])} ms, "
              f"published {rep['published']}, same {rep['publish_same']}, retries {rep['publish_retries']}, pending "
              f"{rep['publish_pending']}, replays {rep['replays']}, owned {rep['owned']}"
              + (f"; logged: {rep['problems']}" if rep["problems"] else ""))
    for r in rows:
        if not r["right"] or r["withdrawn"]:
            print(fault_line(f"  not right: {r['phase']:22} p{r['partition']} ", r)
                  + f"\n      in the KV (status, culprit, evidence, reason): {r.get('kv_history')}")
    print("timeline (the bench's actions, the replicas' lease and replay events):")
    for line in out["timeline"]:
        print(f"  {line}")
    for m in metas:
        if not m["cached"]:
            Path(m["out"]).unlink(missing_ok=True)
    return {"summary": summary, **out, "duplicates_total": n_dup}


# ---------------------------------------------------------------------------------------------- main

def stop_all() -> None:
    """Whatever of STARTED still runs: SIGKILLed (a correlator whose process was not reaped yet: its pid
    is still its own)."""
    for x in STARTED:
        with contextlib.suppress(Exception):
            if isinstance(x, NatsServerProcess):
                x.stop(kill=True)
            elif isinstance(x, Correlator) and x.proc is not None and x.proc.returncode is None:
                os.kill(x.proc.pid, signal.SIGKILL)


def git(*cmd: str) -> str:
    try:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def rounded(v: Any) -> Any:
    """Floats to 4 decimals (0.1 ms), NaN to null, all the way down."""
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 4)
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [rounded(x) for x in v]
    return v


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def kinds(s: str) -> list[str]:
    out = [x.strip() for x in s.split(",") if x.strip()]
    if bad := [k for k in out if k not in (*KINDS, "behind_rank")]:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {bad}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="the live correlator at fleet scale (docstring: bench/incidents_scale.py)")
    ap.add_argument("--mode", choices=("one-job", "many-jobs", "cluster", "replicas"), required=True)
    ap.add_argument("--replicas", type=ints, default=[1, 3],
                    help="replicas: partitioned replica counts, the first the baseline (jobs as many-jobs draws them)")
    ap.add_argument("--sizes", type=ints, default=[128, 512, 1024, 2048, 4096], help="one-job: nodes of the job")
    ap.add_argument("--trials", type=int, default=3, help="one-job: trials per size and fault kind")
    ap.add_argument("--kinds", type=kinds, default=list(KINDS), help="fault kinds, comma-separated")
    ap.add_argument("--jobs", type=int, default=500, help="many-jobs: jobs in the fleet (at most 1,000)")
    ap.add_argument("--fleet-nodes", type=int, default=18000, help="many-jobs: nodes of all the jobs together")
    ap.add_argument("--job-min", type=int, default=8, help="many-jobs: smallest job drawn (nodes)")
    ap.add_argument("--job-max", type=int, default=128, help="many-jobs: largest job (nodes)")
    ap.add_argument("--faults", type=int, default=5, help="many-jobs: jobs with a fault")
    ap.add_argument("--fault-gap", type=float, default=1.0, help="many-jobs: s between two faults (steady state)")
    ap.add_argument("--fleet-start", action="store_true",
                    help="many-jobs: all membership at once, the faults injected during the flood")
    ap.add_argument("--inject-at", type=float, default=0.5,
                    help="many-jobs --fleet-start: share of the flood published when the faults come")
    ap.add_argument("--nodes", type=int, default=16, help="cluster: nodes of each job")
    ap.add_argument("--victim", type=int, default=1, help="cluster: the partition whose replica is killed")
    ap.add_argument("--kill-server", choices=("0", "1", "2", "leases", "leases-only", "none"), default="0",
                    help="cluster: the nats-server killed with the replica (leases: the one leading the leases "
                         "bucket; leases-only: that one, once it leads nothing else; none: server 0, once it "
                         "leads nothing)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=30.0, help="s after a fault's evidence to wait for its incident")
    ap.add_argument("--digest-max", type=float, default=300.0, help="s to wait for membership to be digested")
    ap.add_argument("--stats-interval", type=float, default=1.0, help="s between the correlator's stats lines")
    ap.add_argument("--gen-workers", type=int, default=1, help="scenarios generated at a time (processes)")
    ap.add_argument("--gen-dir", help="where host trees are generated (default: TMPDIR); tmpfs is much faster")
    ap.add_argument("--cache", help="keep generated scenarios' messages here across runs")
    ap.add_argument("--no-freeze-heap", action="store_true",
                    help="the correlator without fleet/heap.py's freezing (the baseline it is measured against)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results/incidents_scale.jsonl")
    ap.add_argument("--trace-steps", type=float, default=0.0, metavar="MS",
                    help="name every correlator loop step longer than MS (bench/step_trace.py); implies --no-record")
    ap.add_argument("--trace-call", action="append", default=[], metavar="MODULE:QUALNAME",
                    help="with --trace-steps: also time this function in the correlator (repeatable)")
    args = ap.parse_args()
    if args.trace_steps:
        args.no_record = True  # the tracer's own cost is in what it measures
        Correlator.trace_steps_ms = args.trace_steps
        Correlator.trace_calls = tuple(args.trace_call)
    if args.mode == "many-jobs" and not 1 <= args.jobs <= 1000:
        ap.error("--jobs must be 1..1000 (each job's nodes are named by its seed modulo 1,000)")
    args.job_min_clamp = min(args.job_min, max(2, args.fleet_nodes // max(1, args.jobs)))
    Correlator.freeze_heap = not args.no_freeze_heap
    configure("error", "json")
    started = time.monotonic()

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # the finally blocks stop what was started and remove the temp dirs

    signal.signal(signal.SIGTERM, terminated)
    try:
        with tempfile.TemporaryDirectory(prefix="gna-scale-") as tmp:
            work = Path(tmp)
            try:
                if args.mode == "one-job":
                    out = run_one_job(args, work)
                elif args.mode == "many-jobs":
                    out = run_many_jobs(args, work)
                elif args.mode == "replicas":
                    out = run_replicas(args, work)
                else:
                    out = run_cluster(args, work)
            finally:
                stop_all()
                if args.trace_steps:
                    print_slow_steps()
    except KeyboardInterrupt:
        print("\ninterrupted: nothing recorded", file=sys.stderr)
        raise SystemExit(130) from None
    record = {"bench": "incidents_scale", "mode": args.mode,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": git("rev-parse", "--short", "HEAD"),
              "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
              "command": " ".join(sys.orig_argv), "cpus": os.cpu_count(),
              "wall_s": round(time.monotonic() - started, 1),
              **{k: v for k, v in out.items() if k != "trials"},
              **({"trials": out["trials"]} if "trials" in out else {})}
    line = json.dumps(rounded(record), default=str, separators=(",", ":"))
    print("\n" + line)
    results.record("incidents_scale", figures_of(out), variant=args.mode + ("-fleet-start" if args.fleet_start else ""),
                   params={k: v for k, v in vars(args).items() if k not in ("no_record", "cache", "gen_dir")},
                   raw=json.loads(line), write=not args.no_record)


def print_slow_steps(top: int = 25) -> None:
    """--trace-steps: per correlator, the slow steps grouped by where they resumed and suspended, longest first."""
    for c in STARTED:
        if not getattr(c, "slow_steps", None):
            continue
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        calls: dict[str, list[float]] = {}
        for r in c.slow_steps:
            if r.get("event") == "slow_gc":
                print(f"  full collection: {r.get('ms')} ms (cpu {r.get('cpu_ms')}), {r.get('walked')} objects walked, "
                      f"{r.get('collected')} collected; biggest containers {r.get('biggest')}; "
                      f"(entries, objects, type) {r.get('types')}")
                continue
            if r.get("event") == "slow_call":
                calls.setdefault(str(r.get("call")), []).append(float(r["ms"]))
                continue
            where = (" <- ".join(reversed((r.get("resumed_at") or [r.get("callback") or "?"])[-3:])),
                     " <- ".join(reversed((r.get("suspended_at") or ["(done)"])[-3:])))
            groups.setdefault(where, []).append(r)
        print(f"\n{c.name}: {len(c.slow_steps)} loop steps over {Correlator.trace_steps_ms} ms")
        rows = sorted(groups.items(), key=lambda kv: -max(float(r["ms"]) for r in kv[1]))
        for (resumed, suspended), rs in rows[:top]:
            mx = max(rs, key=lambda r: float(r["ms"]))
            print(f"  x{len(rs):<5} max {mx['ms']:7.1f} ms (cpu {mx['cpu_ms']:.1f}, gc {mx['gc_ms']:.1f}) "
                  f"sum {sum(float(r['ms']) for r in rs):8.1f} ms  task {mx.get('task')}")
            print(f"         resumed  {resumed[:300]}")
            print(f"         suspended {suspended[:300]}")
        last = c.last().get("followers") or {}
        print("  followers' most messages held received, not yet handed on: "
              + ", ".join(f"{k} {v.get('buffered_max')}" for k, v in last.items() if isinstance(v, dict)))
        for call, mss in sorted(calls.items(), key=lambda kv: -max(kv[1])):
            print(f"  call {call}: x{len(mss)} over {Correlator.trace_steps_ms / 2} ms, max {max(mss):.1f} ms, "
                  f"sum {sum(mss):.1f} ms")


def figures_of(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded figures (bench/record.py): per group of faults, how many were named right and how fast;
    for a fleet, how long its membership took to digest, bytes per rank, the longest loop stall, healthy
    nodes blamed. No same-invocation baseline: the goals are the issue's (right, within 3 s)."""
    figs: list[dict[str, Any]] = []
    for s in out.get("summary") or []:
        g = s["group"]
        figs.append(results.figure(f"{g}: named right", f"{s['right']}/{s['total']}", goal="all"))
        if s.get("median_after_decisive_s") is not None:
            figs.append(results.figure(f"{g}: after the decisive message, median / max",
                                       f"{s['median_after_decisive_s']:.2f} / {s['max_after_decisive_s']:.2f}", "s",
                                       goal="<= 3 s"))
        if s.get("withdrawn"):
            figs.append(results.figure(f"{g}: withdrawn", s["withdrawn"], goal="0"))
    fleet = out.get("fleet") or {}
    for key, name, unit, goal in (("digest_all_s", "fleet's membership digested", "s", "seconds"),
                                  ("kib_per_rank", "memory per rank held (VmHWM growth)", "KiB", ""),
                                  ("stall_window_ms", "longest loop stall, measured phases", "ms", "a few ms"),
                                  ("gc_max_ms", "longest CPython collection", "ms", ""),
                                  ("healthy_blamed", "healthy nodes blamed", "", "0")):
        if fleet.get(key) is not None:
            v = fleet[key]
            figs.append(results.figure(name, round(v, 2) if isinstance(v, float) else v, unit, goal=goal))
    return figs


if __name__ == "__main__":
    main()
