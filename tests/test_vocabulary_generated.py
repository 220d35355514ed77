"""The typed details (gna_types/details.py) are the one source: the schema and docs/messages.md's table are
generated from them and kept equal; the fleet's boundary (fleet/wire.py) and the generated JSON Schema agree
on every message, whatever its details hold; a typed field of the wrong type or out of bound is refused,
counted, and named -- never read as something else."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.message import make_message, to_dict
from fleet.wire import Rejected, decode_event
from gna_types import generate
from gna_types.details import DETAILS_BY_TYPE, MAX_RANKS, ProcessSummary
from gna_types.policy import POLICY, TABLES
from gna_types.subjects import encode_token
from tests.conftest import VALIDATOR


def test_the_schema_and_the_table_are_what_the_vocabulary_generates() -> None:
    assert generate.main(["--check"]) == 0, "run python -m gna_types.generate"
    doc = generate.DOC.read_text()
    for t in DETAILS_BY_TYPE:
        assert f"`{t}`" in doc.split(generate.BEGIN, 1)[1].split(generate.END, 1)[0]


def test_every_policy_row_is_in_its_generated_table_and_a_hand_edit_is_caught() -> None:
    pages = generate.pages()
    for name, (page, rows) in TABLES.items():
        text = pages[generate.ROOT / page]
        begin, end = generate.markers(name)
        block = text.split(begin, 1)[1].split(end, 1)[0]
        assert len([line for line in block.splitlines() if line.startswith("| `")]) == len(rows)
        for (t, r), v in rows.items():
            assert f"| `{t}` | `{r}` | {v.severity} | `{v.action}` |" in block
    (t, r), v = next(iter(POLICY.items()))
    row = f"| `{t}` | `{r}` | {v.severity} | `{v.action}` |"
    edited = generate.DOC.read_text().replace(row, f"| `{t}` | `{r}` | info | `none` |")
    assert edited != generate.DOC.read_text()
    assert generate._between(edited, generate.DOC, *generate.markers("graded"),
                             generate.policy_table("graded")) == pages[generate.DOC]  # regenerated, not kept
    with pytest.raises(SystemExit, match="markers"):
        generate._between("no markers here", generate.DOC, *generate.markers("graded"), "")


JOB_OR_AGENT = {"nccl_logs", "nccl_env", "nccl_inspector", "agent"}


def test_every_node_finding_has_its_node_condition_and_a_job_s_has_none() -> None:
    """docs/messages.md's type table (collector per type): each node-level type belongs to a category; a job's
    finding or the agent's health to none; and the generated table in docs/exports.md says the same."""
    import re

    from gna_types.conditions import CATEGORIES, CATEGORY_BY_TYPE, MEASUREMENTS, NETWORKING, category

    rows = re.findall(r"^\| `([A-Z][A-Za-z0-9]+)` \| (?:condition|event) \| ([a-z_, ]+) \|", generate.DOC.read_text(), re.M)
    assert len(rows) > 40
    for type_, collectors in rows:
        node_level = set(c.strip() for c in collectors.split(",")) - JOB_OR_AGENT
        if type_ in MEASUREMENTS:
            continue
        assert (type_ in CATEGORY_BY_TYPE) == bool(node_level), (type_, collectors)
    assert set(CATEGORY_BY_TYPE.values()) <= set(CATEGORIES)
    assert category("KernelModuleNotLoaded", "module:nvidia_peermem") == NETWORKING
    assert category("NCCLSocketFallback", "nccl:h:1") is None
    text = generate.EXPORTS.read_text()
    assert generate.conditions_table() in text


def _msg(type_: str, details: dict[str, Any], node: str = "gpu-001") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector="nccl_logs", kind="event", type=type_, severity="warning",
                                entity=f"nccl:{node}:7", reason="R", message="m", details=details))


def _decode(m: dict[str, Any]) -> dict[str, Any]:
    subject = f"gna.events.{encode_token(m['node'])}.{m['collector']}.{m['severity']}"
    return decode_event(subject, json.dumps(m).encode())


@pytest.mark.parametrize(("details", "reason"), [
    ({"world_rank": "3"}, "schema"),  # a rank as text: not read as rank 3, not ignored either
    ({"world_rank": MAX_RANKS}, "out_of_range"),
    ({"world_size": 0}, "out_of_range"),
    ({"host": "h" * 254}, "too_long"),
    ({"hcas": ["mlx5_0/1"] * 65}, "too_long"),
    ({"hcas": "mlx5_0/1"}, "schema"),
    ({"job": ["0x1"]}, "schema"),
])
def test_a_typed_field_of_the_wrong_type_or_out_of_bound_is_refused_by_name(details: dict[str, Any],
                                                                            reason: str) -> None:
    m = _msg("NCCLJobMember", {"job": "0xabc", **details})
    with pytest.raises(Rejected) as err:
        _decode(m)
    assert err.value.reason == reason
    assert next(iter(details)) in str(err.value)
    assert not VALIDATOR.is_valid(m)  # the published schema says the same


def test_typed_fields_per_type() -> None:
    ok = _msg("NCCLWatchdogProgress", {"job": "0x1", "at_seq": -1, "signal_from_rank": 3, "implausible": False,
                                       "pg_desc": "anything: not declared, carried as it came"})
    assert _decode(ok)["details"]["at_seq"] == -1
    with pytest.raises(Rejected):
        _decode(_msg("NCCLWatchdogProgress", {"at_seq": "12"}))
    with pytest.raises(Rejected):
        _decode(_msg("NCCLIBAsyncEvent", {"hca": "mlx5_0", "port": 256}))
    with pytest.raises(Rejected):
        _decode(_msg("NCCLRASReport", {"suspects": [{"host": "h"}]}))  # a suspect without its reason
    # another collector naming a declared field is held to its bound, its types are its own
    ib = to_dict(make_message(node="n", collector="infiniband", kind="event", type="X", severity="info",
                              entity="ib:mlx5_0/1", reason="R", message="m", details={"port": "1", "rank": 7}))
    assert _decode(ib)["details"]["port"] == "1"
    with pytest.raises(Rejected):
        _decode({**ib, "details": {"rank": MAX_RANKS}})


_values = st.one_of(st.none(), st.booleans(), st.integers(-3, MAX_RANKS + 3), st.integers(), st.text(max_size=8),
                    st.text(min_size=250, max_size=330), st.lists(st.text(max_size=70), max_size=66),
                    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3))
_keys = sorted({f for cls in {ProcessSummary, *DETAILS_BY_TYPE.values()} for f in cls.__struct_fields__})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([*DETAILS_BY_TYPE, "NCCLSocketFallback"]), st.dictionaries(st.sampled_from(_keys), _values,
                                                                                  max_size=6))
def test_the_boundary_and_the_published_schema_agree_on_every_message(type_: str, details: dict[str, Any]) -> None:
    """Whatever a message's details hold: the fleet accepts it exactly when the generated schema does, and
    what it accepts has every declared field of its declared type and within bound."""
    m = _msg(type_, details)
    try:
        _decode(m)
        accepted = True
    except Rejected:
        accepted = False
    assert accepted == VALIDATOR.is_valid(m), (accepted, details)
    if accepted:
        typed = msgspec.convert(details, DETAILS_BY_TYPE.get(type_, ProcessSummary))
        for name in typed.__struct_fields__:
            v = getattr(typed, name)
            assert v is None or not isinstance(v, str) or len(v) <= 320
