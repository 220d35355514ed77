"""A trailing newline never passes a validator: ``$`` matches before a final "\n", so ``re.match(r"^x$", "x\n")``
is a match (hypothesis found it in the qualified-name check: ``qualified_name("0\n")`` was True). Every
identifier check uses ``fullmatch``; this keeps each one honest for a valid value with "\n" appended, the value
itself still accepted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.message import make_message
from fleet.cloudevents import check_type_prefix
from gna_types.subjects import check_plugin_name, is_valid_token
from remediations.reboot_request import qualified_name


def _accepts(check: Callable[[str], Any], value: str) -> bool:
    try:
        out = check(value)
    except ValueError:
        return False
    return out not in (False, None)


CHECKS: list[tuple[str, Callable[[str], Any], str]] = [
    ("subject token", is_valid_token, "gpu-0417"),
    ("plugin name", check_plugin_name, "nccl_logs"),
    ("qualified name", qualified_name, "gna.example.com/reboot-required"),
    ("CloudEvents type prefix", check_type_prefix, "com.example.gpu"),
    ("message type", lambda t: make_message(node="n", collector="c", kind="event", type=t, severity="info",
                                            entity="e", reason="R", message="m"), "GPUXidError"),
]


@pytest.mark.parametrize(("what", "check", "good"), CHECKS, ids=[c[0] for c in CHECKS])
@pytest.mark.parametrize("tail", ["\n", "\r\n", "\n\n"])
def test_a_valid_value_with_a_newline_appended_is_refused(what: str, check: Callable[[str], Any], good: str,
                                                          tail: str) -> None:
    assert _accepts(check, good), what
    assert not _accepts(check, good + tail), f"{what}: {good + tail!r} accepted"


@given(st.text(min_size=1, max_size=40))
def test_no_accepted_token_or_qualified_name_holds_a_line_break(text: str) -> None:
    for check in (is_valid_token, qualified_name):
        if check(text):
            assert "\n" not in text and "\r" not in text

