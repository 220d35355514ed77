"""NVIDIA's Kubernetes device plugin as this node runs it: its ``--mig-strategy``.

NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go @01421a2 (its urfave/cli StringFlag "mig-strategy",
EnvVars MIG_STRATEGY, Value MigStrategyNone): ``--mig-strategy`` (urfave/cli: ``-mig-strategy`` too, ``=value``
or the next argument), the environment variable ``MIG_STRATEGY``, values ``none`` | ``single`` | ``mixed``,
default ``none``; the flag wins over the environment. A strategy set only in the plugin's ``--config-file``
(``flags.migStrategy``) is not read here: the collector's ``mig_strategy`` setting says it then.
"""

from __future__ import annotations

import os
from typing import Literal

from gna_sdk import HostPaths

MigStrategy = Literal["none", "single", "mixed"]
STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
PLUGIN_NAMES = frozenset({"nvidia-device-plugin", "gpu-device-plugin"})  # the binary's name in the images
MAX_ARGS = 256
MAX_PIDS = 65536


def _strategy(value: str) -> MigStrategy | str:
    v = value.strip().lower()
    for s in STRATEGIES:
        if v == s:
            return s
    return value[:32]  # the plugin refuses it ("Unknown strategy"); shown as it was


def parse_mig_strategy(cmdline: bytes, environ: bytes | None = None) -> MigStrategy | str | None:
    """The strategy a device plugin with this /proc/<pid>/cmdline (and environ) runs with; None when neither
    sets it (the plugin's default, ``none``, unless its config file says otherwise)."""
    args = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0")[:MAX_ARGS]]
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--mig-strategy", "-mig-strategy"):
            if eq:
                return _strategy(value)
            if i + 1 < len(args):
                return _strategy(args[i + 1])
    for var in (environ or b"").split(b"\0")[:4096]:
        if var.startswith(b"MIG_STRATEGY="):
            return _strategy(var[len(b"MIG_STRATEGY="):].decode("utf-8", "replace"))
    return None


def find_device_plugin(host: HostPaths, max_pids: int = MAX_PIDS) -> tuple[int, MigStrategy | str | None] | None:
    """(pid, its strategy or None) of the device plugin process under the host's /proc; None when no such
    process is visible (not this node's, or the agent does not see the host's processes)."""
    proc = host.path("/proc")
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()][:max_pids]
    except OSError:
        return None
    for pid in sorted(names, key=int):
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                cmdline = f.read(65536)
        except OSError:
            continue
        argv0 = cmdline.split(b"\0", 1)[0].decode("utf-8", "replace")
        if os.path.basename(argv0) not in PLUGIN_NAMES:
            continue
        try:
            with open(os.path.join(proc, pid, "environ"), "rb") as f:
                environ: bytes | None = f.read(1 << 20)
        except OSError:
            environ = None
        return int(pid), parse_mig_strategy(cmdline, environ)
    return None
