"""A small Kubernetes API server for the calls the kubernetes and drain remediations make, with the
real API's semantics: merge and strategic-merge PATCH (conditions merge by type), resourceVersion
conflicts (409), unknown nodes (404), RBAC refusals (403), the status subresource, POST events.

For the drain (remediations/drain.py) it also serves:

- pod lists, ``GET /api/v1/pods`` and ``/api/v1/namespaces/<ns>/pods``, with ``fieldSelector``
  ``spec.nodeName=<node>`` (or ``metadata.namespace``; any other field is a 400 as the real server's
  "field label not supported") and ``limit``/``continue`` paging;
- the Eviction subresource, ``POST /api/v1/namespaces/<ns>/pods/<name>/eviction``, following the
  kube-apiserver's EvictionREST.Create (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go
  @ 01aa0f3f6052c9866dcb69054d8924fa8c96e3cb): a terminal, Pending or terminating pod is deleted without
  looking at budgets; more than one matching PodDisruptionBudget is a ``500`` Status with no reason;
  a budget with no disruption allowed is a ``429 TooManyRequests`` whose cause (type
  ``DisruptionBudget``) says how many healthy pods it needs; otherwise the budget is decremented and the
  pod deleted (at once, or marked terminating and removed after ``termination_delay``). A PDB with an
  empty selector matches nothing, as there. ``deleteOptions.preconditions.uid`` is honoured (409);
- ``DrainRequest`` custom objects, **namespaced** as NVSentinel's DrainRequest CRD is:
  ``POST /apis/<group>/<version>/namespaces/<ns>/<plural>`` for each kind in ``custom_kinds``
  (409 AlreadyExists on a duplicate name, 404 for a kind not installed);
- finer RBAC: ``denied`` holds (token, resource) pairs refused with the real 403 wording.

The bodies are the apiserver's Status objects (apimachinery pkg/api/errors NewNotFound, NewAlreadyExists,
NewTooManyRequests, NewForbidden; a returned Status that is not Success becomes the error,
apiserver pkg/endpoints/handlers/finisher). Every request is recorded in ``requests`` (method, path,
content type) as before, and with its query string in ``queries``."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_status(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = merge_patch(status, {k: v for k, v in patch.items() if k != "conditions"})
    if "conditions" in patch:
        conds = {c["type"]: c for c in status.get("conditions", [])}
        for c in patch["conditions"]:
            conds[c["type"]] = merge_patch(conds.get(c["type"], {}), c)
        out["conditions"] = list(conds.values())
    return out


EVICTION_PDB_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
EVICTION_MULTIPLE_PDBS = ("This pod has more than one PodDisruptionBudget, which the eviction subresource "
                          "does not support.")


@dataclass
class FakePDB:
    """A PodDisruptionBudget as the eviction subresource sees it: its selector (matchLabels) and how many
    disruptions it allows now, either a plain count (``disruptions_allowed``, decremented per eviction) or
    computed from the healthy matching pods (``min_available`` / ``max_unavailable`` of ``expected``).
    ``release_after``: after that many refusals (429) one disruption is given back, as when a
    replacement pod becomes ready elsewhere; 0 never."""

    namespace: str
    name: str
    match_labels: dict[str, str]
    disruptions_allowed: int | None = None
    min_available: int | None = None
    max_unavailable: int | None = None
    expected: int = 0
    release_after: int = 0
    refusals: int = 0
    released: int = 0
    evicted: list[str] = field(default_factory=list)

    def selects(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        # an empty selector matches nothing (getPodDisruptionBudgets: "should match nothing, not everything")
        return bool(self.match_labels) and all(labels.get(k) == v for k, v in self.match_labels.items())


def _healthy(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failure(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A metav1.Status with status Failure."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "code": code}
    if reason:  # a Status returned by a REST handler (the eviction's 500) carries none
        body["reason"] = reason
    if details:
        body["details"] = details
    return body


SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> Pod
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content-type)
        self.forbidden_tokens = {"no-rights"}
        self.conflicts_to_inject = 0
        self.conflicts = 0
        self.queries: list[tuple[str, str]] = []  # (method, path with its query string)
        self.denied: set[tuple[str, str]] = set()  # (token, resource): 403 for that resource only
        self.pdbs: list[FakePDB] = []
        self.evictions: list[tuple[str, str, int]] = []  # (namespace, name, HTTP code answered)
        self.eviction_bodies: list[dict[str, Any]] = []
        self.ignore_field_selector = False  # a server (or proxy) that answers with every pod
        self.termination_delay = 0.0  # s an evicted pod stays terminating before it is gone
        self.custom_kinds: dict[tuple[str, str, str], str] = {
            ("gpu-node-agent.io", "v1alpha1", "drainrequests"): "DrainRequest"}
        self.custom: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, plural, ns, name)
        self.timers: list[threading.Timer] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)  # stop() returns within 50 ms

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add_node(self, name: str, *, unschedulable: bool = False, annotations: dict[str, str] | None = None) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "100",
                                         "annotations": dict(annotations or {}), "labels": {"kubernetes.io/hostname": name}},
                            "spec": {"unschedulable": True} if unschedulable else {},
                            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}

    def add_pod(self, namespace: str, name: str, uid: str, *, labels: dict[str, str] | None = None,
                owners: list[dict[str, Any]] | None = None, node_name: str = "",
                resources: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
                phase: str = "Running") -> None:
        """``resources`` is the container's (``{"limits": {"nvidia.com/gpu": "8"}}``)."""
        container: dict[str, Any] = {"name": "pytorch", "image": "trainer:1"}
        if resources is not None:
            container["resources"] = copy.deepcopy(resources)
        spec: dict[str, Any] = {"containers": [container]}
        if node_name:
            spec["nodeName"] = node_name
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7",
                                "labels": dict(labels or {}), "ownerReferences": list(owners or [])}
        if annotations:
            meta["annotations"] = dict(annotations)
        with self.lock:
            self.pods[(namespace, name)] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                                            "status": {"phase": phase}}

    def add_pdb(self, namespace: str, name: str, match_labels: dict[str, str], *,
                disruptions_allowed: int | None = None, min_available: int | None = None,
                max_unavailable: int | None = None, release_after: int = 0) -> FakePDB:
        """One of ``disruptions_allowed``, ``min_available``, ``max_unavailable`` (of the matching pods now)."""
        if sum(x is not None for x in (disruptions_allowed, min_available, max_unavailable)) != 1:
            raise ValueError("give exactly one of disruptions_allowed, min_available, max_unavailable")
        with self.lock:
            expected = sum(1 for (ns, _), p in self.pods.items() if ns == namespace
                           and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in match_labels.items()))
            pdb = FakePDB(namespace, name, dict(match_labels), disruptions_allowed, min_available, max_unavailable,
                          expected, release_after)
            self.pdbs.append(pdb)
        return pdb

    def pdb_status(self, pdb: FakePDB) -> tuple[int, int, int]:
        """(disruptionsAllowed, desiredHealthy, currentHealthy) as the disruption controller would set them;
        call with the lock held."""
        current = sum(1 for (ns, _), p in self.pods.items() if ns == pdb.namespace and pdb.selects(p)
                      and _healthy(p)) + pdb.released
        if pdb.disruptions_allowed is not None:
            return pdb.disruptions_allowed, current - pdb.disruptions_allowed, current
        desired = pdb.min_available if pdb.min_available is not None \
            else max(0, pdb.expected - (pdb.max_unavailable or 0))
        return max(0, current - desired), desired, current

    def end_pod(self, namespace: str, name: str, *, after: float = 0.0, phase: str | None = None) -> None:
        """The pod's job ends by itself: ``phase`` (Succeeded/Failed) set, or (None) the pod deleted;
        ``after`` s from now on a timer thread."""
        def end() -> None:
            with self.lock:
                pod = self.pods.get((namespace, name))
                if pod is None:
                    return
                if phase is None:
                    del self.pods[(namespace, name)]
                else:
                    pod["status"]["phase"] = phase
        if after <= 0:
            end()
        else:
            self._later(after, end)

    def _later(self, delay: float, fn: Any) -> None:
        t = threading.Timer(delay, fn)
        t.daemon = True
        self.timers.append(t)
        t.start()

    def _remove_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod as the API does once its grace period is over (called with the lock held)."""
        def gone() -> None:
            with self.lock:
                pod = self.pods.get((namespace, name))
                if pod is not None and pod["metadata"]["uid"] == uid:
                    del self.pods[(namespace, name)]
        if self.termination_delay > 0:
            self.pods[(namespace, name)]["metadata"]["deletionTimestamp"] = _now()
            self._later(self.termination_delay, gone)
        else:
            del self.pods[(namespace, name)]

    def start(self) -> FakeKube:
        self.thread.start()
        return self

    def stop(self) -> None:
        for t in self.timers:
            t.cancel()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Any, token: str = "agent-token") -> Any:
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {self.url}
users:
- name: agent
  user:
    token: {token}
contexts:
- name: fake
  context:
    cluster: fake
    user: agent
current-context: fake
""")
        return path

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        kube = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on the call (its own timeout): nothing to answer

            def _status(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
                self._send(code, _failure(code, reason, message, details))

            def _token(self) -> str:
                return (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()

            def _denied(self, verb: str, resource: str, group: str, name: str, namespace: str) -> bool:
                """403 for a (token, resource) in kube.denied, worded as the RBAC authorizer's refusal."""
                if (self._token(), resource) not in kube.denied:
                    return False
                what = f'{resource.split("/")[0]} "{name}" is forbidden' if name else f"{resource} is forbidden"
                where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
                self._status(403, "Forbidden", f'{what}: User "{self._token()}" cannot {verb} resource '
                                               f'"{resource}" in API group "{group}"{where}',
                             {"name": name, "group": group, "kind": resource.split("/")[0]})
                return True

            def _record(self, method: str, ctype: str = "") -> tuple[str, dict[str, list[str]]]:
                url = urlsplit(self.path)
                kube.requests.append((method, url.path, ctype))
                kube.queries.append((method, self.path))
                return url.path, parse_qs(url.query)

            def _list_pods(self, namespace: str, query: dict[str, list[str]]) -> None:
                if self._denied("list", "pods", "", "", namespace):
                    return
                wanted: list[tuple[str, str]] = []
                for sel in ",".join(query.get("fieldSelector", [])).split(","):
                    if not sel:
                        continue
                    key, op, value = re.fullmatch(r"([^=!]*)(==|=|!=)?(.*)", sel).groups()  # type: ignore[union-attr]
                    if key not in ("spec.nodeName", "metadata.namespace", "metadata.name") or op not in ("=", "=="):
                        return self._status(400, "BadRequest", f"field label not supported: {key}")
                    wanted.append((key, value))
                if kube.ignore_field_selector:
                    wanted = []
                with kube.lock:
                    items = [copy.deepcopy(p) for (ns, _), p in sorted(kube.pods.items())
                             if (not namespace or ns == namespace)
                             and all({"spec.nodeName": p["spec"].get("nodeName", ""), "metadata.namespace": ns,
                                      "metadata.name": p["metadata"]["name"]}[k] == v for k, v in wanted)]
                start = int((query.get("continue") or ["0"])[0] or 0)
                limit = int((query.get("limit") or ["0"])[0] or 0)
                page = items[start:start + limit] if limit else items[start:]
                meta: dict[str, Any] = {"resourceVersion": "900"}
                if limit and start + limit < len(items):
                    meta["continue"] = str(start + limit)
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

            def _evict(self, namespace: str, name: str) -> None:
                # every answer is recorded before it is sent: a test reading kube.evictions after its call sees it
                if (self._token(), "pods/eviction") in kube.denied:
                    kube.evictions.append((namespace, name, 403))
                    self._denied("create", "pods/eviction", "", name, namespace)
                    return
                try:
                    ev = self._body()
                except ValueError as exc:
                    return self._status(400, "BadRequest", f"invalid JSON: {exc}")
                if not isinstance(ev, dict) or (ev.get("metadata") or {}).get("name") != name:
                    return self._status(400, "BadRequest", "name in URL does not match name in Eviction object")
                kube.eviction_bodies.append(ev)
                code, body = self._evict_pod(namespace, name, ev.get("deleteOptions") or {})
                kube.evictions.append((namespace, name, code))
                self._send(code, body)

            def _evict_pod(self, namespace: str, name: str, options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                with kube.lock:
                    pod = kube.pods.get((namespace, name))
                    if pod is None:
                        return 404, _failure(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
                    uid = pod["metadata"]["uid"]
                    want_uid = (options.get("preconditions") or {}).get("uid")
                    if want_uid is not None and want_uid != uid:
                        return 409, _failure(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": '
                                             f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/"
                                             f"{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
                                             f"UID in precondition: {want_uid}, UID in object meta: {uid}",
                                             {"name": name, "kind": "pods"})
                    # canIgnorePDB: a terminal, Pending or already terminating pod is deleted at once
                    if pod["status"].get("phase") in ("Succeeded", "Failed", "Pending") \
                            or pod["metadata"].get("deletionTimestamp"):
                        kube._remove_pod(namespace, name, uid)
                        return 201, dict(SUCCESS)
                    pdbs = [b for b in kube.pdbs if b.namespace == namespace and b.selects(pod)]
                    if len(pdbs) > 1:
                        return 500, _failure(500, "", EVICTION_MULTIPLE_PDBS)
                    if pdbs:
                        pdb = pdbs[0]
                        allowed, desired, current = kube.pdb_status(pdb)
                        if allowed <= 0:
                            pdb.refusals += 1
                            if pdb.release_after and pdb.refusals % pdb.release_after == 0:
                                if pdb.disruptions_allowed is not None:  # for the next try, not this one
                                    pdb.disruptions_allowed += 1
                                else:
                                    pdb.released += 1
                            return 429, _failure(429, "TooManyRequests", EVICTION_PDB_REFUSED, {"causes": [{
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb.name} needs {desired} healthy pods and has "
                                           f"{current} currently"}]})
                        if pdb.disruptions_allowed is not None:
                            pdb.disruptions_allowed -= 1
                        pdb.evicted.append(name)
                    kube._remove_pod(namespace, name, uid)
                return 201, dict(SUCCESS)

            def _create_custom(self, group: str, version: str, namespace: str, plural: str) -> None:
                kind = kube.custom_kinds.get((group, version, plural))
                if kind is None:
                    return self._status(404, "NotFound", "the server could not find the requested resource")
                if self._denied("create", plural, group, "", namespace):
                    return
                try:
                    obj = self._body()
                except ValueError as exc:
                    return self._status(400, "BadRequest", f"invalid JSON: {exc}")
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                if not isinstance(meta, dict) or obj.get("kind") != kind \
                        or obj.get("apiVersion") != f"{group}/{version}":
                    return self._status(400, "BadRequest", f"expected a {group}/{version} {kind}")
                if meta.get("namespace", namespace) != namespace:
                    return self._status(400, "BadRequest", "the namespace of the provided object does not match "
                                                           "the namespace sent on the request")
                name = meta.get("name")
                if not isinstance(name, str) or not name:
                    return self._status(422, "Invalid", f'{kind}.{group} "" is invalid: metadata.name: '
                                                        "Required value: name or generateName is required")
                with kube.lock:
                    key = (group, plural, namespace, name)
                    if key in kube.custom:
                        return self._status(409, "AlreadyExists", f'{plural}.{group} "{name}" already exists',
                                            {"name": name, "group": group, "kind": plural})
                    stored = copy.deepcopy(obj)
                    stored["metadata"].update(namespace=namespace, uid=f"uid-{len(kube.custom)}",
                                              resourceVersion="1", creationTimestamp=_now())
                    kube.custom[key] = stored
                self._send(201, stored)

            def _authorized(self) -> bool:
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
                if token in kube.forbidden_tokens:
                    self._status(403, "Forbidden", f'nodes is forbidden: User "{token}" cannot patch resource')
                    return False
                return True

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self) -> None:
                path, query = self._record("GET")
                if not self._authorized():
                    return
                lm = re.fullmatch(r"/api/v1(?:/namespaces/([^/]+))?/pods", path)
                if lm:
                    return self._list_pods(lm.group(1) or "", query)
                pm = re.fullmatch(r"/api/v1/namespaces/([^/?]+)/pods/([^/?]+)", self.path.split("?")[0])
                if pm:
                    with kube.lock:
                        pod = kube.pods.get((pm.group(1), pm.group(2)))
                    if pod is None:
                        return self._status(404, "NotFound", f'pods "{pm.group(2)}" not found')
                    return self._send(200, pod)
                m = re.fullmatch(r"/api/v1/nodes/([^/?]+)", self.path.split("?")[0])
                with kube.lock:
                    node = kube.nodes.get(m.group(1)) if m else None
                    if node is None:
                        return self._status(404, "NotFound", f'nodes "{m.group(1) if m else "?"}" not found')
                    self._send(200, node)

            def do_PATCH(self) -> None:
                ctype = self.headers.get("Content-Type", "")
                self._record("PATCH", ctype)
                if not self._authorized():
                    return
                m = re.fullmatch(r"/api/v1/nodes/([^/?]+)(/status)?", self.path.split("?")[0])
                patch = self._body()
                with kube.lock:
                    node = kube.nodes.get(m.group(1)) if m else None
                    if node is None:
                        return self._status(404, "NotFound", "node not found")
                    if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                        return self._status(415, "UnsupportedMediaType", ctype)
                    want_rv = (patch.get("metadata") or {}).get("resourceVersion")
                    if kube.conflicts_to_inject:
                        kube.conflicts_to_inject -= 1
                        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    if want_rv is not None and want_rv != node["metadata"]["resourceVersion"]:
                        kube.conflicts += 1
                        return self._status(409, "Conflict", "the object has been modified; please apply your "
                                                             "changes to the latest version and try again")
                    if m is not None and m.group(2):  # the status subresource only changes status
                        node["status"] = strategic_merge_status(node["status"], patch.get("status", {}))
                    else:
                        meta = merge_patch(node["metadata"], {k: v for k, v in (patch.get("metadata") or {}).items()
                                                              if k != "resourceVersion"})
                        node["metadata"] = meta
                        node["spec"] = merge_patch(node["spec"], patch.get("spec", {}))
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    self._send(200, node)

            def do_POST(self) -> None:
                path, _ = self._record("POST", self.headers.get("Content-Type", ""))
                if not self._authorized():
                    return
                em = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path)
                if em:
                    return self._evict(em.group(1), em.group(2))
                cm = re.fullmatch(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)", path)
                if cm:
                    return self._create_custom(cm.group(1), cm.group(2), cm.group(3), cm.group(4))
                m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", self.path.split("?")[0])
                if not m:
                    return self._status(404, "NotFound", self.path)
                ev = self._body()
                ev.setdefault("metadata", {})["name"] = ev["metadata"].get("generateName", "ev.") + str(len(kube.events))
                kube.events.append(ev)
                self._send(201, ev)

        return Handler
