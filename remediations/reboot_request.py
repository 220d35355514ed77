"""Ask for a reboot of this node — never reboot it: a reboot daemon or an operator's hook decides when.

Three methods (``method`` in the config):

- ``sentinel``: write kured's sentinel file. kured reboots a node when its ``--reboot-sentinel`` file
  exists, default ``/var/run/reboot-required`` (kubereboot/kured cmd/kured/main.go, flag
  "reboot-sentinel", "path to file whose existence triggers the reboot command"; pkg/checkers/checker.go
  FileRebootChecker: an ``os.Stat`` of the path; commit 51220cc, 1.23.0-32). kured takes its own lock
  (the ``weave.works/kured-node-lock`` annotation on its DaemonSet, pkg/daemonsetlock) so one node reboots
  at a time, and drains first: this plugin writes nothing of kured's. The path must lie under ``/run`` or
  ``/var/run`` (tmpfs): the reboot itself clears it; on a disk it would ask for a reboot again after every
  boot. Written atomically under the host root, following the host's own links (``/var/run -> /run``).
- ``annotation``: merge-PATCH the Node with an annotation (or label) ``<key>=<time>`` for a controller
  that watches Nodes (kured itself only reads its sentinel). A label value must be a Kubernetes label
  value (at most 63 characters, alphanumerics and ``-_.``: apimachinery pkg/util/validation
  IsValidLabelValue), so a label carries ``20260102T030405Z``; the key is a qualified name (IsQualifiedName).
  The PATCH carries the resourceVersion it read; a 409 re-reads and retries.
- ``command``: run an operator's hook. The argv comes from the config only; the node name and the
  trigger type are appended as two separate arguments, each a plain name checked against a pattern.

Each is idempotent where it can tell: the sentinel or the annotation already there is ``already_done``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec

from gna_sdk import CommandError, HostPaths, Result, run_command
from gna_sdk.rootpath import resolve_in_root
from remediations.kube_client import LazyClient

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_TYPE = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
# apimachinery pkg/util/validation/validation.go: IsQualifiedName (optional DNS-1123 subdomain prefix,
# "/", a name of at most 63 characters) and the DNS-1123 subdomain rule for the prefix
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TMPFS_DIRS = ("/run/", "/var/run/")
MAX_TEXT = 512  # characters of the sentinel's content and of the reason annotation


def qualified_name(key: str) -> bool:
    """A Kubernetes annotation/label key: ``[prefix/]name`` (apimachinery IsQualifiedName)."""
    prefix, sep, name = key.rpartition("/")
    if sep and not (prefix and len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_QUALIFIED_NAME.fullmatch(name)) and "/" not in prefix


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """Message text for a file or an annotation a human reads: control characters replaced, bounded."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


class RebootRequestConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    method: Literal["sentinel", "annotation", "command"] = "sentinel"
    sentinel_path: str = "/var/run/reboot-required"  # kured's --reboot-sentinel default
    # annotation
    kubeconfig: str = ""  # empty: the in-cluster service account
    node_name: str = ""  # the Node's name when it differs from the agent's node name
    key: str = "gpu-node-agent/reboot-requested"
    as_label: bool = False
    reason_key: str = "gpu-node-agent/reboot-reason"  # an annotation with the trigger; "" for none
    retries: int = 3
    # command
    command: list[str] = msgspec.field(default_factory=list)  # the hook's argv; node and type are appended
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.timeout > 0 or self.retries < 1:
            raise ValueError("timeout must be > 0 and retries >= 1")
        path = self.sentinel_path
        if os.path.normpath(path) != path or not path.startswith(_TMPFS_DIRS) or len(path) > 1024:
            raise ValueError(f"sentinel_path {path[:100]!r} must be a normal absolute path under /run or /var/run "
                             "(tmpfs, so the reboot clears it; elsewhere it would ask for a reboot after every boot)")
        for k in (self.key, self.reason_key):
            if k and not qualified_name(k):
                raise ValueError(f"{k[:100]!r} is not a Kubernetes annotation/label key ([prefix/]name)")
        if not self.key:
            raise ValueError("key must be set")
        if self.method == "command" and not (self.command and all(self.command)):
            raise ValueError("method = 'command' needs command = [argv...]")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def write_sentinel(directory: Path, name: str, content: bytes) -> None:
    """``directory/name`` replaced atomically: a private temporary file (never following a link), synced,
    renamed over the target, the directory synced."""
    tmp = directory / f".{name}.gpu-node-agent.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, content)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, directory / name)
    except BaseException:
        os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class RebootRequestRemediation:
    name: ClassVar[str] = "reboot_request"
    config_type: ClassVar[type[RebootRequestConfig]] = RebootRequestConfig
    needs_budget: ClassVar[bool] = False

    def __init__(self, config: RebootRequestConfig, host: HostPaths, *, client: Any = None) -> None:
        self.config = config
        self.host = host
        self.client = LazyClient(config.kubeconfig, client, needed=config.method == "annotation")
        self.command: list[str] = []
        if config.method == "command":
            exe = config.command[0]
            path = exe if "/" in exe else shutil.which(exe)
            if not path or not os.access(path, os.X_OK):
                raise CommandError(f"reboot hook {exe!r} not found or not executable")
            self.command = [path, *config.command[1:]]

    # -- shared --------------------------------------------------------------------------------

    def _node(self, msg: dict[str, Any]) -> str:
        node = self.config.node_name or str(msg.get("node", ""))
        if not _NODE.fullmatch(node):
            raise ValueError(f"refusing node {node[:80]!r}: not a plain name")
        return node

    def _type(self, msg: dict[str, Any]) -> str:
        type_ = str(msg.get("type", ""))
        if not _TYPE.fullmatch(type_):
            raise ValueError(f"refusing trigger type {type_[:80]!r}: not a CamelCase name")
        return type_

    def _why(self, msg: dict[str, Any]) -> str:
        return printable(f"{msg.get('type', '')} on {msg.get('entity', '')} (message {msg.get('id', '')})")

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        if self.config.method == "sentinel":
            return (f"request a reboot: write kured's sentinel {self.config.sentinel_path} "
                    f"({self._why(msg)}); kured drains and reboots the node when it finds it")
        node = self._node(msg)
        if self.config.method == "annotation":
            where = "label" if self.config.as_label else "annotation"
            return f"request a reboot: set the {where} {self.config.key} on Kubernetes node {node}"
        return f"request a reboot: run {' '.join([*self.command, node, self._type(msg)])}"

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        if self.config.method == "sentinel":
            return self._sentinel(msg)
        if self.config.method == "annotation":
            return await self._annotate(self._node(msg), msg)
        return await self._command(self._node(msg), self._type(msg))

    # -- sentinel ------------------------------------------------------------------------------

    def _sentinel(self, msg: dict[str, Any]) -> Result:
        host_dir, name = os.path.split(self.config.sentinel_path)
        data = {"method": "sentinel", "path": self.config.sentinel_path}
        try:
            directory = resolve_in_root(Path(self.host.root), host_dir)
            if os.path.lexists(directory / name):
                return Result("already_done", f"a reboot is already requested: {self.config.sentinel_path} exists",
                              data)
            content = f"gpu-node-agent requests a reboot: {self._why(msg)} at {_now().isoformat()}\n"
            write_sentinel(directory, name, content.encode())
        except OSError as exc:
            return Result("failed", f"cannot write {self.config.sentinel_path}: {exc.strerror or exc}", data)
        return Result("executed", f"wrote {self.config.sentinel_path}: kured reboots the node when it sees it", data)

    # -- annotation ----------------------------------------------------------------------------

    async def _annotate(self, name: str, msg: dict[str, Any]) -> Result:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        key, where = self.config.key, "labels" if self.config.as_label else "annotations"
        now = _now()
        value = now.strftime("%Y%m%dT%H%M%SZ") if self.config.as_label else now.strftime("%Y-%m-%dT%H:%M:%SZ")
        data = {"method": "annotation", "node": name, "key": key, "where": where[:-1]}
        for attempt in range(self.config.retries):
            try:
                node = await self.client().get(Node, name)
            except ApiError as exc:
                return Result("failed", f"GET node {name}: {exc.status.code} {exc.status.message}", data)
            present = dict(getattr(node.metadata, where) or {})
            if key in present:
                return Result("already_done", f"a reboot is already requested: {key}={present[key]}", data)
            meta: dict[str, Any] = {"resourceVersion": node.metadata.resourceVersion, where: {key: value}}
            if self.config.reason_key:
                meta.setdefault("annotations", {})[self.config.reason_key] = self._why(msg)
            try:
                await self.client().patch(Node, name, {"metadata": meta}, patch_type=PatchType.MERGE)
                return Result("executed", f"set {where[:-1]} {key}={value} on node {name}", {**data, "value": value})
            except ApiError as exc:
                if exc.status.code == 409 and attempt + 1 < self.config.retries:
                    continue  # someone else wrote the Node: read it again
                return Result("failed", f"PATCH node {name}: {exc.status.code} {exc.status.message}", data)
        return Result("failed", f"PATCH node {name}: still conflicting after {self.config.retries} tries", data)

    # -- command -------------------------------------------------------------------------------

    async def _command(self, node: str, type_: str) -> Result:
        argv = [*self.command, node, type_]
        data: dict[str, Any] = {"method": "command", "argv": argv}
        try:
            rc, out, err = await run_command(argv, timeout=self.config.timeout)
        except CommandError as exc:
            return Result("failed", str(exc), data)
        data["rc"] = rc
        if rc != 0:
            return Result("failed", f"reboot hook exited {rc}: {printable(err.strip() or out.strip())}",
                          {**data, "stderr": err.strip()[:2000]})
        return Result("executed", f"reboot hook ran for {node} ({type_})", {**data, "stdout": out.strip()[:2000]})
