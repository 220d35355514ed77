"""``gpu-node-agent demo``: a real agent with embedded NATS on a simulated GPU node, scripted faults,
and the messages shown as they arrive through ``gpu-node-agent events``. Ends by itself."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.simhost import SimHost

DEMO_CONFIG = """\
# Demo config: fast intervals so faults show within a second.
node = "demo-gpu-01"

[metrics]
listen = "127.0.0.1:0"

[nats]
heartbeat_interval = 2.0

[collectors.gpu_devices]
interval = 0.5
jitter = 0.0
expected_count = 8
"""


def _pump(stream: object, started: float) -> None:
    for raw in stream:  # type: ignore[attr-defined]
        try:
            m = json.loads(raw)
        except ValueError:
            continue
        state = (m.get("status") or "event").upper()
        print(f"  +{time.monotonic() - started:5.1f}s  {m['severity']:<8} {state:<8} {m['type']:<28} "
              f"{m['entity']:<24} {m['message']}", flush=True)


def run_demo(duration: float = 20.0, workdir: str | None = None) -> int:
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gna-demo-"))
    host_dir, state_dir = base / "host", base / "state"
    if host_dir.exists():
        shutil.rmtree(host_dir)
    host = SimHost.gpu_node(host_dir, gpus=8)
    cfg = base / "config.toml"
    cfg.write_text(DEMO_CONFIG)
    print(f"demo: simulated 8-GPU node in {host_dir}, agent state in {state_dir}", flush=True)
    agent = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg),
                              "--host-root", str(host_dir), "--state-dir", str(state_dir)],
                             stdout=subprocess.DEVNULL, stderr=open(base / "agent.log", "w"))  # noqa: SIM115
    started = time.monotonic()
    url_file = state_dir / "nats.url"
    while not url_file.exists() and agent.poll() is None and time.monotonic() - started < 20:
        time.sleep(0.05)
    if agent.poll() is not None or not url_file.exists():
        print(f"demo: the agent did not start; see {base / 'agent.log'}", file=sys.stderr)
        return 1
    print(f"demo: agent pid {agent.pid}, embedded NATS at {url_file.read_text().strip()}", flush=True)
    print("demo: following `gpu-node-agent events --all` (JSON lines, summarised here):", flush=True)
    events = subprocess.Popen([sys.executable, "-m", "agent", "events", "--state-dir", str(state_dir), "--all",
                               "--duration", str(duration + 2)], stdout=subprocess.PIPE, text=True)
    reader = threading.Thread(target=_pump, args=(events.stdout, started), daemon=True)
    reader.start()
    def repair() -> None:
        host.add_dev_node("nvidia3")
        host.add_dev_node("nvidiactl")

    script: list[tuple[float, str, Callable[[], object]]] = [
        (3.0, "fault: /dev/nvidia3 vanishes (driver/kernel mismatch after an upgrade)",
         lambda: host.remove_dev_node("nvidia3")),
        (6.0, "fault: /dev/nvidiactl vanishes", lambda: host.remove_dev_node("nvidiactl")),
        (10.0, "repair: device nodes recreated (nvidia-modprobe)", repair),
    ]
    try:
        for at, text, action in script:
            if at >= duration:
                break
            time.sleep(max(0.0, started + at - time.monotonic()))
            print(f"  +{time.monotonic() - started:5.1f}s  ** {text}", flush=True)
            action()
        time.sleep(max(0.0, started + duration - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        time.sleep(0.5)  # let the last messages reach the events reader
        events.send_signal(signal.SIGTERM)
        events.wait(5)
        reader.join(2)
        agent.send_signal(signal.SIGTERM)
        rc = agent.wait(15)
    print(f"demo: agent exited with {rc}; logs in {base / 'agent.log'}", flush=True)
    return 0 if rc == 0 else 1
