"""Issue 23 (1), the fleet half: the fleet decodes typed details at its boundary and never decides on an
untyped key (fleet/typed_details.py).

* the decision modules (fleet/job_facts.py, correlator.py, incidents.py) read no ``details`` dict: an AST
  scan finds every read of one (``m["details"]``, ``m.get("details")``, the former ``_details(m)``) outside
  the functions that only display a message (``brief``);
* the wire refuses a NCCL message whose declared field is of the wrong type or out of its bound exactly as
  before (same reason, counted), and keeps what it decoded for the correlator (``typed=True``) without
  ever putting it where a consumer prints or forwards the message;
* a message that did not come through the wire is decoded the same way, leniently (a field of the wrong
  type is absent), and the caller's dict is never changed.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleet import typed_details
from fleet.correlator import correlate
from fleet.incidents import IncidentTracker
from fleet.typed_details import TYPED, CountersRead, NothingRead, counters, decode, nccl, typed, with_typed
from fleet.wire import Rejected, Rejections, decode_event, decode_job
from gna_types.details import CollectiveTimeout, JobMember, ProcessSummary, RASReport, RasSuspect
from gna_types.subjects import subjects_for
from tests.conftest import ROOT
from tests.verdict_evidence import JOB, finding, member, said, through_wire, timeout

DECISION_MODULES = ("fleet/job_facts.py", "fleet/correlator.py", "fleet/incidents.py")
DISPLAY_ONLY = {"fleet/job_facts.py": {"brief"}}  # functions that show a message's details, deciding nothing


def _untyped_reads(path: Path) -> list[tuple[int, str]]:
    """(line, enclosing function) of every read of a message's ``details`` dict."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            hit = False
            if isinstance(child, ast.Subscript) and isinstance(child.slice, ast.Constant) \
                    and child.slice.value == "details":
                hit = True
            elif isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Name) and f.id == "_details") or (isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and child.args \
                        and isinstance(child.args[0], ast.Constant) and child.args[0].value == "details") or (isinstance(f, ast.Name) and f.id == "getattr" and len(child.args) > 1 \
                        and isinstance(child.args[1], ast.Constant) and child.args[1].value == "details"):
                    hit = True
            if hit:
                found.append((getattr(child, "lineno", 0), name))
            visit(child, name)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("module", DECISION_MODULES)
def test_the_decision_modules_read_details_only_typed(module: str) -> None:
    reads = _untyped_reads(ROOT / module)
    allowed = DISPLAY_ONLY.get(module, set())
    bad = [(line, func) for line, func in reads if func not in allowed]
    assert not bad, (f"{module} reads a message's details untyped at {bad}: decide on fleet/typed_details.py's "
                     "Structs (nccl(m), counters(m)), or add the field to gna_types/details.py")


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scan can fail: each kind of untyped read is found, and attributed to its function."""
    src = tmp_path / "m.py"
    src.write_text("def judge(m):\n    a = m['details']\n    b = m.get('details')\n    c = _details(m)\n"
                   "    return getattr(m, 'details')\n\ndef brief(m):\n    return m.get('details')\n")
    assert _untyped_reads(src) == [(2, "judge"), (3, "judge"), (4, "judge"), (5, "judge"), (8, "brief")]


def _wire(m: dict[str, Any], typed: bool = False) -> dict[str, Any]:
    subject = subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"])[0]
    data = json.dumps(m).encode()
    return (decode_job(subject, data, typed=typed) if subject.startswith("gna.jobs.")
            else decode_event(subject, data, typed=typed))


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("world_rank", "3", "schema"), ("world_rank", True, "schema"), ("world_rank", 1 << 18, "out_of_range"),
    ("world_size", 0, "out_of_range"), ("hcas", "mlx5_0/1", "schema"), ("hcas", ["x" * 65], "too_long"),
    ("seq_num", 1.5, "schema"), ("pg_id", 3, "schema"), ("host", "h" * 254, "too_long"),
    ("last_enqueued", "7", "schema"), ("implausible", "yes", "schema"),
])
@pytest.mark.parametrize("typed", [False, True])
def test_a_wrong_typed_field_is_refused_with_its_reason_whether_kept_typed_or_not(
        field: str, value: Any, reason: str, typed: bool) -> None:
    m = timeout("n0", 0, 4, 40)
    m["details"][field] = value
    with pytest.raises(Rejected) as exc:
        _wire(m, typed)
    assert exc.value.reason == reason, str(exc.value)
    counted = Rejections()
    counted.record(exc.value.reason, "s", b"x")
    assert counted.counts == {reason: 1}


def test_the_wire_keeps_the_typed_details_only_for_the_correlator() -> None:
    m = timeout("n0", 1, 4, 40)
    plain, kept = _wire(m), _wire(m, typed=True)
    assert TYPED not in plain  # what the events CLI prints, the exporter forwards, the dashboards show
    json.dumps(plain)
    t = kept[TYPED]
    assert isinstance(t, CollectiveTimeout) and (t.world_rank, t.seq_num, t.pg_id, t.job) == (1, 40, "0", JOB)
    assert kept["details"] == plain["details"] == m["details"]  # the dict stays, for display
    assert nccl(kept) is t and typed(kept) is t and with_typed(kept) is kept  # decoded once, never again
    other = _wire(finding("n0", "kmsg_xid", "GPUFellOffBus", "gpu:0000:18:00.0", text="x"), typed=True)
    assert isinstance(other[TYPED], NothingRead) and with_typed(other) is other


def test_the_tracker_decides_on_the_wire_s_struct_without_decoding_again(monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = through_wire([member(f"n{r}", r, 4) for r in range(4)] + [
        said("n0", 0, 4, "NCCLRASReport", "critical", suspects=[
            {"reason": "dead", "host": "10.0.0.161", "pid": 1003, "rank": 3, "comm_hash": JOB[2:]}])])
    calls = []
    monkeypatch.setattr(typed_details, "decode", lambda *a: calls.append(a))
    t = IncidentTracker()
    for m in msgs:
        t.add(m, now=1.0)
    report = t.jobs[JOB].facts.ras["n0"][0]
    assert report is msgs[-1] and isinstance(report[TYPED], RASReport)
    t.judge(set(t.jobs), now=10.0)
    assert calls == []


def test_a_message_off_the_wire_is_decoded_leniently_and_the_caller_s_dict_left_alone() -> None:
    m = member("n0", 0, 2)
    m["details"].update(world_rank="0", hcas=["mlx5_0/1", 7], pci=None)
    before = json.dumps(m)
    t = nccl(m)
    assert isinstance(t, JobMember) and t.world_rank is None and t.hcas is None and t.world_size == 2
    assert t.host == "n0" and t.job == JOB
    assert TYPED not in m
    kept = with_typed(m)
    assert kept is not m and kept[TYPED] == t and json.dumps(m) == before
    msgs = [member("n0", 0, 2), member("n1", 1, 2), timeout("n0", 0, 2, 5)]
    copies = json.dumps(msgs)
    correlate(msgs)
    assert json.dumps(msgs) == copies  # correlate() and diagnose print their input afterwards


def test_lenient_lists_are_read_item_by_item_as_far_as_the_decision_reads() -> None:
    good = {"reason": "dead", "pid": 5}
    r = decode(RASReport, {"suspects": [good, {"pid": 6}, "x", {**good, "rank": "9"}] + [good] * 100})
    assert isinstance(r, RASReport) and len(r.suspects) == 62 and r.suspects[0] == RasSuspect(reason="dead", pid=5)
    assert r.suspects[1] == RasSuspect(reason="dead", pid=5, rank=None)  # the rank of the wrong type: absent
    f = finding("n0", "infiniband", "IBErrorCountersIncreasing", "ib:mlx5_0/1", counters=[
        {"severity": "critical", "rule": 5, "full_window": True}, "x", {"severity": "warning"}])
    got = counters(f)
    assert [(c.severity, c.rule, c.full_window) for c in got] == [("critical", None, True), ("warning", None, None)]
    assert isinstance(typed(f), CountersRead)
    assert decode(ProcessSummary, "not a dict") == ProcessSummary()
    assert decode(ProcessSummary, {"world_size": 1 << 40}).world_size is None


def test_every_struct_the_fleet_keeps_is_outside_the_cycle_collector() -> None:
    """Issue 21: what the correlator keeps per message holds no cycle (gc=False where declared here)."""
    for cls in (typed_details.NothingRead, typed_details.CounterRead, typed_details.CountersRead):
        assert msgspec.structs.force_setattr is not None  # msgspec present
        assert cls.__struct_config__.gc is False
