from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.nats_server import NatsServerProcess
from collectors import gpu_devices as gd
from collectors.shared import gpu_inventory
from collectors.shared import nvml_lib as nvml_lib
from gna_sdk.hostroot import HostRoot
from gna_sdk.udev import UdevMonitor
from sim.host import SimHost
from tests.conftest import AGENT_CMD, Sink, agent_config, running_agent, stream_messages
from tests.fake_nvml import FakeGPU, FakeNVML

# Kernel uevents as the kernel sends them (captured property sets; values as on an HGX H100 node).
UEVENT_PCI_REMOVE = {"ACTION": "remove", "DEVPATH": "/devices/pci0000:17/0000:17:00.0/0000:18:00.0",
                     "SUBSYSTEM": "pci", "DRIVER": "nvidia", "PCI_CLASS": "30200", "PCI_ID": "10DE:2330",
                     "PCI_SUBSYS_ID": "10DE:16C1", "PCI_SLOT_NAME": "0000:18:00.0", "MODALIAS": "pci:v000010DE...",
                     "SEQNUM": "5120"}
UEVENT_AER_FAILED = {"ACTION": "change", "DEVPATH": "/devices/pci0000:17/0000:17:00.0/0000:18:00.0",
                     "SUBSYSTEM": "pci", "PCI_ID": "10DE:2330", "PCI_SLOT_NAME": "0000:18:00.0",
                     "ERROR_EVENT": "FAILED_RECOVERY", "DEVICE_ONLINE": "0", "SEQNUM": "5121"}
UEVENT_AER_OK = {**UEVENT_AER_FAILED, "ERROR_EVENT": "SUCCESSFUL_RECOVERY", "DEVICE_ONLINE": "1"}
UEVENT_MODULE_REMOVE = {"ACTION": "remove", "DEVPATH": "/module/nvidia_peermem", "SUBSYSTEM": "module",
                        "SEQNUM": "5122"}
UEVENT_NIC = {"ACTION": "remove", "DEVPATH": "/devices/pci0000:00/0000:00:1f.6", "SUBSYSTEM": "pci",
              "PCI_ID": "8086:15BB", "PCI_SLOT_NAME": "0000:00:1f.6"}
UEVENT_DEVNODE = {"ACTION": "add", "DEVPATH": "/devices/virtual/nvidia-caps/nvidia-cap1", "SUBSYSTEM": "nvidia-caps",
                  "DEVNAME": "nvidia-caps/nvidia-cap1", "MAJOR": "236", "MINOR": "1"}


def test_uevent_filter() -> None:
    assert gd.classify_uevent(UEVENT_PCI_REMOVE) == gd.Signal("pci_remove", bus_id="0000:18:00.0")
    aer = gd.classify_uevent(UEVENT_AER_FAILED)
    assert aer is not None and (aer.kind, aer.error_event, aer.device_online) == ("aer", "FAILED_RECOVERY", "0")
    assert gd.classify_uevent(UEVENT_MODULE_REMOVE) == gd.Signal("module_remove", module="nvidia_peermem")
    assert gd.classify_uevent(UEVENT_DEVNODE) == gd.Signal("devnode")
    assert gd.classify_uevent(UEVENT_NIC) is None
    assert gd.classify_uevent({"ACTION": "remove", "SUBSYSTEM": "module", "DEVPATH": "/module/ext4"}) is None
    assert gd.classify_uevent({}) is None


def _netlink_ok() -> bool:
    if shutil.which("ip") is None:
        return False
    r = subprocess.run(["ip", "link", "add", "gnachk0", "type", "bridge"], capture_output=True)
    subprocess.run(["ip", "link", "del", "gnachk0"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _netlink_ok(), reason="cannot create a bridge here (needs root/CAP_NET_ADMIN and iproute2)")
async def test_real_netlink_uevents_reach_the_asyncio_monitor() -> None:
    seen: list[dict[str, str]] = []
    mon = UdevMonitor(seen.append, subsystems=("net",), name="test")
    assert mon.start(), mon.error
    name = f"gnat{int(time.time() * 1000) % 100000}"
    try:
        await asyncio.to_thread(subprocess.run, ["ip", "link", "add", name, "type", "bridge"], check=True)
        await asyncio.to_thread(subprocess.run, ["ip", "link", "del", name], check=True)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                e.get("INTERFACE") == name and e["ACTION"] == "remove" for e in seen):
            await asyncio.sleep(0.01)
    finally:
        mon.close()
    actions = [e["ACTION"] for e in seen if e.get("INTERFACE") == name]
    assert actions[:1] == ["add"] and "remove" in actions




def _collector(host: SimHost, sink: Sink, state: Path | None = None, **cfg: object) -> gd.GPUDevicesCollector:
    em = CollectorEmitter("n", "gpu_devices", sink, ConditionTracker(None), facts=FactStore(), state_dir=state)
    return gd.GPUDevicesCollector(gd.GPUDevicesConfig(**{"nvml": False, **cfg}), HostRoot(host.root), em)  # type: ignore[arg-type]


async def test_gpu_removed_from_pci_bus_stays_expected(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=4)
    sink = Sink()
    c = _collector(host, sink, tmp_path / "st")
    await c.collect()
    (host.p("/sys/bus/pci/devices/0000:3a:00.0")).unlink()  # the GPU vanished from the bus
    await c.collect()
    assert [(m.type, m.entity, m.reason) for m in sink.messages] == [
        ("GPUDevicesMissing", "gpu:0000:3a:00.0", "RemovedFromPCIBus")]
    # a restart in the same boot still remembers it was there
    c2 = _collector(host, sink, tmp_path / "st")
    assert "0000:3a:00.0" in c2.seen.items


async def test_expected_count_catches_gpus_the_bus_never_showed(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=6)
    sink = Sink()
    c = _collector(host, sink, expected_count=8)
    await c.collect()
    assert sorted(m.entity for m in sink.messages) == ["gpu:nvidia6", "gpu:nvidia7"]
    assert all(m.reason == "GPUNotOnPCIBus" for m in sink.messages)


async def test_nvml_disagreement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    fake = FakeNVML([FakeGPU("00000000:18:00.0")])  # NVML lost track of 0000:2a:00.0
    monkeypatch.setattr(nvml_lib, "_state", {"lib": fake, "why": ""})
    monkeypatch.setattr(gd, "load_nvml", nvml_lib.load_nvml)
    sink = Sink()
    await _collector(host, sink, nvml=True).collect()
    assert [(m.entity, m.reason) for m in sink.messages] == [("gpu:0000:2a:00.0", "NotVisibleToNVML")]
    assert sink.messages[0].details["nvml"] == 1


async def test_aer_uevents_drive_a_condition(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    sink = Sink()
    c = _collector(host, sink)
    c._on_uevent(UEVENT_AER_FAILED)
    await c.collect()
    c._on_uevent(UEVENT_AER_OK)
    c.emit.begin_pass()  # type: ignore[attr-defined]  # as the framework does around every pass
    await c.collect()
    await c.emit.resolve_unasserted()  # type: ignore[attr-defined]
    assert [(m.type, m.status, m.severity) for m in sink.messages] == [
        ("GPUPCIeError", "firing", "critical"), ("GPUPCIeError", "resolved", "critical")]


async def test_inotify_detects_deletion_without_waiting_for_the_interval(tmp_path: Path,
                                                                        nats_server: NatsServerProcess) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root,
                       extra="[collectors.gpu_devices]\ninterval = 3600.0\njitter = 0.0\nudev = false\n")
    async with running_agent(cfg) as agent:
        await asyncio.sleep(0.5)  # first pass done
        t0 = time.monotonic()
        host.remove_dev_node("nvidia3")
        while not agent.tracker or not agent.tracker.active:  # type: ignore[truthy-function]
            await asyncio.sleep(0.002)
            assert time.monotonic() - t0 < 5, "inotify did not trigger a pass"
        host.add_dev_node("nvidia3")
        while agent.tracker.active:
            await asyncio.sleep(0.002)
            assert time.monotonic() - t0 < 10
        while agent.spool and agent.spool.depth:
            await asyncio.sleep(0.01)
    msgs = [m for m in await stream_messages(nats_server.url) if m["type"] == "GPUDevicesMissing"]
    assert [(m["entity"], m["status"]) for m in msgs] == [("gpu:0000:5d:00.0", "firing"),
                                                          ("gpu:0000:5d:00.0", "resolved")]


def test_restart_with_a_device_already_missing(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    host.remove_dev_node("nvidia6")
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    conds = [(c["type"], c["entity"]) for c in json.loads(r.stdout)["conditions"]]
    assert r.returncode == 2 and conds == [("GPUDevicesMissing", "gpu:0000:ba:00.0")]


async def test_without_udev_it_says_so_once_and_still_fires(tmp_path: Path, nats_server: NatsServerProcess,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    def no_netlink(self: UdevMonitor) -> bool:
        self.error = "PermissionError(1, 'Operation not permitted')"
        return False

    monkeypatch.setattr(UdevMonitor, "start", no_netlink)
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root,
                       extra="[collectors.gpu_devices]\ninterval = 3600.0\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        await asyncio.sleep(0.5)
        host.remove_dev_node("nvidia1")
        t0 = time.monotonic()
        while not agent.tracker or not agent.tracker.active:  # type: ignore[truthy-function]
            await asyncio.sleep(0.005)
            assert time.monotonic() - t0 < 5
    out = capsys.readouterr().out
    assert out.count("gpu_devices_udev_unavailable") == 1


# -- which bus entries are GPUs, remembered per entry (collectors/shared/gpu_inventory.py PciGpus) -----------
_FUNCS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")
_KINDS = {"gpu": ("0x10de", "0x030200"), "vga": ("0x10de", "0x030000"), "nvswitch": ("0x10de", "0x068000"),
          "nic": ("0x15b3", "0x020700"), "unreadable": (None, "0x030200")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "replace"]), st.sampled_from(_FUNCS),
                          st.sampled_from(sorted(_KINDS))), max_size=14))
def test_remembered_gpu_functions_agree_with_a_fresh_read_after_every_change(tmp_path_factory: pytest.TempPathFactory,
                                                                              ops: list[tuple[str, str, str]]) -> None:
    """The remembered answer equals reading every function's vendor and class afresh, after any sequence of
    functions added, removed and replaced by another device at the same bus id (as the kernel does: a new
    sysfs entry, so a new inode; created before the old one goes, so the file system cannot reuse its
    number), including a vendor that cannot be read (a directory where the file should be)."""
    root = tmp_path_factory.mktemp("bus")
    bus, devs = root / "bus", root / "devices"
    bus.mkdir()
    devs.mkdir()
    made = 0

    def new_function(kind: str) -> Path:
        nonlocal made
        made += 1
        d = devs / f"f{made}"
        d.mkdir()
        vendor, klass = _KINDS[kind]
        if vendor is None:
            (d / "vendor").mkdir()
        else:
            (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
        return d

    remembered = gpu_inventory.PciGpus()
    for op, bdf, kind in ops:
        link = bus / bdf
        if op == "remove":
            if link.is_symlink():
                link.unlink()
        elif op == "add" and not link.is_symlink():
            link.symlink_to(new_function(kind))
        else:
            tmp = bus / f".{bdf}"
            tmp.symlink_to(new_function(kind))
            tmp.rename(link)
        assert remembered.gpus(str(bus)) == gpu_inventory.PciGpus().gpus(str(bus))
    want = sorted(b for b in _FUNCS if (bus / b).is_symlink() and (bus / b / "class").read_text().startswith("0x03")
                  and (bus / b / "vendor").is_file() and (bus / b / "vendor").read_text() == "0x10de\n")
    assert remembered.gpus(str(bus)) == want


def test_remembered_gpu_functions_read_each_entry_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = SimHost.hgx_node(tmp_path / "host")
    base = str(HostRoot(host.root).path("/sys/bus/pci/devices"))
    reads: list[str] = []
    real = gpu_inventory.read_attr
    monkeypatch.setattr(gpu_inventory, "read_attr", lambda d, n, limit=4096: reads.append(n) or real(d, n, limit))
    remembered = gpu_inventory.PciGpus()
    first = remembered.gpus(base)
    assert len(first) == 8 and reads.count("vendor") == len(os.listdir(base))
    reads.clear()
    assert remembered.gpus(base) == first and reads == []  # nothing read again while the bus is unchanged
    os.unlink(f"{base}/{first[3]}")  # a GPU gone from the bus: the listing says so, nothing is read
    assert remembered.gpus(base) == first[:3] + first[4:] and reads == []
