"""The severity/action policy (gna_types/policy.py): one table in code, the same tables in the docs."""

from __future__ import annotations

from pathlib import Path

from gna_sdk import SEVERITIES, SUGGESTED_ACTIONS
from gna_types.policy import POLICY

DOC = (Path(__file__).resolve().parent.parent / "docs" / "messages.md").read_text()


def test_docs_show_every_row_of_the_code_table() -> None:
    docs = DOC + (Path(__file__).resolve().parent.parent / "docs" / "topology.md").read_text()
    for (type_, reason), v in POLICY.items():
        row = f"| `{type_}` | `{reason}` | {v.severity} | `{v.action}` | {v.why} |"
        assert row in docs, row


def test_the_policy_never_cordons_on_a_job_s_finding() -> None:
    for (type_, _reason), v in POLICY.items():
        assert v.severity in SEVERITIES and v.action in SUGGESTED_ACTIONS
        if type_.startswith("NCCL"):
            assert v.action != "cordon", type_
