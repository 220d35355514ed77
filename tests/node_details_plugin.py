"""A pytest plugin (``-p tests.node_details_plugin``): every message a collector's emitter builds during the
run has its details decoded as its registered Struct (gna_types/node_details.py ``details_type``) -- strict
types, bounds, and the fields the Struct requires -- and a type without one is named. The session fails on
the first kind of mismatch; tests/test_node_details.py runs the collectors' own tests under it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gna_types.node_details import details_type

CHECKED: dict[str, int] = {}
PROBLEMS: dict[str, str] = {}


def check(msg: Any) -> None:
    if msg.collector in ("agent",) and msg.type.startswith("Test"):
        return
    cls = details_type(msg.type, msg.collector, reason=msg.reason, status=msg.status)
    key = f"{msg.collector}/{msg.type}"
    if cls is None:
        PROBLEMS.setdefault(key, "no Struct registered")
        return
    try:
        msgspec.convert(msg.details, cls)
    except msgspec.ValidationError as exc:
        PROBLEMS.setdefault(key, f"{cls.__name__}: {exc}: {msg.details!r}"[:2000])
        return
    CHECKED[key] = CHECKED.get(key, 0) + 1


@pytest.fixture(autouse=True)
def _check_details(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.emitter as emitter

    real = getattr(emitter, "make_message")  # noqa: B009 -- imported there, patched there

    def make_message(*args: Any, **kwargs: Any) -> Any:
        m = real(*args, **kwargs)
        check(m)
        return m

    monkeypatch.setattr(emitter, "make_message", make_message)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    print(f"\nnode details checked: {sum(CHECKED.values())} messages of {len(CHECKED)} types")
    for key, n in sorted(CHECKED.items()):
        print(f"  ok {key}: {n}")
    for key, why in sorted(PROBLEMS.items()):
        print(f"  MISMATCH {key}: {why}")
    if PROBLEMS:
        session.exitstatus = 1
