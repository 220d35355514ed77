from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from collectors.kernel_modules import parse_proc_modules
from sim.host import SimHost
from tests.conftest import AGENT_CMD


def test_proc_modules_lines() -> None:
    text = ("nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
            "nvidia_uvm 1437696 4 - Live 0xffffffffc1a00000 (POE)\n"
            "nvidia 56717312 512 nvidia_uvm,nvidia_peermem,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
            "ib_core 446464 9 rdma_ucm,ib_uverbs,mlx5_ib, Loading 0x0\n"
            "mlx5_core 2367488 1 mlx5_ib, Unloading 0x0\n"
            "garbage line\n\n")
    assert parse_proc_modules(text) == {"nvidia_peermem": "live", "nvidia_uvm": "live", "nvidia": "live",
                                        "ib_core": "coming", "mlx5_core": "going"}


@given(st.text(max_size=500))
def test_proc_modules_never_crashes(text: str) -> None:
    assert isinstance(parse_proc_modules(text), dict)


def _report(host: SimHost, config: Path | None = None) -> tuple[int, dict[str, Any]]:
    cmd = [*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"]
    if config:
        cmd += ["--config", str(config)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads(r.stdout)


def _check(host: SimHost, config: Path | None = None) -> tuple[int, list[dict[str, object]]]:
    rc, report = _report(host, config)
    return rc, [c for c in report["conditions"] if c["type"] == "KernelModuleNotLoaded"]


def test_healthy_gpu_ib_node(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8)
    assert _check(host) == (0, [])


def test_peermem_missing_on_gpu_ib_node_is_critical_with_kernel_log_evidence(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=4, peermem=False)
    host.kmsg("nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client")
    host.kmsg("modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument")
    rc, conds = _check(host)
    assert rc == 2
    (c,) = conds
    assert c["entity"] == "module:nvidia_peermem" and c["severity"] == "critical"
    assert c["suggested_action"] == "reload_module" and c["reason"] == "VersionMismatch"
    assert len(c["details"]["kernel_log"]) == 2  # type: ignore[index]


def test_peermem_not_needed_without_hcas_or_with_dmabuf_or_gdr_files(tmp_path: Path) -> None:
    assert _check(SimHost.gpu_node(tmp_path / "a", gpus=8, peermem=False)) == (0, [])
    host = SimHost.gpu_node(tmp_path / "b", gpus=8, hcas=2, peermem=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[collectors.kernel_modules]\ngpudirect = "dmabuf"\n')
    assert _check(host, cfg) == (0, [])
    host.add_gdr_provider()  # another peer-memory provider (nv_peer_mem) exposes the GDR files
    assert _check(host) == (0, [])


def test_driver_missing_after_kernel_upgrade(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, driver_loaded=False, hcas=2)
    rc, conds = _check(host)
    assert rc == 2
    assert [(c["entity"], c["severity"], c["suggested_action"]) for c in conds] == [
        ("module:nvidia", "critical", "cordon")]


def test_no_proc_modules_is_tolerated(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2, hcas=1)
    host.p("/proc/modules").unlink()
    assert _check(host) == (0, [])
    host.unload_module("nvidia_uvm")
    rc, conds = _check(host)
    assert rc == 1 and [c["entity"] for c in conds] == ["module:nvidia_uvm"]


def test_proc_modules_missing_and_unreadable_are_said_apart(tmp_path: Path) -> None:
    """Issue 22 item 8: a missing /proc/modules was reported "unreadable"."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=2, hcas=1)

    def why() -> list[str]:
        _rc, report = _report(host)
        return [n["reason"] for n in report["not_seen"] if n["source"] == "/proc/modules"]

    assert why() == []
    host.p("/proc/modules").unlink()
    assert why() == ["missing: module states come from /sys/module alone"]
    host.p("/proc/modules").mkdir()  # there, but open() fails (EISDIR: no root needed, unlike a chmod)
    assert why() == ["unreadable: Is a directory: module states come from /sys/module alone"]


def test_messages_say_one_gpu_and_one_hca_in_the_singular(tmp_path: Path) -> None:
    """Issue 22 item 8: "1 GPUs", "1 RDMA HCAs" no more."""
    _rc, conds = _check(SimHost.gpu_node(tmp_path / "a", gpus=1, hcas=1, peermem=False))
    assert "on a node with 1 GPU and 1 RDMA HCA: GPUDirect" in str(conds[0]["message"]), conds
    _rc, conds = _check(SimHost.gpu_node(tmp_path / "b", gpus=1, driver_loaded=False))
    assert "while 1 NVIDIA GPU is on the PCI bus" in str(conds[0]["message"]), conds
