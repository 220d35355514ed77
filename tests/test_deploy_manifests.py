"""The shipped Kubernetes manifests (deploy/kubernetes/): least privilege as structure, RBAC equal to what
remediations/kubernetes.py calls, and the per-node ValidatingAdmissionPolicies' CEL evaluated for real
(cel-python) against admission requests built from what the remediation actually writes."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import MapType, StringType
from celpy.evaluation import CELEvalError

from agent.cli import build_parser
from gna_sdk.hostroot import HostRoot
from remediations import kubernetes as kube_plugin
from remediations.kubernetes import KubernetesConfig, KubernetesRemediation
from tests.fake_kube import FakeKube

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
VARIANTS = ("per-node", "central")
AGENT_SA = ("gpu-node-agent", "gpu-node-agent")  # (namespace, name)
CORDONER_SA = ("gpu-node-agent", "gpu-node-agent-cordoner")
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
OURS = "gpu-node-agent/"  # the prefix the policy lets the agent own: taint and annotation keys
KUSTOMIZE_KINDS = {"Kustomization", "Component"}

# Every Kubernetes API call remediations/kubernetes.py makes, as RBAC (apiGroup, resource, verb, namespace;
# None: cluster-scoped). Call sites: KubernetesRemediation._get -> client.get(Node); execute and uncordon ->
# client.patch(Node, PatchType.MERGE); _condition -> client.patch(Node.Status, PatchType.STRATEGIC); _event ->
# client.create(Event, namespace=event_namespace). A new call there must show up here and in the roles.
EVENT_NAMESPACE = KubernetesConfig().event_namespace
KUBERNETES_CALLS = {
    ("", "nodes", "get", None),
    ("", "nodes", "patch", None),
    ("", "nodes/status", "patch", None),
    ("", "events", "create", EVENT_NAMESPACE),
}


# -- loading ------------------------------------------------------------------------------

def _docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def _all_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))


def _objects(path: Path) -> list[dict[str, Any]]:
    """The API objects a kustomization directory (or a manifest file) stands for. The variants only list
    resources (asserted below), so this is what `kubectl kustomize` renders for them too."""
    if path.is_file():
        return _docs(path)
    (kust,) = _docs(path / "kustomization.yaml")
    return [o for r in kust.get("resources", []) for o in _objects(path / r)]


def variant(name: str) -> list[dict[str, Any]]:
    return _objects(DEPLOY / name)


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def _key(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")


# -- structure ----------------------------------------------------------------------------

def test_every_manifest_is_a_named_kubernetes_object() -> None:
    files = _all_files()
    assert len(files) >= 8, files
    for path in files:
        docs = _docs(path)
        assert docs, f"{path}: empty"
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind"), f"{path}: {doc}"
            if doc["kind"] in KUSTOMIZE_KINDS:
                for ref in doc.get("resources", []) + doc.get("components", []):
                    assert (path.parent / ref).exists(), f"{path}: {ref} does not exist"
                continue
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without metadata.name"
            namespaced = doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding",
                                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
            assert bool(doc["metadata"].get("namespace")) == namespaced, f"{path}: {_key(doc)} namespace"


def test_variants_are_plain_resource_lists_without_duplicates() -> None:
    for name in (*VARIANTS, "base"):
        (kust,) = _docs(DEPLOY / name / "kustomization.yaml")
        # no patches or namespace transformer: what the files say is what gets applied
        assert set(kust) <= {"apiVersion", "kind", "resources"}, (name, sorted(kust))
    for name in VARIANTS:
        keys = [_key(o) for o in variant(name)]
        assert len(keys) == len(set(keys)), keys
    listed = {(p.parent / r).resolve() for p in DEPLOY.rglob("kustomization.yaml")
              for d in _docs(p) for r in d.get("resources", [])}
    orphans = [p for p in _all_files() if p.name != "kustomization.yaml" and p.resolve() not in listed]
    assert not orphans, f"in no variant, so never applied: {orphans}"


@needs_kubectl
def test_kustomize_renders_each_variant_as_its_files_say() -> None:
    for name in VARIANTS:
        assert sorted(map(_key, _kustomize(DEPLOY / name))) == sorted(map(_key, variant(name))), name


def test_daemonset_service_account_is_shipped_by_every_variant() -> None:
    for name in VARIANTS:
        objs = variant(name)
        pod = _find(objs, "DaemonSet", "gpu-node-agent")["spec"]["template"]["spec"]
        ns = _find(objs, "DaemonSet", "gpu-node-agent")["metadata"]["namespace"]
        assert (ns, pod["serviceAccountName"]) == AGENT_SA
        sa = _find(objs, "ServiceAccount", pod["serviceAccountName"])
        assert sa["metadata"]["namespace"] == ns
        _find(objs, "Namespace", ns)


def _cli_args(container: dict[str, Any]) -> Any:
    return build_parser().parse_args(container["args"])


def test_cordoner_runs_as_its_own_service_account_with_its_own_args() -> None:
    objs = variant("central")
    dep = _find(objs, "Deployment", "gpu-node-agent-cordoner")
    pod = dep["spec"]["template"]["spec"]
    assert (dep["metadata"]["namespace"], pod["serviceAccountName"]) == CORDONER_SA
    _find(objs, "ServiceAccount", CORDONER_SA[1])
    assert dep["spec"]["replicas"] == 1
    (container,) = pod["containers"]
    args = _cli_args(container)
    assert args.command == "cordoner" and args.config == "/etc/gpu-node-agent/config.toml"
    assert not args.enforce, "shipped in dry-run, like every other default"
    ds = _find(objs, "DaemonSet", "gpu-node-agent")["spec"]["template"]["spec"]["containers"][0]
    assert _cli_args(ds).command == "run"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]}]


# -- RBAC ---------------------------------------------------------------------------------

def _grants(objs: list[dict[str, Any]], subject: tuple[str, str]) -> set[tuple[str, str, str, str | None]]:
    """(apiGroup, resource, verb, namespace or None for cluster-wide) the ServiceAccount gets."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out: set[tuple[str, str, str, str | None]] = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) == subject for s in b["subjects"]):
            continue
        ns = b["metadata"].get("namespace")  # None for a ClusterRoleBinding: every namespace
        ref = b["roleRef"]
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
            out |= {(g, r, v, ns) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_no_wildcards_or_escalation_verbs_anywhere() -> None:
    for path in _all_files():
        for doc in _docs(path):
            for rule in doc.get("rules", []) if doc["kind"] in ("Role", "ClusterRole") else []:
                words = rule["apiGroups"] + rule["resources"] + rule["verbs"]
                assert "*" not in words and not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), (path, rule)


def test_roles_grant_exactly_what_the_kubernetes_remediation_calls() -> None:
    assert _grants(variant("per-node"), AGENT_SA) == KUBERNETES_CALLS
    assert _grants(variant("central"), CORDONER_SA) == KUBERNETES_CALLS


def test_central_mode_node_agents_have_no_kubernetes_rights_and_no_token() -> None:
    objs = variant("central")
    assert _grants(objs, AGENT_SA) == set()
    assert _find(objs, "ServiceAccount", AGENT_SA[1])["automountServiceAccountToken"] is False
    assert "automountServiceAccountToken" not in _find(objs, "DaemonSet", "gpu-node-agent")["spec"]["template"]["spec"]
    assert not [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")], "nothing to restrict"


def _rbac_of(method: str, path: str) -> tuple[str, str, str, str | None]:
    if re.fullmatch(r"/api/v1/nodes/[^/]+", path):
        return ("", "nodes", {"GET": "get", "PATCH": "patch"}[method], None)
    if re.fullmatch(r"/api/v1/nodes/[^/]+/status", path) and method == "PATCH":
        return ("", "nodes/status", "patch", None)
    if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path)) and method == "POST":
        return ("", "events", "create", m.group(1))
    raise AssertionError(f"a call the table does not know: {method} {path}")


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube().start()
    yield k
    k.stop()


async def _cordon_and_uncordon(kube: FakeKube, tmp_path: Path, node: str) -> dict[str, Any]:
    """Runs the real plugin against the fake API server; returns the Node before, cordoned and
    uncordoned, and the Events it recorded."""
    kube.add_node(node)
    kube.nodes[node]["spec"]["taints"] = [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
    kube.nodes[node]["metadata"]["annotations"]["ops/owner"] = "team-a"
    plugin = KubernetesRemediation(KubernetesConfig(kubeconfig=str(kube.kubeconfig(tmp_path / "kc"))), HostRoot("/"))
    msg = {"id": "01J0000000000000000000000A", "node": node, "type": "GPUFellOffBus", "reason": "FallenOffTheBus",
           "message": "GPU 0000:18:00.0 fell off the bus"}
    before = copy.deepcopy(kube.nodes[node])
    assert (await plugin.execute(msg, {})).outcome == "executed"
    cordoned = copy.deepcopy(kube.nodes[node])
    assert (await plugin.uncordon(msg)).outcome == "executed"
    return {"before": before, "cordoned": cordoned, "uncordoned": copy.deepcopy(kube.nodes[node]),
            "events": copy.deepcopy(kube.events)}


async def test_the_fake_kube_run_makes_exactly_the_calls_in_the_table(kube: FakeKube, tmp_path: Path) -> None:
    await _cordon_and_uncordon(kube, tmp_path, "gpu-01")
    assert {_rbac_of(m, p) for m, p, _ in kube.requests} == KUBERNETES_CALLS


# -- capabilities -------------------------------------------------------------------------

def _agent_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any]
    (c,) = _find(objs, "DaemonSet", "gpu-node-agent")["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "agent"
    return c


def test_default_capabilities_are_minimal_and_documented() -> None:
    documented = set(re.findall(r"`CAP_([A-Z_]+)`", (ROOT / "docs" / "operations.md").read_text()))
    for name in VARIANTS:
        sc = _agent_container(variant(name))["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"]["add"]) == {"DAC_READ_SEARCH", "SYSLOG", "SYS_PTRACE"}
        assert set(sc["capabilities"]["add"]) <= documented
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    for path in _all_files():
        if "components" not in path.relative_to(DEPLOY).parts:
            assert "SYS_MODULE" not in yaml.safe_dump(_docs(path)), f"{path}: SYS_MODULE outside the opt-in component"
    cordoner = _find(variant("central"), "Deployment", "gpu-node-agent-cordoner")["spec"]["template"]["spec"]
    (c,) = cordoner["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and cordoner["securityContext"]["runAsNonRoot"]
    assert not {"hostPID", "hostNetwork", "hostIPC"} & set(cordoner)


def test_sys_module_component_adds_only_sys_module() -> None:
    (comp,) = _docs(DEPLOY / "components" / "enforce-modprobe" / "kustomization.yaml")
    assert comp["kind"] == "Component" and set(comp) == {"apiVersion", "kind", "patches"}
    (patch,) = comp["patches"]
    ops = yaml.safe_load(patch["patch"])
    assert [op for op in ops if op["op"] != "test"] == [
        {"op": "add", "path": "/spec/template/spec/containers/0/securityContext/capabilities/add/-",
         "value": "SYS_MODULE"}]


@needs_kubectl
def test_sys_module_overlay_renders_for_either_variant(tmp_path: Path) -> None:
    for name in VARIANTS:
        overlay = tmp_path / name
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({  # kustomize wants relative paths
            "resources": [os.path.relpath(DEPLOY / name, overlay)],
            "components": [os.path.relpath(DEPLOY / "components" / "enforce-modprobe", overlay)]}))
        rendered = _kustomize(overlay)
        caps = _agent_container(rendered)["securityContext"]["capabilities"]
        assert caps == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH", "SYSLOG", "SYS_PTRACE", "SYS_MODULE"]}
        plain = {_key(o): o for o in _kustomize(DEPLOY / name)}
        assert {k for k, o in ((_key(o), o) for o in rendered) if plain.get(k) != o} == {
            ("DaemonSet", "gpu-node-agent", "gpu-node-agent")}, "the component touches nothing else"


# -- the ValidatingAdmissionPolicies, evaluated ---------------------------------------------
# cel-python evaluates standard CEL; the policies use nothing beyond it (no Kubernetes CEL libraries).
# Where it differs from cel-go, it is stricter: `==` between values of different types is an error in
# cel-python and false in cel-go; either way the validation does not pass and the request is denied.

_env = celpy.Environment()


def _cel(expr: str, activation: dict[str, Any]) -> Any:
    result = _env.program(_env.compile(expr)).evaluate(activation)
    if isinstance(result, CELEvalError):
        raise result
    return result


def _matches_rules(policy: dict[str, Any], req: dict[str, Any]) -> bool:
    res = req["resource"]
    full = res["resource"] + (f"/{req['subResource']}" if req.get("subResource") else "")
    return any(res["group"] in r["apiGroups"] and res["version"] in r["apiVersions"]
               and req["operation"] in r["operations"] and full in r["resources"]
               for r in policy["spec"]["matchConstraints"]["resourceRules"])


def admit(policy: dict[str, Any], req: dict[str, Any], obj: Any, old: Any = None) -> tuple[str, list[str]]:
    """A ValidatingAdmissionPolicy's decision: ("not matched" | "allowed" | "denied", messages).
    An evaluation error counts as failurePolicy says (Fail: denied)."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    if not _matches_rules(policy, req):
        return "not matched", []
    act: dict[str, Any] = {"request": json_to_cel(req), "object": json_to_cel(obj),
                           "oldObject": json_to_cel(old)}
    try:
        if not all(_cel(c["expression"], act) for c in spec.get("matchConditions", [])):
            return "not matched", []
        variables: dict[str, Any] = {}
        for v in spec.get("variables", []):
            act["variables"] = MapType(variables)
            variables[StringType(v["name"])] = _cel(v["expression"], act)
        act["variables"] = MapType(variables)
    except CELEvalError as exc:
        return "denied", [f"evaluation error: {exc.args[0]}"]
    denied: list[str] = []
    for val in spec["validations"]:
        try:
            ok = bool(_cel(val["expression"], act))
        except CELEvalError as exc:
            ok, denied = False, [*denied, f"evaluation error: {exc.args[0]}"]
        if not ok:
            msg = val["message"]
            if "messageExpression" in val:
                try:
                    msg = str(_cel(val["messageExpression"], act))
                except CELEvalError:
                    pass  # the API server falls back to message too
            denied.append(msg)
    return ("denied", denied) if denied else ("allowed", [])


def _policies() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in variant("per-node") if o["kind"] == "ValidatingAdmissionPolicy"}


AGENT_USER = f"system:serviceaccount:{AGENT_SA[0]}:{AGENT_SA[1]}"


def _req(op: str, resource: str, sub: str = "", *, node: str | None = "gpu-01", user: str = AGENT_USER,
         extra: dict[str, list[str]] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if extra is not None:
        info["extra"] = extra
    elif node is not None:
        info["extra"] = {NODE_NAME_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["gpu-node-agent-x"]}
    return {"operation": op, "resource": {"group": "", "version": "v1", "resource": resource}, "subResource": sub,
            "userInfo": info}


def _as_apiserver_sees(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The object admission sees for each subresource: a nodes update keeps the stored status, a
    nodes/status update keeps the stored spec (the registry's PrepareForUpdate runs first)."""
    main = copy.deepcopy(after)
    main["status"] = copy.deepcopy(before["status"])
    status = copy.deepcopy(after)
    status["spec"] = copy.deepcopy(before["spec"])
    return {"": main, "status": status}


def test_policies_are_bound_deny_and_match_the_daemonsets_account() -> None:
    objs = variant("per-node")
    policies = _policies()
    assert set(policies) == {"gpu-node-agent-own-node", "gpu-node-agent-own-node-events"}
    bindings = {o["spec"]["policyName"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] and "matchResources" not in b["spec"]
               for b in bindings.values())
    ds = _find(objs, "DaemonSet", "gpu-node-agent")
    user = f"system:serviceaccount:{ds['metadata']['namespace']}:{ds['spec']['template']['spec']['serviceAccountName']}"
    for p in policies.values():
        assert p["apiVersion"] == "admissionregistration.k8s.io/v1" and p["spec"]["failurePolicy"] == "Fail"
        (cond,) = p["spec"]["matchConditions"]
        assert cond["expression"] == f"request.userInfo.username == '{user}'"
        for v in p["spec"]["validations"]:
            assert "\n" not in v["message"], "the API rejects line breaks in a message"
    # the code's own keys are what the policy lets the agent own
    for key in (KubernetesConfig().taint_key, kube_plugin.MARKER, kube_plugin.A_REASONS, kube_plugin.A_MESSAGE_ID,
                kube_plugin.A_SINCE):
        assert key.startswith(OURS), key


async def test_what_the_remediation_writes_to_its_own_node_is_admitted(kube: FakeKube, tmp_path: Path) -> None:
    run = await _cordon_and_uncordon(kube, tmp_path, "gpu-01")
    nodes, events = _policies()["gpu-node-agent-own-node"], _policies()["gpu-node-agent-own-node-events"]
    for old, new in ((run["before"], run["cordoned"]), (run["cordoned"], run["uncordoned"])):
        for sub, obj in _as_apiserver_sees(old, new).items():
            assert admit(nodes, _req("UPDATE", "nodes", sub), obj, old) == ("allowed", []), (sub, obj)
    assert [e["reason"] for e in run["events"]] == ["Cordoned", "Uncordoned"]
    for ev in run["events"]:
        assert admit(events, _req("CREATE", "events"), ev) == ("allowed", [])


async def test_the_same_writes_to_another_node_or_without_the_claim_are_denied(kube: FakeKube, tmp_path: Path) -> None:
    run = await _cordon_and_uncordon(kube, tmp_path, "gpu-02")
    nodes, events = _policies()["gpu-node-agent-own-node"], _policies()["gpu-node-agent-own-node-events"]
    for sub, obj in _as_apiserver_sees(run["before"], run["cordoned"]).items():
        decision, msgs = admit(nodes, _req("UPDATE", "nodes", sub, node="gpu-01"), obj, run["before"])
        assert decision == "denied" and msgs == ["gpu-node-agent on node gpu-01 may not modify Node gpu-02"]
        for missing in (_req("UPDATE", "nodes", sub, node=None),  # an old cluster: no extra at all
                        _req("UPDATE", "nodes", sub, extra={"authentication.kubernetes.io/pod-name": ["p"]})):
            decision, msgs = admit(nodes, missing, obj, run["before"])
            assert decision == "denied" and "no authentication.kubernetes.io/node-name claim" in msgs[0]
        # anyone else (an operator, the cordoner) is not this policy's business: RBAC decides
        for user in ("system:serviceaccount:gpu-node-agent:gpu-node-agent-cordoner", "kubernetes-admin"):
            assert admit(nodes, _req("UPDATE", "nodes", sub, node=None, user=user), obj, run["before"])[0] \
                == "not matched"
    ev = run["events"][0]
    assert admit(events, _req("CREATE", "events", node="gpu-01"), ev)[0] == "denied"
    assert admit(events, _req("CREATE", "events", node=None), ev)[0] == "denied"
    assert admit(events, _req("CREATE", "events", node=None, user="system:node:gpu-01"), ev)[0] == "not matched"
    pod_event = copy.deepcopy(ev)
    pod_event["involvedObject"] = {"kind": "Pod", "name": "gpu-02", "namespace": "default", "apiVersion": "v1"}
    assert admit(events, _req("CREATE", "events", node="gpu-02"), pod_event) == (
        "denied", ["gpu-node-agent on node gpu-02 may not record an Event about Pod gpu-02"])
    assert admit(events, _req("CREATE", "events", node="gpu-02"), ev) == ("allowed", [])


def _node(name: str = "gpu-01") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "7", "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"ops/owner": "team-a"}},
            "spec": {"providerID": "", "taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                                      {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"}]}}


def _edit(path: str, value: Any) -> dict[str, Any]:
    node = _node()
    *parents, last = path.split(".")
    target: Any = node
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    target[last] = value
    return node


_OWN_TAINT = {"key": "gpu-node-agent/degraded", "value": "GPUFellOffBus", "effect": "NoSchedule"}

FORBIDDEN = [  # (subresource, field path, new value, what the message says)
    ("", "metadata.labels", {"kubernetes.io/hostname": "gpu-01", "node-role.kubernetes.io/control-plane": ""},
     "labels, finalizers"),
    ("", "metadata.finalizers", ["example.com/keep"], "labels, finalizers"),
    ("", "metadata.annotations", {"ops/owner": "attacker"}, "own gpu-node-agent/ annotations"),
    ("", "metadata.annotations", {}, "own gpu-node-agent/ annotations"),
    ("status", "metadata.annotations", {"ops/owner": "team-a", "other/x": "1"}, "own gpu-node-agent/ annotations"),
    ("", "spec.providerID", "aws:///us-east-1a/i-0", "in a Node's spec"),
    ("", "spec.podCIDR", "10.1.0.0/24", "in a Node's spec"),
    ("", "spec.taints", [], "own gpu-node-agent/ taints"),
    ("", "spec.taints", [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}], "own gpu-node-agent/ taints"),
    ("", "spec.taints", [_node()["spec"]["taints"][0], {**_OWN_TAINT, "effect": "NoExecute"}], "must be NoSchedule"),
    ("status", "status.capacity", {"nvidia.com/gpu": "800"}, "in a Node's status"),
    ("status", "status.addresses", [{"type": "InternalIP", "address": "10.0.0.99"}], "in a Node's status"),
    ("status", "status.conditions.0.status", "False", "change the kubelet's"),
    ("status", "status.conditions", [_node()["status"]["conditions"][0]], "never remove"),
]


@pytest.mark.parametrize(("sub", "path", "value", "says"), FORBIDDEN, ids=[f"{p}={v}" for _, p, v, _ in FORBIDDEN])
def test_forbidden_changes_to_its_own_node_are_denied(sub: str, path: str, value: Any, says: str) -> None:
    policy = _policies()["gpu-node-agent-own-node"]
    decision, msgs = admit(policy, _req("UPDATE", "nodes", sub), _edit(path, value), _node())
    assert decision == "denied" and any(says in m for m in msgs), msgs


ALLOWED = [
    ("", "spec.unschedulable", True),
    ("", "spec.taints", [_node()["spec"]["taints"][0], _OWN_TAINT]),
    ("", "metadata.annotations", {"ops/owner": "team-a", kube_plugin.MARKER: kube_plugin.MARK_VALUE}),
    ("", "metadata.resourceVersion", "8"),
    ("status", "status.conditions", [*_node()["status"]["conditions"],
                                     {"type": "GPUFellOffBus", "status": "True", "reason": "FallenOffTheBus"}]),
]


@pytest.mark.parametrize(("sub", "path", "value"), ALLOWED, ids=[p for _, p, _ in ALLOWED])
def test_its_own_fields_on_its_own_node_are_allowed(sub: str, path: str, value: Any) -> None:
    policy = _policies()["gpu-node-agent-own-node"]
    assert admit(policy, _req("UPDATE", "nodes", sub), _edit(path, value), _node()) == ("allowed", [])


def test_policy_matches_only_node_writes() -> None:
    policy = _policies()["gpu-node-agent-own-node"]
    node = _node()
    assert admit(policy, _req("UPDATE", "pods"), node, node)[0] == "not matched"
    assert admit(policy, _req("UPDATE", "nodes", "proxy"), node, node)[0] == "not matched"
    assert admit(policy, _req("UPDATE", "nodes", "status"), node, node) == ("allowed", [])
