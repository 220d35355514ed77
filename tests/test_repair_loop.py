"""Issue 28: a node walked through the whole loop — culprit -> cordon -> drain -> GPU reset -> validate fails
-> reboot request -> (the agent restarts after the reboot) -> validate passes -> uncordon — against the fake
Kubernetes API with the real plugins, recording fakes of nvidia-smi and of the validation tools, and a host
tree; a repeat offender that stays out, labelled for replacement; a suspect validated at once."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import config as configmod
from agent.message import make_message, to_dict
from agent.remediation.engine import Engine
from agent.remediation.loader import load_plugins
from agent.remediation.policy import RemediationsConfig, RepairConfig
from agent.remediation.repair import Validation
from agent.validate.checks import run_validation
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.fake_kube import FakeKube
from tests.test_remediation import FAKE_TOOL
from tests.test_repair_plugins import FAKE_NVIDIA_SMI
from tests.test_validate import FAST as FAST_VALIDATE

FAKES = Path(__file__).parent / "fakes" / "validate"
GPU = "0000:18:00.0"


class Audits:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.alerts: list[tuple[str, str, dict[str, Any]]] = []

    async def __call__(self, r: dict[str, Any]) -> None:
        self.records.append(r)

    async def alert(self, t: str, m: str, d: dict[str, Any]) -> None:
        self.alerts.append((t, m, d))

    def trail(self) -> list[tuple[str, str, str]]:
        return [(r["remediation"], r["action"], r["decision"]) for r in self.records]


class _Budget:
    def __init__(self) -> None:
        self.released: list[str] = []

    async def take(self, node: str, reason: str) -> Any:
        from agent.remediation.budget import SlotDecision
        return SlotDecision(True, "granted", 1, 5, False)

    async def release(self, node: str) -> None:
        self.released.append(node)


@pytest.fixture
def kube() -> Any:
    k = FakeKube().start()
    yield k
    k.stop()


def _tools_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **scripts: str) -> Path:
    """python3 and the recording fakes of the validation tools on PATH, plus ``scripts`` (name -> its text);
    each fake logs to ``validate.log`` and ``argv.log`` in tmp_path."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    for name in ("all_reduce_perf", "nvbandwidth", "dcgmi", "ib_write_bw"):
        (bindir / name).symlink_to(FAKES / name)
    for name, text in scripts.items():
        exe = bindir / name
        exe.write_text(text)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GNA_TEST_ARGV_LOG", str(tmp_path / "argv.log"))
    monkeypatch.setenv("FAKE_VALIDATE_LOG", str(tmp_path / "validate.log"))
    return bindir


@pytest.fixture
def loop_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube: FakeKube) -> dict[str, Any]:
    """The host tree, the tools on PATH (fake nvidia-smi and validation tools, python3 for them), the Node
    with a training pod and a DaemonSet pod, and the remediation config with every step enforced."""
    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)
    host.set_boot("boot-1")
    (host.root / "run").mkdir(exist_ok=True)
    (host.root / "var").mkdir(exist_ok=True)
    (host.root / "var/run").symlink_to("/run")  # as on every systemd host: kured's sentinel lands in /run
    _tools_on_path(tmp_path, monkeypatch, **{"nvidia-smi": FAKE_NVIDIA_SMI})
    monkeypatch.setenv("GNA_TEST_HOST_ROOT", str(host.root))
    monkeypatch.setenv("FAKE_DCGMI_MODE", "fail")  # the GPU reset does not cure it: dcgmi diag still fails
    kube.add_node("gpu-01")
    kube.add_pod("train", "trainer-0", "uid-t0", node_name="gpu-01", labels={"job": "llm"},
                 resources={"limits": {"nvidia.com/gpu": "8"}})
    kube.add_pod("kube-system", "dcgm-exporter-x", "uid-d", node_name="gpu-01",
                 owners=[{"kind": "DaemonSet", "name": "dcgm-exporter", "apiVersion": "apps/v1", "uid": "ds"}],
                 resources={"limits": {"nvidia.com/gpu": "0"}})
    kc = str(kube.kubeconfig(tmp_path / "kubeconfig"))
    cfg = RemediationsConfig(
        enforce=True, uncordon_hold_down=0.1,
        repair=RepairConfig(settle=0.0, reboot_wait=30.0, validate_retry_delay=0.05, validate_level="standard"),
        plugins={"kubernetes": {"kubeconfig": kc},
                 "drain": {"kubeconfig": kc, "mode": "evict", "timeout": 0.0, "poll_interval": 0.05,
                           "deadline": 10.0, "backoff_initial": 0.05},
                 "gpu_reset": {}, "reboot_request": {"method": "sentinel"},
                 "breakfix": {"method": "event", "kubeconfig": kc}})
    return {"host": host, "cfg": cfg, "state": tmp_path / "state" / "remediation-repairs.json"}


def _validator(host: SimHost, levels: list[str]) -> Any:
    """The real active checks (tests/fakes/validate on PATH); the passive pass is tests/test_validate.py's."""
    agent_cfg = configmod.parse(FAST_VALIDATE, file="<test>").agent

    async def validate(level: str, **_: Any) -> Validation:
        levels.append(level)
        report = await run_validation(agent_cfg, HostRoot(host.root), level, node="gpu-01", skip=("passive",))
        from agent.validate.service import summary

        return Validation(report.verdict, summary(report))

    return validate


def _engine(env: dict[str, Any], audits: Audits, budget: _Budget, levels: list[str],
            observed: list[tuple[str, float]]) -> Engine:
    host: SimHost = env["host"]
    loaded = load_plugins(env["cfg"], HostRoot(host.root))
    assert set(loaded.unavailable) <= {"juicefs_warmup", "modprobe", "slurm"}, loaded.unavailable
    return Engine(env["cfg"], loaded.available, audit=audits, alert=audits.alert, budget=lambda: budget,
                  validator=_validator(host, levels), repair_state=env["state"],
                  boot_id=lambda: (host.root / "proc/sys/kernel/random/boot_id").read_text().strip(),
                  observe=lambda what, s: observed.append((what, s)))


def _culprit(type_: str = "GPUFatalXid", entity: str = f"gpu:{GPU}") -> dict[str, Any]:
    return to_dict(make_message(node="gpu-01", collector="kmsg_xid", kind="condition", type=type_,
                                status="firing", severity="critical", entity=entity, reason="Xid79",
                                message="GPU has fallen off the bus"))  # type: ignore[arg-type]


async def _until(pred: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_culprit_to_cordon_drain_reset_reboot_validate_uncordon(loop_env: dict[str, Any], kube: FakeKube,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    host: SimHost = loop_env["host"]
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    await eng.handle(_culprit())
    sentinel = host.root / "run/reboot-required"
    await _until(lambda: sentinel.exists())
    node = kube.nodes["gpu-01"]
    assert node["spec"]["unschedulable"] is True
    assert ("train", "trainer-0") not in kube.pods, "the training pod was evicted"
    assert ("kube-system", "dcgm-exporter-x") in kube.pods, "a DaemonSet's pod is left alone"
    assert [t for t in audits.trail() if t[1] != "apply" or t[0] == "kubernetes"] == [
        ("kubernetes", "apply", "executed"), ("drain", "repair", "executed"), ("validate", "validate", "failed"),
        ("gpu_reset", "repair", "executed"), ("validate", "validate", "failed"),
        ("reboot_request", "repair", "executed")]
    failed = next(r for r in audits.records if r["remediation"] == "validate")
    assert "dcgm_diag" in failed["reason"] and levels == ["standard", "standard"]
    assert eng.repairs.episodes["gpu-01"].state == "awaiting_reboot"
    await eng.close()  # the machine reboots: this agent stops

    # After the reboot: a new boot id, the GPU healthy again, a new agent from the same state directory.
    host.set_boot("boot-2")
    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")
    audits2 = Audits()
    eng2 = _engine(loop_env, audits2, budget, levels, observed)
    eng2.repairs.resume()
    await _until(lambda: any(r["action"] == "uncordon" for r in audits2.records))
    assert audits2.trail() == [("validate", "validate", "executed"), ("kubernetes", "uncordon", "executed")]
    node = kube.nodes["gpu-01"]
    assert node["spec"].get("unschedulable") is False and "gpu-node-agent/cordoned-by" not in \
        node["metadata"]["annotations"]
    assert budget.released == ["gpu-01"] and "gpu-01" not in eng2.repairs.episodes
    assert [w for w, _ in observed] == ["time_to_repair"]
    history = eng2.repairs.history
    assert [(h["outcome"], h["steps"]) for h in history] == [("repaired", ["gpu_reset", "reboot_request"])]  # a drain is not a repair
    await eng2.close()


async def test_a_repeat_offender_stays_out_labelled_for_replacement(loop_env: dict[str, Any],
                                                                    kube: FakeKube) -> None:
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    now = eng.repairs.wall()
    eng.repairs.history = [{"node": "gpu-01", "entity": f"gpu:{GPU}", "type": "GPUFatalXid", "started": now - d,
                            "outcome": "repaired"} for d in (86400.0, 3 * 86400.0, 5 * 86400.0)]
    await eng.handle(_culprit())
    await _until(lambda: bool(audits.alerts))
    kind, message, details = audits.alerts[0]
    assert kind == "RemediationNodeKeptOut" and "repeat offender: the GPU" in message
    assert "4 repairs within 7 days (limit 3)" in details["why"]
    node = kube.nodes["gpu-01"]
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["gpu-node-agent/replace"] == "true"
    assert [e["reason"] for e in kube.events] == ["Cordoned", "MarkedForReplacement", "GPUNodeNeedsRepair"]
    assert not any(r["remediation"] in ("drain", "gpu_reset", "reboot_request") for r in audits.records), \
        "no repair is tried on a repeat offender"
    assert [w for w, _ in observed] == ["time_between_incidents"]
    await eng.handle(to_dict(make_message(node="gpu-01", collector="kmsg_xid", kind="condition", type="GPUFatalXid",
                                          status="resolved", severity="critical", entity=f"gpu:{GPU}",
                                          reason="Xid79", message="resolved")))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)  # past the hold-down: a kept-out node is not uncordoned by its trigger resolving
    assert kube.nodes["gpu-01"]["spec"]["unschedulable"] is True
    assert not any(r["action"] == "uncordon" for r in audits.records)
    await eng.close()


async def test_a_suspect_is_validated_at_once_and_back_without_repair(loop_env: dict[str, Any], kube: FakeKube,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    await eng.handle(_culprit(type_="IncidentCulprit", entity="rank:3"))
    await _until(lambda: any(r["action"] == "uncordon" for r in audits.records))
    assert audits.trail() == [("kubernetes", "apply", "executed"), ("drain", "repair", "executed"),
                              ("validate", "validate", "executed"), ("kubernetes", "uncordon", "executed")]
    assert ("train", "trainer-0") not in kube.pods, "drained of the job"
    assert kube.nodes["gpu-01"]["spec"].get("unschedulable") is False
    await eng.close()


async def test_dry_run_says_the_whole_loop_and_does_nothing(loop_env: dict[str, Any], kube: FakeKube) -> None:
    import msgspec

    loop_env["cfg"] = msgspec.structs.replace(loop_env["cfg"], enforce=False)
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    await eng.handle(_culprit())
    await asyncio.sleep(0.1)
    assert audits.trail() == [("kubernetes", "apply", "dry_run")]
    reason = audits.records[0]["reason"]
    assert "drain with drain -> validate (standard) -> gpu_reset, validate -> reboot_request, validate -> breakfix" \
        in reason
    assert kube.nodes["gpu-01"]["spec"].get("unschedulable") is not True and ("train", "trainer-0") in kube.pods
    assert levels == [] and not eng.repairs.episodes
    await eng.close()


async def test_an_operator_puts_a_kept_out_node_back_and_the_count_starts_again(
        loop_env: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    now = eng.repairs.wall()
    eng.repairs.history = [{"node": "gpu-01", "entity": f"gpu:{GPU}", "type": "GPUFatalXid", "started": now - d,
                            "outcome": "repaired"} for d in (3600.0, 7200.0, 10800.0)]
    await eng.handle(_culprit())
    await _until(lambda: bool(audits.alerts))
    assert eng.repairs.episodes["gpu-01"].state == "kept_out"
    # The operator replaces the GPU and uncordons by hand (kubectl uncordon; the marks removed).
    node = kube.nodes["gpu-01"]
    node["spec"]["unschedulable"] = False
    for key in [k for k in node["metadata"]["annotations"] if k.startswith("gpu-node-agent/")]:
        del node["metadata"]["annotations"][key]
    eng.attempts.clear()  # past the rule's cooldown
    await eng.handle(_culprit())
    await _until(lambda: any(r["action"] == "uncordon" for r in audits.records))
    assert [t for t in audits.trail() if t[0] in ("gpu_reset", "validate", "kubernetes")][-3:] == [
        ("kubernetes", "apply", "executed"), ("validate", "validate", "executed"),
        ("kubernetes", "uncordon", "executed")], "the replaced GPU validates at once: no repair"
    assert eng.repairs.repeats("gpu-01", f"gpu:{GPU}") == (1, 1), "counted from the operator's release on"
    await eng.close()


async def test_the_daemon_validates_on_a_schedule_and_publishes_each_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: Any) -> None:
    """The daemon's schedule (validate.schedule_interval): a run while no job holds the GPUs is a NodeValidation
    event on NATS with the whole report, counted in gna_validation_runs; a run refused because a job holds a
    GPU is counted, not published."""
    from gna_types.validation import decode
    from tests.conftest import agent_config, running_agent, stream_messages

    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)
    _tools_on_path(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_NVBANDWIDTH_MODE", "low_p2p")
    extra = FAST_VALIDATE.replace("[validate]\n", "[validate]\nschedule_interval = 0.3\nschedule_level = \"standard\"\n")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, extra=extra)
    async with running_agent(cfg) as agent:
        runs = agent.metrics.validation_runs
        await _until(lambda: runs.labels("standard", "failed", "schedule")._value.get() >= 1)
        # a job starts: its process holds /dev/nvidia3
        fd = host.root / "proc/4242/fd"
        fd.mkdir(parents=True)
        (fd / "7").symlink_to("/dev/nvidia3")
        (host.root / "proc/4242/comm").write_text("python3\n")
        await _until(lambda: runs.labels("standard", "busy", "schedule")._value.get() >= 1)
        while agent.spool and agent.spool.depth:
            await asyncio.sleep(0.02)
    msgs = [m for m in await stream_messages(nats_server.url, "gna.events.>") if m["type"] == "NodeValidation"]
    assert msgs and all(m["collector"] == "validate" for m in msgs)
    report = decode(msgs[0]["details"])
    assert report.verdict == "failed" and report.check("nvbandwidth").status == "failed"  # type: ignore[union-attr]
    assert msgs[0]["severity"] == "warning" and "failed: nvbandwidth" in msgs[0]["message"]
    assert not any(decode(m["details"]).verdict == "busy" for m in msgs), "a busy node is normal: not published"


@pytest.mark.parametrize(("kind", "entity", "trail"), [
    # a hung rank and nothing else: a suspect, drained and validated at once, back without a repair
    ("rank", "rank:5", [("kubernetes", "apply", "executed"), ("drain", "repair", "executed"),
                        ("validate", "validate", "executed"), ("kubernetes", "uncordon", "executed")]),
    # the verdict names one of its GPUs: validated first too, here it passes (no reset needed)
    ("gpu", f"gpu:{GPU}", [("kubernetes", "apply", "executed"), ("drain", "repair", "executed"),
                           ("validate", "validate", "executed"), ("kubernetes", "uncordon", "executed")]),
])
async def test_per_node_mode_decides_the_correlator_s_verdict_on_itself(
        loop_env: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch, kind: str, entity: str,
        trail: list[tuple[str, str, str]]) -> None:
    """A node agent that cordons itself follows gna-incidents: a record naming this node the culprit becomes
    its IncidentCulprit (the same trigger the central cordoner builds), a record naming another node does
    nothing here."""
    import json

    from agent.remediation.incidents import IncidentView

    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    view = IncidentView()
    view.own_culprit = ("gpu-01", eng.handle)
    other = {"job": "0x77", "status": "open", "victims": ["gpu-01"], "confidence": 0.97, "actionable": True,
             "culprit": {"node": "gpu-02", "entity": "rank:1", "kind": "rank"}}
    await view._filed(json.dumps(other).encode())
    assert audits.records == [], "another node's verdict is not this node's to act on"
    rec = {"job": "0x5c1f", "status": "open", "victims": ["gpu-02", "gpu-03"], "confidence": 0.97,
           "actionable": True, "culprit": {"node": "gpu-01", "entity": entity, "kind": kind}}
    await view._filed(json.dumps(rec).encode())
    await _until(lambda: any(r["action"] == "uncordon" for r in audits.records))
    assert audits.trail() == trail
    assert audits.records[0]["trigger"]["type"] == "IncidentCulprit"
    await eng.close()


async def test_without_repair_plugins_the_node_returns_after_the_hold_down_and_a_validation(
        loop_env: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config that names no drain or repair plugin (the default) starts no episode: an episode could only keep
    the node out. The cordon is undone as before, after every trigger resolved for the hold-down, and now only
    once a validation passed."""
    import msgspec

    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")
    cfg: RemediationsConfig = loop_env["cfg"]
    loop_env["cfg"] = msgspec.structs.replace(cfg, plugins={"kubernetes": cfg.plugins["kubernetes"]})
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    await eng.handle(_culprit())
    assert not eng.repairs.episodes and audits.trail() == [("kubernetes", "apply", "executed")]
    await eng.handle(to_dict(make_message(node="gpu-01", collector="kmsg_xid", kind="condition", type="GPUFatalXid",
                                          status="resolved", severity="critical", entity=f"gpu:{GPU}",
                                          reason="Xid79", message="resolved")))  # type: ignore[arg-type]
    await _until(lambda: any(r["action"] == "uncordon" for r in audits.records))
    assert audits.trail() == [("kubernetes", "apply", "executed"), ("validate", "validate", "executed"),
                              ("kubernetes", "uncordon", "executed")]
    assert kube.nodes["gpu-01"]["spec"].get("unschedulable") is False and not audits.alerts
    await eng.close()


async def test_nothing_is_repaired_while_a_job_holds_the_gpus(loop_env: dict[str, Any], kube: FakeKube,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that outlives the drain (a DRAIN lets it finish; a wait-mode drain can time out) keeps every repair
    step away: the episode validates first, which waits while any process holds a GPU, says so once, and goes
    on when the GPUs are free."""
    import msgspec

    host: SimHost = loop_env["host"]
    fd = host.root / "proc/4242/fd"
    fd.mkdir(parents=True)
    (fd / "7").symlink_to("/dev/nvidia2")
    (host.root / "proc/4242/comm").write_text("python3\n")
    cfg: RemediationsConfig = loop_env["cfg"]
    loop_env["cfg"] = msgspec.structs.replace(cfg, repair=msgspec.structs.replace(cfg.repair, validate_retries=1))
    audits, budget, levels, observed = Audits(), _Budget(), [], []
    eng = _engine(loop_env, audits, budget, levels, observed)
    await eng.handle(_culprit())
    await _until(lambda: len(levels) >= 4)
    assert not any(r["action"] == "repair" and r["remediation"] != "drain" for r in audits.records), \
        "no repair step while the job holds a GPU"
    waiting = [r for r in audits.records if r["action"] == "validate"]
    assert len(waiting) == 1 and waiting[0]["decision"] == "skipped" and "4242 python3" in waiting[0]["reason"]
    (fd / "7").unlink()  # the job ends
    await _until(lambda: any(r["remediation"] == "gpu_reset" for r in audits.records))
    assert [t for t in audits.trail() if t[1] == "validate"][-1] == ("validate", "validate", "failed")
    await eng.close()


@pytest.mark.parametrize("after_resolution", [True, False])
async def test_central_cordoner_uncordons_only_on_the_nodes_own_validation_after_resolution(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: Any, after_resolution: bool) -> None:
    """Central mode: a real node agent (it does not cordon itself) and a real central cordoner (Slurm) over a
    real nats-server. The node's critical condition cordons it; when the condition resolves, the hold-down
    alone no longer uncordons: the node validates itself once its GPUs are free ([validate] after_resolution)
    and publishes the report, and only that report -- the node's own, started after the resolution --
    uncordons it. Without after_resolution (or for a suspect, which has no condition of its own) the cordoner
    asks the node on gna.validate.<node>. Another node's report about it is refused and counted."""
    import json

    import nats

    from fleet.cordoner import Cordoner
    from gna_types.subjects import event_subject
    from gna_types.validation import ValidationReport
    from tests.conftest import agent_config, running_agent

    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)
    _tools_on_path(tmp_path, monkeypatch, scontrol=FAKE_TOOL)
    monkeypatch.setenv("GNA_TEST_STATE", str(tmp_path / "slurm-state.json"))
    monkeypatch.setenv("FAKE_DCGMI_MODE", "pass")

    central = configmod.parse('[remediations]\nenforce = true\ncordon_with = "slurm"\nuncordon_hold_down = 0.3\n',
                              file="<central>").agent
    cord = Cordoner(central, [nats_server.url])
    await cord.start()
    nc = await nats.connect(nats_server.url)
    audits: list[dict[str, Any]] = []

    async def on_audit(m: Any) -> None:
        audits.append(json.loads(m.data))

    await nc.subscribe("gna.actions.>", cb=on_audit)
    extra = FAST_VALIDATE.replace("[validate]\n", "[validate]\nafter_resolution_settle = 1.0\n"
                                                  f"after_resolution = {str(after_resolution).lower()}\n"
                                                  "after_resolution_retry = 0.2\n") + \
        "[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n"
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, extra=extra, node="gpu-01")

    def trail() -> list[tuple[str, str]]:  # the cordoner's decisions (the node's own engine is in dry-run)
        return [(a["action"], a["decision"]) for a in audits
                if a["node"] == "gpu-01" and a["remediation"] in ("slurm", "validate")]

    try:
        async with running_agent(cfg) as agent:
            # a liar: gpu-02 reports that gpu-01 passed
            lie = make_message(node="gpu-02", collector="validate", kind="event", type="NodeValidation",
                               severity="info", entity="validate:node", reason="Passed", message="passed",
                               details=ValidationReport(node="gpu-01", level="full", verdict="passed",
                                                        started=2e9, ended=2e9 + 1).to_details())
            await nc.jetstream().publish(event_subject("gpu-02", "validate", "info"), json.dumps(to_dict(lie)).encode())
            host.remove_dev_node("nvidia1")
            await _until(lambda: ("apply", "executed") in trail())
            host.add_dev_node("nvidia1")
            await _until(lambda: ("uncordon", "executed") in trail(), timeout=40)
            requests = {o: agent.metrics.validation_requests.labels(o)._value.get()
                        for o in ("accepted", "pending", "too_soon")}
            runs = agent.metrics.validation_runs.labels("standard", "passed",
                                                        "resolution" if after_resolution else "request")
            assert runs._value.get() == 1
    finally:
        await cord.stop()
        await nc.close()
    actions = trail()
    assert actions[0] == ("apply", "executed")
    assert actions[-2:] == [("validate", "executed"), ("uncordon", "executed")], actions
    passed = [a for a in audits if a["action"] == "validate" and a["decision"] == "executed"]
    assert "gpu-01's own report" in passed[-1]["reason"], passed[-1]
    assert cord.rejected.get("validation_report") == 1 and cord.validations.refused == {"report names another node": 1}
    assert cord.validations.latest["gpu-01"].verdict == "passed"
    assert ("validate", "skipped") in actions, "the hold-down (0.3 s) ended before the report (settle 1 s): it waited"
    waiting = [a["reason"] for a in audits if a["action"] == "validate" and a["decision"] == "skipped"]
    assert "asked it to validate (gna.validate.gpu-01)" in waiting[0]
    # asked once, however many hold-downs it waited (ask_interval); with after_resolution the run was already owed
    assert requests == {"accepted": 0 if after_resolution else 1, "pending": 1 if after_resolution else 0,
                        "too_soon": 0}


async def test_after_resolution_runs_once_idle_never_while_critical_fires_or_when_cordoning_itself() -> None:
    """agent/validate/service.py alone: a critical condition fired and every critical one resolved -> one run
    after the settle time, tried again while the GPUs are busy; a critical that fires again during the settle
    starts it over; a node whose own engine validates (it cordons itself) runs nothing here."""
    from types import SimpleNamespace

    from agent.validate.service import ValidationService

    cfg = configmod.parse("[validate]\nafter_resolution_settle = 0.05\nafter_resolution_retry = 0.05\n",
                          file="<t>").agent
    runs: list[str] = []
    verdicts = ["busy", "passed", "passed"]
    active: list[Any] = []
    cordons_itself = [False]
    svc = ValidationService(SimpleNamespace(cfg=cfg))  # type: ignore[arg-type]

    async def run(level: str, *, trigger: str, publish_busy: bool = True) -> Any:
        runs.append(f"{level}/{trigger}/{publish_busy}")
        return SimpleNamespace(verdict=verdicts.pop(0))

    svc.run = run  # type: ignore[method-assign]
    subs: list[Any] = []
    svc.watch_resolutions(lambda name, handler: subs.append(handler), lambda: list(active), lambda: cordons_itself[0])

    def cond(status: str, severity: str = "critical") -> Any:
        return make_message(node="gpu-01", collector="gpu_devices", kind="condition", type="GPUDevicesMissing",
                            status=status, severity=severity, entity="gpu:x", reason="r", message="m")  # type: ignore[arg-type]

    firing = SimpleNamespace(severity="critical")
    await subs[0](cond("resolved"))  # nothing fired before: nothing owed
    await asyncio.sleep(0.1)
    assert runs == []
    active.append(firing)
    await subs[0](cond("firing"))
    active.clear()
    await subs[0](cond("resolved"))
    await asyncio.sleep(0.02)
    active.append(firing)  # fires again during the settle
    await asyncio.sleep(0.1)
    assert runs == [] and not svc.tasks()
    active.clear()
    await subs[0](cond("resolved"))
    await _until(lambda: len(runs) == 2)
    assert runs == ["standard/resolution/False"] * 2  # busy, then passed: done
    await asyncio.sleep(0.15)
    assert len(runs) == 2 and not svc.tasks()
    await subs[0](cond("firing", "warning"))  # a warning owes nothing
    await subs[0](cond("resolved", "warning"))
    await asyncio.sleep(0.1)
    assert len(runs) == 2
    cordons_itself[0] = True
    active.append(firing)
    await subs[0](cond("firing"))
    active.clear()
    await subs[0](cond("resolved"))
    await asyncio.sleep(0.15)
    assert len(runs) == 2, "its own engine validates before it uncordons"
    # the cordoner's requests: one accepted, at most one a request_min_interval (60 s), a second while one is
    # owed is pending; its run counts as trigger "request"
    cordons_itself[0] = False
    assert svc.request(1000.0) == "accepted"
    assert svc.request(1001.0) == "pending"
    await _until(lambda: len(runs) == 3)
    assert runs[-1] == "standard/request/False"
    await _until(lambda: not svc.tasks())
    assert svc.request(1030.0) == "too_soon" and svc.request(1061.0) == "accepted"
