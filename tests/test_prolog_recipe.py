"""Issue 22: the README's Slurm prolog line does what the README says, run exactly as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sim.host import SimHost
from tests.conftest import ROOT


def _readme_prolog_line() -> str:
    text = (ROOT / "README.md").read_text()
    para = text[text.index("For a Slurm prolog:"):]
    m = re.search(r"`(gpu-node-agent check [^`]*)`", para)
    assert m, "the README's prolog recipe is gone"
    return m.group(1)


def _prolog(tmp_path: Path, host: SimHost) -> subprocess.CompletedProcess[str]:
    """The README line in bash, with `gpu-node-agent` a wrapper that points check at the simulated root
    (the only thing a real node has that the test does not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "gpu-node-agent"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m agent \"$@\" "
                       f"--host-root {shlex.quote(str(host.root))}\n")
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    script = f"{_readme_prolog_line()}\necho prolog-passed\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)


def _node(tmp_path: Path, name: str) -> SimHost:
    return SimHost.gpu_node(tmp_path / name, gpus=8)


@pytest.mark.parametrize("case", ["healthy", "warnings only", "gpu missing", "critical xid"])
def test_the_readme_prolog_keeps_out_only_critical_nodes(case: str, tmp_path: Path) -> None:
    host = _node(tmp_path, "host")
    if case == "warnings only":
        host.kmsg("NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics SM Warp Exception on "
                  "(GPC 0, TPC 0, SM 0): Out Of Range Address")
        host.add_juicefs("/mnt/jfs", "/var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/cache",
                         cache_size=1 << 30)
    elif case == "gpu missing":
        host.remove_dev_node("nvidia3")
    elif case == "critical xid":
        host.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    r = _prolog(tmp_path, host)
    passes = case in ("healthy", "warnings only")
    assert (r.returncode == 0 and "prolog-passed" in r.stdout) == passes, (case, r.returncode, r.stdout, r.stderr)
    if not passes:
        assert r.returncode == 1 and "prolog-passed" not in r.stdout


def test_a_prolog_with_a_wrong_host_root_keeps_the_node_out(tmp_path: Path) -> None:
    host = _node(tmp_path, "host")
    host.root.rename(tmp_path / "moved")  # the wrapper's --host-root no longer exists: exit 66
    r = _prolog(tmp_path, host)
    assert r.returncode == 1 and "prolog-passed" not in r.stdout and str(host.root) in r.stderr
