from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent import config as configmod
from tests.conftest import AGENT_CMD, ROOT

SHIPPED = sorted([*ROOT.glob("systemd/*.toml"), *ROOT.glob("examples/*.toml")])


def test_defaults_are_valid() -> None:
    cfg = configmod.parse("")
    assert cfg.agent.nats.stream == "GNA_EVENTS"
    assert cfg.agent.spool.policy == "drop_oldest_info_first"
    assert "gpu_devices" in cfg.collectors


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path: Path) -> None:
    configmod.load(path)
    r = subprocess.run([*AGENT_CMD, "config", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_shipped_configs_exist() -> None:
    assert any(p.name == "config.example.toml" for p in SHIPPED)


def test_demo_config_is_valid() -> None:
    from sim.demo import NODE_CONFIG

    cfg = configmod.parse(NODE_CONFIG.format(node="gpu-01", root="/h", state="/s", url="nats://127.0.0.1:1",
                                             modprobe="/h/usr/sbin/modprobe"))
    assert cfg.collectors["gpu_devices"].interval == 1.0 and cfg.agent.remediations.enforce is False
    assert cfg.agent.remediations.plugins["modprobe"] == {"modprobe": "/h/usr/sbin/modprobe"}


def test_typo_names_key_file_line_and_suggestion(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('node = "x"\n\n[collectors.gpu_devices]\nenabled = true\nintervl = 5\n')
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.load(f)
    err = ei.value
    assert err.key == "collectors.gpu_devices.intervl"
    assert err.line == 5
    assert str(f) in str(err) and "did you mean 'interval'" in str(err)


def test_typo_in_top_level_section(tmp_path: Path) -> None:
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.parse('[nats]\nserver = ["nats://x:4222"]\n', file="f.toml")
    assert ei.value.line == 2 and "did you mean 'servers'" in str(ei.value)
    with pytest.raises(configmod.ConfigError, match=r"unknown key 'spoool'.*did you mean 'spool'"):
        configmod.parse("[spoool]\nmax_bytes = 1\n")


def test_unknown_collector_and_wrong_types() -> None:
    with pytest.raises(configmod.ConfigError, match=r"unknown collector 'gpu_device'.*'gpu_devices'"):
        configmod.parse("[collectors.gpu_device]\ninterval = 5\n")
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.parse('[nats]\nheartbeat_interval = "often"\n', file="f.toml")
    assert ei.value.key == "nats.heartbeat_interval" and ei.value.line == 2
    with pytest.raises(configmod.ConfigError, match=r"spool\.policy"):
        configmod.parse('[spool]\npolicy = "drop_everything"\n')
    with pytest.raises(configmod.ConfigError, match="jitter"):
        configmod.parse("[collectors.gpu_devices]\njitter = 1.5\n")


def test_invalid_toml_is_a_config_error() -> None:
    with pytest.raises(configmod.ConfigError, match="not valid TOML"):
        configmod.parse("[nats\n")


def test_config_check_cli_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[log]\nlevle = 'info'\n")
    r = subprocess.run([*AGENT_CMD, "config", "check", str(bad)], capture_output=True, text=True)
    assert r.returncode == 78
    assert "log.levle" in r.stderr and "did you mean 'level'" in r.stderr and ":2:" in r.stderr
    # run and check refuse the same file with the same code
    for cmd in (["run", "--duration", "1"], ["check"]):
        r = subprocess.run([*AGENT_CMD, *cmd, "--config", str(bad)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 78, (cmd, r.stderr)
    r = subprocess.run([*AGENT_CMD, "config", "check", str(tmp_path / "missing.toml")], capture_output=True, text=True)
    assert r.returncode == 78 and "cannot read config" in r.stderr


def test_usage_error_is_64() -> None:
    r = subprocess.run([*AGENT_CMD, "check", "--format", "yaml"], capture_output=True, text=True)
    assert r.returncode == 64
    r = subprocess.run([*AGENT_CMD, "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 64
