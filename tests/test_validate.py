"""``gpu-node-agent validate`` and ``run_validation``: levels, thresholds, skips, refusals and the CLI, with
recording fakes of each tool (tests/fakes/validate/) alone on PATH and simulated host roots."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent import config as configmod
from agent.cli import main
from agent.validate import NODE_VALIDATION
from agent.validate.checks import CHECKS, run_tool, run_validation
from gna_sdk.hostroot import HostRoot
from gna_types.validation import ValidationReport, decode
from sim.host import H200_SXM, SimHost

FAKES = Path(__file__).parent / "fakes" / "validate"
TOOLS = ("all_reduce_perf", "nvbandwidth", "dcgmi", "ib_write_bw")
FAST = """
[validate]
server_start_delay = 0.05
[validate.timeouts]
nccl_allreduce = 10
nvbandwidth = 10
dcgm_diag = 10
ib_write_bw = 10
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A bin directory holding the chosen fakes and python3 (their interpreter), alone on PATH; returns a
    function taking the tools to install and giving the argv log's entries."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("FAKE_VALIDATE_LOG", str(log))

    class Tools:
        def install(self, *names: str) -> None:
            for name in names or TOOLS:
                (bindir / name).symlink_to(FAKES / name)

        def calls(self, tool: str | None = None) -> list[list[str]]:
            if not log.exists():
                return []
            rows = [json.loads(line) for line in log.read_text().splitlines()]
            return [r["argv"] for r in rows if tool is None or r["tool"] == tool]

    t = Tools()
    return t


@pytest.fixture
def node(tmp_path: Path) -> SimHost:
    return SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)


def agent_cfg(extra: str = "", base: str = FAST) -> configmod.AgentConfig:
    return configmod.parse(base + extra, file="<test>").agent


async def validate(host: SimHost, level: str = "standard", extra: str = "", base: str = FAST,
                   **kw: Any) -> ValidationReport:
    kw.setdefault("skip", ("passive",))
    return await run_validation(agent_cfg(extra, base), HostRoot(host.root), level, node="node-0001", **kw)


async def test_standard_passes_on_a_healthy_h100_node(tools: Any, node: SimHost) -> None:
    tools.install()
    report = await validate(node)
    assert report.verdict == "passed", report.reason
    assert report.sku == "nd_h100_v5" and report.gpu_count == 8
    by = {c.name: c for c in report.checks}
    assert [c.status for c in report.checks] == ["skipped", "passed", "passed", "passed", "passed"]
    nccl = by["nccl_allreduce"]
    assert nccl.thresholds == {"busbw": 460.0} and nccl.figures["wrong"] == 0
    assert 480.0 <= nccl.figures["busbw"] <= 480.2  # busbw (not algbw 274) of the 16 GiB row
    assert "nd96isr_h100_v5.conf" in nccl.sources["busbw"]
    assert nccl.argv[1:] == ["-b", "16G", "-e", "16G", "-f", "2", "-g", "8", "-c", "1"]
    nvb = by["nvbandwidth"]
    assert nvb.thresholds == {"h2d": 48.0, "d2h": 48.0, "p2p": 335.0}
    assert len([k for k in nvb.figures if k.startswith("p2p:")]) == 56  # 8 x 7 pairs, the diagonal N/A
    assert by["dcgm_diag"].argv[1:] == ["diag", "-r", "2", "-j"] and by["dcgm_diag"].figures["failed"] == 0
    ib = by["ib_write_bw"]
    assert ib.figures == {"mlx5_0:1": 392.51, "mlx5_1:1": 392.51} and ib.thresholds["mlx5_0:1"] == 380.0
    # the loopback: a server and a client ("localhost") per HCA, each with its own port and GPU
    ib_calls = tools.calls("ib_write_bw")
    assert len(ib_calls) == 4 and sum(1 for a in ib_calls if a[-1] == "localhost") == 2
    assert {a[a.index("-p") + 1] for a in ib_calls} == {"18515", "18516"}
    assert {a for c in ib_calls for a in c if a.startswith("--use_cuda=")} == {"--use_cuda=0", "--use_cuda=1"}
    assert report.started <= report.ended
    assert decode(msgspec.json.encode(report)) == report  # within every bound of the wire type
    assert decode(report.to_details()) == report and NODE_VALIDATION == "NodeValidation"


@pytest.mark.parametrize(("env", "mode", "check", "words"), [
    ("FAKE_ALL_REDUCE_PERF_MODE", "low", "nccl_allreduce", "busbw 150.2 GB/s at 17179869184 B < 460 GB/s"),
    ("FAKE_ALL_REDUCE_PERF_MODE", "wrong", "nccl_allreduce", "#wrong 6 (data corruption"),
    ("FAKE_ALL_REDUCE_PERF_MODE", "nccl_error", "nccl_allreduce", "Test NCCL failure"),
    ("FAKE_ALL_REDUCE_PERF_MODE", "exit", "nccl_allreduce", "exit status 2"),
    ("FAKE_ALL_REDUCE_PERF_MODE", "hang", "nccl_allreduce", "ran past its 0.3s timeout (killed)"),
    ("FAKE_NVBANDWIDTH_MODE", "low_p2p", "nvbandwidth", "p2p:1-2 120.0 < 335 GB/s"),
    ("FAKE_NVBANDWIDTH_MODE", "low_h2d", "nvbandwidth", "h2d:3 21.0 < 48 GB/s"),
    ("FAKE_NVBANDWIDTH_MODE", "error", "nvbandwidth", "device_to_device_memcpy_read_ce: Error: cuMemcpyAsync"),
    ("FAKE_DCGMI_MODE", "fail", "dcgm_diag", "Hardware/memory: fail (GPU 2: A memory mismatch"),
    ("FAKE_DCGMI_MODE", "fail3", "dcgm_diag", "Hardware/memory: fail (GPU 2: A memory mismatch"),
    ("FAKE_DCGMI_MODE", "garbage", "dcgm_diag", "no JSON object in the output (exit status 1: Error: unable"),
    ("FAKE_IB_WRITE_BW_MODE", "low", "ib_write_bw", "mlx5_0:1: 97.3 < 380 Gb/s"),
    ("FAKE_IB_WRITE_BW_MODE", "connect_fail", "ib_write_bw", "mlx5_0:1: Couldn't connect to localhost:18515"),
    ("FAKE_IB_WRITE_BW_MODE", "no_device", "ib_write_bw", "Couldn't get context for the device (exit status 1)"),
])
async def test_each_failing_form_fails_with_its_reason(tools: Any, node: SimHost, monkeypatch: pytest.MonkeyPatch,
                                                       env: str, mode: str, check: str, words: str) -> None:
    tools.install()
    monkeypatch.setenv(env, mode)
    report = await validate(node, base=FAST.replace("nccl_allreduce = 10", "nccl_allreduce = 0.3"),
                            skip=[c for c in CHECKS if c != check])  # the others: test_standard_passes_...
    result = report.check(check)
    assert result is not None and result.status == "failed", result
    assert words in result.reason, result.reason
    assert report.verdict == "failed" and report.reason.startswith(f"{check}: ")


async def test_a_hung_tool_is_killed_with_its_process_group(tools: Any, node: SimHost) -> None:
    os.environ["FAKE_ALL_REDUCE_PERF_MODE"] = "hang"
    try:
        tools.install("all_reduce_perf")
        result = await run_tool([str(FAKES / "all_reduce_perf"), "-g", "2"], timeout=0.5, limit=4096)
    finally:
        del os.environ["FAKE_ALL_REDUCE_PERF_MODE"]
    assert result.timed_out and result.rc is None and result.seconds < 5
    assert "# nThread 1 nGpus 2" in result.out  # what it printed before hanging is kept


async def test_absent_tools_are_skipped_with_the_reason(tools: Any, node: SimHost) -> None:
    tools.install("all_reduce_perf")
    report = await validate(node)
    by = {c.name: c for c in report.checks}
    assert by["nccl_allreduce"].status == "passed"
    for name, tool in (("nvbandwidth", "nvbandwidth"), ("dcgm_diag", "dcgmi"), ("ib_write_bw", "ib_write_bw")):
        assert by[name].status == "skipped"
        assert by[name].reason == f"{tool} not found on PATH (set validate.tools.{tool})"
    assert report.verdict == "passed" and "skipped: passive, nvbandwidth, dcgm_diag, ib_write_bw" in report.reason
    assert tools.calls("dcgmi") == []


def test_nothing_to_run_is_unavailable_and_exit_69(tools: Any, node: SimHost, capsys: Any) -> None:
    report = asyncio.run(validate(node))
    assert report.verdict == "unavailable" and all(c.status == "skipped" for c in report.checks)
    rc = main(["validate", "--host-root", str(node.root), "--skip", "passive", "--level", "standard"])
    assert rc == 69
    assert "UNAVAILABLE" in capsys.readouterr().out


async def test_busy_gpus_refuse_unless_forced(tools: Any, node: SimHost) -> None:
    tools.install()
    fd = node.p("/proc/31337/fd")
    fd.mkdir(parents=True)
    (fd / "3").symlink_to("/dev/nvidia0")
    node.write("/proc/31337/comm", "python3\n")
    report = await validate(node)
    assert report.verdict == "busy" and report.checks == []
    assert report.holders == ["31337 python3 -> /dev/nvidia0"] and "--force" in report.reason
    assert tools.calls() == []  # nothing ran
    forced = await validate(node, force=True)
    assert forced.verdict == "passed" and forced.forced and forced.holders


async def test_the_agents_own_nvml_hold_is_not_a_job(tools: Any, node: SimHost) -> None:
    """The daemon's NVML handle holds every GPU: the process the tree's /proc/self names is left out."""
    tools.install()
    for pid, comm in ((4242, "gpu-node-agent"), (31337, "python3")):
        fd = node.p(f"/proc/{pid}/fd")
        fd.mkdir(parents=True)
        (fd / "3").symlink_to("/dev/nvidia0")
        node.write(f"/proc/{pid}/comm", comm + "\n")
    node.p("/proc/self").symlink_to("4242")
    report = await validate(node)
    assert report.verdict == "busy" and report.holders == ["31337 python3 -> /dev/nvidia0"]
    shutil.rmtree(node.p("/proc/31337"))
    assert (await validate(node)).verdict == "passed"


async def test_thresholds_come_from_the_config_over_the_table(tools: Any, node: SimHost) -> None:
    tools.install()
    extra = """
[validate.thresholds]
nccl_allreduce_busbw = 500.0
nccl_allreduce_bytes = "4G"
ib_gdr = 395.0
"""
    report = await validate(node, extra=extra)
    nccl = report.check("nccl_allreduce")
    assert nccl is not None and nccl.status == "failed" and nccl.thresholds == {"busbw": 500.0}
    assert nccl.sources["busbw"] == "config validate.thresholds" and "-b" in nccl.argv
    assert nccl.argv[nccl.argv.index("-e") + 1] == "4G"
    ib = report.check("ib_write_bw")
    assert ib is not None and ib.status == "failed" and ib.thresholds == {"mlx5_0:1": 395.0, "mlx5_1:1": 395.0}


async def test_h200_row_and_an_unknown_count(tools: Any, tmp_path: Path) -> None:
    tools.install("all_reduce_perf")
    h200 = SimHost(tmp_path / "h200")
    for i in range(8):
        h200.add_gpu(f"0000:{0x18 + i:02x}:00.0", i, H200_SXM)
    report = await validate(h200, level="quick")
    assert report.sku == "nd_h200_v5" and report.check("nccl_allreduce").thresholds == {"busbw": 431.0}  # type: ignore[union-attr]
    six = SimHost.gpu_node(tmp_path / "six", gpus=6)
    report = await validate(six, level="quick")
    nccl = report.check("nccl_allreduce")
    assert report.sku == "" and nccl is not None and nccl.thresholds == {} and nccl.status == "passed"
    assert "6 x NVIDIA H100 80GB HBM3: ND H100 v5 has 8" in report.notes[0]
    assert tools.calls("all_reduce_perf")[-1][tools.calls("all_reduce_perf")[-1].index("-g") + 1] == "6"
    # a configured SKU the node does not match fails
    cfg = configmod.parse('[validate]\nsku = "nd_h100_v5"\n', file="<t>").agent
    report = await run_validation(cfg, HostRoot(six.root), "quick", skip=("passive",))
    top = report.check("topology")
    assert report.verdict == "failed" and top is not None and top.status == "failed"
    assert "the node has 6 x NVIDIA H100 80GB HBM3" in top.reason


async def test_full_level_sweeps_and_runs_dcgm_level_3(tools: Any, node: SimHost) -> None:
    tools.install()
    report = await validate(node, level="full")
    assert report.verdict == "passed", report.reason
    nccl = tools.calls("all_reduce_perf")[0]
    assert nccl[:4] == ["-b", "1M", "-e", "16G"] and "50" in nccl
    assert tools.calls("dcgmi")[0] == ["diag", "-r", "3", "-j"]


async def test_quick_level_with_the_passive_check(tools: Any, node: SimHost) -> None:
    tools.install()
    report = await run_validation(agent_cfg(), HostRoot(node.root), "quick")
    assert [c.name for c in report.checks] == ["passive", "nccl_allreduce"]
    passive = report.check("passive")
    assert passive is not None and passive.status == "passed", passive
    assert passive.reason.startswith("healthy")
    node.remove_dev_node("nvidia3")  # a GPU on the bus without its device node: critical for gpu_devices
    report = await run_validation(agent_cfg(), HostRoot(node.root), "quick")
    passive = report.check("passive")
    assert passive is not None and passive.status == "failed" and report.verdict == "failed"


def test_cli_json_and_exit_codes(tools: Any, node: SimHost, tmp_path: Path, capsys: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tools.install()
    conf = tmp_path / "config.toml"
    conf.write_text(FAST)
    base = ["validate", "--config", str(conf), "--host-root", str(node.root), "--skip", "passive"]
    assert main([*base, "--format", "json", "--level", "standard"]) == 0
    report = decode(capsys.readouterr().out)
    assert report.verdict == "passed" and len(report.checks) == 5
    monkeypatch.setenv("FAKE_DCGMI_MODE", "fail")
    assert main([*base, "--level", "standard"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "[failed ] dcgm_diag: 1 test failed: Hardware/memory" in out
    fd = node.p("/proc/77/fd")
    fd.mkdir(parents=True)
    (fd / "5").symlink_to("/dev/nvidia2")
    assert main(base) == 75
    assert "BUSY" in capsys.readouterr().out
    assert main(["validate", "--host-root", str(tmp_path / "nope")]) == 66


def test_config_errors_name_file_line_and_closest_key(tmp_path: Path, capsys: Any) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[validate]\nsku = \"auto\"\n[validate.timeouts]\nnvbandwith = 5\n")
    assert main(["validate", "--config", str(conf), "--host-root", str(tmp_path)]) == 78
    err = capsys.readouterr().err
    assert f"{conf}:4:" in err and "'validate.timeouts.nvbandwith'" in err and "did you mean 'nvbandwidth'" in err
    conf.write_text("[validate.timeouts]\ndcgm_diag = 0\n")
    assert main(["validate", "--config", str(conf), "--host-root", str(tmp_path)]) == 78
    assert f"{conf}:2: validate.timeouts.dcgm_diag: must be > 0" in capsys.readouterr().err
    conf.write_text('[validate]\nsku = "nd_h100_v6"\n')
    assert main(["validate", "--config", str(conf), "--host-root", str(tmp_path)]) == 78
    assert "did you mean 'nd_h100_v5'" in capsys.readouterr().err
