"""Whose processes wrote a log line: this node's, or another node's read through a shared file.

NCCL prefixes each line with the writing process's hostname cut at its first dot (src/debug.cc
ncclDebugInit, getHostName(hostname, 1024, '.')) and its pid as the process sees it (getpid(): in a
container, the pid in the container's namespace). A line is this node's when that name is one its own
processes go by:

* the node's hostname (a process on the host, a hostNetwork pod, a Slurm task);
* a pod of this node: a pod's hostname is ``spec.hostname`` or else its name (cut at 63 characters,
  trailing ``-``/``.`` trimmed: kubelet GeneratePodHostNameAndDomain / truncatePodHostnameIfNeeded); an
  Indexed Job's or a JobSet's pod is named ``<hostname>-<5 random characters>`` (generateName: the
  apiserver's SimpleNameGenerator, utilrand.String over "bcdfghjklmnpqrstvwxz2456789"). The pods are the
  ones the kubelet keeps logs for here, ``/var/log/pods/<namespace>_<pod>_<uid>/`` (pkg/kubelet/kuberuntime
  BuildPodLogsDirectory): only this node's pods are there;
* a containerised process of this node that says so: one whose ``/proc/<pid>/status`` ``NSpid`` ends in the
  pid NCCL printed and whose environment's ``HOSTNAME`` is the name (containerd's CRI plugin sets
  ``HOSTNAME=<the sandbox's hostname>`` for every container: pkg/cri/server/container_create_linux.go,
  "Add HOSTNAME env", containerd v1.7.0); the process runs here, whatever name it gives itself;
* names the operator lists (``own_hosts``: globs; ``["*"]`` takes every line as this node's, for a log
  copied here to be checked).

Any other name is another node's process: on a shared filesystem (``/home`` on NFS holding every rank's
``--output`` file) or in a job-wide file (srun's forwarded output, a launcher's aggregated log) this node
reads lines it did not write, and they are never its evidence.

A file on a network filesystem (the mount table's type: NFS, Lustre, GPFS, CephFS, a FUSE filesystem such as
JuiceFS, ...) is read by every node that mounts it: its other hosts' lines are never relayed from it (each node
would relay every other's: the same word N times, looking independent). The mount table is the host's
(``/proc/1/mountinfo`` under the host root, proc(5)); a snapshot without one relays, and ``diagnose`` keeps a
line several snapshots read once.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import time

from gna_sdk import HostPaths

POD_LOGS = "/var/log/pods"
MAX_PODS = 4096  # pod log directories looked at (a node runs at most a few hundred pods)
MAX_PROCS = 65536  # /proc entries looked at per refresh
STATUS_MAX = 4096  # bytes of /proc/<pid>/status read (NSpid is in its first kilobyte)
ENVIRON_MAX = 131072  # bytes of /proc/<pid>/environ read (HOSTNAME is set first by the runtime)
# /var/log/pods/<namespace>_<pod>_<uid>
_POD_DIR = re.compile(r"(?P<ns>[a-z0-9][a-z0-9-]{0,62})_(?P<pod>[a-z0-9][a-z0-9.-]{0,252})_(?P<uid>[0-9a-f-]{1,64})")
_GENERATED = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$")  # generateName's random suffix
_NSPID = re.compile(rb"^NSpid:\s*([0-9\s]+)$", re.M)
MOUNTINFO_MAX = 1 << 20  # bytes of mountinfo read (a node with a few thousand mounts stays below)
# filesystems every node of a cluster may mount (proc(5) mountinfo's fstype; FUSE ones are "fuse.<name>")
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "glusterfs", "beegfs",
                        "wekafs", "panfs", "pvfs2", "orangefs", "ocfs2", "gfs2", "9p", "afs", "virtiofs"})


def short_host(name: str) -> str:
    """A hostname as NCCL prints it: cut at its first dot."""
    return name.strip().split(".")[0]


def pod_hostnames(pod: str) -> set[str]:
    """The hostnames a pod named ``pod`` may have: its name (cut and trimmed as the kubelet does), and the
    name without a generated suffix (an Indexed Job's or JobSet's pod, whose spec.hostname it is)."""
    name = pod[:63].rstrip("-.").split(".")[0]
    out = {name}
    if _GENERATED.search(pod):
        out.add(_GENERATED.sub("", pod)[:63].rstrip("-.").split(".")[0])
    return {n for n in out if n}


class Writers:
    """Which names this node's processes write under (see the module's docstring)."""

    def __init__(self, host: HostPaths, node_host: str, *, own_hosts: list[str] | None = None,
                 refresh: float = 30.0) -> None:
        self.host = host
        self.node_host = node_host
        self.own_hosts = [g for g in (own_hosts or []) if g]
        self.refresh = refresh
        self._pods: set[str] = set()
        self._pods_at = -1e18
        # (HOSTNAME, pid in its namespace) -> pid here, of this node's containerised processes
        self._procs: dict[tuple[str, int], int] = {}
        self._procs_at = -1e18
        self.errors: dict[str, int] = {}  # what could not be read, by kind
        self._mounts: list[tuple[str, str]] | None = None
        self._mounts_at = -1e18
        self._shared: dict[str, bool] = {}  # path -> on a network filesystem, until the table is read again

    def local(self, name: str, pid: int = 0) -> bool:
        """Whether a line NCCL prefixed with ``name:pid`` was written by a process of this node."""
        if not name:
            return False
        if name == self.node_host or any(fnmatch.fnmatchcase(name, g) for g in self.own_hosts):
            return True
        if name in self.pod_hosts():
            return True
        return pid > 0 and self.host_pid(name, pid) is not None

    def shared(self, path: str) -> bool | None:
        """Whether ``path`` (a host path) is on a network filesystem: its longest mount point's type; None when
        the host's mount table cannot be read (a snapshot)."""
        now = time.monotonic()
        if now - self._mounts_at >= self.refresh:
            self._mounts_at = now
            self._mounts = self._read_mounts()
            self._shared.clear()
        if self._mounts is None:
            return None
        if path in self._shared:
            return self._shared[path]  # a job-wide file asks for each of its other hosts' lines
        best, fstype = -1, ""
        for point, kind in self._mounts:
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > best:
                best, fstype = len(point), kind
        got = fstype in NETWORK_FS or (fstype.startswith("fuse.") and fstype != "fuse.lxcfs")
        if len(self._shared) < 4096:
            self._shared[path] = got
        return got

    def _read_mounts(self) -> list[tuple[str, str]] | None:
        """(mount point, fstype) of the host's mount table (proc(5): "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 -
        ext3 /dev/root rw"; the point's spaces and such octal-escaped)."""
        for source in ("/proc/1/mountinfo", "/proc/self/mountinfo"):
            text = self.host.read_text(source, limit=MOUNTINFO_MAX)
            if text:
                break
        else:
            return None
        out = []
        for line in text.splitlines():
            left, sep, right = line.partition(" - ")
            fields, tail = left.split(" "), right.split(" ")
            if sep and len(fields) >= 5 and tail:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                out.append((point, tail[0]))
        return out

    def names(self) -> set[str]:
        """Every name this node's processes are known to print (the node's, its pods', its containers' found so
        far); own_hosts' globs are not names and are left out."""
        return {self.node_host, *self.pod_hosts(), *(n for n, _pid in self._procs)} - {""}

    def pod_hosts(self) -> set[str]:
        """The hostnames of the pods this node keeps logs for (read again every ``refresh`` seconds)."""
        now = time.monotonic()
        if now - self._pods_at < self.refresh:
            return self._pods
        self._pods_at = now
        pods: set[str] = set()
        with contextlib.suppress(OSError), os.scandir(self.host.path(POD_LOGS)) as it:
            for i, entry in enumerate(it):
                if i >= MAX_PODS:
                    self.errors["too_many_pods"] = self.errors.get("too_many_pods", 0) + 1
                    break
                m = _POD_DIR.fullmatch(entry.name)
                if m is not None:
                    pods |= pod_hostnames(m["pod"])
        self._pods = pods
        return pods

    def host_pid(self, name: str, pid: int) -> int | None:
        """The pid here of this node's containerised process that calls itself ``name`` and is ``pid`` in its
        own namespace; None when there is none (the index is rebuilt at most every ``refresh`` seconds)."""
        got = self._procs.get((name, pid))
        if got is not None:
            return got
        now = time.monotonic()
        if now - self._procs_at < self.refresh:
            return None
        self._procs_at = now
        self._procs = self._index()
        return self._procs.get((name, pid))

    def _index(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        try:
            names = [n for n in os.listdir(self.host.path("/proc")) if n.isdigit()][:MAX_PROCS]
        except OSError:
            return out
        for n in names:
            ns = self._nspid(n)
            if ns is None or len(ns) < 2:
                continue  # gone, or a process of the host's own namespace (it prints the node's name)
            env = self._hostname_env(n)
            if env:
                out[(short_host(env), ns[-1])] = int(n)
        return out

    def _nspid(self, pid: str) -> list[int] | None:
        try:
            with open(self.host.path(f"/proc/{pid}/status"), "rb") as fh:
                data = fh.read(STATUS_MAX)
        except OSError:
            return None
        m = _NSPID.search(data)
        if m is None:
            return None
        ids = m.group(1).split()
        return [int(x) for x in ids[:32] if len(x) <= 7]

    def _hostname_env(self, pid: str) -> str:
        try:
            with open(self.host.path(f"/proc/{pid}/environ"), "rb") as fh:
                data = fh.read(ENVIRON_MAX)
        except OSError:
            self.errors["environ_unreadable"] = self.errors.get("environ_unreadable", 0) + 1
            return ""
        for item in data.split(b"\0"):
            if item.startswith(b"HOSTNAME="):
                return item[9:9 + 253].decode("utf-8", "replace")
        return ""
