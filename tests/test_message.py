from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import message as msgmod
from gna_sdk.ids import id_time_ms, new_id
from gna_types.subjects import (
    check_plugin_name,
    decode_token,
    encode_token,
    event_subject,
    is_valid_token,
)
from tests.conftest import validate_message


def _msg(**kw: object) -> msgmod.Message:
    base: dict[str, object] = dict(node="gpu-01.dc1", collector="gpu_devices", kind="condition",
                                   type="GPUDevicesMissing",
                                   status="firing", severity="critical", entity="gpu:0000:3b:00.0",
                                   reason="DeviceNodeMissing", message="GPU 0000:3b:00.0 has no /dev/nvidia2.",
                                   details={"expected": 8}, suggested_action="cordon")
    base.update(kw)
    return msgmod.make_message(**base)  # type: ignore[arg-type]


def test_condition_and_event_validate_against_schema() -> None:
    validate_message(msgmod.to_dict(_msg()))
    event = _msg(kind="event", status=None, type="GPUXidError", severity="warning", suggested_action="none")
    validate_message(msgmod.to_dict(event))
    assert msgmod.decode(msgmod.encode(event)) == event


def test_schema_rejects_what_the_model_forbids() -> None:
    import jsonschema

    bad = msgmod.to_dict(_msg())
    bad["status"] = None  # a condition without a status
    with pytest.raises(jsonschema.ValidationError):
        validate_message(bad)
    bad = msgmod.to_dict(_msg())
    bad["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        validate_message(bad)


@pytest.mark.parametrize("kw", [{"type": "gpu_missing"}, {"kind": "event"}, {"kind": "condition", "status": None}])
def test_make_message_refuses_malformed(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _msg(**kw)


def test_ids_are_unique_and_time_sortable() -> None:
    ids = [new_id() for _ in range(20000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert abs(id_time_ms(ids[0]) - id_time_ms(ids[-1])) < 5000
    assert new_id(now_ms=1000) > ids[-1]  # a clock stepping back never breaks the order
    assert id_time_ms(new_id()) >= id_time_ms(ids[-1])


@given(st.text(min_size=0, max_size=64))
def test_node_token_roundtrips_and_is_a_valid_subject_and_kv_token(name: str) -> None:
    token = encode_token(name)
    assert is_valid_token(token)
    assert decode_token(token) == name


def test_node_token_is_readable_for_hostnames() -> None:
    assert encode_token("gpu-node-01.dc1.example.com") == "gpu-node-01=dc1=example=com"
    assert encode_token("a_b") == "a_5Fb"  # '_' is the escape, so it is escaped itself
    assert event_subject("n.x", "gpu_devices", "critical") == "gna.events.n=x.gpu_devices.critical"


@pytest.mark.parametrize("name", ["GPU", "a.b", "a b", "", "1abc", "a>"])
def test_plugin_names_must_be_subject_safe(name: str) -> None:
    with pytest.raises(ValueError):
        check_plugin_name(name)
