"""Issue 21, deliver 1-2: a job's facts are state kept message by message (fleet/job_facts.py).

Whatever the order messages arrive in (membership before or after a process's symptoms, a hostile
node's conflicting size or rank claims moving the majority and so every binding), what the
correlator derived incrementally equals what it derives from scratch, and the verdict is the one
the same messages give in any other arrival order where the trust model says the order does not
matter (honest members only)."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.correlator import ALONE_CONFIDENCE, SYMPTOMS, correlate, fast_verdict, slow_verdict
from fleet.incidents import IncidentTracker
from fleet.job_facts import LOW_VALUES, JobFacts, Membership
from gna_types.details import ProcessSummary

JOB = "0x5eed"
_ids = itertools.count()


def _msg(node: str, type_: str, pid: int, severity: str = "info", **details: Any) -> dict[str, Any]:
    return {"id": f"{next(_ids):026d}", "collector": "nccl_logs", "kind": "event", "type": type_,
            "severity": severity, "node": node, "entity": f"nccl:{node}:{pid}", "time": "2026-12-03T07:00:00.000Z",
            "reason": "x", "message": "x", "details": {"host": node, "pid": pid, "job": JOB, **details}}


def _member(node: str, rank: int, size: int, pid: int | None = None) -> dict[str, Any]:
    return _msg(node, "NCCLJobMember", 1000 + rank if pid is None else pid, world_rank=rank, world_size=size,
                pci=f"0000:{rank % 8:02x}:00.0", hcas=[f"mlx5_{rank % 8}/1"], transport="IB",
                oob=f"ib0:10.0.{rank // 8}.1<0>")


def _timeout(node: str, rank: int, size: int, seq: int, pg: str | None = "0") -> dict[str, Any]:
    d: dict[str, Any] = {"world_rank": rank, "world_size": size, "seq_num": seq, "op_type": "ALLREDUCE"}
    if pg is not None:
        d["pg_id"] = pg
    return _msg(node, "NCCLCollectiveTimeout", 1000 + rank, "critical", **d)


def _progress(node: str, rank: int, size: int, at_seq: int | None, last_enqueued: int) -> dict[str, Any]:
    d: dict[str, Any] = {"world_rank": rank, "world_size": size, "pg_id": "0", "last_enqueued": last_enqueued}
    if at_seq is None:
        d["signal_from_rank"] = 0
    else:
        d["at_seq"] = at_seq
    return _msg(node, "NCCLWatchdogProgress", 1000 + rank, "warning", **d)


def _derived(f: JobFacts) -> tuple[Any, ...]:
    return ({k: {pg: dict(v) for pg, v in by.items() if v} for k, by in f.rank_values.items()},
            {k: {pg: {q: set(r) for q, r in v.items()} for pg, v in by.items() if v} for k, by in f.ranks_at.items()},
            set(f.timed_out_ranks), set(f.self_reported_ranks),
            {r: (m.node, m.process) for r, m in f.ms.ranks.items()}, f.ms.size, f.ms.findings_total)


def _from_scratch(f: JobFacts) -> tuple[Any, ...]:
    f.ms._rebind()
    f._rederive()
    return _derived(f)


@st.composite
def _jobs(draw: Any) -> tuple[int, int, list[dict[str, Any]]]:
    nodes = draw(st.integers(2, 6))
    size = nodes * 4
    hung = draw(st.integers(0, size - 1))
    behind = draw(st.sampled_from([None, "failed_earlier", "nothing_in_flight"]))
    msgs: list[dict[str, Any]] = []
    for r in range(size):
        node = f"n{r // 4}"
        msgs.append(_member(node, r, size))
        if r == hung and behind is None:
            continue  # the hung rank says nothing
        if r == hung and behind == "failed_earlier":
            msgs.append(_timeout(node, r, size, 39))
        elif r == hung:
            msgs.append(_progress(node, r, size, None, 38))
        else:
            msgs.append(_timeout(node, r, size, 40, pg=draw(st.sampled_from(["0", None]))))
            if draw(st.booleans()):
                msgs.append(_progress(node, r, size, 40, 40))
    # a hostile node's claims: another size (from one node: the honest majority stands), taken ranks
    for i in range(draw(st.integers(0, 3))):
        msgs.append(_member("evil", draw(st.integers(0, size * 2)), draw(st.sampled_from([size, size + 1, 7])),
                            pid=90000 + i))
    order = draw(st.permutations(range(len(msgs))))
    return size, hung, [msgs[i] for i in order]


@settings(max_examples=150, deadline=None)
@given(_jobs())
def test_incremental_facts_equal_facts_from_scratch_in_any_arrival_order(job: tuple[int, int, list[dict[str, Any]]]
                                                                         ) -> None:
    _size, _hung, msgs = job
    f = JobFacts(JOB, symptoms=SYMPTOMS)
    for i, m in enumerate(msgs):
        f.add(m, i)
        if i % 7 == 0:  # at any point, not only at the end
            incremental = _derived(f)
            g = JobFacts(JOB, symptoms=SYMPTOMS)
            for k, m2 in enumerate(msgs[:i + 1]):
                g.add(m2, k)
            assert incremental == _from_scratch(g)
    assert _derived(f) == _from_scratch(f)


@settings(max_examples=100, deadline=None)
@given(_jobs())
def test_the_hung_or_behind_rank_is_named_whatever_the_order(job: tuple[int, int, list[dict[str, Any]]]) -> None:
    size, hung, msgs = job
    honest = [m for m in msgs if m["node"] != "evil"]
    (inc,) = correlate(honest)
    assert inc.culprit is not None, inc.reason
    assert inc.culprit["node"] == f"n{hung // 4}" and inc.culprit["rank"] == str(hung), inc.reason
    # the same messages in another order: the same verdict
    shuffled = list(honest)
    random.Random(size).shuffle(shuffled)
    for m in shuffled:
        m.pop("_arrival", None)
    (again,) = correlate(shuffled)
    assert again.culprit == inc.culprit
    # with the hostile claims mixed in: a rank the hostile node claimed first is bound to it (first claims
    # stand), but then the job is contested and nothing another node could act on names anybody else
    (mixed,) = correlate(msgs)
    if mixed.culprit is not None and mixed.culprit["node"] != f"n{hung // 4}":
        assert mixed.contested and not mixed.actionable and mixed.confidence <= ALONE_CONFIDENCE, mixed.reason


def test_a_hostile_majority_change_rebinds_and_rederives_every_rank() -> None:
    """Three nodes of a 12-rank job claim size 12; four other nodes then claim size 16: the majority
    moves, every binding is rebuilt, the derived numbers follow the new bindings."""
    f = JobFacts(JOB, symptoms=SYMPTOMS)
    order = itertools.count()
    for r in range(12):
        f.add(_member(f"n{r // 4}", r, 12), next(order))
        f.add(_timeout(f"n{r // 4}", r, 12, 40), next(order))
    assert f.ms.size == 12 and f.timed_out_ranks == set(range(12))
    for k in range(4):
        f.add(_member(f"x{k}", k, 16, pid=5000 + k), next(order))
    assert f.ms.size == 16 and f.ms.contested
    assert set(f.ms.ranks) == {0, 1, 2, 3} and all(f.ms.ranks[k].node == f"x{k}" for k in range(4))
    assert f.timed_out_ranks == set(), "the old bindings' timeouts no longer count"
    assert _derived(f) == _from_scratch(f)


def test_a_rank_behind_is_kept_as_evidence_whatever_how_many_ranks_report() -> None:
    """The deciding message (the one rank that failed at an earlier collective) is evidence even when
    32,767 other ranks' timeouts came first (the samples hold the first few of them)."""
    size = 4096 * 8
    f = JobFacts(JOB, symptoms=SYMPTOMS)
    order = itertools.count()
    for r in range(size):
        f.add(_member(f"node-{r // 8:04d}", r, size), next(order))
    for r in range(size):
        if r != 4242:
            f.add(_timeout(f"node-{r // 8:04d}", r, size, 40), next(order))
    f.add(_timeout("node-0530", 4242, size, 39), next(order))
    assert fast_verdict(f, {}) is None
    v = slow_verdict(f)
    assert v.culprit == {"node": "node-0530", "entity": "rank:4242", "kind": "rank", "rank": "4242"}, v.reason
    assert any(b["node"] == "node-0530" for b in v.deciding), "the deciding message was dropped"
    assert len(f.low["at"]["0"]) <= LOW_VALUES


def test_a_trickle_of_timeouts_is_judged_from_facts_in_milliseconds() -> None:
    """4,096 nodes: each judgement reads the facts, not the messages; a verdict once the last arrived."""
    import time

    size = 4096 * 8
    t = IncidentTracker(settle=0.0)
    for r in range(size):
        t.add(_member(f"node-{r // 8:04d}", r, size), now=100.0)
    for r in range(size):
        if r != 777:
            t.add(_timeout(f"node-{r // 8:04d}", r, size, 40), now=100.0)
    start = time.process_time()
    rec = t.judge_one(JOB, 101.0)
    took = time.process_time() - start
    assert rec is not None and rec["culprit"]["rank"] == "777", rec
    assert took < 0.25, f"one judgement of a 32,768-rank job took {took * 1000:.0f} ms of CPU"


def test_membership_bounds_a_nodes_claims() -> None:
    ms = Membership(members_per_node=8)
    for pid in range(20):
        ms.claim("n0", ProcessSummary(host="n0", pid=pid, world_rank=pid, world_size=64), pid)
    assert len(ms.members) == 8 and ms.refused == 12
