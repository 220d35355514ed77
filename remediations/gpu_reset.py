"""Reset one GPU with ``nvidia-smi -r -i <pci>``, only when no process holds it.

The reset is NVIDIA's documented way to clear a GPU's hardware and software state without a reboot
(nvidia-smi(1), https://docs.nvidia.com/deploy/nvidia-smi/index.html, ``-r, --gpu-reset``: "Requires
root. There can't be any applications using these devices"; ``-i, --id``: the GPU's "PCI bus ID (as
domain:bus:device.function in hex)"). NVSentinel does the same for its COMPONENT_RESET recommended
action (NVIDIA/NVSentinel data-models/protobufs/health_event.proto, RecommendedAction; its janitor runs
gpu-reset/gpu_reset.sh: ``nvidia-smi --gpu-reset -i <ids>``, commit 353aefd).

Before it runs anything, the plugin proves the GPU idle from ``/proc`` (gna_sdk.gpu_processes): any
process holding ``/dev/nvidia<minor>`` is named in the refusal (pid and comm), and a scan that could not
read every process refuses too ("cannot prove it idle"). nvidia-persistenced counts as a holder — the
driver refuses the reset while persistence mode is on (NVSentinel issue #1690, PR #1692): see below.

This agent is a holder too: its NVML collector keeps every GPU open for the process's lifetime
("A persistent NVML client holds an attachment to every GPU on the node for its process lifetime, and
nvidia-smi --gpu-reset is refused", NVIDIA/NVSentinel #1691). So the agent's own pid is left out of the
first scan, every holder inside this process is asked to let go (gna_sdk.gpu_release: NVML shut down,
its passes and Xid wait parked), ``/proc`` is scanned again — now with the agent itself counted — and
only then does nvidia-smi run; monitoring resumes afterwards, whatever the outcome. With
``persistence_mode = "release"`` (the default) a GPU held only by nvidia-persistenced gets persistence
mode turned off for the reset and on again afterwards (``nvidia-smi -pm 0|1 -i``), as NVSentinel's
janitor does since PR #1692.

Afterwards the GPU must still be listed in ``/proc/driver/nvidia/gpus``: NVIDIA recommends checking a
reset GPU's health before use; a GPU gone from the driver's list is reported as a failure.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec

from gna_sdk import (
    CommandError,
    HostPaths,
    Result,
    gpu_processes,
    gpu_release,
    plural,
    resolve_executable,
    run_command,
)
from gna_types.entities import parse_pci

MAX_OUTPUT = 2000  # characters of nvidia-smi's output kept in the audit
MAX_LINES = 200  # lines of output parsed; the rest is ignored
MAX_NAMED = 8  # holders named in a refusal; the rest are counted
PERSISTENCED_COMM = "nvidia-persiste"  # nvidia-persistenced's comm: the kernel keeps 15 bytes (TASK_COMM_LEN 16)

# nvidia-smi's reset output. nvidia-smi is closed source: these forms are taken from transcripts of
# real runs, each cited; NVSMI says its text output is "not guaranteed to be backwards compatible".
#   success, one line per GPU, then "All done.":
#     "GPU 00000000:C1:00.0 was successfully reset."   (NVIDIA/gpu-operator#118; NVIDIA/k8s-test-infra#759,
#     8 GPUs then "All done."; NVIDIA/NVSentinel#1690 and #1692, exit 0; two spaces before "was" in a
#     transcript of an Iluvatar BI-V100 (nvidia-smi compatible) tool, so any run of blanks is accepted)
_BUS_ID = r"(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])"  # NVML's "%08X:%02X:%02X.0"
_OK = re.compile(rf"^GPU\s+{_BUS_ID}\s+was successfully reset\.?$")
#   refused, current drivers (exit 255):
#     "The following GPUs could not be reset:" then "  GPU 00000000:1A:00.0: In use by another client"
#     (NVIDIA/NVSentinel#1690; ComputeCanada/puppet-magic_castle#387, through mig-parted)
_LIST_HEAD = re.compile(r"^The following GPUs could not be reset:?$")
_LIST_ITEM = re.compile(rf"^GPU\s+{_BUS_ID}:\s*(?P<why>.{{0,200}})$")
#   refused, older drivers: "GPU 00000000:C1:00.0 is currently in use by another process."
#     (NVIDIA/gpu-operator#118; cupy/cupy#1930)
_IN_USE = re.compile(rf"^GPU\s+{_BUS_ID}\s+is currently in use by another process\.?$")
#   refused, driver 418: "Unable to reset this GPU because it's being used by some other process (...)"
#     then "Terminating early due to previous errors." (a user's notes quoting nvidia-smi 418.87; the
#     search index did not name the repository)
_UNABLE = re.compile(r"^Unable to reset this GPU because (?P<why>.{0,200})$")
#   "Insufficient Permissions" is NVML's text for NVML_ERROR_NO_PERMISSION, which nvidia-smi prints after
#   the failed call (e.g. "NVML: Unable to get ...: Insufficient Permissions", gpuopenanalytics/pynvml#19).
#   NO SOURCE was found for the exact line nvidia-smi -r prints without root: any line containing it counts.
_NO_PERMISSION = "Insufficient Permissions"


@dataclass
class ResetOutput:
    """What ``nvidia-smi -r`` said, GPU by GPU (PCI addresses in the sysfs normal form)."""

    reset: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # pci -> the tool's reason
    in_use: bool = False  # some form of "being used by another process/client"
    no_permission: bool = False
    unparsed: int = 0  # non-blank lines of none of the known forms


def parse_reset_output(text: str) -> ResetOutput:
    """nvidia-smi's reset output -> per-GPU outcome. Never raises; unknown lines are counted."""
    out = ResetOutput()
    in_list = False
    for raw in text.splitlines()[:MAX_LINES]:
        line = raw.strip()[:300]
        if not line:
            continue
        if m := _OK.match(line):
            if pci := parse_pci(m.group("pci")):
                out.reset.add(pci)
            continue
        if _LIST_HEAD.match(line):
            in_list = True
            continue
        if in_list and (m := _LIST_ITEM.match(line)):
            if pci := parse_pci(m.group("pci")):
                why = m.group("why").strip()
                out.refused[pci] = why
                out.in_use |= "in use" in why.lower()
            continue
        if m := _IN_USE.match(line):
            if pci := parse_pci(m.group("pci")):
                out.refused[pci] = "in use by another process"
            out.in_use = True
            continue
        if _UNABLE.match(line):
            out.in_use |= "used by" in line
            continue
        if _NO_PERMISSION.lower() in line.lower():
            out.no_permission = True
            continue
        if line in ("All done.", "Terminating early due to previous errors.") or line.startswith(
                ("1 device is currently", "Please first kill")) or "devices are currently" in line:
            continue  # the tool's own summary and advice lines
        in_list = False
        out.unparsed += 1
    return out


class GPUResetConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    nvidia_smi: str = ""  # empty: found on PATH at start-up
    timeout: float = 120.0  # seconds nvidia-smi may take (a reset of a hung GPU can be slow)
    # "release": when nvidia-persistenced is the only other holder, turn persistence mode off for the reset
    # and on again afterwards; "refuse": a GPU nvidia-persistenced holds is not reset
    persistence_mode: Literal["release", "refuse"] = "release"

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError("timeout must be > 0")


def _holders_text(holders: list[tuple[int, str]], me: int | None = None) -> str:
    named = [f"pid {pid} ({name}{', this agent' if pid == me else ''})" for pid, name in holders[:MAX_NAMED]]
    more = len(holders) - len(named)
    return ", ".join(named) + (f" and {plural(more, 'more process', 'more processes')}" if more > 0 else "")


class GPUResetRemediation:
    name: ClassVar[str] = "gpu_reset"
    config_type: ClassVar[type[GPUResetConfig]] = GPUResetConfig
    needs_budget: ClassVar[bool] = False

    def __init__(self, config: GPUResetConfig, host: HostPaths) -> None:
        self.config = config
        self.host = host
        self.nvidia_smi = resolve_executable("nvidia-smi", config.nvidia_smi)

    def _target(self, msg: dict[str, Any], args: dict[str, Any]) -> tuple[str, int]:
        """(pci, minor) of the GPU to reset: ``args["gpu"]`` or the message's ``gpu:<pci>`` entity, and
        only a GPU the driver lists on this host."""
        given = str(args.get("gpu") or "")
        if not given:
            entity = str(msg.get("entity", ""))
            if not entity.startswith("gpu:"):
                raise ValueError(f"entity {entity[:80]!r} is not a GPU (gpu:<pci>) and no gpu argument was given")
            given = entity[4:]
        pci = parse_pci(given)
        if pci is None:
            raise ValueError(f"{given[:80]!r} is not a PCI address")
        minors = gpu_processes.gpu_minors(self.host)
        if pci not in minors:
            raise ValueError(f"GPU {pci} is not one of this host's GPUs ({plural(len(minors), 'GPU')} listed in "
                             "/proc/driver/nvidia/gpus)")
        return pci, minors[pci]

    def plan(self, msg: dict[str, Any], args: dict[str, Any]) -> str:
        pci, minor = self._target(msg, args)
        return f"reset GPU {pci} (/dev/nvidia{minor}) with nvidia-smi -r -i {pci}, if no process holds it"

    async def execute(self, msg: dict[str, Any], args: dict[str, Any]) -> Result:
        try:
            pci, minor = self._target(msg, args)
        except ValueError as exc:
            return Result("failed", str(exc))
        data: dict[str, Any] = {"gpu": pci, "minor": minor}
        me = gpu_processes.own_pid(self.host)
        use = gpu_processes.scan(self.host)
        # this agent's own NVML handle is let go below; nvidia-persistenced is asked to let go (persistence)
        others = [h for h in use.holders(minor) if h[0] != me]
        daemon = [h for h in others if h[1] == PERSISTENCED_COMM]
        if self.config.persistence_mode == "release":
            others = [h for h in others if h[1] != PERSISTENCED_COMM]
        if others:
            data["holders"] = [{"pid": pid, "comm": name} for pid, name in others[:64]]
            return Result("failed", f"refusing to reset GPU {pci}: /dev/nvidia{minor} is held by "
                                    f"{_holders_text(others)}", data)
        if not use.complete:
            why = (f"{plural(use.unreadable, 'process', 'processes')} could not be read" if use.unreadable
                   else f"more than {gpu_processes.MAX_PIDS} processes")
            return Result("failed", f"refusing to reset GPU {pci}: cannot prove it idle ({why}; the agent needs "
                                    "CAP_SYS_PTRACE or root to read every process's fds)", data)
        started = time.monotonic()
        async with gpu_release.released(f"the reset of GPU {pci}") as released:
            data["released"] = released.holders
            if released.failed:
                data["release_failed"] = released.failed
            persistence = bool(daemon) and await self._persistence(pci, False, data)
            try:
                return await self._reset(pci, minor, me, data)
            finally:
                if persistence:
                    await self._persistence(pci, True, data)
                data["released_s"] = round(time.monotonic() - started, 3)

    async def _persistence(self, pci: str, on: bool, data: dict[str, Any]) -> bool:
        """``nvidia-smi -pm 0|1 -i <pci>``: nvidia-persistenced lets go of the GPU while persistence mode is off
        (NVIDIA/NVSentinel PR #1692: "Persistence mode counts as an attachment to the device"; it disables it
        before the reset and restores it afterwards, as here). True when nvidia-smi exited 0; the outcome is
        recorded under ``persistence_off``/``persistence_on``. Its text is not parsed: the re-scan decides."""
        argv = [self.nvidia_smi, "-pm", "1" if on else "0", "-i", pci]
        key = "persistence_on" if on else "persistence_off"
        try:
            rc, out, err = await run_command(argv, timeout=self.config.timeout)
        except CommandError as exc:
            data[key] = {"ok": False, "output": str(exc)[:MAX_OUTPUT]}
            return False
        data[key] = {"ok": rc == 0, "rc": rc, "output": (out + err).strip()[:MAX_OUTPUT]}
        return rc == 0

    async def _reset(self, pci: str, minor: int, me: int | None, data: dict[str, Any]) -> Result:
        """With this agent's holders released: prove the GPU idle once more, then reset it."""
        use = gpu_processes.scan(self.host)
        if holders := use.holders(minor):
            data["holders"] = [{"pid": pid, "comm": name} for pid, name in holders[:64]]
            failed = data.get("release_failed") or {}
            ours = ""
            if failed and any(pid == me for pid, _ in holders):
                ours = " (this agent could not let go: " + "; ".join(f"{k}: {v}" for k, v in failed.items()) + ")"
            return Result("failed", f"refusing to reset GPU {pci}: /dev/nvidia{minor} is still held by "
                                    f"{_holders_text(holders, me)}{ours}", data)
        argv = [self.nvidia_smi, "-r", "-i", pci]
        try:
            rc, out, err = await run_command(argv, timeout=self.config.timeout)
        except CommandError as exc:
            return Result("failed", f"GPU {pci}: {exc}", data)
        text = (out + ("\n" if out and err else "") + err).strip()
        data["output"] = text[:MAX_OUTPUT]
        data["rc"] = rc
        parsed = parse_reset_output(text)
        if rc == 0 and pci in parsed.reset:
            if pci not in gpu_processes.gpu_minors(self.host):
                return Result("failed", f"nvidia-smi reset GPU {pci} but the driver no longer lists it "
                                        "(/proc/driver/nvidia/gpus): the node needs a power cycle", data)
            return Result("executed", f"GPU {pci} was reset", data)
        if parsed.no_permission:
            why = "insufficient permissions (nvidia-smi -r needs root)"
        elif pci in parsed.refused:
            why = parsed.refused[pci] or "refused"
        elif parsed.in_use:
            why = "in use by another process or client (nvidia-smi refused)"
        elif rc == 0:
            why = "nvidia-smi exited 0 without saying the GPU was reset"
        else:
            why = f"nvidia-smi exited {rc}"
        return Result("failed", f"GPU {pci} was not reset: {why}", data)
