"""Letting go of the GPUs for a reset: the parts of this process that hold ``/dev/nvidia*`` open.

``nvidia-smi -r`` refuses a GPU that any process holds, and a monitoring agent is such a process: "A
persistent NVML client holds an attachment to every GPU on the node for its process lifetime, and
``nvidia-smi --gpu-reset`` is refused" (NVIDIA/NVSentinel issue #1691; its janitor tears down the GPU
Operator's device plugin, DCGM, dcgm-exporter and GFD before a reset for the same reason, and IBM/CAST
#551 stops nv-hostengine). NVML opens the device files in ``nvmlInit`` and closes them when the last
``nvmlShutdown`` drops its reference count to zero (nvml.h, nvmlShutdown: "Shut down NVML by releasing
all GPU resources previously allocated with nvmlInit_v2()"; "A reference count of the number of
initializations is maintained. Shutdown only occurs when the reference count reaches zero").

So this agent, before resetting a GPU, asks every registered *holder* in its own process (the NVML
collector: its periodic pass and its Xid event wait) to stop and release, resets, and asks them to
resume — never the other way round, and never two releases at once. A holder registers a pair of
coroutines; :func:`released` runs them. A holder that fails to release is reported, not guessed: the
caller re-scans ``/proc`` (gna_sdk.gpu_processes) and refuses while this process still holds the GPU.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

RELEASE_TIMEOUT = 15.0  # s a holder may take to stop (an NVML call in flight on a sick GPU can block)
RESUME_TIMEOUT = 15.0

Step = Callable[[str], Awaitable[None]]  # called with the reason ("reset of GPU 0000:3b:00.0")


@dataclass
class _Holder:
    release: Step
    resume: Step
    order: int  # released in ascending order, resumed in the reverse


@dataclass
class Released:
    """What :func:`released` achieved: the holders that let go, and those that could not (name: why)."""

    holders: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


_holders: dict[str, _Holder] = {}
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
_active = 0  # releases in progress (0 or 1: one at a time)


def register(name: str, release: Step, resume: Step, *, order: int = 0) -> Callable[[], None]:
    """A part of this process that holds GPU device files. ``order``: lower is released first (the users of a
    library before the library itself) and resumed last. Returns the function that unregisters it."""
    _holders[name] = _Holder(release, resume, order)

    def unregister() -> None:
        if _holders.get(name) is not None and _holders[name].release is release:
            del _holders[name]

    return unregister


def holders() -> list[str]:
    return sorted(_holders, key=lambda name: (_holders[name].order, name))


def active() -> bool:
    """True while the GPUs are released for a reset (a holder's pass should not start one)."""
    return _active > 0


@asynccontextmanager
async def released(reason: str, *, release_timeout: float = RELEASE_TIMEOUT,
                   resume_timeout: float = RESUME_TIMEOUT) -> AsyncIterator[Released]:
    """Every registered holder released for the body, then resumed (also when the body raises or is
    cancelled). One release at a time in this process: a second waits for the first to end."""
    global _active
    lock = _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        out = Released()
        _active += 1
        try:
            for name, holder in sorted(_holders.items(), key=lambda kv: (kv[1].order, kv[0])):
                try:
                    await asyncio.wait_for(holder.release(reason), release_timeout)
                    out.holders.append(name)
                except Exception as exc:  # reported; the caller re-scans /proc
                    why = (f"did not stop within {release_timeout:g} s" if isinstance(exc, TimeoutError)
                           else f"{type(exc).__name__}: {exc}")
                    out.failed[name] = why[:300]
                    # it may have released part of what it holds: resume it too
                    out.holders.append(name)
                    log.warning("gpu_release_failed", holder=name, reason=reason, error=why[:300])
            yield out
        finally:
            _active -= 1
            for name in reversed(out.holders):
                again = _holders.get(name)
                if again is None:
                    continue
                try:
                    await asyncio.wait_for(again.resume(reason), resume_timeout)
                except Exception as exc:  # logged; the holder is left as it is
                    log.warning("gpu_resume_failed", holder=name, reason=reason, error=f"{type(exc).__name__}: {exc}")
