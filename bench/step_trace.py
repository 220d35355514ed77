"""Which step held an asyncio loop: every callback the loop runs timed, the long ones named by where they ran.

A loop-stall probe (fleet/incident_service.py) says *that* the loop was held 70 ms, not by what. Installed
in a service process (``install(threshold_ms)``, before its loop starts), this wraps
``asyncio.events.Handle._run`` -- the one place asyncio's event loop runs a ready callback
(Lib/asyncio/base_events.py ``_run_once``, CPython v3.11.7) -- and, for each callback that took longer than
the threshold, logs one ``slow_step`` line: its wall and thread-CPU milliseconds, the milliseconds CPython's
cycle collector ran inside it, and, for a task's step, the task's await chain before and after (the innermost
frame where the coroutine was suspended when the step began and where it suspended when it ended): the code
between those two awaits is the step. Every full collection over ``SLOW_GC_MS`` is logged too (``slow_gc``:
its CPU, the unfrozen objects it walked, their entries per type and the largest containers), and
``time_calls`` times named functions (``slow_call``). Diagnostic only, for benches: a few microseconds a
callback (two thread-CPU clock reads and the await chain), so a traced run is not a result.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import structlog

log = structlog.get_logger("step_trace")

SLOW_GC_MS = 10.0

_gc_ms = 0.0  # every collection's milliseconds, summed (a step's share: the sum's growth across it)
_gc_t0 = 0.0
_gc_c0 = 0.0
_gc_unfrozen = 0
_gc_big: list[tuple[int, str, str]] = []
_gc_types: list[tuple[int, int, str]] = []  # (entries, objects, type) of the unfrozen objects, most entries first


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    """Time every collection; a full one's size (the unfrozen objects it walks) is counted before it starts,
    and a full one over SLOW_GC_MS is logged (``slow_gc``)."""
    global _gc_ms, _gc_t0, _gc_unfrozen, _gc_c0
    if phase == "start":
        if info.get("generation") == 2:
            objs = [o for g in (0, 1, 2) for o in gc.get_objects(generation=g)]
            _gc_unfrozen = len(objs)
            sized = []
            by_type: dict[str, list[int]] = {}
            for o in objs:  # the biggest containers: a traversal visits each of their entries
                try:
                    n = len(o)
                except Exception:
                    n = 0
                t = by_type.setdefault(type(o).__name__, [0, 0])
                t[0] += 1
                t[1] += n
                if n >= 1000:
                    sized.append((n, id(o), o))
            _gc_types[:] = sorted(((v[1], v[0], k) for k, v in by_type.items()), reverse=True)[:6]
            top = sorted(sized, key=lambda x: x[0], reverse=True)[:4]
            _gc_big[:] = [(n, type(o).__name__, _referrer(o)) for n, _i, o in top]
            del objs, sized, top
            _gc_c0 = time.thread_time()
        _gc_t0 = time.perf_counter()
    else:
        ms = (time.perf_counter() - _gc_t0) * 1000.0
        _gc_ms += ms
        if info.get("generation") == 2 and ms >= SLOW_GC_MS:
            log.info("slow_gc", ms=round(ms, 2), cpu_ms=round((time.thread_time() - _gc_c0) * 1000.0, 2),
                     walked=_gc_unfrozen, collected=info.get("collected"), biggest=_gc_big[:4],
                     types=_gc_types[:6])


def _referrer(o: Any) -> str:
    """Who holds a container: the attribute name in the first object whose __dict__ holds it."""
    for r in gc.get_referrers(o)[:8]:
        for k, v in (list(vars(r).items())[:200] if hasattr(r, "__dict__") and not isinstance(r, type) else ()):
            if v is o:  # an instance whose attributes live inline (3.11's managed dicts): no dict in between
                return f"{type(r).__name__}.{k}"
        if isinstance(r, dict):
            for k, v in list(r.items())[:200]:
                if v is o:
                    holders = [h for h in gc.get_referrers(r)[:4] if getattr(h, "__dict__", None) is r]
                    return f"{type(holders[0]).__name__ if holders else '?'}.{k}"
    return "?"


def chain(task: Any) -> list[str]:
    """The await chain of a task's coroutine, outermost first, as ``file:line function`` (suspended now)."""
    out: list[str] = []
    coro = task.get_coro() if hasattr(task, "get_coro") else None
    for _ in range(64):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        code = frame.f_code
        out.append(f"{code.co_filename.rsplit('/', 2)[-1] if '/' in code.co_filename else code.co_filename}"
                   f":{frame.f_lineno} {code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return out


def install(threshold_ms: float) -> None:
    """Time every callback of every asyncio loop in this process from now on; log those over ``threshold_ms``."""
    handle_run = asyncio.events.Handle._run
    gc.callbacks.append(_on_gc)

    def _run(self: asyncio.events.Handle) -> None:
        task = getattr(self._callback, "__self__", None)
        is_task = isinstance(task, asyncio.Task)
        before = chain(task) if is_task else None
        gc0 = _gc_ms
        t0, c0 = time.perf_counter(), time.thread_time()
        handle_run(self)
        ms = (time.perf_counter() - t0) * 1000.0
        if ms >= threshold_ms:
            log.info("slow_step", ms=round(ms, 2), cpu_ms=round((time.thread_time() - c0) * 1000.0, 2),
                     gc_ms=round(_gc_ms - gc0, 2),
                     task=task.get_name() if is_task else None,
                     resumed_at=before, suspended_at=chain(task) if is_task and not task.done() else None,
                     callback=None if is_task else repr(self._callback)[:200])

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def time_calls(threshold_ms: float, *targets: str) -> None:
    """Also time these functions (``module:Class.method`` or ``module:function``) wherever they are called;
    log a ``slow_call`` line for each call over ``threshold_ms`` (wall and thread CPU): what inside a long
    step took the time."""
    import functools
    import importlib

    for target in targets:
        mod_name, _, path = target.partition(":")
        owner: Any = importlib.import_module(mod_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def timed(*args: Any, _fn: Any = fn, _target: str = target, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                ms = (time.perf_counter() - t0) * 1000.0
                if ms >= threshold_ms:
                    log.info("slow_call", call=_target, ms=round(ms, 2),
                             cpu_ms=round((time.thread_time() - c0) * 1000.0, 2))

        setattr(owner, name, functools.wraps(fn)(timed))
