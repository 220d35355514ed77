"""TLS (mutual) and user/password against a real nats-server with a generated config."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import nats
import pytest

from agent.nats_link import auth_method, connect_options
from agent.nats_server import NatsServerProcess
from tests.conftest import agent_config, running_agent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make test certificates")

PASSWORD = "s3cr3t-Pa55-never-logged"


def _certs(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gna-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr")
        (d / f"{name}.ext").write_text(ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext")
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture
def tls_server(tmp_path: Path) -> tuple[NatsServerProcess, dict[str, Path]]:
    c = _certs(tmp_path / "pki")
    extra = (f'tls {{\n  cert_file: "{c["server.pem"]}"\n  key_file: "{c["server.key"]}"\n'
             f'  ca_file: "{c["ca.pem"]}"\n  verify: true\n}}\n'
             f'authorization {{\n  user: "agent"\n  password: "{PASSWORD}"\n}}\n')
    server = NatsServerProcess(tmp_path / "nats-tls", extra_config=extra)
    server.start()
    yield server, c  # type: ignore[misc]
    server.stop(kill=True)


async def test_agent_publishes_over_mutual_tls_with_password(tmp_path: Path,
                                                             tls_server: tuple[NatsServerProcess, dict[str, Path]],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    server, c = tls_server
    url = f"tls://127.0.0.1:{server.port}"
    cfg = agent_config(tmp_path, servers=[url])
    for key, value in (("tls_ca", c["ca.pem"]), ("tls_cert", c["client.pem"]), ("tls_key", c["client.key"])):
        setattr(cfg.agent.nats, key, str(value))
    cfg.agent.nats.user, cfg.agent.nats.password = "agent", PASSWORD
    assert auth_method(cfg.agent.nats) == "user_password"
    async with running_agent(cfg) as agent:
        assert agent.link is not None
        await asyncio.wait_for(agent.link.connected.wait(), 15)
        await agent.emitter_for("burst").event("BurstEvent", severity="warning", entity="tls", reason="T",
                                               message="over TLS")
        while agent.spool is not None and agent.spool.depth:
            await asyncio.sleep(0.05)
    ctx = ssl.create_default_context(cafile=str(c["ca.pem"]))
    ctx.load_cert_chain(str(c["client.pem"]), str(c["client.key"]))
    nc = await nats.connect(url, tls=ctx, user="agent", password=PASSWORD)
    sub = await nc.jetstream().pull_subscribe("gna.events.>", stream="GNA_EVENTS")
    (msg,) = await sub.fetch(1, timeout=5)
    assert json.loads(msg.data)["entity"] == "tls"
    await nc.close()
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err, "a secret reached the logs"


async def test_wrong_password_spools_and_never_logs_secret(tmp_path: Path,
                                                          tls_server: tuple[NatsServerProcess, dict[str, Path]],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    server, c = tls_server
    cfg = agent_config(tmp_path, servers=[f"tls://127.0.0.1:{server.port}"])
    n = cfg.agent.nats
    n.tls_ca, n.tls_cert, n.tls_key = str(c["ca.pem"]), str(c["client.pem"]), str(c["client.key"])
    n.user, n.password = "agent", "wrong-" + PASSWORD
    async with running_agent(cfg) as agent:
        assert await agent.emitter_for("burst").event("BurstEvent", severity="critical", entity="x", reason="T",
                                                      message="kept in the spool")
        await asyncio.sleep(3.0)
        assert agent.link is not None and not agent.link.connected.is_set()
        assert agent.spool is not None and agent.spool.depth == 1
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    assert "Authorization Violation" in out.out + out.err, "the auth failure itself is visible"


def test_connect_options_map_every_auth_method() -> None:
    from agent.config import NatsConfig

    assert connect_options(NatsConfig(creds="/etc/n.creds"), ["nats://a"], "x")["user_credentials"] == "/etc/n.creds"
    assert connect_options(NatsConfig(nkey_seed="/etc/seed"), ["nats://a"], "x")["nkeys_seed"] == "/etc/seed"
    assert connect_options(NatsConfig(token="t"), ["nats://a"], "x")["token"] == "t"
    opts = connect_options(NatsConfig(), ["nats://a", "nats://b"], "x")
    assert opts["max_reconnect_attempts"] == -1 and opts["servers"] == ["nats://a", "nats://b"] and "tls" not in opts


def test_credentials_in_a_url_never_reach_the_log_even_across_a_reconnect(tmp_path: Path) -> None:
    """#13 D12: user info in a NATS URL is redacted in every log line (connect, reconnect, errors)."""
    import signal
    import subprocess
    import time

    from agent.nats_server import NatsServerProcess
    from tests.conftest import AGENT_CMD

    secret = "s3cr3t-in-url"
    server = NatsServerProcess(tmp_path / "ns", extra_config=f'authorization {{\n  user: "u"\n  password: "{secret}"\n}}\n')
    server.start()
    (tmp_path / "h").mkdir()
    log = tmp_path / "agent.log"
    try:
        with open(log, "wb") as fh:
            proc = subprocess.Popen([*AGENT_CMD, "run", "--nats", f"nats://u:{secret}@127.0.0.1:{server.port}",
                                     "--state-dir", str(tmp_path / "st"), "--host-root", str(tmp_path / "h"),
                                     "--metrics-listen", ""], stdout=subprocess.DEVNULL, stderr=fh)
        deadline = time.monotonic() + 30
        while b"nats_connected" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        server.stop()
        server.start()
        while b"nats_reconnected" not in log.read_bytes():
            assert time.monotonic() < deadline + 30, log.read_text()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop(kill=True)
    text = log.read_text()
    assert "nats_reconnected" in text and secret not in text, [line for line in text.splitlines() if secret in line]
