"""#20: the cordoner's side of the trust model, rule by rule (agent/remediation/incidents.py), and the
supervisors that restart a central service that exited 75."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.remediation.incidents import (
    CULPRIT_MIN_CONFIDENCE,
    MAX_JOB,
    MAX_VICTIMS,
    BadIncident,
    IncidentView,
    check_incident,
    culprit_actionable,
    parse_incident,
)

ROOT = Path(__file__).resolve().parent.parent
JOB = "0x5c1f"


def _rec(**kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"job": JOB, "status": "open", "victims": ["node-a", "node-c"],
                           "culprit": {"node": "node-b", "entity": "ib:mlx5_3/1", "kind": "hca_port"},
                           "confidence": 0.97}
    rec.update(kw)
    return rec


def _msg(type_: str = "NCCLCollectiveTimeout", *, node: str = "node-a", kind: str = "event",
         entity: str | None = None, **details: Any) -> dict[str, Any]:
    return {"collector": "nccl_logs", "type": type_, "kind": kind, "severity": "critical", "node": node,
            "entity": entity if entity is not None else f"nccl:{node}:77", "details": {"job": JOB, **details}}


def _view(rec: dict[str, Any]) -> IncidentView:
    v = IncidentView()
    assert v.file(json.dumps(rec).encode()) is not None
    return v


# -- spare(): only a victim's symptoms of that job --------------------------------------------------

def test_a_victim_is_spared_for_its_waiting_symptoms_of_that_job_only() -> None:
    v = _view(_rec())
    assert "victim of incident 0x5c1f (culprit node-b ib:mlx5_3/1)" in (v.spare(_msg()) or "")
    assert v.spare(_msg("NCCLWatchdogProgress", **{"last_completed": 3})) is not None
    assert v.spare(_msg("NCCLIBCompletionError", peer="10.0.0.7<4500>")) is not None  # actionable culprit
    assert v.spare({**_msg(), "details": {"job": "0xother"}}) is None  # another job
    assert v.spare(_msg(node="node-x")) is None  # not listed as a victim
    assert v.spare(_msg(node="node-b")) is None  # the culprit's node is nobody's victim


@pytest.mark.parametrize("msg", [
    _msg("NCCLSocketFallback", kind="condition"),  # the node's own transport
    _msg("NCCLIBAsyncEvent", hca="mlx5_0", port=1),  # its own port
    _msg("NCCLFarNIC"), _msg("NCCLGDRLevel"), _msg("NCCLNoGDRDMA"),
    _msg(entity="gpu:0000:18:00.0"), _msg(entity="ib:mlx5_0/1"),  # findings about its own GPU and NIC
    _msg("GPUFellOffBus", kind="condition", entity="gpu:0000:18:00.0"),
    _msg(kind="condition"),  # a condition is never a job's symptom
    _msg("NCCLIBCompletionError"),  # names no peer: nothing explains it but the node itself
], ids=lambda m: f"{m['type']}-{m['entity']}-{m['kind']}")
def test_the_victim_list_never_shields_a_nodes_own_findings(msg: dict[str, Any]) -> None:
    assert _view(_rec()).spare(msg) is None


def test_a_shown_verdict_spares_nothing_a_culprit_less_one_would_not() -> None:
    """A timeout names no culprit: spared for a listed victim of a culprit-less, shown or actionable incident.
    A completion error naming a peer is a claim about that peer: spared only when an actionable verdict
    names a culprit on another node."""
    peer_error = _msg("NCCLIBCompletionError", peer="node-b")
    culprit_less = _view(_rec(culprit=None, confidence=0.0))
    shown = _view(_rec(culprit={"node": "node-b", "entity": "rank:3", "kind": "rank"}, confidence=0.7))
    software_unflagged = _view(_rec(culprit={"node": "node-b", "entity": "rank:3", "kind": "rank"}, confidence=0.9))
    software_flagged = _view(_rec(culprit={"node": "node-b", "entity": "rank:3", "kind": "rank"}, confidence=0.9,
                                  actionable=True))
    for v in (culprit_less, shown, software_unflagged, software_flagged):
        assert v.spare(_msg()) is not None
    for v in (culprit_less, shown, software_unflagged):
        assert v.spare(peer_error) is None
    assert software_flagged.spare(peer_error) is not None
    assert _view(_rec(status="resolved")).spare(_msg()) is None


# -- which culprits act ----------------------------------------------------------------------------

@pytest.mark.parametrize(("rec", "acts"), [
    (_rec(), True),  # a hardware culprit in a record from before the field
    (_rec(culprit={"node": "b", "entity": "gpu:0000:18:00.0", "kind": "gpu"}), True),
    (_rec(culprit={"node": "b", "entity": "nccl:transport", "kind": "transport"}), True),
    (_rec(actionable=False), False),  # the correlator says no: no
    (_rec(confidence=CULPRIT_MIN_CONFIDENCE - 0.01), False),  # shown
    (_rec(confidence=CULPRIT_MIN_CONFIDENCE - 0.01, actionable=True), False),  # a flag never lifts a weak verdict
    (_rec(status="resolved"), False),
    (_rec(culprit={"node": "b", "entity": "rank:3", "kind": "rank"}), False),  # software-only, unflagged
    (_rec(culprit={"node": "b", "entity": "node", "kind": "link"}), False),
    (_rec(culprit={"node": "b", "entity": "x", "kind": "anything"}), False),
    (_rec(culprit={"node": "b", "entity": "rank:3", "kind": "rank"}, actionable=True), True),
    (_rec(culprit=None, confidence=0.0), False),
    (_rec(confidence=None), False),
])
def test_an_incident_culprit_acts_only_when_open_confident_and_actionable(rec: dict[str, Any], acts: bool) -> None:
    assert culprit_actionable(rec) is acts
    assert culprit_actionable(check_incident(json.dumps(rec).encode())) is acts


# -- records are bounded -----------------------------------------------------------------------------

@pytest.mark.parametrize(("rec", "reason"), [
    (_rec(job="0x" + "9" * 5000), "incident_too_long"),
    (_rec(victims=[f"n{i}" for i in range(MAX_VICTIMS + 1)]), "incident_too_long"),
    (_rec(victims=["x" * 300]), "incident_too_long"),
    (_rec(victims=[1, 2]), "bad_incident"),
    (_rec(culprit={"node": "b" * 300}), "incident_too_long"),
    (_rec(culprit={"node": "b", "entity": "e" * 600}), "incident_too_long"),
    (_rec(culprit={"node": "b", "kind": ["rank"]}), "bad_incident"),
    (_rec(culprit="node-b"), "bad_incident"),
    (_rec(confidence="0.99"), "bad_incident"),
    (_rec(confidence=True), "bad_incident"),
    (_rec(confidence=7), "bad_incident"),
    (_rec(actionable="yes"), "bad_incident"),
    (_rec(reason="r" * 5000), "incident_too_long"),
    (_rec(status="maybe"), "bad_incident"),
    (_rec(job=""), "bad_incident"),
])
def test_a_record_out_of_bounds_is_refused_with_its_reason(rec: dict[str, Any], reason: str) -> None:
    with pytest.raises(BadIncident) as exc:
        check_incident(json.dumps(rec).encode())
    assert exc.value.reason == reason
    assert parse_incident(json.dumps(rec).encode()) is None


def test_poison_records_are_counted_never_raised() -> None:
    seen: list[tuple[str, bytes]] = []
    v = IncidentView(on_invalid=lambda exc, data: seen.append((exc.reason, data)))
    poison = [b"[" * 100_000, b"\xff\xfe", b"null", b"[]", b'{"job": 5}', b" " * (5 << 20),
              json.dumps(_rec(job="j" * (MAX_JOB + 1))).encode()]
    for data in poison:
        assert v.file(data) is None
    assert v.invalid == len(poison) and len(seen) == len(poison) and not v.incidents
    assert {r for r, _ in seen} == {"bad_incident", "incident_too_long"}
    assert v.file(json.dumps(_rec()).encode()) is not None and JOB in v.incidents


def test_anything_the_fleet_decoder_accepts_as_a_job_the_cordoner_accepts_too() -> None:
    from fleet.wire import JOB_MAX

    assert MAX_JOB >= JOB_MAX  # a correlator's record for a job the wire let through is never refused here


# -- supervisors restart a central service that exited 75 ------------------------------------------

CENTRAL_UNITS = ("cordoner", "correlator", "dashboard")


@pytest.mark.parametrize("name", CENTRAL_UNITS)
def test_central_systemd_units_restart_whatever_the_exit(name: str, tmp_path: Path) -> None:
    path = ROOT / "systemd" / f"gpu-node-agent-{name}.service"
    unit = path.read_text()
    lines = {ln.split("=", 1)[0]: ln.split("=", 1)[1] for ln in unit.splitlines() if "=" in ln and ln[0] != "#"}
    assert lines["Restart"] == "always" and lines["StartLimitIntervalSec"] == "0"
    assert lines["ExecStart"].split()[:2] == ["/usr/local/bin/gpu-node-agent", name]
    assert lines["DynamicUser"] == "yes" and lines["CapabilityBoundingSet"] == ""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze missing: Debian's systemd package provides it")
    exe = shutil.which("gpu-node-agent") or str(Path(sys.executable).parent / "gpu-node-agent")
    (tmp_path / path.name).write_text(unit.replace("/usr/local/bin/gpu-node-agent", exe))
    r = subprocess.run([analyze, "verify", str(tmp_path / path.name)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and path.name not in r.stderr, r.stderr


def test_central_kubernetes_workloads_always_restart() -> None:
    docs = [d for f in sorted((ROOT / "deploy" / "kubernetes" / "central").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
    workloads = [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet")]
    assert workloads
    for d in workloads:
        assert d["spec"]["template"]["spec"].get("restartPolicy", "Always") == "Always", d["metadata"]["name"]
