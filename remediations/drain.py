"""Drain a cordoned Kubernetes node of its GPU pods (lightkube): wait for them to end, evict what is left
through the Eviction API after a timeout, or hand the drain to an external controller (a DrainRequest).

Modes, after NVSentinel's node-drainer (NVIDIA/NVSentinel node-drainer/pkg/config/config.go
@ 5e0e215b581ca0177b7cf5134b5d6898342dbbdb: Immediate / AllowCompletion / DeleteAfterTimeout, and its
custom drain, docs/designs/030-custom-drain-controller.md @ 477467be7dcafc1fb4e2e339f954d3acfc8c1a66):

- ``wait`` (AllowCompletion): wait up to ``timeout`` for the pods to end by themselves; nothing is evicted.
- ``evict`` (DeleteAfterTimeout, but safer: never a force delete): wait up to ``timeout``, then an Eviction
  for each pod still there, so PodDisruptionBudgets decide; ``timeout = 0`` is Immediate.
- ``request``: create a DrainRequest-style object for an external controller and return. NVSentinel's is
  namespaced, group nvsentinel.nvidia.com/v1alpha1 (plugins/slinky-drainer/api/v1alpha1/register.go
  @ 6750fa956f8d580a8a92bb3cd419f86b7ed401e5); its DrainRequestSpec (the types file of that package, read
  through the code index without its commit) has nodeName, reason and podsToDrain (namespace -> pods),
  which this spec keeps, adding messageId, incident and requestedAt.

Which pods (kubectl's drain filters, kubernetes/kubernetes staging/src/k8s.io/kubectl/pkg/drain/filters.go
@ 121817a592d75c16803aea4852820986fc185c73): pods owned by a DaemonSet (any ownerReference of that kind,
as NVSentinel's informers.go isDaemonSetPod; kubectl looks at the controller only) and mirror pods
(annotation ``kubernetes.io/config.mirror``) are left alone, finished pods (Succeeded/Failed) need
nothing; by default only pods that ask for a GPU (``nvidia.com/gpu`` or a MIG resource in any
container's limits or requests; NVSentinel's drainGPUPods). A pod is gone when the API no longer lists it,
it finished, or its UID changed (kubectl drain.go waitForDelete,
@ 014e1fb54c12857b6272f9c2e538fbe4a684f3b7).

The Eviction subresource's answers (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go
@ 01aa0f3f6052c9866dcb69054d8924fa8c96e3cb): ``201`` evicted; ``429 TooManyRequests`` "Cannot evict pod
as it would violate the pod's disruption budget." with a ``DisruptionBudget`` cause (retried here with
exponential backoff and jitter, at least ``details.retryAfterSeconds``, until the deadline; kubectl
retries every 5 s); ``500`` "This pod has more than one PodDisruptionBudget, which the eviction
subresource does not support." (that pod fails, not retried: only an operator can fix the budgets);
``404`` the pod is already gone. Each Eviction carries ``preconditions.uid``, so a replacement pod of the
same name is never evicted in its place (a ``409`` then: the pod we meant is gone).

Safer than both: a node that is not cordoned (``spec.unschedulable``) is refused, its pods would come
back; only pods whose ``spec.nodeName`` is this node are acted on, whatever the server's filtering; at most
``max_pods`` pods and every wait bounded by ``deadline``; every API error is a failed Result naming it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import math
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec
import structlog

from gna_sdk import Result, plural
from gna_sdk.hostroot import HostRoot
from remediations.kube_client import LazyClient

log = structlog.get_logger(__name__)

Mode = Literal["wait", "evict", "request"]
MODES: tuple[Mode, ...] = ("wait", "evict", "request")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # corev1.MirrorPodAnnotationKey
FINISHED = ("Succeeded", "Failed")
SKIP_REASONS = ("daemonset", "mirror", "finished", "not_gpu", "other_node", "malformed")
MAX_NAMES = 10  # pod names in a detail; the rest counted
MAX_TEXT = 300  # characters kept of a server's message
_NODE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS-1123 subdomain: a Node's name
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+)")

Key = tuple[str, str]  # (namespace, name)


class DrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kubeconfig: str = ""  # empty: the in-cluster service account
    node_name: str = ""  # the Node's name when it differs from the agent's node name
    mode: Mode = "wait"
    timeout: float = 600.0  # s: wait mode, for the pods to end; evict mode, before evicting (0: at once)
    poll_interval: float = 5.0  # s between two looks at the node's pods
    backoff_initial: float = 1.0  # s before retrying an eviction a PodDisruptionBudget refused (429)
    backoff_max: float = 60.0
    deadline: float = 1800.0  # s for the whole drain, waiting and evicting included
    request_timeout: float = 30.0  # s for one API call
    pods: Literal["gpu", "all"] = "gpu"
    gpu_resources: list[str] = msgspec.field(default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/mig-*"])
    grace_period: int = -1  # the Eviction's gracePeriodSeconds; -1: each pod's own
    max_pods: int = 1000  # more pods than this on the node: refused, nothing acted on
    concurrency: int = 8  # evictions in flight at once
    request_group: str = "gpu-node-agent.io"
    request_version: str = "v1alpha1"
    request_kind: str = "DrainRequest"
    request_plural: str = "drainrequests"
    request_namespace: str = "gpu-node-agent"

    def __post_init__(self) -> None:
        for name in ("timeout", "poll_interval", "backoff_initial", "backoff_max", "deadline", "request_timeout"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0 or (v == 0 and name != "timeout"):
                raise ValueError(f"{name} must be a finite number of seconds > 0" + (" (or 0)" if name == "timeout"
                                                                                      else ""))
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must be >= backoff_initial")
        if self.timeout > self.deadline:
            raise ValueError("timeout must not exceed deadline (the deadline bounds the whole drain)")
        if not 1 <= self.max_pods <= 10000 or not 1 <= self.concurrency <= 64 or self.grace_period < -1:
            raise ValueError("max_pods 1..10000, concurrency 1..64, grace_period >= -1")
        if self.pods == "gpu" and not self.gpu_resources:
            raise ValueError("pods = 'gpu' needs at least one gpu_resources name")


# -- which pods: pure functions on the API's JSON (a dict), safe on any input ---------------------------

def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _nonzero(quantity: Any) -> bool:
    """A resource quantity ("1", 8, "0") asks for something unless it reads as zero; unreadable counts."""
    m = _QUANTITY.match(str(quantity)[:64])
    return not m or float(m.group(1)) > 0


def _matches(resource: str, patterns: Sequence[str]) -> bool:
    return any(resource == p or (p.endswith("*") and resource.startswith(p[:-1])) for p in patterns)


def requests_gpu(spec: Any, patterns: Sequence[str]) -> bool:
    """True when a container or init container lists one of ``patterns`` (a trailing ``*`` is a prefix)
    with a non-zero quantity in its resources.limits or resources.requests."""
    spec = _dict(spec)
    for c in (_list(spec.get("containers")) + _list(spec.get("initContainers")))[:256]:
        res = _dict(_dict(c).get("resources"))
        for kind in ("limits", "requests"):
            if any(isinstance(k, str) and _matches(k, patterns) and _nonzero(v)
                   for k, v in list(_dict(res.get(kind)).items())[:64]):
                return True
    return False


def classify(pod: Any, node: str, gpu_resources: Sequence[str] | None) -> str:
    """``"drain"``, or why the pod is left alone: one of SKIP_REASONS. ``gpu_resources`` None: every pod."""
    pod = _dict(pod)
    meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    if not all(isinstance(meta.get(k), str) and meta.get(k) for k in ("namespace", "name", "uid")):
        return "malformed"
    if spec.get("nodeName") != node:
        return "other_node"  # the server's field selector is not trusted to have filtered
    if any(_dict(o).get("kind") == "DaemonSet" for o in _list(meta.get("ownerReferences"))[:64]):
        return "daemonset"
    if MIRROR_ANNOTATION in _dict(meta.get("annotations")):
        return "mirror"
    if status.get("phase") in FINISHED:
        return "finished"
    if gpu_resources is not None and not requests_gpu(spec, gpu_resources):
        return "not_gpu"
    return "drain"


def printable(text: Any, limit: int = MAX_TEXT) -> str:
    """A server's string as a detail may carry it: bounded, control characters escaped."""
    s = str(text)[:limit]
    return s if s.isprintable() else s.encode("unicode_escape", "replace").decode("ascii", "replace")[:limit]


def names(keys: Sequence[Key] | Sequence[str], limit: int = MAX_NAMES) -> str:
    """"ns/a, ns/b (+3 more)": a bounded list of pods."""
    shown = [k if isinstance(k, str) else f"{k[0]}/{k[1]}" for k in list(keys)[:limit]]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return printable(", ".join(shown), limit * 120) + more


def backoff(attempt: int, initial: float, maximum: float, retry_after: float = 0.0,
            rng: random.Random | None = None) -> float:
    """Seconds before eviction try ``attempt + 1``: exponential (``initial * 2**attempt``, at most ``maximum``)
    with jitter (between half and all of it), never below the server's retryAfterSeconds (capped too)."""
    step = min(maximum, initial * 2 ** min(attempt, 62))
    return min(maximum, max(retry_after, (rng or random).uniform(step / 2, step)))


# -- the plugin -----------------------------------------------------------------------------------------

class _Failed(Exception):
    def __init__(self, detail: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail, self.data = detail, data or {}


class _DeadlineReached(_Failed):
    """A call cut short by the drain's deadline (not by request_timeout)."""


@dataclass
class _Selection:
    targets: dict[Key, str] = field(default_factory=dict)  # pod -> uid
    terminating: set[Key] = field(default_factory=set)
    skipped: Counter[str] = field(default_factory=Counter)

    def data(self) -> dict[str, Any]:
        return {"selected": len(self.targets), "skipped": {r: self.skipped[r] for r in SKIP_REASONS
                                                            if self.skipped[r]}}


@dataclass
class _Eviction:
    outcome: Literal["evicted", "gone", "failed", "blocked"]
    detail: str = ""
    tries: int = 0
    refused: int = 0  # 429s


def _api(what: str, exc: Exception) -> str:
    """An API call's failure as a detail: code and the server's message, or the client's error."""
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        st = exc.status
        return " ".join(x for x in (f"{what}: {st.code}", printable(st.reason or ""), printable(st.message or "")) if x)
    if isinstance(exc, TimeoutError):
        return f"{what}: no answer in time"
    return f"{what}: {type(exc).__name__}: {printable(exc)}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesDrainRemediation:
    name: ClassVar[str] = "drain"
    config_type: ClassVar[type[DrainConfig]] = DrainConfig
    needs_budget: ClassVar[bool] = False  # runs after the cordon, which took the fleet slot

    def __init__(self, config: DrainConfig, host: HostRoot, *, client: Any = None,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.client = LazyClient(config.kubeconfig, client)
        self._rng = rng or random.Random()

    # -- what to do ------------------------------------------------------------------------------------

    def _node(self, msg: dict[str, Any]) -> str:
        node = self.config.node_name or msg.get("node", "")
        if not isinstance(node, str) or not _NODE.fullmatch(node):
            raise ValueError(f"refusing node {printable(node, 80)!r}: not a Kubernetes node name")
        return node

    def _settings(self, args: dict[str, Any]) -> tuple[Mode, float]:
        """The mode and timeout, a rule's args overriding the config's."""
        mode = args.get("mode", self.config.mode)
        if mode not in MODES:
            raise ValueError(f"drain mode {printable(mode, 40)!r}: one of {', '.join(MODES)}")
        timeout = args.get("timeout", self.config.timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
                or not 0 <= timeout <= self.config.deadline:
            raise ValueError(f"drain timeout {printable(timeout, 40)!r}: seconds from 0 to the deadline "
                             f"({self.config.deadline:g})")
        unknown = sorted(set(args) - {"mode", "timeout"})
        if unknown:
            raise ValueError(f"drain takes the args mode and timeout, not {', '.join(map(str, unknown))[:200]}")
        return mode, float(timeout)

    def _which(self) -> str:
        return "GPU pods" if self.config.pods == "gpu" else "pods"

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        node = self._node(msg)
        mode, timeout = self._settings(args)
        which, c = self._which(), self.config
        kept = "DaemonSet, mirror and finished pods left alone; refused unless the node is cordoned"
        if mode == "wait":
            return f"wait up to {timeout:g} s for the {which} on Kubernetes node {node} to end ({kept})"
        if mode == "evict":
            first = f"wait up to {timeout:g} s for the {which} on Kubernetes node {node} to end, then " \
                if timeout else f"on Kubernetes node {node}: "
            return (f"{first}evict the {which} left through the Eviction API (PodDisruptionBudgets respected, "
                    f"429 retried with backoff) within {c.deadline:g} s ({kept})")
        return (f"hand the drain of Kubernetes node {node} to an external controller: create a "
                f"{c.request_group}/{c.request_version} {c.request_kind} in namespace {c.request_namespace} "
                f"({kept})")

    # -- the API calls ---------------------------------------------------------------------------------

    async def _call(self, what: str, coro: Any, until: float) -> Any:
        """One API call, bounded by request_timeout and the deadline; ApiError and the rest pass through,
        the deadline cutting it short is _DeadlineReached."""
        left = until - time.monotonic()
        if left <= 0:
            coro.close()
            raise _DeadlineReached(f"deadline ({self.config.deadline:g} s) reached before {what}")
        try:
            return await asyncio.wait_for(coro, min(self.config.request_timeout, left))
        except TimeoutError:
            if left < self.config.request_timeout:
                raise _DeadlineReached(f"deadline ({self.config.deadline:g} s) reached during {what}") from None
            raise

    async def _require_cordoned(self, client: Any, node: str, until: float) -> None:
        from lightkube.resources.core_v1 import Node

        try:
            got = await self._call("get node", client.get(Node, node), until)
        except _DeadlineReached:
            raise
        except Exception as exc:
            raise _Failed(_api(f"GET node {node}", exc)) from exc
        if not (got.spec is not None and got.spec.unschedulable):
            raise _Failed(f"node {node} is not cordoned (spec.unschedulable is not true): refusing to drain it, "
                          "its pods would be scheduled back onto it; cordon it first", {"node": node})

    async def _pods(self, client: Any, node: str, until: float) -> list[dict[str, Any]]:
        """The pods the API lists on ``node``, as dicts; more than max_pods is a failure."""
        from lightkube.resources.core_v1 import Pod

        out: list[dict[str, Any]] = []

        async def collect() -> None:
            async for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node},
                                         chunk_size=min(500, self.config.max_pods + 1)):
                out.append(pod.to_dict() if hasattr(pod, "to_dict") else dict(pod))
                if len(out) > self.config.max_pods:
                    return

        try:
            await self._call("list pods", collect(), until)
        except _DeadlineReached:
            raise
        except Exception as exc:
            raise _Failed(_api(f"list pods on node {node}", exc), {"node": node}) from exc
        if len(out) > self.config.max_pods:
            raise _Failed(f"more than {self.config.max_pods} pods on node {node}: refusing to drain "
                          "(max_pods)", {"node": node})
        return out

    async def _select(self, client: Any, node: str, until: float) -> _Selection:
        sel = _Selection()
        gpu = self.config.gpu_resources if self.config.pods == "gpu" else None
        for pod in await self._pods(client, node, until):
            why = classify(pod, node, gpu)
            if why != "drain":
                sel.skipped[why] += 1
                continue
            meta = pod["metadata"]
            key = (meta["namespace"], meta["name"])
            sel.targets[key] = meta["uid"]
            if meta.get("deletionTimestamp"):
                sel.terminating.add(key)
        return sel

    async def _remaining(self, client: Any, node: str, pods: dict[Key, str], until: float) -> dict[Key, str]:
        """Those of ``pods`` still on the node: listed, same UID, not finished."""
        present: dict[Key, str] = {}
        for pod in await self._pods(client, node, until):
            if classify(pod, node, None) in ("drain", "daemonset", "mirror"):
                meta = pod["metadata"]
                present[(meta["namespace"], meta["name"])] = meta["uid"]
        return {k: uid for k, uid in pods.items() if present.get(k) == uid}

    async def _wait(self, client: Any, node: str, pods: dict[Key, str], stop: float, until: float) -> dict[Key, str]:
        """Poll until none of ``pods`` is left or ``stop`` (each look bounded by ``until``); what is left."""
        left = dict(pods)
        looked = False
        while left:
            try:
                left = await self._remaining(client, node, left, until)
            except _DeadlineReached:
                if not looked:
                    raise
                break  # what the last look saw is the answer
            looked = True
            pause = min(self.config.poll_interval, stop - time.monotonic())
            if not left or pause <= 0:
                break
            await asyncio.sleep(pause)
        return left

    async def _evict(self, client: Any, key: Key, uid: str, until: float) -> _Eviction:
        from lightkube import ApiError
        from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
        from lightkube.resources.core_v1 import Pod

        ns, name = key
        grace = self.config.grace_period if self.config.grace_period >= 0 else None
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=ns),
                            deleteOptions=DeleteOptions(preconditions=Preconditions(uid=uid),
                                                        gracePeriodSeconds=grace))
        ev = _Eviction("failed")
        refusal = ""  # the last 429's cause: what a deadline reached while refused reports
        while True:
            ev.tries += 1
            try:
                await self._call("evict", client.create(body, name=name, namespace=ns), until)
                ev.outcome = "evicted"
                return ev
            except _DeadlineReached as exc:
                ev.outcome = "blocked"
                ev.detail = f"429 {refusal} (refused {plural(ev.refused, 'time')}, deadline reached)" if ev.refused \
                    else exc.detail
                return ev
            except ApiError as exc:
                st = exc.status
                if st.code == 404:
                    ev.outcome = "gone"
                    return ev
                if st.code == 409 and "Precondition failed: UID" in (st.message or ""):
                    ev.outcome, ev.detail = "gone", "replaced by another pod of the same name"
                    return ev
                if st.code != 429:  # 500: more than one PDB selects it; 403: not allowed; ...: not retried
                    ev.detail = _api("eviction", exc).removeprefix("eviction: ")
                    return ev
                ev.refused += 1
                causes = [printable(c.message) for c in ((st.details.causes or []) if st.details else [])
                          if c.message][:2]
                retry_after = float((st.details.retryAfterSeconds or 0) if st.details else 0)
                refusal = "; ".join(causes) or printable(st.message or "")
                pause = backoff(ev.refused - 1, self.config.backoff_initial, self.config.backoff_max,
                                retry_after, self._rng)
                if time.monotonic() + pause >= until:
                    ev.outcome = "blocked"
                    ev.detail = f"429 {refusal} (refused {plural(ev.refused, 'time')}, deadline reached)"
                    return ev
                log.info("drain_eviction_refused", pod=f"{ns}/{name}", tries=ev.tries, retry_in=round(pause, 3))
                await asyncio.sleep(pause)
            except Exception as exc:
                ev.detail = _api("eviction", exc).removeprefix("eviction: ")
                return ev

    async def _request(self, client: Any, node: str, msg: dict[str, Any], mode: Mode,
                       sel: _Selection, until: float) -> Result:
        from lightkube import ApiError
        from lightkube.generic_resource import create_namespaced_resource
        from lightkube.models.meta_v1 import ObjectMeta

        c = self.config
        try:
            res = create_namespaced_resource(c.request_group, c.request_version, c.request_kind, c.request_plural)
        except ValueError as exc:
            return Result("failed", f"{c.request_kind}: {exc}")
        details = _dict(msg.get("details"))
        incident = printable(details.get("incident", ""), 128)
        ident = incident or printable(msg.get("id", ""), 128) or printable(msg.get("type", ""), 128)
        name = f"gna-drain-{node[:232].rstrip('.-')}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"
        pods: dict[str, list[str]] = {}
        for ns, pod in sorted(sel.targets):
            pods.setdefault(ns, []).append(pod)
        obj = res(metadata=ObjectMeta(name=name, namespace=c.request_namespace,
                                      labels={"app.kubernetes.io/managed-by": "gpu-node-agent"}),
                  spec={"nodeName": node, "reason": printable(msg.get("type", ""), 128),
                        "message": printable(msg.get("message", ""), 1000),
                        "messageId": printable(msg.get("id", ""), 128), "incident": incident,
                        "requestedAt": _now(), "requestedBy": "gpu-node-agent", "podsToDrain": pods})
        data = {"node": node, "mode": mode, "request": f"{c.request_namespace}/{name}", "drained": False,
                **sel.data()}
        try:
            await self._call("create", client.create(obj), until)
        except _Failed as exc:
            return Result("failed", exc.detail, data)
        except ApiError as exc:
            if exc.status.code == 409:
                return Result("already_done", f"{c.request_kind} {c.request_namespace}/{name} already exists: "
                                              "handed off before", data)
            return Result("failed", _api(f"create {c.request_kind} {c.request_namespace}/{name}", exc), data)
        except Exception as exc:
            return Result("failed", _api(f"create {c.request_kind} {c.request_namespace}/{name}", exc), data)
        return Result("executed", f"handed off the drain of {node} ({plural(len(sel.targets), self._which()[:-1])})"
                                  f" to an external controller: {c.request_kind} {c.request_namespace}/{name}", data)

    # -- the drain -------------------------------------------------------------------------------------

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        try:
            node = self._node(msg)
            mode, timeout = self._settings(args)
        except ValueError as exc:
            return Result("failed", str(exc))
        start = time.monotonic()
        until = start + self.config.deadline
        try:
            try:
                client = self.client()
            except Exception as exc:
                raise _Failed(f"kubernetes client: {type(exc).__name__}: {printable(exc)}") from exc
            await self._require_cordoned(client, node, until)
            sel = await self._select(client, node, until)
            if not sel.targets:
                return Result("already_done", f"no {self._which()} to drain on {node}",
                              {"node": node, "mode": mode, "drained": True, **sel.data()})
            if mode == "request":
                return await self._request(client, node, msg, mode, sel, until)
            return await self._drain(client, node, mode, timeout, sel, start, until)
        except _Failed as exc:
            return Result("failed", exc.detail, exc.data)

    async def _drain(self, client: Any, node: str, mode: Mode, timeout: float, sel: _Selection,
                     start: float, until: float) -> Result:
        which = self._which()
        data: dict[str, Any] = {"node": node, "mode": mode, "drained": False, **sel.data()}
        left = await self._wait(client, node, sel.targets, min(until, start + timeout), until)
        data["ended"] = len(sel.targets) - len(left)
        if not left:
            data["drained"] = True
            return Result("executed", f"drained {node}: {plural(data['ended'], which[:-1])} ended by themselves", data)
        if mode == "wait":
            data["remaining"] = [f"{ns}/{n}" for ns, n in sorted(left)][:MAX_NAMES]
            return Result("failed", f"{plural(len(left), 'pod')} still running on {node} after {timeout:g} s: "
                                    f"{names(sorted(left))}", data)
        # evict: what is already terminating needs no eviction, only the wait
        sem = asyncio.Semaphore(self.config.concurrency)

        async def one(key: Key) -> tuple[Key, _Eviction]:
            async with sem:
                return key, await self._evict(client, key, left[key], until)

        results = dict(await asyncio.gather(*(one(k) for k in sorted(left) if k not in sel.terminating)))
        failed = {k: ev.detail for k, ev in results.items() if ev.outcome in ("failed", "blocked")}
        data.update(evicted=sum(ev.outcome == "evicted" for ev in results.values()),
                    already_gone=sum(ev.outcome == "gone" for ev in results.values()),
                    eviction_tries=sum(ev.tries for ev in results.values()),
                    refused_429=sum(ev.refused for ev in results.values()))
        # then wait for the evicted (and terminating) pods to be gone, within the deadline
        waiting = {k: uid for k, uid in left.items() if k not in failed}
        still = await self._wait(client, node, waiting, until, until) if waiting else {}
        if failed:
            data["failed"] = {f"{ns}/{n}": why for (ns, n), why in sorted(failed.items())[:MAX_NAMES]}
        if still:
            data["remaining"] = [f"{ns}/{n}" for ns, n in sorted(still)][:MAX_NAMES]
        if not failed and not still:
            data["drained"] = True
            return Result("executed", f"drained {node}: {data['evicted']} evicted, {data['ended']} ended by "
                                      f"themselves, {data['already_gone']} already gone", data)
        parts = [f"{ns}/{n} ({why})" for (ns, n), why in sorted(failed.items())]
        parts += [f"{ns}/{n} (evicted, still terminating)" for ns, n in sorted(still)]
        return Result("failed", f"{plural(len(failed) + len(still), 'pod')} not drained from {node}: "
                                f"{names(parts)}", data)
