"""What CPython's cycle collector walks in a central service: its long-lived state kept out of full collections.

A full (generation 2) collection visits every tracked container the process holds and the event loop waits
throughout: over the correlator's state of a 144k-rank fleet it took ~100 ms (docs/benchmarks.md, the
correlator at fleet scale), far above the few milliseconds a loop may be held (issue 21). CPython runs one
whenever the objects that survived into the oldest generation grew by a quarter since the last
(Modules/gcmodule.c, ``long_lived_pending > long_lived_total / 4``, CPython v3.11.7): while a fleet's
membership arrives, that is a full pass over an ever larger state.

The state is built to hold no reference cycles (fleet/job_facts.py: records, dicts, sets of strings and
numbers; a dropped job is freed by reference counts alone, tests/test_heap.py). So what survived a while is
*frozen* (``gc.freeze``: moved to a generation no collection walks) whenever the unfrozen oldest generation
passes ``young_max`` objects, right after one full collection over the unfrozen part only (so no garbage
cycle among them is frozen: that collection costs at most what ``young_max`` objects cost). Every
collection after that walks at most about ``young_max`` objects. When CPython runs a full collection of its
own, what survived it is frozen at once from the ``gc.callbacks`` hook (no second walk: it just left only
survivors, all in the oldest generation), so a large young container -- a straggler evaluation's set of every
device, alive across its yields -- is walked by one full collection, not by each until the next freeze.

Frozen objects are still freed by reference counting the moment they are dropped; only a *cycle* that
becomes garbage while frozen waits: every ``thaw_s`` (default 6 h), at a quiet moment, everything is thawed,
collected once in full (one stall the size of the whole state, timed and logged) and frozen again. What
that collection finds (``thaw_collected``) says whether anything leaked in between.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# Objects the unfrozen oldest generation may hold before it is collected and frozen. Filing a 250-job fleet
# start (72,230 ranks) in process, the longest step of the loop was 5.2 ms at 5,000, 8.2 ms at 10,000, 18.3 ms
# at 20,000, and 57.4 ms without freezing (bench/correlator_gc.py --young-max, 2-core sandbox, 2026-12-06).
YOUNG_MAX = 5_000
THAW_S = 6 * 3600.0  # s between two full collections of everything (cycles that died frozen reclaimed)


class TrackedDict(dict):  # type: ignore[type-arg]
    """A dict CPython never untracks, so it is frozen once and never walked again.

    A full collection untracks an exact dict whose keys and values are all untracked
    (Modules/gcmodule.c ``untrack_dicts``, CPython v3.11.7); inserting a tracked key or value tracks it again,
    into the *youngest* generation (Objects/dictobject.c ``MAINTAIN_TRACKING``). A job's members keyed by
    ``(node, process)`` tuples built at run time, valued by untracked records (``gc=False`` structs), bounced
    that way: untracked by each collect-and-freeze, young again at the next member, so never frozen and
    walked whole -- every entry -- by each later collection: ~800 such dicts, 127-311k entries, in every full
    collection of a 500-job fleet start (bench/incidents_scale.py --trace-steps, ``slow_gc``). A subclass is
    not an exact dict: it stays tracked, the next freeze takes it, and inserting into a frozen dict moves
    nothing."""

    __slots__ = ()


class HeapTender:
    """Every collection timed (the longest, how many full); with ``install(freeze=True)`` the freezing above.
    Call :meth:`tick` often (the stats loop's probe, every 50 ms); it acts only after a collection of
    generation 1 moved objects into the oldest generation (counted by the ``gc.callbacks`` hook), so an idle
    service does nothing. :meth:`remove` unhooks and thaws what it froze."""

    def __init__(self, *, young_max: int = YOUNG_MAX, thaw_s: float = THAW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.young_max, self.thaw_s, self.clock = young_max, thaw_s, clock
        self.freezes = 0
        self.freeze_ms_max = 0.0  # the longest collect-and-freeze (its collection walks <= ~young_max objects)
        self.thaws = 0
        self.thaw_ms = 0.0  # the last full collection of everything
        self.thaw_collected = 0  # what it found unreachable (cycles that died while frozen)
        self.max_ms = 0.0  # the longest collection CPython ran on its own
        self.full = 0  # CPython's own full collections
        self._promoted = 0  # generation-1 collections since the last look (the oldest generation grew)
        self._frozen = 0  # objects this froze (see frozen())
        self._in_freeze = False  # its own full collection is running (the gc callback leaves the freeze to it)
        self._t0 = 0.0
        self._thawed_at = clock()
        self._freezing = False

    def install(self, *, freeze: bool) -> None:
        """Hook the timing; with ``freeze``, also freeze what the process holds now (its modules, classes and
        functions: tens of thousands of objects that would otherwise be walked by every full collection)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        self._freezing = freeze
        self._thawed_at = self.clock()
        if freeze:
            self.freeze()

    def remove(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._freezing:
            gc.unfreeze()
            self._frozen = 0
        self._freezing = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.max_ms = max(self.max_ms, (time.perf_counter() - self._t0) * 1000.0)
        generation = info.get("generation")
        if generation == 2:
            self.full += 1
            if self._freezing and not self._in_freeze:
                # CPython's own full collection just walked everything unfrozen and left only survivors, all in
                # the oldest generation: freezing them now costs nothing more (no second walk) and keeps what
                # it walked -- a large young container included -- out of every later one
                self._freeze_survivors()
                self.freezes += 1
                return
        if generation in (1, 2):
            self._promoted += 1

    def tick(self, *, quiet: bool = True) -> None:
        """Freeze what survived once the oldest generation passed ``young_max``; thaw everything once every
        ``thaw_s`` when ``quiet`` (the caller has nothing waiting to be judged)."""
        if not self._freezing:
            return
        now = self.clock()
        if quiet and now - self._thawed_at >= self.thaw_s:
            self._thaw(now)
            return
        if not self._promoted:
            return
        self._promoted = 0
        if len(gc.get_objects(generation=2)) > self.young_max:
            self.freeze()

    def freeze(self) -> None:
        t0 = time.perf_counter()
        self._collect()  # the frozen generation is not walked: this is a pass over the unfrozen objects only
        self._freeze_survivors()
        self.freezes += 1
        self.freeze_ms_max = max(self.freeze_ms_max, (time.perf_counter() - t0) * 1000.0)

    def _thaw(self, now: float) -> None:
        gc.unfreeze()
        t0 = time.perf_counter()
        self.thaw_collected = self._collect()
        self.thaw_ms = round((time.perf_counter() - t0) * 1000.0, 1)
        self._frozen = 0
        self._freeze_survivors()
        self._thawed_at = now
        self.thaws += 1
        log.info("heap_thawed", collected=self.thaw_collected, ms=self.thaw_ms, frozen=self._frozen)

    def _collect(self) -> int:
        """A full collection of this tender's own (the gc callback leaves its survivors to the caller)."""
        self._in_freeze = True
        try:
            return gc.collect()
        finally:
            self._in_freeze = False

    def _freeze_survivors(self) -> None:
        """Freeze what a full collection just left (all of it in the oldest generation), counted here, where
        it costs what that collection walked (gc.get_freeze_count() walks the whole frozen list: ~27 ns an
        object, 16-47 ms per stats line over a 144k-rank fleet's state, measured with bench/step_trace.py)."""
        self._frozen += len(gc.get_objects(generation=2))
        gc.freeze()
        self._promoted = 0

    def frozen(self) -> int:
        """Objects this froze, as counted when it froze them (0 when it never froze: another's freeze is not
        ours to show). Frozen objects freed since by reference counting are still counted, until a thaw."""
        return self._frozen

    def stats(self) -> dict[str, Any]:
        return {"gc_max_ms": round(self.max_ms, 1), "gc_full": self.full, "gc_freezes": self.freezes,
                "gc_freeze_ms_max": round(self.freeze_ms_max, 1), "gc_frozen": self.frozen(),
                "gc_thaws": self.thaws, "gc_thaw_ms": self.thaw_ms, "gc_thaw_collected": self.thaw_collected}
