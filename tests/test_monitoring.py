"""Day-one alerts and dashboard (deploy/monitoring/): promtool checks the rules and runs their unit tests;
every metric, label and label value the rules and the dashboard's queries use is one a real agent serves
on /metrics (scraped here from an agent running on a simulated GPU node), or one the central services
serve (the correlator, the cordoner and the dashboard, run here in-process on a real nats-server through a
simulated fleet's incident); runbooks match the alerts. ``up`` and ``ALERTS`` are the two series
Prometheus itself writes.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.emitter import ActiveCondition
from agent.metrics import MAX_TYPES, OTHER_TYPE, AgentMetrics
from gna_types.conditions import CATEGORIES, CATEGORY_BY_TYPE
from sim.host import SimHost
from tests.conftest import agent_config, running_agent
from tests.fake_nvml import FakeGPU, FakeNVML

ROOT = Path(__file__).resolve().parent.parent
MON = ROOT / "deploy" / "monitoring"
RULES = MON / "gpu-node-agent.rules.yaml"
RULES_TEST = MON / "gpu-node-agent.rules.test.yaml"
DASHBOARD = MON / "grafana" / "gpu-node-agent.json"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/gpu-node-agent/gpu-node-agent/blob/main/docs/runbooks.md#"
PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = "promtool not on PATH: Debian's `prometheus` package ships it (apt-get install prometheus)"

# series Prometheus writes itself: a target's scrape result, and the alerts of the loaded rules
SYNTHESIZED = {"up": {"job", "instance"}, "ALERTS": {"alertname", "alertstate", "severity"}}
TARGET_LABELS = {"job", "instance", "node"}  # added to every scraped series (node: the PodMonitor's relabeling)
CAMEL = re.compile(r"^[A-Z][a-z0-9]*(?:[A-Z][a-z0-9]*|[A-Z]+(?=[A-Z]|$))*$")
SEVERITIES = {"critical", "warning", "info"}


# -- a real scrape -----------------------------------------------------------------------------------
@dataclass
class Exported:
    """What /metrics served: series names, each metric's label names, and values seen per label."""

    names: set[str] = field(default_factory=set)
    labels: dict[str, set[str]] = field(default_factory=dict)  # no entry: a family without samples
    values: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    text: str = ""
    allowed: dict[str, set[str]] = field(default_factory=dict)  # filled by problems()


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",)}


def _parse_exposition(text: str, metrics: AgentMetrics | None) -> Exported:
    out = Exported(text=text)
    for fam in text_string_to_metric_families(text):
        names = {fam.name + s for s in SUFFIXES.get(fam.type, ("",))} | {s.name for s in fam.samples}
        out.names |= names
        for s in fam.samples:
            out.labels.setdefault(s.name, set()).update(s.labels)
            for k, v in s.labels.items():
                out.values.setdefault((s.name, k), set()).add(v)
    # the agent's own labelled metrics without a child yet still declare their label names
    for m in vars(metrics).values() if metrics is not None else ():
        declared, base = getattr(m, "_labelnames", None), getattr(m, "_name", None)
        if declared is None or base is None:
            continue
        for series in out.names:
            if series == base or (series.startswith(base + "_") and series.removeprefix(base + "_") in
                                  {"total", "created", "bucket", "sum", "count"}):
                out.labels.setdefault(series, set()).update(declared)
    return out


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


async def _scrape(tmp: Path) -> tuple[str, AgentMetrics]:
    host = SimHost.gpu_node(tmp / "host", gpus=2, hcas=2)
    host.remove_dev_node("nvidia1")  # GPUDevicesMissing, critical: a condition and a (dry-run) cordon
    host.set_port("mlx5_1", 1, state="1: DOWN", phys_state="3: Disabled")  # IBPortDown
    extra = "".join(f"[collectors.{c}]\ninterval = 0.2\njitter = 0.0\n"
                    for c in ("gpu_devices", "infiniband", "nvml", "juicefs"))
    # NATS is not needed to serve /metrics: an unreachable server, the agent spools
    cfg = agent_config(tmp, servers=["nats://127.0.0.1:9"], host_root=host.root, extra=extra)
    async with running_agent(cfg) as agent:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        body = ""
        while loop.time() < deadline:
            await asyncio.sleep(0.1)
            if agent.metrics_server is None:
                continue
            body = await asyncio.to_thread(_get, f"http://127.0.0.1:{agent.metrics_server.port}/metrics")
            if ('gna_collector_runs_total{collector="infiniband"} 3' in body
                    and 'gna_remediation_decisions_total{' in body and "DCGM_FI_DEV_GPU_TEMP{" in body):
                break
        return body, agent.metrics


FLEET_RULES = """[remediations]
cordon_with = "slurm"
[[remediations.rules]]
name = "cordon-on-timeout"
action = "cordon"
[remediations.rules.match]
type = ["NCCLCollectiveTimeout"]
status = ["event"]
"""


async def _scrape_fleet(tmp: Path) -> dict[str, str]:
    """The correlator's, the cordoner's and the dashboard's /metrics, scraped after a simulated fleet's
    port-down stall went through them: an open incident with an actionable culprit, the cordoner's (dry-run)
    decisions, and a message each service refused at the wire."""
    import nats
    from aiohttp import web
    from nats.js.api import StreamConfig

    from agent import config as configmod
    from agent.nats_link import JOBS_STREAM_SUBJECTS, JOBS_STREAM_TRANSFORM, STREAM_SUBJECTS
    from agent.nats_server import NatsServerProcess
    from fleet.cordoner import Cordoner
    from fleet.dashboard import make_app
    from fleet.incident_service import IncidentService
    from fleet.state import FleetFeed, FleetState
    from gna_types.subjects import subjects_for
    from sim.scenarios import generate

    sc = generate(tmp / "fleet", seed=11, nodes=4, fault="ib_port_down", job_nodes=3, second_job=False)
    msgs = await sc.messages()
    server = NatsServerProcess(tmp / "nats-server")
    server.start()
    nc = svc = cord = feed = runner = None
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="GNA_EVENTS", subjects=STREAM_SUBJECTS))
        await js.add_stream(StreamConfig(name="GNA_JOBS", subjects=JOBS_STREAM_SUBJECTS,
                                         subject_transform=JOBS_STREAM_TRANSFORM))
        records: list[dict[str, Any]] = []
        audits: list[dict[str, Any]] = []

        async def on_incident(m: Any) -> None:
            records.append(json.loads(m.data))

        async def on_audit(m: Any) -> None:
            audits.append(json.loads(m.data))

        await nc.subscribe("gna.incidents.>", cb=on_incident)
        await nc.subscribe("gna.actions.>", cb=on_audit)
        svc = IncidentService([server.url], debounce=0.02, metrics_listen="127.0.0.1:0")
        cord = Cordoner(configmod.parse(FLEET_RULES, file="<t>").agent, [server.url], metrics_listen="127.0.0.1:0")
        state = FleetState()
        feed = FleetFeed(state, [server.url])
        await svc.start()
        await cord.start()
        await feed.start()
        runner = web.AppRunner(make_app(state, feed), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        dash_port = runner.addresses[0][1]

        async def publish(batch: list[dict[str, Any]]) -> None:
            for m in batch:
                for subject in subjects_for(m["node"], m["collector"], m["severity"], m["type"], m["details"]):
                    await js.publish(subject, json.dumps(m).encode(), headers={"Nats-Msg-Id": m["id"]})

        await publish([m for m in msgs if m["type"] == "NCCLJobMember"])
        await asyncio.sleep(0.3)
        await publish([m for m in msgs if m["type"] != "NCCLJobMember"])
        await js.publish("gna.events.liar.nvml.critical", b"not json")  # refused by every reader: not_json
        for _ in range(400):
            if (records and any(a["trigger"]["type"] == "IncidentCulprit" for a in audits)
                    and svc.rejections.counts and cord.rejections.counts and state.rejections.counts):
                break
            await asyncio.sleep(0.05)
        assert svc.metrics_server is not None and cord.metrics_server is not None
        out = {}
        for name, port in (("correlator", svc.metrics_server.port), ("cordoner", cord.metrics_server.port),
                           ("dashboard", dash_port)):
            out[name] = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        return out
    finally:
        if runner is not None:
            await runner.cleanup()
        for s in (feed, cord, svc):
            if s is not None:
                await s.stop()
        if nc is not None:
            await nc.close()
        server.stop(kill=True)


@pytest.fixture(scope="module")
def fleet_scrape(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import os
    import stat

    tmp = tmp_path_factory.mktemp("fleet")
    bindir = tmp / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"  # the slurm plugin needs its binary; the cordoner only dry-runs it here
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        return asyncio.run(_scrape_fleet(tmp))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, fleet_scrape: dict[str, str]) -> Iterator[Exported]:
    import collectors.nvml as nvml

    fake = FakeNVML([FakeGPU("00000000:18:00.0"), FakeGPU("00000000:2A:00.0")])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nvml, "load_nvml", lambda: (fake, ""))  # the agent's NVML collector reads these two GPUs
        text, metrics = asyncio.run(_scrape(tmp_path_factory.mktemp("scrape")))
    yield _parse_exposition(text + "".join(fleet_scrape.values()), metrics)


# -- a small PromQL reader: selectors (metric, matchers) and grouping labels ----------------------------
TOKEN = re.compile(r"""
    (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$\w+)
  | (?P<num>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)(?:ms|[smhdwy])*)
  | (?P<id>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|==|!=|>=|<=|[-+*/%^<>=(){},@])
  | (?P<ws>\s+)
""", re.X)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", *GROUPING}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}


@dataclass
class Query:
    selectors: list[tuple[str | None, list[tuple[str, str, str]]]]  # (metric or None, [(label, op, value)])
    grouping: set[str]


def _unquote(s: str) -> str:
    if s[0] == "`":
        return s[1:-1]
    return str(json.loads('"' + s[1:-1].replace('\\"', '"').replace('"', '\\"') + '"'))


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
    return out


def parse_promql(expr: str) -> Query:
    toks = tokens(expr)
    q = Query([], set())
    i = 0

    def matchers(j: int) -> tuple[list[tuple[str, str, str]], int]:
        ms: list[tuple[str, str, str]] = []
        j += 1  # past "{"
        while toks[j] != ("op", "}"):
            if toks[j] == ("op", ","):
                j += 1
                continue
            (k1, label), (_, op), (k3, value) = toks[j:j + 3]
            if k1 != "id" or op not in ("=", "!=", "=~", "!~") or k3 != "str":
                raise ValueError(f"bad matcher {toks[j:j + 3]} in {expr!r}")
            ms.append((label, op, _unquote(value)))
            j += 3
        return ms, j + 1

    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "id" and text in GROUPING and nxt == ("op", "("):
            j = i + 2
            while toks[j] != ("op", ")"):
                if toks[j][0] == "id":
                    q.grouping.add(toks[j][1])
                j += 1
            i = j + 1
        elif kind == "id" and (nxt == ("op", "(") or text in AGGREGATIONS):  # a function or an aggregation
            i += 1
        elif kind == "id" and text.lower() not in KEYWORDS:
            ms: list[tuple[str, str, str]] = []
            i += 1
            if i < len(toks) and toks[i] == ("op", "{"):
                ms, i = matchers(i)
            q.selectors.append((text, ms))
        elif (kind, text) == ("op", "{"):  # a selector without a metric name: {__name__=~"..."}
            ms, i = matchers(i)
            q.selectors.append((None, ms))
        else:
            i += 1
    return q


LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<query>.+),)?\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$")


# -- the check itself --------------------------------------------------------------------------------
def _alert_names() -> set[str]:
    return {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def _known_types() -> set[str]:
    """Message types: the vocabulary's node types, every type docs/messages.md lists, and the agent's own."""
    table = set(re.findall(r"^\| `([A-Z]\w+)`(?: / `([A-Z]\w+)`)? \|", (ROOT / "docs" / "messages.md").read_text(),
                           re.M))
    return set(CATEGORY_BY_TYPE) | {t for pair in table for t in pair if t} | {"RemediationBudgetExhausted",
                                                                              OTHER_TYPE}


def _allowed_values(exp: Exported) -> dict[str, set[str]]:
    """Label values a query may name, where the set is closed: the vocabulary's, or what was scraped."""
    seen: dict[str, set[str]] = {}
    for (_metric, label), vals in exp.values.items():
        seen.setdefault(label, set()).update(vals)
    return {"type": _known_types(), "category": {*CATEGORIES, ""}, "severity": {*SEVERITIES, "corrupted"},
            "decision": {"executed", "dry_run", "skipped", "failed"}, "action": {"apply", "uncordon"},
            "alertname": _alert_names(), "alertstate": {"firing", "pending"},
            "culprit": {"named", "none"}, "actionable": {"true", "false"}, "status": {"open", "resolved"},
            "why": {"exhausted", "unavailable"}, "reason": seen.get("reason", set()),
            "counter": seen.get("counter", set()), "signal": seen.get("signal", set()),
            "collector": seen.get("collector", set()) | {"agent"}}


def problems(expr: str, exp: Exported, where: str) -> list[str]:
    """What in one PromQL expression is not exported: metric names, label names, closed-set label values."""
    m = LABEL_VALUES.match(expr)
    if m:  # Grafana's label_values([query,] label)
        q = parse_promql(m["query"] or "up")
        q.grouping.add(m["label"])
    else:
        q = parse_promql(expr)
    out: list[str] = []
    if not exp.allowed:
        exp.allowed = _allowed_values(exp)
        exp.allowed[""] = set().union(*exp.labels.values(), *SYNTHESIZED.values(), TARGET_LABELS)
    allowed, every_label = exp.allowed, exp.allowed[""]
    for metric, ms in q.selectors:
        if metric is None:
            out.append(f"{where}: a selector without a metric name: {ms}")
            continue
        if metric not in exp.names and metric not in SYNTHESIZED:
            out.append(f"{where}: metric {metric!r} is not exported")
            continue
        labels = SYNTHESIZED.get(metric) or exp.labels.get(metric)
        for label, op, value in ms:
            if labels is not None and label not in labels | TARGET_LABELS:
                out.append(f"{where}: {metric} has no label {label!r} (it has {sorted(labels)})")
            if label in allowed and "$" not in value:
                alternatives = value.split("|") if op in ("=~", "!~") else [value]
                for alt in alternatives:
                    rx = re.compile(alt if op in ("=~", "!~") else re.escape(alt))
                    if not any(rx.fullmatch(v) for v in allowed[label]):
                        out.append(f"{where}: {label}{op}{alt!r} matches no known {label}")
    for label in q.grouping - every_label:
        out.append(f"{where}: grouping label {label!r} is on no exported series")
    return out


# -- promtool ----------------------------------------------------------------------------------------
def _promtool(*args: str, cwd: Path = MON) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_check_rules() -> None:
    res = _promtool("check", "rules", RULES.name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in yaml.safe_load(RULES.read_text())['groups'])} rules found" \
        in res.stdout


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_unit_tests_pass() -> None:
    res = _promtool("test", "rules", RULES_TEST.name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
@pytest.mark.parametrize("old,new", [
    # each mutation is one promtool run (~4 s): one in the default run, the others with the slow marker
    pytest.param("expr: gna_spool_depth > 1000", "expr: gna_spool_depth >= 1000",  # the near miss (1000) now fires
                 marks=pytest.mark.slow),
    pytest.param("expr: gna_spool_depth > 1000", "expr: gna_spool_depth > 5000",  # the firing series no longer does
                 marks=pytest.mark.slow),
    ('type="GPUFellOffBus"}', 'type="GPUFellOfBus"}'),  # a type's typo: nothing fires
])
def test_the_unit_tests_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert text.count(old) == 1
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    res = _promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr


def test_every_alert_fires_in_a_unit_test_and_has_a_near_miss() -> None:
    doc = yaml.safe_load(RULES_TEST.read_text())
    assert doc["rule_files"] == [RULES.name]
    fired: dict[str, set[str]] = {}
    near_miss: set[str] = set()
    for test in doc["tests"]:
        series = [dict(re.findall(r'(\w+)="([^"]*)"', s["series"])) for s in test["input_series"]]
        for case in test["alert_rule_test"]:
            name = case["alertname"]
            alerting = [{k: v for k, v in a["exp_labels"].items() if k != "severity"}
                        for a in case.get("exp_alerts") or []]
            if alerting:
                fired.setdefault(name, set()).update(a.get("instance", "") for a in alerting)

            def explained(s: dict[str, str], alerting: list[dict[str, str]] = alerting) -> bool:
                return any(all(s.get(k, v) == v for k, v in a.items()) for a in alerting)

            # a near miss: no alert at this time, or a series beside the firing ones that fires nothing
            if not alerting or not all(explained(s) for s in series):
                near_miss.add(name)
            for a in case.get("exp_alerts") or []:
                assert set(a["exp_annotations"]) == {"summary", "description", "runbook_url"}, name
    alerts = _alert_names()
    assert alerts - set(fired) == set(), "alerts no unit test makes fire"
    assert alerts - near_miss == set(), "alerts without a near miss"
    assert set(fired) | near_miss <= alerts, "unit tests of alerts that do not exist"


# -- the rule file and the runbooks -----------------------------------------------------------------------
def _runbook_sections() -> dict[str, str]:
    text = RUNBOOKS.read_text()
    parts = re.split(r"^### (\w+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_alerts_are_named_labelled_annotated_and_have_a_runbook_section() -> None:
    sections = _runbook_sections()
    seen: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            assert CAMEL.match(name), f"{name}: not CamelCase"
            assert name not in seen, f"{name}: twice"
            seen.add(name)
            sev = rule["labels"]["severity"]
            assert sev in SEVERITIES or sev == "{{ $labels.severity }}", f"{name}: severity {sev!r}"
            ann = rule["annotations"]
            assert ann["summary"].strip() and ann["description"].strip(), name
            assert ann["runbook_url"] == RUNBOOK_URL + name.lower(), f"{name}: runbook_url {ann['runbook_url']}"
            body = sections.get(name)
            assert body is not None, f"{name}: no section '### {name}' in docs/runbooks.md"
            for part in ("**Means.**", "**Check.**", "**Agent already did.**"):
                assert part in body, f"{name}: its runbook section lacks {part}"
    assert set(sections) == seen, "runbook sections without an alert"


def test_runbooks_are_linked_from_the_operations_guide_and_links_resolve() -> None:
    assert "runbooks.md" in (ROOT / "docs" / "operations.md").read_text()
    text = RUNBOOKS.read_text()
    anchors = {h.lower() for h in _runbook_sections()}
    for target in re.findall(r"\]\(#([\w-]+)\)", text):
        assert target in anchors, target
    for path in re.findall(r"\]\((?!https?:|#)([^)#]+)", text):
        assert (RUNBOOKS.parent / path).resolve().exists(), path


# -- metric names against the scrape ------------------------------------------------------------------
def _rule_exprs() -> list[tuple[str, str]]:
    return [(r.get("alert") or r.get("record"), r["expr"]) for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"]]


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in doc["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def _dashboard_exprs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    exprs = [(f"panel {p['title']!r}", t["expr"]) for p in _panels(doc) for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            exprs.append((f"variable {v['name']}", q))
    return exprs


def test_the_scrape_has_the_series_the_alerts_key_on(exported: Exported) -> None:
    """The new per-type series, end to end: a missing /dev node and a down port are conditions by type,
    and the default rule's cordon is a dry-run decision."""
    gpu = exported.values[("gna_conditions_by_type", "type")]
    assert {"GPUDevicesMissing", "IBPortDown"} <= gpu
    assert "AcceleratedHardwareReady" in exported.values[("gna_conditions_by_type", "category")]
    assert ("dry_run" in exported.values[("gna_remediation_decisions_total", "decision")])
    assert "StragglerSignals" in exported.values[("gna_events_total", "type")]
    for name in ("DCGM_FI_DEV_GPU_TEMP", "node_infiniband_state_id", "node_infiniband_link_downed_total",
                 "gna_juicefs_hit_ratio", "gna_collector_up", "gna_spool_dropped_total"):
        assert name in exported.names, name


def test_rule_expressions_use_only_exported_names(exported: Exported) -> None:
    errors = [e for name, expr in _rule_exprs() for e in problems(expr, exported, f"rule {name}")]
    assert errors == []


def test_dashboard_queries_use_only_exported_names(exported: Exported) -> None:
    errors = [e for where, expr in _dashboard_exprs(_dashboard()) for e in problems(expr, exported, where)]
    assert errors == []


@pytest.mark.parametrize("expr,complaint", [
    ("gna_colector_up == 0", "metric 'gna_colector_up' is not exported"),
    ('sum by (instance) (gna_conditions_by_type{type="GPUFatalXId"})', "matches no known type"),
    ('gna_conditions_by_type{type=~"IBPortDown|IBPortFlaping"}', "'IBPortFlaping' matches no known type"),
    ("sum by (instnace) (gna_spool_depth)", "grouping label 'instnace'"),
    ('gna_collector_up{colector="nvml"}', "has no label 'colector'"),
    ('rate(node_infiniband_link_downed[5m])', "'node_infiniband_link_downed' is not exported"),
    ('increase(gna_events_total{type="NCCLCollectiveTimeout", severity="fatal"}[15m])', "severity='fatal'"),
    ('gna_infiniband_counter_rate_per_second{counter="symbol_errors"}', "counter='symbol_errors'"),
    ('ALERTS{alertname="GpuFellOfBus"}', "alertname='GpuFellOfBus'"),
    ("label_values(gna_colector_up, job)", "'gna_colector_up' is not exported"),
])
def test_a_typo_is_caught(exported: Exported, expr: str, complaint: str) -> None:
    errors = problems(expr, exported, "q")
    assert any(complaint in e for e in errors), errors


def test_the_promql_reader() -> None:
    q = parse_promql('count(sum by (job, instance) (increase(gna_events_total{type="A", job=~"$job"}[$__rate_interval]'
                     ' offset 5m)) > 0) / on (job) group_left count(up{job=~".*x.*"}) or vector(0)')
    assert q.selectors == [("gna_events_total", [("type", "=", "A"), ("job", "=~", "$job")]),
                           ("up", [("job", "=~", ".*x.*")])]
    assert q.grouping == {"job", "instance"}
    q = parse_promql('histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m]))) > 1e3 and y unless z{a!~"b|c"}')
    assert [s[0] for s in q.selectors] == ["x_bucket", "y", "z"] and q.grouping == {"le"}
    assert parse_promql('label_replace(m, "dst", "$1", "src", "(.*)")').selectors == [("m", [])]


# -- the dashboard itself ------------------------------------------------------------------------------
def test_dashboard_is_valid_and_every_panel_has_a_query() -> None:
    doc = _dashboard()
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables
    ids = [p["id"] for p in _panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    rows = [p for p in doc["panels"] if p["type"] == "row"]
    assert {r["title"] for r in rows} >= {"Fleet", "Node health", "GPUs", "InfiniBand", "NCCL", "JuiceFS",
                                         "The agent"}
    for p in _panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["title"].strip(), p
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["expr"].strip(), f"panel {p['title']!r}: an empty query"
            tokens(t["expr"])  # readable
            for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                assert var in variables or var.startswith("__"), f"panel {p['title']!r}: ${var} is not defined"
    # panels do not overlap
    cells: set[tuple[int, int]] = set()
    for p in _panels(doc):
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine


# -- the agent's per-type series ----------------------------------------------------------------------
def _cond(type_: str, severity: str = "critical", collector: str = "nvml", entity: str = "gpu:0000:18:00.0"
          ) -> ActiveCondition:
    return ActiveCondition(collector=collector, type=type_, entity=entity, severity=severity, since="t",
                           message_id="m", reason="r", message="x", suggested_action="none")


def _samples(m: AgentMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    fams = text_string_to_metric_families(m.render().decode())
    return {tuple(sorted(s.labels.items())): s.value for f in fams for s in f.samples if s.name == name}


def test_conditions_by_type_count_entities_and_go_to_zero() -> None:
    m = AgentMetrics()
    m.set_conditions([_cond("GPUFatalXid"), _cond("GPUFatalXid", entity="gpu:0000:2a:00.0"),
                      _cond("KernelModuleNotLoaded", entity="module:nvidia_peermem", collector="kernel_modules"),
                      _cond("NCCLSocketFallback", "warning", "nccl_logs", "nccl:h:1")])
    got = {dict(k)["type"]: (dict(k)["category"], v) for k, v in _samples(m, "gna_conditions_by_type").items()}
    assert got == {"GPUFatalXid": ("AcceleratedHardwareReady", 2), "KernelModuleNotLoaded": ("NetworkingReady", 1),
                   "NCCLSocketFallback": ("", 1)}
    m.set_conditions([_cond("GPUFatalXid")])
    got = {dict(k)["type"]: (dict(k)["category"], v) for k, v in _samples(m, "gna_conditions_by_type").items()}
    assert got["GPUFatalXid"][1] == 1 and got["KernelModuleNotLoaded"][1] == 0 and got["NCCLSocketFallback"][1] == 0


def test_events_by_type_are_counted_and_bounded() -> None:
    m = AgentMetrics()
    m.observe_message("event", "kmsg_xid", "GPUXidError", "critical")
    m.observe_message("condition", "kmsg_xid", "GPUFatalXid", "critical")  # conditions: a gauge, not counted here
    assert _samples(m, "gna_events_total") == {
        (("collector", "kmsg_xid"), ("severity", "critical"), ("type", "GPUXidError")): 1.0}
    for i in range(MAX_TYPES + 50):  # a plugin inventing types cannot grow the label sets without bound
        m.observe_message("event", "evil", f"Made{i}", "info")
    types = {dict(k)["type"] for k in _samples(m, "gna_events_total")}
    assert len(types) == MAX_TYPES + 1 and OTHER_TYPE in types


# -- the central services' /metrics -----------------------------------------------------------------------
def _families(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_central_services_serve_their_state(fleet_scrape: dict[str, str]) -> None:
    """The simulated fleet's port-down stall, as each central service counts it: no node or job label."""
    corr = _families(fleet_scrape["correlator"])
    opened = {(s.labels["culprit"], s.labels["actionable"]): s.value for s in corr["gna_correlator_incidents_open"]}
    assert opened == {("named", "true"): 1, ("named", "false"): 0, ("none", "false"): 0}
    assert {s.labels["status"]: s.value for s in corr["gna_correlator_incidents_published"]
            if s.name.endswith("_total")}["open"] >= 1
    assert [s.value for s in corr["gna_correlator_nats_connected"]] == [1.0]
    assert [s.value for s in corr["gna_correlator_judging"]] == [1.0]
    consumed = {s.labels["stream"]: s.value for s in corr["gna_correlator_messages"] if s.name.endswith("_total")}
    assert consumed["GNA_EVENTS"] > 0 and consumed["GNA_JOBS"] > 0
    assert any(s.labels == {"reason": "not_json"} and s.value >= 1 for s in corr["gna_correlator_rejected"])
    assert any(s.name == "gna_correlator_loop_stall_seconds_count" and s.value > 0
               for s in corr["gna_correlator_loop_stall_seconds"])
    cord = _families(fleet_scrape["cordoner"])
    decisions = {(s.labels["action"], s.labels["decision"]) for s in cord["gna_cordoner_decisions"]}
    assert ("apply", "dry_run") in decisions
    assert [s.value for s in cord["gna_cordoner_enforcing"]] == [0.0]
    assert {s.labels["actionable"]: s.value for s in cord["gna_cordoner_incidents_open"]} == {"true": 1, "false": 0}
    assert any(s.labels == {"reason": "not_json"} for s in cord["gna_cordoner_rejected"])
    dash = _families(fleet_scrape["dashboard"])
    assert [s.value for s in dash["gna_dashboard_incidents_open"]] == [1.0]
    assert any(s.labels == {"reason": "not_json"} for s in dash["gna_dashboard_rejected"])
    for text in fleet_scrape.values():  # low cardinality: nothing names a node or a job
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                assert not {"node", "job", "entity"} & set(s.labels), (s.name, s.labels)


def test_rejection_reasons_are_bounded() -> None:
    from fleet.metrics import MAX_REASONS, OTHER, reasons

    counts = {f"unhandled:E{i}": 1 for i in range(MAX_REASONS + 10)}
    out = reasons(counts)
    assert len(out) == MAX_REASONS + 1 and out[-1] == (OTHER, 10)
    counts["unhandled:E0"] += 5  # a reason seen first keeps its name: every series only grows
    assert reasons(counts)[0] == ("unhandled:E0", 6) and reasons(counts)[-1] == (OTHER, 10)


@pytest.mark.parametrize("command", ["correlator", "cordoner"])
def test_a_central_service_that_cannot_listen_for_metrics_exits_71_and_a_bad_address_64(command: str) -> None:
    """Checked before NATS is tried: a port taken by another service on the host is one line and exit 71 (as
    the dashboard's --listen), an address that is not HOST:PORT is a usage error."""
    import socket
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for listen, code, says in ((f"127.0.0.1:{port}", 71, "cannot listen on"), ("nonsense", 64, "HOST:PORT")):
            res = subprocess.run([sys.executable, "-m", "agent", command, "--nats", "nats://127.0.0.1:9",
                                  "--connect-timeout", "2", "--metrics-listen", listen],
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == code and says in res.stderr, (listen, res.returncode, res.stderr[-500:])
