"""#14: a node install carries only what the daemon uses; the rest comes with an extra.

The commands run as on a node without the extras: the optional libraries are made unimportable in
the child process (``sys.modules[name] = None``, what Python itself does for a blocked import), so
this proves the node side never needs them, and that a command that does says which extra to
install. bench/node_footprint.py measures real installs (size, RSS) in fresh virtual environments.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.nats_server import NatsServerProcess
from sim.host import SimHost

OPTIONAL = {"aiohttp": "fleet", "rich": "fleet", "lightkube": "kubernetes", "re2": "fast-scan",
            "hyperscan": "fast-scan"}

# What a node with no NCCL log and no hang never needs (imported on first use; ~1.7 MiB of RSS, docs/benchmarks.md):
# zoneinfo (its import loads sysconfig's build data), the RAS client and the Flight Recorder reader (a hang's).
IDLE_UNLOADED = {"zoneinfo", "collectors.nccl.ras_protocol", "collectors.nccl.flight_recorder"}

PRELUDE = f"""
import sys
for name in {sorted(OPTIONAL)!r}:
    sys.modules[name] = None
from agent.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] in {sorted(OPTIONAL)!r})
print("OPTIONAL-LOADED", loaded, file=sys.stderr)
central = sorted(m for m in sys.modules if m.split(".")[0] in ("fleet", "sim"))
print("CENTRAL-LOADED", central, file=sys.stderr)
idle = sorted(m for m in sys.modules if m.split(".")[0] in {sorted(IDLE_UNLOADED)!r} or m in {sorted(IDLE_UNLOADED)!r}
              or m.startswith("_sysconfigdata"))
print("IDLE-LOADED", idle, file=sys.stderr)
raise SystemExit(rc)
"""


def _node_side(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE, *args], capture_output=True, text=True,
                          timeout=timeout)


def test_check_runs_without_any_extra(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)
    logs = host.root / "var/log/nccl"
    logs.mkdir(parents=True, exist_ok=True)
    # a socket fallback: found by the pure-Python scanner as by Hyperscan/RE2
    (logs / "job.log").write_text("step 1 loss 2.0\nn1:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
                                  "n1:123:456 [0] NCCL INFO Using network Socket\n")
    r = _node_side("check", "--host-root", str(host.root), "--node", "n1", "--format", "json")
    assert r.returncode in (0, 1, 2), r.stderr
    report = json.loads(r.stdout)
    assert report["node"] == "n1"
    assert "OPTIONAL-LOADED []" in r.stderr
    assert "CENTRAL-LOADED []" in r.stderr  # the node side never imports the fleet side, not even its CLI
    assert any(c["type"].startswith("NCCL") for c in report["conditions"] + report["events"]), report


def test_daemon_runs_without_any_extra(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=2)
    r = _node_side("run", "--host-root", str(host.root), "--node", "n1", "--nats", nats_server.url,
                   "--state-dir", str(tmp_path / "state"), "--metrics-listen", "", "--duration", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"agent_started"' in r.stderr or "agent_started" in r.stderr
    assert "OPTIONAL-LOADED []" in r.stderr and "CENTRAL-LOADED []" in r.stderr
    assert "IDLE-LOADED []" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(("command", "extra"), [
    (["dashboard", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0"], "fleet"),
    (["top", "--once", "--nats", "nats://127.0.0.1:1"], "fleet"),
])
def test_a_central_command_names_the_extra_it_needs(command: list[str], extra: str) -> None:
    r = _node_side(*command)
    assert r.returncode == 69, r.stderr
    assert f"gpu-node-agent[{extra}]" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_kubernetes_plugin_says_it_needs_its_extra(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[remediations]\ncordon_with = "kubernetes"\n[remediations.plugins.kubernetes]\n')
    code = ("import sys; sys.modules['lightkube'] = None\n"
            "from agent import config\nfrom agent.remediation.loader import load_plugins\n"
            "from gna_sdk.hostroot import HostRoot\n"
            f"c = config.load({str(cfg)!r}).agent\n"
            "print(load_plugins(c.remediations, HostRoot('/')).unavailable.get('kubernetes'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gpu-node-agent[kubernetes]" in r.stdout, r.stdout + r.stderr
