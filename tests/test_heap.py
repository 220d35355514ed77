"""fleet/heap.py: the correlator's long-lived state kept out of CPython's full collections (issue 21).

A full collection walks every tracked container and holds the event loop throughout (~100 ms over a
144k-rank fleet's state); freezing what survived keeps every collection's walk to about ``young_max``
objects. Freezing is only safe for a state without reference cycles: a cycle that dies frozen is not
reclaimed until the next thaw. These tests check both halves on real collections.
"""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from fleet.heap import HeapTender
from fleet.incident_service import IncidentService
from fleet.incidents import IncidentTracker
from fleet.wire import as_received
from sim.scenarios import generate
from tests.conftest import Clock


class Node:  # a tracked, weak-referenceable object
    def __init__(self) -> None:
        self.peer: Any = None


@pytest.fixture
def tender() -> Any:
    gc.collect()
    t = HeapTender(young_max=2_000, clock=Clock())
    t.install(freeze=True)
    assert t.freezes == 1 and gc.get_freeze_count() > 0  # what the process held at start: its modules
    yield t
    t.remove()
    assert gc.get_freeze_count() == 0  # nothing left frozen in the test process
    gc.collect()


def _promote() -> None:
    """What survives two young collections lands in the oldest generation (as a long-lived state does)."""
    gc.collect(0)
    gc.collect(1)


def test_what_survived_is_frozen_once_the_oldest_generation_passes_the_bound(tender: HeapTender) -> None:
    kept = [[i] for i in range(5_000)]  # long-lived tracked containers
    _promote()
    frozen = gc.get_freeze_count()
    tender.tick()
    assert tender.freezes == 2 and gc.get_freeze_count() >= frozen + 5_000
    assert len(gc.get_objects(generation=2)) < tender.young_max  # a full collection walks only what is new
    # counted when frozen (what died frozen since is still counted): never fewer, barely more
    assert gc.get_freeze_count() <= tender.stats()["gc_frozen"] <= gc.get_freeze_count() * 1.01
    assert tender.stats()["gc_freezes"] == 2
    tender.tick()  # no collection moved anything since: no walk over the generation, no second freeze
    assert tender.freezes == 2
    del kept


def test_below_the_bound_nothing_is_frozen(tender: HeapTender) -> None:
    kept = [[i] for i in range(100)]
    _promote()
    tender.tick()
    assert tender.freezes == 1 and len(gc.get_objects(generation=2)) > 100  # walked, not frozen
    del kept


def test_a_frozen_object_dropped_is_freed_at_once_by_its_reference_count(tender: HeapTender) -> None:
    kept = [Node() for _ in range(3_000)]
    ref = weakref.ref(kept[7])
    _promote()
    tender.tick()
    assert tender.freezes == 2
    del kept[7]
    assert ref() is None  # no collection needed: an acyclic state is freed as it is dropped


def test_a_garbage_cycle_is_collected_before_freezing_never_frozen(tender: HeapTender) -> None:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    ref = weakref.ref(a)
    kept = [[i] for i in range(3_000)]
    _promote()
    del a, b  # now garbage, in the oldest generation: the freeze's own collection takes it
    tender.tick()
    assert tender.freezes == 2 and ref() is None
    del kept


def test_a_cycle_that_died_frozen_is_reclaimed_at_the_thaw(tender: HeapTender) -> None:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    ref = weakref.ref(a)
    kept = [[i] for i in range(3_000)]
    _promote()
    tender.tick()
    assert tender.freezes == 2
    del a, b
    gc.collect()
    assert ref() is not None  # frozen: no collection walks it
    assert isinstance(tender.clock, Clock)
    tender.clock.t += tender.thaw_s
    tender.tick(quiet=False)  # a busy moment: the thaw waits
    assert tender.thaws == 0 and ref() is not None
    tender.tick(quiet=True)
    assert tender.thaws == 1 and ref() is None and tender.thaw_collected >= 2
    assert gc.get_freeze_count() > 0  # frozen again after the full pass
    del kept


def test_without_freezing_collections_are_only_timed() -> None:
    t = HeapTender(young_max=10)
    t.install(freeze=False)
    try:
        kept = [[i] for i in range(100)]
        _promote()
        t.tick()
        gc.collect()
        assert t.freezes == 0 and gc.get_freeze_count() == 0 and t.full >= 1 and t.stats()["gc_frozen"] == 0
        del kept
    finally:
        t.remove()


def test_the_service_times_cpythons_collections() -> None:
    """The stats line says the longest pause and how many full ones (gc.callbacks)."""
    svc = IncidentService(["nats://127.0.0.1:1"])
    svc.heap._on_gc("start", {"generation": 2})
    time.sleep(0.01)
    svc.heap._on_gc("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    svc.heap._on_gc("start", {"generation": 0})
    svc.heap._on_gc("stop", {"generation": 0, "collected": 0, "uncollectable": 0})
    st = svc.stats()
    assert st["gc_max_ms"] >= 10 and st["gc_full"] == 1 and st["gc_freezes"] == 0
    svc.heap.install(freeze=False)
    try:
        gc.collect()
        assert svc.heap.full == 2  # a real collection went through the same probe
    finally:
        svc.heap.remove()


@pytest.mark.parametrize("fault", ["hung_rank", "ib_port_down", "socket_node"])
def test_the_trackers_state_holds_no_reference_cycles(tmp_path: Path, fault: str) -> None:
    """What freezing relies on: a job's facts, judged and then dropped, are freed by reference counts
    alone (a cycle in them would stay frozen until the next thaw)."""
    import asyncio

    sc = generate(tmp_path, seed=11, nodes=4, fault=fault, job_nodes=4, second_job=True)
    msgs = [as_received(m) for m in asyncio.run(sc.messages())]
    tracker = IncidentTracker()
    for m in msgs:
        tracker.add(m)
    for job in list(tracker.jobs):
        tracker.judge_one(job, time.time())
    assert tracker.stats()["processes_held"] > 0
    ref = weakref.ref(tracker)
    gc.collect()
    gc.disable()
    try:
        del tracker
        assert ref() is None
        assert gc.collect() == 0  # nothing the state held was left in a cycle
    finally:
        gc.enable()


def test_stats_never_walk_the_frozen_generation(tender: HeapTender, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc.get_freeze_count() walks every frozen object (16-47 ms per stats line over a fleet's state): the
    stats line and the metrics read the tender's own count."""
    def walks() -> int:
        raise AssertionError("gc.get_freeze_count() walks the whole frozen generation")
    monkeypatch.setattr(gc, "get_freeze_count", walks)
    assert tender.stats()["gc_frozen"] > 0 and tender.frozen() > 0


def test_what_cpythons_own_full_collection_left_is_frozen_at_once(tender: HeapTender) -> None:
    """A full collection of CPython's own walks every unfrozen object: what survives it is frozen right
    after (from the gc callback, with no second walk), so a big young container is walked once, not by
    every full collection until the tender's next tick (issue 21: a 90k-entry set in each)."""
    freezes, frozen = tender.freezes, tender.frozen()
    big = {("node", str(i)) for i in range(50_000)}  # a young container: every entry visited by a walk
    gc.collect(2)  # as CPython's own trigger would run it
    assert tender.freezes == freezes + 1 and tender.frozen() > frozen
    assert not any(o is big for g in (0, 1, 2) for o in gc.get_objects(generation=g))  # frozen: walked no more
    del big


def test_a_jobs_member_and_device_tables_stay_frozen_as_members_arrive(tmp_path: Path) -> None:
    """A job's members (tuple keys, untracked records) and the straggler watch's per-job device counts were
    untracked by each full collection and tracked again, young, by the next member: never frozen, walked
    whole by every collection (issue 21). Frozen once, they stay out of every generation a collection walks."""
    import asyncio

    from fleet.stragglers import StragglerWatch

    sc = generate(tmp_path, seed=11, nodes=4, fault="hung_rank", job_nodes=4)
    msgs = [as_received(m) for m in asyncio.run(sc.messages())]
    members = [m for m in msgs if m.get("type") == "NCCLJobMember"]
    assert len(members) > 4
    tracker, watch = IncidentTracker(), StragglerWatch()
    for m in members[:-2]:
        tracker.add(m)
        watch.add(m)
    gc.collect()
    gc.freeze()
    try:
        for m in members[-2:]:  # new keys built at run time: an exact dict would be tracked again, young
            tracker.add(m)
            watch.add(m)
        young = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
        tables = [*(j.facts.ms.members for j in tracker.jobs.values()), *(j.facts.procs for j in tracker.jobs.values()),
                  *watch.job_devs.values()]
        assert tables and all(len(t) for t in tables[:1])
        assert not [t for t in tables if id(t) in young]
    finally:
        gc.unfreeze()
