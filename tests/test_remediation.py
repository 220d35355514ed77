"""Remediation: dry-run default, plugins with recording executables, Kubernetes against a fake API
with the real semantics, the fleet budget race over a real nats-server, the central cordoner."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.message import make_message, to_dict
from agent.nats_server import NatsServerProcess
from agent.remediation.budget import FleetBudget
from agent.remediation.engine import Engine
from agent.remediation.loader import load_plugins
from agent.remediation.policy import Match, RemediationsConfig, RepairConfig, Rule
from agent.remediation.repair import Validation
from gna_sdk.hostroot import HostRoot
from remediations.kubernetes import KubernetesConfig, KubernetesRemediation
from sim.host import SimHost
from tests.fake_kube import FakeKube

FAKE_TOOL = r"""#!/usr/bin/env python3
import fcntl, json, os, sys
log = os.environ["GNA_TEST_ARGV_LOG"]
state = os.environ.get("GNA_TEST_STATE", "/tmp/gna-state")
# Like slurmctld, the fake serialises updates: several agents drain at once, and a reader must
# never see another process's half-written state file.
lock = open(state + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)
with open(log, "a") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
name = os.path.basename(sys.argv[0])
if name == "scontrol":
    if sys.argv[1:3] == ["show", "node"]:
        st = json.load(open(state)) if os.path.exists(state) else {}
        s = st.get(sys.argv[3], {"State": "IDLE", "Reason": ""})
        print(f"NodeName={sys.argv[3]} Arch=x86_64 CoresPerSocket=56\n   State={s['State']} ThreadsPerCore=2")
        if s["Reason"]:
            print(f"   Reason={s['Reason']} [root@2026-12-02T10:00:00]")
    elif sys.argv[1] == "update":
        args = dict(a.split("=", 1) for a in sys.argv[2:])
        st = json.load(open(state)) if os.path.exists(state) else {}
        if args["State"] == "DRAIN":
            st[args["NodeName"]] = {"State": "IDLE+DRAIN", "Reason": args.get("Reason", "")}
        else:
            st[args["NodeName"]] = {"State": "IDLE", "Reason": ""}
        with open(state + ".tmp", "w") as fh:
            json.dump(st, fh)
        os.replace(state + ".tmp", state)
elif name == "modprobe":
    root = os.environ.get("GNA_TEST_HOST_ROOT", "")
    mod = sys.argv[-1]
    if mod == "broken_mod":
        print("modprobe: ERROR: could not insert 'broken_mod': Invalid argument", file=sys.stderr)
        sys.exit(1)
    os.makedirs(f"{root}/sys/module/{mod}", exist_ok=True)
    open(f"{root}/sys/module/{mod}/initstate", "w").write("live\n")
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("scontrol", "modprobe", "juicefs"):
        p = bindir / name
        p.write_text(FAKE_TOOL)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GNA_TEST_ARGV_LOG", str(log))
    monkeypatch.setenv("GNA_TEST_STATE", str(tmp_path / "slurm-state.json"))
    return log


def argv_log(log: Path) -> list[list[str]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _msg(node: str = "gpu-01", type_: str = "GPUFellOffBus", status: str = "firing", severity: str = "critical",
         entity: str = "gpu:0000:18:00.0", collector: str = "kmsg_xid") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector=collector, kind="condition", type=type_, status=status,
                                severity=severity, entity=entity, reason="R", message="m"))  # type: ignore[arg-type]


class Audits:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.alerts: list[tuple[str, str]] = []

    async def __call__(self, r: dict[str, Any]) -> None:
        self.records.append(r)

    async def alert(self, t: str, m: str, d: dict[str, Any]) -> None:
        self.alerts.append((t, m))


# The cordon mechanics alone: no repair episode after a cordon (tests/test_repair_loop.py walks those).
NO_REPAIR = RepairConfig(enabled=False)


async def _passes(level: str, **_: Any) -> Validation:
    return Validation("passed", f"{level}: 3 checks, none failed")


def _engine(cfg: RemediationsConfig, host: HostRoot, audits: Audits, budget: Any = None,
            validator: Any = None) -> Engine:
    loaded = load_plugins(cfg, host)
    return Engine(cfg, loaded.available, audit=audits, alert=audits.alert, budget=budget,
                  unavailable=loaded.unavailable, validator=validator)


async def test_fresh_config_is_dry_run_and_audits_what_it_would_do(tools: Path, tmp_path: Path) -> None:
    cfg = RemediationsConfig(cordon_with="slurm")
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits)
    await eng.handle(_msg())
    await eng.handle(_msg(type_="KernelModuleNotLoaded", entity="module:nvidia_peermem"))
    await eng.handle(to_dict(make_message(node="gpu-01", collector="kmsg_xid", kind="event", type="GPUXidError",
                                          severity="warning", entity="gpu:0000:18:00.0", reason="Xid13",
                                          message="app error")))
    assert [(r["remediation"], r["decision"]) for r in audits.records] == [("slurm", "dry_run"), ("modprobe", "dry_run")]
    assert audits.records[0]["reason"].startswith("would drain Slurm node gpu-01")
    assert argv_log(tools) == [], "dry-run must not run anything"


async def test_a_dry_run_cooldown_says_nothing_acted_and_never_holds_back_a_real_action(tools: Path,
                                                                                        tmp_path: Path) -> None:
    """Issue 22 item 8: a dry run starts the rule's cooldown (the trail shows a repeat would be
    suppressed) but says "would have acted ... (dry run)", never "acted"; enforcing later acts at once."""
    cfg = RemediationsConfig(cordon_with="slurm")
    audits, now = Audits(), [1000.0]
    loaded = load_plugins(cfg, HostRoot(tmp_path))
    eng = Engine(cfg, loaded.available, audit=audits, clock=lambda: now[0])
    await eng.handle(_msg())
    now[0] += 7
    await eng.handle(_msg())
    first, repeat = audits.records
    assert first["decision"] == "dry_run"
    assert (repeat["decision"], repeat["reason"]) == ("skipped",
                                                      "cooldown: would have acted 7s ago (dry run; cooldown 600s)")
    assert "acted 7s ago (cooldown" not in repeat["reason"]
    enforcing = RemediationsConfig(cordon_with="slurm", enforce=True, repair=NO_REPAIR)
    eng2 = Engine(enforcing, load_plugins(enforcing, HostRoot(tmp_path)).available, audit=audits,
                  budget=lambda: _Granted(), clock=lambda: now[0])
    eng2.attempts = eng.attempts  # a reload carries the attempts over (agent/daemon.py)
    now[0] += 1
    await eng2.handle(_msg())
    assert audits.records[-1]["decision"] == "executed", audits.records[-1]
    now[0] += 5
    await eng2.handle(_msg())
    assert audits.records[-1]["reason"] == "cooldown: acted 5s ago (cooldown 600s)"


class _Granted:
    async def take(self, node: str, reason: str) -> Any:
        from agent.remediation.budget import SlotDecision
        return SlotDecision(granted=True, reason="", used=1, limit=5, tripped=False)


async def test_a_missing_binary_is_named_in_the_audit_not_a_missing_plugin(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no modprobe, no scontrol anywhere
    cfg = RemediationsConfig(cordon_with="slurm", rules=[Rule(name="mystery", action="no_such_plugin",
                                                               match=Match(type=["Mystery"]))])
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits)
    await eng.handle(_msg(type_="KernelModuleNotLoaded", entity="module:nvidia_peermem"))
    await eng.handle(_msg(type_="Mystery", entity="x"))
    modprobe, mystery = audits.records
    assert modprobe["decision"] == "failed" and modprobe["remediation"] == "modprobe"
    assert "modprobe plugin is installed but cannot run here: modprobe not found" in modprobe["reason"]
    assert "no remediation plugin 'no_such_plugin' is installed" in mystery["reason"]
    # issue 22 item 6: the reason names the rule as a rule ("cannot mystery: ..." read as a verb; "cannot r: ...")
    assert modprobe["reason"].startswith("cannot apply rule 'reload-nvidia-peermem': the modprobe plugin")
    assert mystery["reason"].startswith("cannot apply rule 'mystery': no remediation plugin 'no_such_plugin'")


async def test_slurm_drain_is_idempotent_and_resume_only_our_drain(tools: Path, tmp_path: Path) -> None:
    cfg = RemediationsConfig(enforce=True, cordon_with="slurm", uncordon_hold_down=0.2, repair=NO_REPAIR)
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits, budget=lambda: _AlwaysBudget(), validator=_passes)
    await eng.handle(_msg())
    await eng.handle(_msg(entity="gpu:0000:2a:00.0"))  # second trigger: already draining -> no second update
    updates = [a for a in argv_log(tools) if a[1] == "update"]
    assert updates == [["scontrol", "update", "NodeName=gpu-01", "State=DRAIN", "Reason=gpu-node-agent: GPUFellOffBus"]]
    assert [r["decision"] for r in audits.records] == ["executed", "skipped"]
    assert audits.records[1]["reason"].startswith("already done")
    await eng.handle(_msg(status="resolved"))
    await eng.handle(_msg(status="resolved", entity="gpu:0000:2a:00.0"))
    await _until(lambda: audits.records[-1]["action"] == "uncordon")
    assert argv_log(tools)[-1] == ["scontrol", "update", "NodeName=gpu-01", "State=RESUME"]
    assert audits.records[-1]["action"] == "uncordon" and audits.records[-1]["decision"] == "executed"


async def _until(pred: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


class _AlwaysBudget:
    async def take(self, node: str, reason: str) -> Any:
        from agent.remediation.budget import SlotDecision

        return SlotDecision(True, "granted", 1, 5, False)

    async def release(self, node: str) -> None:
        pass


async def test_modprobe_allowlist_verify_and_stderr(tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    monkeypatch.setenv("GNA_TEST_HOST_ROOT", str(host.root))
    cfg = RemediationsConfig(enforce=True, default_policy=True,
                             plugins={"modprobe": {"allowed": ["nvidia_peermem", "broken_mod"]}},
                             rules=[Rule(name="bad", action="modprobe", args={"module": "broken_mod"},
                                         match=Match(type=["Broken"])),
                                    Rule(name="evil", action="modprobe", args={"module": "evil; rm -rf /"},
                                         match=Match(type=["Evil"]))])
    audits = Audits()
    eng = _engine(cfg, HostRoot(host.root), audits)
    await eng.handle(_msg(type_="KernelModuleNotLoaded", entity="module:nvidia_peermem"))
    assert audits.records[-1]["decision"] == "executed"
    assert (host.p("/sys/module/nvidia_peermem/initstate")).read_text().strip() == "live"
    await eng.handle(_msg(type_="Broken", entity="x"))
    assert audits.records[-1]["decision"] == "failed" and "Invalid argument" in audits.records[-1]["error"]
    await eng.handle(_msg(type_="Evil", entity="x"))
    assert audits.records[-1]["decision"] == "failed" and "allowlist" in audits.records[-1]["error"]
    assert ["modprobe", "evil; rm -rf /"] not in argv_log(tools)
    for _ in range(4):  # backoff, then max attempts
        await eng.handle(_msg(type_="Broken", entity="x"))
    assert audits.records[-1]["decision"] == "skipped"


async def test_juicefs_warmup_paths_from_config_and_rate_limit(tools: Path, tmp_path: Path) -> None:
    cfg = RemediationsConfig(enforce=True, plugins={"juicefs_warmup": {
        "threads": 16, "mounts": {"/mnt/jfs": ["/mnt/jfs/data/train", "/mnt/jfs/ckpt"]}}})
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits)
    low = _msg(type_="JuiceFSCacheHitRatioLow", severity="warning", entity="juicefs:/mnt/jfs", collector="juicefs")
    await eng.handle(low)
    assert argv_log(tools) == [["juicefs", "warmup", "--threads", "16", "--background", "/mnt/jfs/data/train",
                                "/mnt/jfs/ckpt"]]
    eng.attempts.clear()  # past the rule's cooldown: the plugin's own rate limit still holds
    await eng.handle(low)
    assert len(argv_log(tools)) == 1 and audits.records[-1]["reason"].startswith("already done")
    await eng.handle(_msg(type_="JuiceFSCacheHitRatioLow", entity="juicefs:/mnt/other", collector="juicefs",
                          severity="warning"))
    assert audits.records[-1]["decision"] == "failed" and "no dataset paths" in audits.records[-1]["error"]


# -- Kubernetes -------------------------------------------------------------------------

@pytest.fixture
def kube() -> Any:
    k = FakeKube().start()
    yield k
    k.stop()


def _kube_engine(kube: FakeKube, tmp_path: Path, audits: Audits, token: str = "agent-token",
                 hold: float = 0.3) -> Engine:
    kc = kube.kubeconfig(tmp_path / f"kubeconfig-{token}", token)
    cfg = RemediationsConfig(enforce=True, uncordon_hold_down=hold, plugins={"kubernetes": {"kubeconfig": str(kc)}},
                             repair=NO_REPAIR)
    return _engine(cfg, HostRoot(tmp_path), audits, budget=lambda: _AlwaysBudget(), validator=_passes)


async def test_kubernetes_cordon_taint_condition_event_then_uncordon(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node("gpu-01")
    kube.conflicts_to_inject = 1  # someone else writes the Node between our GET and PATCH: 409, re-read
    audits = Audits()
    eng = _kube_engine(kube, tmp_path, audits)
    await eng.handle(_msg())
    node = kube.nodes["gpu-01"]
    assert audits.records[-1]["decision"] == "executed", audits.records[-1]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": "gpu-node-agent/degraded", "value": "GPUFellOffBus", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"]["gpu-node-agent/cordoned-by"] == "gpu-node-agent"
    conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conds == {"Ready": "True", "GPUFellOffBus": "True", "AcceleratedHardwareReady": "False"}, \
        "strategic merge keeps the kubelet's conditions"
    category = next(c for c in node["status"]["conditions"] if c["type"] == "AcceleratedHardwareReady")
    assert category["reason"] == "GPUFellOffBus"  # the category's condition names its trigger
    assert kube.events[0]["involvedObject"]["name"] == "gpu-01" and kube.events[0]["reason"] == "Cordoned"
    assert kube.conflicts == 1 and [r for r in kube.requests if r[0] == "GET"] == [("GET", "/api/v1/nodes/gpu-01", "")] * 2
    assert ("PATCH", "/api/v1/nodes/gpu-01", "application/merge-patch+json") in kube.requests
    assert ("PATCH", "/api/v1/nodes/gpu-01/status", "application/strategic-merge-patch+json") in kube.requests
    await eng.handle(_msg(entity="gpu:0000:18:00.0"))  # same trigger again: cooldown
    assert audits.records[-1]["decision"] == "skipped"
    await eng.handle(_msg(status="resolved"))
    await asyncio.sleep(0.1)
    assert kube.nodes["gpu-01"]["spec"]["unschedulable"] is True, "hold-down not over yet"
    await _until(lambda: audits.records[-1]["action"] == "uncordon")
    node = kube.nodes["gpu-01"]
    assert node["spec"].get("unschedulable") is False and "taints" not in node["spec"]
    assert "gpu-node-agent/cordoned-by" not in node["metadata"]["annotations"]
    conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conds["GPUFellOffBus"] == "False" and conds["AcceleratedHardwareReady"] == "True"
    assert "gpu-node-agent/node-conditions" not in node["metadata"]["annotations"]
    assert audits.records[-1]["action"] == "uncordon" and audits.records[-1]["decision"] == "executed"
    gate = audits.records[-2]  # issue 28: back in service only after validation passed
    assert (gate["action"], gate["decision"]) == ("validate", "executed") and "passed" in gate["reason"]
    assert "validation passed" in audits.records[-1]["reason"]


async def test_operator_cordoned_node_is_left_alone(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node("gpu-02", unschedulable=True, annotations={"ops/reason": "RMA ticket 4711"})
    audits = Audits()
    eng = _kube_engine(kube, tmp_path, audits, hold=0.1)
    await eng.handle(_msg(node="gpu-02"))
    assert audits.records[-1]["decision"] == "skipped" and "someone else" in audits.records[-1]["reason"]
    assert "gpu-node-agent/cordoned-by" not in kube.nodes["gpu-02"]["metadata"]["annotations"]
    await eng.handle(_msg(node="gpu-02", status="resolved"))
    await asyncio.sleep(0.4)
    assert kube.nodes["gpu-02"]["spec"]["unschedulable"] is True, "never uncordon what an operator cordoned"
    plugin = KubernetesRemediation(KubernetesConfig(kubeconfig=str(tmp_path / "kubeconfig-agent-token")), HostRoot("/"))
    r = await plugin.uncordon({"node": "gpu-02"})
    assert r.outcome == "already_done"


async def test_unknown_node_and_forbidden(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node("gpu-03")
    audits = Audits()
    await _kube_engine(kube, tmp_path, audits).handle(_msg(node="ghost"))
    assert audits.records[-1]["decision"] == "failed" and "404" in audits.records[-1]["error"]
    audits2 = Audits()
    await _kube_engine(kube, tmp_path, audits2, token="no-rights").handle(_msg(node="gpu-03"))
    assert audits2.records[-1]["decision"] == "failed" and "403" in audits2.records[-1]["error"]
    assert not kube.nodes["gpu-03"]["spec"].get("unschedulable")


# -- fleet budget over a real nats-server ---------------------------------------------------

async def test_100_agents_race_for_a_budget_of_5(tools: Path, tmp_path: Path, nats_server: NatsServerProcess) -> None:
    cfg = RemediationsConfig(enforce=True, cordon_with="slurm", repair=NO_REPAIR)
    conns = [await nats.connect(nats_server.url) for _ in range(100)]
    try:
        budgets = [FleetBudget(nc.jetstream(), max_nodes=5, max_percent=0.0, window=600) for nc in conns]
        await budgets[0].kv()  # the bucket exists before the stampede
        audits = [Audits() for _ in range(100)]
        engines = [_engine(cfg, HostRoot(tmp_path), a, budget=(lambda b=b: b)) for a, b in zip(audits, budgets,
                                                                                            strict=True)]
        await asyncio.gather(*(e.handle(_msg(node=f"gpu-{i:03d}")) for i, e in enumerate(engines)))
        decisions = [a.records[-1]["decision"] for a in audits]
        assert decisions.count("executed") == 5
        assert decisions.count("skipped") == 95
        assert all("budget exhausted" in a.records[-1]["reason"] for a in audits if a.records[-1]["decision"] == "skipped")
        drains = [a for a in argv_log(tools) if a[1] == "update"]
        assert len(drains) == 5
        assert sum(1 for a in audits if a.alerts and a.alerts[0][0] == "RemediationBudgetExhausted") == 95
        status = await budgets[0].status()
        assert status["used"] == 5 and status["tripped"] is True
        await budgets[0].reset()
        assert (await budgets[0].status())["used"] == 0
    finally:
        for nc in conns:
            await nc.close()


async def test_nats_down_means_no_cordon(tools: Path, tmp_path: Path) -> None:
    cfg = RemediationsConfig(enforce=True, cordon_with="slurm")
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits, budget=lambda: None)
    await eng.handle(_msg())
    assert audits.records[-1]["decision"] == "skipped" and "fail safe" in audits.records[-1]["reason"]
    assert [a for a in argv_log(tools) if a[1] == "update"] == []


async def _cordoners(url: str, n: int) -> tuple[list[Any], Any, list[dict[str, Any]]]:
    """``n`` started central cordoners (Slurm), a NATS connection, and the audits they publish."""
    from agent import config as configmod
    from fleet.cordoner import Cordoner

    agent_cfg = configmod.parse('[remediations]\ncordon_with = "slurm"\n').agent
    cords = [Cordoner(agent_cfg, [url], name=f"c{i}") for i in range(n)]
    for c in cords:
        await c.start()
    nc = await nats.connect(url)
    audits: list[dict[str, Any]] = []

    async def on_audit(m: Any) -> None:
        audits.append(json.loads(m.data))

    await nc.subscribe("gna.actions.>", cb=on_audit)
    return cords, nc, audits


async def test_central_cordoner_queue_group_acts_once_per_message(tools: Path, tmp_path: Path,
                                                                  nats_server: NatsServerProcess) -> None:
    from gna_types.subjects import event_subject

    cords, nc, audits = await _cordoners(nats_server.url, 2)
    js = nc.jetstream()
    for i in range(20):
        m = _msg(node=f"node-{i}")
        await js.publish(event_subject(m["node"], m["collector"], m["severity"]), json.dumps(m).encode(),
                         headers={"Nats-Msg-Id": m["id"]})
    for _ in range(100):
        if len(audits) >= 20:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    for c in cords:
        await c.stop()
    await nc.close()
    triggers = [a["trigger"]["id"] for a in audits]
    assert len(triggers) == 20 and len(set(triggers)) == 20, "each message decided exactly once"
    assert all(a["decision"] == "dry_run" for a in audits)
    assert sum(c.handled for c in cords) == 20


async def test_cordoner_takes_identity_from_the_subject_and_survives_poison(tools: Path, tmp_path: Path,
                                                                           nats_server: NatsServerProcess) -> None:
    """#13 D1/D2: a message on nodeb's subject naming nodea is rejected; malformed ones are terminated and
    counted, never redelivered, and a valid message behind 200 of them is still decided."""
    from gna_types.subjects import event_subject

    (c,), nc, audits = await _cordoners(nats_server.url, 1)
    assert c.engine is not None and "modprobe" not in c.engine.plugins, "node-local plugins stay on the nodes"
    js = nc.jetstream()
    spoof = _msg(node="nodea")
    await js.publish(event_subject("nodeb", spoof["collector"], spoof["severity"]), json.dumps(spoof).encode())
    for i in range(200):
        bad = {**_msg(node="nodeb"), "entity": ["not", "a", "string"], "id": f"bad{i}"}
        await js.publish(event_subject("nodeb", "kmsg_xid", "critical"), json.dumps(bad).encode())
    await js.publish(event_subject("nodeb", "kmsg_xid", "critical"), b"\xff not json")
    good = _msg(node="nodec")
    await js.publish(event_subject("nodec", good["collector"], good["severity"]), json.dumps(good).encode())
    for _ in range(200):
        if any(a["node"] == "nodec" for a in audits):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    await c.stop()
    await nc.close()
    assert [a["node"] for a in audits if a["remediation"] == "slurm"] == ["nodec"], audits[:3]
    # schema-checked at the boundary now: the 200 never reach the engine, each is counted with a sample
    assert c.rejected == {"node_mismatch": 1, "schema": 200, "not_json": 1}
    assert "$.entity" in c.rejections.samples["schema"]["detail"]


ACTION_SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "agent/schema/action.schema.json").read_text())


async def test_agent_publishes_dry_run_audits_on_the_actions_subject(tmp_path: Path,
                                                                     nats_server: NatsServerProcess) -> None:
    import jsonschema

    from tests.conftest import agent_config, running_agent, stream_messages

    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.remove_dev_node("nvidia1")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root,
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        for _ in range(200):
            if agent.engine and agent.engine.decisions:
                break
            await asyncio.sleep(0.02)
        while agent.spool and agent.spool.depth:
            await asyncio.sleep(0.02)
    actions = await stream_messages(nats_server.url, "gna.actions.>")
    assert actions, "no audit record reached the stream"
    rec = actions[0]
    jsonschema.Draft202012Validator(ACTION_SCHEMA).validate(rec)
    assert (rec["remediation"], rec["decision"], rec["trigger"]["type"]) == ("kubernetes", "dry_run",
                                                                            "GPUDevicesMissing")
    assert rec["node"] == "node-a.example.com"


def test_remediation_config_errors(tmp_path: Path) -> None:
    from agent import config as configmod

    with pytest.raises(configmod.ConfigError, match=r"remediations\.rules\.match\.severty.*'severity'"):
        configmod.parse('[[remediations.rules]]\nname = "x"\naction = "slurm"\n[remediations.rules.match]\n'
                        'severty = ["critical"]\n')
    with pytest.raises(configmod.ConfigError, match=r"unknown remediation plugin 'slurn'.*'slurm'"):
        configmod.parse("[remediations.plugins.slurn]\ndry_run = true\n")
    with pytest.raises(configmod.ConfigError, match=r"remediations\.plugins\.modprobe\.alowed.*'allowed'"):
        configmod.parse('[remediations.plugins.modprobe]\nalowed = ["x"]\n')
    cfg = configmod.parse('[remediations]\nenforce = true\n[remediations.plugins.kubernetes]\ndry_run = true\n')
    eng = Engine(cfg.agent.remediations, {}, audit=Audits())
    assert eng.dry_run("kubernetes") and not eng.dry_run("slurm")


async def test_per_node_mode_never_cordons_a_victim_of_an_open_incident(tools: Path, tmp_path: Path,
                                                                       nats_server: NatsServerProcess) -> None:
    """#15 deliver 4 without the central cordoner: a node agent that cordons itself follows the
    correlator's incidents (KV gna-incidents); its own watchdog timeout in a job whose open incident
    names it a victim is audited as skipped, and no cordon runs. Another job's timeout is acted on."""
    from agent.remediation.incidents import INCIDENTS_BUCKET
    from tests.conftest import agent_config, running_agent

    node = "node-a.example.com"
    nc = await nats.connect(nats_server.url)
    kv = await nc.jetstream().create_key_value(bucket=INCIDENTS_BUCKET, history=5)
    await kv.put("0x5c1f", json.dumps({"job": "0x5c1f", "status": "open", "victims": [node],
                                      "culprit": {"node": "gpu-9", "entity": "ib:mlx5_3/1", "kind": "hca_port"}}).encode())
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    lines = []
    for job, pid in (("0x5c1f", 77), ("0x9e2d", 78)):
        pre = f"node-a:{pid}:{pid + 1} [0] NCCL INFO "
        lines += [pre + f"comm 0x7f00 rank 3 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId {job} - Init COMPLETE"]
    for pid in (77, 78):  # the trainers are running (a process gone from /proc is forgotten)
        host.write(f"/proc/{pid}/comm", "python\n")
    log = host.p("/var/log/nccl/node-a.77.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(lines[:1]) + "\n")
    host.write("/var/log/nccl/node-a.78.log", lines[1] + "\n")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node=node, extra=(
        '[remediations]\nenforce = true\ncordon_with = "slurm"\n[[remediations.rules]]\nname = "cordon-on-timeout"\n'
        'action = "cordon"\n[remediations.rules.match]\ntype = ["NCCLCollectiveTimeout"]\nstatus = ["event"]\n'
        "[collectors.nccl_logs]\ninterval = 0.2\n"))
    timeout = ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
               "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
    async with running_agent(cfg) as agent:
        for _ in range(100):
            if agent.watching_incidents and agent.incident_view.incidents:
                break
            await asyncio.sleep(0.05)
        assert agent.incident_view.incidents, "the agent did not read the incidents bucket"
        with open(log, "a") as fh:
            fh.write(timeout)
        with open(host.p("/var/log/nccl/node-a.78.log"), "a") as fh:
            fh.write(timeout)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            decided = [d for d in (agent.engine.decisions if agent.engine else []) if d["rule"] == "cordon-on-timeout"]
            if len(decided) >= 2:
                break
            await asyncio.sleep(0.1)
    by_job = {d["reason"].split()[3] if "victim" in d["reason"] else "other": d for d in decided}
    assert by_job["0x5c1f"]["decision"] == "skipped" and "culprit gpu-9 ib:mlx5_3/1" in by_job["0x5c1f"]["reason"]
    other = [d for d in decided if d is not by_job["0x5c1f"]]
    assert other and other[0]["decision"] in ("executed", "failed"), decided  # the other job's timeout is acted on
    await nc.close()


async def test_the_hold_down_uncordon_waits_for_a_validation_that_passed(tools: Path, tmp_path: Path) -> None:
    """Issue 28: without a repair episode, every trigger resolved for the hold-down is not enough: a validation
    refused because a job still holds the GPUs tries again after another hold-down, a failed one keeps the
    node out (alerted), a passed one uncordons."""
    verdicts = ["busy", "passed"]

    async def validator(level: str, **_: Any) -> Validation:
        return Validation(verdicts.pop(0), "")

    cfg = RemediationsConfig(enforce=True, cordon_with="slurm", uncordon_hold_down=0.1, repair=NO_REPAIR)
    audits = Audits()
    eng = _engine(cfg, HostRoot(tmp_path), audits, budget=lambda: _AlwaysBudget(), validator=validator)
    await eng.handle(_msg())
    await eng.handle(_msg(status="resolved"))
    await _until(lambda: audits.records[-1]["action"] == "uncordon")
    assert [(r["action"], r["decision"]) for r in audits.records] == [
        ("apply", "executed"), ("validate", "skipped"), ("validate", "executed"), ("uncordon", "executed")]
    assert not audits.alerts

    failing = _engine(cfg, HostRoot(tmp_path), audits2 := Audits(), budget=lambda: _AlwaysBudget(),
                      validator=lambda level, **_: _verdict("failed"))
    await failing.handle(_msg(node="gpu-02"))
    await failing.handle(_msg(node="gpu-02", status="resolved"))
    await _until(lambda: bool(audits2.alerts))
    await asyncio.sleep(0.3)
    assert [r["action"] for r in audits2.records] == ["apply", "validate"]
    assert audits2.alerts[0][0] == "RemediationNodeKeptOut"


async def _verdict(v: str) -> Validation:
    return Validation(v, "dcgm_diag failed")
