"""#20 deliver 7: "any single reporter", hypothesis-driven, in-process.

Random honest fleets (2-16 nodes, 8 ranks each, one job on all of them) with one fault -- a hung rank, a
GPU fallen off the bus under a rank, an IB port down under a rank, or none -- and one attacker node (a
member of the job or not) sending any sequence of schema-valid messages on its own subjects: membership
claims, timeouts, progress lines, RAS reports, completion errors, hardware findings about its own GPUs
and ports, for the real job or made-up ones. Every message goes through what the live correlator
decodes (fleet.wire.decode_event / decode_job on the subjects its agent publishes), then into
``fleet.incidents.IncidentTracker`` on a simulated clock.

Invariants (docs/correlator.md, issue #20):
- no record is acted on (actionable, or confident enough for the cordoner) with a culprit on a healthy
  node other than the attacker's own;
- once the attacker stops, the honest hardware culprit is named, actionable, within 3 s of simulated time;
  a hung rank is named (its node; or the attacker's own) when the attacker made no conflicting claim;
- a job nobody made a conflicting claim in is never ``contested``;
- with no fault, nothing is acted on except against the attacker itself.

The fleets and the attacks are built from the documented formats (tests/trust_fleet.py), not from the
correlator's code.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.cordoner import CULPRIT_MIN_CONFIDENCE
from fleet.incidents import IncidentTracker
from fleet.wire import Rejected, decode_event, decode_job
from tests.trust_fleet import HCAS, PCIS, SEQ, Job, gpu_fell_off, hardware, ib_port_down, publications

ATT = "att-node"
NAMES = [f"gpu-{i:03d}" for i in range(16)]
FAULTS = ("none", "hung", "gpu", "ib")
SETTLED_WITHIN = 3.0
STEP = 0.05  # the simulated clock's tick between messages


@dataclass(repr=False)
class Scenario:
    job: Job
    fault: str
    fault_rank: int | None
    honest: list[tuple[float, dict[str, Any]]]
    attack: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    @property
    def fault_node(self) -> str | None:
        return None if self.fault_rank is None else self.job.node_of(self.fault_rank)

    @property
    def fault_entity(self) -> str | None:
        if self.fault_rank is None:
            return None
        if self.fault == "gpu":
            return f"gpu:{self.job.pci_of(self.fault_rank)}"
        if self.fault == "ib":
            return f"ib:{self.job.port_of(self.fault_rank)}"
        return f"rank:{self.fault_rank}"

    def conflicting_claims(self) -> bool:
        """Did the attacker claim, for the real job, a world rank it does not host or another world size? A
        membership fact claims; so does the process summary any NCCL message carries (``world_rank``,
        ``world_size``). A process that states no world rank (``world_rank`` null) claims none."""
        own = set(self.job.ranks_of(ATT)) if ATT in self.job.nodes else set()
        for _, m in self.attack:
            d = m["details"]
            if m["collector"] != "nccl_logs" or d.get("job") != self.job.job:
                continue
            if m["type"] == "NCCLJobMember" and (d.get("world_size") != self.job.size or d.get("world_rank") not in own):
                return True
            if d.get("world_rank") is not None and (d["world_rank"] not in own or d.get("world_size") != self.job.size):
                return True
        return False

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis' printer: the short form below
        p.text(repr(self))

    def __repr__(self) -> str:  # what a falsifying example shows: the fleet in one line, the attack in full
        attack = [(round(t, 2), m["type"], m["entity"], {k: m["details"].get(k) for k in (
            "job", "world_rank", "world_size", "rank", "seq_num", "at_seq", "last_enqueued", "suspects", "peer")
            if k in m["details"]}, m["severity"], m["status"]) for t, m in self.attack]
        return (f"Scenario(nodes={self.job.nodes}, job={self.job.job}, size={self.job.size}, fault={self.fault}, "
                f"fault_rank={self.fault_rank} on {self.fault_node}, attack={attack})")

    def attacker_self_fault(self) -> bool:
        return any(m["collector"] != "nccl_logs" and m["severity"] == "critical" for _, m in self.attack)


@st.composite
def fleets(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(2, 16))
    honest_nodes = NAMES[:n]
    nodes = list(honest_nodes)
    if draw(st.booleans()):  # the attacker runs ranks of the job too
        nodes.insert(draw(st.integers(0, n)), ATT)
    job = Job(f"0x{draw(st.integers(1, 2**64 - 1)):016x}", nodes)
    fault = draw(st.sampled_from(FAULTS))
    candidates = [r for r in range(job.size) if job.node_of(r) != ATT]
    fault_rank = None if fault == "none" else draw(st.sampled_from(candidates))
    out: list[tuple[float, dict[str, Any]]] = []
    for r in range(job.size):
        out.append((draw(st.floats(0.0, 0.5)), job.member(r)))
    if fault_rank is not None:
        t = 10.0
        if fault == "gpu":
            out.append((t, gpu_fell_off(job.node_of(fault_rank), job.pci_of(fault_rank))))
        elif fault == "ib":
            out.append((t, ib_port_down(job.node_of(fault_rank), job.port_of(fault_rank))))
        for r in range(job.size):
            if r != fault_rank:
                out.append((t + draw(st.floats(0.0, 0.5)), job.timeout(r)))
    return Scenario(job, fault, fault_rank, out)


def attacker_messages(draw: st.DrawFn, sc: Scenario) -> list[tuple[float, dict[str, Any]]]:
    """Anything schema-valid A's own nkey may publish."""
    job = sc.job
    fake = Job(f"0x{draw(st.integers(1, 2**64 - 1)):016x}", [ATT])
    own = job.ranks_of(ATT) if ATT in job.nodes else []
    rank = st.one_of(st.sampled_from(own or [0]), st.integers(0, job.size + 8), st.just(10**6))
    out: list[tuple[float, dict[str, Any]]] = []
    for _ in range(draw(st.integers(0, 14))):
        t = draw(st.floats(0.0, 14.0))
        target = draw(st.sampled_from([job, job, job, fake]))
        r = draw(rank)
        pid = draw(st.sampled_from([40000 + r % 8, 50000 + r % 1000]))
        world_rank = draw(st.sampled_from([r, None]))
        kind = draw(st.sampled_from(["member", "timeout", "progress", "ras", "completion", "hardware"]))
        base = min(r, target.size - 1) if r < 10**6 else 0
        said = functools.partial(target.nccl, base, node=ATT, pid=pid, world_rank=world_rank)

        if kind == "member":
            size = draw(st.sampled_from([target.size, target.size * 2, 10**6, 8]))
            m = said("NCCLJobMember", "info", world_size=size, nranks=size, comm_id=target.job, rank=r, size=size,
                     cuda_dev=r % 8)
            m["details"]["world_rank"] = r
        elif kind == "timeout":
            seq = draw(st.sampled_from([SEQ, SEQ - 1, SEQ + 1, 1]))
            m = said("NCCLCollectiveTimeout", "critical", seq_num=seq, op_type="ALLREDUCE", rank=r, pg_id="0",
                     pg_rank=r, timeout_ms=600000, ran_for_ms=600100)
        elif kind == "progress":
            m = said("NCCLWatchdogProgress", "warning", pg_id="0", rank=r,
                     at_seq=draw(st.sampled_from([None, SEQ, SEQ - 5])),
                     last_enqueued=draw(st.sampled_from([SEQ - 1, SEQ, -1])), last_completed=SEQ - 1,
                     signal_from_rank=draw(st.sampled_from([None, 0])))
        elif kind == "ras":
            named = draw(st.lists(st.integers(0, target.size - 1), min_size=1, max_size=3))
            reason = draw(st.sampled_from(["dead", "unresponsive", "missing", "error", "behind"]))
            m = said("NCCLRASReport", "warning", suspects=[target.ras_suspect(x, reason) for x in named],
                     missing_processes=[], dead_processes=[], ras_nccl_version="2.28.7", ras_format="text")
        elif kind == "completion":
            peer = draw(st.sampled_from(target.nodes))
            m = target.completion_error(base, peer)
            m = said("NCCLIBCompletionError", "critical", **{k: m["details"][k] for k in
                                                             ("peer", "status", "status_name", "vendor_err", "hca")})
        else:
            type_ = draw(st.sampled_from(["GPUFellOffBus", "GPULost", "IBPortDown", "GPUXidError"]))
            entity = (f"ib:{draw(st.sampled_from(HCAS))}" if type_ == "IBPortDown"
                      else f"gpu:{draw(st.sampled_from(PCIS))}")
            status = None if type_ == "GPUXidError" else draw(st.sampled_from(["firing", "resolved"]))
            m = hardware(ATT, type_, entity, severity=draw(st.sampled_from(["critical", "warning"])), status=status)
        out.append((t, m))
    return out


@st.composite
def attacked(draw: st.DrawFn) -> Scenario:
    sc = draw(fleets())
    sc.attack = attacker_messages(draw, sc)
    return sc


def wire(m: dict[str, Any]) -> list[dict[str, Any]]:
    """What the live correlator decodes of one message: membership from the jobs stream, the rest from the
    events stream (evidence copies are the same messages again); refusals are dropped."""
    out = []
    for subject in publications(m):
        data = json.dumps(m).encode()
        try:
            if subject.startswith("gna.jobs.") and subject.endswith(".member"):
                out.append(decode_job(subject, data))
            elif subject.startswith("gna.events."):
                out.append(decode_event(subject, data))
        except Rejected:
            continue
    return out


def run(sc: Scenario) -> list[tuple[float, dict[str, Any]]]:
    """Every record the tracker publishes, with the simulated time it was published at. Messages that
    arrive within one tick are judged together (the live service debounces 50 ms the same way)."""
    tracker = IncidentTracker()
    base = 1_000_000.0
    timeline = sorted([*sc.honest, *sc.attack], key=lambda x: x[0])
    end = max(t for t, _ in timeline) + SETTLED_WITHIN + 2.0
    published: list[tuple[float, dict[str, Any]]] = []
    i, now = 0, 0.0
    while now <= end:
        touched: set[str] = set()
        while i < len(timeline) and timeline[i][0] <= now:
            for msg in wire(timeline[i][1]):
                touched |= tracker.add(msg, base + now)
            i += 1
        touched |= tracker.due(base + now)
        if touched:
            published += [(now, r) for r in tracker.judge(touched, base + now)]
        now = round(now + STEP, 6)
    return published


def acted_on(rec: dict[str, Any]) -> bool:
    return rec.get("status") == "open" and rec.get("culprit") is not None and (
        bool(rec.get("actionable")) or float(rec.get("confidence") or 0) >= CULPRIT_MIN_CONFIDENCE)


def latest(published: list[tuple[float, dict[str, Any]]], job: str, at: float) -> dict[str, Any] | None:
    recs = [r for t, r in published if r.get("job") == job and t <= at]
    return recs[-1] if recs else None


def check(sc: Scenario) -> None:
    published = run(sc)
    allowed = {ATT} | ({sc.fault_node} if sc.fault_node else set())
    for t, rec in published:
        c = rec.get("culprit") or {}
        if acted_on(rec):
            assert c.get("node") in allowed, (
                f"t={t:.2f}: {c.get('node')} would be cordoned (fault {sc.fault} on {sc.fault_node}): {rec}")
    ready = max(t for t, _ in [*sc.honest, *sc.attack]) + SETTLED_WITHIN
    last = latest(published, sc.job.job, ready)
    if not sc.conflicting_claims() and last is not None:
        assert last.get("contested") is not True, f"contested with no conflicting claim: {last}"
    if sc.fault in ("gpu", "ib") and not sc.attacker_self_fault():
        assert last is not None and last.get("status") == "open", f"no open incident for the {sc.fault} fault: {last}"
        c = last.get("culprit") or {}
        assert (c.get("node"), c.get("entity")) == (sc.fault_node, sc.fault_entity), last
        assert acted_on(last) and last.get("actionable") is True, last
    elif sc.fault == "hung" and not sc.conflicting_claims() and not sc.attacker_self_fault():
        assert last is not None and last.get("status") == "open", f"no open incident for the hang: {last}"
        c = last.get("culprit") or {}
        assert c.get("node") in allowed, last
        if c.get("node") == sc.fault_node:
            assert c.get("rank") == str(sc.fault_rank), last


PROFILE = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROFILE
@given(fleets())
def test_honest_fleets_name_their_culprit_and_nothing_else(sc: Scenario) -> None:
    """No attacker at all: the baseline every attacked case is measured against."""
    check(sc)


@PROFILE
@given(attacked())
def test_any_single_reporter_cannot_frame_a_healthy_node_nor_hide_the_culprit(sc: Scenario) -> None:
    check(sc)


def test_records_carry_the_trust_fields() -> None:
    """The record the cordoner and the views read says whether it may be acted on and whether the job's
    membership was contested (docs/correlator.md)."""
    sc = Scenario(Job("0x00000000000000c1", NAMES[:2]), "gpu", 3, [])
    job = sc.job
    sc.honest = [(0.0, m) for m in job.members()] + [(5.0, gpu_fell_off(job.node_of(3), job.pci_of(3)))] + [
        (5.1, job.timeout(r)) for r in range(job.size) if r != 3]
    published = run(sc)
    assert published
    for _, rec in published:
        assert isinstance(rec.get("actionable"), bool) and isinstance(rec.get("contested"), bool), rec
    last = latest(published, job.job, 100.0)
    assert last is not None and last["actionable"] is True and last["contested"] is False, last
