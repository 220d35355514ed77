"""Issue 23 (2): NCCL and PyTorch rules as registered units (collectors/nccl/rules/).

A rule is one module with its needles, its pattern, the fields it yields with their bounds, its change to
a process's state and the message it emits; severity and action come from gna_types.policy only. These
tests hold the registry to that: every rule module is registered, every field a rule yields is declared
with a bound, every message a rule says on the golden logs and the real corpus has its policy row, and no
module of the NCCL package grades anything itself.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import collectors.nccl
import collectors.nccl.rules as rules_pkg
from collectors.nccl.line import parse_line
from collectors.nccl.matching import Match, Rejected, match_or_reject
from collectors.nccl.prefilter import NEEDLES
from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Heard, Rule
from collectors.nccl.rules import RULES, RULES_BY_NAME, WARNING_RULE
from gna_types.policy import POLICY, verdict

TESTS = Path(__file__).parent
LOGS = [*(TESTS / "golden" / "nccl").glob("*.log"), *(TESTS / "corpus" / "nccl").glob("*/input.log")]


def _matches() -> list[Match]:
    out = []
    for f in LOGS:
        for raw in f.read_bytes().splitlines():
            m = match_or_reject(parse_line(0, raw))
            if isinstance(m, Match):
                out.append(m)
    return out


MATCHES = _matches()


def test_every_rule_module_is_registered_once_and_in_no_other_place() -> None:
    modules = {m.name for m in pkgutil.iter_modules(rules_pkg.__path__)}
    defining = {name for name in modules if isinstance(getattr(importlib.import_module(
        f"collectors.nccl.rules.{name}"), "RULE", None), Rule)}
    registered = {name for name in defining
                  if importlib.import_module(f"collectors.nccl.rules.{name}").RULE in (*RULES, WARNING_RULE)}
    assert defining == registered, f"rule modules not in the registry: {sorted(defining - registered)}"
    assert len(defining) == len(RULES) + 1  # one module per rule, the WARN fallback included
    assert set(RULES_BY_NAME) == {r.name for r in (*RULES, WARNING_RULE)}


@pytest.mark.parametrize("rule", [*RULES, WARNING_RULE], ids=lambda r: r.name)
def test_a_rule_declares_every_field_its_pattern_yields_with_a_bound(rule: Rule) -> None:
    undeclared = set(rule.pattern.groupindex) - set(rule.fields)
    assert not undeclared, f"{rule.name}: fields without a bound: {sorted(undeclared)}"
    assert all(isinstance(v, int) and v > 0 for v in rule.fields.values())
    assert rule.needles, f"{rule.name} brings no prefilter needle: its lines would never be decoded"
    assert set(rule.needles) <= set(NEEDLES)


def test_fields_a_rule_extracts_besides_its_pattern_are_declared_too() -> None:
    seen: dict[str, set[str]] = {}
    for f in LOGS:
        for raw in f.read_bytes().splitlines():
            line = parse_line(0, raw)
            for rule in RULES:
                if rule.extract is None:
                    continue
                seen.setdefault(rule.name, set()).update(rule.extract(line.msg, line.raw))
    for name, fields in seen.items():
        assert fields <= set(RULES_BY_NAME[name].fields), (name, fields - set(RULES_BY_NAME[name].fields))
    assert seen, "no rule with an extract ran over the corpus"


def test_a_line_with_an_extracted_field_past_its_bound_is_rejected() -> None:
    line = parse_line(0, b"h:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12 "
                         b"vendor_err " + b"9" * 11)
    got = match_or_reject(line)
    assert isinstance(got, Rejected) and (got.rule, got.field, got.limit) == ("ib_completion", "vendor_err", 10)


def test_every_message_a_rule_says_on_real_logs_has_its_policy_row() -> None:
    said: set[tuple[str, str]] = set()
    for m in MATCHES:
        st = ProcessState(m.line.host, m.line.pid, "/var/log/nccl/x.log")
        news = st.apply(m)
        rule = m.rule
        if rule.say is None:
            continue
        s = rule.say(m.fields, Heard(st.key, m.line.msg, st.summary(), news))
        if s is None:
            continue
        assert s.type == rule.type, (rule.name, s.type)  # the type a rule declares is the one it emits
        v = verdict(s.type, s.reason)  # KeyError: a message no table grades
        assert v.severity in ("info", "warning", "critical")
        said.add((s.type, s.reason))
    types = {t for t, _ in said}
    assert {"NCCLJobMember", "NCCLCollectiveTimeout", "NCCLWatchdogProgress", "NCCLIBCompletionError",
            "NCCLIBAsyncEvent", "NCCLSocketError", "NCCLWarning"} <= types, types


def test_graded_by_the_table_not_by_the_rule() -> None:
    """The same rule, two reasons, two grades: IB completion status 12 is a retry exhaustion (critical,
    inspect the hardware), any other status is evidence (a warning); an async event NCCL calls non-fatal is
    no fault."""
    def say(raw: bytes) -> tuple[str, str, str]:
        m = match_or_reject(parse_line(0, raw))
        assert isinstance(m, Match) and m.rule.say is not None
        s = m.rule.say(m.fields, Heard("h:1", m.line.msg, {}, False))
        assert s is not None
        v = verdict(s.type, s.reason)
        return s.reason, v.severity, v.action

    assert say(b"h:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode 0") == (
        "IBStatus12", "critical", "inspect_hardware")
    assert say(b"h:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=5 opcode 0") == (
        "IBStatus5", "warning", "none")
    assert say(b"h:1:1 [0] NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async event: GID table change(18)") == (
        "IBAsyncEventNonFatal", "warning", "none")
    assert say(b"h:1:1 [0] NCCL WARN NET/IB : mlx5_0:1 async fatal event: local catastrophic error") == (
        "IBAsyncEvent", "critical", "inspect_hardware")


def _severity_literals(path: Path) -> list[str]:
    """``severity="..."``/``suggested_action="..."`` keyword literals: a grade decided in code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg in ("severity", "suggested_action") and isinstance(
                node.value, ast.Constant | ast.IfExp):
            found.append(f"{path.name}:{node.value.lineno}")
    return found


def test_no_module_of_the_nccl_package_grades_a_finding_itself() -> None:
    package = Path(collectors.nccl.__file__).parent
    found = [hit for p in sorted(package.rglob("*.py")) for hit in _severity_literals(p)]
    assert not found, f"severity or action decided in code, not in gna_types.policy: {found}"


def _graded_in(function: ast.AST, assigned: dict[str, list[ast.expr]]) -> set[tuple[str, str]]:
    named: set[tuple[str, str]] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        args = node.args[1:] if name == "_firing" else node.args if name == "verdict" else []
        if len(args) < 2 or not isinstance(args[0], ast.Constant):
            continue
        exprs = assigned.get(args[1].id, []) if isinstance(args[1], ast.Name) else [args[1]]
        consts = [c.value for e in exprs for c in ast.walk(e) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        named |= {(args[0].value, c) for c in consts}
    return named


def test_the_policy_grades_every_reason_the_plugin_emits_itself() -> None:
    """The reasons the plugin and the hang evidence name in code (conditions over a process's state,
    process ends, repeated warnings, RAS, Flight Recorder) all have their row."""
    package = Path(collectors.nccl.__file__).parent
    named: set[tuple[str, str]] = set()
    for p in (package / "plugin.py", package / "hang_evidence.py"):
        functions = [f for f in ast.walk(ast.parse(p.read_text()))
                     if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in functions:  # a reason held in a variable: its assignments in the same function
            assigned: dict[str, list[ast.expr]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    assigned.setdefault(node.targets[0].id, []).append(node.value)
            named |= _graded_in(function, assigned)
    types = {t for t, _ in named}
    assert {"NCCLNoGDRDMA", "NCCLP2PViaHost", "NCCLHCASelection", "NCCLProcessEnded", "NCCLWarning",
            "NCCLRASReport", "TorchFlightRecord"} <= types, types
    missing = {k for k in named if k not in POLICY}
    assert not missing, missing


@pytest.mark.parametrize(("text", "peer", "port"), [
    # NCCL 2.18-2.21 src/misc/socket.cc ncclSocketProgress: WARN("Net : Connection closed by remote peer %s", ...)
    ("Net : Connection closed by remote peer gpu-0042.cluster.local<43211>", "gpu-0042.cluster.local", 43211),
    # 2.22+: WARN("socketProgress: Connection closed by remote peer %s", ncclSocketToString(&sock->addr, line, 0))
    ("socketProgress: Connection closed by remote peer 10.0.0.7<52314>", "10.0.0.7", 52314),
    ("Net : Call to recv from fe80::5a2f:1<6000> failed : Connection reset by peer", "fe80::5a2f:1", 6000),
    ("Net : Connection closed by remote peer", None, None),  # a build that printed no address
])
def test_a_socket_error_keeps_the_peer_it_names(text: str, peer: str | None, port: int | None) -> None:
    m = match_or_reject(parse_line(0, f"gpu-0001:4242:4250 [3] misc/socket.cc:50 NCCL WARN {text}".encode()))
    assert isinstance(m, Match) and m.rule.name == "socket_error" and m.rule.say is not None
    said = m.rule.say(m.fields, Heard("gpu-0001:4242", m.line.msg, {}, False))
    assert said is not None and (said.details["peer"], said.details["peer_port"]) == (peer, port)
    assert verdict(said.type, said.reason).severity == "warning"
