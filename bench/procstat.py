"""What the benchmarks read about a process they started: CPU time, memory, and a bounded stop."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime from /proc/<pid>/stat (fields after the command name, which may hold spaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def threads_cpu_ns(pid: int) -> int:
    """On-CPU time of all the process's threads, ns (/proc/<pid>/task/*/schedstat: finer than the ticks above)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def wakeups(pid: int) -> int:
    """Voluntary context switches of all the process's threads: how often one of them went to sleep (a timer or
    socket wait of the event loop, a worker thread's wait for work or for the GIL another thread holds)."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    n += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return n


def status_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s; reaped either way."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
