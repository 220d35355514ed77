from __future__ import annotations

import argparse
import json
import socket
import subprocess
from pathlib import Path

from sim.host import SimHost
from tests.conftest import AGENT_CMD, validate_message


def _check(host: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT_CMD, "check", "--host-root", str(host), "--node", "n1", *extra],
                          capture_output=True, text=True, timeout=60)


def test_check_healthy_node_exits_0(sim_host: SimHost) -> None:
    r = _check(sim_host.root, "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    not_seen = report.pop("not_seen")
    assert report.pop("unparsed") == []
    assert report == {"node": "n1", "status": "healthy", "conditions": [], "events": [], "skipped": []}
    # a GPU node without HCAs, NCCL logs or libnvidia-ml here: each said, none of them the GPUs
    assert {n["source"] for n in not_seen} >= {"/sys/class/infiniband", "NVML", "/var/log/nccl/*.log"}
    assert not any(n["source"] in ("GPUs", "/sys/bus/pci/devices") for n in not_seen)


def test_check_missing_gpu_is_critical_exit_2(sim_host: SimHost) -> None:
    sim_host.remove_dev_node("nvidia2")
    r = _check(sim_host.root, "--format", "json")
    assert r.returncode == 2
    report = json.loads(r.stdout)
    assert report["status"] == "unhealthy"
    (cond,) = report["conditions"]
    validate_message(cond)
    assert cond["type"] == "GPUDevicesMissing" and cond["status"] == "firing"
    assert cond["details"]["device_node"] == "/dev/nvidia2" and cond["suggested_action"] == "cordon"
    text = _check(sim_host.root)
    assert text.returncode == 2 and "UNHEALTHY" in text.stdout and "GPUDevicesMissing" in text.stdout


def test_check_warning_only_exits_1(tmp_path: Path) -> None:
    # A third-party warning-level collector through an entry point
    from tests.conftest import python_env

    site = tmp_path / "site"
    site.mkdir()
    (site / "warn_plugin.py").write_text(
        "from gna_sdk import CollectorSettings\n"
        "class W:\n"
        "    config_type = CollectorSettings\n"
        "    def __init__(self, config, host, emit):\n"
        "        self.emit = emit\n"
        "    async def collect(self):\n"
        "        await self.emit.condition('CacheCold', firing=True, severity='warning', entity='x',\n"
        "                                  reason='Test', message='cold cache')\n")
    dist = site / "warn_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: warn-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gpu_node_agent.collectors]\nwarn_test = warn_plugin:W\n")
    host = SimHost.gpu_node(tmp_path / "host", gpus=2)
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, env=python_env(site), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["status"] == "degraded"
    assert [c["collector"] for c in report["conditions"]] == ["warn_test"]


def test_check_on_a_node_without_gpus_or_sysfs_says_what_it_did_not_see(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    r = _check(tmp_path / "bare", "--format", "json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["status"] == "healthy"
    sources = {n["source"]: n["reason"] for n in report["not_seen"]}
    assert "missing under the host root" in sources["/sys/bus/pci/devices"]
    assert "libnvidia-ml not loadable" in sources["NVML"]
    assert "/dev/kmsg" in sources and "/proc/modules" in sources
    text = _check(tmp_path / "bare")
    assert "[not seen] gpu_devices: /sys/bus/pci/devices" in text.stdout
    assert "no problems found in what could be seen" in text.stdout


def test_check_without_gpus_on_the_bus_says_so(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=0)
    report = json.loads(_check(host.root, "--format", "json").stdout)
    assert any(n["source"] == "GPUs" and "no NVIDIA GPU on the PCI bus" in n["reason"] for n in report["not_seen"])


def test_expected_gpus_not_met_is_critical(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=6)
    assert _check(host.root, "--expected-gpus", "6").returncode == 0
    r = _check(host.root, "--expected-gpus", "8", "--format", "json")
    assert r.returncode == 2, r.stdout + r.stderr
    missing = [c for c in json.loads(r.stdout)["conditions"] if c["type"] == "GPUDevicesMissing"]
    assert len(missing) == 2 and all(c["severity"] == "critical" and c["details"]["expected"] == 8 for c in missing)


def test_missing_host_root_exits_66_with_the_path(tmp_path: Path) -> None:
    for cmd in ("check", "run"):
        r = subprocess.run([*AGENT_CMD, cmd, "--host-root", str(tmp_path / "typo")], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 66, (cmd, r.stdout, r.stderr)
        assert str(tmp_path / "typo") in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_node_name_comes_from_the_host_root(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=1)
    host.write("/etc/hostname", "gpu-node-17\n")
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["node"] == "gpu-node-17"
    assert json.loads(_check(host.root, "--format", "json").stdout)["node"] == "n1", "--node wins"
    host.write("/etc/hostname", "<script>x</script>\n")  # not a hostname: this machine's name instead
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["node"] == socket.gethostname()


def test_every_option_says_what_it_does() -> None:
    from agent.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert walk(build_parser(), "gpu-node-agent") == []


def test_check_driver_not_loaded_after_kernel_upgrade(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=4, driver_loaded=False)
    r = _check(host.root, "--format", "json")
    assert r.returncode == 2
    types = sorted({(c["type"], c["entity"]) for c in json.loads(r.stdout)["conditions"]})
    assert ("NvidiaControlDeviceMissing", "dev:nvidiactl") in types
    assert sum(1 for t, _ in types if t == "GPUDevicesMissing") == 4


def test_check_text_counts_one_unparsed_line_in_the_singular() -> None:
    """Issue 22 item 8: "[unparsed] kmsg_xid: /dev/kmsg: 1 lines" said "lines" of one."""
    from agent.check import render_text
    from gna_sdk import plural

    report = {"node": "n1", "status": "healthy", "conditions": [], "events": [], "skipped": [], "not_seen": [],
              "unparsed": [{"collector": "kmsg_xid", "source": "/dev/kmsg", "count": 1, "sample": "x"},
                           {"collector": "nccl_logs", "source": "a.log", "count": 2, "sample": "y"}]}
    text = render_text(report)
    assert "/dev/kmsg: 1 line, e.g. 'x'" in text and "a.log: 2 lines, e.g. 'y'" in text
    assert [plural(0, "line"), plural(1, "process", "processes"), plural(3, "entry", "entries")] == [
        "0 lines", "1 process", "3 entries"]
