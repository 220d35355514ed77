"""sd_notify over a real datagram socket, the shipped unit through systemd-analyze, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.nats_server import NatsServerProcess
from agent.sdnotify import Notifier
from tests.conftest import AGENT_CMD, ROOT


def test_notifier_sends_to_a_real_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        srv.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
        assert n.watchdog_interval() == 1.5
        assert n.ready("up") and n.watchdog()
        assert srv.recv(1024) == b"READY=1\nSTATUS=up"
        assert srv.recv(1024) == b"WATCHDOG=1"
    assert not Notifier({}).ready()
    # WATCHDOG_PID for another process: not ours to ping
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100", "WATCHDOG_PID": "1"}).watchdog_interval() is None


def test_abstract_socket_address() -> None:
    name = f"gna-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind("\0" + name)
        srv.settimeout(2)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).stopping()
        assert srv.recv(64) == b"STOPPING=1"


def test_daemon_ready_watchdog_stopping(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    path = str(tmp_path / "notify.sock")
    (tmp_path / "h").mkdir()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(20)
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    proc = subprocess.Popen([*AGENT_CMD, "run", "--nats", nats_server.url, "--state-dir", str(tmp_path / "st"),
                             "--host-root", str(tmp_path / "h"), "--metrics-listen", ""],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        got: list[bytes] = []
        while sum(1 for g in got if g == b"WATCHDOG=1") < 3:
            got.append(srv.recv(1024))
        assert got[0].startswith(b"READY=1") or b"READY=1" in b"\n".join(got[:2])
        proc.send_signal(signal.SIGTERM)
        while not any(g.startswith(b"STOPPING=1") for g in got):
            got.append(srv.recv(1024))
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.close()


def test_sigterm_exits_0_within_bounded_time_even_without_nats(tmp_path: Path) -> None:
    # NATS configured but down: the agent spools, and SIGTERM still ends it promptly. Signalled once it said
    # READY (a fixed 2 s sleep signalled a start slowed by a loaded CI machine before its handlers were set:
    # killed by the signal, -15, which is what systemd would see too before READY)
    (tmp_path / "h").mkdir()
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        srv.settimeout(30)
        proc = subprocess.Popen([*AGENT_CMD, "run", "--nats", "nats://127.0.0.1:1", "--state-dir",
                                 str(tmp_path / "st"), "--host-root", str(tmp_path / "h"), "--metrics-listen", ""],
                                env={**os.environ, "NOTIFY_SOCKET": path}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            assert srv.recv(1024).startswith(b"READY=1")
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            assert time.monotonic() - t0 < 8
        finally:
            if proc.poll() is None:
                proc.kill()


def test_sighup_reloads_and_rejects_a_bad_config(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    cfg = tmp_path / "c.toml"
    (tmp_path / "h").mkdir()
    good = (f'state_dir = "{tmp_path / "st"}"\nhost_root = "{tmp_path / "h"}"\n'
            f'[nats]\nservers = ["{nats_server.url}"]\n[metrics]\nlisten = ""\n[log]\nformat = "json"\n')
    cfg.write_text(good)
    proc = subprocess.Popen([*AGENT_CMD, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None

    def wait_for(event: str) -> dict[str, object]:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if not line:
                break
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event:
                return rec  # type: ignore[no-any-return]
        raise AssertionError(f"no {event} log record")

    try:
        wait_for("agent_started")
        cfg.write_text(good + "[collectors.gpu_devices]\nintervl = 1\n")
        proc.send_signal(signal.SIGHUP)
        rec = wait_for("config_reload_rejected")
        assert "intervl" in str(rec["error"])
        cfg.write_text(good + "[collectors.gpu_devices]\nenabled = false\n")
        proc.send_signal(signal.SIGHUP)
        wait_for("collector_disabled")
        wait_for("config_reloaded")
        # #14: every section is applied or named with the reason it needs a restart, never kept silently
        cfg.write_text(good.replace('format = "json"', 'format = "json"\nlevel = "debug"')
                       .replace(f'servers = ["{nats_server.url}"]', 'servers = ["nats://127.0.0.1:1"]')
                       + '[spool]\nmax_bytes = 8388608\n[remediations]\nenforce = true\n')
        proc.send_signal(signal.SIGHUP)
        assert wait_for("remediation_ready")["enforce"] is True  # rebuilt before the reload is summed up
        rec = wait_for("config_reload_needs_restart")
        assert rec["sections"] == ["nats", "spool"] and "connection" in str(rec["reasons"])
        assert set(rec["applied"]) == {"log", "remediations"}  # type: ignore[arg-type]
        assert wait_for("config_reloaded")["applied"] == ["log", "remediations", "collectors"]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        assert rc == 0, proc.stderr.read()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def _systemd_analyze() -> str | None:
    return shutil.which("systemd-analyze")


@pytest.mark.skipif(_systemd_analyze() is None,
                    reason="systemd-analyze missing: Debian's systemd package provides it (.ci/run installs it)")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = (ROOT / "systemd" / "gpu-node-agent.service").read_text()
    # verify checks that ExecStart's binary exists: point it at the one installed here
    exe = shutil.which("gpu-node-agent") or str(Path(sys.executable).parent / "gpu-node-agent")
    assert "ExecStart=/usr/local/bin/gpu-node-agent run" in unit
    (tmp_path / "gpu-node-agent.service").write_text(unit.replace("/usr/local/bin/gpu-node-agent", exe))
    r = subprocess.run([_systemd_analyze() or "", "verify", str(tmp_path / "gpu-node-agent.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gpu-node-agent.service" not in r.stderr, r.stderr  # no warnings about our unit either
    for key in ("Type=notify", "WatchdogSec=", "Restart=always", "NoNewPrivileges=yes", "ProtectSystem=strict",
                "StateDirectory=gpu-node-agent", "CapabilityBoundingSet=", "LimitNOFILE="):
        assert key in unit
    bounding = next(line for line in unit.splitlines() if line.startswith("CapabilityBoundingSet="))
    assert "CAP_SYS_MODULE" not in bounding, "module loading only with the opt-in drop-in"
    dropin = (ROOT / "systemd" / "gpu-node-agent.service.d" / "enforce-modprobe.conf").read_text()
    assert "CapabilityBoundingSet=CAP_SYS_MODULE" in dropin
