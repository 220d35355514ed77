"""Cordon, taint, annotate, set NodeConditions and record an Event on the Kubernetes Node (lightkube).

Two conditions a cordon: one named for the trigger (``GPUFellOffBus=True``) and, unless
``category_conditions = false``, its category's as EKS's node monitoring agent names them
(``AcceleratedHardwareReady=False``, reason the trigger; gna_types/conditions.py), set back to ``True``
when the node is uncordoned. Turn the category off where EKS's own agent writes those conditions.

Uncordon only a node this agent cordoned (annotation marker) — never one an operator cordoned.
Writes carry the resourceVersion they were computed from; a 409 re-reads and retries.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import msgspec
import structlog

from gna_sdk import Result
from gna_sdk.hostroot import HostRoot
from gna_types.conditions import category
from remediations.kube_client import LazyClient

log = structlog.get_logger(__name__)

MARKER = "gpu-node-agent/cordoned-by"
MARK_VALUE = "gpu-node-agent"
A_REASONS = "gpu-node-agent/conditions"
A_MESSAGE_ID = "gpu-node-agent/message-id"
A_SINCE = "gpu-node-agent/cordoned-at"
A_CATEGORIES = "gpu-node-agent/node-conditions"  # the category conditions this agent set False
# Annotations, not a label: the per-node admission policy (deploy/kubernetes/per-node) lets an agent write
# only gpu-node-agent/ annotations, taints and conditions on its own Node, never labels.
A_REPLACE = "gpu-node-agent/replace"
A_REPLACE_WHY = "gpu-node-agent/replace-reason"


class KubernetesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kubeconfig: str = ""  # empty: the in-cluster service account
    node_name: str = ""  # the Node's name when it differs from the agent's node name
    taint_key: str = "gpu-node-agent/degraded"
    event_namespace: str = "default"
    retries: int = 3
    category_conditions: bool = True  # also AcceleratedHardwareReady, NetworkingReady, ... (gna_types/conditions.py)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesRemediation:
    name: ClassVar[str] = "kubernetes"
    config_type: ClassVar[type[KubernetesConfig]] = KubernetesConfig
    needs_budget: ClassVar[bool] = True

    def __init__(self, config: KubernetesConfig, host: HostRoot, *, client: Any = None) -> None:
        self.config = config
        self.client = LazyClient(config.kubeconfig, client)

    def _node(self, msg: dict[str, Any]) -> str:
        return self.config.node_name or str(msg.get("node", ""))

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        return (f"cordon Kubernetes node {self._node(msg)}, taint {self.config.taint_key}={msg.get('type')}:NoSchedule,"
                f" set NodeCondition {msg.get('type')} and record an Event")

    async def _get(self, name: str) -> Any:
        from lightkube.resources.core_v1 import Node

        return await self.client().get(Node, name)

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        name, type_ = self._node(msg), str(msg.get("type", ""))
        cat = category(type_, str(msg.get("entity", ""))) if self.config.category_conditions else None
        for attempt in range(self.config.retries):
            try:
                node = await self._get(name)
            except ApiError as exc:
                return Result("failed", f"GET node {name}: {exc.status.code} {exc.status.message}")
            ann = dict(node.metadata.annotations or {})
            ours = ann.get(MARKER) == MARK_VALUE
            if node.spec.unschedulable and not ours:
                return Result("already_done", "cordoned by someone else: left alone")
            reasons = sorted({r for r in ann.get(A_REASONS, "").split(",") if r} | {type_})
            if ours and node.spec.unschedulable and type_ in ann.get(A_REASONS, "").split(","):
                return Result("already_done", f"already cordoned by this agent for {type_}")
            taints = [t.to_dict() if hasattr(t, "to_dict") else t for t in (node.spec.taints or [])]
            taints = [t for t in taints if t.get("key") != self.config.taint_key]
            taints.append({"key": self.config.taint_key, "value": reasons[0], "effect": "NoSchedule"})
            cats = sorted({c for c in ann.get(A_CATEGORIES, "").split(",") if c} | ({cat} if cat else set()))
            patch = {"metadata": {"resourceVersion": node.metadata.resourceVersion, "annotations": {
                        MARKER: MARK_VALUE, A_REASONS: ",".join(reasons), A_MESSAGE_ID: str(msg.get("id", "")),
                        A_SINCE: ann.get(A_SINCE) or _now(), A_CATEGORIES: ",".join(cats) or None}},
                     "spec": {"unschedulable": True, "taints": taints}}
            try:
                await self.client().patch(Node, name, patch, patch_type=PatchType.MERGE)
                break
            except ApiError as exc:
                if exc.status.code == 409 and attempt + 1 < self.config.retries:
                    continue  # someone else wrote the Node: read it again
                return Result("failed", f"PATCH node {name}: {exc.status.code} {exc.status.message}")
        await self._condition(name, type_, True, str(msg.get("reason", "")), str(msg.get("message", "")))
        if cat:
            await self._condition(name, cat, False, type_, str(msg.get("message", "")))
        await self._event(name, "Cordoned", f"gpu-node-agent cordoned the node: {msg.get('message', type_)}")
        return Result("executed", f"cordoned {name} for {type_}", {"reasons": reasons})

    async def _condition(self, name: str, type_: str, status: bool, reason: str, message: str) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        cond = {"type": type_, "status": "True" if status else "False", "reason": reason or type_,
                "message": message[:1000], "lastTransitionTime": _now(), "lastHeartbeatTime": _now()}
        try:  # strategic merge: conditions merge by type, the kubelet's own stay
            await self.client().patch(Node.Status, name, {"status": {"conditions": [cond]}},
                                      patch_type=PatchType.STRATEGIC)
        except ApiError as exc:
            log.warning("kubernetes_condition_failed", node=name, code=exc.status.code, error=exc.status.message)

    async def _event(self, name: str, reason: str, message: str) -> None:
        from lightkube import ApiError
        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event

        ev = Event(metadata=ObjectMeta(generateName=f"{name}.", namespace=self.config.event_namespace),
                   involvedObject=ObjectReference(kind="Node", name=name, apiVersion="v1"), reason=reason,
                   message=message[:1000], type="Warning", source=EventSource(component="gpu-node-agent"),
                   firstTimestamp=dt.datetime.now(dt.UTC), lastTimestamp=dt.datetime.now(dt.UTC), count=1)
        try:
            await self.client().create(ev, namespace=self.config.event_namespace)
        except ApiError as exc:
            log.warning("kubernetes_event_failed", node=name, code=exc.status.code, error=exc.status.message)

    async def mark_for_replacement(self, msg: dict[str, Any], why: str) -> Result:
        """A node that stays out (a repeat offender, no repair left): annotated for replacement with the
        reason, an Event recorded. Only on a node this agent cordoned; the cordon stays."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        name = self._node(msg)
        try:
            node = await self._get(name)
        except ApiError as exc:
            return Result("failed", f"GET node {name}: {exc.status.code} {exc.status.message}")
        if (node.metadata.annotations or {}).get(MARKER) != MARK_VALUE:
            return Result("already_done", "not cordoned by this agent: left alone")
        patch = {"metadata": {"annotations": {A_REPLACE: "true", A_REPLACE_WHY: why[:1000]}}}
        try:
            await self.client().patch(Node, name, patch, patch_type=PatchType.MERGE)
        except ApiError as exc:
            return Result("failed", f"PATCH node {name}: {exc.status.code} {exc.status.message}")
        await self._event(name, "MarkedForReplacement", f"gpu-node-agent keeps the node out: {why}")
        return Result("executed", f"annotated {name} {A_REPLACE}=true")

    async def uncordon(self, msg: dict[str, Any]) -> Result:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        name = self._node(msg)
        for attempt in range(self.config.retries):
            node = await self._get(name)
            ann = dict(node.metadata.annotations or {})
            if ann.get(MARKER) != MARK_VALUE:
                return Result("already_done", "not cordoned by this agent: left alone")
            reasons = [r for r in ann.get(A_REASONS, "").split(",") if r]
            cats = [c for c in ann.get(A_CATEGORIES, "").split(",") if c]
            taints = [t.to_dict() if hasattr(t, "to_dict") else t for t in (node.spec.taints or [])]
            patch = {"metadata": {"resourceVersion": node.metadata.resourceVersion,
                                  "annotations": {MARKER: None, A_REASONS: None, A_MESSAGE_ID: None, A_SINCE: None,
                                                  A_CATEGORIES: None, A_REPLACE: None, A_REPLACE_WHY: None}},
                     "spec": {"unschedulable": False,
                              "taints": [t for t in taints if t.get("key") != self.config.taint_key] or None}}
            try:
                await self.client().patch(Node, name, patch, patch_type=PatchType.MERGE)
                break
            except ApiError as exc:
                if exc.status.code == 409 and attempt + 1 < self.config.retries:
                    continue
                return Result("failed", f"PATCH node {name}: {exc.status.code} {exc.status.message}")
        for r in reasons:
            await self._condition(name, r, False, "Resolved", "gpu-node-agent: the condition resolved")
        for c in cats:
            await self._condition(name, c, True, "Resolved", "gpu-node-agent: every trigger of this category resolved")
        await self._event(name, "Uncordoned", "gpu-node-agent uncordoned the node: every trigger resolved")
        return Result("executed", f"uncordoned {name}", {"reasons": reasons})
