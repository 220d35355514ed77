"""The README's first command: a simulated fleet of real agents, embedded NATS, the dashboard."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import AGENT_CMD


def test_fleet_demo_shows_every_scripted_fault(tmp_path: Path) -> None:
    # An empty PATH entry first and no host modprobe needed: each simulated node brings its own.
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": f"{tmp_path / 'no-bin'}{os.pathsep}/usr/bin:/bin"}
    r = subprocess.run([*AGENT_CMD, "demo", "--duration", "16", "--nodes", "6", "--port", "0"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for node, type_ in (("gpu-01", "GPUDevicesMissing"), ("gpu-02", "KernelModuleNotLoaded"),
                        ("gpu-03", "IBPortDown"), ("gpu-04", "NCCLSocketFallback"),
                        ("gpu-05", "JuiceFSCacheEphemeral"), ("gpu-06", "GPUFellOffBus")):
        assert any(node in line and type_ in line and "FIRING" in line for line in out.splitlines()), (node, type_)
    assert "ACTION  kubernetes     dry_run  would cordon" in out
    assert "ACTION  modprobe       dry_run  would load kernel module nvidia_peermem" in out
    assert "dashboard at http://127.0.0.1:" in out
    assert "6 agents exited with [0]" in out
    # the correlator runs in the demo: the job's stalled GPU is named, its other nodes are victims (issue 22)
    assert any("INCIDENT job 0x5eed0d3e0a1b2c3d OPEN: culprit gpu-06 gpu:0000:9a:00.0" in line
               for line in out.splitlines()), out[-3000:]
    assert not [line for line in out.splitlines() if "ACTION" in line and "failed" in line]
    assert "demo: removed " in out and not list(tmp_path.glob("gna-fleet-*")), "the demo left its directory behind"


def test_demo_without_nodes_is_a_usage_error_not_a_hang() -> None:
    r = subprocess.run([*AGENT_CMD, "demo", "--nodes", "0", "--duration", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 64 and "--nodes" in r.stderr, r.stderr


def test_a_cut_message_ends_at_a_word_with_an_ellipsis() -> None:
    """Issue 22 item 8: the console cut messages at 90 characters, mid-word and without "…"."""
    from sim.demo import MESSAGE_WIDTH, event_line

    long = ("nvidia_peermem is not loaded on a node with 8 GPUs and 8 RDMA HCAs: GPUDirect RDMA is off and NCCL "
            "stages every transfer through host memory.")
    m = {"node": "gpu-02", "severity": "critical", "status": "firing", "type": "KernelModuleNotLoaded",
         "entity": "module:nvidia_peermem", "message": long}
    line = event_line(m, 6.2)
    shown = line.split("module:nvidia_peermem", 1)[1].strip()
    assert shown.endswith("\u2026") and len(shown) <= MESSAGE_WIDTH
    assert long.startswith(shown[:-1]) and long[len(shown) - 1] == " ", "cut between two words"
    assert event_line({**m, "message": "short one"}, 1.0).endswith(" short one")
    assert "\x1b" not in event_line({**m, "node": "gpu\x1b[2J"}, 1.0), "wire text is shown as text"
