"""Issue 24 (2), fleet side: incidents, the dashboard, `top`, `events` and the cordoner's audit name a job
as operators name it (``team-a/llama-70b (PyTorchJob)``, ``slurm:1234 (llama)``), the commId kept as the key.

A job's name is what each node's lookup gave (collectors/nccl/job_identity.py, details.job_name): display
only, the name most of the job's nodes give, never a key and never evidence -- a node that names the job
otherwise is outvoted, and a name changes no verdict.
"""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from fleet.state import FleetState, decode_incident
from fleet.top import render_incidents
from fleet.wire import Rejected
from tests.verdict_evidence import JOB, incident, member, timeout, verdict

NAME = "team-a/llama-70b (PyTorchJob)"


def _named(msgs: list[dict[str, Any]], name_of: dict[str, str]) -> list[dict[str, Any]]:
    for m in msgs:
        if m["node"] in name_of:
            m["details"] = {**m["details"], "job_name": name_of[m["node"]], "job_kind": "PyTorchJob"}
    return msgs


def _hung(size: int = 8) -> list[dict[str, Any]]:
    return [member(f"n{r // 2}", r, size) for r in range(size)] + [
        timeout(f"n{r // 2}", r, size, 40) for r in range(size) if r != 5]


def test_the_incident_carries_the_name_most_nodes_give_and_keeps_the_commid() -> None:
    plain = _hung()
    named = _named(_hung(), {"n0": NAME, "n1": NAME, "n2": NAME, "n3": "team-b/other (JobSet)"})
    a, b = verdict(plain), verdict(named)
    assert a is not None and b is not None and a.culprit == b.culprit  # a name decides nothing
    inc = incident(named)
    assert inc is not None and inc.job == JOB and inc.job_name == NAME
    rec = inc.to_dict()
    assert rec["job"] == JOB and rec["job_name"] == NAME
    unnamed = incident(plain)
    assert unnamed is not None and unnamed.job_name is None


def test_a_tie_is_broken_the_same_way_every_time() -> None:
    inc = incident(_named(_hung(), {"n0": "b/x (Job)", "n1": "a/x (Job)"}))
    assert inc is not None and inc.job_name == "a/x (Job)"


def test_views_show_the_name_and_bound_it() -> None:
    inc = incident(_named(_hung(), {"n0": NAME}))
    assert inc is not None
    rec = {**inc.to_dict(), "status": "open", "updated": 1.0}
    view = decode_incident(rec)
    assert view["job_name"] == NAME and view["job"] == JOB
    state = FleetState()
    assert state.apply_incident(rec)
    table = render_incidents(state)
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    assert NAME in console.export_text()
    with pytest.raises(Rejected):
        decode_incident({**rec, "job_name": "x" * 100_000})
    with pytest.raises(Rejected):
        decode_incident({**rec, "job_name": ["not", "text"]})
