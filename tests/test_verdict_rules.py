"""Issue 23 (3): the correlator's verdicts as registered rules (fleet/correlator.py VERDICT_RULES).

The registry is documented (docs/correlator.md's table is it), ordered, and each rule decides the faults
it exists for: faults from the repository's independent scenario generator (sim/scenarios.py: real
formats through every node's own checks) are decided by the rule named for them, and near misses (a
healthy fleet, a hung job with one node's agent missing) decide nobody; more near misses live beside the
behaviour they pin (tests/test_correlator.py: a fault on a device no rank used; tests/test_incidents.py: a
job on sockets everywhere). The settle rule comes from the registry: a rule that settles waits, one
that does not publishes at once, and a verdict naming nobody always waits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.correlator import (
    RULES_BY_NAME,
    VERDICT_RULES,
    _Verdict,
    facts_of,
    fast_verdict,
    slow_verdict,
    verdict_rules_table,
    waits_to_settle,
)
from sim.scenarios import generate
from tests.conftest import ROOT


def _verdicts(msgs: list[dict[str, Any]]) -> dict[str, _Verdict | None]:
    jobs, hardware = facts_of(msgs)
    held = {node: list(by.values()) for node, by in hardware.items()}
    out: dict[str, _Verdict | None] = {}
    for job, f in jobs.items():
        v = fast_verdict(f, held)
        if v is None and f.symptomatic:
            v = slow_verdict(f, held)
        out[job] = v
    return out


def test_the_registry_is_ordered_complete_and_documented() -> None:
    assert [r.priority for r in VERDICT_RULES] == sorted({r.priority for r in VERDICT_RULES})
    assert len(RULES_BY_NAME) == len(VERDICT_RULES)
    assert all(r.reads and r.rests_on and r.says for r in VERDICT_RULES)
    # the rules published at once come before the ones that wait: a waiting rule never overrides them
    assert [r.settles for r in VERDICT_RULES] == sorted(r.settles for r in VERDICT_RULES)
    assert verdict_rules_table() in (ROOT / "docs" / "correlator.md").read_text(), \
        "docs/correlator.md: paste fleet.correlator.verdict_rules_table()"


@pytest.mark.parametrize(("fault", "rule", "seed"), [
    ("gpu_fell_off", "hardware", 11), ("ib_port_down", "hardware", 12), ("ib_port_down_early", "hardware", 13),
    ("socket_node", "socket_node", 14), ("hung_rank", "hung_rank", 15), ("behind_rank", "behind_rank", 16),
])
async def test_each_generated_fault_is_decided_by_its_rule(tmp_path: Path, fault: str, rule: str, seed: int) -> None:
    sc = generate(tmp_path / fault, seed=seed, nodes=6, fault=fault, job_nodes=4, second_job=True)
    verdicts = _verdicts(await sc.messages())
    for job, want in sc.expected.items():
        v = verdicts.get(job)
        if want is None:  # the healthy second job: nobody named
            assert v is None or v.culprit is None, (job, v)
            continue
        assert v is not None and v.rule == rule, (fault, v)
        assert v.culprit is not None and {k: v.culprit[k] for k in want} == want
        assert waits_to_settle(v, True) == RULES_BY_NAME[rule].settles


async def test_a_healthy_fleet_decides_nobody(tmp_path: Path) -> None:
    sc = generate(tmp_path / "h", seed=21, nodes=6, fault="healthy", job_nodes=4, second_job=True)
    for v in _verdicts(await sc.messages()).values():
        assert v is None or v.culprit is None


async def test_a_hung_job_with_one_node_s_agent_missing_names_nobody(tmp_path: Path) -> None:
    """Near miss of hung_rank: the silent rank's node published nothing, so the job's ranks are not all
    known; a rank that merely did not speak is not named."""
    sc = generate(tmp_path / "m", seed=22, nodes=4, fault="hung_rank", job_nodes=4, second_job=False, noise=False)
    msgs = await sc.messages()
    (want,) = [c for c in sc.expected.values() if c]
    without = [m for m in msgs if m["node"] != want["node"]]
    (v,) = [v for v in _verdicts(without).values() if v is not None]
    assert v.culprit is None and v.rule == "hung_rank" and "ranks are known" in v.reason
    assert waits_to_settle(v, True)


def test_a_verdict_naming_nobody_always_waits_and_a_fast_culprit_does_not() -> None:
    nobody = _Verdict(None, 0.0, [], (), "nothing stands out", rule="hardware")
    named = _Verdict({"node": "n", "entity": "gpu:0000:18:00.0", "kind": "gpu"}, 0.97, [], (), "r", rule="hardware")
    slow = _Verdict({"node": "n", "entity": "ranks:3", "kind": "rank"}, 0.85, [], (), "r", rule="hung_rank")
    assert waits_to_settle(nobody, False) and not waits_to_settle(named, True) and waits_to_settle(slow, False)
    assert waits_to_settle(None, True) and not waits_to_settle(None, False)
