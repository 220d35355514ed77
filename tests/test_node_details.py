"""Every message type a node publishes has its details as a registered Struct (gna_types/node_details.py):
what the collectors emit is found in the registry, the Structs encode exactly the keys a collector gives
(``null`` kept, an unset field left out), and the published schema holds each field to its Struct's bound."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.message import make_message, to_dict
from gna_types import generate
from gna_types.details import DETAILS_BY_TYPE
from gna_types.gpu_details import GPUXidError
from gna_types.node_details import DETAILS_BY_COLLECTOR, NODE_DETAILS_BY_TYPE, details_type, wire
from tests.conftest import VALIDATOR

ROOT = Path(__file__).resolve().parent.parent
NOT_A_NODE_S = {"correlator"}  # IncidentCulprit: the central cordoner's own
_EMIT = re.compile(r"""(?:\.event|\.condition|\bfinding|alert)\(\s*["']([A-Z][A-Za-z0-9]+)["']""")


def _emitted_in_code() -> set[str]:
    found: set[str] = set()
    for d in ("collectors", "agent", "remediations"):
        for p in (ROOT / d).rglob("*.py"):
            found |= set(_EMIT.findall(p.read_text()))
    return found


def test_every_type_a_node_publishes_has_its_details_struct() -> None:
    rows = re.findall(r"^\| `([A-Z][A-Za-z0-9]+)`(?: / `([A-Z][A-Za-z0-9]+)`)? \| (?:condition|event) \| ([^|]+) \|",
                      generate.DOC.read_text(), re.M)
    assert len(rows) > 40
    documented = {t for a, b, who in rows for t in (a, b) if t and not who.strip().startswith(tuple(NOT_A_NODE_S))}
    in_code = _emitted_in_code()
    assert {"GPUXidError", "IBPortDown", "JuiceFSCacheCold", "CollectorFailing"} <= in_code
    for t in sorted(documented | in_code):
        cls = details_type(t, "nccl_logs" if t.startswith(("NCCL", "Torch")) and t not in NODE_DETAILS_BY_TYPE
                           else "")
        assert cls is not None, f"{t}: no details Struct in gna_types/node_details.py"
    for (collector, t) in DETAILS_BY_COLLECTOR:
        assert t in NODE_DETAILS_BY_TYPE, (collector, t)
    assert set(DETAILS_BY_TYPE) <= set(NODE_DETAILS_BY_TYPE)


def test_wire_keeps_a_null_and_leaves_out_what_was_not_given() -> None:
    first = GPUXidError(xid=79, name="GPU has fallen off the bus", nvidia_action="REBOOT_SYSTEM",
                        application_error=False, count=1, source="kmsg", pid=None, process=None, mig=None, text="t")
    assert wire(first) == {"xid": 79, "name": "GPU has fallen off the bus", "nvidia_action": "REBOOT_SYSTEM",
                           "application_error": False, "count": 1, "source": "kmsg", "pid": None, "process": None,
                           "mig": None, "text": "t"}
    # what every kernel-log finding counts (detail_fields.Occurrences) first, then what it is about
    assert list(wire(first))[:6] == ["count", "xid", "name", "nvidia_action", "application_error", "source"]
    summary = GPUXidError(xid=13, name="n", nvidia_action="IGNORE", application_error=True, count=4, source="nvml")
    assert "pid" not in wire(summary) and "window_s" not in wire(summary)
    assert msgspec.convert(wire(first), GPUXidError) == first


def _bounded() -> list[tuple[str, str, str, int]]:
    """(type, field, "str"/"int", bound) of every node type's bounded text and integer fields."""
    out = []
    for t, cls in sorted(NODE_DETAILS_BY_TYPE.items()):
        if t in DETAILS_BY_TYPE:
            continue
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            ft = f.type
            if isinstance(ft, mi.UnionType):
                ft = next((u for u in ft.types if not isinstance(u, mi.NoneType)), ft)
            if isinstance(ft, mi.StrType) and ft.max_length is not None:
                out.append((t, f.name, "str", ft.max_length))
            elif isinstance(ft, mi.IntType) and ft.le is not None:
                out.append((t, f.name, "int", ft.le))
    return out


BOUNDED = _bounded()


def _msg(type_: str, details: dict[str, Any]) -> dict[str, Any]:
    collector = next((c for c, t in DETAILS_BY_COLLECTOR if t == type_), "x")
    return to_dict(make_message(node="n", collector=collector, kind="event", type=type_, severity="info",
                                entity="e", reason="R", message="m", details=details))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(BOUNDED), st.integers(0, 3))
def test_the_published_schema_holds_every_field_to_its_struct_s_bound(case: tuple[str, str, str, int],
                                                                       over: int) -> None:
    type_, name, kind, bound = case
    inside: Any = "x" * bound if kind == "str" else bound
    past: Any = "x" * (bound + 1 + over) if kind == "str" else bound + 1 + over
    assert VALIDATOR.is_valid(_msg(type_, {name: inside})), (type_, name)
    assert not VALIDATOR.is_valid(_msg(type_, {name: past})), (type_, name)
    assert not VALIDATOR.is_valid(_msg(type_, {name: [inside]})), (type_, name)  # and of its type


@pytest.mark.slow
def test_what_the_collectors_tests_emit_decodes_as_its_struct(tmp_path: Path) -> None:
    """The collectors' own tests run with every emitted message's details decoded strictly as its Struct."""
    files = ["tests/test_kmsg.py", "tests/test_infiniband.py", "tests/test_nvml.py", "tests/test_gpu_devices.py",
             "tests/test_kernel_modules.py", "tests/test_juicefs.py", "tests/test_topology.py",
             "tests/test_straggler_signals.py", "tests/test_nccl_inspector.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                        "tests.node_details_plugin", *files], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "TMPDIR": str(tmp_path)})  # its own: host_guard checks what is left
    assert r.returncode == 0, r.stdout[-6000:]
    assert "MISMATCH" not in r.stdout
    n = int(re.search(r"node details checked: (\d+) messages", r.stdout)[1])  # type: ignore[index]
    assert n > 100
