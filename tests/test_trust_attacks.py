"""#20 deliver 7: each attack of the issue reproduced black-box, and shown to hold.

One real nats-server started with the shipped permission layout (fleet/nats_permissions.py) and an nkey per
node and role; the admin creates the streams and buckets first (the documented admin step); the real
`gpu-node-agent correlator` and `gpu-node-agent cordoner --enforce` (slurm, a recording fake `scontrol`) run as
subprocesses with their own role's nkey. Every node publishes only with its own nkey, on the subjects its
agent uses (tests/trust_fleet.py builds the messages from the documented formats). What is asserted is
what an operator sees: incident records on gna.incidents.>, the fake scontrol's argv log, audits on
gna.actions.>, the services' exit codes and journals.

The contract (the issue and docs/correlator.md): a verdict resting on one node's word about another is at
most *shown* (confidence < CULPRIT_MIN_CONFIDENCE, ``actionable`` false); a healthy node is never drained
because of what another node published; a node's own hardware fault is still cordoned within 3 s under any
flood one node can produce.

The attacks share one server, correlator and cordoner (distinct jobs and nodes each); the ones that would
wedge a shared service when they succeed (floods) come last.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js.api import RePublish, StorageType, StreamConfig

from agent.nats_link import JOBS_STREAM_SUBJECTS, JOBS_STREAM_TRANSFORM, SIGNALS_STREAM_SUBJECTS, STREAM_SUBJECTS
from agent.nats_server import free_port
from agent.remediation.budget import FleetBudget
from fleet.cordoner import CULPRIT_MIN_CONFIDENCE
from fleet.nats_permissions import Layout, Roles, ServerSettings, new_user_seed
from gna_types.subjects import encode_token, event_subject, job_subject
from tests.conftest import AGENT_CMD, agent_config, python_env, running_agent
from tests.test_adversarial_fleet import FAKE_TOOL, Central, argv_log
from tests.test_nats_permissions import RenderedServer
from tests.trust_fleet import PCIS, SEQ, Job, gpu_fell_off, ib_port_down, message, publications

ATTACKER = "gpu-att.dc1"
HONEST = [f"gpu-{i:02d}.dc1" for i in range(1, 41)]
ROLES = ("cordoner", "correlator", "reader", "admin")
BUDGET = 5  # the fleet budget's max_nodes (max_percent off: the bucket of heartbeating nodes is empty here)
CORDON_WITHIN = 3.0  # a node's own hardware fault is decided within this, whatever else is going on
module_loop = pytest.mark.asyncio(loop_scope="module")


def honest(i: int) -> str:
    return HONEST[i - 1]


def job_id(n: int) -> str:
    return f"0x{0x20C0FFEE00000000 + n:016x}"


# -- the world: server, admin set-up, correlator, cordoner -------------------------------------------------

@dataclass
class World:
    tmp: Path
    server: RenderedServer
    seeds: dict[str, Path]
    keys: dict[str, str]
    env: dict[str, str]
    admin: Client | None = None
    conns: dict[str, Client] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    audits: list[dict[str, Any]] = field(default_factory=list)
    centrals: dict[str, Central] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def config(self, who: str, extra: str = "") -> Path:
        path = self.tmp / f"{who}.toml"
        path.write_text(f'{extra}\n[nats]\nnkey_seed = "{self.seeds[who]}"\nconnect_timeout = 15.0\n')
        return path

    async def node(self, name: str) -> Client:
        """A connection with ``name``'s nkey (its own reply inbox, as the agent has)."""
        if name not in self.conns:
            self.conns[name] = await nats.connect(self.url, nkeys_seed=str(self.seeds[name]), allow_reconnect=False,
                                                  inbox_prefix=f"_INBOX_{encode_token(name)}")
        return self.conns[name]

    async def publish(self, msgs: list[dict[str, Any]]) -> None:
        """Each message by its own node, with JetStream acks, on every subject its agent uses."""
        for m in msgs:
            js = (await self.node(m["node"])).jetstream(timeout=10)
            for subject in publications(m):
                await js.publish(subject, json.dumps(m).encode(), headers={"Nats-Msg-Id": m["id"]})

    async def flood(self, node: str, items: list[tuple[str, bytes]]) -> None:
        """Core publishes (the stream stores them without a round trip each), then wait until stored."""
        nc = await self.node(node)
        assert self.admin is not None
        before = await self.stored()
        for subject, data in items:
            await nc.publish(subject, data)
        await nc.flush(timeout=30)
        deadline = time.monotonic() + 30
        while await self.stored() < before + len(items):
            assert time.monotonic() < deadline, "the flood was not stored"
            await asyncio.sleep(0.1)

    async def stored(self) -> int:
        """Messages the streams took in (per-subject limits may have dropped old ones since)."""
        assert self.admin is not None
        js = self.admin.jetstream()
        return sum([(await js.stream_info(s)).state.last_seq for s in ("GNA_EVENTS", "GNA_JOBS")])

    def records(self, job: str) -> list[dict[str, Any]]:
        return [r for r in self.incidents if r.get("job") == job]

    def drained(self) -> set[str]:
        return {a[2].split("=", 1)[1] for a in argv_log(self.env) if a[:2] == ["scontrol", "update"]
                and "State=DRAIN" in a}

    async def reset_budget(self) -> None:
        assert self.admin is not None
        await FleetBudget(self.admin.jetstream(), max_nodes=BUDGET, max_percent=0).reset()

    def alive(self, name: str) -> None:
        c = self.centrals[name]
        assert c.proc.poll() is None, f"the {name} exited {c.proc.returncode}: {c.stderr[-3000:]}"


def render_fleet(tmp: Path, nodes: list[str]) -> tuple[RenderedServer, dict[str, Path], dict[str, str]]:
    """The shipped layout for these nodes, an nkey seed per node and role."""
    seeds: dict[str, Path] = {}
    keys: dict[str, str] = {}
    for who in (*ROLES, *nodes):
        seed, public = new_user_seed()
        seeds[who] = tmp / f"{encode_token(who)}.nk"
        seeds[who].write_text(seed + "\n")
        seeds[who].chmod(0o600)
        keys[who] = public
    layout = Layout(server=ServerSettings(listen=f"127.0.0.1:{free_port()}", store_dir=str(tmp / "js")),
                    nodes={n: keys[n] for n in nodes},
                    roles=Roles(cordoner=[keys["cordoner"]], readers=[keys["reader"]], admins=[keys["admin"]],
                                correlators=[keys["correlator"]]))
    server = RenderedServer(tmp / "nats", layout)
    server.start()
    return server, seeds, keys


def tool_env(tmp: Path) -> dict[str, str]:
    bindir = tmp / "bin"
    bindir.mkdir()
    p = bindir / "scontrol"
    p.write_text(FAKE_TOOL)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    env = python_env()
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["GNA_TEST_ARGV_LOG"] = str(tmp / "argv.log")
    env["GNA_TEST_STATE"] = str(tmp / "slurm-state.json")
    return env


async def admin_setup(admin: Client) -> None:
    """What the admin creates before the fleet connects (docs/nats-security.md, "Admin")."""
    js = admin.jetstream()
    for name, subjects, per_subject, age in (("GNA_EVENTS", STREAM_SUBJECTS, -1, 7 * 86400.0),
                                             ("GNA_JOBS", JOBS_STREAM_SUBJECTS, 1024, 2 * 86400.0),
                                             ("GNA_SIGNALS", SIGNALS_STREAM_SUBJECTS, 12, 86400.0)):
        await js.add_stream(StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE,
                                         duplicate_window=600.0, max_age=age, max_msgs_per_subject=per_subject,
                                         subject_transform=JOBS_STREAM_TRANSFORM if name == "GNA_JOBS" else None))
    await js.create_key_value(bucket="gna-nodes", history=1)
    await js.create_key_value(bucket="gna-budget", history=5)
    await js.create_key_value(bucket="gna-incidents", history=5)
    await js.create_key_value(bucket="gna-stragglers", history=5)


async def start_correlator(w: World, name: str = "correlator") -> Central:
    assert w.admin is not None
    c = Central(w.tmp, name, ["correlator", "--config", str(w.config("correlator")), "--nats", w.url,
                              "--duration", "600", "--metrics-listen", ""], python_env())  # replicas side by side
    w.centrals[name] = c
    js = w.admin.jetstream()
    deadline = time.monotonic() + 30
    while (await js.stream_info("GNA_JOBS")).state.consumer_count < 1:  # its ordered consumer: replaying
        assert c.proc.poll() is None and time.monotonic() < deadline, c.stderr
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # the replay of the (short) history is over
    return c


async def start_cordoner(w: World) -> Central:
    assert w.admin is not None
    extra = f'[remediations]\ncordon_with = "slurm"\nenforce = true\n[remediations.budget]\nmax_nodes = {BUDGET}\n' \
            'max_percent = 0.0\n'
    c = Central(w.tmp, "cordoner", ["cordoner", "--config", str(w.config("cordoner", extra)), "--nats", w.url,
                                    "--enforce", "--duration", "600", "--metrics-listen", ""], w.env)
    w.centrals["cordoner"] = c
    deadline = time.monotonic() + 30
    while True:
        assert c.proc.poll() is None, c.stderr
        try:
            await w.admin.jetstream().consumer_info("GNA_EVENTS", "gna-cordoner")
            break
        except Exception:
            assert time.monotonic() < deadline, c.stderr
            await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # its incidents watcher
    return c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("trust")
    server, seeds, keys = render_fleet(tmp, [ATTACKER, *HONEST])
    w = World(tmp, server, seeds, keys, tool_env(tmp))
    try:
        w.admin = await nats.connect(server.url, nkeys_seed=str(seeds["admin"]), inbox_prefix="_INBOX_admin")
        await admin_setup(w.admin)

        async def on_incident(m: Any) -> None:
            w.incidents.append(json.loads(m.data))

        async def on_audit(m: Any) -> None:
            w.audits.append(json.loads(m.data))

        await w.admin.subscribe("gna.incidents.>", cb=on_incident)
        await w.admin.subscribe("gna.actions.>", cb=on_audit)
        await start_correlator(w)
        await start_cordoner(w)
        yield w
    finally:
        for c in w.centrals.values():
            c.stop()
        for nc in [*w.conns.values(), *([w.admin] if w.admin else [])]:
            await nc.close()
        server.stop(kill=True)


async def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(0.05)


def acted_on(rec: dict[str, Any]) -> bool:
    """What the cordoner would act on: an open record that is actionable, or (today's rule) confident enough."""
    return rec.get("status") == "open" and rec.get("culprit") is not None and (
        bool(rec.get("actionable")) or float(rec.get("confidence") or 0) >= CULPRIT_MIN_CONFIDENCE)


def assert_only_shown(w: World, job: str, healthy: set[str]) -> None:
    """No record of ``job`` is actionable against a healthy node, and none of them was drained."""
    for rec in w.records(job):
        c = rec.get("culprit") or {}
        if c.get("node") in healthy:
            assert not acted_on(rec), f"{c.get('node')} would be cordoned on another node's word: {rec}"
            assert float(rec.get("confidence") or 0) < CULPRIT_MIN_CONFIDENCE and rec.get("actionable") is False, rec
    assert not (w.drained() & healthy), f"healthy nodes drained: {w.drained() & healthy}; log {argv_log(w.env)}"


async def hold_still(w: World, seconds: float = 2.5) -> None:
    """Long enough for a settled verdict (1 s), the cordoner's incident watch and a drain to happen if they will."""
    await asyncio.sleep(seconds)
    w.alive("correlator")
    w.alive("cordoner")


# -- framing --------------------------------------------------------------------------------------------

@module_loop
async def test_a_ras_report_from_a_about_b_is_shown_never_acted_on(world: World) -> None:
    """Framing: one NCCLRASReport from A saying "rank 10 is dead" (rank 10 runs on B, which said nothing wrong)
    named B at 0.9 and B was drained. It may be shown; B is never cordoned for it."""
    w = world
    b, c = honest(1), honest(2)
    job = Job(job_id(1), [ATTACKER, b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    await w.publish([job.timeout(r) for r in job.ranks_of(ATTACKER)])  # A's own ranks time out
    await w.publish([job.ras_report(0, [job.ras_suspect(10, "dead")])])
    await hold_still(w)
    assert_only_shown(w, job.job, {b, c})
    assert not [a for a in w.audits if a.get("node") in (b, c) and a.get("decision") in ("executed", "dry_run")]


@module_loop
async def test_forged_progress_from_processes_without_membership_names_nobody_else(world: World) -> None:
    """Framing: NCCLWatchdogProgress from A's processes that have no membership, with details.rank a rank of
    B, named B "behind" at 0.9 -- with no hang at all. A's made-up ranks count for nothing about B; and A
    (then counted a victim) still has its own GPUFellOffBus cordoned: the victim list never shields a
    node's own findings."""
    w = world
    b, c = honest(3), honest(4)
    job = Job(job_id(2), [ATTACKER, b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    forged = []
    for i, r in enumerate(range(job.size)):  # A's pids 50000+: no membership; ranks taken from the payload
        pid = 50000 + i
        if r == 9:  # B's rank: "its last enqueued work is below the collective the others wait in"
            forged.append(job.nccl(r, "NCCLWatchdogProgress", "warning", node=ATTACKER, pid=pid, world_rank=None,
                                   pg_id="0", rank=9, last_enqueued=SEQ - 1, last_completed=SEQ - 1,
                                   signal_from_rank=0))
        else:
            forged.append(job.nccl(r, "NCCLCollectiveTimeout", "critical", node=ATTACKER, pid=pid, world_rank=None,
                                   seq_num=SEQ, op_type="ALLREDUCE", rank=r, pg_id="0", pg_rank=r))
            forged.append(job.nccl(r, "NCCLWatchdogProgress", "warning", node=ATTACKER, pid=pid, world_rank=None,
                                   pg_id="0", rank=r, at_seq=SEQ, last_enqueued=SEQ, last_completed=SEQ - 1))
    await w.publish(forged)
    await hold_still(w)
    assert_only_shown(w, job.job, {b, c})
    own = gpu_fell_off(ATTACKER, job.pci_of(job.ranks_of(ATTACKER)[0]))
    await w.publish([own])
    await wait_for(lambda: ATTACKER in w.drained(), 4 * CORDON_WITHIN,
                   f"A's own GPUFellOffBus drained A (audits {[a for a in w.audits if a.get('node') == ATTACKER]})")
    await w.publish([{**own, "id": gpu_fell_off(ATTACKER)["id"], "status": "resolved"}])  # A's GPU is back


@module_loop
async def test_forged_progress_on_top_of_a_real_hang_leaves_the_real_culprit(world: World) -> None:
    """Framing on top of a real hang: rank 17 (on C) hangs, every other rank times out honestly; A's
    processes without membership say rank 9 (on B) is behind. The verdict names C's rank 17, never B."""
    w = world
    b, c = honest(5), honest(6)
    job = Job(job_id(3), [ATTACKER, b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    await w.publish(job.timeouts(but={17}))
    await w.publish([job.nccl(9, "NCCLWatchdogProgress", "warning", node=ATTACKER, pid=50009, world_rank=None,
                              pg_id="0", rank=9, last_enqueued=SEQ - 1, last_completed=SEQ - 1, signal_from_rank=0)])
    rec = await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                         5, f"the real culprit {c} named")
    assert rec[-1]["culprit"].get("rank") == "17", rec[-1]
    await hold_still(w, 1.5)
    assert_only_shown(w, job.job, {b})


@module_loop
async def test_five_framed_jobs_do_not_spend_the_budget_a_real_fault_needs(world: World) -> None:
    """Framing x5: five such reports on five jobs spent the 5-slot fleet budget on five healthy nodes, and a
    real GPUFellOffBus on another node was then skipped "budget exhausted" for the hour. Now: nobody framed
    is drained, and the real fault on C is cordoned within 3 s."""
    w = world
    await w.reset_budget()
    framed = [honest(i) for i in range(7, 12)]
    for i, b in enumerate(framed):
        job = Job(job_id(10 + i), [ATTACKER, b])
        await w.publish(job.members())
        await w.publish([job.timeout(r) for r in job.ranks_of(ATTACKER)])
        await w.publish([job.ras_report(0, [job.ras_suspect(8 + i, "dead")])])
    await hold_still(w, 3.0)
    c = honest(12)
    real = gpu_fell_off(c)
    t0 = time.monotonic()
    await w.publish([real])
    await wait_for(lambda: c in w.drained(), CORDON_WITHIN + 1.0,
                   f"{c}'s own GPUFellOffBus drained (audits {[a for a in w.audits if a.get('node') == c]})")
    took = time.monotonic() - t0
    assert took <= CORDON_WITHIN + 0.5, took
    assert not (w.drained() & set(framed)), f"framed nodes drained: {w.drained() & set(framed)}"


# -- suppression ------------------------------------------------------------------------------------------

@module_loop
async def test_a_member_claiming_a_million_ranks_does_not_hide_a_real_port_fault(world: World) -> None:
    """Suppression: one fake member from A with world_size 1,000,000 gave "only 8 of 1000000 ranks are
    known: no verdict". That claim (rejected as out of bounds, or a conflict) and a plausible one of another
    size (32) make the job contested (flagged); C's own port fault under a rank is still named and acted on."""
    w = world
    b, c = honest(15), honest(16)
    job = Job(job_id(21), [b, c])
    await w.publish(job.members())
    await w.publish([job.nccl(0, "NCCLJobMember", "info", node=ATTACKER, pid=51000, world_rank=999_999,
                              world_size=1_000_000, nranks=1_000_000, ranks=[999_999], comm_id=job.job,
                              rank=999_999, size=1_000_000, cuda_dev=0),
                     job.nccl(1, "NCCLJobMember", "info", node=ATTACKER, pid=51001, world_size=32, nranks=32,
                              comm_id=job.job, rank=1, size=32, cuda_dev=1)])
    await asyncio.sleep(0.3)
    await w.publish([ib_port_down(c, job.port_of(12)), *job.timeouts()])
    recs = await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                          5, "C named despite A's world_size 1,000,000")
    last = recs[-1]
    assert last["culprit"]["entity"] == f"ib:{job.port_of(12)}" and acted_on(last), last
    assert last.get("contested") is True, f"another node's different world_size is a finding: {last}"
    await wait_for(lambda: c in w.drained(), 5, f"{c} drained for its port")
    assert b not in w.drained()


@module_loop
async def test_a_claiming_bs_rank_is_contested_and_never_names_b_or_a_actionably(world: World) -> None:
    """Suppression/framing: A claiming B's world rank got A named instead of B. The rank stays bound to its
    first claimant; the conflicting claim makes the job contested, and no membership-only verdict is acted
    on: neither B nor any other node is drained for the hang."""
    w = world
    b, c = honest(17), honest(18)
    job = Job(job_id(22), [b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    hung = 13  # on C
    # A says it hosts rank 13 too (same world size), after C did
    await w.publish([job.nccl(hung, "NCCLJobMember", "info", node=ATTACKER, pid=51013, comm_id=job.job, rank=hung,
                              size=job.size, cuda_dev=5)])
    await w.publish(job.timeouts(but={hung}))
    await hold_still(w)
    recs = w.records(job.job)
    assert recs, "the hang is shown"
    assert recs[-1].get("contested") is True, recs[-1]
    for rec in recs:
        assert not acted_on(rec) or (rec.get("culprit") or {}).get("node") == ATTACKER, rec
        assert rec.get("actionable") is False, rec
    assert not (w.drained() & {b, c})


@module_loop
async def test_a_resending_its_timeout_every_0_4_s_cannot_hold_the_verdict_back(world: World) -> None:
    """Suppression: A re-sending its own timeout every 0.4 s held any verdict back (the settle wait had no
    upper bound). The verdict on the real hang (rank 20 on C) comes within ~3 s of the honest evidence."""
    w = world
    b, c = honest(19), honest(20)
    job = Job(job_id(23), [ATTACKER, b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    await w.publish(job.timeouts(but={20}))
    t0 = time.monotonic()

    async def resend() -> None:
        while time.monotonic() - t0 < 6.0:
            await w.publish([job.timeout(0)])
            await asyncio.sleep(0.4)

    task = asyncio.get_running_loop().create_task(resend())
    try:
        await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                       3.5, "the hung rank's verdict while A keeps re-sending")
    finally:
        await task
    assert (w.records(job.job)[-1].get("culprit") or {}).get("rank") == "20"


@module_loop
async def test_a_member_message_after_the_verdict_does_not_withdraw_it(world: World) -> None:
    """Suppression: after B was named, one more member message from A withdrew the verdict. A re-announcing
    its own rank (a new communicator of the same job) leaves the verdict on B standing."""
    w = world
    b, c = honest(21), honest(22)
    job = Job(job_id(24), [ATTACKER, b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    await w.publish([gpu_fell_off(b, job.pci_of(12)), *job.timeouts(but={12})])
    await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == b
                            and r.get("status") == "open"], 5, "B named")
    n = len(w.records(job.job))
    await w.publish([job.member(3, comm_ids=[job.job, "0x00000000000000aa"])])
    await hold_still(w, 2.0)
    after = w.records(job.job)[n:]
    for rec in after:
        assert rec.get("status") == "open" and (rec.get("culprit") or {}).get("node") == b, rec
    assert b in w.drained()


@module_loop
async def test_4200_fake_members_do_not_push_a_jobs_members_out_of_its_window(world: World) -> None:
    """Suppression: 4,200 fake members from A pushed a job's real members out of its 4,096-message window.
    A runs ranks 0-7 of the job and announces them 4,200 times (its own ranks: nothing contested);
    then rank 20 (on C) hangs and every other rank times out: the hung rank, known only by its membership,
    is still named within 3 s of the settle."""
    w = world
    b, c = honest(23), honest(24)
    job = Job(job_id(25), [ATTACKER, b, c])
    await w.publish(job.members())
    items = []
    for i in range(4200):
        m = job.nccl(i % 8, "NCCLJobMember", "info", pid=60000 + i, comm_id=job.job, rank=i % 8, size=job.size,
                     cuda_dev=i % 8)  # A's own ranks, from ever new processes (a launcher restarting them)
        items.append((job_subject(job.job, ATTACKER, "member"), json.dumps(m).encode()))
    await w.flood(ATTACKER, items)
    await asyncio.sleep(2.0)
    w.alive("correlator")
    t0 = time.monotonic()
    await w.publish(job.timeouts(but={20}))
    recs = await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                          CORDON_WITHIN + 3, "the hung rank on C named after 4,200 re-announcements")
    assert time.monotonic() - t0 < CORDON_WITHIN + 1.0, time.monotonic() - t0  # the 1 s settle, then judged
    assert recs[-1]["culprit"].get("rank") == "20" and recs[-1].get("contested") is not True, recs[-1]


# -- speaking as another node (own server: nothing pre-created) -------------------------------------------

def republish_as(node: str) -> str:
    """gna.signals.<A>.<collector> -> gna.events.<node>.<collector>.critical: A's vectors stored as node's events."""
    return f"gna.events.{encode_token(node)}.{{{{wildcard(2)}}}}.critical"


@pytest.fixture
def bare_fleet(tmp_path: Path) -> Iterator[tuple[RenderedServer, dict[str, Path], dict[str, str]]]:
    server, seeds, keys = render_fleet(tmp_path, [ATTACKER, honest(1)])
    yield server, seeds, keys
    server.stop(kill=True)


async def test_a_node_cannot_create_a_stream_that_republishes_as_another_node(
        tmp_path: Path, bare_fleet: tuple[RenderedServer, dict[str, Path], dict[str, str]]) -> None:
    """Speaking as another node: nodes held $JS.API.STREAM.CREATE.GNA_SIGNALS and the admin steps did not
    pre-create it; A created it first with a republish onto gna.events.<B>.kmsg_xid.critical and B was
    cordoned on a GPUFellOffBus "from B". Under the shipped layout a node's STREAM.CREATE is refused, for
    every stream and bucket, and nothing A publishes reaches B's subjects."""
    server, seeds, keys = bare_fleet
    b = honest(1)
    a = await nats.connect(server.url, nkeys_seed=str(seeds[ATTACKER]), allow_reconnect=False,
                           inbox_prefix=f"_INBOX_{encode_token(ATTACKER)}")
    admin = await nats.connect(server.url, nkeys_seed=str(seeds["admin"]), inbox_prefix="_INBOX_admin")
    try:
        evil = {"name": "GNA_SIGNALS", "subjects": ["gna.signals.>"], "storage": "file", "num_replicas": 1,
                "republish": {"src": "gna.signals.*.*", "dest": republish_as(b)}}
        for stream, cfg in (("GNA_SIGNALS", evil), ("GNA_EVENTS", {"name": "GNA_EVENTS", "subjects": STREAM_SUBJECTS}),
                            ("GNA_JOBS", {"name": "GNA_JOBS", "subjects": JOBS_STREAM_SUBJECTS}),
                            ("KV_gna-nodes", {"name": "KV_gna-nodes", "subjects": ["$KV.gna-nodes.>"]})):
            try:
                reply = await a.request(f"$JS.API.STREAM.CREATE.{stream}", json.dumps(cfg).encode(), timeout=1.0)
                answer = json.loads(reply.data)
            except (nats.errors.TimeoutError, TimeoutError):
                answer = {"error": "no reply (refused by the server)"}
            assert "error" in answer, f"node A created stream {stream}: {answer}"
        names = await admin.jetstream().streams_info()
        assert [s.config.name for s in names] == [], "a node created a stream"
        violations = [v for v in server.violations() if keys[ATTACKER] in v]
        assert any("$JS.API.STREAM.CREATE" in v for v in violations), server.violations()
    finally:
        await a.close()
        await admin.close()


@pytest.mark.slow  # a foreign stream refused: tests/test_nats_setup.py's refusals and the next test, by default
async def test_a_stream_precreated_with_republish_is_refused_loudly(
        tmp_path: Path, bare_fleet: tuple[RenderedServer, dict[str, Path], dict[str, str]],
        capfd: pytest.CaptureFixture[str]) -> None:
    """Speaking as another node, the other half: GNA_SIGNALS exists (made before the fix, or by a careless
    admin) with a JetStream republish onto gna.events.<B>.*. ensure_stream accepted it because its subjects
    matched. The agent and the correlator refuse it loudly (an error naming the stream and the republish)."""
    server, seeds, _keys = bare_fleet
    b = honest(1)
    admin = await nats.connect(server.url, nkeys_seed=str(seeds["admin"]), inbox_prefix="_INBOX_admin")
    try:
        await admin_setup_without_signals(admin)
        await admin.jetstream().add_stream(StreamConfig(
            name="GNA_SIGNALS", subjects=SIGNALS_STREAM_SUBJECTS, storage=StorageType.FILE,
            republish=RePublish(src="gna.signals.*.*", dest=republish_as(b))))
    finally:
        await admin.close()
    capfd.readouterr()
    cfg = agent_config(tmp_path, servers=[server.url], node=b)
    cfg.agent.nats.nkey_seed = str(seeds[b])
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 15)
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            out = capfd.readouterr()
            text += out.out + out.err
            if "GNA_SIGNALS" in text and "republish" in text.lower():
                break
            await asyncio.sleep(0.2)
    assert "GNA_SIGNALS" in text and "republish" in text.lower(), f"the agent accepted it silently: {text[-3000:]}"

    conf = tmp_path / "correlator.toml"
    conf.write_text(f'[nats]\nnkey_seed = "{seeds["correlator"]}"\nconnect_timeout = 5.0\n')
    proc = await asyncio.create_subprocess_exec(
        *AGENT_CMD, "correlator", "--config", str(conf), "--nats", server.url, "--duration", "8", "--metrics-listen", "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=python_env())
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 30)
    journal = (out_b + err_b).decode(errors="replace")
    assert "GNA_SIGNALS" in journal and "republish" in journal.lower(), (
        f"the correlator (rc {proc.returncode}) accepted the republishing stream silently: {journal[-3000:]}")


async def admin_setup_without_signals(admin: Client) -> None:
    js = admin.jetstream()
    await js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS, storage=StorageType.FILE))
    await js.add_stream(StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS, storage=StorageType.FILE,
                                     max_msgs_per_subject=1024, subject_transform=JOBS_STREAM_TRANSFORM))
    await js.create_key_value(bucket="gna-nodes", history=1)
    await js.create_key_value(bucket="gna-incidents", history=5)
    await js.create_key_value(bucket="gna-stragglers", history=5)


# -- smaller holes -------------------------------------------------------------------------------------------

def test_a_newline_in_a_layout_node_name_is_refused(tmp_path: Path) -> None:
    """A node name with a newline injected a config line into the rendered NATS layout (nats-server -t
    accepted it). `python -m fleet.nats_permissions render` refuses it, and prints no config."""
    _, key = new_user_seed()
    _, key2 = new_user_seed()
    evil = "gpu-x\\nauthorization { user: intruder, password: letmein }\\n"
    layout = tmp_path / "layout.toml"
    layout.write_text(f'[nodes]\n"{evil}" = "{key}"\n"gpu-ok" = "{key2}"\n')
    r = subprocess.run([sys.executable, "-m", "fleet.nats_permissions", "render", str(layout)], capture_output=True,
                       text=True, timeout=30, env=python_env())
    assert r.returncode != 0, f"rendered a layout whose node name has a newline:\n{r.stdout[:2000]}"
    assert "letmein" not in r.stdout and "intruder" not in r.stdout
    assert "gpu-x" in r.stderr, r.stderr


@module_loop
async def test_top_never_passes_format_or_control_characters_to_the_terminal(world: World) -> None:
    """`top` passed Unicode format characters (RLM/LRM/ALM, bidi isolates, zero-width, BOM, tag characters)
    from message strings to the terminal. A's own job: its membership names a GPU whose PCI address carries
    them, and A's GPUFellOffBus on that entity makes it an incident culprit (the entity top shows); the same
    characters in the condition's message and reason. `top --once` as a reader shows none of them."""
    w = world
    evil = "\u200f\u200e\u061c\u2066\u2069\u202e\u200b\ufeff\U000e0041\x1b[31m\x07"
    pci = PCIS[6] + evil
    job = Job(job_id(30), [ATTACKER])
    members = [job.member(r) for r in job.ranks_of(ATTACKER)]
    for m in members:
        if m["details"]["world_rank"] == 6:
            m["details"]["pci"] = pci
    fault = message(ATTACKER, "GPUFellOffBus", collector="kmsg_xid", severity="critical", entity=f"gpu:{pci}",
                    kind="condition", status="firing", reason=f"FallenOffTheBus{evil}", text=f"gone{evil}",
                    action="reboot")
    await w.publish([*members, fault, *[job.timeout(r) for r in job.ranks_of(ATTACKER) if r != 6]])
    await asyncio.sleep(2.0)
    conf = w.config("reader")
    for _attempt in range(3):  # --once waits a fixed 1.5 s for the history: a loaded machine may need another go
        proc = await asyncio.create_subprocess_exec(
            *AGENT_CMD, "top", "--once", "--width", "400", "--config", str(conf), "--nats", w.url,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=python_env())
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        text = out.decode("utf-8", errors="replace")
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        if "gpu-att" in text:
            break
    assert "gpu-att" in text, (text[-3000:], err.decode(errors="replace")[-2000:])
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cf", "Cc")})
    assert not bad, f"top wrote {bad} to the terminal"
    w.alive("correlator")
    await w.publish([{**fault, "id": gpu_fell_off(ATTACKER)["id"], "status": "resolved"}])


# -- floods (last: when they work they wedge the shared services) ----------------------------------------------

@module_loop
async def test_10050_fake_jobs_do_not_evict_a_real_one(world: World) -> None:
    """Suppression: membership for 10,050 fake jobs from A evicted the real one (max_jobs 10,000). After them
    rank 13 (on C) of the real job hangs and the others time out: the hung rank, known only by its
    membership, is still named."""
    w = world
    b, c = honest(25), honest(26)
    job = Job(job_id(26), [b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.5)
    items = []
    for i in range(10050):
        fake = Job(job_id(100000 + i), [ATTACKER], per_node=1)
        m = fake.member(0)
        items.append((job_subject(fake.job, ATTACKER, "member"), json.dumps(m).encode()))
    await w.flood(ATTACKER, items)
    await asyncio.sleep(3.0)
    w.alive("correlator")
    t0 = time.monotonic()
    await w.publish(job.timeouts(but={13}))
    recs = await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                          CORDON_WITHIN + 3, "the hung rank on C named after 10,050 fake jobs")
    assert time.monotonic() - t0 < CORDON_WITHIN + 1.0, time.monotonic() - t0
    assert recs[-1]["culprit"].get("rank") == "13", recs[-1]


# -- silencing (after the floods: on a correlator it silences, every later verdict is lost) ---------------

@module_loop
async def test_a_5000_character_job_id_or_commid_never_silences_the_correlator(world: World) -> None:
    """Silencing: one timeout whose job id is 5,000 characters, or a job user's single Init COMPLETE with a
    5,000-digit commId, made the correlator put a KV key longer than the server's control line; the server
    closed its connection and it stayed up deaf (and died again replaying history after a restart). Now the
    next real incident is still published and cordoned, and a restarted correlator replays past the poison."""
    w = world
    long_id = "0x" + "7" * 4998
    digits = "0x" + "1234567890" * 500
    poison = Job(long_id, [ATTACKER])
    poison2 = Job(digits, [ATTACKER])
    await w.publish([poison.timeout(0), poison2.member(1, comm_id=digits), poison2.timeout(1)])
    await asyncio.sleep(1.5)
    w.alive("correlator")
    b, c = honest(13), honest(14)
    job = Job(job_id(20), [b, c])
    await w.publish(job.members())
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await w.publish([ib_port_down(c, job.port_of(11)), *job.timeouts()])
    recs = await wait_for(lambda: [r for r in w.records(job.job) if (r.get("culprit") or {}).get("node") == c],
                          5, "the real incident after the poison")
    assert time.monotonic() - t0 < 3.0
    assert recs[-1]["culprit"]["entity"] == f"ib:{job.port_of(11)}" and acted_on(recs[-1]), recs[-1]
    await wait_for(lambda: c in w.drained(), 5, f"{c} drained for its port")
    # a restarted correlator replays the same history (the poison included) and stays up
    first = w.centrals["correlator"]
    assert first.stop() == 0, first.stderr[-3000:]
    n = len(w.records(job.job))
    await start_correlator(w, "correlator")
    # it rebuilds the verdict from the history, and finds it published already: no second record (#21)
    await wait_for(lambda: "incidents_caught_up" in w.centrals["correlator"].stderr, 10,
                   "the restarted correlator through its history")
    await asyncio.sleep(1.5)
    w.alive("correlator")
    assert len(w.records(job.job)) == n
    assert "Traceback" not in w.centrals["correlator"].stderr


@module_loop
async def test_1000_unsettled_fake_jobs_never_delay_a_real_cordon(world: World) -> None:
    """Delay: the cordoner's 3 s wait for a verdict ran inside the push consumer's callback, one message after
    another: with A keeping fake jobs unsettled, B's real GPUFellOffBus was decided 60.7 s late for 20, ~50
    minutes for 1,000. A publishes a cordon-worthy NCCL condition (NCCLSocketFallback, critical) for 1,000
    fake jobs; B's GPUFellOffBus right after is decided within 3 s."""
    w = world
    await w.reset_budget()
    items = []
    for i in range(1000):
        fake = Job(job_id(200000 + i), [ATTACKER], per_node=1)
        s = fake.summary(0, pid=1)  # one process, one entity: the rules' cooldown keeps the plugin out of it
        m = message(ATTACKER, "NCCLSocketFallback", collector="nccl_logs", severity="critical",
                    entity=f"nccl:{ATTACKER}:1", kind="condition", status="firing", reason="SocketTransport",
                    details={**s, "transport": "Socket"}, action="inspect_hardware")
        items.append((event_subject(ATTACKER, "nccl_logs", "critical"), json.dumps(m).encode()))
    await w.flood(ATTACKER, items)
    b = honest(27)
    real = gpu_fell_off(b, PCIS[3])
    t0 = time.monotonic()
    await w.publish([real])
    await wait_for(lambda: [a for a in w.audits if (a.get("trigger") or {}).get("id") == real["id"]],
                   CORDON_WITHIN + 2, f"the cordoner's decision on {b}'s GPUFellOffBus")
    took = time.monotonic() - t0
    assert took <= CORDON_WITHIN, f"{b}'s GPUFellOffBus was decided {took:.1f} s after it was published"
    await wait_for(lambda: b in w.drained(), 3, f"{b} drained")
