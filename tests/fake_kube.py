"""A small Kubernetes API server for the calls the kubernetes remediation makes, with the real
API's semantics: merge and strategic-merge PATCH (conditions merge by type), resourceVersion
conflicts (409), unknown nodes (404), RBAC refusals (403), the status subresource, POST events."""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
    out = merge_patch(status, {k: v for k, v in patch.items() if k != "conditions"})
    if "conditions" in patch:
        conds = {c["type"]: c for c in status.get("conditions", [])}
        for c in patch["conditions"]:
            conds[c["type"]] = merge_patch(conds.get(c["type"], {}), c)
        out["conditions"] = list(conds.values())
    return out


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> Pod
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content-type)
        self.forbidden_tokens = {"no-rights"}
        self.conflicts_to_inject = 0
        self.conflicts = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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
                owners: list[dict[str, Any]] | None = None) -> None:
        self.pods[(namespace, name)] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7",
                         "labels": dict(labels or {}), "ownerReferences": list(owners or [])},
            "spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]}, "status": {"phase": "Running"}}

    def start(self) -> FakeKube:
        self.thread.start()
        return self

    def stop(self) -> None:
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
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "code": code})

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
                kube.requests.append(("GET", self.path.split("?")[0], ""))
                if not self._authorized():
                    return
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
                kube.requests.append(("PATCH", self.path.split("?")[0], ctype))
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
                    if m.group(2):  # the status subresource only changes status
                        node["status"] = strategic_merge_status(node["status"], patch.get("status", {}))
                    else:
                        meta = merge_patch(node["metadata"], {k: v for k, v in (patch.get("metadata") or {}).items()
                                                              if k != "resourceVersion"})
                        node["metadata"] = meta
                        node["spec"] = merge_patch(node["spec"], patch.get("spec", {}))
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    self._send(200, node)

            def do_POST(self) -> None:
                kube.requests.append(("POST", self.path.split("?")[0], self.headers.get("Content-Type", "")))
                if not self._authorized():
                    return
                m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", self.path.split("?")[0])
                if not m:
                    return self._status(404, "NotFound", self.path)
                ev = self._body()
                ev.setdefault("metadata", {})["name"] = ev["metadata"].get("generateName", "ev.") + str(len(kube.events))
                kube.events.append(ev)
                self._send(201, ev)

        return Handler
