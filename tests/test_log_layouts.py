"""Issue 25: the same verdict, node and entity whatever layout a job's logs use, and never a healthy node named
because it could read another node's log.

One job of 16 ranks on two nodes (8 per node), rank 11 hung (on gpu-b: it never enters the collective, hears of
rank 3's timeout), every other rank's watchdog times out. Its ranks' output lands where Kubernetes and Slurm put
it; each snapshot is what that node's disk holds; ``diagnose`` over both roots must name gpu-b, rank 11:

* ``local``: NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log on each node (the control);
* ``shared``: srun --output=/home/alice/logs/%x-%t.out on an NFS /home: every snapshot holds all 16 files;
* ``jobwide``: the batch script's slurm-1234.out in gpu-a's spool, every task's output forwarded there by srun
  (with and without --label), nothing of the job on gpu-b's disk;
* ``pods``: each pod's container log (CRI) on its own node, the pods' hostnames not the nodes';
* ``launcher``: as ``pods``, plus a launcher pod on gpu-a whose log aggregates every worker's output.

The ranks' lines come from sim/scenarios.py's writer (NCCL's and PyTorch's formats, cited there).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from sim.host import SimHost
from sim.scenarios import GPUS, Job, write_rank
from tests.conftest import AGENT_CMD

NODES = ["gpu-a", "gpu-b"]
PODS = {"gpu-a": "train-worker-0", "gpu-b": "train-worker-1"}
HUNG = 11  # rank 3 of gpu-b
GLOBS = '[collectors.nccl_logs]\nglobs = ["/var/log/nccl/*.log", "/home/*/logs/*.out", ' \
        '"/var/spool/slurm/job*/slurm-*.out"]\n'


def _rank_lines(tmp: Path, writer_host: dict[str, str]) -> dict[int, list[str]]:
    """Each rank's output as its process printed it (NCCL's prefix naming ``writer_host[node]``)."""
    rng = random.Random(25)
    job = Job("0x7f3a9c2e11d04b85", NODES, len(NODES) * GPUS)
    ip_of = {n: f"10.0.0.{i + 1}" for i, n in enumerate(NODES)}
    out: dict[int, list[str]] = {}
    for node in NODES:
        scratch = SimHost(tmp / f"scratch-{node}")
        for gpu in range(GPUS):
            rank = job.rank_of(node, gpu)
            write_rank(scratch, rng, job, node, gpu, "2.21", ip_of, socket=False, timeout=rank != HUNG,
                       completion_peer=None, glog=True, heard_from=3 if rank == HUNG else None)
            text = scratch.p(f"/var/log/nccl/{node}.{40000 + gpu}.log").read_text()
            if writer_host[node] != node:
                text = text.replace(f"{node}:{40000 + gpu}:", f"{writer_host[node]}:{40000 + gpu}:")
            out[rank] = text.splitlines()
    return out


def _cri(lines: list[str]) -> str:
    """containerd's CRI log records (kubelet pkg/kubelet/kuberuntime/logs/logs.go parseCRILog)."""
    return "".join(f"2026-12-05T07:44:{i % 60:02d}.{i:09d}Z stderr F {line}\n" for i, line in enumerate(lines))


def _interleave(by_rank: dict[int, list[str]], label: bool) -> list[str]:
    """srun's forwarded output: the tasks' lines interleaved as they arrive, ``--label``'s "%*d: " before each
    (slurm src/common/write_labelled_message.c)."""
    width = len(str(max(by_rank)))
    rows = [(i, r, f"{r:>{width}}: {line}" if label else line)
            for r, lines in by_rank.items() for i, line in enumerate(lines)]
    rows.sort(key=lambda t: (t[0], t[1]))
    return [line for _i, _r, line in rows]


def _layout(tmp: Path, layout: str) -> list[Path]:
    roots = {}
    for node in NODES:
        h = SimHost.gpu_node(tmp / node, gpus=GPUS, hcas=GPUS)
        h.write("/etc/hostname", f"{node}\n")
        h.write("/proc/sys/kernel/hostname", f"{node}\n")
        roots[node] = h
    pods = layout in ("pods", "launcher")
    by_rank = _rank_lines(tmp, PODS if pods else {n: n for n in NODES})
    node_of = {r: NODES[r // GPUS] for r in by_rank}
    if layout == "local":
        for r, lines in by_rank.items():
            roots[node_of[r]].write(f"/var/log/nccl/{node_of[r]}.{40000 + r % GPUS}.log", "\n".join(lines) + "\n")
    elif layout == "shared":
        for h in roots.values():  # NFS: the same files under every node
            for r, lines in by_rank.items():
                h.write(f"/home/alice/logs/llama-{r}.out", "\n".join(lines) + "\n")
    elif layout.startswith("jobwide"):
        roots["gpu-a"].write("/var/spool/slurm/job1234/slurm-1234.out",
                             "\n".join(_interleave(by_rank, layout == "jobwide-label")) + "\n")
    elif pods:
        for node in NODES:
            mine = {r: lines for r, lines in by_rank.items() if node_of[r] == node}
            uid = f"5d0c8a9e-1b2f-4c3d-8e7f-0a1b2c3d4e{NODES.index(node):02d}"
            roots[node].write(f"/var/log/pods/team-a_{PODS[node]}_{uid}/trainer/0.log",
                              _cri(_interleave(mine, False)))
        if layout == "launcher":
            roots["gpu-a"].write("/var/log/pods/team-a_llama-launcher-x7k2p_0b1f7f0e-2d1c-4a53-9d4e-1c2b3a4d5e6f/"
                                 "launcher/0.log", _cri(_interleave(by_rank, False)))
    return [h.root for h in roots.values()]


def _diagnose(tmp: Path, roots: list[Path]) -> dict[str, object]:
    cfg = tmp / "c.toml"
    cfg.write_text(GLOBS)
    args = [a for r in roots for a in ("--host-root", str(r))]
    r = subprocess.run([*AGENT_CMD, "diagnose", *args, "--config", str(cfg), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 2), r.stderr[-2000:]
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("layout", ["local", "shared", "jobwide", "jobwide-label", "pods", "launcher"])
def test_the_hung_rank_is_named_on_its_node_whatever_the_layout(tmp_path: Path, layout: str) -> None:
    out = _diagnose(tmp_path, _layout(tmp_path, layout))
    incidents = out["incidents"]
    assert isinstance(incidents, list) and len(incidents) == 1, incidents
    (inc,) = incidents
    named = {c["node"] for c in inc["culprits"]}
    assert named == {"gpu-b"}, inc["reason"]
    assert inc["culprit"]["entity"] == f"rank:{HUNG}", inc["culprit"]
    # the healthy node is never named: not a culprit, and its own findings are its own ranks' timeouts only
    critical = out["critical"]
    assert isinstance(critical, dict)
    for node, msgs in critical.items():
        for m in msgs:
            assert m["node"] == node
            assert m.get("details", {}).get("relayed") is not True
