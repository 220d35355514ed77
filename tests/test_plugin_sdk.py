"""The plugin SDK as a third party uses it (#14): the collector and the remediation printed in
docs/plugins.md are installed from that page as a distribution with entry points and run through
`config check`, `check` and an enforcing agent; a plugin that breaks the contract is exit 78 naming
the plugin and what it lacks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent.nats_server import NatsServerProcess
from gna_sdk import CollectorSettings, collector_contract, remediation_contract
from sim.host import SimHost
from tests.conftest import AGENT_CMD, ROOT, python_env, stream_messages

DOC = (ROOT / "docs" / "plugins.md").read_text()
BLOCKS = re.findall(r"```(python|toml)\n(.*?)```", DOC, re.S)


def _doc_files() -> dict[str, str]:
    files = {}
    for lang, code in BLOCKS:
        first = code.splitlines()[0]
        if lang == "python" and first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = code
    return files


def _doc_block(marker: str) -> str:
    (code,) = [c for lang, c in BLOCKS if lang == "toml" and c.startswith(marker)]
    return code


def _doc_toml(marker: str) -> dict[str, Any]:
    return tomllib.loads(_doc_block(marker))


def _install(site: Path, name: str, files: dict[str, str], entry_points: dict[str, dict[str, str]]) -> Path:
    site.mkdir(parents=True, exist_ok=True)
    for fname, code in files.items():
        (site / fname).write_text(code)
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()))
    return site


def _doc_site(tmp: Path) -> Path:
    eps = _doc_toml("# your pyproject.toml")["project"]["entry-points"]
    return _install(tmp / "site", "gna-example-plugins", _doc_files(), eps)


def _agent(args: list[str], site: Path, *, path: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = python_env(site)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([*AGENT_CMD, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _hot_host(tmp: Path) -> SimHost:
    host = SimHost.gpu_node(tmp / "host", gpus=1)
    host.write("/sys/class/nvme/nvme0/hwmon3/temp1_input", "71850\n")  # 71.85 °C
    host.write("/sys/class/nvme/nvme1/hwmon4/temp1_input", "38000\n")
    host.write("/sys/class/nvme/nvme2/hwmon5/temp1_input", "N/A\n")  # a sensor that reads garbage
    return host


def test_the_documented_plugins_are_complete_and_keep_the_contract() -> None:
    files = _doc_files()
    assert set(files) == {"gna_example_nvme.py", "gna_example_restart.py"}
    for fname, code in files.items():
        # a plugin imports the SDK and its own modules, nothing else of the agent
        assert not re.search(r"^(from|import) (agent|collectors|remediations)\b", code, re.M), fname
    ns: dict[str, Any] = {}
    exec(compile(files["gna_example_nvme.py"], "gna_example_nvme.py", "exec"), ns)
    exec(compile(files["gna_example_restart.py"], "gna_example_restart.py", "exec"), ns)
    assert collector_contract(ns["NvmeCollector"]) == []
    assert remediation_contract(ns["RestartUnit"]) == []


def test_config_check_and_check_run_the_documented_collector(tmp_path: Path) -> None:
    site = _doc_site(tmp_path)
    host = _hot_host(tmp_path)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'host_root = "{host.root}"\n' + _doc_block("# /etc/gpu-node-agent"))
    r = _agent(["config", "check", str(cfg)], site, path=str(tmp_path / "bin"))  # systemctl is not needed here
    assert r.returncode == 0, r.stderr
    r = _agent(["check", "--config", str(cfg), "--format", "json"], site)
    report = json.loads(r.stdout)
    hot = [c for c in report["conditions"] if c["type"] == "NvmeTooHot"]
    assert [(c["entity"], c["severity"], c["details"]["temp_c"]) for c in hot] == [("nvme:nvme0", "warning", 71.85)]
    assert r.returncode == 1  # a warning: degraded
    (garbage,) = [u for u in report["unparsed"] if u["collector"] == "nvme_health"]
    assert garbage["count"] == 1 and garbage["sample"] == "N/A"


async def test_an_enforcing_agent_runs_the_documented_remediation(tmp_path: Path,
                                                                  nats_server: NatsServerProcess) -> None:
    site = _doc_site(tmp_path)
    host = _hot_host(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.argv"
    fake = bindir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    user_cfg = _doc_block("# /etc/gpu-node-agent")
    user_cfg = user_cfg.replace("dry_run = true ", "dry_run = false")
    assert "dry_run = false" in user_cfg
    off = "".join(f"[collectors.{c}]\nenabled = false\n" for c in ("gpu_devices", "kernel_modules", "kmsg_xid",
                                                                     "nvml", "infiniband", "nccl_env", "nccl_logs",
                                                                     "juicefs"))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'node = "gpu-01"\nhost_root = "{host.root}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[nats]\nservers = ["{nats_server.url}"]\n[metrics]\nlisten = ""\n'
                   f'[remediations]\nenforce = true\ndefault_policy = false\n{off}'
                   + user_cfg.replace("max_temp_c = 65.0", "max_temp_c = 65.0\ninterval = 0.2\njitter = 0.0"))
    r = await asyncio.to_thread(_agent, ["run", "--config", str(cfg), "--duration", "3"], site,
                                path=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert log.read_text().splitlines() == ["restart nvme-fan.service"]  # once: the rule's cooldown holds
    msgs = await stream_messages(nats_server.url, "gna.>")
    assert any(m.get("type") == "NvmeTooHot" and m.get("status") == "firing" for m in msgs)
    (audit,) = [m for m in msgs if m.get("remediation") == "restart_unit"]
    assert (audit["decision"], audit["reason"]) == ("executed", "restart nvme-fan.service")  # the plan
    assert audit["result"]["detail"] == "nvme-fan.service restarted"


BROKEN_COLLECTOR = '''
class NoConfigType:                      # what the old docs allowed: no config_type, collect() not async
    def __init__(self, config, host, emit): ...
    def collect(self): ...
'''

OLD_CONTRACT_REMEDIATION = '''
class PageOncall:                        # the contract docs/plugins.md used to print
    name = "page_oncall"
    async def execute(self, message, args, *, dry_run):
        return "paged"
'''


@pytest.mark.parametrize(("kind", "config", "want"), [
    ("collector", "", ["collector plugin 'legacy'", "legacy_plugins:NoConfigType",
                       "missing class attribute config_type", "collect() must be async def"]),
    ("remediation", '[[remediations.rules]]\nname = "page"\naction = "page_oncall"\n'
                    '[remediations.rules.match]\ntype = ["GPUFellOffBus"]\n',
     ["remediation plugin 'page_oncall'", "missing class attribute config_type", "missing plan()",
      "execute() has required keyword-only argument(s) dry_run"]),
])
def test_a_plugin_that_breaks_the_contract_is_a_config_error(tmp_path: Path, kind: str, config: str,
                                                              want: list[str]) -> None:
    code = BROKEN_COLLECTOR if kind == "collector" else OLD_CONTRACT_REMEDIATION
    group = f"gpu_node_agent.{kind}s"
    ep = "legacy = legacy_plugins:NoConfigType" if kind == "collector" else "page_oncall = legacy_plugins:PageOncall"
    name, value = ep.split(" = ")
    site = _install(tmp_path / "site", "legacy-plugins", {"legacy_plugins.py": code}, {group: {name: value}})
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'host_root = "{tmp_path}"\n{config}')
    for args in (["config", "check", str(cfg)], ["check", "--config", str(cfg)]):
        r = _agent(args, site)
        assert r.returncode == 78, (args, r.returncode, r.stderr)
        for w in want:
            assert w in r.stderr, (w, r.stderr)
    if kind == "collector":  # the operator can switch it off and go on
        cfg.write_text(f'host_root = "{tmp_path}"\n[collectors.legacy]\nenabled = false\n')
        assert _agent(["config", "check", str(cfg)], site).returncode == 0
    else:  # installed but unused: not in the way
        cfg.write_text(f'host_root = "{tmp_path}"\n')
        assert _agent(["config", "check", str(cfg)], site).returncode == 0


def test_a_rule_whose_action_names_no_installed_plugin_is_a_config_error(tmp_path: Path) -> None:
    """Issue 22 item 6: the documented config with the action mistyped (``restart_unitt``) was "valid"
    (exit 0) and failed only at run time, audited as "cannot r: ...". Now ``config check`` says so like any
    other typo (file, line, the closest installed plugin) with 78, and the daemon refuses it at start."""
    site = _doc_site(tmp_path)
    host = _hot_host(tmp_path)
    user_cfg = _doc_block("# /etc/gpu-node-agent").replace('action = "restart_unit"', 'action = "restart_unitt"')
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'host_root = "{host.root}"\nstate_dir = "{tmp_path / "state"}"\n[metrics]\nlisten = ""\n'
                   + user_cfg)
    line = cfg.read_text().splitlines().index('action = "restart_unitt"') + 1
    for args in (["config", "check", str(cfg)], ["run", "--config", str(cfg), "--duration", "2"]):
        r = _agent(args, site)
        assert r.returncode == 78, (args, r.returncode, r.stderr[-2000:])
        assert f"{cfg}:{line}: " in r.stderr, r.stderr
        assert "'restart_unitt'" in r.stderr and "did you mean 'restart_unit'?" in r.stderr, r.stderr
        assert "agent_started" not in r.stderr and "Traceback" not in r.stderr


def test_every_builtin_plugin_keeps_the_contract() -> None:
    from importlib.metadata import entry_points

    for group, contract in (("gpu_node_agent.collectors", collector_contract),
                            ("gpu_node_agent.remediations", remediation_contract)):
        eps = list(entry_points(group=group))
        assert len(eps) >= 4
        for ep in eps:
            assert contract(ep.load()) == [], ep.value
    assert issubclass(CollectorSettings, object)
