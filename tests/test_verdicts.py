"""The severity/action policy: one table in code, the same table in docs/messages.md."""

from __future__ import annotations

from pathlib import Path

from collectors.verdicts import POLICY
from gna_sdk import SEVERITIES, SUGGESTED_ACTIONS

DOC = (Path(__file__).resolve().parent.parent / "docs" / "messages.md").read_text()


def test_docs_show_every_row_of_the_code_table() -> None:
    for (type_, reason), v in POLICY.items():
        row = f"| `{type_}` | `{reason}` | {v.severity} | `{v.action}` | {v.why} |"
        assert row in DOC, row


def test_the_policy_never_cordons_on_a_job_s_finding() -> None:
    for (type_, _reason), v in POLICY.items():
        assert v.severity in SEVERITIES and v.action in SUGGESTED_ACTIONS
        if type_.startswith("NCCL"):
            assert v.action != "cordon", type_
