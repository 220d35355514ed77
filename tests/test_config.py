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


def test_an_unknown_remediation_action_names_file_line_and_the_closest_plugin(tmp_path: Path) -> None:
    """Issue 22 item 6: a rule's action is a remediation plugin's name (or "cordon"): one that names no
    installed plugin is a config error like an unknown key, at the line of that rule's action."""
    rules = ('[remediations]\ncordon_with = "slurm"\n\n'
             '[[remediations.rules]]\nname = "drain"\naction = "cordon"\n[remediations.rules.match]\n'
             'type = ["GPULost"]\n\n'
             '[[remediations.rules]]\nname = "reload"\nargs = { module = "nvidia_peermem" }\naction = "modprob"\n'
             '[remediations.rules.match]\ntype = ["KernelModuleNotLoaded"]\n')
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.parse(rules, file="f.toml")
    err = ei.value
    assert (err.key, err.line) == ("remediations.rules.action", 13)
    assert str(err).startswith("f.toml:13: ") and "'modprob'" in str(err) and "did you mean 'modprobe'?" in str(err)
    # nothing close: the installed plugins are listed (and "cordon")
    with pytest.raises(configmod.ConfigError, match=r"'page_oncall'.*breakfix, drain, gpu_reset, juicefs_warmup, kubernetes, modprobe, reboot_request, slurm"):
        configmod.parse('[[remediations.rules]]\nname = "p"\naction = "page_oncall"\n[remediations.rules.match]\n')
    # inline rules: the line that names the action
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.parse('[remediations]\nrules = [\n  { name = "a", action = "slurm", match = {} },\n'
                        '  { name = "b", action = "slurn", match = {} },\n]\n', file="f.toml")
    assert ei.value.line == 4 and "did you mean 'slurm'?" in str(ei.value)
    # cordon_with names the plugin every "cordon" rule (the default policy's too) runs
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.parse('# x\n[remediations]\ncordon_with = "kubernets"\n', file="f.toml")
    assert (ei.value.key, ei.value.line) == ("remediations.cordon_with", 3)
    assert "did you mean 'kubernetes'?" in str(ei.value)
    configmod.parse('[remediations]\ncordon_with = "kubernets"\ndefault_policy = false\n')  # no rule uses it
    bad = tmp_path / "bad.toml"
    bad.write_text(rules)
    r = subprocess.run([*AGENT_CMD, "config", "check", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and f"{bad}:13: " in r.stderr and "did you mean 'modprobe'?" in r.stderr, r.stderr


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
