"""Hand the node to humans or a ticketing system: the incident and its evidence, once per message.

What NVSentinel's fault-remediation does for the actions it cannot do itself (CONTACT_SUPPORT,
RESTART_BM, ...: NVIDIA/NVSentinel data-models/protobufs/health_event.proto RecommendedAction) is to
create a maintenance object named for the node and the health event (``maintenance-<node>-<eventID>``,
fault-remediation/pkg/remediation/remediation.go CreateMaintenanceResource; "already exists" counts as
success) that an external system acts on. Two hand-offs here, with the same once-per-incident rule:

- ``webhook``: POST the incident as JSON to a configured URL (a ticketing system's intake, an on-call
  router). TLS is verified unless ``verify_tls = false``; redirects are not followed; any answer other
  than 2xx is a failure naming the status. The standard library (urllib) in a worker thread.
- ``event``: a core/v1 Event on the Node, reason ``GPUNodeNeedsRepair``, type Warning, the evidence in its
  message. The API refuses a message over 1024 bytes (kubernetes pkg/apis/core/validation/events.go
  NoteLengthLimit, applied to events that carry an eventTime; the scheduler truncates its own to it), so
  the message is cut there for every event. Its name is derived from the message id: a second create
  is a 409 AlreadyExists, taken as already done, after a restart too.

A repeated execute for a message id this plugin already handed off is ``already_done`` (the last
``remember`` ids are kept, in memory).

Incident document (the webhook body; the Event message says the same in one line)::

    {"source": "gpu-node-agent", "node": ..., "type": ..., "entity": ..., "severity": ..., "status": ...,
     "reason": ..., "message": ..., "message_id": ..., "message_time": ..., "agent_time": ...,
     "details": {...}}   # or {"truncated": true, "size_bytes": N, "preview": "..."} past max_details_bytes
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import http.client
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from typing import Any, ClassVar, Literal

import msgspec

from gna_sdk import HostPaths, Result
from remediations.kube_client import LazyClient

REASON = "GPUNodeNeedsRepair"
NOTE_LIMIT = 1024  # bytes: kubernetes pkg/apis/core/validation/events.go NoteLengthLimit
MAX_ANSWER = 2048  # bytes of the webhook's answer kept
_FIELD_LIMITS = {"node": 253, "type": 128, "entity": 256, "severity": 16, "status": 16, "reason": 256,
                 "message": 4096, "id": 128, "time": 64}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class BreakfixConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    method: Literal["webhook", "event"] = "webhook"
    # webhook
    url: str = ""
    timeout: float = 10.0
    verify_tls: bool = True
    ca_file: str = ""  # a CA bundle for a private PKI; empty: the system's
    bearer_token_file: str = ""  # read at each POST: "Authorization: Bearer <token>"
    max_details_bytes: int = 16384
    # event
    kubeconfig: str = ""
    node_name: str = ""
    event_namespace: str = "default"
    remember: int = 4096  # message ids remembered for idempotence

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError("timeout must be > 0")
        if not 256 <= self.max_details_bytes <= 1 << 20:
            raise ValueError("max_details_bytes must be 256 to 1048576")
        if self.remember < 1:
            raise ValueError("remember must be >= 1")
        if self.method == "webhook":
            u = urllib.parse.urlsplit(self.url)
            if u.scheme not in ("https", "http") or not u.hostname:
                raise ValueError("method = 'webhook' needs url = 'https://...' (or http://)")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bounded_json(value: Any, limit: int) -> Any:
    """``value`` when its JSON is at most ``limit`` bytes; else a marker with its size and a preview."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        return {"unencodable": type(exc).__name__}
    raw = text.encode()
    if len(raw) <= limit:
        return value
    keep = max(0, limit - 100)
    while True:  # the preview re-escaped ("\"", control characters) may grow: halve until the marker fits
        marker = {"truncated": True, "size_bytes": len(raw), "preview": raw[:keep].decode("utf-8", "ignore")}
        if keep == 0 or len(json.dumps(marker, ensure_ascii=False, separators=(",", ":")).encode()) <= limit:
            return marker
        keep //= 2


def incident(msg: dict[str, Any], *, max_details: int) -> dict[str, Any]:
    """The hand-off document: the message's fields (each bounded), its details bounded, the agent's time."""
    def field(name: str) -> str:
        return str(msg.get(name) or "")[:_FIELD_LIMITS[name]]

    return {"source": "gpu-node-agent", "node": field("node"), "type": field("type"), "entity": field("entity"),
            "severity": field("severity"), "status": field("status"), "reason": field("reason"),
            "message": field("message"), "message_id": field("id"), "message_time": field("time"),
            "agent_time": _now(), "details": bounded_json(msg.get("details") or {}, max_details)}


def cut_utf8(text: str, limit: int) -> str:
    """At most ``limit`` bytes of UTF-8, never splitting a character; " ..." marks a cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 4].decode("utf-8", "ignore") + " ..."


def event_message(doc: dict[str, Any]) -> str:
    """The Event's one-line message (at most NOTE_LIMIT bytes): what, where, the message id, the evidence."""
    details = json.dumps(doc["details"], default=str, ensure_ascii=False, separators=(",", ":"))
    text = (f"{doc['type']} on {doc['entity']} ({doc['severity']}): {doc['message']} "
            f"[message {doc['message_id']}] evidence: {details}")
    return cut_utf8("".join(c if c.isprintable() else " " for c in text), NOTE_LIMIT)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer (a failure), never a second POST somewhere else."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class BreakfixRemediation:
    name: ClassVar[str] = "breakfix"
    config_type: ClassVar[type[BreakfixConfig]] = BreakfixConfig
    needs_budget: ClassVar[bool] = False

    def __init__(self, config: BreakfixConfig, host: HostPaths, *, client: Any = None) -> None:
        self.config = config
        self.client = LazyClient(config.kubeconfig, client, needed=config.method == "event")
        self._done: OrderedDict[str, str] = OrderedDict()  # message id -> what was done
        self._lock = asyncio.Lock()
        if config.method == "webhook":
            self._ssl = ssl.create_default_context(cafile=config.ca_file or None)
            if not config.verify_tls:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE

    def _where(self) -> str:
        """The URL as audits show it: no credentials, no query (either may carry a token)."""
        u = urllib.parse.urlsplit(self.config.url)
        port = f":{u.port}" if u.port else ""
        return f"{u.scheme}://{u.hostname}{port}{u.path}"

    def _node(self, msg: dict[str, Any]) -> str:
        node = self.config.node_name or str(msg.get("node", ""))
        if len(node) > 253 or not _DNS_SUBDOMAIN.fullmatch(node):
            raise ValueError(f"refusing node {node[:80]!r}: not a Kubernetes node name")
        return node

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        what = f"{str(msg.get('type', ''))[:128]} on {str(msg.get('entity', ''))[:256]}"
        if self.config.method == "webhook":
            return f"hand the node to break-fix: POST the incident ({what}) to {self._where()}"
        return (f"hand the node to break-fix: record a Warning Event {REASON} ({what}) on Node {self._node(msg)}"
                f" in namespace {self.config.event_namespace}")

    def _remember(self, msg_id: str, what: str) -> None:
        if msg_id:
            self._done[msg_id] = what
            while len(self._done) > self.config.remember:
                self._done.popitem(last=False)

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        msg_id = str(msg.get("id") or "")[:128]
        async with self._lock:
            if msg_id and msg_id in self._done:
                return Result("already_done", f"message {msg_id} was already handed off ({self._done[msg_id]})",
                              {"message_id": msg_id})
            doc = incident(msg, max_details=self.config.max_details_bytes)
            if self.config.method == "webhook":
                result = await self._webhook(doc)
            else:
                result = await self._event(self._node(msg), doc)
            if result.outcome != "failed":
                self._remember(msg_id, result.detail)
            return result

    # -- webhook -------------------------------------------------------------------------------

    def _post(self, body: bytes) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "gpu-node-agent"}
        if self.config.bearer_token_file:
            with open(self.config.bearer_token_file, "rb") as fh:
                token = fh.read(8192).decode("ascii", "replace").strip()
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.config.url, data=body, method="POST", headers=headers)
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._ssl), _NoRedirect())
        try:
            with opener.open(req, timeout=self.config.timeout) as resp:
                return int(resp.status), resp.read(MAX_ANSWER).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:  # any status urllib does not take as success
            answer = exc.read(MAX_ANSWER).decode("utf-8", "replace") if exc.fp else ""
            return int(exc.code), answer

    async def _webhook(self, doc: dict[str, Any]) -> Result:
        where = self._where()
        data: dict[str, Any] = {"method": "webhook", "url": where, "message_id": doc["message_id"]}
        body = json.dumps(doc, default=str, ensure_ascii=False).encode()
        try:
            # the socket timeout bounds each read; this bounds the whole exchange (the thread ends on its own)
            status, answer = await asyncio.wait_for(asyncio.to_thread(self._post, body), self.config.timeout * 2)
        except (OSError, http.client.HTTPException) as exc:  # URLError and TimeoutError are OSErrors
            why = "timed out" if isinstance(exc, TimeoutError) else str(getattr(exc, "reason", "") or exc)[:300]
            return Result("failed", f"POST {where}: {why}", data)
        data.update(status=status, answer=answer.strip()[:500])
        if not 200 <= status < 300:
            return Result("failed", f"POST {where}: HTTP {status}", data)
        return Result("executed", f"incident {doc['message_id']} posted to {where} (HTTP {status})", data)

    # -- event ---------------------------------------------------------------------------------

    async def _event(self, node: str, doc: dict[str, Any]) -> Result:
        from lightkube import ApiError
        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event

        digest = hashlib.sha256(f"{node}\0{doc['message_id'] or doc['agent_time']}".encode()).hexdigest()[:16]
        name = f"{node[:200]}.breakfix-{digest}"
        ns = self.config.event_namespace
        message = event_message(doc)
        now = dt.datetime.now(dt.UTC)
        ev = Event(metadata=ObjectMeta(name=name, namespace=ns),
                   involvedObject=ObjectReference(kind="Node", name=node, apiVersion="v1"), reason=REASON,
                   message=message, type="Warning", source=EventSource(component="gpu-node-agent"),
                   firstTimestamp=now, lastTimestamp=now, count=1)
        data: dict[str, Any] = {"method": "event", "node": node, "event": name, "namespace": ns,
                                "message_id": doc["message_id"]}
        try:
            await self.client().create(ev, namespace=ns)
        except ApiError as exc:
            if exc.status.code == 409:
                return Result("already_done", f"Event {name} for this incident already exists", data)
            return Result("failed", f"POST Event {REASON} for node {node}: {exc.status.code} {exc.status.message}",
                          data)
        return Result("executed", f"recorded Event {REASON} on node {node}", {**data, "bytes": len(message.encode())})
