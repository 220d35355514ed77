"""Which processes hold which NVIDIA GPU open, from ``/proc`` alone (no NVML, no driver call).

A GPU reset (``nvidia-smi -r``) needs every process off the GPU, and an active check must never run
while a job holds the GPUs: both ask this module. A process using a GPU has its device node open —
``/proc/<pid>/fd/<n>`` is a link whose text is ``/dev/nvidia<minor>`` (proc(5), /proc/pid/fd; the
device nodes the driver's nvidia-modprobe creates: ``/dev/nvidia<minor>`` per GPU, ``/dev/nvidiactl``
and ``/dev/nvidia-uvm`` shared, open-gpu-kernel-modules kernel-open/nvidia/nv.c). The minor number
maps to the GPU's PCI address through ``/proc/driver/nvidia/gpus/<pci>/information``'s
``Device Minor:`` line (kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info).

The link text is read, never followed, so a ``--host-root`` tree and a process's own mount namespace
read the same. A process whose fds cannot be read (another user's, without CAP_SYS_PTRACE; gone
mid-scan) is counted in ``unreadable``: "no process found" is only "idle" when that count is 0.
Everything is bounded: processes scanned, fds per process, bytes per file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from gna_sdk import HostPaths

MAX_PIDS = 65536
MAX_FDS_PER_PID = 65536
_DEV = re.compile(r"^/dev/nvidia(\d{1,4})$")
_MINOR = re.compile(r"^Device Minor:\s*(\d{1,4})\s*$", re.MULTILINE)


@dataclass
class GPUUse:
    """GPU minor -> the processes holding it: ``{0: [(1234, "python3"), ...]}``."""

    by_minor: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    unreadable: int = 0  # processes whose fds could not be read: the answer is incomplete
    scanned: int = 0
    truncated: bool = False  # more than MAX_PIDS processes: the scan stopped there

    def holders(self, minor: int) -> list[tuple[int, str]]:
        return self.by_minor.get(minor, [])

    @property
    def complete(self) -> bool:
        """Every process was read: an empty answer means no process holds a GPU."""
        return self.unreadable == 0 and not self.truncated


def gpu_minors(host: HostPaths) -> dict[str, int]:
    """PCI address (as the driver's procfs names it, ``0000:3b:00.0``) -> the GPU's device minor."""
    out: dict[str, int] = {}
    try:
        entries = sorted(host.path("/proc/driver/nvidia/gpus").iterdir())[:1024]
    except OSError:
        return out
    for entry in entries:
        info = host.read_text(f"/proc/driver/nvidia/gpus/{entry.name}/information", 4096) or ""
        if m := _MINOR.search(info):
            out[entry.name.lower()] = int(m.group(1))
    return out


def own_pid(host: HostPaths) -> int | None:
    """This process's pid as the scanned ``/proc`` numbers it: ``/proc/self`` there names the reader as seen
    from that procfs's pid namespace (proc(5), /proc/self), so a container reading the host's procfs under
    ``--host-root`` finds itself too. None when the tree has no such link (a test tree, another pid
    namespace that cannot see us)."""
    try:
        text = os.readlink(host.path("/proc/self"))
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) <= 10 else None


def _comm(pid_dir: str) -> str:
    try:
        with open(os.path.join(pid_dir, "comm"), "rb") as fh:
            raw = fh.read(64)
    except OSError:
        return "?"
    # the kernel's comm is at most 15 bytes (TASK_COMM_LEN 16); anything else is printable-filtered
    return "".join(c if c.isprintable() else "?" for c in raw.decode("utf-8", "replace").strip()[:32]) or "?"


def scan(host: HostPaths) -> GPUUse:
    """One pass over ``/proc/*/fd``: which process holds which ``/dev/nvidia<minor>``."""
    use = GPUUse()
    proc = str(host.path("/proc"))
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        use.unreadable += 1
        return use
    if len(pids) > MAX_PIDS:
        use.truncated = True
        pids = pids[:MAX_PIDS]
    for pid in pids:
        pid_dir = os.path.join(proc, pid)
        fd_dir = os.path.join(pid_dir, "fd")
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # exited between the two reads
        except OSError:
            use.unreadable += 1
            continue
        use.scanned += 1
        minors: set[int] = set()
        for fd in fds[:MAX_FDS_PER_PID]:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if m := _DEV.fullmatch(target):
                minors.add(int(m.group(1)))
        if minors:
            name = _comm(pid_dir)
            for minor in minors:
                use.by_minor.setdefault(minor, []).append((int(pid), name))
    for holders in use.by_minor.values():
        holders.sort()
    return use
