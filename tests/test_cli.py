from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sim.host import SimHost
from tests.conftest import AGENT_CMD, validate_message


def _check(host: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT_CMD, "check", "--host-root", str(host), "--node", "n1", *extra],
                          capture_output=True, text=True, timeout=60)


def test_check_healthy_node_exits_0(sim_host: SimHost) -> None:
    r = _check(sim_host.root, "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    not_seen = report.pop("not_seen")
    assert report.pop("unparsed") == []
    assert report == {"node": "n1", "status": "healthy", "conditions": [], "events": [], "skipped": [],
                      "hostnames": ["n1"]}  # the names its processes print: diagnose files relayed lines by them
    # a GPU node without HCAs, NCCL logs or libnvidia-ml here: each said, none of them the GPUs
    assert {n["source"] for n in not_seen} >= {"/sys/class/infiniband", "NVML", "/var/log/nccl/*.log"}
    assert not any(n["source"] in ("GPUs", "/sys/bus/pci/devices") for n in not_seen)


def test_check_missing_gpu_is_critical_exit_2(sim_host: SimHost) -> None:
    sim_host.remove_dev_node("nvidia2")
    r = _check(sim_host.root, "--format", "json")
    assert r.returncode == 2
    report = json.loads(r.stdout)
    assert report["status"] == "unhealthy"
    (cond,) = report["conditions"]
    validate_message(cond)
    assert cond["type"] == "GPUDevicesMissing" and cond["status"] == "firing"
    assert cond["details"]["device_node"] == "/dev/nvidia2" and cond["suggested_action"] == "cordon"
    text = _check(sim_host.root)
    assert text.returncode == 2 and "UNHEALTHY" in text.stdout and "GPUDevicesMissing" in text.stdout


def test_check_warning_only_exits_1(tmp_path: Path) -> None:
    # A third-party warning-level collector through an entry point
    from tests.conftest import python_env

    site = tmp_path / "site"
    site.mkdir()
    (site / "warn_plugin.py").write_text(
        "from gna_sdk import CollectorSettings\n"
        "class W:\n"
        "    config_type = CollectorSettings\n"
        "    def __init__(self, config, host, emit):\n"
        "        self.emit = emit\n"
        "    async def collect(self):\n"
        "        await self.emit.condition('CacheCold', firing=True, severity='warning', entity='x',\n"
        "                                  reason='Test', message='cold cache')\n")
    dist = site / "warn_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: warn-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gpu_node_agent.collectors]\nwarn_test = warn_plugin:W\n")
    host = SimHost.gpu_node(tmp_path / "host", gpus=2)
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, env=python_env(site), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["status"] == "degraded"
    assert [c["collector"] for c in report["conditions"]] == ["warn_test"]


def test_check_on_a_node_without_gpus_or_sysfs_says_what_it_did_not_see(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    r = _check(tmp_path / "bare", "--format", "json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["status"] == "healthy"
    sources = {n["source"]: n["reason"] for n in report["not_seen"]}
    assert "missing under the host root" in sources["/sys/bus/pci/devices"]
    assert "libnvidia-ml not loadable" in sources["NVML"]
    assert "/dev/kmsg" in sources and "/proc/modules" in sources
    text = _check(tmp_path / "bare")
    assert "[not seen] gpu_devices: /sys/bus/pci/devices" in text.stdout
    assert "no problems found in what could be seen" in text.stdout


def test_check_without_gpus_on_the_bus_says_so(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=0)
    report = json.loads(_check(host.root, "--format", "json").stdout)
    assert any(n["source"] == "GPUs" and "no NVIDIA GPU on the PCI bus" in n["reason"] for n in report["not_seen"])


def test_expected_gpus_not_met_is_critical(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=6)
    assert _check(host.root, "--expected-gpus", "6").returncode == 0
    r = _check(host.root, "--expected-gpus", "8", "--format", "json")
    assert r.returncode == 2, r.stdout + r.stderr
    missing = [c for c in json.loads(r.stdout)["conditions"] if c["type"] == "GPUDevicesMissing"]
    assert len(missing) == 2 and all(c["severity"] == "critical" and c["details"]["expected"] == 8 for c in missing)


def test_missing_host_root_exits_66_with_the_path(tmp_path: Path) -> None:
    for cmd in ("check", "run"):
        r = subprocess.run([*AGENT_CMD, cmd, "--host-root", str(tmp_path / "typo")], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 66, (cmd, r.stdout, r.stderr)
        assert str(tmp_path / "typo") in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_node_name_comes_from_the_host_root(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=1)
    host.write("/etc/hostname", "gpu-node-17\n")
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["node"] == "gpu-node-17"
    assert json.loads(_check(host.root, "--format", "json").stdout)["node"] == "n1", "--node wins"
    host.write("/etc/hostname", "<script>x</script>\n")  # not a hostname: this machine's name instead
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["node"] == socket.gethostname()


def test_every_option_says_what_it_does() -> None:
    from agent.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert walk(build_parser(), "gpu-node-agent") == []


def test_check_driver_not_loaded_after_kernel_upgrade(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=4, driver_loaded=False)
    r = _check(host.root, "--format", "json")
    assert r.returncode == 2
    types = sorted({(c["type"], c["entity"]) for c in json.loads(r.stdout)["conditions"]})
    assert ("NvidiaControlDeviceMissing", "dev:nvidiactl") in types
    assert sum(1 for t, _ in types if t == "GPUDevicesMissing") == 4


def test_check_text_counts_one_unparsed_line_in_the_singular() -> None:
    """Issue 22 item 8: "[unparsed] kmsg_xid: /dev/kmsg: 1 lines" said "lines" of one."""
    from agent.check import render_text
    from gna_sdk import plural

    report = {"node": "n1", "status": "healthy", "conditions": [], "events": [], "skipped": [], "not_seen": [],
              "unparsed": [{"collector": "kmsg_xid", "source": "/dev/kmsg", "count": 1, "sample": "x"},
                           {"collector": "nccl_logs", "source": "a.log", "count": 2, "sample": "y"}]}
    text = render_text(report)
    assert "/dev/kmsg: 1 line, e.g. 'x'" in text and "a.log: 2 lines, e.g. 'y'" in text
    assert [plural(0, "line"), plural(1, "process", "processes"), plural(3, "entry", "entries")] == [
        "0 lines", "1 process", "3 entries"]


def _parsers(parser: argparse.ArgumentParser, path: str = "gpu-node-agent"
             ) -> list[tuple[str, argparse.ArgumentParser]]:
    """The top-level parser and every command's, subcommands included (``config check``, ``budget status``)."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def _main(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    from agent.cli import main

    with pytest.raises(SystemExit) as ei:
        main(argv)
    out, err = capsys.readouterr()
    return int(ei.value.code or 0), out, err


def _commands() -> list[str]:
    from agent.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_every_command_says_what_it_does_its_defaults_and_its_exit_codes(capsys: Any) -> None:
    """Issue 22 item 9: run, cordoner, dashboard, top, demo, warmup ... had no description, no defaults and no
    exit codes in --help. Every command (and subcommand) has a paragraph, an "exit codes:" section that has
    64 (usage) among its codes, and every option that takes a value says its default (or is required)."""
    from agent.cli import build_parser

    parsers = _parsers(build_parser())
    assert len(parsers) >= 19, [p for p, _ in parsers]
    problems = []
    for path, parser in parsers:
        text = parser.format_help()
        if not (parser.description or "").strip():
            problems.append(f"{path}: no description")
        codes = text.partition("\nexit codes:\n")[2]
        if not codes:
            problems.append(f"{path}: no 'exit codes:' section")
        elif not re.search(r"^\s+64\s+\S", codes, re.M) or not re.search(r"^\s+0\s+\S", codes, re.M):
            problems.append(f"{path}: exit codes without 0 or 64:\n{codes}")
        for action in parser._actions:
            if (action.option_strings and action.nargs != 0 and not action.required
                    and "default" not in parser._get_formatter()._expand_help(action)):
                problems.append(f"{path} {'/'.join(action.option_strings)}: no default said")
    assert problems == []
    # what --help prints is that text: a node command and a command added by the fleet package
    for argv in (["run", "--help"], ["cordoner", "--help"], ["config", "check", "--help"]):
        rc, out, _ = _main(argv, capsys)
        assert rc == 0 and "exit codes:" in out and f"usage: gpu-node-agent {' '.join(argv[:-1])}" in out, argv


def test_an_unknown_option_prints_that_commands_usage_and_exits_64(capsys: Any) -> None:
    """Issue 22 item 9: `check --bogus` printed the top-level usage, and with only 5 of the commands."""
    for argv, usage in ((["check", "--bogus"], "check"), (["config", "check", "f.toml", "--bogus"], "config check"),
                        (["events", "--bogus"], "events"), (["budget", "status", "--bogus"], "budget status")):
        rc, out, err = _main(argv, capsys)
        assert rc == 64 and out == "", (argv, rc, out)
        assert err.startswith(f"usage: gpu-node-agent {usage} [-h]"), (argv, err)
        assert err.rstrip().endswith(f"gpu-node-agent {usage}: error: unrecognized arguments: --bogus"), (argv, err)
    r = subprocess.run([*AGENT_CMD, "check", "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and r.stderr.startswith("usage: gpu-node-agent check [-h]"), r.stderr


def test_the_top_level_usage_lists_every_command(capsys: Any) -> None:
    commands = _commands()
    assert {"run", "check", "config", "warmup", "topo", "events", "budget", "cordoner", "dashboard", "correlator",
            "diagnose", "top", "nats", "demo"} <= set(commands)
    for argv in ([], ["frobnicate"], ["--bogus", "run"], ["--bogus"]):
        rc, out, err = _main(argv, capsys)
        assert rc == 64, argv
        usage = " ".join(err.partition("gpu-node-agent: error:")[0].split())
        assert "{" + ",".join(commands) + "}" in usage, (argv, err)
    for argv in (["--help"], ["--help", "run"]):
        rc, out, err = _main(argv, capsys)
        assert rc == 0 and all(f"\n    {c} " in out for c in commands), (argv, out)


def test_every_option_a_help_names_is_an_option_of_that_command() -> None:
    """Issue 22 item 9: `cordoner --help` said "the embedded server of the agent in --state-dir", an option
    the cordoner rejects (it takes --nats or the config's nats.servers only). An option named in a command's
    help exists there (a command group's help may name its subcommands' options)."""
    from agent.cli import build_parser

    wrong = []
    for path, parser in _parsers(build_parser()):
        own = {s for _, p in _parsers(parser) for a in p._actions for s in a.option_strings}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", parser.format_help()))
        wrong += [f"{path}: {opt}" for opt in sorted(named - own)]
    assert wrong == []


def test_the_cordoner_help_and_behaviour_agree_on_state_dir(capsys: Any) -> None:
    rc, out, err = _main(["cordoner", "--help"], capsys)
    assert rc == 0 and "--state-dir" not in out and "state_dir" not in out
    assert "nats.servers" in out
    rc, out, err = _main(["cordoner", "--state-dir", "/var/lib/gpu-node-agent"], capsys)
    assert rc == 64 and err.startswith("usage: gpu-node-agent cordoner [-h]")


def test_the_readme_exit_codes_are_those_each_command_s_help_lists() -> None:
    """Issue 22 item 9: the README's exit code table and every command's --help say the same: each code a
    command's help lists is in the README's row for that code, naming the command, and back."""
    from agent.cli import build_parser
    from tests.conftest import ROOT

    leaves = {path.removeprefix("gpu-node-agent "): p for path, p in _parsers(build_parser())
              if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)}
    helped = {name: {int(c) for c in re.findall(r"^  (\d+)\s", p.format_help().partition("\nexit codes:\n")[2],
                                                re.M)} for name, p in leaves.items()}
    central = {"events", "top", "dashboard", "correlator", "cordoner", "budget status", "budget reset", "nats setup"}
    section = (ROOT / "README.md").read_text().partition("### Exit codes (sysexits)")[2].partition("\n\n\n")[0]
    said: dict[int, set[str]] = {}
    for code, sources in re.findall(r"^\| (\d+) \| .* \| (.*) \|$", section, re.M):
        names = set(leaves) if sources.strip() == "all" else set()
        for n in re.findall(r"`([^`]+)`", sources):
            names |= {leaf for leaf in leaves if leaf in (n, n.removesuffix(" --follow")) or leaf.startswith(n + " ")}
        if "the central commands" in sources:
            names |= central
        said[int(code)] = names
    assert set(said) >= {0, 1, 2, 64, 66, 69, 70, 71, 75, 78}, said
    missing = [f"{name} exits {c}: not in the README's row" for name, codes in helped.items() for c in sorted(codes)
               if name not in said.get(c, set())]
    untold = [f"README: {name} exits {c}: not in its --help" for c, names in said.items() for name in sorted(names)
              if c not in helped[name]]
    assert missing + untold == []
