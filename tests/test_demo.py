"""The README's first command: a real agent with an embedded nats-server on a simulated node."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import AGENT_CMD


def test_demo_shows_faults_firing_and_resolving(tmp_path: Path) -> None:
    r = subprocess.run([*AGENT_CMD, "demo", "--duration", "12", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    fired = [x for x in lines if "FIRING" in x]
    resolved = [x for x in lines if "RESOLVED" in x]
    assert any("GPUDevicesMissing" in x and "/dev/nvidia3" in x for x in fired), r.stdout
    assert any("NvidiaControlDeviceMissing" in x for x in fired), r.stdout
    assert len(resolved) == 2, r.stdout
    assert "agent exited with 0" in r.stdout
    # the embedded server ran from the agent's state dir and is gone with the agent
    assert (tmp_path / "state" / "nats.url").read_text().startswith("nats://127.0.0.1:")
    assert (tmp_path / "state" / "nats" / "jetstream").is_dir()
