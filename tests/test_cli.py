from __future__ import annotations

import json
import subprocess
from pathlib import Path

from agent.simhost import SimHost
from tests.conftest import AGENT_CMD, validate_message


def _check(host: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT_CMD, "check", "--host-root", str(host), "--node", "n1", *extra],
                          capture_output=True, text=True, timeout=60)


def test_check_healthy_node_exits_0(sim_host: SimHost) -> None:
    r = _check(sim_host.root, "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report == {"node": "n1", "status": "healthy", "conditions": [], "events": [], "skipped": []}


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
        "from agent.config import CollectorSettings\n"
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


def test_check_on_a_node_without_gpus_or_sysfs(tmp_path: Path) -> None:
    r = _check(tmp_path / "nothing-here", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "healthy"


def test_check_driver_not_loaded_after_kernel_upgrade(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=4, driver_loaded=False)
    r = _check(host.root, "--format", "json")
    assert r.returncode == 2
    types = sorted({(c["type"], c["entity"]) for c in json.loads(r.stdout)["conditions"]})
    assert ("NvidiaControlDeviceMissing", "dev:nvidiactl") in types
    assert sum(1 for t, _ in types if t == "GPUDevicesMissing") == 4
