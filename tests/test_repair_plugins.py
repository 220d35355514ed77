"""Repair plugins: GPU reset (refused while a process holds the GPU), reboot request (kured sentinel,
Node annotation/label, command hook) and break-fix hand-off (webhook, Kubernetes Event), each against
recording fakes: a fake nvidia-smi printing its real output forms, host-root trees with /proc, the fake
Kubernetes API and a loopback HTTP server."""

from __future__ import annotations

import json
import os
import re
import ssl
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.message import make_message, to_dict
from agent.remediation.engine import Engine
from agent.remediation.policy import Match, RemediationsConfig, Rule
from gna_sdk import CommandError, gpu_processes, gpu_release
from gna_sdk.hostroot import HostRoot
from gna_sdk.rootpath import resolve_in_root as resolve_under
from gna_types.entities import parse_pci
from remediations.breakfix import NOTE_LIMIT, BreakfixConfig, BreakfixRemediation, bounded_json, cut_utf8, event_message
from remediations.gpu_reset import GPUResetConfig, GPUResetRemediation, parse_reset_output
from remediations.reboot_request import (
    RebootRequestConfig,
    RebootRequestRemediation,
    qualified_name,
)
from tests.fake_kube import FakeKube

GPU0, GPU1 = "0000:3b:00.0", "0000:5d:00.0"

# The fake nvidia-smi: logs its argv, answers -r -i <pci> in the forms real drivers print (see the
# citations in remediations/gpu_reset.py), chosen by GNA_TEST_NVSMI.
FAKE_NVIDIA_SMI = r"""#!/usr/bin/env python3
import json, os, shutil, sys, time
with open(os.environ["GNA_TEST_ARGV_LOG"], "a") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
pci = sys.argv[sys.argv.index("-i") + 1]
dom, bus, rest = pci.split(":")
nvml = f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}"
mode = os.environ.get("GNA_TEST_NVSMI", "ok")
root = os.environ["GNA_TEST_HOST_ROOT"]
if "-pm" in sys.argv:
    # persistence mode through nvidia-persistenced: the daemon drops (0) or takes again (1) its fd on the
    # GPU; the texts are from real transcripts ("Disabled persistence mode for GPU 00000000:55:00.0." and
    # "Enabled persistence mode via daemon for GPU 00000000:55:00.0.", a public field report of a GPU reset
    # (a blog post in Korean, found through the code index); "All done." after it in several others)
    on = sys.argv[sys.argv.index("-pm") + 1] == "1"
    info = open(os.path.join(root, "proc/driver/nvidia/gpus", pci, "information")).read()
    minor = info.split("Device Minor:")[1].split()[0]
    if mode != "pm_noop":
        for pid in os.listdir(os.path.join(root, "proc")):
            fd = os.path.join(root, "proc", pid, "fd")
            comm = os.path.join(root, "proc", pid, "comm")
            if not pid.isdigit() or not os.path.exists(comm) or open(comm).read().strip() != "nvidia-persiste":
                continue
            link = os.path.join(fd, "nvidia" + minor)
            if on and not os.path.lexists(link):
                os.symlink("/dev/nvidia" + minor, link)
            elif not on:
                for n in os.listdir(fd):
                    if os.readlink(os.path.join(fd, n)) == "/dev/nvidia" + minor:
                        os.unlink(os.path.join(fd, n))
    print(f"Enabled persistence mode via daemon for GPU {nvml}." if on else f"Disabled persistence mode for GPU {nvml}.")
    print("All done.")
    sys.exit(0)
if mode in ("ok", "vanish"):
    print(f"GPU {nvml} was successfully reset.")
    print("All done.")
    if mode == "vanish":
        shutil.rmtree(os.path.join(root, "proc/driver/nvidia/gpus", pci))
elif mode == "busy":
    print("The following GPUs could not be reset:")
    print(f"  GPU {nvml}: In use by another client")
    print()
    print("1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
          "application, graphics application such as an X server, or a monitoring application such as another "
          "instance of nvidia-smi). Please first kill all processes using this device and all compute "
          "applications running in the system.")
    sys.exit(255)
elif mode == "busy_old":
    print(f"GPU {nvml} is currently in use by another process.")
    print()
    print("1 device is currently being used by one or more other processes (e.g., CUDA application, graphics "
          "application such as an X server, or a monitoring application such as another instance of "
          "nvidia-smi). Please first kill all processes using this device and all compute applications "
          "running in the system.")
    sys.exit(255)
elif mode == "silent":
    pass
elif mode == "hang":
    time.sleep(5)
"""


def _msg(type_: str = "GPUFatalXid", entity: str = f"gpu:{GPU0}", node: str = "gpu-01", msg_id: str | None = None,
         details: dict[str, Any] | None = None, message: str = "Xid 79: GPU has fallen off the bus") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector="kmsg_xid", kind="condition", type=type_, status="firing",
                                severity="critical", entity=entity, reason="Xid79", message=message,
                                details=details or {"xid": 79, "pci": GPU0}, msg_id=msg_id))


def _argv(log: Path) -> list[list[str]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


# -- host-root trees -----------------------------------------------------------------------------

def add_gpu(root: Path, pci: str, minor: int) -> None:
    """The driver's procfs entry for a GPU (kernel-open/nvidia/nv-procfs.c, "Device Minor:")."""
    d = root / "proc/driver/nvidia/gpus" / pci
    d.mkdir(parents=True)
    (d / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{minor:04d}\n"
                                   f"Bus Location: \t {pci}\nDevice Minor: \t {minor}\n")


def add_process(root: Path, pid: int, comm: str, *targets: str) -> None:
    """/proc/<pid>/comm and /proc/<pid>/fd/<n> -> target links (the link text is what the scan reads)."""
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    for n, target in enumerate(["/dev/null", *targets]):
        (d / "fd" / str(n)).symlink_to(target)


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    root = tmp_path / "host"
    add_gpu(root, GPU0, 0)
    add_gpu(root, GPU1, 1)
    add_process(root, 1, "systemd")
    return HostRoot(root)


@pytest.fixture
def nvsmi(tmp_path: Path, host: HostRoot, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "nvidia-smi", FAKE_NVIDIA_SMI)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GNA_TEST_ARGV_LOG", str(log))
    monkeypatch.setenv("GNA_TEST_HOST_ROOT", str(host.root))
    return log


# -- gpu_reset -----------------------------------------------------------------------------------

async def test_gpu_reset_runs_nvidia_smi_on_an_idle_gpu(host: HostRoot, nvsmi: Path) -> None:
    add_process(host.root, 300, "dcgm-exporter", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1")  # not GPU0
    plugin = GPUResetRemediation(GPUResetConfig(), host)
    assert plugin.plan(_msg(), {}) == (f"reset GPU {GPU0} (/dev/nvidia0) with nvidia-smi -r -i {GPU0}, "
                                       "if no process holds it")
    result = await plugin.execute(_msg(), {})
    assert result.outcome == "executed", result.detail
    assert _argv(nvsmi) == [["nvidia-smi", "-r", "-i", GPU0]]
    assert result.data["gpu"] == GPU0 and result.data["rc"] == 0
    assert result.data["output"] == "GPU 00000000:3B:00.0 was successfully reset.\nAll done."


@pytest.mark.parametrize("persistence_mode", ["release", "refuse"])
async def test_gpu_reset_is_refused_naming_the_processes_that_hold_the_gpu(host: HostRoot, nvsmi: Path,
                                                                           persistence_mode: str) -> None:
    add_process(host.root, 4242, "python3", "/dev/nvidiactl", "/dev/nvidia0")
    add_process(host.root, 77, "nvidia-persiste", "/dev/nvidia0", "/dev/nvidia1")
    result = await GPUResetRemediation(GPUResetConfig(persistence_mode=persistence_mode),  # type: ignore[arg-type]
                                       host).execute(_msg(), {})
    assert result.outcome == "failed"
    # persistence mode is only turned off when nothing else holds the GPU: the daemon is named only when it
    # is not to be asked
    held = "pid 77 (nvidia-persiste), pid 4242 (python3)" if persistence_mode == "refuse" else "pid 4242 (python3)"
    assert result.detail == f"refusing to reset GPU {GPU0}: /dev/nvidia0 is held by {held}"
    assert [h["pid"] for h in result.data["holders"]] == ([77, 4242] if persistence_mode == "refuse" else [4242])
    assert _argv(nvsmi) == []  # nothing ran


async def test_gpu_reset_turns_persistence_off_for_the_reset_and_on_again(host: HostRoot, nvsmi: Path) -> None:
    add_process(host.root, 77, "nvidia-persiste", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1")
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "executed", result.detail
    assert _argv(nvsmi) == [["nvidia-smi", "-pm", "0", "-i", GPU0], ["nvidia-smi", "-r", "-i", GPU0],
                            ["nvidia-smi", "-pm", "1", "-i", GPU0]]
    assert result.data["persistence_off"]["ok"] and result.data["persistence_on"]["ok"]
    assert 0 in gpu_processes.scan(host).by_minor  # the daemon holds the GPU again afterwards


async def test_gpu_reset_refused_when_persistence_off_did_not_release_the_gpu(
        host: HostRoot, nvsmi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi -pm 0 can exit 0 and change nothing (a field report: "The command claimed success, ...
    persistence mode: Enabled (unchanged)"): the re-scan decides, and persistence mode is set back anyway."""
    monkeypatch.setenv("GNA_TEST_NVSMI", "pm_noop")
    add_process(host.root, 77, "nvidia-persiste", "/dev/nvidia0")
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert result.detail == f"refusing to reset GPU {GPU0}: /dev/nvidia0 is still held by pid 77 (nvidia-persiste)"
    assert _argv(nvsmi) == [["nvidia-smi", "-pm", "0", "-i", GPU0], ["nvidia-smi", "-pm", "1", "-i", GPU0]]


@pytest.fixture
def release_registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """gna_sdk.gpu_release's holders, empty for the test (the registry is process-wide)."""
    holders: dict[str, Any] = {}
    monkeypatch.setattr(gpu_release, "_holders", holders)
    return holders


def _agent_holds(host: HostRoot, pid: int = 4242) -> Path:
    """This process as the tree numbers it: /proc/self -> <pid>, and <pid> holds GPU 0 (its NVML handle)."""
    add_process(host.root, pid, "gpu-node-agent", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1")
    (host.root / "proc/self").symlink_to(str(pid))
    return host.root / "proc" / str(pid) / "fd" / "2"  # the /dev/nvidia0 link


async def test_gpu_reset_releases_this_agents_own_hold_for_the_reset_and_resumes(
        host: HostRoot, nvsmi: Path, release_registry: dict[str, Any]) -> None:
    link = _agent_holds(host)
    steps: list[str] = []

    async def release(reason: str) -> None:
        steps.append(f"release: {reason}")
        link.unlink()  # as nvmlShutdown closes the device files

    async def resume(reason: str) -> None:
        steps.append(f"resume ({len(_argv(nvsmi))} nvidia-smi runs before)")
        link.symlink_to("/dev/nvidia0")

    gpu_release.register("nvml", release, resume)
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "executed", result.detail
    assert steps == [f"release: the reset of GPU {GPU0}", "resume (1 nvidia-smi runs before)"]
    assert result.data["released"] == ["nvml"] and "release_failed" not in result.data
    assert _argv(nvsmi) == [["nvidia-smi", "-r", "-i", GPU0]]
    assert not gpu_release.active()


async def test_gpu_reset_refused_when_this_agent_cannot_let_go(host: HostRoot, nvsmi: Path,
                                                               release_registry: dict[str, Any]) -> None:
    _agent_holds(host)
    resumed: list[str] = []

    async def release(reason: str) -> None:
        raise RuntimeError("NVML shutdown failed")

    async def resume(reason: str) -> None:
        resumed.append(reason)

    gpu_release.register("nvml", release, resume)
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert result.detail == (f"refusing to reset GPU {GPU0}: /dev/nvidia0 is still held by pid 4242 "
                             "(gpu-node-agent, this agent) (this agent could not let go: nvml: RuntimeError: "
                             "NVML shutdown failed)")
    assert resumed == [f"the reset of GPU {GPU0}"]  # resumed all the same: it may have let go of a part
    assert _argv(nvsmi) == []


async def test_gpu_reset_without_a_registered_holder_names_this_agent(host: HostRoot, nvsmi: Path,
                                                                      release_registry: dict[str, Any]) -> None:
    """A holder of the GPU in this process that did not register (NVML loaded by a collector that does not
    take part) is named as this agent, not reset under."""
    _agent_holds(host)
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert result.detail == f"refusing to reset GPU {GPU0}: /dev/nvidia0 is still held by pid 4242 (gpu-node-agent, this agent)"


async def test_gpu_reset_refusal_names_a_bounded_number_of_holders(host: HostRoot, nvsmi: Path) -> None:
    for pid in range(1000, 1020):
        add_process(host.root, pid, f"rank{pid - 1000}", "/dev/nvidia0")
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert result.detail.count("pid ") == 8 and result.detail.endswith("and 12 more processes")
    assert _argv(nvsmi) == []


async def test_gpu_reset_is_refused_when_a_process_cannot_be_read(host: HostRoot, nvsmi: Path) -> None:
    (host.root / "proc/555").mkdir()
    (host.root / "proc/555/fd").write_text("not a directory: listing it fails like EACCES would")
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert "cannot prove it idle (1 process could not be read" in result.detail
    assert _argv(nvsmi) == []


@pytest.mark.parametrize(("mode", "why"), [
    ("busy", "In use by another client"),
    ("busy_old", "in use by another process"),
    ("silent", "nvidia-smi exited 0 without saying the GPU was reset"),
])
async def test_gpu_reset_reports_nvidia_smis_refusal(host: HostRoot, nvsmi: Path, monkeypatch: pytest.MonkeyPatch,
                                                     mode: str, why: str) -> None:
    monkeypatch.setenv("GNA_TEST_NVSMI", mode)
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed"
    assert result.detail == f"GPU {GPU0} was not reset: {why}"
    assert result.data["rc"] == (0 if mode == "silent" else 255)
    assert len(result.data["output"]) <= 2000
    assert _argv(nvsmi) == [["nvidia-smi", "-r", "-i", GPU0]]


async def test_gpu_reset_fails_when_the_gpu_is_gone_afterwards(host: HostRoot, nvsmi: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNA_TEST_NVSMI", "vanish")
    result = await GPUResetRemediation(GPUResetConfig(), host).execute(_msg(), {})
    assert result.outcome == "failed" and "no longer lists it" in result.detail


async def test_gpu_reset_times_out(host: HostRoot, nvsmi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNA_TEST_NVSMI", "hang")
    result = await GPUResetRemediation(GPUResetConfig(timeout=0.3), host).execute(_msg(), {})
    assert result.outcome == "failed" and "timed out after 0.3s" in result.detail


async def test_gpu_reset_target_must_be_a_gpu_of_this_host(host: HostRoot, nvsmi: Path) -> None:
    plugin = GPUResetRemediation(GPUResetConfig(), host)
    with pytest.raises(ValueError, match="is not a GPU"):
        plugin.plan(_msg(entity="ib:mlx5_0/1"), {})
    with pytest.raises(ValueError, match="not one of this host's GPUs"):
        plugin.plan(_msg(entity="gpu:0000:99:00.0"), {})
    with pytest.raises(ValueError, match="not a PCI address"):
        plugin.plan(_msg(), {"gpu": "0; reboot"})
    assert "nvidia-smi -r -i 0000:5d:00.0" in plugin.plan(_msg(entity="ib:mlx5_0/1"), {"gpu": "00000000:5D:00.0"})
    failed = await plugin.execute(_msg(entity="gpu:0000:99:00.0"), {})
    assert failed.outcome == "failed" and _argv(nvsmi) == []


def test_gpu_reset_needs_nvidia_smi(host: HostRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    with pytest.raises(CommandError, match="nvidia-smi not found"):
        GPUResetRemediation(GPUResetConfig(), host)


async def test_gpu_reset_behind_the_engine_dry_run_then_cooldown(host: HostRoot, nvsmi: Path) -> None:
    records: list[dict[str, Any]] = []

    async def audit(r: dict[str, Any]) -> None:
        records.append(r)

    rule = Rule(name="reset-fallen-gpu", action="gpu_reset", match=Match(type=["GPUFatalXid"]))
    plugin = GPUResetRemediation(GPUResetConfig(), host)
    dry = Engine(RemediationsConfig(default_policy=False, rules=[rule]), {"gpu_reset": plugin}, audit=audit)
    await dry.handle(_msg())
    assert records[-1]["decision"] == "dry_run" and records[-1]["reason"].startswith(f"would reset GPU {GPU0}")
    assert _argv(nvsmi) == []
    live = Engine(RemediationsConfig(enforce=True, default_policy=False, rules=[rule]), {"gpu_reset": plugin},
                  audit=audit)
    await live.handle(_msg())
    await live.handle(_msg())
    assert [r["decision"] for r in records[1:]] == ["executed", "skipped"]
    assert records[1]["result"]["gpu"] == GPU0 and "cooldown" in records[2]["reason"]
    assert len(_argv(nvsmi)) == 1


_NVML_BUS = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000), st.lists(_NVML_BUS, max_size=4))
def test_reset_output_parser_never_raises_and_reads_every_reset_line(noise: str, buses: list[tuple[int, ...]]) -> None:
    lines = [f"GPU {d:08X}:{b:02X}:{v:02X}.{f} was successfully reset." for d, b, v, f in buses]
    parsed = parse_reset_output("\n".join([*lines, noise]))
    assert {f"{d:04x}:{b:02x}:{v:02x}.{f}" for d, b, v, f in buses} <= parsed.reset
    for pci in parsed.reset | set(parsed.refused):
        assert parse_pci(pci) == pci
    assert parsed.unparsed <= 200 and all(len(why) <= 200 for why in parsed.refused.values())


def test_reset_output_parser_forms() -> None:
    busy = parse_reset_output("The following GPUs could not be reset:\n  GPU 00000000:1A:00.0: In use by another "
                              "client\n\n1 device is currently being used by one or more other processes (...).")
    assert busy.refused == {"0000:1a:00.0": "In use by another client"} and busy.in_use and not busy.reset
    assert busy.unparsed == 0
    old = parse_reset_output("Unable to reset this GPU because it's being used by some other process (e.g. CUDA "
                             "application).\nTerminating early due to previous errors.")
    assert old.in_use and old.unparsed == 0
    # NVML's text for NVML_ERROR_NO_PERMISSION; the line around it is not sourced (see gpu_reset.py)
    assert parse_reset_output("Insufficient Permissions").no_permission
    assert parse_reset_output("x\n" * 100_000).unparsed == 200  # bounded


# -- reboot_request: sentinel --------------------------------------------------------------------

@pytest.fixture
def run_link_host(tmp_path: Path) -> HostRoot:
    """A host root whose /var/run is the usual absolute link to /run."""
    root = tmp_path / "node"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    return HostRoot(root)


async def test_sentinel_is_written_under_the_host_root_through_its_own_links(run_link_host: HostRoot) -> None:
    plugin = RebootRequestRemediation(RebootRequestConfig(), run_link_host)
    assert plugin.plan(_msg(msg_id="m-1"), {}).startswith("request a reboot: write kured's sentinel "
                                                          "/var/run/reboot-required")
    first = await plugin.execute(_msg(msg_id="m-1"), {})
    assert first.outcome == "executed", first.detail
    sentinel = run_link_host.root / "run/reboot-required"
    text = sentinel.read_text()
    assert re.fullmatch(rf"gpu-node-agent requests a reboot: GPUFatalXid on gpu:{GPU0} \(message m-1\) at "
                        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\n", text)
    assert sorted(p.name for p in (run_link_host.root / "run").iterdir()) == ["reboot-required"]  # no temp file
    again = await plugin.execute(_msg(msg_id="m-2"), {})
    assert again.outcome == "already_done" and sentinel.read_text() == text


async def test_sentinel_content_is_printable_and_bounded(run_link_host: HostRoot) -> None:
    evil = _msg(entity="gpu:\x1b[2J" + "A" * 5000)
    result = await RebootRequestRemediation(RebootRequestConfig(), run_link_host).execute(evil, {})
    assert result.outcome == "executed"
    text = (run_link_host.root / "run/reboot-required").read_text()
    assert "\x1b" not in text and len(text) < 600


async def test_sentinel_directory_missing_is_a_failure(tmp_path: Path) -> None:
    result = await RebootRequestRemediation(RebootRequestConfig(), HostRoot(tmp_path / "empty")).execute(_msg(), {})
    assert result.outcome == "failed" and result.detail.startswith("cannot write /var/run/reboot-required")


def test_resolve_under_never_leaves_the_root(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    (root / "a/up").symlink_to("../../../../..")
    (root / "a/loop").symlink_to("loop")
    assert resolve_under(root, "/a/up/etc") == root / "etc"
    assert resolve_under(root, "/../../a") == root / "a"
    with pytest.raises(OSError, match="too many symbolic links"):
        resolve_under(root, "/a/loop/x")


@pytest.mark.parametrize("settings_", [
    {"sentinel_path": "/etc/reboot-required"},
    {"sentinel_path": "/var/run/../etc/reboot-required"},
    {"sentinel_path": "var/run/reboot-required"},
    {"key": "not a key"},
    {"key": "Bad_Prefix/x"},
    {"method": "command"},
    {"method": "reboot-now"},
    {"surprise": 1},
])
def test_reboot_request_config_errors(settings_: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(settings_, RebootRequestConfig, strict=True)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_qualified_name_agrees_with_the_api_rule(key: str) -> None:
    ok = qualified_name(key)
    prefix, sep, name = key.rpartition("/")
    if ok:  # apimachinery IsQualifiedName: name part 1..63 of [-A-Za-z0-9_.], alphanumeric at both ends
        assert 1 <= len(name) <= 63 and name[0].isascii() and name[0].isalnum() and name[-1].isalnum()
        assert not sep or (0 < len(prefix) <= 253 and prefix == prefix.lower())


# -- reboot_request: annotation and label --------------------------------------------------------

@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube()
    # the same server, polled for shutdown every 50 ms instead of 500: teardown stays quick
    k.thread = threading.Thread(target=k.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    k.start()
    k.add_node("gpu-01")
    yield k
    k.stop()


async def test_reboot_annotation_on_the_node_once(kube: FakeKube, tmp_path: Path) -> None:
    kc = kube.kubeconfig(tmp_path / "kubeconfig")
    plugin = RebootRequestRemediation(RebootRequestConfig(method="annotation", kubeconfig=str(kc)), HostRoot(tmp_path))
    assert plugin.plan(_msg(), {}) == ("request a reboot: set the annotation gpu-node-agent/reboot-requested on "
                                       "Kubernetes node gpu-01")
    kube.conflicts_to_inject = 1  # someone else writes the Node between our GET and PATCH: re-read, retry
    result = await plugin.execute(_msg(msg_id="m-9"), {})
    assert result.outcome == "executed", result.detail
    assert kube.conflicts == 1
    ann = kube.nodes["gpu-01"]["metadata"]["annotations"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ann["gpu-node-agent/reboot-requested"])
    assert ann["gpu-node-agent/reboot-reason"] == f"GPUFatalXid on gpu:{GPU0} (message m-9)"
    assert [m for m, _, _ in kube.requests].count("PATCH") == 2
    again = await plugin.execute(_msg(), {})
    assert again.outcome == "already_done" and [m for m, _, _ in kube.requests].count("PATCH") == 2


async def test_reboot_label_value_is_a_valid_label_value(kube: FakeKube, tmp_path: Path) -> None:
    kc = kube.kubeconfig(tmp_path / "kubeconfig")
    cfg = RebootRequestConfig(method="annotation", kubeconfig=str(kc), as_label=True, key="example.com/reboot",
                              reason_key="")
    result = await RebootRequestRemediation(cfg, HostRoot(tmp_path)).execute(_msg(), {})
    assert result.outcome == "executed", result.detail
    meta = kube.nodes["gpu-01"]["metadata"]
    value = meta["labels"]["example.com/reboot"]
    assert len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value)
    assert "example.com/reboot" not in meta["annotations"] and "gpu-node-agent/reboot-reason" not in meta["annotations"]


async def test_reboot_annotation_forbidden_and_unknown_node(kube: FakeKube, tmp_path: Path) -> None:
    kc = kube.kubeconfig(tmp_path / "kc-no-rights", token="no-rights")
    denied = await RebootRequestRemediation(RebootRequestConfig(method="annotation", kubeconfig=str(kc)),
                                            HostRoot(tmp_path)).execute(_msg(), {})
    assert denied.outcome == "failed" and denied.detail.startswith("GET node gpu-01: 403")
    kc = kube.kubeconfig(tmp_path / "kc", token="agent-token")
    missing = await RebootRequestRemediation(RebootRequestConfig(method="annotation", kubeconfig=str(kc)),
                                             HostRoot(tmp_path)).execute(_msg(node="gpu-77"), {})
    assert missing.outcome == "failed" and missing.detail.startswith("GET node gpu-77: 404")


# -- reboot_request: command hook ----------------------------------------------------------------

HOOK = r"""#!/usr/bin/env python3
import json, os, sys
with open(os.environ["GNA_TEST_ARGV_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
if os.environ.get("GNA_TEST_HOOK_FAIL"):
    print("ticket system unreachable", file=sys.stderr)
    sys.exit(3)
print("reboot scheduled")
"""


async def test_reboot_command_hook_gets_node_and_type_as_separate_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _exe(tmp_path / "request-reboot", HOOK)
    log = tmp_path / "hook.log"
    monkeypatch.setenv("GNA_TEST_ARGV_LOG", str(log))
    cfg = RebootRequestConfig(method="command", command=[str(hook), "--via", "maintenance"])
    plugin = RebootRequestRemediation(cfg, HostRoot(tmp_path))
    assert plugin.plan(_msg(), {}) == f"request a reboot: run {hook} --via maintenance gpu-01 GPUFatalXid"
    result = await plugin.execute(_msg(), {})
    assert result.outcome == "executed" and result.data["stdout"] == "reboot scheduled"
    assert _argv(log) == [["--via", "maintenance", "gpu-01", "GPUFatalXid"]]
    with pytest.raises(ValueError, match="not a plain name"):
        plugin.plan(_msg(node="gpu-01;reboot"), {})
    with pytest.raises(ValueError, match="not a CamelCase name"):
        await plugin.execute({**_msg(), "type": "$(reboot)"}, {})
    assert len(_argv(log)) == 1
    monkeypatch.setenv("GNA_TEST_HOOK_FAIL", "1")
    failed = await plugin.execute(_msg(), {})
    assert failed.outcome == "failed" and failed.detail == "reboot hook exited 3: ticket system unreachable"


def test_reboot_command_hook_must_exist(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not found or not executable"):
        RebootRequestRemediation(RebootRequestConfig(method="command", command=[str(tmp_path / "nope")]),
                                 HostRoot(tmp_path))


# -- breakfix: webhook ---------------------------------------------------------------------------

class Hook:
    """A loopback HTTP endpoint recording each POST; ``status`` is its answer, ``hold`` stalls it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.status = 201
        self.hold = False
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.requests.append((self.path, dict(self.headers), body))
                if hook.hold:
                    hook.release.wait(5)
                    return
                answer = b'{"ticket": "INC-1"}'
                self.send_response(hook.status)
                if 300 <= hook.status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/incidents"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # loopback only, never through a proxy
    h = Hook()
    yield h
    h.stop()


async def test_webhook_posts_the_incident_once_per_message(hook: Hook, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    plugin = BreakfixRemediation(BreakfixConfig(url=hook.url, bearer_token_file=str(token)), HostRoot(tmp_path))
    msg = _msg(msg_id="01J-incident-1")
    result = await plugin.execute(msg, {})
    assert result.outcome == "executed", result.detail
    assert result.data["status"] == 201 and result.data["answer"] == '{"ticket": "INC-1"}'
    [(path, headers, body)] = hook.requests
    assert path == "/incidents" and headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert {k: doc[k] for k in ("source", "node", "type", "entity", "severity", "message", "message_id")} == {
        "source": "gpu-node-agent", "node": "gpu-01", "type": "GPUFatalXid", "entity": f"gpu:{GPU0}",
        "severity": "critical", "message": "Xid 79: GPU has fallen off the bus", "message_id": "01J-incident-1"}
    assert doc["details"] == {"xid": 79, "pci": GPU0}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["agent_time"])
    again = await plugin.execute(msg, {})
    assert again.outcome == "already_done" and len(hook.requests) == 1
    other = await plugin.execute(_msg(msg_id="01J-incident-2"), {})
    assert other.outcome == "executed" and len(hook.requests) == 2


async def test_webhook_bounds_the_evidence(hook: Hook, tmp_path: Path) -> None:
    plugin = BreakfixRemediation(BreakfixConfig(url=hook.url, max_details_bytes=1024), HostRoot(tmp_path))
    result = await plugin.execute(_msg(details={"log": "x" * 100_000}, message="m" * 10_000), {})
    assert result.outcome == "executed"
    body = hook.requests[0][2]
    doc = json.loads(body)
    assert doc["details"]["truncated"] is True and doc["details"]["size_bytes"] > 100_000
    assert len(doc["message"]) == 4096 and len(body) < 8192


async def test_webhook_non_2xx_fails_with_the_status_and_is_retried(hook: Hook, tmp_path: Path) -> None:
    plugin = BreakfixRemediation(BreakfixConfig(url=hook.url), HostRoot(tmp_path))
    hook.status = 500
    failed = await plugin.execute(_msg(msg_id="m-500"), {})
    assert failed.outcome == "failed" and failed.detail == f"POST {hook.url}: HTTP 500"
    assert failed.data["status"] == 500
    hook.status = 302  # a redirect is an answer, never a second POST elsewhere
    moved = await plugin.execute(_msg(msg_id="m-500"), {})
    assert moved.outcome == "failed" and moved.detail.endswith("HTTP 302")
    hook.status = 200
    ok = await plugin.execute(_msg(msg_id="m-500"), {})  # a failure is not remembered: the retry posts
    assert ok.outcome == "executed"
    assert [p for p, _, _ in hook.requests] == ["/incidents"] * 3


async def test_webhook_timeout(hook: Hook, tmp_path: Path) -> None:
    hook.hold = True
    plugin = BreakfixRemediation(BreakfixConfig(url=hook.url, timeout=0.3), HostRoot(tmp_path))
    result = await plugin.execute(_msg(), {})
    assert result.outcome == "failed" and result.detail == f"POST {hook.url}: timed out"


async def test_webhook_unreachable(tmp_path: Path) -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as s:
        port = s.server_address[1]  # a port nobody listens on once closed
    plugin = BreakfixRemediation(BreakfixConfig(url=f"http://127.0.0.1:{port}/x", timeout=2), HostRoot(tmp_path))
    result = await plugin.execute(_msg(), {})
    assert result.outcome == "failed" and "Connection refused" in result.detail


def test_webhook_plan_hides_credentials_and_tls_is_verified_by_default(tmp_path: Path) -> None:
    plugin = BreakfixRemediation(BreakfixConfig(url="https://svc:pw@tickets.example:8443/api/in?token=abc"),
                                 HostRoot(tmp_path))
    plan = plugin.plan(_msg(), {})
    assert plan == (f"hand the node to break-fix: POST the incident (GPUFatalXid on gpu:{GPU0}) to "
                    "https://tickets.example:8443/api/in")
    assert plugin._ssl.verify_mode == ssl.CERT_REQUIRED and plugin._ssl.check_hostname
    insecure = BreakfixRemediation(BreakfixConfig(url="https://x.example/", verify_tls=False), HostRoot(tmp_path))
    assert insecure._ssl.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize("settings_", [
    {},  # webhook without a url
    {"url": "ftp://tickets.example/in"},
    {"url": "https:///no-host"},
    {"url": "https://x.example", "max_details_bytes": 10},
    {"method": "email"},
])
def test_breakfix_config_errors(settings_: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(settings_, BreakfixConfig, strict=True)


# -- breakfix: Kubernetes Event ------------------------------------------------------------------

async def test_breakfix_event_on_the_node_bounded_and_once(kube: FakeKube, tmp_path: Path) -> None:
    kc = kube.kubeconfig(tmp_path / "kubeconfig")
    plugin = BreakfixRemediation(BreakfixConfig(method="event", kubeconfig=str(kc)), HostRoot(tmp_path))
    assert plugin.plan(_msg(), {}) == (f"hand the node to break-fix: record a Warning Event GPUNodeNeedsRepair "
                                       f"(GPUFatalXid on gpu:{GPU0}) on Node gpu-01 in namespace default")
    msg = _msg(msg_id="01J-ev-1", details={"xid": 79, "log": "é" * 5000})
    result = await plugin.execute(msg, {})
    assert result.outcome == "executed", result.detail
    [ev] = kube.events
    assert ev["reason"] == "GPUNodeNeedsRepair" and ev["type"] == "Warning"
    assert ev["involvedObject"] == {"kind": "Node", "name": "gpu-01", "apiVersion": "v1"}
    assert ev["metadata"]["namespace"] == "default"
    assert len(ev["message"].encode()) <= NOTE_LIMIT and ev["message"].endswith(" ...")
    assert ev["message"].startswith(f"GPUFatalXid on gpu:{GPU0} (critical): Xid 79: GPU has fallen off the bus "
                                    "[message 01J-ev-1] evidence: {")
    again = await plugin.execute(msg, {})
    assert again.outcome == "already_done" and len(kube.events) == 1
    with pytest.raises(ValueError, match="not a Kubernetes node name"):
        plugin.plan(_msg(node="GPU_01"), {})


async def test_breakfix_event_forbidden(kube: FakeKube, tmp_path: Path) -> None:
    kc = kube.kubeconfig(tmp_path / "kc", token="no-rights")
    plugin = BreakfixRemediation(BreakfixConfig(method="event", kubeconfig=str(kc)), HostRoot(tmp_path))
    result = await plugin.execute(_msg(msg_id="m-403"), {})
    assert result.outcome == "failed" and "403" in result.detail and kube.events == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=3000), st.integers(8, 2048),
       st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=50),
                    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=10), c, max_size=5),
                    max_leaves=30))
def test_bounds_hold_for_any_input(text: str, limit: int, details: Any) -> None:
    cut = cut_utf8(text, limit)
    assert len(cut.encode()) <= limit and (cut == text or cut.endswith(" ..."))
    bounded = bounded_json(details, 256)
    encoded = json.dumps(bounded, default=str, ensure_ascii=False)
    assert bounded == details or len(encoded.encode()) <= 256
    doc = {"type": text[:128], "entity": text, "severity": "critical", "message": text, "message_id": "x",
           "details": bounded}
    msg = event_message(doc)
    assert len(msg.encode()) <= NOTE_LIMIT and msg.isprintable()


def test_the_three_plugins_meet_the_remediation_contract() -> None:
    from gna_sdk import remediation_contract

    for cls in (GPUResetRemediation, RebootRequestRemediation, BreakfixRemediation):
        assert remediation_contract(cls) == [], cls
        assert cls.needs_budget is False
