"""Issue 25 (3): a rank that crashed, named on its node with why, from what the job's own logs and the node's
kernel log say -- torchrun's failure report (tests/fixtures/torch_failures/: real torchrun 2.13 runs, their README
says how), PyTorch's NCCL error on the peers, the kernel's OOM kill of the worker's pid.

Two nodes, eight ranks: gpu-node-07 runs ranks 0-3 (pids 29109-29112 as the captured report names them), gpu-node-08
ranks 4-7. Rank 3 is OOM-killed; torchrun stops 0-2 with SIGTERM; ranks on gpu-node-08 time out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sim.host import SimHost
from tests.conftest import AGENT_CMD

FIXTURES = Path(__file__).parent / "fixtures" / "torch_failures"
JOB = "0x5e1f00ddc0ffee11"
PIDS = {0: 29109, 1: 29110, 2: 29111, 3: 29112}
CONFIG = '[collectors.kmsg_xid]\npath = "/var/log/kern.log"\n\n[collectors.nccl_logs]\n' \
         'globs = ["/var/log/nccl/*.log", "/var/log/training/*.log"]\n'


def _init(host: str, pid: int, rank: int, gpu: int) -> str:
    """NCCL's Init COMPLETE (src/init.cc, v2.21.5-1), as sim/scenarios.py writes it."""
    return (f"{host}:{pid}:{pid + 7} [{gpu}] NCCL INFO ncclCommInitRank comm 0x55d0c8b0{rank:02d} rank {rank} nranks 8 "
            f"cudaDev {gpu} nvmlDev {gpu} busId {['18', '2a', '3a', '5d'][gpu]}000 commId {JOB} - Init COMPLETE\n")


def _node(tmp: Path, name: str) -> SimHost:
    h = SimHost.gpu_node(tmp / name, gpus=4, hcas=4)
    h.write("/etc/hostname", f"{name}\n")
    h.write("/proc/sys/kernel/hostname", f"{name}\n")
    h.write("/proc/uptime", "72500.00 100.00\n")  # the kernel log's records are recent
    return h


def _fleet(tmp: Path, *, oom: bool = True, console: bool = True) -> list[Path]:
    a, b = _node(tmp, "gpu-node-07"), _node(tmp, "gpu-node-08")
    for rank, pid in PIDS.items():
        a.write(f"/var/log/nccl/gpu-node-07.{pid}.log", _init("gpu-node-07", pid, rank, rank))
    a.p("/var/log/training").mkdir(parents=True)
    if console:
        shutil.copy(FIXTURES / "torchrun_nccl_text_sigkill_rank3.log", a.p("/var/log/training/console.log"))
    kern = (FIXTURES / "kernel_oom_memcg_dmesg.log").read_text()
    a.write("/var/log/kern.log", kern.replace("29187", str(PIDS[3])) if oom else "")
    for rank in range(4, 8):
        pid = 51000 + rank
        b.write(f"/var/log/nccl/gpu-node-08.{pid}.log", _init("gpu-node-08", pid, rank, rank - 4) + (
            f"[rank{rank}]:[E1206 04:34:59.100000 {pid} ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) "
            f"Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
            "NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.\n"))
    return [a.root, b.root]


def _run(tmp: Path, *args: str) -> dict[str, Any]:
    cfg = tmp / "c.toml"
    cfg.write_text(CONFIG)
    r = subprocess.run([*AGENT_CMD, *args, "--config", str(cfg), "--format", "json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode in (0, 1, 2), r.stderr[-2000:]
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_the_node_reports_the_killed_rank_with_its_oom_kill_and_the_stopped_ones_as_victims(tmp_path: Path) -> None:
    root = _fleet(tmp_path)[0]
    report = _run(tmp_path, "check", "--host-root", str(root))
    failed = {e["details"]["rank"]: e for e in report["events"] if e["type"] == "TorchRankFailed"}
    assert set(failed) == {0, 1, 2, 3}
    killed = failed[3]
    assert (killed["reason"], killed["severity"], killed["entity"]) == ("OOMKilled", "warning",
                                                                         "nccl:gpu-node-07:29112")
    d = killed["details"]
    assert d["job"] == JOB and d["world_rank"] == 3 and d["signal"] == "SIGKILL" and d["root_cause"] is True
    assert "OOM killer" in d["explanation"] and "29112" in d["explanation"]
    assert d["logged_at"].endswith("Z") and d["failed_at"] == "2026-12-06_04:24:59"
    assert {failed[r]["reason"] for r in (0, 1, 2)} == {"PeerFailure"}
    errors = [e for e in report["events"] if e["type"] == "NCCLBackendError"]
    assert errors and all(e["reason"] == "RemoteError" and e["details"]["peer"] == "gpu-node-08" for e in errors)


def test_without_the_oom_kill_it_is_killed_by_a_signal(tmp_path: Path) -> None:
    root = _fleet(tmp_path, oom=False)[0]
    report = _run(tmp_path, "check", "--host-root", str(root))
    (killed,) = [e for e in report["events"] if e["type"] == "TorchRankFailed" and e["details"]["rank"] == 3]
    assert killed["reason"] == "KilledBySignal" and killed["details"]["explanation"] == "killed by SIGKILL"


def test_diagnose_names_the_crashed_rank_on_its_node(tmp_path: Path) -> None:
    roots = _fleet(tmp_path)
    out = _run(tmp_path, "diagnose", *(a for r in roots for a in ("--host-root", str(r))))
    (inc,) = out["incidents"]
    assert inc["culprit"] == {"node": "gpu-node-07", "entity": "rank:3", "kind": "rank", "rank": "3"}, inc["reason"]
    assert "OOMKilled" in inc["reason"] and inc["victims"] == ["gpu-node-08"]


def test_the_kernel_s_oom_kill_of_a_rank_s_pid_is_its_crash_without_any_report(tmp_path: Path) -> None:
    """srun launching the ranks itself (no torchrun), the killed rank printing nothing: this node's own kernel
    log names the pid of its NCCL process."""
    roots = _fleet(tmp_path, console=False)
    report = _run(tmp_path, "check", "--host-root", str(roots[0]))
    (killed,) = [e for e in report["events"] if e["type"] == "TorchRankFailed"]
    assert (killed["reason"], killed["entity"], killed["details"]["world_rank"]) == ("OOMKilled",
                                                                                    "nccl:gpu-node-07:29112", 3)
    out = _run(tmp_path, "diagnose", *(a for r in roots for a in ("--host-root", str(r))))
    (inc,) = out["incidents"]
    assert inc["culprit"]["node"] == "gpu-node-07" and inc["culprit"]["entity"] == "rank:3"
