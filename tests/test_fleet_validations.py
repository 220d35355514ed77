"""fleet/validations.py: the central uncordon judged from each node's own validation report (issue 28)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.validations import LEVELS, NodeValidations
from gna_types.validation import CheckResult, ValidationReport

T0 = 1_780_000_000.0  # the triggers' resolution, the node's clock


def report(node: str = "gpu-01", verdict: str = "passed", level: str = "standard", started: float = T0 + 5,
           **kw: Any) -> dict[str, Any]:
    checks = [CheckResult(name="nccl_allreduce", status="failed" if verdict == "failed" else "passed")]
    return ValidationReport(node=node, level=level, verdict=verdict, started=started, ended=started + 60,  # type: ignore[arg-type]
                            checks=checks, **kw).to_details()


def test_only_the_nodes_own_report_since_the_resolution_at_the_required_level_counts() -> None:
    v = NodeValidations()
    assert v.judge("standard", "gpu-01", T0).verdict == "waiting"
    assert v.file("gpu-01", report(started=T0 - 30)) is None  # ran while the fault was still there
    older = v.judge("standard", "gpu-01", T0)
    assert older.verdict == "waiting" and "older than its triggers' resolution" in older.summary
    assert v.file("gpu-01", report(level="quick")) is None
    shallow = v.judge("standard", "gpu-01", T0)
    assert shallow.verdict == "waiting" and "level quick; standard is required" in shallow.summary
    assert v.file("gpu-01", report(level="full", started=T0 + 9)) is None  # deeper than required: counts
    ok = v.judge("standard", "gpu-01", T0)
    assert ok.verdict == "passed" and "gpu-01's own report" in ok.summary
    assert v.file("gpu-01", report(verdict="failed", started=T0 + 20)) is None
    bad = v.judge("standard", "gpu-01", T0)
    assert bad.verdict == "failed" and "failed: nccl_allreduce" in bad.summary


def test_a_report_about_another_node_or_out_of_order_is_refused_and_counted() -> None:
    v = NodeValidations()
    assert v.file("gpu-02", report(node="gpu-01")) == "report names another node"
    assert v.judge("standard", "gpu-01", T0).verdict == "waiting" and "gpu-02" not in v.latest
    assert v.file("gpu-01", report(started=T0 + 50)) is None
    assert v.file("gpu-01", report(verdict="failed", started=T0 + 10)) == "older than the node's last report"
    assert v.judge("standard", "gpu-01", T0).verdict == "passed"
    assert v.file("gpu-01", {"node": "gpu-01", "verdict": "passed", "level": "standard", "started": -1}).startswith(
        "invalid report")
    assert v.file("gpu-01", "not a dict").startswith("invalid report")  # type: ignore[arg-type]
    assert v.refused == {"report names another node": 1, "older than the node's last report": 1,
                         "invalid report: Expected `float` >= 0.0 - at `$.started`": 1,
                         "invalid report: Object missing required field `node`": 1}


def test_bounded_to_max_nodes_least_recent_first() -> None:
    v = NodeValidations(max_nodes=3)
    for i in range(5):
        assert v.file(f"n{i}", report(node=f"n{i}")) is None
    assert list(v.latest) == ["n2", "n3", "n4"] and v.refused["evicted (too many nodes)"] == 2


_reports = st.fixed_dictionaries({
    "node": st.sampled_from(["gpu-01", "gpu-02"]),
    "verdict": st.sampled_from(["passed", "failed", "busy", "unavailable"]),
    "level": st.sampled_from(LEVELS),
    "started": st.floats(min_value=T0 - 100, max_value=T0 + 100),
})


@settings(max_examples=200, deadline=None)
@given(reports=st.lists(st.tuples(st.sampled_from(["gpu-01", "gpu-02"]), _reports), max_size=12),
       junk=st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=20),
                               st.dictionaries(st.text(max_size=8), st.integers(), max_size=3)), max_size=3),
       level=st.sampled_from(LEVELS))
def test_a_pass_is_only_ever_the_nodes_own_newest_report(reports: list[tuple[str, dict[str, Any]]],
                                                        junk: list[Any], level: str) -> None:
    """Whatever arrives in whatever order: judge() says passed only when the newest report filed from the node's
    own subject, about itself, started at or after the resolution, at the level or deeper, passed."""
    v = NodeValidations()
    for item in junk:
        assert v.file("gpu-01", item) is not None
    for subject_node, r in reports:
        v.file(subject_node, report(**r))
    own = [r for s, r in reports if s == r["node"] == "gpu-01"]
    top = max((r["started"] for r in own), default=None)
    newest = [r for r in own if r["started"] == top][-1] if own else None  # equal starts: the last filed wins
    verdict = v.judge(level, "gpu-01", T0).verdict
    if verdict == "passed":
        assert newest is not None and newest["started"] >= T0
        assert LEVELS.index(newest["level"]) >= LEVELS.index(level)
        assert newest["verdict"] == "passed"
    if newest is None or newest["started"] < T0:
        assert verdict == "waiting"


async def test_waiting_asks_the_node_at_most_once_per_interval_and_a_failed_ask_is_counted() -> None:
    now = [100.0]
    asked: list[str] = []
    fail = [False]

    async def ask(node: str) -> None:
        if fail[0]:
            raise ConnectionError("no NATS")
        asked.append(node)

    v = NodeValidations(ask=ask, ask_interval=30.0, clock=lambda: now[0])
    validate = v.validator()
    first = await validate("standard", node="gpu-01", after=T0)
    assert first.verdict == "waiting" and first.summary.endswith("; asked it to validate (gna.validate.gpu-01)")
    again = await validate("standard", node="gpu-01", after=T0)
    assert again.verdict == "waiting" and "asked" not in again.summary and asked == ["gpu-01"]
    now[0] += 31
    fail[0] = True
    failed = await validate("standard", node="gpu-01", after=T0)
    assert failed.summary.endswith("; asking it to validate failed (ConnectionError)") and v.ask_failures == 1
    v.file("gpu-01", report())
    fail[0] = False
    now[0] += 31
    assert (await validate("standard", node="gpu-01", after=T0)).verdict == "passed" and asked == ["gpu-01"]
