"""State files (#13 D14 and its siblings): any content is either a valid document or set aside with
a message; a collector or the spool never crashes at start on what a disk error or a hand edit left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gna_sdk import statefile
from gna_sdk.persist import BootScopedSet
from gna_sdk.statefile import read_state

JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                       max_leaves=10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64) | st.builds(lambda d: json.dumps(d).encode(), JSONISH)
       | st.builds(lambda d: json.dumps({"version": 1, "boot_id": "b", **d}).encode(),
                   st.dictionaries(st.sampled_from(["seen", "boot_id", "seq", "fatal"]), JSONISH)))
def test_any_content_is_valid_or_set_aside(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "seen.json"
    path.write_bytes(data)
    before = statefile.set_aside_count
    s = BootScopedSet(path, "b")
    assert all(isinstance(x, str) for x in s.items)
    if statefile.set_aside_count > before:
        assert not path.exists() and list(tmp_path.glob("seen.json.bad-*"))
    else:
        doc = json.loads(data)
        assert doc["version"] == 1 and isinstance(doc["seen"], list)
    for p in tmp_path.glob("seen.json*"):
        p.unlink()


def test_a_valid_file_is_read_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    assert read_state(path, version=1, valid=lambda d: True, what="x") == {}
    path.write_text('{"version": 1, "n": 3}')
    assert read_state(path, version=1, valid=lambda d: d["n"] > 0, what="x") == {"version": 1, "n": 3}
    # a validator that trips over the shape counts as invalid, not as a crash
    path.write_text('{"version": 1, "n": "three"}')
    assert read_state(path, version=1, valid=lambda d: d["n"] > 0, what="x") == {}
    assert list(tmp_path.glob("x.json.bad-*"))


def test_kmsg_state_of_the_wrong_types_is_set_aside(tmp_path: Path) -> None:
    from collectors.kmsg_xid import _valid_state

    good: dict[str, Any] = {"version": 1, "boot_id": "b", "seq": 12, "fatal": {"0000:18:00.0": {"codes": [79],
                                                                                                  "last": 5.0}}}
    assert _valid_state(good)
    for bad in ({**good, "seq": "12"}, {**good, "seq": -1}, {**good, "fatal": ["x"]},
                {**good, "fatal": {"x": {"codes": "79", "last": 1}}}, {**good, "fatal": {"x": {"codes": [], "last": True}}},
                {**good, "boot_id": 7}):
        assert not _valid_state(bad), bad
