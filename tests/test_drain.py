"""The drain remediation (remediations/drain.py) against the fake Kubernetes API (tests/fake_kube.py) over
loopback with a real lightkube client: the three modes, kubectl's pod filters, PodDisruptionBudgets (429
retried with backoff, 500 for two budgets, the deadline), the refusal of an uncordoned node, RBAC refusals.
Timeouts and backoffs are tens of milliseconds: the file runs in a few seconds."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gna_sdk.hostroot import HostRoot
from remediations.drain import (
    MAX_NAMES,
    SKIP_REASONS,
    DrainConfig,
    KubernetesDrainRemediation,
    backoff,
    classify,
    names,
    printable,
    requests_gpu,
)
from tests.fake_kube import EVICTION_MULTIPLE_PDBS, EVICTION_PDB_REFUSED, FakeKube

NODE = "gpu-01"
GPU = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}
DS = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin", "uid": "ds-1", "controller": True}]
JOB = [{"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "job-1", "controller": True}]
FAST = {"poll_interval": 0.02, "backoff_initial": 0.01, "backoff_max": 0.04, "request_timeout": 2.0}


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube().start()
    yield k
    k.stop()


def _plugin(kube: FakeKube, tmp_path: Path, token: str = "agent-token", **cfg: Any) -> KubernetesDrainRemediation:
    kc = kube.kubeconfig(tmp_path / f"kubeconfig-{token}", token)
    config = msgspec.convert({"kubeconfig": str(kc), **FAST, "deadline": 3.0, "timeout": 0.5, **cfg}, DrainConfig)
    return KubernetesDrainRemediation(config, HostRoot(tmp_path), rng=random.Random(7))


def _msg(node: str = NODE) -> dict[str, Any]:
    return {"id": "01J0MSG", "node": node, "type": "GPUFellOffBus", "message": "GPU 0000:18:00.0 fell off the bus",
            "details": {"incident": "inc-42"}}


def _evicted(kube: FakeKube) -> list[str]:
    return [f"{ns}/{n}" for ns, n, code in kube.evictions if code == 201]


def _trainers(kube: FakeKube, n: int, ns: str = "team-a", labels: dict[str, str] | None = None) -> None:
    for i in range(n):
        kube.add_pod(ns, f"llama-worker-{i}", f"uid-w{i}", node_name=NODE, resources=GPU, owners=JOB,
                     labels=labels or {"job": "llama"})


# -- wait mode (AllowCompletion) ----------------------------------------------------------------------

async def test_wait_succeeds_when_the_pods_end_by_themselves(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)

    async def jobs_end() -> None:  # once the drain has seen them
        while not any(q.startswith("/api/v1/pods") for _, q in kube.queries):
            await asyncio.sleep(0.005)
        kube.end_pod("team-a", "llama-worker-0", after=0.05)  # deleted by its job controller
        kube.end_pod("team-a", "llama-worker-1", after=0.12, phase="Succeeded")  # finished, object kept

    ending = asyncio.create_task(jobs_end())
    r = await _plugin(kube, tmp_path, mode="wait", timeout=2.0).execute(_msg(), {})
    await ending
    assert r.outcome == "executed", r
    assert r.data["ended"] == 2 and r.data["selected"] == 2 and r.data["drained"] is True
    assert kube.evictions == [], "wait mode never evicts"
    lists = [q for m, q in kube.queries if q.startswith("/api/v1/pods")]
    assert len(lists) >= 3 and all("fieldSelector=spec.nodeName%3Dgpu-01" in q for q in lists)


async def test_wait_times_out_naming_the_pods_still_running(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 12)
    t0 = time.monotonic()
    r = await _plugin(kube, tmp_path, mode="wait", timeout=0.2).execute(_msg(), {})
    assert 0.2 <= time.monotonic() - t0 < 2.5
    assert r.outcome == "failed"
    assert r.detail.startswith("12 pods still running on gpu-01 after 0.2 s: team-a/llama-worker-0, "
                               "team-a/llama-worker-1, team-a/llama-worker-10"), r.detail
    assert r.detail.endswith(f"(+{12 - MAX_NAMES} more)") and len(r.data["remaining"]) == MAX_NAMES
    assert kube.evictions == [] and len(kube.pods) == 12


# -- evict mode ---------------------------------------------------------------------------------------

async def test_evict_leaves_daemonset_mirror_finished_and_cpu_pods_and_evicts_the_rest(kube: FakeKube,
                                                                                       tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)
    kube.add_pod("gpu-operator", "nvidia-device-plugin-x7", "uid-ds", node_name=NODE, resources=GPU, owners=DS)
    kube.add_pod("kube-system", f"static-gpu-burn-{NODE}", "uid-mirror", node_name=NODE, resources=GPU,
                 annotations={"kubernetes.io/config.mirror": "3f1c"})
    kube.add_pod("team-a", "eval-done", "uid-done", node_name=NODE, resources=GPU, owners=JOB, phase="Succeeded")
    kube.add_pod("team-a", "tensorboard", "uid-cpu", node_name=NODE, owners=JOB)  # asks for no GPU
    kube.add_pod("team-a", "other-node-worker", "uid-other", node_name="gpu-02", resources=GPU, owners=JOB)
    kube.ignore_field_selector = True  # the plugin must not trust the server to have filtered
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0.05).execute(_msg(), {})
    assert r.outcome == "executed", r
    assert sorted(_evicted(kube)) == ["team-a/llama-worker-0", "team-a/llama-worker-1"]
    assert r.data["skipped"] == {"daemonset": 1, "mirror": 1, "finished": 1, "not_gpu": 1, "other_node": 1}
    assert r.data["evicted"] == 2 and r.detail == "drained gpu-01: 2 evicted, 0 ended by themselves, 0 already gone"
    assert {n for _, n in kube.pods} == {"nvidia-device-plugin-x7", f"static-gpu-burn-{NODE}", "eval-done",
                                         "tensorboard", "other-node-worker"}
    body = kube.eviction_bodies[0]
    assert (body["apiVersion"], body["kind"]) == ("policy/v1", "Eviction")
    assert body["deleteOptions"]["preconditions"]["uid"] in ("uid-w0", "uid-w1"), "never a same-named replacement"
    assert ("POST", "/api/v1/namespaces/team-a/pods/llama-worker-0/eviction", "application/json") in kube.requests


async def test_evict_all_pods_mode_and_a_rule_overriding_mode_and_timeout(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    kube.add_pod("team-a", "tensorboard", "uid-cpu", node_name=NODE, owners=JOB)
    kube.add_pod("gpu-operator", "dcgm-exporter", "uid-ds", node_name=NODE, owners=DS)
    plugin = _plugin(kube, tmp_path, pods="all", mode="wait", timeout=2.0)
    assert plugin.plan(_msg(), {"mode": "evict", "timeout": 0}).startswith(
        "on Kubernetes node gpu-01: evict the pods left through the Eviction API")
    t0 = time.monotonic()
    r = await plugin.execute(_msg(), {"mode": "evict", "timeout": 0})  # Immediate
    assert r.outcome == "executed" and time.monotonic() - t0 < 1.0, r
    assert _evicted(kube) == ["team-a/tensorboard"] and r.data["skipped"] == {"daemonset": 1}


async def test_a_pdb_429_is_retried_with_backoff_until_it_allows(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 1)
    pdb = kube.add_pdb("team-a", "llama-pdb", {"job": "llama"}, disruptions_allowed=0, release_after=3)
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0).execute(_msg(), {})
    assert r.outcome == "executed", r
    assert [c for _, _, c in kube.evictions] == [429, 429, 429, 201]
    assert r.data["refused_429"] == 3 and r.data["eviction_tries"] == 4
    assert pdb.evicted == ["llama-worker-0"] and pdb.disruptions_allowed == 0, "the budget was decremented"


async def test_a_pdb_that_never_allows_ends_at_the_deadline_failed(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)
    kube.add_pdb("team-a", "llama-pdb", {"job": "llama"}, min_available=2)
    t0 = time.monotonic()
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0, deadline=0.4).execute(_msg(), {})
    took = time.monotonic() - t0
    assert r.outcome == "failed" and took < 2.0, (r, took)  # the deadline bounds it
    assert "2 pods not drained from gpu-01: team-a/llama-worker-0 (429 The disruption budget llama-pdb needs 2 " \
           "healthy pods and has 2 currently (refused" in r.detail, r.detail
    assert "deadline reached" in r.detail and len(kube.pods) == 2
    refusals = [c for _, n, c in kube.evictions if n == "llama-worker-0"]
    assert set(refusals) == {429} and 3 <= len(refusals) <= 60, "retried, with growing pauses, not hammered"


async def test_two_pdbs_over_a_pod_fail_that_pod_without_retry(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    kube.add_pod("team-a", "llama-worker-0", "uid-w0", node_name=NODE, resources=GPU, owners=JOB,
                 labels={"job": "llama", "tier": "train"})
    kube.add_pod("team-b", "sd-worker-0", "uid-s0", node_name=NODE, resources=GPU, owners=JOB, labels={"job": "sd"})
    kube.add_pdb("team-a", "by-job", {"job": "llama"}, disruptions_allowed=1)
    kube.add_pdb("team-a", "by-tier", {"tier": "train"}, disruptions_allowed=1)
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0).execute(_msg(), {})
    assert r.outcome == "failed"
    assert r.data["failed"] == {"team-a/llama-worker-0": f"500 {EVICTION_MULTIPLE_PDBS}"}
    assert [(n, c) for _, n, c in kube.evictions if n == "llama-worker-0"] == [("llama-worker-0", 500)], "not retried"
    assert _evicted(kube) == ["team-b/sd-worker-0"], "the other pod is still drained"
    assert r.detail == f"1 pod not drained from gpu-01: team-a/llama-worker-0 (500 {EVICTION_MULTIPLE_PDBS})"


async def test_evicted_pods_are_waited_for_until_gone(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)
    kube.termination_delay = 0.15  # terminating, then gone
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0).execute(_msg(), {})
    assert r.outcome == "executed" and kube.pods == {}, r
    kube2_pods = 1
    _trainers(kube, kube2_pods)
    kube.termination_delay = 5.0  # longer than the deadline
    r = await _plugin(kube, tmp_path, mode="evict", timeout=0, deadline=0.3).execute(_msg(), {})
    assert r.outcome == "failed" and r.data.get("remaining") == ["team-a/llama-worker-0"], r
    assert r.data["drained"] is False and r.data["evicted"] == 1
    assert r.detail == "1 pod not drained from gpu-01: team-a/llama-worker-0 (evicted, still terminating)"


async def test_a_replaced_pod_is_not_evicted_in_place_of_the_one_we_saw(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 1)
    plugin = _plugin(kube, tmp_path, mode="evict", timeout=0)
    kube.add_pod("team-a", "llama-worker-0", "uid-NEW", node_name=NODE, resources=GPU, owners=JOB)  # same name
    ev = await plugin._evict(plugin.client(), ("team-a", "llama-worker-0"), "uid-w0", time.monotonic() + 2)
    assert (ev.outcome, ev.detail) == ("gone", "replaced by another pod of the same name")
    assert kube.evictions == [("team-a", "llama-worker-0", 409)] and ("team-a", "llama-worker-0") in kube.pods


# -- request mode -------------------------------------------------------------------------------------

async def test_request_mode_hands_off_once(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)
    kube.add_pod("gpu-operator", "nvidia-device-plugin-x7", "uid-ds", node_name=NODE, resources=GPU, owners=DS)
    plugin = _plugin(kube, tmp_path, mode="request")
    assert "create a gpu-node-agent.io/v1alpha1 DrainRequest in namespace gpu-node-agent" in plugin.plan(_msg(), {})
    r = await plugin.execute(_msg(), {})
    assert r.outcome == "executed" and "handed off" in r.detail and r.data["drained"] is False, r
    ((key, obj),) = kube.custom.items()
    assert key[:3] == ("gpu-node-agent.io", "drainrequests", "gpu-node-agent")
    assert obj["kind"] == "DrainRequest" and obj["apiVersion"] == "gpu-node-agent.io/v1alpha1"
    spec = obj["spec"]
    assert (spec["nodeName"], spec["reason"], spec["incident"], spec["messageId"]) == \
        (NODE, "GPUFellOffBus", "inc-42", "01J0MSG")
    assert spec["podsToDrain"] == {"team-a": ["llama-worker-0", "llama-worker-1"]}
    assert spec["requestedAt"].endswith("Z") and kube.evictions == []
    again = await plugin.execute(_msg(), {})  # the same incident redelivered
    assert again.outcome == "already_done" and "already exists" in again.detail
    assert len(kube.custom) == 1 and r.data["request"] == again.data["request"]
    assert ("POST", "/apis/gpu-node-agent.io/v1alpha1/namespaces/gpu-node-agent/drainrequests",
            "application/json") in kube.requests


async def test_request_mode_without_the_crd_installed_fails_clearly(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 1)
    kube.custom_kinds.clear()
    r = await _plugin(kube, tmp_path, mode="request").execute(_msg(), {})
    assert r.outcome == "failed" and "404 NotFound the server could not find the requested resource" in r.detail


# -- refusals and errors ------------------------------------------------------------------------------

async def test_refuses_a_node_that_is_not_cordoned(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE)
    _trainers(kube, 1)
    for mode in ("wait", "evict", "request"):
        r = await _plugin(kube, tmp_path, mode=mode, timeout=0).execute(_msg(), {})
        assert r.outcome == "failed" and "gpu-01 is not cordoned" in r.detail and "refusing" in r.detail
    assert kube.evictions == [] and kube.custom == {}
    assert not [q for _, q in kube.queries if q.startswith("/api/v1/pods")], "not even listed"


async def test_forbidden_token_and_forbidden_eviction_are_failures_not_exceptions(kube: FakeKube,
                                                                                  tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    _trainers(kube, 2)
    r = await _plugin(kube, tmp_path, token="no-rights", mode="evict", timeout=0).execute(_msg(), {})
    assert r.outcome == "failed" and r.detail.startswith("GET node gpu-01: 403 Forbidden"), r
    kube.denied.add(("can-read", "pods/eviction"))
    r = await _plugin(kube, tmp_path, token="can-read", mode="evict", timeout=0).execute(_msg(), {})
    assert r.outcome == "failed"
    assert r.data["failed"]["team-a/llama-worker-0"] == (
        '403 Forbidden pods "llama-worker-0" is forbidden: User "can-read" cannot create resource '
        '"pods/eviction" in API group "" in the namespace "team-a"')
    assert [c for _, _, c in kube.evictions] == [403, 403], "a refusal is not retried"
    kube.denied.add(("no-list", "pods"))
    r = await _plugin(kube, tmp_path, token="no-list", mode="wait").execute(_msg(), {})
    assert r.outcome == "failed" and r.detail.startswith("list pods on node gpu-01: 403 Forbidden pods is forbidden")


async def test_unknown_node_unreachable_api_and_too_many_pods(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    r = await _plugin(kube, tmp_path).execute(_msg(node="ghost"), {})
    assert r.outcome == "failed" and r.detail == 'GET node ghost: 404 NotFound nodes "ghost" not found'
    _trainers(kube, 3)
    r = await _plugin(kube, tmp_path, max_pods=2).execute(_msg(), {})
    assert r.outcome == "failed" and r.detail == "more than 2 pods on node gpu-01: refusing to drain (max_pods)"
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(kube.kubeconfig(tmp_path / "kc").read_text().replace(kube.url, "http://127.0.0.1:9"))
    config = msgspec.convert({"kubeconfig": str(dead), **FAST}, DrainConfig)
    r = await KubernetesDrainRemediation(config, HostRoot(tmp_path)).execute(_msg(), {})
    assert r.outcome == "failed" and r.detail.startswith("GET node gpu-01: ConnectError"), r
    missing = msgspec.convert({"kubeconfig": str(tmp_path / "absent")}, DrainConfig)
    r = await KubernetesDrainRemediation(missing, HostRoot(tmp_path)).execute(_msg(), {})
    assert r.outcome == "failed" and r.detail.startswith("kubernetes client:"), r


async def test_nothing_to_drain_is_already_done(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_node(NODE, unschedulable=True)
    kube.add_pod("gpu-operator", "nvidia-device-plugin-x7", "uid-ds", node_name=NODE, resources=GPU, owners=DS)
    r = await _plugin(kube, tmp_path, mode="evict").execute(_msg(), {})
    assert r.outcome == "already_done" and r.detail == "no GPU pods to drain on gpu-01"
    assert r.data["skipped"] == {"daemonset": 1} and kube.evictions == []


def test_plan_config_and_args_are_checked(tmp_path: Path) -> None:
    plugin = KubernetesDrainRemediation(DrainConfig(), HostRoot(tmp_path), client=object())
    assert plugin.plan(_msg(), {}) == ("wait up to 600 s for the GPU pods on Kubernetes node gpu-01 to end "
                                       "(DaemonSet, mirror and finished pods left alone; refused unless the node "
                                       "is cordoned)")
    assert "then evict the GPU pods left through the Eviction API (PodDisruptionBudgets respected" in \
        plugin.plan(_msg(), {"mode": "evict", "timeout": 30})
    for bad in ({"mode": "nuke"}, {"timeout": -1}, {"timeout": math.inf}, {"timeout": True}, {"timeout": 1e9},
                {"force": True}):
        with pytest.raises(ValueError):
            plugin.plan(_msg(), bad)
    with pytest.raises(ValueError, match="not a Kubernetes node name"):
        plugin.plan(_msg(node="../../namespaces/kube-system"), {})
    bad_configs: list[dict[str, Any]] = [
        {"poll_interval": 0}, {"timeout": 4000}, {"backoff_max": 0.1, "backoff_initial": 1}, {"deadline": math.nan},
        {"max_pods": 0}, {"gpu_resources": []}, {"mode": "delete"}, {"colour": 1}]
    for cfg in bad_configs:
        with pytest.raises((msgspec.ValidationError, ValueError)):
            msgspec.convert(cfg, DrainConfig)
    assert KubernetesDrainRemediation.name == "drain" and KubernetesDrainRemediation.needs_budget is False


async def test_bad_args_fail_in_execute_too(tmp_path: Path) -> None:
    plugin = KubernetesDrainRemediation(DrainConfig(), HostRoot(tmp_path), client=object())
    r = await plugin.execute(_msg(), {"mode": "nuke"})
    assert r.outcome == "failed" and "drain mode 'nuke'" in r.detail


# -- the fake's answers are the apiserver's -----------------------------------------------------------

def test_the_fake_eviction_answers_as_the_apiserver_does(kube: FakeKube) -> None:
    _trainers(kube, 2)
    kube.add_pdb("team-a", "llama-pdb", {"job": "llama"}, max_unavailable=0)

    def evict(name: str, body_name: str | None = None) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": body_name or name, "namespace": "team-a"}}).encode()
        req = urllib.request.Request(f"{kube.url}/api/v1/namespaces/team-a/pods/{name}/eviction", data=body,
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    code, body = evict("llama-worker-0")
    assert code == 429 and body["reason"] == "TooManyRequests" and body["message"] == EVICTION_PDB_REFUSED
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message": "The disruption budget "
                                          "llama-pdb needs 2 healthy pods and has 2 currently"}]
    assert evict("llama-worker-0", "other")[0] == 400
    code, body = evict("ghost")
    assert code == 404 and body["message"] == 'pods "ghost" not found'
    kube.add_pdb("team-a", "second", {"job": "llama"}, disruptions_allowed=5)
    code, body = evict("llama-worker-1")
    assert code == 500 and "reason" not in body and body["message"] == EVICTION_MULTIPLE_PDBS
    kube.pods[("team-a", "llama-worker-1")]["status"]["phase"] = "Failed"  # terminal: budgets not consulted
    assert evict("llama-worker-1") == (201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                             "status": "Success", "code": 201})
    assert ("team-a", "llama-worker-1") not in kube.pods


# -- properties of the pure parts ---------------------------------------------------------------------

JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                  max_size=4), max_leaves=30)
MIRROR = "kubernetes.io/config.mirror"
KEYS = st.sampled_from(["metadata", "spec", "status", "namespace", "name", "uid", "nodeName", "ownerReferences",
                        "kind", "annotations", "phase", "containers", "initContainers", "resources", "limits",
                        "requests", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", MIRROR,
                        "DaemonSet", "Succeeded", NODE])
POD_LIKE = st.recursive(st.one_of(st.none(), KEYS, st.integers(-2, 9), st.text(max_size=5)),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5),
                        max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, POD_LIKE))
def test_classify_never_raises_and_drain_means_every_filter_passed(pod: Any) -> None:
    for gpu in (None, ["nvidia.com/gpu", "nvidia.com/mig-*"]):
        why = classify(pod, NODE, gpu)
        assert why == "drain" or why in SKIP_REASONS
        if why == "drain":
            meta = pod["metadata"]
            assert pod["spec"]["nodeName"] == NODE and meta["name"] and meta["namespace"] and meta["uid"]
            assert MIRROR not in (meta.get("annotations") or {})
            assert not any(isinstance(o, dict) and o.get("kind") == "DaemonSet"
                           for o in (meta.get("ownerReferences") or []))
            assert (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            assert gpu is None or requests_gpu(pod["spec"], gpu)


ZERO = ("0", "0.0", "00")


@given(st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu", "nvidia.com/mig-3g.40gb", "amd.com/gpu"]),
                       st.sampled_from([*ZERO, "1", "8", "500m", "", "lots"])))
def test_requests_gpu_is_a_non_zero_gpu_resource(limits: dict[str, str]) -> None:
    spec = {"initContainers": [{"resources": {"requests": limits}}]}
    got = requests_gpu(spec, ["nvidia.com/gpu", "nvidia.com/mig-*"])
    gpu_values = [v for k, v in limits.items() if k.startswith("nvidia.com/")]
    assert got == any(v not in ZERO for v in gpu_values), "zero asks for nothing; unreadable counts as asking"


@given(st.lists(st.text(max_size=30), max_size=30), st.text(max_size=400))
def test_names_and_printable_are_bounded_and_printable(keys: list[str], text: str) -> None:
    shown = names(keys)
    assert shown.isprintable() and len(shown) <= MAX_NAMES * 120 + 20
    assert (f"(+{len(keys) - MAX_NAMES} more)" in shown) == (len(keys) > MAX_NAMES)
    p = printable(text)
    assert p.isprintable() and len(p) <= 300


@given(st.integers(0, 10_000), st.floats(0.001, 10), st.floats(0.001, 100), st.floats(0, 1000))
def test_backoff_grows_is_jittered_and_capped(attempt: int, initial: float, extra: float, retry_after: float) -> None:
    maximum = initial + extra
    rng = random.Random(attempt)
    got = backoff(attempt, initial, maximum, retry_after, rng)
    step = min(maximum, initial * 2 ** min(attempt, 62))
    assert min(maximum, max(retry_after, step / 2)) <= got <= maximum
    assert got >= min(maximum, retry_after)
